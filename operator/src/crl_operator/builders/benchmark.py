"""A Benchmark's children: the vLLM server when it serves the model itself, and the runner Job;
and the Benchmarks a TrainingRun creates for its periodic evaluations.

The runner is `python -m crl_worker.bench --config /etc/crl/config.yaml` (the benchmark runner's
entry point in the worker image). It reads the model's URL and name from its environment: the
operator's own vLLM Service, or the external endpoint with the API key from the Secret the
spec names (a `secretKeyRef`: the operator never reads the Secret).

The runner reports its progress into a ConfigMap of its own, `<bench>-progress`, key
`progress.json` (crl_worker.rollout.report), with a ServiceAccount that may `get` and `patch` that
one ConfigMap and nothing else (crl_operator.builders.progress).
"""

from __future__ import annotations

from typing import Any

from crl_operator.builders.config import CONFIG_PATH, config_map_name
from crl_operator.builders.inference import (
    CHECKPOINT_DIR,
    MODEL_DIR,
    ServedModel,
    base_url,
    lora_rank_bound,
)
from crl_operator.builders.meta import (
    COMPONENT_EVALUATION,
    COMPONENT_RUNNER,
    JOB_NAME_LIMIT,
    BuildError,
    ResolvedCheckpoint,
    child_name,
    labels,
    object_meta,
    owner_name,
)
from crl_operator.builders.pods import (
    RESTRICTED_CONTAINER,
    config_mount,
    config_volume,
    env,
    env_field,
    env_secret,
    job,
    mount,
    priority,
    scheduling_labels,
    task_mount,
    volume_or_scratch,
)
from crl_operator.builders.pool import client_labels, gateway_url, pool_name, token_env
from crl_operator.builders.progress import progress_name, reporter_rbac
from crl_worker.api import API_VERSION, Benchmark, TrainingRun
from crl_worker.api.common import DEFAULT_WORKER_IMAGE, InferenceSpec
from crl_worker.api.contract import Env, Label

#: Where the results volume is mounted in the runner.
RESULTS_DIR = "/results"


def runner_name(bench: Benchmark) -> str:
    """Name of the runner Job, and of its ServiceAccount, Role and RoleBinding."""
    return child_name(owner_name(bench), COMPONENT_RUNNER, limit=JOB_NAME_LIMIT)


def runner_rbac(bench: Benchmark, namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding of the runner: `get` and `patch` on its progress
    ConfigMap (by name), nothing else. Sandboxes come from the gateway over HTTP."""
    return reporter_rbac(bench, runner_name(bench), COMPONENT_RUNNER, namespace)


def baseline_results(bench: Benchmark, baseline: Benchmark) -> str | None:
    """The baseline's results directory inside this benchmark's runner, or None.

    The runner mounts only its own results volume, so it sees the baseline's results when both
    write to the same claim under the same `subPath`, in different directories.
    """
    mine, theirs = bench.spec.results, baseline.spec.results
    if mine.volume is None or theirs.volume is None:
        return None
    if (mine.volume.claim_name, mine.volume.sub_path) != (
        theirs.volume.claim_name,
        theirs.volume.sub_path,
    ):
        return None
    if mine.path.strip("/") == theirs.path.strip("/"):
        return None  # the same directory: nothing to compare with
    return f"{RESULTS_DIR}/{theirs.path.strip('/')}"


def checkpoint_model_name(bench: Benchmark) -> str:
    """The name a served checkpoint answers to: `<trainingRun>/<step>`."""
    ckpt = bench.spec.model.checkpoint
    assert ckpt is not None
    return f"{ckpt.training_run}/{ckpt.step}"


def inference_spec(bench: Benchmark) -> InferenceSpec | None:
    """The vLLM settings when the benchmark serves its model; None for an external endpoint."""
    model = bench.spec.model
    if model.serve is not None:
        return model.serve.inference
    if model.checkpoint is not None:
        return model.checkpoint.inference
    return None


def served_model(bench: Benchmark, checkpoint: ResolvedCheckpoint | None) -> ServedModel | None:
    """What the benchmark's vLLM server serves; None when it serves nothing (an endpoint) or
    when its checkpoint is not resolved yet."""
    model = bench.spec.model
    if model.serve is not None:
        serve = model.serve
        if serve.volume is not None:
            return ServedModel(
                model=f"{MODEL_DIR}/{serve.name}",
                served_name=serve.name,
                dtype=serve.dtype,
                trust_remote_code=serve.trust_remote_code,
                volumes=(("model", serve.volume, MODEL_DIR),),
            )
        return ServedModel(
            model=serve.name,
            served_name=serve.name,
            dtype=serve.dtype,
            revision=serve.revision,
            trust_remote_code=serve.trust_remote_code,
        )
    if model.checkpoint is None or checkpoint is None:
        return None
    name = checkpoint_model_name(bench)
    path = f"{CHECKPOINT_DIR}/{checkpoint.path}"
    volumes: tuple[tuple[str, Any, str], ...] = (
        ("checkpoints", checkpoint.volume, CHECKPOINT_DIR),
    )
    if checkpoint.lora_rank is None:
        # Full weights: the trainer saves the tokenizer with them, so the directory serves.
        return ServedModel(
            model=path,
            served_name=name,
            dtype=checkpoint.dtype,
            trust_remote_code=checkpoint.trust_remote_code,
            volumes=volumes,
        )
    # An adapter: serve the run's base model with the checkpoint as a named LoRA module.
    base = checkpoint.base_model
    if checkpoint.base_volume is not None:
        volumes += (("model", checkpoint.base_volume, MODEL_DIR),)
        base = f"{MODEL_DIR}/{checkpoint.base_model}"
    return ServedModel(
        model=base,
        served_name=checkpoint.base_model,
        dtype=checkpoint.dtype,
        trust_remote_code=checkpoint.trust_remote_code,
        volumes=volumes,
        max_lora_rank=lora_rank_bound(checkpoint.lora_rank),
        lora_modules=(f"{name}={path}",),
    )


def resolve_checkpoint(bench: Benchmark, run: TrainingRun) -> ResolvedCheckpoint:
    """Where the checkpoint a Benchmark evaluates lies, from the TrainingRun that wrote it.

    `latest` is the run's `status.lastCheckpoint` when known, else the `latest` link the
    trainer keeps next to its checkpoints.
    """
    ckpt = bench.spec.model.checkpoint
    if ckpt is None:
        raise BuildError(f"Benchmark {owner_name(bench)} serves no checkpoint")
    if ckpt.training_run != owner_name(run):
        raise BuildError(
            f"Benchmark {owner_name(bench)} evaluates TrainingRun {ckpt.training_run},"
            f" not {owner_name(run)}"
        )
    volume = run.spec.checkpoints.volume
    if volume is None:
        raise BuildError(
            f"Benchmark {owner_name(bench)} cannot serve a checkpoint of TrainingRun"
            f" {ckpt.training_run}: that run keeps its checkpoints on no volume; set"
            " spec.checkpoints.volume on the run"
        )
    path = ckpt.step
    last = run.status.last_checkpoint if run.status is not None else None
    if ckpt.step == "latest" and last is not None:
        path = last.path
    lora = run.spec.algorithm.lora
    return ResolvedCheckpoint(
        volume=volume,
        path=path,
        base_model=run.spec.model.name,
        base_volume=run.spec.model.volume,
        lora_rank=lora.rank if lora is not None else None,
        trust_remote_code=run.spec.model.trust_remote_code,
        dtype=run.spec.model.dtype,
    )


def model_env(bench: Benchmark, served: ServedModel | None) -> list[dict[str, Any]]:
    """Where the runner finds the model: URL, name and (for an endpoint) the API key."""
    if bench.spec.model.gold is not None:
        return []  # the gold replay asks no model
    endpoint = bench.spec.model.endpoint
    if endpoint is not None:
        out = [env(Env.MODEL_URL, endpoint.url), env(Env.MODEL_NAME, endpoint.model_name)]
        ref = endpoint.api_key_secret_ref
        if ref is not None:
            out.append(env_secret(Env.API_KEY, ref.name, ref.key))
        return out
    spec = inference_spec(bench)
    assert spec is not None and served is not None
    name = checkpoint_model_name(bench) if bench.spec.model.checkpoint else served.served_name
    return [env(Env.MODEL_URL, base_url(bench, spec)), env(Env.MODEL_NAME, name)]


def runner_job(
    bench: Benchmark,
    namespace: str,
    served: ServedModel | None,
    baseline: str | None = None,
) -> dict[str, Any]:
    """The runner Job: one pod that runs the suite against the model with the pool's sandboxes.

    `baseline` is the baseline's results directory as the runner sees it
    (:func:`baseline_results`), passed as `CRL_BASELINE_RESULTS`.
    """
    spec = bench.spec
    kueue = scheduling_labels(spec.scheduling)
    results = spec.results
    # A task file from a ConfigMap or a claim is mounted, as for the pool gateway; other
    # sources (a path in the image, a URL, a dataset) are read through the config.
    tasks = task_mount(spec.suite.tasks)
    mounted = bool(tasks.volumes) and tasks.path is not None
    container: dict[str, Any] = {
        "name": "runner",
        # The benchmark has no image of its own: its inline pool's worker image, else the default.
        "image": spec.pool.gateway.image if spec.pool is not None else DEFAULT_WORKER_IMAGE,
        "command": ["python", "-m", "crl_worker.bench"],
        "args": ["--config", CONFIG_PATH, *(["--tasks", str(tasks.path)] if mounted else [])],
        "env": [
            env_field("POD_NAMESPACE", "metadata.namespace"),
            env(Env.BENCHMARK_NAME, owner_name(bench)),
            env(Env.CONFIG, CONFIG_PATH),
            *model_env(bench, served),
            env(Env.POOL_URL, gateway_url(pool_name(bench))),
            token_env(pool_name(bench)),
            env(Env.RESULTS_DIR, f"{RESULTS_DIR}/{results.path}"),
            env(Env.PROGRESS_CONFIGMAP, progress_name(bench)),
            *([env(Env.BASELINE_RESULTS, baseline)] if baseline else []),
        ],
        "volumeMounts": [
            config_mount(),
            mount("results", RESULTS_DIR, results.volume),
            {"name": "tmp", "mountPath": "/tmp"},
            *(tasks.mounts if mounted else []),
        ],
        "securityContext": {**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True},
    }
    job_spec: dict[str, Any] = {
        "completions": 1,
        "parallelism": 1,
        # The runner resumes from the results already on the volume, so a retry is cheap.
        "backoffLimit": 3,
        "podFailurePolicy": {
            "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
        },
        "template": {
            "metadata": {
                "labels": {
                    **labels(bench, COMPONENT_RUNNER),
                    **client_labels(pool_name(bench)),
                    **kueue,
                }
            },
            "spec": {
                "restartPolicy": "Never",
                "enableServiceLinks": False,
                # Its own identity, allowed only to write its progress report; the token is
                # mounted for that (sandbox pods get none).
                "serviceAccountName": runner_name(bench),
                "automountServiceAccountToken": True,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 1000,
                    "runAsGroup": 1000,
                    # Lets the runner write to the results volume.
                    "fsGroup": 1000,
                },
                **priority(spec.scheduling),
                "containers": [container],
                "volumes": [
                    config_volume(config_map_name(bench)),
                    volume_or_scratch("results", results.volume),
                    {"name": "tmp", "emptyDir": {}},
                    *(tasks.volumes if mounted else []),
                ],
            },
        },
    }
    if spec.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    return job(bench, runner_name(bench), COMPONENT_RUNNER, namespace, job_spec, spec.scheduling)


def evaluation_name(run: TrainingRun, step: int) -> str:
    """Name of the evaluation Benchmark of `step`."""
    return child_name(owner_name(run), f"eval-{step}")


def evaluation_benchmark(run: TrainingRun, namespace: str, step: int) -> dict[str, Any]:
    """The Benchmark evaluating the run's checkpoint of `step` with `spec.evaluation`.

    It serves the checkpoint with the run's own inference settings, and queues in the run's
    Kueue queue unless the template names its own.
    """
    evaluation = run.spec.evaluation
    if evaluation is None:
        raise BuildError(f"TrainingRun {owner_name(run)} has no spec.evaluation")
    template = evaluation.benchmark.to_wire()
    if not evaluation.benchmark.scheduling.queue_name:
        template["scheduling"] = {
            **run.spec.scheduling.to_wire(),
            **template.get("scheduling", {}),
        }
        # The run's deadline is the run's, not the evaluation's.
        template["scheduling"].pop("maxRunSeconds", None)
        # The template's default `false` would hide the run's choice for its sandboxes.
        template["scheduling"]["sandboxesUseQuota"] = run.spec.scheduling.sandboxes_use_quota
    name = evaluation_name(run, step)
    inference = run.spec.inference.to_wire()
    spec = {
        **template,
        "model": {
            "checkpoint": {
                "trainingRun": owner_name(run),
                "step": f"step-{step}",
                "inference": inference,
            }
        },
    }
    # Validating fills the Benchmark's defaults in, so the child is exactly what is stored.
    child = Benchmark.model_validate(
        {"apiVersion": API_VERSION, "kind": "Benchmark", "metadata": {"name": name}, "spec": spec}
    )
    meta = object_meta(run, name, COMPONENT_EVALUATION, namespace)
    meta["labels"][Label.STEP] = str(step)
    return {
        "apiVersion": API_VERSION,
        "kind": "Benchmark",
        "metadata": meta,
        "spec": child.spec.to_wire(),
    }
