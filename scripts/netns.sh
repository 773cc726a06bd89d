#!/usr/bin/env bash
# iproute2 for the network-partition tests (tests/integration/test_partitions.py, netpart.py), from Debian's
# packages, and a check that this machine lets the tests make network namespaces (root, `ip netns`).
#
# Idempotent: installs only when /usr/sbin/ip is missing. Anything missing is said plainly and exits non-zero,
# because the partition tests fail without it (they never skip).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$HERE/apt-install.sh" scripts/netns.sh "install iproute2 (the ip command) at that path" \
  /usr/sbin/ip -- iproute2
if [[ "$(id -u)" != 0 ]]; then
  echo "scripts/netns.sh: the partition tests make network namespaces and veth pairs, which needs root;" \
       "run make test as root (a container with CAP_NET_ADMIN and CAP_SYS_ADMIN)" >&2
  exit 1
fi
probe="asnp-probe-$$"
if ! err=$(ip netns add "$probe" 2>&1); then
  echo "scripts/netns.sh: \`ip netns add\` fails here ($err); the partition tests need it:" \
       "give the container CAP_NET_ADMIN and CAP_SYS_ADMIN" >&2
  exit 1
fi
ip netns del "$probe"
