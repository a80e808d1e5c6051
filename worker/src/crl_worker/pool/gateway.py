"""One pool gateway process: the backend, the pool and the HTTP server, started and stopped
together.

``local``: sandboxes come from the sandbox registry's local backend (a clone and a shell
process per sandbox). ``kubernetes``: one pod per sandbox through the Kubernetes API; at start
the gateway resolves its RolloutPool's uid and deletes the pool's pods that no live gateway
tracks.

With ``spec.validation.enabled`` the gateway listens at once but leases nothing until it has
validated its tasks on its own sandboxes (:mod:`crl_worker.pool.validation`); then it serves
only the valid ones.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from crl_worker.harness.validate import ValidationReport
from crl_worker.pool.config import GatewayConfig
from crl_worker.pool.leases import SandboxFactory, SandboxPool
from crl_worker.pool.metrics import PoolMetrics
from crl_worker.pool.server import Limits, make_app, make_metrics_app
from crl_worker.pool.serving import TaskGate
from crl_worker.pool.validation import publisher_from_env, validate_pool
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

Cleanup = Callable[[], Awaitable[None]]


async def _nothing() -> None:
    return None


async def make_factory(config: GatewayConfig) -> tuple[SandboxFactory, Cleanup]:
    """The sandbox factory of the configured backend, and what to call at shutdown."""
    if config.backend == "local":
        from crl_worker.sandbox.config import LocalSandboxConfig
        from crl_worker.sandbox.registry import create_sandbox

        local = LocalSandboxConfig(root=str(config.local_root) if config.local_root else None)

        def local_sandbox(task: Task, sandbox_id: str) -> Sandbox:
            return create_sandbox(local, task)

        return local_sandbox, _nothing

    # Only here: the local mode never imports the Kubernetes client.
    from crl_worker.sandbox.kubeapi import KubeApi
    from crl_worker.sandbox.kubernetes import KubernetesBackend
    from crl_worker.sandbox.pods import KubernetesSandboxConfig

    queue_name, priority_class = config.sandbox_queue()
    if queue_name:
        logger.info(
            "sandbox pods count against Kueue queue %s (scheduling.sandboxesUseQuota): each"
            " waits, scheduling-gated, until Kueue admits it",
            queue_name,
        )
    pod_config = KubernetesSandboxConfig(
        namespace=config.namespace,
        pool=config.pool,
        pool_uid=config.pool_uid,
        gateway_id=config.gateway_id,
        sandbox=config.settings.sandbox,
        image_template=config.image_template,
        run_as_non_root=config.run_as_non_root,
        run_as_user=config.run_as_user,
        queue_name=queue_name,
        workload_priority_class_name=priority_class,
        kubeconfig=config.kubeconfig,
        context=config.context,
    )
    backend = KubernetesBackend(pod_config, KubeApi(config.kubeconfig, config.context))
    await backend.prepare()
    return backend.sandbox, backend.aclose


class Gateway:
    """A running gateway: call :meth:`start`, then :meth:`stop` (or use ``async with``)."""

    def __init__(
        self, config: GatewayConfig, tasks: list[Task], factory: SandboxFactory | None = None
    ) -> None:
        self.config = config
        self.tasks = tasks
        self._factory = factory
        self._cleanup: Cleanup = _nothing
        self.pool: SandboxPool | None = None
        self.gate: TaskGate | None = None
        """Which tasks the pool serves (``GET /v1/tasks``)."""
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._validation: asyncio.Task[None] | None = None
        #: What validating the tasks found (``spec.validation``), once it is over.
        self.validation: ValidationReport | None = None
        secret = config.token.get_secret_value() if config.token is not None else ""
        #: The bearer token every API request must carry (made here when the config has none).
        self.token = secret or secrets.token_urlsafe(32)

    async def start(self) -> None:
        """Prepare the backend, start the pool and listen."""
        factory = self._factory
        if factory is None:
            factory, self._cleanup = await make_factory(self.config)
        try:
            settings = self.config.settings
            self.pool = SandboxPool(
                self.tasks,
                factory,
                metrics=PoolMetrics(self.config.pool),
                max_sandboxes=settings.max_sandboxes,
                warm=settings.replicas,
                reuse=settings.reuse.enabled,
                max_uses=settings.reuse.max_uses,
                prefetch=settings.prefetch,
                acquire_timeout=self.config.acquire_timeout,
                lease_ttl=self.config.lease_ttl,
                prefetch_ttl=self.config.prefetch_ttl,
            )
            self.gate = TaskGate(self.pool)
            validation = settings.validation.enabled
            if validation:
                self.gate.hold(
                    f"the pool validates its {len(self.tasks)} tasks before it serves them"
                    " (spec.validation)"
                )
            await self.pool.start()
            # A lease request whose client went away must stop waiting (or it would lease a
            # sandbox to nobody); operations on a lease shield themselves (see LeaseRecord.call).
            limits = Limits(
                max_read=self.config.max_read_bytes,
                max_body=self.config.max_write_bytes,
                max_output=self.config.max_output_bytes,
            )
            app = make_app(
                self.pool, self.config.backend, token=self.token, limits=limits, gate=self.gate
            )
            self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            self.port = await self._listen(self._runner, self.config.port)
            if self.config.metrics_port is not None:
                metrics_app = make_metrics_app(self.pool, self.config.backend)
                self._metrics_runner = web.AppRunner(metrics_app, access_log=None)
                self.metrics_port = await self._listen(
                    self._metrics_runner, self.config.metrics_port
                )
            if validation:
                self._validation = asyncio.create_task(
                    self._validate(factory), name="pool-validation"
                )
            logger.info(
                "pool gateway %s (%s backend, %d tasks) listening on %s:%s",
                self.config.pool,
                self.config.backend,
                len(self.tasks),
                self.config.host,
                self.port,
            )
        except BaseException:
            # A port in use or a failed pool start: release what was made (the backend's
            # API connection, the maintenance task) rather than leak it.
            await self.stop()
            raise

    async def _validate(self, factory: SandboxFactory) -> None:
        """Validate the tasks on the pool's sandboxes, then serve the valid ones only."""
        assert self.gate is not None
        try:
            report = await validate_pool(
                self.config, self.tasks, factory, publish=publisher_from_env(self.config)
            )
        except Exception as exc:
            # Leasing stays held: serving tasks that were not validated is what the spec
            # asked to avoid. A restart validates again (finished verdicts are cached).
            logger.exception("validating the pool's tasks failed; nothing is leased")
            self.gate.fail(f"validating the pool's tasks failed ({exc}); see the gateway log")
            return
        self.validation = report
        self.gate.serve(report)

    async def wait_validated(self) -> None:
        """Return when validation is over (at once when the pool does not validate)."""
        if self._validation is not None:
            await asyncio.shield(self._validation)

    async def _listen(self, runner: web.AppRunner, port: int) -> int:
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, port)
        await site.start()
        addresses = runner.addresses
        return int(addresses[0][1]) if addresses else port

    async def stop(self) -> None:
        """Stop validating and listening, close every sandbox, release the backend."""
        if self._validation is not None:
            self._validation.cancel()
            await asyncio.gather(self._validation, return_exceptions=True)
            self._validation = None
        for runner in (self._runner, self._metrics_runner):
            if runner is not None:
                await runner.cleanup()
        self._runner = self._metrics_runner = None
        try:
            if self.pool is not None:
                await self.pool.close()
        finally:
            await self._cleanup()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


async def serve(config: GatewayConfig, tasks: list[Task]) -> None:
    """Run a gateway until SIGTERM or SIGINT, then shut down cleanly (sandboxes closed)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gateway = Gateway(config, tasks)
    await gateway.start()
    try:
        await stop.wait()
        logger.info(
            "shutting down: closing %d sandboxes",
            sum(gateway.pool.counts().values()) if gateway.pool else 0,
        )
    finally:
        await gateway.stop()
