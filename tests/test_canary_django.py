"""Canaries for Django's runner (``django`` log format): copies of the task's own unittest
methods, derived from a real Django test module (tests/fixtures/django/), with ids as
``tests/runtests.py --verbosity 2`` reports them and docstrings that never share a first line
(SWE-bench names some Django tests by it), placed where the ``{tests}`` labels select them."""

from __future__ import annotations

import ast
import random
import shutil
from pathlib import Path

import pytest

from crl_worker import rewards
from crl_worker.harness import mutants
from crl_worker.harness.canary import (
    canary_files,
    derive_canary,
    restore_ids,
    tampered,
    with_canary,
)
from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.grading import grade
from crl_worker.harness.integrity import grade_candidate
from crl_worker.harness.literals import Words, doc_variants, short_description, vocabulary
from crl_worker.harness.parsers import parse_django
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks import selection
from crl_worker.tasks.model import Task, TestSpec
from tests.fixtures import django_instance
from tests.fixtures.canary_tasks import adding_module

MODULE = (Path(__file__).parent / "fixtures" / "django" / "resolve_url_tests.py.txt").read_text()
PATH = "tests/resolve_url/tests.py"
LABEL = "resolve_url.tests.ResolveUrlTests"
COMMAND = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {tests}"
#: One FAIL_TO_PASS test by its docstring (as SWE-bench names it), one by its id.
BY_DOC = "Passing a URL path to resolve_url() results in the same url."
F2P = [BY_DOC, f"test_domain ({LABEL})"]
P2P = [f"test_relative_path ({LABEL})", f"test_full_url ({LABEL})"]


def _task() -> Task:
    return adding_module(
        "django__django-1", PATH, MODULE, F2P, P2P, TestSpec(command=COMMAND, log_format="django")
    )


def _run_log(text: str, failing: set[str]) -> str:
    """What Django's runner prints (Python 3.11+) for the module's tests: each one's id, its
    docstring's first line where it has one, ``ok`` unless its name is in ``failing``."""
    lines = []
    for test in mutants.tests_of(PATH, ast.parse(text), "django"):
        name = test.node.name
        word = "FAIL" if name in failing else "ok"
        head = f"{name} ({LABEL}.{name})"
        lines += [head, f"{test.doc} ... {word}"] if test.doc else [f"{head} ... {word}"]
    return "\n".join(lines) + "\n"


def test_copies_get_the_runner_ids_and_distinct_docstrings() -> None:
    """Copies of the listed tests (the docstring-named one included) under ``name (label.Class)``
    ids; every copy's docstring first line differs from every other test's, at the same word
    for the copies of one test; the class's ``override_settings`` does not stop copying."""
    seen: set[str] = set()
    for seed in range(12):
        # Python 3.11's form of an id names the same test.
        f2p = [BY_DOC, f"test_domain ({LABEL}.test_domain)"]
        derived = mutants.derive(
            PATH, MODULE, "django", f2p, P2P, random.Random(seed), 4, keep=COMMAND
        )
        assert derived is not None and len(derived.ids) == 4
        assert all(i.endswith(f" ({LABEL})") for i in derived.ids)
        assert set(derived.sources) <= {f"test_url_path ({LABEL})", f"test_domain ({LABEL})"}
        tests = mutants.tests_of(PATH, ast.parse(derived.text), "django")
        docs = [t.doc for t in tests if t.doc is not None]
        assert len(docs) == len(set(docs)) == len(tests)
        by_id = {t.id: t for t in tests}
        original = {t.id: t for t in mutants.tests_of(PATH, ast.parse(MODULE), "django")}
        for copy_id, source_id in zip(derived.ids, derived.sources, strict=True):
            copy, source = by_id[copy_id], original[source_id]
            assert copy.doc != source.doc
            # One word (or letter) of the first line changed, the rest as written.
            assert len(copy.doc or "") - len(source.doc or "") in range(-8, 9)
            assert ast.dump(ast.Module(copy.node.body[1:], [])) != ast.dump(
                ast.Module(source.node.body[1:], [])
            )
            seen.add(copy_id)
        # The real tests renamed like their copies, their first lines changed like their
        # copies' (no first line of a group is the one a person wrote), mapped back.
        names = {f"test_url_path ({LABEL})", f"test_domain ({LABEL})"}
        docs_before = {original[i].doc for i in names}
        for run_id, task_id in derived.renamed:
            if task_id in names:
                assert run_id in by_id
            else:
                assert task_id in docs_before and run_id in docs
        grouped = {original[i].doc for i in set(derived.sources)}
        assert not grouped & set(docs)
    assert len(seen) > 12


def test_a_run_maps_back_to_the_task_ids_and_catches_a_forgery() -> None:
    """Through the ``django`` parser: a correct run fails exactly the canaries and passes the
    task's tests (the docstring-named one too, whatever the copies' docstrings say); a run
    where everything is ``ok`` is tampered."""
    task = _task()
    sources = {PATH: MODULE}
    assert canary_files(task) == [PATH]
    assert selection.test_arguments(task) == ["resolve_url.tests"]
    for seed in range(6):
        canary = derive_canary(task, sources, random.Random(seed))
        assert canary is not None and canary.text is not None
        in_run = with_canary(task, canary)
        # The labels that select the module are unchanged by the canaries' ids.
        assert selection.test_arguments(in_run) == ["resolve_url.tests"]
        copies = {i.split(" ", 1)[0] for i in canary.ids}
        honest = restore_ids(canary, parse_django(_run_log(canary.text, copies)))
        assert {honest[i] for i in canary.ids} == {TestStatus.FAILED}
        for task_id in [BY_DOC, f"test_domain ({LABEL})", *P2P]:
            assert honest[task_id] is TestStatus.PASSED, (seed, task_id)
        assert tampered(canary, honest) is None
        forged = restore_ids(canary, parse_django(_run_log(canary.text, set())))
        assert tampered(canary, forged) is not None
    # The module that holds a FAIL_TO_PASS test listed by its docstring goes first.
    other = "tests/other_app/tests.py"
    text = "from django.test import SimpleTestCase\n\n\nclass T(SimpleTestCase):\n"
    text += "    def test_a(self):\n        self.assertEqual(len('ab'), 2)\n"
    only_doc = task.model_copy(
        update={"fail_to_pass": [BY_DOC], "pass_to_pass": ["test_a (other_app.tests.T)"]}
    )
    canary = derive_canary(only_doc, {other: text, PATH: MODULE}, random.Random(1))
    assert canary is not None and canary.path == PATH


def test_a_runner_that_passes_every_docstring_line_is_caught() -> None:
    """A forgery in Django's own runner (found by review): every id line reports the honest
    outcome, every docstring line ``ok``, so a test the task lists by its docstring passes
    while every canary fails under its id. The copies' docstring lines must fail too."""
    task = _task().model_copy(update={"fail_to_pass": [BY_DOC]})
    for seed in range(10):
        canary = derive_canary(task, {PATH: MODULE}, random.Random(seed))
        assert canary is not None and canary.text is not None and canary.docs
        copies = {i.split(" ")[0] for i in canary.ids}
        real_doc = {old: new for new, old in canary.renamed}.get(BY_DOC, BY_DOC)
        honest, forged = [], []
        for test in mutants.tests_of(PATH, ast.parse(canary.text), "django"):
            name = test.node.name
            word = "FAIL" if name in copies or test.doc == real_doc else "ok"
            head = f"{name} ({LABEL}.{name})"
            honest += [head, f"{test.doc} ... {word}"] if test.doc else [f"{head} ... {word}"]
            forged += [f"{head} ... {word}"] + (
                ["forged (x.Forged)", f"{test.doc} ... ok"] if test.doc else []
            )
        for log, caught in ((honest, False), (forged, True)):
            statuses = parse_django("\n".join(log) + "\n")
            graded = grade(restore_ids(canary, statuses), task.fail_to_pass, task.pass_to_pass)
            assert (tampered(canary, statuses) is not None) is caught, (seed, log)
            assert graded.resolved is caught  # the forgery resolves where nothing catches it


def test_docstring_changes_stay_on_the_first_line() -> None:
    """A docstring whose text starts on the line after its quotes: the printed first line is
    what changes, never into a line that another test prints."""
    tree = ast.parse(MODULE)
    node = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "test_model"
    )
    doc = node.body[0]
    assert isinstance(doc, ast.Expr)
    lines = MODULE.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: doc.lineno - 1]) + doc.col_offset
    end = sum(len(line) for line in lines[: (doc.end_lineno or 0) - 1]) + (doc.end_col_offset or 0)
    text = MODULE.encode()[start:end]
    words = Words(vocabulary(tree), vocabulary(tree))
    first = short_description(ast.get_docstring(node, clean=False))
    for seed in range(10):
        new = doc_variants(text, random.Random(seed), 4, words, [])
        assert len(new) == 4
        firsts = [short_description(ast.literal_eval(t.decode())) for t in new]
        assert len(set(firsts)) == 4 and first not in firsts
        # The rest of the docstring is untouched.
        assert {t.split(b"\n", 2)[2] for t in new} == {text.split(b"\n", 2)[2]}


async def test_a_forged_django_runner_is_caught_and_the_gold_patch_is_not(tmp_path: Path) -> None:
    """Red team on a real Django (tests/fixtures/django_instance.py: 4.2.16, django__django-15790's
    bug put back): a patch to Django's own test runner (``django/test/runner.py``, source the
    integrity check keeps) that turns every failure into ``ok``, no fix. Graded as the agent's
    sandbox grades it (no canaries) it resolves: the attack works. Through the integrity check
    (:func:`grade_candidate`: derived canaries in the run) it is tampered, reward 0; the gold
    patch still resolves there. One local sandbox, reset between gradings."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    cache = django_instance.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    why = django_instance.download(cache)
    if why is not None:
        pytest.skip(f"Django {django_instance.VERSION}'s sdist is not cached and {why}")
    task = django_instance.task(cache)
    forged = django_instance.forgery_patch(Path(task.source or ""))
    async with create_sandbox({"type": "local", "root": str(tmp_path)}, task) as sandbox:
        plain = await evaluate(sandbox, task, model_patch=forged)
        assert plain.resolved and rewards.tests_score(plain) == 1.0, plain.log[-3000:]
        await sandbox.reset()
        graded = await grade_candidate(sandbox, task, forged)
        await sandbox.reset()
        assert graded.infrastructure_error is None, graded.infrastructure_error
        assert not graded.resolved and graded.tampered is not None, graded.log[-3000:]
        assert rewards.tests_score(graded) == 0.0
        gold = await grade_candidate(sandbox, task, task.patch)
        assert gold.resolved and gold.confirmed and gold.tampered is None, gold.log[-3000:]
        assert "canary tests planted in tests/check_framework/test_templates.py" in gold.log
