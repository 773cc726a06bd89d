#!/usr/bin/env bash
# Helm for the chart tests (tests/integration/test_helm.py): helm.sh/helm/v4 at $HELM_VERSION, built from source
# with `go install` through the Go module proxy (the Go client checks every module against sum.golang.org).
#
# Kept once per machine, named by the version and the platform:
#   ${AGENTS_STREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agents-stream}/helm-<version>-<os>-<arch>/helm
# and .data/helm links to it, so a fresh clone on a machine that built it once starts at once. Idempotent: builds
# only when that binary has no stamp (an interrupted build starts again), one build at a time per machine (flock).
#
# Go: a `go` of 1.21 or later (PATH, else /usr/local/go/bin) fetches the toolchain helm's go.mod asks for (1.26)
# from the module proxy itself (GOTOOLCHAIN=auto). Where there is none, Debian's golang-go (1.19, too old to do that)
# is installed (scripts/apt-install.sh) and downloads that toolchain as the module it is (golang.org/toolchain).
# From an empty Go build cache it took 23 minutes on 2 cores shared with four other test runs (7.7 CPU-minutes);
# 44 s with the cache warm. Anything missing is said plainly and exits non-zero: the chart tests fail without helm
# (they never skip).
set -euo pipefail

HELM_VERSION=v4.3.2
# the toolchain fetched where only a Go older than 1.21 is at hand (helm v4.3.2's go.mod: go 1.26.0)
GO_TOOLCHAIN=go1.26.8

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LINK=$ROOT/.data/helm
CACHE=${AGENTS_STREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agents-stream}

goos=$(uname -s | tr '[:upper:]' '[:lower:]')
case "$(uname -m)" in
  x86_64 | amd64) goarch=amd64 ;;
  aarch64 | arm64) goarch=arm64 ;;
  *) echo "scripts/helm.sh: no Go toolchain for machine $(uname -m); put a helm $HELM_VERSION at $LINK" >&2; exit 1 ;;
esac
DIR=$CACHE/helm-$HELM_VERSION-$goos-$goarch
mkdir -p "$CACHE" "$ROOT/.data"

link() {
  if [[ -e "$LINK" && ! -L "$LINK" ]]; then rm -rf "$LINK"; fi  # a file left here by hand would shadow the link
  ln -sfn "$DIR/helm" "$LINK"
}

if [[ -f "$DIR/.installed" && -x "$DIR/helm" ]]; then
  link
  exit 0
fi

# A go new enough to switch toolchains by itself (1.21+), or nothing.
go_at_hand() {
  local candidate version
  for candidate in "$(command -v go || true)" /usr/local/go/bin/go; do
    [[ -n "$candidate" && -x "$candidate" ]] || continue
    version=$(GOTOOLCHAIN=local "$candidate" env GOVERSION 2>/dev/null || true)  # go1.26.8
    if [[ "$version" =~ ^go1\.([0-9]+) ]] && (( BASH_REMATCH[1] >= 21 )); then
      echo "$candidate"
      return
    fi
  done
}

exec 9>"$CACHE/helm.lock"
if ! flock -w 1200 9; then
  echo "scripts/helm.sh: another build held $CACHE/helm.lock for 20 minutes; is one stuck?" >&2
  exit 1
fi
if [[ ! -f "$DIR/.installed" ]]; then  # the build that held the lock may have made it meanwhile
  started=$(date +%s)
  rm -rf "$DIR"
  mkdir -p "$DIR"
  GO=$(go_at_hand)
  if [[ -z "$GO" ]]; then
    echo "scripts/helm.sh: no Go 1.21+ here; installing Debian's golang-go to fetch Go $GO_TOOLCHAIN with"
    bash "$ROOT/scripts/apt-install.sh" scripts/helm.sh \
      "install Go 1.21 or later (https://go.dev/dl/) or put a helm $HELM_VERSION at $LINK" /usr/bin/go -- golang-go
    # The toolchain module's zip holds a whole Go; module zips keep no file modes, so the programs are made
    # executable in a copy (the module cache is read-only).
    module=golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.$goos-$goarch
    if ! fetched=$(cd "$CACHE" && /usr/bin/go mod download -json "$module"); then
      echo "scripts/helm.sh: could not download $module (see above); the Go module proxy must be reachable" >&2
      exit 1
    fi
    source_dir=$(printf '%s\n' "$fetched" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    rm -rf "$CACHE/$GO_TOOLCHAIN"
    cp -r "$source_dir" "$CACHE/$GO_TOOLCHAIN"
    chmod -R u+w "$CACHE/$GO_TOOLCHAIN"
    chmod +x "$CACHE/$GO_TOOLCHAIN"/bin/* "$CACHE/$GO_TOOLCHAIN"/pkg/tool/*/*
    GO=$CACHE/$GO_TOOLCHAIN/bin/go
  fi
  echo "scripts/helm.sh: building helm $HELM_VERSION with $("$GO" version) into $DIR (minutes, once per machine)"
  # -X ...version: what helm's own Makefile stamps (without it `helm version` says only v4.3)
  if ! GOTOOLCHAIN=auto GOFLAGS=-mod=mod GOBIN="$DIR" "$GO" install \
      -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"; then
    rm -rf "$DIR"
    echo "scripts/helm.sh: go install helm.sh/helm/v4/cmd/helm@$HELM_VERSION failed (see above); the Go module" \
         "proxy ($("$GO" env GOPROXY)) must be reachable" >&2
    exit 1
  fi
  if ! "$DIR/helm" version --short | grep -q "^$HELM_VERSION\b"; then
    echo "scripts/helm.sh: the helm built into $DIR does not say it is $HELM_VERSION: $("$DIR/helm" version --short)" >&2
    exit 1
  fi
  touch "$DIR/.installed"
  echo "scripts/helm.sh: built in $(( $(date +%s) - started )) s"
fi
link
