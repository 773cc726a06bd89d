"""The operator console: static HTML, CSS and JS (no build step) served at ``/`` by every worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faust.web import Request, Response, View

__all__ = ["ASSETS", "CONSOLE_DIR", "SECURITY_HEADERS", "register_console"]

CONSOLE_DIR = Path(__file__).with_name("console_static")

# The files the console is made of and their types; nothing else under /console/ is served.
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "lookup.js": "text/javascript; charset=utf-8",
    "recent.js": "text/javascript; charset=utf-8",
    "live.js": "text/javascript; charset=utf-8",
    "approvals.js": "text/javascript; charset=utf-8",
    "deadletters.js": "text/javascript; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "conversations.js": "text/javascript; charset=utf-8",
    "desk.js": "text/javascript; charset=utf-8",
    "inbox.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

# No inline script or style anywhere, so the policy can be 'self' only: data rendered into the page cannot
# run even if it slipped past textContent. form-action 'none': no form may ever navigate (a token in a URL).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The files change with the package; a browser revalidates instead of running a stale console.
    "Cache-Control": "no-cache",
}


def register_console(app: Any) -> None:
    """Add ``/`` (the console page) and ``/console/{name}`` (its CSS, JS and icon) to the worker's web server."""
    # Read once at start: a package installed without its console files fails here, not at the first visit.
    bodies = {name: (CONSOLE_DIR / name).read_bytes() for name in ASSETS}

    def asset(view: View, name: str) -> Response:
        # Content-Type goes in the headers: aiohttp refuses a charset inside content_type for a bytes body.
        return view.bytes(bodies[name], headers={**SECURITY_HEADERS, "Content-Type": ASSETS[name]})

    @app.page("/")
    class Console(View):
        async def get(self, request: Request) -> Response:
            return asset(self, "index.html")

    @app.page("/console/{name}")
    class ConsoleAsset(View):
        async def get(self, request: Request, name: str) -> Response:
            if name not in bodies:
                return self.json({"error": f"no console file {name!r}"}, status=404, headers=SECURITY_HEADERS)
            return asset(self, name)
