"""The Docker backend against a real engine (tests/fixtures/docker.py): containers, the exec
session, files as tar, reset and diff in a container, timeouts signalled by a second exec,
containers and engines that die, images that are missing, sockets that refuse.

The sandbox image is a real repository (``calendarkit``, tests/fixtures/repos.py) copied to
``/testbed`` on the Debian base image the fixtures build from Debian packages; its unittest
suite runs in the container as a harness would run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from crl_worker.api.contract import DOCKER_SANDBOX_LABEL
from crl_worker.errors import SandboxError
from crl_worker.sandbox.config import DockerSandboxConfig
from crl_worker.sandbox.docker import DockerSandbox
from crl_worker.tasks.model import Task, TestSpec

from .fixtures.docker import SANDBOX_PACKAGES as BASE_PACKAGES
from .fixtures.docker import (
    DockerEngine,
    EngineError,
    EngineProcess,
    debian_image,
    running_engine,
)
from .fixtures.processes import processes_using
from .fixtures.repos import FixtureRepo, unittest_repo

WORKDIR = "/testbed"
#: Label of the images the fixtures build (so that their old builds can be pruned).
FIXTURE_LABEL = "io.coderepair.test-fixture"
#: prctl(2): the calling process adopts its orphaned descendants.
PR_SET_CHILD_SUBREAPER = 36
#: prctl(2): drop a capability from the bounding set; capabilities(7) numbers.
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def calendar(tmp_path_factory: pytest.TempPathFactory) -> FixtureRepo:
    return unittest_repo(tmp_path_factory.mktemp("calendar"), python="python3")


@pytest.fixture(scope="module")
def image(docker_engine: DockerEngine, docker_base: str, calendar: FixtureRepo) -> str:
    """An image of the base with calendarkit at /testbed (built in well under a second)."""
    context = calendar.path.parent
    (context / "Dockerfile").write_text(
        f"FROM {docker_base}\nCOPY {calendar.path.name} {WORKDIR}\nWORKDIR {WORKDIR}\n"
        f"LABEL {FIXTURE_LABEL}=calendarkit\n"
    )
    tag = "crl-test/calendarkit:sandbox"
    built = docker_engine.cli("build", "-q", "-t", tag, str(context))
    assert built.returncode == 0, built.stderr
    # each session's build replaces the last one's (the repository's files are new): the
    # untagged ones would pile up in the cached data root
    docker_engine.cli("image", "prune", "--force", "--filter", f"label={FIXTURE_LABEL}")
    return tag


def docker_task(calendar: FixtureRepo, image: str) -> Task:
    return calendar.task.model_copy(
        update={
            "image": image,
            "source": None,
            "test": TestSpec(command="python3 -m unittest -v {tests}", log_format="unittest"),
        }
    )


def config(engine: DockerEngine, **changes: object) -> DockerSandboxConfig:
    settings: dict[str, object] = {"base_url": engine.host, "pull": "never"}
    return DockerSandboxConfig.model_validate({**settings, **changes})


@pytest.fixture
async def sandbox(
    docker_engine: DockerEngine, calendar: FixtureRepo, image: str
) -> AsyncIterator[DockerSandbox]:
    async with DockerSandbox(config(docker_engine), docker_task(calendar, image)) as started:
        yield started


def sandbox_containers(engine: DockerEngine) -> list[str]:
    client = engine.client()
    try:
        found = client.containers.list(all=True, filters={"label": DOCKER_SANDBOX_LABEL})
        return [c.id for c in found]
    finally:
        client.close()


# --- the session, files, reset, diff --------------------------------------------------------------


async def test_session_runs_in_the_container(sandbox: DockerSandbox) -> None:
    assert sandbox.container is not None
    assert (await sandbox.run("pwd; cat /etc/debian_version")).output.startswith(f"{WORKDIR}\n12.")
    await sandbox.run("cd calendarkit; export KEPT=1")
    after = await sandbox.run("echo $KEPT; basename $PWD; exit_code_test() { return 7; }")
    assert after.output == "1\ncalendarkit\n"
    assert (await sandbox.run("exit_code_test")).exit_code == 7
    exact = await sandbox.run("printf 'a\\0b\\xff no newline'; echo err >&2")
    assert exact.output == "a\x00b\ufffd no newlineerr\n"
    assert (await sandbox.run("git status --porcelain")).output == ""
    # The default network: none, only the loopback interface (the task's install ran at build).
    sandbox.container.reload()
    assert sandbox.container.attrs["HostConfig"]["NetworkMode"] == "none"
    assert (await sandbox.run("ls /sys/class/net")).output.split() == ["lo"]


async def test_files_travel_as_tar(sandbox: DockerSandbox) -> None:
    data = bytes(range(256)) * 64
    await sandbox.write_file("deep/new/blob.bin", data)
    assert await sandbox.read_file("deep/new/blob.bin") == data
    assert await sandbox.read_file(f"{WORKDIR}/deep/new/blob.bin") == data
    digest = await sandbox.run("sha256sum deep/new/blob.bin | cut -c1-16")
    assert digest.exit_code == 0 and len(digest.output.strip()) == 16
    await sandbox.run("chmod 755 deep/new/blob.bin; ln -s deep/new/blob.bin link")
    await sandbox.write_file("deep/new/blob.bin", b"#!/bin/sh\necho run\n")
    assert (await sandbox.run("./deep/new/blob.bin")).output == "run\n"  # mode kept
    assert await sandbox.read_file("link") == b"#!/bin/sh\necho run\n"  # symlink followed
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("no/such/file")
    with pytest.raises(IsADirectoryError):
        await sandbox.read_file("deep")


async def test_reset_and_diff_in_the_container(
    sandbox: DockerSandbox, calendar: FixtureRepo
) -> None:
    head = (await sandbox.run("git rev-parse HEAD")).output
    # the harness's steps, in the container: test patch, failing tests, gold patch, passing
    await sandbox.write_file("/tmp/test.patch", calendar.task.test_patch.encode())
    await sandbox.write_file("/tmp/gold.patch", calendar.task.patch.encode())
    assert (await sandbox.run("git apply /tmp/test.patch")).exit_code == 0
    failing = await sandbox.run("python3 -m unittest tests.test_dates 2>&1 | tail -1")
    assert failing.output.startswith("FAILED"), failing.output
    assert (await sandbox.run("git apply /tmp/gold.patch")).exit_code == 0
    passing = await sandbox.run("python3 -m unittest tests.test_dates")
    assert passing.exit_code == 0, passing.output
    diff = await sandbox.diff()
    for patch in (calendar.task.patch, calendar.task.test_patch):
        for line in patch.splitlines():
            if line.startswith("+++ "):
                assert line in diff
    mess = (
        "echo new > untracked.txt; git add -A; git -c user.name=a -c user.email=a@b commit -qm x;"
        " git checkout -qb agent; sleep 300 & cd calendarkit; export SECRET=1"
    )
    assert (await sandbox.run(mess)).exit_code == 0
    started = time.monotonic()
    await sandbox.reset()
    assert time.monotonic() - started < 5
    assert (await sandbox.run("git rev-parse HEAD")).output == head
    assert (await sandbox.run('pwd; echo "[$SECRET]"')).output == f"{WORKDIR}\n[]\n"
    status = await sandbox.run("git status --porcelain --untracked-files=all; git branch")
    assert status.output == "* main\n"  # the image's branch; the agent's is gone
    assert await sandbox.diff() == ""
    # the session's background job ended with it
    assert (await sandbox.run("grep -lx sleep /proc/[0-9]*/comm || echo none")).output == "none\n"


# --- timeouts: signals through a second exec ----------------------------------------------------


async def test_timeouts_interrupt_the_command_not_the_session(sandbox: DockerSandbox) -> None:
    await sandbox.run("export KEPT=1")
    started = time.monotonic()
    result = await sandbox.run("echo before; sleep 100", timeout=1)
    assert result.timed_out and result.exit_code is None and result.output == "before\n"
    assert time.monotonic() - started < 3
    assert (await sandbox.run("while :; do :; done", timeout=0.5)).timed_out
    # a command that ignores SIGINT gets SIGKILL after interrupt_grace
    stubborn = await sandbox.run("bash -c \"trap '' INT; echo stubborn; sleep 100\"", timeout=0.5)
    assert stubborn.timed_out and stubborn.output == "stubborn\n"
    assert time.monotonic() - started < 8
    assert (await sandbox.run("echo $KEPT")).output == "1\n"
    # the container's init was never signalled: the sandbox still runs
    assert sandbox.alive and (await sandbox.run("echo ok")).output == "ok\n"


# --- lifecycle and failures ---------------------------------------------------------------------


async def test_close_removes_the_container(
    docker_engine: DockerEngine, calendar: FixtureRepo, image: str
) -> None:
    before = set(sandbox_containers(docker_engine))
    sandbox = DockerSandbox(config(docker_engine), docker_task(calendar, image))
    started = time.monotonic()
    await sandbox.start()
    assert time.monotonic() - started < 10
    assert sandbox.container is not None and sandbox.container.id not in before
    assert sandbox.container.id in sandbox_containers(docker_engine)
    await sandbox.close()
    await sandbox.close()  # twice is fine
    assert set(sandbox_containers(docker_engine)) == before


async def test_container_killed_from_outside(sandbox: DockerSandbox) -> None:
    assert sandbox.container is not None
    await asyncio.to_thread(sandbox.container.kill)
    with pytest.raises(SandboxError):
        await asyncio.wait_for(sandbox.run("echo hi"), 10)
    assert not sandbox.alive
    with pytest.raises(SandboxError):
        await asyncio.wait_for(sandbox.reset(), 10)


async def test_missing_image_is_a_clear_error(
    docker_engine: DockerEngine, calendar: FixtureRepo
) -> None:
    task = docker_task(calendar, "crl-test/no-such-image:1")
    with pytest.raises(SandboxError, match="not in the engine and pull=never"):
        await DockerSandbox(config(docker_engine), task).start()
    # pulled from a registry this machine cannot reach: an error at once, not a wait
    started = time.monotonic()
    with pytest.raises(SandboxError, match=r"cannot pull crl-test/no-such-image:1 \(pull=missing"):
        await DockerSandbox(config(docker_engine, pull="missing"), task).start()
    assert time.monotonic() - started < 30


class SilentRegistry:
    """A registry address that accepts connections and never answers, until :meth:`close`."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.accepted: list[socket.socket] = []
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.closing.is_set():
            with contextlib.suppress(TimeoutError):
                self.accepted.append(self.server.accept()[0])

    def close(self) -> None:
        """Stop accepting and drop every connection (a waiting pull then fails)."""
        self.closing.set()
        self.thread.join()
        for conn in self.accepted:
            conn.close()
        self.server.close()


async def test_a_pull_that_never_answers_ends_at_the_start_timeout(
    docker_engine: DockerEngine, calendar: FixtureRepo
) -> None:
    registry = SilentRegistry()
    try:
        task = docker_task(calendar, f"{registry.address}/crl/never:1")
        sandbox = DockerSandbox(config(docker_engine, pull="missing", start_timeout=2), task)
        started = time.monotonic()
        with pytest.raises(SandboxError, match="starting took more than 2 s"):
            await sandbox.start()
        assert time.monotonic() - started < 5
        assert not sandbox.alive
    finally:
        registry.close()  # the pull still waiting in its thread fails now


def _without_file_permission_override() -> None:
    """In the child before exec: root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so
    file permissions apply to it as to any user (dropped from the bounding set, which is what
    root's capabilities come from at exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_socket_without_permission_is_one_clear_message(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    # The engine's socket behind a folder this client may not enter: the EACCES of a user
    # outside the socket's group, without touching the shared engine's socket.
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "docker.sock").symlink_to(docker_engine.socket_path)
    locked.chmod(0)
    probe = (
        "import asyncio, sys\n"
        "from crl_worker.sandbox.config import DockerSandboxConfig\n"
        "from crl_worker.sandbox.docker import DockerSandbox\n"
        "from crl_worker.tasks.model import Task, TestSpec\n"
        "task = Task(instance_id='a__b-1', repo='a/b', base_commit='0' * 40, image='x',\n"
        "            test=TestSpec(command='true', log_format='pytest'))\n"
        "sandbox = DockerSandbox(DockerSandboxConfig(base_url=sys.argv[1]), task)\n"
        "try:\n"
        "    asyncio.run(sandbox.start())\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
    )
    address = f"unix://{locked / 'docker.sock'}"
    done = subprocess.run(
        [sys.executable, "-c", probe, address],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_without_file_permission_override,
        check=False,
    )
    locked.chmod(0o700)
    assert done.stdout.startswith(
        f"permission denied on the Docker engine's socket at {address}: this user may not use it"
    ), done.stdout + done.stderr


@contextmanager
def reaping(pids: set[int]) -> Iterator[None]:
    """Make this process the subreaper of its orphaned descendants (this machine's PID 1 reaps
    nothing) and reap ``pids`` as they exit, until the block ends; only those pids are waited
    for, so the test's other children keep their exit statuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stop = threading.Event()

    def reap() -> None:
        while not stop.is_set() or pids:
            for pid in list(pids):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        pids.discard(pid)
                except ChildProcessError:
                    # still another process's child (it becomes ours when orphaned), or gone
                    if not Path(f"/proc/{pid}").exists():
                        pids.discard(pid)
            time.sleep(0.05)
            if stop.is_set() and time.monotonic() > deadline:
                return

    deadline = float("inf")
    thread = threading.Thread(target=reap, daemon=True)
    thread.start()
    try:
        yield
    finally:
        deadline = time.monotonic() + 30
        stop.set()
        thread.join()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def restart_adopting_containerd(process: EngineProcess, attempts: int = 3) -> None:
    """Start dockerd again on the roots its killed predecessor left.

    containerd died with that dockerd (its parent-death signal), the container's shim lives on;
    the new dockerd starts a containerd that reconnects to the shim and gives it 15 s to answer,
    exiting otherwise. On a loaded machine (CI's load average reaches 20 on two cores) that can
    miss, so dockerd is started again when, and only when, it gave up on containerd."""
    for attempt in range(1, attempts + 1):
        try:
            process.start()
            return
        except EngineError as error:
            if "timeout waiting for containerd" not in str(error) or attempt == attempts:
                raise
            log.warning("dockerd gave up waiting for containerd (try %d); again", attempt)


async def test_engine_that_dies_mid_run(
    tmp_path: Path, docker_base: str, calendar: FixtureRepo, image: str
) -> None:
    """dockerd SIGKILLed under a running session: the session ends with a SandboxError, close()
    returns at once; an engine restarted on the same roots then cleans the container up."""
    # An engine of its own (the session's is shared), its images imported from the cache.
    state, data = tmp_path / "engine", tmp_path / "data"
    orphans: set[int] = set()
    with reaping(orphans), running_engine(state, data_root=data) as process:
        engine = process.engine
        base = debian_image(engine, BASE_PACKAGES)
        assert base == docker_base
        context = calendar.path.parent
        built = engine.cli("build", "-q", "-t", "crl-test/dying:1", str(context))
        assert built.returncode == 0, built.stderr
        sandbox = DockerSandbox(config(engine), docker_task(calendar, "crl-test/dying:1"))
        await sandbox.start()
        assert (await sandbox.run("echo up")).output == "up\n"
        # containerd and the shims outlive dockerd: reaped here once they end
        dockerd = {process.dockerd_pid, process.proc.pid if process.proc else None}
        orphans |= {pid for pid, _ in processes_using(str(process.exec_root))} - dockerd
        assert orphans, "containerd runs beside dockerd"
        process.kill_dockerd()
        started = time.monotonic()
        with pytest.raises(SandboxError):
            await sandbox.run("echo hi", timeout=5)
        assert not sandbox.alive
        await sandbox.close()  # the engine is gone: a logged warning, no hang
        assert time.monotonic() - started < 10
        # The same roots again: a new containerd reconnects to the shim, dockerd stops the
        # container; the fixture's stop removes it and ends containerd.
        restart_adopting_containerd(process)
    assert not orphans, f"not reaped: {orphans}"
    assert not processes_using(str(process.exec_root))


def test_base_image_is_cached_by_content(docker_engine: DockerEngine, docker_base: str) -> None:
    assert docker_engine.has_image(docker_base)
    started = time.monotonic()
    assert debian_image(docker_engine, BASE_PACKAGES) == docker_base
    assert time.monotonic() - started < 5
    tools = docker_engine.cli(
        "run", "--rm", "--network", "none", docker_base, "sh", "-c", "git --version; python3 -V"
    )
    assert tools.returncode == 0 and "git version" in tools.stdout and "Python 3." in tools.stdout
