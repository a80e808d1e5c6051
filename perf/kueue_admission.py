"""Admission through a real Kueue: TrainingRuns against the floor of plain Jobs.

Three teams, each with a ClusterQueue of `--quota` GPUs, each submit `--runs` TrainingRuns at
once (every run: 1 inference GPU + 1 trainer node with 1 GPU, admitted as one Workload by the
operator, docs/scheduling.md). The floor is the same GPU demand submitted as plain Jobs through
Kueue's own batch/job integration (one Job of 2 pods with 1 GPU each per run), in the same
cluster, before the runs. Both phases poll the Workloads every 50 ms and print:

- time from apply to admission (first poll that sees `status.admission`), p50 and p99, over the
  Workloads admitted in the first wave (the quota admits `quota // 2` per team);
- admissions per second over that wave;
- peak GPUs admitted per team (sampled on every poll) against the quota.

Kueue, the control plane and kwok are built from Go modules (tests/kueue/build.sh,
tests/controlplane/build.sh). Run: `python perf/kueue_admission.py` (about two minutes warm).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crl_operator.apply import Kube, load_api_client  # noqa: E402
from tests.fixtures.cluster import Cluster  # noqa: E402
from tests.fixtures.cluster_build import build as build_cluster  # noqa: E402
from tests.fixtures.kueue import Kueue, version  # noqa: E402
from tests.fixtures.operator_process import OperatorProcess  # noqa: E402

GPU = "nvidia.com/gpu"
API = "kueue.x-k8s.io/v1beta2"
TEAMS = 3


def queue_objects(name: str, namespace: str, quota: int) -> list[dict[str, Any]]:
    """A ClusterQueue of `quota` GPUs and its LocalQueue in `namespace`."""
    return [
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": ["cpu", "memory", GPU],
             "flavors": [{"name": "gpu", "resources": [
                 {"name": "cpu", "nominalQuota": "1000"},
                 {"name": "memory", "nominalQuota": "10Ti"},
                 {"name": GPU, "nominalQuota": quota}]}]}]}},
        {"apiVersion": API, "kind": "LocalQueue",
         "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": name}},
    ]  # fmt: skip


def training_run(name: str, queue: str) -> dict[str, Any]:
    """The tests' small run (1 + 1 GPUs); its trainer stays Pending (kwok would finish it)."""
    return {
        "apiVersion": "coderepair.io/v1alpha1", "kind": "TrainingRun", "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen3-8B"},
            "tasks": {"format": "swe-gym", "huggingFace": {"name": "SWE-Gym/SWE-Gym", "split": "train"}},
            "rollout": {"pool": {"replicas": 0, "maxSandboxes": 4}},
            "inference": {"replicas": 1, "gpus": 1},
            "trainer": {"nodes": 1, "gpusPerNode": 1,
                        "placement": {"nodeSelector": {"crl-test/never": "true"}}},
            "scheduling": {"queueName": queue},
        },
    }  # fmt: skip


def plain_job(name: str, queue: str) -> dict[str, Any]:
    """The floor: one Job of 2 pods with 1 GPU each, queued by Kueue's batch/job integration."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"parallelism": 2, "completions": 2, "suspend": True, "template": {"spec": {
            "restartPolicy": "Never", "nodeSelector": {"crl-test/never": "true"},
            "containers": [{"name": "c", "image": "busybox",
                            "resources": {"requests": {GPU: 1}, "limits": {GPU: 1}}}]}}},
    }  # fmt: skip


def kubectl_apply(
    cluster: Cluster, docs: list[dict[str, Any]], namespace: str | None = None
) -> None:
    """`kubectl apply` the documents at once, as a user submitting them."""
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    cluster.kubectl(*args, input="\n---\n".join(yaml.safe_dump(d) for d in docs))


def gpus(workload: dict[str, Any]) -> int:
    """GPUs Kueue reserved for a Workload (0 while it is not admitted)."""
    admission = (workload.get("status") or {}).get("admission") or {}
    return sum(
        int(str((a.get("resourceUsage") or {}).get(GPU, 0)))
        for a in admission.get("podSetAssignments") or ()
    )


def measure(
    cluster: Cluster,
    kube: Kube,
    kind: str,
    namespaces: list[str],
    runs: int,
    quota: int,
    make: Any,
    timeout: float = 180,
) -> dict[str, Any]:
    """Apply `runs` objects per namespace at once; poll until the first wave is admitted.

    The teams' applies run in a thread while this one polls: an admission is timed when it
    happens, not after every team's `kubectl apply` returned (polling only after the last
    apply added the later teams' apply time to the earlier teams' latencies).
    """
    wave = TEAMS * (quota // 2)
    started: dict[tuple[str, str], float] = {}
    failures: list[BaseException] = []
    applies: list[float] = []  # seconds each team's `kubectl apply` took

    def submit() -> None:
        try:
            for ns in namespaces:
                docs = [make(f"{kind.lower()}-{i}", ns.rsplit("-", 1)[0]) for i in range(runs)]
                t = time.monotonic()
                for d in docs:
                    started[(ns, d["metadata"]["name"])] = t
                kubectl_apply(cluster, docs, ns)
                applies.append(time.monotonic() - t)
        except BaseException as err:  # re-raised in the polling thread
            failures.append(err)

    submitter = threading.Thread(target=submit, name="submit", daemon=True)
    submitter.start()
    admitted: dict[tuple[str, str], float] = {}
    seen: dict[tuple[str, str], float] = {}
    peak = dict.fromkeys(namespaces, 0)
    deadline = time.monotonic() + timeout
    while len(admitted) < wave and time.monotonic() < deadline:
        now = time.monotonic()
        for ns in namespaces:
            used = 0
            for wl in kube.list("Workload", namespace=ns):
                owner = (wl["metadata"].get("ownerReferences") or [{}])[0].get("name", "")
                used += gpus(wl)
                seen.setdefault((ns, owner), now)
                if gpus(wl) and (ns, owner) not in admitted:
                    admitted[(ns, owner)] = now
            peak[ns] = max(peak[ns], used)
        if failures:
            raise failures[0]
        time.sleep(0.05)
    submitter.join()
    if failures:
        raise failures[0]
    latencies = sorted(admitted[k] - started[k] for k in admitted if k in started)
    created = sorted(seen[k] - started[k] for k in admitted if k in started)
    first = min(started.values())
    span = max(admitted.values()) - first if admitted else float("nan")
    return {
        "admitted": len(latencies),
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        if latencies
        else float("nan"),
        "per_second": len(latencies) / span if span and span > 0 else float("nan"),
        "peak": peak,
        "workload_p50": statistics.median(created) if created else float("nan"),
        "apply_seconds": statistics.mean(applies) if applies else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run both phases and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per team")
    parser.add_argument("--quota", type=int, default=8, help="GPUs per team's ClusterQueue")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (logs of Kueue and operator)"
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="crl-kueue-perf-"))
    cluster = Cluster(work / "cluster", bin_dir=build_cluster(), nodes=4).start()
    kueue = Kueue(cluster, work / "kueue")
    operator = None
    try:
        kueue.install()
        kueue.start()
        kube = Kube(load_api_client(str(cluster.kubeconfig)), field_manager="perf")
        kubectl_apply(
            cluster, [{"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": "gpu"}}]
        )
        # Running all along, as in a cluster (its start-up is not part of an admission).
        operator = OperatorProcess(cluster.kubeconfig, log_path=work / "operator.log").start()
        phases = {}
        for phase, kind, make in (
            ("floor", "Job", plain_job),
            ("runs", "TrainingRun", training_run),
        ):
            namespaces = [f"{phase}{t}-{phase}" for t in range(TEAMS)]
            for ns in namespaces:
                cluster.kubectl("create", "namespace", ns)
                kubectl_apply(cluster, queue_objects(ns.rsplit("-", 1)[0], ns, args.quota))
            phases[phase] = measure(cluster, kube, kind, namespaces, args.runs, args.quota, make)
        floor, runs = phases["floor"], phases["runs"]
        print(
            f"Kueue {version()}; {TEAMS} teams x {args.runs} runs of 2 GPUs; quota {args.quota} GPUs a team"
        )
        print(f"{'':22}{'floor (plain Jobs)':>20}{'TrainingRuns':>16}")
        for key, label in (
            ("admitted", "admitted (1st wave)"),
            ("p50", "apply->admitted p50 s"),
            ("p99", "apply->admitted p99 s"),
            ("per_second", "admissions / s"),
            ("apply_seconds", "kubectl apply s/team"),
        ):
            print(f"{label:22}{floor[key]:>20.3f}{runs[key]:>16.3f}")
        print(
            f"{'peak GPUs per team':22}{max(floor['peak'].values()):>20}{max(runs['peak'].values()):>16}"
            f"   (quota {args.quota})"
        )
        ratio = runs["p50"] / floor["p50"] if floor["p50"] else float("nan")
        print(
            f"p50 ratio runs/floor: {ratio:.2f} (goal <= 1.5); quota exceeded: "
            f"{any(v > args.quota for p in phases.values() for v in p['peak'].values())}"
        )
        if args.json:
            args.json.write_text(json.dumps({"kueue": version(), **phases}, indent=1))
    finally:
        if operator is not None:
            operator.stop()
        kueue.stop()
        cluster.stop()
        if args.keep:
            print(f"work folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
