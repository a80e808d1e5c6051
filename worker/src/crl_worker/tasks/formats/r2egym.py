"""R2E-Gym records: environments built from commits of ten Python repositories.

An R2E-Gym record (``R2E-Gym/R2E-Gym-Lite``, ``-Subset``, ``-V1``) has no SWE-bench fields:

- ``repo_name`` is the bare repository name (``aiohttp``), ``commit_hash`` the fixing commit and
  ``docker_image`` its image (``namanjain12/aiohttp_final:<commit_hash>``), which holds the
  repository at the commit before the fix, with the held-out tests in ``/r2e_tests``;
- ``parsed_commit_content`` is the fixing commit as JSON (R2E-Gym's ``ParsedCommit``:
  ``old_commit_hash``, ``new_commit_hash``, ``file_diffs`` with hunks of typed lines): its
  non-test file diffs are the gold patch, ``old_commit_hash`` is the base commit;
- ``execution_result_content`` (JSON) carries the held-out test files (``test_file_names``,
  ``test_file_codes``) and the test run at the old commit (``old_commit_res_stdout``);
- ``expected_output_json`` maps each test (``Class.method`` or ``function``, the file left out)
  to its status once fixed (``PASSED``, ``FAILED``...).

The converter writes the held-out tests as a test patch adding ``r2e_tests/<name>``, turns each
expected test into a pytest id of that folder, and splits the ones expected to pass into
FAIL_TO_PASS (not passing at the old commit) and PASS_TO_PASS (passing there). The environment
is R2E-Gym's image's; without it a record may give its own with the per-record harness keys of
``swe-bench`` (``python``, ``install``, ``test_cmd``, ...), its log format pytest's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from crl_worker.tasks.formats.common import finish, recipe_fields
from crl_worker.tasks.formats.swebench import record_harness
from crl_worker.tasks.model import Task
from crl_worker.tasks.recipes import GENERIC_PYTHON
from crl_worker.tasks.records import ConvertOptions, Record, RecordRef, optional_text, text

#: GitHub repository of each R2E-Gym ``repo_name``.
R2EGYM_REPOS = {
    "aiohttp": "aio-libs/aiohttp",
    "coveragepy": "nedbat/coveragepy",
    "datalad": "datalad/datalad",
    "numpy": "numpy/numpy",
    "orange3": "biolab/orange3",
    "pandas": "pandas-dev/pandas",
    "pillow": "python-pillow/Pillow",
    "pyramid": "Pylons/pyramid",
    "scrapy": "scrapy/scrapy",
    "tornado": "tornadoweb/tornado",
}

#: R2E-Gym's instance images, named by repository and fixing commit.
R2EGYM_IMAGE = "namanjain12/{name}_final:{commit}"

#: The folder the held-out tests are written to (R2E-Gym's run_tests.sh runs them there).
TEST_DIR = "r2e_tests"

#: The record fields the converter maps (the rest is kept in ``metadata``).
R2EGYM_FIELDS = (
    "instance_id",
    "repo_name",
    "commit_hash",
    "docker_image",
    "parsed_commit_content",
    "execution_result_content",
    "expected_output_json",
    "problem_statement",
    "prompt",
    "modified_files",
    "relevant_files",
    "modified_entity_summaries",
)

#: The prefix of each R2E-Gym line type in a unified diff.
_MARKERS = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}

_PASSED_LINE = re.compile(r"^PASSED (\S+)", re.MULTILINE)


def _json_field(record: Record, ref: RecordRef, name: str, kind: type) -> Any:
    """A field holding JSON text (or the decoded value itself) of type ``kind``."""
    value = record.get(name)
    if value is None or value == "":
        raise ref.error("required field is missing", name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ref.error(f"must be JSON text: {exc.msg} at column {exc.colno}", name) from None
    if not isinstance(value, kind):
        raise ref.error(f"must hold a JSON {kind.__name__}, not {type(value).__name__}", name)
    return value


def _is_test_path(path: str) -> bool:
    """R2E-Gym's ``FileDiff.is_test_file``: such diffs are not part of the gold patch."""
    parts = path.split("/")
    return (
        path.endswith("_test.py")
        or parts[-1].startswith("test_")
        or bool({"tests", "Tests", "test", "Test"} & set(parts[:-1]))
    )


def render_file_diff(diff: Mapping[str, Any], ref: RecordRef, where: str) -> tuple[str, str]:
    """``(path, unified diff)`` of one ``file_diffs`` entry, written as R2E-Gym's
    ``FileDiff.get_patch`` writes it."""
    field = f"parsed_commit_content.{where}"
    try:
        path = str(diff["header"]["file"]["path"])
        out = [f"diff --git a/{path} b/{path}"]
        if diff["header"].get("misc_line"):
            out.append(str(diff["header"]["misc_line"]))
        index = diff.get("index_line")
        if index:
            mode = f" {index['mode']}" if index.get("mode") else ""
            out.append(f"index {index['old_commit_hash']}..{index['new_commit_hash']}{mode}")
        if diff.get("is_binary_file"):
            raise ref.error(f"{path} is a binary diff, which a text patch cannot carry", field)
        if diff.get("minus_file") and diff.get("plus_file"):
            out.append(f"--- {diff['minus_file']['path']}")
            out.append(f"+++ {diff['plus_file']['path']}")
        for hunk in diff.get("hunks") or []:
            desc = hunk["descriptor"]
            header = f"@@ -{_range(desc['old_range'])} +{_range(desc['new_range'])} @@"
            out.append(f"{header} {desc['section']}" if desc.get("section") else header)
            for line in hunk["line_group"]["all_lines"]:
                out.append(_MARKERS[line["type"]] + line["content"])
    except (KeyError, TypeError) as exc:
        raise ref.error(
            f"is not an R2E-Gym file diff (header.file.path, hunks[].descriptor, "
            f"hunks[].line_group.all_lines[].type/content): missing or wrong {exc}",
            field,
        ) from None
    return path, "\n".join(out) + "\n"


def _range(value: Mapping[str, Any]) -> str:
    start, length = value["start"], value.get("length")
    return f"{start}" if length is None else f"{start},{length}"


def pytest_id(name: str, files: Mapping[str, str], ref: RecordRef) -> str:
    """The pytest id of an ``expected_output_json`` key: ``TestX.test_y[1.5]`` in the one held-out
    file defining ``class TestX`` -> ``r2e_tests/test_1.py::TestX::test_y[1.5]``."""
    base, bracket, params = name.partition("[")
    parts = base.split(".")
    if len(files) == 1:
        (path,) = files
    else:
        first = parts[0]
        pattern = re.compile(
            rf"^\s*class {re.escape(first)}\b"
            if len(parts) > 1
            else rf"^\s*(async\s+)?def {re.escape(first)}\(",
            re.MULTILINE,
        )
        found = [p for p, code in files.items() if pattern.search(code)]
        if len(found) != 1:
            raise ref.error(
                f"test {name!r} is defined in {len(found)} of the held-out test files"
                f" ({', '.join(sorted(files))}), expected exactly one",
                "expected_output_json",
            )
        (path,) = found
    return f"{path}::{'::'.join(parts)}{bracket}{params}"


def convert_r2egym(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """R2E-Gym records (``R2E-Gym/R2E-Gym-Lite`` and the other splits)."""
    name = text(record, ref, "repo_name", required=True)
    commit = text(record, ref, "commit_hash", required=True)
    instance_id = optional_text(record, ref, "instance_id") or f"{name}__{commit}"
    ref.instance_id = instance_id
    repo = R2EGYM_REPOS.get(name.lower()) or (name if "/" in name else "")
    if not repo:
        raise ref.error(
            f"names repository {name!r}, which is not one of R2E-Gym's: "
            f"{', '.join(sorted(R2EGYM_REPOS))} (or write it as owner/name)",
            "repo_name",
        )
    parsed = _json_field(record, ref, "parsed_commit_content", dict)
    base_commit = parsed.get("old_commit_hash")
    if not isinstance(base_commit, str) or not base_commit:
        raise ref.error(
            "has no old_commit_hash (the commit before the fix)",
            "parsed_commit_content.old_commit_hash",
        )
    diffs = parsed.get("file_diffs")
    if not isinstance(diffs, list):
        raise ref.error("must be a list of file diffs", "parsed_commit_content.file_diffs")
    gold: list[str] = []
    for position, diff in enumerate(diffs):
        if not isinstance(diff, Mapping):
            raise ref.error("must be an object", f"parsed_commit_content.file_diffs[{position}]")
        path, rendered = render_file_diff(diff, ref, f"file_diffs[{position}]")
        if not _is_test_path(path):
            gold.append(rendered)
    if not gold:
        raise ref.error(
            "changes no file outside the tests: there is no gold patch",
            "parsed_commit_content.file_diffs",
        )
    execution = _json_field(record, ref, "execution_result_content", dict)
    names, codes = execution.get("test_file_names"), execution.get("test_file_codes")
    if (
        not isinstance(names, list)
        or not isinstance(codes, list)
        or len(names) != len(codes)
        or not names
        or not all(isinstance(v, str) for v in [*names, *codes])
    ):
        raise ref.error(
            "must hold test_file_names and test_file_codes, two lists of strings of one length"
            " (the held-out tests)",
            "execution_result_content",
        )
    files = {f"{TEST_DIR}/{n.rsplit('/', 1)[-1]}": c for n, c in zip(names, codes, strict=True)}
    expected = _json_field(record, ref, "expected_output_json", dict)
    old_out = execution.get("old_commit_res_stdout")
    passed_before = set(_PASSED_LINE.findall(old_out)) if isinstance(old_out, str) else None
    fail_to_pass: list[str] = []
    pass_to_pass: list[str] = []
    not_passing = 0
    for key, status in expected.items():
        test_name = re.sub(r"\x1b\[[0-9;]*m", "", str(key)).split(" - ")[0]
        if status != "PASSED":
            not_passing += 1
            continue
        test_id = pytest_id(test_name, files, ref)
        if passed_before is not None and test_id in passed_before:
            pass_to_pass.append(test_id)
        else:
            fail_to_pass.append(test_id)
    if not fail_to_pass:
        raise ref.error(
            "expects no test to pass that failed before the fix: nothing checks the fix",
            "expected_output_json",
        )
    # R2E-Gym's environment is its image's; without the image, a record may give its own
    # (python, install, test_cmd, env: the per-record harness keys of swe-bench).
    harness, used = record_harness(record, ref, recipe_fields(GENERIC_PYTHON))
    if harness["test"].log_format != "pytest":
        raise ref.error(
            "must be pytest: R2E-Gym's held-out tests are graded by their pytest ids", "log_format"
        )
    metadata: dict[str, Any] = {"recipe": "generic"}
    if used:
        metadata["record_keys"] = used
    if not_passing:
        # R2E-Gym also checks that these still fail; a task here grades only passing tests.
        metadata["expected_not_passing"] = not_passing
    if passed_before is None:
        metadata["split"] = "no old_commit_res_stdout: every expected-passing test is F2P"
    return finish(
        ref,
        options,
        record,
        (*R2EGYM_FIELDS, *used),
        default_image=optional_text(record, ref, "docker_image")
        or R2EGYM_IMAGE.format(name=name.lower(), commit=commit),
        metadata=metadata,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch="".join(gold),
        test_patch="".join(_new_file_diff(path, code) for path, code in files.items()),
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        problem_statement=_issue_text(text(record, ref, "problem_statement")),
        **harness,
    )


def _issue_text(statement: str) -> str:
    """The issue between R2E-Gym's ``[ISSUE]``/``[/ISSUE]`` markers (all of it when absent)."""
    match = re.search(r"\[ISSUE\](.*)\[/ISSUE\]", statement, re.DOTALL)
    return match.group(1).strip() if match else statement


def _new_file_diff(path: str, content: str) -> str:
    """A git diff creating ``path`` with ``content``."""
    lines = content.splitlines()
    if not lines:
        return f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
    body = "".join(f"+{line}\n" for line in lines)
    note = "" if content.endswith("\n") or not lines else "\\ No newline at end of file\n"
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}{note}"
    )


__all__ = [
    "R2EGYM_FIELDS",
    "R2EGYM_IMAGE",
    "R2EGYM_REPOS",
    "convert_r2egym",
    "pytest_id",
    "render_file_diff",
]
