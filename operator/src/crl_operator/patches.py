"""The status patches the operator sends: JSON merge patches (RFC 7386) limited to the keys each
kind's reconcile owns, so that fields other writers set (the pool gateway's figures) stay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Status keys each kind's reconcile owns; the rest belongs to other writers.
OWNED_KEYS: dict[str, frozenset[str]] = {
    "TrainingRun": frozenset(
        {
            "observedGeneration",
            "conditions",
            "startTime",
            "completionTime",
            "step",
            "totalSteps",
            "policyVersion",
            "lastCheckpoint",
            "metrics",
            "children",
            "queue",
            "validation",
        }
    ),
    "RolloutPool": frozenset(
        {
            "observedGeneration",
            "conditions",
            "replicas",
            "desired",
            "ready",
            "leased",
            "coldStarting",
            "selector",
            "gatewayUrl",
            "validation",
        }
    ),
    "Benchmark": frozenset(
        {
            "observedGeneration",
            "conditions",
            "startTime",
            "completionTime",
            "progress",
            "resolveRate",
            "passAtK",
            "comparison",
            "resultsPath",
            "children",
            "queue",
            "validation",
        }
    ),
}


def status_patch(
    kind: str, current: Mapping[str, Any] | None, computed: Mapping[str, Any]
) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) taking `current` status to `computed` on the owned keys.

    Owned keys that `computed` no longer has are removed (set to null); keys owned by other
    writers are left alone. An empty patch means nothing changed: no request is needed.
    """
    cur = dict(current or {})
    patch: dict[str, Any] = {}
    for key in OWNED_KEYS[kind]:
        if key in computed:
            diff = merge_diff(cur.get(key), computed[key])
            if diff is not _SAME:
                patch[key] = diff
        elif cur.get(key) is not None:
            patch[key] = None
    return patch


class _Same:
    """Marker: no difference."""


_SAME: Any = _Same()


def merge_diff(old: Any, new: Any) -> Any:
    """The merge-patch value that turns `old` into `new`, or the marker `_SAME`."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: dict[str, Any] = {}
        for k, v in new.items():
            d = merge_diff(old.get(k), v)
            if d is not _SAME:
                out[k] = d
        for k in old:
            if k not in new and old[k] is not None:
                out[k] = None
        return out if out else _SAME
    if old == new:
        return _SAME
    return new


__all__ = ["OWNED_KEYS", "merge_diff", "status_patch"]
