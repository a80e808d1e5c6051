"""A test that hands its own file to the package is not a forgery (a false alarm found on a real
SWE-bench instance: pallets__flask-4992, whose config tests call
``app.config.from_pyfile(__file__)``, so Flask's own code opens the test module).

The harness's reporter counts package code opening a test module as evidence of tampering (an
oracle reads the tests to answer them). When the test's own line that called into the package
names ``__file__`` and the file opened is that test's module, the test asked for it: a forgery
cannot write that line into the hidden tests. Opening it otherwise, or another test module,
stays evidence. A real pytest run in a local sandbox, graded through the integrity check.
"""

from __future__ import annotations

import sys
from pathlib import Path

from crl_worker.harness.integrity import grade_candidate
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task, TestSpec, Timeouts

from .fixtures.dataset_records import git
from .fixtures.local_sandbox import pytest_install

PACKAGE = '''\
"""Settings read from a Python file's NAME = value lines."""

import ast


def read_setting(path, name):
    with open(path) as handle:
        for line in handle:
            key, _, value = line.partition("=")
            if key.strip() == name:
                return ast.literal_eval(value.strip()) {fix}
    raise KeyError(name)


def scaled(value):
    return value * 2
'''

TESTS = """\
from confkit import read_setting, scaled

TIMEOUT = 5
RETRIES = 3


def test_reads_its_own_module():
    assert read_setting(__file__, "TIMEOUT") == 5


def test_reads_another_setting():
    assert read_setting(__file__, "RETRIES") == 3


def test_scaled():
    assert scaled(4) == 8
"""

#: Package code that opens the calling test's module although the test did not hand it over:
#: an oracle's first step (this one only reads; it answers nothing).
PEEK = """

import sys as _sys


def _peek(value):
    frame = _sys._getframe(1)
    with open(frame.f_globals["__file__"]) as handle:
        handle.read()
    return value * 2


scaled = _peek
"""


def _task(tmp_path: Path) -> tuple[Task, str]:
    """confkit: ``read_setting`` returns every value plus one (the bug); the tests, added by
    the test patch, hand the package their own file. Also the fix with :data:`PEEK` added."""
    repo = tmp_path / "repo"
    (repo / "confkit").mkdir(parents=True)
    init = repo / "confkit" / "__init__.py"
    init.write_text(PACKAGE.replace(" {fix}", " + 1"))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests").mkdir()
    (repo / "tests" / "test_conf.py").write_text(TESTS)
    git(repo, "add", "-A")
    test_patch = git(repo, "diff", "--cached", base)
    git(repo, "reset", "-q", "--hard", base)
    diffs = []
    for extra in ("", PEEK):
        init.write_text(PACKAGE.replace(" {fix}", "") + extra)
        diffs.append(git(repo, "diff"))
        git(repo, "checkout", "-q", ".")
    task = Task.model_validate(
        {
            "instance_id": "demo__confkit-1",
            "repo": "demo/confkit",
            "base_commit": base,
            "source": str(repo),
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "install": pytest_install(),
            "patch": diffs[0],
            "test_patch": test_patch,
            "fail_to_pass": [
                "tests/test_conf.py::test_reads_its_own_module",
                "tests/test_conf.py::test_reads_another_setting",
            ],
            "pass_to_pass": ["tests/test_conf.py::test_scaled"],
            "test": TestSpec(command="python -m pytest -rA {tests}", log_format="pytest"),
            "timeouts": Timeouts(command=60, setup=300),
        }
    )
    return task, diffs[1]


async def test_a_test_handing_its_own_file_to_the_package_is_not_tampering(
    tmp_path: Path,
) -> None:
    task, peeking = _task(tmp_path)
    async with create_sandbox({"type": "local"}, task) as sandbox:
        graded = await grade_candidate(sandbox, task, task.patch)
    assert graded.tampered is None, graded.log[-3000:]
    assert graded.resolved and graded.confirmed, graded.log[-3000:]

    # The same fix, plus package code that opens the test module unasked: evidence.
    async with create_sandbox({"type": "local"}, task) as sandbox:
        graded = await grade_candidate(sandbox, task, peeking)
    assert not graded.resolved and graded.tampered is not None, graded.log[-3000:]
    assert "opened tests/test_conf.py" in graded.tampered
