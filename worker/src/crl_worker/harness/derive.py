"""Deriving implement-from-spec tasks from a repair task: remove a function's body, keep its
signature and docstring as the specification, and let the repository's tests decide.

For one repair task (:func:`derive_implement`):

1. The *reference* is the task's repository at its base commit with its gold patch and test
   patch applied: the fixed code and every test that checks it.
2. Candidates are the Python functions and methods of its source files (not its tests) that
   have a docstring, a body beyond it, a public name, and whose name the test files mention
   (the tests that cover them).
3. Each candidate's body is replaced by ``raise NotImplementedError``, the deciding test files
   (:func:`hidden_test_files`: those the test command is given) are left out, and the result is
   committed as a root commit (no parent: the history holds no body and no hidden test to
   read) into a bundle of its own, under a repository name of its own
   (``owner/name--impl-<function>``: the sandboxes' clone cache never mixes it with the
   original history). The withheld files become the derived task's test patch, which the
   harness applies only when it grades, over whatever the agent left at those paths, as it
   applies a repair task's test patch.
4. In a sandbox, the task's FAIL_TO_PASS and PASS_TO_PASS tests run with the body restored (the
   derived task's gold patch) and without it. Tests that pass with it and fail without it are
   the derived task's FAIL_TO_PASS, tests that pass both ways its PASS_TO_PASS. A candidate whose
   tests all pass without the body is rejected with that reason, as is one whose tests do not
   pass with it.
5. The derived task then goes through :func:`crl_worker.harness.check.check_task`, the check of
   ``crl tasks check`` (gold resolves, no patch does not); a candidate that fails it is
   rejected with the check's problems.

Only ``pytest`` and ``unittest`` tasks of Python repositories are derived from; the test command
of a derived task names the source task's test files. Test files the command does not name
stay in the repository, visible: the agent may run them, they do not decide.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from crl_worker.errors import CrlError, InfrastructureError
from crl_worker.harness.check import InstanceCheck, check_task
from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.grading import PASSING
from crl_worker.harness.result import EvalResult
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.sandbox.repos import resolve_source
from crl_worker.tasks.model import Task, TestSpec
from crl_worker.tasks.selection import is_test_file, test_arguments, test_files

logger = logging.getLogger(__name__)

#: Formats whose test command can be given test files directly.
SUPPORTED_FORMATS = ("pytest", "unittest")
#: The fixed identity and date of the derived commits (the same sources, the same ids).
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "CodeRepairRL derive-implement",
    "GIT_AUTHOR_EMAIL": "derive@coderepair.io",
    "GIT_COMMITTER_NAME": "CodeRepairRL derive-implement",
    "GIT_COMMITTER_EMAIL": "derive@coderepair.io",
    "GIT_AUTHOR_DATE": "2024-01-01T09:00:00+00:00",
    "GIT_COMMITTER_DATE": "2024-01-01T09:00:00+00:00",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}
_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


class DeriveError(CrlError):
    """A repair task that implement tasks cannot be derived from (the message says why)."""


@dataclass(frozen=True)
class Candidate:
    """A function whose body could be removed."""

    path: str
    """Its file, relative to the repository root."""
    qualname: str
    """``function`` or ``Class.method``."""
    start: int
    """First line of the body after the docstring (1-based)."""
    end: int
    """Last line of the function (1-based, inclusive)."""
    indent: str
    """The body's indentation."""
    header: str
    """The source of its signature and docstring (the specification)."""


@dataclass
class Derivation:
    """What deriving from one repair task produced."""

    source_id: str
    """The repair task's instance id."""
    tasks: list[Task] = field(default_factory=list)
    """The derived tasks that passed every check."""
    rejected: list[tuple[str, str]] = field(default_factory=list)
    """``(function, reason)`` of each candidate left out."""


def _git(repo: Path, *args: str, data: bytes | None = None) -> str:
    done = subprocess.run(
        ["git", *args],
        cwd=repo,
        env={**os.environ, **_GIT_ENV},
        input=data,
        capture_output=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        raise DeriveError(
            f"git {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace')[-800:]}"
        )
    return done.stdout.decode("utf-8", "replace")


def find_candidates(repo: Path, language: str = "python") -> list[Candidate]:
    """The functions of ``repo``'s non-test Python files that a test file names, have a
    docstring and a body beyond it, and a public name; in file and line order."""
    files = [
        p.relative_to(repo).as_posix()
        for p in sorted(repo.rglob("*.py"))
        if ".git" not in p.relative_to(repo).parts
    ]
    tests = [f for f in files if is_test_file(f, "python")]
    test_text = "\n".join((repo / f).read_text(encoding="utf-8", errors="replace") for f in tests)
    found: list[Candidate] = []
    for path in files:
        if path in tests:
            continue
        text = (repo / path).read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        scopes: list[tuple[str, ast.AST]] = [("", tree)]
        scopes += [(f"{n.name}.", n) for n in tree.body if isinstance(n, ast.ClassDef)]
        for prefix, scope in scopes:
            for node in getattr(scope, "body", []):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                if node.name.startswith("_") or len(node.body) < 2:
                    continue
                if ast.get_docstring(node) is None or node.end_lineno is None:
                    continue
                if not re.search(rf"\b{re.escape(node.name)}\b", test_text):
                    continue
                docstring = node.body[0]
                first = node.body[1]
                start_of_def = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                header = "\n".join(lines[start_of_def - 1 : (docstring.end_lineno or 0)])
                found.append(
                    Candidate(
                        path=path,
                        qualname=prefix + node.name,
                        start=first.lineno,
                        end=node.end_lineno,
                        indent=" " * first.col_offset,
                        header=header,
                    )
                )
    return found


def stub_text(text: str, candidate: Candidate) -> str:
    """``text`` with the candidate's body (after its docstring) replaced by a
    ``raise NotImplementedError``."""
    lines = text.splitlines(keepends=True)
    stub = f'{candidate.indent}raise NotImplementedError("{candidate.qualname}")\n'
    return "".join([*lines[: candidate.start - 1], stub, *lines[candidate.end :]])


def statement(candidate: Candidate) -> str:
    """The problem statement of the derived task: where, and the specification."""
    return (
        f"The body of `{candidate.qualname}` in `{candidate.path}` is missing: it only raises "
        "NotImplementedError. Implement it. Its signature and docstring are the "
        "specification:\n\n"
        f"```python\n{candidate.header}\n```\n\n"
        "The tests that decide whether your implementation is correct are withheld: they are "
        "added to the repository and run after you submit."
    )


def _reference(task: Task, work: Path) -> None:
    """Clone the task's repository into ``work`` at its base commit, with the gold patch and
    the test patch applied."""
    try:
        source = resolve_source(task)
    except InfrastructureError as exc:
        raise DeriveError(str(exc)) from exc
    _git(work.parent, "clone", "--quiet", "--no-checkout", source, str(work))
    _git(work, "-c", "advice.detachedHead=false", "checkout", "--quiet", task.base_commit)
    for name, patch in (("gold patch", task.patch), ("test patch", task.test_patch)):
        if patch.strip():
            try:
                _git(work, "apply", "-", data=patch.encode())
            except DeriveError as exc:
                raise DeriveError(f"the {name} does not apply: {exc}") from None


def hidden_test_files(task: Task, work: Path) -> list[str]:
    """The test files of the reference ``work`` that decide a task derived from ``task``: the
    ones its test command is given (:func:`~crl_worker.tasks.selection.test_arguments`) and the
    ones its test patch touches, when they are test modules that exist in the reference."""
    names = [*test_files(task.test_patch, "python"), *test_arguments(task)]
    return [
        name
        for name in dict.fromkeys(names)
        if is_test_file(name, "python") and (work / name).is_file()
    ]


def _stub_repository(
    work: Path, candidate: Candidate, hidden: list[str], bundle: Path
) -> tuple[str, str, str]:
    """Commit the reference with the candidate's body removed and the ``hidden`` test files
    left out as a root commit, bundle it into ``bundle``; return the commit, the gold patch
    that restores the body and the test patch that adds the hidden tests back."""
    target = work / candidate.path
    original = target.read_text(encoding="utf-8")
    try:
        target.write_text(stub_text(original, candidate), encoding="utf-8")
        _git(work, "add", "--all")
        # Withheld from the commit (and so from the bundle's objects): the agent's sandbox
        # never holds them; the harness adds them from the test patch when it grades.
        _git(work, "rm", "--cached", "--quiet", "--", *hidden)
        tree = _git(work, "write-tree").strip()
        commit = _git(
            work, "commit-tree", tree, "-m", f"{candidate.qualname}: body removed"
        ).strip()
    finally:
        target.write_text(original, encoding="utf-8")
    branch = "refs/heads/main"
    _git(work, "update-ref", branch, commit)
    _git(work, "add", "--all")
    gold = _git(work, "diff", "--cached", commit, "--", candidate.path)
    tests = _git(work, "diff", "--cached", commit, "--", *hidden)
    bundle.parent.mkdir(parents=True, exist_ok=True)
    partial = bundle.with_suffix(".bundle.partial")
    _git(work, "bundle", "create", "--quiet", str(partial), "main")
    partial.replace(bundle)
    return commit, gold, tests


def _slug(text: str) -> str:
    return _SLUG.sub("-", text).strip("-").lower()


def _passing(result: EvalResult) -> dict[str, bool]:
    return {o.name: o.status in PASSING for o in [*result.fail_to_pass, *result.pass_to_pass]}


async def _outcomes(
    task: Task, sandbox_config: BaseModel | Mapping[str, Any] | None
) -> tuple[EvalResult, EvalResult]:
    """Run ``task``'s listed tests with its gold patch and without it, in one sandbox."""
    sandbox = create_sandbox(sandbox_config, task)
    async with sandbox:
        with_body = await evaluate(sandbox, task, model_patch=task.patch)
        await sandbox.reset()
        without = await evaluate(sandbox, task, model_patch=None)
    return with_body, without


async def derive_implement(
    task: Task,
    out_dir: Path,
    *,
    sandbox_config: BaseModel | Mapping[str, Any] | None = None,
    limit: int = 3,
    functions: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Derivation:
    """Derive up to ``limit`` implement tasks from the repair task ``task`` (only the
    functions named in ``functions`` when given); their bundles go to ``out_dir/repos``. See
    the module docs for the steps; raises :class:`DeriveError` when ``task`` cannot be derived
    from at all."""
    if task.task_type != "repair":
        raise DeriveError(f"{task.instance_id} is a {task.task_type} task, not a repair task")
    test = task.test_spec
    if task.language != "python" or test.log_format not in SUPPORTED_FORMATS:
        raise DeriveError(
            f"{task.instance_id}: only Python tasks run by {' or '.join(SUPPORTED_FORMATS)} are "
            f"derived from (this one: {task.language}, {test.log_format})"
        )
    listed = [*task.fail_to_pass, *task.pass_to_pass]
    if not listed:
        raise DeriveError(f"{task.instance_id}: lists no tests to decide a derived task")
    arguments = test_arguments(task)
    if "{tests}" in test.command and not arguments:
        raise DeriveError(f"{task.instance_id}: its test command selects no test files")
    command = test.command.replace("{tests}", " ".join(shlex.quote(a) for a in arguments))
    out_dir = out_dir.resolve()
    result = Derivation(source_id=task.instance_id)
    scratch = Path(tempfile.mkdtemp(prefix="crl-derive-"))
    try:
        work = scratch / "reference"
        await asyncio.to_thread(_reference, task, work)
        hidden = hidden_test_files(task, work)
        if not hidden:
            raise DeriveError(
                f"{task.instance_id}: its tests name no test file to withhold from the agent"
            )
        candidates = find_candidates(work)
        if functions:
            unknown = set(functions) - {c.qualname for c in candidates}
            result.rejected += [(f, "no such covered, documented function") for f in unknown]
            candidates = [c for c in candidates if c.qualname in functions]
        for candidate in candidates:
            if len(result.tasks) >= limit:
                break
            name = f"{task.instance_id}--impl-{_slug(candidate.qualname)}"
            bundle = out_dir / "repos" / f"{_slug(name)}.bundle"
            commit, gold, tests = await asyncio.to_thread(
                _stub_repository, work, candidate, hidden, bundle
            )
            derived = task.model_copy(
                update={
                    "instance_id": name,
                    "repo": f"{task.repo}--impl-{_slug(candidate.qualname)}",
                    "base_commit": commit,
                    "source": str(bundle.resolve()),
                    "patch": gold,
                    "test_patch": tests,
                    "fail_to_pass": [],
                    "pass_to_pass": listed,
                    "environment_setup_commit": None,
                    "problem_statement": statement(candidate),
                    "hints_text": "",
                    "image": None,
                    "task_type": "implement",
                    "test": TestSpec(
                        command=command,
                        log_format=test.log_format,
                        pre=list(test.pre),
                    ),
                    "metadata": {
                        "derived_from": task.instance_id,
                        "function": candidate.qualname,
                        "file": candidate.path,
                        "hidden_tests": hidden,
                    },
                }
            )
            reason = await _judge(derived, sandbox_config)
            if isinstance(reason, str):
                result.rejected.append((candidate.qualname, reason))
                bundle.unlink(missing_ok=True)
                logger.info("%s: %s rejected: %s", task.instance_id, candidate.qualname, reason)
            else:
                result.tasks.append(reason)
            if progress is not None:
                progress(f"{candidate.qualname}: {'ok' if not isinstance(reason, str) else reason}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


async def _judge(derived: Task, sandbox_config: BaseModel | Mapping[str, Any] | None) -> Task | str:
    """The derived task with its test lists, or why it is rejected."""
    try:
        with_body, without = await _outcomes(derived, sandbox_config)
    except (CrlError, OSError) as exc:
        return f"the tests could not run: {exc}"
    for label, run in (("with the body", with_body), ("without the body", without)):
        if run.infrastructure_error is not None:
            return f"the tests could not run {label}: {run.infrastructure_error}"
    if not with_body.patch_applied:
        return "the body does not restore cleanly (its patch does not apply)"
    good, bad = _passing(with_body), _passing(without)
    broken = [n for n, ok in good.items() if not ok]
    if broken:
        return "tests fail even with the body: " + ", ".join(broken[:10])
    fail_to_pass = [n for n in good if not bad.get(n, False)]
    if not fail_to_pass:
        return f"no test fails without the body (all {len(good)} listed tests still pass)"
    pass_to_pass = [n for n in good if bad.get(n, False)]
    final = derived.model_copy(update={"fail_to_pass": fail_to_pass, "pass_to_pass": pass_to_pass})
    checked: InstanceCheck = await check_task(final, sandbox_config=sandbox_config)
    if not checked.ok:
        return "the task check failed: " + "; ".join(checked.problems)
    return final
