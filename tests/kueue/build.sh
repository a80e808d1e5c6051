#!/usr/bin/env bash
# Build Kueue's manager (sigs.k8s.io/kueue v0.17.0, the newest release the module proxy serves,
# `go list -m -versions sigs.k8s.io/kueue`) from its Go module into the cache; the last line of
# stdout is the binary path. Its CRDs come from the same module version (tests/kueue.py reads
# them from the module cache, config/components/crd/bases). Upgrade: `go get -tool
# sigs.k8s.io/kueue/cmd/kueue@vX.Y.Z && go mod tidy` here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../build_go_tool.sh" kueue "$here" sigs.k8s.io/kueue/cmd/kueue
