"""One task model for every benchmark: the SWE-bench fields plus what a general harness needs.

Loaders (``crl_worker.tasks.loaders``) turn each benchmark's records into :class:`Task`. The
harness reads everything it needs at run time from here: where the repository comes from, how the
environment is provisioned, how tests are selected and run, and how their output is parsed.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from crl_worker.api.common import TaskType
from crl_worker.errors import CrlError

Language = Literal["python", "java", "javascript", "go", "rust", "cpp", "other"]
LogFormat = Literal["pytest", "unittest", "sympy", "django", "junit", "go", "cargo", "jest"]
#: The ``jest`` log format: the line a test command prints (with Jest's exit status) before it
#: prints Jest's ``--json`` report; the parser reads the report after the last such line.
JEST_REPORT_MARKER = "@@crl-jest-report@@"

#: Every task type, in the order the docs list them.
TASK_TYPES: tuple[str, ...] = get_args(TaskType)


class Timeouts(BaseModel):
    """Time limits, in seconds, of the harness steps for one instance."""

    model_config = ConfigDict(extra="forbid")

    setup: float = Field(default=1800, gt=0)
    """Provisioning: clone, environment, install commands."""
    test: float = Field(default=1800, gt=0)
    """One evaluation test run (FAIL_TO_PASS and PASS_TO_PASS together)."""
    command: float = Field(default=180, gt=0)
    """Default limit of one command the agent runs."""


class TestSpec(BaseModel):
    """How the instance's tests are run and how their output is read."""

    __test__ = False  # not a pytest test class
    model_config = ConfigDict(extra="forbid")

    command: str
    """Shell command run in the workdir; ``{tests}`` is replaced by the selected test files or
    ids, shell-quoted and space-separated (e.g. ``pytest -rA {tests}``)."""
    log_format: LogFormat
    """Parser for the command's output (``junit`` reads the report files instead)."""
    select: Literal["files", "ids"] = "files"
    """What ``{tests}`` receives: the test files the test patch touches (SWE-bench's way), or the
    FAIL_TO_PASS and PASS_TO_PASS ids themselves."""
    junit_reports: list[str] = Field(default_factory=list)
    """Glob patterns, relative to the workdir, of JUnit XML reports (Maven Surefire, Gradle)."""
    pre: list[str] = Field(default_factory=list)
    """Commands run before the test command on each evaluation (e.g. remove stale reports)."""
    plugins: list[str] = Field(default_factory=list)
    """pytest plugins the run needs, by the name ``-p`` takes (``xdist.plugin``): the integrity
    check's run turns plugin auto-loading off and loads these, the environment's installed
    ones and any ``-p`` the command names; name here a plugin found only in the repository."""


class Classification(BaseModel):
    """The answer key of a ``classify`` task: the weakness the code holds."""

    model_config = ConfigDict(extra="forbid")

    cwe: str
    """The label, a CWE id such as ``CWE-787`` (it must be in the shipped CWE list,
    :mod:`crl_worker.tasks.cwe`)."""
    location: str | None = None
    """Where the weakness is, when known: a path in the repository, optionally with
    ``:line`` or ``::function`` (shown to the agent)."""
    cve: str | None = None
    """The CVE id of the record, when it has one (never shown to the agent)."""

    @field_validator("cwe", mode="before")
    @classmethod
    def _known_cwe(cls, value: Any) -> str:
        from crl_worker.tasks.cwe import UnknownCweError, normalise

        try:
            return normalise(value)
        except UnknownCweError as exc:
            raise ValueError(str(exc)) from None


class Task(BaseModel):
    """One repository instance: a bug and its fix, a function to implement, or code to
    classify; and how to check an answer."""

    model_config = ConfigDict(extra="forbid")

    # --- the SWE-bench fields ------------------------------------------------------------
    instance_id: str = Field(min_length=1)
    """Unique id, e.g. ``sympy__sympy-20590``."""
    repo: str = Field(min_length=1)
    """Repository as ``owner/name``."""
    base_commit: str = Field(min_length=1)
    """Commit the instance starts from."""
    patch: str = ""
    """Gold patch (unified diff) fixing the bug; empty when unknown."""
    test_patch: str = ""
    """Patch adding or changing the tests that check the fix."""
    fail_to_pass: list[str] = Field(default_factory=list)
    """Tests that fail before the fix and must pass after it."""
    pass_to_pass: list[str] = Field(default_factory=list)
    """Tests that pass before the fix and must still pass after it."""
    environment_setup_commit: str | None = None
    """Commit whose dependencies the environment is built from (SWE-bench)."""
    version: str | None = None
    """Version of the repository, which selects the environment recipe."""
    problem_statement: str = ""
    """The issue text given to the agent."""
    hints_text: str = ""
    """Comments on the issue before the fix (not shown to agents by default)."""
    created_at: str | None = None
    """When the instance's pull request was created."""

    # --- what a general harness needs ------------------------------------------------------
    language: Language = "python"
    """Language of the repository."""
    image: str | None = None
    """Container image holding the repository at ``base_commit`` with its environment
    (kubernetes and docker sandboxes)."""
    workdir: str = "/testbed"
    """Directory of the repository inside the image."""
    source: str | None = None
    """Where a local sandbox clones the repository from: a git URL or a local path. Empty:
    ``https://github.com/{repo}.git`` (or a mirror, see the local backend)."""
    python: str | None = None
    """Interpreter version a Python task needs, e.g. ``3.9`` (local sandboxes)."""
    install: list[str] = Field(default_factory=list)
    """Commands that provision the environment once, run in the workdir (local sandboxes; an
    image already holds the result)."""
    test: TestSpec | None = None
    """How the tests are run and read (required by ``repair`` and ``implement`` tasks; a
    ``classify`` task runs none)."""
    task_type: TaskType = "repair"
    """What the agent is asked to do: ``repair``, ``implement`` or ``classify``
    (docs/task-types.md)."""
    classification: Classification | None = None
    """The answer key of a ``classify`` task (required there, refused elsewhere)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of every command in the sandbox."""
    timeouts: Timeouts = Field(default_factory=Timeouts)
    """Time limits of the harness steps."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Whatever else the source record carried (difficulty, build system, ...)."""

    @model_validator(mode="after")
    def _fits_its_type(self) -> Task:
        if self.task_type == "classify":
            if self.classification is None:
                raise ValueError("a classify task needs classification (its CWE label)")
        else:
            if self.classification is not None:
                raise ValueError(
                    f"classification is only for classify tasks, not {self.task_type} ones"
                )
            if self.test is None:
                raise ValueError(f"a {self.task_type} task needs test (how its tests run)")
        return self

    @property
    def test_spec(self) -> TestSpec:
        """:attr:`test`, which a task that runs tests always has (an error otherwise)."""
        if self.test is None:
            raise CrlError(
                f"task {self.instance_id} is a {self.task_type} task: it has no tests to run"
            )
        return self.test

    @property
    def owner(self) -> str:
        """The repository's owner (before the slash)."""
        return self.repo.split("/", 1)[0]

    @property
    def name(self) -> str:
        """The repository's name (after the slash)."""
        return self.repo.split("/", 1)[-1]
