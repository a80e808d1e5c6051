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

import hashlib
import logging
import os
import shlex
import sys
from collections import OrderedDict
from pathlib import PurePosixPath

from crl_worker.api.contract import Env
from crl_worker.errors import InfrastructureError
from crl_worker.harness.diffsplit import Split, Tree, split_diff, touched_files, unquote_c
from crl_worker.harness.evaluate import STEP_TIMEOUT, cap_log, evaluate
from crl_worker.harness.infrastructure import (
    INFRASTRUCTURE_NAMES,
    INFRASTRUCTURE_ROOTS,
    INFRASTRUCTURE_SUFFIXES,
    LINK_MODES,
    RUNNER_MODULES,
    is_test_infrastructure,
)
from crl_worker.harness.result import EvalResult
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

__all__ = [
    "INFRASTRUCTURE_NAMES",
    "INFRASTRUCTURE_ROOTS",
    "INFRASTRUCTURE_SUFFIXES",
    "RUNNER_MODULES",
    "base_tree",
    "confirm",
    "confirmation_enabled",
    "grade_candidate",
    "is_test_infrastructure",
    "needs_confirmation",
    "runner_files",
    "shadows_a_module",
    "source_diff",
    "touched_files",
]


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
    """The source changes of ``diff`` and what was left out (``path (why)``), without knowing
    the repository (:func:`~crl_worker.harness.diffsplit.split_diff`; a refused diff gives no
    source change and says why among the left-out entries)."""
    split = split_diff(diff, test_patch=test_patch)
    if split.refused is not None:
        return "", [*split.stripped, f"(refused: {split.refused})"]
    return split.source, split.stripped


#: Prints the tracked files (``git ls-files -s``) and, for Python, the folders on the
#: interpreter's ``sys.path`` relative to the workdir, in the pristine sandbox before any
#: candidate change (nothing of the candidate runs there yet).
_TREE_SCRIPT = (
    "git -c core.quotePath=true ls-files -s; echo '@@crl-import-roots@@'; "
    'if [ {python} = 1 ]; then python -c \'import os, sys; print("\\n".join('
    'os.path.relpath(os.path.abspath(p or ".")) for p in sys.path))\' 2>/dev/null; fi; true'
)


#: Base trees already read, by task (the same for every pristine sandbox of a task).
_TREES: OrderedDict[tuple[str, ...], Tree] = OrderedDict()
_TREES_KEPT = 256


async def base_tree(sandbox: Sandbox, task: Task) -> Tree:
    """The repository of ``sandbox`` (pristine: before any candidate change) as the split needs
    it: tracked files, tracked links, and the import roots (the repository's root, folders of
    it on ``sys.path``, and the folders pytest puts there for the selected test files). Read
    once per task and process (the same base commit, image and environment give the same)."""
    key = (
        task.instance_id,
        task.base_commit,
        task.image or "",
        task.language,
        hashlib.sha256(task.test_patch.encode()).hexdigest(),
    )
    if key in _TREES:
        _TREES.move_to_end(key)
        return _TREES[key]
    tree = await _read_tree(sandbox, task)
    _TREES[key] = tree
    while len(_TREES) > _TREES_KEPT:
        _TREES.popitem(last=False)
    return tree


async def _read_tree(sandbox: Sandbox, task: Task) -> Tree:
    script = _TREE_SCRIPT.replace("{python}", "1" if task.language == "python" else "0")
    result = await sandbox.run(
        f"cd {shlex.quote(sandbox.workdir)} && {script}",
        timeout=STEP_TIMEOUT,
        max_output=64 << 20,
    )
    if result.exit_code != 0 or result.timed_out:
        raise InfrastructureError(f"could not list the repository's files: {result.output[-500:]}")
    listing, _, roots_text = result.output.partition("@@crl-import-roots@@")
    files: set[str] = set()
    links: set[str] = set()
    for line in listing.splitlines():
        meta, sep, name = line.partition("\t")
        if not sep:
            continue
        path = unquote_c(name)
        files.add(path)
        if meta.split(" ", 1)[0] in LINK_MODES:
            links.add(path)
    roots = {""}
    for line in roots_text.splitlines():
        line = line.strip()
        if line and line != "." and not line.startswith(".."):
            roots.add(line)
    roots.update(_pytest_roots(task, files))
    return Tree(files=frozenset(files), links=frozenset(links), import_roots=frozenset(roots))


def _pytest_roots(task: Task, files: set[str]) -> set[str]:
    """The folders pytest's default import mode puts on ``sys.path`` for the test patch's test
    files: the first folder upwards without an ``__init__.py``."""
    if task.language != "python":
        return set()
    roots = set()
    for test in touched_files(task.test_patch):
        folder = PurePosixPath(test).parent
        while str(folder) != "." and f"{folder}/__init__.py" in files:
            folder = folder.parent
        roots.add("" if str(folder) == "." else str(folder))
    return roots


def runner_files(task: Task, tree: Tree) -> list[str]:
    """Tracked files the test command or its ``pre`` commands name (``bin/test``,
    ``./runtests.py``): they decide how the tests run, so never a source change."""
    words: list[str] = []
    for command in (task.test_spec.command, *task.test_spec.pre):
        try:
            words += shlex.split(command.replace("{tests}", ""))
        except ValueError:
            words += command.split()
    named = [w.removeprefix("./") for w in words]
    return [w for w in dict.fromkeys(named) if w in tree.files]


def needs_confirmation(result: EvalResult, *, partial: bool = False) -> bool:
    """Whether ``result`` (graded in the agent's sandbox) must be graded again in a fresh one:
    it is resolved, or it has no verdict (an infrastructure or environment error: the agent may
    have caused it, e.g. a git filter that makes the test patch fail to apply, a runner deleted
    outside the repository). Not when nothing was selected to run: that is the task's own.

    With ``partial`` (a reward that pays the share of passing tests: ``testsMode: fraction``),
    also an unresolved result that any listed test passed: its share is forged as easily as a
    resolved verdict (every failure but one reported passing), so it counts only as the fresh
    sandbox grades it."""
    nothing_selected = result.environment_error is not None and not result.test_command
    if result.resolved or (result.infrastructure_error is not None and not nothing_selected):
        return True
    passed_some = result.fail_to_pass_fraction > 0 or result.pass_to_pass_fraction > 0
    return partial and result.tampered is None and result.patch_applied and passed_some


def confirmation_enabled() -> bool:
    """Whether resolved episodes are confirmed in a fresh sandbox (``$CRL_GRADING_CONFIRM``,
    on unless ``0``, ``false``, ``no`` or ``off``)."""
    value = os.environ.get(Env.GRADING_CONFIRM, "").strip().lower()
    return value not in {"0", "false", "no", "off"}


def _no_source_change(
    first: EvalResult, stripped: list[str], refused: str | None = None
) -> EvalResult:
    if refused is not None:
        note = f"integrity check: the diff is refused ({refused}): nothing of it counts"
        stripped = [*stripped, f"(refused: {refused})"]
    else:
        note = (
            "integrity check: no source change is left once tests and test infrastructure are "
            f"stripped ({', '.join(stripped) or 'empty diff'}): the base state fails by "
            "definition"
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


async def split_in(sandbox: Sandbox, task: Task, diff: str) -> Split:
    """:func:`~crl_worker.harness.diffsplit.split_diff` of ``diff`` against the repository of
    ``sandbox`` (pristine: nothing applied yet)."""
    tree = await base_tree(sandbox, task)
    return split_diff(
        diff, test_patch=task.test_patch, tree=tree, runner_files=runner_files(task, tree)
    )


async def grade_candidate(
    sandbox: Sandbox, task: Task, diff: str, *, timeout: float | None = None
) -> EvalResult:
    """Grade ``diff`` (a candidate's patch: a prediction, ``crl tasks check --patch``) in
    ``sandbox``, a pristine, started sandbox of the task, the way :func:`confirm` grades an
    episode's diff: only its source changes
    (:func:`~crl_worker.harness.diffsplit.split_diff`), canary tests in the run. A diff with no
    source change left (or refused) is unresolved without running anything. ``confirmed`` is
    the verdict (``None`` without one). Never raises for a failed evaluation."""
    empty = EvalResult(instance_id=task.instance_id, resolved=False)
    try:
        split = await split_in(sandbox, task, diff)
    except (InfrastructureError, OSError) as exc:
        error = f"the integrity check could not read the base: {exc}"
        return empty.model_copy(update={"infrastructure_error": error})
    if split.refused is not None or not split.source.strip():
        return _no_source_change(empty, split.stripped, split.refused)
    result = await evaluate(sandbox, task, model_patch=split.source, timeout=timeout, canary=True)
    confirmed = None if result.infrastructure_error is not None else result.resolved
    header = (
        f">>> graded in a pristine sandbox (stripped: {', '.join(split.stripped) or 'nothing'})"
    )
    return result.model_copy(
        update={
            "confirmed": confirmed,
            "stripped": split.stripped,
            "log": cap_log(f"{header}\n{result.log}"),
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

    Only the source changes are applied (:func:`~crl_worker.harness.diffsplit.split_diff`, with
    the repository's base tree read from ``sandbox`` first: :func:`base_tree`); a refused diff
    counts as no change at all. The test run gets canary tests. The result is
    the second grading's, with ``confirmed`` (for a resolved ``first``: whether it held),
    ``stripped``, the two durations added and both logs; an infrastructure failure of the second
    grading leaves the episode without a verdict, as any other. Never raises for a failed
    evaluation.
    """
    try:
        split = await split_in(sandbox, task, diff)
    except (InfrastructureError, OSError) as exc:
        logger.warning("%s: the integrity check could not read the base: %s", task.instance_id, exc)
        return first.model_copy(
            update={
                "resolved": False,
                "confirmed": None,
                "infrastructure_error": f"the integrity check could not read the base: {exc}",
            }
        )
    source, stripped = split.source, split.stripped
    if split.refused is not None or (first.resolved and not source.strip()):
        return _no_source_change(first, stripped, split.refused)
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
