"""The scripted workload of ``perf/agent_loop.py``, shared by the server and both agent sides.

Standard library only: the scripted server (``agent_loop_server.py``), this project's side
(project venv) and the mini-swe-agent driver (``agent_loop_mini.py``, bench venv) all import it,
so the three agree on every byte of the script.

One trajectory is ``turns`` model calls. Turns ``1 .. turns-1`` cycle through six actions an
agent typically takes on a SWE task (list, grep, view a file, edit it, run the tests, look at the
diff); the last turn submits. Each turn's assistant text is a "thought" of 400-1,100 characters
(about 100-280 tokens) plus one tool call; each command's canned output is a few KB. The same
turn returns the same text and the same output to both agents.

Token ids imitate vLLM's ``return_token_ids`` without a tokenizer: text is cut into 4-character
pieces and each piece maps to an id in ``[1000, 151000)`` (a Qwen-sized vocabulary, so the ids are
not CPython's cached small ints). The prompt of turn ``t`` is the prompt of turn ``t-1``, then that
turn's completion, then the tool output, so the ids extend turn over turn exactly as a chat
template's would.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

#: Model names the two sides send; the server tells them apart by it.
CRL_MODEL = "crl-scripted"
MINI_MODEL = "mini-scripted"

#: The file the script views and edits.
FILE_PATH = "src/shapes/metrics.py"
#: The line the edit replaces (unique in :data:`FILE_TEXT`) and its replacement.
EDIT_OLD = "    return total / count\n"
EDIT_NEW = "    return total / count if count else 0.0\n"

_SENTENCE = (
    "the function returns wrong value when input list is empty so I should check how average "
    "is computed in metrics module and whether tests cover zero length case then fix division "
    "by guarding count before dividing and rerun test suite to confirm nothing else breaks"
)
_WORDS = _SENTENCE.split()


def _prose(seed: int, length: int) -> str:
    """Deterministic English-looking text of exactly ``length`` characters."""
    words: list[str] = []
    size = 0
    i = seed
    while size < length:
        word = _WORDS[(i * 7 + i // 3) % len(_WORDS)]
        words.append(word)
        size += len(word) + 1
        i += 1
    return " ".join(words)[:length]


def _source_file() -> str:
    """A ~4 KB Python module with :data:`EDIT_OLD` exactly once."""
    parts = ['"""Shape metrics."""\n\nfrom __future__ import annotations\n\nimport math\n\n']
    for k in range(24):
        parts.append(
            f"\ndef metric_{k}(values: list[float]) -> float:\n"
            f'    """{_prose(k, 60)}."""\n'
            f"    return sum(math.sqrt(abs(v)) * {k + 1} for v in values)\n"
        )
    parts.append(
        "\ndef average(values: list[float]) -> float:\n"
        '    """Arithmetic mean of the values."""\n'
        "    total = sum(values)\n"
        "    count = len(values)\n" + EDIT_OLD
    )
    return "".join(parts)


FILE_TEXT = _source_file()

_LS = (
    "".join(
        f"-rw-r--r-- 1 root root {1000 + 37 * k:>6} Nov 21 04:00 {name}\n"
        for k, name in enumerate(
            ["README.md", "pyproject.toml", "setup.cfg", "tox.ini", "LICENSE", "CHANGELOG.md"]
            + [f"src/shapes/module_{k}.py" for k in range(14)]
            + [f"tests/test_module_{k}.py" for k in range(8)]
        )
    )
    + "On branch main\nnothing to commit, working tree clean\n"
)
_GREP = "".join(
    f"src/shapes/module_{k % 14}.py:{10 + 7 * k}:    value = average(samples_{k}) "
    f"# {_prose(k, 40)}\n"
    for k in range(36)
)
_PYTEST = (
    "============================= test session starts ==============================\n"
    "platform linux -- Python 3.11.7, pytest-8.3.3, pluggy-1.5.0\n"
    "rootdir: /testbed\ncollected 48 items\n\n"
    + "".join(
        f"tests/test_module_{k}.py {'.' * 6}{'F' if k == 3 else '.'} [ {k * 12}%]\n"
        for k in range(8)
    )
    + "\n=================================== FAILURES ===================================\n"
    "_____________________________ test_average_empty ______________________________\n\n"
    + "".join(f"    {line}\n" for line in FILE_TEXT.splitlines()[-12:])
    + "E   ZeroDivisionError: division by zero\n\n"
    "tests/test_module_3.py:41: ZeroDivisionError\n"
    + "".join(f"    {_prose(k, 90)}\n" for k in range(12))
    + "=========================== short test summary info ============================\n"
    "FAILED tests/test_module_3.py::test_average_empty - ZeroDivisionError: division by zero\n"
    "========================= 1 failed, 47 passed in 0.42s =========================\n"
)
DIFF = (
    f"diff --git a/{FILE_PATH} b/{FILE_PATH}\n"
    "index 3b18e51..8c2f6a9 100644\n"
    f"--- a/{FILE_PATH}\n+++ b/{FILE_PATH}\n"
    "@@ -120,4 +120,4 @@ def average(values: list[float]) -> float:\n"
    '     """Arithmetic mean of the values."""\n'
    "     total = sum(values)\n"
    "     count = len(values)\n"
    f"-{EDIT_OLD}+{EDIT_NEW}"
)
_NUMBERED = "".join(f"{n:6}\t{line}\n" for n, line in enumerate(FILE_TEXT.splitlines(), 1))


@dataclass(frozen=True)
class Action:
    """One scripted turn: what the model says and does, and what the tool answers."""

    thought: str
    """The assistant's text before its tool call."""
    tool: str
    """This project's tool: ``shell``, ``view``, ``edit`` or ``submit``."""
    arguments: dict[str, str]
    """This project's tool arguments."""
    command: str
    """The same step as one bash command (mini-swe-agent has only bash)."""
    output: str
    """What the command prints (the canned sandbox's answer to it)."""


def _actions() -> list[tuple[str, dict[str, str], str, str]]:
    """The six steps the script cycles through: (tool, arguments, bash command, output)."""
    grep = "grep -rn 'average(' src tests"
    pytest = "python -m pytest tests -x -q"
    return [
        ("shell", {"command": "ls -la && git status"}, "ls -la && git status", _LS),
        ("shell", {"command": grep}, grep, _GREP),
        ("view", {"path": FILE_PATH}, f"cat -n {FILE_PATH}", _NUMBERED),
        (
            "edit",
            {"path": FILE_PATH, "old_str": EDIT_OLD, "new_str": EDIT_NEW},
            f"sed -i 's/return total \\/ count$/return total \\/ count if count else 0.0/' {FILE_PATH}",
            "",
        ),
        ("shell", {"command": pytest}, pytest, _PYTEST),
        ("shell", {"command": "git diff"}, "git diff", DIFF),
    ]


SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"


def action(turn: int, turns: int) -> Action:
    """The scripted action of ``turn`` (1-based) in a trajectory of ``turns`` model calls."""
    thought = _prose(turn * 13, 400 + (turn * 337) % 700) + "."
    if turn >= turns:
        return Action(thought, "submit", {}, SUBMIT_COMMAND, "")
    tool, arguments, command, output = _actions()[(turn - 1) % 6]
    return Action(thought, tool, arguments, command, output)


#: Canned outputs by command, for the sandboxes of both sides.
OUTPUTS: dict[str, str] = {a[2]: a[3] for a in _actions()} | {f"cat {FILE_PATH}": FILE_TEXT}
#: What the canned sandbox answers to a command the script does not know (about 2 KB).
DEFAULT_OUTPUT = _GREP[:2048]

#: The issue text both agents get as their task (about 1.5 KB).
PROBLEM = (
    "average() raises ZeroDivisionError on an empty list\n\n"
    + _prose(5, 1400)
    + "\n\nExpected: average([]) returns 0.0.\n"
)

#: The system prompt and task the server counts as turn 1's prompt (about 1,500 tokens).
_FIRST_PROMPT = _prose(1, 6000)


def _ids(text: str) -> list[int]:
    """Pseudo token ids of ``text``: one per 4 characters, stable for the same text."""
    return [1000 + zlib.crc32(text[i : i + 4].encode(), i) % 150000 for i in range(0, len(text), 4)]


def completion_text(turn: int, turns: int) -> str:
    """What the completion of ``turn`` "is" as text, tool call included (hermes-style)."""
    step = action(turn, turns)
    call = json.dumps({"name": step.tool, "arguments": step.arguments})
    return f"{step.thought}\n<tool_call>\n{call}\n</tool_call>"


def completion_ids(turn: int, turns: int) -> list[int]:
    """Completion token ids of ``turn``, end-of-turn token included."""
    return [*_ids(completion_text(turn, turns)), 151645]


def prompt_ids(turns: int) -> list[list[int]]:
    """Prompt token ids of each turn ``1 .. turns`` (index 0 is turn 1)."""
    prompts = [_ids(_FIRST_PROMPT)]
    for turn in range(1, turns):
        observation = _ids(f"<tool_response>\n{action(turn, turns).output}\n</tool_response>")
        prompts.append([*prompts[-1], *completion_ids(turn, turns), *observation])
    return prompts
