"""What a pool keeps of each sandbox (:class:`Slot`) and of each lease (:class:`LeaseRecord`),
and the errors a lease request can meet; the rules that move slots between states live in
:mod:`crl_worker.pool.leases`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from crl_worker.errors import CrlError, SandboxError
from crl_worker.pool.models import LeaseSource
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

SlotState = Literal["starting", "ready", "leased", "resetting", "closing"]
Origin = Literal["lease", "prefetch", "replace"]
_T = TypeVar("_T")


class PoolError(CrlError):
    """Base class of the errors a lease request can meet."""


class UnknownInstance(PoolError):
    """The pool has no task with this instance id."""


class UnknownLease(PoolError):
    """No lease with this id (never issued, released, or expired)."""


class PoolBusy(PoolError):
    """Every sandbox slot stayed busy until the request's timeout."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PoolClosed(PoolError):
    """The gateway is shutting down."""


@dataclass(eq=False)
class Slot:
    """One sandbox and its bookkeeping."""

    id: str
    task: Task
    sandbox: Sandbox
    state: SlotState
    origin: Origin
    uses: int = 0
    claimed: bool = False
    """A lease request waits for this slot to settle and will take it."""
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a start or reset finished (successfully or not)."""
    idle_since: float = field(default_factory=time.monotonic)
    protected_until: float = 0.0
    """A prefetched sandbox is not trimmed before this time (monotonic) or its first lease."""
    error: BaseException | None = None
    """Why the last start or reset failed."""
    operation: asyncio.Task[None] | None = None
    """The start or reset in flight, which a close must wait for (or cancel at shutdown)."""


@dataclass(eq=False)
class LeaseRecord:
    """A sandbox leased to one rollout."""

    id: str
    slot: Slot
    source: LeaseSource
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One operation at a time: the sandbox has one shell session."""
    last_used: float = field(default_factory=time.monotonic)
    broken: bool = False
    """An operation on the lease met a sandbox failure; release replaces the sandbox."""
    released: bool = False
    """The lease ended; an operation still queued for the lock must not reach the sandbox."""

    @property
    def sandbox(self) -> Sandbox:
        """The leased sandbox."""
        return self.slot.sandbox

    async def call(self, operation: Callable[[Sandbox], Awaitable[_T]]) -> _T:
        """Run one operation on the sandbox, serialized, noting sandbox failures.

        The operation runs to its end even when the caller goes away (an HTTP client that
        disconnects): stopping it half-way would leave the shell session in the middle of a
        frame, and the lock stays held until it ends, so a release waits for it.
        """

        async def guarded() -> _T:
            async with self.lock:
                if self.released:
                    # Queued behind (or scheduled just before) the release: by now the
                    # sandbox is being reset, closed, or leased to another rollout.
                    raise UnknownLease(
                        f"lease {self.id} was released while this request waited; "
                        "ask for a new lease"
                    )
                self.last_used = time.monotonic()
                try:
                    return await operation(self.slot.sandbox)
                except SandboxError:
                    self.broken = True
                    raise
                finally:
                    self.last_used = time.monotonic()

        task = asyncio.ensure_future(guarded())
        # Its caller may be gone when it ends; the outcome is then only logged.
        task.add_done_callback(_log_orphan_failure)
        return await asyncio.shield(task)


def slot_error(slot: Slot) -> str:
    """What made a slot fail, for messages."""
    return str(slot.error) if slot.error is not None else "unknown failure"


def lease_source(slot: Slot) -> LeaseSource:
    """How a lease of ``slot`` is reported: a cold start, a warm hit, or a prefetched one."""
    if slot.origin == "prefetch" and slot.uses == 0:
        return "prefetched"
    if slot.origin == "lease" and slot.uses == 0:
        # Started for an earlier request that gave up; for this one it is still a cold start
        # unless it is already ready.
        return "warm" if slot.state == "ready" else "cold"
    return "warm"


def _log_orphan_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("an operation on a lease failed after its caller left: %s", task.exception())


__all__ = [
    "LeaseRecord",
    "Origin",
    "PoolBusy",
    "PoolClosed",
    "PoolError",
    "Slot",
    "SlotState",
    "UnknownInstance",
    "UnknownLease",
    "lease_source",
    "slot_error",
]
