"""Pure builders on real manifests: names, labels, owner references, and what each child holds.

Every example is rendered in every state the runtime can observe (waiting for inference,
ready, suspended, finished); the invariants hold for all of them, and table-driven tests pin
what each kind of child must contain. Whether the API server accepts the children is tested
against a real one in `test_chart_cluster.py`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from crl_operator.builders import (
    NAME_LIMIT,
    BuildError,
    RenderState,
    child_name,
    render,
    retained,
)
from crl_operator.builders.inference import WEIGHT_TRANSFER_CONFIG, lora_rank_bound
from crl_operator.builders.meta import JOB_NAME_LIMIT
from crl_worker.api import Benchmark, RolloutPool, TrainingRun

from .fixtures.builders import (
    RUN,
    STATES,
    UID,
    container,
    env_of,
    find,
    flag,
    kinds,
    load,
    pod_spec,
    with_spec,
)
from .fixtures.paths import EXAMPLES

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


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
