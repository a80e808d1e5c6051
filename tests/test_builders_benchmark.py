"""The children of a Benchmark: what it serves, waits for, keeps once finished, and reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from crl_operator.builders import (
    BuildError,
    RenderState,
    render,
    render_offline,
    resolve_checkpoint,
    retained,
)
from crl_operator.builders.meta import ResolvedCheckpoint
from crl_worker.api import Benchmark, TrainingRun
from crl_worker.api.base import VolumeSource
from crl_worker.api.validation import load_resources

from .fixtures.builders import (
    STATES,
    TASK_SOURCES,
    assert_task_mount,
    container,
    env_of,
    find,
    flag,
    kinds,
    load,
    pod_spec,
    with_spec,
)
from .fixtures.paths import ROOT

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
