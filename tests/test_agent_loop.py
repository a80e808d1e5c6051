"""The agent loop end to end: a scripted model over real HTTP, real local sandboxes on the
fixture repositories, the real evaluation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crl_worker.agent import ChatClient, GoldPolicy, run_agent
from crl_worker.api.common import AgentSpec
from crl_worker.harness.evaluate import evaluate
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task
from tests.fixtures.openai_server import (
    ScriptedServer,
    call,
    marker,
)
from tests.fixtures.repos import python_task, unittest_task

BUGGY = """\
    total = 0
    for char in numeral:
        try:
            total += _VALUES[char]
        except KeyError:
            raise ValueError(f"{char!r} is not a Roman digit") from None
    return total
"""

FIXED = """\
    try:
        values = [_VALUES[char] for char in numeral]
    except KeyError as exc:
        raise ValueError(f"{exc.args[0]!r} is not a Roman digit") from None
    total = 0
    for index, value in enumerate(values):
        following = values[index + 1] if index + 1 < len(values) else 0
        total += -value if value < following else value
    return total
"""

NUMERALS = "src/romankit/numerals.py"


def keyed(task: Task, key: str) -> Task:
    """The task with the script marker in its problem statement."""
    return task.model_copy(update={"problem_statement": f"{task.problem_statement}\n{marker(key)}"})


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


@pytest.fixture
async def client(server: ScriptedServer) -> AsyncIterator[ChatClient]:
    async with ChatClient(server.url, "scripted", backoff_base=0.01, max_retries=3) as chat:
        yield chat


@pytest.fixture
def roman_task(tmp_path: Path) -> Task:
    return python_task(tmp_path)


@pytest.fixture
async def sandbox(roman_task: Task) -> AsyncIterator[Sandbox]:
    async with create_sandbox({"type": "local"}, roman_task) as box:
        yield box


async def test_scripted_model_fixes_romankit(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "fix")
    server.script(
        "fix",
        call("view", {"path": NUMERALS, "start_line": 35}),
        call("edit", {"path": NUMERALS, "old_str": BUGGY, "new_str": FIXED}),
        call(
            "shell",
            {
                "command": "PYTHONPATH=src python -c \"from romankit.numerals import from_roman as f; print(f('MCMXCIV'), f('IV'))\""
            },
        ),
        call("submit"),
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted", trajectory.error
    assert trajectory.error is None
    assert len(trajectory.turns) == 4 == len(server.requests_for("fix"))
    view, edit, shell, submit = (turn.tool_calls[0] for turn in trajectory.turns)
    assert "    35\tdef from_roman(text):" in view.output
    assert not edit.error and f"Edited {NUMERALS}" in edit.output
    assert shell.exit_code == 0 and "1994 4" in shell.output
    assert submit.name == "submit"
    assert "+        total += -value if value < following else value" in trajectory.diff
    # The chat as sent: system, instance, then assistant/tool pairs.
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 4
    assert "from_roman ignores subtractive notation" in trajectory.messages[1]["content"]
    assert sandbox.workdir in trajectory.messages[0]["content"]
    # What the agent sent: the four tools, max_tokens capped by the per-turn limit.
    first = server.requests_for("fix")[0].body
    assert [t["function"]["name"] for t in first["tools"]] == ["shell", "view", "edit", "submit"]
    assert first["tool_choice"] == "auto"
    assert first["max_tokens"] == AgentSpec().max_tokens_per_turn
    assert first["return_token_ids"] is True and first["logprobs"] is True
    result = await evaluate(sandbox, task)
    assert result.resolved, result.log


async def test_gold_policy_resolves_romankit(roman_task: Task, sandbox: Sandbox) -> None:
    trajectory = await run_agent(roman_task, sandbox, GoldPolicy(roman_task), AgentSpec())
    assert trajectory.exit_reason == "submitted"
    assert trajectory.model == "gold"
    apply = trajectory.turns[0].tool_calls[0]
    assert apply.name == "shell" and apply.exit_code == 0, apply.output
    assert trajectory.completion_tokens == 0
    assert trajectory.token_sequence() is None
    result = await evaluate(sandbox, roman_task)
    assert result.resolved, result.log


async def test_gold_policy_resolves_calendarkit(tmp_path: Path) -> None:
    task = unittest_task(tmp_path)
    async with create_sandbox({"type": "local"}, task) as box:
        trajectory = await run_agent(task, box, GoldPolicy(task), AgentSpec())
        assert trajectory.exit_reason == "submitted"
        assert trajectory.diff.strip() == task.patch.strip()
        result = await evaluate(box, task)
        assert result.resolved, result.log
