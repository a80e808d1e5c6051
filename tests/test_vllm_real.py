"""The agent, the benchmark runner and the operator's probes against a real vLLM (the session's
``vllm`` fixture, tests/fixtures/vllm.py): upstream vLLM's server started with the arguments
the operator's Deployment renders, serving the toy model with random weights.

The model's output is random, so these tests check what does not depend on it: no request is
refused (the Deployment's tool-call flags), the server's tool calls reach the sandbox, every
turn carries the server's token ids and logprobs, and the logprobs are the model's own
(recomputed with transformers from the recorded ids, the trainer's side of the comparison).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from crl_worker.agent import ChatClient, Trajectory, run_agent
from crl_worker.agent.client import ContextLengthError
from crl_worker.agent.sampling import Sampling
from crl_worker.api.common import AgentSpec
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from crl_worker.train.toy import build_toy_suite
from tests.fixtures.vllm import MAX_MODEL_LEN, VllmServer

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
#: Agent limits small enough for a CPU: a turn is a few dozen tokens.
SPEC = AgentSpec(max_turns=4, max_tokens_per_turn=24, max_total_tokens=2048, timeout_seconds=300)
#: The toy model's end of turn (``<|im_end|>``).
EOS = 3


@pytest.fixture(scope="module")
def toy_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    """The toy suite's one task (``toycalc``: the task the toy model's action tokens act on)."""
    tasks_file = build_toy_suite(tmp_path_factory.mktemp("toy-suite"))
    [task] = load_tasks(tasks_file, "task").tasks
    return task


@pytest.fixture(scope="module")
def reference_model(vllm: VllmServer) -> Any:
    """The served weights in transformers (float32): the trainer's view of the same model."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(vllm.model, dtype="float32").eval()


def model_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """Log-probabilities the model gives ``completion`` after ``prompt`` (temperature 1)."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    picked = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt) :, None])
    return [float(x) for x in picked[:, 0]]


async def agent_run(vllm: VllmServer, task: Task, spec: AgentSpec = SPEC) -> Trajectory:
    async with (
        create_sandbox({"type": "local"}, task) as sandbox,
        ChatClient(vllm.base_url, vllm.served_name, max_retries=1) as client,
    ):
        return await run_agent(task, sandbox, client, spec)


# --- the operator's probes -------------------------------------------------------------------


def test_the_server_runs_the_deployments_arguments(vllm: VllmServer) -> None:
    rendered = vllm.container["args"]
    # `vllm serve MODEL` as `api_server --model MODEL`; host and port are this machine's; every
    # other argument exactly as the operator deploys it, in the same order.
    assert vllm.args[:2] == ["--model", rendered[0]]

    def value(flag: str) -> str:
        return vllm.args[vllm.args.index(flag) + 1]

    assert (value("--host"), value("--port")) == ("127.0.0.1", str(vllm.port))
    unchanged = [a for a in vllm.args[2:] if a not in ("127.0.0.1", str(vllm.port))]
    assert unchanged == [a for a in rendered[1:] if a not in ("0.0.0.0", "8000")]
    for flag in ("--enable-auto-tool-choice", "--enable-lora", "--logprobs-mode"):
        assert flag in vllm.args
    deployed_env = {e["name"]: e["value"] for e in vllm.container["env"]}
    assert deployed_env.items() <= vllm.env.items()


def test_health_and_models_answer_as_the_probes_and_the_agent_use_them(vllm: VllmServer) -> None:
    probes = {vllm.container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe")}
    assert probes == {"/health"}
    assert httpx.get(f"{vllm.root}/health", timeout=10).status_code == 200
    models = httpx.get(f"{vllm.base_url}/models", timeout=10).json()
    [card] = models["data"]
    assert card["id"] == vllm.served_name  # --served-model-name: what the agent sends
    assert card["max_model_len"] == MAX_MODEL_LEN


# --- the agent -------------------------------------------------------------------------------


async def test_agent_turns_carry_the_servers_tool_calls_token_ids_and_logprobs(
    vllm: VllmServer, toy_task: Task, reference_model: Any
) -> None:
    trajectory = await agent_run(vllm, toy_task)
    # The Deployment's --enable-auto-tool-choice: without it every request is a 400 and the
    # run an infrastructure error before its first turn.
    assert trajectory.exit_reason != "infrastructure_error", trajectory.error
    assert trajectory.turns
    calls = [c for t in trajectory.turns for c in t.tool_calls]
    # A random toy model writes an action token in nearly every turn (6 of its 14 tokens).
    assert calls, [t.model_dump(exclude={"prompt_token_ids"}) for t in trajectory.turns]
    assert {c.name for c in calls} <= {"edit", "view", "shell", "submit"}
    gaps: list[float] = []
    for turn, prompt in zip(trajectory.turns, trajectory.full_prompt_ids(), strict=True):
        assert prompt is not None and turn.completion_token_ids is not None
        completion = turn.completion_token_ids.tolist()
        assert turn.completion_logprobs is not None
        served = turn.completion_logprobs.tolist()
        assert len(served) == len(completion) == turn.completion_tokens > 0
        assert len(prompt) == turn.prompt_tokens
        # Stop reasons: the length limit, or the end-of-turn token (kept in the ids).
        if turn.finish_reason == "length":
            assert len(completion) == SPEC.max_tokens_per_turn
        else:
            assert turn.finish_reason == ("tool_calls" if turn.tool_calls else "stop")
            assert completion[-1] == EOS
        ours = model_logprobs(reference_model, prompt.tolist(), completion)
        gaps += [abs(a - b) for a, b in zip(served, ours, strict=True)]
    log.info("base weights: server vs transformers logprob gap max %.2e", max(gaps))
    assert max(gaps) < 1e-4


async def test_concurrent_agents_share_the_server(vllm: VllmServer, toy_task: Task) -> None:
    runs = await asyncio.gather(*(agent_run(vllm, toy_task) for _ in range(3)))
    assert all(r.exit_reason != "infrastructure_error" for r in runs), [r.error for r in runs]
    assert all(t.completion_token_ids is not None for r in runs for t in r.turns)


def long_chat(messages: int) -> list[dict[str, Any]]:
    """A conversation of ``messages`` messages: four toy tokens each (start, role, text, end)."""
    roles = ("user", "assistant")
    return [{"role": roles[n % 2], "content": f"message {n}"} for n in range(messages - 1)] + [
        {"role": "user", "content": "go on"}
    ]


async def test_long_conversations_fill_the_context_and_then_end_it(vllm: VllmServer) -> None:
    async with ChatClient(vllm.base_url, vllm.served_name, max_retries=1) as client:
        # 4,001 prompt tokens: the prompt fits, prompt + max_tokens does not. vLLM's 400 says
        # how much room is left and the client asks again within it.
        near = await client.complete(
            long_chat(1000), tools=[], sampling=Sampling(max_tokens=500, temperature=1.0, top_p=1.0)
        )
        prompt = near.prompt_ids()
        assert prompt is not None and len(prompt) == near.prompt_tokens > 3900
        assert near.completion_token_ids is not None
        assert 0 < near.completion_tokens <= MAX_MODEL_LEN - near.prompt_tokens
        # Past the context: the trajectory ends as context_exhausted, not an infrastructure error.
        with pytest.raises(ContextLengthError):
            await client.complete(
                long_chat(1100),
                tools=[],
                sampling=Sampling(max_tokens=16, temperature=1.0, top_p=1.0),
            )


# --- the benchmark runner --------------------------------------------------------------------


def test_crl_bench_openai_runs_the_bundled_suite(vllm: VllmServer, tmp_path: Path) -> None:
    manifest = ROOT / "examples" / "local-benchmark-mini.yaml"
    results = tmp_path / "results"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "crl_cli",
            "bench",
            str(manifest),
            "--agent",
            "openai",
            "--url",
            vllm.base_url,
            "--model",
            vllm.served_name,
            "--limit",
            "2",
            "--results",
            str(results),
            "-o",
            "json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout)
    assert (summary["total"], summary["errored"]) == (2, 0), summary
    assert summary["model"] == vllm.served_name
    trajectories = [json.loads(line) for line in (results / "trajectories.jsonl").open()]
    assert len(trajectories) == 2
    turns = [t for traj in trajectories for t in traj["turns"]]
    assert turns and all(t["completion_token_ids"] for t in turns)
    assert all(len(t["completion_logprobs"]) == len(t["completion_token_ids"]) for t in turns)
