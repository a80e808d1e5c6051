"""`crl tasks check --integrity`: each gold patch graded once more as an episode's resolved
verdict is confirmed (a pristine sandbox, only its source changes, canaries), so that an
instance whose correct answer the integrity check would grade 0 is found before training on it.

The bundled mini suite's unittest instance, local sandboxes: its real gold patch passes both
gradings; a "gold" patch that forges the run from the package (unittest's expected-failure flag
set on every test: tests/fixtures/forgery.py) resolves as the plain check grades it and is
caught through the integrity check, which makes the instance invalid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crl_worker.harness.check import check_task
from crl_worker.sandbox.registry import create_sandbox

from .fixtures import forgery
from .fixtures.cli import crl
from .fixtures.redteam import PYTEST, UNITTEST, suite


async def test_the_integrity_check_of_gold_patches_finds_what_an_episode_would_grade_zero(
    tmp_path: Path,
) -> None:
    task = suite()[UNITTEST]
    checked = await check_task(task, integrity=True)
    assert checked.ok, checked.problems
    assert (checked.gold_verdict, checked.integrity_verdict) == ("resolved", "resolved")
    [confirmed] = checked.confirmed
    assert confirmed.tampered is None and "canary tests planted" in confirmed.log

    async with create_sandbox({"type": "local"}, task) as sandbox:
        done = await sandbox.run(forgery.append_to_package("lrukit", forgery.EXPECTING_FAILURE))
        assert done.exit_code == 0, done.output
        forged = await sandbox.diff()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task.model_copy(update={"patch": forged}).model_dump(mode="json")))

    ran = crl("tasks", "check", str(tasks), "--integrity", "--output", "json")
    assert ran.returncode == 1, ran.stderr
    [row] = [json.loads(line) for line in ran.stdout.splitlines() if line.strip()]
    # The plain check is fooled; the integrity check is not, and says what it means.
    assert (row["gold"], row["integrity"], row["ok"]) == ("resolved", "unresolved", False)
    [problem] = [p for p in row["problems"] if "through the integrity check" in p]
    assert "tampered" in problem and "graded 0" in problem

    refused = crl("tasks", "check", str(tasks), "--integrity", "--patch", str(tasks))
    assert refused.returncode == 2 and "use one of them" in refused.stderr


#: Package code that uses a runner attribute unittest loads on first use, and code that replaces it.
USES_LAZY = "import unittest\nASYNC_BASE = unittest.IsolatedAsyncioTestCase\n"
REPLACES_LAZY = "import unittest\nunittest.IsolatedAsyncioTestCase = type('Mine', (), {})\n"
#: Package code that swaps the code of the runner's test call in place (red team 13): the function
#: object stays, so a snapshot of functions alone saw nothing; every test passes uncalled.
SWAPS_CODE = (
    "import _pytest.python\n"
    "_pytest.python.pytest_pyfunc_call.__code__ = (lambda pyfuncitem: True).__code__\n"
)

#: Package code that makes a function whose code claims to be the runner's own file: a
#: replacement made so before pytest is configured (a conftest importing the package) was
#: judged by that file name, as the runner's.
CLAIMS_RUNNER_FILE = (
    "import _pytest.python as _p\n"
    "_ns = {}\n"
    "exec(compile('def pytest_pyfunc_call(pyfuncitem):\\n    return True\\n', _p.__file__, 'exec'), _ns)\n"
)


@pytest.mark.parametrize(
    ("instance", "package", "code", "resolved"),
    [
        (PYTEST, "intervals", USES_LAZY, True),
        (UNITTEST, "lrukit", USES_LAZY, True),
        (PYTEST, "intervals", REPLACES_LAZY, False),
        (PYTEST, "intervals", SWAPS_CODE, False),
        (PYTEST, "intervals", CLAIMS_RUNNER_FILE, False),
    ],
)
async def test_the_runner_check_spares_first_use_and_catches_replacement(
    instance: str, package: str, code: str, resolved: bool
) -> None:
    """``unittest.IsolatedAsyncioTestCase`` is loaded on first use (a module ``__getattr__``):
    package code that first uses it after pytest was configured (moto's decorators, SWE-Gym's
    getmoto__moto-6920) changed nothing of the runner, and a correct answer still counts, under
    either runner. Replacing it is still a change to the runner, and so is swapping the code of
    a runner function in place."""
    task = suite()[instance]
    async with create_sandbox({"type": "local"}, task) as sandbox:
        applied = await sandbox.run(f"git apply - <<'CRL_GOLD_EOF'\n{task.patch}CRL_GOLD_EOF")
        assert applied.exit_code == 0, applied.output
        done = await sandbox.run(forgery.append_to_package(package, code))
        assert done.exit_code == 0, done.output
        gold = await sandbox.diff()
    checked = await check_task(task.model_copy(update={"patch": gold}), integrity=True)
    assert checked.gold_verdict == "resolved", checked.problems
    if resolved:
        assert checked.ok and checked.integrity_verdict == "resolved", checked.problems
    else:
        [confirmed] = checked.confirmed
        changed = {SWAPS_CODE: "pytest_pyfunc_call", CLAIMS_RUNNER_FILE: "claims to be"}.get(
            code, "unittest.IsolatedAsyncioTestCase"
        )
        assert changed in (confirmed.tampered or ""), checked.problems
