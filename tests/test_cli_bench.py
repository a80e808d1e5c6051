"""`crl bench`, `python -m crl_worker.bench` and `crl compare` as a user runs them: real
subprocesses, real fixture repositories in local sandboxes, a scripted OpenAI-compatible server
over real HTTP, real signals (SIGKILL for a crash, SIGINT for Ctrl-C)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl_worker.agent.gold import apply_command
from crl_worker.tasks.model import Task
from tests.fixtures.openai_server import ScriptedServer, Step, call, marker
from tests.fixtures.repos import python_task, unittest_task

ROOT = Path(__file__).resolve().parents[1]


def _manifest(tmp_path: Path, tasks: list[Task], *, parallelism: int = 2) -> Path:
    """A Benchmark manifest whose task file lies beside it (a relative path)."""
    with (tmp_path / "tasks.jsonl").open("w") as f:
        for task in tasks:
            f.write(task.model_dump_json() + "\n")
    manifest = tmp_path / "bench.yaml"
    manifest.write_text(
        f"""apiVersion: coderepair.io/v1alpha1
kind: Benchmark
metadata:
  name: fixtures
spec:
  suite:
    name: fixtures
    tasks:
      format: task
      path: tasks.jsonl
  model:
    serve:
      name: some/model
  agent:
    maxTurns: 6
    timeoutSeconds: 300
  parallelism: {parallelism}
  results:
    path: out
"""
    )
    return manifest


def _scripted(tasks: list[Task]) -> list[Task]:
    """The tasks with a marker in their problem statement, so the server knows each one."""
    return [
        t.model_copy(
            update={"problem_statement": f"{t.problem_statement}\n{marker(t.instance_id)}"}
        )
        for t in tasks
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CRL_MODEL") and k not in ("CRL_API_KEY", "OPENAI_API_KEY")
    }
    env.pop("CRL_POOL_URL", None)
    env.pop("CRL_RESULTS_DIR", None)
    env.pop("CRL_CONFIG", None)
    env["COLUMNS"] = "160"
    return {**env, **extra}


async def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *args,
        cwd=cwd,
        env=env or _env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _crl(*args: str) -> list[str]:
    return [sys.executable, "-m", "crl_cli", *args]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class GoldModel:
    """A scripted model that solves each task as the gold agent does: apply the patch, submit.

    ``slow`` instances answer their first call after a delay (to have something running when
    the test interrupts)."""

    def __init__(self, tasks: list[Task], slow: frozenset[str] = frozenset()) -> None:
        self.patches = {t.instance_id: t.patch for t in tasks}
        self.slow = slow

    def __call__(self, key: str, index: int, body: dict[str, Any]) -> Step:
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        if turn == 0:
            return call(
                "shell",
                {"command": apply_command(self.patches[key])},
                delay=3.0 if key in self.slow else 0.0,
                usage=(100, 20),
            )
        return call("submit", {}, usage=(150, 5))


@pytest.fixture
def fixture_tasks(tmp_path: Path) -> list[Task]:
    return [python_task(tmp_path / "repos"), unittest_task(tmp_path / "repos")]


async def test_crl_bench_gold_resolves_the_fixtures_and_resumes_without_rerunning(
    tmp_path: Path, fixture_tasks: list[Task]
) -> None:
    manifest = _manifest(tmp_path, fixture_tasks)
    code, out, err = await _run(*_crl("bench", str(manifest), "--agent", "gold"), cwd=tmp_path)
    assert code == 0, err
    # Results default to spec.results.path, relative to the current directory.
    folder = tmp_path / "out"
    assert "results:" in out and str(folder) in out
    assert "100.0%" in out and "crl-fixtures/romankit" in out
    assert [r["resolved"] for r in _lines(folder / "results.jsonl")] == [True, True]

    code, out, err = await _run(
        *_crl("bench", str(manifest), "--agent", "gold", "-o", "json"), cwd=tmp_path
    )
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["done"], summary["resolved"], summary["resolveRate"]) == (2, 2, 1.0)
    assert len(_lines(folder / "results.jsonl")) == 2, "nothing was run again"

    code, out, err = await _run(
        *_crl("bench", str(manifest), "--agent", "gold", "--restart", "--limit", "1", "-o", "json"),
        cwd=tmp_path,
    )
    assert code == 0, err
    assert json.loads(out)["total"] == 1
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("out.old-")]) == 1


async def test_crl_bench_openai_over_real_http(tmp_path: Path, fixture_tasks: list[Task]) -> None:
    tasks = _scripted(fixture_tasks)
    manifest = _manifest(tmp_path, tasks)
    async with ScriptedServer(responder=GoldModel(tasks)) as server:
        code, out, err = await _run(
            *_crl(
                "bench",
                str(manifest),
                "--agent",
                "openai",
                "--url",
                server.url,
                "--model",
                "scripted",
                "--results",
                str(tmp_path / "r"),
                "-o",
                "json",
            ),
            cwd=tmp_path,
        )
        assert code == 0, err
        keys = sorted(r.key for r in server.requests)
    summary = json.loads(out)
    assert summary["model"] == "scripted"
    assert (summary["resolved"], summary["errored"]) == (2, 0)
    assert summary["tokens"]["prompt"] == 2 * 250
    assert summary["tokens"]["completion"] == 2 * 25
    assert keys == sorted([t.instance_id for t in tasks] * 2)
    trajectories = _lines(tmp_path / "r" / "trajectories.jsonl")
    assert all(t["model"] == "scripted" and len(t["turns"]) == 2 for t in trajectories)


async def _wait_for_lines(path: Path, count: int, timeout: float = 120) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if path.exists() and path.read_text().count("\n") >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never had {count} lines")


async def _wait_for_request(server: ScriptedServer, key: str, timeout: float = 120) -> None:
    """Wait until ``key``'s conversation has sent its first model call.

    The agent calls the model from inside its sandbox, so by then the attempt's sandbox exists
    (a results line alone only says the previous attempt finished).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if server.requests_for(key):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{key} never called the model")


async def test_a_killed_runner_resumes_without_rerunning_finished_attempts(
    tmp_path: Path, fixture_tasks: list[Task]
) -> None:
    tasks = _scripted(fixture_tasks)
    first, second = (t.instance_id for t in tasks)
    manifest = _manifest(tmp_path, tasks, parallelism=1)
    results = tmp_path / "results"
    async with ScriptedServer(responder=GoldModel(tasks, slow=frozenset({second}))) as server:
        # SIGKILL leaves the running attempt's sandbox folder behind (nothing can clean up
        # after it) until the next run's first sandbox: keep the runner's sandboxes in this
        # test's own folder, not in /tmp.
        sandboxes = tmp_path / "sandboxes"
        sandboxes.mkdir()
        env = _env(CRL_MODEL_URL=server.url, CRL_MODEL_NAME="scripted", TMPDIR=str(sandboxes))
        command = [
            sys.executable,
            "-m",
            "crl_worker.bench",
            "--config",
            str(manifest),
            "--results",
            str(results),
        ]
        process = await asyncio.create_subprocess_exec(
            *command, cwd=tmp_path, env=env, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            await _wait_for_lines(results / "results.jsonl", 1)
            await _wait_for_request(server, second)  # its sandbox is up: it is mid-attempt
        finally:
            process.kill()  # SIGKILL: no cleanup, as in a node crash
            await process.wait()
        assert process.returncode == -signal.SIGKILL
        (left,) = sandboxes.iterdir()  # the killed attempt's, and it is here
        assert left.name.startswith(f"crl-{second}-")
        before = _lines(results / "results.jsonl")
        assert [r["instance_id"] for r in before] == [first]
        first_started = before[0]["started_at"]

        code, _, err = await _run(*command, cwd=tmp_path, env=env)
        assert code == 0, err
        requests = [r.key for r in server.requests]
        # The next run removed it: its owner was gone.
        assert list(sandboxes.iterdir()) == []
    after = _lines(results / "results.jsonl")
    assert [r["instance_id"] for r in after] == [first, second]
    assert after[0]["started_at"] == first_started
    # The finished attempt's two model calls happened once; the killed one was started over.
    assert requests.count(first) == 2
    assert requests.count(second) >= 2
    summary = json.loads((results / "summary.json").read_text())
    assert (summary["done"], summary["resolved"], summary["finished"]) == (2, 2, True)
    # JSON logs on the runner's standard error.
    assert all(json.loads(line)["level"] for line in err.splitlines() if line.strip())


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_a_stop_signal_ends_the_run_keeps_what_is_written_and_says_how_to_resume(
    tmp_path: Path, fixture_tasks: list[Task], stop: signal.Signals
) -> None:
    # SIGINT is Ctrl-C on a laptop; SIGTERM is what a cluster sends a preempted runner pod.
    tasks = _scripted(fixture_tasks)
    first, second = (t.instance_id for t in tasks)
    manifest = _manifest(tmp_path, tasks, parallelism=1)
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    async with ScriptedServer(responder=GoldModel(tasks, slow=frozenset({second}))) as server:
        process = await asyncio.create_subprocess_exec(
            *_crl("bench", str(manifest), "--url", server.url, "--model", "m"),
            cwd=tmp_path,
            env=_env(TMPDIR=str(sandboxes)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        await _wait_for_lines(tmp_path / "out" / "results.jsonl", 1)
        # The second attempt is waiting for its slow first answer.
        await _wait_for_request(server, second)
        process.send_signal(stop)
        _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 128 + stop
    assert "run the same command again to resume" in err.decode()
    assert list(sandboxes.iterdir()) == []  # the stopped attempt's sandbox closed
    assert [r["instance_id"] for r in _lines(tmp_path / "out" / "results.jsonl")] == [first]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["done"], summary["total"], summary["finished"]) == (1, 2, False)


async def test_usage_errors(tmp_path: Path, fixture_tasks: list[Task]) -> None:
    manifest = _manifest(tmp_path, fixture_tasks)
    code, _, err = await _run(*_crl("bench", str(manifest), "--agent", "openai"), cwd=tmp_path)
    assert code == 2
    for place in ("--url", "--model", "CRL_MODEL_URL", "CRL_MODEL_NAME", "spec.model.endpoint"):
        assert place in err

    code, _, err = await _run(*_crl("bench", str(manifest), "--agent", "gold"), cwd=tmp_path)
    assert code == 0, err
    # Another model into the same folder: refused, nothing is touched.
    code, _, err = await _run(
        *_crl("bench", str(manifest), "--url", "http://127.0.0.1:9/v1", "--model", "other"),
        cwd=tmp_path,
    )
    assert code == 2
    assert "model: gold then, other now" in err and "--restart" in err
    assert len(_lines(tmp_path / "out" / "results.jsonl")) == 2

    code, _, err = await _run(
        *_crl("bench", str(manifest), "--agent", "gold", "--instance", "nope"), cwd=tmp_path
    )
    assert code == 1 and "no instance nope" in err

    # The runner Job's command: a setup error is exit 2 with one JSON error line saying why.
    code, _, err = await _run(
        sys.executable,
        "-m",
        "crl_worker.bench",
        "--config",
        str(manifest),
        "--results",
        str(tmp_path / "out"),
        env=_env(CRL_MODEL_URL="http://127.0.0.1:9/v1", CRL_MODEL_NAME="other"),
        cwd=tmp_path,
    )
    assert code == 2
    logged = [json.loads(x) for x in err.splitlines() if x.strip()]
    (line,) = [x for x in logged if x["level"] == "error"]
    assert "model: gold then, other now" in line["message"] and "--restart" in line["message"]

    # Nobody listens at the URL: refused at once, not after every attempt's retries.
    code, _, err = await _run(
        *_crl(
            "bench",
            str(manifest),
            "--url",
            f"http://127.0.0.1:{_closed_port()}/v1",
            "--model",
            "m",
            "--results",
            str(tmp_path / "elsewhere"),
        ),
        cwd=tmp_path,
    )
    assert code == 2 and "does not answer" in err
    assert not (tmp_path / "elsewhere" / "results.jsonl").exists()


async def test_infrastructure_failures_exit_1_and_are_left_out_of_the_rate(
    tmp_path: Path, fixture_tasks: list[Task]
) -> None:
    roman, calendar = fixture_tasks
    broken = calendar.model_copy(update={"source": str(tmp_path / "no-such-repository")})
    manifest = _manifest(tmp_path, [roman, broken])
    code, out, err = await _run(
        *_crl("bench", str(manifest), "--agent", "gold", "-o", "json"), cwd=tmp_path
    )
    assert code == 1
    assert "infrastructure failures" in err and "retry" in err
    summary = json.loads(out)
    assert (summary["resolved"], summary["unresolved"], summary["errored"]) == (1, 0, 1)
    assert summary["resolveRate"] == 1.0


# --- crl compare ------------------------------------------------------------------------------


def _folder(path: Path, verdicts: dict[str, list[bool | None]]) -> Path:
    path.mkdir()
    with (path / "results.jsonl").open("w") as f:
        for instance, attempts in verdicts.items():
            for attempt, resolved in enumerate(attempts):
                record = {
                    "instance_id": instance,
                    "repo": "o/r",
                    "attempt": attempt,
                    "resolved": resolved,
                    "exit_reason": "submitted" if resolved is not None else "infrastructure_error",
                    "infrastructure_error": None if resolved is not None else "sandbox died",
                }
                f.write(json.dumps(record) + "\n")
    return path


async def test_crl_compare_exit_codes(tmp_path: Path) -> None:
    n = 60
    # The results resolve 40 of 60, the baseline 20 of the same 60 (every one the results
    # resolve too): +33 points, 20 discordant pairs all one way.
    better = _folder(tmp_path / "better", {f"i{i}": [i < 40] for i in range(n)})
    worse = _folder(tmp_path / "worse", {f"i{i}": [i < 20] for i in range(n)})

    code, out, err = await _run(
        *_crl("compare", str(better), str(worse), "--min-improvement", "0.05"), cwd=tmp_path
    )
    assert code == 0, err
    assert "+33.3 points over 60 shared instances" in out
    assert "meets the minimum improvement" in out

    code, out, _ = await _run(
        *_crl("compare", str(worse), str(better), "--min-improvement", "0.05", "-o", "json"),
        cwd=tmp_path,
    )
    assert code == 1
    found = json.loads(out)
    assert found["difference"] == pytest.approx(-1 / 3)
    assert found["meetsMinimumImprovement"] is False
    assert found["mcnemarPValue"] == pytest.approx(2 / 2**20)
    assert (found["discordantResults"], found["discordantBaseline"]) == (0, 20)

    # No minimum asked for: the comparison is reported, the exit code is 0.
    code, _, _ = await _run(*_crl("compare", str(worse), str(better)), cwd=tmp_path)
    assert code == 0

    # An infrastructure failure is no verdict: that instance is not shared.
    partial = _folder(tmp_path / "partial", {"i0": [None], "i1": [True]})
    code, out, _ = await _run(
        *_crl("compare", str(partial), str(worse), "-o", "json"), cwd=tmp_path
    )
    assert code == 0
    assert json.loads(out)["sharedInstances"] == 1

    other = _folder(tmp_path / "other", {"x": [True]})
    code, _, err = await _run(*_crl("compare", str(better), str(other)), cwd=tmp_path)
    assert code == 2 and "share no instance" in err
    code, _, err = await _run(*_crl("compare", str(better), str(tmp_path)), cwd=tmp_path)
    assert code == 2 and "results.jsonl" in err


# --- in the cluster's shape ----------------------------------------------------------------------


async def test_the_runner_job_command_with_a_pool_gateway(
    tmp_path: Path, fixture_tasks: list[Task]
) -> None:
    """`python -m crl_worker.bench` as the operator runs it: its config.yaml, the task file
    mounted apart (--tasks), sandboxes leased from a real pool gateway (local backend), results
    into CRL_RESULTS_DIR."""
    from tests.fixtures.gateway import launch, stop

    manifest = _manifest(tmp_path, fixture_tasks)
    task_file = tmp_path / "tasks.jsonl"
    spec = yaml.safe_load(manifest.read_text())["spec"]
    spec["suite"]["tasks"] = {"format": "task", "configMap": {"name": "suite-tasks"}}
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"apiVersion": "coderepair.io/v1alpha1", "kind": "Benchmark", "name": "b", "spec": spec}
        )
    )
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    gateway = launch(
        [
            *("--tasks", str(task_file), "--format", "task", "--backend", "local"),
            *("--pool", "bench-pool", "--local-root", str(sandboxes)),
        ],
        tmp_path / "gateway.log",
    )
    try:
        results = tmp_path / "volume" / "results"
        code, _, err = await _run(
            sys.executable,
            "-m",
            "crl_worker.bench",
            "--config",
            str(config),
            "--tasks",
            str(task_file),
            "--agent",
            "gold",
            cwd=tmp_path,
            # As the operator starts the runner: the gateway's URL and its token.
            env=_env(
                CRL_POOL_URL=gateway.url, CRL_POOL_TOKEN=gateway.token, CRL_RESULTS_DIR=str(results)
            ),
        )
    finally:
        stop(gateway)
    assert code == 0, err
    lines = _lines(results / "results.jsonl")
    assert [(r["resolved"], r["exit_reason"]) for r in lines] == [(True, "submitted")] * 2
    summary = json.loads((results / "summary.json").read_text())
    assert summary["resolveRate"] == 1.0 and summary["finished"] is True
    # Every lease went back to the pool, and the pool closed its sandboxes on shutdown.
    assert list(sandboxes.iterdir()) == []


def test_a_file_of_native_tasks_replaces_a_suite_of_another_format(tmp_path: Path) -> None:
    """``crl tasks images --out`` writes native tasks for any suite: ``--tasks`` reads such a
    file as native even where the Benchmark's suite says ``polyglot`` (it was refused, every
    record lacking ``exercise``), and a file in the suite's own format as before."""
    from crl_cli.bench import _benchmark, _native_tasks
    from crl_worker.bench.config import BenchTasksError, load_benchmark_tasks
    from crl_worker.tasks.loaders import load_tasks

    manifest = ROOT / "examples" / "local-benchmark-polyglot.yaml"
    suite = ROOT / "examples" / "suites" / "polyglot" / "tasks.jsonl"
    native = tmp_path / "native.jsonl"
    tasks = load_tasks(suite, "polyglot").tasks
    native.write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    config = _benchmark(manifest)
    assert config.spec.suite.tasks.format == "polyglot"
    with pytest.raises(BenchTasksError, match="'exercise': required field is missing"):
        load_benchmark_tasks(config, tasks_file=native)
    as_native = _native_tasks(config, native)
    assert as_native.spec.suite.tasks.format == "task"
    loaded = load_benchmark_tasks(as_native, tasks_file=native)
    assert [t.instance_id for t in loaded] == [t.instance_id for t in tasks]
    assert _native_tasks(config, suite) is config
    assert _native_tasks(config, None) is config
