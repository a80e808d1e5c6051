"""TrainingRuns queued, admitted and preempted by a real Kueue (tests/fixtures/kueue.py).

A control plane of its own (Kueue's webhooks must not reach into the session's shared cluster),
two kwok nodes with 8 GPUs each, Kueue's manager built from its Go module, and the operator as
a subprocess. The test plays the trainer where the fake pods cannot: it writes the progress
report a trainer would. Trainer pods stay Pending (a node selector no node matches), so a
trainer Job never finishes on its own; Kueue admits by quota, not by pods.

The quota is sampled on every poll: the GPUs of all admitted Workloads (Kueue's own
`status.admission`) never exceed the ClusterQueue's nominal quota.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl_operator.apply import Kube, KubeError, load_api_client
from crl_worker.api.common import SandboxSpec
from crl_worker.errors import SandboxError
from crl_worker.sandbox.kubeapi import KubeApi
from crl_worker.sandbox.pods import KubernetesSandboxConfig, build_pod, kueue_gated
from crl_worker.tasks.model import Task, TestSpec

from .fixtures.cluster import Cluster
from .fixtures.cluster_build import ClusterError
from .fixtures.cluster_build import build as build_cluster
from .fixtures.kueue import POD_NAMESPACE_LABEL, Kueue
from .fixtures.kueue_teams import (
    GPU,
    WORKLOADS,
    admitted_gpus,
    children,
    queued_run,
    report,
    state,
    team,
)
from .fixtures.operator_process import OperatorProcess
from .fixtures.resources import PENDING_TRAINER, apply, condition, wait_for

QUOTA = 4


@pytest.fixture(scope="module")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Kueue]]:
    """A control plane with Kueue running against it (both built from Go modules)."""
    if shutil.which("go") is None:
        if os.environ.get("CI"):
            pytest.fail("Go is needed in CI to build Kueue (tests/kueue)")
        pytest.skip("Go is not installed: Kueue is built from its Go module")
    workdir = tmp_path_factory.mktemp("kueue-cluster")
    try:
        cluster = Cluster(workdir / "cluster", bin_dir=build_cluster(), nodes=2).start()
    except ClusterError as error:
        pytest.fail(f"the test control plane did not start: {error}")
    kueue = Kueue(cluster, workdir / "kueue", pod_namespaces=True)
    try:
        kueue.install()
        kueue.start()
        yield cluster, kueue
    finally:
        kueue.stop()
        cluster.stop()


@pytest.fixture(scope="module")
def operator(
    kueue_cluster: tuple[Cluster, Kueue], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    cluster, _ = kueue_cluster
    log_path = tmp_path_factory.mktemp("operator") / "operator.log"
    proc = OperatorProcess(cluster.kubeconfig, log_path=log_path, resync_seconds=20).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def kube(kueue_cluster: tuple[Cluster, Kueue]) -> Kube:
    return Kube(load_api_client(str(kueue_cluster[0].kubeconfig)), field_manager="kueue-test")


class Sampler:
    """Polls a run's status while checking, on every poll, that the quota holds."""

    def __init__(self, kube: Kube, namespace: str, quota: int) -> None:
        self.kube = kube
        self.namespace = namespace
        self.quota = quota
        self.peak = 0
        self.samples = 0

    def check(self) -> None:
        used = admitted_gpus(self.kube, self.namespace)
        self.samples += 1
        self.peak = max(self.peak, used)
        assert used <= self.quota, f"{used} GPUs admitted in a queue of {self.quota}"

    def run(self, name: str) -> dict[str, Any]:
        self.check()
        return self.kube.get("TrainingRun", self.namespace, name) or {}


def test_runs_are_admitted_whole_within_quota(
    kueue_cluster: tuple[Cluster, Kueue], operator: OperatorProcess, kube: Kube
) -> None:
    """Two runs of 2 GPUs fit a 4-GPU queue; the third waits visibly with no GPU pod; one
    larger than the queue says it can never fit; the third starts when one finishes."""
    cluster, _ = kueue_cluster
    ns = cluster.namespace("quota")
    team(cluster, ns, "team-quota", QUOTA)
    sampler = Sampler(kube, ns, QUOTA)
    apply(cluster, ns, *(queued_run(f"run-{i}", "team-quota") for i in range(3)))
    huge = queued_run(
        "huge", "team-quota", trainer={**PENDING_TRAINER, "nodes": 2, "gpusPerNode": 4}
    )
    apply(cluster, ns, huge)

    def settled() -> list[dict[str, Any]] | None:
        runs = [sampler.run(f"run-{i}") for i in range(3)]
        states = sorted(str(state(r)) for r in runs)
        assert states == ["Admitted", "Admitted", "Queued"], [
            (state(r), condition(r, "Admitted"), condition(r, "Ready")) for r in runs
        ]
        return runs

    runs = wait_for("two runs admitted and one queued", settled, op=None)
    waiting = next(r for r in runs if state(r) == "Queued")
    name = waiting["metadata"]["name"]
    admitted = condition(waiting, "Admitted")
    assert admitted["status"] == "False" and admitted["reason"] == "Pending", admitted
    assert "team-quota" in admitted["message"] and "insufficient" in admitted["message"], admitted
    assert condition(waiting, "Ready")["reason"] == "Pending"
    # Queued means nothing holds a GPU: no inference Deployment and no trainer Job.
    assert children(kube, ns, name) == {}
    for r in runs:
        if state(r) == "Admitted":
            got = wait_for(
                "the admitted run's trainer Job",
                lambda r=r: "Job" in children(kube, ns, r["metadata"]["name"]),
            )
            assert got
    table = cluster.kubectl("get", "trun", "-n", ns, name).stdout
    assert "Queued" in table and "team-quota" in table, table

    big = wait_for(
        "the oversized run's verdict",
        lambda: (
            condition(sampler.run("huge"), "Admitted").get("reason") == "ExceedsQuota"
            and sampler.run("huge")
        ),
    )
    assert "maximum capacity" in condition(big, "Admitted")["message"]
    assert "Job" not in children(kube, ns, "huge")

    # One admitted run goes away: the queued one is admitted and starts.
    done = next(r["metadata"]["name"] for r in runs if state(r) == "Admitted")
    cluster.kubectl("delete", "trun", "-n", ns, done, "--wait=false")
    wait_for("the queued run admitted", lambda: state(sampler.run(name)) == "Admitted")
    wait_for("its trainer Job", lambda: "Job" in children(kube, ns, name))
    assert sampler.peak == QUOTA and sampler.samples > 3


def test_preemption_stops_the_run_and_it_resumes(
    kueue_cluster: tuple[Cluster, Kueue], operator: OperatorProcess, kube: Kube
) -> None:
    """A high-priority run preempts a low one: the low run's trainer Job and inference stop,
    its status says Preempted, and once the quota is free again it is readmitted, its trainer
    Job comes back and the step count continues from the last checkpoint."""
    cluster, _ = kueue_cluster
    ns = cluster.namespace("preempt")
    team(cluster, ns, "team-preempt", 2)
    sampler = Sampler(kube, ns, 2)
    apply(cluster, ns, queued_run("low", "team-preempt", "low"))
    wait_for(
        "the low run's trainer Job",
        lambda: "Job" in children(kube, ns, "low") and sampler.check() is None,
    )
    wait_for("the progress ConfigMap", lambda: kube.get("ConfigMap", ns, "low-progress"))
    report(cluster, ns, "low", 10)
    wait_for(
        "step 10 in the status", lambda: (sampler.run("low").get("status") or {}).get("step") == 10
    )
    first_job = children(kube, ns, "low")["Job"]["metadata"]["uid"]

    apply(cluster, ns, queued_run("high", "team-preempt", "high"))
    low = wait_for(
        "the low run preempted",
        lambda: state(sampler.run("low")) == "Preempted" and sampler.run("low"),
    )
    assert condition(low, "Admitted")["reason"] == "Preempted", condition(low, "Admitted")
    wait_for("the high run admitted", lambda: state(sampler.run("high")) == "Admitted")
    wait_for("the low run's pods stopped", lambda: children(kube, ns, "low") == {})
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=low", "-o", "json"
    ).stdout
    assert "Preempted" in events

    cluster.kubectl("delete", "trun", "-n", ns, "high", "--wait=false")
    wait_for("the low run readmitted", lambda: state(sampler.run("low")) == "Admitted")
    job = wait_for("a new trainer Job", lambda: children(kube, ns, "low").get("Job"))
    assert job["metadata"]["uid"] != first_job
    assert (sampler.run("low").get("status") or {}).get("step") == 10
    report(cluster, ns, "low", 11)
    wait_for(
        "the step count continues",
        lambda: (sampler.run("low").get("status") or {}).get("step") == 11,
    )


def test_kueue_restarted_mid_run(
    kueue_cluster: tuple[Cluster, Kueue], operator: OperatorProcess, kube: Kube
) -> None:
    """Kueue stops and comes back: admitted runs stay admitted, a queued one keeps waiting
    (no GPU pod meanwhile) and is admitted by the restarted Kueue when quota frees up."""
    cluster, kueue = kueue_cluster
    ns = cluster.namespace("restart")
    team(cluster, ns, "team-restart", 2)
    sampler = Sampler(kube, ns, 2)
    apply(cluster, ns, queued_run("first", "team-restart"))
    wait_for("the first run admitted", lambda: state(sampler.run("first")) == "Admitted")
    kueue.stop()
    apply(cluster, ns, queued_run("second", "team-restart"))
    # Kueue's webhooks are down with it, so the Workload cannot even be created: the run
    # waits with nothing running, and says why.
    second = wait_for(
        "the second run waiting for its Workload",
        lambda: (
            condition(sampler.run("second"), "Admitted").get("reason") == "WorkloadMissing"
            and sampler.run("second")
        ),
    )
    assert state(second) == "Queued"
    assert "Job" not in children(kube, ns, "second")
    kueue.start()
    wait_for(
        "the second run queued",
        lambda: condition(sampler.run("second"), "Admitted").get("reason") == "Pending",
    )
    assert state(sampler.run("first")) == "Admitted"
    cluster.kubectl("delete", "trun", "-n", ns, "first", "--wait=false")
    wait_for("the second run admitted", lambda: state(sampler.run("second")) == "Admitted")


def test_without_kueue_a_queued_run_runs_and_says_why(cluster: Cluster, tmp_path: Path) -> None:
    """The session's cluster has no Kueue: the run starts unqueued, its Admitted condition
    says that the queue it names is not enforced."""
    ns = cluster.namespace("nokueue")
    kube = Kube(load_api_client(str(cluster.kubeconfig)), field_manager="kueue-test")
    proc = OperatorProcess(
        cluster.kubeconfig, namespaces=[ns], log_path=tmp_path / "op.log"
    ).start()
    try:
        apply(cluster, ns, queued_run("solo", "team-x"))
        run = wait_for(
            "the Admitted condition",
            lambda: (
                condition(kube.get("TrainingRun", ns, "solo"), "Admitted").get("reason")
                == "KueueAbsent"
                and kube.get("TrainingRun", ns, "solo")
            ),
        )
        assert condition(run, "Admitted")["status"] == "True"
        assert "Kueue is not installed" in condition(run, "Admitted")["message"]
        assert state(run) == "Unqueued"
        wait_for("the trainer Job", lambda: "Job" in children(kube, ns, "solo"))
        with pytest.raises(KubeError):
            kube.request("GET", "Workload", WORKLOADS.path(ns))
    finally:
        proc.stop()


TEAMS = sorted((Path(__file__).resolve().parents[1] / "examples" / "teams").glob("*.yaml"))


def test_the_teams_example_applies_and_its_run_is_admitted(
    kueue_cluster: tuple[Cluster, Kueue], operator: OperatorProcess, kube: Kube
) -> None:
    """examples/teams/ as a user applies it: the ClusterQueues become active (their flavor,
    cohort and priorities exist) and team A's run is admitted as one unit."""
    cluster, _ = kueue_cluster
    for path in TEAMS:
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    for name in ("team-a", "team-b"):
        wait_for(
            f"ClusterQueue {name} active",
            lambda name=name: (
                condition(
                    kube.request(
                        "GET", "ClusterQueue", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{name}"
                    ),
                    "Active",
                ).get("status")
                == "True"
            ),
        )
    run = wait_for(
        "team A's run admitted",
        lambda: (
            state(kube.get("TrainingRun", "team-a", "qwen3-0-6b-team-a") or {}) == "Admitted"
            and kube.get("TrainingRun", "team-a", "qwen3-0-6b-team-a")
        ),
    )
    assert run["status"]["queue"] == {"name": "gpus", "state": "Admitted", "clusterQueue": "team-a"}
    workload = kube.get("Workload", "team-a", "qwen3-0-6b-team-a-workload")
    assert workload is not None
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [
        ("inference", 1),
        ("trainer", 1),
    ]
    usage = {
        a["name"]: a["resourceUsage"][GPU]
        for a in workload["status"]["admission"]["podSetAssignments"]
    }
    assert usage == {"inference": "1", "trainer": "2"}


def test_borrowing_from_an_idle_team_and_reclaim(
    kueue_cluster: tuple[Cluster, Kueue], operator: OperatorProcess, kube: Kube
) -> None:
    """Team Y borrows team X's idle GPUs (two runs on a 2-GPU quota); when team X submits, it
    reclaims them: one of Y's runs is preempted (status Preempted, its pods stopped), X's run is
    admitted, and neither team ever holds more than its quota plus what it may borrow."""
    cluster, _ = kueue_cluster
    nx, ny = cluster.namespace("lender"), cluster.namespace("borrower")
    team(cluster, nx, "team-x", 2, cohort="lab", borrowing_limit=0)
    team(cluster, ny, "team-y", 2, cohort="lab", borrowing_limit=2)
    x, y = Sampler(kube, nx, 2), Sampler(kube, ny, 4)

    def both() -> None:
        x.check()
        y.check()
        assert x.samples and admitted_gpus(kube, nx) + admitted_gpus(kube, ny) <= 4

    apply(cluster, ny, queued_run("y-0", "team-y"), queued_run("y-1", "team-y"))
    wait_for(
        "both of team Y's runs admitted (one on borrowed GPUs)",
        lambda: both() is None and all(state(y.run(f"y-{i}")) == "Admitted" for i in range(2)),
    )
    apply(cluster, nx, queued_run("x-0", "team-x"))
    wait_for("team X's run admitted", lambda: both() is None and state(x.run("x-0")) == "Admitted")
    states = sorted(str(state(y.run(f"y-{i}"))) for i in range(2))
    assert states == ["Admitted", "Preempted"], states
    preempted = next(f"y-{i}" for i in range(2) if state(y.run(f"y-{i}")) == "Preempted")
    reason = condition(y.run(preempted), "Admitted")
    assert reason["reason"] == "Preempted" and "reclamation" in reason["message"], reason
    wait_for("the preempted run's pods stopped", lambda: children(kube, ny, preempted) == {})
    assert y.peak == 4 and x.peak == 2


def test_fair_sharing_between_two_busy_teams(
    kueue_cluster: tuple[Cluster, Kueue], operator: OperatorProcess, kube: Kube
) -> None:
    """Two teams with no GPUs of their own share a cohort's pool of 6 by fair-sharing weights 2:1
    (Kueue's `fairSharing` is on, tests/fixtures/kueue.py). Team B, alone, borrows the whole pool;
    once team A submits too, both oversubscribed, Kueue preempts B's runs beyond its share (reason
    "Fair Sharing within the cohort") until A holds 4 GPUs and B 2, and the cohort never holds more
    than the pool (sampled on every poll)."""
    cluster, _ = kueue_cluster
    pool, na, nb = (cluster.namespace(p) for p in ("fair-pool", "fair-a", "fair-b"))
    team(cluster, pool, "fair-pool", 6, cohort="fair")  # lends all, runs nothing
    team(cluster, na, "fair-a", 0, cohort="fair", weight=2)
    team(cluster, nb, "fair-b", 0, cohort="fair", weight=1)
    peak = {"cohort": 0, "samples": 0}

    def held() -> tuple[int, int]:
        """GPUs admitted to team A and team B now; records the cohort's peak."""
        got = admitted_gpus(kube, na), admitted_gpus(kube, nb)
        peak["cohort"] = max(peak["cohort"], sum(got) + admitted_gpus(kube, pool))
        peak["samples"] += 1
        return got

    apply(cluster, nb, *(queued_run(f"b-{i}", "fair-b") for i in range(4)))
    wait_for("team B borrowing the whole pool", lambda: held() == (0, 6))
    apply(cluster, na, *(queued_run(f"a-{i}", "fair-a") for i in range(3)))
    wait_for("the weighted fair share, 4 GPUs to A and 2 to B", lambda: held() == (4, 2))
    runs = {f"b-{i}": kube.get("TrainingRun", nb, f"b-{i}") or {} for i in range(4)}
    preempted = [n for n, r in runs.items() if state(r) == "Preempted"]
    assert len(preempted) == 2, {n: state(r) for n, r in runs.items()}
    for name in preempted:
        reason = condition(runs[name], "Admitted")
        assert reason["reason"] == "Preempted" and "Fair Sharing" in reason["message"], reason
        wait_for(f"{name}'s pods stopped", lambda name=name: children(kube, nb, name) == {})
    # Settled: A's third run would push A's share above B's, B's requeued runs the reverse.
    assert held() == (4, 2)

    def a_settled() -> list[str]:
        got = sorted(str(state(kube.get("TrainingRun", na, f"a-{i}") or {})) for i in range(3))
        assert got == ["Admitted", "Admitted", "Queued"], got
        return got

    # The runs' status follows Kueue's admission through the operator, which may lag on a
    # loaded machine: waited for, and the GPUs held must not have moved meanwhile.
    wait_for("team A's runs: two admitted, one queued", a_settled)
    assert held() == (4, 2)
    assert peak["cohort"] <= 6 and peak["samples"] > 3, peak


def test_a_pods_ready_timeout_evicts_stops_and_requeues_the_run(
    kueue_cluster: tuple[Cluster, Kueue], operator: OperatorProcess, kube: Kube
) -> None:
    """Kueue restarted with `waitForPodsReady` (6 s): a run whose trainer pods never become
    ready carries the PodsReady condition the operator writes (Kueue writes it only for its own
    integrations), is evicted with PodsReadyTimeout once the timeout passes, stops its pods
    like a preempted run, says why, and is requeued after Kueue's backoff and admitted again."""
    cluster, kueue = kueue_cluster
    ns = cluster.namespace("podsready")
    team(cluster, ns, "team-podsready", 2)
    sampler = Sampler(kube, ns, 2)
    kueue.stop()
    kueue.wait_for_pods_ready = 6
    kueue.start()
    try:
        apply(cluster, ns, queued_run("stuck", "team-podsready"))
        wait_for("the run admitted", lambda: state(sampler.run("stuck")) == "Admitted")
        workload = wait_for(
            "PodsReady written by the operator",
            lambda: (
                condition(kube.get("Workload", ns, "stuck-workload"), "PodsReady")
                and kube.get("Workload", ns, "stuck-workload")
            ),
        )
        assert condition(workload, "PodsReady")["reason"] == "WaitForStart", workload["status"]
        first_job = wait_for("the trainer Job", lambda: children(kube, ns, "stuck").get("Job"))
        run = wait_for(
            "the PodsReady timeout eviction",
            # One read per poll: Kueue's requeue backoff is short, so a second read can already
            # see the run admitted again.
            lambda: (r := sampler.run("stuck")) and state(r) == "Evicted" and r,
            timeout=60,
        )
        assert condition(run, "Admitted")["reason"] == "PodsReadyTimeout", condition(
            run, "Admitted"
        )
        assert condition(run, "Ready")["reason"] == "PodsReadyTimeout"
        wait_for("the evicted run's pods stopped", lambda: children(kube, ns, "stuck") == {})
        events = cluster.kubectl(
            "get", "events", "-n", ns, "--field-selector", "involvedObject.name=stuck", "-o", "json"
        ).stdout
        assert "PodsReady timeout" in events
        wait_for(
            "the run requeued and admitted again",
            lambda: state(sampler.run("stuck")) == "Admitted",
            timeout=60,
        )
        job = wait_for("a new trainer Job", lambda: children(kube, ns, "stuck").get("Job"))
        assert job["metadata"]["uid"] != first_job["metadata"]["uid"]
        assert sampler.peak <= 2
    finally:
        cluster.kubectl("delete", "trun", "-n", ns, "stuck", "--wait=false")
        kueue.stop()
        kueue.wait_for_pods_ready = None
        kueue.start()


async def test_sandboxes_use_quota_gates_a_sandbox_until_the_queue_has_room(
    kueue_cluster: tuple[Cluster, Kueue],
) -> None:
    """scheduling.sandboxesUseQuota through Kueue's plain-pod integration: the gateway's own
    pod manifest and start wait (build_pod, KubeApi.wait_ready) against a queue with room for
    one 1-CPU sandbox. The second is gated (its start times out saying so) until the first is
    deleted; a sandbox without the queue label (the default) is never held back."""
    cluster, _ = kueue_cluster
    ns = cluster.namespace("sandboxes")
    cluster.kubectl("label", "namespace", ns, f"{POD_NAMESPACE_LABEL}=true")
    docs: list[dict[str, Any]] = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": "cpu"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": "sandboxes"},
         "spec": {
             "namespaceSelector": {},
             "resourceGroups": [{
                 "coveredResources": ["cpu", "memory", "ephemeral-storage"],
                 "flavors": [{"name": "cpu", "resources": [
                     {"name": "cpu", "nominalQuota": "1"},
                     {"name": "memory", "nominalQuota": "8Gi"},
                     {"name": "ephemeral-storage", "nominalQuota": "100Gi"},
                 ]}],
             }],
         }},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "sandboxes", "namespace": ns},
         "spec": {"clusterQueue": "sandboxes"}},
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))
    task = Task(
        instance_id="demo__demo-1",
        repo="demo/demo",
        base_commit="0" * 40,
        image="registry.invalid/sandbox:1",
        test=TestSpec(command="true", log_format="pytest"),
    )
    sandbox = SandboxSpec.model_validate({"resources": {"requests": {"cpu": "1"}}})
    counted = KubernetesSandboxConfig(
        namespace=ns, pool="pool", gateway_id="gw", sandbox=sandbox, queue_name="sandboxes"
    )
    uncounted = counted.model_copy(update={"queue_name": None})
    api = KubeApi(str(cluster.kubeconfig))
    try:
        await api.create_pod(ns, build_pod(task, "pool-first", counted))
        await api.wait_ready(ns, "pool-first", 30)
        await api.create_pod(ns, build_pod(task, "pool-second", counted))
        assert kueue_gated(await api.read_pod(ns, "pool-second"))  # gated from creation
        with pytest.raises(SandboxError, match=r"still gated by Kueue.*queue sandboxes had no"):
            await api.wait_ready(ns, "pool-second", 2)
        # The default: no queue label, not counted, started while the queue is full.
        await api.create_pod(ns, build_pod(task, "pool-plain", uncounted))
        await api.wait_ready(ns, "pool-plain", 30)
        assert kueue_gated(await api.read_pod(ns, "pool-second"))
        # What the kubelet reports once the keep-alive shell exits on the gateway's delete
        # (kwok has no kubelet): the pod succeeded, so Kueue finishes its Workload.
        cluster.kubectl(
            "patch", "pod", "-n", ns, "pool-first", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": "Succeeded"}}),
        )  # fmt: skip
        await api.delete_pod(ns, "pool-first")
        await api.wait_ready(ns, "pool-second", 30)
        assert not kueue_gated(await api.read_pod(ns, "pool-second"))
    finally:
        await api.aclose()
        cluster.delete_namespace(ns)
