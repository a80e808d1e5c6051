"""A supervised TrainingRun (`algorithm.type: sft`) as the operator renders it: only the trainer,
at once, with what it reads (its config, the checkpoint volume its dataset is on, its progress
channel), and none of GRPO's rollout machinery (vLLM server, sandbox pool, pool token, tasks)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from crl_operator.builders import RenderState, render
from crl_worker.api import TrainingRun
from crl_worker.api.validation import validate_text
from crl_worker.rollout.results import AttemptResult, ResultsStore
from crl_worker.train.settings import resolve_settings
from crl_worker.train.tasklist import load_tasks

from .fixtures.builders import (
    STATES,
    container,
    env_of,
    find,
    kinds,
    load,
    pod_spec,
    trainer_pod,
    with_spec,
)
from .fixtures.cli import crl
from .fixtures.paths import ROOT

#: The supervised run's children, in apply order: configs, then the trainer and its identity.
TRAINER_ONLY = [
    "ConfigMap",
    "ConfigMap",
    "Service",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "Job",
]
#: What a trainer that runs rollouts is told, and a supervised one must not be.
ROLLOUT_ENV = {
    "CRL_POOL_URL",
    "CRL_POOL_TOKEN",
    "CRL_INFERENCE_URL",
    "CRL_INFERENCE_MODEL",
    "CRL_WEIGHT_SYNC",
    "CRL_INFERENCE_PEERS",
}


def cluster_sft() -> TrainingRun:
    """The cluster example turned into its recipe's SFT step: a Benchmark's results on the
    checkpoint volume, and tasks on a volume (required by the schema, to be ignored)."""
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    sft = with_spec(
        run,
        algorithm={
            "type": "sft",
            "sft": {"dataset": {"benchmarkResults": "results/sample", "perInstance": 4}},
            "steps": 100,
            "learningRate": 1.0e-5,
        },
        tasks={"format": "swe-gym", "volume": {"claimName": "data", "path": "/gym.parquet"}},
        # GRPO's pool, reward and weight sync are refused with sft: the agent's token limit stays.
        rollout={"agent": {"maxTotalTokens": 32768}},
        weightSync="auto",
    )
    assert isinstance(sft, TrainingRun)
    # A run the API server would take (its CEL rules, as `crl validate` evaluates them).
    [checked] = validate_text(yaml.safe_dump(sft.model_dump(mode="json", by_alias=True)))
    assert checked.ok, [str(p) for p in checked.problems]
    return sft


def assert_no_rollouts(children: list[dict[str, Any]]) -> dict[str, Any]:
    """No server, no pool, no gateway; the trainer neither leases nor generates. Its Job."""
    assert not {"Deployment", "RolloutPool", "NetworkPolicy"} & set(kinds(children))
    components = {c["metadata"]["labels"].get("app.kubernetes.io/component") for c in children}
    assert not {"inference", "inference-peers", "gateway"} & components
    job = find(children, "Job")
    assert not ROLLOUT_ENV & set(env_of(job))
    assert "coderepair.io/pool-client" not in job["spec"]["template"]["metadata"]["labels"]
    return job


def test_a_supervised_run_is_only_its_trainer_and_does_not_wait() -> None:
    run = load("local-trainingrun-toy-sft.yaml")
    for state in ("waiting", "ready"):
        children = render(run, state=STATES[state])
        # Inference never becomes ready (there is none): the trainer is there at once.
        assert kinds(children) == TRAINER_ONLY, state
        job = assert_no_rollouts(children)
    env = env_of(job)
    # It still reports its progress, and its identity may write exactly that ConfigMap.
    assert env["CRL_PROGRESS_CONFIGMAP"] == "toy-sft-progress"
    assert find(children, "Role")["rules"][0]["resourceNames"] == ["toy-sft-progress"]
    assert env["CRL_CHECKPOINT_DIR"] == "/checkpoints"
    assert pod_spec(job)["serviceAccountName"] == "toy-sft-trainer"
    # Suspended and finished runs keep what a GRPO run keeps: configs only.
    assert kinds(render(run, state=STATES["suspended"])) == ["ConfigMap", "ConfigMap"]
    assert kinds(render(run, state=STATES["finished"])) == ["ConfigMap", "ConfigMap"]


def test_a_cluster_sft_run_reads_its_dataset_from_the_checkpoint_volume() -> None:
    run = cluster_sft()
    children = render(run, state=STATES["waiting"])
    assert kinds(children) == TRAINER_ONLY
    job = assert_no_rollouts(children)
    spec = pod_spec(job)
    # The dataset (benchmarkResults, relative to the checkpoint volume) and the exported
    # `sft-dataset/` live on the checkpoint volume, mounted where the trainer writes.
    [mount] = [m for m in container(job)["volumeMounts"] if m["name"] == "checkpoints"]
    assert mount == {
        "name": "checkpoints",
        "mountPath": "/checkpoints",
        "subPath": "qwen3-8b-swe-gym",
    }
    claims = {v["name"]: v.get("persistentVolumeClaim") for v in spec["volumes"]}
    assert claims["checkpoints"] == {"claimName": "rl-checkpoints"}
    assert claims["model"] == {"claimName": "model-weights", "readOnly": True}
    # The tasks are GRPO's: neither mounted nor passed.
    assert "tasks" not in claims
    assert "--tasks" not in container(job)["args"]
    assert "--tasks" not in container(job)["command"][2]
    # The worker config says sft: the trainer picks SFTTrainer from it.
    config = yaml.safe_load(find(children, "ConfigMap", "-config")["data"]["config.yaml"])
    assert config["spec"]["algorithm"]["type"] == "sft"
    # Evaluation Benchmarks follow its checkpoints as a GRPO run's do.
    later = render(run, state=RenderState(evaluation_steps=(50,)))
    assert kinds(later)[-1] == "Benchmark"


def test_a_queued_sft_run_asks_kueue_for_the_trainer_alone() -> None:
    run = with_spec(cluster_sft(), scheduling={"queueName": "team-a"})
    assert isinstance(run, TrainingRun)
    waiting = render(run, state=RenderState(queued=True, admitted=False))
    assert kinds(waiting) == ["Workload", "ConfigMap", "ConfigMap"]
    [pod_set] = waiting[0]["spec"]["podSets"]
    assert pod_set["count"] == run.spec.trainer.nodes
    admitted = render(run, state=RenderState(queued=True, admitted=True))
    assert kinds(admitted) == ["Workload", *TRAINER_ONLY]


def test_crl_render_of_the_sft_example_shows_only_the_trainer() -> None:
    result = crl("render", "examples/local-trainingrun-toy-sft.yaml")
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ConfigMap", "toy-sft-config"),
        ("ConfigMap", "toy-sft-progress"),
        ("Service", "toy-sft-trainer"),
        ("ServiceAccount", "toy-sft-trainer"),
        ("Role", "toy-sft-trainer"),
        ("RoleBinding", "toy-sft-trainer"),
        ("Job", "toy-sft-trainer"),
    ]
    assert_no_rollouts(docs)


def write_bench_results(folder: Path, resolved: dict[str, bool]) -> None:
    """A results folder as `crl bench` writes it: one attempt per instance."""
    store = ResultsStore(folder)
    store.open({"suite": "mini"})
    try:
        for instance, outcome in resolved.items():
            result = AttemptResult(
                instance_id=instance,
                repo="crl-mini/x",
                attempt=0,
                resolved=outcome,
                exit_reason="submitted",
            )
            store.append(result, "{}")
    finally:
        store.close()


def test_a_trainer_pod_reads_benchmark_results_on_the_volume_the_operator_mounts(
    tmp_path: Path,
) -> None:
    """`curriculum.results` and `sft.dataset.benchmarkResults` are relative to the checkpoint
    volume: the trainer, in the pod the operator renders, reads them there (not beside the
    ConfigMap's copy of the manifest, where nothing is)."""
    grpo = with_spec(
        load("trainingrun-qwen3-8b-swe-gym.yaml"),
        tasks={"format": "task", "volume": {"claimName": "data", "path": "/mini.jsonl"}},
        curriculum={"order": "benchmark-results", "results": "baselines/base"},
    )
    pod = trainer_pod(render(grpo, state=STATES["ready"]), tmp_path / "grpo")
    # The Benchmark wrote to the same claim and subPath: in the pod, under the mount.
    assert pod.env["CRL_CHECKPOINT_DIR"] == str(pod.volume("checkpoints"))
    write_bench_results(
        pod.volume("checkpoints") / "baselines" / "base",
        {"crl-mini__lrukit-1": True, "crl-mini__iniconf-2": True, "crl-mini__iniconf-1": False},
    )
    assert pod.tasks is not None
    pod.tasks.parent.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "suites" / "mini" / "tasks.jsonl", pod.tasks)
    settings = resolve_settings(pod.config, env=pod.env, tasks_file=pod.tasks)
    ordered = [t.instance_id for t in load_tasks(settings)]
    assert ordered[:3] == ["crl-mini__iniconf-2", "crl-mini__lrukit-1", "crl-mini__iniconf-1"]

    sft = trainer_pod(render(cluster_sft(), state=STATES["waiting"]), tmp_path / "sft")
    settings = resolve_settings(sft.config, env=sft.env)
    assert settings.spec.algorithm.sft is not None
    results = settings.spec.algorithm.sft.dataset.benchmark_results
    assert results is not None
    assert settings.spec_path(results) == sft.volume("checkpoints") / "results" / "sample"
