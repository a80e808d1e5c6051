"""Small-program benchmarks' records: QuixBugs (Python and Java), BugsInPy, Aider's polyglot
exercises, and records already in the task schema."""

from __future__ import annotations

import re
from typing import Any

from crl_worker.tasks.formats.common import (
    build_task,
    finish,
    list_field,
    recipe_fields,
    repo_name,
)
from crl_worker.tasks.model import Task, TestSpec
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
        fail_to_pass = explicit or [test_file]
        # The test file is the id (no test patch names it); results match it as a prefix.
        test = TestSpec(command=PYTEST, log_format="pytest", select="ids")
        fields: dict[str, Any] = {
            "language": "python",
            "python": optional_text(record, ref, "python") or "3.9",
            "install": ["python -m pip install pytest"],
            "test": test,
        }
        # The runner gets the test file even though no test patch names it.
        test_patch = text(record, ref, "test_patch")
        metadata_extra = {"test_file": test_file}
    elif language_name == "java":
        name = program.upper()
        fail_to_pass = explicit or [f"java_testcases.junit.{name}_TEST"]
        recipe = java_recipe("gradle")
        fields = recipe_fields(recipe)
        test_patch = text(record, ref, "test_patch")
        metadata_extra = {"build_system": "gradle"}
    else:
        raise ref.error(
            f"QuixBugs language {language_name!r} is not supported: use 'python' or 'java'",
            "language",
        )
    consumed = {"program", "language", "instance_id", "repo", "base_commit", "FAIL_TO_PASS",
                "fail_to_pass", "patch", "test_patch", "problem_statement", "python"}  # fmt: skip
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


def convert_bugsinpy(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """BugsInPy bugs: ``bug.info`` fields plus the commands of ``run_test.sh``."""
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
    requirements = text(record, ref, "requirements")
    install = ["python -m pip install -r requirements.txt"] if requirements else []
    install.append("python -m pip install -e .")
    consumed = {"project", "bug_id", "instance_id", "repo", "buggy_commit_id", "run_test",
                "python_version", "patch", "test_patch", "problem_statement",
                "requirements"}  # fmt: skip
    return finish(
        ref,
        options,
        record,
        consumed,
        metadata={"requirements": requirements} if requirements else None,
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
    )


# --- Aider-polyglot style exercises -----------------------------------------------------------------


def convert_polyglot(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """Exercism-style exercises (Aider's polyglot benchmark): solution stubs plus tests in the
    benchmark repository. Python (pytest) and Java (Gradle) are supported."""
    language_name = text(record, ref, "language", required=True).lower()
    exercise = text(record, ref, "exercise", required=True)
    instance_id = optional_text(record, ref, "instance_id") or f"{language_name}__{exercise}"
    ref.instance_id = instance_id
    repo = repo_name(optional_text(record, ref, "repo") or "Aider-AI/polyglot-benchmark", ref)
    base_commit = text(record, ref, "base_commit", required=True)
    exercise_dir = f"{language_name}/exercises/practice/{exercise}"
    test_files_list = string_list(record, ref, "test_files")
    if language_name == "python":
        tests = [f"{exercise_dir}/{t}" for t in test_files_list] or [
            f"{exercise_dir}/{exercise.replace('-', '_')}_test.py"
        ]
        fields: dict[str, Any] = {
            "language": "python",
            "python": "3.11",
            "install": ["python -m pip install pytest"],
            "test": TestSpec(command=PYTEST, log_format="pytest", select="ids"),
        }
        fail_to_pass = tests
    elif language_name == "java":
        recipe = java_recipe("gradle")
        fields = recipe_fields(recipe)
        # Each exercise is its own Gradle project: run it from the exercise's folder.
        fields["test"] = fields["test"].model_copy(
            update={"command": f"cd {exercise_dir} && gradle test --continue {{tests}}"}
        )
        fail_to_pass = string_list(record, ref, "FAIL_TO_PASS") or [
            t.rsplit("/", 1)[-1].removesuffix(".java") for t in test_files_list
        ]
        if not fail_to_pass:
            raise ref.error("Java exercises need test_files or FAIL_TO_PASS", "test_files")
    else:
        raise ref.error(
            f"polyglot language {language_name!r} is not supported yet: only python and java"
            " have a log parser here",
            "language",
        )
    consumed = {"language", "exercise", "instance_id", "repo", "base_commit", "test_files",
                "instructions", "FAIL_TO_PASS"}  # fmt: skip
    return finish(
        ref,
        options,
        record,
        consumed,
        metadata={"exercise_dir": exercise_dir},
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        fail_to_pass=fail_to_pass,
        problem_statement=text(record, ref, "instructions"),
        **fields,
    )


def convert_native(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """A record already in the :class:`Task` schema (the ``task`` format): validated as is."""
    instance_id = record.get("instance_id")
    if isinstance(instance_id, str) and instance_id:
        ref.instance_id = instance_id
    return build_task(ref, **record)


__all__ = [
    "QUIXBUGS_REPO",
    "convert_bugsinpy",
    "convert_native",
    "convert_polyglot",
    "convert_quixbugs",
]
