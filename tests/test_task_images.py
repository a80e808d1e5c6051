"""Task images (crl_worker.sandbox.images, `crl tasks images`) built with the real engine of
tests/fixtures/docker.py, from Debian base images the tests make themselves, and the Docker
sandbox's verdicts on them against the local sandbox's: the bundled suite (gold resolves, no
patch does not) and the Java fixture, whose Maven build runs offline in its container."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from crl_worker.harness.check import check_tasks
from crl_worker.sandbox.images import (
    DEFAULT_BASES,
    WARM_PATCH,
    ImageBuildError,
    TaskImageBuilder,
    environment_dockerfile,
    environment_layer,
    instance_dockerfile,
    maven_warm,
)
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task

from .fixtures.cli import crl
from .fixtures.docker import (
    JAVA_PACKAGES,
    POLYGLOT_PACKAGES,
    POLYGLOT_SUITE,
    DockerEngine,
    debian_image,
)
from .fixtures.paths import ROOT
from .fixtures.repos import java_repo

SUITE = ROOT / "examples" / "suites" / "mini" / "tasks.jsonl"
POLYGLOT = ROOT / "examples" / "suites" / "polyglot" / "tasks.jsonl"


def _sandbox(engine: DockerEngine) -> dict[str, object]:
    # The default network (none): what the tests need must be in the image.
    return {"type": "docker", "base_url": engine.host, "pull": "never"}


def _suite() -> list[Task]:
    return load_tasks(SUITE, "task").tasks


def test_recipes_follow_the_local_sandbox() -> None:
    task = _suite()[2]  # intervals-1: an install command
    assert task.install
    recipe = instance_dockerfile("parent:1", task)
    lines = recipe.splitlines()
    assert lines[:3] == ["FROM parent:1", f"COPY repo/ {task.workdir}/", f"WORKDIR {task.workdir}"]
    # Each install command is one step, run by bash as written (exec form: no re-parsing).
    runs = [json.loads(line[4:]) for line in lines if line.startswith("RUN ")]
    assert runs == [["/bin/bash", "-c", command] for command in task.install]
    env = environment_dockerfile("toolchain:1", task)
    assert "ENV PATH=/opt/crl/venv/bin:$PATH" in env


def test_java_tests_that_arrive_with_the_test_patch_warm_maven_and_leave_no_trace(
    tmp_path: Path,
) -> None:
    """Surefire fetches its JUnit provider only for a build that has tests: a Java task whose
    tests come with its test patch warms Maven with the patch applied, then restores the tree
    and deletes the patch in that same step (QuixBugs' Java programs ran offline with every
    test missing before)."""
    java = java_repo(tmp_path).task
    assert java.test_patch.strip()
    steps = instance_dockerfile("parent:1", java).splitlines()
    warm = next(json.loads(line[4:])[2] for line in steps if WARM_PATCH in line and "RUN" in line)
    assert f"COPY {WARM_PATCH} /tmp/{WARM_PATCH}" in steps
    assert warm.startswith(f"git apply --whitespace=nowarn /tmp/{WARM_PATCH} && rm -f /tmp/")
    assert warm.endswith("git checkout -q -- . && git clean -fdxq && exit $rc")
    plain = instance_dockerfile("parent:1", java.model_copy(update={"test_patch": ""}))
    assert WARM_PATCH not in plain and "-Dmaven.test.failure.ignore=true test" in plain
    # The warm run builds as the tests will: the test command's properties (a Defects4J
    # record's Java 17 options), not its selection.
    command = "mvn -B -q test -Dmaven.compiler.source=8 -Djacoco.skip=true -Dtest={tests}"
    d4j = java.model_copy(update={"test": java.test.model_copy(update={"command": command})})
    warm = maven_warm(d4j)
    assert "-Dmaven.compiler.source=8 -Djacoco.skip=true test" in warm and "-Dtest" not in warm


def test_compiled_languages_and_javascript_get_their_tools_checked(tmp_path: Path) -> None:
    """Go, Rust, C++ and JavaScript have default bases; their environment layer names a missing
    tool and the ``--base`` option; JavaScript's gets the local sandboxes' Jest install
    copied in, whose lock is part of the layer's identity (a new lock makes a new layer)."""
    tasks = {t.language: t for t in load_tasks(POLYGLOT, "polyglot").tasks}
    assert set(tasks) == {"go", "rust", "cpp", "javascript"}
    assert all(language in DEFAULT_BASES for language in tasks)
    cpp = environment_dockerfile("toolchain:1", tasks["cpp"])
    assert "apt-get install -y -qq --no-install-recommends cmake make g++" in cpp
    assert "(--base cpp=...)" in cpp
    js = environment_layer("crl", "toolchain:1", tasks["javascript"], jest=tmp_path)
    assert js.files == tmp_path and len(js.identity) == 64
    assert "COPY repo/ /opt/crl/jest/" in js.dockerfile
    assert "ENV NODE_PATH=/opt/crl/jest/node_modules" in js.dockerfile
    with pytest.raises(ImageBuildError, match="needs Jest"):
        environment_layer("crl", "toolchain:1", tasks["javascript"])
    go = environment_layer("crl", "toolchain:1", tasks["go"])
    assert go.files is None and "for t in go;" in go.dockerfile


def test_bundled_suite_gives_the_local_verdicts(
    docker_engine: DockerEngine, docker_base: str
) -> None:
    tasks = _suite()
    builder = TaskImageBuilder(docker_engine.client(), bases={"python": docker_base})
    built = asyncio.run(builder.build_all(tasks, jobs=2))
    assert [r.error for r in built] == [None] * len(tasks)
    # Unchanged inputs: every layer is found by its content tag.
    again = asyncio.run(builder.build_all(tasks, jobs=2))
    assert [(r.image, r.built) for r in again] == [(r.image, []) for r in built]

    with_images = [
        t.model_copy(update={"image": r.image}) for t, r in zip(tasks, built, strict=True)
    ]
    checks = asyncio.run(check_tasks(with_images, sandbox_config=_sandbox(docker_engine), jobs=2))
    verdicts = {c.instance_id: (c.gold_verdict, c.no_patch_verdict, c.problems) for c in checks}
    assert verdicts == {t.instance_id: ("resolved", "unresolved", []) for t in tasks}


def test_java_fixture_resolves_in_its_container(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    base = debian_image(docker_engine, JAVA_PACKAGES)
    task = java_repo(tmp_path).task
    builder = TaskImageBuilder(docker_engine.client(), bases={"java": base})
    built = asyncio.run(builder.build(task))
    assert built.ok, built.error
    task = task.model_copy(update={"image": built.image})
    [check] = asyncio.run(check_tasks([task], sandbox_config=_sandbox(docker_engine)))
    assert (check.gold_verdict, check.no_patch_verdict, check.problems) == (
        "resolved",
        "unresolved",
        [],
    )


def test_a_failing_step_names_the_task_and_the_others_still_build(
    docker_engine: DockerEngine, docker_base: str
) -> None:
    good = _suite()[0]
    bad = good.model_copy(
        update={"instance_id": "crl-mini__broken-1", "install": ["echo fetching; exit 3"]}
    )
    builder = TaskImageBuilder(docker_engine.client(), bases={"python": docker_base})
    broken, fine = asyncio.run(builder.build_all([bad, good]))
    assert fine.ok
    assert broken.image is None and broken.error is not None
    assert broken.error.startswith("crl-mini__broken-1: the instance image failed at step")
    assert "echo fetching; exit 3" in broken.error  # the step, as written
    assert "fetching" in broken.error.splitlines()[-1] or "fetching" in broken.error


def test_a_base_image_that_cannot_be_had_is_a_clear_error(docker_engine: DockerEngine) -> None:
    # No registry answers here: the pull fails, and says so, instead of hanging.
    builder = TaskImageBuilder(
        docker_engine.client(), bases={"python": "crl-test/no-such-base:1"}, network="none"
    )
    result = asyncio.run(asyncio.wait_for(builder.build(_suite()[0]), timeout=120))
    assert not result.ok
    assert result.error is not None
    assert result.error.startswith("crl-mini__iniconf-1: the toolchain image failed")
    assert "crl-test/no-such-base" in result.error


def test_cli_writes_the_tasks_with_their_images(
    docker_engine: DockerEngine, docker_base: str, tmp_path: Path
) -> None:
    out = tmp_path / "with-images.jsonl"
    result = crl(
        "tasks", "images", str(SUITE), "--instance", "crl-mini__lrukit-1",
        "--base", f"python={docker_base}", "--docker-host", docker_engine.host,
        "--out", str(out), "--output", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    [summary] = [json.loads(line) for line in result.stdout.splitlines()]
    [task] = [json.loads(line) for line in out.read_text().splitlines()]
    assert task["instance_id"] == summary["instance_id"] == "crl-mini__lrukit-1"
    assert task["image"] == summary["image"]
    assert task["image"].startswith("crl-task/crl-mini__lrukit-1:")


def test_cli_engine_down_is_one_message(tmp_path: Path) -> None:
    result = crl("tasks", "images", str(SUITE), "--docker-host", f"unix://{tmp_path}/none.sock")
    assert result.returncode == 1
    assert "cannot reach the Docker engine" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("value", ["python", "=img", "python="])
def test_cli_refuses_a_malformed_base(value: str) -> None:
    result = crl("tasks", "images", str(SUITE), "--base", value)
    assert result.returncode == 2
    assert "LANGUAGE=IMAGE" in result.stderr


def test_bench_gold_in_docker_resolves_the_suite(
    docker_engine: DockerEngine, docker_base: str, tmp_path: Path
) -> None:
    with_images = tmp_path / "tasks.jsonl"
    built = crl(
        "tasks", "images", str(SUITE), "--base", f"python={docker_base}",
        "--docker-host", docker_engine.host, "--out", str(with_images), "--jobs", "2",
        timeout=900,  # the first build on a fresh machine: Go, Rust, C++ and Jest layers
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    sandbox = json.dumps(_sandbox(docker_engine))
    result = crl(
        "bench", str(ROOT / "examples" / "local-benchmark-mini.yaml"), "--agent", "gold",
        "--tasks", str(with_images), "--sandbox", sandbox, "--results", str(tmp_path / "results"),
        "--jobs", "2", "--output", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert (summary["resolved"], summary["total"], summary["errored"]) == (8, 8, 0), summary


def test_polyglot_suite_resolves_with_gold_in_docker(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    """The bundled Go, Rust, C++ and JavaScript exercises in their images (Jest copied in from
    the local sandboxes' shared install), graded in containers with no network:
    ``crl bench`` with the gold agent resolves all 8, as the local sandboxes do."""
    base = debian_image(docker_engine, POLYGLOT_PACKAGES, suite=POLYGLOT_SUITE)
    with_images = tmp_path / "tasks.jsonl"
    bases = [arg for lang in ("go", "rust", "cpp", "javascript")
             for arg in ("--base", f"{lang}={base}")]  # fmt: skip
    built = crl(
        "tasks", "images", str(POLYGLOT), "-f", "polyglot", *bases,
        "--docker-host", docker_engine.host, "--out", str(with_images), "--jobs", "2",
        timeout=900,  # the first build on a fresh machine: Go, Rust, C++ and Jest layers
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    result = crl(
        "bench", str(ROOT / "examples" / "local-benchmark-polyglot.yaml"), "--agent", "gold",
        "--tasks", str(with_images), "--sandbox", json.dumps(_sandbox(docker_engine)),
        "--results", str(tmp_path / "results"), "--jobs", "2", "--output", "json",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert (summary["resolved"], summary["total"], summary["errored"]) == (8, 8, 0), summary
