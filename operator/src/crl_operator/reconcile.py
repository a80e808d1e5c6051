"""One idempotent reconcile for each kind: read, validate, observe, render, apply, prune, status.

The steps are the same for every kind; at each step that differs between kinds the reconcile
asks the kind's handler (:class:`~crl_operator.kinds.KindHandler`, one module per kind in
``crl_operator.kinds``), which calls the pure builders and status functions. Nothing here
branches on the kind.

Everything here runs in a worker thread (the Kubernetes client is synchronous) and reads the
cluster only through the watch-fed :class:`~crl_operator.cache.Cache`. The only requests are
writes: a server-side apply for a child whose live state differs from what the builders
render, a DELETE for a child the render no longer produces, and one status merge-patch when
the computed status differs from the stored one. A reconcile with nothing to change sends
nothing, which is what keeps the timer and the child events cheap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from crl_operator import conditions as c
from crl_operator.apply import Kube, KubeError, child_key, to_prune
from crl_operator.builders import BuildError, relocate_images
from crl_operator.cache import Cache, Key
from crl_operator.conditions import merge_conditions
from crl_operator.events import transition_events
from crl_operator.kinds import Context, ProgressReports, handlers
from crl_operator.kueue import KueueWorkloads
from crl_operator.metrics import ERRORS, LATENCY, RECONCILES, forget_condition, record_conditions
from crl_operator.patches import status_patch
from crl_operator.status import Problem
from crl_operator.writes import ChildWrites

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """How a reconcile ended and when to look again without an event."""

    result: str
    """`ok`, `error`, `invalid` or `gone` (the metric label)."""
    requeue_after: float | None = None
    """Reconcile again after this many seconds (e.g. when a Benchmark's TTL expires)."""


def format_validation_error(err: ValidationError) -> str:
    """Pydantic's errors as one line a user can act on: `path: message; ...`."""
    parts = []
    for e in err.errors()[:5]:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{loc}: {e.get('msg')}")
    more = len(err.errors()) - 5
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts) + " (fix the spec; the operator retries once it changes)"


class Reconciler:
    """The reconcile of every kind over a shared cache and client; the kind's own steps are its
    handler's (:data:`crl_operator.kinds.HANDLERS`)."""

    def __init__(
        self,
        kube: Kube,
        cache: Cache,
        *,
        now: Callable[[], datetime] | None = None,
        apply_threads: int = 0,
        image_registry: str | None = None,
    ):
        """`apply_threads`: threads shared by all reconciles to apply the children of one wave
        at once (0 applies them one after another in the reconciling thread). `image_registry`:
        the registry this project's images are run from (:func:`relocate_images`)."""
        self.kube = kube
        self.cache = cache
        self.image_registry = image_registry
        self.now = now or (lambda: datetime.now(UTC))
        # resourceVersion our last status patch produced, per resource: its watch echo is ours.
        self.status_versions: dict[Key, str] = {}
        # Condition types exported per resource (crl_operator_resource_condition), to drop them.
        self._condition_types: dict[Key, set[str]] = {}
        self.kueue = KueueWorkloads(kube, cache, self.now)
        self.writes = ChildWrites(kube, cache, apply_threads)
        self.reports = ProgressReports(cache)
        # The handler of each kind: the steps that differ between kinds (crl_operator.kinds).
        self.handlers = handlers(Context(cache, self.kueue, self.writes, self.reports, self.now))
        self._lock = threading.Lock()

    def forget(self, key: Key) -> None:
        """Drop what was remembered about an object that was deleted (keeps memory bounded)."""
        with self._lock:
            self.status_versions.pop(key, None)
            types = self._condition_types.pop(key, set())
        self.writes.forget(key)
        self.reports.forget(key)
        for type_ in types:
            forget_condition(*key, type_)
        handler = self.handlers.get(key[0])
        if handler is not None:
            handler.forget(key[1], key[2])

    # --- entry point ----------------------------------------------------------------------

    def reconcile(self, key: Key) -> Outcome:
        """Reconcile one resource; never raises (failures become conditions and a result)."""
        kind = key[0]
        started = time.perf_counter()
        try:
            outcome = self._reconcile(key)
        except Exception:  # the boundary: one resource's failure never stops the rest
            log.exception("reconcile of %s %s/%s failed", *key)
            ERRORS.labels(kind=kind, reason="Unexpected").inc()
            outcome = Outcome("error", None)
        LATENCY.labels(kind=kind).observe(time.perf_counter() - started)
        RECONCILES.labels(kind=kind, result=outcome.result).inc()
        return outcome

    def _reconcile(self, key: Key) -> Outcome:
        kind, ns, name = key
        body = self.cache.get(kind, ns, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return Outcome("gone")  # the garbage collector removes the children
        previous = dict(body.get("status") or {})
        generation = (body.get("metadata") or {}).get("generation")
        handler = self.handlers[kind]
        try:
            resource = handler.parse(body)
        except ValidationError as err:
            return self._invalid(key, body, previous, generation, format_validation_error(err))

        # What the later steps share: the resource, its uid, the stored status, the worker's
        # report and Kueue's admission.
        subject = handler.read(key, resource, str(body["metadata"]["uid"]), previous)
        uid = subject.uid
        # `problem`: e.g. a Benchmark whose checkpoint cannot be resolved yet (it still renders).
        state, problem = handler.render_state(subject)
        try:
            desired = relocate_images(handler.render(subject, state), self.image_registry)
        except BuildError as err:
            return self._invalid(key, body, previous, generation, str(err))

        try:
            early = handler.before_apply(subject)
        except KubeError as err:
            if err.namespace_terminating:
                return Outcome("gone")
            raise
        problem = problem or early

        for obj, failure in self.writes.ensure_all(desired):
            if failure.namespace_terminating:
                # The namespace is going away with the resource in it: nothing to repair.
                return Outcome("gone")
            ERRORS.labels(kind=kind, reason=c.APPLY_FAILED).inc()
            log.warning(
                "apply of %s %s for %s %s/%s failed: %s",
                obj["kind"],
                obj["metadata"]["name"],
                kind,
                ns,
                name,
                failure,
            )
            if failure.invalid and obj["kind"] == "Job":
                # A Job's pod template is immutable: replace the Job (the trainer resumes
                # from its last checkpoint); the next reconcile creates the new one.
                self.writes.replace_job(obj)
            problem = problem or Problem(
                c.APPLY_FAILED, f"{obj['kind']} {obj['metadata']['name']}: {failure.message}"
            )

        wanted = {child_key(o) for o in desired} | handler.retained(subject, state)
        for stale in to_prune(self.cache.owned(uid), uid, wanted):
            okind, ons, oname = child_key(stale)
            try:
                if self.kube.delete(okind, ons, oname, uid=stale["metadata"].get("uid")):
                    log.info("pruned %s %s/%s of %s %s", okind, ons, oname, kind, name)
                # Gone either way (Background propagation deletes the object itself at once);
                # the status below must not name it any more.
                self.cache.remove(stale)
            except KubeError as err:
                ERRORS.labels(kind=kind, reason=c.PRUNE_FAILED).inc()
                problem = problem or Problem(c.PRUNE_FAILED, f"{okind} {oname}: {err.message}")

        if problem is None:
            problem = handler.settle_admission(subject)
        computed = handler.status(subject, handler.observe(subject, problem), self.now())
        self._patch_status(key, body, previous, computed)
        if problem is not None and not handler.waits(problem):
            return Outcome("error", None)
        return Outcome("ok", handler.requeue_after(subject, computed))

    def _patch_status(
        self,
        key: Key,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        computed: Mapping[str, Any],
    ) -> None:
        kind, ns, name = key
        with self._lock:
            known = self._condition_types.get(key, set())
            self._condition_types[key] = record_conditions(
                kind, ns, name, computed.get("conditions"), known
            )
        self.handlers[kind].record(ns, name, computed)
        patch = status_patch(kind, previous, computed)
        if not patch:
            return
        self._warn_on_transition(body, previous, computed)
        for event in transition_events(kind, previous, computed):
            self.kube.event(body, event.type, event.reason, event.message)
        try:
            result = self.kube.patch_status(kind, ns, name, patch)
        except KubeError as err:
            ERRORS.labels(kind=kind, reason="StatusFailed").inc()
            if not err.not_found:
                raise
            return
        result.setdefault("kind", kind)
        self.cache.upsert(result)
        with self._lock:
            self.status_versions[key] = str(result["metadata"].get("resourceVersion"))

    def _warn_on_transition(
        self, body: Mapping[str, Any], previous: Mapping[str, Any], computed: Mapping[str, Any]
    ) -> None:
        """Post a Warning event when Ready turns False for a failure (not while starting up)."""
        new = c.find(computed.get("conditions"), c.READY)
        old = c.find(previous.get("conditions"), c.READY)
        if new is None or new.get("status") != "False":
            return
        if new.get("reason") not in (
            c.INVALID_SPEC,
            c.APPLY_FAILED,
            c.JOB_FAILED,
            c.PRUNE_FAILED,
            c.EXCEEDS_QUOTA,
            "Inadmissible",
        ):
            return
        if (
            old is not None
            and old.get("reason") == new.get("reason")
            and old.get("message") == new.get("message")
        ):
            return
        self.kube.event(body, "Warning", str(new["reason"]), str(new.get("message", "")))

    def _invalid(
        self,
        key: Key,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        generation: int | None,
        message: str,
    ) -> Outcome:
        """A spec the operator cannot use: say so in Ready and stop; no retry until it changes."""
        log.warning("%s %s/%s has an invalid spec: %s", *key, message)
        others = [
            c.Cond.stored(p) for p in previous.get("conditions") or () if p.get("type") != c.READY
        ]
        conds = [c.cond(c.READY, False, c.INVALID_SPEC, message), *others]
        computed = {
            **previous,
            "observedGeneration": generation,
            "conditions": merge_conditions(
                previous.get("conditions"), conds, generation=generation, now=self.now()
            ),
        }
        self._patch_status(key, body, previous, computed)
        return Outcome("invalid", None)
