#!/usr/bin/env bash
# Writes requirements/vllm-lock.txt: the real vLLM's own environment (requirements/vllm.in), for
# Linux x86_64 and the Python CI runs, with torch taken from PyPI (requirements/vllm-overrides.txt).
# Arguments are passed to `uv pip compile` (--upgrade, --upgrade-package X). The environment
# itself is made by .ci/vllm-env.sh, keyed by this lock's hash.
set -euo pipefail

cd "$(dirname "$0")/.."
source .ci/uv.sh
"$UV" pip compile requirements/vllm.in --override requirements/vllm-overrides.txt \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --custom-compile-command "bash requirements/vllm-lock.sh" \
    -o requirements/vllm-lock.txt "$@"
