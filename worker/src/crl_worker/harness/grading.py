"""Grading: a status map and the FAIL_TO_PASS / PASS_TO_PASS lists in, a verdict out. Pure.

The rules follow SWE-bench's ``grading.py`` where it has one, and say where they are stricter:

- A FAIL_TO_PASS test succeeds when it PASSED; FAILED, ERROR, MISSING (not in the output at
  all), SKIPPED, XFAIL and XPASS do not, unless the task's own tests mark that test so
  (``expected``: a ``skip``/``xfail`` marker or ``expectedFailure`` in the test file as the
  test patch leaves it, :mod:`crl_worker.harness.marks`). SWE-bench counts XFAIL as a pass and
  leaves a skipped FAIL_TO_PASS test out of both counts; code under test can make a running
  test expected to fail (``pytest.xfail()``) or skip it, so neither is evidence of a fix here.
- A PASS_TO_PASS test is kept when it PASSED, XFAIL, XPASS or SKIPPED (a suite may skip a test
  in some environments; SWE-bench does not count that as a regression either); FAILED, ERROR
  and MISSING break it.
- Resolved: every FAIL_TO_PASS test succeeds and every PASS_TO_PASS test is kept.
- Fractions: the share of each list that succeeds; 1.0 for an empty list (SWE-bench's
  convention).

Matching ids: an id the log reports exactly wins. Otherwise the id may be a prefix of reported
ids that continue with a space, ``[`` or ``(``: SWE-bench stores ids cut at the first space
(``test_x[a`` for ``test_x[a b]``), and a JUnit id may name a parametrized method whose runs are
reported one by one (``Class#m`` for ``Class#m(int)[1]``, ``Class#m(int)[2]``). All reported ids
it stands for are combined: the worst status counts (a failed run fails the test), and only
passing and skipped runs make a pass. ``pkg.Class::method`` (Defects4J) and
``pkg.Class#method`` (Multi-SWE-bench) are the same id.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from crl_worker.harness.result import TestOutcome, TestStatus

#: Statuses that count as a pass for a FAIL_TO_PASS test (others only where the task marks it).
PASSING = frozenset({TestStatus.PASSED})
#: Statuses that keep a PASS_TO_PASS test (not a regression).
KEPT = frozenset({TestStatus.PASSED, TestStatus.XFAIL, TestStatus.XPASS, TestStatus.SKIPPED})

# Characters that may follow an id cut short: a space (SWE-bench cut at the first one), the
# parameters of a pytest or JUnit parametrized test, a Java signature.
_CONTINUATIONS = (" ", "[", "(")


_UNITTEST_LONG = re.compile(r"^(?P<name>[^\s()]+) \((?P<where>[\w.]+)\)$")
# SWE-bench's log parser shortens a parameter that is an absolute path to its last part
# (``test_stdin[/testbed/tests/mymodule.py]`` is listed as ``test_stdin[/mymodule.py]``).
_SHORTENED_PATH = re.compile(r"^(?P<main>[^\[]+)\[(?P<name>/[^/\[\]*]+)\]$")


class StatusIndex:
    """A status map prepared for id lookups (exact, alternative separators, cut-short prefix)."""

    def __init__(self, statuses: Mapping[str, TestStatus]):
        self._statuses = dict(statuses)
        self._keys = sorted(self._statuses)

    def __len__(self) -> int:
        return len(self._statuses)

    def _prefixed(self, prefix: str) -> list[str]:
        start = bisect.bisect_left(self._keys, prefix)
        found = []
        for key in self._keys[start:]:
            if not key.startswith(prefix):
                break
            if len(key) > len(prefix) and key[len(prefix)] in _CONTINUATIONS:
                found.append(key)
        return found

    def lookup(self, test_id: str) -> TestStatus:
        """The status the log gives ``test_id`` (``MISSING`` when it does not report it)."""
        candidates = _spellings(test_id)
        for candidate in candidates:
            status = self._statuses.get(candidate)
            if status is not None:
                return status
        for candidate in candidates:
            matches = self._prefixed(candidate)
            if matches:
                return combine(self._statuses[key] for key in matches)
        return self._shortened_path(test_id.strip())

    def _shortened_path(self, test_id: str) -> TestStatus:
        """A listed ``test[/name]`` matches the reported ``test[/any/path/name]`` (see
        :data:`_SHORTENED_PATH`; pylint-dev__pylint-7080's ``test_stdin[/mymodule.py]``)."""
        shortened = _SHORTENED_PATH.match(test_id)
        if shortened is None:
            return TestStatus.MISSING
        head, name = shortened.group("main") + "[/", shortened.group("name") + "]"
        matches = []
        for key in self._keys[bisect.bisect_left(self._keys, head) :]:
            if not key.startswith(head):
                break
            if key.endswith(name) and not key.startswith(head + "/") and "*" not in key:
                matches.append(key)
        return combine(self._statuses[key] for key in matches) if matches else TestStatus.MISSING


def _spellings(test_id: str) -> list[str]:
    test_id = test_id.strip()
    spellings = [test_id]
    # Java ids: Defects4J writes Class::method, Multi-SWE-bench Class#method.
    if "::" in test_id and "/" not in test_id and not test_id.endswith(".py"):
        spellings.append(test_id.replace("::", "#", 1))
    if "#" in test_id:
        spellings.append(test_id.replace("#", "::", 1))
    # unittest ids as Python 3.11+ prints them ("test_x (module.Class.test_x)"); the parsers
    # record the older "test_x (module.Class)".
    match = _UNITTEST_LONG.match(test_id)
    if match is not None and match.group("where").endswith("." + match.group("name")):
        where = match.group("where")[: -len(match.group("name")) - 1]
        spellings.append(f"{match.group('name')} ({where})")
    return spellings


def combine(statuses: Iterable[TestStatus]) -> TestStatus:
    """One status for several runs of one test: any error or failure wins; runs that all pass or
    skip pass (all skipped: skipped)."""
    seen = set(statuses)
    if not seen:
        return TestStatus.MISSING
    for status in (TestStatus.ERROR, TestStatus.FAILED, TestStatus.MISSING):
        if status in seen:
            return status
    if TestStatus.PASSED in seen:
        return TestStatus.PASSED
    if TestStatus.XPASS in seen:
        return TestStatus.XPASS
    if TestStatus.XFAIL in seen:
        return TestStatus.XFAIL
    return TestStatus.SKIPPED


@dataclass(frozen=True)
class Grade:
    """The verdict on one run: each listed test's outcome, the fractions, resolved."""

    fail_to_pass: list[TestOutcome] = field(default_factory=list)
    pass_to_pass: list[TestOutcome] = field(default_factory=list)
    #: Statuses besides PASSED that count for a FAIL_TO_PASS test the task marks so.
    expected: Mapping[str, frozenset[TestStatus]] = field(default_factory=dict)

    def passes(self, outcome: TestOutcome) -> bool:
        """Whether a FAIL_TO_PASS ``outcome`` counts as a pass."""
        return outcome.status in PASSING or outcome.status in self.expected.get(
            outcome.name, frozenset()
        )

    @property
    def fail_to_pass_fraction(self) -> float:
        """Share of FAIL_TO_PASS tests that pass (1.0 when there are none)."""
        if not self.fail_to_pass:
            return 1.0
        return sum(map(self.passes, self.fail_to_pass)) / len(self.fail_to_pass)

    @property
    def pass_to_pass_fraction(self) -> float:
        """Share of PASS_TO_PASS tests that are kept (1.0 when there are none)."""
        return _fraction(self.pass_to_pass, KEPT)

    @property
    def resolved(self) -> bool:
        """Every FAIL_TO_PASS test passes and every PASS_TO_PASS test is kept."""
        return all(map(self.passes, self.fail_to_pass)) and all(
            o.status in KEPT for o in self.pass_to_pass
        )

    @property
    def failing(self) -> list[str]:
        """Ids of the listed tests that did not succeed, FAIL_TO_PASS first."""
        return [o.name for o in self.fail_to_pass if not self.passes(o)] + [
            o.name for o in self.pass_to_pass if o.status not in KEPT
        ]


def _fraction(outcomes: Sequence[TestOutcome], good: frozenset[TestStatus]) -> float:
    if not outcomes:
        return 1.0
    return sum(o.status in good for o in outcomes) / len(outcomes)


def grade(
    statuses: Mapping[str, TestStatus] | StatusIndex,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    *,
    durations: Mapping[str, float] | None = None,
    expected: Mapping[str, frozenset[TestStatus]] | None = None,
) -> Grade:
    """Grade one test run: look every listed test up in ``statuses``. ``expected`` gives, by
    FAIL_TO_PASS id, the statuses besides PASSED that count for a test the task itself marks
    (skipped or expected to fail)."""
    index = statuses if isinstance(statuses, StatusIndex) else StatusIndex(statuses)
    times = durations or {}

    def outcomes(ids: Sequence[str]) -> list[TestOutcome]:
        return [
            TestOutcome(name=test_id, status=index.lookup(test_id), duration=times.get(test_id))
            for test_id in ids
        ]

    return Grade(
        fail_to_pass=outcomes(fail_to_pass),
        pass_to_pass=outcomes(pass_to_pass),
        expected=dict(expected or {}),
    )
