"""Offline validation: every example passes, every wrong manifest fails with its message."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from crl_worker.api.validation import (
    FOREIGN_NOTE,
    ManifestError,
    load_resources,
    validate_file,
    validate_text,
)

from .fixtures.cli import crl
from .fixtures.paths import EDGE, EXAMPLES, INVALID, ROOT, verdict


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


#: Fields that mean nothing for `algorithm.type: sft` (more of the algorithm, or another line
#: of the spec), and where the refusal points.
SFT_REFUSED = [
    ("", "rollout: {poolRef: {name: shared-pool}}", "spec.rollout.poolRef"),
    ("", "rollout: {pool: {replicas: 2}}", "spec.rollout.pool"),
    ("", "rollout: {reward: {type: diff-similarity}}", "spec.rollout.reward"),
    ("", "rollout: {reward: {testsMode: fraction}}", "spec.rollout.reward"),
    ("", "rollout: {reward: {evaluationTimeoutSeconds: 60}}", "spec.rollout.reward"),
    ("", "generation: in-process", "spec.generation"),
    ("", "weightSync: nccl", "spec.weightSync"),
    (
        "",
        "scheduling: {queueName: q, sandboxesUseQuota: true}",
        "spec.scheduling.sandboxesUseQuota",
    ),
    (", numGenerations: 1", "", "spec.algorithm.numGenerations"),
    (", tasksPerStep: 4", "", "spec.algorithm.tasksPerStep"),
    (", lossType: grpo", "", "spec.algorithm.lossType"),
    (", epsilon: 0.3", "", "spec.algorithm.epsilon"),
    (", scaleRewards: none", "", "spec.algorithm.scaleRewards"),
]


def sft_run(algorithm: str = "", line: str = "") -> str:
    """The lines a supervised run adds to RUN: `algorithm` more of its algorithm, `line` one
    more line of the spec."""
    return f"  algorithm: {{type: sft, sft: {{dataset: {{path: d}}}}{algorithm}}}\n" + (
        f"  {line}\n" if line else ""
    )


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
        # Supervised fine-tuning: its data is needed, GRPO-only fields are refused.
        ("  algorithm: {type: sft, numGenerations: 8, sft: {dataset: {path: d}}}\n", None),
        ("  algorithm: {type: sft, sft: {dataset: {huggingFace: o/n, split: x}}}\n", None),
        ("  algorithm: {type: sft, sft: {dataset: {benchmarkResults: r}}}\n", None),
        ("  algorithm: {type: sft}\n", "spec.algorithm.sft"),
        ("  algorithm: {sft: {dataset: {path: d}}}\n", "spec.algorithm.sft"),
        (
            "  algorithm: {type: sft, sft: {dataset: {path: d, huggingFace: o/n}}}\n",
            "spec.algorithm.sft.dataset",
        ),
        ("  algorithm: {type: sft, sft: {dataset: {split: x}}}\n", "spec.algorithm.sft.dataset"),
        ("  algorithm: {type: sft, beta: 0.1, sft: {dataset: {path: d}}}\n", "spec.algorithm.beta"),
        (
            "  algorithm: {type: sft, epsilonHigh: 0.3, sft: {dataset: {path: d}}}\n",
            "spec.algorithm.epsilonHigh",
        ),
        (
            "  algorithm: {type: sft, maxStaleness: 1, sft: {dataset: {path: d}}}\n",
            "spec.algorithm.maxStaleness",
        ),
        (
            "  algorithm: {type: sft, sft: {dataset: {path: d}}}\n  curriculum: {order: patch-size}\n",
            "spec.curriculum",
        ),
        # Neither rollouts nor their sandboxes, rewards or server: each refused by name.
        *[(sft_run(algorithm, line), path) for algorithm, line, path in SFT_REFUSED],
        # Left at their defaults, written or not, they pass.
        (sft_run(", tasksPerStep: 8, epsilon: 0.2, lossType: dapo"), None),
        (sft_run(line="rollout: {agent: {maxTotalTokens: 512}, reward: {type: tests}}"), None),
        (sft_run(line="weightSync: auto"), None),
        ("  rollout: {poolRef: {name: p}}\n  generation: in-process\n", None),  # GRPO: fine
    ],
)
def test_cel_rules(extra: str, problem: str | None) -> None:
    found = _problems(RUN + extra)
    if problem is None:
        assert found == []
    else:
        assert [f.split(":")[0] for f in found] == [problem], found


def test_classify_runs_are_scored_by_their_answers_credit() -> None:
    # A diff-similarity or mix reward would pay a classify rollout for edits it is not asked for.
    classify = RUN.replace("tasks: {path: t.jsonl}", "tasks: {path: t.jsonl, taskType: classify}")
    assert _problems(classify) == []
    assert _problems(classify + "  rollout: {reward: {type: tests, testsMode: fraction}}\n") == []
    for reward in (
        "{type: diff-similarity}",
        "{type: mix, weights: {tests: 1, diffSimilarity: 1}}",
    ):
        found = _problems(classify + f"  rollout: {{reward: {reward}}}\n")
        assert [f.split(":")[0] for f in found] == ["spec.rollout.reward.type"], found
    assert _problems(RUN + "  rollout: {reward: {type: diff-similarity}}\n") == []


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


# --- other APIs' objects: skipped by `crl validate`, errors with --strict-kinds ---------------

#: What a team keeps next to its runs: Namespaces, Kueue objects, an Argo CD Application.
GITOPS_FOLDERS = [ROOT / "examples" / "teams", ROOT / "examples" / "gitops"]


def _foreign_in(folders: list[Path]) -> list[str]:
    """`Kind/name (apiVersion)` of each document in the folders' YAML files that is not ours."""
    found = []
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and not doc["apiVersion"].startswith("coderepair.io/"):
                    found.append(f"{doc['kind']}/{doc['metadata']['name']} ({doc['apiVersion']})")
    return found


def test_crl_validate_skips_other_apis_in_a_gitops_folder_and_checks_ours() -> None:
    foreign = _foreign_in(GITOPS_FOLDERS)
    assert "Namespace/team-a (v1)" in foreign
    assert "Application/coderepairrl-root (argoproj.io/v1alpha1)" in foreign
    result = crl("validate", *(str(f.relative_to(ROOT)) for f in GITOPS_FOLDERS))
    assert result.returncode == 0, result.stdout + result.stderr
    notes = [line for line in result.stdout.splitlines() if line.endswith(FOREIGN_NOTE)]
    assert len(notes) == len(foreign), result.stdout
    for what, note in zip(foreign, notes, strict=True):
        assert f": {what}, line " in note and note.startswith("- examples/"), (what, note)
    assert "- examples/teams/10-team-a.yaml: Namespace/team-a (v1), line 3: skipped" in notes[4]
    assert "✓ examples/teams/30-trainingrun-team-a.yaml: TrainingRun/" in result.stdout
    assert result.stdout.splitlines()[-1] == (
        f"1 valid, 0 invalid, {len(foreign)} skipped (not CodeRepairRL kinds)"
    )


def test_strict_kinds_rejects_other_apis_as_before() -> None:
    foreign = _foreign_in(GITOPS_FOLDERS)
    result = crl("validate", "--strict-kinds", *(str(f) for f in GITOPS_FOLDERS))
    assert result.returncode == 1
    assert result.stdout.count("is not a CodeRepairRL resource") == len(foreign)
    assert "'Namespace' (v1) is not a CodeRepairRL resource" in result.stdout
    assert f"1 valid, {len(foreign)} invalid" in result.stdout
    assert "skipped" not in result.stdout


def test_the_other_kind_fixture_is_wrong_only_when_strict() -> None:
    """07-other-kind (a Deployment) is skipped by default; test_cli.py runs every wrong manifest
    with --strict-kinds, where it is an error, and the test above checks the library's default."""
    [other] = [p for p in INVALID if p.name == "07-other-kind.yaml"]
    result = crl("validate", *(str(p) for p in INVALID))
    assert result.returncode == 1
    assert f"- {other}: Deployment/web (apps/v1), line 5: skipped" in result.stdout
    assert f"0 valid, {len(INVALID) - 1} invalid, 1 skipped" in result.stdout


NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n"

MIXED = """\
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
""" + RUN.replace("{name: m}", "{}")


def test_a_mixed_file_reports_the_error_of_ours_and_skips_the_rest() -> None:
    result = crl("validate", "-", stdin=MIXED)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "- <stdin>: Namespace/team-a (v1), line 1: skipped, not a CodeRepairRL kind"
    assert lines[1] == "✗ <stdin>: TrainingRun/r"
    assert lines[2].startswith("    line 9: spec.model.name: ")
    assert lines[-1] == "0 valid, 1 invalid, 1 skipped (not CodeRepairRL kinds)"
    docs = [
        json.loads(line)
        for line in crl("validate", "-o", "json", "-", stdin=MIXED).stdout.splitlines()
    ]
    assert [(d["kind"], d["apiVersion"], d["valid"], d["skipped"]) for d in docs] == [
        ("Namespace", "v1", True, FOREIGN_NOTE),
        ("TrainingRun", "coderepair.io/v1alpha1", False, None),
    ]


def test_only_other_apis_says_nothing_was_checked() -> None:
    result = crl("validate", "examples/gitops/root-app.yaml")
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[-1] == (
        "0 CodeRepairRL resources checked, 1 skipped "
        "(no TrainingRun, RolloutPool or Benchmark in the input)"
    )


def test_a_duplicate_key_is_wrong_in_any_object() -> None:
    """A duplicate key is reported whatever the kind (YAML keeps only the last value): a foreign
    document with one is shown as invalid, not as skipped."""
    result = crl("validate", "-", stdin=NAMESPACE + "metadata: {name: b}\n")
    assert result.returncode == 1
    assert result.stdout.splitlines()[:2] == [
        "✗ <stdin>: Namespace/b",
        "    line 4: metadata: duplicate key: YAML keeps only the last one",
    ]
    assert result.stdout.splitlines()[-1] == "0 valid, 1 invalid"


def test_a_typo_of_our_kind_fails_even_when_skipping() -> None:
    typo = RUN.replace("kind: TrainingRun", "kind: TrainingRn")
    result = crl("validate", "-", stdin=MIXED.split("---")[0] + "---\n" + typo)
    assert result.returncode == 1
    assert "'TrainingRn' (coderepair.io/v1alpha1) is not a CodeRepairRL resource; " in result.stdout
    assert "did you mean 'TrainingRun'?" in result.stdout
    assert "0 valid, 1 invalid, 1 skipped" in result.stdout


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
