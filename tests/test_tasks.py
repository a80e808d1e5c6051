"""Task loaders, recipes and test selection, on the real SWE-bench and Multi-SWE-bench data in
shared/data plus small records of the other formats written here."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crl_worker.api.common import TaskFilter
from crl_worker.errors import TaskFormatError
from crl_worker.tasks import Task, load_tasks, selection
from crl_worker.tasks.loaders import load_records
from crl_worker.tasks.records import RecordRef
from tests.fixtures.task_records import DATA, LITE, VERIFIED, broken_file, read_rows

JAVA = DATA / "multi-swe-bench-java-sample.jsonl"

pytestmark = pytest.mark.skipif(not LITE.is_file(), reason="shared/data is not present")


def _by_id(tasks: list[Task]) -> dict[str, Task]:
    return {t.instance_id: t for t in tasks}


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
    # In name order: the command line is readable by the code under test (harness/canary.py).
    assert selection.test_arguments(task) == [
        "org.apache.druid.query.aggregation.post.ArithmeticPostAggregatorTest"
        "#testDiv+testPow+testQuotient"
    ]


def test_python_repr_lists_are_parsed_without_eval(tmp_path: Path) -> None:
    rows = read_rows(JAVA)
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
    rows = read_rows(LITE)
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


def test_bad_records_are_reported_and_the_others_load(tmp_path: Path) -> None:
    rows = read_rows(LITE)[:6]
    result = load_tasks(broken_file(tmp_path), "swe-bench")
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
        load_tasks(broken_file(tmp_path), "swe-bench", strict=True)
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
    row = {**read_rows(LITE)[0], **change}
    result = load_records([(RecordRef("index 0"), row)], "swe-bench")
    assert result.tasks == []
    assert [e.field for e in result.errors] == [field]
    assert words in str(result.errors[0])


def test_duplicates_and_unreadable_files(tmp_path: Path) -> None:
    row = read_rows(LITE)[0]
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
    rows = read_rows(LITE)[:6]
    wanted = TaskFilter(instance_ids=[rows[0]["instance_id"]])
    result = load_tasks(broken_file(tmp_path), "swe-bench", wanted)
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
