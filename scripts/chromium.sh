#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the console's browser test
# (tests/integration/test_console.py), from Debian's packages.
#
# Idempotent: installs only when /usr/bin/chromium or /usr/bin/chromedriver is
# missing. Needs apt-get and root (or sudo); anything else is said plainly and
# exits non-zero, because the browser test fails without them (it never skips).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# fonts-liberation: without any font the screenshots show boxes instead of text.
bash "$HERE/apt-install.sh" scripts/chromium.sh "install Chromium and its chromedriver (same version) at those paths" \
  /usr/bin/chromium /usr/bin/chromedriver -- chromium chromium-driver fonts-liberation
