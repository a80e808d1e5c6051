"""Pure builders: deterministic names, standard labels, owner references."""

from __future__ import annotations

import pytest
import yaml

from crl_operator.builders import NAME_LIMIT, BuildError, child_name, render
from crl_worker.api import Benchmark, TrainingRun

RUN = {
    "apiVersion": "coderepair.io/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "r", "namespace": "ns", "uid": "1234"},
    "spec": {"model": {"name": "m"}, "tasks": {"path": "t.jsonl"}},
}


def test_child_names_are_short_and_deterministic() -> None:
    assert child_name("run", "config") == "run-config"
    long = "a" * 60
    first, second = child_name(long, "config"), child_name(long, "config")
    assert first == second
    assert len(first) <= NAME_LIMIT
    assert first.endswith("-config")
    assert child_name(long + "b", "config") != first


def test_children_are_owned_and_labelled() -> None:
    run = TrainingRun.model_validate(RUN)
    children = render(run)
    assert [c["kind"] for c in children] == ["ConfigMap", "RolloutPool"]
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["ownerReferences"][0]["uid"] == "1234"
        assert meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "coderepairrl-operator"
        assert meta["labels"]["coderepair.io/trainingrun"] == "r"
    config = yaml.safe_load(children[0]["data"]["config.yaml"])
    assert config["spec"]["algorithm"]["numGenerations"] == 8


def test_a_benchmark_owns_its_inline_pool() -> None:
    bench = Benchmark.model_validate(
        {
            "apiVersion": "coderepair.io/v1alpha1",
            "kind": "Benchmark",
            "metadata": {"name": "b"},
            "spec": {
                "suite": {"name": "s", "tasks": {"path": "t.jsonl"}},
                "model": {"endpoint": {"url": "http://x/v1", "modelName": "m"}},
                "pool": {"replicas": 3},
            },
        }
    )
    [_, pool] = render(bench)
    assert pool["kind"] == "RolloutPool"
    assert pool["spec"]["replicas"] == 3
    assert pool["spec"]["tasks"] == {"format": "swe-bench", "path": "t.jsonl"}
    assert pool["metadata"]["namespace"] == "default"
    assert "ownerReferences" not in pool["metadata"]  # no uid offline


def test_a_pool_reference_means_no_owned_pool() -> None:
    spec = {**RUN["spec"], "rollout": {"poolRef": {"name": "shared"}}}
    run = TrainingRun.model_validate({**RUN, "spec": spec})
    assert [c["kind"] for c in render(run)] == ["ConfigMap"]


def test_a_resource_without_a_name_cannot_be_built() -> None:
    run = TrainingRun.model_validate({**RUN, "metadata": {"generateName": "r-"}})
    with pytest.raises(BuildError, match="generateName"):
        render(run)
