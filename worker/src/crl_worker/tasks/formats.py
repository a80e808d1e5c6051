"""Record converters: one function per benchmark format, each turning one raw record into a
:class:`Task` or raising :class:`TaskFormatError` naming the record and the field.

Record shapes and field mappings are documented in ``docs/tasks.md``.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from crl_worker.errors import TaskFormatError
from crl_worker.tasks.model import Language, Task, TestSpec
from crl_worker.tasks.recipes import (
    GENERIC_PYTHON,
    PYTEST,
    BuildSystem,
    Recipe,
    java_recipe,
    multi_swe_bench_image,
    render_image_template,
    swebench_image,
    swebench_recipe,
    swegym_image,
)
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
from crl_worker.tasks.vulns import convert_bigvul, convert_cvefixes, convert_primevul

logger = logging.getLogger(__name__)

Converter = Callable[[Record, RecordRef, ConvertOptions], Task]

_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


# --- shared pieces --------------------------------------------------------------------------------


def _repo(value: str, ref: RecordRef, field: str = "repo") -> str:
    if not _REPO.match(value):
        raise ref.error(f"must be a repository as owner/name, not {value!r}", field)
    return value


def _image(
    options: ConvertOptions,
    default: str | None,
    *,
    instance_id: str,
    repo: str,
    version: str | None,
) -> str | None:
    if options.image_template:
        return render_image_template(
            options.image_template, instance_id=instance_id, repo=repo, version=version
        )
    return default


def _extras(record: Record, consumed: Iterable[str]) -> dict[str, Any]:
    """Fields the converter did not map, kept in ``metadata`` (small scalars and lists only:
    large run logs stay out of every task object)."""
    skip = set(consumed)
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key in skip or value is None:
            continue
        if isinstance(value, str | int | float | bool) and len(str(value)) <= 2000:
            out[key] = value
    return out


def _build(ref: RecordRef, **fields: Any) -> Task:
    """``Task(**fields)``, with pydantic's complaints turned into a :class:`TaskFormatError`."""
    try:
        return Task(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise ref.error(first["msg"], location or None) from None


def _recipe_fields(recipe: Recipe, version: str | None = None) -> dict[str, Any]:
    return {
        "language": recipe.language,
        "python": recipe.python,
        "install": list(recipe.install),
        "test": recipe.test_spec(),
        "env": recipe.environment(version),
    }


def _list_field(record: Record, ref: RecordRef, *names: str, required: bool = False) -> list[str]:
    """The first of ``names`` present (SWE-bench's upper-case names, or lower-case aliases)."""
    for name in names:
        if name in record and record[name] is not None:
            return string_list(record, ref, name)
    if required:
        raise ref.error("required field is missing", names[0])
    return []


# --- SWE-bench, SWE-bench Verified/Lite, SWE-Gym --------------------------------------------------

_SWEBENCH_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "fail_to_pass",
    "pass_to_pass",
    "environment_setup_commit",
    "image_name",
)


#: Per-record harness keys a ``swe-bench``/``swe-gym`` record may carry (names as SWE-bench's
#: harness specs spell them); they replace what the recipe says (docs/tasks.md).
RECORD_HARNESS_KEYS = (
    "python",
    "pre_install",
    "pip_packages",
    "install",
    "test_cmd",
    "test_command",
    "log_format",
    "env",
)
#: SWE-bench spec keys that cannot be honoured, with the reason: such a record is refused rather
#: than loaded with the key dropped.
REFUSED_RECORD_KEYS = {
    "packages": "conda packages: local sandboxes build a virtual environment, not a conda one; "
    "give pip_packages or install commands instead",
    "eval_commands": "commands run before each test run: fold them into test_cmd "
    "('source env.sh && pytest -rA'), or write the record in the task format (test.pre)",
    "env_setup": "a conda environment script: give install commands instead",
    "docker_specs": "image build settings: give image_name, or build images with crl tasks images",
}


def _commands(record: Record, ref: RecordRef, name: str) -> list[str]:
    """A command list: a list of strings, a JSON string holding one, or one command string."""
    value = record.get(name)
    if isinstance(value, str) and not value.lstrip().startswith("["):
        return [value] if value.strip() else []
    return string_list(record, ref, name)


def _record_harness(
    record: Record, ref: RecordRef, fields: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """``fields`` (the recipe's) with the record's own harness keys applied; the keys used."""
    for key, reason in REFUSED_RECORD_KEYS.items():
        if record.get(key) not in (None, "", [], {}):
            raise ref.error(f"is not supported: {reason}", key)
    used = [k for k in RECORD_HARNESS_KEYS if record.get(k) not in (None, "", [], {})]
    if not used:
        return fields, []
    fields = dict(fields)
    if "python" in used:
        fields["python"] = text(record, ref, "python").removeprefix("python")
    install = list(fields["install"])
    if "install" in used:
        install = _commands(record, ref, "install")
    if "pip_packages" in used:
        packages = _commands(record, ref, "pip_packages")
        if len(packages) == 1:  # SWE-bench writes them as one space-separated string
            packages = packages[0].split()
        install = ["python -m pip install " + " ".join(shlex.quote(p) for p in packages), *install]
    if "pre_install" in used:
        install = [*_commands(record, ref, "pre_install"), *install]
    fields["install"] = install
    test: TestSpec = fields["test"]
    updates: dict[str, Any] = {}
    for key in ("test_cmd", "test_command"):
        if key in used:
            command = " && ".join(_commands(record, ref, key))
            # SWE-bench's test_cmd takes the test files after it.
            updates["command"] = command if "{tests}" in command else f"{command} {{tests}}"
    if "log_format" in used:
        updates["log_format"] = text(record, ref, "log_format")
    if updates:
        try:
            fields["test"] = TestSpec.model_validate({**test.model_dump(), **updates})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ref.error(first["msg"], "log_format") from None
    if "env" in used:
        env = mapping(record, ref, "env")
        if not all(isinstance(v, str | int | float) for v in env.values()):
            raise ref.error("must map names to strings", "env")
        fields["env"] = {**fields["env"], **{k: str(v) for k, v in env.items()}}
    return fields, used


def drop_log_fragments(ids: list[str]) -> tuple[list[str], list[str]]:
    """``(kept, dropped)``: ids that are pieces of a test log rather than tests are dropped.

    SWE-bench's log parsers took some progress markers for test names, so a few published lists
    hold ``"[100%]"``, ``"["`` or ``"[100%]------"`` (pytest-dev__pytest-5227's PASS_TO_PASS). No
    runner reports such an id, so kept they would be graded missing and the gold patch
    unresolved. A test id of any log format (a path, a name, ``Class#method``) never starts with
    ``[`` or is blank."""
    kept = [i for i in ids if i.strip() and not i.lstrip().startswith("[")]
    return kept, [i for i in ids if i not in kept]


def _swebench_like(
    record: Record, ref: RecordRef, options: ConvertOptions, image_of: Callable[[str], str]
) -> Task:
    instance_id = text(record, ref, "instance_id", required=True)
    ref.instance_id = instance_id
    repo = _repo(text(record, ref, "repo", required=True), ref)
    base_commit = text(record, ref, "base_commit", required=True)
    fail_to_pass = _list_field(record, ref, "FAIL_TO_PASS", "fail_to_pass", required=True)
    pass_to_pass = _list_field(record, ref, "PASS_TO_PASS", "pass_to_pass")
    fail_to_pass, dropped = drop_log_fragments(fail_to_pass)
    pass_to_pass, dropped_p2p = drop_log_fragments(pass_to_pass)
    version = optional_text(record, ref, "version")
    recipe = swebench_recipe(repo, version)
    metadata = _extras(record, _SWEBENCH_FIELDS)
    if dropped or dropped_p2p:
        metadata["dropped_ids"] = [*dropped, *dropped_p2p]
        logger.warning(
            "%s: ids that are pieces of a log, not tests, left out of the lists: %s",
            instance_id,
            ", ".join(repr(i) for i in [*dropped, *dropped_p2p]),
        )
    if recipe is None:
        logger.debug("no recipe for %s; using the generic pytest recipe", repo)
        recipe = GENERIC_PYTHON
        metadata["recipe"] = "generic"
    else:
        metadata["recipe"] = "table"
    if recipe.image_only:
        metadata["image_only"] = True
    harness, used = _record_harness(record, ref, _recipe_fields(recipe, version))
    for key in used:
        metadata.pop(key, None)
    if used:
        metadata["record_keys"] = used
    default_image = optional_text(record, ref, "image_name") or image_of(instance_id)
    return _build(
        ref,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=text(record, ref, "patch"),
        test_patch=text(record, ref, "test_patch"),
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        environment_setup_commit=optional_text(record, ref, "environment_setup_commit"),
        version=version,
        problem_statement=text(record, ref, "problem_statement"),
        hints_text=text(record, ref, "hints_text"),
        created_at=optional_text(record, ref, "created_at"),
        image=_image(options, default_image, instance_id=instance_id, repo=repo, version=version),
        metadata=metadata,
        **harness,
    )


def convert_swebench(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """SWE-bench, SWE-bench Verified and SWE-bench Lite records."""
    return _swebench_like(record, ref, options, swebench_image)


def convert_swegym(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """SWE-Gym records: the SWE-bench schema, SWE-Gym's images."""
    return _swebench_like(record, ref, options, swegym_image)


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
    return _recipe_fields(recipe), build


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
        repo = _repo(f"{owner}/{name}", ref, "org")
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
        repo = _repo(text(record, ref, "repo", required=True), ref)
        owner, name = repo.split("/", 1)
        base_commit = text(record, ref, "base_commit", required=True)
        patch = text(record, ref, "patch")
        test_patch = text(record, ref, "test_patch")
        fail_to_pass = _list_field(record, ref, "FAIL_TO_PASS", "fail_to_pass", required=True)
        pass_to_pass = _list_field(record, ref, "PASS_TO_PASS", "pass_to_pass")
        statement = text(record, ref, "problem_statement")
        version = optional_text(record, ref, "version")
        # The pull request number: SWE-bench-style ids end in it ("apache__druid-13704").
        number = optional_text(record, ref, "number") or instance_id.rsplit("-", 1)[-1]
        consumed = {*_SWEBENCH_FIELDS, "language", "build_system", "number"}
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
    metadata = _extras(record, consumed)
    metadata["build_system"] = build
    return _build(
        ref,
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
        image=_image(options, default_image, instance_id=instance_id, repo=repo, version=version),
        # Multi-SWE-bench images hold the repository under /home/<name>.
        workdir=f"/home/{name}" if default_image and not options.image_template else "/testbed",
        metadata=metadata,
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


def _first_text(record: Record, ref: RecordRef, *names: str, required: bool = False) -> str:
    for name in names:
        if record.get(name) is not None:
            return text(record, ref, name)
    if required:
        raise ref.error("required field is missing", names[0])
    return ""


def convert_defects4j(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """Defects4J bugs: one record per bug, with the columns of Defects4J's
    ``active-bugs.csv`` (dotted or underscored names), its trigger tests and the patches."""
    project = text(record, ref, "project", required=True)
    bug_id = _first_text(record, ref, "bug_id", "bug.id", required=True)
    instance_id = optional_text(record, ref, "instance_id") or f"{project}-{bug_id}"
    ref.instance_id = instance_id
    known_repo, known_build = DEFECTS4J_PROJECTS.get(project, ("", "maven"))
    repo = _repo(optional_text(record, ref, "repo") or known_repo, ref)
    base_commit = _first_text(
        record, ref, "revision_buggy", "revision.id.buggy", "base_commit", required=True
    )
    # Defects4J writes trigger tests as Class::method; the harness's Java ids are Class#method.
    trigger = _list_field(record, ref, "trigger_tests", "FAIL_TO_PASS", required=True)
    fail_to_pass = [t.replace("::", "#") for t in trigger]
    pass_to_pass = [
        t.replace("::", "#") for t in _list_field(record, ref, "pass_to_pass", "PASS_TO_PASS")
    ]
    patch = _first_text(record, ref, "patch", "src_patch")
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
    version = optional_text(record, ref, "version")
    metadata = _extras(
        record,
        {"project", "bug_id", "bug.id", "instance_id", "repo", "revision_buggy",
         "revision.id.buggy", "base_commit", "trigger_tests", "FAIL_TO_PASS", "pass_to_pass",
         "PASS_TO_PASS", "patch", "src_patch", "test_patch", "build_system", "version",
         "problem_statement"},
    )  # fmt: skip
    metadata.update(build_system=build, project=project, bug_id=bug_id)
    return _build(
        ref,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=patch,
        test_patch=test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        version=version,
        problem_statement=text(record, ref, "problem_statement"),
        image=_image(options, None, instance_id=instance_id, repo=repo, version=version),
        metadata=metadata,
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
    repo = _repo(text(record, ref, "repository", required=True), ref, "repository")
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
    metadata = _extras(
        record,
        {"repository", "commit_hash", "previous_commit_hash", "bug_patch", "test_patch",
         "non_code_patch", "actions_runs", "issues", "instance_id", "FAIL_TO_PASS",
         "PASS_TO_PASS", "clone_url", "build_system", "language"},
    )  # fmt: skip
    metadata.update(build_system=build, fixed_commit=commit)
    clone_url = optional_text(record, ref, "clone_url")
    return _build(
        ref,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=patch,
        test_patch=full_test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        problem_statement=_issues_text(record.get("issues")) or text(record, ref, "commit_message"),
        created_at=optional_text(record, ref, "commit_timestamp"),
        source=clone_url,
        image=_image(options, None, instance_id=instance_id, repo=repo, version=None),
        metadata=metadata,
        **fields,
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
    repo = _repo(optional_text(record, ref, "repo") or QUIXBUGS_REPO, ref)
    base_commit = text(record, ref, "base_commit", required=True)
    explicit = _list_field(record, ref, "FAIL_TO_PASS", "fail_to_pass")
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
        fields = _recipe_fields(recipe)
        test_patch = text(record, ref, "test_patch")
        metadata_extra = {"build_system": "gradle"}
    else:
        raise ref.error(
            f"QuixBugs language {language_name!r} is not supported: use 'python' or 'java'",
            "language",
        )
    metadata = _extras(
        record,
        {"program", "language", "instance_id", "repo", "base_commit", "FAIL_TO_PASS",
         "fail_to_pass", "patch", "test_patch", "problem_statement", "python"},
    )  # fmt: skip
    metadata.update(metadata_extra, program=program)
    return _build(
        ref,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=text(record, ref, "patch"),
        test_patch=test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=_list_field(record, ref, "PASS_TO_PASS", "pass_to_pass"),
        problem_statement=text(record, ref, "problem_statement")
        or f"The QuixBugs program {program} has a one-line bug. Find and fix it.",
        image=_image(options, None, instance_id=instance_id, repo=repo, version=None),
        metadata=metadata,
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
    repo = _repo(text(record, ref, "repo", required=True), ref)
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
    metadata = _extras(
        record,
        {"project", "bug_id", "instance_id", "repo", "buggy_commit_id", "run_test",
         "python_version", "patch", "test_patch", "problem_statement", "requirements"},
    )  # fmt: skip
    if requirements:
        metadata["requirements"] = requirements
    return _build(
        ref,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=text(record, ref, "patch"),
        test_patch=text(record, ref, "test_patch"),
        fail_to_pass=ids,
        pass_to_pass=_list_field(record, ref, "PASS_TO_PASS", "pass_to_pass"),
        problem_statement=text(record, ref, "problem_statement"),
        # BugsInPy writes full versions (3.8.3); the sandbox picks interpreters by major.minor.
        python=".".join(python.split(".")[:2]) if python else None,
        install=install,
        test=test,
        image=_image(options, None, instance_id=instance_id, repo=repo, version=None),
        metadata=metadata,
    )


# --- Aider-polyglot style exercises -----------------------------------------------------------------


def convert_polyglot(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """Exercism-style exercises (Aider's polyglot benchmark): solution stubs plus tests in the
    benchmark repository. Python (pytest) and Java (Gradle) are supported."""
    language_name = text(record, ref, "language", required=True).lower()
    exercise = text(record, ref, "exercise", required=True)
    instance_id = optional_text(record, ref, "instance_id") or f"{language_name}__{exercise}"
    ref.instance_id = instance_id
    repo = _repo(optional_text(record, ref, "repo") or "Aider-AI/polyglot-benchmark", ref)
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
        fields = _recipe_fields(recipe)
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
    metadata = _extras(
        record,
        {"language", "exercise", "instance_id", "repo", "base_commit", "test_files",
         "instructions", "FAIL_TO_PASS"},
    )  # fmt: skip
    metadata["exercise_dir"] = exercise_dir
    return _build(
        ref,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        fail_to_pass=fail_to_pass,
        problem_statement=text(record, ref, "instructions"),
        image=_image(options, None, instance_id=instance_id, repo=repo, version=None),
        metadata=metadata,
        **fields,
    )


def convert_native(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """A record already in the :class:`Task` schema (the ``task`` format): validated as is."""
    instance_id = record.get("instance_id")
    if isinstance(instance_id, str) and instance_id:
        ref.instance_id = instance_id
    return _build(ref, **record)


#: Converter of each ``TaskFormat`` name.
CONVERTERS: dict[str, Converter] = {
    "swe-bench": convert_swebench,
    "swe-gym": convert_swegym,
    "multi-swe-bench": convert_multi_swe_bench,
    "defects4j": convert_defects4j,
    "gitbug-java": convert_gitbug_java,
    "bugsinpy": convert_bugsinpy,
    "quixbugs": convert_quixbugs,
    "polyglot": convert_polyglot,
    "bigvul": convert_bigvul,
    "cvefixes": convert_cvefixes,
    "primevul": convert_primevul,
    "task": convert_native,
}


def converter(format_name: str) -> Converter:
    """The converter of a format; a clear error for a name no loader knows."""
    try:
        return CONVERTERS[format_name]
    except KeyError:
        raise TaskFormatError(
            f"task format {format_name!r} is not supported yet; known formats:"
            f" {', '.join(sorted(CONVERTERS))}"
        ) from None
