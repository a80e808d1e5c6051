"""Small-program benchmarks' records: QuixBugs (Python and Java), BugsInPy, Aider's polyglot
exercises, and records already in the task schema."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

from crl_worker.tasks.formats.common import (
    build_task,
    finish,
    list_field,
    recipe_fields,
    repo_name,
)
from crl_worker.tasks.model import JEST_REPORT_MARKER, Task, TestSpec
from crl_worker.tasks.recipes import PYTEST, java_recipe
from crl_worker.tasks.records import (
    ConvertOptions,
    Record,
    RecordRef,
    optional_text,
    string_list,
    text,
)

# --- QuixBugs ---------------------------------------------------------------------------------------

QUIXBUGS_REPO = "jkoppel/QuixBugs"
#: Several buggy QuixBugs programs loop forever (``bitcount``, ``sqrt``, ...): each test gets
#: QuixBugs' Java limit (JUnit ``timeout = 3000``) doubled, and fails when it runs out; the
#: slow ``knapsack`` case is skipped as QuixBugs skips it without ``--runslow``.
QUIXBUGS_PYTEST = "pytest -rA -v -p no:cacheprovider --timeout=6 {tests}"


def convert_quixbugs(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """QuixBugs programs (one record per program and language): the buggy program sits in
    ``python_programs/`` or ``java_programs/`` of the QuixBugs repository, its tests in
    ``python_testcases/`` (pytest) or ``java_testcases/junit/`` (Gradle)."""
    program = text(record, ref, "program", required=True)
    language_name = (optional_text(record, ref, "language") or "python").lower()
    instance_id = optional_text(record, ref, "instance_id") or (
        f"quixbugs-{language_name}-{program.lower()}"
    )
    ref.instance_id = instance_id
    repo = repo_name(optional_text(record, ref, "repo") or QUIXBUGS_REPO, ref)
    base_commit = text(record, ref, "base_commit", required=True)
    explicit = list_field(record, ref, "FAIL_TO_PASS", "fail_to_pass")
    if language_name == "python":
        test_file = f"python_testcases/test_{program.lower()}.py"
        # Most QuixBugs test files hold one parametrized test named after the program, which
        # the id names (its runs, ``test_x[input_data0-7]``, match it); the graph programs'
        # files hold test1, test2, ...: their records list them in FAIL_TO_PASS. (A bare file
        # id would match nothing: pytest reports ``file::test``.)
        fail_to_pass = explicit or [f"{test_file}::test_{program.lower()}"]
        test = TestSpec(command=QUIXBUGS_PYTEST, log_format="pytest", select="ids")
        fields: dict[str, Any] = {
            "language": "python",
            "python": optional_text(record, ref, "python") or "3.9",
            "install": ["python -m pip install pytest pytest-timeout"],
            "test": test,
        }
        # The runner gets the test file even though no test patch names it.
        test_patch = text(record, ref, "test_patch")
        metadata_extra = {"test_file": test_file}
    elif language_name == "java":
        name = program.upper()
        fail_to_pass = explicit or [f"java_testcases.junit.{name}_TEST"]
        # QuixBugs builds with Gradle (no wrapper); a converted copy may carry a pom.xml.
        build = (optional_text(record, ref, "build_system") or "gradle").lower()
        if build not in ("gradle", "maven"):
            raise ref.error(
                f"QuixBugs build_system {build!r} is not supported: use 'gradle' or 'maven'",
                "build_system",
            )
        recipe = java_recipe("maven" if build == "maven" else "gradle")
        fields = recipe_fields(recipe)
        test_patch = text(record, ref, "test_patch")
        metadata_extra = {"build_system": build}
    else:
        raise ref.error(
            f"QuixBugs language {language_name!r} is not supported: use 'python' or 'java'",
            "language",
        )
    consumed = {"program", "language", "instance_id", "repo", "base_commit", "FAIL_TO_PASS",
                "fail_to_pass", "patch", "test_patch", "problem_statement", "python",
                "source", "build_system"}  # fmt: skip
    source = optional_text(record, ref, "source")
    if source:
        fields["source"] = source
    return finish(
        ref,
        options,
        record,
        consumed,
        metadata={**metadata_extra, "program": program},
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=text(record, ref, "patch"),
        test_patch=test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=list_field(record, ref, "PASS_TO_PASS", "pass_to_pass"),
        problem_statement=text(record, ref, "problem_statement")
        or f"The QuixBugs program {program} has a one-line bug. Find and fix it.",
        **fields,
    )


# --- BugsInPy ---------------------------------------------------------------------------------------

_PYTEST_CALL = re.compile(r"^\s*(?:python\d*(?:\.\d+)? -m )?pytest\b(?P<args>.*)$")
_UNITTEST_CALL = re.compile(r"^\s*python\d*(?:\.\d+)? -m unittest\b(?P<args>.*)$")


def _bugsinpy_tests(lines: list[str], ref: RecordRef) -> tuple[str, list[str]]:
    """(runner, test ids) from BugsInPy's ``run_test.sh`` lines."""
    runner: str | None = None
    ids: list[str] = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        for name, pattern in (("pytest", _PYTEST_CALL), ("unittest", _UNITTEST_CALL)):
            match = pattern.match(line)
            if match:
                if runner not in (None, name):
                    raise ref.error("mixes pytest and unittest commands", "run_test")
                runner = name
                ids += [a for a in match.group("args").split() if not a.startswith("-")]
                break
        else:
            raise ref.error(
                f"cannot read test command {line.strip()!r}: expected 'pytest …' or"
                " 'python -m unittest …'",
                "run_test",
            )
    if runner is None or not ids:
        raise ref.error("names no tests", "run_test")
    return runner, ids


#: Lines of a BugsInPy ``requirements.txt`` (a ``pip freeze``) that no index serves: the
#: project itself as an editable VCS checkout (installed from the sandbox's own checkout
#: instead), and the ``pkg-resources==0.0.0`` entry Debian's pip adds to every freeze.
_UNINSTALLABLE = re.compile(r"^(?:-e\s|\S*(?:git|hg|svn)\+|pkg[-_]resources==0\.0\.0$)", re.I)
#: A requirement's project name (``nose`` of ``nose==1.3.7``).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _bugsinpy_requirements(requirements: str) -> tuple[dict[str, str], list[str]]:
    """(requirements pip can install, by normalized project name; lines left out) from a
    BugsInPy ``requirements.txt``.

    A package named twice (a pinned freeze line, then ``setup.sh``'s bare ``pip install nose``)
    is kept once, pinned where either is: older pips refuse a double requirement."""
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for raw in requirements.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if _UNINSTALLABLE.match(line):
            dropped.append(line)
            continue
        name = _NAME.match(line)
        key = re.sub(r"[-_.]+", "-", name.group(0)).lower() if name else line
        if key not in kept or _NAME.fullmatch(kept[key]):  # new, or only named so far
            kept[key] = line
    return kept, dropped


def convert_bugsinpy(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """BugsInPy bugs: ``bug.info`` fields plus the commands of ``run_test.sh``; the record's
    ``requirements`` (BugsInPy's ``requirements.txt``) are installed by name, so the
    repository need not hold that file."""
    project = text(record, ref, "project", required=True)
    bug_id = text(record, ref, "bug_id", required=True)
    instance_id = optional_text(record, ref, "instance_id") or f"{project}-{bug_id}"
    ref.instance_id = instance_id
    repo = repo_name(text(record, ref, "repo", required=True), ref)
    base_commit = text(record, ref, "buggy_commit_id", required=True)
    raw = record.get("run_test")
    lines = raw.splitlines() if isinstance(raw, str) else string_list(record, ref, "run_test")
    runner, ids = _bugsinpy_tests(lines, ref)
    if runner == "pytest":
        test = TestSpec(command=PYTEST, log_format="pytest", select="ids")
    else:
        test = TestSpec(command="python -m unittest -v {tests}", log_format="unittest",
                        select="ids")  # fmt: skip
    python = optional_text(record, ref, "python_version")
    kept, dropped = _bugsinpy_requirements(text(record, ref, "requirements"))
    requirements = list(kept.values())
    if runner == "pytest" and "pytest" not in kept:
        requirements.append("pytest")  # run_test.sh calls it; BugsInPy's freeze may not list it
    install = ["python -m pip install " + shlex.join(requirements)] if requirements else []
    install.append("python -m pip install -e .")
    consumed = {"project", "bug_id", "instance_id", "repo", "buggy_commit_id", "run_test",
                "python_version", "patch", "test_patch", "problem_statement",
                "requirements", "source"}  # fmt: skip
    source = optional_text(record, ref, "source")
    return finish(
        ref,
        options,
        record,
        consumed,
        metadata={"requirements_left_out": dropped} if dropped else None,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=text(record, ref, "patch"),
        test_patch=text(record, ref, "test_patch"),
        fail_to_pass=ids,
        pass_to_pass=list_field(record, ref, "PASS_TO_PASS", "pass_to_pass"),
        problem_statement=text(record, ref, "problem_statement"),
        # BugsInPy writes full versions (3.8.3); the sandbox picks interpreters by major.minor.
        python=".".join(python.split(".")[:2]) if python else None,
        install=install,
        test=test,
        **({"source": source} if source else {}),
    )


# --- Aider-polyglot style exercises -----------------------------------------------------------------

#: Languages the ``polyglot`` format loads, in Aider's benchmark's folder names.
POLYGLOT_LANGUAGES = ("python", "java", "go", "rust", "cpp", "javascript")
#: The C++ test binary's JUnit report (Catch2's ``--reporter junit``), in the exercise's folder.
CATCH2_REPORT = "build/crl-catch2-report.xml"
#: Jest's ``--json`` report, in the exercise's folder (printed into the log after the run).
JEST_REPORT = ".crl-jest-report.json"
#: Exercism marks all tests but the first to skip (``xtest``, ``xit``); the runner runs them all,
#: as Aider's benchmark does (its ``npm-test.sh`` turns ``xtest(`` into ``test(``).
UNSKIP_JEST = r"sed -i -E 's/\bx(test|it|describe)\(/\1(/g'"
#: Exercism's Java tests: every ``@Disabled(...)`` line under ``src/test`` deleted before the run.
UNSKIP_JAVA = r"find src/test -name '*.java' -exec sed -i -E '/^\s*@Disabled\(/d' {} +"


def polyglot_test_spec(
    language: str, exercise_dir: str, exercise: str, test_files: Sequence[str] = ()
) -> TestSpec:
    """How an exercise is tested, from the repository's root (``test_files``, relative to the
    exercise's folder: JavaScript's test files, by default ``<exercise>.spec.js``). Java's is
    Maven's (a converted copy's ``pom.xml``); Python's and Java's select the tests by id.

    Each runs every test of the exercise (the tests Exercism marks as skipped included:
    ``--include-ignored``, ``EXERCISM_RUN_ALL_TESTS``, Java's ``@Disabled``) and reports each test by name; code
    that does not compile is reported as a build failure, which grading counts as every test
    failed. Build folders left by the agent are removed first (``pre``): a stale build there
    could stand in for the code under test.
    """
    where = shlex.quote(exercise_dir)
    if language == "python":
        # From the repository's root: pytest puts the test file's folder on sys.path.
        return TestSpec(command=PYTEST, log_format="pytest", select="ids")
    if language == "go":
        return TestSpec(command=f"cd {where} && go test -json ./...", log_format="go")
    if language == "rust":
        return TestSpec(
            # The integration tests only (the hidden ones), not unit or doc tests of the
            # candidate's own files (nor the reference solution's, when FAIL_TO_PASS is made).
            command=f"cd {where} && cargo test --offline --test '*' -- --include-ignored",
            log_format="cargo",
            pre=[f"rm -rf {where}/target"],
        )
    if language == "cpp":
        target = shlex.quote(exercise)
        return TestSpec(
            command=(
                f"cd {where} && cmake -S . -B build -DEXERCISM_RUN_ALL_TESTS=ON >/dev/null"
                f" && cmake --build build --target {target}"
                f" && ./build/{target} --reporter junit --out {CATCH2_REPORT}"
            ),
            log_format="junit",
            junit_reports=[f"{exercise_dir}/{CATCH2_REPORT}"],
            pre=[f"rm -rf {where}/build"],
        )
    if language == "javascript":
        # The shared Jest (sandbox/node.py) with a configuration of its own (``--config {}``:
        # no jest.config.js or package.json "jest" key the agent could add takes part), Babel's
        # from the exercise; only the task's test files (``--runTestsByPath``: a test file the
        # agent adds, with tests named like the task's, does not run); no transform cache
        # (entries from the agent's runs could stand in for the code under test); one process.
        report = shlex.quote(JEST_REPORT)
        files = " ".join(shlex.quote(f) for f in (test_files or [f"{exercise}.spec.js"]))
        return TestSpec(
            command=(
                f"cd {where} && {UNSKIP_JEST} {files}"
                f" && {{ jest --ci --no-cache --runInBand --config '{{}}' --json"
                f" --outputFile={report} --runTestsByPath {files}; status=$?;"
                f" printf '\\n%s %s\\n' {JEST_REPORT_MARKER} \"$status\";"
                f" cat {report} 2>/dev/null; exit $status; }}"
            ),
            log_format="jest",
            pre=[f"rm -f {where}/{report}"],
        )
    if language == "java":
        # Maven (Surefire) in the exercise's folder; its ``pom.xml`` is the converted copy's
        # (scripts/polyglot_tasks.py), Aider's own build is Gradle's (``java_test_spec``).
        # Exercism marks all tests but the first ``@Disabled("Remove to run test")``: the
        # runner runs them all, as Aider's benchmark does (it deletes those lines too).
        maven = java_recipe("maven").test_spec()
        return maven.model_copy(
            update={
                "command": f"cd {where} && {UNSKIP_JAVA} && {maven.command}",
                "pre": [*maven.pre, f"rm -rf {where}/target"],
            }
        )
    raise ValueError(f"no test command for polyglot language {language!r}")


#: What each compiled language's tests need in the environment: no network, no downloads.
POLYGLOT_ENV: dict[str, dict[str, str]] = {
    "go": {"GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"},
    "rust": {"CARGO_NET_OFFLINE": "true", "CARGO_TERM_COLOR": "never"},
    "cpp": {},
    "javascript": {"CI": "true", "NO_COLOR": "1"},
}


#: Run once per sandbox before the agent starts. Go: the standard library into the build cache,
#: which a local sandbox shares between sandboxes (read-only for the agent); compiled once per
#: machine, a second or two after that, instead of a minute for each sandbox's first test run.
#: Go: the standard library, and the ``test2json`` tool the integrity check's run calls (Go
#: 1.24+ builds it on first use into the build cache, which the agent's commands only read).
POLYGLOT_INSTALL: dict[str, tuple[str, ...]] = {
    "go": ("go build std", "go tool -n test2json > /dev/null")
}


def convert_polyglot(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """Exercism-style exercises (Aider's polyglot benchmark): solution stubs plus tests in the
    benchmark repository, or in a repository of the exercise alone whose tests come in
    ``test_patch`` (hidden until grading: an ``implement`` task). Python (pytest), Java
    (Gradle, or Maven with ``build_system: maven``), Go (``go test -json``), Rust (``cargo test``), C++ (CMake and Catch2) and
    JavaScript (Jest)."""
    language_name = text(record, ref, "language", required=True).lower()
    exercise = text(record, ref, "exercise", required=True)
    instance_id = optional_text(record, ref, "instance_id") or f"{language_name}__{exercise}"
    ref.instance_id = instance_id
    repo = repo_name(optional_text(record, ref, "repo") or "Aider-AI/polyglot-benchmark", ref)
    base_commit = text(record, ref, "base_commit", required=True)
    exercise_dir = f"{language_name}/exercises/practice/{exercise}"
    test_files_list = string_list(record, ref, "test_files")
    explicit = list_field(record, ref, "FAIL_TO_PASS", "fail_to_pass")
    fields: dict[str, Any]
    metadata: dict[str, Any] = {"exercise_dir": exercise_dir}
    if language_name == "python":
        tests = [f"{exercise_dir}/{t}" for t in test_files_list] or [
            f"{exercise_dir}/{exercise.replace('-', '_')}_test.py"
        ]
        fields = {
            "language": "python",
            "python": "3.11",
            "install": ["python -m pip install pytest"],
            "test": polyglot_test_spec("python", exercise_dir, exercise),
        }
        fail_to_pass = explicit or tests
    elif language_name == "java":
        # Aider's exercises build with Gradle (the default); a converted copy carries a
        # pom.xml (scripts/polyglot_tasks.py: the machines have Maven, not Gradle).
        build = (optional_text(record, ref, "build_system") or "gradle").lower()
        if build not in ("gradle", "maven"):
            raise ref.error(
                f"polyglot build_system {build!r} is not supported: use 'gradle' or 'maven'",
                "build_system",
            )
        fields = recipe_fields(java_recipe("gradle"))
        if build == "maven":
            fields["test"] = polyglot_test_spec("java", exercise_dir, exercise)
        else:
            # Each exercise is its own Gradle project: run it from the exercise's folder.
            where = shlex.quote(exercise_dir)
            fields["test"] = fields["test"].model_copy(
                update={"command": f"cd {where} && {UNSKIP_JAVA} && gradle test --continue"
                        " {tests}"}
            )  # fmt: skip
        metadata["build_system"] = build
        fail_to_pass = explicit or [
            t.rsplit("/", 1)[-1].removesuffix(".java") for t in test_files_list
        ]
        if not fail_to_pass:
            raise ref.error("Java exercises need test_files or FAIL_TO_PASS", "test_files")
    elif language_name in POLYGLOT_ENV:
        if not explicit:
            raise ref.error(
                f"{language_name} exercises need FAIL_TO_PASS: the test ids as the runner"
                " reports them (scripts/polyglot_tasks.py writes them from a reference run)",
                "FAIL_TO_PASS",
            )
        install = list(POLYGLOT_INSTALL.get(language_name, ()))
        if language_name == "rust":
            # The crates a base's Cargo.lock pins (scripts/polyglot_tasks.py), fetched with the
            # network into the sandbox's cargo home; the tests then build offline.
            install.append(
                f"cd {shlex.quote(exercise_dir)} && if [ -f Cargo.lock ]; then"
                " CARGO_NET_OFFLINE=false cargo fetch --locked --quiet; fi"
            )
        fields = {
            "language": language_name,
            "install": install,
            "test": polyglot_test_spec(language_name, exercise_dir, exercise, test_files_list),
            "env": dict(POLYGLOT_ENV[language_name]),
        }
        fail_to_pass = explicit
    else:
        raise ref.error(
            f"polyglot language {language_name!r} is not supported: use one of"
            f" {', '.join(POLYGLOT_LANGUAGES)}",
            "language",
        )
    test_patch = text(record, ref, "test_patch")
    source = optional_text(record, ref, "source")
    consumed = {"language", "exercise", "instance_id", "repo", "base_commit", "test_files",
                "instructions", "FAIL_TO_PASS", "fail_to_pass", "PASS_TO_PASS",
                "pass_to_pass", "patch", "test_patch", "source", "build_system"}  # fmt: skip
    return finish(
        ref,
        options,
        record,
        consumed,
        metadata=metadata,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=text(record, ref, "patch"),
        test_patch=test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=list_field(record, ref, "PASS_TO_PASS", "pass_to_pass"),
        problem_statement=text(record, ref, "instructions"),
        # Tests that come as a patch are withheld from the agent until grading.
        task_type="implement" if test_patch.strip() else "repair",
        **({"source": source} if source else {}),
        **fields,
    )


def convert_native(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """A record already in the :class:`Task` schema (the ``task`` format): validated as is."""
    instance_id = record.get("instance_id")
    if isinstance(instance_id, str) and instance_id:
        ref.instance_id = instance_id
    return build_task(ref, **record)


__all__ = [
    "CATCH2_REPORT",
    "JEST_REPORT",
    "POLYGLOT_ENV",
    "POLYGLOT_INSTALL",
    "POLYGLOT_LANGUAGES",
    "QUIXBUGS_PYTEST",
    "QUIXBUGS_REPO",
    "convert_bugsinpy",
    "convert_native",
    "convert_polyglot",
    "convert_quixbugs",
    "polyglot_test_spec",
]
