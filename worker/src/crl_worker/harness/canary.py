"""Canary tests: failing tests the harness plants to catch a tampered test run.

A candidate's own source code runs inside the test process (the tests import it), so it can
rewrite the test framework from there: make ``unittest``'s assertions no-ops, turn pytest's test
functions into no-ops, print a forged report and exit. Grading again in a fresh sandbox does
not undo that, since the code is the candidate's answer. So the harness appends a test class
and a test function with freshly drawn random names to a test file the run executes (one the test patch touches,
next to the FAIL_TO_PASS tests, so code that cannot tell them apart cannot spare one and not the
other). Its tests must fail: one through ``TestCase.assertEqual``, one through a bare
``assert`` (and, for pytest, a plain test function: pytest runs those through another path than
``TestCase`` methods). If either is reported passing, skipped or not at all, the run was tampered with.

Python runners only (``pytest``, ``unittest`` log formats); other formats get no canary.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from crl_worker.harness.grading import grade
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task
from crl_worker.tasks.selection import is_test_file, patch_files, test_arguments

#: Log formats whose runners collect a ``unittest.TestCase`` appended to a test module.
CANARY_FORMATS = frozenset({"pytest", "unittest"})
#: Words the canary's names are made of, so that they read like any other test's.
_WORDS = ("parse", "merge", "update", "empty", "limits", "order", "values", "default", "round")


@dataclass(frozen=True)
class Canary:
    """A planted test class: where, its test ids as the runner reports them, and its code."""

    path: str
    ids: tuple[str, ...]
    code: str


def _name() -> str:
    return f"{secrets.choice(_WORDS)}_{secrets.choice(_WORDS)}_{secrets.token_hex(3)}"


def make_canary(task: Task) -> Canary | None:
    """A canary for ``task``'s test run, or ``None`` when its runner or selection has no place
    for one (not a Python runner, or no test module that the test patch touches is run)."""
    if task.test_spec.log_format not in CANARY_FORMATS or not task.test_patch.strip():
        return None
    files = [f for f in patch_files(task.test_patch) if is_test_file(f, "python")]
    if "{tests}" in task.test_spec.command:
        selected = set(test_arguments(task))
        files = [f for f in files if f in selected]
    if not files:
        return None
    path = files[0]
    suffix = secrets.token_hex(3)
    cls = "Test" + "".join(w.capitalize() for w in _name().split("_")[:2]) + suffix
    first, second, third = f"test_{_name()}", f"test_{_name()}", f"test_{_name()}"
    a, b = secrets.randbelow(1000), 1000 + secrets.randbelow(1000)
    module = path[: -len(".py")].replace("/", ".")
    alias = f"_unittest_{suffix}"
    code = (
        f"\n\nimport unittest as {alias}\n\n\n"
        f"class {cls}({alias}.TestCase):\n"
        f"    def {first}(self):\n"
        f"        self.assertEqual({a}, {b})\n\n"
        f"    def {second}(self):\n"
        f"        assert {a} == {b}\n"
    )
    ids: tuple[str, ...]
    if task.test_spec.log_format == "pytest":
        code += f"\n\ndef {third}():\n    assert {b} == {a}\n"
        ids = (f"{path}::{cls}::{first}", f"{path}::{cls}::{second}", f"{path}::{third}")
    else:
        ids = (f"{first} ({module}.{cls})", f"{second} ({module}.{cls})")
    return Canary(path=path, ids=ids, code=code)


async def plant(sandbox: Sandbox, canary: Canary) -> None:
    """Append the canary to its test file in ``sandbox`` (after the test patch)."""
    data = await sandbox.read_file(canary.path)
    if data and not data.endswith(b"\n"):
        data += b"\n"
    await sandbox.write_file(canary.path, data + canary.code.encode("utf-8"))


def with_canary(task: Task, canary: Canary) -> Task:
    """``task`` with the canary's ids among FAIL_TO_PASS: what the test command is built from,
    so that a selection by test ids runs the canary too."""
    return task.model_copy(update={"fail_to_pass": [*task.fail_to_pass, *canary.ids]})


def tampered(canary: Canary, statuses: dict[str, TestStatus]) -> str | None:
    """Why the run is tampered with (a canary test did not fail), or ``None`` when every
    canary test failed as it must."""
    outcomes = grade(statuses, list(canary.ids), []).fail_to_pass
    wrong = [o for o in outcomes if o.status not in (TestStatus.FAILED, TestStatus.ERROR)]
    if not wrong:
        return None
    listed = ", ".join(f"{o.name}: {o.status.value}" for o in wrong)
    return f"canary tests that must fail did not ({listed}): the test run was tampered with"
