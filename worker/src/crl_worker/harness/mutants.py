"""Mutants of a task's own tests: the pure part of :mod:`crl_worker.harness.canary`.

:func:`derive` takes a test module's text, the ids of the tests the task lists and a random
generator, and returns the module with a few mutated copies of those tests planted among them,
with the copies' ids. See :mod:`crl_worker.harness.canary` for what a copy is and why.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Collection
from dataclasses import dataclass

from crl_worker.harness.literals import (
    Words,
    doc_variants,
    short_description,
    vocabulary,
)
from crl_worker.harness.mutant_edits import (
    Text,
    copy_test,
    def_name_at,
    equality_sides,
    moved_test,
    span,
)
from crl_worker.harness.mutant_targets import Target, is_literal, mutate, nodes
from crl_worker.harness.mutant_targets import expectations as target_expectations
from crl_worker.harness.names import body_words, canary_name
from crl_worker.tasks.selection import django_label

#: Names that make a test's outcome other than pass or fail: such a test is not copied.
_UNSAFE_NAMES = frozenset(
    {
        "skip",
        "skipif",
        "skipIf",
        "skipUnless",
        "skipTest",
        "importorskip",
        "xfail",
        "expectedFailure",
        "fail",
        "exit",
    }
)
#: Decorators that leave a test's outcome pass or fail (``parametrize``; Django's settings and
#: app registry overrides, ``ignore_warnings``; ``mock.patch``): the dotted name's last parts.
_SAFE_DECORATORS = (
    "parametrize",
    "override_settings",
    "modify_settings",
    "isolate_apps",
    "ignore_warnings",
    "patch",
    "patch.object",
    "patch.dict",
)
#: The log formats of unittest's verbose runner (``django``: Django's ``runtests.py``).
UNITTEST_FORMATS = frozenset({"unittest", "django"})
#: Context managers whose block may swallow a failing assertion (``assertRaises``,
#: ``suppress``, ``catch_warnings``...): an expectation inside one is not changed.
_SWALLOWING = re.compile(r"(?i)raise|suppress|catch|expect|warn|xfail|skip")


@dataclass(frozen=True)
class TestDef:
    """One test function or method of a module."""

    __test__ = False

    id: str
    cls: str | None
    node: ast.FunctionDef
    testcase: bool
    """A ``unittest.TestCase`` method (``self.assert*`` is available)."""
    #: Its docstring's first line, which unittest's verbose runner prints after its id (and
    #: SWE-bench names some Django tests by); ``None`` without one.
    doc: str | None = None


@dataclass(frozen=True)
class Derived:
    """The module with its canaries planted, and each canary's id and the id it copies."""

    text: str
    ids: tuple[str, ...]
    sources: tuple[str, ...]
    #: Task tests renamed in ``text`` like their copies (new id, the task's id).
    renamed: tuple[tuple[str, str], ...] = ()
    #: The copies' docstring first lines as unittest's verbose runner prints them after the id
    #: (a second name of the copy: SWE-bench grades some tests by that line).
    docs: tuple[str, ...] = ()


def _decorators_unsafe(node: ast.FunctionDef | ast.ClassDef) -> bool:
    return any(_names(d) & _UNSAFE_NAMES for d in node.decorator_list) or any(
        not f".{_dotted(d.func if isinstance(d, ast.Call) else d)}".endswith(
            tuple(f".{safe}" for safe in _SAFE_DECORATORS)
        )
        for d in node.decorator_list
    )


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for a name or attribute chain, else ``""``."""
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _names(root: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(root):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Name):
            found.add(node.id)
    return found


def test_id(path: str, cls: str | None, name: str, log_format: str) -> str:
    """The id ``log_format``'s runner reports for test ``name`` (of class ``cls``) in ``path``."""
    if log_format == "unittest":
        return f"{name} ({path.removesuffix('.py').replace('/', '.')}.{cls})"
    if log_format == "django":
        # The label relative to ``tests/`` (``tests/admin_views/tests.py``: ``admin_views.tests``).
        return f"{name} ({django_label(path)}.{cls})"
    if log_format == "sympy":
        return name  # ``bin/test --verbose`` names a test by its function alone
    return "::".join(p for p in (path, cls, name) if p)


def tests_of(path: str, tree: ast.Module, log_format: str) -> list[TestDef]:
    """The test functions of a module as ``log_format``'s runner names them."""
    found: list[TestDef] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if log_format in ("pytest", "sympy"):
                found.append(TestDef(test_id(path, None, node.name, log_format), None, node, False))
        elif isinstance(node, ast.ClassDef) and log_format != "sympy":
            # Django's test classes often derive from a base of the module or a mixin: a listed
            # id shows the class runs (only listed tests are copied, into their own class).
            testcase = any("TestCase" in ast.dump(b) for b in node.bases)
            testcase = testcase or (log_format == "django" and bool(node.bases))
            if log_format == "unittest" and not testcase:
                continue
            if log_format == "pytest" and not (testcase or node.name.startswith("Test")):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    found.append(
                        TestDef(
                            test_id(path, node.name, item.name, log_format),
                            node.name,
                            item,
                            testcase,
                            short_description(ast.get_docstring(item, clean=False)),
                        )
                    )
    return found


def expectations(test: TestDef) -> list[Target]:
    """What a copy of ``test`` may change (:func:`crl_worker.harness.mutant_targets.expectations`):
    the expectations of the top-level equality assertions of its body, or of a ``with`` block
    in it that cannot swallow a failure (:func:`_straight`)."""
    return target_expectations(test.node, _straight(test.node.body))


def last_equality(test: TestDef) -> ast.stmt | None:
    """The last top-level equality assertion of ``test`` (:func:`_straight`) whose sides are
    both not literals: what a copy without a literal to change compares with a new object
    (:func:`crl_worker.harness.mutant_edits.unequal_check`); None when there is none. A side
    naming ``ANY`` (``unittest.mock.ANY`` equals everything, honestly) rules a statement out."""
    found = None
    for stmt in _straight(test.node.body):
        sides = equality_sides(stmt)
        if (
            len(sides) == 2
            and not any(is_literal(s) for s in sides)
            and "ANY" not in {n.id if isinstance(n, ast.Name) else getattr(n, "attr", None)
                              for s in sides for n in ast.walk(s)}
        ):  # fmt: skip
            found = stmt
    return found


def _straight(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body``'s statements, those of its ``with`` blocks in their place (Django's
    ``self.settings(...)``, ``mock.patch``) unless a context manager's name says it may swallow
    an exception (:data:`_SWALLOWING`): the statements that run, in order, whenever it runs."""
    found: list[ast.stmt] = []
    for stmt in body:
        found.append(stmt)
        if isinstance(stmt, ast.With) and not any(
            _SWALLOWING.search(n) for item in stmt.items for n in _names(item.context_expr)
        ):
            found.extend(_straight(stmt.body))
    return found


def copyable(test: TestDef) -> bool:
    """Whether a copy of ``test`` fails exactly when an expectation of it is changed: no
    skip/xfail markers or calls, no early ``return`` or ``yield``, no decorator but
    ``parametrize``."""
    if _decorators_unsafe(test.node) or _names(test.node) & _UNSAFE_NAMES:
        return False
    return not any(
        isinstance(n, ast.Return | ast.Yield | ast.YieldFrom | ast.Global | ast.Nonlocal)
        for n in ast.walk(test.node)
    )


def group_sizes(count: int, groups: int) -> list[int]:
    """``count`` copies shared among ``groups`` tests as evenly as can be, the first ones
    taking the remainder."""
    return [count // groups + (i < count % groups) for i in range(groups)]


def derive(
    path: str,
    text: str,
    log_format: str,
    fail_to_pass: Collection[str],
    pass_to_pass: Collection[str],
    rng: random.Random,
    count: int,
    keep: str = "",
) -> Derived | None:
    """``text`` (the test module at ``path``) with up to ``count`` mutated copies of its listed
    tests planted among its tests, or ``None`` when it lists none that can be copied.

    A FAIL_TO_PASS test that has copies is renamed like them (:func:`renamable`; not when its
    name is in ``keep``, the test command): the group's names all come from one draw, so no
    name tells the real test apart."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    module_marks = [
        n for n in tree.body if isinstance(n, ast.Assign) and "pytestmark" in ast.dump(n)
    ]
    if any(_names(n) & _UNSAFE_NAMES for n in module_marks):
        return None
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    tests = tests_of(path, tree, log_format)

    def named(ids: Collection[str]) -> list[TestDef]:
        bare = {_UT_NEW_ID.sub(r"\1 (\2)", i.split("[", 1)[0]) for i in ids} | set(ids)
        # unittest's runners print a docstring's first line too: SWE-bench may name by it.
        docs = set(ids) if log_format in UNITTEST_FORMATS else set()
        return [t for t in tests if t.id in bare or (t.doc is not None and t.doc in docs)]

    def listed(ids: Collection[str]) -> list[TestDef]:
        return [
            t
            for t in named(ids)
            if copyable(t) and not (t.cls and _decorators_unsafe(classes[t.cls]))
        ]

    f2p, p2p = listed(fail_to_pass), listed(pass_to_pass)
    if not f2p and not p2p:
        return None
    source = Text(text)
    taken = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    # SymPy's ids are bare names: no new name may be one of another module's in the run.
    taken |= set(re.findall(r"\w+", keep)) if log_format == "sympy" else set()
    listed_f2p = {i.split("[", 1)[0] for i in fail_to_pass} | {t.id for t in named(fail_to_pass)}
    known = [t.node.name for t in tests if t.id not in listed_f2p]
    inserts: list[tuple[int, bytes, int]] = []
    ids: list[str] = []
    copied: list[str] = []
    renamed: list[tuple[str, str]] = []
    copy_docs: list[str] = []
    new_tests = {t.node for t in tests if t.id in listed_f2p}
    words = Words(vocabulary(tree), vocabulary(tree, new_tests))
    plan = _plan(source, f2p, p2p, rng, count, words)
    docs: dict[int, tuple[int, int, bytes]] = {}
    own: dict[str, tuple[int, int, bytes]] = {}
    groups = {test.id for test, literal in plan if literal is not None and test in f2p}
    if log_format in UNITTEST_FORMATS:
        plan, docs, own = _new_docs(source, plan, tests, rng, words, groups)
    if not plan:
        return None
    # Another class's test of the same name (a subclass's run of it) would not be mapped back.
    others = "\n".join([*fail_to_pass, *pass_to_pass]) if log_format in UNITTEST_FORMATS else ""
    renaming = [
        t
        for t in tests
        if t.id in groups and renamable(t, text, f"{keep}\n{others.replace(t.id, '')}")
    ]
    # The renamed real tests move to a random place among their scope's tests too: a test patch
    # adds its tests in blocks, and a group whose copies were scattered while the real one
    # stayed in the block would say which is real by where they stand.
    renamed_nodes = {id(t.node) for t in renaming}
    moving = {
        id(t.node)
        for t in renaming
        if any(o.cls == t.cls and id(o.node) not in renamed_nodes for o in tests)
    }
    stay = [t for t in tests if id(t.node) not in moving]
    for test in tests:
        if test.id in own:
            # The real test's first line changed like its copies' (and mapped back): else it
            # would be the one of its group that reads as a person wrote it.
            start, end, new = own[test.id]
            if id(test.node) not in moving:
                inserts.append((start, new, end - start))
            printed = short_description(ast.literal_eval(new.decode("utf-8")))
            renamed.append((printed or "", test.doc or ""))

    def place(test: TestDef, block: bytes) -> None:
        """``block`` beside a random test of ``test``'s scope that stays where it is, after
        the definitions its decorators, defaults and annotations read (:func:`_ready_after`)."""
        after = _ready_after(test, classes[test.cls].body if test.cls else tree.body)
        options = [
            (where, before)
            for where in (t.node for t in stay if t.cls == test.cls)
            for before in (True, False)
            if (_first_line(where) > after if before else (where.end_lineno or 0) >= after)
        ]
        gap = b"\n\n" if test.cls is None else b"\n"
        if not options:  # every test of the scope stands before such a definition
            inserts.append((source.line_end(after), gap + block, 0))
            return
        where, before = rng.choice(options)
        if before:
            inserts.append((source.line_start(_first_line(where)), block + gap, 0))
        else:
            at = source.line_end(where.end_lineno or where.lineno)
            inserts.append((at, gap + block, 0))

    for test in renaming:
        scope = [t.node.name for t in tests if t.cls == test.cls]
        name = canary_name(test.node.name, scope, known, taken, rng, body_words(test.node))
        renamed.append((test_id(path, test.cls, name, log_format), test.id))
        if id(test.node) in moving:
            start, end = span(source, test.node)
            inserts.append((start, b"", end - start))
            place(test, moved_test(source, test, name, own.get(test.id)))
        else:  # nothing of its scope stays: renamed where it is
            at = def_name_at(source, test.node)
            inserts.append((at, name.encode(), len(test.node.name.encode())))
    for index, (test, literal) in enumerate(plan):
        scope = [t.node.name for t in tests if t.cls == test.cls]
        name = canary_name(test.node.name, scope, known, taken, rng, body_words(test.node))
        equality = last_equality(test) if literal is None else None
        place(test, copy_test(source, test, name, rng, literal, docs.get(index), equality))
        ids.append(test_id(path, test.cls, name, log_format))
        copied.append(test.id)
        if index in docs:
            printed = short_description(ast.literal_eval(docs[index][2].decode("utf-8")))
            if printed:
                copy_docs.append(printed)
    data = source.data
    # From the end; at one place a removal before an addition (a test moved off the place
    # right after the one a block goes beside).
    # Blocks added at one place land in a random order (red team 13: the renamed real test,
    # added first, always stood after its copies).
    for at, new, replaced in sorted(
        inserts, key=lambda i: (i[0], i[2], rng.random()), reverse=True
    ):
        data = data[:at] + new + data[at + replaced :]
    if not data.endswith(b"\n"):
        data += b"\n"
    return Derived(
        data.decode("utf-8"), tuple(ids), tuple(copied), tuple(renamed), tuple(copy_docs)
    )


def _first_line(node: ast.FunctionDef) -> int:
    """Where ``node`` starts, its decorators included."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def _bound(stmt: ast.stmt) -> set[str]:
    """The names a statement of a module or class body binds in that scope (not inside the
    functions and classes it defines)."""
    found: set[str] = set()
    pending: list[ast.AST] = [stmt]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        if not isinstance(node, ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))
    return found


def _ready_after(test: TestDef, scope: list[ast.stmt]) -> int:
    """The last line of the statements of ``scope`` (the module's or the class's body) before
    ``test`` that bind a name its ``def`` evaluates when it runs (decorators: a
    ``parametrize`` row may build a module's object; defaults; annotations), 0 for none: a
    test moved or copied above that line would fail to import, the real one too."""
    node = test.node
    arguments = node.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    parts = [*node.decorator_list, *arguments.defaults, *arguments.kw_defaults, node.returns]
    parts += [a.annotation for a in every]
    read = {n.id for part in parts if part is not None for n in ast.walk(part)
            if isinstance(n, ast.Name)}  # fmt: skip
    line = 0
    for stmt in scope:
        if stmt.lineno >= _first_line(node):
            break
        if _bound(stmt) & read:
            line = stmt.end_lineno or stmt.lineno
    return line


#: Python 3.11+'s unittest id, ``test_x (module.Class.test_x)``.
_UT_NEW_ID = re.compile(r"^(\S+) \(([\w.]+)\.\1\)$")


def _new_docs(
    source: Text,
    plan: list[tuple[TestDef, tuple[int, int, bytes] | None]],
    tests: list[TestDef],
    rng: random.Random,
    words: Words,
    groups: Collection[str] = (),
) -> tuple[
    list[tuple[TestDef, tuple[int, int, bytes] | None]],
    dict[int, tuple[int, int, bytes]],
    dict[str, tuple[int, int, bytes]],
]:
    """``plan`` (of a unittest run), a new docstring for each copy (by its index) of a test
    with one, and one for each test of ``groups`` (by id) that does not read its own.

    unittest prints a docstring's first line after the id (a run's id too, since SWE-bench
    names some tests by it), so every copy's must differ from the test's and from each other's.
    All of a group change the same word (:func:`doc_variants`), the real test too where it may,
    so no first line tells the test from its copies; copies that get none are left out."""
    avoid = {t.doc for t in tests if t.doc is not None}
    kept: list[tuple[TestDef, tuple[int, int, bytes] | None]] = []
    docs: dict[int, tuple[int, int, bytes]] = {}
    own: dict[str, tuple[int, int, bytes]] = {}
    for test in dict.fromkeys(t for t, _ in plan):
        mine = [entry for entry in plan if entry[0] is test]
        first = test.node.body[0]
        if test.doc is None or not isinstance(first, ast.Expr):
            kept.extend(mine)
            continue
        doc = first.value
        start = source.offset(doc.lineno, doc.col_offset)
        end = source.offset(doc.end_lineno or doc.lineno, doc.end_col_offset or 0)
        reads = bool(_names(test.node) & {"__doc__", "shortDescription", "_testMethodDoc"})
        mutable = test.id in groups and not reads
        texts = doc_variants(source.data[start:end], rng, len(mine) + mutable, words, avoid)
        if mutable and len(texts) == len(mine) + 1:
            own[test.id] = (start, end, texts.pop(0))
        for entry, new in zip(mine, texts, strict=False):
            docs[len(kept)] = (start, end, new)
            kept.append(entry)
    return kept, docs, own


#: Names in a test's code or arguments that may read its own name (snapshot and regression
#: fixtures, ``request.node``, ``self.id()``): such a test keeps its name.
_OWN_NAME_READERS = re.compile(r"request|snapshot|regression|^_testMethodName$|^id$|^node$")


def renamable(test: TestDef, text: str, keep: str = "") -> bool:
    """Whether ``test`` passes or fails the same under another name: its name appears once in
    the module (its ``def``) and nowhere in ``keep``, and its code and arguments read nothing
    that could depend on it (:data:`_OWN_NAME_READERS`)."""
    name = test.node.name
    if len(re.findall(rf"\b{re.escape(name)}\b", text)) != 1 or re.search(
        rf"\b{re.escape(name)}\b", keep
    ):
        return False
    used = _names(test.node) | {a.arg for a in ast.walk(test.node) if isinstance(a, ast.arg)}
    return not any(_OWN_NAME_READERS.search(n) for n in used)


def _input_words(test: TestDef, literal: Target, words: Words | None) -> Words | None:
    """``words`` with the words of the test's other strings (the calls' inputs; not its
    docstring nor ``literal``) as the ones a changed word is drawn from first (see
    :class:`~crl_worker.harness.literals.Words`)."""
    if words is None:
        return None
    body = test.node.body
    skip = nodes(literal)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip.add(body[0].value)
    strings = [
        n.value
        for n in ast.walk(test.node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n not in skip
    ]
    return words.input_first(strings)


def _plan(
    source: Text,
    f2p: list[TestDef],
    p2p: list[TestDef],
    rng: random.Random,
    count: int,
    words: Words | None = None,
) -> list[tuple[TestDef, tuple[int, int, bytes] | None]]:
    """The copies to plant: which test each copies and its changed expectation (a span and
    its new text; ``None``: the fallback, :func:`~crl_worker.harness.mutant_edits.copy_test`).

    Code that runs the package as it is sees a PASS_TO_PASS test pass and its copy fail, so it
    can spare such a copy; a copy of a FAIL_TO_PASS test fails like the test it copies. Code
    that pairs tests differing in one literal must then guess which of a group is the real
    one: the ``count`` copies go to the FAIL_TO_PASS tests with an expectation, several
    to a test where there are fewer tests than copies, every copy of a test changing the same
    constant at the same spot to a different value. Such code answers the real test with
    probability one in the group's size (a test and its copies), the product over the groups
    for a forgery that must answer them all. Tests without one are copied once each after
    those, FAIL_TO_PASS first.
    """
    with_literal = [t for t in f2p if expectations(t)]
    rng.shuffle(with_literal)
    plan: list[tuple[TestDef, tuple[int, int, bytes] | None]] = []
    if with_literal:
        groups = with_literal[:count]
        sizes = group_sizes(count, len(groups))
        for test, size in zip(groups, sizes, strict=True):
            changed = _mutate_one_of(source, test, rng, size, words)
            if changed is not None:
                start, end, texts = changed
                plan.extend((test, (start, end, t)) for t in texts)
    if plan:
        return plan
    rest = [
        test
        for group in (f2p, p2p)
        for test in sorted(group, key=lambda t: (not expectations(t), rng.random()))
    ][:count]
    single: list[tuple[TestDef, tuple[int, int, bytes] | None]] = []
    for test in rest:
        literals = expectations(test)
        if not literals:
            single.append((test, None))
            continue
        changed = _mutate_one_of(source, test, rng, 1, words)
        if changed is not None:
            single.append((test, (changed[0], changed[1], changed[2][0])))
    return single


def _mutate_one_of(
    source: Text, test: TestDef, rng: random.Random, count: int, words: Words | None
) -> tuple[int, int, list[bytes]] | None:
    """Up to ``count`` changed texts of the one of ``test``'s expectations that gives the most
    (a boolean gives one; the fewer copies, the likelier a guess of the real one), ties broken
    at random; ``None`` when none gives any."""
    literals = expectations(test)
    found = []
    for literal in rng.sample(literals, len(literals)):
        try:
            found.append(mutate(source, literal, rng, count, _input_words(test, literal, words)))
        except ValueError:
            continue
    return max(found, key=lambda changed: len(changed[2]), default=None)
