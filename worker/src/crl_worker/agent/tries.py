"""A benchmark's second try (``agent.tries: 2``): Aider's polyglot "pass@2".

When the first try ends, :class:`SecondTry` grades it **outside** the agent's sandbox: in a
fresh sandbox from the same factory, with the candidate's diff applied and the task's own test
command (no canaries, no reporter: its output holds nothing of the harness's), then, when that
verdict is resolved or has none, by the integrity check as every episode's
(:func:`crl_worker.agent.episode.confirm_resolved`: source changes only, canaries). So the
hidden tests, the test patch, canaries and the reporter's files never enter the agent's
sandbox, and the candidate's code never runs there beside them (it could copy the tests out of
the repository, where no reset reaches). The agent's sandbox stays exactly as the agent left
it.

A first try graded unresolved (not tampered; with a verdict, tests that outlived their time
counting as one, as in the benchmark's rate) gets one user message: the test command's output of that grading (:func:`feedback_message`, at most
:data:`FEEDBACK_CAP` characters, its tail kept), and the conversation goes on in the same
sandbox for one more try, graded as any episode. Otherwise the first try's verdict is final.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable

from crl_worker.agent.loop import Feedback
from crl_worker.agent.trajectory import Trajectory
from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.integrity import needs_confirmation
from crl_worker.harness.result import EvalResult
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import JEST_REPORT_MARKER, Task

logger = logging.getLogger(__name__)

#: Characters of the test output the second try's message holds at most (the tail is kept:
#: runners print their failures and summary last).
FEEDBACK_CAP = 8000

#: Headers of the harness's log sections (``>>> title``) that end the test command's output.
_HARNESS_SECTIONS = (
    ">>> junit reports: ",
    ">>> control run",
    ">>> no control run",
    ">>> tampered",
    ">>> infrastructure error",
    ">>> reporter's note",
    ">>> tests: ",
    ">>> pre: ",
    ">>> integrity check",
)

_MESSAGE = """The tests of this task were run on your changes and they fail. Their output:

```
{output}
```

The tests are correct: do not look for them or try to change them. Fix the code so that they
pass, then submit again. This is your last try."""

_STRIPPED = """The tests of this task pass with all of your changes, but not with only your \
source changes: changes to tests and test infrastructure do not count ({stripped}). Fix the \
code itself so that the tests pass, then submit again. This is your last try."""


def may_try_again(result: EvalResult) -> bool:
    """Whether a first try graded ``result`` gets a second one: unresolved, with a verdict (no
    infrastructure or environment error; tests that outlived their time are a verdict, as the
    benchmark counts them: unresolved) and not tampered with."""
    verdict = result.infrastructure_error is None or result.tests_timed_out
    return not result.resolved and verdict and result.tampered is None


def readable(lines: list[str]) -> list[str]:
    """Test output as a person reads it: ``go test -json`` events as the text they carry
    (their ``Output``), and nothing from the jest report marker on (the machine-readable
    report the task's command prints after jest's own output)."""
    shown: list[str] = []
    for line in lines:
        if line.startswith(JEST_REPORT_MARKER):
            break
        if line.startswith('{"Time":') or line.startswith('{"Action":'):
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if isinstance(event, dict) and "Action" in event:
                output = event.get("Output")
                if isinstance(output, str):
                    shown.append(output.rstrip("\n"))
                continue
        shown.append(line)
    return shown


def failing_output(log: str, *, workdir: str = "", shown_as: str = "") -> str:
    """The test command's own output in an evaluation's ``log`` (the first ``>>> tests:``
    section's body, without its header, which holds the command; :func:`readable`), with
    ``workdir`` written as ``shown_as``, cut to its last :data:`FEEDBACK_CAP` characters.
    Empty when the log has no test run (the candidate's patch did not apply: nothing ran)."""
    lines: list[str] = []
    inside = False
    for line in log.splitlines():
        if inside and line.startswith(_HARNESS_SECTIONS):
            break
        if inside:
            lines.append(line)
        elif line.startswith(">>> tests: "):
            inside = True
    text = "\n".join(readable(lines)).strip("\n")
    if workdir and workdir != shown_as:
        text = text.replace(workdir, shown_as or ".")
    if len(text) > FEEDBACK_CAP:
        text = "[... earlier output left out ...]\n" + text[-FEEDBACK_CAP:]
    return text


def feedback_message(plain: EvalResult, final: EvalResult, *, workdir: str, shown_as: str) -> str:
    """The second try's user message: the test output of ``plain`` (the grading with the
    candidate's whole diff, without canaries), or, when that passed but the integrity check
    (``final``) did not, which of the candidate's files did not count."""
    if plain.resolved:
        return _STRIPPED.format(stripped=", ".join(final.stripped) or "none")
    output = failing_output(plain.log, workdir=workdir, shown_as=shown_as)
    if plain.tests_timed_out:
        output = f"{output}\n(the tests did not finish in time: {plain.infrastructure_error})"
    if not plain.patch_applied:
        output = "(your changes could not be applied to a clean checkout; nothing ran)"
    return _MESSAGE.format(output=output or "(the test command printed nothing)")


#: The integrity check of a verdict and its diff (:func:`~crl_worker.agent.episode.confirm_resolved`).
Confirm = Callable[[EvalResult, str], Awaitable[EvalResult]]
#: Closes a sandbox (:func:`~crl_worker.agent.episode.close_sandbox`).
Close = Callable[[Sandbox, str], Awaitable[None]]


class SecondTry:
    """The :data:`~crl_worker.agent.loop.NextTry` of one episode with ``agent.tries: 2``:
    grades the first try in fresh sandboxes and answers the second try's message, or ``None``
    when the first try's verdict is final (:attr:`final`)."""

    def __init__(
        self,
        task: Task,
        sandbox: Sandbox,
        factory: Callable[[Task], Sandbox],
        *,
        label: str,
        agent_seconds: float,
        confirm: Confirm | None,
        close: Close,
        confirm_partial: bool = False,
    ) -> None:
        self.task = task
        self.sandbox = sandbox
        self.factory = factory
        self.label = label
        #: Seconds the second try's agent gets (its evaluation's reserve kept back).
        self.agent_seconds = agent_seconds
        #: The integrity check (``None``: turned off).
        self.confirm = confirm
        #: Unresolved verdicts with passing tests are checked too (a fraction reward).
        self.confirm_partial = confirm_partial
        self.close = close
        #: Workdir of the sandbox that graded the first try (written as the agent's in output).
        self.graded_in = ""
        #: The first try's verdict once graded; with no second try, the episode's verdict.
        self.final: EvalResult | None = None
        #: Whether a second try began (its verdict is then graded as any episode's).
        self.began = False
        #: When the second try began (:func:`time.monotonic`).
        self.started: float | None = None

    async def __call__(self, trajectory: Trajectory) -> Feedback | None:
        """Grade the try that ended; the second try's :class:`Feedback`, or ``None``."""
        if self.began or self.task.task_type == "classify":
            return None
        plain, final = await self.grade(trajectory.diff)
        self.final = final
        if not may_try_again(final):
            logger.info("%s: no second try (%s)", self.label, _why_not(final))
            return None
        self.began = True
        self.started = time.monotonic()
        logger.info("%s: first try unresolved; the second try begins", self.label)
        message = feedback_message(
            plain, final, workdir=self.graded_in, shown_as=self.sandbox.workdir
        )
        deadline = self.started + self.agent_seconds
        return Feedback(message=message, evaluation=final, deadline=deadline)

    async def grade(self, diff: str) -> tuple[EvalResult, EvalResult]:
        """The first try's grading with the whole diff in a fresh sandbox, and the verdict
        (that one, or the integrity check's when it :func:`needs_confirmation`)."""
        fresh: Sandbox | None = None
        try:
            try:
                fresh = self.factory(self.task)
                await fresh.start()
            except Exception as exc:
                logger.warning("%s: the first try's sandbox did not start: %s", self.label, exc)
                error = f"the sandbox grading the first try did not start: {exc}"
                failed = EvalResult(
                    instance_id=self.task.instance_id, resolved=False, infrastructure_error=error
                )
                return failed, failed
            self.graded_in = fresh.workdir
            plain = await evaluate(
                fresh, self.task, model_patch=diff, timeout=self.task.timeouts.test
            )
        finally:
            if fresh is not None:
                await self.close(fresh, f"{self.label} (first try)")
        final = plain
        if self.confirm is not None and needs_confirmation(plain, partial=self.confirm_partial):
            final = await self.confirm(plain, diff)
        return plain, final


def first_try_resolved(trajectory: Trajectory, resolved: bool | None) -> bool | None:
    """Whether the first try of an attempt with ``agent.tries: 2`` resolved (``resolved``, the
    attempt's verdict, when there was no second try); ``None`` without the option or without
    a verdict."""
    if not trajectory.tries or resolved is None:
        return None
    first = trajectory.tries[0].evaluation
    if len(trajectory.tries) == 1 or first is None:
        return resolved
    return first.resolved


def _why_not(result: EvalResult) -> str:
    if result.resolved:
        return "resolved"
    if result.tampered is not None:
        return f"tampered: {result.tampered}"
    return f"no verdict: {result.infrastructure_error}"
