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
import signal
import socket
import ssl
import tarfile
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.models.containers import Container

from crl_worker.api.contract import DOCKER_SANDBOX_LABEL, Label
from crl_worker.errors import SandboxError
from crl_worker.sandbox import gitstate
from crl_worker.sandbox.config import DockerSandboxConfig
from crl_worker.sandbox.session import (
    SESSION_ENV,
    SHELL_ARGV,
    ByteReader,
    ByteWriter,
    ShellProcess,
    remote_signal_script,
)
from crl_worker.sandbox.shell import ShellSandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: Docker's stream ids in a multiplexed exec/attach stream.
STDOUT, STDERR = 1, 2
_HEADER = 8
_MAX_SYMLINKS = 16
#: What a docker SDK call raises: the SDK's errors, and requests' when the engine's connection
#: breaks (an engine that stopped or died answers with a refused or reset connection).
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


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


def parse_owner(text: str) -> tuple[int, int, int] | None:
    """Mode, uid and gid for a written file from :data:`OWNER_SCRIPT`'s output (a new file gets
    mode 644 and its directory's owner, as if the sandbox's user had created it); ``None`` when
    the output is not the script's (an exec whose output was lost)."""
    fields = text.split()
    if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
        return None
    if fields[0] != "-" and not (fields[0].isdigit() and set(fields[0]) <= set("01234567")):
        return None
    mode = int(fields[0], 8) if fields[0] != "-" else 0o644
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


# --- the engine ---------------------------------------------------------------------------------


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: causes, contexts, and exceptions among its arguments (requests
    wraps urllib3's errors that way)."""
    pending, seen = [exc], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = (current.__cause__, current.__context__, *current.args)
        pending += [c for c in linked if isinstance(c, BaseException)]


def engine_error(where: str, exc: BaseException) -> str:
    """One sentence for a failed connection to the engine: a socket this user may not open
    (permission) is told apart from an engine that is not there."""
    text = str(exc)
    denied = any(isinstance(cause, PermissionError) for cause in _causes(exc))
    if denied or "Permission denied" in text:
        return (
            f"permission denied on the Docker engine's socket at {where}: this user may not use "
            "it. Add the user to the socket's group (usually `docker`), run rootless Docker and "
            "set DOCKER_HOST to its socket, or use another sandbox type"
        )
    return (
        f"cannot reach the Docker engine at {where}: {text}. Start Docker, or set DOCKER_HOST / "
        "the docker sandbox config's base_url, or use another sandbox type"
    )


def connect(base_url: str | None = None) -> docker.DockerClient:
    """A client of the engine at ``base_url`` (default: ``DOCKER_HOST`` or the local socket),
    checked with a ping; one :class:`SandboxError` sentence (:func:`engine_error`) when it
    cannot be used."""
    where = base_url or "DOCKER_HOST or the default socket"
    try:
        client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
        client.ping()
    except Exception as exc:  # the SDK raises DockerException and raw requests errors
        raise SandboxError(engine_error(where, exc)) from exc
    return client


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
        """Queue ``data`` for the shell's standard input."""
        self._writer.write(data)

    async def drain(self) -> None:
        """Wait until the queued data may be sent."""
        await self._writer.drain()

    def close(self) -> None:
        """Close the socket (the shell reads end of file)."""
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


# --- the transport ----------------------------------------------------------------------------


class DockerTransport:
    """Docker exec into one container: the shell is an exec with an attached socket, signals
    and base-state scripts are further execs, files travel as tar archives.

    ``client`` and ``container`` are set by :class:`DockerSandbox` once the container exists.
    """

    def __init__(
        self,
        *,
        workdir: str,
        env: Mapping[str, str],
        user: str | None = None,
        name: str = "docker sandbox",
    ) -> None:
        self.workdir = workdir
        self.env = {**SESSION_ENV, **env}
        self.user = user or ""
        self.name = name
        self.client: docker.DockerClient | None = None
        self.container: Container | None = None

    @property
    def shell_open(self) -> bool:
        """``True``: a dropped exec shows as the session's end of stream."""
        return True

    async def open_shell(self, workdir: str) -> tuple[ByteReader, ByteWriter]:
        """Exec ``bash`` in the container and attach to its socket."""
        assert self.client is not None and self.container is not None
        api = self.client.api
        try:
            exec_id = await asyncio.to_thread(
                api.exec_create,
                self.container.id,
                list(SHELL_ARGV),
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                environment=self.env,
                workdir=workdir,
                user=self.user,
            )
            response = await asyncio.to_thread(api.exec_start, exec_id["Id"], socket=True)
        except ENGINE_ERRORS as exc:
            raise SandboxError(f"{self.name}: cannot start the shell: {exc}") from exc
        raw = _raw_socket(response)
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw)
        return DemuxReader(reader, name=self.name), _SocketWriter(writer)

    async def exec_once(
        self, argv: list[str], workdir: str | None = None
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` in the container to completion (no input); exit code, stdout, stderr."""
        assert self.container is not None
        try:
            result = await asyncio.to_thread(
                self.container.exec_run,
                argv,
                workdir=workdir or self.workdir,
                demux=True,
                user=self.user,
            )
        except ENGINE_ERRORS as exc:
            raise SandboxError(f"{self.name}: exec failed: {exc}") from exc
        # With demux=True the output is a (stdout, stderr) pair, either of which may be None.
        out, err = result.output if isinstance(result.output, tuple) else (result.output, None)
        return (
            int(result.exit_code or 0),
            out if isinstance(out, bytes) else b"",
            err if isinstance(err, bytes) else b"",
        )

    async def signal(self, sig: int, shell: ShellProcess) -> None:
        """Signal with a second exec (:func:`remote_signal_script`)."""
        await self.exec_once(["sh", "-c", remote_signal_script(sig, shell)])

    async def end_shell(self, shell: ShellProcess | None) -> None:
        """SIGKILL the shell's children, then the shell."""
        if shell is None or self.container is None:
            return
        await self.signal(signal.SIGKILL, shell)
        # The shell's builtin: a minimal image (the Debian base) has no kill program.
        await self.exec_once(["sh", "-c", f"kill -KILL {shell.pid} 2>/dev/null; true"])

    async def run_script(
        self, script: str, workdir: str, *, timeout: float
    ) -> tuple[int, bytes, bytes]:
        """Run the script with bash in ``workdir`` (``timeout`` is not enforced: the SDK's
        exec cannot be interrupted)."""
        del timeout
        return await self.exec_once(gitstate.script_command(script), workdir)

    async def read_file(self, path: str) -> bytes:
        """The file's bytes, through ``get_archive`` (symlinks followed)."""
        assert self.container is not None
        target = posixpath.normpath(path)
        for _ in range(_MAX_SYMLINKS):
            try:
                chunks, _stat = await asyncio.to_thread(self.container.get_archive, target)
                entry = await asyncio.to_thread(unpack_entry, chunks)
            except docker.errors.NotFound:
                raise FileNotFoundError(f"{path}: no such file in the sandbox") from None
            except ENGINE_ERRORS as exc:
                raise SandboxError(f"{self.name}: reading {path} failed: {exc}") from exc
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
        target = posixpath.normpath(path)
        parent, name = posixpath.split(target)
        owner = None
        for _ in range(3):
            # An exec's output can be lost by the engine under load; a file written with a
            # guessed mode would silently lose its executable bit: read it again instead.
            code, out, err = await self.exec_once(["sh", "-c", OWNER_SCRIPT, "-", parent, target])
            if code != 0:
                raise SandboxError(
                    f"{self.name}: cannot create {parent}: {err.decode(errors='replace')}"
                )
            owner = parse_owner(out.decode(errors="replace"))
            if owner is not None:
                break
            logger.warning("%s: no mode and owner read for %s (%r); again", self.name, path, out)
        if owner is None:
            raise SandboxError(f"{self.name}: cannot read the mode and owner of {path}")
        mode, uid, gid = owner
        archive = pack_file(name, data, mode=mode, uid=uid, gid=gid)
        try:
            ok = await asyncio.to_thread(self.container.put_archive, parent, archive)
        except ENGINE_ERRORS as exc:
            raise SandboxError(f"{self.name}: writing {path} failed: {exc}") from exc
        if not ok:
            raise SandboxError(f"{self.name}: writing {path} failed")

    async def aclose(self) -> None:
        """Nothing: the sandbox removes the container."""


# --- the sandbox ------------------------------------------------------------------------------


class DockerSandbox(ShellSandbox):
    """A sandbox in a Docker container (see the module docs): the container here, the rest is
    :class:`~crl_worker.sandbox.shell.ShellSandbox` over a :class:`DockerTransport`."""

    transport: DockerTransport

    def __init__(self, config: DockerSandboxConfig, task: Task) -> None:
        name = f"docker sandbox {task.instance_id}"
        super().__init__(
            DockerTransport(workdir=task.workdir, env=task.env, user=config.user, name=name),
            workdir=task.workdir,
            name=name,
            default_timeout=task.timeouts.command,
            interrupt_grace=config.interrupt_grace,
        )
        self.config = config
        self.task = task

    @property
    def container(self) -> Container | None:
        """The sandbox's container (None before ``start``)."""
        return self.transport.container

    @property
    def image(self) -> str:
        """The image this sandbox runs (config override, else the task's)."""
        template = self.config.image or self.task.image
        if not template:
            raise SandboxError(
                f"{self.name}: the task has no image; set the task's image or the docker "
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
                self.transport.client = await asyncio.to_thread(self._connect)
                self.transport.container = await asyncio.to_thread(self._create_container)
                await super().start()
        except TimeoutError:
            await self.close()
            raise SandboxError(
                f"{self.name}: starting took more than {self.config.start_timeout:.0f} s"
            ) from None
        except BaseException:
            await self.close()
            raise

    def _connect(self) -> docker.DockerClient:
        return connect(self.config.base_url)

    def _create_container(self) -> Container:
        client = self.transport.client
        assert client is not None
        image = self.image
        try:
            present = True
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                present = False
            if self.config.pull == "always" or (not present and self.config.pull == "missing"):
                logger.info("%s: pulling %s", self.name, image)
                try:
                    client.images.pull(image, platform=self.config.platform)
                except ENGINE_ERRORS as exc:
                    raise SandboxError(
                        f"{self.name}: cannot pull {image} (pull={self.config.pull}): {exc}. "
                        "Build or load the image into this engine, or fix its name or registry"
                    ) from exc
            elif not present:
                raise SandboxError(
                    f"{self.name}: image {image} is not in the engine and pull=never: build or "
                    "load it first"
                )
            container = client.containers.run(
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
        except ENGINE_ERRORS as exc:
            raise SandboxError(
                f"{self.name}: cannot create a container from {image}: {exc}"
            ) from exc
        if self._closed:
            # start() timed out while this thread was still creating the container: close()
            # has already run and saw no container, so remove it here or it would leak.
            container.remove(force=True)
            raise SandboxError(f"{self.name}: closed while the container was being created")
        return container

    @property
    def _label(self) -> str:
        return self.task.instance_id[:63]

    async def _release(self) -> None:
        """Remove the container and close the engine client (after the session, on close)."""
        container, client = self.transport.container, self.transport.client
        if container is not None:
            try:
                await asyncio.to_thread(container.remove, force=True)
            except ENGINE_ERRORS:
                logger.warning("%s: removing the container failed", self.name, exc_info=True)
        if client is not None:
            await asyncio.to_thread(client.close)
