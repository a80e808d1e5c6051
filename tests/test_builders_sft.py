"""A supervised TrainingRun (`algorithm.type: sft`) as the operator renders it: only the trainer,
at once, with what it reads (its config, the checkpoint volume its dataset is on, its progress
channel), and none of GRPO's rollout machinery (vLLM server, sandbox pool, pool token, tasks)."""

from __future__ import annotations

from typing import Any

import yaml

from crl_operator.builders import RenderState, render
from crl_worker.api import TrainingRun

from .fixtures.builders import STATES, container, env_of, find, kinds, load, pod_spec, with_spec
from .fixtures.cli import crl

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
    checkpoint volume, tasks on a volume and a referenced pool (both to be ignored)."""
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
        rollout={"poolRef": {"name": "shared-pool"}},
    )
    assert isinstance(sft, TrainingRun)
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
