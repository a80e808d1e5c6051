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

import pytest

from crl_worker.harness import canary, mutants
from crl_worker.harness.result import TestStatus
from crl_worker.tasks.model import Task, TestSpec
from tests.fixtures.canary_attacks import Module, Tally, mini_modules, try_names, try_values

#: How much better than chance any guess may pick the real test (chance is about 0.26 here;
#: the noise of this many gradings is about 0.045).
MARGIN = 0.15
GRADINGS = 12
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
