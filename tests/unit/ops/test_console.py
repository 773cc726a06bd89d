"""The console's files: every one is served, every one the page loads is served, common.js loads before its users."""

from __future__ import annotations

import re

from agents_stream.ops.console import ASSETS, CONSOLE_DIR


def test_every_file_of_the_console_is_served_and_nothing_else() -> None:
    assert {p.name for p in CONSOLE_DIR.iterdir() if p.is_file() and not p.name.startswith(".")} == set(ASSETS)


def test_the_page_loads_every_served_file_and_only_those() -> None:
    page = (CONSOLE_DIR / "index.html").read_text()
    loaded = re.findall(r'(?:src|href)="/console/([^"]+)"', page)
    assert set(loaded) == set(ASSETS) - {"index.html"}
    assert len(loaded) == len(set(loaded)), "a file loaded twice"


def test_the_shared_object_is_made_before_a_script_reads_it() -> None:
    """Plain deferred scripts run in the page's order: common.js makes window.AgentsStreamConsole, the others use it."""
    page = (CONSOLE_DIR / "index.html").read_text()
    scripts = re.findall(r'<script src="/console/([^"]+)" defer></script>', page)
    makers = [s for s in scripts if "window.AgentsStreamConsole = " in (CONSOLE_DIR / s).read_text()]
    users = [s for s in scripts if "window.AgentsStreamConsole;" in (CONSOLE_DIR / s).read_text()]
    assert makers == ["common.js"]
    assert users and all(scripts.index(u) > scripts.index("common.js") for u in users)
    # console.js takes the views' functions as it loads: each view adds them before it
    views = [s for s in scripts if "Object.assign(C, {" in (CONSOLE_DIR / s).read_text()]
    assert views and all(scripts.index(v) < scripts.index("console.js") for v in views)
