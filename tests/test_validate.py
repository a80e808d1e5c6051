"""Offline validation: every example passes, every wrong manifest fails with its message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crl_worker.api.validation import ManifestError, load_resources, validate_file, validate_text

from .fixtures.paths import EDGE, EXAMPLES, INVALID, verdict


def _expectations(path: Path) -> dict[str, str]:
    """`# expect: ...`, `# expect-path: ...`, `# expect-line: N` headers of a wrong manifest."""
    found = {}
    for line in path.read_text().splitlines():
        m = re.match(r"# (expect(?:-path|-line)?): (.*)$", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_there_are_enough_wrong_manifests() -> None:
    assert len(INVALID) >= 15


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    results = validate_file(path)
    assert [str(p) for r in results for p in r.problems] == []
    assert all(r.resource is not None for r in results)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_wrong_manifest_fails_with_its_message(path: Path) -> None:
    expect = _expectations(path)
    assert "expect" in expect, f"{path.name} has no '# expect:' header"
    problems = [p for r in validate_file(path) for p in r.problems]
    assert problems, f"{path.name} was accepted"
    matching = [p for p in problems if expect["expect"] in p.message]
    assert matching, (
        f"{path.name}: no problem says {expect['expect']!r}: {[str(p) for p in problems]}"
    )
    if "expect-path" in expect:
        assert any(p.path == expect["expect-path"] for p in matching), [str(p) for p in matching]
    if "expect-line" in expect:
        assert any(p.line == int(expect["expect-line"]) for p in matching), [
            str(p) for p in matching
        ]
    for p in matching:
        assert p.source == str(path)


RUN = """\
apiVersion: coderepair.io/v1alpha1
kind: TrainingRun
metadata: {name: r}
spec:
  model: {name: m}
  tasks: {path: t.jsonl}
"""


def _problems(text: str) -> list[str]:
    return [f"{p.path}: {p.message}" for r in validate_text(text) for p in r.problems]


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        # Each CEL rule, once passing and once failing, evaluated by cel-python.
        ("  inference: {gpus: 8, tensorParallelSize: 4}\n", None),
        ("  inference: {gpus: 6, tensorParallelSize: 4}\n", "spec.inference.gpus"),
        ("  inference: {gpus: 3}\n", None),  # tensorParallelSize defaults to 1
        ("  algorithm: {numGenerations: 2}\n", None),
        ("  algorithm: {numGenerations: 1}\n", "spec.algorithm.numGenerations"),
        ("  algorithm: {epsilon: 0.2, epsilonHigh: 0.2}\n", None),
        ("  algorithm: {epsilon: 0.2, epsilonHigh: 0.1}\n", "spec.algorithm.epsilonHigh"),
        ("  weightSync: lora-adapter\n  algorithm: {lora: {rank: 8}}\n", None),
        ("  weightSync: lora-adapter\n", "spec.weightSync"),
        ("  rollout: {reward: {type: mix, weights: {tests: 1}}}\n", None),
        ("  rollout: {reward: {type: mix}}\n", "spec.rollout.reward.type"),
        (
            "  rollout: {reward: {weights: {tests: 0, diffSimilarity: 0}}}\n",
            "spec.rollout.reward.weights",
        ),
        ("  rollout: {pool: {replicas: 8, maxSandboxes: 8}}\n", None),
        ("  rollout: {pool: {replicas: 9, maxSandboxes: 8}}\n", "spec.rollout.pool.replicas"),
        ("  rollout: {pool: {replicas: 9}}\n", None),  # maxSandboxes defaults to 64
        ("  trainer: {deepspeed: {zeroStage: 3, offloadParameters: cpu}}\n", None),
        (
            "  trainer: {deepspeed: {zeroStage: 0, offloadOptimizer: cpu}}\n",
            "spec.trainer.deepspeed.offloadOptimizer",
        ),
        ("  curriculum: {order: patch-size}\n", None),
        ("  curriculum: {order: benchmark-results, results: bench/results}\n", None),
        ("  curriculum: {order: benchmark-results}\n", "spec.curriculum.results"),
    ],
)
def test_cel_rules(extra: str, problem: str | None) -> None:
    found = _problems(RUN + extra)
    if problem is None:
        assert found == []
    else:
        assert [f.split(":")[0] for f in found] == [problem], found


def test_defaults_take_part_in_cel() -> None:
    # inference.gpus defaults to 1: TP 2 without gpus breaks the rule, as on the server.
    assert _problems(RUN + "  inference: {tensorParallelSize: 2}\n") == [
        "spec.inference.gpus: gpus must be a multiple of tensorParallelSize (each engine uses"
        " tensorParallelSize GPUs)"
    ]


def test_null_means_absent_as_on_the_server() -> None:
    # The API server prunes nulls of non-nullable fields before defaulting.
    assert _problems(RUN + "  evaluation: null\n  algorithm: {seed: null}\n") == []
    # Inside the free-form DeepSpeed overrides nulls are kept: they are the user's data.
    results = validate_text(RUN + "  trainer: {deepspeed: {overrides: {bf16: null}}}\n")
    resource = results[0].resource
    assert resource is not None
    assert resource.spec.trainer.deepspeed.overrides == {"bf16": None}


def test_multi_document_stream_reports_each_document() -> None:
    text = RUN + "---\n" + RUN.replace("name: r}", "name: s}").replace("{name: m}", "{}") + "---\n"
    results = validate_text(text)
    # The empty document after the last `---` is skipped, as kubectl skips it.
    assert [r.ok for r in results] == [True, False]
    assert results[1].problems[0].path == "spec.model.name"
    assert results[1].problems[0].line == 12  # `model: {}` in the second document


def test_several_problems_are_all_reported() -> None:
    text = RUN + "  algorithm: {numGeneration: 8, steps: -1}\n  suspend: maybe\n"
    paths = sorted(p.split(":")[0] for p in _problems(text))
    assert paths == ["spec.algorithm.numGeneration", "spec.algorithm.steps", "spec.suspend"]


def test_load_resources_raises_with_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(RUN + "  algorithm: {numGenerations: 1}\n")
    with pytest.raises(ManifestError) as info:
        load_resources(path)
    assert "numGenerations" in str(info.value)
    good = tmp_path / "good.yaml"
    good.write_text(RUN)
    [run] = load_resources(good)
    assert run.kind == "TrainingRun"


def test_unreadable_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    results = validate_file(tmp_path / "missing.yaml")
    assert "cannot read the file" in results[0].problems[0].message
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert "cannot read the file" in validate_file(binary)[0].problems[0].message


def _transition(kind: str, new: dict, old: dict) -> bool:
    """Evaluate the kind's root transition rule(s) with cel-python, as the server does on update."""
    import celpy
    from celpy.adapter import json_to_cel

    from crl_worker.api.validation import kind_schema

    env = celpy.Environment()
    results = []
    for rule in kind_schema(kind).get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            program = env.program(env.compile(rule["rule"]))
            results.append(
                bool(program.evaluate({"self": json_to_cel(new), "oldSelf": json_to_cel(old)}))
            )
    assert results, f"{kind} has no transition rule"
    return all(results)


def test_model_and_tasks_are_immutable_once_started() -> None:
    [result] = validate_text(RUN)
    assert result.resource is not None
    old = result.resource.to_wire()
    changed = {**old, "spec": {**old["spec"], "model": {**old["spec"]["model"], "name": "other"}}}
    tuned = {**old, "spec": {**old["spec"], "suspend": True}}
    started = {**old, "status": {"startTime": "2026-11-21T00:00:00Z"}}
    assert _transition("TrainingRun", changed, old)  # not started: anything may change
    assert not _transition("TrainingRun", {**changed, "status": started["status"]}, started)
    assert _transition("TrainingRun", {**tuned, "status": started["status"]}, started)


@pytest.mark.parametrize("path", EDGE, ids=lambda p: p.name)
def test_edge_cases_get_the_api_servers_verdict(path: Path) -> None:
    """Each file's verdict is what Kubernetes' own code says (test_crdcheck.py checks that)."""
    results = validate_file(path)
    got = "valid" if all(r.ok for r in results) else "invalid"
    assert got == verdict(path), [str(p) for r in results for p in r.problems]


def test_whole_floats_become_integers() -> None:
    [result] = validate_text(RUN + "  algorithm: {steps: 4.0, numGenerations: 1e1}\n")
    assert result.resource is not None
    assert result.resource.spec.algorithm.steps == 4
    assert result.resource.spec.algorithm.num_generations == 10


def test_status_is_dropped_with_a_warning() -> None:
    [result] = validate_text(RUN + "status: {step: -1}\n")
    assert result.ok
    assert result.warnings[0].path == "status"


HOSTILE = {
    "kind-is-a-list": (
        "apiVersion: coderepair.io/v1alpha1\nkind: [a]\n",
        "is not a CodeRepairRL resource",
    ),
    "kind-is-a-map": ("kind: {a: 1}\n", "is not a CodeRepairRL resource"),
    "no-api-version": (
        "kind: TrainingRun\nmetadata: {name: a}\n",
        "required field is missing; use",
    ),
    "metadata-list": (RUN.replace("metadata: {name: r}", "metadata: []"), "must be a mapping"),
    "spec-null": (RUN.split("spec:")[0] + "spec: null\n", "required field is missing"),
    "name-number": (RUN.replace("{name: r}", "{name: 123}"), "must be a valid string"),
    "binary-tag": (RUN + "  suspend: !!binary aGVsbG8=\n", "invalid YAML"),
    "set-tag": (RUN + "  suspend: !!set {a, b}\n", "invalid YAML"),
    "recursive-alias": (RUN + "  rollout: &a {agent: *a}\n", "recursive alias"),
    "nan": (RUN + "  algorithm: {learningRate: .nan}\n", "JSON cannot represent"),
    "huge-int": (RUN + "  algorithm: {seed: 99999999999999999999}\n", "64-bit"),
    "tab-indent": (RUN + "\tsuspend: true\n", "invalid YAML"),
    "unhashable-key": (RUN + "  ? [a, b]\n  : c\n", "invalid YAML"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_is_a_problem_not_a_crash(name: str) -> None:
    text, expected = HOSTILE[name]
    problems = [str(p) for r in validate_text(text) for p in r.problems]
    assert any(expected in p for p in problems), problems


def test_alias_bomb_is_refused_quickly() -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    problems = [p.message for r in validate_text("\n".join(lines) + "\n") for p in r.problems]
    assert any("expands to more than" in p for p in problems), problems
