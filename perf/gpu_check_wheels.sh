#!/usr/bin/env bash
# The wheels perf/gpu_check.py needs on a GPU machine that has PyTorch, transformers, accelerate
# and PEFT but no network (docs/training.md#gpu-check): the trainer's other Python libraries, at
# the versions requirements/lock.txt pins, for CPython 3.12 on x86-64 Linux.
#
#   bash perf/gpu_check_wheels.sh [DEST]      # default DEST: .whl (ignored by git: add it to
#                                             # .git/info/exclude)
#
# - trl, datasets, dill, multiprocess: TRL and its dataset library (pure Python);
# - pydantic, pydantic-core, annotated-types, typing-inspection: the project's API models;
# - uv: local sandboxes create their virtual environments with it (without it they fall back
#   to `python -m venv`, which needs the interpreter's ensurepip).
# DeepSpeed is not needed (one GPU, ZeRO stage 0). About 22 MiB in all, uv 17 of them.
set -euo pipefail

dest=${1:-.whl}
root=$(cd "$(dirname "$0")/.." && pwd)
lock="$root/requirements/lock.txt"
names=(trl datasets dill multiprocess pydantic pydantic-core annotated-types typing-inspection uv)
pins=()
for name in "${names[@]}"; do
    pin=$(grep -E "^${name}==" "$lock" || true)
    if [[ -z "$pin" ]]; then
        echo "gpu_check_wheels: $name is not pinned in $lock" >&2
        exit 1
    fi
    pins+=("$pin")
done
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$dest" "${pins[@]}"
du -ch "$dest"/*.whl | tail -1
