"""The operator's view of the cluster, fed by kopf's watch streams.

Reconciles read their resource and its children from here instead of sending GETs: one watch
per kind serves every reconcile, as an informer cache does in controller-runtime. Objects are
stored without ``metadata.managedFields`` (large, and never read) to keep memory small.
Indexes kept up to date on every add, update and delete answer the handlers' questions in time
proportional to the answer: children by controlling owner, sandbox pods by pool, objects by
kind, and the TrainingRuns and Benchmarks that reference a RolloutPool or a TrainingRun by name
(:func:`references`), so an event about a pool does not scan every run and benchmark.
Reconciles run in worker threads while kopf feeds the cache from the event loop, hence the lock.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from crl_operator.apply import child_key, controller_uid
from crl_operator.status import POOL_LABEL

Key = tuple[str, str, str]
"""(kind, namespace, name)."""


def _slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


def references(key: Key, obj: Mapping[str, Any]) -> set[Key]:
    """The resources `obj` names in its spec and that reconcile it when they change.

    A TrainingRun's ``spec.rollout.poolRef`` (a RolloutPool); a Benchmark's ``spec.poolRef``
    (a RolloutPool) and ``spec.model.checkpoint.trainingRun`` (a TrainingRun). References are
    by name within the referrer's namespace.
    """
    kind, ns, _ = key
    spec = obj.get("spec") or {}
    out: set[Key] = set()
    if kind == "TrainingRun":
        pool = ((spec.get("rollout") or {}).get("poolRef") or {}).get("name")
        if pool:
            out.add(("RolloutPool", ns, str(pool)))
    elif kind == "Benchmark":
        pool = (spec.get("poolRef") or {}).get("name")
        if pool:
            out.add(("RolloutPool", ns, str(pool)))
        run = ((spec.get("model") or {}).get("checkpoint") or {}).get("trainingRun")
        if run:
            out.add(("TrainingRun", ns, str(run)))
    return out


class Cache:
    """Objects by key, with indexes by controlling owner uid, sandbox pool, kind and reference."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._by_owner: dict[str, set[Key]] = defaultdict(set)
        self._by_pool: dict[tuple[str, str], set[Key]] = defaultdict(set)
        self._by_kind: dict[str, set[Key]] = defaultdict(set)
        self._by_ref: dict[Key, set[Key]] = defaultdict(set)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """Store the newest version of `obj` (from a watch event or a write's response)."""
        slim = _slim(obj)
        key = child_key(slim)
        with self._lock:
            old = self._objects.get(key)
            if old is not None:
                if old["metadata"].get("uid") == slim["metadata"].get("uid") and _older(slim, old):
                    return  # a stale event after our own write's response
                self._unindex(key, old)
            self._objects[key] = slim
            self._index(key, slim)

    def remove(self, obj: Mapping[str, Any]) -> None:
        """Forget `obj` (it was deleted), unless a newer incarnation replaced it."""
        key = child_key(obj)
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            old = self._objects.get(key)
            if old is None or (uid and old["metadata"].get("uid") != uid):
                return
            self._unindex(key, old)
            del self._objects[key]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None."""
        with self._lock:
            return self._objects.get((kind, namespace, name))

    def owned(self, uid: str) -> list[dict[str, Any]]:
        """Objects whose controlling owner has `uid`."""
        with self._lock:
            return [self._objects[k] for k in self._by_owner.get(uid, ()) if k in self._objects]

    def pool_pods(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        """Sandbox pods labelled with `pool`."""
        with self._lock:
            keys = self._by_pool.get((namespace, pool), ())
            return [self._objects[k] for k in keys if k in self._objects]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """Every cached object of `kind` (metrics and resyncs)."""
        with self._lock:
            return [self._objects[k] for k in self._by_kind.get(kind, ()) if k in self._objects]

    def referencing(self, kind: str, namespace: str, name: str) -> list[Key]:
        """Keys of the cached resources whose spec references `kind` `namespace`/`name`.

        See :func:`references` for which fields count. Sorted, so callers enqueue in a stable
        order.
        """
        with self._lock:
            return sorted(self._by_ref.get((kind, namespace, name), ()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def _index(self, key: Key, obj: Mapping[str, Any]) -> None:
        self._by_kind[key[0]].add(key)
        owner = controller_uid(obj)
        # Pods are never children the operator applies or prunes (the gateway owns sandbox
        # pods, the Job and ReplicaSet controllers the rest): they are indexed by pool only.
        if owner and key[0] != "Pod":
            self._by_owner[owner].add(key)
        pool = ((obj.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
        if key[0] == "Pod" and pool:
            self._by_pool[(key[1], pool)].add(key)
        for ref in references(key, obj):
            self._by_ref[ref].add(key)

    def _unindex(self, key: Key, obj: Mapping[str, Any]) -> None:
        self._by_kind[key[0]].discard(key)
        owner = controller_uid(obj)
        if owner and owner in self._by_owner:
            self._by_owner[owner].discard(key)
            if not self._by_owner[owner]:
                del self._by_owner[owner]
        pool = ((obj.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
        if key[0] == "Pod" and pool and (key[1], pool) in self._by_pool:
            self._by_pool[(key[1], pool)].discard(key)
            if not self._by_pool[(key[1], pool)]:
                del self._by_pool[(key[1], pool)]  # as for owners: a deleted pool leaves no set
        for ref in references(key, obj):
            referrers = self._by_ref.get(ref)
            if referrers is not None:
                referrers.discard(key)
                if not referrers:
                    del self._by_ref[ref]


def _older(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether `new` is an older version of the same object than `old`.

    resourceVersions are opaque by contract; etcd-backed servers hand out increasing integers,
    which is what every informer-style cache relies on when it orders its own writes and
    watch events. Anything that is not an integer is taken as newer.
    """
    try:
        return int(new["metadata"].get("resourceVersion")) < int(
            old["metadata"].get("resourceVersion")
        )
    except (TypeError, ValueError):
        return False
