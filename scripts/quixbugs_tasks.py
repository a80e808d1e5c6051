#!/usr/bin/env python3
"""Turn the QuixBugs repository (``jkoppel/QuixBugs``) into ``quixbugs`` records with hidden
tests and no reference answers in the agent's checkout.

QuixBugs keeps, beside each buggy program, its corrected version (``correct_python_programs/``,
``correct_java_programs/``) and its tests and expected outputs (``python_testcases/``,
``json_testcases/``, ``java_testcases/``). An agent given the repository as it is could copy
the answer or edit the expected outputs, so for each language this script commits, as a root
commit of its own with a fixed identity and date (``repos/quixbugs-<language>.bundle``,
repository ``jkoppel/QuixBugs--<language>``):

- **python**: ``python_programs/`` (the buggy programs and their helpers);
- **java**: ``java_programs/*.java`` and a ``pom.xml`` written here (QuixBugs builds with
  Gradle and has no wrapper; the machines have Maven): JUnit 4.13.2, Java 17, sources
  ``java_programs/``, tests ``java_testcases/junit/``.

For each program, the record's **test patch** adds its test file and what it needs (Python:
``conftest.py``, ``python_testcases/test_<p>.py``, ``load_testdata.py``, ``node.py`` and
``json_testcases/<p>.json``; Java: ``java_testcases/junit/<P>_TEST.java`` and
``QuixFixOracleHelper.java``), applied only when grading; its **gold patch** is the corrected
program over the buggy one (Java: its package renamed to ``java_programs``). Java's
``FAIL_TO_PASS`` lists every ``@Test`` method of the test class (``Class#test_N``); Python's is
each test function of the test file (``file::test_x``, whose parametrized runs match it).

Usage::

    python scripts/quixbugs_tasks.py SOURCE --out DIR [-l python] [-l java] [-p bitcount]

``SOURCE`` is the QuixBugs repository (bare or not; its ``HEAD``) or a folder holding its
files. The records go to ``DIR/tasks.jsonl``; ``crl tasks check -f quixbugs DIR/tasks.jsonl``
then checks that the gold patch resolves and no patch does not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Languages this script converts.
LANGUAGES = ("python", "java")
#: Date of every base commit.
DATE = "2024-01-01T09:00:00+00:00"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "CodeRepairRL QuixBugs",
    "GIT_AUTHOR_EMAIL": "quixbugs@coderepair.io",
    "GIT_COMMITTER_NAME": "CodeRepairRL QuixBugs",
    "GIT_COMMITTER_EMAIL": "quixbugs@coderepair.io",
    "GIT_AUTHOR_DATE": DATE,
    "GIT_COMMITTER_DATE": DATE,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}
#: The Maven build of the Java programs (QuixBugs' own build is Gradle's).
POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.coderepair</groupId>
  <artifactId>quixbugs-java</artifactId>
  <version>1.0</version>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencies>
    <dependency>
      <groupId>junit</groupId>
      <artifactId>junit</artifactId>
      <version>4.13.2</version>
      <scope>test</scope>
    </dependency>
  </dependencies>
  <build>
    <sourceDirectory>.</sourceDirectory>
    <testSourceDirectory>.</testSourceDirectory>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-compiler-plugin</artifactId>
        <version>3.13.0</version>
        <configuration>
          <includes><include>java_programs/*.java</include></includes>
          <testIncludes><testInclude>java_testcases/junit/*.java</testInclude></testIncludes>
        </configuration>
      </plugin>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-surefire-plugin</artifactId>
        <version>3.2.5</version>
        <configuration>
          <includes><include>**/*_TEST.java</include></includes>
        </configuration>
      </plugin>
    </plugins>
  </build>
</project>
"""
_TEST_METHOD = re.compile(r"@org\.junit\.Test\b[^\n]*\n\s*public void (\w+)\(|@Test\b[^\n]*\n"
                          r"\s*public void (\w+)\(")  # fmt: skip


_PYTHON_TEST = re.compile(r"^def (test\w*)\(", re.MULTILINE)


class ConvertError(Exception):
    """A program that cannot be converted (the reason is the message)."""


def say(message: str) -> None:
    """One line of the script's report on standard output."""
    sys.stdout.write(message + "\n")


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git with the fixed identity; its output (raises on failure)."""
    env = {**os.environ, **_GIT_ENV}
    # Bytes, not text: text mode would turn the CRLF lines some programs have (wrap.py) into
    # LF ones, and the patches would no longer apply.
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True)
    if done.returncode != 0:
        raise ConvertError(f"git {' '.join(args)} failed: {done.stderr.decode()[-500:]}")
    return done.stdout.decode()


def _read(path: Path) -> str:
    """A file's text with its line endings as they are (CRLF kept)."""
    return path.read_bytes().decode()


def checkout(source: Path, into: Path) -> Path:
    """``source`` as a folder: itself, or its git ``HEAD`` extracted under ``into``."""
    if (source / "HEAD").is_file() or (source / ".git").exists():
        git_dir = source if (source / "HEAD").is_file() else source / ".git"
        into.mkdir(parents=True)
        archive = subprocess.run(
            ["git", f"--git-dir={git_dir}", "archive", "--format=tar", "HEAD"],
            capture_output=True, check=True,
        )  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
        return into
    return source


def programs(root: Path, language: str) -> list[str]:
    """The programs of ``language`` that have a corrected version (QuixBugs' 40 per language)."""
    if language == "python":
        return sorted(p.stem for p in (root / "correct_python_programs").glob("*.py")
                      if (root / "python_programs" / p.name).is_file()
                      and p.stem != "node" and not p.stem.endswith("_test"))  # fmt: skip
    return sorted(p.stem for p in (root / "correct_java_programs").glob("*.java")
                  if (root / "java_programs" / p.name).is_file())  # fmt: skip


def _base(root: Path, language: str, repo: Path) -> None:
    """The agent's checkout: the buggy programs only (and the Maven build for Java)."""
    if language == "python":
        shutil.copytree(root / "python_programs", repo / "python_programs",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    else:
        (repo / "java_programs").mkdir()
        for path in sorted((root / "java_programs").glob("*.java")):
            shutil.copy2(path, repo / "java_programs" / path.name)
        (repo / "pom.xml").write_text(POM)
    for name in ("README.md", "LICENSE"):
        if (root / name).is_file():
            shutil.copy2(root / name, repo / name)


def _test_files(root: Path, language: str, program: str) -> list[str]:
    """The files the program's tests need, relative to the QuixBugs root."""
    if language == "python":
        files = ["conftest.py", f"python_testcases/test_{program}.py",
                 "python_testcases/load_testdata.py", "python_testcases/node.py",
                 f"json_testcases/{program}.json"]  # fmt: skip
    else:
        files = [f"java_testcases/junit/{program}_TEST.java",
                 "java_testcases/junit/QuixFixOracleHelper.java"]  # fmt: skip
    if not (root / files[1 if language == "python" else 0]).is_file():
        raise ConvertError(f"no test file {files[1 if language == 'python' else 0]}")
    return [f for f in files if (root / f).is_file()]


def _staged_diff(repo: Path) -> str:
    """The working tree's changes as one diff, then the tree reset to the base."""
    git("add", "-A", cwd=repo)
    diff = git("diff", "--cached", "--no-color", "--no-ext-diff", cwd=repo)
    git("reset", "-q", "--hard", cwd=repo)
    git("clean", "-q", "-fdx", cwd=repo)
    return diff


def _keep_docstring(fixed: str, buggy: str) -> str:
    """The corrected program with the buggy one's closing docstring (the program's description,
    which the corrected copies leave out), so that the gold patch changes code only."""
    body = buggy.rstrip()
    start = body.rfind('\n"""', 0, len(body) - 3)
    if not body.endswith('"""') or start < 0:
        return fixed
    docstring = body[start + 1 :]
    if docstring in fixed:
        return fixed
    return fixed.rstrip() + "\n\n\n" + docstring + "\n"


def convert(root: Path, language: str, program: str, repo: Path, base: str) -> dict[str, Any]:
    """The ``quixbugs`` record of one program, against the language's base commit in ``repo``."""
    tests = _test_files(root, language, program)
    for name in tests:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, repo / name)
    test_patch = _staged_diff(repo)
    if language == "python":
        target = f"python_programs/{program}.py"
        fixed = _keep_docstring(_read(root / "correct_python_programs" / f"{program}.py"),
                                _read(root / target))  # fmt: skip
    else:
        target = f"java_programs/{program}.java"
        fixed = _read(root / "correct_java_programs" / f"{program}.java")
        fixed = fixed.replace("correct_java_programs", "java_programs")
    (repo / target).write_bytes(fixed.encode())
    patch = _staged_diff(repo)
    if not patch.strip():
        raise ConvertError(f"the corrected {target} is the buggy one")
    record: dict[str, Any] = {
        "program": program,
        "language": language,
        "repo": f"jkoppel/QuixBugs--{language}",
        "base_commit": base,
        "source": f"repos/quixbugs-{language}.bundle",
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": (
            f"The program `{target}` of QuixBugs has a bug on one line. Find and fix it"
            " without changing the function's name or signature. The tests are hidden:"
            " they are added and run when your answer is graded."
        ),
    }
    if language == "java":
        record["build_system"] = "maven"
        text = (root / tests[0]).read_text()
        methods = [a or b for a, b in _TEST_METHOD.findall(text)]
        if not methods:
            raise ConvertError(f"no @Test method in {tests[0]}")
        record["FAIL_TO_PASS"] = [f"java_testcases.junit.{program}_TEST#{m}" for m in methods]
    else:
        test_file = tests[1]
        names = _PYTHON_TEST.findall((root / test_file).read_text())
        if not names:
            raise ConvertError(f"no test function in {test_file}")
        # A parametrized test's runs (``test_x[input_data0-7]``) match its name.
        record["FAIL_TO_PASS"] = [f"{test_file}::{name}" for name in names]
    return record


def convert_language(root: Path, language: str, only: set[str], out: Path) -> list[str]:
    """Write the language's bundle and append its records to ``out/tasks.jsonl``; the
    programs skipped, with their reasons."""
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        repo.mkdir()
        git("init", "-q", "-b", "main", cwd=repo)
        _base(root, language, repo)
        git("add", "-A", cwd=repo)
        git("commit", "-q", "-m", f"QuixBugs {language} programs, without tests or fixes", cwd=repo)
        base = git("rev-parse", "HEAD", cwd=repo).strip()
        with (out / "tasks.jsonl").open("a") as sink:
            for program in programs(root, language):
                if only and program.lower() not in only:
                    continue
                try:
                    record = convert(root, language, program, repo, base)
                except ConvertError as exc:
                    skipped.append(f"{language}/{program}: {exc}")
                    continue
                sink.write(json.dumps(record) + "\n")
                say(f"converted {language}/{program}")
        bundle = out / "repos" / f"quixbugs-{language}.bundle"
        bundle.parent.mkdir(parents=True, exist_ok=True)
        git("bundle", "create", "-q", str(bundle), "main", cwd=repo)
    return skipped


def main(argv: list[str] | None = None) -> int:
    """Convert, print one line per program and a total; exit 1 when nothing converted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the QuixBugs repository or a folder of it")
    parser.add_argument("--out", type=Path, required=True, help="folder for tasks.jsonl, repos/")
    parser.add_argument("-l", "--language", action="append", choices=LANGUAGES, default=[])
    parser.add_argument("-p", "--program", action="append", default=[], help="program name")
    args = parser.parse_args(argv)
    only = {p.lower() for p in args.program}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tasks.jsonl").write_text("")
    with tempfile.TemporaryDirectory() as scratch:
        root = checkout(args.source, Path(scratch) / "quixbugs")
        skipped: list[str] = []
        for language in args.language or list(LANGUAGES):
            skipped += convert_language(root, language, only, args.out)
    for line in skipped:
        say(f"skipped {line}")
    count = sum(1 for _ in (args.out / "tasks.jsonl").open())
    say(f"{count} converted, {len(skipped)} skipped")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main())
