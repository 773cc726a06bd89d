"""The operator console at ``/``, served by a real worker and driven in a real headless Chromium (Selenium)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agents_stream.contract import topics
from agents_stream.ops.console import ASSETS

from .harness import ROOT, encode, eventually, produce, read_topic, results_for, task, unique

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = ROOT / "docs" / "screenshots"
TOKEN = "console-t0ken-for-tests"
# The machine's network is closed: nothing in the browser may try to reach out (updates, sync, QUIC probes).
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1280,900",
]
# Untrusted text the console must show as text: if any of it became markup, an <img> would appear and run.
HOSTILE = "<img src=x id=pwned onerror=\"document.title='pwned'\"><b>bold</b> refund order 7"


def approval_policy(agent: str) -> str:
    return (
        f'[agents.{agent}.approval]\nalways = true\n[[agents.{agent}.approval.levels]]\nname = "ops"\ntimeout_s = 600\n'
    )


def calls_for(fake: Any, task_id: str) -> int:
    return sum(1 for r in fake.requests if r.task_id == task_id or task_id in r.instruction)


def chromium(profile: Path) -> Any:
    """A headless Chromium under chromedriver; fails (never skips) when either is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `bash scripts/chromium.sh` (make test does it first)",
                    pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    # Both paths given: Selenium Manager (which would go to the network for a driver) is never asked.
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    # --window-size counts the (invisible) browser frame; the screenshots want a 1280x900 page.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(10)
    return driver


class Page:
    """The console in the browser. Selenium blocks, so every step runs in a thread: the fake LLM the worker
    calls lives on this test's event loop and must keep answering meanwhile."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    def _wait(self, what: str, check: Any, timeout: float = 20) -> Any:
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(lambda d: check(d))
        except TimeoutException:
            raise AssertionError(f"console: timed out after {timeout}s waiting for {what}") from None

    async def wait(self, what: str, check: Any, timeout: float = 20) -> Any:
        return await self.run(self._wait, what, check, timeout)

    async def js(self, script: str, *args: Any) -> Any:
        return await self.run(self.driver.execute_script, script, *args)

    async def type(self, css: str, text: str) -> None:
        def go() -> None:
            from selenium.webdriver.common.by import By

            field = self.driver.find_element(By.CSS_SELECTOR, css)
            field.clear()
            field.send_keys(text)

        await self.run(go)

    async def click(self, css: str) -> None:
        def go() -> None:
            from selenium.webdriver.common.by import By

            self.driver.find_element(By.CSS_SELECTOR, css).click()

        await self.run(go)

    async def text(self, css: str) -> str:
        return await self.js("const n = document.querySelector(arguments[0]); return n ? n.textContent : null;", css)

    async def screenshot(self, path: Path, height: int = 900) -> None:
        """The page's top ``height`` pixels (1280 wide) as a PNG."""
        path.parent.mkdir(parents=True, exist_ok=True)
        await self.run(self.driver.execute_cdp_cmd, "Emulation.setDeviceMetricsOverride",
                       {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False})
        assert await self.run(self.driver.save_screenshot, str(path)), f"screenshot {path} not written"

    async def errors(self) -> list[str]:
        """Severe browser console entries (script errors, CSP violations), less the refusals the test provokes."""
        entries = await self.run(self.driver.get_log, "browser")
        return [e["message"] for e in entries if e["level"] == "SEVERE" and "status of 401" not in e["message"]]


async def test_console_approves_a_parked_task_only_with_the_token(cluster_factory, fake_llm, tmp_path):
    """Without the token the inbox is refused and shows no task; with it an operator sees a parked task (its
    untrusted text shown as text); Approve without the token is refused on screen and the task stays parked; with
    the token it runs exactly once."""
    agent = unique("console")
    c = cluster_factory([agent], fake_llm.url, extra=approval_policy(agent), AGENTS_STREAM_API_TOKEN=TOKEN)
    w = await c.started()
    t = task(agent, f"console-{uuid.uuid4().hex[:12]}", instruction=HOSTILE)
    task_id = t["task_id"]
    await produce(topics.task_topic(agent), [encode(t)])
    await eventually(lambda: _awaiting(w, task_id), timeout=30, what="the task parked for approval")

    driver = await asyncio.to_thread(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(driver)
        await page.run(driver.get, f"http://127.0.0.1:{w.web_port}/")
        row = f'tr[data-task-id="{task_id}"]'
        # Task data needs the token: without it the inbox says so and shows nothing.
        await page.wait("the inbox refused without a token", lambda d: "Refused (401)" in (d.execute_script(
            "const n = document.getElementById('approvals-error'); return n.hidden ? '' : n.textContent") or ""))
        assert await page.js("return !!document.querySelector(arguments[0])", row) is False, "no task data shown"
        await page.type("#token", TOKEN)
        await page.click("#token-save")
        await page.wait("the task in the approvals inbox",
                        lambda d: d.execute_script("return !!document.querySelector(arguments[0])", row))
        assert await page.text(f"{row} td.instruction") == HOSTILE, "the instruction is shown as text, not markup"
        shown = next(a for a in (await w.get("/approvals"))["awaiting"] if a["task_id"] == task_id)
        assert await page.js("return document.querySelectorAll('img').length") == 0
        assert await page.js("return document.title") == "agents-stream console"
        await page.wait("the live counters", lambda d: d.execute_script(
            "return document.querySelectorAll('#ready-cards .card').length") == 4)
        await page.type("#operator", "alice")
        await page.js("document.getElementById('approvals').scrollIntoView()")  # below the charts and recent list
        await page.screenshot(SCREENSHOTS / "console-approvals.png")

        # No token: the worker refuses, the console says so, nothing is decided.
        await page.click("#token-forget")
        await page.click(f"{row} button.approve")
        await page.wait("the refusal on the row", lambda d: "401" in (d.execute_script(
            "const n = document.querySelector(arguments[0]); "
            "return n && n.classList.contains('refused') ? n.textContent : ''",
            f"{row} .row-status") or ""))
        notice = await page.js(
            "const n = document.getElementById('notice'); return [n.hidden, n.className, n.textContent]"
        )
        assert notice[0] is False and notice[1] == "refused" and "Refused (401)" in notice[2], notice
        await asyncio.sleep(2)  # a decision that slipped through would be applied by now
        assert await _awaiting(w, task_id), "refused: the task is still parked"
        assert (await w.get(f"/tasks/{task_id}"))["state"] == "awaiting_approval"
        assert calls_for(fake_llm, task_id) == 0

        # The token: kept in sessionStorage only, never in a URL or localStorage.
        await page.type("#token", TOKEN)
        await page.click("#token-save")
        stored = await page.js("return [sessionStorage.getItem('agents-stream.token'), localStorage.length, "
                               "location.href, document.getElementById('token').value, "
                               "document.getElementById('token-state').textContent]")
        assert stored == [TOKEN, 0, f"http://127.0.0.1:{w.web_port}/", "", "token set (this tab)"], stored

        await page.click(f"{row} button.approve")
        await page.wait("the accepted decision", lambda d: d.execute_script(
            "const n = document.querySelector(arguments[0]); return !n || n.classList.contains('ok')",
            f"{row} .row-status"))

        got = await results_for({task_id}, timeout=60)
        assert len(got[task_id]) == 1, "one result"
        sent = await read_topic(topics.APPROVALS, timeout=30, until=lambda s: len(s) >= 1,
                                keep=lambda m: m.key == task_id.encode())
        decided = json.loads(sent[-1].value)  # the console names what its row showed: parking, app id, agent
        assert (decided.get("parked"), decided.get("app_id"), decided.get("agent")) == (
            round(shown["requested_at"] * 1000), c.app_id, agent), decided
        result = json.loads(got[task_id][0].value)
        assert result["status"] == "succeeded", result
        await page.wait("the inbox emptied", lambda d: d.execute_script(
            "return !document.querySelector(arguments[0]) && "
            "document.getElementById('approvals-count').textContent === '0'", row))
        await page.wait("the provider call counted on /metrics", lambda d: d.execute_script(
            "return [...document.querySelectorAll('#metric-cards .card')]"
            ".some(c => c.textContent.startsWith('provider calls1'))"))
        await page.wait("the breaker table", lambda d: d.execute_script(
            "const r = document.querySelector('#breakers-body tr[data-provider=\"fake\"]'); "
            "return !!r && r.textContent.includes('closed')"))
        await page.screenshot(SCREENSHOTS / "console-overview.png")

        await page.type("#task-id", task_id)
        await page.click("#task-form button[type=submit]")
        await page.wait("the task's record", lambda d: d.execute_script(
            "const r = document.getElementById('lookup-result'); "
            "return !r.hidden && r.textContent.includes('succeeded')"))
        assert await page.text("#lookup-title-text") == f"Task {task_id}"
        assert await page.errors() == [], "no script errors or CSP violations in the console"
    finally:
        await asyncio.to_thread(driver.quit)

    await asyncio.sleep(2)  # a second run would show up here
    assert calls_for(fake_llm, task_id) == 1, "approved task reached the provider exactly once"
    decided = (await w.get(f"/tasks/{task_id}"))["approval"]["decision"]
    assert (decided["decision"], decided["by"], decided["via"]) == ("approve", "alice", "http"), decided


async def test_console_is_served_with_security_headers(cluster_factory):
    """``/`` is the console (no inline script, so a 'self'-only CSP holds), every file it loads is served, and all
    of them carry the anti-framing, no-sniff and no-referrer headers."""
    c = cluster_factory([unique("console")], None)
    w = await c.started()
    base = f"http://127.0.0.1:{w.web_port}"
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/", timeout=aiohttp.ClientTimeout(total=10)) as r:
            assert r.status == 200 and r.content_type == "text/html"
            page, headers = await r.text(), r.headers
        csp = [d.strip() for d in headers["Content-Security-Policy"].split(";")]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert "<script>" not in page and 'src="/console/console.js"' in page and 'href="/console/console.css"' in page
        for name, content_type in ASSETS.items():
            if name == "index.html":
                continue
            assert f"/console/{name}" in page, name
            async with s.get(f"{base}/console/{name}", timeout=aiohttp.ClientTimeout(total=10)) as r:
                assert r.status == 200 and r.headers["Content-Type"] == content_type, (name, r.headers)
                assert r.headers["X-Content-Type-Options"] == "nosniff" and r.headers["X-Frame-Options"] == "DENY"
        async with s.get(f"{base}/console/..%2Fweb.py", timeout=aiohttp.ClientTimeout(total=10)) as r:
            assert r.status == 404, "only the console's own files are served"


async def _awaiting(worker: Any, task_id: str) -> bool:
    try:
        return task_id in [a["task_id"] for a in (await worker.get("/approvals"))["awaiting"]]
    except Exception:
        return False


async def test_console_shows_an_agent_loops_transcript_as_a_timeline(cluster_factory, fake_llm, tmp_path):
    """A support-agent task (lookup → label + refund → notify → answer): the task view draws its turns and tool
    calls in order, one row each, with the rung, the tokens and the attempts."""
    from agents_stream.examples.services import FakeServices
    from agents_stream.testing.fakellm import call, ok, tool_calls

    async with FakeServices() as services:
        agent = unique("support")
        toml = (f'[providers.fake]\nkind = "openai"\nbase_url = "{fake_llm.url}/v1"\nmodel = "fake-model"\n\n'
                f'[agents.{agent}]\nproviders = ["fake"]\nagent = "agents_stream.examples.support:SUPPORT"\n'
                f'[[agents.{agent}.approval.levels]]\nname = "lead"\ntimeout_s = 600\n')
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_API_TOKEN=TOKEN,
                            AGENTS_STREAM_REFUND_SERVICES=services.url)
        w = await c.started()
        t = task(agent, f"ticket-{uuid.uuid4().hex[:10]}", instruction="Refund order o-7", context_data={"o": 7})
        fake_llm.enqueue(tool_calls(call("lookup_order", {"order_id": "o-7"})),
                         tool_calls(call("create_label", {"order_id": "o-7"}),
                                    call("refund", {"order_id": "o-7", "amount": 42.5})),
                         tool_calls(call("notify_customer", {"email": "c@example.com", "text": "Refunded"})),
                         ok("Refunded 42.50 and sent a label."))
        await produce(topics.task_topic(agent), [encode(t)])
        await results_for({t["task_id"]}, timeout=60)
        driver = await asyncio.to_thread(chromium, tmp_path / "chromium-profile")
        try:
            page = Page(driver)
            await page.run(driver.get, f"http://127.0.0.1:{w.web_port}/")
            await page.type("#token", TOKEN)
            await page.click("#token-save")
            await page.type("#task-id", t["task_id"])
            await page.click("#task-form button[type=submit]")
            await page.wait("the timeline", lambda d: d.execute_script(
                "return !document.getElementById('task-timeline').hidden"))
            rows = await page.js("return [...document.querySelectorAll('#task-timeline-body tr')]"
                                 ".map(r => [r.className, r.textContent])")
            await page.run(driver.execute_script, "document.getElementById('task-timeline').scrollIntoView()")
            await page.screenshot(SCREENSHOTS / "console-agent-timeline.png")
            assert await page.errors() == []
        finally:
            await asyncio.to_thread(driver.quit)
    kinds = [k for k, _ in rows]
    assert kinds == ["turn", "call", "turn", "call", "call", "turn", "call", "turn"], rows
    assert rows[0][1].startswith("0primary:fake:fake-model") and rows[0][1].endswith("lookup_order")
    assert "lookup_order (" in rows[1][1] and rows[1][1].endswith("1 attemptok")
    assert rows[-1][1].endswith("final answer")


# -- the live charts and the recent list, against two workers doing real work -----------------------------------------

PROBLEM_STATES = {"failed", "dead_lettered"}


async def _unauthorised(worker: Any, path: str) -> int:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{worker.web_port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status


def _drawn(d: Any, chart: str) -> dict[str, str]:
    """What charts.js says it drew into a chart (its figure's data attributes) and how many SVG points it has."""
    return d.execute_script(
        "const f = document.getElementById(arguments[0]); if (!f) return {}; "
        "const pts = [...f.querySelectorAll('polyline')].reduce((n, p) => n + p.points.numberOfItems, 0) "
        "  + f.querySelectorAll('circle.dot').length; "
        "return {...f.dataset, svg_points: String(pts), rects: String(f.querySelectorAll('rect.b-open').length)};",
        chart,
    )


def _recent_rows(d: Any) -> dict[str, str]:
    return d.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#recent-body tr')]"
        ".map(r => [r.dataset.recentTask, r.dataset.state]));"
    )


@pytest.mark.exclusive  # it runs the job orchestrator, which reads and answers the shared agent.jobs
async def test_console_draws_live_charts_and_lists_recent_tasks_from_two_workers(cluster_factory, fake_llm, tmp_path):
    """Two workers do real work (a failing task, a batch, a job, an outage that opens the breaker and holds tasks,
    the recovery) and the console shows it: the charts, gathered from both workers, draw throughput, lag, calls in
    flight, the held tasks and the breaker's open stretch; the recent list shows every task with its state (held
    during the outage), newest first. Without the token neither view answers."""
    from agents_stream.testing.fakellm import status

    agent = unique("live")
    breaker = "[breaker]\nfailure_threshold = 3\nsuccess_threshold = 1\nopen_timeout_s = 2\nwindow_s = 30\n"
    c = cluster_factory([agent], fake_llm.url, extra=breaker, AGENTS_STREAM_API_TOKEN=TOKEN,
                        AGENTS_STREAM_CONSOLE_SAMPLE_S="0.5", AGENTS_STREAM_JOBS="1")
    a, b, driver = await asyncio.gather(c.started("a"), c.started("b"),
                                        asyncio.to_thread(chromium, tmp_path / "chromium-profile"))
    try:
        assert await _unauthorised(a, "/samples") == 401 and await _unauthorised(b, "/recent?limit=5") == 401
        page = Page(driver)
        await page.run(driver.get, f"http://127.0.0.1:{a.web_port}/")
        await page.wait("the charts refused without a token", lambda d: "Refused (401)" in (d.execute_script(
            "const n = document.getElementById('charts-error'); return n.hidden ? '' : n.textContent") or ""))
        await page.type("#token", TOKEN)
        await page.click("#token-save")

        # A task that fails for good (400), alone so the scripted answer is its own; then a batch and a job.
        bad = task(agent, f"bad-{uuid.uuid4().hex[:8]}", instruction="a request the model refuses")
        fake_llm.enqueue(status(400))
        await produce(topics.task_topic(agent), [encode(bad)])
        await results_for({bad["task_id"]}, timeout=30)
        await fake_llm.set_mode(latency=1.0)  # calls stay in flight across samples
        batch = [task(agent, f"ok-{i}-{uuid.uuid4().hex[:6]}") for i in range(16)]
        job_id = unique("job")
        plan = {"tasks": [{"id": "facts", "agent": agent, "instruction": "collect facts"},
                          {"id": "summary", "agent": agent, "instruction": "summarise", "depends_on": ["facts"]}]}
        await produce(topics.task_topic(agent), [encode(t) for t in batch])
        await produce(topics.JOBS, [(job_id.encode(), json.dumps({"job_id": job_id, "plan": plan}).encode())])
        await results_for({t["task_id"] for t in batch}, timeout=30)

        async def job_done() -> bool:
            return any(j["job_id"] == job_id and j["state"] == "succeeded" for j in (await a.get("/recent"))["jobs"])

        # Both steps done before the outage, so only the tasks sent during it can be held.
        await eventually(job_done, timeout=30, what="the job's two steps done")

        # The provider goes down: the breaker opens, new tasks are held and wait as lag.
        await fake_llm.set_mode(outage=True, latency=0.0)
        down = [task(agent, f"down-{i}-{uuid.uuid4().hex[:6]}") for i in range(6)]
        await produce(topics.task_topic(agent), [encode(t) for t in down])
        await page.wait("held tasks in the recent list and on the chart", lambda d: (
            "held" in _recent_rows(d).values() and float(_drawn(d, "chart-held").get("max") or 0) > 0
            and int(_drawn(d, "chart-breakers").get("open") or 0) > 0), timeout=30)
        await page.screenshot(SCREENSHOTS / "console-live-outage.png", height=1200)

        await fake_llm.set_mode(outage=False)
        await results_for({t["task_id"] for t in down}, timeout=40)
        expected = {t["task_id"]: "succeeded" for t in batch + down}
        expected[f"{job_id}/facts"] = expected[f"{job_id}/summary"] = "succeeded"
        bad_state = (await a.get(f"/tasks/{bad['task_id']}"))["state"]
        assert bad_state in PROBLEM_STATES, bad_state
        expected[bad["task_id"]] = bad_state
        await page.wait("every task with its final state in the recent list", lambda d: all(
            _recent_rows(d).get(k) == v for k, v in expected.items()), timeout=30)
        await page.wait("the job done in the recent jobs", lambda d: d.execute_script(
            "const r = document.querySelector(`#recent-jobs-body tr[data-recent-job='${arguments[0]}']`); "
            "return !!r && r.dataset.state === 'succeeded' && r.textContent.includes('2 / 2');", job_id))
        await page.wait("the breaker closed again", lambda d: d.execute_script(
            "return document.querySelector('#chart-breakers .now').textContent === 'all closed'"))
        await page.run(driver.execute_script, "window.scrollTo(0, 0)")
        await page.screenshot(SCREENSHOTS / "console-live.png", height=1200)

        # A row opens its task in the look-up (its record, and its transcript when it has one).
        await page.click(f'#recent-body tr[data-recent-task="{bad["task_id"]}"] button.link-button')
        await page.wait("the listed task opened", lambda d: d.execute_script(
            "const r = document.getElementById('lookup-result'); return !r.hidden && "
            "document.getElementById('lookup-title-text').textContent === 'Task ' + arguments[0] && "
            "r.textContent.includes(arguments[1])", bad["task_id"], bad_state))
        charts = {name: await page.run(_drawn, driver, name) for name in (
            "chart-throughput", "chart-lag", "chart-in-flight", "chart-held", "chart-breakers")}
        rows = await page.run(_recent_rows, driver)
        order = await page.js("return [...document.querySelectorAll('#recent-body tr')].map(r => r.dataset.recentTask)")
        samples, recent = await a.get("/samples"), await b.get("/recent?limit=200")
        assert await page.errors() == [], "no script errors or CSP violations in the console"
    finally:
        await asyncio.to_thread(driver.quit)

    for name in ("chart-throughput", "chart-lag", "chart-in-flight", "chart-held"):
        drawn = charts[name]
        assert int(drawn["points"]) >= 10 and int(drawn["svg_points"]) == int(drawn["points"]), (name, drawn)
        assert float(drawn["max"]) > 0, (name, drawn)
    assert float(charts["chart-held"]["max"]) <= len(down)
    breakers = charts["chart-breakers"]
    assert "fake" in breakers["names"].split(",") and int(breakers["open"]) > 0 and int(breakers["rects"]) >= 1
    assert all(rows.get(k) == v for k, v in expected.items()), rows
    assert order.index(down[0]["task_id"]) < order.index(batch[0]["task_id"]) < order.index(bad["task_id"])
    # Gathered: both workers' samples and tasks (tasks spread over both workers' partitions).
    assert len(samples["workers"]) == 2 and samples["unreachable"] == [], samples["workers"]
    assert {e["worker"] for e in recent["tasks"]} == set(samples["workers"]), "each worker lists its own tasks"
