#!/usr/bin/env bash
# Build crdcheck (Kubernetes' own CRD and object validation, from the modules this folder's
# go.mod pins) into ${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}/bin/crdcheck; the last line of
# stdout is the binary path. Rebuilt only when its sources change (tests/build_go_tool.sh);
# GOTOOL_FORCE=1 rebuilds anyway. Every module go.mod shares with ../controlplane is pinned to the
# version the control plane's build uses (`go list -m all` there), so a cold build compiles only
# what the control plane does not (minutes alone, about 20 s after it); tests/test_crdcheck.py
# checks that the two stay in step when Kubernetes is bumped.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../build_go_tool.sh" crdcheck "$here" .
