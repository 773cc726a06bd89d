"""Install the peers into .data/peers/ from the registries (PyPI, the Go module proxy, npm, Debian), once.

Each install is idempotent: a stamp (or the binary itself) says it is done, so a second run is quick. A failed
install is returned as a one-line reason, never raised: that peer's row says why and the rest still runs. Logs are
under .data/peers/logs/.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.peers import versions as v

LOGS = v.PEERS / "logs"


def _run(name: str, args: list[str], timeout: float, **env: str) -> str | None:
    """Run an install command; None when it succeeded, else the reason (its last line of output)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"install-{name}.log"
    try:
        with open(log, "ab") as out:
            out.write(f"$ {' '.join(args)}\n".encode())
            out.flush()
            code = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=v.ROOT,
                                  env={**os.environ, **env}).returncode
    except subprocess.TimeoutExpired:
        return f"`{' '.join(args[:3])}` took over {timeout:.0f} s (log: {log.relative_to(v.ROOT)})"
    except OSError as exc:
        return f"`{args[0]}`: {exc}"
    if code == 0:
        return None
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return f"`{' '.join(args[:4])}` exited {code}: {lines[-1].strip()[:160] if lines else ''}"


def python_venv() -> str | None:
    """The peers' venv with requirements.txt installed (restamped when the file changes)."""
    digest = hashlib.sha256(v.PYTHON_REQUIREMENTS.read_bytes()).hexdigest()[:16]
    stamp = v.VENV / f".installed-{digest}"
    if stamp.exists():
        return None
    if not v.VENV_PYTHON.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        if err := _run("venv", [base, "-m", "venv", str(v.VENV)], 300):
            return err
    if err := _run("pip", [str(v.VENV_PYTHON), "-m", "pip", "install", "-q", "-r", str(v.PYTHON_REQUIREMENTS)],
                   1200):
        return err
    stamp.touch()
    return None


def temporal() -> str | None:
    module, version = v.TEMPORAL_CLI
    stamp = v.TEMPORAL_BIN.with_name(f".temporal-{version}")
    if v.TEMPORAL_BIN.exists() and stamp.exists():
        return None
    if not shutil.which("go"):
        return "no `go` command on this machine to build the Temporal CLI"
    v.TEMPORAL_BIN.parent.mkdir(parents=True, exist_ok=True)
    if err := _run("temporal", ["go", "install", f"{module}@{version}"], 1800, GOBIN=str(v.TEMPORAL_BIN.parent)):
        return err
    stamp.touch()
    return None


def restate() -> str | None:
    package, version = v.RESTATE_SERVER
    if v.RESTATE_BIN.exists() and _version_of(v.RESTATE_BIN) == version:
        return None
    if not shutil.which("npm"):
        return "no `npm` command on this machine to install the Restate server"
    prefix = v.PEERS / "npm"
    prefix.mkdir(parents=True, exist_ok=True)
    if err := _run("restate", ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix),
                               f"{package}@{version}"], 900):
        return err
    return None if v.RESTATE_BIN.exists() else f"npm installed {package} but not {v.RESTATE_BIN.name} for linux-x64"


def postgres() -> str | None:
    package, bindir = v.POSTGRES
    if (bindir / "initdb").exists():
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"PostgreSQL 15 not at {bindir}; install the Debian package {package}"
    if err := _run("postgres", ["apt-get", "install", "-y", "-q", package], 900, DEBIAN_FRONTEND="noninteractive"):
        return err
    return None if (bindir / "initdb").exists() else f"apt-get installed {package} but {bindir}/initdb is missing"


def _version_of(binary: Path) -> str:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.split()[-1] if out.split() else ""


def all_peers() -> dict[str, str | None]:
    """Install everything; returns, per peer, None (ready) or why it is not."""
    py = python_venv()
    tmp = py or temporal()
    rst = py or restate()
    return {
        "temporal": tmp,
        "temporal-memory": tmp,
        "restate": rst,
        "restate-64": rst,
        "dbos": py or postgres(),
        "quix": py,
    }
