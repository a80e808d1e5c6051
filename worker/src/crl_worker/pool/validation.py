"""A pool that validates its tasks before it serves them (the RolloutPool's ``spec.validation``).

The gateway runs :func:`~crl_worker.harness.validate.validate_tasks` on sandboxes made by its
own factory (pods of the pool in a cluster), at most ``maxSandboxes`` at a time, before it
leases anything: the gold patch must resolve, no patch must not, ``runs`` runs of each must
agree. The quarantined tasks are never leased (:meth:`SandboxPool.serve_only`).

Verdicts are cached by each task's content hash under ``$CRL_CACHE_DIR/validation`` (the
operator mounts ``spec.validation.cache`` there, so a restarted gateway does not pay again),
and the full list of quarantined tasks is written to
``$CRL_CACHE_DIR/quarantine/<pool>/quarantine.json``. In a cluster the counts, the most common
reasons and the first quarantined tasks go into the pool's progress ConfigMap
(``$CRL_PROGRESS_CONFIGMAP``, key ``progress.json``, a
:class:`~crl_worker.api.progress.PoolProgress`), which the operator copies into the
RolloutPool's status.

Only gold patches, which the task set's authors wrote, are graded here: no candidate patch ever
reaches this path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crl_worker.api.contract import POOL_FIELD_MANAGER, PROGRESS_KEY, Env
from crl_worker.api.progress import MAX_LISTED_QUARANTINED, MAX_REASONS, PoolProgress
from crl_worker.harness.validate import (
    TaskVerdict,
    ValidationReport,
    validate_tasks,
    write_quarantine,
)
from crl_worker.pool.config import GatewayConfig
from crl_worker.pool.leases import SandboxFactory
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.repos import cache_dir
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: Sends one report (never raises).
Publish = Callable[[PoolProgress], Awaitable[None]]

#: Seconds between two progress reports while validating (the last one is sent at once).
REPORT_INTERVAL = 5.0


def quarantine_folder(pool: str) -> Path:
    """Where the pool's ``quarantine.json`` is written."""
    return cache_dir() / "quarantine" / pool


def progress_report(
    total: int, verdicts: Sequence[TaskVerdict], *, finished: bool = False
) -> PoolProgress:
    """The report of a validation that has found ``verdicts`` of ``total`` tasks so far."""
    bad = [v for v in verdicts if not v.ok]
    counts: dict[str, int] = {}
    for verdict in bad:
        counts[verdict.reason[:128]] = counts.get(verdict.reason[:128], 0) + 1
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_REASONS]
    return PoolProgress.model_validate(
        {
            "total": total,
            "validated": len(verdicts),
            "quarantined": len(bad),
            "cached": sum(v.cached for v in verdicts),
            "reasons": dict(common),
            "tasks": [
                {"instanceId": v.instance_id[:256], "reason": v.reason[:128]}
                for v in bad[:MAX_LISTED_QUARANTINED]
            ],
            "finished": finished,
        }
    )


def sandbox_kind(config: GatewayConfig) -> dict[str, Any]:
    """What of the pool's sandboxes decides a verdict (part of each task's cache key)."""
    if config.backend == "local":
        return {"type": "local"}
    image = config.settings.sandbox.image_template or config.image_template
    return {"type": "kubernetes", **({"image": image} if image else {})}


async def validate_pool(
    config: GatewayConfig,
    tasks: Sequence[Task],
    factory: SandboxFactory,
    *,
    publish: Publish | None = None,
    interval: float = REPORT_INTERVAL,
) -> ValidationReport:
    """Validate ``tasks`` on sandboxes from ``factory`` (at most ``maxSandboxes`` at a time),
    write ``quarantine.json``, and report progress through ``publish`` every ``interval``
    seconds and once at the end (``finished``)."""
    spec = config.settings.validation
    verdicts: list[TaskVerdict] = []
    changed = asyncio.Event()
    changed.set()

    def make(task: Task) -> Sandbox:
        return factory(task, f"val-{secrets.token_hex(5)}")

    def found(verdict: TaskVerdict) -> None:
        verdicts.append(verdict)
        changed.set()

    async def report_while_running() -> None:
        assert publish is not None
        while True:
            await changed.wait()
            changed.clear()
            await publish(progress_report(len(tasks), list(verdicts)))
            await asyncio.sleep(interval)

    reporter = asyncio.create_task(report_while_running()) if publish is not None else None
    try:
        report = await validate_tasks(
            tasks,
            runs=spec.runs,
            jobs=max(1, min(config.settings.max_sandboxes, len(tasks))),
            sandbox_config=sandbox_kind(config),
            timeout=float(spec.timeout_seconds) if spec.timeout_seconds else None,
            progress=found,
            sandboxes=make,
            integrity=spec.integrity,
        )
    finally:
        if reporter is not None:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
    path = write_quarantine(quarantine_folder(config.pool), report)
    logger.info(
        "validated %d tasks of pool %s (%d from the cache): %d valid, %d quarantined (%s)",
        len(tasks),
        config.pool,
        report.cached,
        len(report.valid),
        len(report.quarantined),
        path,
    )
    if publish is not None:
        await publish(progress_report(len(tasks), verdicts, finished=True))
    return report


class ConfigMapPublisher:
    """Merge-patches the report into key ``progress.json`` of the pool's progress ConfigMap,
    as the gateway's ServiceAccount (which may patch that one ConfigMap). A failure is logged;
    the next report tries again."""

    def __init__(self, namespace: str, name: str, kubeconfig: str | None = None) -> None:
        self.namespace = namespace
        self.name = name
        self.kubeconfig = kubeconfig
        self._api: Any = None

    async def __call__(self, report: PoolProgress) -> None:
        """Send ``report``; never raises."""
        text = json.dumps(report.to_wire(), sort_keys=True, separators=(",", ":"))
        try:
            await asyncio.to_thread(self._send, text)
        except Exception as err:  # an unreachable or refusing API server, no credentials
            logger.warning(
                "could not publish the validation progress to ConfigMap %s/%s: %s",
                self.namespace,
                self.name,
                err,
            )

    def _send(self, text: str) -> None:
        if self._api is None:
            # Only here: a local gateway never imports the Kubernetes client.
            from kubernetes import client

            from crl_worker.sandbox.kubeapi import client_configuration

            conf = client_configuration(self.kubeconfig)
            self._api = client.CoreV1Api(client.ApiClient(conf))
        self._api.patch_namespaced_config_map(
            self.name,
            self.namespace,
            {"data": {PROGRESS_KEY: text}},
            field_manager=POOL_FIELD_MANAGER,
            _content_type="application/merge-patch+json",
            _request_timeout=10,
        )


def publisher_from_env(
    config: GatewayConfig, env: Mapping[str, str] | None = None
) -> ConfigMapPublisher | None:
    """The publisher the operator configured (``$CRL_PROGRESS_CONFIGMAP``); None on one
    machine, where the log and ``quarantine.json`` say the same."""
    env = os.environ if env is None else env
    name = env.get(Env.PROGRESS_CONFIGMAP)
    if not name:
        return None
    return ConfigMapPublisher(config.namespace, name, config.kubeconfig)


__all__ = [
    "ConfigMapPublisher",
    "progress_report",
    "publisher_from_env",
    "quarantine_folder",
    "sandbox_kind",
    "validate_pool",
]
