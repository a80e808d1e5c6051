"""A reconcile applies its children in two waves against the real API server: what the workloads
refer to (ConfigMaps, RBAC, Services) first, then the workloads, each wave's children at once."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import yaml

from crl_operator.apply import Kube, load_api_client
from crl_operator.builders import RenderState, render
from crl_operator.cache import Cache
from crl_operator.reconcile import Reconciler
from crl_operator.writes import WORKLOAD_KINDS
from crl_worker.api import TrainingRun

from .fixtures.cluster import Cluster
from .fixtures.paths import EXAMPLES


class RecordingKube(Kube):
    """A real client that records each apply's start and end, in order, and can hold the first
    `meet` applies at a barrier: they pass only if that many are in flight together."""

    def __init__(self, kubeconfig: str, meet: int) -> None:
        super().__init__(load_api_client(kubeconfig, pool_size=16))
        self.events: list[tuple[str, str]] = []  # ("start" | "end", kind)
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(meet) if meet > 1 else None
        self._held = 0
        self._meet = meet

    def apply(self, obj: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        """Record, maybe wait at the barrier, then apply for real."""
        with self._lock:
            self.events.append(("start", str(obj["kind"])))
            wait = self._barrier is not None and self._held < self._meet
            self._held += 1
        if wait and self._barrier is not None:
            self._barrier.wait(timeout=10)  # sequential applies never get here together
        try:
            return super().apply(obj, force=force)
        finally:
            with self._lock:
                self.events.append(("end", str(obj["kind"])))


def _training_run(namespace: str) -> dict[str, Any]:
    path = next(p for p in EXAMPLES if p.name == "trainingrun-qwen3-8b-swe-gym.yaml")
    body = yaml.safe_load(path.read_text())
    body["metadata"]["namespace"] = namespace
    return dict(body)


def _reconcile_once(cluster: Cluster, namespace: str, kube: RecordingKube, threads: int) -> None:
    live = Kube(load_api_client(str(cluster.kubeconfig))).apply(_training_run(namespace))
    cache = Cache()
    cache.upsert(live)
    outcome = Reconciler(kube, cache, apply_threads=threads).reconcile(
        ("TrainingRun", namespace, live["metadata"]["name"])
    )
    assert outcome.result == "ok", outcome


def test_config_goes_before_the_workloads_and_a_wave_goes_at_once(
    cluster: Cluster, namespace: str
) -> None:
    run = TrainingRun.model_validate(_training_run(namespace))
    children = render(run, namespace, RenderState(inference_ready=False))
    first = [c for c in children if c["kind"] not in WORKLOAD_KINDS]
    assert len(first) >= 2 and any(c["kind"] in WORKLOAD_KINDS for c in children)

    kube = RecordingKube(str(cluster.kubeconfig), meet=2)
    _reconcile_once(cluster, namespace, kube, threads=4)

    applies = [kind for event, kind in kube.events if event == "start"]
    assert sorted(applies) == sorted(c["kind"] for c in children)
    # Every config apply ended before the first workload apply started.
    first_workload = next(i for i, (e, k) in enumerate(kube.events) if k in WORKLOAD_KINDS)
    config_ends = [
        i for i, (e, k) in enumerate(kube.events) if e == "end" and k not in WORKLOAD_KINDS
    ]
    assert max(config_ends) < first_workload
    # The first two config applies met at the barrier: they were in flight together.
    assert kube.events[0][0] == kube.events[1][0] == "start"


def test_one_thread_applies_in_render_order(cluster: Cluster, namespace: str) -> None:
    run = TrainingRun.model_validate(_training_run(namespace))
    children = render(run, namespace, RenderState(inference_ready=False))

    kube = RecordingKube(str(cluster.kubeconfig), meet=1)
    _reconcile_once(cluster, namespace, kube, threads=0)

    # Without apply threads: one after another, config first, render order within a wave.
    starts, ends = kube.events[0::2], kube.events[1::2]
    assert [e for e, _ in starts] == ["start"] * len(starts)
    assert [(e, k) for e, k in ends] == [("end", k) for _, k in starts]
    kinds = [k for _, k in starts]
    expected = [c["kind"] for c in children if c["kind"] not in WORKLOAD_KINDS] + [
        c["kind"] for c in children if c["kind"] in WORKLOAD_KINDS
    ]
    assert kinds == expected
