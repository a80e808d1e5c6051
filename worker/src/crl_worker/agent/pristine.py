"""Pristine sandboxes kept ready for the integrity check, so a resolved episode does not wait
for one to start.

The integrity check grades a resolved verdict again in a sandbox nothing of the candidate ever
ran in (:func:`crl_worker.agent.episode.confirm_resolved`). Starting one (a clone, an
environment, the task's install) costs several times the evaluation itself. A
:class:`PristineSpares` starts one per task ahead of need, at the start of each episode
(``prefetch``), beside the agent's sandbox: by the time the agent submits, it is ready, and the
check costs one evaluation. A spare is used once (the candidate's code runs in it), and the next
one starts with the task's next episode; an episode that needs no check leaves the spare to the next
episode of the same task (a GRPO group, pass@k attempts). At most ``limit`` tasks keep one (the
least recently used goes first). A spare reads the base tree the split needs while it waits, and
a used one is closed in the background. The price: up to one more sandbox per task in flight, and one
sandbox start per task that no resolved episode uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from crl_worker.harness.integrity import base_tree
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: Seconds a spare gets to close before the caller moves on.
CLOSE_TIMEOUT = 120.0


class PristineSpares:
    """At most one started, never-used sandbox per task (see the module docs)."""

    def __init__(self, factory: Callable[[Task], Sandbox], *, limit: int = 8) -> None:
        self.factory = factory
        """Makes a sandbox of a task (the episode's own factory)."""
        self.limit = max(1, limit)
        """Tasks that keep a spare at once."""
        self._spares: OrderedDict[str, asyncio.Task[Sandbox]] = OrderedDict()
        self.hits = 0
        """Sandboxes handed out that were started ahead of need."""
        self.misses = 0
        """Sandboxes handed out that had to start on demand."""
        self._closing: set[asyncio.Future[None]] = set()

    async def _start(self, task: Task) -> Sandbox:
        sandbox = self.factory(task)
        try:
            await sandbox.start()
            if task.task_type != "classify":
                # The split's view of the base (read once per task), while nothing waits.
                await base_tree(sandbox, task)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sandbox.close(), CLOSE_TIMEOUT)
            raise
        return sandbox

    def prefetch(self, task: Task) -> None:
        """Start a spare of ``task`` unless one is there or starting."""
        key = task.instance_id
        found = self._spares.get(key)
        failed = found is not None and found.done() and (found.cancelled() or found.exception())
        if found is not None and not failed:
            self._spares.move_to_end(key)
            return
        starting = asyncio.ensure_future(self._start(task))
        starting.add_done_callback(_retrieve)
        self._spares[key] = starting
        while len(self._spares) > self.limit:
            _, oldest = self._spares.popitem(last=False)
            asyncio.ensure_future(_discard(oldest)).add_done_callback(_retrieve)

    async def take(self, task: Task) -> Sandbox:
        """A started sandbox of ``task`` that nothing ran in: the spare (waiting for the rest of
        its start), else a new one. The next spare starts with the task's next episode
        (:meth:`prefetch`). Raises what a failed start raises."""
        starting = self._spares.pop(task.instance_id, None)
        if starting is not None:
            try:
                sandbox = await starting
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("%s: a spare sandbox did not start: %s", task.instance_id, exc)
            else:
                self.hits += 1
                return sandbox
        self.misses += 1
        return await self._start(task)

    def dispose(self, sandbox: Sandbox) -> None:
        """Close a used sandbox in the background (off the episode's path); :meth:`close` waits
        for it."""
        closing = asyncio.ensure_future(_close(sandbox))
        closing.add_done_callback(_retrieve)
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def ready(self, task: Task) -> None:
        """Wait until the spare of ``task`` (if any) has started (measurements)."""
        starting = self._spares.get(task.instance_id)
        if starting is not None:
            await asyncio.wait({starting})

    async def close(self) -> None:
        """Close every spare (those still starting are stopped) and wait for the used sandboxes
        still closing."""
        spares = list(self._spares.values())
        self._spares.clear()
        await asyncio.gather(
            *(_discard(s) for s in spares), *list(self._closing), return_exceptions=True
        )


def _retrieve(future: asyncio.Future[Any]) -> None:
    # A spare that failed to start is reported when taken; nothing else reads its exception.
    if not future.cancelled():
        future.exception()


async def _discard(starting: asyncio.Task[Sandbox]) -> None:
    """Close a spare, stopping its start first when it is still starting."""
    if not starting.done():
        starting.cancel()
    try:
        sandbox = await starting
    except (asyncio.CancelledError, Exception):
        return
    await _close(sandbox)


async def _close(sandbox: Sandbox) -> None:
    try:
        await asyncio.wait_for(sandbox.close(), CLOSE_TIMEOUT)
    except Exception as exc:
        logger.warning("closing a spare sandbox failed: %s", exc)
