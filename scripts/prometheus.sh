#!/usr/bin/env bash
# Prometheus and promtool for the alert-rule tests (tests/unit/test_alert_rules.py) and the test that evaluates
# the Grafana dashboard on a real Prometheus (tests/integration/test_prometheus.py), from Debian's package.
#
# Idempotent: installs only when /usr/bin/prometheus or /usr/bin/promtool is missing. Needs apt-get and root
# (or sudo); anything else is said plainly and exits non-zero, because those tests fail without them (they never
# skip). The package would also start a Prometheus service on :9090: during the install a policy-rc.d that says
# "no" keeps it from starting (Docker images ship one; elsewhere this script puts one there and removes it after).
set -euo pipefail

PROMETHEUS=/usr/bin/prometheus
PROMTOOL=/usr/bin/promtool
# --no-install-recommends: the recommended prometheus-node-exporter would pull in 24 more packages and a daemon.
PACKAGES=(prometheus)
POLICY=/usr/sbin/policy-rc.d

if [[ -x "$PROMETHEUS" && -x "$PROMTOOL" ]]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "scripts/prometheus.sh: $PROMETHEUS or $PROMTOOL is missing and there is no apt-get here;" \
       "install Prometheus 2.x (it ships promtool) at those paths, then run make test again." >&2
  exit 1
fi

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "scripts/prometheus.sh: installing ${PACKAGES[*]} needs root (or password-less sudo);" \
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

echo "scripts/prometheus.sh: installing ${PACKAGES[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null

for bin in "$PROMETHEUS" "$PROMTOOL"; do
  if [[ ! -x "$bin" ]]; then
    echo "scripts/prometheus.sh: apt-get finished but $bin is still missing" >&2
    exit 1
  fi
done
"$PROMETHEUS" --version | head -1
"$PROMTOOL" --version | head -1
