#!/usr/bin/env bash
# Builds the component images from this checkout (docs/images.md):
#
#   bash images/build.sh [options] [operator] [worker] [trainer-cpu] [trainer-cuda]
#
# (no component: all four). Tags are REGISTRY/NAME:VERSION with VERSION from pyproject.toml:
# operator:V, worker:V, trainer:V-cpu, trainer:V-cuda. Options:
#
#   --registry R          where the images are to live (default ghcr.io/coderepairrl); the
#                         chart's image.registry takes the same value
#   --base-image I        the Python base of every image but trainer-cuda
#                         (default python:3.12-slim-bookworm)
#   --cuda-base-image I   the base of trainer-cuda (default nvidia/cuda:13.0.1-base-ubuntu24.04)
#   --torch-index URL     where trainer-cpu's torch comes from (default the PyTorch CPU index;
#                         empty: PyPI's torch, which brings the CUDA libraries)
#   --network MODE        the network of the build's RUN steps (e.g. host: an engine without a
#                         default bridge)
#   --no-cache            build every step again (a cold build; the base image is kept)
#   --push                push each image after building it
#
# Installs are exactly the versions of requirements/lock.txt (as .ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

registry=ghcr.io/coderepairrl
base=python:3.12-slim-bookworm
cuda_base=nvidia/cuda:13.0.1-base-ubuntu24.04
torch_index=https://download.pytorch.org/whl/cpu
network=() # and other arguments of docker build
push=0
components=()
while [ $# -gt 0 ]; do
    case "$1" in
        --registry) registry=${2%/}; shift 2 ;;
        --base-image) base=$2; shift 2 ;;
        --cuda-base-image) cuda_base=$2; shift 2 ;;
        --torch-index) torch_index=$2; shift 2 ;;
        --network) network=(--network "$2"); shift 2 ;;
        --no-cache) network+=(--no-cache); shift ;;
        --push) push=1; shift ;;
        operator | worker | trainer-cpu | trainer-cuda) components+=("$1"); shift ;;
        -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "images/build.sh: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
[ ${#components[@]} -gt 0 ] || components=(operator worker trainer-cpu trainer-cuda)

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
revision=$(git rev-parse HEAD 2> /dev/null || echo unknown)
common=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision" "${network[@]}")

build() { # build TAG DOCKERFILE ARGS...
    local tag=$1 file=$2
    shift 2
    echo "==> $tag" >&2
    if ! docker build --file "$file" --tag "$tag" "${common[@]}" "$@" .; then
        echo "images/build.sh: building $tag from $file failed (the failing step is above)" >&2
        exit 1
    fi
    if [ "$push" = 1 ]; then docker push "$tag"; fi
}

for component in "${components[@]}"; do
    case "$component" in
        operator | worker)
            build "$registry/$component:$version" "images/$component.Dockerfile" \
                --build-arg "BASE_IMAGE=$base" ;;
        trainer-cpu)
            build "$registry/trainer:$version-cpu" images/trainer.Dockerfile \
                --build-arg "BASE_IMAGE=$base" --build-arg "TORCH_INDEX_URL=$torch_index" \
                --build-arg VARIANT=cpu ;;
        trainer-cuda)
            build "$registry/trainer:$version-cuda" images/trainer.Dockerfile \
                --build-arg "BASE_IMAGE=$cuda_base" --build-arg TORCH_INDEX_URL= \
                --build-arg VARIANT=cuda ;;
    esac
done
