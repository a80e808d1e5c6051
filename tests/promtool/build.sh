#!/usr/bin/env bash
# promtool for the observability tests; the last line of stdout is the binary path.
#
# Debian's own build where apt can fetch it (the `prometheus` package, Prometheus 2.42 on
# bookworm): only its promtool is unpacked from the .deb into the cache (nothing installed, no
# service), keyed by the package version, in a second. It passes the same checks as the module
# build (tests/test_observability.py: `check rules` of every alert and dashboard query, `test
# rules` of tests/promtool/alerts_test.yaml, and the tests that show those can fail), and rules
# Prometheus 2.42 accepts are read by 3.x too. Elsewhere (no apt, no candidate, a failed download)
# or with PROMTOOL_FROM=source: built from github.com/prometheus/prometheus v0.316.0 (Prometheus
# 3.16.0), `remove_all_sd` leaving out the cloud service-discovery plugins that `check rules` /
# `test rules` never use; cold, minutes of CPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}"

from_debian() {
  command -v apt-get > /dev/null && command -v dpkg-deb > /dev/null || return 1
  local version bin work
  version="$(apt-cache policy prometheus 2> /dev/null | sed -nE 's/^ *Candidate: *([^ ]+)$/\1/p')"
  [[ -n "$version" && "$version" != "(none)" ]] || return 1
  bin="$cache/bin/promtool-debian-${version//[^A-Za-z0-9.+-]/_}"
  if [[ ! -x "$bin" ]]; then
    mkdir -p "$cache/bin"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    # apt-get download writes into the working directory; as root it says the _apt user cannot
    # reach a mktemp folder (harmless), hence the silence.
    (cd "$work" && apt-get download -q "prometheus=$version" > /dev/null 2>&1) || return 1
    dpkg-deb -x "$work"/prometheus_*.deb "$work/x" || return 1
    "$work/x/usr/bin/promtool" --version > /dev/null 2>&1 || return 1
    mv -f "$work/x/usr/bin/promtool" "$bin"
  fi
  echo "$bin"
}

if [[ "${PROMTOOL_FROM:-debian}" != source ]] && from_debian; then
  exit 0
fi
exec bash "$here/../build_go_tool.sh" promtool "$here" github.com/prometheus/prometheus/cmd/promtool remove_all_sd
