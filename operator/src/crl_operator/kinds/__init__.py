"""One home per kind: the handler the reconcile asks at each step that differs between kinds.

| module | what |
|---|---|
| `base.py` | :class:`KindHandler` (the steps a kind implements), the :class:`Subject` of one reconcile its steps share, and the :class:`Context` handlers read the cluster through |
| `workload.py` | :class:`~crl_operator.kinds.workload.WorkloadKind`: what the kinds that run one worker Job share (Kueue, the progress report, the inference gate, the pool) |
| `progress.py` | :class:`ProgressReports`: the workers' progress reports read from their ConfigMaps |
| `trainingrun.py`, `rolloutpool.py`, `benchmark.py` | one handler per kind |

Adding a kind: its model in ``crl_worker.api`` (and :data:`crl_worker.api.KINDS`), its children
in ``crl_operator.builders`` (and its branch of ``render``), one module here with its handler,
registered in :data:`HANDLERS` (docs/development.md, "Adding a kind", lists the tables that name
every kind).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crl_operator.kinds.base import Context, KindHandler, Subject
from crl_operator.kinds.benchmark import CHECKPOINT_UNAVAILABLE, BenchmarkKind
from crl_operator.kinds.progress import ProgressReports
from crl_operator.kinds.rolloutpool import RolloutPoolKind
from crl_operator.kinds.trainingrun import TrainingRunKind

#: The handler class of each kind, by the kind's name (``crl_worker.api.KINDS``'s keys).
HANDLERS: Mapping[str, type[KindHandler[Any]]] = {
    h.kind: h for h in (TrainingRunKind, RolloutPoolKind, BenchmarkKind)
}


def handlers(ctx: Context) -> dict[str, KindHandler[Any]]:
    """One handler of every kind over ``ctx``, by the kind's name."""
    return {kind: cls(ctx) for kind, cls in HANDLERS.items()}


__all__ = [
    "CHECKPOINT_UNAVAILABLE",
    "HANDLERS",
    "BenchmarkKind",
    "Context",
    "KindHandler",
    "ProgressReports",
    "RolloutPoolKind",
    "Subject",
    "TrainingRunKind",
    "handlers",
]
