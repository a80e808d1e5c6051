"""Structured results of the evaluation engine."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class TestStatus(StrEnum):
    """Outcome of one test, as the parsers report it."""

    __test__ = False  # not a pytest test class

    PASSED = "PASSED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    XFAIL = "XFAIL"
    #: A test marked as expected to fail that passed (pytest's non-strict ``XPASS``).
    XPASS = "XPASS"
    #: The test was asked for but does not appear in the output.
    MISSING = "MISSING"


class TestOutcome(BaseModel):
    """One FAIL_TO_PASS or PASS_TO_PASS test and what happened to it."""

    __test__ = False
    model_config = ConfigDict(extra="forbid")

    name: str
    """Test id as the task names it."""
    status: TestStatus
    """What the run reported (``MISSING`` when it did not report the test)."""
    duration: float | None = None
    """Seconds, when the runner reports it."""


class EvalResult(BaseModel):
    """The harness's verdict on one instance in one sandbox."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str
    """The task's id."""
    resolved: bool
    """Every FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes."""
    fail_to_pass: list[TestOutcome] = Field(default_factory=list)
    """Each FAIL_TO_PASS test's outcome."""
    pass_to_pass: list[TestOutcome] = Field(default_factory=list)
    """Each PASS_TO_PASS test's outcome."""
    fail_to_pass_fraction: float = 0.0
    """Fraction of FAIL_TO_PASS tests that pass (1.0 when there are none)."""
    pass_to_pass_fraction: float = 0.0
    """Fraction of PASS_TO_PASS tests that pass (1.0 when there are none)."""
    patch_applied: bool = True
    """The model's patch (and the test patch) applied; ``False`` means not resolved."""
    infrastructure_error: str | None = None
    """Set when the harness itself failed (sandbox died, test run timed out): no verdict, and
    rewards must exclude the rollout instead of scoring it 0."""
    environment_error: str | None = None
    """Set when the test run graded nothing: no tests were selected, or the run reported no test
    at all (the runner is missing, a usage error, a conftest that does not import, nothing
    collected): what happened, with the exit code. ``infrastructure_error`` is set too (``environment
    error: ...``), so rewards and the benchmark runner leave the attempt out instead of scoring
    it as a wrong answer; ``crl tasks check`` shows it as the ``environment-error`` verdict."""
    tests_timed_out: bool = False
    """The test run itself outlived its timeout (``infrastructure_error`` says so too). Training
    leaves such a rollout out; the benchmark runner counts it as unresolved, as SWE-bench does."""
    test_command: str = ""
    """The command the harness ran."""
    exit_code: int | None = None
    """Exit status of the test command."""
    duration: float = 0.0
    """Seconds the evaluation took."""
    log: str = ""
    """The test run's output (capped)."""
    confirmed: bool | None = None
    """Whether a resolved verdict held when graded again in a fresh sandbox with only the
    candidate's source changes (:mod:`crl_worker.harness.integrity`); ``None`` when no such
    check ran (an unresolved verdict, or the check turned off)."""
    stripped: list[str] = Field(default_factory=list)
    """Files of the candidate's diff left out of that second grading, each as ``path (why)``:
    tests and test infrastructure (conftest.py, runner configuration, ``.pth`` files, ...),
    package metadata, new top-level modules, renames, links, binary and mode changes
    (:mod:`crl_worker.harness.diffsplit`); ``(refused: why)`` when the whole diff was."""
    answer: str | None = None
    """Classify tasks: the CWE id the agent answered with (``None``: it never called
    ``classify``, which scores 0)."""
    reasoning: str = ""
    """Classify tasks: the reasoning the agent gave with its answer."""
    credit: float | None = None
    """Classify tasks: the answer's credit along the CWE hierarchy (1 for the label itself,
    less for a related weakness, 0 otherwise; :func:`crl_worker.tasks.cwe.credit`). Rewards
    use it instead of the test fractions; ``resolved`` is the exact match."""
    tampered: str | None = None
    """Set when the test run was tampered with (a canary test the harness planted, which must
    fail, did not): the verdict is unresolved and rewards score it 0."""

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of :attr:`log`."""
        return "\n".join(self.log.rstrip().splitlines()[-lines:])
