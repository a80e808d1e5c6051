"""How the operator scales: N TrainingRuns at once (100 by default) on the test control plane.

Two phases in one run, against the same control plane:

floor     one Python process creates what the operator would, and nothing more: it applies
          each run's render output by server-side apply (the same manifests, the same field
          manager), renders and applies each inline RolloutPool's children, watches the
          inference Deployments and applies each trainer Service and Job as soon as that run's
          inference is available. No status writes, no cache, no retries. It applies each
          run's children in the operator's two waves (config, RBAC and Services, then the
          workloads), up to --apply-concurrency at once, as the operator does.
operator  `python -m crl_operator` (a subprocess, watching its own namespace) does the same
          from the N TrainingRuns applied at once.

"Ready" for both: every run's children exist and its inference Deployment is available, so
its trainer Job has been created (for the operator: status InferenceReady=True and
status.children.trainerJob set).

Printed: wall time to all-ready, requests the writer sent (by verb and resource, from the
writer's own counter: the floor's client and the operator's crl_operator_api_requests_total),
requests the API server served in each phase (apiserver_request_total before/after, by verb and
resource: everyone's, kube-controller-manager and kwok included, which is why it is shown
apart), requests per child, and the operator's memory (RSS, peak RSS).

Run: .venv/bin/python perf/operator_scale.py [--runs 100] [--workers 8] [--apply-concurrency 4]
     [--profile REPORT]

``--profile REPORT`` runs the operator under perf/sampling_profiler.py (every thread sampled every
5 ms) and writes where its time went to REPORT. The machine's load average is printed before and
after, since the seconds are only comparable on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crl_operator.apply import Kube, load_api_client  # noqa: E402
from crl_operator.builders import RenderState, render  # noqa: E402
from crl_operator.children import deployment_state  # noqa: E402
from crl_operator.writes import WORKLOAD_KINDS  # noqa: E402
from crl_worker.api import RolloutPool, TrainingRun  # noqa: E402
from tests.fixtures.operator_process import OperatorProcess, metric_sum, parse_metrics  # noqa: E402

RUN_TEMPLATE = """
apiVersion: coderepair.io/v1alpha1
kind: TrainingRun
metadata:
  name: {name}
  namespace: {namespace}
spec:
  model: {{name: Qwen/Qwen3-8B}}
  tasks:
    format: swe-gym
    huggingFace: {{name: SWE-Gym/SWE-Gym, split: train}}
  rollout:
    pool: {{replicas: 2, maxSandboxes: 4}}
  inference: {{replicas: 1, gpus: 1}}
  # The trainer pods stay Pending (no node matches), so no Job finishes and nothing is
  # cleaned up while the benchmark measures: kwok would complete Job pods at once.
  trainer:
    nodes: 1
    gpusPerNode: 1
    placement: {{nodeSelector: {{crl-bench/never: "true"}}}}
"""

NODE_CAPACITY = {"cpu": "512", "memory": "4Ti", "pods": "250", "nvidia.com/gpu": "64"}

Counts = Counter[tuple[str, str]]


def run_manifest(i: int, namespace: str) -> dict[str, Any]:
    """The i-th TrainingRun of the benchmark."""
    doc: dict[str, Any] = yaml.safe_load(
        RUN_TEMPLATE.format(name=f"run-{i:03d}", namespace=namespace)
    )
    return doc


def apiserver_counts(kube: Kube) -> Counts:
    """apiserver_request_total summed by (verb, resource)."""
    text = kube.raw("/metrics")
    out: Counts = Counter()
    for (name, labels), value in parse_metrics(text).items():
        if name != "apiserver_request_total":
            continue
        d = dict(labels)
        resource = d.get("resource", "?") + (f"/{d['subresource']}" if d.get("subresource") else "")
        out[(d.get("verb", "?"), resource)] += int(value)
    return out


def add_nodes(kube: Kube, n: int) -> None:
    """Fake nodes (kwok) big enough for every pod of both phases."""
    for i in range(n):
        name = f"bench-node-{i}"
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
            },
            "status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY},
        }
        kube.request("POST", "Node", "/api/v1/nodes", body=node)


def apply_runs(kube: Kube, namespace: str, n: int, workers: int) -> list[dict[str, Any]]:
    """Apply the n TrainingRuns (the same way in both phases); returns the live objects."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda i: kube.apply(run_manifest(i, namespace)), range(n)))


# --- floor --------------------------------------------------------------------------------------


def floor(
    kube: Kube, namespace: str, n: int, workers: int, concurrency: int, timeout: float
) -> float:
    """Create every child directly; returns seconds until all trainer Jobs exist."""
    t0 = time.perf_counter()
    runs = apply_runs(kube, namespace, n, workers)
    models = [TrainingRun.model_validate(r) for r in runs]
    appliers = ThreadPoolExecutor(workers * concurrency) if concurrency > 1 else None

    def apply_all(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Apply in the operator's two waves; returns the live objects in `children`'s order."""
        live: dict[int, dict[str, Any]] = {}
        for workloads in (False, True):
            wave = [
                (i, c) for i, c in enumerate(children) if (c["kind"] in WORKLOAD_KINDS) == workloads
            ]
            if appliers is None or len(wave) < 2:
                live.update((i, kube.apply(c)) for i, c in wave)
            else:
                done = appliers.map(lambda ic: (ic[0], kube.apply(ic[1])), wave)
                live.update(done)
        return [live[i] for i in range(len(children))]

    def first_wave(run: TrainingRun) -> None:
        children = render(run, namespace, RenderState(inference_ready=False))
        for child, live in zip(children, apply_all(children), strict=True):
            if child["kind"] == "RolloutPool":
                pool = RolloutPool.model_validate(live)
                apply_all(render(pool, namespace, RenderState(inference_ready=True)))

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(first_wave, models))

    by_deployment: dict[str, TrainingRun] = {}
    for run in models:
        for child in render(run, namespace, RenderState(inference_ready=False)):
            if child["kind"] == "Deployment":
                by_deployment[child["metadata"]["name"]] = run
    pending = dict(by_deployment)  # only this thread reads and changes it

    def second_wave(run: TrainingRun) -> None:
        before = {(c["kind"], c["metadata"]["name"]) for c in render(run, namespace, RenderState())}
        apply_all(
            [
                child
                for child in render(run, namespace, RenderState(inference_ready=True))
                if (child["kind"], child["metadata"]["name"]) not in before
            ]
        )

    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(workers) as pool:
        futures = []
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"floor: {len(pending)} inference Deployments never became available"
                )
            for dep in kube.list("Deployment", namespace=namespace):
                name = dep["metadata"]["name"]
                waiting = pending.get(name)
                if waiting is not None and deployment_state(dep).ready:
                    del pending[name]
                    futures.append(pool.submit(second_wave, waiting))
            if pending:
                time.sleep(0.5)
        for f in futures:
            f.result()
    if appliers is not None:
        appliers.shutdown()
    return time.perf_counter() - t0


# --- operator -----------------------------------------------------------------------------------


def all_ready(kube: Kube, namespace: str, n: int) -> int:
    """How many runs have inference available and their trainer Job created."""
    ready = 0
    for run in kube.list("TrainingRun", namespace=namespace):
        st = run.get("status") or {}
        inference = any(
            c.get("type") == "InferenceReady" and c.get("status") == "True"
            for c in st.get("conditions") or ()
        )
        if inference and (st.get("children") or {}).get("trainerJob"):
            ready += 1
    return ready


def with_operator(
    kube: Kube,
    kubeconfig: str,
    namespace: str,
    n: int,
    workers: int,
    concurrency: int,
    timeout: float,
    log: Path,
    profile: Path | None = None,
) -> tuple[float, Counts, tuple[int, int], int, int]:
    """Apply the runs with the operator running (under the sampling profiler if `profile`).

    Returns (seconds, its requests, (RSS, peak RSS), the bench's polls, reconciles).
    """
    python_args = ["-m", "crl_operator"]
    if profile is not None:
        sampler = str(Path(__file__).resolve().parent / "sampling_profiler.py")
        python_args = [sampler, str(profile.resolve()), *python_args]
    op = OperatorProcess(
        kubeconfig,
        namespaces=[namespace],
        log_path=log,
        extra_args=["--workers", str(workers), "--apply-concurrency", str(concurrency)],
        resync_seconds=300,
        python_args=python_args,
    )
    op.start()
    try:
        time.sleep(2)  # the watches are up once /healthz answers; let the initial lists finish
        before = op.metrics()
        t0 = time.perf_counter()
        apply_runs(kube, namespace, n, workers)
        polls = 0
        deadline = time.monotonic() + timeout
        while True:
            polls += 1
            done = all_ready(kube, namespace, n)
            if done == n:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"operator: only {done}/{n} runs ready after {timeout}s\n{op.log_tail()}"
                )
            time.sleep(0.5)
        seconds = time.perf_counter() - t0
        time.sleep(3)  # let the last status patches land before reading the counters
        after = op.metrics()
        requests: Counts = Counter()
        for (name, labels), value in after.items():
            if name == "crl_operator_api_requests_total":
                d = dict(labels)
                delta = value - before.get((name, labels), 0.0)
                requests[(d["verb"], d["kind"])] += int(delta)
        rss = op.rss_bytes()
        reconciles = metric_sum(after, "crl_operator_reconciles_total") - metric_sum(
            before, "crl_operator_reconciles_total"
        )
        return seconds, requests, rss, polls, int(reconciles)
    finally:
        op.stop()


# --- report -------------------------------------------------------------------------------------


def children_count(namespace: str, n: int) -> int:
    """Children (and grandchildren) the render output has for n runs, inference ready."""
    total = 0
    for i in range(n):
        run = TrainingRun.model_validate(
            {
                **run_manifest(i, namespace),
                "metadata": {"name": f"run-{i:03d}", "namespace": namespace, "uid": "x"},
            }
        )
        for child in render(run, namespace, RenderState(inference_ready=True)):
            total += 1
            if child["kind"] == "RolloutPool":
                total += len(render(RolloutPool.model_validate(child), namespace))
    return total


def table(title: str, rows: dict[str, Counts]) -> None:
    """Print requests by (verb, resource) for several columns."""
    keys = sorted({k for c in rows.values() for k in c if any(c2.get(k) for c2 in rows.values())})
    print(f"\n{title}")
    head = f"{'verb':8} {'resource':24}" + "".join(f"{name:>14}" for name in rows)
    print(head)
    print("-" * len(head))
    for verb, res in keys:
        print(
            f"{verb:8} {res:24}" + "".join(f"{rows[name].get((verb, res), 0):>14}" for name in rows)
        )
    print(f"{'total':33}" + "".join(f"{sum(c.values()):>14}" for c in rows.values()))


def main(argv: list[str] | None = None) -> int:
    """Run both phases and print the comparison."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument(
        "--apply-concurrency",
        type=int,
        default=4,
        help="children applied at once per run, by both the floor and the operator (default 4)",
    )
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--profile", type=Path, help="write the operator's sampling profile here")
    a = p.parse_args(argv)
    load_before = os.getloadavg()

    from tests.fixtures.cluster import Cluster

    workdir = Path(tempfile.mkdtemp(prefix="crl-bench-"))
    with Cluster(workdir, nodes=0) as cluster:
        kubeconfig = str(cluster.kubeconfig)
        kube = Kube(load_api_client(kubeconfig, pool_size=a.workers * 2))
        # Both phases keep their pods: one GPU per inference pod, three pods per run.
        gpus, pods = int(NODE_CAPACITY["nvidia.com/gpu"]), int(NODE_CAPACITY["pods"])
        add_nodes(kube, max(-(-2 * a.runs // gpus), -(-6 * a.runs // pods)) + 1)
        ns_floor = cluster.namespace("bench-floor")
        ns_operator = cluster.namespace("bench-operator")

        api0 = apiserver_counts(kube)
        floor_kube = Kube(
            load_api_client(kubeconfig, pool_size=a.workers * (1 + a.apply_concurrency))
        )
        floor_s = floor(floor_kube, ns_floor, a.runs, a.workers, a.apply_concurrency, a.timeout)
        api1 = apiserver_counts(kube)
        op_s, op_requests, (rss, peak), polls, reconciles = with_operator(
            kube,
            kubeconfig,
            ns_operator,
            a.runs,
            a.workers,
            a.apply_concurrency,
            a.timeout,
            workdir / "operator.log",
            a.profile,
        )
        api2 = apiserver_counts(kube)

    children = children_count("bench", a.runs)
    floor_requests = Counter(floor_kube.counts())
    apiserver_floor = api1 - api0
    apiserver_op = api2 - api1
    table(
        "requests sent by the writer (floor client vs operator) and served by the API server (all clients)",
        {
            "floor": floor_requests,
            "operator": op_requests,
            "api:floor": apiserver_floor,
            "api:operator": apiserver_op,
        },
    )

    def writes(counts: Counts, status: bool) -> int:
        return sum(
            v
            for (verb, kind), v in counts.items()
            if verb != "GET" and kind.endswith("/status") == status and kind != "TrainingRun"
        )

    applies = (writes(floor_requests, False), writes(op_requests, False))
    statuses = (writes(floor_requests, True), writes(op_requests, True))
    api = (sum(apiserver_floor.values()), sum(apiserver_op.values()))
    print(
        f"\nruns: {a.runs}   children (pool children included): {children}"
        f"   workers: {a.workers}   apply concurrency: {a.apply_concurrency}"
    )
    print(f"{'':44}{'floor':>10}{'operator':>10}{'ratio':>8}")
    print(
        f"{'seconds until all runs are ready':44}{floor_s:>10.1f}{op_s:>10.1f}{op_s / floor_s:>8.2f}"
    )
    print(
        f"{'child applies (server-side apply)':44}{applies[0]:>10}{applies[1]:>10}{applies[1] / max(1, applies[0]):>8.2f}"
    )
    print(f"{'status writes':44}{statuses[0]:>10}{statuses[1]:>10}")
    per = [(x + y) / children for x, y in zip(applies, statuses, strict=True)]
    print(
        f"{'writes per child (applies + status)':44}{per[0]:>10.2f}{per[1]:>10.2f}{per[1] / per[0]:>8.2f}"
    )
    print(
        f"{'API server requests, all clients':44}{api[0]:>10}{api[1]:>10}{api[1] / max(1, api[0]):>8.2f}"
    )
    print(
        f"operator: {reconciles} reconciles, RSS {rss / 2**20:.0f} MiB (peak {peak / 2**20:.0f} MiB)"
    )
    print(f"the benchmark's own status polls in the operator phase: {polls} LISTs of trainingruns")
    load_after = os.getloadavg()
    print(
        "load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f}".format(
            *load_before, *load_after
        )
    )
    if a.profile is not None:
        print(f"operator profile: {a.profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
