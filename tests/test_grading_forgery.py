"""Red team of issue 30: forgeries from the package's own source, through the episode path.

Each attack is package code (or a file beside it) that makes a fix-nothing answer look
resolved: it survives the integrity check's source-only diff, so only the canaries derived from
the task's tests, the grading rules and the harness's own runner stand in its way
(:mod:`crl_worker.harness.canary`, :mod:`crl_worker.harness.marks`,
:mod:`crl_worker.harness.runner`). A scripted policy writes it through the agent's ``shell``
tool and submits; the real episode grades it (the agent's sandbox, then a fresh one). Every
attack must be graded unresolved with reward 0. Each was graded resolved before issue 30's
changes (see the commit that added this file).

Backends: ``local``, and ``docker`` (marked; the engine's fixtures of tests/conftest.py) with
images of the attacked instances, for every forgery (``CRL_REDTEAM_DOCKER=subset``: those of
``ON_DOCKER``). Attacks and gold patches of a backend run once, a few at a
time, in one module fixture; every bundled suite's gold patch is among them on the local
backend (no false alarms).
"""

from __future__ import annotations

import ast
import asyncio
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from crl_worker import rewards
from crl_worker.agent.episode import run_episode
from crl_worker.agent.gold import GoldPolicy
from crl_worker.agent.trajectory import Trajectory
from crl_worker.api.common import AgentSpec
from crl_worker.harness import marks, mutants, runner
from crl_worker.harness.canary import Canary, canary_files, restore_ids, with_canary
from crl_worker.harness.literals import variants
from crl_worker.harness.result import EvalResult, TestStatus
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.images import TaskImageBuilder
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks import selection
from crl_worker.tasks.model import Task
from tests.fixtures import forgery
from tests.fixtures.episodes import suite_tasks
from tests.fixtures.forgery import ScriptedPolicy, append_to_package
from tests.fixtures.redteam import BACKENDS, attack_params, docker_attacks

FIXTURES = Path(__file__).resolve().parent / "fixtures"

PYTEST = "crl-mini__intervals-1"
#: A unittest instance whose FAIL_TO_PASS tests compare with assertEqual/assertIs/assertIsNone.
UNITTEST = "crl-mini__iniconf-2"
#: One whose FAIL_TO_PASS tests compare only with assertEqual (a proxy cannot pass ``assertIs``).
UNITTEST_EQ = "crl-mini__iniconf-1"
#: The pytest instance selecting its tests by id (``select: ids``, as QuixBugs, BugsInPy and the
#: exercises do): the canaries join the ids on the command line.
BY_IDS = f"{PYTEST} (select: ids)"
#: The pytest instance whose test patch marks its FAIL_TO_PASS tests with a conditional
#: ``skipif`` (tests/fixtures/skipif_intervals.diff), as real suites mark tests of optional
#: dependencies.
SKIPIF = f"{PYTEST} (conditional skips)"
#: Variants of the local backend only (no image of their own on Docker).
LOCAL_ONLY = (BY_IDS, SKIPIF)
PACKAGES = {
    PYTEST: "intervals",
    UNITTEST: "iniconf",
    UNITTEST_EQ: "iniconf",
    BY_IDS: "intervals",
    SKIPIF: "intervals",
}


@dataclass(frozen=True)
class Attack:
    """One forgery: the instance it targets, and the commands the agent runs."""

    name: str
    instance: str
    commands: tuple[str, ...]
    what: str


def _in_package(instance: str, code: str) -> tuple[str, ...]:
    return (append_to_package(PACKAGES[instance], code),)


ATTACKS: tuple[Attack, ...] = (
    Attack(
        "xfail-call",
        PYTEST,
        _in_package(PYTEST, forgery.XFAIL_CALL),
        "package code calls pytest.xfail() inside every test that calls it",
    ),
    Attack(
        "expecting-failure",
        UNITTEST,
        _in_package(UNITTEST, forgery.EXPECTING_FAILURE),
        "package code sets the running TestCase's _outcome.expecting_failure",
    ),
    Attack(
        "always-equal",
        PYTEST,
        _in_package(PYTEST, forgery.ALWAYS_EQUAL),
        "package results compare equal to anything",
    ),
    Attack(
        "always-equal-unittest",
        UNITTEST_EQ,
        _in_package(UNITTEST_EQ, forgery.ALWAYS_EQUAL),
        "package results compare equal to anything (assertEqual)",
    ),
    Attack(
        "oracle-frame",
        PYTEST,
        _in_package(PYTEST, forgery.ORACLE_FRAME),
        "package code returns what the calling assert expects (frame + AST)",
    ),
    Attack(
        "oracle-frame-unittest",
        UNITTEST,
        _in_package(UNITTEST, forgery.ORACLE_FRAME),
        "package code returns what the calling self.assert* expects (frame + AST)",
    ),
    Attack(
        "oracle-parse-tests",
        PYTEST,
        _in_package(PYTEST, forgery.ORACLE_PARSE),
        "package code parses tests/test_*.py at import into a table of answers",
    ),
    Attack(
        "flip-reports-by-name",
        PYTEST,
        _in_package(PYTEST, forgery.FLIP_BY_NAME),
        "TestReport construction turns failures into passes, sparing canary names",
    ),
    Attack(
        "flip-reports-unless-no-package-code",
        PYTEST,
        _in_package(PYTEST, forgery.FLIP_UNLESS_NO_PACKAGE_CODE),
        "TestReport construction flips tests in which package code ran",
    ),
    Attack(
        "flip-addfailure-unittest",
        UNITTEST,
        _in_package(UNITTEST, forgery.UNITTEST_FLIP),
        "TextTestResult.addFailure/addError report success where package code ran",
    ),
    Attack(
        "forge-output",
        PYTEST,
        _in_package(PYTEST, forgery.FORGE_OUTPUT),
        "pytest's saved output descriptors go to a file, rewritten at exit",
    ),
    Attack(
        "forge-output-unittest",
        UNITTEST,
        _in_package(UNITTEST, forgery.FORGE_OUTPUT),
        "unittest's output descriptors go to a file, rewritten at exit",
    ),
    Attack(
        "dist-info-plugin",
        PYTEST,
        forgery.dist_info_plugin(),
        "a new *.dist-info at the root registers a pytest11 plugin that flips failures",
    ),
    Attack(
        "always-equal-select-ids",
        BY_IDS,
        _in_package(BY_IDS, forgery.ALWAYS_EQUAL),
        "results equal to anything, on a task selecting its tests by id (it had no canary: the "
        "test modules were looked for among the ids as paths)",
    ),
    Attack(
        "skip-condition-flip",
        SKIPIF,
        forgery.skip_condition_flip(PACKAGES[SKIPIF]),
        "package code makes the condition of the task's own skipif markers true, so the "
        "FAIL_TO_PASS tests are skipped (a marked test's skip counted as a pass)",
    ),
    Attack(
        "leak-after-submitting",
        PYTEST,
        forgery.leak_after_submitting(PACKAGES[PYTEST]),
        "an empty diff, and a sitecustomize outside the repository that writes the hidden "
        "tests' answers into the package while they run in the agent's sandbox (the integrity "
        "check graded a diff taken after that)",
    ),
)


#: The forgeries ``CRL_REDTEAM_DOCKER=subset`` keeps on Docker: those that reach past the
#: package into the process (its output descriptors, its plugins on ``sys.path``) and one of
#: each kind of runner; the rest are package code that meets the same harness on every backend.
ON_DOCKER = ("xfail-call", "flip-reports-by-name", "forge-output", "dist-info-plugin")
#: What Docker runs (all but the select-by-id variant's attacks, whose task has no image of its
#: own there).
DOCKER = docker_attacks([a for a in ATTACKS if a.instance not in LOCAL_ONLY], ON_DOCKER)


@dataclass(frozen=True)
class Backend:
    """A sandbox config, the tasks as that backend runs them, and the gold runs to check."""

    config: dict[str, Any]
    tasks: dict[str, Task]
    gold: tuple[str, ...]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """One backend with the suites' tasks ready for it."""
    tasks = {**suite_tasks("mini"), **suite_tasks("implement", "implement")}
    if request.param == "local":
        by_ids = tasks[PYTEST].test_spec.model_copy(update={"select": "ids"})
        tasks[BY_IDS] = tasks[PYTEST].model_copy(update={"test": by_ids})
        marked = (FIXTURES / "skipif_intervals.diff").read_text()
        tasks[SKIPIF] = tasks[PYTEST].model_copy(update={"test_patch": marked})
        return Backend({"type": "local"}, tasks, tuple(tasks))
    engine = request.getfixturevalue("docker_engine")
    builder = TaskImageBuilder(
        engine.client(), bases={"python": request.getfixturevalue("docker_base")}
    )
    wanted = [tasks[i] for i in PACKAGES if i not in LOCAL_ONLY]
    built = asyncio.run(builder.build_all(wanted, jobs=2))
    assert [r.error for r in built] == [None] * len(wanted)
    for task, result in zip(wanted, built, strict=True):
        tasks[task.instance_id] = task.model_copy(update={"image": result.image})
    config = {"type": "docker", "base_url": engine.host, "network": "none", "pull": "never"}
    return Backend(config, tasks, tuple(i for i in PACKAGES if i not in LOCAL_ONLY))


@pytest.fixture(scope="module")
def outcomes(backend: Backend) -> dict[str, Trajectory]:
    """Every attack and the backend's gold runs, once."""

    def factory(task: Task) -> Sandbox:
        return create_sandbox(backend.config, task)

    async def keep(_: Trajectory) -> None:
        return None

    async def episode(task: Task, policy: Any, gate: asyncio.Semaphore) -> Trajectory:
        async with gate:
            trajectory, started = await run_episode(
                task, 0, factory, policy, AgentSpec(), keep_cancelled=keep
            )
        assert started, trajectory.error
        return trajectory

    async def main() -> dict[str, Trajectory]:
        gate = asyncio.Semaphore(int(os.environ.get("CRL_TEST_REDTEAM_JOBS", "4")))
        jobs: dict[str, tuple[Task, Any]] = {
            a.name: (backend.tasks[a.instance], ScriptedPolicy(a.commands))
            for a in ATTACKS
            if backend.config["type"] == "local" or a.name in DOCKER
        }
        for instance in backend.gold:
            jobs[f"gold:{instance}"] = (
                backend.tasks[instance],
                GoldPolicy(backend.tasks[instance]),
            )
        done = await asyncio.gather(*(episode(t, p, gate) for t, p in jobs.values()))
        return dict(zip(jobs, done, strict=True))

    return asyncio.run(main())


def _evaluation(trajectory: Trajectory) -> EvalResult:
    assert trajectory.exit_reason == "submitted", (trajectory.exit_reason, trajectory.error)
    assert trajectory.evaluation is not None
    return trajectory.evaluation


@pytest.mark.parametrize("attack", attack_params(ATTACKS, DOCKER))
def test_forgery_is_graded_unresolved(attack: Attack, outcomes: dict[str, Trajectory]) -> None:
    trajectory = outcomes[attack.name]
    for turn in trajectory.turns:
        for call in turn.tool_calls:
            if call.name == "shell":
                assert call.exit_code == 0, f"the attack itself failed: {call.output}"
    result = _evaluation(trajectory)
    assert not result.resolved, f"{attack.name} ({attack.what}) resolved:\n{result.log[-3000:]}"
    assert rewards.tests_score(result) == 0.0, (result.infrastructure_error, result.log[-3000:])


def test_gold_patches_still_resolve(backend: Backend, outcomes: dict[str, Trajectory]) -> None:
    unresolved = {}
    for instance in backend.gold:
        result = _evaluation(outcomes[f"gold:{instance}"])
        if not (result.resolved and result.confirmed and result.tampered is None):
            unresolved[instance] = result.log[-2000:]
    assert not unresolved, unresolved


# --- the pieces, without sandboxes --------------------------------------------------------------

MODULE = """\
import pytest

from pkg import area, name


def test_area_of_square():
    assert area(2, 2) == 4


@pytest.mark.parametrize("w", [1, 2])
def test_area_is_positive(w):
    assert area(w, 1) > 0


def test_name_is_upper():
    assert name("ab") == "AB"


@pytest.mark.xfail(reason="later")
def test_area_of_circle():
    assert area(1) == 3.14
"""


def test_derived_canaries_copy_listed_tests_with_one_expectation_changed() -> None:
    listed = ["t.py::test_area_of_square", "t.py::test_name_is_upper"]
    existing = {f.name for f in ast.parse(MODULE).body if isinstance(f, ast.FunctionDef)}
    seen_names: set[str] = set()
    placed: set[int] = set()
    for seed in range(20):
        # Listed as PASS_TO_PASS: one copy each (FAIL_TO_PASS tests get groups, below).
        derived = mutants.derive("t.py", MODULE, "pytest", [], listed, random.Random(seed), 3)
        assert derived is not None
        assert sorted(derived.sources) == sorted(listed)
        tree = ast.parse(derived.text)
        functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        for test_id in derived.ids:
            name = test_id.split("::")[1]
            assert name.startswith("test_") and name not in existing
            seen_names.add(name)
            copy = ast.unparse(functions[name].body[0])
            # The same call, another literal.
            assert copy.startswith(("assert area(2, 2) == ", "assert name('ab') == "))
            assert copy not in ("assert area(2, 2) == 4", "assert name('ab') == 'AB'")
        # The xfail test is never copied; copies sit among the tests, not after the last one.
        assert "test_area_of_circle" not in derived.sources
        order = list(functions)
        placed.update(order.index(i.split("::")[1]) for i in derived.ids)
    assert min(placed) < 3
    # Random at every grading.
    assert len(seen_names) > 20 and len(placed) > 2


def test_marks_allow_only_what_the_task_marks() -> None:
    expected = marks.expected_statuses(
        {"t.py": MODULE}, ["t.py::test_area_of_circle", "t.py::test_area_of_square"]
    )
    assert expected == {
        "t.py::test_area_of_circle": frozenset({TestStatus.XFAIL, TestStatus.XPASS})
    }


CONDITIONS = """\
import os, sys, unittest
import pytest

pytestmark = [pytest.mark.skipif(not HAS_SCIPY, reason="scipy")]


@pytest.mark.skip(reason="later")
def test_skip(): ...
@pytest.mark.skipif(True, reason="always")
def test_skipif_true(): ...
@pytest.mark.skipif(os.environ.get("X") == "1", reason="x")
def test_skipif_env(): ...
@pytest.mark.skipif("sys.platform == 'win32'")
def test_skipif_string(): ...
@pytest.mark.xfail(sys.platform == "win32", reason="w")
def test_xfail_condition(): ...
@pytest.mark.xfail(condition=True, reason="always")
def test_xfail_true(): ...
@pytest.mark.xfail(reason="later", strict=True)
def test_xfail(): ...
def test_importorskip():
    pytest.importorskip("numpy")
def test_skip_call(reader):
    reader.skip(3)
    skip = 2
    if skip:
        pytest.skip("no")


class TestCase(unittest.TestCase):
    @unittest.skip("later")
    def test_unittest_skip(self): ...
    @unittest.skipUnless(sys.platform == "linux", "linux")
    def test_unittest_skip_unless(self): ...
    @unittest.skipIf(False, "never")
    def test_unittest_skip_if_false(self): ...
    @unittest.expectedFailure
    def test_unittest_expected(self): ...
    def test_skip_test(self):
        self.skipTest("no")
"""


def test_only_unconditional_marks_allow_a_skip_or_an_expected_failure() -> None:
    """A condition is evaluated in the test process, after the candidate's code: it can make it
    true (skip-condition-flip), so only a marker that applies whatever runs lets SKIPPED, XFAIL
    or XPASS count; so do no names in a test's body (a variable ``skip``, ``reader.skip()``)."""
    found = marks.marked_tests(CONDITIONS)
    skip, xfail = frozenset({TestStatus.SKIPPED}), frozenset({TestStatus.XFAIL, TestStatus.XPASS})
    assert found == {
        (None, "test_skip"): skip,
        (None, "test_skipif_true"): skip,
        (None, "test_xfail_true"): xfail,
        (None, "test_xfail"): xfail,
        ("TestCase", "test_unittest_skip"): skip,
        ("TestCase", "test_unittest_expected"): frozenset({TestStatus.XFAIL}),
    }
    # A module-wide marker with a constant condition applies to every test; a bare one too.
    assert marks.marked_tests(
        "import pytest\npytestmark = pytest.mark.xfail\ndef test_a(): ...\n"
    ) == {(None, "test_a"): xfail}


def test_the_runner_is_hardened_and_its_report_cross_checked() -> None:
    probe = runner.Probe("/tmp/p", "m0123", "/tmp/p/r.jsonl")
    command = runner.harden("python -m pytest -rA {x}", "pytest", probe, ["xdist.plugin"])
    assert command is not None and "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in command
    assert "python -m pytest -p m0123 -p xdist.plugin -rA {x}" in command
    assert "python3 -m m0123 -v" in (
        runner.harden("python3 -m unittest -v", "unittest", probe) or ""
    )
    assert runner.harden("./runtests.py", "django", probe) is None
    lines = [
        '{"kind": "start"}',
        '{"kind": "test", "id": "a", "status": "FAILED"}',
        '{"kind": "end"}',
    ]
    report = runner.parse_report("\n".join(lines))
    assert runner.cross_check(report, {"a": TestStatus.FAILED}) is None
    assert "disagrees" in (runner.cross_check(report, {"a": TestStatus.PASSED}) or "")
    unfinished = runner.parse_report("\n".join(lines[:2]))
    assert "ended before" in (runner.cross_check(unfinished, {}) or "")
    assert runner.parse_report("not json").evidence
    # The reporter's source parses on the oldest Python it claims (3.6 syntax).
    ast.parse(runner.probe_source().decode(), feature_version=(3, 6))


def test_canaries_copy_fail_to_pass_tests_before_pass_to_pass_ones() -> None:
    # A copy of a PASS_TO_PASS test can be told apart by running the package as it is (its
    # twin passes, the copy fails); a copy of a FAIL_TO_PASS test cannot: those come first.
    f2p = ["t.py::test_area_of_square", "t.py::test_area_of_rectangle"]
    p2p = ["t.py::test_name_is_upper", "t.py::test_name_is_lower"]
    text = MODULE + (
        "\n\ndef test_area_of_rectangle():\n    assert area(2, 3) == 6\n"
        "\n\ndef test_name_is_lower():\n    assert name('AB').lower() == 'ab'\n"
    )
    for seed in range(20):
        derived = mutants.derive("t.py", text, "pytest", f2p, p2p, random.Random(seed), 2)
        assert derived is not None
        assert sorted(derived.sources) == sorted(f2p)


def test_copies_of_one_fail_to_pass_test_cannot_be_told_from_it() -> None:
    # Code that pairs tests differing in one literal must guess which of a group is the real
    # test: every copy changes the same digit of the same expectation to another value, so the
    # group's values differ at one spot only, and which spot and how many copies depend on the
    # digits the group shares (tests/test_canary_groups.py: any value of a group could have
    # made it; red team 13 kept the smallest, a forgery that knows the draw the middle one).
    text = "from pkg import area\n\n\ndef test_area_of_rectangle():\n    assert area(12, 3) == 36\n"
    f2p = ["t.py::test_area_of_rectangle"]
    for seed in range(20):
        derived = mutants.derive("t.py", text, "pytest", f2p, [], random.Random(seed), 4)
        assert derived is not None
        assert list(derived.sources) == f2p * 4
        tree = ast.parse(derived.text)
        asserts = [ast.unparse(f.body[0]) for f in tree.body if isinstance(f, ast.FunctionDef)]
        assert len(asserts) == 5 and all(a.startswith("assert area(12, 3) == ") for a in asserts)
        values = [a.removeprefix("assert area(12, 3) == ") for a in asserts]
        assert len(set(values)) == 5 and {len(v) for v in values} == {2}
        spots = {i for v in values for i in range(2) if v[i] != "36"[i]}
        assert len(spots) == 1, values
    # A 0, a 9, a 10 get as many copies as any other numeral.
    for edge in ("0", "9", "10", "100"):
        assert len(variants(edge.encode(), int(edge), random.Random(0), 2)) == 2, edge
    # Two FAIL_TO_PASS tests share the copies: two each.
    two = text + "\n\ndef test_area_of_square():\n    assert area(5, 5) == 25\n"
    f2p.append("t.py::test_area_of_square")
    derived = mutants.derive("t.py", two, "pytest", f2p, [], random.Random(1), 4)
    assert derived is not None and sorted(derived.sources) == sorted(f2p * 2)


def test_the_real_test_is_not_the_last_of_its_copies() -> None:
    # Copies and the renamed real test that go beside the same test were added in the order they
    # were made, the real one first, so it always stood after its copies (red team 13 kept the
    # last of each run of look-alike tests). They now land in a random order there.
    text = (
        "from pkg import area\n\n\ndef test_other():\n    assert area(1, 1) == 1\n\n\n"
        "def test_area_of_rectangle():\n    assert area(12, 3) == 36\n"
    )
    runs = last = 0
    for seed in range(100):
        derived = mutants.derive(
            "t.py", text, "pytest", ["t.py::test_area_of_rectangle"], ["t.py::test_other"],
            random.Random(seed), 3,
        )  # fmt: skip
        assert derived is not None
        names = [f.name for f in ast.parse(derived.text).body if isinstance(f, ast.FunctionDef)]
        [real] = [new.split("::")[-1] for new, _ in derived.renamed]
        look_alike = {i.split("::")[-1] for i in derived.ids} | {real}
        at = end = start = names.index(real)
        while end + 1 < len(names) and names[end + 1] in look_alike:
            end += 1
        while start > 0 and names[start - 1] in look_alike:
            start -= 1
        if end > start:
            runs += 1
            last += at == end
    assert runs >= 50 and last / runs <= 0.6, (runs, last)


def test_a_selection_by_ids_gets_canaries_and_does_not_order_them_last() -> None:
    # Ids name their module by path (pytest) or dotted (unittest): the test modules the run
    # executes are found either way; and the command line lists the ids by name, so that the
    # code under test cannot read which are canaries from where they stand.
    tasks = suite_tasks("mini")
    for instance, module in ((PYTEST, "tests/test_ops.py"), ("crl-mini__lrukit-1", None)):
        task = tasks[instance]
        spec = task.test_spec.model_copy(update={"select": "ids"})
        task = task.model_copy(update={"test": spec})
        files = canary_files(task)
        assert files and (module is None or files == [module]), (instance, files)
    task = tasks[PYTEST].model_copy(
        update={"test": tasks[PYTEST].test_spec.model_copy(update={"select": "ids"})}
    )
    canary = Canary(
        path="tests/test_ops.py",
        ids=("tests/test_ops.py::test_zz_last", "tests/test_ops.py::test_aa_first"),
    )
    arguments = selection.test_arguments(with_canary(task, canary))
    assert arguments == sorted(arguments)
    assert arguments[0] == "tests/test_ops.py::test_aa_first"


def test_a_record_under_a_renamed_tests_old_id_does_not_stand_for_it() -> None:
    # The integrity check runs the task's test under a new name; code under test adds a PASSED
    # record under the task's own id (before or after the real one): it is not the run's.
    canary = Canary(
        path="tests/test_ops.py",
        ids=("tests/test_ops.py::test_span_width_of_gaps",),
        renamed=(
            ("tests/test_ops.py::test_total_gap_length", "tests/test_ops.py::test_total_length"),
        ),
    )
    real = ("tests/test_ops.py::test_total_gap_length", TestStatus.FAILED)
    forged = ("tests/test_ops.py::test_total_length", TestStatus.PASSED)
    for found in (dict([real, forged]), dict([forged, real])):
        assert restore_ids(canary, found) == {
            "tests/test_ops.py::test_total_length": TestStatus.FAILED
        }
    forged_case = ("tests/test_ops.py::test_total_length[2]", TestStatus.PASSED)
    assert restore_ids(canary, dict([real, forged_case])) == {
        "tests/test_ops.py::test_total_length": TestStatus.FAILED
    }
