#!/usr/bin/env python3
"""Turn Exercism exercises laid out as Aider's polyglot benchmark lays them out
(``<language>/exercises/practice/<exercise>/``) into ``polyglot`` records with hidden tests.

For each exercise (Go, Rust, C++, JavaScript, Python, Java):

- the **base**: a root commit of its own (fixed identity and date, so the same exercise gives
  the same commit anywhere) holding the exercise's folder without its tests (``files.test`` and,
  but for Java, ``files.editor`` of ``.meta/config.json``; Java's editor files are sources the
  tests use, such as an exception class) and without its dot-folders (``.meta`` holds the
  reference solution, ``.approaches``/``.articles`` discuss solutions, ``.docs`` becomes the
  statement), saved as ``repos/<language>__<exercise>.bundle``. Java: the Gradle wrapper
  (``gradlew``, ``gradle/``) is left out and a ``pom.xml`` written (:data:`POM`: the same JUnit 5
  and AssertJ as ``build.gradle``), since the machines have Maven and no Gradle distribution;
  the record says ``build_system: maven``;
- the **test patch**: the withheld test files (applied only when grading);
- the **gold patch**: the reference solution (``files.example``) over the stub
  (``files.solution``; Java's ``.meta/src/reference/java/X.java`` becomes
  ``src/main/java/X.java``, helper classes included);
- **FAIL_TO_PASS**: the tests that pass when the reference solution runs (a run of the task's
  own test command in a scratch copy, with this machine's toolchain; Python's with the pytest
  of the interpreter running this script); every other test must pass too, but for
  JavaScript's ``test.skip`` tests, which stay skipped.

Usage::

    python scripts/polyglot_tasks.py SOURCE --out DIR [-l go] [-e bowling] [--limit N]

``SOURCE`` is a folder in that layout or a git repository (bare or not; its ``HEAD``).
The records go to ``DIR/tasks.jsonl`` (sources relative to it); ``crl tasks check -f polyglot
DIR/tasks.jsonl`` then checks that the reference resolves and the stub does not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_worker.errors import SandboxError
from crl_worker.harness.parsers import parse_junit_reports, parse_log
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox import node
from crl_worker.tasks.formats.exercises import POLYGLOT_ENV, polyglot_test_spec
from crl_worker.tasks.selection import java_test_class, maven_test_filter

#: Languages this script converts.
LANGUAGES = ("go", "rust", "cpp", "javascript", "python", "java")
#: Date of every exercise's commit.
DATE = "2024-01-01T09:00:00+00:00"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "CodeRepairRL polyglot",
    "GIT_AUTHOR_EMAIL": "polyglot@coderepair.io",
    "GIT_COMMITTER_NAME": "CodeRepairRL polyglot",
    "GIT_COMMITTER_EMAIL": "polyglot@coderepair.io",
    "GIT_AUTHOR_DATE": DATE,
    "GIT_COMMITTER_DATE": DATE,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}
#: Aider's benchmark's words to the model after the instructions (its ``benchmark.py``).
_ASK = (
    "Use the above instructions to modify the supplied files: {files} (in `{where}`). Don't"
    " change the names of existing functions or classes, as they may be referenced from other"
    " code like unit tests, etc. Only use standard libraries, don't suggest installing any"
    " packages. The tests are hidden: they are added and run ({runner}) when your answer is"
    " graded."
)
_RUNNERS = {
    "go": "`go test`",
    "rust": "`cargo test`",
    "cpp": "CMake and Catch2",
    "javascript": "Jest",
    "python": "pytest",
    "java": "Maven and JUnit 5",
}
#: Java: the Gradle wrapper, left out of the base (it downloads Gradle on its first run).
_GRADLE_WRAPPER = ("gradlew", "gradlew.bat", "gradle")
#: The Maven build of a Java exercise: ``build.gradle``'s dependencies (JUnit 5.10.0 through
#: its BOM, AssertJ 3.25.1, and the exercise's own ``implementation`` ones in ``{main}``),
#: Java 17, Exercism's ``src/main/java`` and ``src/test/java``.
POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.coderepair.polyglot</groupId>
  <artifactId>{name}</artifactId>
  <version>1.0</version>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>org.junit</groupId>
        <artifactId>junit-bom</artifactId>
        <version>5.10.0</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>{main}
    <dependency>
      <groupId>org.junit.jupiter</groupId>
      <artifactId>junit-jupiter</artifactId>
      <scope>test</scope>
    </dependency>
    <dependency>
      <groupId>org.assertj</groupId>
      <artifactId>assertj-core</artifactId>
      <version>3.25.1</version>
      <scope>test</scope>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-compiler-plugin</artifactId>
        <version>3.13.0</version>
      </plugin>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-surefire-plugin</artifactId>
        <version>3.2.5</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


#: ``implementation "group:artifact:version"`` in a ``build.gradle`` (rxjava for ``hangman``,
#: org.json for ``rest-api``).
_GRADLE_DEPENDENCY = re.compile(
    r"""^\s*implementation\s+["']([^:"']+):([^:"']+):([^"']+)["']""", re.M
)


def pom(exercise: Exercise) -> str:
    """The ``pom.xml`` of a Java exercise, with the main dependencies of its ``build.gradle``."""
    gradle = exercise.folder / "build.gradle"
    text = gradle.read_text() if gradle.is_file() else ""
    main = "".join(
        f"\n    <dependency>\n      <groupId>{g}</groupId>\n      <artifactId>{a}</artifactId>"
        f"\n      <version>{v}</version>\n    </dependency>"
        for g, a, v in _GRADLE_DEPENDENCY.findall(text)
    )
    return POM.replace("{name}", exercise.name).replace("{main}", main)


def say(message: str) -> None:
    """One line of the script's report on standard output."""
    sys.stdout.write(message + "\n")


class ConvertError(Exception):
    """An exercise that cannot be converted; the message says why."""


@dataclass(frozen=True)
class Exercise:
    """One exercise's folder and its ``.meta/config.json`` file lists."""

    language: str
    name: str
    folder: Path
    solution: list[str]
    tests: list[str]
    example: list[str]
    editor: list[str]

    @property
    def where(self) -> str:
        """The exercise's folder in the repository."""
        return f"{self.language}/exercises/practice/{self.name}"


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git with the fixed identity; its output (raises on failure)."""
    env = {**os.environ, **_GIT_ENV}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConvertError(f"git {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def read_exercise(root: Path, language: str, name: str) -> Exercise:
    """The exercise under ``root``, its files named by ``.meta/config.json``."""
    folder = root / language / "exercises" / "practice" / name
    try:
        config = json.loads((folder / ".meta" / "config.json").read_text())
        files = config["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConvertError(f"{language}/{name}: unreadable .meta/config.json ({exc})") from exc
    # Java's editor files are sources the tests use (kept in the base); elsewhere test helpers.
    editor = files.get("editor", [])
    tests = [*files.get("test", []), *([] if language == "java" else editor)]
    exercise = Exercise(language, name, folder, files["solution"], tests, files["example"],
                        editor if language == "java" else [])  # fmt: skip
    for path in [*exercise.solution, *exercise.tests, *exercise.example, *exercise.editor]:
        if not (folder / path).is_file():
            raise ConvertError(f"{language}/{name}: {path} named by .meta/config.json is missing")
    return exercise


def _gold_target(exercise: Exercise, example: str) -> str:
    """The solution file a reference file replaces (same suffix; Rust's is ``src/lib.rs``);
    Java's by path: ``.meta/src/reference/java/X.java`` -> ``src/main/java/X.java`` (a helper
    class of the reference solution is a new file)."""
    if exercise.language == "java":
        reference = ".meta/src/reference/"
        if not example.startswith(reference):
            raise ConvertError(f"{exercise.where}: reference file {example} is not under"
                               f" {reference}")  # fmt: skip
        return "src/main/" + example.removeprefix(reference)
    suffix = Path(example).suffix
    matches = [s for s in exercise.solution if Path(s).suffix == suffix]
    if len(matches) != 1:
        raise ConvertError(f"{exercise.where}: cannot tell which solution file {example} replaces")
    return matches[0]


def _statement(exercise: Exercise) -> str:
    docs = exercise.folder / ".docs"
    parts = [(docs / n).read_text().strip() for n in ("instructions.md", "instructions.append.md")
             if (docs / n).is_file()]  # fmt: skip
    if not parts:
        raise ConvertError(f"{exercise.where}: no .docs/instructions.md")
    files = ", ".join(f"`{f}`" for f in exercise.solution)
    ask = _ASK.format(files=files, where=exercise.where, runner=_RUNNERS[exercise.language])
    return "\n\n".join([*parts, ask])


def _base_tree(exercise: Exercise, into: Path) -> None:
    target = into / exercise.where
    java = exercise.language == "java"
    shutil.copytree(
        exercise.folder,
        target,
        ignore=lambda d, names: [
            n
            for n in names
            if n.startswith(".")
            or n in ("build", "target", "__pycache__")
            or (java and Path(d) == exercise.folder and n in _GRADLE_WRAPPER)
        ],
    )
    for test in exercise.tests:
        (target / test).unlink()
    if java:
        (target / "pom.xml").write_text(pom(exercise))
    if exercise.language == "rust":
        _rust_dependencies(exercise, target)


def _rust_dependencies(exercise: Exercise, target: Path) -> None:
    """A Rust exercise's crates, for runs without network: the reference solution's
    (``.meta/Cargo-example.toml``) added to the stub's ``Cargo.toml``, resolved once into a
    ``Cargo.lock`` kept in the base (the same versions at every install) and fetched into this
    machine's cargo home for the reference run. A task's ``install`` fetches them (with the
    network) into the sandbox's own."""
    manifest = target / "Cargo.toml"
    example = exercise.folder / ".meta" / "Cargo-example.toml"
    text, crates = with_example_dependencies(
        manifest.read_text(), example.read_text() if example.is_file() else ""
    )
    manifest.write_text(text)
    if not crates:
        return
    env = {**os.environ, "CARGO_NET_OFFLINE": "false", "CARGO_TERM_COLOR": "never"}
    for step in (["generate-lockfile"], ["fetch", "--locked"]):
        done = subprocess.run(["cargo", *step, "--quiet"], cwd=target, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        if done.returncode != 0:
            raise ConvertError(f"{exercise.where}: cargo {step[0]} failed (the crates need the"
                               f" network once): {done.stderr.strip()[-500:]}")  # fmt: skip


def with_example_dependencies(manifest: str, example: str) -> tuple[str, list[str]]:
    """``manifest`` (a stub's ``Cargo.toml``) with the dependencies of ``example`` (the reference
    solution's) that it lacks, added under its ``[dependencies]``; and every crate it then
    names."""
    stub = tomllib.loads(manifest).get("dependencies", {})
    wanted = tomllib.loads(example).get("dependencies", {}) if example.strip() else {}
    extra = {n: v for n, v in wanted.items() if n not in stub}
    if extra:
        lines = manifest.splitlines()
        added = [f"{name} = {_toml_value(value)}" for name, value in extra.items()]
        if "[dependencies]" in lines:
            at = lines.index("[dependencies]") + 1
            lines[at:at] = added
        else:
            lines += ["", "[dependencies]", *added]
        manifest = "\n".join(lines) + "\n"
    return manifest, [*stub, *extra]


def _toml_value(value: object) -> str:
    """A dependency's version or inline table, written back as TOML."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise ConvertError(f"a Cargo.toml value this script cannot write back: {value!r}")


def _diff(repo: Path) -> str:
    git("add", "-A", cwd=repo)
    diff = git("diff", "--cached", "--no-color", "--no-ext-diff", cwd=repo)
    git("reset", "-q", "--hard", cwd=repo)
    return diff


def reference_run(exercise: Exercise, checkout: Path) -> dict[str, TestStatus]:
    """The test statuses of the task's own test command, run in ``checkout``."""
    spec = polyglot_test_spec(exercise.language, exercise.where, exercise.name, exercise.tests)
    env = {**os.environ, **POLYGLOT_ENV.get(exercise.language, {})}
    command = spec.command.replace("{tests}", " ".join(_run_all(exercise)))
    if exercise.language == "python":
        # This interpreter's pytest without the plugins of its environment (the sandbox
        # installs pytest alone; the ids are the same).
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if exercise.language == "javascript":
        # The shared Jest a sandbox gets (crl_worker.sandbox.node), as ``jest`` on PATH.
        home = node.ensure_jest()
        node.link_jest(home, checkout.parent / "tools")
        env.update(node.jest_env(home), PATH=f"{checkout.parent / 'tools'}:{env['PATH']}")
    script = " && ".join([*spec.pre, command])
    done = subprocess.run(
        ["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=900
    )
    if spec.log_format == "junit":
        reports = sorted(checkout.glob(spec.junit_reports[0]))
        return parse_junit_reports(r.read_text() for r in reports)
    return parse_log(spec.log_format, done.stdout + done.stderr)


def _run_all(exercise: Exercise) -> list[str]:
    """What ``{tests}`` stands for in the reference run: every test of the exercise (Python:
    its ``*_test.py`` files; Java: one ``-Dtest`` value naming its test classes)."""
    if exercise.language == "python":
        return [shlex.quote(f"{exercise.where}/{t}") for t in exercise.tests
                if t.endswith("_test.py")]  # fmt: skip
    if exercise.language == "java":
        classes = [java_test_class(t) for t in exercise.tests if t.endswith("Test.java")]
        return [shlex.quote(maven_test_filter(c for c in classes if c))]
    return []


def stage(exercise: Exercise, scratch: Path) -> tuple[str, str, str]:
    """(base commit, gold patch, test patch) of ``exercise``: its base committed in
    ``scratch/repo``, and ``scratch/run`` a copy of it with the reference and the tests."""
    repo = scratch / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    _base_tree(exercise, repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", f"{exercise.where}: the exercise's stub", cwd=repo)
    base = git("rev-parse", "HEAD", cwd=repo).strip()
    target = repo / exercise.where
    for example in exercise.example:
        shutil.copyfile(exercise.folder / example, target / _gold_target(exercise, example))
    patch = _diff(repo)
    for test in exercise.tests:
        (target / test).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(exercise.folder / test, target / test)
    test_patch = _diff(repo)
    # The reference run's copy: the gold patch and the tests applied to the base.
    run = scratch / "run"
    shutil.copytree(repo, run, ignore=shutil.ignore_patterns(".git"))
    for example in exercise.example:
        shutil.copyfile(
            exercise.folder / example, run / exercise.where / _gold_target(exercise, example)
        )
    for test in exercise.tests:
        (run / exercise.where / test).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(exercise.folder / test, run / exercise.where / test)
    return base, patch, test_patch


def convert(exercise: Exercise, out: Path) -> dict[str, Any]:
    """The polyglot record of ``exercise``; its bundle written under ``out/repos``."""
    with tempfile.TemporaryDirectory(prefix="crl-polyglot-") as scratch:
        base, patch, test_patch = stage(exercise, Path(scratch))
        repo, run = Path(scratch) / "repo", Path(scratch) / "run"
        statuses = reference_run(exercise, run)
        passed = sorted(i for i, s in statuses.items() if s is TestStatus.PASSED)
        # JavaScript's ``test.skip`` tests stay skipped (Exercism skips them as too slow for its
        # runner; Aider's benchmark runs them skipped too), and so does Java's one bare
        # ``@Disabled`` (forth's, no "Remove to run test" reason; the reference fails it):
        # they are left out of FAIL_TO_PASS.
        allowed = {
            TestStatus.PASSED,
            *([TestStatus.SKIPPED] if exercise.language in ("javascript", "java") else []),
        }
        failing = sorted(i for i, s in statuses.items() if s not in allowed)
        if not passed or failing:
            raise ConvertError(f"{exercise.where}: the reference solution does not pass: "
                               f"{failing[:5] or 'no test reported'}")  # fmt: skip
        instance_id = f"{exercise.language}__{exercise.name}"
        bundle = out / "repos" / f"{instance_id}.bundle"
        bundle.parent.mkdir(parents=True, exist_ok=True)
        git("bundle", "create", "-q", str(bundle), "main", cwd=repo)
    return {
        "instance_id": instance_id,
        "language": exercise.language,
        "exercise": exercise.name,
        "repo": f"Aider-AI/polyglot-benchmark--{exercise.language}-{exercise.name}",
        "source": f"repos/{instance_id}.bundle",
        "base_commit": base,
        "patch": patch,
        "test_patch": test_patch,
        "test_files": exercise.tests,
        "FAIL_TO_PASS": passed,
        "instructions": _statement(exercise),
        **({"build_system": "maven"} if exercise.language == "java" else {}),
    }


def _checkout(source: Path, into: Path) -> Path:
    """``source`` as a folder: itself, or its git ``HEAD`` extracted under ``into``."""
    if (source / "HEAD").is_file() or (source / ".git").exists():
        archive = subprocess.run(
            ["git", f"--git-dir={source if (source / 'HEAD').is_file() else source / '.git'}",
             "archive", "HEAD", *LANGUAGES], capture_output=True, check=True,
        )  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
        return into
    return source


def main(argv: list[str] | None = None) -> int:
    """Convert the exercises; print one line per exercise; 1 when none converted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("-l", "--language", action="append", choices=LANGUAGES)
    parser.add_argument("-e", "--exercise", action="append", help="exercise name (repeatable)")
    parser.add_argument("--limit", type=int, default=0, help="at most N exercises per language")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    records, failed = [], 0
    with tempfile.TemporaryDirectory(prefix="crl-polyglot-src-") as scratch:
        root = _checkout(args.source.resolve(), Path(scratch))
        for language in args.language or LANGUAGES:
            practice = root / language / "exercises" / "practice"
            names = sorted(p.name for p in practice.iterdir()) if practice.is_dir() else []
            if args.exercise:
                names = [n for n in names if n in args.exercise]
            if args.limit:
                names = names[: args.limit]
            for name in names:
                try:
                    records.append(convert(read_exercise(root, language, name), args.out))
                    say(f"ok      {language}/{name}")
                except (ConvertError, SandboxError, subprocess.SubprocessError, OSError) as exc:
                    failed += 1
                    say(f"skipped {language}/{name}: {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, sort_keys=True) for r in records]
    (args.out / "tasks.jsonl").write_text("".join(line + "\n" for line in lines))
    say(f"{len(records)} converted, {failed} skipped -> {args.out / 'tasks.jsonl'}")
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
