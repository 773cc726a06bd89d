#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the console's browser test
# (tests/integration/test_console.py), from Debian's packages.
#
# Idempotent: installs only when /usr/bin/chromium or /usr/bin/chromedriver is
# missing. Needs apt-get and root (or sudo); anything else is said plainly and
# exits non-zero, because the browser test fails without them (it never skips).
set -euo pipefail

CHROMIUM=/usr/bin/chromium
CHROMEDRIVER=/usr/bin/chromedriver
# fonts-liberation: without any font the screenshots show boxes instead of text.
PACKAGES=(chromium chromium-driver fonts-liberation)

if [[ -x "$CHROMIUM" && -x "$CHROMEDRIVER" ]]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "scripts/chromium.sh: $CHROMIUM or $CHROMEDRIVER is missing and there is no apt-get here;" \
       "install Chromium and its chromedriver (same version) at those paths, then run make test again." >&2
  exit 1
fi

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "scripts/chromium.sh: installing ${PACKAGES[*]} needs root (or password-less sudo);" \
         "run: apt-get install -y ${PACKAGES[*]}" >&2
    exit 1
  fi
fi

echo "scripts/chromium.sh: installing ${PACKAGES[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null

for bin in "$CHROMIUM" "$CHROMEDRIVER"; do
  if [[ ! -x "$bin" ]]; then
    echo "scripts/chromium.sh: apt-get finished but $bin is still missing" >&2
    exit 1
  fi
done
"$CHROMIUM" --version
"$CHROMEDRIVER" --version
