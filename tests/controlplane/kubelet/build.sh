#!/usr/bin/env bash
# Build what a real node of the test cluster needs into ${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}/bin:
#   crl-kubelet  the upstream kubelet (k8s.io/kubernetes/cmd/kubelet/app), from the module pinned
#                in ../go.mod, so it is exactly the control plane's version
#   crl-pause    the pod sandbox's pause process (../pause), made into the sandbox image
# Rebuilt only when its inputs changed (a hash of the sources, the module pins, this script and
# the compiler). With the control plane's build cache warm this takes a minute or two; cold,
# several. Prints the bin directory as its last line. KUBELET_FORCE=1 rebuilds anyway.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$(cd "$here/.." && pwd)"
cache="${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}"
bindir="$cache/bin"
bin="$bindir/crl-kubelet"

export GOTOOLCHAIN=local
export GOMODCACHE="${GOMODCACHE:-$cache/go/mod}"
export GOCACHE="${GOCACHE:-$cache/go/build}"
export CGO_ENABLED=0

command -v go >/dev/null || { echo "kubelet/build.sh: go not found in PATH (install Go 1.26+)" >&2; exit 1; }
mkdir -p "$bindir"

inputs_hash() {
  { go version; cd "$module" && sha256sum go.mod go.sum kubelet/*.go kubelet/build.sh pause/*.go; } | sha256sum | cut -d' ' -f1
}

# One builder at a time (parallel sessions share the cache).
exec 9>"$bindir/.kubelet.lock"
command -v flock >/dev/null && flock 9

hash="$(inputs_hash)"
if [[ "${KUBELET_FORCE:-0}" == 1 || ! -x "$bin" || "$(cat "$bin.stamp" 2>/dev/null)" != "$hash" ]]; then
  kube="$(sed -nE 's/^[[:space:]]*k8s\.io\/kubernetes (v[0-9.]+)$/\1/p' "$module/go.mod")"
  [[ -n "$kube" ]] || { echo "kubelet/build.sh: no k8s.io/kubernetes version in $module/go.mod" >&2; exit 1; }
  major="${kube#v}"; major="${major%%.*}"
  minor="${kube#v*.}"; minor="${minor%%.*}"
  # The kubelet reports this version on its Node object (nodeInfo.kubeletVersion).
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.gitCommit="
  done
  echo "building crl-kubelet (Kubernetes $kube); this takes minutes without a warm build cache ..." >&2
  start=$SECONDS
  tmp="$bin.tmp.$$"
  trap 'rm -f "$tmp" "$tmp.pause"' EXIT
  (cd "$module" && GOFLAGS=-mod=readonly go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp" ./kubelet)
  (cd "$module" && GOFLAGS=-mod=readonly go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp.pause" ./pause)
  mv -f "$tmp.pause" "$bindir/crl-pause"
  mv -f "$tmp" "$bin"
  trap - EXIT
  echo "$hash" >"$bin.stamp"
  echo "built crl-kubelet in $((SECONDS - start))s" >&2
fi
echo "$bindir"
