"""Local sandboxes against a hostile agent: secrets of the worker, processes that get away,
leftover folders, the PATH (docs/security.md, "Local isolation").

The worker whose secrets are at stake is a separate Python process started with them in its
environment from the start (``/proc/PID/environ`` shows a process's initial environment, so a
variable set inside the test process would prove nothing).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crl_worker.errors import SandboxError
from crl_worker.sandbox import isolation
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.local import LocalSandbox
from crl_worker.sandbox.transport import default_interrupts
from crl_worker.tasks.model import Task, TestSpec
from tests.fixtures.local_sandbox import (
    GOLD_PATCH,
    host_pids,
    make_repo,
    python_task,
    until_host_pids,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET = "sk-canary-" + os.urandom(8).hex()

#: A worker in a process of its own: runs each command of argv[3:] in one local sandbox (``@diff``:
#: computes the diff, as the harness does at the end) and prints the outputs as a JSON list.
WORKER = """
import asyncio, json, sys
from crl_worker.sandbox import isolation
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.local import LocalSandbox
from crl_worker.tasks.model import Task

async def main():
    task = Task.model_validate_json(sys.argv[1])
    config = LocalSandboxConfig.model_validate_json(sys.argv[2])
    async with LocalSandbox(config, task) as sandbox:
        outputs = [
            await sandbox.diff() if command == "@diff" else (await sandbox.run(command)).output
            for command in sys.argv[3:]
        ]
    print(json.dumps(outputs))

asyncio.run(main())
"""

#: A worker that runs argv[3] in a sandbox, says ``ready`` and waits to be killed.
HOLD = """
import asyncio, sys
from crl_worker.sandbox import isolation
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.local import LocalSandbox
from crl_worker.tasks.model import Task

async def main():
    task = Task.model_validate_json(sys.argv[1])
    config = LocalSandboxConfig.model_validate_json(sys.argv[2])
    async with LocalSandbox(config, task) as sandbox:
        await sandbox.run(sys.argv[3])
        await asyncio.sleep(0.2)
        print(sandbox.root, flush=True)
        await asyncio.sleep(300)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    path = tmp_path_factory.mktemp("calc")
    yield path, make_repo(path)


def plain_task(repo: tuple[Path, str]) -> Task:
    """A task with no environment to build (fast): the repository and a shell."""
    return python_task(*repo, install=[], language="other")


def run_worker(task: Task, config: LocalSandboxConfig, *commands: str) -> list[str]:
    """Run ``commands`` in a sandbox of a worker process holding :data:`SECRET` in its
    environment under the names real API keys have."""
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "HF_TOKEN": SECRET, "CRL_API_KEY": SECRET}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            WORKER,
            task.model_dump_json(),
            config.model_dump_json(exclude_defaults=True),
            *commands,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    outputs: list[str] = json.loads(done.stdout)
    return outputs


SNOOP = [
    # the reproduction: the parent's environment
    "tr '\\0' '\\n' </proc/$PPID/environ",
    # every process the sandbox can see, and their command lines
    "for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; done 2>/dev/null",
    # the shell's own environment
    "env",
]


async def test_the_workers_secrets_are_out_of_reach(repo: tuple[Path, str], tmp_path: Path) -> None:
    config = LocalSandboxConfig(root=str(tmp_path))
    outputs = run_worker(plain_task(repo), config, *SNOOP, "ps -e -o pid=,comm=")
    for output in outputs[:3]:
        assert SECRET not in output
    # ps works, and sees the sandbox's processes only: the shell (process 1) and ps itself
    processes = [line.split() for line in outputs[3].splitlines()]
    assert ["1", "bash"] in processes and len(processes) <= 3, outputs[3]


async def test_without_isolation_the_secrets_are_readable(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """The weaker guarantee of ``isolation: none``, stated as a test so the docs stay true."""
    config = LocalSandboxConfig(root=str(tmp_path), isolation="none")
    outputs = run_worker(plain_task(repo), config, *SNOOP)
    assert SECRET in outputs[0]
    assert SECRET not in outputs[2]  # the shell's own environment is still built, not inherited


DETACH = (
    # fork, setsid, fork: the daemon dance; the marker finds it on the host
    "(setsid sh -c 'sh -c \"sleep 300; :\" {marker} & :' &); "
    # and one that keeps the session's standard output open
    "(setsid sh -c 'sleep 300; :' {marker}-out &); echo detached"
)


async def test_detached_processes_die_when_the_sandbox_closes(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    marker = f"crl-detached-{os.urandom(4).hex()}"
    sandbox = LocalSandbox(LocalSandboxConfig(root=str(tmp_path)), plain_task(repo))
    async with sandbox:
        result = await sandbox.run(DETACH.format(marker=marker))
        assert result.output == "detached\n"
        assert len(await until_host_pids(marker, 2)) >= 2
        # a reset ends them too (a fresh session)
        await sandbox.reset()
        assert host_pids(marker) == []
        await sandbox.run(DETACH.format(marker=marker))
        assert len(await until_host_pids(marker, 2)) >= 2
        started = time.monotonic()
    assert host_pids(marker) == []
    assert time.monotonic() - started < 5


async def test_a_killed_worker_takes_its_sandboxes_processes_along(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    marker = f"crl-orphan-{os.urandom(4).hex()}"
    config = LocalSandboxConfig(root=str(tmp_path))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLD,
            plain_task(repo).model_dump_json(),
            config.model_dump_json(exclude_defaults=True),
            DETACH.format(marker=marker),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        root = Path(worker.stdout.readline().strip())
        assert root.is_dir()
        # the worker's own command line holds the marker too: 3
        assert len(await until_host_pids(marker, 3)) >= 3
        worker.kill()
        worker.wait()
        deadline = time.monotonic() + 5
        while host_pids(marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert host_pids(marker) == []
    finally:
        worker.kill()
        worker.wait()


async def test_path_holds_no_host_tool_directory(repo: tuple[Path, str], tmp_path: Path) -> None:
    sandbox = LocalSandbox(LocalSandboxConfig(root=str(tmp_path)), plain_task(repo))
    async with sandbox:
        path = (await sandbox.run('printf %s "$PATH"')).output.split(":")
        assert path == [f"{sandbox.root}/tools", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        # the worker's own interpreter (its virtual environment) is not reachable by name
        worker_bin = str(Path(sys.executable).parent)
        assert worker_bin not in path
        found = await sandbox.run(f"command -v {Path(sys.executable).name} || echo none")
        assert not found.output.startswith(worker_bin)


async def test_isolation_required_but_unavailable_is_an_error(
    repo: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crl_worker.sandbox import isolation

    monkeypatch.setattr(isolation, "namespace_candidates", lambda: [])
    sandbox = LocalSandbox(
        LocalSandboxConfig(root=str(tmp_path), isolation="namespaces"), plain_task(repo)
    )
    with pytest.raises(SandboxError, match="unshare"):
        await sandbox.start()
    assert not any(tmp_path.iterdir())
    # auto: the sandbox runs without, and says so
    sandbox = LocalSandbox(LocalSandboxConfig(root=str(tmp_path)), plain_task(repo))
    async with sandbox:
        assert (await sandbox.run("echo $$")).output.strip() != "1"


def folders(root: Path) -> list[Path]:
    return sorted(path for path in root.iterdir() if path.name.startswith("crl-"))


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGINT"])
async def test_folders_of_a_stopped_worker_are_gone_by_the_next_start(
    repo: tuple[Path, str], tmp_path: Path, sig: str
) -> None:
    config = LocalSandboxConfig(root=str(tmp_path))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLD,
            plain_task(repo).model_dump_json(),
            config.model_dump_json(exclude_defaults=True),
            "echo hi",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        # as a worker started from a terminal: SIGINT at its default even when pytest itself
        # was started in the background with it ignored
        preexec_fn=default_interrupts,
    )
    try:
        assert worker.stdout is not None
        left = Path(worker.stdout.readline().strip())
        assert folders(tmp_path) == [left]
        worker.send_signal(getattr(signal, sig))
        worker.wait(timeout=30)
    finally:
        worker.kill()
        worker.wait()
    # a folder in use, and one kept on purpose, stay
    async with LocalSandbox(config, plain_task(repo)) as busy:
        kept = LocalSandbox(config.model_copy(update={"keep": True}), plain_task(repo))
        async with kept:
            pass
        async with LocalSandbox(config, plain_task(repo)) as fresh:
            assert folders(tmp_path) == sorted([busy.root, kept.root, fresh.root])
    assert folders(tmp_path) == [kept.root]


@pytest.mark.parametrize("mode", ["auto", "none"])
async def test_a_detached_process_does_not_stall_the_workers_exit(
    repo: tuple[Path, str], tmp_path: Path, mode: str
) -> None:
    """Before: closing waited 10 s for the shell's output pipe, which the detached process
    held, and the interpreter's exit printed 'Event loop is closed'."""
    marker = f"crl-stall-{os.urandom(4).hex()}"
    extra = {} if mode == "auto" else {"isolation": mode}
    config = LocalSandboxConfig.model_validate({"root": str(tmp_path), **extra})
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            WORKER,
            plain_task(repo).model_dump_json(),
            config.model_dump_json(exclude_defaults=True),
            DETACH.format(marker=marker) + "; sleep 0.3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    # without namespaces they survive (give them time to show): killed here
    survivors = await until_host_pids(marker, 2, timeout=3) if mode == "none" else host_pids(marker)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["detached\n"]
    assert "Event loop is closed" not in done.stderr
    assert "did not exit" not in done.stderr
    # A stall waits for the detached sleeps (300 s; the run's 60 s timeout first): 30 s tells
    # them apart with room for a loaded machine (it took 6.4 s beside a CI run).
    assert elapsed < 30
    if mode == "auto":
        assert survivors == []


async def test_sigterm_stops_crl_tasks_check_and_cleans_up(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """``crl tasks check`` stopped by SIGTERM (a CI job cancelled, a pod deleted): its
    sandboxes close — no folder left, nothing running — and it exits with 143."""
    marker = f"crl-check-{os.urandom(4).hex()}"
    task = python_task(
        *repo,
        install=[],
        language="other",
        patch=GOLD_PATCH,
        fail_to_pass=["tests/test_calc.py::test_add"],
        test=TestSpec(
            command=f"sh -c 'sleep 120; :' {marker}; echo {{tests}}", log_format="pytest"
        ),
    )
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(task.model_dump_json() + "\n")
    root = tmp_path / "sandboxes"
    sandbox = json.dumps({"type": "local", "root": str(root)})
    command = [sys.executable, "-m", "crl_cli", "tasks", "check", str(task_file)]
    cli = subprocess.Popen(
        [*command, "--sandbox", sandbox], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while not host_pids(marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert host_pids(marker), "the test command never started"
        assert len(folders(root)) == 1
        cli.send_signal(signal.SIGTERM)
        code = cli.wait(timeout=30)
    finally:
        cli.kill()
        _, stderr = cli.communicate()
        for pid in host_pids(marker):
            os.kill(pid, signal.SIGKILL)
    assert code == 143, stderr.decode(errors="replace")[-2000:]
    assert folders(root) == []


async def test_the_host_shell_is_found_by_parent_pid_too(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """The fallback for kernels without ``/proc/PID/task/PID/children``."""
    from crl_worker.sandbox import transport

    sandbox = LocalSandbox(LocalSandboxConfig(root=str(tmp_path)), plain_task(repo))
    async with sandbox:
        started = sandbox.transport.pid
        assert started is not None and sandbox.shell_pid not in (None, started)
        assert transport._children(started) == [sandbox.shell_pid]
        assert (await sandbox.run("echo $$")).output == "1\n"


#: A git clean filter that records the environment it runs with, its own and its parent's.
FILTER = r"""cat > ../filter.sh <<'EOF'
#!/bin/sh
{ env; tr '\0' '\n' < /proc/$PPID/environ; } >> "$(dirname "$0")/leak" 2>/dev/null
cat
EOF
chmod +x ../filter.sh && git config filter.crl.clean "$PWD/../filter.sh" &&
echo '*.py filter=crl' > .gitattributes && echo 'x = 1' >> calc/__init__.py && echo armed"""


async def test_git_run_by_the_harness_does_not_hand_the_agent_the_workers_secrets(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """The diff (and snapshot, reset) scripts run git in the agent's repository, whose
    configuration the agent writes: a clean filter runs whatever it names. Before, that ran
    with the worker's environment, secrets included, outside any namespace."""
    config = LocalSandboxConfig(root=str(tmp_path))
    outputs = run_worker(plain_task(repo), config, FILTER, "@diff", "cat ../leak")
    assert outputs[0] == "armed\n"
    assert "x = 1" in outputs[1]
    assert "PATH=" in outputs[2]  # the filter ran
    assert SECRET not in outputs[2]


async def test_a_network_namespace_that_fails_is_an_error_only_when_namespaces_are_required(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Where `unshare --net` fails (a container without the capability), `isolation: auto` keeps
    # the network with a warning; `isolation: namespaces` promised no network: an error.
    async def failing(argv: list[str], check: str, what: str) -> str | None:
        return f"{what} failed: Operation not permitted"

    monkeypatch.setattr(isolation, "_trial", failing)
    monkeypatch.setattr(isolation, "_offline_probed", {})
    monkeypatch.setattr(isolation, "_offline_warned", False)
    prefix = ["unshare", "--pid", "--fork", "--"]
    with pytest.raises(SandboxError, match="isolation 'namespaces' is required"):
        await isolation.can_go_offline(prefix, "namespaces", name="box")
    with caplog.at_level("WARNING", logger=isolation.__name__):
        assert await isolation.can_go_offline(prefix, "auto", name="box") is False
    assert any("keep the host's network" in r.message for r in caplog.records)
