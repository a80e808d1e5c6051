"""The agent's tools, run in the sandbox: ``shell``, ``view``, ``edit`` (str_replace),
``submit``, and ``classify`` (the answer of a classify task: a CWE id and the reasoning).

The model calls them with OpenAI function calling. Every call gets an answer the model can act
on: a malformed call (unknown tool, arguments that are not a JSON object, a missing, extra or
wrongly typed argument) and a refused one (``old_str`` not found) come back as an error text,
and the loop goes on. Only failures of the sandbox itself (:class:`SandboxError`) escape: they
end the trajectory as an infrastructure failure.

``view`` and ``edit`` resolve relative paths against the repository root (the sandbox's
workdir), whatever directory the shell has ``cd``-ed into.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from crl_worker.agent.prompts import Prompts
from crl_worker.api.common import TaskType
from crl_worker.errors import SandboxError
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.files import FileTooLarge, NotARegularFile, PathOutsideSandbox
from crl_worker.tasks.cwe import UnknownCweError, normalise

#: Characters of output a tool returns at most (the middle of longer output is left out).
DEFAULT_MAX_OUTPUT = 16_000
#: Largest file the view and edit tools read (bytes): a bigger one (or ``/dev/zero``) is
#: refused with a hint to use the shell, never read into memory.
MAX_FILE_BYTES = 8 << 20

#: Argument types of each tool: name -> (JSON type, required). The descriptions the model sees
#: come from the template set's tools.yaml.
TOOL_ARGUMENTS: dict[str, dict[str, tuple[str, bool]]] = {
    "shell": {"command": ("string", True)},
    "view": {
        "path": ("string", True),
        "start_line": ("integer", False),
        "end_line": ("integer", False),
    },
    "edit": {"path": ("string", True), "old_str": ("string", True), "new_str": ("string", True)},
    "submit": {},
    "classify": {"cwe": ("string", True), "reasoning": ("string", True)},
}

#: The tool that ends an episode of each task type (the agent's answer).
ANSWER_TOOL: dict[str, str] = {"repair": "submit", "implement": "submit", "classify": "classify"}
#: Tools a classify episode never gets: it reads the code, it does not change it.
_CLASSIFY_WITHOUT = frozenset({"edit", "submit"})


def tools_for(task_type: TaskType, configured: list[str]) -> list[str]:
    """The tools an episode of ``task_type`` offers, from the agent's configured ones: a
    classify episode drops ``edit`` and ``submit`` and gets ``classify``; the others never get
    ``classify``."""
    if task_type == "classify":
        kept = [t for t in configured if t not in _CLASSIFY_WITHOUT and t != "classify"]
        return [*kept, "classify"]
    return [t for t in configured if t != "classify"]


#: Lines of context shown around an edit.
_SNIPPET_CONTEXT = 4
#: Entries a directory listing shows at most.
_LISTING_LIMIT = 400


class ToolCallError(Exception):
    """A call the tool refuses; the message is sent to the model."""


@dataclass
class ToolOutcome:
    """What one tool call produced."""

    output: str
    """The tool message's content."""
    error: bool = False
    """The call was malformed or refused."""
    exit_code: int | None = None
    """``shell``: the command's exit status."""
    submitted: bool = False
    """``submit`` (or an accepted ``classify``) was called: the episode ends."""


def tool_schemas(names: list[str], prompts: Prompts) -> list[dict[str, Any]]:
    """The OpenAI ``tools`` list for the tools ``names``, described by ``prompts``."""
    schemas = []
    for name in names:
        if name not in TOOL_ARGUMENTS:
            raise ValueError(f"unknown tool {name!r}; known: {', '.join(TOOL_ARGUMENTS)}")
        text = prompts.tools.get(name)
        if text is None:
            raise ValueError(
                f"prompt template set {prompts.name!r} does not describe tool {name!r}"
            )
        properties: dict[str, Any] = {}
        required = []
        for argument, (kind, needed) in TOOL_ARGUMENTS[name].items():
            if argument not in text.parameters:
                raise ValueError(
                    f"prompt template set {prompts.name!r} does not describe argument "
                    f"{argument!r} of tool {name!r}"
                )
            properties[argument] = {"type": kind, "description": text.parameters[argument]}
            if needed:
                required.append(argument)
        schemas.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": text.description,
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": required,
                        "additionalProperties": False,
                    },
                },
            }
        )
    return schemas


def parse_arguments(name: str, raw: Any) -> dict[str, Any]:
    """Check a call's arguments against the tool's; raise :class:`ToolCallError` saying what
    to fix."""
    if raw is None or raw == "":
        arguments: Any = {}
    elif isinstance(raw, dict):
        arguments = dict(raw)  # a copy: the checks below drop null optional arguments
    else:
        try:
            arguments = json.loads(raw)
        except (TypeError, ValueError) as exc:
            raise ToolCallError(
                f"the arguments of {name} are not valid JSON ({exc}); send a JSON object such "
                f'as {{"{next(iter(TOOL_ARGUMENTS[name]), "arg")}": ...}}'
            ) from None
    if not isinstance(arguments, dict):
        raise ToolCallError(
            f"the arguments of {name} must be a JSON object, not {type(arguments).__name__}"
        )
    expected = TOOL_ARGUMENTS[name]
    extra = sorted(set(arguments) - set(expected))
    if extra:
        raise ToolCallError(
            f"{name} has no argument {', '.join(map(repr, extra))}; its arguments are: "
            f"{', '.join(expected) or '(none)'}"
        )
    for argument, (kind, needed) in expected.items():
        if argument not in arguments or arguments[argument] is None:
            if needed:
                raise ToolCallError(f"{name} needs the argument {argument!r} ({kind})")
            arguments.pop(argument, None)
            continue
        value = arguments[argument]
        ok = (
            isinstance(value, str)
            if kind == "string"
            else isinstance(value, int) and not isinstance(value, bool)
        )
        if not ok:
            raise ToolCallError(
                f"the argument {argument!r} of {name} must be a{'n' if kind == 'integer' else ''} "
                f"{kind}, got {type(value).__name__} {json.dumps(value)[:80]}"
            )
    return arguments


def split_lines(text: str) -> list[str]:
    """A file's lines as ``grep -n``, ``sed`` and editors number them: split at newlines only,
    a carriage return before one dropped.

    ``str.splitlines`` also splits at form feeds, ``\x1c``-``\x1e``, ``\x85`` and U+2028/2029,
    which real sources hold (a form feed between sections of a GNU-style file): the numbers
    ``view`` shows would drift from the shell's, and an edit's snippet would show other lines.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _number(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(lines))


def _cap(text: str, limit: int, hint: str) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    omitted = len(text) - 2 * half
    return f"{text[:half]}\n[... {omitted} characters omitted; {hint} ...]\n{text[-half:]}"


class Toolbox:
    """Runs the tools of one trajectory in its sandbox."""

    def __init__(
        self,
        sandbox: Sandbox,
        prompts: Prompts,
        *,
        tools: list[str],
        command_timeout: float,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> None:
        self.sandbox = sandbox
        self.prompts = prompts
        self.tools = list(tools)
        self.command_timeout = command_timeout
        self.max_output = max_output

    def error(self, message: str) -> ToolOutcome:
        """A tool error as the model sees it."""
        return ToolOutcome(
            self.prompts.render("tool_error", error=message, tools=self.tools), error=True
        )

    async def call(self, name: str, raw_arguments: Any, *, time_left: float | None) -> ToolOutcome:
        """Run one tool call. ``time_left`` (seconds until the trajectory's deadline) bounds a
        shell command's timeout. Raises :class:`SandboxError` only."""
        if name not in self.tools:
            known = "" if name not in TOOL_ARGUMENTS else " in this run"
            return self.error(f"there is no tool {name!r}{known}")
        try:
            arguments = parse_arguments(name, raw_arguments)
            if name == "submit":
                return ToolOutcome("Submitted.", submitted=True)
            if name == "classify":
                return self.classify(arguments["cwe"], arguments["reasoning"])
            if not self.sandbox.alive:
                raise SandboxError("the sandbox is no longer alive")
            if name == "shell":
                return await self.shell(arguments["command"], time_left=time_left)
            if name == "view":
                return ToolOutcome(
                    await self.view(
                        arguments["path"], arguments.get("start_line"), arguments.get("end_line")
                    )
                )
            return ToolOutcome(
                await self.edit(arguments["path"], arguments["old_str"], arguments["new_str"])
            )
        except ToolCallError as refused:
            return self.error(str(refused))

    def classify(self, cwe: str, reasoning: str) -> ToolOutcome:
        """Accept a classification (a known CWE id and a reasoning) and end the episode; an
        unknown id or an empty reasoning is refused and the episode goes on."""
        try:
            key = normalise(cwe)
        except UnknownCweError as exc:
            raise ToolCallError(str(exc)) from None
        if not reasoning.strip():
            raise ToolCallError("classify needs the reasoning that led to the CWE id")
        return ToolOutcome(f"Classified as {key}.", submitted=True)

    async def shell(self, command: str, *, time_left: float | None) -> ToolOutcome:
        """Run ``command`` in the sandbox's session."""
        if not command.strip():
            raise ToolCallError("the command is empty")
        timeout = self.command_timeout
        if time_left is not None:
            timeout = max(1.0, min(timeout, time_left))
        result = await self.sandbox.run(command, timeout=timeout, max_output=self.max_output)
        text = self.prompts.render(
            "shell_output",
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            timeout=f"{timeout:g}",
            truncated=result.truncated,
            output=result.output.rstrip("\n"),
        )
        return ToolOutcome(text, exit_code=result.exit_code)

    async def _read_text(self, path: str) -> str:
        try:
            data = await self.sandbox.read_file_limited(path, MAX_FILE_BYTES)
        except FileNotFoundError:
            raise ToolCallError(f"{path} does not exist") from None
        except IsADirectoryError:
            raise
        except FileTooLarge:
            raise ToolCallError(
                f"{path} is larger than {MAX_FILE_BYTES} bytes; use shell (head, sed -n, grep)"
            ) from None
        except (NotARegularFile, PathOutsideSandbox) as exc:
            raise ToolCallError(f"{path} cannot be read with this tool: {exc}; use shell") from None
        except PermissionError:
            raise ToolCallError(f"{path} cannot be read (permission denied)") from None
        except OSError as exc:
            raise ToolCallError(f"{path} cannot be read: {exc}") from None
        if b"\0" in data[:8192]:
            raise ToolCallError(f"{path} is a binary file ({len(data)} bytes); use shell")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolCallError(f"{path} is not UTF-8 text; use shell") from None

    async def view(self, path: str, start_line: int | None, end_line: int | None) -> str:
        """Numbered lines of a file, or a directory listing."""
        if not path.strip():
            raise ToolCallError("the path is empty")
        try:
            text = await self._read_text(path)
        except IsADirectoryError:
            return await self._listing(path)
        lines = split_lines(text)
        total = len(lines)
        first = 1 if start_line is None else start_line
        last = total if end_line is None or end_line == -1 else end_line
        if total == 0:
            return f"{path} is empty."
        if not 1 <= first <= total:
            raise ToolCallError(f"start_line {first} is outside the file (lines 1 to {total})")
        if last < first:
            raise ToolCallError(f"end_line {last} is before start_line {first}")
        last = min(last, total)
        shown = _number(lines[first - 1 : last], first)
        return _cap(shown, self.max_output, "view a smaller range with start_line and end_line")

    async def _listing(self, path: str) -> str:
        quoted = shlex.quote(path)
        command = (
            f"find {quoted} -maxdepth 2 -not -name '.*' -not -path '*/.*' 2>/dev/null"
            f" | LC_ALL=C sort | head -n {_LISTING_LIMIT + 1}"
        )
        result = await self.sandbox.run(
            f"(cd {shlex.quote(self.sandbox.workdir)} && {command})",
            timeout=min(self.command_timeout, 60),
            max_output=self.max_output,
        )
        entries = result.output.splitlines()
        more = len(entries) > _LISTING_LIMIT
        body = "\n".join(entries[:_LISTING_LIMIT])
        note = f"\n[more than {_LISTING_LIMIT} entries; list a subdirectory]" if more else ""
        return f"{path} is a directory (two levels, hidden entries left out):\n{body}{note}"

    async def edit(self, path: str, old_str: str, new_str: str) -> str:
        """Replace the one occurrence of ``old_str``; or create ``path`` when ``old_str`` is
        empty."""
        if not path.strip():
            raise ToolCallError("the path is empty")
        if old_str == "":
            try:
                # Whether it exists, without reading it: 0 bytes allowed.
                await self.sandbox.read_file_limited(path, 0)
            except FileTooLarge:
                pass  # it exists, with content
            except (NotARegularFile, PathOutsideSandbox) as exc:
                raise ToolCallError(f"{path} cannot be written with this tool: {exc}") from None
            except FileNotFoundError:
                await self._write(path, new_str)
                lines = new_str.count("\n") + (0 if new_str.endswith("\n") or not new_str else 1)
                return f"Created {path} ({lines} lines)."
            except IsADirectoryError:
                raise ToolCallError(f"{path} is a directory") from None
            except OSError as exc:
                raise ToolCallError(f"{path} cannot be checked: {exc}") from None
            raise ToolCallError(
                f"{path} already exists; to change it, give the exact text to replace as old_str"
            )
        try:
            text = await self._read_text(path)
        except IsADirectoryError:
            raise ToolCallError(f"{path} is a directory, not a file") from None
        count = text.count(old_str)
        if count == 0 and "\n" in old_str and "\r\n" in text and "\r" not in old_str:
            # A CRLF file: view shows its lines without the \r, so text copied from view has
            # bare newlines and a multi-line old_str could never match. Match and write in the
            # file's own line endings.
            crlf_old = old_str.replace("\n", "\r\n")
            if text.count(crlf_old):
                old_str, new_str = crlf_old, new_str.replace("\r\n", "\n").replace("\n", "\r\n")
                count = text.count(old_str)
        if count == 0:
            hint = ""
            if old_str.strip() and text.count(old_str.strip()) == 1:
                hint = " (it does when leading and trailing whitespace is removed)"
            raise ToolCallError(
                f"old_str does not occur in {path}{hint}; view the file and copy the text "
                "exactly, indentation included"
            )
        if count > 1:
            starts: list[str] = []
            at = text.find(old_str)
            while at != -1 and len(starts) < 10:
                starts.append(str(text.count("\n", 0, at) + 1))
                at = text.find(old_str, at + 1)
            raise ToolCallError(
                f"old_str occurs {count} times in {path} (at lines {', '.join(starts)}); "
                "include more surrounding lines so that it occurs exactly once"
            )
        at = text.index(old_str)
        updated = text[:at] + new_str + text[at + len(old_str) :]
        await self._write(path, updated)
        first = text.count("\n", 0, at) + 1
        updated_lines = split_lines(updated)
        start = max(1, first - _SNIPPET_CONTEXT)
        end = min(len(updated_lines), first + new_str.count("\n") + _SNIPPET_CONTEXT)
        snippet = _number(updated_lines[start - 1 : end], start)
        return _cap(
            f"Edited {path}. Lines {start} to {end} now read:\n{snippet}",
            self.max_output,
            "view the file for the rest",
        )

    async def _write(self, path: str, text: str) -> None:
        try:
            await self.sandbox.write_file(path, text.encode("utf-8"))
        except IsADirectoryError:
            raise ToolCallError(f"{path} is a directory") from None
        except (FileTooLarge, NotARegularFile, PathOutsideSandbox) as exc:
            raise ToolCallError(f"{path} cannot be written with this tool: {exc}") from None
        except PermissionError:
            raise ToolCallError(f"{path} cannot be written (permission denied)") from None
        except OSError as exc:
            raise ToolCallError(f"{path} cannot be written: {exc}") from None
