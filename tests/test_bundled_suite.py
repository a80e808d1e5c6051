"""The bundled mini suite (``examples/suites/mini``) and git bundles as task sources.

The suite is what the README's first command runs, so it is checked the way a benchmark's
curators check theirs: its files match their sources, the manifest loads every instance from any
working directory, and in real local sandboxes the gold patch resolves every instance while no
patch resolves none. The bundle tests build small repositories of their own.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from crl_worker.api.common import TaskSource
from crl_worker.api.resources import Benchmark
from crl_worker.api.validation import load_resources
from crl_worker.errors import SandboxError
from crl_worker.harness.check import check_tasks
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.sandbox.repos import is_bundle, resolve_source
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task, TestSpec
from crl_worker.tasks.sources import load_source

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "suites" / "mini"
MANIFEST = ROOT / "examples" / "local-benchmark-mini.yaml"

#: Every instance of the suite, as its README lists them.
INSTANCES = {
    "crl-mini__intervals-1",
    "crl-mini__intervals-2",
    "crl-mini__slugkit-1",
    "crl-mini__slugkit-2",
    "crl-mini__iniconf-1",
    "crl-mini__iniconf-2",
    "crl-mini__lrukit-1",
    "crl-mini__lrukit-2",
}

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args],
        cwd=repo,
        env={**os.environ, **_GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _build_script(suite: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(suite / "build.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _suite_tasks() -> list[Task]:
    (benchmark,) = load_resources(MANIFEST)
    assert isinstance(benchmark, Benchmark)
    loaded = load_source(benchmark.spec.suite.tasks, base_dir=MANIFEST.parent)
    assert loaded.ok, loaded.errors
    return loaded.tasks


# --- the suite's files -------------------------------------------------------------------------


def test_checked_in_files_match_their_sources() -> None:
    done = _build_script(SUITE, "--check")
    assert done.returncode == 0, done.stderr
    assert "4 repositories, 8 instances" in done.stdout


def test_check_finds_stale_files(tmp_path: Path) -> None:
    """A changed source makes the JSONL stale; a bundle of other commits is stale too."""
    copy = tmp_path / "mini"
    shutil.copytree(SUITE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    fix = copy / "src" / "lrukit" / "1-get-recency" / "fix.patch"
    added = "+        self._data.move_to_end(key)\n"
    assert added in fix.read_text(encoding="utf-8")
    fix.write_text(
        fix.read_text(encoding="utf-8").replace(added, added.replace("\n", "  # a change\n"))
    )
    shutil.copyfile(copy / "repos" / "iniconf.bundle", copy / "repos" / "slugkit.bundle")
    done = _build_script(copy, "--check")
    assert done.returncode == 1
    assert "tasks.jsonl does not match the sources" in done.stderr
    assert "repos/slugkit.bundle does not match the sources" in done.stderr
    assert "repos/lrukit.bundle does not match the sources" in done.stderr
    assert "iniconf.bundle" not in done.stderr
    # Building brings them back in line; the check then rebuilds from scratch and finds the
    # same commit ids in the bundles the build wrote (the build is deterministic).
    built = _build_script(copy)
    assert built.returncode == 0, built.stderr
    assert "wrote repos/lrukit.bundle" in built.stdout
    assert "iniconf.bundle" not in built.stdout  # unchanged bundles are left alone
    assert _build_script(copy, "--check").returncode == 0


def test_a_patch_that_does_not_apply_names_itself(tmp_path: Path) -> None:
    """A test patch whose context the tree does not hold stops the build with the patch's name."""
    copy = tmp_path / "mini"
    shutil.copytree(SUITE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    tests_patch = copy / "src" / "slugkit" / "2-accents" / "tests.patch"
    text = tests_patch.read_text(encoding="utf-8")
    context = next(line for line in text.splitlines() if line.startswith(" ") and line.strip())
    tests_patch.write_text(
        text.replace(context, context + " # not in the tree", 1), encoding="utf-8"
    )
    done = _build_script(copy, "--check")
    assert done.returncode == 2
    assert "src/slugkit/2-accents/tests.patch does not apply" in done.stderr
    assert "Traceback" not in done.stderr


def test_manifest_loads_every_instance_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the task file's relative sources must not depend on this
    tasks = _suite_tasks()
    assert {t.instance_id for t in tasks} == INSTANCES
    assert len(tasks) == len(INSTANCES)
    for task in tasks:
        assert task.source is not None
        bundle = Path(task.source)
        assert bundle.is_absolute() and bundle.parent == SUITE / "repos", task.source
        assert is_bundle(bundle)
        assert task.fail_to_pass and task.pass_to_pass and task.problem_statement
        assert not set(task.fail_to_pass) & set(task.pass_to_pass)
    frameworks = {t.test.log_format for t in tasks}
    assert frameworks == {"pytest", "unittest"}
    # Two instances per repository, at different points of its history.
    by_repo: dict[str, set[str]] = {}
    for task in tasks:
        by_repo.setdefault(task.repo, set()).add(task.base_commit)
    assert len(by_repo) == 4 and all(len(commits) == 2 for commits in by_repo.values())


async def test_gold_resolves_every_instance_and_no_patch_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``crl tasks check`` on the suite, in real local sandboxes, with a cache of its own."""
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    tasks = _suite_tasks()
    results = await check_tasks(
        tasks, jobs=2, sandbox_config={"type": "local", "root": str(tmp_path)}
    )
    for task, found in zip(tasks, results, strict=True):
        assert found.ok, (found.instance_id, found.problems)
        assert found.warnings == [], (found.instance_id, found.warnings)
        assert (found.gold_verdict, found.no_patch_verdict) == ("resolved", "unresolved")
        (gold,) = found.gold
        (none,) = found.no_patch
        # Every listed test was found under its exact id: the lists match the runners' output.
        assert [o.name for o in gold.fail_to_pass] == task.fail_to_pass
        assert [o.name for o in gold.pass_to_pass] == task.pass_to_pass
        assert all(o.status is TestStatus.PASSED for o in [*gold.fail_to_pass, *gold.pass_to_pass])
        assert all(o.status is not TestStatus.PASSED for o in none.fail_to_pass)
        assert all(o.status is TestStatus.PASSED for o in none.pass_to_pass)
    # The bundles went through the clone cache, one bare mirror per repository.
    mirrors = sorted(p.name for p in (tmp_path / "cache" / "repos").glob("*.git"))
    assert mirrors == [
        "crl-mini__iniconf.git",
        "crl-mini__intervals.git",
        "crl-mini__lrukit.git",
        "crl-mini__slugkit.git",
    ]


# --- git bundles as task sources ------------------------------------------------------------


@pytest.fixture
def history(tmp_path: Path) -> dict[str, str]:
    """A repository with two commits, an ``old`` bundle holding only the first and a ``new``
    bundle holding both; returns the paths and commit ids."""
    repo = tmp_path / "origin"
    repo.mkdir()
    _git(repo, "init", "--quiet", "--initial-branch=main")
    (repo / "notes.txt").write_text("first\n")
    _git(repo, "add", "notes.txt")
    _git(repo, "commit", "--quiet", "-m", "first")
    first = _git(repo, "rev-parse", "HEAD")
    _git(repo, "branch", "old")
    (repo / "notes.txt").write_text("second\n")
    _git(repo, "commit", "--quiet", "-am", "second")
    second = _git(repo, "rev-parse", "HEAD")
    old, new = tmp_path / "old.bundle", tmp_path / "new.pack-of-history"
    _git(repo, "bundle", "create", "--quiet", str(old), "old")
    _git(repo, "bundle", "create", "--quiet", str(new), "main")
    return {"old": str(old), "new": str(new), "first": first, "second": second}


def _task(source: str, base_commit: str) -> Task:
    return Task(
        instance_id="crl-tests__notes-1",
        repo="crl-tests/notes",
        base_commit=base_commit,
        source=source,
        language="other",  # nothing to provision: the test is about the clone
        test=TestSpec(command="true {tests}", log_format="pytest"),
    )


async def test_bundle_is_cached_then_fetched_again_for_a_newer_base_commit(
    tmp_path: Path, history: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    config = {"type": "local", "root": str(tmp_path)}
    async with create_sandbox(config, _task(history["old"], history["first"])) as sandbox:
        assert await sandbox.read_file("notes.txt") == b"first\n"
    mirror = tmp_path / "cache" / "repos" / "crl-tests__notes.git"
    assert mirror.is_dir()
    # The cached mirror lacks the second commit: the (other) bundle is fetched into it. The
    # file name does not matter: a bundle is known by its first line.
    async with create_sandbox(config, _task(history["new"], history["second"])) as sandbox:
        assert await sandbox.read_file("notes.txt") == b"second\n"
        result = await sandbox.run("git log --all --format=%H")
        assert result.output.split() == [history["second"], history["first"]]
    assert _git(mirror, "rev-parse", "refs/heads/main") == history["second"]


async def test_bundle_without_the_base_commit_is_a_clear_sandbox_error(
    tmp_path: Path, history: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    task = _task(history["old"], history["second"])
    with pytest.raises(SandboxError) as caught:
        async with create_sandbox({"type": "local", "root": str(tmp_path)}, task):
            pass
    message = str(caught.value)
    assert f"base commit {history['second']} is not in the git bundle" in message
    assert history["old"] in message and "rebuild" in message
    assert not list(tmp_path.glob("crl-*")), "the failed sandbox's folder was left behind"


def test_a_file_that_is_not_a_bundle_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "repo.bundle"
    text.write_text("not a bundle\n")
    with pytest.raises(SandboxError, match="is a file but not a git bundle"):
        resolve_source(_task(str(text), "0" * 40))
    with pytest.raises(SandboxError, match="neither a URL nor an existing directory"):
        resolve_source(_task(str(tmp_path / "missing.bundle"), "0" * 40))


def test_relative_sources_are_resolved_against_the_task_file(
    tmp_path: Path, history: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = tmp_path / "suite"
    (suite / "repos").mkdir(parents=True)
    shutil.copyfile(history["old"], suite / "repos" / "notes.bundle")
    sources = {
        "a": "repos/notes.bundle",
        "b": "https://example.org/notes.git",
        "c": "git@example.org:notes.git",
        "d": str(tmp_path / "elsewhere"),
        "e": "~/notes",
    }
    lines = [
        _task(source, history["first"]).model_copy(update={"instance_id": key}).model_dump_json()
        for key, source in sources.items()
    ]
    (suite / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_tasks(Path("..") / "suite" / "tasks.jsonl", "task")
    got = {t.instance_id: t.source for t in loaded.tasks}
    assert got == {**sources, "a": str(suite.resolve() / "repos" / "notes.bundle")}
    assert resolve_source(loaded.tasks[0]) == str(suite.resolve() / "repos" / "notes.bundle")


def test_relative_sources_of_a_downloaded_task_file_are_left_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task file fetched by URL lies in the download cache: its relative sources meant the
    URL's folder, so they are not pointed into the cache."""
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SUITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/tasks.jsonl"
        loaded = load_source(TaskSource.model_validate({"url": url, "format": "task"}))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert {t.instance_id for t in loaded.tasks} == INSTANCES
    assert {t.source for t in loaded.tasks} == {
        f"repos/{lib}.bundle" for lib in ("iniconf", "intervals", "lrukit", "slugkit")
    }


async def test_sandboxes_cloning_one_bundle_at_once_share_one_mirror(
    tmp_path: Path, history: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first clone of a bundle into the cache is serialised by its file lock: the others
    wait for it and clone from the finished mirror (a shared `.partial` would collide)."""
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    task = _task(history["new"], history["second"])
    sandboxes = [create_sandbox({"type": "local", "root": str(tmp_path)}, task) for _ in range(4)]
    await asyncio.gather(*(sandbox.start() for sandbox in sandboxes))
    try:
        contents = await asyncio.gather(*(sb.read_file("notes.txt") for sb in sandboxes))
        assert contents == [b"second\n"] * 4
    finally:
        await asyncio.gather(*(sandbox.close() for sandbox in sandboxes))
    repos = tmp_path / "cache" / "repos"
    assert sorted(p.name for p in repos.iterdir()) == [
        "crl-tests__notes.git",
        "crl-tests__notes.lock",
    ]
