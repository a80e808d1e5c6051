#!/usr/bin/env bash
# Builds every test tool the project makes from Go modules, one after another, into
# ${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}/bin: the control plane (etcd, kube-apiserver,
# controller-manager, scheduler, kwok, helm), the kubelet, Kueue's manager, promtool, Argo CD's
# health library and crdcheck. Each build script skips its build when its binary is up to date
# (about a second); cold, the whole takes about half an hour on 2 cores. `.ci/run` starts this in
# the background; the tests would otherwise build each tool on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
for script in tests/controlplane/build.sh tests/controlplane/kubelet/build.sh \
    tests/kueue/build.sh tests/promtool/build.sh tests/argocdhealth/build.sh \
    tests/crdcheck/build.sh; do
    started=$SECONDS
    echo "--- $script"
    bash "$script"
    echo "--- $script: $((SECONDS - started)) s"
done
