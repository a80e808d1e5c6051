"""Shared fixtures."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from crl_operator.apply import Kube, load_api_client

from .fixtures.cluster import Cluster
from .fixtures.cluster_build import ClusterError, build
from .fixtures.crdcheck import crdcheck  # noqa: F401  (a fixture for every module)
from .fixtures.docker import SANDBOX_PACKAGES, DockerEngine, debian_image, engine_or_skip
from .fixtures.fetched import mirror  # noqa: F401  (a fixture for every module)
from .fixtures.gateway import start_gateway, task_file, tasks  # noqa: F401  (fixtures for every module)
from .fixtures.local_sandbox import repo  # noqa: F401  (fixtures for every module)
from .fixtures.node import RealNode
from .fixtures.node_build import NodeError
from .fixtures.node_build import missing as real_node_missing
from .fixtures.node_host import node_folder
from .fixtures.openai_server import ScriptedServer
from .fixtures.operator_process import Operator
from .fixtures.paths import ROOT
from .fixtures.schedule import Schedule
from .fixtures.task_records import lite  # noqa: F401  (fixtures for every module)
from .fixtures.toy_training import serve, suite, toy_dir  # noqa: F401  (fixtures for every module)
from .fixtures.trainer import ShortRuns, build_toy_files, short_runs
from .fixtures.vllm import (
    VllmServer,
    build_model,
    rendered_container,
    serving,
    training_run,
    vllm_python_or_skip,
)

log = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def pytest_configure(config: pytest.Config) -> None:
    """Mark each test by the shared resources it uses, run the suite lane by lane on its
    workers, stop shared resources after their last user, and time each group
    (tests/fixtures/schedule.py)."""
    config.pluginmanager.register(Schedule(config), "crl-schedule")
    config.addinivalue_line(
        "markers",
        "backends(*names): the sandbox backends a red-team attack runs on; its other `backend`"
        " parametrizations are deselected",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``backend`` parametrizations a test's ``backends`` marker leaves out (the
    red-team modules repeat only some attacks on Docker: tests/fixtures/redteam.py)."""
    kept, dropped = [], []
    for item in items:
        allowed = {name for mark in item.iter_markers("backends") for name in mark.args}
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("backend") if callspec is not None else None
        (dropped if allowed and backend is not None and backend not in allowed else kept).append(
            item
        )
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real control plane with the project's CRDs and three kwok nodes, shared by the session.

    Built from Go modules on first use (tests/controlplane/build.sh: minutes cold, a second
    warm). Without Go the tests are skipped, except under CI=true where that is a failure.
    """
    if shutil.which("go") is None:
        if os.environ.get("CI"):
            pytest.fail("Go is needed in CI to build the test control plane (tests/controlplane)")
        pytest.skip("Go is not installed: the test control plane is built from Go modules")
    try:
        bin_dir = build()
    except ClusterError as error:
        pytest.fail(str(error))
    instance = Cluster(tmp_path_factory.mktemp("cluster"), bin_dir=bin_dir)
    try:
        instance.start()
    except ClusterError as error:
        pytest.fail(f"the test control plane did not start: {error}")
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A real vLLM server (tests/fixtures/vllm.py) serving a tiny toy model with the arguments
    the operator's LoRA TrainingRun Deployment gives it, shared by the session.

    Its environment comes from `bash .ci/vllm-env.sh`; without it the tests are skipped, except
    under CI=true or CRL_VLLM=1 where that is a failure.
    """
    python = vllm_python_or_skip()
    workdir = tmp_path_factory.mktemp("vllm")
    model = build_model(workdir / "model")
    server = VllmServer(python, rendered_container(training_run(model)), workdir / "vllm.log")
    with serving(server):
        yield server


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    """A real Docker engine (tests/fixtures/docker.py) on its own socket, shared by the session;
    stopped, with every container it ran, at the end.

    It needs root, dockerd and debootstrap (`apt-get install docker.io debootstrap`); without
    them the tests are skipped with the reason, except under CI=true where that is a failure.
    """
    with engine_or_skip(tmp_path_factory.mktemp("docker")) as process:
        yield process.engine


@pytest.fixture(scope="session")
def docker_base(docker_engine: DockerEngine) -> str:
    """The tag of a Debian bookworm image with bash, git and Python 3 in the engine: built from
    Debian packages once per recipe and kept in the cache (tests/fixtures/docker.py)."""
    return debian_image(docker_engine, SANDBOX_PACKAGES)


@pytest.fixture(scope="session")
def real_node(
    cluster: Cluster, docker_engine: DockerEngine, docker_base: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealNode]:  # fmt: skip
    """A real node (tests/fixtures/node.py: kubelet, containerd, CNI) in the session's cluster, with
    the Debian sandbox base image (``docker_base``) loaded; stopped at the end, and the session
    fails if it leaves a process, mount, cgroup or network link behind.

    Pods reach it only through ``real_node.placement`` (label and taint). Without root,
    containerd, the CNI plugins or Go the tests are skipped, except under CI=true (a failure).
    """
    reason = real_node_missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a real node: {reason}")
        pytest.skip(reason)
    with node_folder(tmp_path_factory.mktemp("node")) as folder:
        node = RealNode(cluster, folder)
        try:
            node.start()
            node.load_image(docker_engine.env(), docker_base)
        except NodeError as error:
            with contextlib.suppress(NodeError):
                node.stop()
            pytest.fail(f"the real node did not start: {error}")
        try:
            yield node
        finally:
            node.stop()


@pytest.fixture(scope="session")
def toy_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the toy model (``model/``) and the toy suite (``suite/``)."""
    pytest.importorskip("torch")
    return build_toy_files(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="session", name="short_runs")
def short_runs_fixture(toy_files: Path, tmp_path_factory: pytest.TempPathFactory) -> ShortRuns:
    """The toy's two-step TrainingRun run twice, on a terminal and into pipes
    (tests/fixtures/trainer.py), for the tests that read a short run."""
    pytest.importorskip("trl")
    return short_runs(toy_files, tmp_path_factory.mktemp("short-runs"))


@pytest.fixture(scope="session")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """One ``python -m crl_operator`` for the session's cluster, watching every namespace
    (resync every 20 s, images named under ``OTHER_REGISTRY``); the tests read its metrics as
    differences, and one that kills it restarts it."""
    op = Operator(cluster, tmp_path_factory.mktemp("operator") / "operator.log")
    op.proc.start()
    Operator.running = op
    try:
        yield op
    finally:
        Operator.running = None
        op.proc.stop()


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    """Reads for the assertions (the writes go through kubectl, as a user's would)."""
    return Kube(load_api_client(str(cluster.kubeconfig)), field_manager="e2e-test")


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount), deleted after the test."""
    name = cluster.namespace()
    yield name
    cluster.delete_namespace(name)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    """A scripted OpenAI-compatible server over real HTTP (tests/fixtures/openai_server.py),
    started for the test and stopped after it."""
    async with ScriptedServer() as running:
        yield running
