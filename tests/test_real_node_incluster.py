"""The operator installed with its chart on the real node, as a user runs it: its pod, a RolloutPool
leasing real sandbox pods, one validating its tasks, a gold Benchmark, a toy TrainingRun on a
validating pool, the README's cluster section."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crl_worker.sandbox.images import TaskImageBuilder
from crl_worker.sandbox.pods import pod_ready
from crl_worker.tasks.loaders import load_tasks
from crl_worker.train import toy

from .fixtures.cluster import Cluster
from .fixtures.docker import DockerEngine
from .fixtures.incluster import (
    HOST_PYTHON_DIR,
    REGISTRY,
    RUNNER_UID,
    TRAINER_UID,
    Gateway,
    build_image,
    delete_benchmark,
    final_status,
    host_python_trainer_image,
    install_operator,
    local_volume,
    owned_by,
    pin_namespace,
    run_gold_benchmark,
    sandbox_pods,
    share_host_python,
    start_pool,
    suite_on_node,
    uninstall_operator,
    until,
)
from .fixtures.incluster_sft import sft_on_rollouts
from .fixtures.incluster_toy import TOY_STEPS, toy_trainingrun
from .fixtures.incluster_validation import (
    BROKEN_ID,
    BROKEN_REASON,
    delete_pool,
    restart_gateway,
    validate_pool,
    with_broken_copy,
)
from .fixtures.node import RealNode
from .fixtures.node_build import NodeError
from .fixtures.operator_process import session_operator_paused
from .fixtures.paths import ROOT
from .fixtures.real_node import SUITE, Release, readme_cluster_commands

log = logging.getLogger(__name__)


# --- the operator installed in the cluster ---------------------------------------------------------


@pytest.fixture(scope="module")
def operator_release(
    cluster: Cluster, real_node: RealNode, docker_engine: DockerEngine, docker_base: str
) -> Iterator[Release]:
    """`helm install` as a user runs it (tests/fixtures/incluster.py), with the operator's image
    (images/build.sh) on the real node; uninstalled afterwards."""
    real_node.load_image(docker_engine.env(), build_image(docker_engine, docker_base, "operator"))
    namespace = cluster.namespace("crl-system")
    # One operator at a time: the session's would reconcile the release's objects too.
    with session_operator_paused():
        try:
            yield Release(namespace, install_operator(cluster, real_node, namespace))
        finally:
            uninstall_operator(cluster, namespace)
            cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=1",
                            "--timeout=60s", check=False, timeout=90)  # fmt: skip
            cluster.delete_namespace(namespace)


def test_the_operator_runs_as_the_charts_pod(
    cluster: Cluster, real_node: RealNode, operator_release: Release
) -> None:
    """The chart's pod on the real node, as its own ServiceAccount, reaching the API server
    in-cluster: it reconciles a RolloutPool (the gateway's Deployment appears, owned)."""
    operator = operator_release.operator_pod
    namespace = operator_release.namespace
    assert operator["spec"]["nodeName"] == real_node.name
    assert operator["spec"]["serviceAccountName"] == "crl-coderepairrl"
    pool = {
        "apiVersion": "coderepair.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": "bare", "namespace": namespace},
        "spec": {
            "tasks": {"format": "task", "path": "/tasks/tasks.jsonl"},
            "replicas": 0,
            "maxSandboxes": 1,
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pool))
    try:
        until("the gateway Deployment", lambda: owned_by(cluster, "deployments", namespace,
                                                         "bare"), timeout=90)  # fmt: skip
    except AssertionError:
        logs = cluster.kubectl("logs", "-n", namespace, operator["metadata"]["name"],
                               check=False).stdout  # fmt: skip
        raise AssertionError(
            f"the operator made no gateway Deployment; its log:\n{logs[-4000:]}"
        ) from None
    finally:
        cluster.kubectl("delete", "rolloutpool", "bare", "-n", namespace, "--wait=false")
    # Still the same pod, never restarted (kopf's watches reach the API server too).
    pod = json.loads(cluster.kubectl("get", "pod", operator["metadata"]["name"], "-n", namespace,
                                     "-o", "json").stdout)  # fmt: skip
    assert pod_ready(pod)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0


def _sandbox_uids(node: RealNode) -> set[str]:
    """Pod uids of the node's running containers (containerd's tasks: what really runs)."""
    containers = node.ctr("tasks", "list", "-q").split()
    uids = set()
    for container in containers:
        try:
            info = json.loads(node.ctr("containers", "info", container))
        except NodeError:  # removed in between
            continue
        uid = (info.get("Labels") or {}).get("io.kubernetes.pod.uid")
        if uid:
            uids.add(uid)
    return uids


def _gateway_after_scale(
    cluster: Cluster, node: RealNode, namespace: str, gateway: Gateway, replicas: int
) -> Gateway:  # fmt: skip
    """The pool's gateway once it serves the scaled warm target (its config changed, so its
    Deployment rolled out a new pod: a new address, the same token)."""

    def serving() -> Gateway | None:
        pods = json.loads(cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=gateway", "-o",
            "json").stdout)["items"]  # fmt: skip
        ready = [p for p in pods if pod_ready(p) and not p["metadata"].get("deletionTimestamp")]
        if len(ready) != 1 or ready[0]["spec"].get("nodeName") != node.name:
            return None
        candidate = Gateway(f"http://{ready[0]['status']['podIP']}:8080", gateway.token)
        try:
            with urllib.request.urlopen(candidate.url + "/metrics", timeout=10) as response:
                metrics = response.read().decode()
        except OSError:
            return None
        wanted = f'crl_pool_warm_target{{pool="mini"}} {float(replicas)}'
        return candidate if wanted in metrics.splitlines() else None

    serves: Gateway = until(f"the gateway serving a warm target of {replicas}", serving,
                            timeout=180)  # fmt: skip
    return serves


def test_a_rolloutpool_leases_real_sandbox_pods(
    cluster: Cluster, real_node: RealNode, docker_engine: DockerEngine, docker_base: str,
    operator_release: Release,
) -> None:  # fmt: skip
    """A RolloutPool of the bundled suite (two of its tasks, from their task images): the
    operator's gateway runs as a pod on the real node and leases real sandbox pods, made from
    the task images, cold then warm; deleting the pool collects them."""
    namespace = operator_release.namespace
    tasks = load_tasks(SUITE, "task").tasks[:2]
    built = asyncio.run(TaskImageBuilder(docker_engine.client(), bases={"python": docker_base})
                        .build_all(tasks, jobs=2))  # fmt: skip
    assert [b.error for b in built] == [None, None]
    worker = build_image(docker_engine, docker_base, "worker")
    real_node.load_image(docker_engine.env(), worker, *[str(b.image) for b in built])
    with_images = [
        t.model_copy(update={"image": b.image}) for t, b in zip(tasks, built, strict=True)
    ]
    gateway = start_pool(cluster, real_node, namespace, "mini", with_images, replicas=1)

    instance = tasks[0].instance_id
    status, lease = gateway.call("POST", "/v1/leases", {"instance_id": instance})
    assert status == 201, lease
    assert lease["source"] == "cold"  # a new sandbox pod, started for this lease
    [sandbox] = sandbox_pods(cluster, namespace, "mini")
    assert sandbox["spec"]["nodeName"] == real_node.name and pod_ready(sandbox)
    status, ran = gateway.call("POST", f"/v1/leases/{lease['lease_id']}/run",
                               {"command": "git status --short | wc -l; ls"})  # fmt: skip
    assert status == 200 and ran["exit_code"] == 0, ran
    assert ran["output"].split()[0] == "0"  # the task's repository, clean, in a real container
    status, released = gateway.call("DELETE", f"/v1/leases/{lease['lease_id']}", {})
    assert status == 200 and released["action"] == "reuse", released
    # The same instance again: the warm sandbox, no new pod.
    status, again = gateway.call("POST", "/v1/leases", {"instance_id": instance})
    assert status == 201 and again["source"] == "warm", again
    names = [p["metadata"]["name"] for p in sandbox_pods(cluster, namespace, "mini")]
    assert names == [sandbox["metadata"]["name"]]
    gateway.call("DELETE", f"/v1/leases/{again['lease_id']}", {})

    # `kubectl scale`: the warm target is an upper bound on idle sandboxes (docs/pool-gateway.md);
    # leases fill it. From 1 up to 2: both instances leased and released stay warm, two real
    # pods (the new target reaches the gateway through its config: its Deployment rolls).
    cluster.kubectl("scale", "rpool/mini", "-n", namespace, "--replicas=2")
    gateway = _gateway_after_scale(cluster, real_node, namespace, gateway, 2)
    for task in tasks:
        status, lease = gateway.call("POST", "/v1/leases", {"instance_id": task.instance_id})
        assert status == 201, lease
        gateway.call("DELETE", f"/v1/leases/{lease['lease_id']}", {})
    warm = until("two warm sandbox pods", lambda: [
        p for p in sandbox_pods(cluster, namespace, "mini")
        if pod_ready(p) and p["metadata"]["labels"].get("coderepair.io/state") == "ready"
    ] if len(sandbox_pods(cluster, namespace, "mini")) == 2 else None)  # fmt: skip
    assert {p["spec"]["nodeName"] for p in warm} == {real_node.name}
    # Down to 0: the idle sandboxes are closed, their pods deleted and gone from containerd.
    cluster.kubectl("scale", "rpool/mini", "-n", namespace, "--replicas=0")
    until("the idle sandbox pods gone", lambda: not sandbox_pods(cluster, namespace, "mini"))
    gone = {p["metadata"]["uid"] for p in warm}
    until("their containers gone", lambda: not gone & _sandbox_uids(real_node), timeout=60)
    pool = json.loads(cluster.kubectl("get", "rpool", "mini", "-n", namespace, "-o",
                                      "json").stdout)  # fmt: skip
    assert pool["spec"]["replicas"] == 0
    # Deleting the pool collects its sandbox pods (owner references, garbage collector).
    cluster.kubectl("delete", "rpool", "mini", "-n", namespace, "--timeout=120s", timeout=150)
    until("the sandbox pods gone", lambda: not sandbox_pods(cluster, namespace, "mini"))


def test_a_rolloutpool_validates_its_tasks_and_quarantines_a_broken_one(
    cluster: Cluster, real_node: RealNode, docker_engine: DockerEngine, docker_base: str,
    operator_release: Release,
) -> None:  # fmt: skip
    """The bundled suite plus a broken copy of one task in a RolloutPool with `validation` on:
    the gateway pod checks each task in real sandbox pods of its task image and quarantines the
    copy with its reason; `kubectl get rpool`, the progress ConfigMap, `quarantine.json` on the
    cache claim and an Event say so; a lease of the copy is refused with the reason; a new
    gateway pod takes every verdict from the cache."""
    namespace = operator_release.namespace
    tasks = with_broken_copy(suite_on_node(real_node, docker_engine, docker_base))
    pool = validate_pool(cluster, real_node, namespace, "mini-valid", tasks)
    try:
        log.info("validating 9 tasks took %.1f s in the cluster", pool.wall)
        report = pool.report
        assert (report["total"], report["validated"], report["quarantined"]) == (9, 9, 1), report
        assert report["reasons"] == {BROKEN_REASON: 1}, report
        assert report["tasks"] == [{"instanceId": BROKEN_ID, "reason": BROKEN_REASON}], report
        listed = json.loads((pool.cache / "quarantine" / pool.name / "quarantine.json").read_text())
        assert [t["instance_id"] for t in listed["tasks"]] == [BROKEN_ID], listed
        assert listed["valid"] == 8 and listed["tasks"][0]["problems"], listed
        # What a user sees: the status and `kubectl get rpool`, once the operator copied them.
        until("the pool's status", lambda: json.loads(cluster.kubectl(
            "get", "rpool", pool.name, "-n", namespace, "-o", "json").stdout)["status"].get(
            "validation", {}).get("state") == "Done")  # fmt: skip
        header, row = cluster.kubectl(
            "get", "rpool", pool.name, "-n", namespace
        ).stdout.splitlines()
        cell = {name: row[header.index(name) :].split()[0] for name in ("VALIDATED", "QUARANTINED")}
        assert cell == {"VALIDATED": "9", "QUARANTINED": "1"}, (header, row)
        events = json.loads(cluster.kubectl(
            "get", "events", "-n", namespace, "-o", "json", "--field-selector",
            f"involvedObject.name={pool.name},reason=TasksQuarantined").stdout)["items"]  # fmt: skip
        assert events and BROKEN_REASON in events[0]["message"], events
        # The copy is never leased; a valid task is.
        code, refused = pool.gateway.call("POST", "/v1/leases", {"instance_id": BROKEN_ID})
        assert code == 404 and BROKEN_REASON in refused, (code, refused)
        code, lease = pool.gateway.call("POST", "/v1/leases", {"instance_id": tasks[0].instance_id})
        assert code == 201, lease
        pool.gateway.call("DELETE", f"/v1/leases/{lease['lease_id']}", {})
        # A new gateway pod validates nothing again: every verdict from the cache on the claim.
        again = restart_gateway(cluster, namespace, pool.name, 9, timeout=180)
        assert (again["validated"], again["quarantined"]) == (9, 1), again
    finally:
        delete_pool(cluster, namespace, pool.name)


def test_a_gold_benchmark_runs_in_the_cluster(
    cluster: Cluster, real_node: RealNode, docker_engine: DockerEngine, docker_base: str,
    operator_release: Release,
) -> None:  # fmt: skip
    """The bundled suite's Benchmark with the gold agent, as a user applies it: the operator's
    runner Job and inline pool on the real node, the 8 task images as real sandbox pods, the
    results on a PersistentVolume; status and `kubectl get bench` say 8/8, resolve rate 1.0.

    Mid-run, once a few results are on the volume, the operator's pod and the runner's pod are
    deleted: the Deployment and the Job replace them, the new runner resumes from the volume
    (only attempts in flight at the kill run again), and the status ends the same."""
    namespace = operator_release.namespace
    killed: list[str] = []

    def disrupt(volume: Path) -> None:
        results = volume / "mini-gold" / "results.jsonl"
        until("3 results on the volume", lambda: results.exists()
              and len(results.read_text().splitlines()) >= 3, timeout=300)  # fmt: skip
        operator = "app.kubernetes.io/name=coderepairrl,app.kubernetes.io/component=operator"
        for selector in (operator, "job-name=mini-gold-runner"):
            pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector,
                                              "-o", "json").stdout)["items"]  # fmt: skip
            killed.extend(p["metadata"]["uid"] for p in pods)
            cluster.kubectl("delete", "pods", "-n", namespace, "-l", selector, "--wait=false")

    run = run_gold_benchmark(cluster, real_node, docker_engine, docker_base, namespace,
                             meanwhile=disrupt)  # fmt: skip
    try:
        status = run.bench.get("status", {})
        if not run.finished or status.get("resolveRate") != 1.0:
            runner = cluster.kubectl("logs", "-n", namespace, f"job/{run.name}-runner",
                                     "--tail=60", check=False).stdout  # fmt: skip
            raise AssertionError(f"status: {json.dumps(status)[:3000]}\n"
                                 f"runner log:\n{runner[-4000:]}")  # fmt: skip
        log.info("the gold benchmark took %.1f s in the cluster", run.wall)
        # The Job's completion and the runner's last report are two events in either order:
        # the verdict waits for the report, so whoever reads it reads the final progress.
        status = final_status(cluster, run)
        assert status["progress"] == {"total": 8, "done": 8, "resolved": 8, "errored": 0,
                                      "summary": "8/8"}  # fmt: skip
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        assert conditions["Succeeded"] == "True" and conditions.get("Failed") != "True"
        # What a user sees.
        table = cluster.kubectl("get", "bench", "-n", namespace).stdout.splitlines()
        header = table[0]
        assert header.split()[:6] == ["NAME", "SUITE", "PROGRESS", "ADMISSION", "RESOLVE", "RATE"]
        # Cells by the header's column starts: an unqueued run's Admission cell is empty.
        starts = [header.index(name) for name in ("NAME", "SUITE", "PROGRESS", "ADMISSION",
                                                  "RESOLVE RATE", "AGE")]  # fmt: skip
        cells = [table[1][a:b].strip() for a, b in itertools.pairwise(starts)]
        assert cells == [run.name, "crl-mini", "8/8", "", "1"], table
        # A second runner pod finished it, on the real node; a new operator pod reports.
        assert len(killed) == 2, killed
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l",
                                          f"job-name={run.name}-runner", "-o",
                                          "json").stdout)["items"]  # fmt: skip
        [pod] = [p for p in pods if p["status"]["phase"] == "Succeeded"]
        assert pod["metadata"]["uid"] not in killed
        assert pod["spec"]["nodeName"] == real_node.name
        resumed = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout
        before = re.search(r"8 instances x 1 attempts .*?, (\d+) already done", resumed)
        assert before and int(before.group(1)) >= 3, resumed[:2000]  # resumed from the volume
        # The results are on the volume, in the node's directory, written by the runner.
        folder = run.volume / run.name
        summary = json.loads((folder / "summary.json").read_text())
        assert (summary["resolved"], summary["total"]) == (8, 8), summary
        lines = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
        latest = {r["instance_id"]: r for r in lines}
        assert len(latest) == 8 and all(r["resolved"] for r in latest.values()), lines
        # Only attempts in flight when the runner was killed (at most its parallelism, 2) ran
        # again; those finished before it were kept.
        assert len(lines) - 8 <= 2, lines
        assert folder.stat().st_uid == RUNNER_UID
    finally:
        delete_benchmark(cluster, namespace, run)


def test_a_toy_trainingrun_trains_in_the_cluster(
    cluster: Cluster, real_node: RealNode, docker_engine: DockerEngine, docker_base: str,
    operator_release: Release, tmp_path: Path,
) -> None:  # fmt: skip
    """A CPU-only TrainingRun of the toy, as a user applies it: the operator's trainer Job runs
    real GRPO steps on the real node, generating in-process (`generation: in-process`: no vLLM,
    no weight sync), its rollouts in real sandbox pods of the toy's task image leased from the
    run's inline pool; status shows step, reward and the last checkpoint.

    Mid-run the trainer pod is deleted (SIGTERM: it checkpoints and exits; the Job starts
    another, which resumes from the volume) and then the operator's pod: the run finishes with
    every step in metrics.jsonl exactly once, under the one trainer Job. Then the recipe's next
    step on its rollouts: an SFT TrainingRun, a trainer Job alone (tests/fixtures/incluster_sft.py).

    Test-only: the trainer image. The real one (images/trainer.Dockerfile) is 6.5 GB with
    PyPI's torch, too big for the test machines' disk; this run's trainer image is the Debian
    base with the trainer's user, and its Python packages are this virtual environment's, hard
    linked onto the model volume next to the toy model and put on ``PYTHONPATH``
    (tests/fixtures/incluster.py: host_python_trainer_image, share_host_python)."""
    namespace = operator_release.namespace
    toy.build_toy_suite(tmp_path / "suite")
    tasks = load_tasks(tmp_path / "suite" / "tasks.jsonl", "task").tasks
    built = asyncio.run(TaskImageBuilder(docker_engine.client(), bases={"python": docker_base})
                        .build_all(tasks))  # fmt: skip
    assert [b.error for b in built] == [None]
    trainer_image = host_python_trainer_image(docker_engine, docker_base)
    real_node.load_image(docker_engine.env(), build_image(docker_engine, docker_base, "worker"),
                         trainer_image, *[str(b.image) for b in built])  # fmt: skip
    [toy_task] = [
        t.model_copy(update={"image": b.image}) for t, b in zip(tasks, built, strict=True)
    ]
    # A broken copy (its FAIL_TO_PASS test passes without the fix): the run's pool validates
    # both, quarantines it and the trainer never draws it.
    broken = toy_task.model_copy(update={"instance_id": f"{toy_task.instance_id}-broken",
                                         "fail_to_pass": toy_task.pass_to_pass, "pass_to_pass": []})  # fmt: skip
    jsonl = "".join(json.dumps(t.model_dump(mode="json")) + "\n" for t in (toy_task, broken))
    cluster.kubectl("create", "configmap", "toy-tasks", "-n", namespace,
                    "--from-file=tasks.jsonl=/dev/stdin", input=jsonl)  # fmt: skip
    models = local_volume(cluster, real_node, namespace, "toy-model", uid=0)
    toy.build_toy_model(models / "toy")
    for path in [models / "toy", *(models / "toy").iterdir()]:  # the trainer's, as an admin would
        os.chown(path, TRAINER_UID, TRAINER_UID)
    (models / HOST_PYTHON_DIR).mkdir()
    share_host_python(models / HOST_PYTHON_DIR)
    output = local_volume(cluster, real_node, namespace, "toy-checkpoints", uid=TRAINER_UID)
    metrics = output / "metrics.jsonl"
    operator = "app.kubernetes.io/name=coderepairrl,app.kubernetes.io/component=operator"

    def get(kind: str, name: str) -> dict[str, Any]:
        return dict(json.loads(cluster.kubectl("get", kind, name, "-n", namespace, "-o",
                                               "json").stdout))  # fmt: skip

    def pods(selector: str) -> list[dict[str, Any]]:
        listed = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector,
                                            "-o", "json").stdout)["items"]  # fmt: skip
        return [p for p in listed if not p["metadata"].get("deletionTimestamp")]

    def running_trainer(not_uid: str = "") -> dict[str, Any] | None:
        found = [
            p
            for p in pods("job-name=toy-trainer")
            if p["status"].get("phase") == "Running" and p["metadata"]["uid"] != not_uid
        ]
        return found[0] if found else None

    def diagnosis() -> str:
        logs = cluster.kubectl("logs", "-n", namespace, "job/toy-trainer", "--tail=80",
                               check=False).stdout  # fmt: skip
        status = cluster.kubectl("get", "trun", "toy", "-n", namespace, "-o",
                                 "jsonpath={.status}", check=False).stdout  # fmt: skip
        return f"status: {status[:3000]}\ntrainer log:\n{logs[-5000:]}"

    began = time.monotonic()
    manifest = toy_trainingrun(namespace, trainer_image)
    manifest["spec"]["rollout"]["pool"]["validation"] = {"enabled": True}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    try:
        try:
            until("the trainer Job", lambda: owned_by(cluster, "jobs", namespace, "toy"))
            job_uid = get("job", "toy-trainer")["metadata"]["uid"]
            # A step done (its metrics on the volume; status follows on the operator's timer,
            # too late for a run this short): the trainer pod is deleted (SIGTERM).
            until("a step's metrics on the volume", lambda: metrics.exists()
                  and metrics.read_text().strip(), timeout=300)  # fmt: skip
            first = until("the trainer pod", running_trainer, timeout=60)
            failed = get("job", "toy-trainer")["status"].get("failed", 0)
            if failed:  # a pod before the one training now: say why
                for pod in pods("job-name=toy-trainer"):
                    if pod["status"].get("phase") == "Failed":
                        tail = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"],
                                               "--tail=30", check=False).stdout  # fmt: skip
                        log.warning("trainer pod %s failed:\n%s", pod["metadata"]["name"], tail)
            cluster.kubectl("delete", "pod", first["metadata"]["name"], "-n", namespace,
                            "--wait=false")  # fmt: skip
            second = until("a second trainer pod", lambda: running_trainer(
                first["metadata"]["uid"]), timeout=420)  # fmt: skip
            # The operator's pod too, while the second trainer runs: nothing changes.
            killed = [p["metadata"]["uid"] for p in pods(operator)]
            cluster.kubectl("delete", "pods", "-n", namespace, "-l", operator, "--wait=false")
            steps_at_kill = len(metrics.read_text().splitlines())
            done = cluster.kubectl("wait", "trun/toy", "-n", namespace,
                                   "--for=condition=Succeeded", "--timeout=420s", check=False,
                                   timeout=450)  # fmt: skip
        except AssertionError as error:
            raise AssertionError(f"{error}\n{diagnosis()}") from None
        assert done.returncode == 0, diagnosis()
        log.info("the toy TrainingRun took %.1f s in the cluster", time.monotonic() - began)
        # The trainer's last report can reach the (restarted) operator's cache a reconcile after
        # the Job's end: Succeeded may stand a moment before the last step does.
        run = until(
            "the last step in the status",
            lambda: (r := get("trun", "toy"))["status"].get("step") == TOY_STEPS and r,
            timeout=90,
        )
        status = run["status"]
        assert status["step"] == TOY_STEPS, status
        assert status["lastCheckpoint"]["step"] == TOY_STEPS, status
        assert status["metrics"]["rewardMean"] is not None, status
        # Its pool validated both tasks and quarantined the broken one, with the reason.
        validation = status["validation"]
        assert (validation["state"], validation["validated"], validation["quarantined"]) == (
            "Done", 2, 1), validation  # fmt: skip
        assert validation["reasons"][0]["reason"] == BROKEN_REASON, validation
        # What a user sees: `kubectl get trun` prints the step, the reward and those counts.
        header, row = cluster.kubectl("get", "trun", "toy", "-n", namespace).stdout.splitlines()
        cell = {name: row[header.index(name) :].split()[0]
                for name in ("STEP", "REWARD", "VALIDATED", "QUARANTINED")}  # fmt: skip
        assert cell["STEP"] == str(TOY_STEPS), (header, row)
        assert float(cell["REWARD"]) == status["metrics"]["rewardMean"], (header, row)
        assert (cell["VALIDATED"], cell["QUARANTINED"]) == ("2", "1"), (header, row)
        # It trained only on the valid task: every rollout of every step is of that one.
        drawn = {json.loads(line)["instance_id"]
                 for path in (output / "trajectories").glob("step-*.jsonl")
                 for line in path.read_text().splitlines() if line.strip()}  # fmt: skip
        assert drawn == {toy_task.instance_id}, drawn
        # One trainer Job all along; its second pod finished the run, on the real node.
        [job] = owned_by(cluster, "jobs", namespace, "toy")
        assert job["metadata"]["uid"] == job_uid
        assert second["spec"]["nodeName"] == real_node.name
        assert get("pod", second["metadata"]["name"])["status"]["phase"] == "Succeeded"
        # A new operator pod (the Deployment's) reported the end.
        assert killed and not {p["metadata"]["uid"] for p in pods(operator)} & set(killed)
        assert steps_at_kill < TOY_STEPS  # the operator was killed mid-run
        resumed = cluster.kubectl("logs", "-n", namespace, second["metadata"]["name"]).stdout
        assert "resuming from" in resumed, resumed[-4000:]
        # Nothing lost, nothing done twice: every step once in the metrics on the volume.
        records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        assert [r["step"] for r in records] == list(range(1, TOY_STEPS + 1)), records
        assert (output / f"step-{TOY_STEPS}").is_dir()
        # The recipe's next step: SFT on this run's resolved rollouts, a trainer Job alone.
        sft_on_rollouts(cluster, real_node, namespace, toy_trainingrun(namespace, trainer_image),
                        output)  # fmt: skip
    finally:
        cluster.kubectl("delete", "trun", "toy", "-n", namespace, "--timeout=120s",
                        check=False, timeout=150)  # fmt: skip
        for claim in ("toy-model", "toy-checkpoints"):
            cluster.kubectl("delete", "pvc", claim, "-n", namespace, "--wait=false",
                            check=False)  # fmt: skip
            cluster.kubectl("delete", "pv", f"{namespace}-{claim}", "--wait=false",
                            check=False)  # fmt: skip
        cluster.kubectl("delete", "configmap", "toy-tasks", "-n", namespace, check=False)


def test_the_readme_cluster_section_works_as_written(
    cluster: Cluster, real_node: RealNode, docker_engine: DockerEngine, docker_base: str,
    operator_release: Release,
) -> None:  # fmt: skip
    """Each command of the README's cluster section, run against the test cluster with only
    the registry changed: no registry is reachable here, so `images/build.sh --push` becomes
    the same build loaded into the node, and each namespace is pinned to the real node when it
    is created (the test cluster's kwok nodes run nothing). The tasks of the swe-gym pool come
    from Hugging Face, which this machine cannot reach: its gateway is made but cannot load them.
    The module's own release (one namespace) is uninstalled first: the README's operator
    watches the whole cluster."""
    uninstall_operator(cluster, operator_release.namespace)
    commands = readme_cluster_commands()
    assert [c[:2] for c in commands] == [
        ["bash", "images/build.sh"], ["helm", "install"], ["kubectl", "create"],
        ["kubectl", "apply"], ["kubectl", "get"], ["kubectl", "scale"], ["kubectl", "explain"],
    ], commands  # fmt: skip
    outputs: list[str] = []
    namespaces: list[str] = []
    try:
        for command in commands:
            command = [a.replace("registry.example.com/crl", REGISTRY) for a in command]
            if command[:2] == ["bash", "images/build.sh"]:
                assert "--push" in command
                tags = [build_image(docker_engine, docker_base, c) for c in ("operator", "worker")]
                real_node.load_image(docker_engine.env(), *tags)
                continue
            if command[:2] == ["helm", "install"]:
                namespace = command[command.index("-n") + 1]
                cluster.kubectl("create", "namespace", namespace)
                pin_namespace(cluster, real_node, namespace)
                namespaces.append(namespace)
                result = subprocess.run([str(cluster.helm_path), *command[1:]], cwd=ROOT,
                                        env=cluster.env, capture_output=True, text=True,
                                        timeout=240, check=False)  # fmt: skip
                assert result.returncode == 0, result.stderr
                rollout = cluster.kubectl("rollout", "status", "deployment/coderepairrl", "-n",
                                          namespace, "--timeout=180s", timeout=200)  # fmt: skip
                outputs.append(rollout.stdout)
                continue
            assert command[0] == "kubectl", command
            result = subprocess.run([str(cluster.kubectl_path), *command[1:]], cwd=ROOT,
                                    env=cluster.env, capture_output=True, text=True, timeout=120,
                                    check=False)  # fmt: skip
            assert result.returncode == 0, f"{command}: {result.stderr}"
            outputs.append(result.stdout)
            if command[1:3] == ["create", "namespace"]:
                pin_namespace(cluster, real_node, command[3])
                namespaces.append(command[3])
        # What each command was for.
        team = namespaces[-1]
        [gateway] = until("the swe-gym gateway Deployment",
                          lambda: owned_by(cluster, "deployments", team, "swe-gym"))  # fmt: skip
        assert gateway["metadata"]["namespace"] == team
        listed = outputs[-3]  # kubectl get crl
        assert listed.splitlines()[1].split()[0] == "rolloutpool.coderepair.io/swe-gym", listed
        pool = json.loads(cluster.kubectl("get", "rpool", "swe-gym", "-n", team, "-o",
                                          "json").stdout)  # fmt: skip
        assert pool["spec"]["replicas"] == 64  # kubectl scale
        assert "FIELDS:" in outputs[-1] and "numGenerations" in outputs[-1]  # kubectl explain
        [operator] = [p for p in json.loads(cluster.kubectl(
            "get", "pods", "-n", namespaces[0], "-o", "json").stdout)["items"]]  # fmt: skip
        assert operator["spec"]["nodeName"] == real_node.name and pod_ready(operator)
    finally:
        for namespace in reversed(namespaces[1:]):
            cluster.kubectl("delete", "rolloutpools", "--all", "-n", namespace,
                            "--timeout=60s", check=False, timeout=90)  # fmt: skip
        if namespaces:
            subprocess.run([str(cluster.helm_path), "uninstall", "coderepairrl", "-n",
                            namespaces[0], "--wait", "--timeout", "60s"], env=cluster.env,
                           capture_output=True, timeout=90, check=False)  # fmt: skip
        for namespace in namespaces:
            cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=1",
                            "--timeout=60s", check=False, timeout=90)  # fmt: skip
            cluster.delete_namespace(namespace)
