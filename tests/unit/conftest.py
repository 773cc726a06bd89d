"""Fixtures shared by tests/unit's packages (helpers that are not fixtures live next to this file: fake_worker.py,
ledger_fakes.py, job_helpers.py, breaker_helpers.py; import them as ``tests.unit.<helper>``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from agents_stream.testing.fakellm import FakeLLM


@pytest_asyncio.fixture
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeLLM]:
    """A fake LLM server on 127.0.0.1 for one test. It asks for the API key a test module names as FAKE_LLM_KEY
    (the key that module gives its providers) and, in a module that names none, for no key."""
    async with FakeLLM(api_key=getattr(request.module, "FAKE_LLM_KEY", None)) as server:
        yield server
