# The operator's image: the base install and the `operator` extra (kopf, the Kubernetes client,
# prometheus-client); no torch. Built by images/build.sh (docs/images.md).
#
# BASE_IMAGE is any Debian-like image with python3 >= 3.11 and its venv module (the public
# default: python:3.12-slim-bookworm); both stages use it, so the virtual environment copied
# from the builder finds the same interpreter at the same path.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS builder
WORKDIR /src
# uv at the version requirements/lock.txt pins (as .ci/uv.sh does), in a venv of its own.
COPY requirements/lock.txt requirements/lock.txt
RUN python3 -m venv /opt/uv \
 && /opt/uv/bin/pip install --no-cache-dir --quiet \
      "uv==$(sed -n 's/^uv==\([^ ;]*\).*/\1/p' requirements/lock.txt)" \
 && /opt/uv/bin/uv venv --quiet --python "$(command -v python3)" /opt/venv
# No bytecode in the image: compiled, the Kubernetes client alone is 30 MB more, and the image
# would pass 200 MB. Python compiles what the operator imports at its start (about a second)
# into PYTHONPYCACHEPREFIX below, under /tmp (the chart's writable emptyDir).
ENV UV_NO_CACHE=1 UV_PYTHON=/opt/venv/bin/python
# Dependencies first (a layer that changes only with pyproject.toml or the lock), exactly the
# versions of the lock, then the project itself without dependencies.
COPY pyproject.toml README.md ./
# The Kubernetes client ships an asyncio copy of itself (kubernetes/aio, 80 MB with bytecode)
# that nothing here imports (kopf talks to the API with aiohttp): left out.
RUN /opt/uv/bin/uv pip install --quiet -c requirements/lock.txt \
      -r pyproject.toml --extra operator \
 && rm -rf /opt/venv/lib/python3*/site-packages/kubernetes/aio
COPY worker/src worker/src
COPY operator/src operator/src
COPY cli/src cli/src
RUN /opt/uv/bin/uv pip install --quiet -c requirements/lock.txt \
      --build-constraints requirements/lock.txt --no-deps .

FROM ${BASE_IMAGE}
# The chart runs the operator as 65532 with a read-only root file system and a writable /tmp.
RUN groupadd --gid 65532 crl \
 && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/crl --shell /usr/sbin/nologin crl
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /home/crl
# Last: the revision changes with every commit, and an ARG invalidates the steps after it.
ARG VERSION=0.0.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="coderepairrl-operator" \
      org.opencontainers.image.description="CodeRepairRL's Kubernetes operator (python -m crl_operator)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/coderepairrl/coderepairrl" \
      org.opencontainers.image.licenses="Apache-2.0"
CMD ["python", "-m", "crl_operator"]
