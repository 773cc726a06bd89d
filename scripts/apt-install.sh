#!/usr/bin/env bash
# Installs Debian packages for the test suite, only when a program they ship is missing (idempotent); used by
# scripts/chromium.sh, scripts/prometheus.sh and scripts/netns.sh.
#
# Usage: scripts/apt-install.sh WHO HINT BIN... -- PACKAGE...
#   WHO   the calling script, named in every message
#   HINT  what to do where apt-get is missing (another way to get the programs)
#   BIN   the programs the packages must provide (absolute paths); nothing is installed when all are there
# Needs apt-get and root (or password-less sudo); anything else is said plainly and exits non-zero, because the
# tests that need the programs fail without them (they never skip). No service starts during the install: a
# policy-rc.d that answers "forbidden" is put in place for it when there is none (Docker images ship one).
set -euo pipefail

WHO=$1 HINT=$2
shift 2
BINS=()
while [[ $# -gt 0 && "$1" != "--" ]]; do BINS+=("$1"); shift; done
shift
PACKAGES=("$@")
POLICY=/usr/sbin/policy-rc.d

missing=""
for bin in "${BINS[@]}"; do [[ -x "$bin" ]] || missing=yes; done
[[ -z "$missing" ]] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "$WHO: ${BINS[*]} missing and there is no apt-get here; $HINT, then run make test again." >&2
  exit 1
fi

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "$WHO: installing ${PACKAGES[*]} needs root (or password-less sudo);" \
         "run: apt-get install -y --no-install-recommends ${PACKAGES[*]}" >&2
    exit 1
  fi
fi

placed=""
if [[ ! -e "$POLICY" ]]; then
  # exit 101 = "action forbidden" (invoke-rc.d and deb-systemd-invoke ask it): no service starts during the install.
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY" >/dev/null
  "${SUDO[@]}" chmod 755 "$POLICY"
  placed=yes
fi
remove_policy() { if [[ -n "$placed" ]]; then "${SUDO[@]}" rm -f "$POLICY"; fi; }
trap remove_policy EXIT

echo "$WHO: installing ${PACKAGES[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null

for bin in "${BINS[@]}"; do
  if [[ ! -x "$bin" ]]; then
    echo "$WHO: apt-get finished but $bin is still missing" >&2
    exit 1
  fi
done
