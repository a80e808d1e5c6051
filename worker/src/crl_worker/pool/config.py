"""Configuration of one pool gateway: the RolloutPool spec plus what only the process knows.

The operator hands the gateway the resolved RolloutPool in a ConfigMap (``config.yaml`` with
``apiVersion``, ``kind: RolloutPool``, ``name`` and the defaulted ``spec``, see
``crl_operator.builders.worker_config``); on one machine the same file, a RolloutPool manifest,
or command-line flags alone configure it.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from crl_worker.api.common import (
    PoolSettings,
    SchedulingSpec,
    TaskFilter,
    TaskFormat,
    TaskSource,
)
from crl_worker.api.rolloutpool import RolloutPoolSpec
from crl_worker.errors import CrlError
from crl_worker.tasks import loaders
from crl_worker.tasks.model import Task
from crl_worker.tasks.sources import TaskSourceError, load_source

logger = logging.getLogger(__name__)

Backend = Literal["local", "kubernetes"]

#: Default bound of a file read through the gateway (bytes).
DEFAULT_MAX_READ = 64 << 20
#: Default bound of a request body, a file write included (bytes).
DEFAULT_MAX_WRITE = 64 << 20
#: Default bound of one command's kept output (bytes); requests may ask for less.
DEFAULT_MAX_OUTPUT_CAP = 16 << 20


class ConfigError(CrlError):
    """The gateway's configuration is unusable; the message says which setting and why."""


class GatewayConfig(BaseModel):
    """Everything one gateway process needs."""

    model_config = ConfigDict(extra="forbid")

    pool: str = "local"
    """Name of the RolloutPool (labels, metrics, sandbox names); ``$CRL_POOL_NAME`` in the
    gateway's pod."""
    namespace: str = "default"
    """Namespace of the RolloutPool and its sandbox pods; ``$POD_NAMESPACE`` in a pod."""
    pool_uid: str | None = None
    """uid of the RolloutPool, for the pods' owner reference (``$CRL_POOL_UID``); read from the
    API when empty."""
    gateway_id: str = Field(default_factory=socket.gethostname)
    """This gateway's name (its pod name in a cluster): it labels the pods it creates, so
    gateways of one pool never collect each other's sandboxes."""
    backend: Backend = Field(
        default_factory=lambda: (
            "kubernetes" if os.environ.get("KUBERNETES_SERVICE_HOST") else "local"
        )
    )
    """``local``: sandboxes are local processes; ``kubernetes``: one pod per sandbox. The
    default is ``kubernetes`` inside a pod, ``local`` elsewhere."""
    host: str = "127.0.0.1"
    """Address the HTTP server binds."""
    port: int = Field(default=8080, ge=0, le=65535)
    """Port of the HTTP server (0 picks a free one)."""
    tasks_file: Path | None = None
    """Task file (JSON, JSONL or Parquet); the spec's task source when empty."""
    task_format: TaskFormat = "swe-bench"
    """Format of the task file's records (``task``: already :class:`Task` records)."""
    task_filter: TaskFilter | None = None
    """Which instances of the file to serve."""
    task_source: TaskSource | None = None
    """The RolloutPool's task source, read when no task file is given (a URL is downloaded,
    a Hugging Face dataset read with ``datasets``)."""
    image_template: str | None = None
    """Task source's sandbox image template (the sandbox spec's own one wins)."""
    settings: PoolSettings = Field(default_factory=PoolSettings)
    """The RolloutPool's pool settings (sandbox, replicas, maxSandboxes, reuse, prefetch)."""
    scheduling: SchedulingSpec | None = None
    """The RolloutPool's scheduling: with ``sandboxesUseQuota`` and a ``queueName``, sandbox
    pods carry Kueue's queue label (see :meth:`sandbox_queue`)."""
    acquire_timeout: float = Field(default=600.0, gt=0)
    """Default seconds a lease request waits for capacity before a 503."""
    lease_ttl: float = Field(default=7200.0, gt=0)
    """Seconds without a request after which a lease is taken back (as dirty)."""
    prefetch_ttl: float = Field(default=900.0, gt=0)
    """Seconds a prefetched sandbox is kept before it counts as an ordinary idle one."""
    run_as_non_root: bool = False
    """Sandbox pods refuse to run as root (only for images whose user is not root)."""
    run_as_user: int | None = Field(default=None, ge=0)
    """User id of the sandbox container; the image's user when empty."""
    kubeconfig: str | None = None
    """Kubeconfig file (kubernetes backend); in a pod, the service account when empty."""
    context: str | None = None
    """Context of the kubeconfig."""
    local_root: Path | None = None
    """Where local sandboxes keep their checkouts; the local backend's default when empty."""
    token: SecretStr | None = None
    """The bearer token every API request must carry (``$CRL_POOL_TOKEN``; the pool's token
    Secret in a cluster). Empty: :class:`~crl_worker.pool.gateway.Gateway` makes one."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """A second port serving only ``/metrics`` and ``/healthz`` (no token), so a NetworkPolicy
    can admit scrapers there and the API's clients alone on :attr:`port`; none when empty."""
    max_read_bytes: int = Field(default=DEFAULT_MAX_READ, ge=1)
    """Largest file the file API returns (larger: 413)."""
    max_write_bytes: int = Field(default=DEFAULT_MAX_WRITE, ge=1)
    """Largest request body, a file written included (larger: 413)."""
    max_output_bytes: int = Field(default=DEFAULT_MAX_OUTPUT_CAP, ge=1)
    """Most output a command keeps, whatever its request's ``max_output`` says (beyond: cut
    and marked ``truncated``)."""

    def sandbox_queue(self) -> tuple[str | None, str | None]:
        """The Kueue queue and WorkloadPriorityClass of the sandbox pods: both ``None`` unless
        the pool's ``scheduling.sandboxesUseQuota`` is on (with a ``queueName``)."""
        scheduling = self.scheduling
        if scheduling is None or not scheduling.sandboxes_use_quota or not scheduling.queue_name:
            return None, None
        return scheduling.queue_name, scheduling.workload_priority_class_name


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a gateway config: the operator's ``config.yaml``, or a RolloutPool manifest.

    Returns :class:`GatewayConfig` fields (``pool``, ``settings``, ``tasks_file``, ...).
    """
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the gateway config {path}: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping with kind RolloutPool and a spec")
    kind = document.get("kind")
    if kind != "RolloutPool":
        raise ConfigError(
            f"{path}: kind is {kind!r}; the pool gateway serves a RolloutPool (an inline pool of"
            " a TrainingRun or Benchmark becomes its own RolloutPool with its own ConfigMap)"
        )
    metadata = document.get("metadata") or {}
    name = document.get("name") or metadata.get("name")
    try:
        spec = RolloutPoolSpec.model_validate(document.get("spec") or {})
    except ValidationError as exc:
        raise ConfigError(f"{path}: the RolloutPool spec is invalid:\n{exc}") from exc
    fields: dict[str, Any] = {
        "settings": PoolSettings.model_validate(
            spec.model_dump(exclude={"tasks", "scheduling"}, by_alias=False)
        ),
        "task_format": spec.tasks.format,
        "task_filter": spec.tasks.filter,
        "image_template": spec.tasks.image_template,
        "task_source": spec.tasks,
        "scheduling": spec.scheduling,
    }
    if name:
        fields["pool"] = name
    if metadata.get("namespace"):
        fields["namespace"] = metadata["namespace"]
    if metadata.get("uid"):
        fields["pool_uid"] = metadata["uid"]
    if spec.tasks.path:
        tasks_path = Path(spec.tasks.path)
        # On one machine a relative path is relative to the manifest's folder.
        fields["tasks_file"] = tasks_path if tasks_path.is_absolute() else path.parent / tasks_path
    return fields


def load_tasks(config: GatewayConfig) -> list[Task]:
    """The tasks the pool serves: the task file read in its format, filtered."""
    if config.tasks_file is not None:
        where = str(config.tasks_file)
        result = loaders.load_tasks(
            config.tasks_file,
            config.task_format,
            config.task_filter,
            image_template=config.image_template,
        )
    elif config.task_source is not None:
        where = "the RolloutPool's task source"
        try:
            result = load_source(config.task_source)
        except TaskSourceError as exc:
            raise ConfigError(str(exc)) from exc
    else:
        raise ConfigError(
            "the gateway has no tasks: pass --tasks FILE, or --config with a task source (the"
            " operator mounts a ConfigMap or volume task file and passes --tasks)"
        )
    for error in result.errors[:20]:
        logger.warning("skipping a malformed task record: %s", error)
    if result.errors:
        logger.warning("%d task records could not be read", len(result.errors))
    if result.missing_ids:
        logger.warning("instance ids the filter names but the file lacks: %s", result.missing_ids)
    if not result.tasks:
        raise ConfigError(
            f"no usable task in {where} ({config.task_format} format, after the"
            f" filter); {len(result.errors)} records failed to load"
        )
    return result.tasks
