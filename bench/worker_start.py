"""Worker start: seconds from a worker's process start until its /readyz answers, restarted on an app id whose
topics the broker has, on a broker that also has ``--topics`` others of 8 partitions (a shared cluster).

    .venv/bin/python -m bench.worker_start [--topics 400] [--starts 3]

The filler topics (``bench.filler.<n>``) are made once and kept, so runs from two checkouts, alternated, compare
the same broker. Prints each start and the median; the first start of the app id (it makes the app's topics) is
not counted. Needs a broker (``make broker``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench import common
from bench.common import PARTITIONS, PRODUCT_DEFAULTS, create_topics, unique
from tests.integration.harness import Cluster

FILLER = "bench.filler"


async def run(filler: int, starts: int) -> list[float]:
    names = [f"{FILLER}.{n}" for n in range(filler)]
    for at in range(0, filler, 100):  # a request of its own per hundred: each one is bounded (30 s)
        await create_topics(names[at:at + 100], partitions=PARTITIONS)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="bench-start-")), [unique("start")], None,
                      settings=dict(PRODUCT_DEFAULTS))
    took: list[float] = []
    try:
        for n in range(starts + 1):
            began = time.monotonic()
            worker = common.track(cluster.worker("w0").start())
            await worker.wait_ready(timeout=120)
            if n:  # the first start made the app's topics
                took.append(time.monotonic() - began)
                print(f"start {n}: ready after {took[-1]:.2f} s", flush=True)
            code, _ = worker.terminate()
            assert code == 0, worker.tail()
    finally:
        common.stop_all()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=400, help="other topics on the broker (8 partitions each)")
    parser.add_argument("--starts", type=int, default=3, help="timed starts")
    args = parser.parse_args()
    took = asyncio.run(run(args.topics, args.starts))
    print(f"worker start with {args.topics} other topics: median {statistics.median(took):.2f} s "
          f"(min {min(took):.2f}, max {max(took):.2f}, {len(took)} starts)")


if __name__ == "__main__":
    main()
