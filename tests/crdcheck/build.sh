#!/usr/bin/env bash
# Build crdcheck (API-server-exact validation of CRDs and custom objects) into
#   ${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}/bin/crdcheck
# with Go module/build caches kept outside the checkout. Skips the build when the
# binary is newer than every source file (*.go except tests, go.mod, go.sum, this
# script), so repeat runs take about a second. The last line of stdout is the
# binary path. Set CRDCHECK_FORCE=1 to rebuild anyway.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}"
bin="$cache/bin/crdcheck"

export GOTOOLCHAIN=local
export GOMODCACHE="${GOMODCACHE:-$cache/go/mod}"
export GOCACHE="${GOCACHE:-$cache/go/build}"
export GOFLAGS="${GOFLAGS:--mod=mod}"
export CGO_ENABLED=0

stale() {
  [[ "${CRDCHECK_FORCE:-0}" == 1 || ! -x "$bin" ]] && return 0
  [[ -n "$(find "$src" -path "$src/testdata" -prune -o -type f \
      \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum -o -name build.sh \) \
      -newer "$bin" -print -quit)" ]]
}

mkdir -p "$cache/bin"
if stale; then
  # Serialize concurrent builders (e.g. pytest-xdist workers); re-check once we hold the lock.
  exec 9>"$cache/bin/.crdcheck.lock"
  command -v flock >/dev/null && flock 9
  if stale; then
    command -v go >/dev/null || { echo "build.sh: go not found in PATH" >&2; exit 1; }
    echo "building crdcheck ($(go version | cut -d' ' -f3)) ..." >&2
    tmp="$bin.tmp.$$"
    trap 'rm -f "$tmp"' EXIT
    (cd "$src" && go build -buildvcs=false -ldflags "-s -w" -o "$tmp" .)
    mv -f "$tmp" "$bin"
    trap - EXIT
  fi
fi
echo "$bin"
