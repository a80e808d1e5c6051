"""Grading integrity: a resolved verdict is confirmed in a fresh sandbox before it counts.

The unified rollout grades in the sandbox the agent controlled, and that sandbox can lie: an
exported ``PYTEST_ADDOPTS``, a ``conftest.py`` or ``.pth`` file, an edited site-packages, a
``python`` shim on ``PATH``, a process left running that rewrites the tests. None of that can
make a failing verdict out of a passing one worth having, so an **unresolved** verdict stands as
graded (the fast path: most episodes, no extra cost). A **resolved** one is graded again:

1. in a fresh sandbox from the same factory (nothing the agent exported, installed, left
   running or wrote outside the repository is there);
2. with only the candidate's **source** changes: :func:`source_diff` leaves out tests and
   test infrastructure (listed in ``EvalResult.stripped``);
3. with canary tests planted next to the task's (:mod:`crl_worker.harness.canary`), which catch
   source code that rewrites the test framework from inside the test process.

The second grading's verdict is the result (``confirmed`` says whether it held; ``tampered``
whether the canary caught something). A run in the agent's sandbox with no verdict (an
infrastructure or environment error, which rewards leave out) is graded again the same way: the
candidate may have caused it (a runner broken outside the repository, where the control run's
reset does not reach; a git filter that makes the test patch fail to apply); if the fresh sandbox
gives a verdict, that is the answer. See docs/security.md, "Grading
integrity".
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import PurePosixPath

from crl_worker.api.contract import Env
from crl_worker.harness.evaluate import cap_log, evaluate, touched_files
from crl_worker.harness.result import EvalResult
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: File names that configure or extend the test runner, the interpreter or the build: never
#: part of a confirmed answer.
INFRASTRUCTURE_NAMES = frozenset(
    {
        # Python: pytest's configuration and plugins, interpreter start-up hooks.
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
        "sitecustomize.py",
        "usercustomize.py",
        ".coveragerc",
        # Java builds: the build decides which tests run and how failures count.
        "pom.xml",
        "build.gradle",
        "build.gradle.kts",
        "settings.gradle",
        "settings.gradle.kts",
        "gradle.properties",
    }
)
#: Suffixes of files that run code at interpreter start (``.pth``) or hold compiled code.
INFRASTRUCTURE_SUFFIXES = (".pth", ".pyc", ".pyo", ".so", ".jar", ".class")
#: Top-level directories of tests, CI and build tooling.
INFRASTRUCTURE_ROOTS = frozenset(
    {"test", "tests", "testing", ".github", ".circleci", ".mvn", "gradle", ".git"}
)
#: Test runners and their helpers that a module at the top of the repository would shadow (the
#: runner starts in the workdir, first on ``sys.path``), besides the standard library's modules.
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "nose", "nose2", "unittest2"})
_PY_TEST_NAME = re.compile(r"^(test_.*|.*_test)\.py$")
_JAVA_TEST_NAME = re.compile(r"^(Test.*|.*(Test|Tests|TestCase|IT))\.java$")
_BLOCK = re.compile(r"^diff --git ", re.MULTILINE)


def is_test_infrastructure(path: str) -> bool:
    """Whether ``path`` (relative to the repository) is a test or steers the test run."""
    p = PurePosixPath(path)
    if not p.parts:
        return False
    return (
        p.name in INFRASTRUCTURE_NAMES
        or p.name.endswith(INFRASTRUCTURE_SUFFIXES)
        or p.parts[0] in INFRASTRUCTURE_ROOTS
        or bool(_PY_TEST_NAME.match(p.name))
        or bool(_JAVA_TEST_NAME.match(p.name))
        or "src/test/" in f"{path}/"
    )


def shadows_a_module(path: str) -> bool:
    """Whether ``path`` is a module or package at the top of the repository named like a
    standard-library module or a test runner (``unittest/``, ``pytest.py``): the test command,
    started in the workdir, would import it instead."""
    p = PurePosixPath(path)
    top = p.parts[0] if len(p.parts) > 1 else p.name.removesuffix(".py")
    if len(p.parts) == 1 and p.suffix != ".py":
        return False
    return top in RUNNER_MODULES or top in sys.stdlib_module_names


def source_diff(diff: str, test_patch: str = "") -> tuple[str, list[str]]:
    """The blocks of ``diff`` (a git diff) that change source files, and the paths left out:
    every file the test patch touches, every :func:`is_test_infrastructure` path, and new files
    that :func:`shadows_a_module` (a rename counts by both names). Text before the first
    ``diff --git`` line is dropped."""
    test_files = set(touched_files(test_patch))
    starts = [m.start() for m in _BLOCK.finditer(diff)]
    kept: list[str] = []
    stripped: list[str] = []
    for start, end in zip(starts, [*starts[1:], len(diff)][: len(starts)], strict=True):
        block = diff[start:end]
        paths = touched_files(block)
        added = "\nnew file mode " in block.split("\n@@", 1)[0]
        if any(
            p in test_files or is_test_infrastructure(p) or (added and shadows_a_module(p))
            for p in paths
        ):
            stripped += [p for p in paths if p not in stripped]
        else:
            kept.append(block)
    return "".join(kept), stripped


def needs_confirmation(result: EvalResult) -> bool:
    """Whether ``result`` (graded in the agent's sandbox) must be graded again in a fresh one:
    it is resolved, or it has no verdict (an infrastructure or environment error: the agent may
    have caused it, e.g. a git filter that makes the test patch fail to apply, a runner deleted
    outside the repository). Not when nothing was selected to run: that is the task's own."""
    nothing_selected = result.environment_error is not None and not result.test_command
    return result.resolved or (result.infrastructure_error is not None and not nothing_selected)


def confirmation_enabled() -> bool:
    """Whether resolved episodes are confirmed in a fresh sandbox (``$CRL_GRADING_CONFIRM``,
    on unless ``0``, ``false``, ``no`` or ``off``)."""
    value = os.environ.get(Env.GRADING_CONFIRM, "").strip().lower()
    return value not in {"0", "false", "no", "off"}


def _no_source_change(first: EvalResult, stripped: list[str]) -> EvalResult:
    note = (
        "integrity check: no source change is left once tests and test infrastructure are "
        f"stripped ({', '.join(stripped) or 'empty diff'}): the base state fails by definition"
    )
    logger.warning("%s: %s", first.instance_id, note)
    return first.model_copy(
        update={
            "resolved": False,
            "confirmed": False,
            "stripped": stripped,
            "fail_to_pass_fraction": 0.0,
            "pass_to_pass_fraction": 0.0,
            "log": cap_log(f"{first.log}\n>>> {note}\n"),
        }
    )


async def confirm(
    sandbox: Sandbox,
    task: Task,
    first: EvalResult,
    diff: str,
    *,
    timeout: float | None = None,
) -> EvalResult:
    """Grade ``diff`` (the candidate's changes, as :meth:`Sandbox.diff` gives them) again in
    ``sandbox``, a fresh, started sandbox of the task, after a ``first`` verdict that
    :func:`needs_confirmation`.

    Only :func:`source_diff`'s blocks are applied; the test run gets canary tests. The result is
    the second grading's, with ``confirmed`` (for a resolved ``first``: whether it held),
    ``stripped``, the two durations added and both logs; an infrastructure failure of the second
    grading leaves the episode without a verdict, as any other. Never raises for a failed
    evaluation.
    """
    source, stripped = source_diff(diff, task.test_patch)
    if first.resolved and not source.strip():
        return _no_source_change(first, stripped)
    second = await evaluate(sandbox, task, model_patch=source, timeout=timeout, canary=True)
    confirmed: bool | None = second.resolved
    if second.infrastructure_error is not None or not first.resolved:
        confirmed = None
    elif not second.resolved and first.resolved:
        logger.warning(
            "%s: resolved in the agent's sandbox, not in a fresh one with the source changes "
            "(stripped: %s; tampered: %s)",
            task.instance_id,
            ", ".join(stripped) or "nothing",
            second.tampered or "no",
        )
    header = (
        f">>> integrity check in a fresh sandbox (stripped: {', '.join(stripped) or 'nothing'})"
    )
    return second.model_copy(
        update={
            "confirmed": confirmed,
            "stripped": stripped,
            "duration": first.duration + second.duration,
            "log": cap_log(f"{first.log}\n{header}\n{second.log}"),
        }
    )
