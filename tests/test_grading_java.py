"""Canaries for JUnit test runs (harness/mutants_java.py): copies of a task's own ``@Test``
methods with one literal expectation changed, planted among its methods, that must fail.

Through Maven on the Java fixture (``stringkit``, JUnit 5): the gold patch still resolves with
canaries in the run (the real test renamed like its copies, graded under the task's id), and
package code that starts a process rewriting Surefire's reports (every failure removed, after
Maven wrote them and before the harness reads them) is caught: its canaries pass, so the run
is tampered with, reward 0. Without canaries that forgery resolves.
"""

from __future__ import annotations

import random
import re
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from crl_worker import rewards
from crl_worker.harness import mutants_java
from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.literals import Words, text_vocabulary, word_variants
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox.registry import create_sandbox
from tests.fixtures.repos import STRINGKIT_FAIL_TO_PASS, STRINGKIT_PASS_TO_PASS, java_repo

CLASS = "com.example.text.StringsTest"
TESTS = Path(__file__).parent / "fixtures/stringkit/tests/src/test/java/com/example/text"

#: Package code that starts a process of its own (outliving the test JVM) which removes every
#: failure from Surefire's reports as soon as they are written, atomically.
FORGER = r"""
    static {
        try {
            new ProcessBuilder("setsid", "python3", "forge.py").inheritIO().start();
        } catch (Exception ignored) {
        }
    }
"""
FORGE_PY = """\
import glob, os, re, time
import xml.etree.ElementTree as ET
# Until the reports have stayed as forged for a few seconds (Maven has finished writing
# them), at most two minutes: the grader reads its output until this process is gone too.
end, forged_at = time.time() + 120, None
while time.time() < end and (forged_at is None or time.time() - forged_at < 10):
    for path in glob.glob("target/surefire-reports/TEST-*.xml"):
        try:
            text = open(path).read()
            ET.fromstring(text)  # whole: Maven has finished writing it
        except (OSError, ET.ParseError):
            continue
        forged = re.sub(r"<failure\\b.*?</failure>|<failure\\b[^>]*/>", "", text, flags=re.S)
        if forged != text:
            with open(path + ".tmp", "w") as out:
                out.write(forged)
            os.replace(path + ".tmp", path)
            forged_at = time.time()
    time.sleep(0.005)
"""


def test_copies_of_a_junit_test_change_one_literal_of_its_expectation() -> None:
    text = (TESTS / "StringsTest.java").read_text()
    listed = [f"{CLASS}#abbreviateCutsLongText", f"{CLASS}#abbreviateNeverExceedsWidth"]
    spots: set[int] = set()
    for seed in range(20):
        derived = mutants_java.derive("StringsTest.java", text, listed, [], random.Random(seed), 4)
        assert derived is not None
        # The parameterized test is not copied; the other one four times, in one group.
        assert derived.sources == (f"{CLASS}#abbreviateCutsLongText",) * 4
        values = re.findall(
            r'assertEquals\("([^"]*)", Strings\.abbreviate\("Hello, w', derived.text
        )
        assert len(values) == 5 and len(set(values)) == 5 and "Hello, ..." in values
        # The same one word changed, to another word of the class: none reads as a typo.
        words = {v.removesuffix(", ...") for v in values}
        assert all(v.endswith(", ...") for v in values) and len(words) == 5, values
        assert all(w.lower() in text_vocabulary(text) for w in words), values
        spots |= words
    # The call's own input ("Hello, world!") gives a copy its word first.
    assert "World" in spots and len(spots) > 5
    # PASS_TO_PASS tests only where no FAIL_TO_PASS one qualifies; assertThrows is not copied.
    p2p = mutants_java.derive(
        "StringsTest.java", text, [], list(STRINGKIT_PASS_TO_PASS), random.Random(1), 4
    )
    assert p2p is not None and f"{CLASS}#abbreviateRejectsTinyWidth" not in p2p.sources
    assert (
        mutants_java.derive("StringsTest.java", "class X {}", listed, [], random.Random(1), 4)
        is None
    )


def test_a_word_of_the_input_replaces_only_a_word_as_old_as_itself() -> None:
    """The call's input words come first, but only those the repository had before the task
    when the original word was one (and new for new): otherwise a list of the repository's
    words would tell the original apart from its copies."""
    words = Words(Counter(hello=2, world=1, apple=1, pear=1), Counter(hello=1, pear=1))
    for seed in range(20):
        new_close = replace(words, close=frozenset({"world", "apple"}))
        texts = word_variants(b'"Hello"', (1, 6), new_close, random.Random(seed), 1)
        assert texts == [b'"Pear"'], texts  # the one old word; the input's are new
        old_close = replace(words, close=frozenset({"pear"}))
        assert word_variants(b'"Hello"', (1, 6), old_close, random.Random(seed), 1) == [b'"Pear"']


def test_a_comment_above_the_copied_test_does_not_mark_it() -> None:
    """A copy carries the comment lines right above the method it copies, and is never placed
    between another method and its comment: the member under a comment is not the real test
    (it was in two draws of three when copies had no comment)."""
    doc = "    /** Long text is cut, the ellipsis within the width. */\n"
    text = (TESTS / "StringsTest.java").read_text()
    text = text.replace(
        "    @Test\n    void abbreviateCutsLongText",
        doc + "    @Test\n    void abbreviateCutsLongText",
    )
    text = text.replace(
        "    @Test\n    void reversesWords",
        "    // Words, not letters.\n    @Test\n    void reversesWords",
    )
    listed = [f"{CLASS}#abbreviateCutsLongText"]
    for seed in range(40):
        derived = mutants_java.derive("StringsTest.java", text, listed, [], random.Random(seed), 4)
        assert derived is not None and len(derived.ids) == 4
        # Every copy and the real test under the same comment, each comment over its method.
        assert derived.text.count(doc) == 5, derived.text
        for comment, body in (
            (doc, 'Strings.abbreviate("Hello'),
            ("// Words, not letters.\n", "reverseWords("),
        ):
            for at in [m.end() for m in re.finditer(re.escape(comment), derived.text)]:
                member = derived.text[at : derived.text.index("}", at)]
                assert member.lstrip().startswith("@Test") and body in member, derived.text


def test_unsafe_junit_tests_are_not_copied() -> None:
    text = """\
package p;
class T {
    @Test(expected = IllegalStateException.class)
    public void expects() { assertEquals(3, f()); }
    @Test @Disabled void disabled() { assertEquals(3, f()); }
    @Test void assumes() { assumeTrue(on()); assertEquals(3, f()); }
    @Test void delta() { assertEquals(3.0, g(), 0.5); }
    @Test void message() { assertEquals("why", 3, f()); }
    @Test void nested() { if (on()) { assertEquals(3, f()); } }
    @Test void copied() throws Exception { assertEquals(-45L, f()); }
}
"""
    ids = [f"p.T#{n}" for n in ("expects", "disabled", "assumes", "delta", "message", "nested")]
    assert mutants_java.derive("T.java", text, ids, [], random.Random(0), 4) is None
    derived = mutants_java.derive("T.java", text, [*ids, "p.T#copied"], [], random.Random(0), 4)
    assert derived is not None and set(derived.sources) == {"p.T#copied"}
    values = re.findall(r"assertEquals\((-\d+L), f\(\)\); }", derived.text)
    assert len(set(values)) == 5 and "-45L" in values


@pytest.mark.skipif(shutil.which("mvn") is None, reason="Maven (mvn) is not installed")
async def test_junit_canaries_catch_rewritten_reports_and_spare_the_gold_patch(
    tmp_path: Path,
) -> None:
    fixture = java_repo(tmp_path)
    task = fixture.task
    assert list(task.fail_to_pass) == list(STRINGKIT_FAIL_TO_PASS)
    source = "src/main/java/com/example/text/Strings.java"
    async with create_sandbox({"type": "local"}, task) as box:
        gold = await evaluate(box, task, model_patch=task.patch, canary=True)
        assert gold.resolved and gold.tampered is None, gold.log[-3000:]
        assert "canary tests planted" in gold.log
        # The real test ran under a drawn name (Surefire reports class#method) and was graded
        # under the task's id.
        report = await box.read_file(
            "target/surefire-reports/TEST-com.example.text.StringsTest.xml"
        )
        assert b'name="abbreviateCutsLongText"' not in report and b"<testcase" in report
        outcomes = {o.name: o.status for o in gold.fail_to_pass}
        assert outcomes[f"{CLASS}#abbreviateCutsLongText"] == TestStatus.PASSED
        await box.reset()
        code = (await box.read_file(source)).decode()
        at = code.index("{", code.index("class Strings")) + 1
        await box.write_file(source, (code[:at] + FORGER + code[at:]).encode())
        await box.write_file("forge.py", FORGE_PY.encode())
        forged = await evaluate(box, task, canary=True)
    assert not forged.resolved, forged.log[-3000:]
    assert forged.tampered is not None and "canary" in forged.tampered, forged.log[-3000:]
    assert rewards.tests_score(forged) == 0.0


BUILT = """\
package p;

class T {
    @Test
    void parses() {
        assertEquals(new Interval(-3, -1), Interval.parse("[-3, -1]"));
    }

    @Test
    void splits() {
        assertEquals(List.of(4, 7), Words.numbers("4 7"));
    }

    @Test
    void near() {
        assertEquals(new ApproxValue(3), Words.x());
    }
}
"""


def test_an_expected_value_built_from_literals_has_one_of_them_changed() -> None:
    """``assertEquals(new Interval(-3, -1), ...)`` had no copy at all: a result equal to every
    Interval passed it unseen. Its copies now change one argument (a loose-looking class's
    never)."""
    ids = ["p.T#parses", "p.T#splits", "p.T#near"]
    for seed in range(4):
        derived = mutants_java.derive("T.java", BUILT, ids, [], random.Random(seed), 4)
        # At most four copies: a digit gives as many as it has digits on each side (-1: one).
        assert derived is not None and 3 <= len(derived.ids) <= 4
        assert set(derived.sources) <= {"p.T#parses", "p.T#splits"}
        built = re.findall(r"assertEquals\((new Interval\(.*?\)|List\.of\(.*?\)), ", derived.text)
        assert len(set(built)) == 2 + len(derived.ids), derived.text  # the real values, copies
        assert derived.text.count("new ApproxValue(3)") == 1
