"""Setting a benchmark run up, shared by ``python -m crl_worker.bench`` and ``crl bench``: the
config file, the model endpoint, the tasks, the sandbox and policy factories, and what a results
folder is a run *of* (its identity).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from crl_worker.api.benchmark import BenchmarkSpec
from crl_worker.api.common import AgentSpec
from crl_worker.configfile import read_resource_file
from crl_worker.errors import CrlError
from crl_worker.tasks.model import Task
from crl_worker.tasks.sources import load_source

if TYPE_CHECKING:
    from crl_worker.agent.client import ChatClient, Policy
    from crl_worker.pool.client import GatewayClient
    from crl_worker.sandbox.base import Sandbox

AgentKind = Literal["gold", "openai"]

#: Environment variables of the model endpoint (set by the operator in the runner Job).
MODEL_URL_ENV = "CRL_MODEL_URL"
MODEL_NAME_ENV = "CRL_MODEL_NAME"
API_KEY_ENVS = ("CRL_API_KEY", "OPENAI_API_KEY")
#: The pool gateway to lease sandboxes from (in a cluster); local sandboxes when unset.
POOL_URL_ENV = "CRL_POOL_URL"
#: The results folder (in a cluster: on the results volume).
RESULTS_DIR_ENV = "CRL_RESULTS_DIR"


class BenchConfigError(CrlError):
    """The benchmark cannot be set up (bad config file, no model endpoint, no tasks)."""


@dataclass(frozen=True)
class BenchmarkConfig:
    """A Benchmark as the runner needs it: its name, its spec and where it was read from."""

    name: str
    spec: BenchmarkSpec
    path: Path


def read_benchmark(path: Path) -> BenchmarkConfig:
    """Read the operator's worker config (``{apiVersion, kind, name, spec}``) or a Benchmark
    manifest (``metadata.name``); the first Benchmark document of a multi-document file."""
    found = read_resource_file(path, "Benchmark", BenchmarkSpec, error=BenchConfigError)
    return BenchmarkConfig(name=found.name, spec=found.spec, path=found.path)


@dataclass(frozen=True)
class Endpoint:
    """Where the OpenAI-compatible model is."""

    url: str
    model: str
    api_key: str | None = None


def resolve_endpoint(
    spec: BenchmarkSpec,
    *,
    url: str | None = None,
    model: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Endpoint:
    """The model endpoint: flags first, then ``CRL_MODEL_URL``/``CRL_MODEL_NAME``, then
    ``spec.model.endpoint``; the key from ``CRL_API_KEY`` or ``OPENAI_API_KEY``."""
    env = os.environ if env is None else env
    endpoint = spec.model.endpoint
    url = url or env.get(MODEL_URL_ENV) or (endpoint.url if endpoint else None)
    model = model or env.get(MODEL_NAME_ENV) or (endpoint.model_name if endpoint else None)
    if not url or not model:
        missing = " and ".join(
            what for what, value in (("URL", url), ("model name", model)) if not value
        )
        raise BenchConfigError(
            f"no model {missing}: give --url and --model, or set {MODEL_URL_ENV} and "
            f"{MODEL_NAME_ENV}, or set spec.model.endpoint (url, modelName) in the manifest"
        )
    api_key = next((env[k] for k in API_KEY_ENVS if env.get(k)), None)
    return Endpoint(url=url, model=model, api_key=api_key)


def load_benchmark_tasks(
    config: BenchmarkConfig,
    *,
    tasks_file: Path | None = None,
    instance_ids: list[str] | None = None,
    limit: int | None = None,
) -> list[Task]:
    """The suite's tasks: its source (relative paths against the config's folder, or
    ``tasks_file`` where the operator mounted it), its filter, then ``instance_ids`` and
    ``limit``. Raises when a record is malformed or an id asked for is missing."""
    try:
        loaded = load_source(
            config.spec.suite.tasks, mounted_path=tasks_file, base_dir=config.path.parent
        )
    except (CrlError, OSError, ValueError) as exc:
        raise BenchConfigError(f"cannot read the suite's tasks: {exc}") from exc
    if loaded.errors:
        shown = "; ".join(str(e) for e in loaded.errors[:5])
        raise BenchConfigError(
            f"{len(loaded.errors)} task record(s) of the suite are malformed ({shown}); fix them "
            "or check the file with `crl tasks check`"
        )
    tasks = loaded.tasks
    if instance_ids:
        known = {t.instance_id for t in tasks}
        unknown = [i for i in instance_ids if i not in known]
        if unknown:
            raise BenchConfigError(f"the suite has no instance {', '.join(unknown)}")
        wanted = set(instance_ids)
        tasks = [t for t in tasks if t.instance_id in wanted]
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise BenchConfigError("the suite selects no instance")
    return tasks


def run_identity(config: BenchmarkConfig, *, agent: AgentKind, model: str) -> dict[str, Any]:
    """What a results folder holds a run of: suite, task source (without its filter: a subset
    or a longer list of the same instances resumes into the same folder), model and agent
    settings. ``attempts``, ``passAtK`` and ``parallelism`` may change between resumes."""
    source = config.spec.suite.tasks.to_wire()
    source.pop("filter", None)
    return {
        "suite": config.spec.suite.name,
        "tasks": source,
        "agentKind": agent,
        "model": model,
        "agent": config.spec.agent.to_wire(),
    }


@dataclass
class Policies:
    """The policy of each attempt, and what to close when the run ends."""

    factory: Callable[[Task], Policy]
    model: str
    client: ChatClient | None = None

    @classmethod
    def make(cls, kind: AgentKind, endpoint: Endpoint | None) -> Policies:
        """Gold replays (one per task), or one chat client shared by every attempt."""
        if kind == "gold":
            from crl_worker.agent.gold import GoldPolicy

            return cls(factory=GoldPolicy, model="gold")
        if endpoint is None:
            raise BenchConfigError("the openai agent needs a model endpoint")
        from crl_worker.agent.client import ChatClient

        client = ChatClient(endpoint.url, endpoint.model, api_key=endpoint.api_key)
        return cls(factory=lambda task: client, model=endpoint.model, client=client)

    async def aclose(self) -> None:
        """Close the chat client's connections."""
        if self.client is not None:
            await self.client.aclose()


@dataclass
class Sandboxes:
    """The sandbox of each attempt, and what to close when the run ends."""

    factory: Callable[[Task], Sandbox]
    gateway: GatewayClient | None = None

    @classmethod
    def make(cls, pool_url: str | None, config: Mapping[str, Any] | None = None) -> Sandboxes:
        """Leases from the pool gateway at ``pool_url``, else sandboxes made from ``config``
        (default: local)."""
        if pool_url:
            from crl_worker.pool.client import GatewayClient, RemoteSandbox

            gateway = GatewayClient(pool_url)
            return cls(
                factory=lambda task: RemoteSandbox(gateway, task.instance_id), gateway=gateway
            )
        from crl_worker.sandbox.registry import create_sandbox, parse_config

        parsed = parse_config(config or {"type": "local"})
        return cls(factory=lambda task: create_sandbox(parsed, task))

    async def aclose(self) -> None:
        """Close the gateway client's connections."""
        if self.gateway is not None:
            await self.gateway.aclose()


def check_agent(agent: AgentSpec) -> None:
    """Fail before any sandbox starts when the agent's prompt templates do not load."""
    from crl_worker.agent.prompts import PromptError, load_prompts

    try:
        load_prompts(agent.prompt_template)
    except PromptError as exc:
        raise BenchConfigError(f"agent.promptTemplate: {exc}") from exc


async def check_endpoint(endpoint: Endpoint, *, timeout: float = 10.0) -> None:
    """Fail fast when nothing answers at the endpoint (``GET {url}/models``).

    Without this, a server that is not up costs every attempt the client's whole retry budget
    before it is written off as an infrastructure failure. Any HTTP answer counts as up (some
    servers have no ``/models``); only a connection that fails or times out is refused.
    """
    import httpx

    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    url = endpoint.url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise BenchConfigError(
            f"the model server at {endpoint.url} does not answer ({exc!r}); start it, or check "
            "the URL (an OpenAI-compatible API root such as http://localhost:8000/v1)"
        ) from exc
