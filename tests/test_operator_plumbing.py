"""What the operator does around the status: merge patches, apply decisions, the cache, the work\nqueue and the process's plumbing."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from typing import Any

import pytest
import yaml

from crl_operator.apply import contains, kind_info, to_prune
from crl_operator.builders import RenderState, render
from crl_operator.cache import Cache
from crl_operator.patches import merge_diff, status_patch
from crl_operator.settings import parse_args
from crl_operator.status import (
    Observed,
    rolloutpool_status,
)
from crl_operator.workqueue import WorkQueue
from crl_worker.api import Benchmark, RolloutPool, TrainingRun
from crl_worker.logs import JsonFormatter

from .fixtures.paths import ROOT
from .fixtures.status_objects import T0, T1, children, pod, pool_model, run_model

# --- status patches ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"a": 1}, {"a": 1}, None),
        (1, 2, 2),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({"a": {"x": 1}}, {"a": {"x": 1, "y": 2}}, {"a": {"y": 2}}),
        (None, {"a": 1}, {"a": 1}),
        ([1, 2], [1, 2, 3], [1, 2, 3]),
    ],
)
def test_merge_diff(old: Any, new: Any, patch: Any) -> None:
    diff = merge_diff({"k": old} if old is not None else {}, {"k": new})
    if patch is None:
        assert diff.__class__.__name__ == "_Same"
    else:
        assert diff == {"k": patch}


def test_status_patch_keeps_other_writers_fields() -> None:
    pool = pool_model(2)
    current = {"ready": 0, "hitRatio": 0.9, "acquireLatencySeconds": {"p50": 0.1}}
    computed = rolloutpool_status(pool, Observed(), current, T0)
    patch = status_patch("RolloutPool", current, computed)
    assert "hitRatio" not in patch and "acquireLatencySeconds" not in patch
    assert patch["desired"] == 2
    # The same status again is an empty patch: no request.
    applied = {**current, **computed}
    assert (
        status_patch("RolloutPool", applied, rolloutpool_status(pool, Observed(), applied, T1))
        == {}
    )


def test_status_patch_removes_owned_fields_no_longer_computed() -> None:
    # lastEvaluation is not the reconcile's: left alone.
    current = {"children": {"trainerJob": "x", "configMap": "y"}, "lastEvaluation": {"step": 10}}
    patch = status_patch("TrainingRun", current, {"children": {"configMap": "y"}})
    assert patch == {"children": {"trainerJob": None}}


# --- apply decisions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("live", "desired", "same"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, True),  # the server added a default
        ({"a": 1}, {"a": 2}, False),  # someone edited our field
        ({}, {"a": 1}, False),  # someone removed it
        ({"env": [{"name": "X"}]}, {"env": [{"name": "X", "value": ""}]}, True),  # dropped empty
        ({"l": [{"a": 1, "d": 0}]}, {"l": [{"a": 1}]}, True),
        ({"l": [{"a": 1}, {"a": 2}]}, {"l": [{"a": 1}]}, False),
        ({"cpu": "4"}, {"cpu": 4}, True),  # quantities come back as strings
        ({"x": "true"}, {"x": True}, False),
        ({"replicas": 0}, {"replicas": 0}, True),
    ],
)
def test_contains(live: Any, desired: Any, same: bool) -> None:
    assert contains(live, desired) is same


def test_a_rendered_child_matches_itself_with_server_defaults() -> None:
    run = run_model()
    for child in children(run, inference_ready=True):
        live = copy.deepcopy(child)
        live["metadata"].update({"uid": "u", "resourceVersion": "5", "creationTimestamp": "t"})
        live["status"] = {"whatever": 1}
        assert contains(live, child), child["kind"]


def test_prune_takes_only_our_unwanted_children() -> None:
    def obj(kind: str, name: str, owner: str | None, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": "ns"}
        if owner:
            meta["ownerReferences"] = [{"uid": owner, "controller": True}]
        if deleting:
            meta["deletionTimestamp"] = "t"
        return {"kind": kind, "metadata": meta}

    live = [
        obj("Job", "keep", "u"),
        obj("Job", "stale", "u"),
        obj("Job", "other-owner", "v"),
        obj("Job", "going", "u", deleting=True),
    ]
    pruned = to_prune(live, "u", {("Job", "ns", "keep")})
    assert [p["metadata"]["name"] for p in pruned] == ["stale"]


def test_every_rendered_kind_has_a_rest_path() -> None:
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(example.read_text())
        model = {"TrainingRun": TrainingRun, "RolloutPool": RolloutPool, "Benchmark": Benchmark}[
            doc["kind"]
        ]
        resource = model.model_validate(doc)
        for child in render(resource, "ns", RenderState(inference_ready=True)):
            info = kind_info(child["kind"])
            assert info.path("ns", "x").endswith(f"/{info.plural}/x")


# --- cache --------------------------------------------------------------------------------------


def test_cache_indexes_by_owner_and_pool_and_ignores_stale_events() -> None:
    cache = Cache()
    job = {
        "kind": "Job",
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "uid": "j1",
            "resourceVersion": "10",
            "ownerReferences": [{"uid": "owner", "controller": True}],
            "managedFields": [{"manager": "x"}],
        },
    }
    cache.upsert(job)
    assert [o["metadata"]["name"] for o in cache.owned("owner")] == ["j"]
    assert "managedFields" not in cache.get("Job", "ns", "j")["metadata"]
    stale = copy.deepcopy(job)
    stale["metadata"]["resourceVersion"] = "9"
    stale["spec"] = {"old": True}
    cache.upsert(stale)
    assert "spec" not in cache.get("Job", "ns", "j")
    # A DELETED event for an older incarnation does not remove the new one.
    cache.remove({"kind": "Job", "metadata": {"name": "j", "namespace": "ns", "uid": "older"}})
    assert cache.get("Job", "ns", "j") is not None
    cache.remove(job)
    assert cache.owned("owner") == [] and cache.get("Job", "ns", "j") is None
    p = pod()
    p["metadata"]["ownerReferences"] = [{"uid": "pool-uid", "controller": True}]
    cache.upsert(p)
    assert cache.pool_pods("ns", "p") == [cache.get("Pod", "ns", "x")]
    # Sandbox pods are owned by their pool but are never the pool's children to prune.
    assert cache.owned("pool-uid") == []


# --- work queue ---------------------------------------------------------------------------------


async def test_queue_deduplicates_and_reruns_keys_marked_while_active() -> None:
    q = WorkQueue()
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    key = await q.get()
    assert key == "a"
    q.add("a")  # an event while "a" is being reconciled
    assert len(q) == 1  # not queued twice, not run concurrently
    q.done("a")
    assert len(q) == 2
    assert await q.get() == "b"
    assert await q.get() == "a"


async def test_queue_delayed_add_and_backoff() -> None:
    q = WorkQueue()
    q.add_after("k", 0.05)
    q.add_after("k", 10)  # a later timer does not replace an earlier one
    assert len(q) == 0
    assert await asyncio.wait_for(q.get(), 2) == "k"
    q.done("k")
    first = q.backoff("k", base=0.01)
    second = q.backoff("k", base=0.01)
    assert second > first
    q.forget("k")
    q.cancel_timers()


# --- process plumbing ---------------------------------------------------------------------------


def test_json_log_lines() -> None:
    record = logging.LogRecord(
        "crl_operator.x", logging.WARNING, __file__, 1, "bad %s", ("spec",), None
    )
    record.resource = "ns/name"
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "bad spec"
    assert line["level"] == "warning"
    assert line["resource"] == "ns/name"


def test_flags() -> None:
    s = parse_args(
        ["--namespace", "a", "--namespace", "b", "--metrics-port", "9000", "--log-format", "text"]
    )
    assert s.namespaces == ("a", "b") and not s.all_namespaces
    assert (s.metrics_port, s.health_port, s.log_format, s.standalone) == (9000, 8081, "text", True)
    s = parse_args(["--peering", "crl"])
    assert not s.standalone and s.peering_name == "crl" and s.all_namespaces
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "a", "--all-namespaces"])
