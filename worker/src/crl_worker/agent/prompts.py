"""The agent's prompts: Jinja2 template sets bundled under ``agent/templates/<name>/``.

A set holds ``system.j2`` and ``instance.j2`` (the first two messages), ``no_tool_call.j2``
(the nudge after an answer without a tool call), ``tool_error.j2`` (the answer to a malformed
tool call), ``shell_output.j2`` (how a command's result is shown) and ``tools.yaml`` (the tools'
descriptions). Templates use ``StrictUndefined``: a variable a template names but the agent does
not pass is an error, not an empty string. No prompt text lives in code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from crl_worker.errors import CrlError

#: Where the bundled template sets live (package data).
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

#: The templates every set must have.
TEMPLATE_FILES = ("system", "instance", "no_tool_call", "tool_error", "shell_output")


class PromptError(CrlError):
    """A prompt template set is missing, incomplete, or does not render."""


@dataclass(frozen=True)
class ToolText:
    """A tool's description and its arguments' descriptions."""

    description: str
    parameters: dict[str, str]


def bundled_templates() -> list[str]:
    """Names of the bundled template sets."""
    if not TEMPLATES_DIR.is_dir():
        return []
    return sorted(p.name for p in TEMPLATES_DIR.iterdir() if (p / "system.j2").is_file())


@dataclass(frozen=True)
class Prompts:
    """One loaded template set."""

    name: str
    templates: dict[str, jinja2.Template]
    tools: dict[str, ToolText]

    def render(self, which: str, **context: Any) -> str:
        """Render template ``which`` (e.g. ``system``) with ``context``."""
        try:
            return self.templates[which].render(**context).strip()
        except jinja2.UndefinedError as exc:
            raise PromptError(
                f"prompt template {self.name}/{which}.j2 uses an undefined variable: {exc}; "
                f"it receives: {', '.join(sorted(context))}"
            ) from exc
        except jinja2.TemplateError as exc:
            raise PromptError(f"prompt template {self.name}/{which}.j2 failed: {exc}") from exc


def _tool_texts(name: str, path: Path) -> dict[str, ToolText]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PromptError(f"prompt template set {name!r}: cannot read {path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise PromptError(f"prompt template set {name!r}: {path.name} must map tool names")
    texts: dict[str, ToolText] = {}
    for tool, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("description"), str):
            raise PromptError(
                f"prompt template set {name!r}: tool {tool!r} in {path.name} needs a description"
            )
        parameters = entry.get("parameters") or {}
        if not isinstance(parameters, dict) or not all(
            isinstance(v, str) for v in parameters.values()
        ):
            raise PromptError(
                f"prompt template set {name!r}: the parameters of tool {tool!r} in {path.name} "
                "must map argument names to descriptions"
            )
        texts[str(tool)] = ToolText(
            description=entry["description"].strip(),
            parameters={str(k): str(v).strip() for k, v in parameters.items()},
        )
    return texts


@functools.lru_cache(maxsize=16)
def load_prompts(name: str) -> Prompts:
    """Load the bundled template set ``name`` (cached).

    Raises :class:`PromptError` naming the bundled sets when ``name`` is not one of them, or
    when the set misses a file or does not parse.
    """
    available = bundled_templates()
    if name not in available:
        raise PromptError(
            f"unknown prompt template {name!r}; the bundled ones are: "
            f"{', '.join(available) or '(none found)'} (agent.promptTemplate)"
        )
    folder = TEMPLATES_DIR / name
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # plain text for a model, not HTML
        keep_trailing_newline=False,
    )
    templates: dict[str, jinja2.Template] = {}
    for which in TEMPLATE_FILES:
        try:
            templates[which] = environment.get_template(f"{which}.j2")
        except jinja2.TemplateNotFound:
            raise PromptError(
                f"prompt template set {name!r} has no {which}.j2 (in {folder})"
            ) from None
        except jinja2.TemplateSyntaxError as exc:
            raise PromptError(
                f"prompt template {name}/{which}.j2 line {exc.lineno}: {exc.message}"
            ) from exc
    return Prompts(name=name, templates=templates, tools=_tool_texts(name, folder / "tools.yaml"))
