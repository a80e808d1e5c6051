#!/usr/bin/env bash
# Build the test control plane and its companions into ${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}/bin:
#   crl-controlplane  etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl,
#                     from the Kubernetes Go modules pinned in go.mod (one role per process)
#   kubectl           a symlink to crl-controlplane, so kubectl matches the server exactly
#   kwok              sigs.k8s.io/kwok (fake nodes and pod lifecycles)
#   helm              helm.sh/helm/v3
#                     both from ./tools, a module that pins them with every module they share
#                     with the control plane at its version (tests/build_go_tool.sh)
# Go module and build caches live outside the checkout. Each piece is rebuilt only when its
# inputs changed (a hash of the sources and module pins: this folder's for crl-controlplane,
# ./tools' for kwok and helm), so repeat runs take about a second; a cold build of
# crl-controlplane takes minutes.
# Prints the bin directory as its last line. CONTROLPLANE_FORCE=1 rebuilds anyway.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}"
bindir="$cache/bin"
bin="$bindir/crl-controlplane"

export GOTOOLCHAIN=local
export GOMODCACHE="${GOMODCACHE:-$cache/go/mod}"
export GOCACHE="${GOCACHE:-$cache/go/build}"
export CGO_ENABLED=0

command -v go >/dev/null || { echo "build.sh: go not found in PATH (install Go 1.26+)" >&2; exit 1; }
mkdir -p "$bindir"

# What the binary is built from: the sources, the module pins, this script and the compiler.
inputs_hash() {
  (cd "$src" && { go version; find . -maxdepth 1 -type f \( -name '*.go' ! -name '*_test.go' \
      -o -name go.mod -o -name go.sum -o -name build.sh \) -print | LC_ALL=C sort | xargs sha256sum; } \
    | sha256sum | cut -d' ' -f1)
}

# Serialize concurrent builders (pytest-xdist workers, parallel sessions).
exec 9>"$bindir/.controlplane.lock"
command -v flock >/dev/null && flock 9

hash="$(inputs_hash)"
if [[ "${CONTROLPLANE_FORCE:-0}" == 1 || ! -x "$bin" || "$(cat "$bin.stamp" 2>/dev/null)" != "$hash" ]]; then
  kube="$(sed -nE 's/^[[:space:]]*k8s\.io\/kubernetes (v[0-9.]+)$/\1/p' "$src/go.mod")"
  [[ -n "$kube" ]] || { echo "build.sh: no k8s.io/kubernetes version in $src/go.mod" >&2; exit 1; }
  major="${kube#v}"; major="${major%%.*}"
  minor="${kube#v*.}"; minor="${minor%%.*}"
  # What upstream's hack/lib/version.sh sets, so /version and `kubectl version` are honest.
  # "archive": built from the released module sources, not from a git checkout.
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    ldflags+=" -X $pkg.gitCommit="  # unknown: the module proxy serves sources, not the commit
  done
  echo "building crl-controlplane (Kubernetes $kube, $(go version | cut -d' ' -f3)); a cold build takes minutes ..." >&2
  start=$SECONDS
  tmp="$bin.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  (cd "$src" && GOFLAGS=-mod=mod go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp" .)
  mv -f "$tmp" "$bin"
  trap - EXIT
  echo "$hash" >"$bin.stamp"
  echo "built crl-controlplane in $((SECONDS - start))s" >&2
fi
ln -sfn crl-controlplane "$bindir/kubectl"

# kwok and helm, each rebuilt only when ./tools changes (tests/build_go_tool.sh).
bash "$src/../build_go_tool.sh" kwok "$src/tools" sigs.k8s.io/kwok/cmd/kwok >/dev/null
bash "$src/../build_go_tool.sh" helm "$src/tools" helm.sh/helm/v3/cmd/helm >/dev/null
KWOK_VERSION="$(sed -nE 's/^[[:space:]]*sigs\.k8s\.io\/kwok (v[0-9.]+)$/\1/p' "$src/tools/go.mod")"
[[ -n "$KWOK_VERSION" ]] || { echo "build.sh: no sigs.k8s.io/kwok version in $src/tools/go.mod" >&2; exit 1; }

# kwok simulates nothing without stages: the defaults kwokctl uses (nodes become Ready and keep
# a lease; pods become Ready; Job pods Succeeded; deleted pods are finalized), taken from the
# kwok module itself so they match the binary. tests/cluster.py passes the file to kwok --config.
stages="$bindir/kwok-stages.yaml"
header="# kwok $KWOK_VERSION default stages (written by tests/controlplane/build.sh)"
if [[ "$(head -n1 "$stages" 2>/dev/null)" != "$header" ]]; then
  kwokdir="$(cd / && GOFLAGS= go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
    | sed -nE 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')"
  [[ -d "$kwokdir/kustomize/stage" ]] || { echo "build.sh: kwok $KWOK_VERSION sources not found" >&2; exit 1; }
  {
    echo "$header"
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      echo "---"
      cat "$kwokdir/kustomize/stage/$f"
    done
  } >"$stages.tmp.$$"
  mv -f "$stages.tmp.$$" "$stages"
fi
echo "$bindir"
