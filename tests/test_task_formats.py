"""The loaders of the other benchmark formats (Multi-SWE-bench, Defects4J, GitBug-Java, QuixBugs,\nBugsInPy, polyglot) on records shaped as each publishes them, and a real Maven run of a Java\nrecipe."""

from __future__ import annotations

import datetime
import json
import logging
import shlex
import shutil
import subprocess
import typing
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crl_worker.api.common import TaskFormat
from crl_worker.harness.grading import StatusIndex
from crl_worker.harness.parsers import parse_pytest
from crl_worker.harness.result import TestStatus
from crl_worker.tasks import Task, formats, load_tasks, recipes, selection
from crl_worker.tasks.loaders import load_records
from crl_worker.tasks.records import RecordRef, read_text_records, rows_with_refs
from tests.fixtures.task_records import LITE, VERIFIED, broken_file, read_rows

pytestmark = pytest.mark.skipif(not LITE.is_file(), reason="shared/data is not present")


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


def test_defects4j_maven_options_and_source() -> None:
    """A converted Defects4J bug (scripts/defects4j_tasks.py, Cli-40) carries its bundle and
    the Maven properties an old revision needs on Java 17; only ``-Dkey=value`` words are
    taken (a record cannot add a goal, a flag or a shell command to the test command)."""
    cli = {
        "project": "Cli",
        "bug.id": "40",
        "repo": "apache/commons-cli--d4j-40",
        "revision.id.buggy": "9d1b3b5b1c3a0f7fe7fa3e4b3b2cd9bd7be0a6f4",
        "source": "repos/Cli-40.bundle",
        "trigger_tests": ["org.apache.commons.cli.TypeHandlerTest::testCreateValueInteger_failure"],
        "test_patch": _TEST_PATCH_JAVA,
        "maven_options": "-Dmaven.compiler.source=8 -Dmaven.compiler.target=8 -Djacoco.skip=true",
    }
    bad = [
        {**cli, "bug.id": "41", "maven_options": "-Djacoco.skip=true; curl x | sh"},
        {**cli, "bug.id": "42", "maven_options": "-Dx=1 verify"},
        {**cli, "bug.id": "43", "build_system": "gradle"},
    ]
    result = _load("defects4j", [cli, *bad])
    (task,) = result.tasks
    assert task.source == "repos/Cli-40.bundle"
    assert task.test.command.startswith(
        "mvn -B -q test -Dmaven.compiler.source=8 -Dmaven.compiler.target=8 -Djacoco.skip=true "
    )
    assert "-Dtest={tests}" in task.test.command
    assert [e.field for e in result.errors] == ["maven_options"] * 3
    assert "'-Djacoco.skip=true;'" in str(result.errors[0])


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
    assert selection.test_arguments(python_task) == [
        "python_testcases/test_bitcount.py::test_bitcount"
    ]
    assert selection.test_arguments(java_task) == ["--tests", "java_testcases.junit.BITCOUNT_TEST"]
    assert quix.errors[0].field == "language"


#: Lines of a real run of QuixBugs' python_testcases/test_bitcount.py (buggy program, pytest
#: -rA -v --timeout=6): the runs of the parametrized test, one of them stopped by the timeout.
QUIXBUGS_PYTEST_LOG = """\
python_testcases/test_bitcount.py::test_bitcount[input_data0-7] FAILED   [ 11%]
python_testcases/test_bitcount.py::test_bitcount[input_data1-1] PASSED   [ 22%]
FAILED python_testcases/test_bitcount.py::test_bitcount[input_data0-7] - Failed: Timeout
PASSED python_testcases/test_bitcount.py::test_bitcount[input_data1-1]
"""


def test_quixbugs_default_ids_match_what_pytest_reports() -> None:
    """The default Python id names the test function, so its parametrized runs grade it (a bare
    file id, the loader's old default, matched nothing: every record was unresolvable); a
    converted Java copy with a pom.xml selects by ``-Dtest``; an unknown build is an error."""
    quix = _load(
        "quixbugs",
        [
            {"program": "bitcount", "base_commit": "a" * 40, "source": "repos/q.bundle"},
            {"program": "BITCOUNT", "language": "java", "base_commit": "a" * 40,
             "build_system": "maven", "FAIL_TO_PASS": ["java_testcases.junit.BITCOUNT_TEST#test_0"]},
            {"program": "gcd", "language": "java", "base_commit": "a" * 40, "build_system": "ant"},
        ],
    )  # fmt: skip
    python_task, java_task = quix.tasks
    assert python_task.source == "repos/q.bundle"
    assert "--timeout=" in python_task.test.command
    assert "pytest-timeout" in " ".join(python_task.install)
    index = StatusIndex(parse_pytest(QUIXBUGS_PYTEST_LOG))
    assert index.lookup(python_task.fail_to_pass[0]) == TestStatus.FAILED
    assert index.lookup("python_testcases/test_bitcount.py") == TestStatus.MISSING
    assert java_task.metadata["build_system"] == "maven"
    assert selection.test_arguments(java_task) == ["java_testcases.junit.BITCOUNT_TEST#test_0"]
    assert java_task.test.command.startswith("mvn ")
    assert quix.errors[0].field == "build_system"

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
    assert black.install == ["python -m pip install -e ."]
    assert bugsinpy.errors[0].field == "run_test" and "make check" in str(bugsinpy.errors[0])


def test_bugsinpy_installs_its_requirements_by_name() -> None:
    """A BugsInPy ``requirements.txt`` is a ``pip freeze``: the record's text is installed as
    packages (the repository need not hold the file), without the project's own editable VCS
    line and Debian's ``pkg-resources==0.0.0``; ``pytest`` is added where ``run_test.sh``
    calls it and the freeze does not list it; ``source`` is kept."""
    loaded = _load(
        "bugsinpy",
        [
            {
                "project": "cookiecutter",
                "bug_id": "1",
                "repo": "cookiecutter/cookiecutter",
                "buggy_commit_id": "c" * 40,
                "run_test": "pytest tests/test_hooks.py::test_a",
                "requirements": "click==7.1.2\n-e git+https://github.com/cookiecutter/"
                "cookiecutter@c15633#egg=cookiecutter\npkg-resources==0.0.0\n"
                "python-slugify==4.0.0\n",
                "source": "/srv/repos/cookiecutter",
            },
            {
                "project": "tqdm",
                "bug_id": "1",
                "repo": "tqdm/tqdm",
                "buggy_commit_id": "d" * 40,
                "run_test": "python3 -m pytest tqdm/tests/tests_contrib.py::test_enumerate",
                "requirements": "pytest==5.4.3\nnose==1.3.7\nnose\nPyTest\nflake8",
            },
        ],
    )
    assert not loaded.errors
    cookiecutter, tqdm = loaded.tasks
    assert cookiecutter.install == [
        "python -m pip install click==7.1.2 python-slugify==4.0.0 pytest",
        "python -m pip install -e .",
    ]
    assert cookiecutter.metadata["requirements_left_out"] == [
        "-e git+https://github.com/cookiecutter/cookiecutter@c15633#egg=cookiecutter",
        "pkg-resources==0.0.0",
    ]
    assert cookiecutter.source == "/srv/repos/cookiecutter"
    assert tqdm.install[0] == "python -m pip install pytest==5.4.3 nose==1.3.7 flake8"

    polyglot = _load(
        "polyglot",
        [
            {"language": "python", "exercise": "two-fer", "base_commit": "d" * 40},
            {"language": "kotlin", "exercise": "two-fer", "base_commit": "d" * 40},
        ],
    )
    (exercise,) = polyglot.tasks
    assert selection.test_arguments(exercise) == [
        "python/exercises/practice/two-fer/two_fer_test.py"
    ]
    assert "not supported" in str(polyglot.errors[0])


def test_bad_records_are_logged(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    with caplog.at_level(logging.WARNING, logger="crl_worker.tasks.loaders"):
        load_tasks(broken_file(tmp_path), "swe-bench")
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
    # SWE-Gym's moto: `make init`, without which freezegun's test modules do not collect.
    moto = recipes.swebench_recipe("getmoto/moto", "4.2")
    assert moto is not None and "requirements-dev.txt" in moto.install[-1]
    assert recipes.swegym_image("getmoto__moto-5406") == (
        "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5406:latest"
    )
    swegym = load_records(
        [(RecordRef("index 0"), {**read_rows(LITE)[0], "repo": "getmoto/moto",
                                 "instance_id": "getmoto__moto-5406"}),
         (RecordRef("index 1"), {**read_rows(LITE)[0], "repo": "conan-io/conan",
                                 "instance_id": "conan-io__conan-13610"})],
        "swe-gym",
    )  # fmt: skip
    task, other = swegym.tasks
    assert task.metadata["recipe"] == "table" and task.test.log_format == "pytest"
    assert task.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5406:latest"
    assert other.metadata["recipe"] == "generic" and other.test.log_format == "pytest"


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
    rows = read_rows(VERIFIED)[:5]
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
