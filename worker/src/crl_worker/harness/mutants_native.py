"""Canaries for Go and Rust test files (the polyglot exercises' hidden tests).

The candidate's code is compiled into the same test binary as the hidden tests, so it can print
the runner's framing itself (``--- PASS: TestX`` for test2json, ``test x ... ok`` for libtest)
and exit before any test runs. Canaries are tests that must fail: a run in which one of them is
reported passing was forged. :func:`derive` plants :data:`~crl_worker.harness.canary.COUNT` of
them in one hidden test file, at every grading anew:

- **the same calls**: each is a copy of one of the file's top-level tests (Go: ``func TestX(t
  *testing.T)``; Rust: a ``#[test] fn x()``, its other attributes, ``#[ignore]`` included,
  kept), its body run first (Go: inside a closure, so that a ``return`` or ``t.Fatal`` ends
  only the body), then one failing comparison of two different numbers (Go: ``t.Fatalf`` when
  they differ; Rust: ``assert_eq!``). This is the weaker fallback of the Python canaries (no
  literal expectation of the body is changed: Exercism's Go tests keep their expectations in
  case tables, often in another file, where a change cannot be made safely): code that reads the
  test file could spare the copies that end in such a comparison, which is why the harness runs
  the test binary with the test sources removed (:mod:`crl_worker.harness.native`);
- **named in the task's style**: :func:`crl_worker.harness.names.canary_name` over the file's
  own test names; every real top-level test whose name appears nowhere else in the hidden files
  or the command is renamed the same way, so neither the names nor a list of the exercise's
  published test names tell a canary from a real test;
- **placed among the real tests**: each after a randomly drawn test of the file.

Tests that skip themselves (Go: ``Skip``), expect a panic (Rust: ``should_panic``) or return a
value (Rust: ``-> Result``) are not copied: the comparison would not run, or not fail the test.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from dataclasses import dataclass

from crl_worker.harness.mutants import Derived
from crl_worker.harness.names import canary_name

_GO_TEST = re.compile(r"^func (?P<name>Test\w*)\((?P<t>\w+) \*testing\.T\) \{\s*$")
_RUST_FN = re.compile(r"^(?:pub )?fn (?P<name>\w+)\(\) \{\s*$")
_IDENT = re.compile(r"[A-Za-z][a-z0-9]+")
#: Words of a body that say nothing of the task (the language's own).
_COMMON = frozenset(
    {"func", "range", "return", "struct", "string", "name", "want", "got", "let", "mut", "assert",
     "some", "none", "vec", "self", "true", "false", "fatalf", "errorf", "run", "test", "for"}
)  # fmt: skip


@dataclass(frozen=True)
class NativeTest:
    """A top-level test function of a Go or Rust test file: lines ``[start, end]`` (``start``
    its first attribute, or the ``func`` line), the line of its signature, its name."""

    name: str
    start: int
    signature: int
    end: int
    #: Go: the name of its ``*testing.T`` parameter.
    param: str = ""


def tests_of(text: str, language: str) -> list[NativeTest]:
    """The top-level test functions of a Go (``language="go"``) or Rust test file's ``text``
    whose body ends at a ``}`` in the first column."""
    lines = text.splitlines()
    found: list[NativeTest] = []
    i = 0
    while i < len(lines):
        start = i
        if language == "go":
            match = _GO_TEST.match(lines[i])
        else:
            if lines[i].strip() != "#[test]":
                i += 1
                continue
            while i + 1 < len(lines) and lines[i + 1].startswith("#["):
                i += 1
            match = _RUST_FN.match(lines[i + 1]) if i + 1 < len(lines) else None
            i += 1
        if match is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "}"), None)
        if end is None:
            break
        param = match.groupdict().get("t") or ""
        found.append(NativeTest(match.group("name"), start, i, end, param))
        i = end + 1
    return found


def copyable(test: NativeTest, lines: list[str], language: str) -> bool:
    """Whether a failing comparison appended to a copy of ``test`` makes the copy fail."""
    body = "\n".join(lines[test.signature + 1 : test.end])
    if language == "go":
        return "Skip" not in body
    attributes = "\n".join(lines[test.start : test.signature])
    return "should_panic" not in attributes


def _occurrences(name: str, texts: Collection[str]) -> int:
    word = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])")
    return sum(len(word.findall(t)) for t in texts)


def _draw(copied: str, names: list[str], taken: set[str], rng: random.Random, extra: list[str],
          language: str) -> str:  # fmt: skip
    """A new name for a copy of (or the renamed) ``copied`` in the language's own style."""
    if language == "go":
        # ``TestDigitSum`` as ``testDigitSum`` (names.py's camel style with a ``test`` prefix).
        scope = ["test" + n[4:] for n in names]
        seen = {"test" + n[4:] for n in taken}
        name = canary_name("test" + copied[4:], scope, (), seen, rng, extra)
        new = "Test" + name[4:]
    else:
        # Rust's snake case, single words included (``zero``), through the ``test_`` style.
        scope = [f"test_{n}" for n in names]
        seen = {f"test_{n}" for n in taken}
        new = canary_name(f"test_{copied}", scope, (), seen, rng, extra).removeprefix("test_")
    taken.add(new)
    return new


def _canary(test: NativeTest, lines: list[str], name: str, language: str,
            rng: random.Random) -> list[str]:  # fmt: skip
    """The copy of ``test`` named ``name`` with a failing comparison after its body."""
    a = rng.randrange(2, 1000)
    b = a + rng.randrange(1, 1000)
    body = lines[test.signature + 1 : test.end]
    if language == "go":
        t = test.param
        return [
            f"func {name}({t} *testing.T) {{",
            "\tfunc() {",
            *[f"\t{line}" if line.strip() else line for line in body],
            "\t}()",
            f"\tif got, want := {a}, {b}; got != want {{",
            f'\t\t{t}.Fatalf("got %d, want %d", got, want)',
            "\t}",
            "}",
        ]
    return [
        *lines[test.start : test.signature],
        f"fn {name}() {{",
        "    {",
        *[f"    {line}" if line.strip() else line for line in body],
        "    };",
        f"    assert_eq!({a}, {b});",
        "}",
    ]


def derive(
    text: str,
    language: str,
    fail_to_pass: Collection[str],
    rng: random.Random,
    count: int,
    keep: Collection[str] = (),
) -> Derived | None:
    """``text`` (a Go or Rust test file) with ``count`` canaries among its tests and its tests
    renamed where safe (see the module's docstring); ``None`` when it has no test to copy.
    ``keep`` are the texts (the command, the other hidden files) where a renamed test's name
    must not appear."""
    lines = text.splitlines()
    tests = tests_of(text, language)
    listed = set(fail_to_pass)
    pool = [t for t in tests if copyable(t, lines, language)]
    # Copies of FAIL_TO_PASS tests first (a copy of a passing test would pass unless forged).
    pool = [t for t in pool if t.name in listed] or pool
    if not pool:
        return None
    names = [t.name for t in tests]
    taken = set(names)
    renamed: dict[str, str] = {}
    for test in tests:
        if _occurrences(test.name, [text, *keep]) == 1:
            renamed[test.name] = _draw(test.name, names, taken, rng, [], language)
    after: dict[int, list[list[str]]] = {}
    ids: list[str] = []
    sources: list[str] = []
    for _ in range(count):
        source = rng.choice(pool)
        body = "\n".join(lines[source.signature + 1 : source.end])
        extra = sorted({w for w in _IDENT.findall(body) if len(w) > 2} - _COMMON)
        name = _draw(source.name, names, taken, rng, extra, language)
        where = rng.choice(tests)
        after.setdefault(where.end, []).append(_canary(source, lines, name, language, rng))
        ids.append(name)
        sources.append(source.name)
    signatures = {t.signature: t for t in tests}
    out: list[str] = []
    for i, line in enumerate(lines):
        test = signatures.get(i)
        if test is not None and test.name in renamed:
            line = line.replace(f" {test.name}(", f" {renamed[test.name]}(", 1)
        out.append(line)
        for planted in after.get(i, []):
            out.extend(["", *planted])
    return Derived(
        text="\n".join(out) + "\n",
        ids=tuple(ids),
        sources=tuple(sources),
        renamed=tuple((new, old) for old, new in renamed.items()),
    )
