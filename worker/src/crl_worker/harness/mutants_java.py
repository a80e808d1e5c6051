"""Mutants of a task's own JUnit tests: :mod:`crl_worker.harness.mutants` for Java sources.

:func:`derive` takes a JUnit test class's source (JUnit 4 or 5), the ids of the tests the task
lists (``package.Class#method``, as :func:`~crl_worker.harness.parsers.junit_id` names them)
and a random generator, and returns the source with copies of listed ``@Test`` methods planted
among its methods, each with the same literal expectation changed, as the Python mutants are
(see :mod:`crl_worker.harness.canary` for what a copy is and why).

No Java parser runs here: a small scanner that knows comments, string, text-block and character
literals finds the top-level class's methods and their bodies. A method is copied only when
that is safe: annotated ``@Test`` alone (no arguments, such as JUnit 4's ``expected``; no
``@Disabled``/``@Ignore``, no parameterized or repeated test), no ``return``, no assumption
(``assume*``), and a top-level statement ``assertEquals(<literal>, <expression>);`` with exactly
two arguments (a third may be a delta, under which a changed number could still pass, or JUnit
4's leading message), the literal a number, a string, a character or a boolean; or one whose
expected value is built from such literals (``new Interval(-3, -1)``, ``List.of(1, 2)``: one
argument of it is changed, as the Python copies change a constructor's literal argument).

The copies are named like the class's own test methods (:func:`crl_worker.harness.names.
canary_name`, lower camel case or ``testXxx`` as the name they start from), and the copied
FAIL_TO_PASS method is renamed the same way where that cannot change its outcome
(:func:`renamable`), so no name tells it from its copies; the run's statuses are mapped back to
the task's ids (``Derived.renamed``, :func:`crl_worker.harness.canary.restore_ids`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from dataclasses import dataclass

from crl_worker.harness.literals import Words, comment_top, source_words, variants
from crl_worker.harness.mutant_targets import LOOSE
from crl_worker.harness.mutants import Derived, group_sizes
from crl_worker.harness.names import canary_name

_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
#: ``assertEquals(`` as a statement: bare (static import) or on ``Assert``/``Assertions``.
_ASSERT = re.compile(r"(?:(?:org\.junit\.(?:jupiter\.api\.)?)?Assert(?:ions)?\.)?assertEquals\(")
#: An expected value built from literals (``new Interval(-3, -1)``, ``List.of(1, 2)``): the
#: constructor's or factory's call, up to its ``(``.
_BUILT = re.compile(
    r"\s*(?:new\s+((?:[\w$]+\.)*[A-Z][\w$]*)\s*(?:<[^()]*>)?|List\.of|Arrays\.asList)\s*\("
)
_NUMBER = re.compile(r"-?(?:[1-9][0-9_]*|0)(?:\.[0-9_]+)?(?:[eE][+-]?[0-9]+)?[lLfFdD]?")
_STRING = re.compile(r'"(?:[^"\\\n]|\\[^u])*"')
_CHAR = re.compile(r"'(?:[^'\\\n]|\\[^u])'")
_UNSAFE = re.compile(r"\breturn\b|\bassume[A-Z]\w*\(|\bAssumptions?\.")
_TEST_ANNOTATION = re.compile(r"@(?:org\.junit\.(?:jupiter\.api\.)?)?Test\b(?!\s*\()")
#: Annotations of a test method of any kind (JUnit 4 and 5): the names canaries are drawn from.
_ANY_TEST = re.compile(
    r"@(?:[\w.]*\.)?(?:Test|ParameterizedTest|RepeatedTest|TestFactory|TestTemplate)\b"
)
#: Code that may read a test method's own name (``TestInfo``, a ``TestName`` rule, display
#: names, extensions and runners, reflection, the stack, snapshot and approval libraries) or
#: run the class's tests in name order: in such a class the copied test keeps its name.
_OWN_NAME_READERS = re.compile(
    r"\b(?:TestInfo|TestName|TestWatcher|Description|DisplayName\w*|\w*MethodName\w*"
    r"|getDisplayName|getTestMethod|ExtensionContext|ExtendWith|RegisterExtension|Rule"
    r"|ClassRule|RunWith|MethodOrderer|TestMethodOrder|FixMethodOrder|Nested|StackWalker"
    r"|getStackTrace|getEnclosingMethod|getDeclaredMethods?|getMethods?|currentThread"
    r"|Approvals|\w*[Ss]napshot\w*)\b"
)
_ANNOTATION = re.compile(r"\s*@[\w.$]+\s*")
#: The name of the method whose declaration starts here (past its annotations).
_DECLARED = re.compile(r"[^;{}()=@]*?(?<![\w$])([A-Za-z_$][\w$]*)\s*\(")
#: Class annotations that cannot make a test's outcome depend on its name.
_HARMLESS_CLASS_ANNOTATIONS = frozenset({"SuppressWarnings", "Tag", "Tags", "Timeout"})
#: Java's reserved words: never a method name, nor a word drawn from a test's body.
_KEYWORDS = """abstract assert boolean break byte case catch char class const continue default do double
    else enum extends final finally float for goto if implements import instanceof int interface
    long native new package private protected public return short static strictfp super switch
    synchronized this throw throws transient try void volatile while true false null var record
    yield sealed permits"""
JAVA_KEYWORDS = frozenset(_KEYWORDS.split())


@dataclass(frozen=True)
class _Method:
    name: str
    start: int
    """Offset of its first annotation (or its first modifier)."""
    body_open: int
    """Offset of the ``{`` of its body."""
    end: int
    """Offset just past the ``}`` of its body."""
    annotations: tuple[str, ...]


def _skip_literal(text: str, i: int) -> int:
    """The offset past the comment or literal starting at ``i`` (``i`` itself if none does)."""
    if text.startswith("//", i):
        j = text.find("\n", i)
        return len(text) if j < 0 else j
    if text.startswith("/*", i):
        j = text.find("*/", i + 2)
        return len(text) if j < 0 else j + 2
    if text.startswith('"""', i):
        j = text.find('"""', i + 3)
        while j > 0 and text[j - 1] == "\\":
            j = text.find('"""', j + 1)
        return len(text) if j < 0 else j + 3
    if text[i] in "\"'":
        j = i + 1
        while j < len(text) and text[j] != text[i] and text[j] != "\n":
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i


def _code(text: str) -> str:
    """``text`` with every comment and literal blanked (same length): what is left is code."""
    out = list(text)
    i = 0
    while i < len(text):
        j = _skip_literal(text, i)
        if j == i:
            i += 1
            continue
        for k in range(i, min(j, len(text))):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def _close(code: str, i: int, pair: str = "{}") -> int:
    """The offset of the bracket closing the one at ``i`` in blanked ``code`` (-1: none)."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == pair[0]:
            depth += 1
        elif code[j] == pair[1]:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _class_body(code: str) -> tuple[str, int, int] | None:
    """The first top-level class: its name and the offsets of its body's braces."""
    m = re.search(r"\bclass\s+([A-Za-z_$][\w$]*)[^{;]*\{", code)
    if m is None:
        return None
    end = _close(code, m.end() - 1)
    return (m.group(1), m.end() - 1, end) if end > 0 else None


def _methods(code: str, open_at: int, close_at: int) -> list[_Method]:
    """The methods declared directly in the class body between ``open_at`` and ``close_at``."""
    found: list[_Method] = []
    i, segment_start = open_at + 1, open_at + 1
    while i < close_at:
        c = code[i]
        if c == ";" or c == "}":
            i += 1
            segment_start = i
        elif c == "{":
            end = _close(code, i)
            if end < 0:
                return found
            head = code[segment_start:i]
            m = re.search(r"\bvoid\s+([A-Za-z_$][\w$]*)\s*\(\s*\)\s*(?:throws[^{]*)?$", head)
            if m is not None and "class " not in head and "=" not in head:
                annotations = tuple(re.findall(r"@[\w.]+(?:\s*\([^)]*\))?", head))
                lead = len(head) - len(head.lstrip())
                found.append(_Method(m.group(1), segment_start + lead, i, end + 1, annotations))
            i = end + 1
            segment_start = i
        else:
            i += 1
    return found


def _copyable(code: str, method: _Method) -> bool:
    if len(method.annotations) != 1 or not _TEST_ANNOTATION.fullmatch(method.annotations[0]):
        return False
    return _UNSAFE.search(code[method.body_open : method.end]) is None


def _arguments(code: str, open_paren: int) -> list[tuple[int, int]] | None:
    """The spans of the top-level arguments of the call whose ``(`` is at ``open_paren``."""
    close = _close(code, open_paren, "()")
    if close < 0:
        return None
    spans, start, depth = [], open_paren + 1, 0
    for j in range(open_paren + 1, close):
        if code[j] in "([{":
            depth += 1
        elif code[j] in ")]}":
            depth -= 1
        elif code[j] == "," and depth == 0:
            spans.append((start, j))
            start = j + 1
    spans.append((start, close))
    return spans


def _literal_kind(literal: str) -> object | None:
    """A value of the literal's type (what :func:`~crl_worker.harness.literals.variants`
    changes by), or ``None`` when ``literal`` is not one this module changes."""
    if literal in ("true", "false"):
        return literal == "true"
    if _STRING.fullmatch(literal) or _CHAR.fullmatch(literal):
        return literal
    if _NUMBER.fullmatch(literal) and any(c.isdigit() for c in literal):
        return 0
    return None


def expectations(text: str, code: str, method: _Method) -> list[tuple[int, int]]:
    """The spans of the literal expected values of the method's top-level two-argument
    ``assertEquals`` statements."""
    found: list[tuple[int, int]] = []
    depth_base = method.body_open
    for m in _ASSERT.finditer(code, method.body_open, method.end):
        before = code[depth_base : m.start()]
        if before.count("{") - before.count("}") != 1 or code[: m.start()].rstrip()[-1:] not in (
            ";",
            "{",
            "}",
        ):
            continue
        spans = _arguments(code, m.end() - 1)
        if spans is None or len(spans) != 2:
            continue
        found.extend(_literals(text, [spans[0]]) or _built(text, code, *spans[0]))
    return found


def _literals(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans, their surrounding blanks left out, that hold a literal alone."""
    found = []
    for a, b in spans:
        literal = text[a:b].strip()
        if _literal_kind(literal) is not None:
            lead = len(text[a:b]) - len(text[a:b].lstrip())
            found.append((a + lead, a + lead + len(literal)))
    return found


def _built(text: str, code: str, a: int, b: int) -> list[tuple[int, int]]:
    """The literal arguments of the expected value at ``[a, b)`` when it is a constructor of a
    capitalised class that does not read as a loose comparison, or a list factory, and nothing
    else (:data:`_BUILT`): a changed argument builds another value, which a correct answer does
    not equal, while a result equal to every value of that class does."""
    m = _BUILT.match(code, a, b)
    if m is None or (m.group(1) and LOOSE.search(m.group(1).rsplit(".", 1)[-1])):
        return []
    close = _close(code, m.end() - 1, "()")
    if close < 0 or close >= b or code[close + 1 : b].strip():
        return []
    return _literals(text, _arguments(code, m.end() - 1) or [])


def _input_text(text: str, code: str, span: tuple[int, int]) -> str:
    """The string literals in the rest of the ``assertEquals`` statement whose expected value
    is at ``span`` (the compared call's input), else all its code."""
    end = code.find(";", span[1])
    rest = text[span[1] : end if end >= 0 else len(text)]
    quoted = " ".join(m[1:-1] for m in _STRING.findall(rest))
    return quoted or rest


def _mutations(
    text: str, span: tuple[int, int], rng: random.Random, count: int, words: Words
) -> list[str]:
    literal = text[span[0] : span[1]]
    kind = _literal_kind(literal)
    if kind is None:
        return []
    sign = literal.startswith("-")
    body = literal[1:] if sign else literal
    found: list[str] = []
    for new in variants(body.encode(), kind, rng, count, words):
        changed = ("-" if sign else "") + new.decode()
        if changed == literal or changed in found or _literal_kind(changed) is None:
            continue
        number = isinstance(kind, int) and not isinstance(kind, bool)
        if not (number and _number(changed) == _number(literal)):
            found.append(changed)
    return found


def _number(literal: str) -> float:
    return float(literal.rstrip("lLfFdD").replace("_", ""))


def test_names(code: str, open_at: int, close_at: int) -> list[str]:
    """The names of the test methods of any kind (``@Test``, ``@ParameterizedTest``, ...) in
    blanked ``code`` between the class body's braces, in order."""
    found: list[str] = []
    for m in _ANY_TEST.finditer(code, open_at, close_at):
        i = m.start()
        while True:  # past this and the next annotations, with their arguments
            a = _ANNOTATION.match(code, i)
            if a is None:
                break
            i = a.end()
            if code.startswith("(", i):
                end = _close(code, i, "()")
                if end < 0:
                    break
                i = end + 1
        head = _DECLARED.match(code, i)
        if head is not None and head.group(1) not in found:
            found.append(head.group(1))
    return found


def body_words(code: str, method: _Method) -> list[str]:
    """Words of the identifiers in a method's code (blanked ``code``), the framework's and
    Java's own left out: new words a person would name the test after."""
    found: list[str] = []
    for ident in _IDENT.findall(code[method.body_open : method.end]):
        if ident.startswith(("assert", "fail")) or ident in JAVA_KEYWORDS:
            continue
        found.extend(w.lower() for w in _WORD.findall(ident) if w.isalpha() and len(w) > 2)
    return [w for w in found if w not in JAVA_KEYWORDS and w not in ("test", "assertions")]


def _class_annotations(code: str, class_at: int) -> list[str]:
    """The names of the annotations on the class declared at ``class_at`` in blanked ``code``."""
    start = max(code.rfind(";", 0, class_at), code.rfind("}", 0, class_at)) + 1
    return re.findall(r"@([\w.$]+)", code[start:class_at])


def _word_re(word: str) -> str:
    return rf"(?<![\w$]){re.escape(word)}(?![\w$])"


def renamable(text: str, code: str, cls: str, method: _Method, keep: str = "") -> bool:
    """Whether ``method`` passes or fails the same under another name: its name appears once
    in the file (its declaration) and nowhere in ``keep`` (the test command, the other test
    files), the command selects no method of class ``cls`` by name, the class neither extends
    another nor carries an annotation that could read or order by the name, and nothing in the
    file could read a test's own name (:data:`_OWN_NAME_READERS`)."""
    name = method.name
    if len(re.findall(_word_re(name), text)) != 1 or re.search(_word_re(name), keep):
        return False
    if re.search(_word_re(cls) + r"\s*[#.]", keep):
        return False
    declared = re.search(rf"\bclass\s+{re.escape(cls)}\b([^{{]*)\{{", code)
    if declared is None or re.search(r"\bextends\b", declared.group(1)):
        return False
    annotations = _class_annotations(code, declared.start())
    if any(a.rpartition(".")[2] not in _HARMLESS_CLASS_ANNOTATIONS for a in annotations):
        return False
    return _OWN_NAME_READERS.search(text) is None


def _name_at(code: str, method: _Method) -> int:
    """Where ``method``'s name starts in its declaration."""
    m = re.compile(_word_re(method.name) + r"\s*\(").search(code, method.start, method.body_open)
    assert m is not None  # _methods found the declaration by this very name
    return m.start()


def derive(
    path: str,
    text: str,
    fail_to_pass: Collection[str],
    pass_to_pass: Collection[str],
    rng: random.Random,
    count: int,
    keep: str = "",
) -> Derived | None:
    """``text`` (the JUnit test class at ``path``) with up to ``count`` mutated copies of its
    listed ``@Test`` methods planted among its methods, or ``None`` when it lists none that can
    be copied. FAIL_TO_PASS methods get the copies, in groups that change the same literal at
    the same spot (as :func:`crl_worker.harness.mutants.derive`); PASS_TO_PASS ones only where
    no FAIL_TO_PASS method qualifies, one copy each.

    Every name is drawn from the class's own test names (:func:`~crl_worker.harness.names.
    canary_name`), and a FAIL_TO_PASS method that has copies is renamed like them where
    :func:`renamable` (``keep``: the test command and the other test files)."""
    code = _code(text)
    found = _class_body(code)
    if found is None:
        return None
    cls, open_at, close_at = found
    package = re.search(r"^\s*package\s+([\w.]+)\s*;", code, re.M)
    fqn = f"{package.group(1)}.{cls}" if package else cls
    methods = _methods(code, open_at, close_at)
    by_id = {f"{fqn}#{m.name}": m for m in methods}

    def listed(ids: Collection[str]) -> list[_Method]:
        return [
            by_id[i]
            for i in dict.fromkeys(ids)
            if i in by_id and _copyable(code, by_id[i]) and expectations(text, code, by_id[i])
        ]

    # A changed word of a string is another word of the class (one the class had before the
    # task for one it had), from the compared call's input first: see literals.Words.
    listed_f2p = set(fail_to_pass)
    vocabulary = source_words(
        text, [(m.start, m.end) for m in methods if f"{fqn}#{m.name}" in listed_f2p]
    )
    plan: list[tuple[_Method, tuple[int, int], str]] = []
    for group, per_test in ((listed(fail_to_pass), None), (listed(pass_to_pass), 1)):
        if plan or not group:
            continue
        rng.shuffle(group)
        group = group[:count]
        sizes = group_sizes(count, len(group))
        for method, size in zip(group, sizes, strict=True):
            span = rng.choice(expectations(text, code, method))
            words = vocabulary.input_first([_input_text(text, code, span)])
            for new in _mutations(text, span, rng, per_test or size, words):
                plan.append((method, span, new))
    if not plan:
        return None
    scope = test_names(code, open_at, close_at)
    known = [n for n in scope if f"{fqn}#{n}" not in listed_f2p]
    # Any identifier of the file (a method, a field, a static import) or a reserved word.
    taken = set(_IDENT.findall(code)) | JAVA_KEYWORDS
    inserts: list[tuple[int, str, int]] = []
    renamed: list[tuple[str, str]] = []
    for method in dict.fromkeys(m for m, _, _ in plan):
        if f"{fqn}#{method.name}" in listed_f2p and renamable(text, code, cls, method, keep):
            name = canary_name(method.name, scope, known, taken, rng, body_words(code, method))
            inserts.append((_name_at(code, method), name, len(method.name)))
            renamed.append((f"{fqn}#{name}", f"{fqn}#{method.name}"))
    ids: list[str] = []
    for method, (a, b), new in plan:
        name = canary_name(method.name, scope, known, taken, rng, body_words(code, method))
        first = comment_top(text, code, method.start)
        head = text[first : method.body_open]
        at = _name_at(code, method) - first
        head = head[:at] + name + head[at + len(method.name) :]
        body = text[method.body_open : a] + new + text[b : method.end]
        where = rng.choice(methods)
        ahead = comment_top(text, code, where.start)
        indent = text[text.rfind("\n", 0, ahead) + 1 : ahead]
        copy = head + body
        if rng.random() < 0.5:
            inserts.append((ahead, copy + "\n\n" + indent, 0))
        else:
            inserts.append((where.end, "\n\n" + indent + copy, 0))
        ids.append(f"{fqn}#{name}")
    out = text
    # From the end; at one offset a rename (which replaces) goes last.
    for at, new, replaced in sorted(inserts, key=lambda i: (i[0], -i[2]), reverse=True):
        out = out[:at] + new + out[at + replaced :]
    return Derived(out, tuple(ids), tuple(f"{fqn}#{m.name}" for m, _, _ in plan), tuple(renamed))
