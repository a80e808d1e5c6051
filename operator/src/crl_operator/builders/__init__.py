"""Pure builders: a validated resource and the observed state in, the Kubernetes objects out.

No client and no I/O here, so ``crl render`` shows exactly what the operator applies, and the
builders are tested on real manifests without a cluster. The runtime fills a
:class:`RenderState` from what it observes (is inference ready? has the workload finished?),
applies what :func:`render` returns, and prunes the children it owns that are neither in the
output nor in :func:`retained`.

| resource | children (apply order) |
|---|---|
| TrainingRun | ConfigMap; progress ConfigMap; vLLM Deployment + Service (+ peers Service for NCCL); inline RolloutPool; trainer headless Service, ServiceAccount, Role, RoleBinding and indexed Job (once inference is ready); evaluation Benchmarks. Supervised (`algorithm.type: sft`): no server and no pool, the trainer at once |
| RolloutPool | ConfigMap; progress ConfigMap (with `spec.validation.enabled`); gateway ServiceAccount, Role, RoleBinding, Deployment, Service; gateway NetworkPolicy; sandbox NetworkPolicy (the token Secret: created once by the runtime, see `token_secret`) |
| Benchmark | ConfigMap; progress ConfigMap; vLLM Deployment + Service (when served); inline RolloutPool; runner ServiceAccount, Role, RoleBinding and Job (once inference is ready) |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from crl_operator.builders.benchmark import (
    baseline_results,
    evaluation_benchmark,
    inference_spec,
    resolve_checkpoint,
    runner_job,
    runner_name,
    runner_rbac,
    served_model,
)
from crl_operator.builders.config import CONFIG_KEY, config_map, worker_config
from crl_operator.builders.inference import (
    CHECKPOINT_DIR,
    MODEL_DIR,
    ServedModel,
    inference_objects,
    lora_rank_bound,
)
from crl_operator.builders.meta import (
    MANAGED_BY,
    NAME_LIMIT,
    BuildError,
    RenderState,
    ResolvedCheckpoint,
    child_name,
    content_hash,
    labels,
    owner_name,
    owner_references,
    relocate_images,
)
from crl_operator.builders.pool import (
    gateway_network_policy,
    gateway_objects,
    inline_pool,
    network_policy,
    token_secret,
    token_secret_name,
)
from crl_operator.builders.progress import progress_config_map, progress_name
from crl_operator.builders.trainer import (
    headless_service,
    job_name,
    supervised,
    trainer_job,
    trainer_rbac,
)
from crl_operator.builders.workload import strip_kueue_labels, workload, workload_name
from crl_worker.api import AnyResource, Benchmark, RolloutPool, TrainingRun
from crl_worker.api.base import VolumeSource
from crl_worker.api.launch import accelerate_config, deepspeed_config, weight_sync_mode

__all__ = [
    "CONFIG_KEY",
    "MANAGED_BY",
    "NAME_LIMIT",
    "BuildError",
    "RenderState",
    "ResolvedCheckpoint",
    "accelerate_config",
    "baseline_results",
    "child_name",
    "config_map",
    "deepspeed_config",
    "inline_pool",
    "labels",
    "owner_name",
    "owner_references",
    "progress_name",
    "relocate_images",
    "render",
    "render_offline",
    "resolve_checkpoint",
    "retained",
    "runner_name",
    "token_secret",
    "token_secret_name",
    "worker_config",
    "workload_name",
]


def _namespace(resource: AnyResource, namespace: str | None) -> str:
    return namespace or resource.metadata.namespace or "default"


def suspended(resource: AnyResource, state: RenderState) -> bool:
    """Whether the resource is suspended: by its spec (TrainingRun) or by the runtime."""
    return state.suspended or (isinstance(resource, TrainingRun) and resource.spec.suspend)


#: What a queued or evicted resource keeps besides its Workload.
_KEPT_WHILE_QUEUED = frozenset({"ConfigMap", "Benchmark"})


def _queued(
    resource: TrainingRun | Benchmark,
    ns: str,
    state: RenderState,
    build: Callable[[RenderState], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The children of a resource Kueue admits as one unit (`state.queued`).

    The Workload's pod sets come from the render as admitted (every pod-running child
    present); the children themselves follow the admission: none that runs a pod before it.
    """
    if not state.queued or state.finished:
        return build(state)
    waiting = replace(state, suspended=True)
    if suspended(resource, state):
        # Suspended by its spec: no Workload, so no quota is held (it comes back on resume).
        return [strip_kueue_labels(c) for c in build(state)]
    whole = build(replace(state, admitted=True, inference_ready=True))
    unit = workload(resource, ns, whole, state.workload_priority)
    if not unit["spec"]["podSets"]:
        # Nothing would run yet (a checkpoint still unresolved): nothing to queue either.
        return [strip_kueue_labels(c) for c in build(waiting)]
    if state.admitted:
        return [unit, *(strip_kueue_labels(c) for c in build(state))]
    # Waiting (or evicted): only the configs, which hold the trainer's last report, and the
    # evaluation Benchmarks (queued on their own). No server, no pool gateway, no sandbox: a
    # queued run runs nothing and costs the API server three objects.
    kept = [c for c in build(waiting) if c["kind"] in _KEPT_WHILE_QUEUED]
    return [unit, *kept]


def policy_model(run: TrainingRun) -> ServedModel:
    """What a TrainingRun's vLLM server serves: the policy's base weights, updated in place."""
    model = run.spec.model
    sync = weight_sync_mode(run)
    lora = run.spec.algorithm.lora
    volumes: tuple[tuple[str, VolumeSource, str], ...] = (
        () if model.volume is None else (("model", model.volume, MODEL_DIR),)
    )
    checkpoints = run.spec.checkpoints.volume
    if sync == "lora-adapter" and checkpoints is not None:
        # The trainer writes each adapter to the checkpoint volume and tells vLLM its path:
        # the server mounts the same volume at the same place to read it.
        volumes += (("checkpoints", checkpoints, CHECKPOINT_DIR),)
    return ServedModel(
        model=f"{MODEL_DIR}/{model.name}" if model.volume is not None else model.name,
        served_name=model.name,
        dtype=model.dtype,
        revision=model.revision if model.volume is None else None,
        trust_remote_code=model.trust_remote_code,
        volumes=volumes,
        max_lora_rank=lora_rank_bound(lora.rank) if sync == "lora-adapter" and lora else None,
        # The current adapter plus those still generating rollouts that may lag behind.
        max_loras=run.spec.algorithm.max_staleness + 1,
        runtime_lora_updates=sync == "lora-adapter",
        nccl_weight_sync=sync == "nccl",
        training_rollouts=True,
    )


def _training_run(run: TrainingRun, ns: str, state: RenderState) -> list[dict[str, Any]]:
    # The progress ConfigMap outlives the trainer: it holds the last report.
    out = [config_map(run, ns), progress_config_map(run, ns)]
    if state.finished:
        # Nothing runs any more: only the configs (and the kept trainer Job) remain.
        return out + [evaluation_benchmark(run, ns, s) for s in state.evaluation_steps]
    paused = suspended(run, state)
    in_process = run.spec.generation == "in-process"
    # Supervised fine-tuning trains on recorded trajectories: no rollouts, so no server, no
    # sandbox pool, and nothing for the trainer to wait for.
    sft = supervised(run)
    if not in_process and not sft:
        replicas = 0 if paused else run.spec.inference.replicas
        out += inference_objects(
            run,
            ns,
            policy_model(run),
            run.spec.inference,
            replicas=replicas,
            scheduling=run.spec.scheduling,
        )
    pool = None if sft else inline_pool(run, ns)
    if pool is not None:
        if paused:
            # Warm sandboxes are of no use while nothing generates rollouts.
            pool["spec"]["replicas"] = 0
        out.append(pool)
    if (state.inference_ready or in_process or sft) and not paused:
        # The trainer's identity exists exactly while the trainer may run (created before it).
        out += [headless_service(run, ns), *trainer_rbac(run, ns), trainer_job(run, ns)]
    out += [evaluation_benchmark(run, ns, s) for s in state.evaluation_steps]
    return out


def _rollout_pool(pool: RolloutPool, ns: str) -> list[dict[str, Any]]:
    config = config_map(pool, ns)
    out = [config]
    if pool.spec.validation.enabled:
        # The gateway reports its task validation there; it outlives the gateway's pods.
        out.append(progress_config_map(pool, ns))
    out += gateway_objects(pool, ns, content_hash(config["data"][CONFIG_KEY]))
    out.append(gateway_network_policy(pool, ns))
    policy = network_policy(pool, ns)
    if policy is not None:
        out.append(policy)
    return out


def _benchmark(bench: Benchmark, ns: str, state: RenderState) -> list[dict[str, Any]]:
    # The progress ConfigMap outlives the runner: it holds the last report.
    out = [config_map(bench, ns), progress_config_map(bench, ns)]
    if state.finished:
        return out
    spec = inference_spec(bench)
    served = served_model(bench, state.checkpoint)
    # Only the runtime suspends a Benchmark: while Kueue has not admitted it (or evicted it).
    paused = state.suspended
    pool = inline_pool(bench, ns)
    if pool is not None and paused:
        pool["spec"]["replicas"] = 0
    if spec is not None and served is None:
        # A checkpoint not resolved yet: nothing to serve, nothing to run.
        return out + ([pool] if pool is not None else [])
    if spec is not None and served is not None:
        replicas = 0 if paused else spec.replicas
        out += inference_objects(
            bench, ns, served, spec, replicas=replicas, scheduling=bench.spec.scheduling
        )
    if pool is not None:
        out.append(pool)
    if paused:
        return out
    if spec is None or state.inference_ready:
        # The runner's identity exists exactly while the runner may run (created before it).
        out += runner_rbac(bench, ns)
        out.append(runner_job(bench, ns, served, state.baseline_results))
    return out


def render(
    resource: AnyResource, namespace: str | None = None, state: RenderState | None = None
) -> list[dict[str, Any]]:
    """Every child object the operator applies for `resource` in `state`, in apply order.

    `state` defaults to :meth:`RenderState.offline` (inference ready: every child shown).
    """
    state = state if state is not None else RenderState.offline()
    ns = _namespace(resource, namespace)
    owner_name(resource)  # refuse a nameless resource before building anything
    if isinstance(resource, TrainingRun):
        run = resource
        return _queued(run, ns, state, lambda s: _training_run(run, ns, s))
    if isinstance(resource, RolloutPool):
        return _rollout_pool(resource, ns)
    bench = resource
    return _queued(bench, ns, state, lambda s: _benchmark(bench, ns, s))


def retained(
    resource: AnyResource, namespace: str | None = None, state: RenderState | None = None
) -> list[tuple[str, str]]:
    """Children (kind, name) that `render` leaves out but the runtime must not prune.

    A finished Job: re-applying it after the Job controller's TTL removed it would run the
    workload again, and pruning it at once would lose its pods' logs. It goes with its TTL
    (Benchmark runner) or with its owner (trainer).
    """
    state = state if state is not None else RenderState.offline()
    if not state.finished:
        return []
    if isinstance(resource, TrainingRun):
        return [("Job", job_name(resource))]
    if isinstance(resource, Benchmark):
        return [("Job", runner_name(resource))]
    return []


def render_offline(
    resources: list[AnyResource], namespace: str | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """What `crl render` prints: every resource rendered as if its inference were ready.

    A Benchmark serving a checkpoint is resolved against a TrainingRun among `resources`, and
    its baseline's results directory against a Benchmark among them.
    Returns the children and notes for the reader about what the offline view cannot show.
    """
    runs = {r.metadata.name: r for r in resources if isinstance(r, TrainingRun)}
    benches = {r.metadata.name: r for r in resources if isinstance(r, Benchmark)}
    children: list[dict[str, Any]] = []
    notes = [
        "rendered as if inference were ready (the operator creates the trainer and runner"
        " Jobs only then); evaluation Benchmarks appear as checkpoints are saved; each"
        " RolloutPool's token Secret (<pool>-gateway-token) is made by the operator once, with"
        " a random value, and is not shown"
    ]
    for resource in resources:
        state = RenderState.offline()
        if isinstance(resource, Benchmark) and resource.spec.model.checkpoint is not None:
            run_name = resource.spec.model.checkpoint.training_run
            run = runs.get(run_name)
            if run is not None:
                state = RenderState(
                    inference_ready=True, checkpoint=resolve_checkpoint(resource, run)
                )
            else:
                notes.append(
                    f"Benchmark {resource.metadata.name} serves a checkpoint of TrainingRun"
                    f" {run_name}, which is not in the input: its inference server and runner"
                    " appear once the operator resolves the checkpoint (render both together"
                    " to see them)"
                )
        if isinstance(resource, Benchmark) and resource.spec.baseline is not None:
            baseline = benches.get(resource.spec.baseline.name)
            if baseline is not None:
                state = replace(state, baseline_results=baseline_results(resource, baseline))
        children.extend(render(resource, namespace, state))
    return children, notes
