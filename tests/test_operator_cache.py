"""The operator cache's reference index: which TrainingRuns and Benchmarks name a RolloutPool or a
TrainingRun, kept right as objects are added, updated (references changed) and deleted."""

from __future__ import annotations

import copy
from typing import Any

from crl_operator.cache import Cache, references


def _run(name: str, pool: str | None, ns: str = "ns", rv: str = "1") -> dict[str, Any]:
    rollout: dict[str, Any] = {"poolRef": {"name": pool}} if pool else {"pool": {"replicas": 1}}
    return {
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": {"rollout": rollout},
    }


def _bench(
    name: str, pool: str | None, run: str | None, ns: str = "ns", rv: str = "1"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"checkpoint": {"trainingRun": run}} if run else {}}
    if pool:
        spec["poolRef"] = {"name": pool}
    return {
        "kind": "Benchmark",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": spec,
    }


def test_references_reads_the_reference_fields_of_runs_and_benchmarks() -> None:
    assert references(("TrainingRun", "ns", "a"), _run("a", "p")) == {("RolloutPool", "ns", "p")}
    assert references(("TrainingRun", "ns", "a"), _run("a", None)) == set()
    assert references(("Benchmark", "ns", "b"), _bench("b", "p", "a")) == {
        ("RolloutPool", "ns", "p"),
        ("TrainingRun", "ns", "a"),
    }
    # Other kinds reference nothing, whatever their spec holds.
    assert references(("Job", "ns", "j"), {"spec": {"poolRef": {"name": "p"}}}) == set()


def test_reference_index_after_add_update_and_delete() -> None:
    cache = Cache()
    cache.upsert(_run("a", "p"))
    cache.upsert(_run("b", "p"))
    cache.upsert(_run("c", "q"))
    cache.upsert(_run("d", None))
    cache.upsert(_run("e", "p", ns="other"))  # same pool name, another namespace
    cache.upsert(_bench("x", "p", "a"))
    cache.upsert(_bench("y", None, "a"))
    assert cache.referencing("RolloutPool", "ns", "p") == [
        ("Benchmark", "ns", "x"),
        ("TrainingRun", "ns", "a"),
        ("TrainingRun", "ns", "b"),
    ]
    assert cache.referencing("RolloutPool", "ns", "q") == [("TrainingRun", "ns", "c")]
    assert cache.referencing("RolloutPool", "other", "p") == [("TrainingRun", "other", "e")]
    assert cache.referencing("TrainingRun", "ns", "a") == [
        ("Benchmark", "ns", "x"),
        ("Benchmark", "ns", "y"),
    ]
    assert cache.referencing("RolloutPool", "ns", "none") == []

    # An update that moves b to pool q and x to run b: the old entries go, the new ones come.
    cache.upsert(_run("b", "q", rv="2"))
    cache.upsert(_bench("x", "p", "b", rv="2"))
    assert cache.referencing("RolloutPool", "ns", "p") == [
        ("Benchmark", "ns", "x"),
        ("TrainingRun", "ns", "a"),
    ]
    assert cache.referencing("RolloutPool", "ns", "q") == [
        ("TrainingRun", "ns", "b"),
        ("TrainingRun", "ns", "c"),
    ]
    assert cache.referencing("TrainingRun", "ns", "a") == [("Benchmark", "ns", "y")]
    assert cache.referencing("TrainingRun", "ns", "b") == [("Benchmark", "ns", "x")]

    # A stale event (older resourceVersion) does not bring the old reference back.
    cache.upsert(_run("b", "p", rv="1"))
    assert ("TrainingRun", "ns", "b") not in cache.referencing("RolloutPool", "ns", "p")

    # An update that drops the reference entirely.
    cache.upsert(_run("a", None, rv="2"))
    assert cache.referencing("RolloutPool", "ns", "p") == [("Benchmark", "ns", "x")]

    # Deletes: the referrer leaves every entry it was in; an empty entry leaves no set behind.
    cache.remove(_bench("x", "p", "b", rv="2"))
    assert cache.referencing("RolloutPool", "ns", "p") == []
    assert cache.referencing("TrainingRun", "ns", "b") == []
    assert ("RolloutPool", "ns", "p") not in cache._by_ref
    cache.remove(_run("c", "q"))
    assert cache.referencing("RolloutPool", "ns", "q") == [("TrainingRun", "ns", "b")]
    # A DELETED event for an older incarnation (another uid) leaves the index alone.
    gone = copy.deepcopy(_run("b", "q"))
    gone["metadata"]["uid"] = "older"
    cache.remove(gone)
    assert cache.referencing("RolloutPool", "ns", "q") == [("TrainingRun", "ns", "b")]
    # Deleting the referenced object does not drop its referrers (they still name it).
    cache.upsert(_bench("z", None, "b"))
    cache.remove(_run("b", "q", rv="2"))
    assert cache.referencing("TrainingRun", "ns", "b") == [("Benchmark", "ns", "z")]
