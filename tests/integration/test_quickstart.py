"""The README's quick start, run as written against a real broker and a worker started as `make run` starts it
(issue 29 item 4, "a first hour without surprises"): every command answers, reads with the local operator token.

The commands are the README's own, read from its "Publish a task, read its result" section; only what would collide
with other tests on the shared broker is renamed (the agent, the task ids, the web port, the consumer group, the
broker address), and each command this test expects must still be in the README.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from pathlib import Path

from .harness import BOOTSTRAP, ROOT, free_port, unique, write_config

#: the commands of the README's quick start, each as it starts: a README that drops or renames one fails here
EXPECTED = (
    "echo '{\"task_id\": \"t-1\", \"agent_name\": \"analyzer\"",
    ".venv/bin/agents-stream publish --agent analyzer",
    "scripts/kafka-tool console-consumer --bootstrap-server 127.0.0.1:9092",
    'curl -s -H "Authorization: Bearer $(cat .data/operator-token)" localhost:6066/tasks/t-1',
    ".venv/bin/agents-stream tasks show t-1",
    "scripts/kafka-tool console-producer --bootstrap-server 127.0.0.1:9092 --topic agent.tasks.analyzer",
    "scripts/kafka-tool consumer-groups --bootstrap-server 127.0.0.1:9092 --describe --group agents-stream",
)


def quickstart() -> tuple[list[str], str]:
    """The section's bash blocks (continuation lines joined into one command each) and its group-lag command."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Publish a task, read its result", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        joined = block.replace("\\\n", " ")
        commands += [line.strip() for line in joined.splitlines() if line.strip()]
    lag = re.search(r"Watch the group's lag: `([^`]+)`", section)
    assert lag is not None, "the README's quick start no longer says how to watch the group's lag"
    return commands, lag.group(1)


def renamed(command: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        command = re.sub(old, new, command)
    return command


async def test_the_readme_quick_start_answers_as_written(tmp_path: Path) -> None:
    commands, lag = quickstart()
    everything = "\n".join([*commands, lag])
    for expected in EXPECTED:
        assert expected in everything, f"the README's quick start lost {expected!r}"
    assert "$(VENV)/bin/agents-stream worker --local-token" in (ROOT / "Makefile").read_text(), \
        "make run starts the worker this test starts"

    agent, app_id, port = unique("analyzer"), unique("quickstart"), free_port()
    t1, t2 = unique("t-1"), unique("t-2")
    names = {r"\bt-1\b": t1, r"\bt-2\b": t2, r"\banalyzer\b": agent, r"localhost:6066": f"localhost:{port}",
             r"--group agents-stream\b": f"--group {app_id}", r"127\.0\.0\.1:9092": BOOTSTRAP}
    # the clone as a new user has it, minus its .data: the worker makes .data/operator-token here
    for name in (".venv", "scripts", "kafka", ".cache"):  # kafka-tool finds its jars by kafka/pom.xml
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AGENTS_STREAM_")},  # no token, as a new shell
        "PYTHONPATH": str(ROOT),  # this checkout, installed or not
        "KAFKA_BROKER": f"kafka://{BOOTSTRAP}", "AGENTS_STREAM_APP_ID": app_id, "WEB_PORT": str(port),
        "AGENTS_STREAM_CONFIG": str(write_config(tmp_path / "quickstart.toml", [agent], None)),
        "AGENTS_STREAM_DATA_DIR": str(tmp_path / ".data" / "worker"), "AGENTS_STREAM_JOBS": "0",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen([".venv/bin/agents-stream", "worker", "--local-token"], cwd=tmp_path, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        await ready(worker, port, log_path)
        token = (tmp_path / ".data" / "operator-token").read_text().strip()
        assert token and token in log_path.read_text(), "the worker says its local operator token"

        async def run(command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
            done = await asyncio.to_thread(subprocess.run, ["bash", "-c", renamed(command, names)], cwd=tmp_path,
                                           env=env, capture_output=True, text=True, timeout=timeout)
            assert done.returncode == 0, f"{command}\n→ {done.returncode}\n{done.stdout}\n{done.stderr}"
            return done

        said = {}
        for command in commands:
            said[command] = (await run(command)).stdout
        by_start = {e: next(out for c, out in said.items() if e in c) for e in EXPECTED[1:-1]}
        assert t1 in by_start[EXPECTED[2]], "the console consumer shows t-1's result"
        record = json.loads(by_start[EXPECTED[3]])
        assert record["task_id"] == t1 and record["result"]["status"] == "succeeded", record
        assert by_start[EXPECTED[4]].startswith(f"task {t1}  agent {agent}  state ") and "result: succeeded" in \
            by_start[EXPECTED[4]]
        # t-2 went in through Kafka's own console producer: the same read answers for it
        read_t2 = renamed(EXPECTED[3], names).replace(t1, t2)
        deadline = time.monotonic() + 60
        while '"succeeded"' not in (await run(read_t2)).stdout:
            assert time.monotonic() < deadline, f"no result for {t2}"
            await asyncio.sleep(1)
        assert app_id in (await run(lag)).stdout
        # reads stay protected: without the token, 401
        refused = await run(f"curl -s -o /dev/null -w '%{{http_code}}' localhost:{port}/tasks/{t1}")
        assert refused.stdout == "401"
        lines = log_path.read_text(errors="replace").splitlines()
        assert not [line for line in lines if "Missing sensor state" in line]
        assert not [line for line in lines if "[ERROR]" in line], "\n".join(lines[-40:])
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)


async def ready(worker: subprocess.Popen[bytes], port: int, log_path: Path, timeout: float = 90) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            assert worker.poll() is None, f"the worker exited:\n{log_path.read_text(errors='replace')[-4000:]}"
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise AssertionError(f"the worker was not ready in {timeout}s:\n{log_path.read_text(errors='replace')[-4000:]}")

