#!/usr/bin/env bash
# Build Prometheus' promtool (github.com/prometheus/prometheus v0.316.0, i.e. Prometheus 3.16.0)
# into the cache; the last line of stdout is the binary path. `remove_all_sd` leaves out the
# cloud service-discovery plugins that `promtool check rules` / `test rules` never use.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../build_go_tool.sh" promtool "$here" github.com/prometheus/prometheus/cmd/promtool remove_all_sd
