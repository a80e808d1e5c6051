"""The agent loop end to end: a scripted model over real HTTP, real local sandboxes on the
fixture repositories, the real evaluation."""

from __future__ import annotations

import time
from pathlib import Path

from crl_worker.agent import ChatClient, GoldPolicy, run_agent
from crl_worker.api.common import AgentSpec
from crl_worker.harness.evaluate import evaluate
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task
from tests.fixtures import agent_loop
from tests.fixtures.agent_loop import BUGGY, FIXED, NUMERALS, keyed
from tests.fixtures.openai_server import (
    ScriptedServer,
    Step,
    call,
    calls,
    context_length,
    text,
    tool_call,
)
from tests.fixtures.repos import unittest_task

# The shared fixtures, bound here so that pytest finds them.
client, roman_task, sandbox = agent_loop.client, agent_loop.roman_task, agent_loop.sandbox


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


# --- malformed calls and tool errors ------------------------------------------------------------


async def test_malformed_calls_are_answered_and_the_run_goes_on(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "bad")
    server.script(
        "bad",
        call("grep", {"pattern": "x"}),
        call("view", '{"path": "README.md"'),
        call("view", "[1, 2]"),
        call("edit", {"path": NUMERALS, "old_str": "x"}),
        call("shell", {"command": "ls", "cwd": "/"}),
        call("view", {"path": "README.md", "start_line": "3"}),
        calls(tool_call("view", {"path": "README.md"}), tool_call("submit")),
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted"
    outputs = [turn.tool_calls[0].output for turn in trajectory.turns[:6]]
    assert all(turn.tool_calls[0].error for turn in trajectory.turns[:6])
    assert "there is no tool 'grep'" in outputs[0]
    assert "Available tools: shell, view, edit, submit." in outputs[0]
    assert "not valid JSON" in outputs[1]
    assert "must be a JSON object, not list" in outputs[2]
    assert "edit needs the argument 'new_str'" in outputs[3]
    assert "shell has no argument 'cwd'" in outputs[4]
    assert "'start_line' of view must be an integer, got str" in outputs[5]
    # The last answer made two calls: both ran, in order, each answered by its own tool message.
    last = trajectory.turns[6].tool_calls
    assert [c.name for c in last] == ["view", "submit"]
    assert not last[0].error and "romankit" in last[0].output
    tool_messages = [m for m in trajectory.messages if m["role"] == "tool"]
    assert len(tool_messages) == 8
    assert tool_messages[-2]["tool_call_id"] == last[0].id
    # The raw malformed arguments are kept as the model wrote them.
    assert trajectory.turns[1].tool_calls[0].arguments == '{"path": "README.md"'
    assert trajectory.diff == ""


async def test_answer_without_tool_call_gets_a_nudge(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "chatty")
    server.script(
        "chatty",
        text("I think the bug is in from_roman."),
        text("cut off", finish_reason="length"),
        call("submit"),
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted"
    roles = [m["role"] for m in trajectory.messages]
    assert roles == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
    ]
    assert trajectory.messages[3]["content"].startswith("Your answer did not call a tool.")
    assert "shell, view, edit, submit" in trajectory.messages[3]["content"]
    assert "cut off at the token limit" in trajectory.messages[5]["content"]
    # The nudge reached the server in the next request.
    second = server.requests_for("chatty")[1].body["messages"]
    assert second[-1] == trajectory.messages[3]
    assert second[-2] == {"role": "assistant", "content": "I think the bug is in from_roman."}


async def test_view_and_edit_refusals(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "edits")
    server.script(
        "edits",
        call("view", {"path": "src"}),
        call("view", {"path": "missing.py"}),
        call("view", {"path": NUMERALS, "start_line": 500}),
        call("edit", {"path": NUMERALS, "old_str": "no such text", "new_str": "x"}),
        call("edit", {"path": NUMERALS, "old_str": "raise ValueError", "new_str": "raise"}),
        call("edit", {"path": NUMERALS, "old_str": "", "new_str": "x = 1\n"}),
        call("edit", {"path": "src/romankit/extra.py", "old_str": "", "new_str": "X = 1\n"}),
        call("view", {"path": "src/romankit/extra.py"}),
        call("submit"),
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted"
    out = [turn.tool_calls[0] for turn in trajectory.turns]
    assert not out[0].error and "src/romankit/numerals.py" in out[0].output
    assert "directory" in out[0].output
    assert out[1].error and "missing.py does not exist" in out[1].output
    assert out[2].error and "start_line 500 is outside the file" in out[2].output
    assert out[3].error and "old_str does not occur in" in out[3].output
    assert out[4].error and "occurs 3 times" in out[4].output and "at lines" in out[4].output
    assert out[5].error and "already exists" in out[5].output
    assert not out[6].error and out[6].output == "Created src/romankit/extra.py (1 lines)."
    assert out[7].output == "     1\tX = 1"
    assert "+X = 1" in trajectory.diff and "numerals.py" not in trajectory.diff


async def test_only_the_spec_tools_are_offered(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "subset")
    server.script("subset", call("view", {"path": "README.md"}), call("submit"))
    spec = AgentSpec(tools=["shell", "submit"])
    trajectory = await run_agent(task, sandbox, client, spec)
    body = server.requests_for("subset")[0].body
    assert [t["function"]["name"] for t in body["tools"]] == ["shell", "submit"]
    assert "there is no tool 'view' in this run" in trajectory.turns[0].tool_calls[0].output
    assert trajectory.tools == ["shell", "submit"]


# --- limits ------------------------------------------------------------------------------------


async def test_max_turns_ends_before_another_call(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "turns")
    server.script("turns", *[call("view", {"path": "README.md"})] * 5)
    trajectory = await run_agent(task, sandbox, client, AgentSpec(max_turns=3))
    assert trajectory.exit_reason == "max_turns"
    assert trajectory.error == "reached the limit of 3 model calls"
    assert len(trajectory.turns) == 3 == len(server.requests_for("turns"))


async def test_context_budget_caps_max_tokens_then_ends_the_run(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "budget")
    server.script(
        "budget",
        call("view", {"path": "README.md"}, usage=(1500, 100)),
        call("view", {"path": "README.md"}, usage=(1900, 50)),
        call("submit"),
    )
    spec = AgentSpec(max_total_tokens=2000, max_tokens_per_turn=1024)
    trajectory = await run_agent(task, sandbox, client, spec)
    assert trajectory.exit_reason == "context_exhausted"
    assert "1950 of 2000 tokens" in (trajectory.error or "")
    sent = [r.body["max_tokens"] for r in server.requests_for("budget")]
    assert sent == [1024, 400]  # min(per turn, 2000 - (1500 + 100))
    assert [t.max_tokens for t in trajectory.turns] == sent
    assert (trajectory.prompt_tokens, trajectory.completion_tokens) == (3400, 150)


async def test_server_context_length_error_is_context_exhausted(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "toolong")
    server.script("toolong", call("view", {"path": "README.md"}), context_length())
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "context_exhausted"
    assert "maximum context length" in (trajectory.error or "")
    assert not trajectory.infrastructure_failure
    assert len(trajectory.turns) == 1


async def test_deadline_passing_during_a_command_ends_before_the_next_call(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "longcmd")
    server.script("longcmd", call("shell", {"command": "sleep 5"}), call("submit"))
    started = time.monotonic()
    trajectory = await run_agent(task, sandbox, client, AgentSpec(), deadline=started + 1.5)
    assert trajectory.exit_reason == "timeout"
    assert "before the next model call" in (trajectory.error or "")
    assert len(server.requests_for("longcmd")) == 1
    shell = trajectory.turns[0].tool_calls[0]
    assert shell.exit_code is None and "interrupted" in shell.output
    assert time.monotonic() - started < 5


async def test_deadline_bounds_a_slow_model_call(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "slowmodel")
    server.script("slowmodel", Step(content="late", delay=10))
    started = time.monotonic()
    trajectory = await run_agent(task, sandbox, client, AgentSpec(), deadline=started + 1.0)
    assert trajectory.exit_reason == "timeout"
    assert "during a model call" in (trajectory.error or "")
    assert trajectory.turns == []
    assert time.monotonic() - started < 5
