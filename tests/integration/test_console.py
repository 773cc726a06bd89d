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

from .harness import ROOT, encode, eventually, produce, results_for, task, unique

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

    async def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
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
        assert await page.js("return document.querySelectorAll('img').length") == 0
        assert await page.js("return document.title") == "agents-stream console"
        await page.wait("the live counters", lambda d: d.execute_script(
            "return document.querySelectorAll('#ready-cards .card').length") == 4)
        await page.type("#operator", "alice")
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
