"""Offline validation: every example passes, every wrong manifest fails with its message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crl_worker.api.validation import (
    FOREIGN_NOTE,
    ManifestError,
    load_resources,
    validate_file,
    validate_text,
)

from .paths import EDGE, EXAMPLES, INVALID, verdict


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


# --- other APIs' objects: skipped with skip_foreign, errors without -----------------------

NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n"

#: Documents and what `skip_foreign` (plain `crl validate`) makes of them: "skipped", "valid", or
#: the text of the error. Only what is clearly another API's object is skipped.
KIND_CASES = {
    "namespace": (NAMESPACE, "skipped"),
    "kueue-local-queue": (
        NAMESPACE.replace("v1", "kueue.x-k8s.io/v1beta2").replace("Namespace", "LocalQueue"),
        "skipped",
    ),
    # Another project's kind with one of our names, under its own group.
    "other-projects-benchmark": (
        RUN.replace("coderepair.io", "ripsaw.cloudbulldozer.io").replace(
            "TrainingRun", "Benchmark"
        ),
        "skipped",
    ),
    "list-of-other-objects": (
        "apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: Namespace}]\n",
        "skipped",
    ),
    "ours": (RUN, "valid"),
    "typo-of-our-kind": (
        RUN.replace("kind: TrainingRun", "kind: TrainingRn"),
        "'TrainingRn' (coderepair.io/v1alpha1) is not a CodeRepairRL resource; "
        "did you mean 'TrainingRun'?",
    ),
    "other-kind-in-our-group": (
        RUN.replace("kind: TrainingRun", "kind: Pod"),
        "'Pod' (coderepair.io/v1alpha1) is not a CodeRepairRL resource",
    ),
    "typo-of-our-group": (
        RUN.replace("coderepair.io", "coderepairrl.io"),
        "TrainingRun is served as 'coderepair.io/v1alpha1' (got 'coderepairrl.io/v1alpha1')",
    ),
    "typos-of-our-group-and-kind": (
        RUN.replace("coderepair.io", "code-repair.io").replace("TrainingRun", "RolloutPol"),
        "did you mean 'RolloutPool'?",
    ),
    "our-kind-without-a-group": (
        RUN.replace("coderepair.io/v1alpha1", "v1"),
        "TrainingRun is served as 'coderepair.io/v1alpha1' (got 'v1')",
    ),
    "our-group-old-version": (
        RUN.replace("coderepair.io/v1alpha1", "coderepair.io/v1"),
        "TrainingRun is served as 'coderepair.io/v1alpha1' (got 'coderepair.io/v1')",
    ),
    "list-holding-ours": (
        "apiVersion: v1\nkind: List\nitems: [{apiVersion: coderepair.io/v1alpha1, kind: Benchmark}]\n",
        "its items are checked only as separate documents",
    ),
    "no-api-version": (
        "kind: Namespace\nmetadata: {name: a}\n",
        "'Namespace' is not a CodeRepairRL resource",
    ),
    "empty-api-version": ("apiVersion: ''\nkind: Namespace\n", "is not a CodeRepairRL resource"),
    "api-version-a-number": ("apiVersion: 1\nkind: Namespace\n", "is not a CodeRepairRL resource"),
    "kind-a-map": (
        "apiVersion: v1\nkind: {a: 1}\n",
        "{'a': 1} (v1) is not a CodeRepairRL resource",
    ),
    "kind-empty": ("apiVersion: v1\nkind: ''\n", "'' (v1) is not a CodeRepairRL resource"),
    "no-kind": ("apiVersion: v1\nmetadata: {name: a}\n", "kind: required field is missing"),
    "not-a-mapping": ("- apiVersion: v1\n  kind: Namespace\n", "a manifest must be a mapping"),
}


@pytest.mark.parametrize("name", list(KIND_CASES))
def test_what_is_skipped_and_what_is_checked(name: str) -> None:
    text, expected = KIND_CASES[name]
    # Empty documents around it are ignored, as before.
    [result] = validate_text("---\n" + text + "---\n", skip_foreign=True)
    if expected == "skipped":
        assert result.skipped == FOREIGN_NOTE and result.ok and result.resource is None
        # Without skip_foreign (the library's default, and --strict-kinds) it is an error.
        [strict] = validate_text(text)
        assert strict.skipped is None and not strict.ok
    elif expected == "valid":
        assert result.skipped is None and result.ok and result.resource is not None
    else:
        assert result.skipped is None
        assert any(expected in str(p) for p in result.problems), [str(p) for p in result.problems]
