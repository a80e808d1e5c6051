# The worker's image: the pool gateway (python -m crl_worker.pool) and the benchmark runner
# (python -m crl_worker.bench): the base install and the `worker` extra, plus git (local
# sandboxes clone repositories). Built by images/build.sh (docs/images.md).
#
# BASE_IMAGE: see operator.Dockerfile (default python:3.12-slim-bookworm).
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS builder
WORKDIR /src
COPY requirements/lock.txt requirements/lock.txt
RUN python3 -m venv /opt/uv \
 && /opt/uv/bin/pip install --no-cache-dir --quiet \
      "uv==$(sed -n 's/^uv==\([^ ;]*\).*/\1/p' requirements/lock.txt)" \
 && /opt/uv/bin/uv venv --quiet --python "$(command -v python3)" /opt/venv
ENV UV_NO_CACHE=1 UV_COMPILE_BYTECODE=1 UV_PYTHON=/opt/venv/bin/python
# strip, for pyarrow's shared libraries (shipped with their symbol tables: 20 MB).
RUN if ! command -v strip > /dev/null; then \
      apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends binutils > /dev/null; \
    fi
COPY pyproject.toml README.md ./
# Left out to keep the image under 400 MB, none of it imported by the worker: the Kubernetes
# client's asyncio copy of itself (kubernetes/aio) and its bytecode (30 MB; compiled at import,
# about a second); of pyarrow (which reads Parquet task files) Arrow Flight, the S3 file
# system, C++ headers, Cython sources, its own tests and its libraries' symbol tables (90 MB);
# and uv's binary (38 MB): in a cluster the sandboxes are pods, and a local sandbox makes its
# venv with python -m venv without it. The last line checks that what the worker imports still
# imports.
RUN /opt/uv/bin/uv pip install --quiet -c requirements/lock.txt \
      -r pyproject.toml --extra worker \
 && cd /opt/venv/lib/python3*/site-packages \
 && rm -rf /opt/venv/bin/uv /opt/venv/bin/uvx kubernetes/aio pyarrow/include pyarrow/tests pyarrow/*flight* pyarrow/_s3fs.* \
      pyarrow/libarrow_s3.* pyarrow/_pyarrow_cpp_tests.* \
 && find pyarrow \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' \) -delete \
 && strip --strip-unneeded pyarrow/*.so* \
 && find kubernetes -name __pycache__ -prune -exec rm -rf {} + \
 && /opt/venv/bin/python -c 'import pyarrow.parquet, pyarrow.fs, kubernetes.client, docker'
COPY worker/src worker/src
COPY operator/src operator/src
COPY cli/src cli/src
RUN /opt/uv/bin/uv pip install --quiet -c requirements/lock.txt \
      --build-constraints requirements/lock.txt --no-deps .

FROM ${BASE_IMAGE}
RUN if ! command -v git > /dev/null; then \
      apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git > /dev/null \
      && apt-get clean \
      && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /usr/share/doc/* /usr/share/man/* \
           /usr/share/locale/*; \
    fi \
 && groupadd --gid 65532 crl \
 && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/crl --shell /usr/sbin/nologin crl
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN python -c 'import crl_worker.pool.__main__, crl_worker.bench.__main__' && git --version
USER 65532:65532
WORKDIR /home/crl
# Last: the revision changes with every commit, and an ARG invalidates the steps after it.
ARG VERSION=0.0.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="coderepairrl-worker" \
      org.opencontainers.image.description="CodeRepairRL's pool gateway and benchmark runner" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/coderepairrl/coderepairrl" \
      org.opencontainers.image.licenses="Apache-2.0"
CMD ["crl", "--help"]
