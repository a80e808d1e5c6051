"""The lease logic of a pool: which sandbox a rollout gets, and what happens after it.

A :class:`SandboxPool` owns every sandbox of one pool and moves each through its states::

    starting ──► ready ──► leased ──► resetting ──► ready ...   (reuse)
        │          │          └──────► closing                  (dirty, broken, max uses)
        └──────────┴─────────────────► closing                  (failed start, trimmed, evicted)

Rules, in the order a lease request applies them: a ready sandbox of the instance is a warm hit;
else one of the instance that is starting or being reset is claimed and awaited; else a new one
starts if the pool is under ``max_sandboxes``; else the least recently used idle sandbox of
another instance is closed to make room; else the request waits (back-pressure) until capacity
frees up or its timeout passes (:class:`PoolBusy`). After a release the sandbox is reset and kept
warm for the same instance until ``max_uses``; dirty or broken ones are closed and replaced
while the pool is under its warm target; idle ones beyond the warm target are closed, least
recently used first. A lease that sees no request for ``lease_ttl`` seconds is taken back as
dirty, so a crashed rollout worker cannot hold a sandbox forever.

Everything here runs on one event loop; state changes never straddle an ``await``, so no lock
guards the tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from crl_worker.api.contract import SandboxState
from crl_worker.errors import SandboxError
from crl_worker.pool.metrics import PoolMetrics
from crl_worker.pool.models import (
    Lease,
    LeaseSource,
    PrefetchResponse,
    ReleaseResponse,
)
from crl_worker.pool.slots import (
    LeaseRecord,
    Origin,
    PoolBusy,
    PoolClosed,
    PoolError,
    Slot,
    UnknownInstance,
    UnknownLease,
    lease_source,
    slot_error,
)
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: Makes the sandbox for a task; the second argument is the id the pool gives the sandbox
#: (backends that name things, such as pods, derive the name from it).
SandboxFactory = Callable[[Task, str], Sandbox]

#: Seconds a start or reset in flight gets to finish when the gateway shuts down.
SHUTDOWN_GRACE = 30.0


class SandboxPool:
    """Sandboxes of one task set, leased to rollouts, reset and reused between them."""

    def __init__(
        self,
        tasks: Iterable[Task],
        factory: SandboxFactory,
        *,
        metrics: PoolMetrics,
        max_sandboxes: int,
        warm: int,
        reuse: bool = True,
        max_uses: int = 16,
        prefetch: int = 2,
        acquire_timeout: float = 600.0,
        lease_ttl: float = 7200.0,
        prefetch_ttl: float = 900.0,
        maintenance_interval: float = 5.0,
    ) -> None:
        if max_sandboxes < 1:
            raise ValueError("max_sandboxes must be at least 1")
        if not 0 <= warm <= max_sandboxes:
            raise ValueError("the warm target must be between 0 and max_sandboxes")
        self.tasks: Mapping[str, Task] = {task.instance_id: task for task in tasks}
        self._factory = factory
        self.metrics = metrics
        self.max_sandboxes = max_sandboxes
        self.warm = warm
        self.reuse = reuse
        self.max_uses = max_uses
        self.prefetch_depth = prefetch
        self.acquire_timeout = acquire_timeout
        self.lease_ttl = lease_ttl
        self.prefetch_ttl = prefetch_ttl
        self._maintenance_interval = maintenance_interval
        self._slots: dict[str, Slot] = {}
        self._leases: dict[str, LeaseRecord] = {}
        self._wakeup = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._maintainer: asyncio.Task[None] | None = None
        self._waiting = 0
        self._closed = False
        self.holding: str | None = None
        """While set, why nothing is leased yet (the gateway validates its tasks): lease
        requests wait for :meth:`serve_only`, prefetches are skipped."""
        self.quarantined: dict[str, str] = {}
        """Tasks validation found broken, with their reason: never leased."""
        metrics.max_sandboxes.labels(metrics.pool).set(max_sandboxes)
        metrics.warm_target.labels(metrics.pool).set(warm)
        self._publish()

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the maintenance loop (lease expiry, trimming, gauges)."""
        if self._maintainer is None:
            self._maintainer = asyncio.create_task(self._maintain(), name="pool-maintenance")

    async def close(self) -> None:
        """Close every sandbox and stop; lease requests fail with :class:`PoolClosed` after."""
        self._closed = True
        self._notify()
        if self._maintainer is not None:
            self._maintainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintainer
        for slot in list(self._slots.values()):
            self._close_slot(slot)
        self._leases.clear()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        self._publish()

    def serve_only(self, quarantined: Mapping[str, str]) -> None:
        """End the hold: serve every task but the ``quarantined`` ones (instance id: reason),
        and wake the lease requests that waited."""
        self.quarantined = dict(quarantined)
        self.tasks = {i: t for i, t in self.tasks.items() if i not in self.quarantined}
        self.holding = None
        self._notify()

    # --- queries ---------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Sandboxes per state (closing ones excluded: they no longer count)."""
        counts = {"starting": 0, "ready": 0, "leased": 0, "resetting": 0}
        for slot in self._slots.values():
            if slot.state in counts:
                counts[slot.state] += 1
        return counts

    def lease(self, lease_id: str) -> LeaseRecord:
        """The live lease with this id."""
        record = self._leases.get(lease_id)
        if record is None:
            raise UnknownLease(
                f"no lease {lease_id!r}: it was released, expired after {self.lease_ttl:.0f} s"
                " without requests, or never existed; ask for a new lease"
            )
        return record

    # --- leasing ---------------------------------------------------------------------------

    async def acquire(self, instance_id: str, timeout: float | None = None) -> Lease:
        """Lease a sandbox of ``instance_id``, waiting for capacity up to ``timeout`` seconds."""
        begin = time.monotonic()
        deadline = begin + (self.acquire_timeout if timeout is None else timeout)
        while self.holding is not None and not self._closed:
            # The gateway validates its tasks: wait (up to the request's timeout) to learn
            # whether this one is served at all.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PoolBusy(f"{self.holding}; retry later", retry_after=30.0)
            wakeup = self._wakeup
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), remaining)
        task = self._task(instance_id)
        self._waiting += 1
        self._publish()
        try:
            while True:
                if self._closed:
                    raise PoolClosed("the pool gateway is shutting down; retry on another one")
                slot, source = self._claim(task)
                if slot is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self.metrics.acquire_timeouts.labels(self._pool_label).inc()
                        raise PoolBusy(
                            f"all {self.max_sandboxes} sandboxes of the pool stayed busy for"
                            f" {time.monotonic() - begin:.1f} s; retry later or raise maxSandboxes",
                            retry_after=self._retry_after(),
                        )
                    wakeup = self._wakeup
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wakeup.wait(), remaining)
                    continue
                try:
                    if slot.state != "ready":
                        await slot.settled.wait()
                except BaseException:
                    slot.claimed = False
                    self._notify()
                    raise
                slot.claimed = False
                if slot.state != "ready":
                    # The start or reset we waited for failed (the slot is gone). A sandbox
                    # started for this very request failing is the request's answer; a warm
                    # one failing its reset only means trying again.
                    if source == "cold":
                        raise SandboxError(
                            f"could not start a sandbox for {instance_id}: {slot_error(slot)}"
                        )
                    continue
                return self._lease(slot, source, time.monotonic() - begin)
        finally:
            self._waiting -= 1
            self._publish()

    def _claim(self, task: Task) -> tuple[Slot | None, LeaseSource]:
        """Pick (synchronously) the slot a request for ``task`` gets, starting one if needed."""
        mine = [
            slot
            for slot in self._slots.values()
            if slot.task.instance_id == task.instance_id and not slot.claimed
        ]
        ready = [slot for slot in mine if slot.state == "ready"]
        for slot in [s for s in ready if not s.sandbox.alive]:
            # An idle session can die (a cut exec stream, a killed process): replace, not lease.
            logger.warning("idle sandbox %s is no longer usable; replacing it", slot.id)
            self.metrics.sandboxes_replaced.labels(self._pool_label, "broken").inc()
            self._close_slot(slot)
            ready.remove(slot)
        if ready:
            slot = max(ready, key=lambda s: s.idle_since)  # the most recently used is warmest
            slot.claimed = True
            return slot, lease_source(slot)
        pending = [slot for slot in mine if slot.state in ("starting", "resetting")]
        if pending:
            slot = pending[0]
            slot.claimed = True
            return slot, lease_source(slot)
        if self._active() >= self.max_sandboxes and not self._evict_one():
            return None, "cold"
        slot = self._new_slot(task, "lease")
        slot.claimed = True
        return slot, "cold"

    def _lease(self, slot: Slot, source: LeaseSource, waited: float) -> Lease:
        slot.state = "leased"
        slot.sandbox.report_state(SandboxState.LEASED)
        slot.protected_until = 0.0
        record = LeaseRecord(id=f"lease-{secrets.token_hex(8)}", slot=slot, source=source)
        self._leases[record.id] = record
        self.metrics.lease(source, waited)
        self._publish()
        logger.info(
            "leased %s (%s, %s, use %d) as %s after %.3f s",
            slot.id,
            slot.task.instance_id,
            source,
            slot.uses + 1,
            record.id,
            waited,
        )
        return Lease(
            lease_id=record.id,
            instance_id=slot.task.instance_id,
            sandbox_id=slot.id,
            workdir=slot.sandbox.workdir,
            source=source,
            uses=slot.uses,
            wait_seconds=waited,
        )

    async def release(
        self, lease_id: str, *, dirty: bool = False, broken: bool = False
    ) -> ReleaseResponse:
        """End a lease: reset and keep the sandbox warm, or close (and replace) it."""
        record = self.lease(lease_id)
        del self._leases[lease_id]
        record.released = True
        # An operation still running on the lease (a client gave up on a long command) would
        # race the reset: wait for it, then decide.
        async with record.lock:
            pass
        slot = record.slot
        if slot.state == "closing":
            # The gateway shut down while the operation ended: a reset now would race the
            # close (its git could recreate what the close removed).
            self._notify()
            return ReleaseResponse(action="close", reason="shutting-down")
        slot.uses += 1
        reason = ""
        if broken or record.broken or not slot.sandbox.alive:
            reason = "broken"
        elif dirty:
            reason = "dirty"
        elif not self.reuse:
            reason = "reuse-disabled"
        elif slot.uses >= self.max_uses:
            reason = "max-uses"
        logger.info("released %s from %s (%s)", record.id, slot.id, reason or "clean")
        if reason:
            self._close_slot(slot)
            if reason == "reuse-disabled":
                response = ReleaseResponse(action="close", reason=reason)
            else:
                self.metrics.sandboxes_replaced.labels(self._pool_label, reason).inc()
                self._replace(slot.task)
                response = ReleaseResponse(action="replace", reason=reason)
        else:
            slot.state = "resetting"
            slot.sandbox.report_state(SandboxState.STARTING)  # not leasable until the reset is done
            slot.settled = asyncio.Event()
            slot.operation = self._spawn(self._reset_slot(slot), f"reset-{slot.id}")
            response = ReleaseResponse(action="reuse")
        self._notify()
        return response

    async def prefetch(self, instance_ids: list[str]) -> PrefetchResponse:
        """Start sandboxes ahead for the first ``prefetch`` announced instances."""
        started: list[str] = []
        already: list[str] = []
        skipped: list[str] = []
        seen: set[str] = set()
        for instance_id in instance_ids:
            if instance_id in seen:
                continue
            seen.add(instance_id)
            task = self.tasks.get(instance_id)
            full = len(started) + len(already) >= self.prefetch_depth
            if task is None or full or self._closed or self.holding is not None:
                skipped.append(instance_id)
                continue
            waiting = [
                slot
                for slot in self._slots.values()
                if slot.task.instance_id == instance_id
                and not slot.claimed
                and slot.state in ("starting", "ready", "resetting")
            ]
            if waiting:
                # Keep it: the announcement says it will be leased soon.
                for slot in waiting:
                    slot.protected_until = max(
                        slot.protected_until, time.monotonic() + self.prefetch_ttl
                    )
                already.append(instance_id)
            elif self._active() < self.max_sandboxes:
                self._new_slot(task, "prefetch")
                started.append(instance_id)
            else:
                skipped.append(instance_id)
        self._publish()
        return PrefetchResponse(started=started, already=already, skipped=skipped)

    # --- slots -----------------------------------------------------------------------------

    def _new_slot(self, task: Task, origin: Origin) -> Slot:
        slot_id = f"sbx-{secrets.token_hex(5)}"
        sandbox = self._factory(task, slot_id)
        slot = Slot(id=slot_id, task=task, sandbox=sandbox, state="starting", origin=origin)
        if origin == "prefetch":
            slot.protected_until = time.monotonic() + self.prefetch_ttl
        self._slots[slot_id] = slot
        self.metrics.sandboxes_started.labels(self._pool_label, origin).inc()
        slot.operation = self._spawn(self._start_slot(slot), f"start-{slot_id}")
        self._publish()
        return slot

    async def _start_slot(self, slot: Slot) -> None:
        began = time.monotonic()
        try:
            await slot.sandbox.start()
        except Exception as exc:  # any failure of a backend's start is a failed sandbox
            if slot.state != "closing":
                logger.warning(
                    "sandbox %s for %s failed to start: %s", slot.id, slot.task.instance_id, exc
                )
                self.metrics.failures.labels(self._pool_label, "start").inc()
                slot.error = exc
                self._close_slot(slot)
            return
        finally:
            # Whatever happened (cancelled at shutdown included), nobody may wait forever.
            slot.settled.set()
        logger.info(
            "sandbox %s for %s started in %.2f s",
            slot.id,
            slot.task.instance_id,
            time.monotonic() - began,
        )
        if slot.state == "starting":
            slot.state = "ready"
            slot.idle_since = time.monotonic()
            slot.sandbox.report_state(SandboxState.READY)
        self._notify()

    async def _reset_slot(self, slot: Slot) -> None:
        try:
            await slot.sandbox.reset()
            if not slot.sandbox.alive:
                raise SandboxError("the session was not usable after the reset")
        except Exception as exc:  # a failed reset means a fresh sandbox, whatever the cause
            if slot.state != "closing":
                logger.warning("reset of sandbox %s failed, replacing it: %s", slot.id, exc)
                self.metrics.failures.labels(self._pool_label, "reset").inc()
                self.metrics.sandboxes_replaced.labels(self._pool_label, "reset-failed").inc()
                slot.error = exc
                self._close_slot(slot)
                self._replace(slot.task)
            return
        finally:
            slot.settled.set()
        if slot.state == "resetting":
            slot.state = "ready"
            slot.idle_since = time.monotonic()
            slot.sandbox.report_state(SandboxState.READY)
        self._notify()

    def _replace(self, task: Task) -> None:
        """Start a fresh sandbox for ``task`` when the pool is under its warm target."""
        if self._closed or self._idle() >= self.warm or self._active() >= self.max_sandboxes:
            return
        self._new_slot(task, "replace")

    def _close_slot(self, slot: Slot) -> None:
        if slot.state == "closing":
            return
        slot.state = "closing"
        self._slots.pop(slot.id, None)
        self._spawn(self._close_sandbox(slot), f"close-{slot.id}")
        self._wake()
        self._publish()

    async def _close_sandbox(self, slot: Slot) -> None:
        operation = slot.operation
        if (
            operation is not None
            and not operation.done()
            and operation is not asyncio.current_task()
        ):
            # Closing under a start or reset would race it (a reset's git could recreate what
            # the close removed): let it end; at shutdown, cancel it after a grace period.
            await asyncio.wait({operation}, timeout=SHUTDOWN_GRACE if self._closed else None)
            if not operation.done():
                operation.cancel()
            with contextlib.suppress(BaseException):
                await operation
        try:
            await slot.sandbox.close()
        except Exception as exc:  # closing is best effort; the backend's GC catches leftovers
            logger.warning("closing sandbox %s failed: %s", slot.id, exc)
            self.metrics.failures.labels(self._pool_label, "close").inc()

    def _evict_one(self) -> bool:
        """Close the least recently used idle sandbox (unprotected first) to free a slot."""
        idle = [s for s in self._slots.values() if s.state == "ready" and not s.claimed]
        if not idle:
            return False
        now = time.monotonic()
        victim = min(idle, key=lambda s: (s.protected_until > now, s.idle_since))
        logger.info(
            "evicting idle sandbox %s (%s) to make room", victim.id, victim.task.instance_id
        )
        self._close_slot(victim)
        return True

    def _trim(self) -> None:
        """Close idle sandboxes beyond the warm target, least recently used first."""
        now = time.monotonic()
        while self._idle() > self.warm:
            idle = [
                s
                for s in self._slots.values()
                if s.state == "ready" and not s.claimed and s.protected_until <= now
            ]
            if not idle:
                return
            victim = min(idle, key=lambda s: s.idle_since)
            logger.info("closing idle sandbox %s beyond the warm target", victim.id)
            self._close_slot(victim)

    def _expire_leases(self) -> None:
        now = time.monotonic()
        for record in list(self._leases.values()):
            if now - record.last_used > self.lease_ttl and not record.lock.locked():
                logger.warning(
                    "lease %s saw no request for %.0f s; taking its sandbox back",
                    record.id,
                    self.lease_ttl,
                )
                self._spawn(self._expire(record.id), f"expire-{record.id}")

    async def _expire(self, lease_id: str) -> None:
        with contextlib.suppress(UnknownLease):  # released meanwhile
            await self.release(lease_id, dirty=True)

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self._maintenance_interval)
            try:
                self._expire_leases()
                self._trim()
                self._publish()
            except Exception:  # the loop must survive one bad round
                logger.exception("pool maintenance failed")

    # --- helpers ---------------------------------------------------------------------------

    @property
    def _pool_label(self) -> str:
        return self.metrics.pool

    def _task(self, instance_id: str) -> Task:
        task = self.tasks.get(instance_id)
        if task is None and instance_id in self.quarantined:
            raise UnknownInstance(
                f"the pool quarantined task {instance_id!r} when it validated its tasks"
                f" ({self.quarantined[instance_id]}); it is not served"
            )
        if task is None:
            raise UnknownInstance(
                f"the pool has no task {instance_id!r}; it serves {len(self.tasks)} instances"
                " from its task source (check the instance id and the pool's filter)"
            )
        return task

    def _active(self) -> int:
        return sum(1 for s in self._slots.values() if s.state != "closing")

    def _idle(self) -> int:
        """Sandboxes that exist and are not leased (ready, starting, resetting) and unclaimed."""
        return sum(
            1
            for s in self._slots.values()
            if s.state in ("ready", "starting", "resetting") and not s.claimed
        )

    def _retry_after(self) -> float:
        return max(1.0, min(30.0, float(self._waiting)))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _wake(self) -> None:
        """Wake every waiting request; each re-checks the pool."""
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    def _notify(self) -> None:
        """Wake waiting requests and keep the pool within its targets."""
        self._wake()
        if not self._closed:
            self._trim()
        self._publish()

    def _publish(self) -> None:
        self.metrics.set_states(self.counts())
        self.metrics.waiting.labels(self._pool_label).set(self._waiting)


__all__ = [
    "SHUTDOWN_GRACE",
    "LeaseRecord",
    "PoolBusy",
    "PoolClosed",
    "PoolError",
    "SandboxFactory",
    "SandboxPool",
    "UnknownInstance",
    "UnknownLease",
]
