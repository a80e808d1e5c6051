"""The Benchmark runner's results folder: torn and corrupt lines, resuming, baselines, retries,\nstops and failed writes, and the lock a second run meets."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crl_worker.agent.client import ChatClient
from crl_worker.agent.trajectory import Trajectory
from crl_worker.api.progress import ProgressReport
from crl_worker.bench.runner import Baseline
from crl_worker.rollout.results import (
    AttemptResult,
    ResultsError,
    ResultsMismatchError,
    ResultsStore,
    read_results,
    read_trajectories,
)
from crl_worker.rollout.setup import Sandboxes
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.local import LocalSandbox
from crl_worker.tasks.model import Task, TestSpec
from tests.fixtures import bench_runner
from tests.fixtures.bench_runner import (
    IDENTITY,
    RecordingReporter,
    closed_port,
    make_runner,
    result_lines,
)
from tests.fixtures.canned import CannedSandbox
from tests.fixtures.openai_server import ScriptedServer, Step, call, marker

# The shared fixture, bound here so that pytest finds it.
tasks = bench_runner.tasks


# --- the results folder ---------------------------------------------------------------------------


def _record(instance: str, attempt: int, resolved: bool | None) -> AttemptResult:
    return AttemptResult(
        instance_id=instance,
        repo="o/r",
        attempt=attempt,
        resolved=resolved,
        exit_reason="submitted" if resolved is not None else "infrastructure_error",
        reward=None if resolved is None else float(resolved),
    )


def test_a_torn_last_line_is_ignored_and_cut_before_appending(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r")
    store.open(IDENTITY)
    store.append(_record("a", 0, True), json.dumps({"instance_id": "a", "attempt": 0}))
    # Trajectories are long: the torn tail is found from the end, across read chunks.
    big = {"instance_id": "b", "attempt": 0, "messages": ["x" * 200_000]}
    store.append(_record("b", 0, False), json.dumps(big))
    # A crash in the middle of the third attempt's writes.
    with store.results_file.open("a") as f:
        f.write('{"instance_id": "c", "repo": "o/r", "attem')
    with store.trajectories_file.open("a") as f:
        f.write('{"instance_id": "c", "messages": ["' + "y" * 150_000)
    assert [t["instance_id"] for t in read_trajectories(tmp_path / "r")] == ["a", "b"]

    assert [r.instance_id for r in read_results(tmp_path / "r")] == ["a", "b"]
    store.close()
    reopened = ResultsStore(tmp_path / "r")
    reopened.open(IDENTITY)
    assert reopened.finished() == {("a", 0), ("b", 0)}
    reopened.append(_record("c", 0, True), json.dumps({"instance_id": "c", "attempt": 0}))
    assert [line["instance_id"] for line in result_lines(reopened.results_file)] == ["a", "b", "c"]
    assert [t["instance_id"] for t in read_trajectories(tmp_path / "r")] == ["a", "b", "c"]
    assert result_lines(reopened.trajectories_file)[1] == big


def test_a_bad_line_before_the_end_is_corruption(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r")
    store.open(IDENTITY)
    store.append(_record("a", 0, True), "{}")
    text = store.results_file.read_text()
    store.results_file.write_text("not json\n" + text)
    store.close()
    with pytest.raises(ResultsError, match="line 1"):
        ResultsStore(tmp_path / "r").open(IDENTITY)


def test_infrastructure_failures_are_not_finished_and_the_last_line_wins(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r")
    store.open(IDENTITY)
    store.append(_record("a", 0, None), "{}")
    store.append(_record("b", 0, True), "{}")
    assert store.finished() == {("b", 0)}
    store.append(_record("a", 0, False), "{}")
    assert store.finished() == {("a", 0), ("b", 0)}
    assert [r.resolved for r in read_results(tmp_path / "r")] == [False, True]


def test_resuming_with_another_model_is_refused_and_restart_moves_the_folder_aside(
    tmp_path: Path,
) -> None:
    store = ResultsStore(tmp_path / "r")
    store.open(IDENTITY)
    store.append(_record("a", 0, True), "{}")
    store.close()
    other = {**IDENTITY, "model": "Qwen/Qwen3-8B"}
    with pytest.raises(ResultsMismatchError) as caught:
        ResultsStore(tmp_path / "r").open(other)
    message = str(caught.value)
    assert "model: gold then, Qwen/Qwen3-8B now" in message
    assert "--restart" in message

    fresh = ResultsStore(tmp_path / "r")
    fresh.open(other, restart=True)
    assert fresh.finished() == set()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("r.old-")]
    assert len(aside) == 1
    assert [r.instance_id for r in read_results(aside[0])] == ["a"]


async def test_the_run_gives_up_after_too_many_infrastructure_failures_in_a_row(
    tmp_path: Path, tasks: list[Task]
) -> None:
    client = ChatClient(
        f"http://127.0.0.1:{closed_port()}/v1", "nobody", max_retries=0, backoff_base=0.01
    )
    store = ResultsStore(tmp_path / "results")
    store.open({**IDENTITY, "model": "nobody"})
    runner = make_runner(
        tasks, store, client=client, attempts=3, parallelism=1, max_consecutive_errors=2
    )
    try:
        outcome = await runner.run()
    finally:
        await client.aclose()
    assert outcome.gave_up is not None and "2 attempts in a row" in outcome.gave_up
    assert outcome.interrupted
    assert outcome.ran == 2 and len(result_lines(store.results_file)) == 2
    assert outcome.summary["finished"] is False
    assert (outcome.summary["done"], outcome.summary["total"]) == (2, 6)


async def test_a_baseline_is_compared_in_the_summary_and_the_last_report(
    tmp_path: Path, tasks: list[Task]
) -> None:
    roman, calendar = tasks
    baseline = ResultsStore(tmp_path / "baseline")
    baseline.open({**IDENTITY, "model": "zero-shot"})
    baseline.append(_record(roman.instance_id, 0, False), "{}")
    baseline.append(_record(calendar.instance_id, 0, True), "{}")
    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    reporter = RecordingReporter()
    runner = make_runner(tasks, store, reporter=reporter)
    runner.baseline = Baseline(tmp_path / "baseline", "zero-shot", 0.9, 0.05)
    outcome = await runner.run()
    comparison = outcome.summary["comparison"]
    assert comparison["baseline"] == "zero-shot"
    assert comparison["sharedInstances"] == 2
    assert comparison["difference"] == pytest.approx(0.5)
    assert (comparison["discordantResults"], comparison["discordantBaseline"]) == (1, 0)
    assert comparison["confidenceLevel"] == 0.9
    assert comparison["meetsMinimumImprovement"] is (comparison["ciLow"] >= 0.05)
    last = ProgressReport.model_validate(reporter.reports[-1])
    assert last.comparison is not None and last.comparison.difference == pytest.approx(0.5)


async def test_an_errored_attempt_is_retried_after_the_rest_within_the_run(
    tmp_path: Path, tasks: list[Task]
) -> None:
    roman, calendar = tasks
    source = Path(str(calendar.source))
    moved = Path(str(source) + ".moved")
    source.rename(moved)
    factory = Sandboxes.make(None).factory
    order: list[str] = []

    def sandbox(task: Task) -> Any:
        order.append(task.instance_id)
        if len(order) == 3:
            # The repository is back before the retry: a transient failure.
            moved.rename(source)
        return factory(task)

    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    runner = make_runner(
        [calendar, roman], store, sandbox_factory=sandbox, parallelism=1, retries=1
    )
    outcome = await runner.run()
    # calendarkit fails, romankit runs, then calendarkit again (after the rest); each resolved
    # attempt's integrity check makes one more sandbox, after its own is closed.
    assert order == [
        calendar.instance_id,
        roman.instance_id,
        roman.instance_id,
        calendar.instance_id,
        calendar.instance_id,
    ]
    lines = result_lines(store.results_file)
    assert [(r["instance_id"], r["resolved"]) for r in lines] == [
        (calendar.instance_id, None),
        (roman.instance_id, True),
        (calendar.instance_id, True),
    ]
    assert outcome.ran == 3
    assert (outcome.summary["errored"], outcome.summary["resolved"]) == (0, 2)


def test_a_write_that_fails_half_way_leaves_no_torn_line_behind(tmp_path: Path) -> None:
    """A full disk in the middle of a trajectory: the file is cut back, so the next attempt's
    line does not land glued onto a torn one (which would make the folder unreadable)."""
    store = ResultsStore(tmp_path / "r")
    store.open(IDENTITY)
    store.append(_record("a", 0, True), json.dumps({"instance_id": "a"}))
    size = store.trajectories_file.stat().st_size
    # A real failing write(2): the process may not grow a file past the limit (EFBIG), the same
    # half-written line a full disk (ENOSPC) leaves.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1000, hard))
    try:
        with pytest.raises(OSError):
            store.append(_record("b", 0, True), json.dumps({"messages": ["x" * 100_000]}))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert store.trajectories_file.stat().st_size == size
    store.append(_record("c", 0, True), json.dumps({"instance_id": "c"}))
    assert [t["instance_id"] for t in read_trajectories(tmp_path / "r")] == ["a", "c"]
    store.close()
    reopened = ResultsStore(tmp_path / "r")
    reopened.open(IDENTITY)
    assert reopened.finished() == {("a", 0), ("c", 0)}


class SlowClosingSandbox(LocalSandbox):
    """A real local sandbox whose close takes a while, as deleting a pod or releasing a pool
    lease does; ``closing`` is set when the close begins."""

    def __init__(self, config: Any, task: Task) -> None:
        super().__init__(config, task)
        self.closing = asyncio.Event()

    async def close(self) -> None:
        self.closing.set()
        await asyncio.sleep(0.5)
        await super().close()


async def test_a_second_stop_while_closing_still_closes_every_sandbox(
    tmp_path: Path, tasks: list[Task]
) -> None:
    """Ctrl-C twice: the second cancellation lands while the sandbox is closing. The run must
    not end (and asyncio.run then cancel the close) before the sandbox is gone."""
    roman = tasks[0]
    made: list[SlowClosingSandbox] = []

    def sandbox(task: Task) -> SlowClosingSandbox:
        made.append(SlowClosingSandbox(LocalSandboxConfig(), task))
        return made[-1]

    async with ScriptedServer() as server:
        keyed = roman.model_copy(
            update={"problem_statement": f"{roman.problem_statement}\n{marker('hang')}"}
        )
        server.script("hang", Step(content="late", delay=30))
        async with ChatClient(server.url, "scripted") as client:
            store = ResultsStore(tmp_path / "results")
            store.open({**IDENTITY, "model": "scripted"})
            runner = make_runner([keyed], store, client=client, sandbox_factory=sandbox)
            run = asyncio.create_task(runner.run())
            while not server.requests_for("hang"):
                await asyncio.sleep(0.02)
            runner.stop()
            await asyncio.wait_for(made[0].closing.wait(), 30)
            runner.stop()  # the second Ctrl-C
            outcome = await asyncio.wait_for(run, 60)
    assert outcome.interrupted and outcome.ran == 0
    root = made[0].root
    assert root is not None and not root.exists(), "the sandbox was left behind"
    assert not made[0].alive


async def test_results_that_cannot_be_written_stop_the_run_and_say_why(
    tmp_path: Path, tasks: list[Task]
) -> None:
    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    # A real failing write: trajectories.jsonl is a folder, so opening it for writing fails.
    store.trajectories_file.unlink(missing_ok=True)
    store.trajectories_file.mkdir()
    outcome = await make_runner(tasks, store, parallelism=1).run()
    assert outcome.interrupted and outcome.ran == 0
    assert outcome.gave_up is not None
    assert "recording" in outcome.gave_up and "IsADirectoryError" in outcome.gave_up
    assert outcome.summary["done"] == 0 and outcome.summary["finished"] is False


async def test_a_stopped_attempt_keeps_its_trajectory_apart_and_runs_again(
    tmp_path: Path, tasks: list[Task]
) -> None:
    roman = tasks[0].model_copy(
        update={"problem_statement": f"{tasks[0].problem_statement}\n{marker('stopped')}"}
    )
    async with ScriptedServer() as server:
        server.script(
            "stopped", call("view", {"path": "README.md"}), Step(content="late", delay=30)
        )
        async with ChatClient(server.url, "scripted") as client:
            store = ResultsStore(tmp_path / "results")
            store.open({**IDENTITY, "model": "scripted"})
            runner = make_runner([roman], store, client=client)
            run = asyncio.create_task(runner.run())
            while len(server.requests_for("stopped")) < 2:
                await asyncio.sleep(0.02)
            runner.stop()
            outcome = await asyncio.wait_for(run, 60)
    assert outcome.interrupted and outcome.ran == 0
    # No result line: the attempt is not done and runs again on resume ...
    assert not store.results_file.exists() or store.results_file.read_text() == ""
    assert not store.trajectories_file.exists() or store.trajectories_file.read_text() == ""
    store.close()
    resumed = ResultsStore(tmp_path / "results")
    resumed.open({**IDENTITY, "model": "scripted"})
    assert resumed.finished() == set()
    # ... but what its agent did is kept.
    (kept,) = result_lines(store.cancelled_file)
    trajectory = Trajectory.model_validate(kept)
    assert trajectory.exit_reason == "cancelled"
    assert [t.tool_calls[0].name for t in trajectory.turns] == ["view"]


class CountingCannedSandbox(CannedSandbox):
    """The canned sandbox of the agent's concurrency test (runs nothing; real sandboxes would
    take minutes for this many attempts), counting how many exist at once. Only for this
    concurrency test."""

    live = 0
    most = 0
    closed = 0

    async def start(self) -> None:
        cls = CountingCannedSandbox
        cls.live += 1
        cls.most = max(cls.most, cls.live)
        await asyncio.sleep(0.001)
        await super().start()

    async def close(self) -> None:
        if self.alive:
            CountingCannedSandbox.live -= 1
            CountingCannedSandbox.closed += 1
        await super().close()


async def test_hundreds_of_attempts_never_hold_more_sandboxes_than_the_parallelism(
    tmp_path: Path,
) -> None:
    tasks = [
        Task(
            instance_id=f"canned-{n}",
            repo=f"crl/canned-{n % 3}",
            base_commit="0" * 40,
            problem_statement="Nothing to fix.",
            patch="--- a/x\n+++ b/x\n",
            test=TestSpec(command="true", log_format="pytest"),
        )
        for n in range(150)
    ]
    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    runner = make_runner(
        tasks, store, sandbox_factory=lambda task: CountingCannedSandbox(), parallelism=6
    )
    outcome = await runner.run()
    assert (outcome.ran, outcome.interrupted) == (150, False)
    assert CountingCannedSandbox.most == 6  # back-pressure: never more than the parallelism
    # Canned sandboxes run nothing: every run reports no tests, which the integrity check grades
    # again in a second sandbox, made once the first is closed (so still at most 6 at once).
    assert (CountingCannedSandbox.live, CountingCannedSandbox.closed) == (0, 300)
    assert (
        len(result_lines(store.results_file)) == len(result_lines(store.trajectories_file)) == 150
    )
    assert {r.key for r in read_results(tmp_path / "results")} == {
        (t.instance_id, 0) for t in tasks
    }


def test_a_folder_another_run_writes_to_is_refused_until_it_ends(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r")
    store.open(IDENTITY)
    store.append(_record("a", 0, True), "{}")
    # Another process (the same command in a second terminal) with the same identity.
    script = (
        "import sys; from pathlib import Path; from crl_worker.rollout.results import ResultsStore\n"
        f"ResultsStore(Path(sys.argv[1])).open({IDENTITY!r})\n"
    )
    second = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "r")], capture_output=True, text=True
    )
    assert second.returncode != 0
    assert f"another run is writing to {tmp_path / 'r'} (process {os.getpid()})" in second.stderr
    for restart in (False, True):  # restarting would move the folder from under it
        with pytest.raises(ResultsError, match="another run is writing"):
            ResultsStore(tmp_path / "r").open(IDENTITY, restart=restart)
    assert store.finished() == {("a", 0)}
    store.close()
    again = subprocess.run([sys.executable, "-c", script, str(tmp_path / "r")])
    assert again.returncode == 0
    reopened = ResultsStore(tmp_path / "r")
    reopened.open(IDENTITY, restart=True)
    assert reopened.finished() == set()
    reopened.append(_record("b", 0, True), "{}")
    reopened.close()


async def test_a_summary_that_cannot_be_written_does_not_lose_the_run(
    tmp_path: Path, tasks: list[Task], caplog: pytest.LogCaptureFixture
) -> None:
    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    store.summary_file.mkdir()  # a real failing write: summary.json cannot be replaced
    reporter = RecordingReporter()
    outcome = await make_runner(tasks[:1], store, reporter=reporter).run()
    assert outcome.summary["resolved"] == 1 and not outcome.interrupted
    assert reporter.reports[-1]["finished"] is True  # the last report still went out
    assert "cannot write" in caplog.text and "results are intact" in caplog.text
    assert not store.summary_file.with_name("summary.json.part").exists()
    assert [r["resolved"] for r in result_lines(store.results_file)] == [True]


def test_a_lock_file_that_cannot_be_opened_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "r" / ".lock").mkdir(parents=True)
    with pytest.raises(ResultsError, match=r"cannot open .*\.lock: .*is the results folder"):
        ResultsStore(tmp_path / "r").open(IDENTITY)
