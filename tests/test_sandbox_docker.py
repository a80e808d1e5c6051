"""The Docker backend's parts that need no engine (tests/test_sandbox_docker_engine.py runs it
against a real one).

Checked here: config validation, the tar packing and unpacking that files travel in, the
demultiplexing of Docker's exec stream, the shell session over such a stream (a real bash whose
output a small helper process frames exactly as Docker does), the out-of-band signalling a
remote backend uses (including a shell that does not lead its process group, as in a container),
and the error when no engine answers.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from crl_worker.errors import SandboxError
from crl_worker.sandbox.config import DockerSandboxConfig, LocalSandboxConfig, SandboxConfig
from crl_worker.sandbox.docker import (
    OWNER_SCRIPT,
    DemuxReader,
    DockerSandbox,
    DockerTransport,
    pack_file,
    parse_owner,
    unpack_entry,
)
from crl_worker.sandbox.registry import BACKENDS, create_sandbox
from crl_worker.sandbox.session import (
    SHELL_ARGV,
    ShellProcess,
    ShellSession,
    remote_signal_script,
)
from crl_worker.tasks.model import Task, TestSpec

TASK = Task(
    instance_id="astropy__astropy-12907",
    repo="astropy/astropy",
    base_commit="d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    image="swebench/sweb.eval.x86_64.{instance_id}:latest",
    test=TestSpec(command="pytest -rA {tests}", log_format="pytest"),
)

#: Runs bash and frames its stdout/stderr on its own stdout the way Docker multiplexes an exec.
MUX = r"""
import os, struct, subprocess, sys, threading
shell = subprocess.Popen(sys.argv[1:], stdin=sys.stdin, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
out, lock = sys.stdout.buffer, threading.Lock()
def pump(stream, kind):
    while True:
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            return
        with lock:
            out.write(struct.pack(">BxxxI", kind, len(chunk)) + chunk)
            out.flush()
threads = [threading.Thread(target=pump, args=(shell.stdout, 1)),
           threading.Thread(target=pump, args=(shell.stderr, 2))]
for t in threads:
    t.start()
shell.wait()
"""


def frame(kind: int, payload: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


# --- configuration ------------------------------------------------------------------------------


def test_config_is_validated() -> None:
    adapter: TypeAdapter[LocalSandboxConfig | DockerSandboxConfig] = TypeAdapter(SandboxConfig)
    parsed = adapter.validate_python({"type": "docker", "network": "none", "cpus": 2})
    assert isinstance(parsed, DockerSandboxConfig) and parsed.cpus == 2
    # No network unless asked for: the task's install ran when its image was built.
    default = adapter.validate_python({"type": "docker"})
    assert isinstance(default, DockerSandboxConfig) and default.network == "none"
    assert isinstance(adapter.validate_python({"type": "local"}), LocalSandboxConfig)
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        adapter.validate_python({"type": "docker", "imagee": "x"})
    with pytest.raises(ValueError, match="greater than 0"):
        adapter.validate_python({"type": "docker", "cpus": 0})
    with pytest.raises(ValueError, match="does not match any of the expected tags"):
        adapter.validate_python({"type": "podman"})


def test_registry_creates_a_docker_sandbox_and_reserves_kubernetes() -> None:
    sandbox = create_sandbox({"type": "docker", "pull": "never"}, TASK)
    assert isinstance(sandbox, DockerSandbox)
    assert sandbox.image == "swebench/sweb.eval.x86_64.astropy__astropy-12907:latest"
    assert sandbox.workdir == "/testbed"
    with pytest.raises(SandboxError, match="invalid docker sandbox config"):
        create_sandbox({"type": "docker", "pull": "sometimes"}, TASK)
    assert BACKENDS["kubernetes"].module == "crl_worker.sandbox.kubernetes"


def test_image_comes_from_the_config_or_the_task() -> None:
    config = DockerSandboxConfig(image="mirror.local/{owner}/{name}:{instance_id}")
    assert DockerSandbox(config, TASK).image == (
        "mirror.local/astropy/astropy:astropy__astropy-12907"
    )
    with pytest.raises(SandboxError, match="the task has no image"):
        _ = DockerSandbox(DockerSandboxConfig(), TASK.model_copy(update={"image": None})).image


async def test_unreachable_engine_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    config = DockerSandboxConfig(base_url="unix:///nonexistent/docker.sock")
    sandbox = DockerSandbox(config, TASK)
    with pytest.raises(SandboxError, match="cannot reach the Docker engine at unix:///nonexistent"):
        await sandbox.start()
    assert not sandbox.alive
    await sandbox.close()  # safe after a failed start, and twice
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    with pytest.raises(SandboxError, match="Start Docker, or set DOCKER_HOST"):
        await DockerSandbox(DockerSandboxConfig(), TASK).start()


# --- files as tar -------------------------------------------------------------------------------


def test_tar_round_trip_is_binary_exact() -> None:
    data = bytes(range(256)) * 100
    archive = pack_file("blob.bin", data, mode=0o755, mtime=1_700_000_000)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.mode, member.size, member.mtime) == (
            "blob.bin",
            0o755,
            len(data),
            1_700_000_000,
        )
    entry = unpack_entry(archive)
    assert entry.kind == "file" and entry.data == data
    # get_archive yields chunks of arbitrary size
    chunks = [archive[i : i + 1000] for i in range(0, len(archive), 1000)]
    assert unpack_entry(iter(chunks)).data == data
    assert unpack_entry(pack_file("empty", b"")).data == b""
    long_name = "n" * 150 + ".txt"  # beyond the 100 characters of a plain tar header
    assert unpack_entry(pack_file(long_name, b"x")).data == b"x"
    for bad in ("a/b", "", "..", "."):
        with pytest.raises(ValueError):
            pack_file(bad, b"")


def test_written_files_keep_mode_and_owner(tmp_path: Path) -> None:
    """The owner script as write_file runs it in the container (here: in a real sh)."""
    existing = tmp_path / "run.sh"
    existing.write_text("#!/bin/sh\n")
    existing.chmod(0o750)

    def owner(target: Path) -> tuple[int, int, int] | None:
        out = subprocess.run(
            ["sh", "-c", OWNER_SCRIPT, "-", str(target.parent), str(target)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return parse_owner(out)

    assert owner(existing) == (0o750, os.getuid(), os.getgid())
    new = tmp_path / "a" / "b" / "new.py"
    assert owner(new) == (0o644, os.getuid(), os.getgid())
    assert new.parent.is_dir()  # created on the way
    assert parse_owner("- 1000 1001") == (0o644, 1000, 1001)
    # Output that is not the script's (an exec whose output the engine lost) is not a mode.
    assert parse_owner("garbage") is None and parse_owner("") is None
    assert parse_owner("9 0 0") is None
    with tarfile.open(fileobj=io.BytesIO(pack_file("x", b"", mode=0o600, uid=7, gid=8))) as tar:
        (member,) = tar.getmembers()
        assert (member.mode, member.uid, member.gid) == (0o600, 7, 8)


def test_unpack_recognises_directories_and_links() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("current")
        link.type, link.linkname = tarfile.SYMTYPE, "../releases/v2/setup.py"
        tar.addfile(link)
    entry = unpack_entry(buffer.getvalue())
    assert entry.kind == "symlink" and entry.link == "../releases/v2/setup.py"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo("src")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
    assert unpack_entry(buffer.getvalue()).kind == "dir"
    with pytest.raises(SandboxError, match="broken archive"):
        unpack_entry(b"this is not a tar archive" * 40)


# --- the multiplexed stream ----------------------------------------------------------------------


async def test_demux_keeps_stdout_and_drops_stderr() -> None:
    reader = asyncio.StreamReader()
    stream = frame(1, b"hello ") + frame(2, b"warning\n") + frame(1, b"world\n\xff")
    reader.feed_data(stream[:3])  # a header split across reads
    reader.feed_data(stream[3:])
    reader.feed_eof()
    demux = DemuxReader(reader)
    got = b""
    while chunk := await demux.read(4):
        got += chunk
    assert got == b"hello world\n\xff"
    assert await demux.read() == b""


async def _muxed_session(tmp_path: Path) -> tuple[asyncio.subprocess.Process, ShellSession]:
    """A real bash behind a Docker-style framing helper, signalled by the remote script."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        MUX,
        *SHELL_ARGV,
        cwd=tmp_path,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,  # the helper plays the container's init: it leads the group
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
    )
    assert proc.stdin is not None and proc.stdout is not None

    async def signaller(sig: int, shell: ShellProcess) -> None:
        # What the docker backend does with a second exec: a separate process runs the script.
        script = await asyncio.create_subprocess_exec("sh", "-c", remote_signal_script(sig, shell))
        await script.wait()

    session = ShellSession(
        DemuxReader(proc.stdout), proc.stdin, signaller=signaller, interrupt_grace=1
    )
    await session.start()
    return proc, session


async def test_session_over_a_multiplexed_stream(tmp_path: Path) -> None:
    proc, session = await _muxed_session(tmp_path)
    try:
        assert session.shell is not None
        # like a container exec, the shell does not lead its process group
        assert session.shell.pgid == proc.pid != session.shell.pid
        result = await session.run("echo out; echo err >&2; printf '\\x00\\xfe'; (exit 42)")
        assert result.output == b"out\nerr\n\x00\xfe" and result.exit_code == 42
        await session.run("cd /; export X=7")
        assert (await session.run("echo $PWD $X")).output == b"/ 7\n"

        started = time.monotonic()
        timed = await session.run("echo go; sleep 100", timeout=0.5)
        assert timed.timed_out and timed.output == b"go\n"
        assert time.monotonic() - started < 3
        stubborn = await session.run("sh -c \"trap '' INT; sleep 100\"", timeout=0.5)
        assert stubborn.timed_out
        # the helper (the container's init) survived both; the session still works
        assert proc.returncode is None
        assert (await session.run("echo $X")).output == b"7\n"
    finally:
        await session.close()
        proc.kill()
        await proc.wait()


async def test_remote_signal_script_for_a_group_leader(tmp_path: Path) -> None:
    """The other case of the script: a shell that leads its group (exec with a new session)."""
    proc = await asyncio.create_subprocess_exec(
        *SHELL_ARGV,
        cwd=tmp_path,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None

    async def signaller(sig: int, shell: ShellProcess) -> None:
        script = await asyncio.create_subprocess_exec("sh", "-c", remote_signal_script(sig, shell))
        await script.wait()

    session = ShellSession(proc.stdout, proc.stdin, signaller=signaller, interrupt_grace=0.5)
    try:
        shell = await session.start()
        assert shell.pid == shell.pgid == proc.pid
        assert (await session.run("while :; do :; done", timeout=0.3)).timed_out
        assert (await session.run("sh -c \"trap '' INT; sleep 100\"", timeout=0.3)).timed_out
        assert (await session.run("echo alive")).output == b"alive\n"
    finally:
        await session.close()
        proc.kill()
        await proc.wait()


class _LossyContainer:
    """The two calls write_file makes, run on this machine: ``exec_run`` in a real ``sh`` whose
    first output is dropped (as an engine under load can drop a short exec's), ``put_archive``
    kept for the test to read."""

    def __init__(self) -> None:
        self.execs = 0
        self.archives: list[bytes] = []

    def exec_run(self, argv: list[str], **_: object) -> object:
        done = subprocess.run(argv, capture_output=True, check=False)
        self.execs += 1
        out = b"" if self.execs == 1 else done.stdout

        class Result:
            exit_code = done.returncode
            output = (out, done.stderr)

        return Result()

    def put_archive(self, path: str, data: bytes) -> bool:
        self.archives.append(data)
        return True


def test_a_lost_owner_read_is_read_again_not_guessed(tmp_path: Path) -> None:
    """A file written over an executable one keeps its mode even when the engine drops the
    first stat's output (CI once saw an executable turned 644: "Permission denied")."""
    target = tmp_path / "run.sh"
    target.write_text("#!/bin/sh\n")
    target.chmod(0o755)
    transport = DockerTransport(workdir=str(tmp_path), env={})
    container = _LossyContainer()
    transport.container = container  # type: ignore[assignment]
    asyncio.run(transport.write_file(str(target), b"#!/bin/sh\necho run\n"))
    assert container.execs == 2
    with tarfile.open(fileobj=io.BytesIO(container.archives[0])) as tar:
        (member,) = tar.getmembers()
    assert member.mode == 0o755
