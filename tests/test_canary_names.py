"""Issue 30: canary names an attacker cannot tell from the task's own tests.

Code that pairs tests differing in one literal finds a FAIL_TO_PASS test and its copies; it must
then guess which of the group is real (harness/mutants.py). Their names must not tell it: the
attacker of tests/fixtures/canary_attacks.py knows the repository's names before the task and
scores each name of the group as a person would write one (word and character likelihoods,
known words, length, distance to the nearest known name or to the rest of the group). Over
many gradings of the bundled mini suite's test modules, no score's highest or lowest pick may
find the real test more often than chance by more than :data:`MARGIN` (before the renaming of
the copied test and names drawn to its profile: up to 0.48 over chance).
"""

from __future__ import annotations

import random
import re

import pytest

from crl_worker.harness import canary, mutants, mutants_java
from crl_worker.harness.result import TestStatus
from crl_worker.tasks.model import Task, TestSpec
from tests.fixtures.canary_attacks import (
    Module,
    Tally,
    by_position,
    mini_modules,
    stringkit_module,
    try_names,
    try_values,
)

#: How much better than chance any guess may pick the real test (chance is about 0.26 here;
#: the noise of this many gradings is about 0.03).
MARGIN = 0.15
GRADINGS = 30
#: The same for the strings of one module's groups (20 or more: the noise is about 0.09).
STRING_MARGIN = 0.2


@pytest.fixture(scope="module")
def gradings(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Module, mutants.Derived]]:
    """:data:`GRADINGS` derivations of canaries for each test module of the mini suite."""
    found: list[tuple[Module, mutants.Derived]] = []
    for module in mini_modules(tmp_path_factory.mktemp("mini")):
        for seed in range(GRADINGS):
            derived = mutants.derive(
                module.path,
                module.text,
                module.log_format,
                module.fail_to_pass,
                module.pass_to_pass,
                random.Random(seed),
                4,
            )
            assert derived is not None
            found.append((module, derived))
    return found


def test_no_name_score_picks_the_real_test_out_of_its_copies(
    gradings: list[tuple[Module, mutants.Derived]],
) -> None:
    tally = Tally()
    for module, derived in gradings:
        try_names(module, derived, tally)
    assert tally.gradings >= 6 * GRADINGS
    advantage = tally.advantage()
    assert max(advantage.values()) <= MARGIN, sorted(advantage.items(), key=lambda kv: -kv[1])


TWO = """\
import pytest

from pkg import area


@pytest.mark.parametrize("w", [3])
def test_area_of_rectangle(w):
    assert area(w, 4) == 12


def test_area_of_square(request):
    assert area(2, 2) == 4
"""


def test_a_renamed_test_is_graded_under_the_task_id() -> None:
    task_ids = ["t.py::test_area_of_rectangle[3]", "t.py::test_area_of_square"]
    derived = mutants.derive("t.py", TWO, "pytest", task_ids, [], random.Random(3), 4)
    assert derived is not None
    # The test that reads ``request`` (its own node, its name) keeps its name.
    assert [old for _, old in derived.renamed] == ["t.py::test_area_of_rectangle"]
    new = derived.renamed[0][0]
    assert "def test_area_of_rectangle(" not in derived.text
    assert f"def {new.split('::')[1]}(w):\n    assert area(w, 4) == 12" in derived.text
    planted = canary.Canary("t.py", derived.ids, text=derived.text, renamed=derived.renamed)
    task = Task(
        instance_id="x__y-1",
        repo="x/y",
        base_commit="0" * 40,
        patch="",
        test_patch="",
        fail_to_pass=task_ids,
        pass_to_pass=[],
        test=TestSpec(command="python -m pytest {tests}", log_format="pytest"),
    )
    run = canary.with_canary(task, planted)
    assert run.fail_to_pass[:2] == [f"{new}[3]", "t.py::test_area_of_square"]
    reported = {f"{new}[3]": TestStatus.PASSED, derived.ids[0]: TestStatus.FAILED}
    assert canary.restore_ids(planted, reported) == {
        "t.py::test_area_of_rectangle[3]": TestStatus.PASSED,
        derived.ids[0]: TestStatus.FAILED,
    }


def test_no_dictionary_picks_the_real_string_out_of_its_copies(
    gradings: list[tuple[Module, mutants.Derived]],
) -> None:
    # A string expectation changed by a letter reads as a typo ("hellp"); changed by a word of
    # the module (an old word for an old one, a new for a new), each value of the group reads
    # as the file's words. Per module (the string groups are in a few): each with enough of
    # them must keep either guess (most or fewest known words) within STRING_MARGIN of chance
    # (before: 0.28 over chance on slugkit-1's "hello").
    checked = 0
    for module in {m.instance: m for m, _ in gradings}.values():
        hits: list[tuple[float, float, float]] = []
        for _, derived in (g for g in gradings if g[0] is module):
            try_values(module, derived, hits)
        if len(hits) < 20:
            continue
        checked += 1
        most = sum(h - c for h, _, c in hits) / len(hits)
        least = sum(h - c for _, h, c in hits) / len(hits)
        assert max(most, least) <= STRING_MARGIN, (module.instance, most, least, len(hits))
    assert checked >= 2


#: JUnit gradings of the Java fixture's class (one group: a test and four copies, chance 0.2;
#: the noise of this many is about 0.05).
JUNIT_GRADINGS = 60


def test_no_name_score_picks_the_real_junit_test_out_of_its_copies() -> None:
    # Before names.py drew the Java names and the real test was renamed: the highest word
    # bigram score picked it 0.66 over chance, the fewest known words 0.60.
    module = stringkit_module()
    tally = Tally()
    for seed in range(JUNIT_GRADINGS):
        derived = mutants_java.derive(
            module.path,
            module.text,
            module.fail_to_pass,
            module.pass_to_pass,
            random.Random(seed),
            4,
        )
        assert derived is not None and derived.renamed
        try_names(module, derived, tally)
    assert tally.gradings == JUNIT_GRADINGS
    advantage = tally.advantage()
    assert max(advantage.values()) <= MARGIN, sorted(advantage.items(), key=lambda kv: -kv[1])


JUNIT = """\
package p;

import org.junit.jupiter.api.Test;

class AreaTest {
    @Test
    void areaOfRectangle() {
        assertEquals(45, Area.of(5, 9));
    }

    @Test
    void areaOfSquare() {
        assertEquals(4, Area.of(2, 2));
    }
}
"""


def test_a_renamed_junit_test_is_graded_under_the_task_id() -> None:
    task_ids = ["p.AreaTest#areaOfRectangle"]
    derived = mutants_java.derive("AreaTest.java", JUNIT, task_ids, [], random.Random(5), 4)
    assert derived is not None and [old for _, old in derived.renamed] == task_ids
    new = derived.renamed[0][0]
    assert "void areaOfRectangle()" not in derived.text
    name = new.split("#")[1]
    assert name[:1].islower() and not name.startswith("test")  # the class's style
    assert f"void {name}() {{\n        assertEquals(45, Area.of(5, 9));" in derived.text
    planted = canary.Canary(
        "AreaTest.java", derived.ids, text=derived.text, renamed=derived.renamed
    )
    reported = {new: TestStatus.PASSED, derived.ids[0]: TestStatus.FAILED}
    assert canary.restore_ids(planted, reported) == {
        task_ids[0]: TestStatus.PASSED,
        derived.ids[0]: TestStatus.FAILED,
    }


@pytest.mark.parametrize(
    ("change", "keep"),
    [
        # Its name elsewhere in the class (a method source, a helper call), or in the command.
        ("// see areaOfRectangle\n", ""),
        ("", "mvn test -Dtest=AreaTest#areaOfRectangle"),
        ("", "mvn test -Dtest='AreaTest#area*'"),
        # Code that can read a test's own name, or orders tests by it.
        ("@BeforeEach void setUp(TestInfo info) { name = info.getTestMethod(); }\n", ""),
        ("@Rule public TestName name = new TestName();\n", ""),
        ('@DisplayName("area") void x() {}\n', ""),
        ("void who() { Thread.currentThread().getStackTrace(); }\n", ""),
        ("@TestMethodOrder(MethodOrderer.MethodName.class)\n", ""),
        ("@ExtendWith(Recorder.class)\n", ""),
        ("extends", ""),
    ],
)
def test_a_junit_test_that_may_see_its_name_keeps_it(change: str, keep: str) -> None:
    if change == "extends":
        text = JUNIT.replace("class AreaTest {", "class AreaTest extends Base {")
    elif change.startswith(("@TestMethodOrder", "@ExtendWith")):
        text = JUNIT.replace("class AreaTest", change + "class AreaTest")
    else:
        text = JUNIT.replace(
            "    @Test\n    void areaOfSquare", "    " + change + "    @Test\n    void areaOfSquare"
        )
    ids = ["p.AreaTest#areaOfRectangle"]
    derived = mutants_java.derive("AreaTest.java", text, ids, [], random.Random(5), 4, keep=keep)
    assert derived is not None and len(derived.ids) == 4
    assert derived.renamed == () and "void areaOfRectangle() {" in derived.text


def test_no_position_picks_the_real_test_out_of_its_copies(
    gradings: list[tuple[Module, mutants.Derived]],
) -> None:
    # A test patch adds its tests in a block; copies placed anywhere while the real test stayed
    # in its block would be told apart by where they stand (an attacker review: 0.69 against a
    # chance of 0.20 on intervals-1 before the real test moved too).
    per_module: dict[str, list[tuple[float, float]]] = {}
    for module, derived in gradings:
        pick = by_position(module, derived)
        if pick is not None:
            per_module.setdefault(module.instance, []).append(pick)
    assert sum(map(len, per_module.values())) >= 4 * GRADINGS
    advantage = {
        instance: sum(hit - chance for hit, chance in rows) / len(rows)
        for instance, rows in per_module.items()
    }
    assert max(advantage.values()) <= MARGIN, advantage


GREETINGS = '''\
from pkg import shout, whisper


def test_whisper():
    assert whisper("quiet please") == "quiet please..."


def test_shout():
    """Loud: upper case and a bang."""
    assert shout("hello world") == "HELLO!"
'''


def test_a_copys_word_comes_from_the_calls_input_first() -> None:
    """Python copies change a word of a string expectation to another word of the module,
    the test's own input strings first (not its docstring): a copy shares as much with the
    call's input as the original does, so overlap with the input does not pick the original."""
    ids = ["t.py::test_shout"]
    for seed in range(20):
        derived = mutants.derive("t.py", GREETINGS, "pytest", ids, [], random.Random(seed), 4)
        assert derived is not None
        values = set(re.findall(r'shout\("hello world"\) == "(\w+)!"', derived.text))
        # The input's other word in every group; the docstring's words only after it.
        assert len(values) == 5 and {"HELLO", "WORLD"} <= values, derived.text
