"""Create a sandbox from its config by backend name, importing the backend only when used.

Importing this module imports neither the Docker SDK nor the Kubernetes client: the backend's
module is imported the first time a sandbox of its type is created.

Backends (``type`` → module, sandbox class, config class):

- ``local``: :mod:`crl_worker.sandbox.local` (the default)
- ``docker``: :mod:`crl_worker.sandbox.docker`
- ``kubernetes``: ``crl_worker.sandbox.kubernetes`` (``KubernetesSandbox``;
  its ``KubernetesSandboxConfig`` is in ``crl_worker.sandbox.pods``)

Every sandbox class is constructed as ``cls(config, task)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from crl_worker.errors import SandboxError
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task


@dataclass(frozen=True)
class Backend:
    """Where a backend's sandbox class and config model live."""

    module: str
    sandbox_class: str
    config_module: str
    config_class: str


BACKENDS: dict[str, Backend] = {
    "local": Backend(
        "crl_worker.sandbox.local",
        "LocalSandbox",
        "crl_worker.sandbox.config",
        "LocalSandboxConfig",
    ),
    "docker": Backend(
        "crl_worker.sandbox.docker",
        "DockerSandbox",
        "crl_worker.sandbox.config",
        "DockerSandboxConfig",
    ),
    "kubernetes": Backend(
        "crl_worker.sandbox.kubernetes",
        "KubernetesSandbox",
        "crl_worker.sandbox.pods",
        "KubernetesSandboxConfig",
    ),
}
"""The known backends by ``type``."""


def _backend(kind: object) -> Backend:
    if not isinstance(kind, str) or kind not in BACKENDS:
        raise SandboxError(
            f"unknown sandbox type {kind!r}; use one of: {', '.join(sorted(BACKENDS))}"
        )
    return BACKENDS[kind]


def _load(module: str, name: str, kind: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise SandboxError(
            f"the {kind!r} sandbox backend cannot be loaded ({exc}); install what it needs "
            "(e.g. the worker's extras) or choose another sandbox type"
        ) from exc
    except AttributeError as exc:
        raise SandboxError(f"the {kind!r} sandbox backend has no {name} ({exc})") from exc


def parse_config(config: BaseModel | Mapping[str, Any] | None) -> BaseModel:
    """Validate a config given as a mapping (``type`` picks the model; default ``local``)."""
    if config is None:
        config = {"type": "local"}
    if isinstance(config, BaseModel):
        return config
    kind = config.get("type", "local")
    backend = _backend(kind)
    model = _load(backend.config_module, backend.config_class, kind)
    try:
        parsed: BaseModel = model.model_validate({**config, "type": kind})
    except ValidationError as exc:
        raise SandboxError(f"invalid {kind} sandbox config: {exc}") from exc
    return parsed


def create_sandbox(config: BaseModel | Mapping[str, Any] | None, task: Task) -> Sandbox:
    """A sandbox for ``task`` (not started yet: ``async with`` it or call ``start``)."""
    parsed = parse_config(config)
    kind = getattr(parsed, "type", None)
    backend = _backend(kind)
    cls = _load(backend.module, backend.sandbox_class, str(kind))
    sandbox = cls(parsed, task)
    if not isinstance(sandbox, Sandbox):
        raise SandboxError(f"the {kind!r} backend's {backend.sandbox_class} is not a Sandbox")
    return sandbox
