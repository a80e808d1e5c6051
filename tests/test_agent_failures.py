"""The agent loop when things fail (the model, the sandbox, the submission) and its gold runs."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from crl_worker.agent import AgentCancelled, ChatClient, GoldPolicy, PromptError, run_agent
from crl_worker.agent.gold import apply_command, heredoc_delimiter
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
    drop,
    error,
)
from tests.fixtures.ports import free_port
from tests.fixtures.repos import java_task, python_task

# The shared fixtures, bound here so that pytest finds them.
client, roman_task, sandbox = agent_loop.client, agent_loop.roman_task, agent_loop.sandbox


# --- failures ------------------------------------------------------------------------------------


async def test_retried_faults_do_not_end_the_run(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "faults")
    server.script(
        "faults",
        error(429, retry_after="0"),
        error(500),
        drop(),
        call("view", {"path": "README.md"}),
        call("submit"),
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted"
    assert [t.retries for t in trajectory.turns] == [3, 0]


async def test_unreachable_server_is_an_infrastructure_failure(
    roman_task: Task, sandbox: Sandbox
) -> None:
    async with ChatClient(
        f"http://127.0.0.1:{free_port()}/v1", "nobody", backoff_base=0.01, max_retries=2
    ) as down:
        trajectory = await run_agent(roman_task, sandbox, down, AgentSpec())
    assert trajectory.exit_reason == "infrastructure_error"
    assert trajectory.infrastructure_failure
    assert "failed 3 times" in (trajectory.error or "")
    assert trajectory.turns == []
    assert trajectory.diff == ""


async def test_exhausted_retries_mid_run_keep_the_work_done(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "dies")
    server.script(
        "dies",
        call("edit", {"path": NUMERALS, "old_str": BUGGY, "new_str": FIXED}),
        *[error(503)] * 4,
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "infrastructure_error"
    assert "HTTP 503" in (trajectory.error or "")
    assert len(trajectory.turns) == 1
    assert "following = values" in trajectory.diff


async def test_shell_dying_is_an_infrastructure_failure(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "kill")
    # The shell ends (`exec` replaces it with a program that exits). `kill -KILL $$` no longer
    # does it: in the sandbox's PID namespace the shell is process 1, which no process inside
    # can kill (tests/test_sandbox_isolation.py).
    server.script("kill", call("shell", {"command": "exec true"}), call("submit"))
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "infrastructure_error", trajectory.error
    assert trajectory.infrastructure_failure
    assert len(server.requests_for("kill")) == 1


async def test_sandbox_closed_mid_run_is_an_infrastructure_failure(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "closed")
    server.script(
        "closed",
        call("view", {"path": "README.md"}),
        call("shell", {"command": "ls"}, delay=1.0),
        call("submit"),
    )

    async def close_soon() -> None:
        while len(server.requests_for("closed")) < 2:
            await asyncio.sleep(0.02)
        await sandbox.close()

    closer = asyncio.create_task(close_soon())
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    await closer
    assert trajectory.exit_reason == "infrastructure_error"
    assert "no longer alive" in (trajectory.error or "")
    assert len(server.requests_for("closed")) == 2


async def test_cancellation_hands_back_the_trajectory(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "cancel")
    server.script("cancel", call("view", {"path": "README.md"}), Step(content="x", delay=30))
    run = asyncio.create_task(run_agent(task, sandbox, client, AgentSpec()))
    while len(server.requests_for("cancel")) < 2:
        await asyncio.sleep(0.02)
    run.cancel()
    with pytest.raises(AgentCancelled) as caught:
        await run
    assert isinstance(caught.value, asyncio.CancelledError)
    trajectory = caught.value.trajectory
    assert trajectory.exit_reason == "cancelled"
    assert len(trajectory.turns) == 1
    assert trajectory.turns[0].tool_calls[0].name == "view"
    assert sandbox.alive  # cancelled between commands: the session is intact


async def test_unknown_prompt_template_names_the_bundled_ones(
    client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    with pytest.raises(PromptError, match=r"unknown prompt template 'nope'.*swe-default"):
        await run_agent(roman_task, sandbox, client, AgentSpec(prompt_template="nope"))


# --- gold runs ------------------------------------------------------------------------------------


def test_heredoc_delimiter_never_occurs_in_the_patch() -> None:
    patch = "--- a/x\n+++ b/x\n@@ -1 +1,2 @@\n+CRL_GOLD_PATCH_EOF\n CRL_GOLD_PATCH_EOF_1\n"
    # A line that merely contains the stem is harmless; an equal line is not.
    assert heredoc_delimiter(patch) == "CRL_GOLD_PATCH_EOF"
    assert heredoc_delimiter("CRL_GOLD_PATCH_EOF\nCRL_GOLD_PATCH_EOF_1\n") == (
        "CRL_GOLD_PATCH_EOF_2"
    )
    command = apply_command("CRL_GOLD_PATCH_EOF\n$HOME `id`")
    assert command.startswith("git apply --verbose <<'CRL_GOLD_PATCH_EOF_1'\n")
    assert command.endswith("\n$HOME `id`\nCRL_GOLD_PATCH_EOF_1")


async def test_gold_patch_with_shell_syntax_and_delimiter_lines(tmp_path: Path) -> None:
    # The patch adds a file whose lines look like shell expansions and like the delimiter.
    body = ["$HOME", "`id`", "CRL_GOLD_PATCH_EOF", "'quoted' \\ back"]
    patch = (
        "diff --git a/notes.txt b/notes.txt\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/notes.txt\n@@ -0,0 +1,{len(body)} @@\n" + "".join(f"+{line}\n" for line in body)
    )
    task = python_task(tmp_path).model_copy(update={"patch": patch})
    async with create_sandbox({"type": "local"}, task) as box:
        trajectory = await run_agent(task, box, GoldPolicy(task), AgentSpec())
        assert trajectory.turns[0].tool_calls[0].exit_code == 0
        assert (await box.read_file("notes.txt")).decode() == "".join(f"{x}\n" for x in body)


async def test_gold_patch_that_does_not_apply_still_submits(
    roman_task: Task, sandbox: Sandbox
) -> None:
    task = roman_task.model_copy(
        update={"patch": roman_task.patch.replace("-    for char in numeral:", "-    for c in x:")}
    )
    trajectory = await run_agent(task, sandbox, GoldPolicy(task), AgentSpec())
    assert trajectory.exit_reason == "submitted"
    apply = trajectory.turns[0].tool_calls[0]
    assert apply.exit_code != 0 and "patch does not apply" in apply.output
    assert trajectory.diff == ""
    result = await evaluate(sandbox, task)
    assert not result.resolved


@pytest.mark.skipif(shutil.which("mvn") is None, reason="Maven (mvn) is not installed")
async def test_gold_policy_resolves_stringkit(tmp_path: Path) -> None:
    task = java_task(tmp_path)
    async with create_sandbox({"type": "local"}, task) as box:
        trajectory = await run_agent(task, box, GoldPolicy(task), AgentSpec())
        assert trajectory.exit_reason == "submitted"
        result = await evaluate(box, task)
        assert result.resolved, result.log


async def test_view_to_the_end_of_the_file(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    task = keyed(roman_task, "tail")
    server.script(
        "tail",
        call("view", {"path": NUMERALS, "start_line": 46, "end_line": -1}),
        call("view", {"path": NUMERALS, "start_line": 3, "end_line": 4}),
        call("submit"),
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    tail, middle = (t.tool_calls[0].output for t in trajectory.turns[:2])
    assert tail == "    46\t    return total"
    assert middle == '     3\t_SYMBOLS = [\n     4\t    ("M", 1000),'


async def test_arguments_sent_as_an_object_run_and_go_back_as_a_string(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    # Some servers send the arguments as a JSON object, not the string the format has.
    task = keyed(roman_task, "objargs")
    as_object = {"type": "function", "function": {"name": "view", "arguments": {"path": NUMERALS}}}
    server.script("objargs", Step(calls=[as_object]), call("submit"))
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted", trajectory.error
    view = trajectory.turns[0].tool_calls[0]
    assert not view.error and "def from_roman" in view.output
    assert view.arguments == '{"path": "src/romankit/numerals.py"}'
    # Sent back in the format's shape, or a validating server (vLLM) refuses the next request.
    sent = server.requests_for("objargs")[1].body["messages"]
    assert sent[2]["tool_calls"][0]["function"]["arguments"] == view.arguments


async def test_view_numbers_lines_as_the_shell_does_and_refuses_binary_and_non_utf8(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    # A form feed on a line of its own (GNU-style sections), CRLF endings, a binary file and a
    # Latin-1 file, all written by the shell.
    setup = (
        r"printf 'a\n\f\nb\r\nc\n' > ff.txt && printf 'x\000y' > blob.bin"
        r" && printf 'caf\351\n' > latin1.txt && grep -n c ff.txt"
    )
    task = keyed(roman_task, "lines")
    server.script(
        "lines",
        call("shell", {"command": setup}),
        call("view", {"path": "ff.txt", "start_line": 4}),
        call("edit", {"path": "ff.txt", "old_str": "b\r\n", "new_str": "B\r\n"}),
        call("view", {"path": "blob.bin"}),
        call("view", {"path": "latin1.txt"}),
        call("edit", {"path": "latin1.txt", "old_str": "caf", "new_str": "cafe"}),
        call("submit"),
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    shell, view, edit, blob, latin1, latin1_edit = (t.tool_calls[0] for t in trajectory.turns[:6])
    assert "4:c" in shell.output  # what the model sees from grep -n ...
    assert view.output == "     4\tc"  # ... is what view calls line 4
    assert not edit.error and "Lines 1 to 4 now read:" in edit.output
    assert "     3\tB\n     4\tc" in edit.output
    assert blob.error and "blob.bin is a binary file" in blob.output
    assert latin1.error and "latin1.txt is not UTF-8 text; use shell" in latin1.output
    assert latin1_edit.error and "not UTF-8" in latin1_edit.output
    assert (await sandbox.read_file("ff.txt")) == b"a\n\x0c\nB\r\nc\n"
    assert (await sandbox.read_file("latin1.txt")) == b"caf\xe9\n"


async def test_view_refuses_devices_fifos_and_huge_files_without_reading_them(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    """Issue 17: ``view /dev/zero`` grew ``crl bench`` to 2.4 GB. Only regular files up to
    MAX_FILE_BYTES are read; the rest is refused at once, with a hint."""
    import resource

    from crl_worker.agent.tools import MAX_FILE_BYTES

    setup = f"mkfifo fifo && head -c {MAX_FILE_BYTES + 1} /dev/zero > huge.bin && ln -s /dev/zero z"
    task = keyed(roman_task, "devices")
    server.script(
        "devices",
        call("shell", {"command": setup}),
        call("view", {"path": "/dev/zero"}),
        call("view", {"path": "z"}),
        call("view", {"path": "fifo"}),
        call("view", {"path": "huge.bin"}),
        call("edit", {"path": "huge.bin", "old_str": "", "new_str": "x"}),
        call("submit"),
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert time.monotonic() - started < 60
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, f"grew by {grown_mb:.0f} MB"
    _, zero, link, fifo, huge, create = (t.tool_calls[0] for t in trajectory.turns[:6])
    for refused in (zero, link, fifo):
        assert refused.error and "not a regular file" in refused.output, refused.output
    assert huge.error and f"larger than {MAX_FILE_BYTES} bytes; use shell" in huge.output
    assert create.error and "already exists" in create.output


async def test_a_server_without_usage(roman_task: Task, sandbox: Sandbox) -> None:
    """No ``usage`` in the answers: the token ids measure the context when the server sends
    them; with neither, the run still ends by its other limits, tokens counted as 0."""
    view = {"path": "README.md"}
    async with ScriptedServer() as vllm, ScriptedServer(vllm=False) as plain:
        for server in (vllm, plain):
            server.script("nousage", *[call("view", view, no_usage=True)] * 3)
        spec = AgentSpec(max_turns=3, max_total_tokens=400_000, max_tokens_per_turn=262_144)
        task = keyed(roman_task, "nousage")
        async with ChatClient(vllm.url, "m") as client:
            with_ids = await run_agent(task, sandbox, client, spec)
        async with ChatClient(plain.url, "m") as client:
            without = await run_agent(task, sandbox, client, spec)
    first = with_ids.turns[0]
    assert first.prompt_tokens == first.completion_tokens == 0
    assert first.prompt_token_ids is not None and first.completion_token_ids is not None
    size = len(first.prompt_token_ids) + len(first.completion_token_ids)
    assert with_ids.turns[1].max_tokens == min(262_144, 400_000 - size)
    assert without.exit_reason == with_ids.exit_reason == "max_turns"
    assert [t.max_tokens for t in without.turns] == [262_144] * 3
    assert (without.prompt_tokens, without.completion_tokens) == (0, 0)


async def test_a_multi_line_edit_copied_from_view_works_in_a_crlf_file(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    # view shows a CRLF file's lines without their \r, so what the model copies has bare
    # newlines; the edit matches and writes in the file's own line endings.
    task = keyed(roman_task, "crlf")
    server.script(
        "crlf",
        call("shell", {"command": r"printf 'one\r\ntwo\r\nthree\r\n' > dos.txt"}),
        call("view", {"path": "dos.txt"}),
        call("edit", {"path": "dos.txt", "old_str": "one\ntwo\n", "new_str": "1\n2\n"}),
        call("submit"),
    )
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    view, edit = (t.tool_calls[0] for t in trajectory.turns[1:3])
    assert view.output == "     1\tone\n     2\ttwo\n     3\tthree"
    assert not edit.error, edit.output
    assert "     1\t1\n     2\t2\n     3\tthree" in edit.output
    assert (await sandbox.read_file("dos.txt")) == b"1\r\n2\r\nthree\r\n"


async def test_a_turn_that_overflows_only_by_its_max_tokens_is_asked_again_with_the_room_left(
    server: ScriptedServer, client: ChatClient, roman_task: Task, sandbox: Sandbox
) -> None:
    # The last answer left room in the budget, but the tool output since pushed the prompt
    # plus max_tokens past the model's context: vLLM says so with both sizes.
    too_many = (
        "'max_tokens' or 'max_completion_tokens' is too large: 4096. This model's maximum context"
        " length is 32768 tokens and your request has 32000 input tokens (4096 > 32768 - 32000)."
    )
    task = keyed(roman_task, "room")
    server.script("room", error(400, too_many), call("submit"))
    trajectory = await run_agent(task, sandbox, client, AgentSpec())
    assert trajectory.exit_reason == "submitted", trajectory.error
    assert [r.body["max_tokens"] for r in server.requests_for("room")] == [4096, 768]
    assert trajectory.turns[0].max_tokens == 768
