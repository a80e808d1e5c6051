"""The benchmark runner end to end: real fixture repositories in local sandboxes, the gold
policy through the agent's own loop and tools, the real evaluation, the results folder on disk.
Infrastructure failures are real too: a repository that cannot be cloned, a model server port
nobody listens on."""

from __future__ import annotations

import json
from pathlib import Path

from crl_worker.agent.client import ChatClient
from crl_worker.api.progress import ProgressReport
from crl_worker.rollout.results import (
    ResultsStore,
    read_results,
)
from crl_worker.tasks.model import Task
from tests.fixtures import bench_runner
from tests.fixtures.bench_runner import (
    IDENTITY,
    RecordingReporter,
    closed_port,
    make_runner,
    result_lines,
)

# The shared fixture, bound here so that pytest finds it.
tasks = bench_runner.tasks


async def test_gold_run_resolves_every_fixture_and_writes_a_consistent_folder(
    tmp_path: Path, tasks: list[Task]
) -> None:
    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    reporter = RecordingReporter()
    seen: list[tuple[str, int]] = []
    runner = make_runner(
        tasks,
        store,
        attempts=2,
        pass_at_k=(1, 2),
        reporter=reporter,
        progress=lambda result, report: seen.append((result.instance_id, report["done"])),
    )
    outcome = await runner.run()

    assert not outcome.interrupted
    assert (outcome.total, outcome.ran, outcome.skipped) == (4, 4, 0)
    results = result_lines(store.results_file)
    trajectories = result_lines(store.trajectories_file)
    assert len(results) == len(trajectories) == 4
    assert {(r["instance_id"], r["attempt"]) for r in results} == {
        (t.instance_id, a) for t in tasks for a in (0, 1)
    }
    for result, trajectory in zip(results, trajectories, strict=True):
        # Same order, and each result's trajectory holds the evaluation that decided it.
        assert (trajectory["instance_id"], trajectory["attempt"]) == (
            result["instance_id"],
            result["attempt"],
        )
        assert result["resolved"] is True and result["reward"] == 1.0
        assert result["exit_reason"] == trajectory["exit_reason"] == "submitted"
        assert trajectory["evaluation"]["resolved"] is True
        assert trajectory["reward"] == 1.0
        assert trajectory["diff"].strip(), "the gold patch's changes are in the final diff"
        assert result["turns"] == len(trajectory["turns"]) >= 2
        assert result["eval_seconds"] > 0 and result["wall_seconds"] >= result["eval_seconds"]

    summary = json.loads(store.summary_file.read_text())
    assert summary == outcome.summary
    assert summary["finished"] is True
    assert (summary["done"], summary["resolved"], summary["errored"]) == (4, 4, 0)
    assert summary["resolveRate"] == 1.0
    assert [(p["k"], p["value"]) for p in summary["passAtK"]] == [(1, 1.0), (2, 1.0)]
    assert {r["repo"]: r["attempts"] for r in summary["repositories"]} == {
        "crl-fixtures/calendarkit": 2,
        "crl-fixtures/romankit": 2,
    }
    assert summary["exitReasons"] == {"submitted": 4}

    assert sorted(done for _, done in seen) == [1, 2, 3, 4]
    # One before the first attempt ends (the operator waits for the last once it read one),
    # one per attempt, the last.
    assert [r["done"] for r in reporter.reports] == [0, 1, 2, 3, 4, 4]
    assert [r["finished"] for r in reporter.reports] == [False] * 5 + [True]
    assert reporter.reports[-1]["finished"] is True
    assert reporter.reports[-1]["passAtK"] == [{"k": 1, "value": 1.0}, {"k": 2, "value": 1.0}]
    # What the operator reads back from the ConfigMap accepts every report.
    for report in reporter.reports:
        ProgressReport.model_validate(report)


async def test_tests_that_outlive_their_time_are_unresolved_not_errored(
    tmp_path: Path, tasks: list[Task]
) -> None:
    # The gold fix, but a test run that hangs past the task's limit: SWE-bench's rule is "not
    # resolved", and it must not drop out of the rate as an infrastructure failure.
    roman = tasks[0]
    hanging = roman.model_copy(
        update={
            "test": roman.test.model_copy(update={"command": "sleep 60; " + roman.test.command}),
            "timeouts": roman.timeouts.model_copy(update={"test": 2.0}),
        }
    )
    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    outcome = await make_runner([hanging], store, retries=0).run()

    (result,) = result_lines(store.results_file)
    (trajectory,) = result_lines(store.trajectories_file)
    assert trajectory["evaluation"]["tests_timed_out"] is True
    assert "timed out after 2s" in trajectory["evaluation"]["infrastructure_error"]
    assert result["resolved"] is False and result["infrastructure_error"] is None
    assert result["reward"] == trajectory["reward"] == 0.0
    assert (outcome.summary["done"], outcome.summary["errored"]) == (1, 0)
    assert outcome.summary["resolveRate"] == 0.0


async def test_a_sandbox_that_does_not_start_is_errored_and_retried_on_resume(
    tmp_path: Path, tasks: list[Task]
) -> None:
    roman, calendar = tasks
    # The repository moved away: cloning fails, a real infrastructure failure.
    moved = Path(str(calendar.source) + ".moved")
    Path(str(calendar.source)).rename(moved)
    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    first = await make_runner(tasks, store).run()

    by_id = {r.instance_id: r for r in first.records}
    broken = by_id[calendar.instance_id]
    assert broken.resolved is None and broken.reward is None
    assert broken.exit_reason == "infrastructure_error"
    assert broken.infrastructure_error and "sandbox did not start" in broken.infrastructure_error
    assert by_id[roman.instance_id].resolved is True
    # Errored, not unresolved: the rate is over the one attempt with a verdict.
    assert (first.summary["errored"], first.summary["unresolved"]) == (1, 0)
    assert first.summary["resolveRate"] == 1.0
    assert first.summary["finished"] is True

    # Resume: only the failed attempt runs again; the later line wins.
    moved.rename(Path(str(calendar.source)))
    store.close()
    resumed_store = ResultsStore(tmp_path / "results")
    resumed_store.open(IDENTITY)
    second = await make_runner(tasks, resumed_store).run()
    assert (second.ran, second.skipped) == (1, 1)
    lines = result_lines(resumed_store.results_file)
    assert [line["instance_id"] for line in lines].count(roman.instance_id) == 1
    assert len(lines) == len(result_lines(resumed_store.trajectories_file)) == 3
    assert all(r.resolved for r in read_results(tmp_path / "results"))
    assert second.summary["errored"] == 0 and second.summary["resolveRate"] == 1.0


async def test_a_model_server_that_is_down_errors_the_attempts_without_a_verdict(
    tmp_path: Path, tasks: list[Task]
) -> None:
    client = ChatClient(
        f"http://127.0.0.1:{closed_port()}/v1", "nobody", max_retries=1, backoff_base=0.01
    )
    store = ResultsStore(tmp_path / "results")
    store.open({**IDENTITY, "model": "nobody"})
    runner = make_runner(tasks, store, client=client, parallelism=8)
    try:
        outcome = await runner.run()
    finally:
        await client.aclose()
    assert [r.resolved for r in outcome.records] == [None, None]
    assert all(r.exit_reason == "infrastructure_error" for r in outcome.records)
    assert outcome.summary["errored"] == 2
    assert outcome.summary["resolveRate"] is None
    assert outcome.summary["passAtK"][0]["value"] is None
