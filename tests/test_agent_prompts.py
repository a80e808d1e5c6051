"""The prompt template sets: the bundled one renders with what the agent passes, and a broken set
fails with a message that names what is wrong."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from crl_worker.agent import prompts
from crl_worker.agent.prompts import PromptError, bundled_templates, load_prompts
from crl_worker.agent.tools import TOOL_ARGUMENTS, tool_schemas
from crl_worker.tasks.model import Task, TestSpec

TASK = Task(
    instance_id="o__r-1",
    repo="o/r",
    base_commit="abc",
    problem_statement="It crashes on empty input.",
    test=TestSpec(command="pytest {tests}", log_format="pytest"),
)


def context(
    tools: list[str], task_type: str = "repair", location: str | None = None
) -> dict[str, object]:
    return {
        "task": TASK,
        "problem_statement": TASK.problem_statement,
        "repo": TASK.repo,
        "instance_id": TASK.instance_id,
        "language": TASK.language,
        "workdir": "/testbed",
        "tools": tools,
        "task_type": task_type,
        "location": location,
    }


@pytest.fixture
def templates_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point the loader at a folder of template sets made by the test."""
    monkeypatch.setattr(prompts, "TEMPLATES_DIR", tmp_path)
    load_prompts.cache_clear()
    yield tmp_path
    load_prompts.cache_clear()


def copy_default(root: Path, name: str) -> Path:
    target = root / name
    shutil.copytree(Path(prompts.__file__).parent / "templates" / "swe-default", target)
    return target


def test_bundled_set_renders_every_template() -> None:
    assert bundled_templates() == ["swe-default"]
    loaded = load_prompts("swe-default")
    everything = ["shell", "view", "edit", "submit"]
    system = loaded.render("system", **context(everything))
    assert "o/r" in system and "/testbed" in system and "call submit" in system
    assert "call submit" not in loaded.render("system", **context(["shell"]))
    assert "It crashes on empty input." in loaded.render("instance", **context(everything))
    nudge = loaded.render("no_tool_call", tools=everything, finish_reason="stop")
    assert nudge.startswith("Your answer did not call a tool.")
    assert loaded.render("tool_error", error="boom", tools=["shell"]) == (
        "Error: boom\nAvailable tools: shell."
    )
    shown = loaded.render(
        "shell_output", exit_code=2, timed_out=False, timeout="120", truncated=True, output="x"
    )
    assert shown.startswith("Exit code: 2\nThe output was too long")
    assert shown.endswith("Output:\nx")


def test_each_task_type_gets_its_own_instructions() -> None:
    """Implement and classify episodes are told what they answer and how; repair is unchanged."""
    loaded = load_prompts("swe-default")
    repair = loaded.render("instance", **context(["shell", "submit"]))
    implement = loaded.render("instance", **context(["shell", "submit"], "implement"))
    classify = loaded.render(
        "instance", **context(["shell", "classify"], "classify", "pkg/mod.py::f")
    )
    assert repair.startswith("Fix the following issue")
    assert implement.startswith("Implement the missing code") and "<specification>" in implement
    assert classify.startswith("Classify the security weakness")
    assert "The weakness is at: pkg/mod.py::f" in classify and "classify tool" in classify
    system = loaded.render("system", **context(["shell", "classify"], "classify"))
    assert "security analyst" in system and "Answer once, with the classify tool" in system
    assert "call submit" not in system
    tools = tool_schemas(["shell", "classify"], loaded)
    assert tools[1]["function"]["parameters"]["required"] == ["cwe", "reasoning"]


def test_tool_schemas_describe_every_argument() -> None:
    schemas = tool_schemas(["shell", "view", "edit", "submit"], load_prompts("swe-default"))
    for schema in schemas:
        function = schema["function"]
        parameters = function["parameters"]
        assert function["description"]
        assert parameters["additionalProperties"] is False
        assert set(parameters["properties"]) == set(TOOL_ARGUMENTS[function["name"]])
        assert all(p["description"] for p in parameters["properties"].values())
    view = schemas[1]["function"]["parameters"]
    assert view["required"] == ["path"]
    assert view["properties"]["start_line"]["type"] == "integer"


def test_unknown_set_lists_the_bundled_ones(templates_in: Path) -> None:
    copy_default(templates_in, "mine")
    copy_default(templates_in, "other")
    with pytest.raises(PromptError, match=r"unknown prompt template 'nope'.*mine, other"):
        load_prompts("nope")


def test_missing_template_is_named(templates_in: Path) -> None:
    (copy_default(templates_in, "partial") / "no_tool_call.j2").unlink()
    with pytest.raises(PromptError, match=r"'partial' has no no_tool_call\.j2"):
        load_prompts("partial")


def test_undefined_variable_is_an_error_not_an_empty_string(templates_in: Path) -> None:
    folder = copy_default(templates_in, "typo")
    (folder / "instance.j2").write_text("Fix {{ problem_statment }} in {{ repo }}.\n")
    loaded = load_prompts("typo")
    with pytest.raises(
        PromptError, match=r"instance\.j2 uses an undefined variable.*problem_statment"
    ):
        loaded.render("instance", **context(["shell"]))


def test_syntax_error_names_the_line(templates_in: Path) -> None:
    folder = copy_default(templates_in, "broken")
    (folder / "system.j2").write_text("ok\n{% if tools %}\nno end\n")
    with pytest.raises(PromptError, match=r"broken/system\.j2 line"):
        load_prompts("broken")


def test_tool_without_description_is_refused(templates_in: Path) -> None:
    folder = copy_default(templates_in, "terse")
    (folder / "tools.yaml").write_text("shell:\n  parameters:\n    command: the command\n")
    with pytest.raises(PromptError, match=r"tool 'shell' in tools\.yaml needs a description"):
        load_prompts("terse")


def test_undescribed_argument_is_refused(templates_in: Path) -> None:
    folder = copy_default(templates_in, "vague")
    (folder / "tools.yaml").write_text("shell:\n  description: run it\n  parameters: {}\n")
    with pytest.raises(ValueError, match="does not describe argument 'command' of tool 'shell'"):
        tool_schemas(["shell"], load_prompts("vague"))
