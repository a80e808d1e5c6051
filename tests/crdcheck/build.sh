#!/usr/bin/env bash
# Build crdcheck (Kubernetes' own CRD and object validation, from the modules this folder's
# go.mod pins) into ${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}/bin/crdcheck; the last line of
# stdout is the binary path. Rebuilt only when its sources change (tests/build_go_tool.sh);
# GOTOOL_FORCE=1 rebuilds anyway.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../build_go_tool.sh" crdcheck "$here" .
