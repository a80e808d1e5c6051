"""The Sandbox protocol over a pool gateway, and the gateway's configuration."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl_worker.api.contract import Env
from crl_worker.errors import SandboxError
from crl_worker.pool import RemoteSandbox
from crl_worker.pool.__main__ import build_config, parser
from crl_worker.pool.config import read_config_file
from crl_worker.pool.gateway import Gateway
from crl_worker.pool.leases import PoolClosed, SandboxPool, UnknownLease
from crl_worker.pool.metrics import PoolMetrics
from crl_worker.rollout.setup import RolloutSetupError, wait_for_gateway
from crl_worker.sandbox.base import CommandResult, Sandbox
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task

from .fixtures.gateway import TOKEN, GatewayProcess, gateway_client, stop
from .fixtures.paths import ROOT
from .fixtures.ports import free_port

# --- the Sandbox protocol over the gateway ------------------------------------------------------


async def _exercise(sandbox: Sandbox) -> list[Any]:
    """Observable behaviour of a sandbox; a local and a remote one must agree."""
    seen: list[Any] = []

    async def run(command: str, **kwargs: Any) -> None:
        result = await sandbox.run(command, **kwargs)
        seen.append((command, result.exit_code, result.output, result.timed_out, result.truncated))

    await run("true")
    await run("false")
    await run("(exit 42)")
    await run("printf 'no newline'")
    await run("export CRL_X=kept; mkdir -p sub; cd sub")
    await run('echo "$CRL_X $(basename "$PWD")"')
    await run("echo start; sleep 30; echo never", timeout=1)
    await run("echo alive after timeout $CRL_X")
    await run("head -c 5000 /dev/zero | tr '\\0' a", max_output=100)
    await run("echo 'syntax (error'")
    await run("if then fi")
    await sandbox.write_file("sub/binary.dat", b"\x00\xff\xfe\n\r")
    seen.append(await sandbox.read_file("sub/binary.dat"))
    try:
        await sandbox.read_file("does/not/exist")
    except FileNotFoundError:
        seen.append("missing")
    # A path naming a directory is the caller's mistake: an error, and the sandbox goes on.
    try:
        await sandbox.read_file("sub")
    except IsADirectoryError:
        seen.append("directory")
    await run("echo '# change' >> src/romankit/__init__.py")
    seen.append("src/romankit/__init__.py" in await sandbox.diff())
    await sandbox.reset()
    await run('echo "${CRL_X:-gone}"; git status --porcelain')
    seen.append(await sandbox.diff())
    return seen


async def test_remote_sandbox_behaves_like_a_local_one(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task], tmp_path: Path
) -> None:
    gateway = start_gateway("--max-sandboxes", "1", "--warm", "1")
    local = create_sandbox({"type": "local", "root": str(tmp_path / "sandboxes")}, tasks[0])
    async with local:
        expected = await _exercise(local)
    async with gateway_client(gateway) as gw, RemoteSandbox(gw, tasks[0].instance_id) as remote:
        assert remote.alive
        assert remote.workdir.endswith("/testbed")
        observed = await _exercise(remote)
    # Durations differ; everything else is the same, timeouts included.
    assert observed == expected
    timed_out = [entry for entry in observed if isinstance(entry, tuple) and entry[3]]
    assert len(timed_out) == 1
    assert timed_out[0][1] is None
    assert "missing" in observed
    assert "directory" in observed


async def test_remote_sandbox_marks_dirty_and_survives_a_lost_gateway(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "1", "--warm", "1")
    async with gateway_client(gateway) as gw:
        async with RemoteSandbox(gw, tasks[0].instance_id) as sandbox:
            first = sandbox.lease
            sandbox.mark_dirty()
        assert not sandbox.alive
        async with RemoteSandbox(gw, tasks[0].instance_id) as sandbox:
            assert first is not None and sandbox.lease is not None
            assert sandbox.lease.sandbox_id != first.sandbox_id
            with pytest.raises(SandboxError):
                await RemoteSandbox(gw, tasks[0].instance_id, lease_timeout=0.2).start()
        assert gateway.metric("crl_pool_sandboxes_replaced_total", reason="dirty") == 1
    gone = RemoteSandbox("http://127.0.0.1:9", tasks[0].instance_id)
    with pytest.raises(SandboxError, match="did not answer"):
        await gone.start()
    await gone.close()


# --- configuration ------------------------------------------------------------------------------


def test_operator_config_is_accepted(tmp_path: Path, task_file: Path) -> None:
    """The ConfigMap the operator writes for a RolloutPool configures the gateway."""
    from crl_operator.builders.config import config_map
    from crl_worker.api import RolloutPool

    pool = RolloutPool.model_validate(
        {
            "apiVersion": "coderepair.io/v1alpha1",
            "kind": "RolloutPool",
            "metadata": {"name": "swe-pool", "namespace": "team-a"},
            "spec": {
                "tasks": {"path": str(task_file), "format": "swe-bench"},
                "replicas": 3,
                "maxSandboxes": 7,
                "reuse": {"maxUses": 4},
                "prefetch": 5,
                "sandbox": {"startupTimeoutSeconds": 120},
            },
        }
    )
    data = config_map(pool, "team-a")["data"]
    path = tmp_path / "config.yaml"
    path.write_text(next(iter(data.values())))
    fields = read_config_file(path)
    assert fields["pool"] == "swe-pool"
    assert fields["tasks_file"] == task_file
    args = parser().parse_args(["--config", str(path), "--max-uses", "9", "--format", "task"])
    config = build_config(args)
    assert (config.settings.replicas, config.settings.max_sandboxes) == (3, 7)
    assert config.settings.reuse.max_uses == 9  # the flag wins over the file
    assert config.settings.prefetch == 5
    assert config.settings.sandbox.startup_timeout_seconds == 120
    assert config.task_format == "task"
    assert config.sandbox_queue() == (None, None)  # sandboxes stay out of Kueue by default


@pytest.mark.parametrize(
    ("scheduling", "expected"),
    [
        ({"queueName": "team-a"}, (None, None)),  # a queue alone does not count sandboxes
        (
            {"queueName": "team-a", "workloadPriorityClassName": "high", "sandboxesUseQuota": True},
            ("team-a", "high"),
        ),
    ],
)
def test_the_gateway_config_carries_sandboxes_use_quota(
    tmp_path: Path,
    task_file: Path,
    scheduling: dict[str, Any],
    expected: tuple[str | None, str | None],
) -> None:
    """The operator's ConfigMap of a RolloutPool hands its scheduling to the gateway, which
    labels sandbox pods with the queue only with sandboxesUseQuota."""
    from crl_operator.builders.config import config_map
    from crl_worker.api import RolloutPool

    pool = RolloutPool.model_validate(
        {
            "apiVersion": "coderepair.io/v1alpha1",
            "kind": "RolloutPool",
            "metadata": {"name": "swe-pool", "namespace": "team-a"},
            "spec": {"tasks": {"path": str(task_file)}, "scheduling": scheduling},
        }
    )
    path = tmp_path / "config.yaml"
    path.write_text(config_map(pool, "team-a")["data"]["config.yaml"])
    config = build_config(parser().parse_args(["--config", str(path)]))
    assert config.sandbox_queue() == expected


def test_config_errors_are_reported(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump({"kind": "Benchmark", "spec": {}}))
    done = subprocess.run(
        [sys.executable, "-m", "crl_worker.pool", "--config", str(wrong)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "KUBERNETES_SERVICE_HOST": ""},
        timeout=60,
    )
    assert done.returncode == 2
    assert "kind is 'Benchmark'" in done.stderr
    too_warm = subprocess.run(
        [sys.executable, "-m", "crl_worker.pool", "--warm", "5", "--max-sandboxes", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert too_warm.returncode == 2
    assert "exceeds maxSandboxes" in too_warm.stderr


async def test_an_operation_queued_behind_the_release_never_reaches_the_sandbox(
    tmp_path: Path, tasks: list[Task]
) -> None:
    # In process: the window (a request scheduled in the same event-loop turn as the release)
    # cannot be hit on purpose over HTTP.
    local = LocalSandboxConfig(root=str(tmp_path / "sandboxes"))
    pool = SandboxPool(
        tasks,
        lambda task, _sandbox_id: create_sandbox(local, task),
        metrics=PoolMetrics("race-pool"),
        max_sandboxes=1,
        warm=1,
    )
    instance = tasks[0].instance_id
    try:
        lease = await pool.acquire(instance, timeout=60)
        record = pool.lease(lease.lease_id)
        ran: list[str] = []

        async def stray(sandbox: Sandbox) -> CommandResult:
            ran.append("stray")
            return await sandbox.run("touch stray-file")

        queued = asyncio.ensure_future(record.call(stray))  # scheduled, not started yet
        assert (await pool.release(lease.lease_id)).action == "reuse"
        with pytest.raises(UnknownLease):
            await queued
        assert ran == []

        async def look(sandbox: Sandbox) -> CommandResult:
            return await sandbox.run("ls stray-file")

        again = await pool.acquire(instance, timeout=60)
        assert again.sandbox_id == lease.sandbox_id
        assert (await pool.lease(again.lease_id).call(look)).exit_code != 0
    finally:
        await pool.close()


async def test_a_release_that_outlives_the_shutdown_answers_close(
    tmp_path: Path, tasks: list[Task]
) -> None:
    # The release waits for the running command; the gateway shuts down meanwhile. The slot
    # is closed by then: no reset or replacement is started for it, and the answer says so.
    root = tmp_path / "sandboxes"
    local = LocalSandboxConfig(root=str(root))
    pool = SandboxPool(
        tasks,
        lambda task, _sandbox_id: create_sandbox(local, task),
        metrics=PoolMetrics("shutdown-pool"),
        max_sandboxes=1,
        warm=1,
    )
    lease = await pool.acquire(tasks[0].instance_id, timeout=60)
    record = pool.lease(lease.lease_id)

    async def slow(sandbox: Sandbox) -> CommandResult:
        return await sandbox.run("sleep 1")

    running = asyncio.ensure_future(record.call(slow))
    await asyncio.sleep(0.2)
    release = asyncio.ensure_future(pool.release(lease.lease_id))  # waits for the command
    await asyncio.sleep(0.1)
    await pool.close()
    with contextlib.suppress(SandboxError):  # the close may cut the command short
        await running
    response = await release
    assert (response.action, response.reason) == ("close", "shutting-down")
    assert list(root.iterdir()) == []


async def test_a_gateway_that_cannot_listen_releases_what_it_made(
    tmp_path: Path, task_file: Path, tasks: list[Task]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ["--tasks", str(task_file), "--format", "task", "--backend", "local"]
        flags += ["--pool", "busy-port", "--host", "127.0.0.1", "--port", str(port)]
        flags += ["--local-root", str(tmp_path / "sandboxes")]
        args = parser().parse_args(flags)
        gateway = Gateway(build_config(args), tasks)
        with pytest.raises(OSError):
            await gateway.start()
    # The pool was closed with the failed start: its maintenance task is not left running.
    assert gateway.pool is not None
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "pool-maintenance"]
    with pytest.raises(PoolClosed):
        await gateway.pool.acquire(tasks[0].instance_id, timeout=1)


async def test_a_runner_waits_for_a_gateway_that_is_still_starting(
    task_file: Path, tmp_path: Path
) -> None:
    """In a cluster the runner starts with its pool: it waits for the gateway's /healthz
    instead of failing its first attempts, and gives up with a clear error after its timeout."""
    port = free_port()
    waiting = asyncio.create_task(wait_for_gateway(f"http://127.0.0.1:{port}", timeout=90))
    await asyncio.sleep(1.0)
    assert not waiting.done()  # nothing listens yet: still waiting
    (tmp_path / "sandboxes").mkdir()
    argv = [sys.executable, "-m", "crl_worker.pool", "--port", str(port), "--tasks",
            str(task_file), "--format", "task", "--backend", "local", "--pool", "late",
            "--local-root", str(tmp_path / "sandboxes")]  # fmt: skip
    env = {**os.environ, Env.POOL_TOKEN: TOKEN}
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    gateway = GatewayProcess(process, f"http://127.0.0.1:{port}", tmp_path / "unused.log")
    try:
        await asyncio.wait_for(waiting, timeout=90)
    finally:
        stop(gateway)
    with pytest.raises(RolloutSetupError, match="did not come up in 1 s"):
        await wait_for_gateway(f"http://127.0.0.1:{free_port()}", timeout=1)
