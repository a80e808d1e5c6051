"""The workers' progress reports as the reconcile reads them: from the progress ConfigMap of a
Benchmark (the runner's), a TrainingRun (the trainer's) or a RolloutPool that validates its
tasks (the gateway's), watched like every child."""

from __future__ import annotations

import logging
import threading
from typing import Any

from crl_operator import builders
from crl_operator.apply import controller_uid
from crl_operator.cache import Cache, Key
from crl_worker.api import Benchmark, RolloutPool, TrainingRun
from crl_worker.api.contract import PROGRESS_KEY
from crl_worker.api.progress import WireReport

log = logging.getLogger(__name__)


class ProgressReports:
    """Reads reports from the cache; remembers which malformed ones it logged (thread-safe)."""

    def __init__(self, cache: Cache) -> None:
        """``cache``: the reconciler's watch-fed cache."""
        self.cache = cache
        # resourceVersion of the progress ConfigMap whose malformed report was logged, per
        # Benchmark or TrainingRun: a bad report is logged once, not at every resync.
        self._bad: dict[Key, str] = {}
        self._lock = threading.Lock()

    def forget(self, key: Key) -> None:
        """Drop what was remembered about a resource that was deleted."""
        with self._lock:
            self._bad.pop(key, None)

    def read(
        self, resource: TrainingRun | Benchmark | RolloutPool, uid: str, model: type[WireReport]
    ) -> dict[str, Any] | None:
        """The report of the resource's worker, validated by ``model``, as JSON; None when
        there is none.

        A malformed report is logged (once per version of the ConfigMap) and ignored: the
        status keeps what it recorded before, and the reconcile goes on.
        """
        ns = resource.metadata.namespace or "default"
        name = builders.progress_name(resource)
        live = self.cache.get("ConfigMap", ns, name)
        if live is None or controller_uid(live) != uid:
            return None
        text = (live.get("data") or {}).get(PROGRESS_KEY)
        if not text:
            return None
        try:
            return model.parse(str(text)).to_wire()
        except ValueError as err:
            key = (resource.kind, ns, resource.metadata.name or "")
            version = str(live["metadata"].get("resourceVersion"))
            with self._lock:
                logged = self._bad.get(key) == version
                self._bad[key] = version
            if not logged:
                log.warning(
                    "ignoring the progress report of %s %s/%s in ConfigMap %s: %s",
                    resource.kind,
                    ns,
                    resource.metadata.name,
                    name,
                    err,
                )
            return None
