"""The one shell sandbox every backend is: a framed session, files and the base state, over a
:class:`~crl_worker.sandbox.transport.Transport`.

:class:`ShellSandbox` implements the whole :class:`~crl_worker.sandbox.base.Sandbox` protocol
once: ``run`` in the persistent session of :mod:`crl_worker.sandbox.session`, ``read_file`` and
``write_file`` through the transport, ``reset`` and ``diff`` with the scripts of
:mod:`crl_worker.sandbox.gitstate`, ``close`` and ``alive``. A backend (local, Docker,
Kubernetes) subclasses it only to provision its environment before :meth:`ShellSandbox.start`
and to release it in :meth:`ShellSandbox._release`, which :meth:`ShellSandbox.close` calls.

The environment is expected to hold the repository at ``workdir`` when ``start`` runs (an
image, or a checkout); ``start`` snapshots it as the base state and opens the session.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import shlex

from crl_worker.errors import SandboxError
from crl_worker.sandbox.base import DEFAULT_MAX_OUTPUT, CommandResult, Sandbox
from crl_worker.sandbox.files import (
    READ_SCRIPT,
    WRITE_SCRIPT,
    FileTooLarge,
    confine,
    read_local,
    script_error,
    write_local,
)
from crl_worker.sandbox.gitstate import DIFF_SCRIPT, RESET_SCRIPT, SNAPSHOT_SCRIPT
from crl_worker.sandbox.session import ShellSession
from crl_worker.sandbox.transport import ExecTransport, LocalTransport, Transport

logger = logging.getLogger(__name__)

#: Longest a base-state script (snapshot, reset, diff) may take, in seconds.
SCRIPT_TIMEOUT = 600.0


class ShellSandbox(Sandbox):
    """A sandbox over any :class:`~crl_worker.sandbox.transport.Transport` (see the module
    docs).

    ``default_timeout`` is ``run``'s limit when the caller gives none (a task's sandbox: its
    command timeout). ``snapshot=False`` skips the base state (reset then only renews the
    session). ``interrupt_grace`` and ``start_timeout`` go to the session.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        workdir: str,
        name: str = "sandbox",
        snapshot: bool = True,
        default_timeout: float | None = None,
        interrupt_grace: float = 1.0,
        start_timeout: float = 30.0,
    ) -> None:
        self.transport = transport
        self.workdir = workdir
        self.name = name
        self._snapshot = snapshot
        self.default_timeout = default_timeout
        self.interrupt_grace = interrupt_grace
        self.start_timeout = start_timeout
        self._session: ShellSession | None = None
        self._based = False
        self._closed = False

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Record the base state and open the shell session (nothing when already open)."""
        if self._session is not None:
            return
        await self.record_base_state()
        await self.open_session()

    async def record_base_state(self) -> None:
        """Snapshot the repository as it is now as the state :meth:`reset` returns to."""
        if self._snapshot:
            await self._script(SNAPSHOT_SCRIPT, "snapshotting the base state")
        self._based = True

    async def open_session(self) -> None:
        """Start a shell through the transport and wait until it answers."""
        reader, writer = await self.transport.open_shell(self.workdir)
        session = ShellSession(
            reader,
            writer,
            signaller=self.transport.signal,
            interrupt_grace=self.interrupt_grace,
            name=self.name,
        )
        try:
            await session.start(timeout=self.start_timeout)
        except BaseException:
            await session.close()
            raise
        self._session = session

    async def end_session(self) -> None:
        """Close the session and kill what is left of it (a reset starts a clean one)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        try:
            await self.transport.end_shell(session.shell if session is not None else None)
        except SandboxError:
            logger.debug("%s: killing the old session failed", self.name, exc_info=True)

    async def close(self) -> None:
        """End the session, release the transport, then what the backend holds
        (:meth:`_release`). Each step runs whatever the one before did: a failed session close
        must not leave the environment running. Safe to call twice: the second call does
        nothing."""
        if self._closed:
            return
        self._closed = True
        session, self._session = self._session, None
        try:
            try:
                if session is not None:
                    await session.close()
            finally:
                await self.transport.aclose()
        finally:
            await self._release()

    async def _release(self) -> None:
        """Release what the backend provisioned for this sandbox (a container, a pod, a
        folder). :meth:`close` calls it once, last, even when ending the session failed. A
        sandbox over a bare transport has nothing more to release."""

    @property
    def alive(self) -> bool:
        """Whether the shell session is usable."""
        return (
            self._session is not None
            and self._session.alive
            and not self._closed
            and self.transport.shell_open
        )

    # --- commands and files --------------------------------------------------------------------

    async def run(
        self, command: str, *, timeout: float | None = None, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> CommandResult:
        """Run ``command`` in the persistent session; ``timeout`` defaults to
        ``default_timeout``."""
        if self._session is None or self._closed:
            raise SandboxError(f"{self.name}: not started, or closed")
        result = await self._session.run(
            command,
            timeout=self.default_timeout if timeout is None else timeout,
            max_output=max_output,
        )
        return result.to_command_result()

    def _path(self, path: str) -> str:
        if not self.workdir:
            raise SandboxError(f"{self.name}: not started")
        return posixpath.join(self.workdir, path)  # an absolute path replaces the workdir

    async def read_file(self, path: str) -> bytes:
        """The bytes of ``path`` (relative to the workdir); ``FileNotFoundError`` or
        ``IsADirectoryError`` for a bad path."""
        return await self.transport.read_file(self._path(path))

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to the workdir), creating parent directories."""
        await self.transport.write_file(self._path(path), data)

    async def read_file_limited(self, path: str, limit: int) -> bytes:
        """At most ``limit`` bytes of the regular file ``path`` (relative to the workdir):
        :class:`~crl_worker.sandbox.files.FileTooLarge` beyond, never more held in memory."""
        return await self._bounded_read(self._path(path), limit, root=None)

    async def read_confined(self, path: str, limit: int) -> bytes:
        """A bounded read of a file inside the working tree, symbolic links followed and
        checked (see :mod:`crl_worker.sandbox.files`)."""
        return await self._bounded_read(confine(self.workdir, path), limit, root=self.workdir)

    async def write_confined(self, path: str, data: bytes) -> None:
        """Write a file inside the working tree; no symbolic link may lead outside it."""
        full = confine(self.workdir, path)
        transport = self.transport
        if isinstance(transport, LocalTransport):
            await asyncio.to_thread(write_local, self.workdir, full, data)
            return
        if isinstance(transport, ExecTransport):
            argv = [transport.shell, "-c", WRITE_SCRIPT, "write", full, self.workdir]
            code, _, err = await transport.exec_once(
                [*argv, str(len(data))], stdin=data, timeout=600
            )
            self._script_failed(code, full, err, "writing")
            return
        await transport.write_file(full, data)

    async def _bounded_read(self, full: str, limit: int, *, root: str | None) -> bytes:
        transport = self.transport
        if isinstance(transport, LocalTransport):
            return await asyncio.to_thread(read_local, full, limit, root=root)
        if isinstance(transport, ExecTransport):
            argv = [transport.shell, "-c", READ_SCRIPT, "read", full, root or "", str(limit + 1)]
            code, out, err = await transport.exec_once(argv, timeout=600)
            self._script_failed(code, full, err, "reading")
        else:
            # A transport of its own (Docker): no bounded read; checked after the fact.
            out = await transport.read_file(full)
        if len(out) > limit:
            raise FileTooLarge(full, limit)
        return out

    def _script_failed(self, code: int, full: str, err: bytes, what: str) -> None:
        if code == 0:
            return
        message = err.decode("utf-8", "replace").strip()[-2000:]
        known = script_error(code, full, message)
        if known is not None:
            raise known
        if "Is a directory" in message:
            raise IsADirectoryError(f"{full} is a directory")
        raise SandboxError(f"{self.name}: {what} {full} failed (exit {code}): {message}")

    # --- base state ----------------------------------------------------------------------------

    async def reset(self) -> None:
        """Back to the base state with a fresh shell (cwd and variables renewed); also brings
        back a sandbox whose shell died."""
        if self._closed or not self._based:
            raise SandboxError(f"{self.name}: not started, or closed")
        await self.end_session()
        if self._snapshot:
            await self._script(RESET_SCRIPT, "resetting to the base state")
        await self.open_session()

    async def diff(self) -> str:
        """The changes against the task's base commit, new files included (binary-safe)."""
        out = await self._script(DIFF_SCRIPT, "computing the diff")
        return out.decode("utf-8", "replace")

    async def diff_limited(self, limit: int) -> str:
        """:meth:`diff`, never holding more than ``limit`` + 1 bytes of it:
        :class:`~crl_worker.sandbox.files.FileTooLarge` beyond."""
        bounded = f"set -o pipefail\nbash -c {shlex.quote(DIFF_SCRIPT)} | head -c {int(limit) + 1}"
        code, out, err = await self.transport.run_script(
            bounded, self.workdir, timeout=SCRIPT_TIMEOUT
        )
        if len(out) > limit:
            # git was cut off by head (SIGPIPE): the exit code says nothing more.
            raise FileTooLarge("the diff", limit)
        if code != 0:
            message = (err or out).decode("utf-8", "replace").strip()[-2000:]
            raise SandboxError(
                f"{self.name}: computing the diff failed in {self.workdir} (exit {code}): {message}"
            )
        return out.decode("utf-8", "replace")

    async def _script(self, script: str, what: str) -> bytes:
        code, out, err = await self.transport.run_script(
            script, self.workdir, timeout=SCRIPT_TIMEOUT
        )
        if code != 0:
            message = (err or out).decode("utf-8", "replace").strip()[-2000:]
            raise SandboxError(
                f"{self.name}: {what} failed in {self.workdir} (exit {code}): {message}"
            )
        return out
