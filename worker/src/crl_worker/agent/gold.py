"""The gold policy: replays a task's gold patch through the agent's own loop and tools.

Turn 1 calls ``shell`` with ``git apply`` reading the patch from a quoted heredoc; turn 2 calls
``submit`` (also when the patch did not apply: the evaluation shows it). A gold run therefore
exercises everything a model's run does except the model (prompts, tool calls, the sandbox's
shell, the final diff, the evaluation), like SWE-bench's gold validation run: every instance
must resolve, or the harness or the task is broken.
"""

from __future__ import annotations

import json
from typing import Any

from crl_worker.agent.client import Completion
from crl_worker.agent.sampling import Sampling
from crl_worker.agent.trajectory import Trajectory
from crl_worker.tasks.model import Task

#: The heredoc delimiter's stem; a suffix is added until no line of the patch equals it.
_DELIMITER = "CRL_GOLD_PATCH_EOF"


def heredoc_delimiter(text: str) -> str:
    """A heredoc delimiter that no line of ``text`` equals."""
    lines = set(text.splitlines())
    delimiter, n = _DELIMITER, 0
    while delimiter in lines:
        n += 1
        delimiter = f"{_DELIMITER}_{n}"
    return delimiter


def apply_command(patch: str) -> str:
    """A shell command applying ``patch`` to the repository in the current directory."""
    if patch and not patch.endswith("\n"):
        patch += "\n"
    delimiter = heredoc_delimiter(patch)
    # Quoted delimiter: the shell expands nothing inside the patch ($, `, \ stay as written).
    return f"git apply --verbose <<'{delimiter}'\n{patch}{delimiter}"


def tool_call(
    turn: int, name: str, arguments: dict[str, Any], *, prefix: str = "gold"
) -> Completion:
    """A completion that calls one tool (id ``{prefix}_{turn}``), as a scripted policy sends."""
    return Completion(
        message={
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"{prefix}_{turn}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        },
        finish_reason="tool_calls",
        prompt_tokens=0,
        completion_tokens=0,
        latency=0.0,
    )


class GoldPolicy:
    """A :class:`~crl_worker.agent.client.Policy` that applies ``task.patch`` and submits; on a
    classify task, it answers the task's label with ``classify``.

    When ``shell`` is not among the offered tools it submits at once (nothing applied).
    """

    model = "gold"

    def __init__(self, task: Task) -> None:
        self.task = task

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]], sampling: Sampling
    ) -> Completion:
        """Turn 1: apply the patch with ``shell``; later turns: ``submit`` (``sampling``
        unused)."""
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        offered = {t.get("function", {}).get("name") for t in tools}
        if self.task.classification is not None and "classify" in offered:
            label = self.task.classification.cwe
            reasoning = f"the task's label (gold replay): {label}"
            return tool_call(turn, "classify", {"cwe": label, "reasoning": reasoning})
        if turn == 0 and "shell" in offered:
            return tool_call(turn, "shell", {"command": apply_command(self.task.patch)})
        return tool_call(turn, "submit", {})


def gold_patch_failure(trajectory: Trajectory) -> str | None:
    """Why the gold replay of ``trajectory`` did not apply its patch (``None`` when it did, or
    when the trajectory is not a gold replay). A gold patch that does not apply means the task
    or the harness is broken, not that the instance is hard."""
    if trajectory.model != GoldPolicy.model:
        return None
    if any(c.name == "classify" for t in trajectory.turns for c in t.tool_calls):
        return None  # a classify task has no patch
    for turn in trajectory.turns:
        for call in turn.tool_calls:
            if call.name == "shell":
                if call.exit_code == 0:
                    return None
                tail = call.output.strip()[-600:]
                return f"the gold patch did not apply (exit code {call.exit_code}): {tail}"
    return "the gold patch was never applied (the agent offers no shell tool)"
