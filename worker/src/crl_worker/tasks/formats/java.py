"""Java benchmarks' records: Multi-SWE-bench (its Java part), Defects4J and GitBug-Java, graded
from the JUnit XML reports of a Maven (Surefire) or Gradle build."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from crl_worker.tasks.formats.common import finish, first_text, list_field, recipe_fields, repo_name
from crl_worker.tasks.formats.swebench import SWEBENCH_FIELDS
from crl_worker.tasks.model import Language, Task, TestSpec
from crl_worker.tasks.recipes import BuildSystem, java_recipe, multi_swe_bench_image
from crl_worker.tasks.records import (
    ConvertOptions,
    Record,
    RecordRef,
    mapping,
    optional_text,
    string_list,
    text,
)
from crl_worker.tasks.selection import maven_modules, patch_files, test_files

# --- Multi-SWE-bench (Java) -----------------------------------------------------------------------

#: Build systems of the Java repositories Multi-SWE-bench uses (lower-case owner/name).
MULTI_SWE_BENCH_JAVA_BUILDS: dict[str, BuildSystem] = {
    "alibaba/fastjson2": "maven",
    "apache/dubbo": "maven",
    "apache/druid": "maven",
    "elastic/logstash": "gradle",
    "fasterxml/jackson-core": "maven",
    "fasterxml/jackson-databind": "maven",
    "fasterxml/jackson-dataformat-xml": "maven",
    "google/gson": "maven",
    "googlecontainertools/jib": "gradle",
    "mockito/mockito": "gradle",
}

_LANGUAGE_ALIASES: dict[str, Language] = {
    "java": "java",
    "python": "python",
    "py": "python",
    "javascript": "javascript",
    "js": "javascript",
    "typescript": "javascript",
    "ts": "javascript",
    "go": "go",
    "rust": "rust",
    "c": "cpp",
    "cpp": "cpp",
    "c++": "cpp",
}


def _build_system(
    record: Record, ref: RecordRef, repo: str, patches: Iterable[str], known: Mapping[str, str]
) -> BuildSystem:
    declared = (optional_text(record, ref, "build_system") or "").lower()
    if declared:
        if declared not in ("maven", "gradle"):
            raise ref.error(
                f"build system {declared!r} is not supported yet: JUnit XML reports come from"
                " 'maven' (Surefire) or 'gradle'",
                "build_system",
            )
        return "maven" if declared == "maven" else "gradle"
    table = known.get(repo.lower())
    if table in ("maven", "gradle"):
        return "maven" if table == "maven" else "gradle"
    # The patches name the build files they touch; Maven when nothing tells.
    names = [path.rsplit("/", 1)[-1] for patch in patches for path in patch_files(patch)]
    if any(name.startswith("build.gradle") or name.startswith("settings.gradle") for name in names):
        return "gradle"
    return "maven"


def _java_task_fields(
    record: Record, ref: RecordRef, repo: str, patch: str, test_patch: str,
    known: Mapping[str, str],
) -> tuple[dict[str, Any], BuildSystem]:  # fmt: skip
    build = _build_system(record, ref, repo, (patch, test_patch), known)
    modules = maven_modules(test_files(test_patch, "java")) if build == "maven" else []
    recipe = java_recipe(build, modules=modules)
    return recipe_fields(recipe), build


def _issues_text(issues: Any) -> str:
    parts = []
    if isinstance(issues, list):
        for issue in issues:
            if isinstance(issue, dict) and not issue.get("is_pull_request", False):
                title = str(issue.get("title") or "").strip()
                body = str(issue.get("body") or "").strip()
                parts.append("\n".join(p for p in (title, body) if p))
    return "\n\n".join(p for p in parts if p)


def convert_multi_swe_bench(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """Multi-SWE-bench records, in either of its two shapes: the SWE-bench-style export
    (``instance_id``, ``repo`` as owner/name, ``FAIL_TO_PASS``…) or the native one (``org``,
    ``repo``, ``number``, ``base.sha``, ``fix_patch``, ``f2p_tests``…). Java only for now."""
    native = "org" in record or "fix_patch" in record
    language_name = (optional_text(record, ref, "language") or "java").lower()
    language = _LANGUAGE_ALIASES.get(language_name)
    if native:
        owner = text(record, ref, "org", required=True)
        name = text(record, ref, "repo", required=True)
        number = text(record, ref, "number", required=True)
        instance_id = optional_text(record, ref, "instance_id") or f"{owner}__{name}-{number}"
        ref.instance_id = instance_id
        repo = repo_name(f"{owner}/{name}", ref, "org")
        base = mapping(record, ref, "base")
        base_commit = base.get("sha")
        if not isinstance(base_commit, str) or not base_commit:
            raise ref.error("required field is missing (the base commit's sha)", "base.sha")
        patch = text(record, ref, "fix_patch")
        test_patch = text(record, ref, "test_patch")
        # Skipped-to-pass and none-to-pass tests (new tests) must pass after the fix as well.
        fail_to_pass = [
            *mapping(record, ref, "f2p_tests"),
            *mapping(record, ref, "s2p_tests"),
            *mapping(record, ref, "n2p_tests"),
        ]
        pass_to_pass = list(mapping(record, ref, "p2p_tests"))
        if not fail_to_pass:
            raise ref.error("no tests that fail before the fix and pass after it", "f2p_tests")
        statement = _issues_text(record.get("resolved_issues")) or "\n".join(
            p for p in (text(record, ref, "title"), text(record, ref, "body")) if p
        )
        version: str | None = number
        consumed = {"org", "repo", "number", "base", "fix_patch", "test_patch", "instance_id",
                    "f2p_tests", "s2p_tests", "n2p_tests", "p2p_tests", "title", "body",
                    "resolved_issues", "fixed_tests", "run_result", "test_patch_result",
                    "fix_patch_result", "language", "build_system"}  # fmt: skip
        created_at = optional_text(record, ref, "created_at")
        hints = ""
    else:
        instance_id = text(record, ref, "instance_id", required=True)
        ref.instance_id = instance_id
        repo = repo_name(text(record, ref, "repo", required=True), ref)
        owner, name = repo.split("/", 1)
        base_commit = text(record, ref, "base_commit", required=True)
        patch = text(record, ref, "patch")
        test_patch = text(record, ref, "test_patch")
        fail_to_pass = list_field(record, ref, "FAIL_TO_PASS", "fail_to_pass", required=True)
        pass_to_pass = list_field(record, ref, "PASS_TO_PASS", "pass_to_pass")
        statement = text(record, ref, "problem_statement")
        version = optional_text(record, ref, "version")
        # The pull request number: SWE-bench-style ids end in it ("apache__druid-13704").
        number = optional_text(record, ref, "number") or instance_id.rsplit("-", 1)[-1]
        consumed = {*SWEBENCH_FIELDS, "language", "build_system", "number"}
        created_at = optional_text(record, ref, "created_at")
        hints = text(record, ref, "hints_text")
    if language != "java":
        raise ref.error(
            f"Multi-SWE-bench language {language_name!r} is not supported yet: only Java tasks"
            " have a test recipe (JUnit reports); filter this language out",
            "language",
        )
    fields, build = _java_task_fields(
        record, ref, repo, patch, test_patch, MULTI_SWE_BENCH_JAVA_BUILDS
    )
    default_image = multi_swe_bench_image(owner, name, number) if number.isdigit() else None
    return finish(
        ref,
        options,
        record,
        consumed,
        default_image=default_image,
        metadata={"build_system": build},
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=patch,
        test_patch=test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        version=version,
        problem_statement=statement,
        hints_text=hints,
        created_at=created_at,
        # Multi-SWE-bench images hold the repository under /home/<name>.
        workdir=f"/home/{name}" if default_image and not options.image_template else "/testbed",
        **fields,
    )


# --- Defects4J ------------------------------------------------------------------------------------

#: Defects4J projects: their repositories and the build our recipe uses (``ant`` is not
#: supported: Defects4J's Ant runner leaves no JUnit XML reports).
DEFECTS4J_PROJECTS: dict[str, tuple[str, str]] = {
    "Chart": ("jfree/jfreechart", "ant"),
    "Cli": ("apache/commons-cli", "maven"),
    "Closure": ("google/closure-compiler", "ant"),
    "Codec": ("apache/commons-codec", "maven"),
    "Collections": ("apache/commons-collections", "maven"),
    "Compress": ("apache/commons-compress", "maven"),
    "Csv": ("apache/commons-csv", "maven"),
    "Gson": ("google/gson", "maven"),
    "JacksonCore": ("FasterXML/jackson-core", "maven"),
    "JacksonDatabind": ("FasterXML/jackson-databind", "maven"),
    "JacksonXml": ("FasterXML/jackson-dataformat-xml", "maven"),
    "Jsoup": ("jhy/jsoup", "maven"),
    "JxPath": ("apache/commons-jxpath", "maven"),
    "Lang": ("apache/commons-lang", "maven"),
    "Math": ("apache/commons-math", "maven"),
    "Mockito": ("mockito/mockito", "gradle"),
    "Time": ("JodaOrg/joda-time", "maven"),
}


_MAVEN_PROPERTY = re.compile(r"^-D[A-Za-z0-9_.-]+(=[A-Za-z0-9_.,:/+-]*)?$")


def _with_maven_options(test: TestSpec, options: str, build: str, ref: RecordRef) -> TestSpec:
    """``test`` with Maven properties (``-Dkey=value`` only) added to its ``mvn test``: old
    revisions need some to build on a current JDK (``-Dmaven.compiler.source=8`` where the pom
    says 1.5, ``-Djacoco.skip=true`` where an old JaCoCo agent cannot start)."""
    if build != "maven":
        raise ref.error(f"maven_options needs a Maven build, not {build!r}", "maven_options")
    words = options.split()
    bad = [w for w in words if not _MAVEN_PROPERTY.match(w)]
    if bad:
        raise ref.error(
            f"maven_options takes Maven properties (-Dkey=value) only, not {bad[0]!r}",
            "maven_options",
        )
    command = test.command.replace("mvn -B -q test", f"mvn -B -q test {' '.join(words)}", 1)
    return test.model_copy(update={"command": command})


def convert_defects4j(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """Defects4J bugs: one record per bug, with the columns of Defects4J's
    ``active-bugs.csv`` (dotted or underscored names), its trigger tests and the patches."""
    project = text(record, ref, "project", required=True)
    bug_id = first_text(record, ref, "bug_id", "bug.id", required=True)
    instance_id = optional_text(record, ref, "instance_id") or f"{project}-{bug_id}"
    ref.instance_id = instance_id
    known_repo, known_build = DEFECTS4J_PROJECTS.get(project, ("", "maven"))
    repo = repo_name(optional_text(record, ref, "repo") or known_repo, ref)
    base_commit = first_text(
        record, ref, "revision_buggy", "revision.id.buggy", "base_commit", required=True
    )
    # Defects4J writes trigger tests as Class::method; the harness's Java ids are Class#method.
    trigger = list_field(record, ref, "trigger_tests", "FAIL_TO_PASS", required=True)
    fail_to_pass = [t.replace("::", "#") for t in trigger]
    pass_to_pass = [
        t.replace("::", "#") for t in list_field(record, ref, "pass_to_pass", "PASS_TO_PASS")
    ]
    patch = first_text(record, ref, "patch", "src_patch")
    test_patch = text(record, ref, "test_patch")
    declared = (optional_text(record, ref, "build_system") or known_build).lower()
    if declared == "ant":
        raise ref.error(
            f"project {project} builds with Ant, which is not supported yet (no JUnit XML"
            " reports); set build_system to 'maven' or 'gradle' when the buggy revision has"
            " such a build, or filter the project out",
            "build_system",
        )
    fields, build = _java_task_fields(
        {**record, "build_system": declared}, ref, repo, patch, test_patch, {}
    )
    options_text = optional_text(record, ref, "maven_options")
    if options_text:
        fields["test"] = _with_maven_options(fields["test"], options_text, build, ref)
    consumed = {"project", "bug_id", "bug.id", "instance_id", "repo", "revision_buggy",
                "revision.id.buggy", "base_commit", "trigger_tests", "FAIL_TO_PASS",
                "pass_to_pass", "PASS_TO_PASS", "patch", "src_patch", "test_patch",
                "build_system", "version", "problem_statement", "source",
                "maven_options"}  # fmt: skip
    source = optional_text(record, ref, "source")
    if source:
        fields["source"] = source
    return finish(
        ref,
        options,
        record,
        consumed,
        metadata={"build_system": build, "project": project, "bug_id": bug_id},
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=patch,
        test_patch=test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        version=optional_text(record, ref, "version"),
        problem_statement=text(record, ref, "problem_statement"),
        **fields,
    )


# --- GitBug-Java ----------------------------------------------------------------------------------


def _run_statuses(runs: Any, ref: RecordRef, field: str) -> dict[str, bool]:
    """Test id -> passed, from one entry of GitBug's ``actions_runs`` (a list of workflow runs,
    each with ``tests``: classname, name, results)."""
    if not isinstance(runs, list):
        raise ref.error("each entry must be a list of workflow runs", field)
    statuses: dict[str, bool] = {}
    for run in runs:
        if not isinstance(run, dict) or not isinstance(run.get("tests", []), list):
            raise ref.error("each workflow run must be an object with a 'tests' list", field)
        for test in run.get("tests", []):
            if not isinstance(test, dict) or "classname" not in test or "name" not in test:
                raise ref.error("each test needs 'classname' and 'name'", field)
            results = test.get("results") or []
            outcomes = [r.get("result") for r in results if isinstance(r, dict)]
            if "Skipped" in outcomes and all(o == "Skipped" for o in outcomes):
                continue
            test_id = f"{test['classname']}#{test['name']}"
            statuses[test_id] = bool(outcomes) and all(o == "Passed" for o in outcomes)
    return statuses


def _run_build_tool(runs: Any) -> str | None:
    if isinstance(runs, list):
        for run in runs:
            if isinstance(run, dict) and isinstance(run.get("build_tool"), str):
                return str(run["build_tool"])
    return None


def convert_gitbug_java(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """GitBug-Java bugs (``data/bugs/*.json`` lines of the benchmark's repository)."""
    repo = repo_name(text(record, ref, "repository", required=True), ref, "repository")
    commit = text(record, ref, "commit_hash", required=True)
    # GitBug-Java's own bug id: owner-name-<first 12 hex digits of the fix commit>.
    instance_id = optional_text(record, ref, "instance_id") or (
        f"{repo.replace('/', '-')}-{commit[:12]}"
    )
    ref.instance_id = instance_id
    base_commit = text(record, ref, "previous_commit_hash", required=True)
    patch = text(record, ref, "bug_patch")
    test_patch = text(record, ref, "test_patch")
    non_code = text(record, ref, "non_code_patch")
    if "FAIL_TO_PASS" in record:
        fail_to_pass = string_list(record, ref, "FAIL_TO_PASS")
        pass_to_pass = string_list(record, ref, "PASS_TO_PASS")
    else:
        runs = record.get("actions_runs")
        if not isinstance(runs, list) or len(runs) < 3:
            raise ref.error(
                "must list three runs (before, buggy with the test patch, fixed) to derive"
                " FAIL_TO_PASS; or give FAIL_TO_PASS/PASS_TO_PASS",
                "actions_runs",
            )
        buggy = _run_statuses(runs[1], ref, "actions_runs[1]")
        fixed = _run_statuses(runs[2], ref, "actions_runs[2]")
        fail_to_pass = [t for t, ok in fixed.items() if ok and not buggy.get(t, False)]
        pass_to_pass = [t for t, ok in fixed.items() if ok and buggy.get(t, False)]
        if not record.get("build_system"):
            tool = _run_build_tool(runs[2]) or _run_build_tool(runs[1])
            if tool:
                record = {**record, "build_system": tool}
    if not fail_to_pass:
        raise ref.error("no test fails on the buggy version and passes on the fixed one",
                        "actions_runs")  # fmt: skip
    # GitBug-Java applies the non-code part of the fix (resources, build files) with the test
    # patch when it checks out the buggy version: the harness does the same.
    full_test_patch = test_patch + (non_code if non_code and patch else "")
    fields, build = _java_task_fields(record, ref, repo, patch, full_test_patch, {})
    consumed = {"repository", "commit_hash", "previous_commit_hash", "bug_patch", "test_patch",
                "non_code_patch", "actions_runs", "issues", "instance_id", "FAIL_TO_PASS",
                "PASS_TO_PASS", "clone_url", "build_system", "language"}  # fmt: skip
    return finish(
        ref,
        options,
        record,
        consumed,
        metadata={"build_system": build, "fixed_commit": commit},
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=patch,
        test_patch=full_test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        problem_statement=_issues_text(record.get("issues")) or text(record, ref, "commit_message"),
        created_at=optional_text(record, ref, "commit_timestamp"),
        source=optional_text(record, ref, "clone_url"),
        **fields,
    )


__all__ = [
    "DEFECTS4J_PROJECTS",
    "MULTI_SWE_BENCH_JAVA_BUILDS",
    "convert_defects4j",
    "convert_gitbug_java",
    "convert_multi_swe_bench",
]
