"""The sandbox protocol every backend implements (local process, Kubernetes exec, Docker).

A sandbox is one persistent shell session in the repository's environment: one process tree per
trajectory, so the working directory and exported variables persist between commands. Commands are
framed so that the exit code and the output come back exactly; a timeout interrupts the command and
leaves the session usable; output is capped; files are read and written as bytes; ``reset`` returns
the repository and the session to the base state the sandbox started in.

All methods are coroutines: one process drives hundreds of sandboxes with asyncio.
"""

from __future__ import annotations

import abc
from types import TracebackType

from pydantic import BaseModel, ConfigDict, Field

from crl_worker.api.contract import SandboxState
from crl_worker.sandbox.files import FileTooLarge, confine

#: Output kept per command unless the caller asks for another cap (bytes).
DEFAULT_MAX_OUTPUT = 1 << 20


class CommandResult(BaseModel):
    """What one command returned."""

    model_config = ConfigDict(extra="forbid")

    exit_code: int | None
    """The command's exit status; ``None`` when it was interrupted by the timeout."""
    output: str
    """Standard output and standard error interleaved as the command wrote them (decoded as
    UTF-8 with replacement), cut to the output cap."""
    timed_out: bool = False
    """The command ran past its timeout and was interrupted; the session is still usable."""
    truncated: bool = False
    """Output beyond the cap was dropped (the beginning and the end are kept)."""
    duration: float = Field(default=0.0, ge=0)
    """Wall time of the command, in seconds."""


class Sandbox(abc.ABC):
    """One persistent shell session in a repository instance's environment.

    Use as an async context manager (``async with sandbox:`` starts and closes it) or call
    :meth:`start` and :meth:`close` yourself. Methods raise
    :class:`crl_worker.errors.SandboxError` when the sandbox itself fails (never for a command
    that merely exits non-zero).
    """

    #: Directory of the repository inside the sandbox; commands start there.
    workdir: str

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the sandbox (provision when needed) and open the shell session."""

    @abc.abstractmethod
    async def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> CommandResult:
        """Run ``command`` in the persistent session and return its exit code and output."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Return the bytes of ``path`` (relative paths are relative to the workdir)."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path``, creating parent directories."""

    async def read_file_limited(self, path: str, limit: int) -> bytes:
        """Like :meth:`read_file`, but :class:`~crl_worker.sandbox.files.FileTooLarge` for a
        file over ``limit`` bytes. This default reads the whole file first; backends that can
        stop at the limit (and refuse devices and FIFOs) override it."""
        data = await self.read_file(path)
        if len(data) > limit:
            raise FileTooLarge(path, limit, len(data))
        return data

    async def read_confined(self, path: str, limit: int) -> bytes:
        """A bounded read of a path that must lie inside :attr:`workdir`
        (:class:`~crl_worker.sandbox.files.PathOutsideSandbox` otherwise): what an untrusted
        caller (the pool gateway's file API) may ask for. This default checks the path as
        written; backends that can resolve symbolic links safely override it."""
        return await self.read_file_limited(confine(self.workdir, path), limit)

    async def write_confined(self, path: str, data: bytes) -> None:
        """:meth:`write_file` of a path that must lie inside :attr:`workdir` (see
        :meth:`read_confined`)."""
        await self.write_file(confine(self.workdir, path), data)

    @abc.abstractmethod
    async def reset(self) -> None:
        """Return the repository and the session to the base state (fresh cwd and environment)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session and release the sandbox. Safe to call twice."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether the session is still usable."""

    @abc.abstractmethod
    async def diff(self) -> str:
        """The agent's changes against the task's base commit as a binary-safe unified diff:
        new files included, provisioning artefacts (build outputs, environments) left out."""

    async def diff_limited(self, limit: int) -> str:
        """:meth:`diff`, or :class:`~crl_worker.sandbox.files.FileTooLarge` when it is over
        ``limit`` bytes. This default computes the whole diff first; backends that can stop
        at the limit override it."""
        text = await self.diff()
        if len(text.encode("utf-8", "surrogateescape")) > limit:
            raise FileTooLarge("the diff", limit)
        return text

    #: Set by :meth:`mark_dirty`: this sandbox must not be reset and reused.
    dirty: bool = False

    def mark_dirty(self) -> None:
        """Ask that this sandbox be replaced, not reset and reused, when it is released: it may
        hold, outside what :meth:`reset` restores, what a later episode must not see (a task's
        hidden tests were in it while the candidate's code ran). Backends that never reuse a
        sandbox only record it (:attr:`dirty`); a pooled one tells its gateway."""
        self.dirty = True

    def report_state(self, state: SandboxState) -> None:
        """Hear the pool's view of this sandbox (a pool calls it at each change of state).

        Backends whose sandboxes are visible to the operator (Kubernetes pods) record it where
        the operator reads it (:attr:`~crl_worker.api.contract.Label.STATE`); the others have
        nothing to record. Must not block or raise.
        """
        del state

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
