#!/usr/bin/env bash
# Build argocdhealth (Argo CD v3.5.7's Lua health code in a small CLI) into the cache; the last
# line of stdout is the binary path. The first build takes minutes, later runs a second. Its
# go.mod keeps every module it shares with the control plane at the control plane's version (the
# compiled packages are shared on a cold machine; tests/test_crdcheck.py checks the pins).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../build_go_tool.sh" argocdhealth "$here" .
