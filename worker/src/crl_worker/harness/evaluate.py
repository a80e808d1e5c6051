"""The evaluation engine: grade a repository instance in the sandbox the agent worked in.

One call of :func:`evaluate` does, in the sandbox's own shell session:

1. apply the model's patch when one is given (when the agent edited the files itself, none);
2. reset every file the test patch touches to the base commit (the agent may have edited the
   tests, or created a file the test patch adds), then apply the test patch;
3. run ``TestSpec.pre`` and the test command, with ``{tests}`` replaced by the selected test
   files or ids (:func:`crl_worker.tasks.selection.test_arguments`);
4. parse the output (or the JUnit XML reports, read through the sandbox), grade it against
   FAIL_TO_PASS and PASS_TO_PASS, and return an :class:`EvalResult`.

Who is at fault decides the result. A model patch that does not apply is the model's answer:
``patch_applied=False``, not resolved. The sandbox dying, the test run outliving its time limit,
or a test patch that does not apply to its own base files is not an answer at all:
``infrastructure_error`` is set and rewards leave the rollout out. Neither is a test run that
graded nothing: no test selected (the command is then not run: most runners given no arguments
run the whole suite), or a run that reported no test at all (runner not found, exit 127; a usage
error or a conftest that does not import, pytest's exit 4; nothing collected, exit 5; test
modules that do not import, pytest's exit 2, whose only entries are those modules).
``environment_error`` says what happened, with the exit code, and ``infrastructure_error`` is set
too: the environment, not the answer, failed. Unless the candidate did it: when the working tree
holds changes beyond the test files, the tests run again at the sandbox's base state, and if
they report tests there the run that reported none is graded as the candidate's answer.

Patches go through ``git apply`` first and ``patch --fuzz`` second (a model's diff often has
slightly wrong line numbers or context), as SWE-bench's harness does.
"""

from __future__ import annotations

import logging
import shlex
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from crl_worker.errors import InfrastructureError
from crl_worker.harness import seals
from crl_worker.harness.canary import (
    Canary,
    derive_canary,
    make_canary,
    native_language,
    plant,
    read_test_modules,
    restore_ids,
    selected_modules,
    tampered,
    with_canary,
)
from crl_worker.harness.diffsplit import DiffError, parse_diff
from crl_worker.harness.diffsplit import touched_files as touched_files
from crl_worker.harness.grading import Grade, grade
from crl_worker.harness.marks import expected_statuses
from crl_worker.harness.native import OLD_TOOLCHAIN, hardened_run, settle
from crl_worker.harness.native import harden as harden_native
from crl_worker.harness.parsers import junit_durations, parse_junit_reports, parse_log
from crl_worker.harness.result import EvalResult, TestStatus
from crl_worker.harness.runner import (
    HARDENED_FORMATS,
    Probe,
    collect,
    cross_check,
    environment_plugins,
    harden,
    install,
)
from crl_worker.harness.steps import STEP_TIMEOUT as STEP_TIMEOUT
from crl_worker.harness.steps import (
    clear_junit_reports,
    in_workdir,
    read_junit_reports,
    step,
)
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task
from crl_worker.tasks.selection import test_arguments

logger = logging.getLogger(__name__)

#: Output kept from the test command for parsing (bytes); the result keeps less (LOG_CAP).
TEST_OUTPUT_CAP = 32 << 20
#: Characters of the test log an EvalResult carries (head and tail kept).
LOG_CAP = 1 << 20
#: ``patch`` fuzz factor of the fallback (SWE-bench's harness uses 5 too).
FUZZ = 5


class PatchError(Exception):
    """A patch did not apply; the message holds the tools' output."""


def cap_log(text: str, limit: int = LOG_CAP) -> str:
    """``text`` cut to ``limit`` characters, keeping the beginning and (mostly) the end."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters dropped ...]\n{text[-tail:]}"


@dataclass
class _Run:
    """Log of the harness's steps, kept for the result."""

    parts: list[str]

    def add(self, title: str, text: str) -> None:
        self.parts.append(f">>> {title}\n{text.rstrip()}\n" if text.strip() else f">>> {title}\n")


async def apply_patch(sandbox: Sandbox, patch: str, *, name: str) -> str:
    """Apply ``patch`` in the sandbox's workdir (``git apply``, then ``patch --fuzz``).

    Returns the tools' output; raises :class:`PatchError` when neither applies it (the
    working tree is left as it was: ``patch`` runs a dry run first).
    """
    if not patch.endswith("\n"):
        # A diff cut before its last newline is "corrupt" to git apply.
        patch += "\n"
    # Inside the git directory: relative to the workdir on every backend, and invisible to
    # ``git status`` and ``git diff``.
    path = f".git/crl-eval-{uuid.uuid4().hex}-{name}.patch"
    await sandbox.write_file(path, patch.encode("utf-8"))
    quoted = shlex.quote(path)
    try:
        code, out = await step(sandbox, f"git apply --verbose --whitespace=nowarn {quoted}")
        if code == 0:
            return out
        patch_cmd = f"patch --batch --forward --fuzz={FUZZ} -p1 -i {quoted}"
        dry_code, dry_out = await step(sandbox, f"{patch_cmd} --dry-run")
        if dry_code != 0:
            raise PatchError(f"git apply:\n{out.rstrip()}\npatch --dry-run:\n{dry_out.rstrip()}")
        code, patch_out = await step(sandbox, patch_cmd)
        if code != 0:
            raise PatchError(f"git apply:\n{out.rstrip()}\npatch:\n{patch_out.rstrip()}")
        return f"{out.rstrip()}\n(applied by patch --fuzz={FUZZ})\n{patch_out}"
    finally:
        await step(sandbox, f"rm -f {quoted}")


async def reset_files(sandbox: Sandbox, files: Sequence[str], base_commit: str) -> str:
    """Return ``files`` to their base-commit state: restore the ones the base has, delete the
    others (a file the test patch adds may already exist if the agent created it)."""
    if not files:
        return ""
    rev = shlex.quote(base_commit)
    script = [
        # The image may lack the commit object (a squashed export): its HEAD is the base then.
        f'__crl_rev={rev}; git cat-file -e "$__crl_rev^{{commit}}" 2>/dev/null || __crl_rev=HEAD',
        "for __crl_f in " + " ".join(shlex.quote(f) for f in files) + "; do",
        '  if git cat-file -e "$__crl_rev:$__crl_f" 2>/dev/null; then',
        '    git checkout -q "$__crl_rev" -- "$__crl_f" || exit 1',
        '  else rm -f -- "$__crl_f"; fi',
        "done",
    ]
    code, out = await step(sandbox, "(\n" + "\n".join(script) + "\n)")
    if code != 0:
        raise InfrastructureError(f"could not reset the test files to {base_commit}: {out[-2000:]}")
    return out


class NothingSelectedError(ValueError):
    """The test command takes ``{tests}`` but the task selects none."""


def build_test_command(task: Task) -> str:
    """``task.test_spec.command`` with ``{tests}`` replaced by the selected tests, shell-quoted.

    Raises :class:`NothingSelectedError` when the command has ``{tests}`` and nothing is selected:
    run without arguments, most runners would run the whole suite.
    """
    command = task.test_spec.command
    if "{tests}" not in command:
        return command
    arguments = test_arguments(task)
    if not arguments:
        raise NothingSelectedError(
            f"no tests selected for {{tests}} (select: {task.test_spec.select}): the test patch "
            "touches no test file and the FAIL_TO_PASS/PASS_TO_PASS ids name none; the command "
            "was not run (without arguments it would run the whole suite)"
        )
    return command.replace("{tests}", " ".join(shlex.quote(a) for a in arguments))


#: What an exit status means when the run reported no tests (any runner).
_EXIT_MEANINGS = {126: "the command is not executable", 127: "command not found",
                  OLD_TOOLCHAIN: "the toolchain is older than the integrity check needs"}  # fmt: skip
#: pytest's exit statuses (``pytest.ExitCode``).
_PYTEST_EXIT_MEANINGS = {
    1: "tests failed, yet none was reported (a wrong log format?)",
    2: "interrupted (errors while collecting)",
    3: "internal error",
    4: "usage error: a bad option, or a conftest.py that does not import",
    5: "no tests collected",
}


def no_tests_reason(exit_code: int | None, log_format: str) -> str:
    """Why a run that reported no test probably failed, from its exit status."""
    meaning = _EXIT_MEANINGS.get(exit_code) if exit_code is not None else None
    if meaning is None and log_format == "pytest" and exit_code is not None:
        meaning = _PYTEST_EXIT_MEANINGS.get(exit_code)
    return f"exit {exit_code}" + (f": {meaning}" if meaning else "")


def reported_no_test(
    statuses: Mapping[str, TestStatus], exit_code: int | None, log_format: str
) -> bool:
    """Whether a run's statuses name no test that ran.

    Besides an empty report: pytest's exit 2 ("Interrupted: N errors during collection") runs
    nothing, and its only entries are the modules that did not import (``ERROR tests/test_x.py``,
    no ``::``). A test module whose imports fail in this environment (psf__requests-863) is an
    environment error, not an answer whose every test is missing.
    """
    if not statuses:
        return True
    return (
        log_format == "pytest"
        and exit_code == 2
        and all(s is TestStatus.ERROR and "::" not in name for name, s in statuses.items())
    )


def _result(
    task: Task,
    started: float,
    run: _Run,
    *,
    graded: Grade | None = None,
    patch_applied: bool = True,
    infrastructure_error: str | None = None,
    test_command: str = "",
    exit_code: int | None = None,
    tests_timed_out: bool = False,
    environment_error: str | None = None,
    tampered_with: str | None = None,
) -> EvalResult:
    if environment_error is not None:
        infrastructure_error = f"environment error: {environment_error}"
    # A tampered run's outcomes are the tamperer's: no credit, not even partial.
    credited = graded if tampered_with is None else None
    return EvalResult(
        instance_id=task.instance_id,
        resolved=credited is not None
        and credited.resolved
        and patch_applied
        and infrastructure_error is None,
        fail_to_pass=graded.fail_to_pass if graded else [],
        pass_to_pass=graded.pass_to_pass if graded else [],
        fail_to_pass_fraction=credited.fail_to_pass_fraction if credited else 0.0,
        pass_to_pass_fraction=credited.pass_to_pass_fraction if credited else 0.0,
        tampered=tampered_with,
        patch_applied=patch_applied,
        infrastructure_error=infrastructure_error,
        environment_error=environment_error,
        tests_timed_out=tests_timed_out,
        test_command=test_command,
        exit_code=exit_code,
        duration=time.monotonic() - started,
        log=cap_log("\n".join(run.parts)),
    )


@dataclass
class _TestRun:
    """What one run of the test command reported."""

    exit_code: int | None
    timed_out: bool
    statuses: dict[str, TestStatus]
    durations: dict[str, float]
    #: The command run (with the canary's ids, through the harness's reporter).
    command: str = ""
    #: The canary planted, if any.
    canary: Canary | None = None
    #: FAIL_TO_PASS ids the task's own test files mark skipped or expected to fail.
    expected: dict[str, frozenset[TestStatus]] = field(default_factory=dict)
    #: Why the runner's own report says the run cannot be trusted.
    tampered: str | None = None


async def _plant_canary(
    sandbox: Sandbox, task: Task, run: _Run, sources: dict[str, str]
) -> Canary | None:
    planted = derive_canary(task, sources) or make_canary(task)
    if planted is None:
        return None
    await plant(sandbox, planted)
    how = f"copies of {', '.join(planted.sources)}" if planted.sources else "synthetic"
    run.add(f"canary tests planted in {planted.path} ({how}): {', '.join(planted.ids)}", "")
    return planted


async def _run_tests(
    sandbox: Sandbox,
    task: Task,
    run: _Run,
    limit: float,
    *,
    canary: bool = False,
) -> _TestRun:
    """Steps 2 to 4 on the working tree as it is: test files reset and patched (and canaries
    planted, the run made through the harness's reporter: ``canary``), stale reports removed,
    ``pre`` and the test command run, the output (or reports) parsed."""
    if task.test_patch.strip():
        # The hidden tests (a repair task's test patch as much as an implement task's) are
        # about to sit next to the candidate's code while it runs: it could copy them where a
        # reset does not reach (the home folder, /tmp, the environment, git's objects), for a
        # later episode of this task in a reused sandbox to build its answers from.
        sandbox.mark_dirty()
        files = touched_files(task.test_patch)
        run.add("reset test files", await reset_files(sandbox, files, task.base_commit))
        try:
            run.add("test patch", await apply_patch(sandbox, task.test_patch, name="test"))
        except PatchError as exc:
            # Its files were just reset to the base: the task itself is broken.
            raise InfrastructureError(
                f"the test patch of {task.instance_id} does not apply to its base files: "
                f"{str(exc)[-2000:]}"
            ) from exc
    sources = await read_test_modules(sandbox, task)
    expected = expected_statuses(sources, task.fail_to_pass)
    planted = await _plant_canary(sandbox, task, run, sources) if canary else None
    in_run = task if planted is None else with_canary(task, planted)
    test_command = build_test_command(in_run)
    probe: Probe | None = None
    command = test_command
    recorder: Probe | None = None
    if canary and task.test_spec.log_format in seals.APPENDED_FORMATS:
        # A folder outside the repository for the records of the recorder the modules carry.
        recorder = await install(sandbox, [])
    # Only the integrity check's run is sealed (the fast path reads no test module for it).
    report_path = recorder.report if recorder is not None else None
    sealed = seals.plan(in_run, sources, planted, report_path) if canary else seals.Seals("")
    if recorder is not None:
        await seals.write(sandbox, sealed, run.add)
    if canary and task.test_spec.log_format in HARDENED_FORMATS:
        probe = await install(sandbox, [*sources, *selected_modules(task)], sealed.name)
        plugins = list(task.test_spec.plugins)
        if task.test_spec.log_format == "pytest":
            plugins += await environment_plugins(sandbox, test_command)
        hardened = harden(test_command, task.test_spec.log_format, probe, plugins)
        if hardened is None:
            logger.info("%s: the test command is not one the reporter knows", task.instance_id)
        command = hardened or test_command
        if hardened is not None:  # the recorder is there to call
            await seals.write(sandbox, sealed, run.add)
    native = canary and native_language(task) is not None
    if native:
        hidden = touched_files(task.test_patch)
        command = harden_native(test_command, task.test_spec.log_format, hidden) or test_command
    if task.test_spec.log_format == "junit":
        stale = await clear_junit_reports(sandbox, task.test_spec.junit_reports)
        run.add(f"stale junit reports removed: {stale}", "")
    for pre in task.test_spec.pre:
        code, out = await step(sandbox, pre)
        run.add(f"pre: {pre} (exit {code})", out)
    result = await sandbox.run(
        in_workdir(sandbox, command), timeout=limit, max_output=TEST_OUTPUT_CAP
    )
    run.add(f"tests: {command} (exit {result.exit_code})", result.output)
    tests = _TestRun(result.exit_code, result.timed_out, {}, {}, command, planted, expected)
    if result.timed_out:
        return tests
    if result.truncated:
        logger.warning(
            "%s: test output beyond %d bytes was dropped; tests in the gap count as missing",
            task.instance_id,
            TEST_OUTPUT_CAP,
        )
    if task.test_spec.log_format == "junit":
        reports = await read_junit_reports(sandbox, task.test_spec.junit_reports)
        run.add(f"junit reports: {len(reports)}", "")
        tests.statuses, tests.durations = parse_junit_reports(reports), junit_durations(reports)
    else:
        tests.statuses = parse_log(task.test_spec.log_format, result.output)
    if native:
        fmt = task.test_spec.log_format
        own = hardened_run(test_command, command, fmt)
        tests.statuses, tests.tampered = settle(
            tests.statuses, result.output, fmt, in_run, planted, hardened=own
        )
    if probe is not None and command != test_command:
        report = await collect(sandbox, probe)
        tests.tampered = cross_check(report, tests.statuses)
        for note in report.notes[:20]:
            run.add("reporter's note", note)
        # The outcomes the runner saw, not what the process printed; sealed expectations judged.
        ran = report.statuses if report.started else tests.statuses
        fmt = task.test_spec.log_format
        tests.statuses, unmet = seals.judge(sealed, ran, report.seals, fmt)
        for line in unmet[:20]:
            run.add("sealed expectation not met", line)
    if recorder is not None:
        records = (await collect(sandbox, recorder)).seals
        fmt = task.test_spec.log_format
        tests.statuses, unmet = seals.judge(sealed, tests.statuses, records, fmt, by_test=False)
        for line in unmet[:20]:
            run.add("sealed expectation not met", line)
    return _restored(tests)


def _restored(tests: _TestRun) -> _TestRun:
    """``tests`` with the task's tests the canaries renamed under the task's ids again."""
    tests.statuses = restore_ids(tests.canary, tests.statuses)
    tests.durations = restore_ids(tests.canary, tests.durations)
    return tests


async def _blame_the_candidate(
    sandbox: Sandbox, task: Task, run: _Run, limit: float, why: str, applied: str | None
) -> bool:
    """Whether a run that reported no tests is the candidate's doing, not the environment's.

    When the working tree holds changes beyond the test files, the tests run once more at the
    sandbox's base state (``reset``, then the test patch). If they report tests there, the
    candidate broke the test run (a module every test imports, a conftest.py, a runner option):
    that is its answer, graded as such (every test missing), not an environment error that
    rewards would leave out. Otherwise the environment is at fault. The sandbox is left at its
    base state with the test patch; evaluation is the last thing done in it.

    The changes are those of the working tree's diff and of ``applied`` (the model patch this
    evaluation applied), so a change that the diff does not show (a file that an ignore rule
    of the candidate's own hides) still counts, and so does a diff that cannot be read.
    """
    try:
        names = {p for c in parse_diff(await sandbox.diff()) for p in c.paths}
    except DiffError as exc:
        names = {f"(a diff that cannot be read: {exc})"}
    names.update(touched_files(applied or ""))
    if not names - set(touched_files(task.test_patch)):
        run.add(f"no control run: {why}, and nothing beyond the test files changed", "")
        return False
    run.add(f"control run: {why}; the tests run again at the base state", "")
    await sandbox.reset()
    control = await _run_tests(sandbox, task, run, limit)
    if control.timed_out or reported_no_test(
        control.statuses, control.exit_code, task.test_spec.log_format
    ):
        return False
    run.add(
        "control run reported tests: the changes broke the test run (graded as the answer)",
        "",
    )
    logger.info("%s: %s only with the candidate's changes", task.instance_id, why)
    return True


async def evaluate(
    sandbox: Sandbox,
    task: Task,
    *,
    model_patch: str | None = None,
    timeout: float | None = None,
    canary: bool = False,
) -> EvalResult:
    """Grade ``task`` in ``sandbox`` (the one the agent used, or a fresh one).

    ``model_patch`` is applied first when given; leave it out when the agent's edits are already
    in the working tree. ``timeout`` bounds the test run (default ``task.timeouts.test``);
    running past it is an infrastructure error. ``canary`` (the integrity check's run) plants
    failing copies of the task's own tests among them (:mod:`crl_worker.harness.canary`) and
    runs pytest and unittest through the harness's reporter (:mod:`crl_worker.harness.runner`),
    Go, Rust and C++ as a binary without its test sources (:mod:`crl_worker.harness.native`):
    if a canary is not reported failing, or the reporter's cross-checks fail, the run was
    tampered with, and the result says so (``tampered``, unresolved, no credit).
    Never raises for a failed evaluation: the result says what happened.
    """
    started = time.monotonic()
    run = _Run(parts=[])
    test_command = ""
    try:
        if not sandbox.alive:
            raise InfrastructureError("the sandbox is not running")
        if model_patch is not None and model_patch.strip():
            try:
                run.add("model patch", await apply_patch(sandbox, model_patch, name="model"))
            except PatchError as exc:
                run.add("model patch does not apply", str(exc))
                logger.info("%s: the model's patch does not apply", task.instance_id)
                return _result(task, started, run, patch_applied=False)

        try:
            test_command = build_test_command(task)
        except NothingSelectedError as exc:
            logger.warning("%s: %s", task.instance_id, exc)
            run.add("nothing to run", str(exc))
            return _result(task, started, run, environment_error=str(exc))
        limit = timeout if timeout is not None else task.timeouts.test
        tests = await _run_tests(sandbox, task, run, limit, canary=canary)
        test_command = tests.command
        if tests.timed_out:
            return _result(
                task,
                started,
                run,
                infrastructure_error=f"the test run timed out after {limit:.0f}s",
                test_command=test_command,
                tests_timed_out=True,
            )
        statuses, durations = tests.statuses, tests.durations
        if reported_no_test(statuses, tests.exit_code, task.test_spec.log_format) and (
            task.test_spec.log_format != "junit" or tests.exit_code in _EXIT_MEANINGS
        ):
            # A Java build that fails before writing reports is left to grading (every test
            # MISSING: not resolved): a candidate patch that does not compile is a wrong answer.
            why = "the test run reported no tests ("
            why += no_tests_reason(tests.exit_code, task.test_spec.log_format) + ")"
            if not await _blame_the_candidate(sandbox, task, run, limit, why, model_patch):
                logger.warning("%s: %s", task.instance_id, why)
                return _result(
                    task,
                    started,
                    run,
                    test_command=test_command,
                    exit_code=tests.exit_code,
                    environment_error=why,
                )
        graded = grade(
            statuses,
            task.fail_to_pass,
            task.pass_to_pass,
            durations=durations,
            expected=tests.expected,
        )
        # A run that reported nothing (graded after the control run) has no canary to read.
        planted = tests.canary
        why_tampered = tampered(planted, statuses) if planted and statuses else None
        if tests.tampered is not None:
            why_tampered = "; ".join(w for w in (tests.tampered, why_tampered) if w)
        if why_tampered is not None:
            run.add("tampered", why_tampered)
            logger.warning("%s: %s", task.instance_id, why_tampered)
        return _result(
            task,
            started,
            run,
            graded=graded,
            test_command=test_command,
            exit_code=tests.exit_code,
            tampered_with=why_tampered,
        )
    except (InfrastructureError, OSError) as exc:
        logger.warning("%s: evaluation failed in the harness: %s", task.instance_id, exc)
        run.add("infrastructure error", str(exc))
        return _result(
            task,
            started,
            run,
            infrastructure_error=str(exc) or type(exc).__name__,
            test_command=test_command,
        )
