"""The worker pods the builders make: their identity, progress channel, task files, launcher and
images."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl_operator.builders import (
    RenderState,
    baseline_results,
    render,
    render_offline,
    resolve_checkpoint,
)
from crl_worker.api import RolloutPool
from crl_worker.api.validation import load_resources

from .fixtures.builders import (
    STATES,
    TASK_SOURCES,
    assert_task_mount,
    container,
    env_of,
    find,
    flag,
    kinds,
    load,
    pod_spec,
    with_spec,
)
from .fixtures.paths import EXAMPLES, ROOT

# --- the runner's identity and progress channel ---------------------------------------------


def assert_progress_channel(
    children: list[dict[str, Any]], worker: str, progress: str, namespace: str = "default"
) -> dict[str, Any]:
    """The worker Job `worker` may `get` and `patch` its empty progress ConfigMap and nothing
    else, with an identity of its own applied before it; returns the Job."""
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    # The RoleBinding needs its Role, the Job's pods need the ServiceAccount: applied before.
    assert names.index(("ServiceAccount", worker)) < names.index(("Job", worker))
    assert names.index(("Role", worker)) < names.index(("RoleBinding", worker))
    assert names.index(("RoleBinding", worker)) < names.index(("Job", worker))
    cm = find(children, "ConfigMap", "-progress")
    assert cm["metadata"]["name"] == progress
    # No data: server-side apply then leaves the worker's `progress.json` to the worker.
    assert set(cm) == {"apiVersion", "kind", "metadata"}
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "progress"
    role = find(children, "Role")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [progress],
            "verbs": ["get", "patch"],
        }
    ]
    binding = find(children, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": worker,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": worker, "namespace": namespace}
    ]
    job = find(children, "Job")
    assert job["metadata"]["name"] == worker
    spec = pod_spec(job)
    assert spec["serviceAccountName"] == worker
    assert spec["automountServiceAccountToken"] is True
    env = env_of(job)
    assert env["CRL_PROGRESS_CONFIGMAP"] == progress
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    return job


def test_runner_reports_progress_with_least_privilege() -> None:
    bench = load("benchmark-hosted-endpoint.yaml")
    children = render(bench, state=RenderState())
    job = assert_progress_channel(
        children, "hosted-model-swe-bench-lite-runner", "hosted-model-swe-bench-lite-progress"
    )
    assert "CRL_BASELINE_RESULTS" not in env_of(job)
    # A Hugging Face suite is not a file: nothing mounted, no --tasks.
    assert "--tasks" not in container(job)["args"]
    assert "tasks" not in {v["name"] for v in pod_spec(job)["volumes"]}


def test_trainer_reports_progress_with_least_privilege() -> None:
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    children = render(run, "team-a", STATES["ready"])
    job = assert_progress_channel(
        children, "qwen3-8b-swe-gym-trainer", "qwen3-8b-swe-gym-progress", "team-a"
    )
    # Every trainer pod serves its Prometheus metrics where the env says.
    assert env_of(job)["CRL_METRICS_PORT"] == "9400"
    ports = {p["name"]: p["containerPort"] for p in container(job)["ports"]}
    assert ports == {"rendezvous": 29500, "metrics": 9400}
    # The identity exists exactly while the trainer may run; the report outlives it.
    for state in ("waiting", "suspended", "finished"):
        others = render(run, "team-a", STATES[state])
        assert not {"ServiceAccount", "Role", "RoleBinding"} & set(kinds(others)), state
        assert find(others, "ConfigMap", "-progress")["metadata"]["name"] == (
            "qwen3-8b-swe-gym-progress"
        )


def test_the_builder_and_the_runner_agree_on_the_progress_variable() -> None:
    from crl_worker.rollout.report import reporter_from_env

    bench = load("benchmark-hosted-endpoint.yaml")
    job = find(render(bench, "team-a", state=RenderState()), "Job", "-runner")
    env = {k: v for k, v in env_of(job).items() if isinstance(v, str)}
    reporter = reporter_from_env({**env, "POD_NAMESPACE": "team-a"})
    assert reporter is not None and reporter.name == "hosted-model-swe-bench-lite-progress"


@pytest.mark.parametrize(
    ("example", "worker"),
    [
        (
            "benchmark-swe-bench-verified-baseline.yaml",
            "qwen3-8b-zero-shot-swe-bench-verified-runner",
        ),
        ("trainingrun-qwen3-8b-swe-gym.yaml", "qwen3-8b-swe-gym-trainer"),
    ],
)
def test_no_other_pod_gets_the_workers_identity(example: str, worker: str) -> None:
    resource = load(example)
    children = render(resource, state=STATES["ready"])
    # The inline pool's own children (its gateway) run pods too.
    for pool in [c for c in children if c["kind"] == "RolloutPool"]:
        children += render(RolloutPool.model_validate(pool))
    workloads = [c for c in children if c["kind"] in ("Deployment", "Job")]
    others = [w for w in workloads if w["metadata"]["name"] != worker]
    assert {w["kind"] for w in others} == {"Deployment"} and len(others) >= 2, others
    for workload in others:
        assert pod_spec(workload).get("serviceAccountName") != worker
    assert pod_spec(find(workloads, "Job"))["serviceAccountName"] == worker


@pytest.mark.parametrize(("tasks", "volume", "gateway_path", "path"), TASK_SOURCES)
def test_the_runner_reads_a_mounted_task_file(
    tasks: dict[str, Any], volume: dict[str, Any] | None, gateway_path: str | None, path: str | None
) -> None:
    bench = load("benchmark-hosted-endpoint.yaml")
    suite = {"name": "s", "tasks": {"format": "swe-bench", **tasks}}
    job = find(render(with_spec(bench, suite=suite), state=RenderState()), "Job")
    args = container(job)["args"]
    assert flag(args, "--config") == "/etc/crl/config.yaml"
    assert flag(args, "--tasks") == path
    mounts = assert_task_mount(job, volume)
    if "volume" in tasks:
        assert mounts[0]["subPath"] == "suites"


def test_a_baseline_on_the_same_results_volume_is_passed_to_the_runner(tmp_path: Path) -> None:
    rl = load("benchmark-swe-bench-verified.yaml")
    zero_shot = load("benchmark-swe-bench-verified-baseline.yaml")
    assert baseline_results(rl, zero_shot) == "/results/qwen3-8b-zero-shot/swe-bench-verified"
    # Another claim, another subPath, no volume, or the same directory: nothing to read.
    elsewhere = with_spec(zero_shot, results={"volume": {"claimName": "x"}, "path": "a"})
    assert baseline_results(rl, elsewhere) is None
    sub = with_spec(
        zero_shot, results={"volume": {"claimName": "benchmark-results", "subPath": "s"}}
    )
    assert baseline_results(rl, sub) is None
    assert baseline_results(rl, with_spec(zero_shot, results={"path": "a"})) is None
    same = with_spec(
        zero_shot,
        results={
            "volume": {"claimName": "benchmark-results"},
            "path": "qwen3-8b-rl/swe-bench-verified/",
        },
    )
    assert baseline_results(rl, same) is None
    # The state carries it into the runner; `crl render` resolves it from the same input.
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    state = RenderState(
        inference_ready=True,
        checkpoint=resolve_checkpoint(rl, run),
        baseline_results="/results/qwen3-8b-zero-shot/swe-bench-verified",
    )
    env = env_of(find(render(rl, state=state), "Job"))
    assert env["CRL_BASELINE_RESULTS"] == "/results/qwen3-8b-zero-shot/swe-bench-verified"
    both = tmp_path / "all.yaml"
    both.write_text(
        "---\n".join(
            (ROOT / "examples" / n).read_text()
            for n in (
                "trainingrun-qwen3-8b-swe-gym.yaml",
                "benchmark-swe-bench-verified.yaml",
                "benchmark-swe-bench-verified-baseline.yaml",
            )
        )
    )
    children, _ = render_offline(load_resources(str(both)))
    runners = {
        c["metadata"]["name"]: env_of(c)
        for c in children
        if c["kind"] == "Job" and "runner" in c["metadata"]["name"]
    }
    assert runners["qwen3-8b-rl-swe-bench-verified-runner"]["CRL_BASELINE_RESULTS"] == (
        "/results/qwen3-8b-zero-shot/swe-bench-verified"
    )
    assert "CRL_BASELINE_RESULTS" not in runners["qwen3-8b-zero-shot-swe-bench-verified-runner"]


@pytest.mark.parametrize(("tasks", "volume", "gateway_path", "path"), TASK_SOURCES)
def test_the_trainer_reads_a_mounted_task_file(
    tasks: dict[str, Any], volume: dict[str, Any] | None, gateway_path: str | None, path: str | None
) -> None:
    # The trainer loads the tasks it trains on itself, like the runner (same mounted path).
    run = with_spec(load("trainingrun-qwen3-8b-swe-gym.yaml"), tasks={"format": "swe-gym", **tasks})
    job = find(render(run, state=STATES["ready"]), "Job")
    args = container(job)["args"]
    assert flag(args, "--config") == "/etc/crl/config.yaml"
    assert flag(args, "--tasks") == path
    mounts = assert_task_mount(job, volume)
    if "volume" in tasks:
        assert mounts[0]["subPath"] == "suites"
    from crl_worker.train.__main__ import parser

    parsed = parser().parse_args(args[args.index("crl_worker.train") + 1 :])
    assert (str(parsed.tasks) if parsed.tasks else None) == path


@pytest.mark.parametrize("preflight_status", [0, 2])
def test_the_trainer_checks_its_config_before_the_launcher(
    tmp_path: Path, preflight_status: int
) -> None:
    # The pod's script, run by a real shell with stand-ins for python and accelerate: a config
    # error (2) is the container's exit status and nothing is launched; otherwise accelerate
    # gets the container's args.
    job = find(render(load("trainingrun-qwen3-8b-swe-gym.yaml"), state=STATES["ready"]), "Job")
    spec = container(job)
    assert spec["command"][:2] == ["/bin/sh", "-c"]
    for name, status in (("python", preflight_status), ("accelerate", 0)):
        stand_in = tmp_path / name
        stand_in.write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls\nexit {status}\n')
        stand_in.chmod(0o755)
    args = ["launch", "--config_file", "/etc/crl/accelerate.yaml", "--module", "crl_worker.train"]
    done = subprocess.run(
        [*spec["command"], *args], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=False
    )
    calls = (tmp_path / "calls").read_text().splitlines()
    assert done.returncode == preflight_status
    assert calls[0] == "python -m crl_worker.train --preflight-only --config /etc/crl/config.yaml"
    assert calls[1:] == ([] if preflight_status else ["accelerate " + " ".join(args)])
    env_names = {e["name"]: e.get("value") for e in spec["env"]}
    assert env_names["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "270"


def test_the_trainer_gets_the_pods_sigterm_through_the_launcher(tmp_path: Path) -> None:
    # The pod's script under a real shell, a stand-in for accelerate's simple launcher (one
    # process: it waits for its worker and installs no signal handler) and a worker that
    # checkpoints on SIGTERM. SIGTERM to the shell (what the kubelet sends the container's
    # PID 1) reaches the worker, which finishes its checkpoint before the shell exits, with the
    # launcher's status.
    job = find(render(load("trainingrun-qwen3-8b-swe-gym.yaml"), state=STATES["ready"]), "Job")
    spec = container(job)
    (tmp_path / "python").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "accelerate").write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys\n"
        f"sys.exit(subprocess.call([sys.executable, {str(tmp_path / 'worker.py')!r}]))\n"
    )
    (tmp_path / "worker.py").write_text(
        "import pathlib, signal, sys, time\n"
        f"here = pathlib.Path({str(tmp_path)!r})\n"
        "def stop(*_):\n"
        "    time.sleep(0.5)  # a checkpoint being written\n"
        "    (here / 'checkpoint').write_text('written')\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "(here / 'ready').write_text('')\n"
        "time.sleep(60)\n"
    )
    for name in ("python", "accelerate"):
        (tmp_path / name).chmod(0o755)
    # A session of its own: the script signals its whole process group.
    shell = subprocess.Popen(
        [*spec["command"], "launch"], env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and shell.poll() is None
            time.sleep(0.05)
        shell.send_signal(signal.SIGTERM)
        assert shell.wait(timeout=30) == 143
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
    assert (tmp_path / "checkpoint").read_text() == "written"


# --- images: the project's registry, and another one ------------------------------------------


def test_children_run_the_images_this_repository_builds() -> None:
    """The defaults name images/build.sh's tags: the worker for the gateway and the runner, the
    CUDA trainer for the trainer, at the version of pyproject.toml and the chart."""
    import tomllib

    from crl_worker.api.common import (
        DEFAULT_TRAINER_IMAGE,
        DEFAULT_WORKER_IMAGE,
        IMAGE_REGISTRY,
        IMAGE_VERSION,
    )

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "coderepairrl" / "Chart.yaml").read_text())
    assert IMAGE_VERSION == version == chart["appVersion"]
    assert f"{IMAGE_REGISTRY}/worker:{version}" == DEFAULT_WORKER_IMAGE
    assert f"{IMAGE_REGISTRY}/trainer:{version}-cuda" == DEFAULT_TRAINER_IMAGE
    build = (ROOT / "images" / "build.sh").read_text()
    assert f"registry={IMAGE_REGISTRY}\n" in build
    assert '"$registry/$component:$version"' in build  # worker:V
    assert '"$registry/trainer:$version-cuda"' in build
    images = {c["image"] for obj in _all_example_children() for c in _containers(obj)}
    assert DEFAULT_WORKER_IMAGE in images and DEFAULT_TRAINER_IMAGE in images


def _all_example_children() -> list[dict[str, Any]]:
    children: list[dict[str, Any]] = []
    for path in EXAMPLES:
        children += render_offline(load_resources(path))[0]
    return children


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def test_another_registry_moves_only_this_projects_images() -> None:
    from crl_operator.builders import relocate_images
    from crl_operator.settings import parse_args
    from crl_worker.api.common import IMAGE_REGISTRY

    children = _all_example_children()
    before = copy.deepcopy(children)
    moved = relocate_images(children, "registry.example.com/crl")
    assert children == before  # pure
    assert relocate_images(children, None) is children
    assert relocate_images(children, IMAGE_REGISTRY) is children
    pairs = [
        (old["image"], new["image"])
        for a, b in zip(children, moved, strict=True)
        for old, new in zip(_containers(a), _containers(b), strict=True)
    ]
    ours = [(o, n) for o, n in pairs if o.startswith(f"{IMAGE_REGISTRY}/")]
    assert ours and all(n == o.replace(IMAGE_REGISTRY, "registry.example.com/crl") for o, n in ours)
    others = [(o, n) for o, n in pairs if not o.startswith(f"{IMAGE_REGISTRY}/")]
    assert others and all(o == n for o, n in others)  # vLLM, users' images: untouched
    # only container images move: a RolloutPool child's spec keeps what the user wrote
    for a, b in zip(children, moved, strict=True):
        if a["kind"] not in ("Deployment", "Job"):
            assert a == b
    assert parse_args([]).image_registry is None
    assert parse_args(["--image-registry", "r.example/x/"]).image_registry == "r.example/x"
