#!/usr/bin/env bash
# Prometheus and promtool for the alert-rule tests (tests/unit/repo/test_alert_rules.py) and the test that evaluates
# the Grafana dashboard on a real Prometheus (tests/integration/test_prometheus.py), from Debian's package
# (scripts/apt-install.sh: only when missing; no service started). --no-install-recommends there keeps out the
# recommended prometheus-node-exporter (24 more packages and a daemon).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$HERE/apt-install.sh" scripts/prometheus.sh "install Prometheus 2.x (it ships promtool) at those paths" \
  /usr/bin/prometheus /usr/bin/promtool -- prometheus
