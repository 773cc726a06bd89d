#!/usr/bin/env bash
# The LiteLLM proxy of tests/integration/test_litellm.py (litellm[proxy], pinned in
# scripts/litellm-requirements.txt), in a venv of its own: never the worker's .venv.
#
# The venv is kept once per machine, named by the hash of the requirements and the Python it runs on:
#   ${AGENTS_STREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agents-stream}/litellm-<hash>
# and .data/litellm-venv links to it, so a fresh clone (CI's) on a machine that installed it once starts at
# once. Idempotent: installs only when that venv has no stamp (an interrupted install starts again), one
# install at a time per machine (flock). Needs PyPI only for the install; about 100 s from a clean pip
# cache on 2 cores, ~750 MB. Anything missing is said plainly and exits non-zero: the test fails without
# the proxy (it never skips).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REQS=$ROOT/scripts/litellm-requirements.txt
PYTHON=${PYTHON:-python3}
LINK=$ROOT/.data/litellm-venv

if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
  echo "scripts/litellm.sh: $PYTHON is missing or older than 3.10, which litellm needs; set PYTHON=..." >&2
  exit 1
fi
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "scripts/litellm.sh: $PYTHON cannot make a venv with pip (Debian: apt-get install python3-venv)" >&2
  exit 1
fi

identity=$( { cat "$REQS"; "$PYTHON" -c 'import sys; print(sys.executable, sys.version)'; } | sha256sum | cut -c1-12)
CACHE=${AGENTS_STREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agents-stream}
VENV=$CACHE/litellm-$identity
mkdir -p "$CACHE" "$ROOT/.data"

link() {
  # a directory left here by hand would swallow the link: replace it
  if [[ -e "$LINK" && ! -L "$LINK" ]]; then rm -rf "$LINK"; fi
  ln -sfn "$VENV" "$LINK"
}

if [[ -f "$VENV/.installed" && -x "$VENV/bin/litellm" ]]; then
  link
  exit 0
fi

exec 9>"$CACHE/litellm.lock"
if ! flock -w 900 9; then
  echo "scripts/litellm.sh: another install held $CACHE/litellm.lock for 15 minutes; is one stuck?" >&2
  exit 1
fi
if [[ ! -f "$VENV/.installed" ]]; then  # the install that held the lock may have made it meanwhile
  echo "scripts/litellm.sh: installing litellm[proxy] into $VENV (pinned: $REQS)"
  started=$(date +%s)
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  if ! "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQS"; then
    rm -rf "$VENV"
    echo "scripts/litellm.sh: pip could not install $REQS (see above); the package index must be reachable" >&2
    exit 1
  fi
  if [[ ! -x "$VENV/bin/litellm" ]]; then
    echo "scripts/litellm.sh: pip finished but $VENV/bin/litellm is missing" >&2
    exit 1
  fi
  touch "$VENV/.installed"
  echo "scripts/litellm.sh: installed in $(( $(date +%s) - started )) s"
fi
link
