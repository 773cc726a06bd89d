"""Every version `make bench-peers` installs, in one place (the Python packages' full pins: requirements.txt here).

Installs go under .data/peers/ (ignored by git) and are kept between runs; bench/peers/install.py makes them.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEERS = ROOT / ".data" / "peers"

#: Temporal's CLI with its dev server, built from the Go module proxy. v1.5.1, not the newer v1.9.1: 1.9's go.mod
#: replaces a nested module by a local path (./cliext), which `go install pkg@version` refuses, and that nested
#: module is not served on its own.
TEMPORAL_CLI = ("github.com/temporalio/cli/cmd/temporal", "v1.5.1")
#: Restate's server from the npm registry (the package carries the linux-x64 binary as an optional dependency).
RESTATE_SERVER = ("@restatedev/restate-server", "1.7.12")
#: DBOS runs on Debian's PostgreSQL 15 server (the package postgresql-15).
POSTGRES = ("postgresql-15", Path("/usr/lib/postgresql/15/bin"))
#: temporalio 1.35.0, restate-sdk 1.2.0 (+ hypercorn 0.18.0), dbos 3.4.0 (+ psycopg 3.3.9), quixstreams 3.28.1, and
#: everything they pull in, pinned: the peers' workers run in PEERS/venv, never in the project's .venv.
PYTHON_REQUIREMENTS = HERE / "requirements.txt"

VENV = PEERS / "venv"
VENV_PYTHON = VENV / "bin" / "python"
TEMPORAL_BIN = PEERS / "bin" / "temporal"
RESTATE_BIN = PEERS / "npm" / "node_modules" / "@restatedev" / "restate-server-linux-x64" / "bin" / "restate-server"
