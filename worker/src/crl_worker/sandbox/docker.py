"""The Docker sandbox (workstations): a container from the task's image, driven with the docker SDK.

- ``start``: connect to the engine (a clear :class:`SandboxError` when it cannot be reached), pull
  the image when needed, create a container that idles (``tail -f /dev/null`` under Docker's init,
  which reaps the agent's orphans), snapshot the repository's base state in it
  (:mod:`crl_worker.sandbox.gitstate`), and open the shell: an exec of ``bash`` with an attached
  socket, framed by :class:`crl_worker.sandbox.session.ShellSession`.
- The exec runs without a terminal, so Docker multiplexes its standard output and error on the
  socket (8-byte frame headers): :class:`DemuxReader` keeps standard output for the session.
- Files travel as tar archives (``get_archive``/``put_archive``), never through the shell.
- Timeouts signal the command with a second exec (:func:`remote_signal_script`).
- ``reset``: kill the session's processes, run the reset script, open a new exec session.
- ``close``: remove the container.

Every docker SDK call blocks, so each runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import io
import logging
import posixpath
import socket
import ssl
import tarfile
import time
from collections.abc import Iterable
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from crl_worker.api.contract import DOCKER_SANDBOX_LABEL, Label
from crl_worker.errors import SandboxError
from crl_worker.sandbox import gitstate
from crl_worker.sandbox.base import DEFAULT_MAX_OUTPUT, CommandResult, Sandbox
from crl_worker.sandbox.config import DockerSandboxConfig
from crl_worker.sandbox.session import (
    SESSION_ENV,
    SHELL_ARGV,
    ShellProcess,
    ShellSession,
    remote_signal_script,
)
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: Docker's stream ids in a multiplexed exec/attach stream.
STDOUT, STDERR = 1, 2
_HEADER = 8
_MAX_SYMLINKS = 16


# --- tar: files in and out of the container ------------------------------------------------


def pack_file(
    name: str,
    data: bytes,
    *,
    mode: int = 0o644,
    uid: int = 0,
    gid: int = 0,
    mtime: float | None = None,
) -> bytes:
    """A tar archive holding one regular file ``name`` (a base name) with ``data``; Docker
    extracts it with the header's mode and owner."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"pack_file takes a plain file name, got {name!r}")
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.mtime = int(time.time() if mtime is None else mtime)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


#: Prints "MODE UID GID" of an existing file, or "- UID GID" of the directory it will go into
#: (creating that directory first): what a written file's tar header should carry.
OWNER_SCRIPT = (
    'mkdir -p "$1" && if [ -e "$2" ]; then stat -c "%a %u %g" "$2"; else stat -c "- %u %g" "$1"; fi'
)


def parse_owner(text: str) -> tuple[int, int, int]:
    """Mode, uid and gid for a written file from :data:`OWNER_SCRIPT`'s output (a new file gets
    mode 644 and its directory's owner, as if the sandbox's user had created it)."""
    fields = text.split()
    if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
        return 0o644, 0, 0
    mode = int(fields[0], 8) if fields[0].isdigit() else 0o644
    return mode, int(fields[1]), int(fields[2])


class ArchiveEntry:
    """The first entry of a tar archive as ``get_archive`` returns it for one path."""

    def __init__(self, kind: str, data: bytes = b"", link: str = "") -> None:
        self.kind = kind
        """``file``, ``dir``, ``symlink`` or ``other``."""
        self.data = data
        """The file's bytes (regular files)."""
        self.link = link
        """The link's target (symlinks)."""


def unpack_entry(archive: bytes | Iterable[bytes]) -> ArchiveEntry:
    """Read the first entry of a tar archive (bytes, or the chunks ``get_archive`` yields)."""
    raw = archive if isinstance(archive, bytes) else b"".join(archive)
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            member = tar.next()
            if member is None:
                raise SandboxError("the container returned an empty archive")
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                return ArchiveEntry("file", extracted.read())
            if member.isdir():
                return ArchiveEntry("dir")
            if member.issym():
                return ArchiveEntry("symlink", link=member.linkname)
            return ArchiveEntry("other")
    except tarfile.TarError as exc:
        raise SandboxError(f"the container returned a broken archive: {exc}") from exc


# --- the multiplexed exec stream ------------------------------------------------------------


class DemuxReader:
    """Standard output of a multiplexed Docker stream (frames of an 8-byte header and a
    payload); standard error frames are logged and dropped."""

    def __init__(self, reader: asyncio.StreamReader, *, name: str = "docker exec") -> None:
        self._reader = reader
        self._remaining = 0
        self._stream = STDOUT
        self._name = name

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of standard output; ``b""`` at end of stream."""
        while True:
            if self._remaining == 0:
                try:
                    header = await self._reader.readexactly(_HEADER)
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        logger.warning("%s: stream ended inside a frame header", self._name)
                    return b""
                self._stream = header[0]
                self._remaining = int.from_bytes(header[4:8], "big")
                continue
            want = self._remaining if n < 0 else min(n, self._remaining)
            chunk = await self._reader.read(want)
            if not chunk:
                return b""
            self._remaining -= len(chunk)
            if self._stream == STDOUT:
                return chunk
            logger.debug("%s: stderr: %r", self._name, chunk[:500])


class _SocketWriter:
    """The write half over the exec socket (wraps an asyncio StreamWriter)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


def _raw_socket(response: Any) -> socket.socket:
    """The socket under what ``exec_start(socket=True)`` returns (a SocketIO for unix/tcp)."""
    candidate = getattr(response, "_sock", response)
    if isinstance(candidate, ssl.SSLSocket):
        raise SandboxError(
            "the docker sandbox cannot drive an exec over a TLS connection; use the engine's "
            "unix socket or plain tcp"
        )
    if not isinstance(candidate, socket.socket):
        raise SandboxError(
            f"the Docker connection ({type(candidate).__name__}) is not a socket; use a unix "
            "or tcp DOCKER_HOST (ssh:// is not supported by the docker sandbox)"
        )
    return candidate


# --- the sandbox ------------------------------------------------------------------------------


class DockerSandbox(Sandbox):
    """A sandbox in a Docker container (see the module docs)."""

    def __init__(self, config: DockerSandboxConfig, task: Task) -> None:
        self.config = config
        self.task = task
        self.workdir = task.workdir
        self.container: Container | None = None
        self._client: docker.DockerClient | None = None
        self._session: ShellSession | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._closed = False
        self._name = f"docker sandbox {task.instance_id}"

    @property
    def image(self) -> str:
        """The image this sandbox runs (config override, else the task's)."""
        template = self.config.image or self.task.image
        if not template:
            raise SandboxError(
                f"{self._name}: the task has no image; set the task's image or the docker "
                "sandbox config's image"
            )
        return template.format(
            instance_id=self.task.instance_id,
            repo=self.task.repo,
            owner=self.task.owner,
            name=self.task.name,
        )

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, pull, create the container, snapshot the base state, open the session."""
        if self._session is not None:
            return
        try:
            async with asyncio.timeout(self.config.start_timeout):
                self._client = await asyncio.to_thread(self._connect)
                self.container = await asyncio.to_thread(self._create_container)
                await self._git_script(gitstate.SNAPSHOT_SCRIPT, "snapshotting the base state")
                await self._open_session()
        except TimeoutError:
            await self.close()
            raise SandboxError(
                f"{self._name}: starting took more than {self.config.start_timeout:.0f} s"
            ) from None
        except BaseException:
            await self.close()
            raise

    def _connect(self) -> docker.DockerClient:
        where = self.config.base_url or "DOCKER_HOST or the default socket"
        try:
            if self.config.base_url:
                client = docker.DockerClient(base_url=self.config.base_url)
            else:
                client = docker.from_env()
            client.ping()
        except Exception as exc:  # the SDK raises DockerException and raw requests errors
            raise SandboxError(
                f"cannot reach the Docker engine at {where}: {exc}. Start Docker, or set "
                "DOCKER_HOST / the docker sandbox config's base_url, or use another sandbox type"
            ) from exc
        return client

    def _create_container(self) -> Container:
        assert self._client is not None
        image = self.image
        try:
            present = True
            try:
                self._client.images.get(image)
            except docker.errors.ImageNotFound:
                present = False
            if self.config.pull == "always" or (not present and self.config.pull == "missing"):
                logger.info("%s: pulling %s", self._name, image)
                self._client.images.pull(image, platform=self.config.platform)
            elif not present:
                raise SandboxError(f"{self._name}: image {image} is not present and pull=never")
            container = self._client.containers.run(
                image,
                entrypoint=["tail", "-f", "/dev/null"],
                command=[],
                detach=True,
                init=True,
                working_dir=self.workdir,
                environment=dict(self.task.env),
                labels={DOCKER_SANDBOX_LABEL: "docker", Label.INSTANCE: self._label},
                network_mode=self.config.network,
                mem_limit=self.config.mem_limit,
                nano_cpus=int(self.config.cpus * 1e9) if self.config.cpus else None,
                user=self.config.user,
                platform=self.config.platform,
            )
        except docker.errors.DockerException as exc:
            raise SandboxError(
                f"{self._name}: cannot create a container from {image}: {exc}"
            ) from exc
        if self._closed:
            # start() timed out while this thread was still creating the container: close()
            # has already run and saw no container, so remove it here or it would leak.
            container.remove(force=True)
            raise SandboxError(f"{self._name}: closed while the container was being created")
        return container

    @property
    def _label(self) -> str:
        return self.task.instance_id[:63]

    async def _open_session(self) -> None:
        assert self._client is not None and self.container is not None
        api = self._client.api
        env = {**SESSION_ENV, **self.task.env}
        try:
            exec_id = await asyncio.to_thread(
                api.exec_create,
                self.container.id,
                list(SHELL_ARGV),
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                environment=env,
                workdir=self.workdir,
                user=self.config.user or "",
            )
            response = await asyncio.to_thread(api.exec_start, exec_id["Id"], socket=True)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"{self._name}: cannot start the shell: {exc}") from exc
        raw = _raw_socket(response)
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw)
        self._writer = writer
        self._session = ShellSession(
            DemuxReader(reader, name=self._name),
            _SocketWriter(writer),
            signaller=self._signal,
            interrupt_grace=self.config.interrupt_grace,
            name=self._name,
        )
        await self._session.start()

    async def _exec(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        assert self.container is not None
        try:
            result = await asyncio.to_thread(
                self.container.exec_run,
                argv,
                workdir=self.workdir,
                demux=True,
                user=self.config.user or "",
            )
        except docker.errors.DockerException as exc:
            raise SandboxError(f"{self._name}: exec failed: {exc}") from exc
        # With demux=True the output is a (stdout, stderr) pair, either of which may be None.
        out, err = result.output if isinstance(result.output, tuple) else (result.output, None)
        return (
            int(result.exit_code or 0),
            out if isinstance(out, bytes) else b"",
            err if isinstance(err, bytes) else b"",
        )

    async def _signal(self, sig: int, shell: ShellProcess) -> None:
        await self._exec(["sh", "-c", remote_signal_script(sig, shell)])

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        await session.close()
        if session.shell is not None and self.container is not None:
            try:
                await self._signal(9, session.shell)  # the shell's children
                await self._exec(["kill", "-9", str(session.shell.pid)])
            except SandboxError:
                logger.debug("%s: killing the old session failed", self._name, exc_info=True)

    async def close(self) -> None:
        """Remove the container. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.container is not None:
            try:
                await asyncio.to_thread(self.container.remove, force=True)
            except docker.errors.DockerException:
                logger.warning("%s: removing the container failed", self._name, exc_info=True)
        if self._client is not None:
            await asyncio.to_thread(self._client.close)

    # --- commands and files ----------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the exec session still answers."""
        return self._session is not None and self._session.alive

    async def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> CommandResult:
        """Run ``command`` in the session; ``timeout`` defaults to ``task.timeouts.command``."""
        if self._session is None:
            raise SandboxError(f"{self._name}: not started, or closed")
        result = await self._session.run(
            command,
            timeout=self.task.timeouts.command if timeout is None else timeout,
            max_output=max_output,
        )
        return result.to_command_result()

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def read_file(self, path: str) -> bytes:
        """The file's bytes, through ``get_archive`` (symlinks followed)."""
        assert self.container is not None
        target = self._path(path)
        for _ in range(_MAX_SYMLINKS):
            try:
                chunks, _stat = await asyncio.to_thread(self.container.get_archive, target)
                entry = await asyncio.to_thread(unpack_entry, chunks)
            except docker.errors.NotFound:
                raise FileNotFoundError(f"{path}: no such file in the sandbox") from None
            except docker.errors.DockerException as exc:
                raise SandboxError(f"{self._name}: reading {path} failed: {exc}") from exc
            if entry.kind == "file":
                return entry.data
            if entry.kind == "dir":
                raise IsADirectoryError(f"{path} is a directory")
            if entry.kind != "symlink":
                raise OSError(f"{path} is not a regular file")
            target = posixpath.normpath(posixpath.join(posixpath.dirname(target), entry.link))
        raise OSError(f"{path}: too many levels of symbolic links")

    async def write_file(self, path: str, data: bytes) -> None:
        """Write the bytes through ``put_archive``, creating parent directories, keeping the
        mode and owner of a file that already exists (a new one gets its directory's owner)."""
        assert self.container is not None
        target = self._path(path)
        parent, name = posixpath.split(target)
        code, out, err = await self._exec(["sh", "-c", OWNER_SCRIPT, "-", parent, target])
        if code != 0:
            raise SandboxError(
                f"{self._name}: cannot create {parent}: {err.decode(errors='replace')}"
            )
        mode, uid, gid = parse_owner(out.decode(errors="replace"))
        archive = pack_file(name, data, mode=mode, uid=uid, gid=gid)
        try:
            ok = await asyncio.to_thread(self.container.put_archive, parent, archive)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"{self._name}: writing {path} failed: {exc}") from exc
        if not ok:
            raise SandboxError(f"{self._name}: writing {path} failed")

    # --- base state --------------------------------------------------------------------------

    async def reset(self) -> None:
        """Kill the session, restore the base state in the container, open a new session."""
        if self._closed or self.container is None:
            raise SandboxError(f"{self._name}: not started, or closed")
        await self._close_session()
        await self._git_script(gitstate.RESET_SCRIPT, "resetting to the base state")
        await self._open_session()

    async def diff(self) -> str:
        """The agent's changes against the task's base commit (new files included)."""
        return (await self._git_script(gitstate.DIFF_SCRIPT, "computing the diff")).decode(
            "utf-8", "replace"
        )

    async def _git_script(self, script: str, what: str) -> bytes:
        code, out, err = await self._exec(gitstate.script_command(script))
        if code != 0:
            raise SandboxError(
                f"{self._name}: {what} failed in {self.workdir} (exit {code}): "
                f"{err.decode('utf-8', 'replace').strip()[-2000:]}"
            )
        return out
