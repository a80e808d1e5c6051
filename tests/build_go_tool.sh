#!/usr/bin/env bash
# Build a Go test tool kept as its own module under tests/ into
#   ${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}/bin/NAME
# with the Go module/build caches outside the checkout.
#
#   build_go_tool.sh NAME SRC_DIR PACKAGE [BUILD_TAGS]
#
# PACKAGE is "." for the module's own main package, or a main package of a dependency the
# module pins (tests/promtool builds github.com/prometheus/prometheus/cmd/promtool). The binary
# is keyed by what it is built from: a hash of SRC_DIR's sources (*.go except tests, go.mod,
# go.sum, build.sh), this script, the package, the tags and the Go version, kept beside it as
# NAME.stamp. A build whose key matches is skipped (about a second), also in a fresh clone of an
# unchanged tree, whose files are all new by their time stamps. The last line of stdout is the
# binary path. Set GOTOOL_FORCE=1 to rebuild anyway. `-trimpath`, as the control plane's build
# (tests/controlplane/build.sh): a package compiled with the same flags at the same module
# version is compiled once in the shared build cache, whichever tool needed it first.
set -euo pipefail

[[ $# -ge 3 ]] || { echo "usage: $0 NAME SRC_DIR PACKAGE [BUILD_TAGS]" >&2; exit 2; }
name="$1"
src="$(cd "$2" && pwd)"
pkg="$3"
tags="${4:-}"
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cache="${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}"
bin="$cache/bin/$name"

export GOTOOLCHAIN=local
export GOMODCACHE="${GOMODCACHE:-$cache/go/mod}"
export GOCACHE="${GOCACHE:-$cache/go/build}"
export GOFLAGS="${GOFLAGS:--mod=mod}"
export CGO_ENABLED=0

command -v go >/dev/null || { echo "build_go_tool.sh: go not found in PATH" >&2; exit 1; }

inputs_hash() {
  { go version; echo "$pkg $tags"; sha256sum "$self"
    (cd "$src" && find . -path ./testdata -prune -o -type f \( -name '*.go' ! -name '*_test.go' \
        -o -name go.mod -o -name go.sum -o -name build.sh \) -print | LC_ALL=C sort | xargs sha256sum)
  } | sha256sum | cut -d' ' -f1
}

stale() {
  [[ "${GOTOOL_FORCE:-0}" == 1 || ! -x "$bin" || "$(cat "$bin.stamp" 2>/dev/null)" != "$hash" ]]
}

mkdir -p "$cache/bin"
hash="$(inputs_hash)"
if stale; then
  # Serialize concurrent builders (.ci/go-tools.sh in the background and a test that needs the
  # tool); re-check once we hold the lock.
  exec 9>"$cache/bin/.$name.lock"
  command -v flock >/dev/null && flock 9
  if stale; then
    echo "building $name ($(go version | cut -d' ' -f3)) ..." >&2
    tmp="$bin.tmp.$$"
    trap 'rm -f "$tmp"' EXIT
    (cd "$src" && go build -trimpath -buildvcs=false -tags "$tags" -ldflags "-s -w" -o "$tmp" "$pkg")
    mv -f "$tmp" "$bin"
    trap - EXIT
    echo "$hash" >"$bin.stamp"
  fi
fi
echo "$bin"
