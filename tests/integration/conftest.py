"""Integration fixtures: the real broker must be up (``make test`` starts it); nothing here skips."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from agents_stream.testing.fakellm import FakeLLM

from .harness import BOOTSTRAP, Cluster, data_root


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def broker_is_up() -> None:
    """Fail loudly (never skip) when the broker is missing: CI must not pass without it."""

    async def check() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
        await asyncio.wait_for(admin.start(), 20)
        await admin.close()

    try:
        asyncio.run(check())
    except Exception as exc:
        pytest.fail(f"No Kafka broker at {BOOTSTRAP} ({exc!r}). Run `make test` (it starts one) or `make broker`.",
                    pytrace=False)


@pytest.fixture
async def fake_llm():
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
def workers_data(tmp_path: Path):
    """The directory under the test's workers' data dirs: on tmpfs when there is one (harness.data_root)."""
    with data_root(tmp_path) as path:
        yield path


@pytest.fixture
def cluster_factory(tmp_path: Path, workers_data: Path):
    made: list[Cluster] = []

    def make(agents: list[str], fake_url: str | None, toml: str | None = None, extra: str = "",
             **settings: str) -> Cluster:
        c = Cluster(tmp_path, agents, fake_url, settings=dict(settings), toml=toml, extra=extra,
                    data_root=workers_data)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
