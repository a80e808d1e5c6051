"""Task loaders, recipes and test selection, on the real SWE-bench and Multi-SWE-bench data in
shared/data plus small records of the other formats written here."""

from __future__ import annotations

import datetime
import json
import logging
import shlex
import shutil
import subprocess
import typing
from collections import Counter
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crl_worker.api.common import TaskFilter, TaskFormat
from crl_worker.errors import TaskFormatError
from crl_worker.tasks import Task, formats, load_tasks, recipes, selection
from crl_worker.tasks.loaders import load_records
from crl_worker.tasks.records import RecordRef, read_text_records, rows_with_refs

DATA = Path(__file__).resolve().parents[1] / "shared" / "data"
if not DATA.is_dir():  # helpers' checkouts see the shared folder one level up
    DATA = Path("/work/shared/data")
LITE = DATA / "swe-bench-lite.jsonl"
VERIFIED = DATA / "swe-bench-verified-sample50.jsonl"
JAVA = DATA / "multi-swe-bench-java-sample.jsonl"

pytestmark = pytest.mark.skipif(not LITE.is_file(), reason="shared/data is not present")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _by_id(tasks: list[Task]) -> dict[str, Task]:
    return {t.instance_id: t for t in tasks}


@pytest.fixture(scope="module")
def lite() -> list[Task]:
    result = load_tasks(LITE, "swe-bench")
    assert result.errors == []
    return result.tasks


# --- real data ------------------------------------------------------------------------------------


def test_lite_loads_all_300_with_their_fields(lite: list[Task]) -> None:
    assert len(lite) == 300
    assert len({t.instance_id for t in lite}) == 300
    repos = Counter(t.repo for t in lite)
    assert repos["django/django"] == 114
    assert repos["sympy/sympy"] == 77
    assert set(repos) >= {"pallets/flask", "pytest-dev/pytest", "psf/requests", "pydata/xarray"}
    task = _by_id(lite)["sympy__sympy-20590"]
    assert task.fail_to_pass == ["test_immutable"]
    assert "test_structure" in task.pass_to_pass
    assert task.base_commit == "cffd4e0f86fefd4802349a9f9b19ed70934ea354"
    assert task.version == "1.7"
    assert task.patch.startswith("diff --git a/sympy/core/_print_helpers.py")
    assert task.problem_statement and task.environment_setup_commit
    # The JSON strings of the file became real lists everywhere.
    assert all(isinstance(t.fail_to_pass, list) and t.fail_to_pass for t in lite)
    django = _by_id(lite)["django__django-11905"]
    assert django.fail_to_pass[0] == "test_isnull_non_boolean_value (lookup.tests.LookupTests)"


def test_verified_sample_keeps_difficulty() -> None:
    result = load_tasks(VERIFIED, "swe-bench")
    assert result.errors == [] and len(result.tasks) == 50
    assert len({t.repo for t in result.tasks}) == 12
    assert all("difficulty" in t.metadata for t in result.tasks)
    requests = [t for t in result.tasks if t.repo == "psf/requests"]
    assert any(
        t.fail_to_pass == ["test_requests.py::RequestsTestCase::test_no_content_length"]
        for t in requests
    )


def test_recipes_for_sympy_flask_pytest(lite: list[Task]) -> None:
    tasks = _by_id(lite)
    sympy = tasks["sympy__sympy-20590"]
    assert sympy.python == "3.9"
    assert sympy.test.log_format == "sympy" and sympy.test.select == "files"
    assert sympy.test.command.startswith("bin/test -C --verbose")
    assert "python -m pip install mpmath==1.3.0" in sympy.install
    assert sympy.image == "swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest"

    flask_20 = tasks["pallets__flask-4045"]  # version 2.0
    assert flask_20.python == "3.9"
    assert any("pytest==7.2.0" in c and "Werkzeug==2.3.7" in c for c in flask_20.install)
    assert flask_20.test.log_format == "pytest"
    flask_23 = tasks["pallets__flask-4992"]  # version 2.3
    assert flask_23.python == "3.11"

    for task in (t for t in lite if t.repo == "pytest-dev/pytest"):
        assert task.python == "3.9", task.instance_id
        assert task.install[-1] == "python -m pip install -e ."
        # pytest takes its version from git tags: an export needs the pretend version.
        assert task.env["SETUPTOOLS_SCM_PRETEND_VERSION"] == f"{task.version}.0"
    pytest_44 = tasks["pytest-dev__pytest-5221"]
    assert "pluggy==0.13.1" in pytest_44.install[0]


def test_every_lite_repository_has_a_recipe(lite: list[Task]) -> None:
    assert {t.metadata["recipe"] for t in lite} == {"table"}
    image_only = {t.repo for t in lite if t.metadata.get("image_only")}
    assert image_only == {
        "astropy/astropy",
        "matplotlib/matplotlib",
        "scikit-learn/scikit-learn",
    }
    # seaborn is pure Python on pinned wheels (docs/validation.md: it runs locally).
    seaborn = [t for t in lite if t.repo == "mwaskom/seaborn"]
    assert seaborn and all("matplotlib==3.7.2" in t.install[0] for t in seaborn)
    for task in lite:
        if task.repo == "django/django":
            assert task.test.log_format == "django"
            assert "--settings=test_sqlite --parallel 1" in task.test.command
            assert task.env["LANG"] == "en_US.UTF-8"
        elif task.repo == "sympy/sympy":
            assert task.test.log_format == "sympy"
        else:
            assert task.test.log_format == "pytest", task.instance_id
        assert task.image and "__" not in task.image and task.image == task.image.lower()


def test_multi_swe_bench_java_sample() -> None:
    result = load_tasks(JAVA, "multi-swe-bench")
    assert result.errors == [] and len(result.tasks) == 3
    task = _by_id(result.tasks)["apache__druid-13704"]
    assert task.language == "java" and task.python is None
    assert task.fail_to_pass == [
        "org.apache.druid.query.aggregation.post.ArithmeticPostAggregatorTest#testPow"
    ]
    assert task.test.log_format == "junit" and task.test.select == "ids"
    assert task.test.junit_reports == ["**/target/surefire-reports/TEST-*.xml"]
    assert task.test.command.startswith("mvn -B -q test -pl processing -am")
    assert task.image == "mswebench/apache_m_druid:pr-13704"
    assert task.workdir == "/home/druid"
    assert selection.test_arguments(task) == [
        "org.apache.druid.query.aggregation.post.ArithmeticPostAggregatorTest"
        "#testPow+testDiv+testQuotient"
    ]


def test_python_repr_lists_are_parsed_without_eval(tmp_path: Path) -> None:
    rows = _rows(JAVA)
    rows[0]["FAIL_TO_PASS"] = repr(rows[0]["FAIL_TO_PASS"])  # "['org...#testPow']"
    marker = tmp_path / "pwned"
    rows[1]["FAIL_TO_PASS"] = f"__import__('os').system('touch {marker}')"
    path = tmp_path / "java.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = load_tasks(path, "multi-swe-bench")
    assert [t.instance_id for t in result.tasks] == ["apache__druid-13704", "apache__druid-14136"]
    assert result.tasks[0].fail_to_pass[0].endswith("ArithmeticPostAggregatorTest#testPow")
    assert len(result.errors) == 1
    error = result.errors[0]
    assert error.field == "FAIL_TO_PASS" and "apache__druid-14092" in str(error.record)
    assert not marker.exists()


# --- file variants ----------------------------------------------------------------------------------


def _write_parquet(rows: list[dict[str, Any]], path: Path, *, lists: bool) -> None:
    """Write rows as ``datasets`` exports them: string columns, and list<string> columns for
    the test lists (``lists``) or strings holding JSON (SWE-bench's own Parquet files)."""
    columns: dict[str, pa.Array] = {}
    for name in rows[0]:
        values = [r.get(name) for r in rows]
        if name in ("FAIL_TO_PASS", "PASS_TO_PASS") and lists:
            columns[name] = pa.array(
                [json.loads(str(v)) for v in values], type=pa.list_(pa.string())
            )
        else:
            columns[name] = pa.array(values, type=pa.string())
    pq.write_table(pa.table(columns), path)


def test_json_jsonl_and_parquet_give_the_same_tasks(tmp_path: Path) -> None:
    rows = _rows(LITE)
    array = tmp_path / "lite.json"
    array.write_text(json.dumps(rows))
    lists = tmp_path / "lite.jsonl"
    lists.write_text(
        "".join(
            json.dumps(
                {
                    **r,
                    "FAIL_TO_PASS": json.loads(r["FAIL_TO_PASS"]),
                    "PASS_TO_PASS": json.loads(r["PASS_TO_PASS"]),
                }
            )
            + "\n"
            for r in rows
        )
    )
    parquet_lists = tmp_path / "lite-lists.parquet"
    _write_parquet(rows, parquet_lists, lists=True)
    parquet_strings = tmp_path / "lite-strings.parquet"
    _write_parquet(rows, parquet_strings, lists=False)
    assert pq.read_schema(parquet_lists).field("FAIL_TO_PASS").type == pa.list_(pa.string())

    reference = [t.model_dump() for t in load_tasks(LITE, "swe-bench").tasks]
    for path in (array, lists, parquet_lists, parquet_strings):
        result = load_tasks(path, "swe-bench")
        assert result.errors == [], path
        assert [t.model_dump() for t in result.tasks] == reference, path


# --- malformed records --------------------------------------------------------------------------------


def _broken_file(tmp_path: Path) -> Path:
    rows = _rows(LITE)[:6]
    del rows[1]["base_commit"]
    rows[3]["FAIL_TO_PASS"] = json.dumps({"not": "a list"})
    lines = [json.dumps(r) for r in rows]
    lines.insert(4, '{"instance_id": "broken", "repo": ')  # a cut-off line
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bad_records_are_reported_and_the_others_load(tmp_path: Path) -> None:
    rows = _rows(LITE)[:6]
    result = load_tasks(_broken_file(tmp_path), "swe-bench")
    assert [t.instance_id for t in result.tasks] == [
        rows[0]["instance_id"],
        rows[2]["instance_id"],
        rows[4]["instance_id"],
        rows[5]["instance_id"],
    ]
    assert len(result.errors) == 3 and not result.ok
    missing, not_list, not_json = result.errors
    assert missing.field == "base_commit"
    assert missing.record == f"{rows[1]['instance_id']!r} (line 2)"
    assert "required field is missing" in str(missing)
    assert not_json.record == "line 5" and "not valid JSON" in str(not_json)
    assert "column 35" in str(not_json)
    assert not_list.field == "FAIL_TO_PASS"
    assert rows[3]["instance_id"] in str(not_list) and "list of strings" in str(not_list)


def test_strict_mode_raises_the_first_bad_record(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError) as info:
        load_tasks(_broken_file(tmp_path), "swe-bench", strict=True)
    assert info.value.field == "base_commit"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"FAIL_TO_PASS": 42}, "FAIL_TO_PASS", "list of strings"),
        ({"FAIL_TO_PASS": "[1, 2]"}, "FAIL_TO_PASS", "item 0 must be a string"),
        ({"version": 1.1}, "version", "write versions as strings"),
        ({"repo": "sympy"}, "repo", "owner/name"),
        ({"instance_id": ""}, "instance_id", "empty"),
    ],
)
def test_field_errors_name_the_field(change: dict[str, Any], field: str, words: str) -> None:
    row = {**_rows(LITE)[0], **change}
    result = load_records([(RecordRef("index 0"), row)], "swe-bench")
    assert result.tasks == []
    assert [e.field for e in result.errors] == [field]
    assert words in str(result.errors[0])


def test_duplicates_and_unreadable_files(tmp_path: Path) -> None:
    row = _rows(LITE)[0]
    result = load_records([(RecordRef("index 0"), row), (RecordRef("index 1"), row)], "swe-bench")
    assert len(result.tasks) == 1
    assert "duplicate instance id (first at index 0)" in str(result.errors[0])
    bad = tmp_path / "tasks.json"
    bad.write_text("{not json")
    with pytest.raises(TaskFormatError, match="not valid JSON"):
        load_tasks(bad, "swe-bench")
    with pytest.raises(TaskFormatError, match="cannot tell the format"):
        load_tasks(tmp_path / "tasks.csv", "swe-bench")
    with pytest.raises(TaskFormatError, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl", "swe-bench")
    not_parquet = tmp_path / "tasks.parquet"
    not_parquet.write_bytes(b"PAR1 nothing")
    with pytest.raises(TaskFormatError, match="not a Parquet file"):
        load_tasks(not_parquet, "swe-bench")


def test_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(TaskFormatError, match="not supported yet; known formats"):
        load_records([], "cobol-bench")  # type: ignore[arg-type]


# --- filters ----------------------------------------------------------------------------------------------


def test_filters(lite: list[Task]) -> None:
    ids = ["sympy__sympy-20590", "pallets__flask-4992", "django__django-11905"]
    only = load_tasks(LITE, "swe-bench", TaskFilter(instance_ids=[*ids, "nope__nope-1"]))
    # Source order, not the filter's order.
    assert [t.instance_id for t in only.tasks] == [
        t.instance_id for t in lite if t.instance_id in ids
    ]
    assert only.missing_ids == ["nope__nope-1"]

    flask = load_tasks(LITE, "swe-bench", TaskFilter(repos=["pallets/flask"]))
    assert [t.instance_id for t in flask.tasks] == [
        "pallets__flask-4045",
        "pallets__flask-4992",
        "pallets__flask-5063",
    ]
    excluded = load_tasks(
        LITE,
        "swe-bench",
        TaskFilter(repos=["PALLETS/Flask"], exclude_instance_ids=["pallets__flask-4992"]),
    )
    assert [t.instance_id for t in excluded.tasks] == ["pallets__flask-4045", "pallets__flask-5063"]

    limited = load_tasks(LITE, "swe-bench", TaskFilter(limit=5))
    assert [t.instance_id for t in limited.tasks] == [t.instance_id for t in lite[:5]]

    shuffled = load_tasks(LITE, "swe-bench", TaskFilter(shuffle_seed=7, limit=20))
    again = load_tasks(LITE, "swe-bench", TaskFilter(shuffle_seed=7, limit=20))
    other = load_tasks(LITE, "swe-bench", TaskFilter(shuffle_seed=8, limit=20))
    first = [t.instance_id for t in shuffled.tasks]
    assert first == [t.instance_id for t in again.tasks]
    assert first != [t.instance_id for t in other.tasks]
    assert first != [t.instance_id for t in lite[:20]] and len(first) == 20


def test_errors_of_filtered_out_records_are_not_reported(tmp_path: Path) -> None:
    rows = _rows(LITE)[:6]
    wanted = TaskFilter(instance_ids=[rows[0]["instance_id"]])
    result = load_tasks(_broken_file(tmp_path), "swe-bench", wanted)
    assert [t.instance_id for t in result.tasks] == [rows[0]["instance_id"]]
    # Only the unparseable line, whose id nobody knows, is still reported.
    assert [e.record for e in result.errors] == ["line 5"]


def test_image_template_overrides_the_default() -> None:
    result = load_tasks(
        LITE,
        "swe-bench",
        TaskFilter(instance_ids=["sympy__sympy-20590"]),
        image_template="registry.local/{owner}/{name}:{instance_id}-{version}",
    )
    assert result.tasks[0].image == "registry.local/sympy/sympy:sympy__sympy-20590-1.7"


# --- test selection on real test patches ------------------------------------------------------------------


def test_test_files_drop_data_files(lite: list[Task]) -> None:
    tasks = _by_id(lite)
    flask = tasks["pallets__flask-4992"]
    assert "tests/static/config.toml" in selection.patch_files(flask.test_patch)
    assert selection.test_files(flask.test_patch, "python") == ["tests/test_config.py"]
    sphinx = tasks["sphinx-doc__sphinx-8595"]
    assert selection.test_files(sphinx.test_patch, "python") == [
        "tests/test_ext_autodoc_automodule.py"
    ]
    assert selection.test_arguments(flask) == ["tests/test_config.py"]
    assert selection.test_arguments(tasks["sympy__sympy-20590"]) == [
        "sympy/core/tests/test_basic.py"
    ]


def test_test_arguments_add_files_named_by_ids(lite: list[Task]) -> None:
    # The patch touches testing/python/fixtures.py, which is not named like a test module;
    # the FAIL_TO_PASS ids name it, so it still runs.
    task = _by_id(lite)["pytest-dev__pytest-5221"]
    assert selection.test_files(task.test_patch, "python") == []
    assert selection.test_arguments(task) == ["testing/python/fixtures.py"]


def test_django_gets_dotted_labels(lite: list[Task]) -> None:
    task = _by_id(lite)["django__django-11905"]
    assert selection.test_files(task.test_patch, "python") == ["tests/lookup/tests.py"]
    assert selection.test_arguments(task) == ["lookup.tests"]
    assert selection.django_label("tests/staticfiles_tests/test_handlers.py") == (
        "staticfiles_tests.test_handlers"
    )


def test_every_shared_task_selects_some_tests(lite: list[Task]) -> None:
    verified = load_tasks(VERIFIED, "swe-bench").tasks
    java = load_tasks(JAVA, "multi-swe-bench").tasks
    assert len(lite) + len(verified) + len(java) == 353
    for task in java:
        assert selection.test_arguments(task), task.instance_id
    for task in [*lite, *verified]:
        arguments = selection.test_arguments(task)
        assert arguments, task.instance_id
        if task.test.log_format != "django":
            assert all(a.endswith(".py") for a in arguments), task.instance_id


def test_java_test_files_and_selection() -> None:
    tasks = _by_id(load_tasks(JAVA, "multi-swe-bench").tasks)
    task = tasks["apache__druid-14136"]
    files = selection.test_files(task.test_patch, "java")
    assert files == [
        "processing/src/test/java/org/apache/druid/common/utils/JodaUtilsTest.java",
        "processing/src/test/java/org/apache/druid/query/TimewarpOperatorTest.java",
        "processing/src/test/java/org/apache/druid/timeline/VersionedIntervalTimelineTest.java",
    ]
    assert selection.java_test_class(files[0]) == "org.apache.druid.common.utils.JodaUtilsTest"
    assert selection.maven_modules(files) == ["processing"]
    assert selection.gradle_test_filters(["a.BTest#x", "a.BTest#y[1]", "a.CTest"]) == [
        "--tests",
        "a.BTest.x",
        "--tests",
        "a.BTest.y",
        "--tests",
        "a.CTest",
    ]
    assert selection.maven_test_filter(["a.BTest::x", "a.BTest#y", "a.CTest", "a.CTest#z"]) == (
        "a.BTest#x+y,a.CTest"
    )
    # Surefire names a JUnit 5 parameterized case "method{Type, Type}[n]" (GitBug-Java's ids):
    # -Dtest takes the method's name, or the case is never run and graded missing.
    assert selection.maven_test_filter(
        ["o.SemverTest#shouldCoerce{String, String}[52]", "o.SemverTest#shouldParse{String}[1]"]
    ) == ("o.SemverTest#shouldCoerce+shouldParse")
    assert selection.gradle_test_filters(["o.ATest#m{String}[1]"]) == ["--tests", "o.ATest.m"]


def test_deleted_files_and_plain_diffs() -> None:
    patch = (
        "diff --git a/tests/test_old.py b/tests/test_old.py\n"
        "deleted file mode 100644\n--- a/tests/test_old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
        "--- tests/test_new.py\t2024-01-01\n+++ tests/test_new.py\t2024-01-02\n@@ -0,0 +1 @@\n+y\n"
    )
    assert selection.patch_files(patch) == ["tests/test_new.py"]
    assert selection.test_files(patch, "python") == ["tests/test_new.py"]


# --- the other formats --------------------------------------------------------------------------------------

_TEST_PATCH_JAVA = (
    "diff --git a/src/test/java/org/x/FooTest.java b/src/test/java/org/x/FooTest.java\n"
    "--- a/src/test/java/org/x/FooTest.java\n+++ b/src/test/java/org/x/FooTest.java\n"
    "@@ -1 +1 @@\n-a\n+b\n"
)


def _load(format: str, records: list[dict[str, Any]]) -> Any:
    return load_records(
        [(RecordRef(f"index {i}"), r) for i, r in enumerate(records)],
        format,  # type: ignore[arg-type]
    )


def test_multi_swe_bench_native_shape() -> None:
    record = {
        "org": "google",
        "repo": "gson",
        "number": 2024,
        "base": {"label": "google:main", "ref": "main", "sha": "abc123"},
        "resolved_issues": [{"number": 1, "title": "Bug", "body": "It breaks."}],
        "fix_patch": "diff --git a/src/main/A.java b/src/main/A.java\n",
        "test_patch": _TEST_PATCH_JAVA,
        "f2p_tests": {"org.x.FooTest#a": {"run": "PASS", "test": "FAIL", "fix": "PASS"}},
        "n2p_tests": {"org.x.FooTest#b": {"run": "NONE", "test": "NONE", "fix": "PASS"}},
        "p2p_tests": {"org.x.FooTest#c": {"run": "PASS", "test": "PASS", "fix": "PASS"}},
        "s2p_tests": {},
    }
    go = {**record, "number": 7, "language": "go"}
    result = _load("multi-swe-bench", [record, go])
    (task,) = result.tasks
    assert task.instance_id == "google__gson-2024" and task.repo == "google/gson"
    assert task.base_commit == "abc123" and task.problem_statement == "Bug\nIt breaks."
    assert task.fail_to_pass == ["org.x.FooTest#a", "org.x.FooTest#b"]
    assert task.pass_to_pass == ["org.x.FooTest#c"]
    assert task.image == "mswebench/google_m_gson:pr-2024"
    assert task.metadata["build_system"] == "maven"
    assert "-pl" not in task.test.command  # the tests sit in the root module
    (error,) = result.errors
    assert error.field == "language" and "not supported yet" in str(error)


def test_defects4j_records() -> None:
    lang = {
        "project": "Lang",
        "bug.id": "1",
        "revision.id.buggy": "687b2e62b7c6e81cd9d5c872b7fa9cc8fd3f1509",
        "revision.id.fixed": "2c65ba2e1fa2b4bc1e0ee7d6a2b2d0fa0c1b1c7f",
        "report.url": "https://issues.apache.org/jira/browse/LANG-747",
        "trigger_tests": ["org.apache.commons.lang3.math.NumberUtilsTest::TestLang747"],
        "test_patch": _TEST_PATCH_JAVA,
    }
    chart = {"project": "Chart", "bug_id": 1, "revision_buggy": "abc", "trigger_tests": ["a::b"]}
    mockito = {
        "project": "Mockito",
        "bug_id": 2,
        "revision_buggy": "def",
        "trigger_tests": ["org.mockito.FooTest::bar"],
    }
    result = _load("defects4j", [lang, chart, mockito])
    lang_task, mockito_task = result.tasks
    assert lang_task.instance_id == "Lang-1" and lang_task.repo == "apache/commons-lang"
    assert lang_task.fail_to_pass == ["org.apache.commons.lang3.math.NumberUtilsTest#TestLang747"]
    assert lang_task.metadata["report.url"].endswith("LANG-747")
    assert selection.test_arguments(lang_task) == [
        "org.apache.commons.lang3.math.NumberUtilsTest#TestLang747"
    ]
    assert mockito_task.test.junit_reports == ["**/build/test-results/test/*.xml"]
    assert selection.test_arguments(mockito_task) == ["--tests", "org.mockito.FooTest.bar"]
    (error,) = result.errors
    assert error.record == "'Chart-1' (index 1)" and error.field == "build_system"
    assert "Ant" in str(error)


def _gitbug_runs(buggy: dict[str, str], fixed: dict[str, str]) -> list[Any]:
    def run(statuses: dict[str, str]) -> list[dict[str, Any]]:
        return [
            {
                "failed": any(s != "Passed" for s in statuses.values()),
                "build_tool": "gradle",
                "tests": [
                    {
                        "classname": name.split("#")[0],
                        "name": name.split("#")[1],
                        "results": [{"result": status, "message": "", "type": ""}],
                    }
                    for name, status in statuses.items()
                ],
            }
        ]

    return [run({}), run(buggy), run(fixed)]


def test_gitbug_java_derives_the_test_lists() -> None:
    record = {
        "repository": "davidmoten/word-wrap",
        "language": "java",
        "clone_url": "https://github.com/davidmoten/word-wrap.git",
        "commit_hash": "e59eedf0bac7d5ca7ee0062f3816c7ac5c3de4e0",
        "previous_commit_hash": "930eb5e91a40f00a6782e939606d6c1d397629e0",
        "commit_message": "fix state problem",
        "bug_patch": "diff --git a/src/main/java/W.java b/src/main/java/W.java\n",
        "test_patch": _TEST_PATCH_JAVA,
        "non_code_patch": "diff --git a/pom.xml b/pom.xml\n",
        "actions_runs": _gitbug_runs(
            {"org.x.FooTest#a": "Failure", "org.x.FooTest#b": "Passed", "org.x.FooTest#s": "Skipped"},
            {"org.x.FooTest#a": "Passed", "org.x.FooTest#b": "Passed", "org.x.FooTest#s": "Skipped"},
        ),
        "issues": [{"title": "Not stateless", "body": "Calls modify a static.", "is_pull_request": False}],
    }  # fmt: skip
    no_failing = {**record, "commit_hash": "f" * 40, "actions_runs": _gitbug_runs({}, {})}
    result = _load("gitbug-java", [record, no_failing])
    (task,) = result.tasks
    assert task.instance_id == "davidmoten-word-wrap-e59eedf0bac7"
    assert task.base_commit == "930eb5e91a40f00a6782e939606d6c1d397629e0"
    assert task.fail_to_pass == ["org.x.FooTest#a"] and task.pass_to_pass == ["org.x.FooTest#b"]
    assert task.test_patch.endswith("diff --git a/pom.xml b/pom.xml\n")
    assert task.metadata["build_system"] == "gradle" and task.source == record["clone_url"]
    assert task.problem_statement == "Not stateless\nCalls modify a static."
    assert result.errors[0].field == "actions_runs"


def test_quixbugs_bugsinpy_and_polyglot() -> None:
    quix = _load(
        "quixbugs",
        [
            {"program": "bitcount", "base_commit": "a" * 40},
            {"program": "bitcount", "language": "java", "base_commit": "a" * 40},
            {"program": "bitcount", "language": "c", "base_commit": "a" * 40},
        ],
    )
    python_task, java_task = quix.tasks
    assert python_task.instance_id == "quixbugs-python-bitcount"
    assert selection.test_arguments(python_task) == ["python_testcases/test_bitcount.py"]
    assert selection.test_arguments(java_task) == ["--tests", "java_testcases.junit.BITCOUNT_TEST"]
    assert quix.errors[0].field == "language"

    bugsinpy = _load(
        "bugsinpy",
        [
            {
                "project": "black",
                "bug_id": "1",
                "repo": "psf/black",
                "buggy_commit_id": "b" * 40,
                "python_version": "3.8.3",
                "run_test": "python -m unittest -q tests.test_black.BlackTestCase.test_x\n",
            },
            {
                "project": "thefuck",
                "bug_id": 2,
                "repo": "nvbn/thefuck",
                "buggy_commit_id": "c" * 40,
                "run_test": ["pytest tests/test_utils.py::test_a", "make check"],
            },
        ],
    )
    (black,) = bugsinpy.tasks
    assert black.python == "3.8" and black.test.log_format == "unittest"
    assert selection.test_arguments(black) == ["tests.test_black.BlackTestCase.test_x"]
    assert bugsinpy.errors[0].field == "run_test" and "make check" in str(bugsinpy.errors[0])

    polyglot = _load(
        "polyglot",
        [
            {"language": "python", "exercise": "two-fer", "base_commit": "d" * 40},
            {"language": "go", "exercise": "two-fer", "base_commit": "d" * 40},
        ],
    )
    (exercise,) = polyglot.tasks
    assert selection.test_arguments(exercise) == [
        "python/exercises/practice/two-fer/two_fer_test.py"
    ]
    assert "not supported yet" in str(polyglot.errors[0])


def test_bad_records_are_logged(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    with caplog.at_level(logging.WARNING, logger="crl_worker.tasks.loaders"):
        load_tasks(_broken_file(tmp_path), "swe-bench")
    assert sum("skipping a task record" in r.message for r in caplog.records) == 3


def test_recipe_table_covers_the_asked_repositories() -> None:
    for repo in (
        "sympy/sympy",
        "pytest-dev/pytest",
        "pallets/flask",
        "django/django",
        "psf/requests",
        "sphinx-doc/sphinx",
        "pylint-dev/pylint",
        "pydata/xarray",
        "astropy/astropy",
        "matplotlib/matplotlib",
        "scikit-learn/scikit-learn",
        "mwaskom/seaborn",
    ):
        assert repo in recipes.swebench_repos()
    assert recipes.swebench_recipe("unknown/repo", "1.0") is None
    # A version the table does not list uses the repository's default entry.
    assert recipes.swebench_recipe("sympy/sympy", "9.9") is not None
    newer = recipes.swebench_recipe("pytest-dev/pytest", "9.1")
    assert newer is not None
    assert newer.environment("9.1") == {"SETUPTOOLS_SCM_PRETEND_VERSION": "9.1.0"}
    xarray = [t for t in load_tasks(VERIFIED, "swe-bench").tasks if t.repo == "pydata/xarray"]
    assert xarray and all(
        t.env["SETUPTOOLS_SCM_PRETEND_VERSION"] == f"{t.version}.0" and t.python == "3.10"
        for t in xarray
    )
    assert recipes.swebench_recipe("django/django", "1.9").test_command.find("--parallel") == -1  # type: ignore[union-attr]
    assert recipes.swegym_image("getmoto__moto-5406") == (
        "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5406:latest"
    )
    swegym = load_records(
        [(RecordRef("index 0"), {**_rows(LITE)[0], "repo": "getmoto/moto",
                                 "instance_id": "getmoto__moto-5406"})],
        "swe-gym",
    )  # fmt: skip
    (task,) = swegym.tasks
    assert task.metadata["recipe"] == "generic" and task.test.log_format == "pytest"
    assert task.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5406:latest"


# --- a real Maven run of a Java recipe ----------------------------------------------------------------------

_POM_PARENT = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>org.x</groupId><artifactId>parent</artifactId><version>1.0</version>
  <packaging>pom</packaging>
  <modules><module>core</module><module>other</module></modules>
  <properties><maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding></properties>
  <build><pluginManagement><plugins>
    <plugin><groupId>org.apache.maven.plugins</groupId>
      <artifactId>maven-surefire-plugin</artifactId><version>3.2.5</version></plugin>
    <plugin><groupId>org.apache.maven.plugins</groupId>
      <artifactId>maven-compiler-plugin</artifactId><version>3.13.0</version></plugin>
  </plugins></pluginManagement></build>
</project>"""
_POM_MODULE = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <parent><groupId>org.x</groupId><artifactId>parent</artifactId><version>1.0</version></parent>
  <artifactId>{name}</artifactId>
  <dependencies><dependency><groupId>junit</groupId><artifactId>junit</artifactId>
    <version>4.13.2</version><scope>test</scope></dependency></dependencies>
</project>"""
_FOO_TEST = """package org.x;
import org.junit.Test;
import static org.junit.Assert.assertEquals;
public class FooTest {
  @Test public void a() { assertEquals(1, 1); }
  @Test public void b() { assertEquals(1, 2); }
  @Test public void c() { }
}"""


@pytest.mark.skipif(
    shutil.which("mvn") is None, reason="needs Maven (and Maven Central or a filled ~/.m2)"
)
def test_maven_recipe_runs_exactly_the_selected_tests(tmp_path: Path) -> None:
    """The Multi-SWE-bench recipe and test_arguments, run by real Maven: Surefire reports hold
    the FAIL_TO_PASS and PASS_TO_PASS methods and nothing else; the other module is skipped."""
    (tmp_path / "pom.xml").write_text(_POM_PARENT)
    for module in ("core", "other"):
        (tmp_path / module / "src/test/java/org/x").mkdir(parents=True)
        (tmp_path / module / "pom.xml").write_text(_POM_MODULE.format(name=module))
    (tmp_path / "core/src/test/java/org/x/FooTest.java").write_text(_FOO_TEST)
    (tmp_path / "core/src/test/java/org/x/BarTest.java").write_text(
        "package org.x;\npublic class BarTest { @org.junit.Test public void z() { } }\n"
    )
    (tmp_path / "other/src/test/java/org/x/OtherTest.java").write_text(
        "package org.x;\npublic class OtherTest { @org.junit.Test public void o() { } }\n"
    )
    stale = tmp_path / "core/target/surefire-reports/TEST-org.x.Stale.xml"
    stale.parent.mkdir(parents=True)
    stale.write_text("<testsuite/>")
    record = {
        "instance_id": "x__parent-1",
        "repo": "x/parent",
        "base_commit": "0" * 40,
        "test_patch": _TEST_PATCH_JAVA.replace("src/test/java/org/x/FooTest.java",
                                               "core/src/test/java/org/x/FooTest.java"),
        "FAIL_TO_PASS": ["org.x.FooTest#a"],
        "PASS_TO_PASS": ["org.x.FooTest#c", "org.x.BarTest"],
    }  # fmt: skip
    (task,) = _load("multi-swe-bench", [record]).tasks
    command = task.test.command.replace("{tests}", shlex.join(selection.test_arguments(task)))
    for line in [*task.test.pre, command]:
        subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, timeout=600)
    reports = [p for pattern in task.test.junit_reports for p in tmp_path.glob(pattern)]
    ran = sorted(
        f"{case.get('classname')}#{case.get('name')}"
        for report in reports
        for case in ElementTree.parse(report).getroot().iter("testcase")
    )
    assert ran == ["org.x.BarTest#z", "org.x.FooTest#a", "org.x.FooTest#c"]
    assert not stale.exists()


def test_every_task_format_has_a_converter() -> None:
    for name in typing.get_args(TaskFormat):
        assert formats.converter(name) is formats.CONVERTERS[name]


def test_text_and_in_memory_rows(tmp_path: Path) -> None:
    rows = _rows(VERIFIED)[:5]
    from_jsonl = load_records(read_text_records(VERIFIED.read_text(), "jsonl"), "swe-bench")
    from_json = load_records(read_text_records(json.dumps(rows), "json"), "swe-bench")
    from_rows = load_records(rows_with_refs(rows), "swe-bench")
    assert [t.instance_id for t in from_jsonl.tasks][:5] == [r["instance_id"] for r in rows]
    assert from_json.tasks == from_rows.tasks == from_jsonl.tasks[:5]
    # Parquet can type created_at as a timestamp; it becomes an ISO string.
    table = pa.table(
        {
            **{k: pa.array([str(r[k]) for r in rows]) for k in rows[0] if k != "created_at"},
            "created_at": pa.array(
                [datetime.datetime(2023, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)] * 5,
                type=pa.timestamp("ns", tz="UTC"),
            ),
        }
    )
    path = tmp_path / "verified.parquet"
    pq.write_table(table, path)
    result = load_tasks(path, "swe-bench")
    assert result.errors == []
    assert result.tasks[0].created_at == "2023-01-02T03:04:05+00:00"


def test_log_fragments_in_published_lists_are_left_out(lite: list[Task]) -> None:
    """pytest-dev__pytest-5227's PASS_TO_PASS holds three pieces of a log ("[100%]", "["), which
    no runner reports: kept, the gold patch would be graded unresolved (docs/validation.md)."""
    (task,) = [t for t in lite if t.instance_id == "pytest-dev__pytest-5227"]
    assert task.metadata["dropped_ids"] == ["[100%]", "[", "[100%]------------------------------"]
    assert len(task.pass_to_pass) == 31 and all("::" in i for i in task.pass_to_pass)
    assert formats.drop_log_fragments(["a.py::t[1]", " ", "[50%]"]) == (
        ["a.py::t[1]"],
        [" ", "[50%]"],
    )
    dropped = {t.instance_id for t in lite if "dropped_ids" in t.metadata}
    assert dropped == {"pytest-dev__pytest-5227"}


def test_recipes_of_repositories_that_import_pkg_resources_pin_setuptools(
    lite: list[Task],
) -> None:
    """Sphinx (before 5) and pytest's namespace-package tests import pkg_resources, which
    setuptools 81+ lacks; the environment's seeded setuptools is the newest (docs/validation.md:
    17 of 20 sphinx instances were environment errors, pytest-11148's gold run failed)."""
    for task in lite:
        if task.repo in ("sphinx-doc/sphinx", "pytest-dev/pytest"):
            assert any("setuptools==68.0.0" in c for c in task.install), task.instance_id
