"""A benchmark's second try (``agent.tries: 2``, Aider's polyglot pass@2): the first try is
graded outside the agent's sandbox, an unresolved one continues there with the failing tests'
output, and the second is graded as any episode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crl_worker.agent.trajectory import Trajectory
from crl_worker.agent.tries import failing_output, feedback_message, may_try_again
from crl_worker.api.common import AgentSpec
from crl_worker.api.validation import validate_text
from crl_worker.bench.config import read_benchmark, run_identity
from crl_worker.bench.runner import BenchmarkRunner
from crl_worker.bench.summary import build_summary, summary_table
from crl_worker.harness.result import EvalResult
from crl_worker.rollout.export import export_trajectories
from crl_worker.rollout.results import AttemptResult, ResultsStore
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import JEST_REPORT_MARKER, Task
from crl_worker.train.settings import TrainConfigError, resolve_settings

from .fixtures.paths import ROOT
from .fixtures.second_try import (
    LOOK_FOR_THE_TESTS,
    TwoTries,
    apply_patch_command,
    two_try_episode,
)
from .fixtures.task_types import IMPLEMENT, local_sandboxes, suite_tasks

IDENTITY = {"suite": "implement", "model": "two-tries", "agent": {"tries": 2}}


async def test_the_second_try_sees_the_failures_not_the_tests(tmp_path: Path) -> None:
    """Through the benchmark runner: the stub is submitted first (its tests fail with
    NotImplementedError); shown that, the agent finds no trace of the hidden tests in its
    sandbox, applies the reference and submits: try 1 unresolved, try 2 resolved (and
    confirmed), both rates in the summary; the run then resumes with nothing left to do."""
    task = suite_tasks(IMPLEMENT / "tasks.jsonl")[0]
    policy = TwoTries((), (LOOK_FOR_THE_TESTS, apply_patch_command(task.patch)), "NotImplemented")

    def factory(t: Task) -> Sandbox:
        return create_sandbox(local_sandboxes(tmp_path / "sandboxes"), t)

    def runner(store: ResultsStore) -> BenchmarkRunner:
        return BenchmarkRunner(
            [task],
            agent=AgentSpec(max_turns=6, timeout_seconds=300, tries=2),
            store=store,
            policy_factory=lambda _: policy,
            sandbox_factory=factory,
            suite="implement",
            model=policy.model,
        )

    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    summary = (await runner(store).run()).summary
    store.close()
    assert (summary["firstTryRate"], summary["resolveRate"]) == (0.0, 1.0)
    [row] = summary["languages"]
    assert (row["firstTryResolved"], row["resolved"]) == (0, 1)
    [result] = [json.loads(line) for line in store.results_file.read_text().splitlines()]
    assert (result["first_try_resolved"], result["resolved"]) == (False, True)
    [line] = store.trajectories_file.read_text().splitlines()
    trajectory = Trajectory.model_validate_json(line)

    assert [t.exit_reason for t in trajectory.tries] == ["submitted", "submitted"]
    first = trajectory.tries[0].evaluation
    assert first is not None and not first.resolved and first.tampered is None
    assert trajectory.evaluation is not None and trajectory.evaluation.resolved
    assert trajectory.evaluation.confirmed is True
    # Try 2 began at the turn after the first submit, with the test output as a user message.
    begins = trajectory.tries[1].first_turn
    assert begins == 1
    message = trajectory.messages[trajectory.turns[begins].message_index - 1]
    assert message["role"] == "user" and message["content"] == policy.shown
    shown = policy.shown or ""
    assert "NotImplementedError" in shown and "last try" in shown
    for internal in (".git/crl", "crl-eval", "canary", task.test_spec.command):
        assert internal not in shown, internal
    # Nothing of the hidden tests was in the sandbox during the second try.
    looked = trajectory.turns[begins].tool_calls[0].output
    assert looked.split()[-4:] == ["0", "0", "0", "0"], looked
    assert "test_parser" not in looked

    # Resumed: the attempt is done, its first-try verdict read back from results.jsonl.
    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    summary = (await runner(store).run()).summary
    store.close()
    assert (summary["firstTryRate"], summary["resolveRate"], summary["done"]) == (0.0, 1.0, 1)

    # Never training data: the second try was shown the hidden tests' output.
    exported = export_trajectories([tmp_path / "results"], tmp_path / "dataset")
    assert exported.written == 0, exported.left_out
    assert exported.left_out == {"a second try (shown the hidden tests' output)": 1}


#: Source code (the package's ``__init__``) that reports every unittest test passed.
TAMPER = """
import unittest as _u


def _run(self, result=None):
    result.startTest(self)
    result.addSuccess(self)
    result.stopTest(self)


_u.TestCase.run = _run
"""


async def test_a_first_try_resolved_or_tampered_is_final(tmp_path: Path) -> None:
    """No second try after a resolved first try, nor after a tampered one (its tests "pass"
    in the first grading, the integrity check catches it); the first try's grading
    is the episode's verdict, and no test output is shown."""
    task = suite_tasks(IMPLEMENT / "tasks.jsonl")[0]
    policy = TwoTries((apply_patch_command(task.patch),), ("false",), "")
    trajectory, made = await two_try_episode(task, policy, local_sandboxes(tmp_path))
    assert len(trajectory.tries) == 1 and policy.shown is None
    assert trajectory.evaluation is not None and trajectory.evaluation.resolved
    assert trajectory.evaluation.confirmed is True
    # Graded once: the agent's sandbox, the first grading's, the integrity check's.
    assert made == 3

    tamper = f"cat >> iniconf/__init__.py <<'EOF'\n{TAMPER}EOF"
    policy = TwoTries((tamper,), ("false",), "")
    trajectory, _ = await two_try_episode(task, policy, local_sandboxes(tmp_path))
    assert len(trajectory.tries) == 1 and policy.shown is None
    assert [m["role"] for m in trajectory.messages].count("user") == 1
    assert trajectory.evaluation is not None and not trajectory.evaluation.resolved
    # Caught by the reporter (the runner's code changed) or the canaries, whichever says first.
    assert "tampered with" in (trajectory.evaluation.tampered or "")

    tampered = EvalResult(instance_id="x", resolved=False, tampered="a canary passed")
    errored = EvalResult(instance_id="x", resolved=False, infrastructure_error="gone")
    assert not may_try_again(tampered) and not may_try_again(errored)
    assert may_try_again(EvalResult(instance_id="x", resolved=False))
    timed_out = errored.model_copy(update={"tests_timed_out": True})
    assert may_try_again(timed_out)  # the benchmark's verdict: unresolved


def test_failing_output_keeps_the_run_only() -> None:
    log = (
        ">>> model patch\napplied\n>>> tests: python -m pytest tests/t.py (exit 1)\n"
        "/w/x/tests/t.py:3: AssertionError\n>>> doctest line\n"
        ">>> junit reports: 2\n>>> tampered\ncanary ids\n"
    )
    assert failing_output(log, workdir="/w/x", shown_as="/repo") == (
        "/repo/tests/t.py:3: AssertionError\n>>> doctest line"
    )
    # go test -json is shown as its text; jest's machine-readable report is left out.
    events = (
        '{"Time":"t","Action":"run","Package":"p","Test":"TestA"}\n'
        '{"Time":"t","Action":"output","Package":"p","Test":"TestA","Output":"--- FAIL: TestA\\n"}\n'
        f'ok\n{JEST_REPORT_MARKER} 1\n{{"numFailedTests": 1}}\n'
    )
    assert failing_output(">>> tests: go test -json (exit 1)\n" + events) == "--- FAIL: TestA\nok"
    # The message: the output, what a timeout or a patch that does not apply means, and for
    # a diff that passed only with its test changes, the files that did not count.
    plain = EvalResult(instance_id="x", resolved=False, log=log)
    timed_out = plain.model_copy(
        update={"tests_timed_out": True, "infrastructure_error": "timed out after 5s"}
    )
    message = feedback_message(timed_out, timed_out, workdir="/w/x", shown_as="/repo")
    assert "/repo/tests/t.py:3: AssertionError" in message and "timed out after 5s" in message
    assert "tampered" not in message and "junit" not in message and "pytest" not in message
    unapplied = plain.model_copy(update={"patch_applied": False})
    assert "could not be applied" in feedback_message(unapplied, unapplied, workdir="", shown_as="")
    passed = plain.model_copy(update={"resolved": True})
    final = plain.model_copy(update={"stripped": ["tests/conftest.py (test infrastructure)"]})
    message = feedback_message(passed, final, workdir="", shown_as="")
    assert "tests/conftest.py (test infrastructure)" in message and "```" not in message
    long = ">>> tests: x (exit 1)\n" + "a" * 20000 + "END"
    assert failing_output(long).endswith("END") and len(failing_output(long)) < 8100


def test_summary_reports_both_tries_per_language() -> None:
    def attempt(instance: str, language: str, first: bool | None, final: bool) -> AttemptResult:
        return AttemptResult(
            instance_id=instance,
            repo="r",
            attempt=0,
            resolved=final,
            exit_reason="submitted",
            language=language,
            first_try_resolved=first,
        )

    records = [
        attempt("a", "go", False, True),
        attempt("b", "go", True, True),
        attempt("c", "rust", False, False),
    ]
    summary = build_summary(records, suite="s", model="m", total=3, ks=[1], finished=True)
    assert (summary["firstTryRate"], summary["resolveRate"]) == (1 / 3, 2 / 3)
    go, rust = summary["languages"]
    assert (go["firstTryRate"], go["resolveRate"]) == (0.5, 1.0)
    assert (rust["firstTryRate"], rust["resolveRate"]) == (0.0, 0.0)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "try 1" in text and "try 2" in text and "50.0%" in text
    # Without the option: the table and summary as before.
    plain = [r.model_copy(update={"first_try_resolved": None}) for r in records]
    summary = build_summary(plain, suite="s", model="m", total=3, ks=[1], finished=True)
    assert "firstTryRate" not in summary and "firstTryRate" not in summary["languages"][0]


def test_one_try_keeps_the_results_identity() -> None:
    """A results folder written before ``agent.tries`` existed resumes: one try (the
    default) is not part of the run's identity; two tries are (another run)."""
    config = read_benchmark(ROOT / "examples" / "local-benchmark-polyglot.yaml")
    assert "tries" not in run_identity(config, agent="gold", model="gold")["agent"]
    config.spec.agent.tries = 2
    assert run_identity(config, agent="gold", model="gold")["agent"]["tries"] == 2


def test_a_training_run_refuses_a_second_try(tmp_path: Path) -> None:
    run = (
        "apiVersion: coderepair.io/v1alpha1\nkind: TrainingRun\nmetadata: {name: r}\n"
        "spec:\n  model: {name: m}\n  tasks: {path: t.jsonl}\n"
    )
    problems = [
        f"{p.path}: {p.message}"
        for r in validate_text(run + "  rollout: {agent: {tries: 2}}\n")
        for p in r.problems
    ]
    assert len(problems) == 1 and problems[0].startswith("spec.rollout.agent.tries: ")
    assert "benchmarks" in problems[0]
    assert [
        p for r in validate_text(run + "  rollout: {agent: {tries: 1}}\n") for p in r.problems
    ] == []
    # A local run (not checked against the CEL rules) refuses it as well.
    path = tmp_path / "run.yaml"
    path.write_text(run + "  rollout: {agent: {tries: 2}}\n")
    with pytest.raises(TrainConfigError, match=r"spec\.rollout\.agent\.tries"):
        resolve_settings(path, env={})
