"""Validating tasks: the gold patch must resolve, no patch must not, and the tests must be stable.

For each instance, in one sandbox reset between runs, :func:`check_task` evaluates the gold patch
and no patch ``runs`` times each. An instance passes when

- every gold run is resolved (the patch applies, every FAIL_TO_PASS test passes, every
  PASS_TO_PASS test is kept),
- no run without a patch is resolved,
- no listed test changes status between runs of the same patch (a flaky test makes the reward
  noise), and
- nothing failed in the harness (an instance that could not be checked is not valid), and
- every run graded something: a run that selected no test, or reported none (the runner is
  missing, a usage error, a conftest that does not import), is an ``environment-error``, shown
  with its exit code and the tail of its log, never ``unresolved``.

Findings that do not make an instance invalid but say its lists are off are kept as warnings:
a FAIL_TO_PASS test that already passes without the fix, a PASS_TO_PASS test that fails without
it.

This module is what ``crl tasks check`` runs; it imports only the task loaders, the harness and
the sandbox registry (no Kubernetes client).
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from crl_worker.errors import CrlError, InfrastructureError
from crl_worker.harness.classify import grade_answer
from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.grading import KEPT, PASSING
from crl_worker.harness.integrity import grade_candidate
from crl_worker.harness.result import EvalResult, TestStatus
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: Makes a sandbox for a task (a pool's own sandboxes), instead of the sandbox registry.
SandboxMaker = Callable[[Task], Sandbox]

Verdict = Literal[
    "resolved", "unresolved", "patch-failed", "environment-error", "error", "mixed", "not-run"
]


@dataclass
class InstanceCheck:
    """What checking one instance found."""

    instance_id: str
    gold: list[EvalResult] = field(default_factory=list)
    """One result per run with the gold patch."""
    no_patch: list[EvalResult] = field(default_factory=list)
    """One result per run without a patch."""
    flaky: list[str] = field(default_factory=list)
    """Listed tests whose status changed between runs of the same patch."""
    problems: list[str] = field(default_factory=list)
    """Why the instance is not valid (empty: valid)."""
    warnings: list[str] = field(default_factory=list)
    """Findings that do not make it invalid."""
    confirmed: list[EvalResult] = field(default_factory=list)
    """The gold patch graded once more as an episode's resolved verdict is confirmed (a
    pristine sandbox, only its source changes, canaries), when asked (``integrity``)."""
    patch_label: str = "gold"
    """What ``gold`` holds: the gold patch, or a ``candidate`` patch graded through the
    integrity path (:func:`crl_worker.harness.integrity.grade_candidate`)."""

    @property
    def ok(self) -> bool:
        """The instance passed validation."""
        return not self.problems

    @property
    def gold_verdict(self) -> Verdict:
        """Summary of the gold runs."""
        return _verdict(self.gold)

    @property
    def no_patch_verdict(self) -> Verdict:
        """Summary of the runs without a patch."""
        return _verdict(self.no_patch)

    @property
    def integrity_verdict(self) -> Verdict:
        """Summary of the gold patch's runs through the integrity check (``not-run`` unless
        asked)."""
        return _verdict(self.confirmed)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (per-test outcomes of each run included, logs left out)."""

        def runs(results: Sequence[EvalResult]) -> list[dict[str, Any]]:
            out = []
            for r in results:
                run = r.model_dump(mode="json", exclude={"log", "instance_id"})
                if r.environment_error is not None:
                    run["log_tail"] = r.log_tail()
                out.append(run)
            return out

        return {
            "instance_id": self.instance_id,
            "ok": self.ok,
            "patch": self.patch_label,
            "gold": self.gold_verdict,
            "no_patch": self.no_patch_verdict,
            "flaky": self.flaky,
            "problems": self.problems,
            "warnings": self.warnings,
            "gold_runs": runs(self.gold),
            "no_patch_runs": runs(self.no_patch),
            "integrity": self.integrity_verdict,
            "integrity_runs": runs(self.confirmed),
        }


def _verdict(results: Sequence[EvalResult]) -> Verdict:
    if not results:
        return "not-run"
    kinds: set[Verdict] = set()
    for r in results:
        if r.environment_error is not None:
            kinds.add("environment-error")
        elif r.infrastructure_error is not None:
            kinds.add("error")
        elif not r.patch_applied:
            kinds.add("patch-failed")
        else:
            kinds.add("resolved" if r.resolved else "unresolved")
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _statuses(result: EvalResult) -> dict[str, TestStatus]:
    return {o.name: o.status for o in [*result.fail_to_pass, *result.pass_to_pass]}


def flaky_tests(results: Sequence[EvalResult]) -> list[str]:
    """Listed tests whose status differs between runs (runs with a harness error left out)."""
    graded = [_statuses(r) for r in results if r.infrastructure_error is None and r.patch_applied]
    if len(graded) < 2:
        return []
    names = dict.fromkeys(name for statuses in graded for name in statuses)
    return [n for n in names if len({s.get(n, TestStatus.MISSING) for s in graded}) > 1]


def _failing(result: EvalResult, most: int = 20) -> str:
    """The listed tests that kept ``result`` from resolving, with their statuses."""
    failing = [o for o in result.fail_to_pass if o.status not in PASSING] + [
        o for o in result.pass_to_pass if o.status not in KEPT
    ]
    return ", ".join(f"{o.name} ({o.status.value})" for o in failing[:most])


def judge(check: InstanceCheck, task: Task) -> InstanceCheck:
    """Fill ``flaky``, ``problems`` and ``warnings`` from the runs (pure)."""
    gold = check.patch_label
    for label, results in ((gold, check.gold), ("no patch", check.no_patch)):
        for r in results:
            if r.environment_error is not None:
                tail = r.log_tail(12)
                check.problems.append(
                    f"{label}: environment error: {r.environment_error}"
                    + (f"; log tail:\n{tail}" if tail else "")
                )
            elif r.infrastructure_error is not None:
                check.problems.append(f"{label}: harness error: {r.infrastructure_error}")
    flaky = dict.fromkeys([*flaky_tests(check.gold), *flaky_tests(check.no_patch)])
    check.flaky = list(flaky)
    if check.flaky:
        check.problems.append(f"flaky tests: {', '.join(check.flaky)}")

    for r in check.gold:
        if r.infrastructure_error is not None:
            continue
        if not r.patch_applied:
            check.problems.append(f"{gold}: the {gold} patch does not apply")
        elif not r.resolved:
            if r.tampered is not None or (r.stripped and not r.fail_to_pass):
                why = r.tampered or "no source change left: " + ", ".join(r.stripped)
                check.problems.append(f"{gold}: not resolved ({why})")
                continue
            check.problems.append(f"{gold}: not resolved; failing: {_failing(r)}")
    for r in check.confirmed:
        if r.environment_error is not None or r.infrastructure_error is not None:
            error = r.environment_error or r.infrastructure_error
            check.problems.append(f"{gold} through the integrity check: error: {error}")
        elif not r.resolved:
            why = r.tampered or (
                "no source change left: " + ", ".join(r.stripped)
                if r.stripped and not r.fail_to_pass
                else "failing: " + _failing(r)
            )
            check.problems.append(
                f"{gold} through the integrity check: not resolved ({why}); an episode's correct"
                " answer would be graded 0 here"
            )
    for r in check.no_patch:
        if r.infrastructure_error is None and r.resolved:
            check.problems.append(
                "no patch: resolved without the fix (the FAIL_TO_PASS tests do not test it)"
            )
    if not task.fail_to_pass and task.task_type != "classify":
        check.problems.append("the task lists no FAIL_TO_PASS tests")

    clean = [r for r in check.no_patch if r.infrastructure_error is None]
    if clean:
        already = [o.name for o in clean[0].fail_to_pass if o.status in PASSING]
        if already:
            check.warnings.append(
                "FAIL_TO_PASS tests that pass without the fix: " + ", ".join(already[:20])
            )
        broken = [o.name for o in clean[0].pass_to_pass if o.status not in KEPT]
        if broken:
            check.warnings.append(
                "PASS_TO_PASS tests that fail without the fix: " + ", ".join(broken[:20])
            )
    # The same message once, even when every run said it.
    check.problems = list(dict.fromkeys(check.problems))
    return check


async def check_task(
    task: Task,
    *,
    runs: int = 1,
    sandbox_config: BaseModel | Mapping[str, Any] | None = None,
    timeout: float | None = None,
    candidate: str | None = None,
    sandboxes: SandboxMaker | None = None,
    integrity: bool = False,
) -> InstanceCheck:
    """Evaluate ``task`` with its gold patch and with none, ``runs`` times each, and judge it.

    With ``integrity``, the gold patch is also graded ``runs`` times as an episode's resolved
    verdict is confirmed (:func:`~crl_worker.harness.integrity.grade_candidate`): a false alarm there (the
    canaries, the source-only diff) makes the instance invalid, since a correct answer to it
    would be graded 0.

    With a ``candidate`` patch, that patch takes the gold patch's place and each of its runs is
    graded as an episode's resolved verdict is confirmed: in a pristine sandbox of its own, only
    its source changes, canary tests in the run
    (:func:`~crl_worker.harness.integrity.grade_candidate`).

    A classify task has neither: its sandbox must start (the repository at its commit), the
    location it names must be a file there, and its label must grade as resolved while no
    answer grades as unresolved (:func:`check_classify_task`).

    Sandboxes come from ``sandboxes`` when given (a pool validating on its own sandboxes),
    else from ``sandbox_config`` through the sandbox registry."""

    def make(task: Task) -> Sandbox:
        return sandboxes(task) if sandboxes is not None else create_sandbox(sandbox_config, task)

    check = InstanceCheck(
        instance_id=task.instance_id, patch_label="gold" if candidate is None else "candidate"
    )
    if task.task_type == "classify":
        return await check_classify_task(task, check, sandbox_config, sandboxes)
    if candidate is None and not task.patch.strip():
        check.problems.append("the task has no gold patch to check")
        return check
    try:
        if candidate is not None:
            for run in range(runs):
                logger.info("%s: run %d, candidate", task.instance_id, run + 1)
                async with make(task) as pristine:
                    check.gold.append(
                        await grade_candidate(pristine, task, candidate, timeout=timeout)
                    )
        sandbox = make(task)
        async with sandbox:
            patches: list[tuple[str, str | None]] = [("no patch", None)]
            if candidate is None:
                patches.insert(0, ("gold", task.patch))
            for run in range(runs):
                for number, (label, patch) in enumerate(patches):
                    if run or number:
                        await sandbox.reset()
                    logger.info("%s: run %d, %s", task.instance_id, run + 1, label)
                    result = await evaluate(sandbox, task, model_patch=patch, timeout=timeout)
                    (check.gold if patch else check.no_patch).append(result)
        # As many runs as the others: the canaries are drawn again for each.
        for run in range(runs if integrity and candidate is None else 0):
            logger.info("%s: run %d, gold through the integrity check", task.instance_id, run + 1)
            async with make(task) as pristine:
                check.confirmed.append(
                    await grade_candidate(pristine, task, task.patch, timeout=timeout)
                )
    except InfrastructureError as exc:
        check.problems.append(f"sandbox: {exc}")
    except CrlError as exc:
        check.problems.append(f"error: {exc}")
    except OSError as exc:
        # Provisioning on this machine (disk full, a missing tool): this instance's problem,
        # not a reason to stop checking the others.
        check.problems.append(f"sandbox: {exc}")
    return judge(check, task)


def location_path(location: str | None) -> str | None:
    """The file part of a classify task's location (``path``, ``path:12``, ``path::func``)."""
    if not location:
        return None
    path = location.split("::", 1)[0]
    head, _, tail = path.rpartition(":")
    return head if head and tail.isdigit() else path


async def check_classify_task(
    task: Task,
    check: InstanceCheck,
    sandbox_config: BaseModel | Mapping[str, Any] | None,
    sandboxes: SandboxMaker | None = None,
) -> InstanceCheck:
    """The checks of a classify task (see :func:`check_task`)."""
    assert task.classification is not None
    try:
        sandbox = sandboxes(task) if sandboxes is not None else create_sandbox(sandbox_config, task)
        async with sandbox:
            path = location_path(task.classification.location)
            if path is not None:
                found = await sandbox.run(f"test -f {shlex.quote(path)}", timeout=60)
                if found.exit_code != 0:
                    check.problems.append(
                        f"the location {task.classification.location!r} names no file of the "
                        f"repository at {task.base_commit}"
                    )
    except (CrlError, OSError) as exc:
        check.problems.append(f"sandbox: {exc}")
        return check
    check.gold.append(grade_answer(task, task.classification.cwe, "the label"))
    check.no_patch.append(grade_answer(task, None))
    return judge(check, task)


async def check_tasks(
    tasks: Sequence[Task],
    *,
    runs: int = 1,
    jobs: int = 1,
    sandbox_config: BaseModel | Mapping[str, Any] | None = None,
    timeout: float | None = None,
    progress: Callable[[InstanceCheck], None] | None = None,
    candidate: str | None = None,
    sandboxes: SandboxMaker | None = None,
    integrity: bool = False,
) -> list[InstanceCheck]:
    """Check several tasks, ``jobs`` at a time (with a ``candidate`` patch instead of each
    gold patch, and sandboxes from ``sandboxes``, see :func:`check_task`); results in the
    tasks' order."""
    gate = asyncio.Semaphore(max(1, jobs))

    async def one(task: Task) -> InstanceCheck:
        async with gate:
            found = await check_task(
                task,
                runs=runs,
                sandbox_config=sandbox_config,
                timeout=timeout,
                candidate=candidate,
                sandboxes=sandboxes,
                integrity=integrity,
            )
        if progress is not None:
            progress(found)
        return found

    return list(await asyncio.gather(*(one(t) for t in tasks)))
