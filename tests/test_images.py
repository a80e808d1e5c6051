"""The component images (images/, docs/images.md) against a real engine (tests/fixtures/docker.py).

Only the operator's image is built here: about 25 s cold (uv and the operator's wheels from
PyPI), a second warm, since the engine's data root and its build cache live in the cache folder.
The worker's (about 40 s cold) is built by ``perf/images.py``, which prints sizes and build
times. The trainer's is built by no test: about 4 minutes cold, 6.5 GB, and 14 GB of disk while
it builds (torch with the CUDA libraries), too much for every CI run.
"""

from __future__ import annotations

import json
import subprocess
import tomllib

import pytest

from .fixtures.docker import DockerEngine
from .fixtures.paths import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
#: The size goal of the operator's image (docs/images.md), less the public python base's size
#: (python:3.12-slim-bookworm, about 125 MB, like the fixtures' Debian python base).
OPERATOR_OVER_BASE_MB = 200 - 125


def build(engine: DockerEngine, *args: str) -> subprocess.CompletedProcess[str]:
    """``bash images/build.sh ARGS`` against the engine (builds use the host's network: the
    test engine has no default bridge)."""
    return subprocess.run(
        ["bash", "images/build.sh", "--registry", "crl-test", "--network", "host", *args],
        cwd=ROOT,
        env=engine.env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def inspect(engine: DockerEngine, tag: str) -> dict[str, object]:
    done = engine.cli("image", "inspect", tag)
    assert done.returncode == 0, done.stderr
    [found] = json.loads(done.stdout)
    return dict(found)


@pytest.fixture(scope="module")
def operator_image(docker_engine: DockerEngine, docker_base: str) -> str:
    done = build(docker_engine, "--base-image", docker_base, "operator")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return f"crl-test/operator:{VERSION}"


def test_operator_image_is_small_labelled_and_non_root(
    docker_engine: DockerEngine, docker_base: str, operator_image: str
) -> None:
    image = inspect(docker_engine, operator_image)
    config = image["Config"]
    assert isinstance(config, dict)
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.title"] == "coderepairrl-operator"
    assert len(labels["org.opencontainers.image.revision"]) == 40  # the commit built
    assert config["User"] == "65532:65532"  # the user the chart runs it as
    base = inspect(docker_engine, docker_base)
    added = (int(str(image["Size"])) - int(str(base["Size"]))) / 1e6
    assert added <= OPERATOR_OVER_BASE_MB, f"the operator adds {added:.0f} MB to its base"


def test_operator_image_runs_as_the_chart_runs_it(
    docker_engine: DockerEngine, operator_image: str
) -> None:
    # The chart's pod: non-root, read-only root file system, a writable /tmp, no network here.
    script = (
        "python -m crl_operator --help | grep -q -- --image-registry"
        " && python -c 'import kopf, kubernetes.client, crl_operator.handlers'"
        " && ! python -c 'import torch' 2> /dev/null && echo ok"
    )
    done = docker_engine.cli(
        "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--user",
        "65532:65532", "--entrypoint", "sh", operator_image, "-c", script,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "ok\n", done.stdout + done.stderr


def test_a_failed_build_names_the_image_and_the_step(docker_engine: DockerEngine) -> None:
    done = build(docker_engine, "--base-image", "crl-test/no-such-base:1", "operator")
    assert done.returncode == 1
    assert (
        f"images/build.sh: building crl-test/operator:{VERSION} from images/operator.Dockerfile "
        "failed (the failing step is above)"
    ) in done.stderr
    # Docker's own words: the step (on standard output) and why it failed
    assert "FROM ${BASE_IMAGE} AS builder" in done.stdout.splitlines()[-1]
    assert "no such host" in done.stderr or "not found" in done.stderr
    wrong = build(docker_engine, "--registri", "x")
    assert wrong.returncode == 2 and "unknown argument --registri" in wrong.stderr
