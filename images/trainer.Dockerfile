# The trainer's image (python -m crl_worker.train under accelerate): the `train` extra and
# DeepSpeed, built against the torch installed first. Built by images/build.sh in two variants
# (docs/images.md):
#
# - cpu:  BASE_IMAGE=python:3.12-slim-bookworm, TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#         (torch's CPU wheel: no CUDA libraries).
# - cuda: BASE_IMAGE=an nvidia/cuda image, TORCH_INDEX_URL empty: PyPI's torch with the CUDA
#         libraries the lock pins (nvidia-* wheels).
#
# A BASE_IMAGE without python3 and its venv module (the CUDA images) gets them from apt.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS python
RUN if ! python3 -c 'import ensurepip, venv' 2> /dev/null; then \
      apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
           python3 python3-venv ca-certificates > /dev/null \
      && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    fi

FROM python AS builder
ARG TORCH_INDEX_URL=
WORKDIR /src
COPY requirements/lock.txt requirements/lock.txt
RUN python3 -m venv /opt/uv \
 && /opt/uv/bin/pip install --no-cache-dir --quiet \
      "uv==$(sed -n 's/^uv==\([^ ;]*\).*/\1/p' requirements/lock.txt)" \
 && /opt/uv/bin/uv venv --quiet --python "$(command -v python3)" /opt/venv
ENV UV_NO_CACHE=1 UV_COMPILE_BYTECODE=1 UV_PYTHON=/opt/venv/bin/python
# torch first, from TORCH_INDEX_URL when given (its CPU wheel satisfies the lock's ==pin).
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
      /opt/uv/bin/uv pip install --quiet -c requirements/lock.txt \
        --index-url "$TORCH_INDEX_URL" --no-deps torch; \
    fi
COPY pyproject.toml README.md ./
RUN /opt/uv/bin/uv pip install --quiet -c requirements/lock.txt \
      -r pyproject.toml --extra train setuptools wheel \
 && /opt/uv/bin/uv pip install --quiet -c requirements/lock.txt --no-build-isolation deepspeed
COPY worker/src worker/src
COPY operator/src operator/src
COPY cli/src cli/src
RUN /opt/uv/bin/uv pip install --quiet -c requirements/lock.txt \
      --build-constraints requirements/lock.txt --no-deps .

FROM python
RUN if ! command -v git > /dev/null; then \
      apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git > /dev/null \
      && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /usr/share/doc/*; \
    fi \
 && groupadd --gid 65532 crl \
 && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/crl --shell /usr/sbin/nologin crl
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN python -c 'import crl_worker.train.__main__, deepspeed' && accelerate --help > /dev/null
USER 65532:65532
WORKDIR /home/crl
# Last: the revision changes with every commit, and an ARG invalidates the steps after it.
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="coderepairrl-trainer" \
      org.opencontainers.image.description="CodeRepairRL's GRPO trainer (TRL, accelerate, DeepSpeed), ${VARIANT} variant" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/coderepairrl/coderepairrl" \
      org.opencontainers.image.licenses="Apache-2.0"
CMD ["python", "-m", "crl_worker.train", "--help"]
