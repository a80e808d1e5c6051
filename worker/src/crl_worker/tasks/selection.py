"""Which tests to run: the test files a test patch touches, and the ``{tests}`` argument.

The evaluation engine substitutes :func:`test_arguments` into ``TestSpec.command``'s ``{tests}``
(shell-quoted, space-separated). SWE-bench runs the test *files* the test patch touches; a
patch can also touch data files (``tests/static/config.toml``, fixture trees), which are not
passed to the runner. Files named by the FAIL_TO_PASS/PASS_TO_PASS ids themselves are added
too, so a test that lives in a file the patch did not touch (e.g. a data-driven test whose
inputs the patch changed) still runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import PurePosixPath

from crl_worker.tasks.model import Language, Task

# A git diff names the file twice; the b/ side is the file after the patch.
_DIFF_GIT = re.compile(r"^diff --git a/(?P<a>.+?) b/(?P<b>.+?)$")

# Directories that hold test inputs rather than test modules (sphinx's test roots, pylint's
# functional cases, fixture trees); their .py files are data.
_PY_DATA_DIRS = frozenset(
    {"roots", "fixtures", "fixture", "data", "testdata", "test_data", "functional", "input"}
)
_PY_NOT_TESTS = frozenset({"conftest.py", "__init__.py", "setup.py"})

_JAVA_TEST_NAME = re.compile(r"(^Test.*|.*(Test|Tests|TestCase|IT))\.java$")

# Django's verbose runner prints "test_name (app.module.Class)"; SWE-bench ids keep that form.
_DJANGO_ID = re.compile(r"^\S+ \((?P<label>[\w.]+)\)")


def patch_files(patch: str) -> list[str]:
    """Paths a unified diff leaves behind (new paths; deleted files are left out), in order.

    Reads git diffs (``diff --git a/… b/…``, including blocks without ``+++``: binary files,
    renames) and plain unified diffs (``--- …`` / ``+++ …`` pairs).
    """
    files: list[str] = []
    pending: str | None = None  # a git block's file whose +++ line has not come yet
    deleted = False
    previous = ""

    def keep(path: str) -> None:
        if path not in files:
            files.append(path)

    for line in patch.splitlines():
        git = _DIFF_GIT.match(line)
        if git:
            if pending is not None and not deleted:
                keep(pending)
            pending, deleted = git.group("b"), False
        elif line.startswith("deleted file mode") and pending is not None:
            deleted = True
        elif line.startswith("+++ ") and previous.startswith("--- "):
            # Only a +++ right after a --- is a header (a hunk can add a line "++ x").
            path = line[4:].split("\t", 1)[0].strip()
            if path == "/dev/null":
                deleted = True
            elif pending is None:
                keep(path[2:] if path.startswith("b/") else path)
            if pending is not None and not deleted:
                keep(pending)
            pending = None
        previous = line
    if pending is not None and not deleted:
        keep(pending)
    return files


def is_test_file(path: str, language: Language) -> bool:
    """Whether ``path`` is a test module the runner should be given (not a data file)."""
    p = PurePosixPath(path)
    dirs = set(p.parts[:-1])
    if language == "python":
        if p.suffix != ".py" or p.name in _PY_NOT_TESTS or dirs & _PY_DATA_DIRS:
            return False
        # Named like a test module; a helper module under tests/ (models.py, a fixture) is
        # not handed to the runner: the ids below name any test module this rule misses.
        return (
            p.name.startswith(("test_", "unittest_"))
            or p.name in {"tests.py", "test.py"}
            or (p.name.endswith(("_test.py", "_tests.py")))
        )
    if language == "java":
        if p.suffix != ".java":
            return False
        in_test_tree = "/src/test/" in f"/{path}" or p.parts[:1] in (("test",), ("tests",))
        return in_test_tree or bool(_JAVA_TEST_NAME.match(p.name))
    # Other languages: test files by the usual naming conventions.
    name = p.name
    return bool(
        re.search(r"(^test_|_test\.|\.test\.|\.spec\.|_spec\.|Test\.)", name)
        or dirs & {"test", "tests", "__tests__", "spec"}
    )


def test_files(test_patch: str, language: Language) -> list[str]:
    """Test files a test patch touches, in patch order, keeping only test modules."""
    return [f for f in patch_files(test_patch) if is_test_file(f, language)]


def java_test_class(path: str) -> str | None:
    """Fully qualified class of a Java test file (``…/src/test/java/org/x/FooTest.java`` ->
    ``org.x.FooTest``); ``None`` when the path has no ``java`` source root."""
    parts = PurePosixPath(path).with_suffix("").parts
    for root in ("java", "kotlin"):
        if root in parts:
            index = len(parts) - 1 - list(reversed(parts)).index(root)
            rest = parts[index + 1 :]
            if rest:
                return ".".join(rest)
    return None


def maven_modules(paths: Iterable[str]) -> list[str]:
    """Maven modules holding the given files: the directory before ``src/`` (``.`` at root)."""
    modules: list[str] = []
    for path in paths:
        parts = PurePosixPath(path).parts
        if "src" not in parts:
            continue
        module = "/".join(parts[: parts.index("src")]) or "."
        if module not in modules:
            modules.append(module)
    return modules


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        if item:
            seen.setdefault(item, None)
    return list(seen)


def _pytest_files_from_ids(ids: Iterable[str]) -> list[str]:
    out = []
    for test_id in ids:
        head = test_id.split("::", 1)[0].strip()
        if "::" in test_id and head.endswith(".py"):
            out.append(head)
    return out


def django_label(path: str) -> str:
    """Dotted label Django's ``runtests.py`` takes for a file under ``tests/``
    (``tests/lookup/tests.py`` -> ``lookup.tests``)."""
    p = PurePosixPath(path).with_suffix("")
    parts = p.parts[1:] if p.parts[:1] == ("tests",) else p.parts
    return ".".join(parts)


def _django_labels_from_ids(ids: Iterable[str]) -> list[str]:
    out = []
    for test_id in ids:
        match = _DJANGO_ID.match(test_id)
        if match:
            # "app.module.Class" -> the module "app.module".
            out.append(match.group("label").rpartition(".")[0])
    return out


def _java_id_parts(test_id: str) -> tuple[str, str | None]:
    """``org.x.FooTest#bar[1]`` -> (``org.x.FooTest``, ``bar``); also accepts ``Class::method``
    (Defects4J) and a bare class."""
    for separator in ("#", "::"):
        if separator in test_id:
            cls, _, method = test_id.partition(separator)
            # Parameterized and signature suffixes are not part of the method's name:
            # "m[1]", "m(String)", and Surefire's JUnit 5 form "m{String, int}[1]".
            method = re.split(r"[\[({\s]", method, maxsplit=1)[0]
            return cls.strip(), method or None
    return test_id.strip(), None


def maven_test_filter(ids: Iterable[str]) -> str:
    """One Surefire ``-Dtest`` value for test ids: ``A#m1+m2,B`` (a bare class runs whole)."""
    methods: dict[str, list[str] | None] = {}
    for test_id in ids:
        cls, method = _java_id_parts(test_id)
        if not cls:
            continue
        if method is None:
            methods[cls] = None  # the whole class
        elif cls not in methods:
            methods[cls] = [method]
        else:
            known = methods[cls]
            if known is not None and method not in known:
                known.append(method)
    return ",".join(cls if ms is None else f"{cls}#{'+'.join(ms)}" for cls, ms in methods.items())


def gradle_test_filters(ids: Iterable[str]) -> list[str]:
    """``--tests`` arguments for Gradle: ``["--tests", "A.m1", "--tests", "B"]``."""
    out: list[str] = []
    for entry in _dedupe(
        cls if method is None else f"{cls}.{method}"
        for cls, method in (_java_id_parts(i) for i in ids)
    ):
        out += ["--tests", entry]
    return out


def _build_system(task: Task) -> str | None:
    declared = task.metadata.get("build_system")
    if isinstance(declared, str):
        return declared
    command = task.test_spec.command.lstrip()
    if command.startswith("mvn") or " mvn " in command:
        return "maven"
    if "gradle" in command:
        return "gradle"
    return None


def test_ids(task: Task) -> list[str]:
    """FAIL_TO_PASS then PASS_TO_PASS ids, without repeats."""
    return _dedupe([*task.fail_to_pass, *task.pass_to_pass])


def test_arguments(task: Task) -> list[str]:
    """The arguments that replace ``{tests}`` in ``task.test_spec.command`` (unquoted; the engine
    shell-quotes each one).

    - ``select == "files"``: the test files the test patch touches plus the files named by the
      test ids (pytest ids ``path::name``); Django gets dotted labels instead of paths.
    - ``select == "ids"``: the FAIL_TO_PASS and PASS_TO_PASS ids, sorted by name; for Maven one
      ``-Dtest`` value (``Class#m1+m2,Other``), for Gradle ``--tests Class.method`` pairs.

    An empty list means nothing could be selected (e.g. a SymPy test patch that touches no
    test module): the caller must not run the command then, since most runners given no
    arguments run the whole suite.
    """
    ids = test_ids(task)
    if task.test_spec.select == "ids":
        # In the order of their names, not FAIL_TO_PASS before PASS_TO_PASS: the command line
        # is readable by the code under test, and the integrity check's canaries join these
        # ids (harness/canary.py, with_canary); an order by role would say which are which.
        ids = sorted(ids)
        build = _build_system(task) if task.language == "java" else None
        if build == "maven":
            value = maven_test_filter(ids)
            return [value] if value else []
        if build == "gradle":
            return gradle_test_filters(ids)
        return ids
    files = test_files(task.test_patch, task.language)
    if task.test_spec.log_format == "django":
        return _dedupe([*(django_label(f) for f in files), *_django_labels_from_ids(ids)])
    if task.test_spec.log_format == "pytest":
        return _dedupe([*files, *_pytest_files_from_ids(ids)])
    return files


__all__ = [
    "django_label",
    "gradle_test_filters",
    "is_test_file",
    "java_test_class",
    "maven_modules",
    "maven_test_filter",
    "patch_files",
    "test_arguments",
    "test_files",
    "test_ids",
]
