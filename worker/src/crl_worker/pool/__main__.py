"""``python -m crl_worker.pool``: run a pool gateway.

Settings come from the defaults, then the config file (``--config``: the operator's
``config.yaml`` or a RolloutPool manifest), then the flags; a flag wins over the file.

The API's bearer token comes from ``--token-file``, else ``$CRL_POOL_TOKEN`` (the pool's token
Secret in a cluster, where one is required). On one machine without either, the gateway makes
one, writes it to a file only the user can read and logs how clients use it (never the token).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any, get_args

from pydantic import SecretStr, ValidationError

from crl_worker.api.common import PoolSettings, TaskFormat
from crl_worker.api.contract import Env
from crl_worker.entrypoint import CONFIG_ERROR, add_logging_flags, entry_parser
from crl_worker.errors import CrlError
from crl_worker.logs import setup_logging
from crl_worker.pool.config import GatewayConfig, load_tasks, read_config_file
from crl_worker.pool.gateway import serve

logger = logging.getLogger("crl_worker.pool")


def parser() -> argparse.ArgumentParser:
    """The gateway's command line."""
    p = entry_parser(
        "crl_worker.pool",
        "Lease sandboxes of a task set to rollout workers over HTTP.",
        config="config.yaml from the operator, or a RolloutPool manifest",
    )
    p.add_argument("--tasks", type=Path, help="task file (JSON, JSONL, Parquet)")
    p.add_argument(
        "--format",
        choices=get_args(TaskFormat),
        help="format of the task file ('task': records already in the Task schema)",
    )
    p.add_argument("--backend", choices=["local", "kubernetes"])
    p.add_argument("--namespace", help="namespace of the RolloutPool and its sandbox pods")
    p.add_argument("--pool", help="name of the RolloutPool")
    p.add_argument("--pool-uid", help="uid of the RolloutPool (read from the API when omitted)")
    p.add_argument(
        "--gateway-id", help="name of this gateway (default: $POD_NAME or the host name)"
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, help="port to listen on (default 8080)")
    p.add_argument("--max-sandboxes", type=int, help="upper bound on sandboxes, warm and leased")
    p.add_argument("--warm", type=int, help="idle sandboxes kept warm (the RolloutPool's replicas)")
    p.add_argument("--max-uses", type=int, help="rollouts per sandbox before it is recreated")
    p.add_argument("--no-reuse", action="store_true", help="close sandboxes after each rollout")
    p.add_argument("--prefetch", type=int, help="announced instances whose sandboxes start ahead")
    p.add_argument("--startup-timeout", type=int, help="seconds a sandbox pod may take to be ready")
    p.add_argument("--acquire-timeout", type=float, help="default seconds a lease request waits")
    p.add_argument(
        "--lease-ttl", type=float, help="seconds without requests before a lease is taken back"
    )
    p.add_argument(
        "--run-as-non-root", action="store_true", help="sandbox pods must not run as root"
    )
    p.add_argument("--run-as-user", type=int, help="user id of the sandbox containers")
    p.add_argument("--local-root", type=Path, help="directory of local sandboxes' checkouts")
    p.add_argument(
        "--token-file",
        type=Path,
        help=f"file holding the API's bearer token (default: ${Env.POOL_TOKEN}; on one machine"
        " without either, a new token is written to this file or to the cache folder)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="a second port serving only /metrics and /healthz, without the token",
    )
    p.add_argument("--max-read-bytes", type=int, help="largest file the file API returns")
    p.add_argument("--max-write-bytes", type=int, help="largest request body (a written file)")
    p.add_argument(
        "--max-output-bytes", type=int, help="most output one command keeps (then truncated)"
    )
    add_logging_flags(p, fmt="text")
    return p


def build_config(args: argparse.Namespace) -> GatewayConfig:
    """Merge defaults, the config file and the flags."""
    fields: dict[str, Any] = read_config_file(args.config) if args.config else {}
    # What the operator tells the gateway's pod (the Deployment's env), under the file's values.
    from_env = {
        "pool": Env.POOL_NAME,
        "pool_uid": Env.POOL_UID,
        "namespace": Env.POD_NAMESPACE,
        "gateway_id": Env.POD_NAME,
    }
    for field, name in from_env.items():
        if os.environ.get(name) and field not in fields:
            fields[field] = os.environ[name]
    settings = (fields.pop("settings", None) or PoolSettings()).to_wire()
    direct = {
        "tasks": "tasks_file",
        "format": "task_format",
        "backend": "backend",
        "namespace": "namespace",
        "pool": "pool",
        "pool_uid": "pool_uid",
        "gateway_id": "gateway_id",
        "kubeconfig": "kubeconfig",
        "context": "context",
        "host": "host",
        "port": "port",
        "acquire_timeout": "acquire_timeout",
        "lease_ttl": "lease_ttl",
        "run_as_user": "run_as_user",
        "local_root": "local_root",
        "metrics_port": "metrics_port",
        "max_read_bytes": "max_read_bytes",
        "max_write_bytes": "max_write_bytes",
        "max_output_bytes": "max_output_bytes",
    }
    for arg, field in direct.items():
        value = getattr(args, arg)
        if value is not None:
            fields[field] = value
    if args.run_as_non_root:
        fields["run_as_non_root"] = True
    if args.max_sandboxes is not None:
        settings["maxSandboxes"] = args.max_sandboxes
    if args.warm is not None:
        settings["replicas"] = args.warm
    if args.prefetch is not None:
        settings["prefetch"] = args.prefetch
    reuse = settings.setdefault("reuse", {})
    if args.max_uses is not None:
        reuse["maxUses"] = args.max_uses
    if args.no_reuse:
        reuse["enabled"] = False
    if args.startup_timeout is not None:
        settings.setdefault("sandbox", {})["startupTimeoutSeconds"] = args.startup_timeout
    fields["settings"] = PoolSettings.model_validate(settings)
    if fields["settings"].replicas > fields["settings"].max_sandboxes:
        raise CrlError(
            f"the warm target ({fields['settings'].replicas}) exceeds maxSandboxes"
            f" ({fields['settings'].max_sandboxes}); lower --warm or raise --max-sandboxes"
        )
    return GatewayConfig.model_validate(fields)


def default_token_file(pool: str) -> Path:
    """Where a local gateway writes the token it makes: the cache folder."""
    cache = Path(os.environ.get(Env.CACHE_DIR) or Path.home() / ".cache" / "coderepairrl")
    return cache / "pool" / f"{pool}.token"


def resolve_token(args: argparse.Namespace, config: GatewayConfig) -> GatewayConfig:
    """The config with its bearer token: from ``--token-file``, ``$CRL_POOL_TOKEN``, or (one
    machine only) a new one written to a file that only the user may read."""
    token_file: Path | None = args.token_file
    if token_file is not None and token_file.exists():
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise CrlError(f"cannot read the token file {token_file}: {exc}") from exc
        if not token:
            raise CrlError(f"the token file {token_file} is empty")
        return config.model_copy(update={"token": SecretStr(token)})
    if os.environ.get(Env.POOL_TOKEN, "").strip():
        token = os.environ[Env.POOL_TOKEN].strip()
        return config.model_copy(update={"token": SecretStr(token)})
    if config.backend == "kubernetes":
        raise CrlError(
            f"no token: set ${Env.POOL_TOKEN} (the operator mounts the pool's token Secret) or"
            " pass --token-file; a gateway in a cluster does not run without authentication"
        )
    path = token_file or default_token_file(config.pool)
    token = secrets.token_urlsafe(32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        path.chmod(0o600)
    except OSError as exc:
        raise CrlError(f"cannot write the token file {path}: {exc}") from exc
    logger.info(
        "made a new API token for this gateway in %s; clients send it as 'Authorization:"
        " Bearer <token>': export %s=$(cat %s)",
        path,
        Env.POOL_TOKEN.value,
        path,
    )
    return config.model_copy(update={"token": SecretStr(token)})


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parser().parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    try:
        config = build_config(args)
        tasks = load_tasks(config)
        config = resolve_token(args, config)
        asyncio.run(serve(config, tasks))
    except (CrlError, ValidationError) as exc:
        logger.error("%s", exc)
        return CONFIG_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
