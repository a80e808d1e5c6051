"""How the reconcile writes children: in two waves (what the workloads refer to, then the
workloads), each child applied only when the live one differs from what it would become, and
the pool's token Secret created once, never applied (:mod:`crl_operator.apply` makes the
requests)."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crl_operator import builders
from crl_operator.apply import (
    Kube,
    KubeError,
    child_key,
    contains,
    controller_uid,
    fingerprint,
    kind_info,
)
from crl_operator.cache import Cache, Key
from crl_operator.metrics import APPLIES_SKIPPED
from crl_worker.api import RolloutPool
from crl_worker.api.contract import Annotation

log = logging.getLogger(__name__)

#: Annotation on every child: the fingerprint of the manifest last applied. A render that
#: drops a field changes it, which a comparison of fields alone would miss.
APPLIED_ANNOTATION = Annotation.APPLIED

#: Children that run pods (or make them, as a RolloutPool does): applied in the second wave,
#: after the ConfigMaps, RBAC and Services they refer to.
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job", "Pod", "RolloutPool"})


class ChildWrites:
    """The reconcile's writes of children, over the shared client and cache (thread-safe)."""

    def __init__(self, kube: Kube, cache: Cache, apply_threads: int = 0) -> None:
        """``apply_threads``: threads shared by all reconciles to apply the children of one
        wave at once (0 applies them one after another in the reconciling thread)."""
        self.kube = kube
        self.cache = cache
        self._lock = threading.Lock()
        # (kind, ns, name) -> (fingerprint of the manifest we applied, resourceVersion returned)
        self._applied: dict[Key, tuple[str, str]] = {}
        # RolloutPools (key -> uid) whose token Secret is known to exist: created at most once
        # per pool and operator process, never re-created with a new value.
        self._tokens: dict[Key, str] = {}
        self._apply_pool = (
            ThreadPoolExecutor(apply_threads, thread_name_prefix="apply") if apply_threads else None
        )

    def forget(self, key: Key) -> None:
        """Drop what was remembered of an object that was deleted."""
        with self._lock:
            self._applied.pop(key, None)
            self._tokens.pop(key, None)

    def ensure_all(
        self, desired: Sequence[Mapping[str, Any]]
    ) -> list[tuple[Mapping[str, Any], KubeError]]:
        """Apply `desired` in two waves; returns the failures in `desired`'s order.

        First what the workloads refer to (ConfigMaps, RBAC, Services, Secrets), then the
        workloads, so a pod never starts before its ServiceAccount or ConfigMap exists. The
        children of one wave are independent and go to the API server at once: a reconcile
        costs two round trips instead of one per child, which is what bounds the operator at
        a thousand TrainingRuns (perf/operator_scale.py). A namespace that is terminating
        stops before the second wave.
        """
        failed: list[tuple[Mapping[str, Any], KubeError]] = []
        waves = (
            [o for o in desired if o["kind"] not in WORKLOAD_KINDS],
            [o for o in desired if o["kind"] in WORKLOAD_KINDS],
        )
        for wave in waves:
            if self._apply_pool is None or len(wave) < 2:
                errors = [self._try_ensure(o) for o in wave]
            else:
                errors = list(self._apply_pool.map(self._try_ensure, wave))
            failed.extend((o, e) for o, e in zip(wave, errors, strict=True) if e is not None)
            if any(e.namespace_terminating for _, e in failed):
                break
        return failed

    def _try_ensure(self, obj: Mapping[str, Any]) -> KubeError | None:
        try:
            self._ensure(obj)
        except KubeError as err:
            return err
        return None

    def _ensure(self, obj: Mapping[str, Any]) -> None:
        """Apply `obj` unless the live child is already what it would become.

        Skipped when the live child carries the fingerprint of this exact manifest (so no field
        was dropped from what we apply) and still holds every field we set (nobody edited one),
        or when nothing changed since our own last apply of it (covers values the server
        normalizes, such as quantities).
        """
        key = child_key(obj)
        live = self.cache.get(*key)
        fp = fingerprint(obj)
        desired = with_fingerprint(obj, fp)
        if live is not None:
            theirs, mine = controller_uid(live), controller_uid(obj)
            if theirs and mine and theirs != mine:
                # Most often what a deleted resource of the same name left for the garbage
                # collector. Applying would adopt it (our field manager owns the old owner
                # reference, so the apply swaps it) with its state: a finished Job, the old
                # runner's progress report. Wait for the collector instead.
                raise KubeError(
                    409,
                    "Conflict",
                    f"{key[0]} {key[2]} already exists, controlled by another owner (uid"
                    f" {theirs}): left by a deleted resource of the same name, it goes with the"
                    " garbage collector; otherwise delete or rename it",
                )
            rv = str(live["metadata"].get("resourceVersion"))
            stamped = (live["metadata"].get("annotations") or {}).get(APPLIED_ANNOTATION) == fp[:16]
            if self._applied.get(key) == (fp, rv) or (stamped and contains(live, desired)):
                APPLIES_SKIPPED.labels(kind=key[0]).inc()
                return
        result = self.kube.apply(desired)
        result.setdefault("kind", obj["kind"])
        result.setdefault("apiVersion", obj["apiVersion"])
        self.cache.upsert(result)
        with self._lock:
            self._applied[key] = (fp, str(result["metadata"].get("resourceVersion")))
        # Only real applies reach here (a child that already matches is skipped above), so the
        # line says what the operator changed, and when.
        log.info("applied %s %s/%s", *key)

    def ensure_token(self, key: Key, pool: RolloutPool, namespace: str, uid: str) -> None:
        """Create the pool's token Secret unless it exists: a create that the API server
        refuses with 409 when it does (the operator never reads Secrets). Never applied: a
        server-side apply of a freshly drawn value would rotate the token at every reconcile
        and cut off every client holding the old one."""
        if self._tokens.get(key) == uid:
            return
        secret = builders.token_secret(pool, namespace, secrets.token_urlsafe(32))
        try:
            self.kube.request("POST", "Secret", kind_info("Secret").path(namespace), body=secret)
            log.info("created the token Secret %s/%s", namespace, secret["metadata"]["name"])
        except KubeError as err:
            if err.status != 409:
                raise
        with self._lock:
            self._tokens[key] = uid

    def replace_job(self, obj: Mapping[str, Any]) -> None:
        """Delete the live Job of ``obj`` (a Job's template cannot change: it is made anew)."""
        kind, ns, name = child_key(obj)
        live = self.cache.get(kind, ns, name)
        uid = live["metadata"].get("uid") if live else None
        try:
            self.kube.delete(kind, ns, name, uid=uid, propagation="Background")
        except KubeError as err:
            log.warning("could not replace Job %s/%s: %s", ns, name, err)


def with_fingerprint(obj: Mapping[str, Any], fp: str) -> dict[str, Any]:
    """`obj` with its fingerprint annotation added (a shallow copy; `obj` is not changed)."""
    meta = dict(obj["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_ANNOTATION: fp[:16]}
    return {**obj, "metadata": meta}


__all__ = ["APPLIED_ANNOTATION", "WORKLOAD_KINDS", "ChildWrites", "with_fingerprint"]
