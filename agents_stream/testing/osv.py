"""A local OSV API over a folder of OSV records, so ``pip-audit`` audits without reaching a public service.

    python -m agents_stream.testing.osv audit -r constraints.txt

starts the server on an ephemeral loopback port, runs ``pip-audit --strict -s osv --osv-url <it>`` on the
requirements file and exits with pip-audit's code: 1 when a pin is affected by an advisory, or when a
dependency could not be audited (``--strict``). With ``--osv-url URL`` (or ``AUDIT_OSV_URL``) it audits a second
time against that service, e.g. the public OSV API where the machine reaches it.

Why a local service: from this project's machines neither of pip-audit's services answers. The OSV API's host does
not resolve, and PyPI's per-version JSON (``/pypi/<name>/<version>/json``) answers 404, which pip-audit's default
service reports as "Dependency not found on PyPI and could not be audited" and then exits 0: an audit that checked
nothing and passed. The records in ``security/advisories/`` are the advisories this project's floors answer
(docs/security.md); each is an OSV record (https://ossf.github.io/osv-schema/) written for this project.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = ["ADVISORIES_DIR", "affects", "audit", "load_advisories", "main", "matching", "serve"]

ADVISORIES_DIR = Path(__file__).resolve().parents[2] / "security" / "advisories"
MAX_QUERY_BYTES = 64 * 1024
AUDIT_TIMEOUT_S = 600.0
_EVENT_KINDS = ("introduced", "fixed", "last_affected")


def load_advisories(folder: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` OSV record in ``folder``; a record without an id or a well-formed range is refused by name."""
    records = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        problem = _shape_problem(record)
        if problem:
            raise ValueError(f"{path}: not an OSV record this audit can use: {problem}")
        records.append(record)
    if not records:
        raise ValueError(f"{folder}: no advisories (*.json); an audit against nothing would pass everything")
    return records


def _shape_problem(record: Any) -> str | None:
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return "no string 'id'"
    affected = record.get("affected")
    if not isinstance(affected, list) or not affected:
        return "no 'affected' list"
    for entry in affected:
        package = entry.get("package") if isinstance(entry, dict) else None
        if not isinstance(package, dict) or package.get("ecosystem") != "PyPI" or not package.get("name"):
            return "an 'affected' entry without a PyPI package name"
        for rng in entry.get("ranges", []):
            if rng.get("type") != "ECOSYSTEM" or not rng.get("events"):
                return "a range that is not an ECOSYSTEM range with events"
            for event in rng["events"]:
                if len(event) != 1 or next(iter(event)) not in _EVENT_KINDS:
                    return f"an event that is not one of {_EVENT_KINDS}: {event}"
                try:
                    _version(next(iter(event.values())))
                except InvalidVersion as exc:
                    return str(exc)
    return None


def _version(text: str) -> Version:
    return Version("0") if text == "0" else Version(text)


def _in_range(events: list[dict[str, str]], version: Version) -> bool:
    """OSV's ECOSYSTEM range: walk the events in version order; the last one at or below ``version`` decides."""
    inside = False
    for event in sorted(events, key=lambda e: _version(next(iter(e.values())))):
        kind, at = next(iter(event.items()))
        bound = _version(at)
        if kind == "introduced" and version >= bound:
            inside = True
        elif kind == "fixed" and version >= bound:
            inside = False
        elif kind == "last_affected" and version > bound:
            inside = False
    return inside


def affects(record: dict[str, Any], name: str, version: str) -> bool:
    """True when the OSV ``record`` lists ``name`` at ``version`` (explicit ``versions`` or an ECOSYSTEM range)."""
    wanted = canonicalize_name(name)
    parsed = Version(version)
    for entry in record["affected"]:
        if canonicalize_name(entry["package"]["name"]) != wanted:
            continue
        if version in entry.get("versions", []):
            return True
        if any(_in_range(rng["events"], parsed) for rng in entry.get("ranges", [])):
            return True
    return False


def matching(records: list[dict[str, Any]], name: str, version: str) -> list[dict[str, Any]]:
    """The records that affect ``name`` at ``version``, as the OSV API's ``vulns`` list; withdrawn ones left out."""
    return [r for r in records if not r.get("withdrawn") and affects(r, name, version)]


def _handler(records: list[dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class QueryHandler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/v1/query" or not 0 < length <= MAX_QUERY_BYTES:
                self._answer(400, {"error": "POST /v1/query with a JSON body of at most 64 KiB"})
                return
            try:
                query = json.loads(self.rfile.read(length))
                name, version = query["package"]["name"], query["version"]
                vulns = matching(records, name, version)
            except (ValueError, KeyError, TypeError, InvalidVersion) as exc:
                self._answer(400, {"error": f"not an OSV package query: {exc}"})
                return
            self._answer(200, {"vulns": vulns} if vulns else {})

        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            return  # one line per query would bury pip-audit's table

    return QueryHandler


@contextmanager
def serve(records: list[dict[str, Any]], port: int = 0) -> Iterator[str]:
    """Serve ``records`` as the OSV query API on 127.0.0.1; yields the query URL; stops and joins on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(records))
    thread = threading.Thread(target=server.serve_forever, name="osv-local", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/query"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _pip_audit(requirements: Path, osv_url: str, cache_dir: str) -> int:
    command = [
        sys.executable, "-m", "pip_audit", "-r", str(requirements), "--no-deps", "--disable-pip", "--strict",
        "-s", "osv", "--osv-url", osv_url, "--progress-spinner", "off", "--timeout", "30", "--cache-dir", cache_dir,
    ]
    try:
        return subprocess.run(command, timeout=AUDIT_TIMEOUT_S, check=False).returncode
    except subprocess.TimeoutExpired:
        print(f"audit: pip-audit did not finish within {AUDIT_TIMEOUT_S:.0f} s against {osv_url}; "
              "check that the service answers", file=sys.stderr)
        return 1


def audit(requirements: Path, advisories: Path = ADVISORIES_DIR, osv_url: str | None = None) -> int:
    """pip-audit ``requirements`` against the local advisories, then against ``osv_url`` if given; 0 only if clean."""
    records = load_advisories(advisories)
    newest = max(str(r.get("modified", "")) for r in records)
    print(f"audit: {requirements} against {len(records)} advisories in {advisories} (newest modified {newest}); "
          "set AUDIT_OSV_URL to audit against a live OSV service as well", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="pip-audit-cache-") as cache_dir, serve(records) as local_url:
        rc = _pip_audit(requirements, local_url, cache_dir)
        if osv_url:
            print(f"audit: {requirements} against {osv_url}", file=sys.stderr, flush=True)
            rc = max(rc, _pip_audit(requirements, osv_url, cache_dir))
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents_stream.testing.osv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("audit", help="pip-audit a requirements file against the local advisories")
    run.add_argument("-r", "--requirement", type=Path, default=Path("constraints.txt"))
    run.add_argument("--advisories", type=Path, default=ADVISORIES_DIR)
    run.add_argument("--osv-url", default=os.environ.get("AUDIT_OSV_URL") or None,
                     help="also audit against this OSV query URL (default: $AUDIT_OSV_URL)")
    args = parser.parse_args(argv)
    try:
        return audit(args.requirement, args.advisories, args.osv_url)
    except (OSError, ValueError) as exc:
        print(f"audit: cannot run: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
