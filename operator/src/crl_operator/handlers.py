"""The kopf side: watches that feed the cache and the queue, and the reconcile workers.

kopf watches the three custom resources and every child kind (children server-side filtered
by the `app.kubernetes.io/managed-by` label, sandbox pods by `coderepair.io/pool`). Each event
only updates the cache and enqueues the resource it concerns: the resource itself, the owner
of a child (its controller owner reference), the pool of a sandbox pod, and the runs and
benchmarks that reference a pool or a run by name. Workers take keys from a de-duplicating
queue and run :meth:`Reconciler.reconcile` in threads; a resync timer enqueues every resource
every ``--resync-seconds`` so drift is repaired even when no event arrives.

Why ``kopf.on.event`` rather than ``on.create/update/resume``: the change-detecting handlers
store kopf's diff base and progress on every object (a PATCH per change) and cannot be
triggered by a child's event. A level-based reconcile needs neither: it compares the world
with the spec every time. The equivalent of ``kopf.PermanentError`` is the `invalid` outcome
(condition Ready=False/InvalidSpec, no requeue), of ``kopf.TemporaryError`` the backoff
requeue after an API error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from crl_operator.apply import CHILD_KINDS, KINDS, Kube, KubeError, child_key
from crl_operator.builders.meta import LABEL_MANAGED_BY, MANAGED_BY
from crl_operator.cache import Cache, Key
from crl_operator.children import deployment_state, job_state
from crl_operator.kinds import HANDLERS
from crl_operator.metrics import CHILDREN
from crl_operator.reconcile import Reconciler
from crl_operator.settings import Settings, configure_kopf
from crl_operator.status import POOL_LABEL

log = logging.getLogger(__name__)

#: The operator's own kinds: one per handler (crl_operator.kinds).
PRIMARY_KINDS = tuple(HANDLERS)
#: Every kind the operator watches and lists at startup: its resources, their children, and
#: sandbox pods (for the pools' counts).
WATCHED_KINDS = (*PRIMARY_KINDS, *[k for k in CHILD_KINDS if k not in PRIMARY_KINDS], "Pod")


class Runtime:
    """State shared by the handlers of one operator process (passed to kopf as `memo`)."""

    def __init__(self, settings: Settings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube
        self.cache = Cache()
        self.reconciler = Reconciler(
            kube,
            self.cache,
            apply_threads=settings.apply_threads,
            image_registry=settings.image_registry,
        )
        self.queue: Any = None  # a WorkQueue, made inside the running loop
        self.executor = ThreadPoolExecutor(settings.workers, thread_name_prefix="reconcile")
        self.tasks: list[asyncio.Task[None]] = []

    # --- keys ----------------------------------------------------------------------------

    def keys_for(self, obj: Mapping[str, Any]) -> list[Key]:
        """The resources an event about `obj` concerns."""
        kind = str(obj.get("kind"))
        meta = obj.get("metadata") or {}
        ns = str(meta.get("namespace") or "")
        name = str(meta.get("name"))
        keys: list[Key] = []
        if kind in PRIMARY_KINDS:
            keys.append((kind, ns, name))
        for ref in meta.get("ownerReferences") or ():
            if (
                ref.get("controller")
                and ref.get("kind") in PRIMARY_KINDS
                and str(ref.get("apiVersion", "")).startswith("coderepair.io/")
            ):
                keys.append((str(ref["kind"]), ns, str(ref["name"])))
        if kind == "Pod":
            pool = (meta.get("labels") or {}).get(POOL_LABEL)
            if pool:
                keys.append(("RolloutPool", ns, str(pool)))
        if kind in ("RolloutPool", "TrainingRun"):
            # The runs and benchmarks that name this pool or run (the cache's reference
            # index: as many lookups as there are references, not a scan of every resource).
            keys.extend(self.cache.referencing(kind, ns, name))
        return keys

    # --- events --------------------------------------------------------------------------

    def on_event(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Update the cache with one watch event and enqueue what it concerns."""
        obj = dict(body)
        obj.setdefault("kind", kind)
        key = child_key(obj)
        if event_type == "DELETED":
            self.cache.remove(obj)
            self.reconciler.forget(key)
        else:
            self.cache.upsert(obj)
        keys = self.keys_for(obj)
        if kind in PRIMARY_KINDS and event_type != "DELETED" and self._own_echo(key, obj):
            keys = [k for k in keys if k != key]
        for k in keys:
            self.enqueue(k)

    def _own_echo(self, key: Key, obj: Mapping[str, Any]) -> bool:
        """Whether `obj` is the watch echo of the status we just wrote (no reconcile needed)."""
        rv = str(obj["metadata"].get("resourceVersion"))
        return self.reconciler.status_versions.get(key) == rv

    def enqueue(self, key: Hashable) -> None:
        """Add a key to the queue (no-op before the workers started)."""
        if self.queue is not None:
            self.queue.add(key)

    # --- startup -------------------------------------------------------------------------

    def label_selectors(self) -> dict[tuple[str, str, str], str]:
        """Server-side label selectors for the child watches."""
        out: dict[tuple[str, str, str], str] = {}
        for kind in CHILD_KINDS:
            if kind in PRIMARY_KINDS:
                continue
            info = KINDS[kind]
            group, _, version = info.api_version.rpartition("/")
            out[(group, version, info.plural)] = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        out[("", "v1", "pods")] = POOL_LABEL
        return out

    def initial_sync(self) -> int:
        """List every watched kind once, so the first reconciles see existing children.

        Without it, a restarted operator could reconcile a run before the trainer Job's watch
        delivered it, conclude the trainer must not exist yet, and prune it.
        """
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        count = 0
        selectors = {k[2]: v for k, v in self.label_selectors().items()}
        for kind in WATCHED_KINDS:
            info = KINDS[kind]
            for ns in scopes:
                try:
                    items = self.kube.list(
                        kind, namespace=ns, label_selector=selectors.get(info.plural)
                    )
                except KubeError as err:
                    log.warning("initial list of %s failed: %s", info.plural, err)
                    continue
                for item in items:
                    self.cache.upsert(item)
                    count += 1
        return count

    async def start(self) -> None:
        """Start the workers, the resync timer and the children gauge."""
        from crl_operator.workqueue import WorkQueue

        loop = asyncio.get_running_loop()
        n = await loop.run_in_executor(self.executor, self.initial_sync)
        log.info("initial sync: %d objects cached", n)
        self.queue = WorkQueue()
        for kind in PRIMARY_KINDS:
            for obj in self.cache.of_kind(kind):
                self.queue.add(child_key(obj))
        for i in range(self.settings.workers):
            self.tasks.append(asyncio.create_task(self._worker(), name=f"reconcile-worker-{i}"))
        self.tasks.append(asyncio.create_task(self._resync(), name="resync"))
        self.tasks.append(asyncio.create_task(self._gauge(), name="children-gauge"))

    async def stop(self) -> None:
        """Stop workers and timers; reconciles in flight finish in their threads."""
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.queue is not None:
            self.queue.cancel_timers()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key = await self.queue.get()
            try:
                outcome = await loop.run_in_executor(self.executor, self.reconciler.reconcile, key)
                if outcome.result == "error":
                    delay = self.queue.backoff(key)
                    log.info("reconcile of %s %s/%s failed; retrying in %.1fs", *key, delay)
                else:
                    self.queue.forget(key)
                    if outcome.requeue_after is not None:
                        self.queue.add_after(key, outcome.requeue_after)
            finally:
                self.queue.done(key)

    async def _resync(self) -> None:
        period = self.settings.resync_seconds
        while True:
            await asyncio.sleep(period)
            keys = [child_key(o) for kind in PRIMARY_KINDS for o in self.cache.of_kind(kind)]
            # Spread the resync over a fraction of the period instead of one burst.
            for i, key in enumerate(keys):
                self.queue.add_after(key, (i / max(1, len(keys))) * period * 0.5)

    async def _gauge(self) -> None:
        shown: set[tuple[str, str]] = set()
        while True:
            counts: dict[tuple[str, str], int] = {}
            for kind in ("Deployment", "Job", "Pod", "ConfigMap", "Service", "RolloutPool"):
                for obj in self.cache.of_kind(kind):
                    state = _child_state(obj)
                    counts[(kind, state)] = counts.get((kind, state), 0) + 1
            # Overwrite in place (a state that emptied reads 0) rather than clear and refill:
            # the metrics server runs in another thread and could scrape the empty gauge.
            for kind, state in shown - counts.keys():
                CHILDREN.labels(kind=kind, state=state).set(0)
            for (kind, state), n in counts.items():
                CHILDREN.labels(kind=kind, state=state).set(n)
            shown |= counts.keys()
            await asyncio.sleep(15)


def connection_info(kube: Kube) -> kopf.ConnectionInfo:
    """kopf's connection settings from the Kubernetes client's configuration."""
    conf = kube.api.configuration
    token = None
    auth = (conf.api_key or {}).get("authorization") or (conf.api_key or {}).get("BearerToken")
    if auth:
        token = str(auth).removeprefix("Bearer ").strip()
    return kopf.ConnectionInfo(
        server=str(conf.host),
        ca_path=conf.ssl_ca_cert,
        insecure=not conf.verify_ssl,
        token=token,
        certificate_path=conf.cert_file,
        private_key_path=conf.key_file,
    )


def _child_state(obj: Mapping[str, Any]) -> str:
    kind = obj.get("kind")
    if kind == "Deployment":
        return "ready" if deployment_state(obj).ready else "progressing"
    if kind == "Job":
        return {"succeeded": "finished", "failed": "failed", "running": "ready"}.get(
            job_state(obj).phase, "progressing"
        )
    if kind == "Pod":
        return str((obj.get("status") or {}).get("phase", "Unknown")).lower()
    return "present"


def build_registry(runtime: Runtime) -> kopf.OperatorRegistry:
    """A kopf registry with the startup/cleanup/probe handlers and one event handler per kind."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, runtime.settings)
        for (group, version, plural), selector in runtime.label_selectors().items():
            settings.watching.label_selectors[group, version, plural] = selector
        await runtime.start()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same identity as the reconciles' client. In a pod, kopf reads the projected
        # service-account token itself (it rotates; kopf logs in again on a 401).
        if runtime.settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return kopf.login_with_service_account(**kwargs)
        return connection_info(runtime.kube)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await runtime.stop()

    @kopf.on.probe(id="queue", registry=registry)
    async def probe(**_: Any) -> dict[str, int]:
        return {"cached": len(runtime.cache), "queued": len(runtime.queue or ())}

    def watch(kind: str) -> None:
        info = KINDS[kind]

        @kopf.on.event(info.api_version, info.plural, registry=registry, id=f"watch-{kind}")
        async def on_event(type: str | None, body: kopf.Body, **_: Any) -> None:
            # async: runs in the event loop, where the queue lives (sync handlers run in
            # threads, and asyncio queues are not thread-safe).
            runtime.on_event(kind, type, body)

    for kind in WATCHED_KINDS:
        watch(kind)
    return registry
