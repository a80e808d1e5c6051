"""Pure builders on real manifests: names, labels, owner references, and what each child holds.

Every example is rendered in every state the runtime can observe (waiting for inference,
ready, suspended, finished); the invariants hold for all of them, and table-driven tests pin
what each kind of child must contain. Whether the API server accepts the children is tested
against a real one in `test_chart_cluster.py`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from crl_operator.builders import (
    NAME_LIMIT,
    BuildError,
    RenderState,
    baseline_results,
    child_name,
    render,
    render_offline,
    resolve_checkpoint,
    retained,
)
from crl_operator.builders.inference import WEIGHT_TRANSFER_CONFIG, lora_rank_bound
from crl_operator.builders.meta import JOB_NAME_LIMIT, ResolvedCheckpoint
from crl_operator.builders.pool import pool_name
from crl_worker.api import AnyResource, Benchmark, RolloutPool, TrainingRun
from crl_worker.api.base import VolumeSource
from crl_worker.api.validation import load_resources

from .paths import EXAMPLES, ROOT

UID = "0f6e3c1a-5a8e-4c4e-9d3e-2b7f5d1c9a10"
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
STATES = {
    "waiting": RenderState(),
    "ready": RenderState(inference_ready=True),
    "suspended": RenderState(inference_ready=True, suspended=True),
    "finished": RenderState(inference_ready=True, finished=True),
}

RUN = {
    "apiVersion": "coderepair.io/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "r", "namespace": "ns", "uid": "1234"},
    "spec": {"model": {"name": "m"}, "tasks": {"path": "t.jsonl"}},
}


def load(name: str, *, uid: bool = True) -> AnyResource:
    """An example as the live object: with a uid, so children get owner references."""
    [resource] = load_resources(str(ROOT / "examples" / name))
    if uid:
        data = resource.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["metadata"]["uid"] = UID
        return type(resource).model_validate(data)
    return resource


def with_spec(resource: AnyResource, **changes: Any) -> AnyResource:
    """A copy of `resource` with top-level spec fields replaced (wire names)."""
    data = resource.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"] = {**data["spec"], **copy.deepcopy(changes)}
    return type(resource).model_validate(data)


def find(children: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    matches = [c for c in children if c["kind"] == kind and c["metadata"]["name"].endswith(suffix)]
    assert len(matches) == 1, [(c["kind"], c["metadata"]["name"]) for c in children]
    return matches[0]


def kinds(children: list[dict[str, Any]]) -> list[str]:
    return [c["kind"] for c in children]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [c] = pod_spec(workload)["containers"]
    return dict(c)


def env_of(workload: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(workload)["env"]}


def flag(args: list[str], name: str) -> str | None:
    """The value after `name` in an argument list (None when the flag is absent)."""
    return args[args.index(name) + 1] if name in args else None


# --- invariants over every example and every state ------------------------------------------

CASES = [(p.name, s) for p in EXAMPLES for s in STATES]


@pytest.mark.parametrize(("example", "state"), CASES)
def test_every_child_is_named_labelled_and_owned(example: str, state: str) -> None:
    resource = load(example)
    children = render(resource, state=STATES[state])
    assert children == render(resource, state=STATES[state])  # deterministic
    assert children[0]["kind"] == "ConfigMap"
    seen = set()
    for child in children:
        meta = child["metadata"]
        name = meta["name"]
        assert (child["kind"], name) not in seen
        seen.add((child["kind"], name))
        assert len(name) <= NAME_LIMIT and DNS1123_LABEL.match(name), name
        if child["kind"] in ("Service", "Deployment", "Job"):
            assert DNS1035_LABEL.match(name), name
        assert meta["namespace"] == (resource.metadata.namespace or "default")
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "coderepairrl"
        assert labels["app.kubernetes.io/instance"] == resource.metadata.name
        assert labels["app.kubernetes.io/part-of"] == "coderepairrl"
        assert labels["app.kubernetes.io/managed-by"] == "coderepairrl-operator"
        assert labels["app.kubernetes.io/component"]
        assert labels[f"coderepair.io/{resource.kind.lower()}"] == resource.metadata.name
        assert all(len(v) <= 63 for v in labels.values())
        [owner] = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "coderepair.io/v1alpha1",
            "kind": resource.kind,
            "name": resource.metadata.name,
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        if child["kind"] in ("Deployment", "Job"):
            template_labels = child["spec"]["template"]["metadata"]["labels"]
            selector = child["spec"].get("selector", {}).get("matchLabels", {})
            assert selector.items() <= template_labels.items()
            assert pod_spec(child)["enableServiceLinks"] is False


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_custom_children_validate_as_their_kind(example: str) -> None:
    """Inline pools and evaluation Benchmarks are themselves valid custom resources."""
    resource = load(example)
    steps = (50, 100) if isinstance(resource, TrainingRun) and resource.spec.evaluation else ()
    children = render(resource, state=RenderState(inference_ready=True, evaluation_steps=steps))
    models = {"RolloutPool": RolloutPool, "Benchmark": Benchmark}
    for child in children:
        if child["kind"] in models:
            models[child["kind"]].model_validate(child)


def test_without_a_uid_there_are_no_owner_references() -> None:
    children = render(load("rolloutpool-swe-gym.yaml", uid=False))
    assert all("ownerReferences" not in c["metadata"] for c in children)


def test_child_names_are_short_and_deterministic() -> None:
    assert child_name("run", "config") == "run-config"
    long = "a" * 60
    first, second = child_name(long, "config"), child_name(long, "config")
    assert first == second
    assert len(first) <= NAME_LIMIT
    assert first.endswith("-config")
    assert child_name(long + "b", "config") != first


def test_a_63_character_name_gives_valid_distinct_children() -> None:
    base = load("trainingrun-qwen3-8b-swe-gym.yaml")
    names = ["x" * 63, "x" * 62 + "y"]
    rendered = []
    for name in names:
        data = base.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["metadata"]["name"] = name
        rendered.append(render(TrainingRun.model_validate(data)))
    for children in rendered:
        for child in children:
            assert len(child["metadata"]["name"]) <= NAME_LIMIT
            assert DNS1035_LABEL.match(child["metadata"]["name"])
        job = find(children, "Job")
        # Indexed pods are named <job>-<index>: that must stay a valid hostname.
        assert len(job["metadata"]["name"]) <= JOB_NAME_LIMIT
        master = env_of(job)["MASTER_ADDR"]
        assert master.split(".")[0] == job["metadata"]["name"] + "-0"
        assert master.split(".")[1] == pod_spec(job)["subdomain"]
    first, second = ({c["metadata"]["name"] for c in r} for r in rendered)
    assert not first & second


def test_a_resource_without_a_name_cannot_be_built() -> None:
    run = TrainingRun.model_validate({**RUN, "metadata": {"generateName": "r-"}})
    with pytest.raises(BuildError, match="generateName"):
        render(run)


# --- TrainingRun ----------------------------------------------------------------------------


def test_training_run_children_follow_the_state() -> None:
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    base = ["ConfigMap", "ConfigMap", "Deployment", "Service", "Service", "RolloutPool"]
    assert kinds(render(run, state=STATES["waiting"])) == base
    trainer = ["Service", "ServiceAccount", "Role", "RoleBinding", "Job"]
    assert kinds(render(run, state=STATES["ready"])) == [*base, *trainer]
    # The config and the trainer's last progress report stay; its identity goes.
    assert kinds(render(run, state=STATES["finished"])) == ["ConfigMap", "ConfigMap"]
    assert retained(run, state=STATES["finished"]) == [("Job", "qwen3-8b-swe-gym-trainer")]
    assert retained(run, state=STATES["ready"]) == []


@pytest.mark.parametrize("how", ["spec", "runtime"])
def test_a_suspended_run_has_no_trainer_and_no_servers(how: str) -> None:
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    if how == "spec":
        run, state = with_spec(run, suspend=True), STATES["ready"]
    else:
        state = STATES["suspended"]
    children = render(run, state=state)
    assert "Job" not in kinds(children)
    assert find(children, "Deployment", "-inference")["spec"]["replicas"] == 0
    assert find(children, "RolloutPool")["spec"]["replicas"] == 0
    # The checkpoints and the config stay: resuming needs both. So does the last report.
    assert find(children, "ConfigMap", "-config")
    assert find(children, "ConfigMap", "-progress")
    assert not {"ServiceAccount", "Role", "RoleBinding"} & set(kinds(children))


def test_vllm_server_of_a_full_fine_tuning_run() -> None:
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    children = render(run)
    deployment = find(children, "Deployment", "-inference")
    assert deployment["spec"]["replicas"] == 2
    vllm = container(deployment)
    assert vllm["command"] == ["vllm", "serve"]
    args = vllm["args"]
    # Weights come from the model volume, served under the Hub name.
    assert args[0] == "/models/Qwen/Qwen3-8B"
    assert flag(args, "--served-model-name") == "Qwen/Qwen3-8B"
    assert flag(args, "--tensor-parallel-size") == "2"
    assert flag(args, "--max-model-len") == "40960"
    assert flag(args, "--gpu-memory-utilization") == "0.85"
    assert flag(args, "--dtype") == "bfloat16"
    # The agent sends `tool_choice: auto`: vLLM refuses it (400) without both flags.
    assert "--enable-auto-tool-choice" in args
    assert flag(args, "--tool-call-parser") == "hermes"
    assert vllm["image"] == "vllm/vllm-openai:v0.32.0"  # the release tests/test_vllm_real.py runs
    # The trainer's importance-sampling correction compares with processed logprobs.
    assert flag(args, "--logprobs-mode") == "processed_logprobs"
    assert "--data-parallel-size" not in args  # gpus == tensorParallelSize
    # vLLM's own weight-transfer engine receives the weights: no worker extension, no TRL.
    assert json.loads(flag(args, "--weight-transfer-config")) == {"backend": "nccl"}
    assert flag(args, "--weight-transfer-config") == WEIGHT_TRANSFER_CONFIG
    assert "--worker-extension-cls" not in args
    assert "--enable-lora" not in args
    assert args[-1] == "--enable-prefix-caching"  # extraArgs last, so they win
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env == {"HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == 2
    [model_mount] = [m for m in vllm["volumeMounts"] if m["name"] == "model"]
    assert model_mount == {
        "name": "model",
        "mountPath": "/models",
        "readOnly": True,
        "subPath": "qwen3-8b",
    }
    # The startup probe gives the server the spec's whole startup budget before liveness.
    startup = vllm["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert run.spec.inference.startup_timeout_seconds <= budget < 1800 + startup["periodSeconds"]
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    assert vllm["livenessProbe"]["httpGet"]["path"] == "/health"
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "model-weights"
    assert pod_spec(deployment)["priorityClassName"] == "research-high"
    # The trainer drives every server pod through the headless peers Service; the pods listen
    # on nothing but HTTP (the trainer hosts the NCCL rendezvous and the workers dial out).
    assert [p["name"] for p in vllm["ports"]] == ["http"]
    peers = find(children, "Service", "-inference-peers")
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [p["name"] for p in peers["spec"]["ports"]] == ["http"]
    service = find(children, "Service", "-inference")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 8000


def test_vllm_server_of_a_lora_run() -> None:
    run = load("local-trainingrun-tiny-cpu.yaml")
    children = render(run)
    vllm = container(find(children, "Deployment", "-inference"))
    args = vllm["args"]
    assert args[0] == "Qwen/Qwen2.5-0.5B-Instruct"  # no volume: from the Hub
    assert "--enable-lora" in args
    assert flag(args, "--max-lora-rank") == "8"
    assert flag(args, "--max-loras") == "1"  # maxStaleness 0 (default): one version resident
    assert "--weight-transfer-config" not in args
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    # Each replica must load every adapter: the trainer reaches them through the peers Service.
    peers = find(children, "Service", "-inference-peers")
    assert peers["spec"]["clusterIP"] == "None"
    assert env_of(find(children, "Job"))["CRL_WEIGHT_SYNC"] == "lora-adapter"


@pytest.mark.parametrize(
    ("rank", "bound"), [(1, 1), (2, 8), (8, 8), (9, 16), (100, 128), (300, 320), (512, 512)]
)
def test_lora_rank_rounds_up_to_what_vllm_accepts(rank: int, bound: int) -> None:
    assert lora_rank_bound(rank) == bound


def test_tool_call_parser_follows_the_model_family() -> None:
    run = with_spec(
        load("local-trainingrun-tiny-cpu.yaml"), inference={"toolCallParser": "qwen3_coder"}
    )
    args = container(find(render(run), "Deployment", "-inference"))["args"]
    assert "--enable-auto-tool-choice" in args
    assert flag(args, "--tool-call-parser") == "qwen3_coder"


def test_data_parallel_inside_one_server() -> None:
    run = with_spec(
        load("trainingrun-qwen3-8b-swe-gym.yaml"),
        inference={"gpus": 8, "tensorParallelSize": 2},
    )
    vllm = container(find(render(run), "Deployment", "-inference"))
    assert flag(vllm["args"], "--data-parallel-size") == "4"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_trainer_job_and_rendezvous() -> None:
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    children = render(run)
    job = find(children, "Job")
    service = find(children, "Service", "-trainer")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] >= 2
    assert spec["activeDeadlineSeconds"] == 259200
    assert "suspend" not in spec  # Kueue owns it
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    pod = pod_spec(job)
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == 29500
    assert (
        service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    )
    env = env_of(job)
    assert env["MASTER_ADDR"] == "qwen3-8b-swe-gym-trainer-0.qwen3-8b-swe-gym-trainer"
    assert env["MASTER_PORT"] == "29500"
    assert env["NNODES"] == "2"
    assert env["WORLD_SIZE"] == "16"
    assert env["GPUS_PER_NODE"] == env["NPROC_PER_NODE"] == "8"
    assert env["NODE_RANK"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    assert env["CRL_INFERENCE_URL"] == "http://qwen3-8b-swe-gym-inference:8000/v1"
    assert env["CRL_INFERENCE_PEERS"] == "qwen3-8b-swe-gym-inference-peers"
    assert env["CRL_POOL_URL"] == "http://qwen3-8b-swe-gym-pool-gateway:8080"
    assert env["CRL_CONFIG"] == "/etc/crl/config.yaml"
    trainer = container(job)
    # Every $(VAR) the launcher's arguments use is defined in the env.
    for ref in re.findall(r"\$\((\w+)\)", " ".join(trainer["args"])):
        assert ref in env, ref
    assert flag(trainer["args"], "--config_file") == "/etc/crl/accelerate.yaml"
    assert trainer["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert trainer["resources"]["requests"] == {
        "cpu": "64",
        "memory": "900Gi",
        "nvidia.com/gpu": 8,
    }
    mounts = {m["mountPath"]: m for m in trainer["volumeMounts"]}
    assert mounts["/checkpoints"]["subPath"] == "qwen3-8b-swe-gym"
    assert mounts["/dev/shm"]["name"] == "dshm"
    assert mounts["/etc/crl"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "rl-checkpoints"
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["priorityClassName"] == "research-high"


def test_cpu_trainer_has_no_gpus_and_scratch_checkpoints() -> None:
    children = render(load("local-trainingrun-tiny-cpu.yaml"))
    job = find(children, "Job")
    trainer = container(job)
    assert "nvidia.com/gpu" not in json.dumps(trainer["resources"])
    env = env_of(job)
    assert env["WORLD_SIZE"] == "1"
    assert env["NPROC_PER_NODE"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    assert volumes["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}
    accelerate = yaml.safe_load(find(children, "ConfigMap", "-config")["data"]["accelerate.yaml"])
    assert accelerate["distributed_type"] == "NO"
    assert accelerate["use_cpu"] is True


@pytest.mark.parametrize(
    ("deepspeed", "expect"),
    [
        (
            {"zeroStage": 3},
            {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
        ),
        (
            {"zeroStage": 3, "offloadOptimizer": "cpu", "offloadParameters": "cpu"},
            {
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "offload_param": {"device": "cpu", "pin_memory": True},
            },
        ),
        ({"zeroStage": 2, "offloadOptimizer": "cpu"}, {"stage": 2, "contiguous_gradients": True}),
        ({"zeroStage": 1}, {"stage": 1, "overlap_comm": True}),
        ({"zeroStage": 0}, {"stage": 0}),
    ],
)
def test_deepspeed_config_follows_the_spec(
    deepspeed: dict[str, Any], expect: dict[str, Any]
) -> None:
    run = with_spec(
        load("trainingrun-qwen3-8b-swe-gym.yaml"),
        trainer={"nodes": 2, "gpusPerNode": 8, "perDeviceBatchSize": 2, "deepspeed": deepspeed},
    )
    config = json.loads(find(render(run), "ConfigMap", "-config")["data"]["deepspeed.json"])
    zero = config["zero_optimization"]
    assert expect.items() <= zero.items()
    assert ("offload_param" in zero) == (deepspeed.get("offloadParameters") == "cpu")
    assert ("offload_optimizer" in zero) == (deepspeed.get("offloadOptimizer") == "cpu")
    assert ("stage3_prefetch_bucket_size" in zero) == (deepspeed["zeroStage"] == 3)
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["gradient_clipping"] == 1.0
    assert config["bf16"] == {"enabled": True}
    assert config["fp16"] == {"enabled": False}


def test_deepspeed_overrides_merge_recursively() -> None:
    run = with_spec(
        load("trainingrun-qwen3-8b-swe-gym.yaml"),
        trainer={
            "deepspeed": {
                "zeroStage": 3,
                "overrides": {
                    "zero_optimization": {"reduce_bucket_size": 50000000},
                    "communication_data_type": "fp32",
                },
            }
        },
    )
    children = render(run)
    config = json.loads(find(children, "ConfigMap", "-config")["data"]["deepspeed.json"])
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 50000000
    assert zero["stage"] == 3 and zero["overlap_comm"] is True  # the rest stays
    assert config["communication_data_type"] == "fp32"
    accelerate = yaml.safe_load(find(children, "ConfigMap", "-config")["data"]["accelerate.yaml"])
    assert accelerate["distributed_type"] == "DEEPSPEED"
    assert accelerate["num_machines"] == 1 and accelerate["num_processes"] == 8
    assert accelerate["deepspeed_config"]["deepspeed_config_file"] == "/etc/crl/deepspeed.json"
    assert accelerate["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"
    assert "mixed_precision" not in accelerate  # DeepSpeed's file decides


def test_kueue_labels_on_jobs_and_deployments() -> None:
    children = render(load("trainingrun-qwen3-8b-swe-gym.yaml"))
    for workload in (find(children, "Job"), find(children, "Deployment")):
        for labels in (
            workload["metadata"]["labels"],
            workload["spec"]["template"]["metadata"]["labels"],
        ):
            assert labels["kueue.x-k8s.io/queue-name"] == "team-repair"
            assert labels["kueue.x-k8s.io/priority-class"] == "research-high"
    # Services, ConfigMaps and the pool are not workloads Kueue admits.
    for child in children:
        if child["kind"] not in ("Job", "Deployment"):
            assert "kueue.x-k8s.io/queue-name" not in child["metadata"]["labels"]


def test_no_kueue_labels_without_a_queue() -> None:
    children = render(load("local-trainingrun-tiny-cpu.yaml"))
    assert "kueue.x-k8s.io" not in json.dumps([c["metadata"] for c in children])
    assert "priorityClassName" not in pod_spec(find(children, "Job"))


def test_evaluation_benchmarks_serve_the_step_checkpoint() -> None:
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    children = render(run, state=RenderState(inference_ready=True, evaluation_steps=(50,)))
    bench = find(children, "Benchmark")
    assert bench["metadata"]["name"] == "qwen3-8b-swe-gym-eval-50"
    assert bench["metadata"]["labels"]["coderepair.io/step"] == "50"
    checkpoint = bench["spec"]["model"]["checkpoint"]
    assert checkpoint["trainingRun"] == "qwen3-8b-swe-gym"
    assert checkpoint["step"] == "step-50"
    assert checkpoint["inference"]["tensorParallelSize"] == 2
    assert bench["spec"]["suite"]["name"] == "swe-bench-verified"
    # The template names no queue: the run's queue applies, not its deadline.
    assert bench["spec"]["scheduling"]["queueName"] == "team-repair"
    assert "maxRunSeconds" not in bench["spec"]["scheduling"]
    # Evaluations outlive the run's training: they stay when the run finishes.
    finished = render(run, state=RenderState(finished=True, evaluation_steps=(50,)))
    assert kinds(finished) == ["ConfigMap", "ConfigMap", "Benchmark"]


def test_sandboxes_use_quota_reaches_the_inline_pools() -> None:
    """A run's scheduling.sandboxesUseQuota puts its queue (not its deadline) on the inline
    pool, whose gateway then labels the sandboxes; off (the default), the pool has no
    scheduling and its sandboxes stay out of Kueue."""
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    state = RenderState(inference_ready=True, evaluation_steps=(50,))
    assert "scheduling" not in find(render(run, state=state), "RolloutPool")["spec"]
    scheduling = {**run.spec.scheduling.to_wire(), "sandboxesUseQuota": True}
    counted = with_spec(run, scheduling=scheduling)
    children = render(counted, state=state)
    assert find(children, "RolloutPool")["spec"]["scheduling"] == {
        "queueName": "team-repair",
        "workloadPriorityClassName": "research-high",
        "sandboxesUseQuota": True,
    }
    # The evaluation Benchmark takes the run's queue and its choice for sandboxes.
    bench = Benchmark.model_validate(find(children, "Benchmark"))
    assert bench.spec.scheduling.sandboxes_use_quota
    assert find(render(bench), "RolloutPool")["spec"]["scheduling"]["sandboxesUseQuota"] is True


def test_a_pool_reference_means_no_owned_pool() -> None:
    spec = {**RUN["spec"], "rollout": {"poolRef": {"name": "shared"}}}
    run = TrainingRun.model_validate({**RUN, "spec": spec})
    children = render(run)
    assert "RolloutPool" not in kinds(children)
    assert env_of(find(children, "Job"))["CRL_POOL_URL"] == "http://shared-gateway:8080"


def test_worker_config_holds_the_resolved_spec() -> None:
    run = TrainingRun.model_validate(RUN)
    config = yaml.safe_load(find(render(run), "ConfigMap", "-config")["data"]["config.yaml"])
    assert config["kind"] == "TrainingRun"
    assert config["spec"]["algorithm"]["numGenerations"] == 8


# --- RolloutPool ----------------------------------------------------------------------------


def test_rollout_pool_gateway() -> None:
    pool = load("rolloutpool-swe-gym.yaml")
    children = render(pool)
    assert kinds(children) == [
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "NetworkPolicy",
    ]
    role = find(children, "Role")
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert verbs == {
        *(("pods", v) for v in ("create", "delete", "get", "list", "watch", "patch")),
        ("pods/exec", "create"),
        ("pods/exec", "get"),
        ("pods/log", "get"),
        ("events", "create"),
        ("rolloutpools", "get"),
    }
    [own] = [r for r in role["rules"] if r["resources"] == ["rolloutpools"]]
    assert own["resourceNames"] == ["swe-gym"]
    assert "secrets" not in json.dumps(role)
    binding = find(children, "RoleBinding")
    account = find(children, "ServiceAccount")["metadata"]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "team-repair"}
    ]
    deployment = find(children, "Deployment")
    pod = pod_spec(deployment)
    assert pod["serviceAccountName"] == account
    gateway = container(deployment)
    assert gateway["command"] == ["python", "-m", "crl_worker.pool"]
    # The flags of `python -m crl_worker.pool`, checked against its own parser.
    from crl_worker.pool.__main__ import parser

    parsed = parser().parse_args(gateway["args"])
    assert str(parsed.config) == "/etc/crl/config.yaml"
    assert parsed.backend == "kubernetes"
    assert parsed.port == 8080
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/healthz"
    env = env_of(deployment)
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["CRL_POOL_NAME"] == "swe-gym"
    assert env["CRL_POOL_UID"] == UID
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    assert gateway["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    service = find(children, "Service")
    assert service["spec"]["ports"][0]["port"] == 8080
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # The token comes from the pool's Secret (never a literal in the manifest); probes and
    # scrapers use the metrics port, which needs no token.
    assert env["CRL_POOL_TOKEN"] == {
        "secretKeyRef": {"name": "swe-gym-gateway-token", "key": "token"}
    }
    assert parsed.metrics_port == 9090
    assert gateway["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 8080,
        "metrics": 9090,
    }
    # A changed config rolls the gateway pods.
    hash_key = "coderepair.io/config-hash"
    before = deployment["spec"]["template"]["metadata"]["annotations"][hash_key]
    changed = find(render(with_spec(pool, prefetch=9)), "Deployment")
    assert changed["spec"]["template"]["metadata"]["annotations"][hash_key] != before


@pytest.mark.parametrize("egress", ["deny", "dns", "allow"])
def test_sandbox_network_policy(egress: str) -> None:
    pool = load("rolloutpool-swe-gym.yaml")
    data = pool.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"]["sandbox"]["egress"] = egress
    children = render(RolloutPool.model_validate(data))
    policies = [
        c
        for c in children
        if c["kind"] == "NetworkPolicy" and c["metadata"]["name"].endswith("-sandboxes")
    ]
    if egress == "allow":
        assert policies == []
        return
    [policy] = policies
    spec = policy["spec"]
    assert spec["podSelector"] == {
        "matchLabels": {"coderepair.io/pool": "swe-gym", "coderepair.io/role": "sandbox"}
    }
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    gateway = find(children, "Deployment")
    [ingress] = spec["ingress"]
    assert ingress["from"] == [
        {"podSelector": {"matchLabels": gateway["spec"]["selector"]["matchLabels"]}}
    ]
    if egress == "deny":
        assert spec["egress"] == []
    else:
        [rule] = spec["egress"]
        assert {p["port"] for p in rule["ports"]} == {53}
        assert {p["protocol"] for p in rule["ports"]} == {"UDP", "TCP"}


def test_gateway_network_policy_admits_only_the_pools_clients() -> None:
    pool = load("rolloutpool-swe-gym.yaml")
    children = render(pool)
    [policy] = [
        c
        for c in children
        if c["kind"] == "NetworkPolicy" and c["metadata"]["name"] == "swe-gym-gateway"
    ]
    gateway = find(children, "Deployment")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": gateway["spec"]["selector"]["matchLabels"]}
    assert spec["policyTypes"] == ["Ingress"]
    api, metrics = spec["ingress"]
    assert api == {
        "from": [{"podSelector": {"matchLabels": {"coderepair.io/pool-client": "swe-gym"}}}],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }
    assert metrics == {"ports": [{"protocol": "TCP", "port": 9090}]}
    assert policy["metadata"]["ownerReferences"][0]["uid"] == UID


def test_token_secret_is_owned_by_the_pool_and_not_rendered() -> None:
    from crl_operator.builders import token_secret

    pool = load("rolloutpool-swe-gym.yaml")
    assert "Secret" not in kinds(render(pool))
    secret = token_secret(pool, "team-repair", "t0k3n")
    assert secret["metadata"]["name"] == "swe-gym-gateway-token"
    assert secret["stringData"] == {"token": "t0k3n"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID


@pytest.mark.parametrize(
    ("example", "kind"),
    [("benchmark-hosted-endpoint.yaml", "Job"), ("trainingrun-qwen3-8b-swe-gym.yaml", "Job")],
)
def test_pool_clients_get_the_token_and_the_client_label(example: str, kind: str) -> None:
    resource = load(example)
    children = render(resource)
    pool = pool_name(resource)
    [job] = [c for c in children if c["kind"] == kind]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["coderepair.io/pool-client"] == pool
    assert env_of(job)["CRL_POOL_TOKEN"] == {
        "secretKeyRef": {"name": f"{pool}-gateway-token", "key": "token"}
    }


# --- Benchmark ------------------------------------------------------------------------------


def test_external_endpoint_means_no_vllm() -> None:
    bench = load("benchmark-hosted-endpoint.yaml")
    for state in STATES.values():
        children = render(bench, state=state)
        assert "Deployment" not in kinds(children)
        assert not [c for c in children if c["kind"] == "Service"]
    children = render(bench, state=RenderState())  # nothing to wait for
    runner = find(children, "Job")
    env = env_of(runner)
    assert env["CRL_MODEL_URL"] == "https://llm.example.com/v1"
    assert env["CRL_MODEL_NAME"] == "my-model"
    assert env["CRL_API_KEY"] == {"secretKeyRef": {"name": "llm-api", "key": "api-key"}}
    assert container(runner)["command"] == ["python", "-m", "crl_worker.bench"]


def test_gold_replay_serves_nothing_and_asks_no_model() -> None:
    bench = with_spec(load("benchmark-hosted-endpoint.yaml"), model={"gold": {}})
    for state in STATES.values():
        children = render(bench, state=state)
        assert "Deployment" not in [c["kind"] for c in children if c["metadata"]["name"]
                                    .endswith("inference")]  # fmt: skip
    runner = find(render(bench, state=RenderState()), "Job")
    env = env_of(runner)
    assert not {"CRL_MODEL_URL", "CRL_MODEL_NAME", "CRL_API_KEY"} & set(env)
    assert env["CRL_POOL_URL"].startswith("http://")


def test_a_benchmark_names_exactly_one_model() -> None:
    bench = load("benchmark-hosted-endpoint.yaml")
    with pytest.raises(ValidationError):
        with_spec(bench, model={"gold": {"x": 1}})  # an empty object only
    rule = Benchmark.model_json_schema()["$defs"]["BenchmarkModel"]["x-kubernetes-validations"]
    assert "has(self.gold)" in rule[0]["rule"]


def test_served_benchmark_waits_for_inference() -> None:
    bench = load("benchmark-swe-bench-verified-baseline.yaml")
    waiting = render(bench, state=STATES["waiting"])
    assert "Job" not in kinds(waiting)
    children = render(bench, state=STATES["ready"])
    deployment = find(children, "Deployment")
    args = container(deployment)["args"]
    assert args[0] == "Qwen/Qwen3-8B"
    assert flag(args, "--served-model-name") == "Qwen/Qwen3-8B"
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-repair"
    runner = find(children, "Job")
    env = env_of(runner)
    assert env["CRL_MODEL_URL"] == (
        "http://qwen3-8b-zero-shot-swe-bench-verified-inference:8000/v1"
    )
    assert "CRL_API_KEY" not in env
    assert env["CRL_RESULTS_DIR"] == "/results/qwen3-8b-zero-shot/swe-bench-verified"
    volumes = {v["name"]: v for v in pod_spec(runner)["volumes"]}
    assert volumes["results"]["persistentVolumeClaim"]["claimName"] == "benchmark-results"
    assert runner["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-repair"
    assert "ttlSecondsAfterFinished" not in runner["spec"]


def test_finished_benchmark_keeps_only_config_and_its_job() -> None:
    bench = load("benchmark-swe-bench-verified-baseline.yaml")
    finished = render(bench, state=STATES["finished"])
    # The config and the last progress report stay; the runner's identity goes with it.
    assert [c["metadata"]["name"] for c in finished] == [
        "qwen3-8b-zero-shot-swe-bench-verified-config",
        "qwen3-8b-zero-shot-swe-bench-verified-progress",
    ]
    assert retained(bench, state=STATES["finished"]) == [
        ("Job", "qwen3-8b-zero-shot-swe-bench-verified-runner")
    ]


def test_checkpoint_benchmark_needs_its_checkpoint_resolved() -> None:
    bench = load("benchmark-swe-bench-verified.yaml")
    assert kinds(render(bench)) == ["ConfigMap", "ConfigMap", "RolloutPool"]
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    state = RenderState(inference_ready=True, checkpoint=resolve_checkpoint(bench, run))
    children = render(bench, state=state)
    vllm = container(find(children, "Deployment"))
    assert vllm["args"][0] == "/checkpoints/latest"
    assert flag(vllm["args"], "--served-model-name") == "qwen3-8b-swe-gym/latest"
    [mount] = [m for m in vllm["volumeMounts"] if m["name"] == "checkpoints"]
    assert mount["subPath"] == "qwen3-8b-swe-gym" and mount["readOnly"] is True
    runner = find(children, "Job")
    assert runner["spec"]["ttlSecondsAfterFinished"] == 3600
    assert env_of(runner)["CRL_MODEL_NAME"] == "qwen3-8b-swe-gym/latest"


def test_lora_checkpoint_is_served_as_an_adapter() -> None:
    bench = load("benchmark-swe-bench-verified.yaml")
    checkpoint = ResolvedCheckpoint(
        volume=VolumeSource(claim_name="ckpt"),
        path="step-40",
        base_model="Qwen/Qwen3-8B",
        base_volume=VolumeSource(claim_name="weights"),
        lora_rank=16,
    )
    children = render(bench, state=RenderState(inference_ready=True, checkpoint=checkpoint))
    args = container(find(children, "Deployment"))["args"]
    assert args[0] == "/models/Qwen/Qwen3-8B"
    assert flag(args, "--max-lora-rank") == "16"
    assert flag(args, "--lora-modules") == "qwen3-8b-swe-gym/latest=/checkpoints/step-40"
    assert env_of(find(children, "Job"))["CRL_MODEL_NAME"] == "qwen3-8b-swe-gym/latest"


def test_checkpoint_of_a_run_without_a_volume_is_refused() -> None:
    bench = load("benchmark-swe-bench-verified.yaml")
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    data = run.model_dump(mode="json", by_alias=True, exclude_none=True)
    del data["spec"]["checkpoints"]["volume"]
    with pytest.raises(BuildError, match=r"spec\.checkpoints\.volume"):
        resolve_checkpoint(bench, TrainingRun.model_validate(data))


def test_a_benchmark_owns_its_inline_pool() -> None:
    bench = Benchmark.model_validate(
        {
            "apiVersion": "coderepair.io/v1alpha1",
            "kind": "Benchmark",
            "metadata": {"name": "b"},
            "spec": {
                "suite": {"name": "s", "tasks": {"path": "t.jsonl"}},
                "model": {"endpoint": {"url": "http://x/v1", "modelName": "m"}},
                "pool": {"replicas": 3},
            },
        }
    )
    pool = find(render(bench), "RolloutPool")
    assert pool["spec"]["replicas"] == 3
    assert pool["spec"]["tasks"] == {"format": "swe-bench", "path": "t.jsonl", "taskType": "repair"}
    assert pool["metadata"]["namespace"] == "default"
    assert "ownerReferences" not in pool["metadata"]  # no uid offline


def test_render_offline_resolves_checkpoints_from_the_same_input(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(
        (ROOT / "examples" / "trainingrun-qwen3-8b-swe-gym.yaml").read_text()
        + "---\n"
        + (ROOT / "examples" / "benchmark-swe-bench-verified.yaml").read_text()
    )
    children, notes = render_offline(load_resources(str(both)))
    assert "qwen3-8b-rl-swe-bench-verified-runner" in {c["metadata"]["name"] for c in children}
    assert len(notes) == 1 and "as if inference were ready" in notes[0]
    alone, notes = render_offline(
        load_resources(str(ROOT / "examples" / "benchmark-swe-bench-verified.yaml"))
    )
    assert "Job" not in kinds(alone)
    assert any("qwen3-8b-swe-gym" in n and "not in the input" in n for n in notes)


#: Task sources, the volume a pod gets for each, and the `--tasks` path the gateway and the runner
#: are given. The runner takes a file in the image or a download from its config instead.
TASK_SOURCES = [
    pytest.param(
        {"configMap": {"name": "suite", "key": "lite.jsonl"}},
        {"configMap": {"name": "suite", "items": [{"key": "lite.jsonl", "path": "lite.jsonl"}]}},
        "/var/lib/crl/tasks/lite.jsonl",
        "/var/lib/crl/tasks/lite.jsonl",
        id="configmap",
    ),
    pytest.param(
        {"volume": {"claimName": "data", "subPath": "suites", "path": "/gym/train.parquet"}},
        {"persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
        "/var/lib/crl/tasks/gym/train.parquet",
        "/var/lib/crl/tasks/gym/train.parquet",
        id="volume",
    ),
    pytest.param({"path": "/opt/tasks.jsonl"}, None, "/opt/tasks.jsonl", None, id="image-path"),
    pytest.param({"url": "https://example.org/tasks.jsonl"}, None, None, None, id="url"),
]


@pytest.mark.parametrize(("tasks", "volume", "path", "runner_path"), TASK_SOURCES)
def test_the_gateway_reads_its_task_source(
    tasks: dict[str, Any], volume: dict[str, Any] | None, path: str | None, runner_path: str | None
) -> None:
    pool = with_spec(load("rolloutpool-swe-gym.yaml"), tasks={"format": "swe-bench", **tasks})
    deployment = find(render(pool), "Deployment")
    from crl_worker.pool.__main__ import parser

    parsed = parser().parse_args(container(deployment)["args"])
    assert (str(parsed.tasks) if parsed.tasks else None) == path
    assert_task_mount(deployment, volume)


def assert_task_mount(workload: dict[str, Any], volume: dict[str, Any] | None) -> list[Any]:
    """The task file's volume is `volume` (or absent), mounted read-only where workers look;
    returns the mounts."""
    mounted = [v for v in pod_spec(workload)["volumes"] if v["name"] == "tasks"]
    assert [{k: v for k, v in m.items() if k != "name"} for m in mounted] == (
        [volume] if volume else []
    )
    mounts = [m for m in container(workload)["volumeMounts"] if m["name"] == "tasks"]
    assert all(m["readOnly"] and m["mountPath"] == "/var/lib/crl/tasks" for m in mounts)
    assert len(mounts) == len(mounted)
    return mounts


# --- the runner's identity and progress channel ---------------------------------------------


def assert_progress_channel(
    children: list[dict[str, Any]], worker: str, progress: str, namespace: str = "default"
) -> dict[str, Any]:
    """The worker Job `worker` may `get` and `patch` its empty progress ConfigMap and nothing
    else, with an identity of its own applied before it; returns the Job."""
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    # The RoleBinding needs its Role, the Job's pods need the ServiceAccount: applied before.
    assert names.index(("ServiceAccount", worker)) < names.index(("Job", worker))
    assert names.index(("Role", worker)) < names.index(("RoleBinding", worker))
    assert names.index(("RoleBinding", worker)) < names.index(("Job", worker))
    cm = find(children, "ConfigMap", "-progress")
    assert cm["metadata"]["name"] == progress
    # No data: server-side apply then leaves the worker's `progress.json` to the worker.
    assert set(cm) == {"apiVersion", "kind", "metadata"}
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "progress"
    role = find(children, "Role")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [progress],
            "verbs": ["get", "patch"],
        }
    ]
    binding = find(children, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": worker,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": worker, "namespace": namespace}
    ]
    job = find(children, "Job")
    assert job["metadata"]["name"] == worker
    spec = pod_spec(job)
    assert spec["serviceAccountName"] == worker
    assert spec["automountServiceAccountToken"] is True
    env = env_of(job)
    assert env["CRL_PROGRESS_CONFIGMAP"] == progress
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    return job


def test_runner_reports_progress_with_least_privilege() -> None:
    bench = load("benchmark-hosted-endpoint.yaml")
    children = render(bench, state=RenderState())
    job = assert_progress_channel(
        children, "hosted-model-swe-bench-lite-runner", "hosted-model-swe-bench-lite-progress"
    )
    assert "CRL_BASELINE_RESULTS" not in env_of(job)
    # A Hugging Face suite is not a file: nothing mounted, no --tasks.
    assert "--tasks" not in container(job)["args"]
    assert "tasks" not in {v["name"] for v in pod_spec(job)["volumes"]}


def test_trainer_reports_progress_with_least_privilege() -> None:
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    children = render(run, "team-a", STATES["ready"])
    job = assert_progress_channel(
        children, "qwen3-8b-swe-gym-trainer", "qwen3-8b-swe-gym-progress", "team-a"
    )
    # Every trainer pod serves its Prometheus metrics where the env says.
    assert env_of(job)["CRL_METRICS_PORT"] == "9400"
    ports = {p["name"]: p["containerPort"] for p in container(job)["ports"]}
    assert ports == {"rendezvous": 29500, "metrics": 9400}
    # The identity exists exactly while the trainer may run; the report outlives it.
    for state in ("waiting", "suspended", "finished"):
        others = render(run, "team-a", STATES[state])
        assert not {"ServiceAccount", "Role", "RoleBinding"} & set(kinds(others)), state
        assert find(others, "ConfigMap", "-progress")["metadata"]["name"] == (
            "qwen3-8b-swe-gym-progress"
        )


def test_the_builder_and_the_runner_agree_on_the_progress_variable() -> None:
    from crl_worker.rollout.report import reporter_from_env

    bench = load("benchmark-hosted-endpoint.yaml")
    job = find(render(bench, "team-a", state=RenderState()), "Job", "-runner")
    env = {k: v for k, v in env_of(job).items() if isinstance(v, str)}
    reporter = reporter_from_env({**env, "POD_NAMESPACE": "team-a"})
    assert reporter is not None and reporter.name == "hosted-model-swe-bench-lite-progress"


@pytest.mark.parametrize(
    ("example", "worker"),
    [
        (
            "benchmark-swe-bench-verified-baseline.yaml",
            "qwen3-8b-zero-shot-swe-bench-verified-runner",
        ),
        ("trainingrun-qwen3-8b-swe-gym.yaml", "qwen3-8b-swe-gym-trainer"),
    ],
)
def test_no_other_pod_gets_the_workers_identity(example: str, worker: str) -> None:
    resource = load(example)
    children = render(resource, state=STATES["ready"])
    # The inline pool's own children (its gateway) run pods too.
    for pool in [c for c in children if c["kind"] == "RolloutPool"]:
        children += render(RolloutPool.model_validate(pool))
    workloads = [c for c in children if c["kind"] in ("Deployment", "Job")]
    others = [w for w in workloads if w["metadata"]["name"] != worker]
    assert {w["kind"] for w in others} == {"Deployment"} and len(others) >= 2, others
    for workload in others:
        assert pod_spec(workload).get("serviceAccountName") != worker
    assert pod_spec(find(workloads, "Job"))["serviceAccountName"] == worker


@pytest.mark.parametrize(("tasks", "volume", "gateway_path", "path"), TASK_SOURCES)
def test_the_runner_reads_a_mounted_task_file(
    tasks: dict[str, Any], volume: dict[str, Any] | None, gateway_path: str | None, path: str | None
) -> None:
    bench = load("benchmark-hosted-endpoint.yaml")
    suite = {"name": "s", "tasks": {"format": "swe-bench", **tasks}}
    job = find(render(with_spec(bench, suite=suite), state=RenderState()), "Job")
    args = container(job)["args"]
    assert flag(args, "--config") == "/etc/crl/config.yaml"
    assert flag(args, "--tasks") == path
    mounts = assert_task_mount(job, volume)
    if "volume" in tasks:
        assert mounts[0]["subPath"] == "suites"


def test_a_baseline_on_the_same_results_volume_is_passed_to_the_runner(tmp_path: Path) -> None:
    rl = load("benchmark-swe-bench-verified.yaml")
    zero_shot = load("benchmark-swe-bench-verified-baseline.yaml")
    assert baseline_results(rl, zero_shot) == "/results/qwen3-8b-zero-shot/swe-bench-verified"
    # Another claim, another subPath, no volume, or the same directory: nothing to read.
    elsewhere = with_spec(zero_shot, results={"volume": {"claimName": "x"}, "path": "a"})
    assert baseline_results(rl, elsewhere) is None
    sub = with_spec(
        zero_shot, results={"volume": {"claimName": "benchmark-results", "subPath": "s"}}
    )
    assert baseline_results(rl, sub) is None
    assert baseline_results(rl, with_spec(zero_shot, results={"path": "a"})) is None
    same = with_spec(
        zero_shot,
        results={
            "volume": {"claimName": "benchmark-results"},
            "path": "qwen3-8b-rl/swe-bench-verified/",
        },
    )
    assert baseline_results(rl, same) is None
    # The state carries it into the runner; `crl render` resolves it from the same input.
    run = load("trainingrun-qwen3-8b-swe-gym.yaml")
    state = RenderState(
        inference_ready=True,
        checkpoint=resolve_checkpoint(rl, run),
        baseline_results="/results/qwen3-8b-zero-shot/swe-bench-verified",
    )
    env = env_of(find(render(rl, state=state), "Job"))
    assert env["CRL_BASELINE_RESULTS"] == "/results/qwen3-8b-zero-shot/swe-bench-verified"
    both = tmp_path / "all.yaml"
    both.write_text(
        "---\n".join(
            (ROOT / "examples" / n).read_text()
            for n in (
                "trainingrun-qwen3-8b-swe-gym.yaml",
                "benchmark-swe-bench-verified.yaml",
                "benchmark-swe-bench-verified-baseline.yaml",
            )
        )
    )
    children, _ = render_offline(load_resources(str(both)))
    runners = {
        c["metadata"]["name"]: env_of(c)
        for c in children
        if c["kind"] == "Job" and "runner" in c["metadata"]["name"]
    }
    assert runners["qwen3-8b-rl-swe-bench-verified-runner"]["CRL_BASELINE_RESULTS"] == (
        "/results/qwen3-8b-zero-shot/swe-bench-verified"
    )
    assert "CRL_BASELINE_RESULTS" not in runners["qwen3-8b-zero-shot-swe-bench-verified-runner"]


@pytest.mark.parametrize(("tasks", "volume", "gateway_path", "path"), TASK_SOURCES)
def test_the_trainer_reads_a_mounted_task_file(
    tasks: dict[str, Any], volume: dict[str, Any] | None, gateway_path: str | None, path: str | None
) -> None:
    # The trainer loads the tasks it trains on itself, like the runner (same mounted path).
    run = with_spec(load("trainingrun-qwen3-8b-swe-gym.yaml"), tasks={"format": "swe-gym", **tasks})
    job = find(render(run, state=STATES["ready"]), "Job")
    args = container(job)["args"]
    assert flag(args, "--config") == "/etc/crl/config.yaml"
    assert flag(args, "--tasks") == path
    mounts = assert_task_mount(job, volume)
    if "volume" in tasks:
        assert mounts[0]["subPath"] == "suites"
    from crl_worker.train.__main__ import parser

    parsed = parser().parse_args(args[args.index("crl_worker.train") + 1 :])
    assert (str(parsed.tasks) if parsed.tasks else None) == path


@pytest.mark.parametrize("preflight_status", [0, 2])
def test_the_trainer_checks_its_config_before_the_launcher(
    tmp_path: Path, preflight_status: int
) -> None:
    # The pod's script, run by a real shell with stand-ins for python and accelerate: a config
    # error (2) is the container's exit status and nothing is launched; otherwise accelerate
    # gets the container's args.
    job = find(render(load("trainingrun-qwen3-8b-swe-gym.yaml"), state=STATES["ready"]), "Job")
    spec = container(job)
    assert spec["command"][:2] == ["/bin/sh", "-c"]
    for name, status in (("python", preflight_status), ("accelerate", 0)):
        stand_in = tmp_path / name
        stand_in.write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls\nexit {status}\n')
        stand_in.chmod(0o755)
    args = ["launch", "--config_file", "/etc/crl/accelerate.yaml", "--module", "crl_worker.train"]
    done = subprocess.run(
        [*spec["command"], *args], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=False
    )
    calls = (tmp_path / "calls").read_text().splitlines()
    assert done.returncode == preflight_status
    assert calls[0] == "python -m crl_worker.train --preflight-only --config /etc/crl/config.yaml"
    assert calls[1:] == ([] if preflight_status else ["accelerate " + " ".join(args)])
    env_names = {e["name"]: e.get("value") for e in spec["env"]}
    assert env_names["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "270"


def test_the_trainer_gets_the_pods_sigterm_through_the_launcher(tmp_path: Path) -> None:
    # The pod's script under a real shell, a stand-in for accelerate's simple launcher (one
    # process: it waits for its worker and installs no signal handler) and a worker that
    # checkpoints on SIGTERM. SIGTERM to the shell (what the kubelet sends the container's
    # PID 1) reaches the worker, which finishes its checkpoint before the shell exits, with the
    # launcher's status.
    job = find(render(load("trainingrun-qwen3-8b-swe-gym.yaml"), state=STATES["ready"]), "Job")
    spec = container(job)
    (tmp_path / "python").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "accelerate").write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys\n"
        f"sys.exit(subprocess.call([sys.executable, {str(tmp_path / 'worker.py')!r}]))\n"
    )
    (tmp_path / "worker.py").write_text(
        "import pathlib, signal, sys, time\n"
        f"here = pathlib.Path({str(tmp_path)!r})\n"
        "def stop(*_):\n"
        "    time.sleep(0.5)  # a checkpoint being written\n"
        "    (here / 'checkpoint').write_text('written')\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "(here / 'ready').write_text('')\n"
        "time.sleep(60)\n"
    )
    for name in ("python", "accelerate"):
        (tmp_path / name).chmod(0o755)
    # A session of its own: the script signals its whole process group.
    shell = subprocess.Popen(
        [*spec["command"], "launch"], env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and shell.poll() is None
            time.sleep(0.05)
        shell.send_signal(signal.SIGTERM)
        assert shell.wait(timeout=30) == 143
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
    assert (tmp_path / "checkpoint").read_text() == "written"


# --- images: the project's registry, and another one ------------------------------------------


def test_children_run_the_images_this_repository_builds() -> None:
    """The defaults name images/build.sh's tags: the worker for the gateway and the runner, the
    CUDA trainer for the trainer, at the version of pyproject.toml and the chart."""
    import tomllib

    from crl_worker.api.common import (
        DEFAULT_TRAINER_IMAGE,
        DEFAULT_WORKER_IMAGE,
        IMAGE_REGISTRY,
        IMAGE_VERSION,
    )

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "coderepairrl" / "Chart.yaml").read_text())
    assert IMAGE_VERSION == version == chart["appVersion"]
    assert f"{IMAGE_REGISTRY}/worker:{version}" == DEFAULT_WORKER_IMAGE
    assert f"{IMAGE_REGISTRY}/trainer:{version}-cuda" == DEFAULT_TRAINER_IMAGE
    build = (ROOT / "images" / "build.sh").read_text()
    assert f"registry={IMAGE_REGISTRY}\n" in build
    assert '"$registry/$component:$version"' in build  # worker:V
    assert '"$registry/trainer:$version-cuda"' in build
    images = {c["image"] for obj in _all_example_children() for c in _containers(obj)}
    assert DEFAULT_WORKER_IMAGE in images and DEFAULT_TRAINER_IMAGE in images


def _all_example_children() -> list[dict[str, Any]]:
    children: list[dict[str, Any]] = []
    for path in EXAMPLES:
        children += render_offline(load_resources(path))[0]
    return children


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def test_another_registry_moves_only_this_projects_images() -> None:
    from crl_operator.builders import relocate_images
    from crl_operator.settings import parse_args
    from crl_worker.api.common import IMAGE_REGISTRY

    children = _all_example_children()
    before = copy.deepcopy(children)
    moved = relocate_images(children, "registry.example.com/crl")
    assert children == before  # pure
    assert relocate_images(children, None) is children
    assert relocate_images(children, IMAGE_REGISTRY) is children
    pairs = [
        (old["image"], new["image"])
        for a, b in zip(children, moved, strict=True)
        for old, new in zip(_containers(a), _containers(b), strict=True)
    ]
    ours = [(o, n) for o, n in pairs if o.startswith(f"{IMAGE_REGISTRY}/")]
    assert ours and all(n == o.replace(IMAGE_REGISTRY, "registry.example.com/crl") for o, n in ours)
    others = [(o, n) for o, n in pairs if not o.startswith(f"{IMAGE_REGISTRY}/")]
    assert others and all(o == n for o, n in others)  # vLLM, users' images: untouched
    # only container images move: a RolloutPool child's spec keeps what the user wrote
    for a, b in zip(children, moved, strict=True):
        if a["kind"] not in ("Deployment", "Job"):
            assert a == b
    assert parse_args([]).image_registry is None
    assert parse_args(["--image-registry", "r.example/x/"]).image_registry == "r.example/x"
