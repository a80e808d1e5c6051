"""`python -m crl_operator`: run the operator (kopf) with metrics, a health endpoint and JSON logs."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import kopf
from prometheus_client import disable_created_metrics, start_http_server

from crl_operator.apply import Kube, load_api_client
from crl_operator.handlers import Runtime, build_registry
from crl_operator.settings import Settings, parse_args
from crl_worker.logs import setup_logging

log = logging.getLogger("crl_operator")


def run(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT."""
    setup_logging(settings.log_format, getattr(logging, settings.log_level))
    if settings.metrics_port:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created: noise
        start_http_server(settings.metrics_port)
    kube = Kube(load_api_client(settings.kubeconfig, pool_size=settings.connections))
    runtime = Runtime(settings, kube)
    registry = build_registry(runtime)
    log.info(
        "starting",
        extra={
            "namespaces": ",".join(settings.namespaces) or "*",
            "metrics_port": settings.metrics_port,
            "health_port": settings.health_port,
            "standalone": settings.standalone,
        },
    )
    liveness = f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None
    kopf.run(
        registry=registry,
        standalone=settings.standalone,
        peering_name=settings.peering_name,
        clusterwide=settings.all_namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=liveness,
        memo=kopf.Memo(runtime=runtime),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
