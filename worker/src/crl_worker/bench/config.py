"""Setting a benchmark run up, shared by ``python -m crl_worker.bench`` and ``crl bench``: the
config file, the model endpoint, the tasks, and what a results folder is a run *of* (its
identity). The sandbox and policy factories every rollout shares are crl_worker.rollout.setup.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_worker.api.benchmark import BenchmarkSpec
from crl_worker.api.common import AgentSpec
from crl_worker.api.contract import API_KEY_ENVS, Env
from crl_worker.configfile import read_resource_file
from crl_worker.errors import CrlError
from crl_worker.rollout.setup import AgentKind, Endpoint, RolloutSetupError
from crl_worker.tasks.model import Task
from crl_worker.tasks.sources import load_source


class BenchConfigError(RolloutSetupError):
    """The benchmark cannot be set up (bad config file, no model endpoint or one that does not
    answer, no tasks, a results folder of another run, no sandboxes)."""


class BenchTasksError(BenchConfigError):
    """The suite's tasks cannot be read (a malformed record, an unreadable source), or the
    selection holds an instance the suite lacks, or none at all."""


@dataclass(frozen=True)
class BenchmarkConfig:
    """A Benchmark as the runner needs it: its name, its spec and where it was read from."""

    name: str
    spec: BenchmarkSpec
    path: Path


def read_benchmark(path: Path, *, name: str | None = None) -> BenchmarkConfig:
    """Read the operator's worker config (``{apiVersion, kind, name, spec}``) or a Benchmark
    manifest (``metadata.name``); the one Benchmark document of a multi-document file.

    ``name`` (the operator's ``CRL_BENCHMARK_NAME`` in a cluster) overrides the file's name.
    """
    found = read_resource_file(path, "Benchmark", BenchmarkSpec, error=BenchConfigError)
    return BenchmarkConfig(name=name or found.name, spec=found.spec, path=found.path)


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
    url = url or env.get(Env.MODEL_URL) or (endpoint.url if endpoint else None)
    model = model or env.get(Env.MODEL_NAME) or (endpoint.model_name if endpoint else None)
    if not url or not model:
        missing = " and ".join(
            what for what, value in (("URL", url), ("model name", model)) if not value
        )
        raise BenchConfigError(
            f"no model {missing}: give --url and --model, or set {Env.MODEL_URL} and "
            f"{Env.MODEL_NAME}, or set spec.model.endpoint (url, modelName) in the manifest"
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
    ``limit``. Raises :class:`BenchTasksError` when a record is malformed or an id asked for
    is missing."""
    try:
        loaded = load_source(
            config.spec.suite.tasks, mounted_path=tasks_file, base_dir=config.path.parent
        )
    except (CrlError, OSError, ValueError) as exc:
        raise BenchTasksError(f"cannot read the suite's tasks: {exc}") from exc
    if loaded.errors:
        shown = "; ".join(str(e) for e in loaded.errors[:5])
        raise BenchTasksError(
            f"{len(loaded.errors)} task record(s) of the suite are malformed ({shown}); fix them "
            "or check the file with `crl tasks check`"
        )
    tasks = loaded.tasks
    if instance_ids:
        known = {t.instance_id for t in tasks}
        unknown = [i for i in instance_ids if i not in known]
        if unknown:
            raise BenchTasksError(f"the suite has no instance {', '.join(unknown)}")
        wanted = set(instance_ids)
        tasks = [t for t in tasks if t.instance_id in wanted]
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise BenchTasksError("the suite selects no instance")
    return tasks


def run_identity(config: BenchmarkConfig, *, agent: AgentKind, model: str) -> dict[str, Any]:
    """What a results folder holds a run of: suite, task source (without its filter: a subset
    or a longer list of the same instances resumes into the same folder), model and agent
    settings. ``attempts``, ``passAtK`` and ``parallelism`` may change between resumes."""
    source = config.spec.suite.tasks.to_wire()
    source.pop("filter", None)
    settings = config.spec.agent.to_wire()
    if settings.get("tries") == 1:
        # One try, the default: left out, so that a folder written before the field existed
        # resumes.
        del settings["tries"]
    return {
        "suite": config.spec.suite.name,
        "tasks": source,
        "agentKind": agent,
        "model": model,
        "agent": settings,
    }


def check_agent(agent: AgentSpec) -> None:
    """Fail before any sandbox starts when the agent's prompt templates do not load."""
    from crl_worker.agent.prompts import PromptError, load_prompts

    try:
        load_prompts(agent.prompt_template)
    except PromptError as exc:
        raise BenchConfigError(f"agent.promptTemplate: {exc}") from exc
