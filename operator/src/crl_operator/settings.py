"""Command-line flags of ``python -m crl_operator`` and how they map to kopf's settings."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import kopf


@dataclass(frozen=True)
class Settings:
    """What the operator process is configured with."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty with `all_namespaces` means the whole cluster."""
    all_namespaces: bool = False
    metrics_port: int = 8080
    health_port: int = 8081
    log_format: str = "json"
    log_level: str = "INFO"
    standalone: bool = True
    """No kopf peering: one replica (the chart's Deployment uses the Recreate strategy)."""
    peering_name: str | None = None
    workers: int = 8
    """Reconciles running at once (threads: the Kubernetes client is synchronous)."""
    apply_concurrency: int = 4
    """Children one reconcile applies at once, within a wave (1: one after another)."""
    resync_seconds: float = 60.0
    """Every resource is reconciled at least this often, events or not (drift repair)."""
    kubeconfig: str | None = None
    image_registry: str | None = None
    """Registry that replaces the project's default one (``ghcr.io/coderepairrl``) in the
    images of the children: where a user pushed the images images/build.sh builds."""
    watch_server_timeout: int = 300
    watch_client_timeout: int = 330

    @property
    def apply_threads(self) -> int:
        """Threads shared by all reconciles for their concurrent applies (0: none)."""
        return self.workers * self.apply_concurrency if self.apply_concurrency > 1 else 0

    @property
    def connections(self) -> int:
        """HTTP connections to keep to the API server: one per thread that writes."""
        return self.workers + self.apply_threads


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """Parse the flags (environment variables `CRL_OPERATOR_*` give the defaults)."""
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="python -m crl_operator",
        description="The CodeRepairRL operator: reconciles TrainingRun, RolloutPool and Benchmark.",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="namespace to watch (repeatable); the default is all namespaces",
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch the whole cluster (default)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("CRL_OPERATOR_METRICS_PORT", "8080")),
        help="Prometheus metrics port, /metrics (0 disables; default 8080)",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=int(env("CRL_OPERATOR_HEALTH_PORT", "8081")),
        help="liveness endpoint port, /healthz (0 disables; default 8081)",
    )
    p.add_argument(
        "--log-format", choices=("json", "text"), default=env("CRL_OPERATOR_LOG_FORMAT", "json")
    )
    p.add_argument(
        "--log-level",
        default=env("CRL_OPERATOR_LOG_LEVEL", "INFO"),
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
    )
    peering = p.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone",
        action="store_true",
        default=True,
        help="run without kopf peering (default; run one replica)",
    )
    peering.add_argument(
        "--peering",
        metavar="NAME",
        default=None,
        help="use kopf peering NAME (its KopfPeering CRDs must be installed)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=int(env("CRL_OPERATOR_WORKERS", "8")),
        help="reconciles at once (default 8)",
    )
    p.add_argument(
        "--apply-concurrency",
        type=int,
        default=int(env("CRL_OPERATOR_APPLY_CONCURRENCY", "4")),
        help="children one reconcile applies at once, config before workloads (default 4)",
    )
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=float(env("CRL_OPERATOR_RESYNC_SECONDS", "60")),
        help="reconcile every resource at least this often (default 60)",
    )
    p.add_argument(
        "--kubeconfig",
        default=env("KUBECONFIG"),
        help="kubeconfig file outside a cluster (default: in-cluster, then $KUBECONFIG)",
    )
    p.add_argument(
        "--image-registry",
        default=env("CRL_OPERATOR_IMAGE_REGISTRY") or None,
        metavar="REGISTRY",
        help="run this project's images (operator, worker, trainer) from REGISTRY instead of "
        "ghcr.io/coderepairrl, e.g. registry.example.com/crl",
    )
    a = p.parse_args(argv)
    return Settings(
        namespaces=tuple(a.namespace),
        all_namespaces=a.all_namespaces or not a.namespace,
        metrics_port=a.metrics_port,
        health_port=a.health_port,
        log_format=a.log_format,
        log_level=a.log_level,
        standalone=a.peering is None,
        peering_name=a.peering,
        workers=max(1, a.workers),
        apply_concurrency=max(1, a.apply_concurrency),
        resync_seconds=max(5.0, a.resync_seconds),
        kubeconfig=a.kubeconfig,
        image_registry=a.image_registry.rstrip("/") if a.image_registry else None,
    )


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: Settings) -> None:
    """Apply our choices to kopf's settings (called from the startup handler)."""
    # A watch that goes silent (a dropped connection no one closed) must not hang the operator:
    # the server ends each watch after server_timeout, the client gives up shortly after.
    kopf_settings.watching.server_timeout = settings.watch_server_timeout
    kopf_settings.watching.client_timeout = settings.watch_client_timeout
    kopf_settings.watching.connect_timeout = 30
    kopf_settings.networking.request_timeout = 60
    # Only warnings and errors become Kubernetes events; info stays in the logs.
    kopf_settings.posting.level = logging.WARNING
    # kopf keeps no handler progress for us (only on.event handlers), but if it ever does,
    # annotations are fine: they stay on the object and need no extra CRD.
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.coderepair.io"
    )
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.coderepair.io"
    )
    kopf_settings.peering.standalone = settings.standalone
    if settings.peering_name:
        kopf_settings.peering.name = settings.peering_name
    kopf_settings.peering.mandatory = not settings.standalone
    # Reconciles run in our own worker pool; kopf's executor only runs the tiny event handlers.
    kopf_settings.execution.max_workers = 4
