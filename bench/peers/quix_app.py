"""The Quix Streams peer (runs in .data/peers/venv): a stateful app on our Kafka broker. Each record is a task keyed
by its id; a RocksDB state store (with its changelog topic, Quix Streams' default) remembers each task's result, so
a task seen again is dropped; otherwise one model call, the result stored in state and produced to the output topic.
Processing is Quix Streams' default: at-least-once, a checkpoint every 5 s, one message at a time.

    BENCH_IN=<topic> BENCH_OUT=<topic> BENCH_GROUP=<id> BENCH_STATE_DIR=<dir> python -m bench.peers.quix_app
"""

from __future__ import annotations

import os
from typing import Any

from quixstreams import Application, State

from bench.peers import model


def process(value: dict[str, Any], state: State) -> dict[str, Any] | None:
    if state.get("result") is not None:  # a task we already answered: no second call, no second result
        return None
    output = model.call(value["task_id"], value["instruction"])
    state.set("result", output)
    return {"task_id": value["task_id"], "status": "succeeded", "output": output}


def main() -> None:
    app = Application(broker_address=os.environ["KAFKA_BOOTSTRAP"], consumer_group=os.environ["BENCH_GROUP"],
                      auto_offset_reset="earliest", state_dir=os.environ["BENCH_STATE_DIR"], loglevel="WARNING")
    tasks = app.topic(os.environ["BENCH_IN"], key_deserializer="str", value_deserializer="json")
    results = app.topic(os.environ["BENCH_OUT"], key_serializer="str", value_serializer="json")
    sdf = app.dataframe(tasks).apply(process, stateful=True).filter(lambda v: v is not None)
    sdf.to_topic(results)
    app.run()


if __name__ == "__main__":
    main()
