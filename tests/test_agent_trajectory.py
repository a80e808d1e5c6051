"""Trajectories: token ids recorded exactly as the server sent them, the model/environment mask,
the prefix check, the JSON line format, and many concurrent runs in one process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from crl_worker.agent import ChatClient, Trajectory, Turn, run_agent
from crl_worker.api.common import AgentSpec
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task, TestSpec
from tests.fixtures.canned import CannedSandbox
from tests.fixtures.openai_server import (
    ScriptedServer,
    Step,
    call,
    marker,
    render_prompt,
    text,
    tokenize,
    toy_logprob,
)
from tests.fixtures.repos import python_task


def keyed(task: Task, key: str) -> Task:
    return task.model_copy(update={"problem_statement": f"{task.problem_statement}\n{marker(key)}"})


SCRIPT = [
    call("view", {"path": "README.md"}, content="Reading first."),
    text("Thinking about it."),
    call("shell", {"command": "echo hello"}, reasoning="secret thoughts"),
    call("submit"),
]


@pytest.fixture
async def client(server: ScriptedServer) -> AsyncIterator[ChatClient]:
    async with ChatClient(server.url, "scripted", backoff_base=0.01, max_retries=2) as chat:
        yield chat


@pytest.fixture
async def roman(tmp_path: Path) -> AsyncIterator[tuple[Task, Sandbox]]:
    task = python_task(tmp_path)
    async with create_sandbox({"type": "local"}, task) as box:
        yield task, box


async def test_token_sequence_is_exact_and_masked(
    server: ScriptedServer, client: ChatClient, roman: tuple[Task, Sandbox]
) -> None:
    task, sandbox = roman
    server.script("ids", *SCRIPT)
    trajectory = await run_agent(keyed(task, "ids"), sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted"
    assert trajectory.token_sequence_problem() is None
    prompts = trajectory.full_prompt_ids()
    requests = server.requests_for("ids")
    # Each turn's full prompt is what the server tokenized, restored from the deduplicated store.
    for prompt, request in zip(prompts, requests, strict=True):
        assert prompt is not None
        assert prompt.tolist() == tokenize(render_prompt(request.body["messages"]))
    turns = trajectory.turns
    assert turns[0].prompt_ids_offset == 0
    for previous, turn, prompt in zip(turns, turns[1:], prompts, strict=False):
        assert previous.completion_token_ids is not None and prompt is not None
        assert turn.prompt_ids_offset == len(prompt) + len(previous.completion_token_ids)
    # Storage is linear: stored prompt ids plus the earlier completions add up to the last
    # prompt, not to the sum of every prompt.
    last = prompts[-1]
    assert last is not None
    stored = sum(len(t.prompt_token_ids or []) for t in turns)
    assert stored + sum(len(t.completion_token_ids or []) for t in turns[:-1]) == len(last)

    sequence = trajectory.token_sequence()
    assert sequence is not None
    assert turns[-1].completion_token_ids is not None
    assert sequence.ids == last + turns[-1].completion_token_ids
    assert len(sequence.mask) == len(sequence.ids)
    completions = [t.completion_token_ids or [] for t in turns]
    assert sum(sequence.mask) == sum(len(c) for c in completions)
    for (start, end), completion in zip(sequence.completion_spans, completions, strict=True):
        assert sequence.ids[start:end] == completion
        assert set(sequence.mask[start:end]) == {1}
    assert sequence.mask[: len(prompts[0] or [])].tolist() == [0] * len(prompts[0] or [])
    assert sequence.logprobs is not None
    for token, flag, logprob in zip(sequence.ids, sequence.mask, sequence.logprobs, strict=True):
        assert logprob == (toy_logprob(token) if flag else 0.0)
    # The reasoning is recorded on the turn and not sent back to the server.
    assert turns[2].reasoning == "secret thoughts"
    assert all("reasoning_content" not in m for m in requests[3].body["messages"])


async def test_broken_prefix_gives_no_sequence_but_per_turn_samples(
    server: ScriptedServer, client: ChatClient, roman: tuple[Task, Sandbox]
) -> None:
    task, sandbox = roman
    server.script(
        "broken",
        call("view", {"path": "README.md"}),
        call("view", {"path": "README.md"}),
        Step(calls=call("submit").calls, break_prefix=True),
    )
    trajectory = await run_agent(keyed(task, "broken"), sandbox, client, AgentSpec())
    assert trajectory.token_sequence() is None
    problem = trajectory.token_sequence_problem()
    assert problem is not None
    assert "turn 2's prompt does not start with turn 1's prompt + completion ids" in problem
    assert "first difference at token 1 " in problem
    assert trajectory.turns[2].prompt_ids_offset == 0
    samples = trajectory.turn_samples()
    assert [s.turn for s in samples] == [0, 1, 2]
    sent = server.requests_for("broken")[2].body["messages"]
    expected = tokenize(render_prompt(sent))
    assert samples[2].prompt_ids.tolist() == [*expected[:1], 0, *expected[1:]]


async def test_server_without_token_ids_gives_no_sequence(roman: tuple[Task, Sandbox]) -> None:
    task, sandbox = roman
    async with (
        ScriptedServer(vllm=False) as plain,
        ChatClient(plain.url, "plain", backoff_base=0.01) as client,
    ):
        plain.script("plain", call("submit"))
        trajectory = await run_agent(keyed(task, "plain"), sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted"
    assert trajectory.token_sequence() is None
    assert "turn 0 has no token ids" in (trajectory.token_sequence_problem() or "")
    assert trajectory.turn_samples() == []
    assert trajectory.prompt_tokens > 0


async def test_trajectory_json_round_trips(
    server: ScriptedServer, client: ChatClient, roman: tuple[Task, Sandbox]
) -> None:
    task, sandbox = roman
    server.script("json", *SCRIPT)
    trajectory = await run_agent(keyed(task, "json"), sandbox, client, AgentSpec())
    line = trajectory.to_json()
    assert "\n" not in line
    again = Trajectory.model_validate_json(line)
    assert again == trajectory
    assert again.token_sequence() == trajectory.token_sequence()
    assert again.turns[0].tool_calls[0].name == "view"


def handmade(turns: list[Turn]) -> Trajectory:
    return Trajectory(
        instance_id="x",
        repo="o/r",
        model="m",
        started_at=datetime.now(UTC),
        exit_reason="max_turns",
        turns=turns,
    )


def turn(index: int, prompt: list[int], offset: int, completion: list[int], **kw: Any) -> Turn:
    return Turn(
        index=index,
        started=0.0,
        latency=0.0,
        max_tokens=16,
        message_index=2 + 2 * index,
        prompt_token_ids=prompt,
        prompt_ids_offset=offset,
        completion_token_ids=completion,
        **kw,
    )


def test_sequence_without_logprobs_keeps_ids_and_mask() -> None:
    trajectory = handmade(
        [
            turn(0, [1, 2, 3], 0, [4, 5], completion_logprobs=[-0.1, -0.2]),
            turn(1, [6], 5, [7]),  # no logprobs for this turn
        ]
    )
    sequence = trajectory.token_sequence()
    assert sequence is not None
    assert sequence.ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert sequence.mask.tolist() == [0, 0, 0, 1, 1, 0, 1]
    assert sequence.logprobs is None
    assert sequence.completion_spans == [(3, 5), (6, 7)]


def test_no_turns_is_a_stated_problem() -> None:
    assert handmade([]).token_sequence_problem() == "the trajectory has no turns"


def test_infrastructure_failure_covers_the_evaluation() -> None:
    from crl_worker.harness.result import EvalResult

    trajectory = handmade([])
    assert not trajectory.infrastructure_failure
    trajectory.evaluation = EvalResult(
        instance_id="x", resolved=False, infrastructure_error="test run timed out"
    )
    assert trajectory.infrastructure_failure


# --- many trajectories at once -----------------------------------------------------------------


async def test_two_hundred_concurrent_trajectories() -> None:
    turns = 5

    def respond(key: str, index: int, body: dict[str, Any]) -> Step:
        if index < turns - 1:
            return call("shell", {"command": f"echo {key} {index}"})
        return call("submit")

    async with (
        ScriptedServer(responder=respond) as server,
        ChatClient(server.url, "scripted", max_connections=16, backoff_base=0.01) as client,
    ):

        async def one(n: int) -> Trajectory:
            task = Task(
                instance_id=f"canned-{n}",
                repo="crl/canned",
                base_commit="0" * 40,
                problem_statement=f"Nothing to fix. {marker(f'k{n}')}",
                test=TestSpec(command="true", log_format="pytest"),
            )
            async with CannedSandbox() as sandbox:
                return await run_agent(task, sandbox, client, AgentSpec())

        trajectories = await asyncio.gather(*(one(n) for n in range(200)))
    assert [t.exit_reason for t in trajectories] == ["submitted"] * 200
    assert len(server.requests) == 200 * turns
    assert server.max_in_flight <= 16
    for n, trajectory in enumerate(trajectories):
        # Each run saw only its own conversation, and its token ids chain without a break.
        assert trajectory.diff == "".join(f"# echo k{n} {i}\n" for i in range(turns - 1))
        assert trajectory.token_sequence_problem() is None
