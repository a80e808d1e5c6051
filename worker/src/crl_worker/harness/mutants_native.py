"""Canaries for Go, Rust and C++ test files (the polyglot exercises' hidden tests).

The candidate's code is compiled into the same test binary as the hidden tests, so it can print
the runner's framing itself (``--- PASS: TestX`` for test2json, ``test x ... ok`` for libtest)
or write the report (Catch2's JUnit XML) and exit before any test runs. Canaries are tests that
must fail: a run in which one of them is reported passing was forged. :func:`derive` plants
:data:`~crl_worker.harness.canary.COUNT` of them in one hidden test file, at every grading
anew:

- **the same calls**: each is a copy of one of the file's top-level tests (Go: ``func TestX(t
  *testing.T)``; Rust: a ``#[test] fn x()``, its other attributes, ``#[ignore]`` included,
  kept; C++: a ``TEST_CASE("x", tags)``), its body run first (Go: inside a closure, so that a
  ``return`` or ``t.Fatal`` ends only the body; Rust and C++: in a block). A copy changes an
  expectation where it can, and such tests are copied first: in Rust and C++ the last
  assertion's literal (:mod:`crl_worker.harness.expectations`; an answer that compares equal
  to anything, a forged ``PartialEq`` or ``operator==``, passes that copy and is caught), in Go
  one FAIL_TO_PASS row of the case table the test ranges over, written in place or a
  package-level variable of a hidden test file as Exercism's ``cases_test.go``, the same row
  in every copy, and that row's subtest is the copy's canary
  (:mod:`crl_worker.harness.expectations_go`). A Go copy of a test over a package-level table
  ranges over its own copy of the table (``var <drawn> = <literal>`` just above it), and so
  does the real test, over an unchanged copy declared the same way;
- **one check at the end of every test**: every test, real or copy, then compares two cells
  of one array the file declares (Go: ``if a[i] != a[j] { t.FailNow() }``, silent, so a
  failing copy prints what the test it copies prints; Rust: ``assert_eq!`` of a ``static``'s
  cells read through ``black_box``; C++: ``REQUIRE`` on a global's), equal but for a copy
  with no expectation to change, whose check is what fails it. A comparison appended to the
  copies alone was code no real test had (Go: a direct call of ``FailNow``; Rust and C++: an
  unconditional failure, the constants folded): redteam10 read it from the binary. Now every
  test function has it, and only data (a row, a literal, the array's cells) tells a copy
  apart. Code that reads the test file could spare the copies, which is why the harness runs
  the test binary with the test sources removed (:mod:`crl_worker.harness.native`);
- **named in the task's style**: :func:`crl_worker.harness.names.canary_name` over the file's
  own test names; every real top-level test whose name appears nowhere else in the hidden files
  or the command is renamed the same way, so neither the names nor a list of the exercise's
  published test names tell a canary from a real test;
- **placed with the test they copy**: a test and its copies are written as one block, in an
  order drawn at random, since Go and Catch2 run tests in the file's order (copies placed after
  drawn tests never came before the first test, which was then always real: redteam12 passed
  only the file's first test and was resolved wherever the file has one); every real test's
  body runs in a closure (Go) or block as well, so that the call stack a copy's body sees (one
  closure deeper than its test) is the real tests' too (redteam9 spared the copies by it). Body
  lines are not indented: a line inside a raw string (kindergarten-garden's diagram) is data.

Tests that skip themselves (Go: ``Skip``; C++: ``SKIP``, ``SUCCEED``, a ``return``), return
early (Rust: ``return``), expect a panic (Rust: ``should_panic``) or return a value (Rust:
``-> Result``) are not copied: the check would not run, or not fail the test.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from crl_worker.harness.expectations import changed_expectations, expected_side
from crl_worker.harness.expectations_go import (
    Table,
    changeable_rows,
    changed_row,
    reads_other_fields,
    table_rows,
)
from crl_worker.harness.literals import Words, text_vocabulary
from crl_worker.harness.mutants import Derived
from crl_worker.harness.names import canary_name

_GO_TEST = re.compile(r"^func (?P<name>Test\w*)\((?P<t>\w+) \*testing\.T\) \{\s*$")
_GO_BENCHMARK = re.compile(r"^func Benchmark\w*\(\w+ \*testing\.B\) \{\s*$")
_RUST_FN = re.compile(r"^(?:pub )?fn (?P<name>\w+)\(\) \{\s*$")
_CPP_TEST = re.compile(
    r'^TEST_CASE\(\s*"(?P<name>[\w ]+)"(?P<tags>\s*,\s*"[^"\\]*")?\s*\)\s*(?P<rest>.*?)\s*$'
)
_IDENT = re.compile(r"[A-Za-z][a-z0-9]+")
_WORDS = re.compile(r"[A-Za-z_]\w*")
#: Rust's keywords, reserved words included (a test cannot be named so).
_KEYWORDS = frozenset(
    {"as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum",
     "extern", "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod",
     "move", "mut", "pub", "ref", "return", "self", "static", "struct", "super", "trait",
     "true", "try", "type", "unsafe", "use", "where", "while", "abstract", "become", "box",
     "do", "final", "macro", "override", "priv", "typeof", "unsized", "virtual", "yield",
     "union"}
)  # fmt: skip
#: Go's keywords and predeclared names: a package-level variable so named would not compile, or
#: would shadow a builtin the candidate's code calls.
_GO_RESERVED = frozenset(
    {"break", "case", "chan", "const", "continue", "default", "defer", "else", "fallthrough",
     "for", "func", "go", "goto", "if", "import", "interface", "map", "package", "range",
     "return", "select", "struct", "switch", "type", "var", "any", "append", "bool", "byte",
     "cap", "clear", "close", "comparable", "complex", "copy", "delete", "error", "false",
     "float32", "float64", "imag", "int", "int8", "int16", "int32", "int64", "iota", "len",
     "make", "max", "min", "new", "nil", "panic", "print", "println", "real", "recover", "rune",
     "string", "true", "uint", "uint8", "uint16", "uint32", "uint64", "uintptr"}
)  # fmt: skip
_GO_VAR = re.compile(r"^var\s+([A-Za-z_]\w*)\s*=", re.MULTILINE)
#: Words of a body that say nothing of the task (the language's own).
_COMMON = frozenset(
    {"func", "range", "return", "struct", "string", "name", "want", "got", "let", "mut", "assert",
     "some", "none", "vec", "self", "true", "false", "fatalf", "errorf", "run", "test", "for"}
)  # fmt: skip


@dataclass(frozen=True)
class NativeTest:
    """A top-level test of a Go, Rust or C++ test file: lines ``[start, end]`` (``start`` its
    first attribute, or the ``func`` line), the line of its signature, its name and body."""

    name: str
    start: int
    signature: int
    end: int
    #: The lines between its braces (C++'s one-line ``TEST_CASE``: the text between them).
    body: tuple[str, ...] = ()
    #: Go: the name of its ``*testing.T`` parameter; C++: the tags argument (``, "[x]"``).
    param: str = ""


def _cpp_test(lines: list[str], i: int) -> NativeTest | None:
    """The Catch2 ``TEST_CASE`` whose signature is line ``i``: ``{`` at its end or alone on the
    next line, up to a ``}`` in the first column; or all on one line."""
    match = _CPP_TEST.match(lines[i])
    if match is None:
        return None
    name, tags, rest = match.group("name"), match.group("tags") or "", match.group("rest")
    if rest.startswith("{") and rest.rstrip().endswith("}") and len(rest.strip()) > 1:
        return NativeTest(name, i, i, i, (rest.strip()[1:-1].strip(),), tags)
    first = i + 1
    if not rest:
        if i + 1 >= len(lines) or lines[i + 1].strip() != "{":
            return None
        first = i + 2
    elif rest.strip() != "{":
        return None
    end = next((j for j in range(first, len(lines)) if lines[j].rstrip() == "}"), None)
    if end is None:
        return None
    return NativeTest(name, i, i, end, tuple(lines[first:end]), tags)


def tests_of(text: str, language: str) -> list[NativeTest]:
    """The top-level tests of a Go (``language="go"``), Rust (``"rust"``) or C++ (``"cpp"``:
    Catch2) test file's ``text`` whose body ends at a ``}`` in the first column."""
    lines = text.splitlines()
    found: list[NativeTest] = []
    i = 0
    while i < len(lines):
        start = i
        if language == "cpp":
            test = _cpp_test(lines, i)
            if test is not None:
                found.append(test)
            i = (test.end if test is not None else i) + 1
            continue
        if language == "go":
            match = _GO_TEST.match(lines[i])
        else:
            if lines[i].strip() != "#[test]":
                i += 1
                continue
            # Other attributes and doc comments (``/// Chromatic scale``) up to the ``fn``.
            while i + 1 < len(lines) and lines[i + 1].startswith(("#[", "///")):
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
        body = tuple(lines[i + 1 : end])
        found.append(NativeTest(match.group("name"), start, i, end, body, param))
        i = end + 1
    return found


def copyable(test: NativeTest, lines: list[str], language: str) -> bool:
    """Whether a failing comparison appended to a copy of ``test`` makes the copy fail."""
    body = "\n".join(test.body)
    if language == "go":
        return "Skip" not in body
    if language == "cpp":
        # ``SUCCEED``/``SKIP`` or a ``return`` could end the copy before the comparison.
        return not re.search(r"\b(SKIP|SUCCEED|return)\b", body)
    # A ``return`` would end the copy before the check that fails it.
    attributes = "\n".join(lines[test.start : test.signature])
    return "should_panic" not in attributes and not re.search(r"\breturn\b", body)


#: A Go ``var`` declaration at the top level: one line, or a ``var ( ... )`` block.
_GO_VAR_DECL = re.compile(r"^var[ \t]*(\((?:[ \t]*//[^\n]*)?\n(?:.*\n)*?\)|[^\n]*)", re.MULTILINE)
#: The names a declaration without a value declares: ``a, b T`` (``=`` nowhere after).
_GO_NAMES = re.compile(r"^[ \t]*([A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)[ \t]+[^=]*$")


def _go_state(texts: Collection[str], tables: Collection[str]) -> set[str]:
    """The package-level variables of the Go files ``texts`` declared without a value, other
    than the tests' case tables ``tables``: state that a copy of a test may change before the
    real test reads it. A test that names one is not copied (Aider's robot-simulator: each
    step moves the one ``Step1Robot`` that the hidden ``defs.go`` declares, and the real test,
    run after a copy, failed on the gold patch). A variable declared with a value (a table of
    cases) is taken for data the tests read."""
    found: set[str] = set()
    for text in texts:
        for match in _GO_VAR_DECL.finditer(text.replace("\r\n", "\n")):
            declared = match.group(1)
            if declared.startswith("("):
                lines = declared.split("\n")[1:-1]
                # The block's own level (deeper lines: a struct type's fields, a value's rows).
                level = min(
                    (len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0
                )
                lines = [line for line in lines if len(line) - len(line.lstrip()) == level]
            else:
                lines = [declared]
            for line in lines:
                names = _GO_NAMES.match(re.sub(r"//.*", "", line))
                if names:
                    found.update(n.strip() for n in names.group(1).split(","))
    return found - set(tables) - {"_"}


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
        # Rust's snake case, single words included (``zero``), through the ``test_`` style;
        # a Catch2 name written with spaces gets them back.
        spaced = " " in copied

        def snake(n: str) -> str:
            return "test_" + n.replace(" ", "_")

        scope = [snake(n) for n in names]
        seen = {snake(n) for n in taken}
        for _ in range(50):
            new = canary_name(snake(copied), scope, (), seen, rng, extra).removeprefix("test_")
            # A Rust function's name cannot start with a digit (``5_only_garbled``: the file
            # would not compile, a correct answer graded as a build failure).
            if not new[:1].isdigit():
                break
            seen.add("test_" + new)
        new = new.replace("_", " ") if spaced else new
    taken.add(new)
    return new


def _changeable(test: NativeTest, language: str, tables: dict[str, Table | None],
                listed: Collection[str]) -> bool:  # fmt: skip
    """Whether a copy of ``test`` can have its expectation changed (:mod:`.expectations`; Go:
    a row of its case table in ``tables``, one :func:`_row_listed` in ``listed``)."""
    if language == "go":
        table = tables.get(test.name)
        return table is not None and bool(changeable_rows(table, _row_listed(test, listed)))
    return expected_side("\n".join(test.body), language) is not None


def _row_listed(test: NativeTest, listed: Collection[str]) -> Callable[[str | None], bool]:
    """Whether a subtest of Go ``test`` is FAIL_TO_PASS (None: the test as a whole)."""

    def row_listed(subtest: str | None) -> bool:
        return test.name in listed or (subtest is not None and f"{test.name}/{subtest}" in listed)

    return row_listed


class _Checks:
    """The comparison every test and copy ends with (see the module's docstring): two cells of
    one array the file declares, equal (a real test; a copy whose expectation changed) or not
    (a copy that fails by it), at places drawn for each, so that every test's machine code is
    the same and only the array's data tells them apart. Go reads a package-level ``var``,
    C++ a global (neither is folded into a constant: either could change at run time), Rust a
    ``static`` through ``black_box`` (which the compiler cannot see through)."""

    def __init__(self, language: str, name: str, size: int, rng: random.Random) -> None:
        self.language = language
        self.name = name
        self.rng = rng
        self.slots = list(range(2 * size))
        rng.shuffle(self.slots)
        self.values = [0] * (2 * size)
        self.used = 0

    def check(self, t: str, fails: bool) -> list[str]:
        """The lines of one more check (Go: ``t`` is the test's ``*testing.T``), failing or
        not."""
        a, b = self.slots[2 * self.used], self.slots[2 * self.used + 1]
        self.used += 1
        self.values[a] = self.rng.randrange(2, 1000)
        self.values[b] = self.values[a] + (self.rng.randrange(1, 1000) if fails else 0)
        n = self.name
        if self.language == "go":
            return [f"\tif {n}[{a}] != {n}[{b}] {{", f"\t\t{t}.FailNow()", "\t}"]
        if self.language == "cpp":
            return [f"    REQUIRE({n}[{a}] == {n}[{b}]);"]
        box = f"std::hint::black_box(&{n})"
        return [f"    assert_eq!({box}[{a}], {box}[{b}]);"]

    def declaration(self) -> list[str]:
        """The array's declaration, after a blank line (the file's last lines; C++: above
        its first test)."""
        cells = ", ".join(str(v) for v in self.values)
        size = len(self.values)
        if self.language == "go":
            return ["", f"var {self.name} = [{size}]int{{{cells}}}"]
        if self.language == "cpp":
            return ["", f"int {self.name}[{size}] = {{{cells}}};"]
        return ["", f"static {self.name}: [u32; {size}] = [{cells}];"]


def _wrapped(test: NativeTest, lines: list[str], name: str, language: str, body: list[str],
             check: list[str]) -> list[str]:  # fmt: skip
    """Test ``name`` (a copy of ``test``, or ``test`` itself) whose ``body`` runs first in a
    closure (Go: a ``return`` or ``t.Fatal`` ends only the body) or a block, then ``check``.
    The body's lines are not indented: a line inside a raw string is the test's data
    (kindergarten-garden's diagram: indented, a correct answer failed)."""
    if language == "go":
        return [
            f"func {name}({test.param} *testing.T) {{",
            "\tfunc() {",
            *body,
            "\t}()",
            *check,
            "}",
        ]
    if language == "cpp" and test.start == test.end:
        # A one-line test stays on one line.
        ended = " ".join(c.strip() for c in check)
        return [f'TEST_CASE("{name}"{test.param}) {{ {{ {body[0]} }} {ended} }}']
    if language == "cpp":
        return [f'TEST_CASE("{name}"{test.param}) {{', "    {", *body, "    }", *check, "}"]
    return [*lines[test.start : test.signature], f"fn {name}() {{", "    {", *body, "    };",
            *check, "}"]  # fmt: skip


def _canary(test: NativeTest, lines: list[str], name: str, language: str, changed: str | None,
            checks: _Checks) -> list[str]:  # fmt: skip
    """The copy of ``test`` named ``name``: its body ``changed`` (its last assertion expecting
    another value; Go: a row of its table) where it can, else its own body, then one of
    ``checks``: equal after a changed body, different after its own (what fails it). Silent in
    Go: a run that rewrites failures into passes sees the copy fail exactly as the test it
    copies does (a wrong answer fails in the body)."""
    body = changed.split("\n") if changed is not None else list(test.body)
    check = checks.check(test.param, fails=changed is None)
    return _wrapped(test, lines, name, language, body, check)


def _go_benchmarks(lines: list[str]) -> dict[int, int]:
    """The first and last line of each top-level benchmark of a Go test file's ``lines``."""
    found: dict[int, int] = {}
    for i, line in enumerate(lines):
        if _GO_BENCHMARK.match(line):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "}"), None)
            if end is not None:
                found[i] = end
    return found


def _users(
    lines: list[str], benchmarks: dict[int, int], var: str, rewritten: dict[int, list[str]]
) -> list[tuple[int, int]]:
    """The benchmarks of ``lines`` (first and last line) not yet rewritten that name ``var``."""
    return [
        (start, end)
        for start, end in benchmarks.items()
        if start not in rewritten and var in _WORDS.findall("\n".join(lines[start : end + 1]))
    ]


def _own_table(
    var: str, literal: str, code: str, variables: list[str], taken: set[str], rng: random.Random
) -> tuple[list[str], list[str]]:
    """A copy of the package-level table ``var`` written as ``literal``, declared under a name
    drawn as a copy's table's is (its lines, then a blank one), and ``code`` (a function's
    lines) with every ``var`` turned into that name."""
    name = canary_name(var, variables, (), taken, rng, _words(code))
    return [*f"var {name} = {literal}".split("\n"), ""], re.sub(rf"\b{var}\b", name, code).split(
        "\n"
    )


def _words(body: str) -> list[str]:
    """The words of a test's body a name drawn for its copy may take (not the language's)."""
    return sorted({w.lower() for w in _IDENT.findall(body) if len(w) > 2} - _COMMON)


def derive(
    text: str,
    language: str,
    fail_to_pass: Collection[str],
    rng: random.Random,
    count: int,
    keep: Collection[str] = (),
    prefix: str = "",
) -> Derived | None:
    """``text`` (a Go or Rust test file) with ``count`` canaries among its tests and its tests
    renamed where safe (see the module's docstring); ``None`` when it has no test to copy.
    ``keep`` are the texts (the command, the other hidden files) where a renamed test's name
    must not appear. Ids are the tests' names after ``prefix`` (C++: ``exercise.global#``)."""
    lines = text.splitlines()
    tests = tests_of(text, language)
    listed = {i.removeprefix(prefix) for i in fail_to_pass}
    # Go: each test's case table, in place or a package-level variable of a test file.
    package = [text, *keep]
    tables = (
        {t.name: table_rows("\n".join(t.body), package) for t in tests} if language == "go" else {}
    )
    state = (
        _go_state(package, {t.var for t in tables.values() if t and t.var})
        if language == "go"
        else set()
    )
    pool = [
        t
        for t in tests
        if copyable(t, lines, language) and not state & set(_WORDS.findall("\n".join(t.body)))
    ]
    # Copies of FAIL_TO_PASS tests first (a copy of a passing test would pass unless forged),
    # of those whose expectation can change first (they catch an answer equal to anything).
    pool = [t for t in pool if t.name in listed] or pool
    pool = [t for t in pool if _changeable(t, language, tables, listed)] or pool
    if not pool:
        return None
    names = [t.name for t in tests]
    # Never a name the file or the package already has (a Rust test named like the function it
    # imports, a Go test named like a helper of another test file), nor a keyword.
    taken = {*names, *_KEYWORDS, *(w for t in package for w in _WORDS.findall(t))}
    taken |= _GO_RESERVED if language == "go" else set()
    variables = sorted({v for t in package for v in _GO_VAR.findall(t)})
    array = {"go": "expected", "cpp": "expected_", "rust": "EXPECTED_"}[language]
    array += str(rng.randrange(100, 1000))
    while array in taken:
        array += str(rng.randrange(10))
    taken.add(array)
    checks = _Checks(language, array, len(tests) + count, rng)
    renamed: dict[str, str] = {}
    for test in tests:
        if _occurrences(test.name, [text, *keep]) == 1:
            renamed[test.name] = _draw(test.name, names, taken, rng, [], language)
    # Each test's copies, written in one block with it in an order drawn at random.
    copies: dict[str, list[list[str]]] = {}
    ids: list[str] = []
    sources: list[str] = []
    drawn = [rng.choice(pool) for _ in range(count)]
    # The copies of one test all change the same literal at the same spot, each to another
    # value (a word of the file for a word), so no copy stands out from the others.
    words = Words(text_vocabulary(text), text_vocabulary(text))
    changes: dict[str, list[str]] = {}
    # Go: the subtest whose row the copies of a test change; that subtest is the canary.
    subtests: dict[str, str] = {}
    # Go: a test whose copies change a row of a package-level table ranges over a copy of that
    # table too, declared as theirs are (``var <drawn> = <literal>`` just above the test), so
    # no name or place tells it from them: the variable's lines before it, its own body.
    declared: dict[str, list[str]] = {}
    own_bodies: dict[str, list[str]] = {}
    # Go: benchmarks (never run when grading) that range over a table a test's copies change
    # get a changed copy of their own, and so do other tests that read only other fields of
    # it, so no function but the real test holds the table's data unchanged: they kept the
    # original in the binary, equal to the real test's.
    benchmarks = _go_benchmarks(lines) if language == "go" else {}
    rewritten: dict[int, list[str]] = {}
    for source in dict.fromkeys(drawn):
        body = "\n".join(source.body)
        if language == "go":
            table = tables.get(source.name)
            shared = table.var if table is not None else None
            users = _users(lines, benchmarks, shared, rewritten) if shared else []
            # Other tests that read the table but not the changed field (hexadecimal's
            # TestHandleErrors reads ``in`` and ``errCase``): a changed copy of their own too.
            readers = [
                t
                for t in tests
                if shared
                and t not in drawn
                and t.name not in own_bodies
                and shared in _WORDS.findall(read := "\n".join(t.body))
                and reads_other_fields(read, shared, table.field if table else "")
            ]
            subtest, found = (
                changed_row(
                    table,
                    rng,
                    drawn.count(source) + len(readers) + len(users),
                    words,
                    _row_listed(source, listed),
                )
                if table is not None
                else (None, [])
            )
            spare = max(len(found) - drawn.count(source), 0)
            changes[source.name] = found[spare:]
            for reader, new in zip(readers, found[:spare], strict=False):
                assert shared is not None  # readers: the table has a name
                copied = _own_table(shared, new, "\n".join(reader.body), variables, taken, rng)
                declared[reader.name], own_bodies[reader.name] = copied
            for (start, end), new in zip(users, found[len(readers) : spare], strict=False):
                assert shared is not None  # users: the table has a name
                benchmark = "\n".join(lines[start : end + 1])
                declaration, body_lines = _own_table(shared, new, benchmark, variables, taken, rng)
                rewritten[start] = [*declaration, *body_lines]
            if subtest is not None:
                subtests[source.name] = subtest
            if table is not None and table.var is not None and changes[source.name]:
                var = canary_name(table.var, variables, (), taken, rng, _words(body))
                declared[source.name] = [*f"var {var} = {table.text}".split("\n"), ""]
                own_bodies[source.name] = (body[: table.use[0]] + var + body[table.use[1] :]).split(
                    "\n"
                )
        else:
            changes[source.name] = changed_expectations(
                body, language, rng, drawn.count(source), words
            )
    for source in drawn:
        body = "\n".join(source.body)
        extra = _words(body)
        name = _draw(source.name, names, taken, rng, extra, language)
        left = changes[source.name]
        changed = left.pop() if left else None
        table = tables.get(source.name)
        preamble: list[str] = []
        if changed is not None and table is not None and table.var is not None:
            var = canary_name(table.var, variables, (), taken, rng, extra)
            preamble = [*f"var {var} = {changed}".split("\n"), ""]
            changed = body[: table.use[0]] + var + body[table.use[1] :]
        planted = _canary(source, lines, name, language, changed, checks)
        copies.setdefault(source.name, []).append([*preamble, *planted])
        row = subtests.get(source.name) if changed is not None else None
        ids.append(prefix + name + (f"/{row}" if row else ""))
        sources.append(prefix + source.name)
    # Every real test's body runs in a closure (Go) or block too, as a copy's does, so the call
    # stack (a Go copy's body one closure deeper: ``TestX.func1``) does not tell them apart
    # (redteam9), then its check, as a copy's does.
    starts = {t.start: t for t in tests}
    # Drawn before anything is written: C++'s array is declared above the first test.
    own_checks = {t.name: checks.check(t.param, fails=False) for t in tests}
    out: list[str] = []
    i = 0
    while i < len(lines):
        real = starts.get(i)
        if real is not None and language == "cpp" and real is tests[0]:
            # Declared before its first use (C++ reads in order).
            out.extend([*checks.declaration()[1:], ""])
        if real is None and i in rewritten:
            out.extend(rewritten[i])
            i = benchmarks[i] + 1
            continue
        if real is None:
            out.append(lines[i])
            i += 1
            continue
        own = own_bodies.get(real.name, list(real.body))
        title = renamed.get(real.name, real.name)
        wrapped = _wrapped(real, lines, title, language, own, own_checks[real.name])
        members = [
            [*declared.get(real.name, []), *wrapped],
            *copies.get(real.name, []),
        ]
        # The test among its copies at a place drawn at random: tests run in the file's order
        # (Go, Catch2), and copies that always came after it let the first of a group to run
        # be the real one (redteam12: a forgery that passed the file's first test only was
        # resolved wherever the file has one test).
        rng.shuffle(members)
        out.extend(members[0])
        for member in members[1:]:
            out.extend(["", *member])
        i = real.end + 1
    out.extend(checks.declaration() if language != "cpp" else [])
    return Derived(
        text="\n".join(out) + "\n",
        ids=tuple(ids),
        sources=tuple(sources),
        renamed=tuple((prefix + new, prefix + old) for old, new in renamed.items()),
    )
