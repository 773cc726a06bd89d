"""The chaos run at a moderate size (tests/chaos.py; `make chaos` runs 5,000 tasks): `pytest -s` prints the figures."""

from __future__ import annotations

import pytest

from tests.chaos import run_chaos

#: it restarts the shared broker
pytestmark = pytest.mark.exclusive


async def test_chaos_kills_broker_restart_outage_and_poison_lose_and_duplicate_nothing(tmp_path, workers_data):
    """Under SIGKILLs every 15 s, a worker paused past its session timeout (SIGSTOP, SIGCONT), a broker restart, 20%
    provider errors with a 20 s outage and 5% poison pills, every valid task ends with exactly one distinct succeeded
    result, every pill with one schema dead letter, lag 0."""
    report = await run_chaos(
        600, tmp=tmp_path, data=workers_data, rate=10.0, outage_at=10.0, outage_s=20.0, kill_every=15.0,
        broker_restart_at=35.0, drain_timeout=120.0,
    )
    print("\nchaos run (600 messages):\n" + report.table())
    assert not report.problems, report.describe()
    # The faults share one lock (a kill waits out a restart or a pause under way), so a kill falls later than its
    # period; once the run drained in 3 s, a 20 s period got in only two kills before the end.
    assert report.kills >= 3 and report.broker_restarts == 1 and report.pauses >= 1
