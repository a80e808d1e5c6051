"""A TrainingRun's trainer: an indexed Job of one pod per node, and the headless Service that
gives each pod a stable DNS name for the rendezvous.

Pod `i` of Job `J` is reachable as `J-i.S` (S the headless Service, the Job's `subdomain`);
pod 0 is the rendezvous master. `accelerate launch` starts one process per GPU in each pod with
the DeepSpeed config from the ConfigMap; the same values are in the environment under the
names torchrun uses (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, WORLD_SIZE), so another
launcher works from the same pod spec. Kubernetes expands `$(VAR)` in args from the env.

The trainer reports its step, policy version, last checkpoint and a few metrics into the run's
progress ConfigMap (crl_operator.builders.progress, crl_worker.train.report) with a
ServiceAccount of its own, allowed to write that one ConfigMap; its Prometheus metrics are on
port `metrics`.
"""

from __future__ import annotations

from typing import Any

from crl_operator.builders.config import (
    ACCELERATE_PATH,
    CONFIG_PATH,
    config_map_name,
)
from crl_operator.builders.inference import (
    CHECKPOINT_DIR,
    MODEL_DIR,
    base_url,
    peers_service_name,
)
from crl_operator.builders.meta import (
    COMPONENT_TRAINER,
    JOB_NAME_LIMIT,
    child_name,
    labels,
    object_meta,
    owner_name,
    selector,
)
from crl_operator.builders.pods import (
    claim_volume,
    config_mount,
    config_volume,
    env,
    env_field,
    env_secret,
    job,
    mount,
    placement,
    priority,
    resources,
    scheduling_labels,
    shm_mount,
    shm_volume,
    task_mount,
    user_env,
    volume_or_scratch,
)
from crl_operator.builders.pool import client_labels, gateway_url, pool_name, token_env
from crl_operator.builders.progress import progress_name, reporter_rbac
from crl_worker.api import TrainingRun
from crl_worker.api.contract import CONFIG_ERROR_EXIT_CODE, Env
from crl_worker.api.launch import processes, weight_sync_mode

#: Rendezvous port of the trainer (torch.distributed's customary one).
RENDEZVOUS_PORT = 29500
#: Port of the trainer's Prometheus metrics (each pod serves its own).
METRICS_PORT = 9400
#: Where the Job controller writes an indexed pod's index.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: Seconds a trainer pod gets after SIGTERM (suspend, preemption) to write a last checkpoint.
GRACE_SECONDS = 300


def supervised(run: TrainingRun) -> bool:
    """Whether the run is supervised fine-tuning (`algorithm.type: sft`): it trains on recorded
    trajectories, so it has no rollouts, no inference server, no sandbox pool and no tasks."""
    return run.spec.algorithm.type == "sft"


def job_name(run: TrainingRun) -> str:
    """Name of the trainer Job (short enough that `<job>-<index>` is a valid hostname), and of
    its ServiceAccount, Role and RoleBinding."""
    return child_name(owner_name(run), COMPONENT_TRAINER, limit=JOB_NAME_LIMIT)


def service_name(run: TrainingRun) -> str:
    """Name of the trainer's headless Service (the Job's `subdomain`)."""
    return child_name(owner_name(run), COMPONENT_TRAINER)


def master_address(run: TrainingRun) -> str:
    """DNS name of pod 0, the rendezvous master."""
    return f"{job_name(run)}-0.{service_name(run)}"


def trainer_rbac(run: TrainingRun, namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding of the trainer pods: `get` and `patch` on the run's
    progress ConfigMap (by name), nothing else."""
    return reporter_rbac(run, job_name(run), COMPONENT_TRAINER, namespace)


def shm_size_gi(run: TrainingRun) -> int:
    """`/dev/shm` of a trainer pod: 8 GiB per GPU for NCCL and data-loader workers."""
    return max(2, 8 * run.spec.trainer.gpus_per_node)


def headless_service(run: TrainingRun, namespace: str) -> dict[str, Any]:
    """The headless Service whose DNS records name each trainer pod, ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(run, service_name(run), COMPONENT_TRAINER, namespace),
        "spec": {
            "clusterIP": "None",
            # The rendezvous happens before any pod is ready: publish them all.
            "publishNotReadyAddresses": True,
            "selector": selector(run, COMPONENT_TRAINER),
            "ports": [
                {"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}
            ],
        },
    }


def trainer_env(run: TrainingRun) -> list[dict[str, Any]]:
    """The trainer's environment: rendezvous, the servers, the pool, the config and secrets
    (no servers and no pool for supervised fine-tuning: it runs no rollouts)."""
    spec = run.spec
    gpus = spec.trainer.gpus_per_node
    out = [
        env("MASTER_ADDR", master_address(run)),
        env("MASTER_PORT", str(RENDEZVOUS_PORT)),
        env("NNODES", str(spec.trainer.nodes)),
        {
            "name": "NODE_RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}
            },
        },
        env("NPROC_PER_NODE", str(max(gpus, 1))),
        env("GPUS_PER_NODE", str(gpus)),
        env("WORLD_SIZE", str(processes(run))),
        env_field("POD_NAMESPACE", "metadata.namespace"),
        env(Env.RUN_NAME, owner_name(run)),
        env(Env.CONFIG, CONFIG_PATH),
    ]
    if not supervised(run):
        out += [env(Env.POOL_URL, gateway_url(pool_name(run))), token_env(pool_name(run))]
    out += [
        env(Env.CHECKPOINT_DIR, CHECKPOINT_DIR),
        env(Env.PROGRESS_CONFIGMAP, progress_name(run)),
        env(Env.METRICS_PORT, str(METRICS_PORT)),
        # torchrun's agent gives workers this long after forwarding SIGTERM (its default is
        # 30 s): time to finish a step and write a checkpoint within the pod's grace period.
        env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(GRACE_SECONDS - 30)),
    ]
    if spec.generation == "vllm" and not supervised(run):
        out += [
            env(Env.INFERENCE_URL, base_url(run, spec.inference)),
            env(Env.INFERENCE_MODEL, spec.model.name),
            env(Env.WEIGHT_SYNC, weight_sync_mode(run)),
            # Every replica gets each weight update (full weights or an adapter), not just the
            # one the ClusterIP Service would pick.
            env(Env.INFERENCE_PEERS, peers_service_name(run)),
        ]
    # in-process: without CRL_INFERENCE_URL the trainer generates itself (no weight sync).
    if spec.model.volume is not None:
        out += [env(Env.MODEL_PATH, f"{MODEL_DIR}/{spec.model.name}"), env("HF_HUB_OFFLINE", "1")]
    if gpus == 0:
        out.append(env("CUDA_VISIBLE_DEVICES", ""))
    if spec.wandb is not None:
        out.append(env("WANDB_PROJECT", spec.wandb.project))
        if spec.wandb.entity:
            out.append(env("WANDB_ENTITY", spec.wandb.entity))
        ref = spec.wandb.api_key_secret_ref
        out.append(env_secret("WANDB_API_KEY", ref.name, ref.key))
    return out + user_env(spec.trainer.env)


def _tasks_path(run: TrainingRun) -> str | None:
    """Where the trainer reads its tasks when a ConfigMap or volume task source is mounted;
    None otherwise, and for supervised fine-tuning, which reads no tasks."""
    if supervised(run):
        return None
    tasks = task_mount(run.spec.tasks)
    return tasks.path if tasks.volumes else None


def trainer_args(run: TrainingRun) -> list[str]:
    """`accelerate launch` arguments: machine layout from the env, then the worker module (with
    `--tasks` where a ConfigMap or volume task source is mounted)."""
    tasks = _tasks_path(run)
    return [
        "launch",
        "--config_file",
        ACCELERATE_PATH,
        "--num_machines",
        "$(NNODES)",
        "--machine_rank",
        "$(NODE_RANK)",
        "--main_process_ip",
        "$(MASTER_ADDR)",
        "--main_process_port",
        "$(MASTER_PORT)",
        "--num_processes",
        "$(WORLD_SIZE)",
        "--module",
        "crl_worker.train",
        "--config",
        CONFIG_PATH,
        *(["--tasks", tasks] if tasks is not None else []),
    ]


#: How the container's shell runs the launcher so that the pod's SIGTERM reaches the trainer.
#: The kubelet signals only the container's PID 1. Were that `accelerate` itself, a one-process
#: trainer would never see it: accelerate's simple launcher (one process, no torchrun) installs
#: no handler, and PID 1 drops signals it does not handle, so the trainer ran on until the
#: grace period's SIGKILL. Instead the shell stays PID 1 and starts the launcher with SIGTERM
#: ignored (it waits for its workers rather than dying first), and on SIGTERM sends it to its
#: whole process group: the trainer's own handler stops at the next safe point and writes a
#: checkpoint (a torchrun agent handles it too and passes it on). The exit status is the
#: launcher's.
LAUNCH_SCRIPT = (
    "trap '' TERM\n"
    'accelerate "$@" &\n'
    "launcher=$!\n"
    "trap 'trap \"\" TERM; kill -TERM 0' TERM\n"
    "wait $launcher\n"
    "status=$?\n"
    # A trap interrupts `wait`: wait again for the launcher's own exit.
    "if kill -0 $launcher 2> /dev/null; then wait $launcher; status=$?; fi\n"
    "exit $status"
)


def preflight_script(run: TrainingRun) -> str:
    """The container's shell script: the trainer's preflight, then `accelerate` with the
    container's args (`$@`), the pod's SIGTERM passed on to it (:data:`LAUNCH_SCRIPT`)."""
    tasks = _tasks_path(run)
    check = ["python", "-m", "crl_worker.train", "--preflight-only", "--config", CONFIG_PATH]
    if tasks is not None:
        check += ["--tasks", tasks]
    return " ".join(check) + " || exit $?\n" + LAUNCH_SCRIPT


def trainer_job(run: TrainingRun, namespace: str) -> dict[str, Any]:
    """The indexed trainer Job: `nodes` pods started together, each with its node rank.

    `spec.suspend` is never set here: Kueue owns it when the Job is queued, and the operator
    removes the whole Job to suspend the run (checkpoints stay on the volume).
    """
    spec = run.spec
    nodes = spec.trainer.nodes
    kueue = scheduling_labels(spec.scheduling)
    mounts = [config_mount(), shm_mount(), mount("checkpoints", CHECKPOINT_DIR)]
    volumes = [
        config_volume(config_map_name(run)),
        shm_volume(shm_size_gi(run)),
        volume_or_scratch("checkpoints", spec.checkpoints.volume),
    ]
    if spec.checkpoints.volume is not None and spec.checkpoints.volume.sub_path:
        mounts[-1]["subPath"] = spec.checkpoints.volume.sub_path
    tasks = task_mount(spec.tasks)
    if _tasks_path(run) is not None:
        # The trainer reads the tasks it trains on (the pool gateway has its own copy).
        mounts += tasks.mounts
        volumes += tasks.volumes
    if spec.model.volume is not None:
        volumes.append(claim_volume("model", spec.model.volume, read_only=True))
        mounts.append(mount("model", MODEL_DIR, spec.model.volume, read_only=True))
    container: dict[str, Any] = {
        "name": "trainer",
        "image": spec.trainer.image,
        # The config is checked once, before the launcher: a launcher turns a worker's exit
        # status 2 (a config that cannot work) into 1, and the failure policy keys on 2.
        "command": ["/bin/sh", "-c", preflight_script(run), "accelerate"],
        "args": trainer_args(run),
        "env": trainer_env(run),
        "ports": [
            {"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": resources(spec.trainer.resources, spec.trainer.gpus_per_node),
        "volumeMounts": mounts,
    }
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        # One crash usually takes the whole group down (every rank loses its peer): allow a
        # few group restarts, each resuming from the last checkpoint.
        "backoffLimit": 3 * nodes,
        "podFailurePolicy": {
            "rules": [
                # Preemption, eviction, node drain: not the trainer's fault, not counted.
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": "trainer",
                        "operator": "In",
                        "values": [CONFIG_ERROR_EXIT_CODE],
                    },
                },
            ]
        },
        "template": {
            "metadata": {
                "labels": {
                    **labels(run, COMPONENT_TRAINER),
                    # A pool client (its gateway admits it), except a supervised run: no pool.
                    **({} if supervised(run) else client_labels(pool_name(run))),
                    **kueue,
                }
            },
            "spec": {
                "subdomain": service_name(run),
                "restartPolicy": "Never",
                "enableServiceLinks": False,
                # Its own identity, allowed only to write the progress report; the token is
                # mounted for that.
                "serviceAccountName": job_name(run),
                "automountServiceAccountToken": True,
                # Time to write a last checkpoint on SIGTERM (suspend, preemption).
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                **priority(spec.scheduling),
                **placement(spec.trainer.placement),
                "containers": [container],
                "volumes": volumes,
            },
        },
    }
    return job(run, job_name(run), COMPONENT_TRAINER, namespace, job_spec, spec.scheduling)
