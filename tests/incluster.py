"""The project running in the test cluster as a user runs it: images, the chart, a RolloutPool.

Helpers shared by tests/test_real_node.py and perf/real_node.py, on a `Cluster` with a
`RealNode` and the Docker engine of tests/fixtures/docker.py:

- :func:`build_image`: ``images/build.sh`` of one component on the Debian base;
- :func:`pin_namespace`: every pod of a namespace on the real node (the namespace's
  node-selector and default-toleration annotations, which the test API server enforces);
- :func:`install_operator`: ``helm install`` of the chart, as the README has it, into a
  namespace pinned to the real node;
- :func:`start_pool`: a RolloutPool whose tasks come from a ConfigMap, its gateway moved onto the
  real node; returns a :class:`Gateway` to lease from (at the gateway pod's IP: no kube-proxy);
- :func:`local_volume`: a ``local`` PersistentVolume of a node directory and its claim;
- :func:`host_python_trainer_image` and :func:`share_host_python`: a test-only stand-in for the
  trainer image (the real one does not fit the test machines' disk) whose Python packages are
  this environment's, hard-linked onto a volume.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess
import sys
import sysconfig
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from crl_worker.sandbox.images import TaskImageBuilder
from crl_worker.sandbox.pods import pod_ready
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task

from .cluster import Cluster
from .fixtures.docker import DockerEngine
from .node import RealNode
from .paths import ROOT

#: The project's version: the tag of the images images/build.sh makes.
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CHART = ROOT / "charts" / "coderepairrl"
REGISTRY = "crl-test"


def until(what: str, predicate: Callable[[], Any], timeout: float = 120) -> Any:
    """Poll ``predicate`` every half second until it returns something true; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def build_image(engine: DockerEngine, base: str, component: str) -> str:
    """``bash images/build.sh`` of ``component`` on ``base``; returns its tag."""
    built = subprocess.run(
        ["bash", "images/build.sh", "--registry", REGISTRY, "--network", "host",
         "--base-image", base, component],
        cwd=ROOT, env=engine.env(), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        raise AssertionError(
            f"images/build.sh {component}: {(built.stdout + built.stderr)[-4000:]}"
        )
    return f"{REGISTRY}/{component}:{VERSION}"


def owned_by(cluster: Cluster, kind: str, namespace: str, owner: str) -> list[dict[str, Any]]:
    """Objects of ``kind`` in ``namespace`` with an owner reference to ``owner``."""
    listed = json.loads(cluster.kubectl("get", kind, "-n", namespace, "-o", "json").stdout)
    return [
        item for item in listed["items"]
        if any(o["name"] == owner for o in item["metadata"].get("ownerReferences", []))
    ]  # fmt: skip


def pin_namespace(cluster: Cluster, node: RealNode, namespace: str) -> None:
    """Put every pod of ``namespace`` on the real node: the API server's PodNodeSelector and
    PodTolerationRestriction admission plugins merge the namespace's node selector and default
    tolerations into each pod, so the operator's children (gateways, runner and trainer Jobs,
    sandboxes) land there without a placement of their own, as a cluster admin would do it."""
    selector = ",".join(f"{k}={v}" for k, v in node.placement["nodeSelector"].items())
    cluster.kubectl(
        "annotate", "namespace", namespace, "--overwrite",
        f"scheduler.alpha.kubernetes.io/node-selector={selector}",
        f"scheduler.alpha.kubernetes.io/defaultTolerations="
        f"{json.dumps(node.placement['tolerations'])}",
    )  # fmt: skip


def install_operator(
    cluster: Cluster, node: RealNode, namespace: str, release: str = "crl"
) -> dict[str, Any]:
    """``helm install`` the chart into ``namespace`` (pinned to the real node, the operator's
    image already there), watching that namespace; returns the operator's pod once Ready."""
    pin_namespace(cluster, node, namespace)
    values = [
        "--set", f"image.registry={REGISTRY}",
        "--set", "logFormat=text",
        "--set", "workers=2",
        "--set", "watch.scope=namespaces",
    ]  # fmt: skip
    install = subprocess.run(
        [str(cluster.helm_path), "install", release, str(CHART), "--namespace", namespace,
         *values],
        env=cluster.env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    if install.returncode != 0:
        raise AssertionError(f"helm install: {install.stderr}")
    rollout = cluster.kubectl("rollout", "status", f"deployment/{release}-coderepairrl", "-n",
                              namespace, "--timeout=180s", check=False, timeout=200)  # fmt: skip
    if rollout.returncode != 0:
        described = cluster.kubectl("describe", "pods", "-n", namespace, check=False).stdout
        raise AssertionError(f"the operator did not start: {rollout.stderr}\n{described[-4000:]}")
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l",
                                      "app.kubernetes.io/name=coderepairrl", "-o",
                                      "json").stdout)["items"]  # fmt: skip
    [operator] = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return dict(operator)


def uninstall_operator(cluster: Cluster, namespace: str, release: str = "crl") -> None:
    """``helm uninstall`` (RolloutPools first, while the operator still runs)."""
    cluster.kubectl("delete", "rolloutpools", "--all", "-n", namespace, "--timeout=60s",
                    check=False, timeout=90)  # fmt: skip
    subprocess.run(
        [str(cluster.helm_path), "uninstall", release, "--namespace", namespace, "--wait",
         "--timeout", "60s"],
        env=cluster.env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


@dataclass
class Gateway:
    """A running pool gateway, reached at its pod's IP with the pool's token."""

    url: str
    token: str

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """One HTTP request; returns (status, decoded JSON or the error text)."""
        request = urllib.request.Request(
            self.url + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                raw = response.read()
                return int(response.status), json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()


def start_pool(
    cluster: Cluster, node: RealNode, namespace: str, name: str, tasks: Sequence[Task],
    *, replicas: int = 2, max_sandboxes: int = 4,
) -> Gateway:  # fmt: skip
    """A RolloutPool of ``tasks`` (each with its image on the node; in a ConfigMap) with its
    sandboxes and gateway on the real node; returns the gateway once its pod is Ready."""
    jsonl = "".join(json.dumps(t.model_dump(mode="json")) + "\n" for t in tasks)
    cluster.kubectl("create", "configmap", f"{name}-tasks", "-n", namespace,
                    "--from-file=tasks.jsonl=/dev/stdin", input=jsonl)  # fmt: skip
    pool = {
        "apiVersion": "coderepair.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tasks": {"format": "task", "configMap": {"name": f"{name}-tasks"}},
            "replicas": replicas,
            "maxSandboxes": max_sandboxes,
            "prefetch": 0,
            "sandbox": {
                "placement": node.placement,
                "startupTimeoutSeconds": 120,
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pool))
    until("the gateway Deployment", lambda: owned_by(cluster, "deployments", namespace, name))
    secret_name = f"{name}-gateway-token"
    until("the gateway's token Secret", lambda: cluster.kubectl(
        "get", "secret", secret_name, "-n", namespace, check=False).returncode == 0)  # fmt: skip

    def gateway_pods() -> list[dict[str, Any]]:
        listed = json.loads(cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=gateway", "-o",
            "json").stdout)["items"]  # fmt: skip
        return [p for p in listed if pod_ready(p) and p["spec"].get("nodeName") == node.name]

    [pod] = until("the gateway pod on the real node", gateway_pods, timeout=180)
    secret = json.loads(cluster.kubectl("get", "secret", secret_name, "-n", namespace, "-o",
                                        "json").stdout)  # fmt: skip
    token = base64.b64decode(secret["data"]["token"]).decode()
    return Gateway(f"http://{pod['status']['podIP']}:8080", token)


def sandbox_pods(cluster: Cluster, namespace: str, pool: str) -> list[dict[str, Any]]:
    """The pool's sandbox pods that are not being deleted."""
    listed = json.loads(cluster.kubectl(
        "get", "pods", "-n", namespace, "-l", f"coderepair.io/pool={pool},coderepair.io/role=sandbox",
        "-o", "json").stdout)["items"]  # fmt: skip
    return [p for p in listed if not p["metadata"].get("deletionTimestamp")]


#: The runner's user: the operator's runner Job runs as 1000:1000.
RUNNER_UID = 1000
#: The bundled suite in a cluster, with the gold replay (what the README's cluster section shows).
GOLD_BENCHMARK = ROOT / "examples" / "benchmark-mini-gold.yaml"
SUITE = ROOT / "examples" / "suites" / "mini" / "tasks.jsonl"


def local_volume(
    cluster: Cluster, node: RealNode, namespace: str, name: str, *, uid: int = RUNNER_UID
) -> Path:
    """A PersistentVolume of a directory on the real node (``local``, pinned to the node by its
    affinity, as an admin makes one of a node's disk) and the claim ``name`` bound to it;
    returns the directory, made for the user ``uid`` (the runner's by default) as an admin
    would."""
    directory = node.workdir / "volumes" / f"{namespace}-{name}"
    directory.mkdir(parents=True)
    os.chown(directory, uid, uid)
    hostname = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node.name]}
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{name}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "crl-local",
            "local": {"path": str(directory)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [hostname]}]}},
            "claimRef": {"namespace": namespace, "name": name},
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "crl-local",
            "volumeName": f"{namespace}-{name}",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    body = {"apiVersion": "v1", "kind": "List", "items": [volume, claim]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    return directory


@dataclass
class BenchmarkRun:
    """A Benchmark applied and waited for: its last state and how long it took."""

    name: str
    namespace: str
    bench: dict[str, Any]
    finished: bool
    wall: float
    """Seconds from `kubectl apply` to the status's completion time being seen."""
    volume: Path
    """The results volume's directory on the node."""


def run_gold_benchmark(
    cluster: Cluster, node: RealNode, engine: DockerEngine, base: str, namespace: str,
    *, timeout: int = 600, meanwhile: Callable[[Path], None] | None = None,
) -> BenchmarkRun:  # fmt: skip
    """examples/benchmark-mini-gold.yaml as its comment says to run it: the suite's task images
    (``TaskImageBuilder``, as ``crl tasks images``) and the worker image on the node, the task
    file in the ``crl-mini-tasks`` ConfigMap, the ``crl-mini-results`` claim on a local volume;
    then ``kubectl apply``, ``meanwhile(volume directory)`` when given (what a test does to
    the running benchmark), and a watch until the status has a completion time."""
    tasks = load_tasks(SUITE, "task").tasks
    built = asyncio.run(TaskImageBuilder(engine.client(), bases={"python": base})
                        .build_all(tasks, jobs=2))  # fmt: skip
    errors = [b.error for b in built if b.error]
    if errors:
        raise AssertionError(f"task images: {errors}")
    node.load_image(engine.env(), build_image(engine, base, "worker"),
                    *[str(b.image) for b in built])  # fmt: skip
    jsonl = "".join(
        json.dumps(t.model_copy(update={"image": b.image}).model_dump(mode="json")) + "\n"
        for t, b in zip(tasks, built, strict=True)
    )
    cluster.kubectl("create", "configmap", "crl-mini-tasks", "-n", namespace,
                    "--from-file=tasks.jsonl=/dev/stdin", input=jsonl)  # fmt: skip
    volume = local_volume(cluster, node, namespace, "crl-mini-results")
    manifest = yaml.safe_load(GOLD_BENCHMARK.read_text())
    manifest["metadata"]["namespace"] = namespace
    name = manifest["metadata"]["name"]
    began = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    if meanwhile is not None:
        meanwhile(volume)
    done = cluster.kubectl(
        "wait", f"bench/{name}", "-n", namespace, "--for=jsonpath={.status.completionTime}",
        f"--timeout={timeout}s", check=False, timeout=timeout + 30,
    )  # fmt: skip
    wall = time.monotonic() - began
    bench = json.loads(cluster.kubectl("get", "bench", name, "-n", namespace, "-o",
                                       "json").stdout)  # fmt: skip
    return BenchmarkRun(name, namespace, bench, done.returncode == 0, wall, volume)


def delete_benchmark(cluster: Cluster, namespace: str, run: BenchmarkRun) -> None:
    """Delete the Benchmark (its children go with it), its claim and volume, and the task
    ConfigMap; the volume's directory stays with the node's folder."""
    cluster.kubectl("delete", "bench", run.name, "-n", namespace, "--timeout=120s",
                    check=False, timeout=150)  # fmt: skip
    cluster.kubectl("delete", "pvc", "crl-mini-results", "-n", namespace, "--wait=false",
                    check=False)  # fmt: skip
    cluster.kubectl("delete", "pv", f"{namespace}-crl-mini-results", "--wait=false",
                    check=False)  # fmt: skip
    cluster.kubectl("delete", "configmap", "crl-mini-tasks", "-n", namespace, check=False)


# -- a TrainingRun in the cluster, its trainer's Python environment from the host ------------

#: The trainer's user, as in images/trainer.Dockerfile.
TRAINER_UID = 65532
#: Where the trainer finds its Python packages on the model volume (``PYTHONPATH``), next to
#: the model: the volume is mounted at /models (crl_operator.builders.inference.MODEL_DIR).
HOST_PYTHON_DIR = "python"
HOST_PYTHON_PATH = f"/models/{HOST_PYTHON_DIR}/site-packages:/models/{HOST_PYTHON_DIR}/src"
#: The modules the trainer imports first, compiled on the host before they are shared: the
#: volume is read-only in the pod, so a missing ``.pyc`` would be compiled again by each process.
TRAINER_IMPORTS = (
    "import crl_worker.train.__main__, crl_worker.train.trainer, crl_worker.train.build, "
    "accelerate.commands.accelerate_cli, deepspeed, trl, transformers.models.llama"
)


def host_python_trainer_image(engine: DockerEngine, base: str) -> str:
    """A test-only stand-in for the trainer image (images/trainer.Dockerfile): the Debian base
    (its Python 3.11, as this virtual environment's), ``python`` and ``accelerate`` on ``PATH``,
    the trainer's user; its packages come from the host (:func:`share_host_python`) through
    ``PYTHONPATH``. The real image is 6.5 GB with PyPI's torch (its CUDA libraries; torch's CPU
    index is out of reach here): about 20 GB of disk in Docker and containerd, more than the
    test machines have. Returns its tag."""
    found = engine.cli("run", "--rm", base, "python3", "-c",
                       "import sys; print('%d.%d' % sys.version_info[:2])")  # fmt: skip
    here = "{}.{}".format(*sys.version_info[:2])
    if found.returncode != 0 or found.stdout.strip() != here:
        raise AssertionError(
            f"the base image's Python ({found.stdout.strip() or found.stderr.strip()}) is not "
            f"this environment's ({here}): its packages cannot be shared with a trainer pod"
        )
    dockerfile = "\n".join([
        f"FROM {base}",
        "RUN ln -s /usr/bin/python3 /usr/local/bin/python"
        " && printf '#!/bin/sh\\nexec python3 -m accelerate.commands.accelerate_cli \"$@\"\\n'"
        " > /usr/local/bin/accelerate && chmod 755 /usr/local/bin/accelerate"
        f" && groupadd --gid {TRAINER_UID} crl"
        f" && useradd --uid {TRAINER_UID} --gid {TRAINER_UID} --create-home"
        " --home-dir /home/crl --shell /usr/sbin/nologin crl",
        "ENV PYTHONUNBUFFERED=1",
        f"USER {TRAINER_UID}:{TRAINER_UID}",
        "WORKDIR /home/crl",
        "",
    ])  # fmt: skip
    tag = f"{REGISTRY}/trainer-host-python:{VERSION}"
    client = engine.client()
    try:
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True,
                            network_mode="host")  # fmt: skip
    finally:
        client.close()
    return tag


def share_host_python(directory: Path) -> None:
    """This virtual environment's packages and the worker's source under ``directory``
    (``site-packages/``, ``src/``) as hard links (no copy: the same file system), for the
    trainer pod of :func:`host_python_trainer_image`; its first imports compiled beforehand."""
    compiled = subprocess.run([sys.executable, "-c", TRAINER_IMPORTS], capture_output=True,
                              text=True, timeout=600, check=False)  # fmt: skip
    if compiled.returncode != 0:
        raise AssertionError(f"the trainer's imports fail here: {compiled.stderr[-3000:]}")
    site = Path(sysconfig.get_paths()["purelib"])
    if site.stat().st_dev != directory.stat().st_dev:
        raise AssertionError(f"{site} and {directory} are on different file systems: "
                             "the packages cannot be hard-linked")  # fmt: skip
    for source, name in ((site, "site-packages"), (ROOT / "worker" / "src", "src")):
        linked = subprocess.run(["cp", "-al", str(source), str(directory / name)],
                                capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        if linked.returncode != 0:
            raise AssertionError(f"cp -al {source}: {linked.stderr}")
