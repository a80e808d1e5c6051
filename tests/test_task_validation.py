"""Validating tasks before a run (``crl bench --validate``, ``crl train --validate``): the bundled
mini suite with one deliberately broken task, in real local sandboxes; verdicts cached by the
task's content hash; the broken task quarantined with its reason in the results folder."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from crl_worker.bench.config import read_benchmark
from crl_worker.bench.setup import prepare_benchmark
from crl_worker.harness.validate import (
    QUARANTINE_FILE,
    TaskVerdict,
    task_digest,
    validate_tasks,
)
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.validation import drop_quarantined

from .fixtures.forgery import EXPECTING_FAILURE, append_to_package
from .fixtures.validation import good_and_broken

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "local-benchmark-mini.yaml"


def test_mini_suite_with_a_broken_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}
    good, broken = good_and_broken()
    seen: list[TaskVerdict] = []
    report = asyncio.run(
        validate_tasks([good, broken], runs=1, jobs=2, sandbox_config=sandbox, progress=seen.append)
    )
    assert [t.instance_id for t in report.valid] == [good.instance_id]
    (verdict,) = report.quarantined
    assert verdict.instance_id == broken.instance_id and not verdict.cached
    assert verdict.reason == "resolved without the fix"
    assert report.cached == 0 and len(seen) == 2
    cached = sorted(p.stem for p in (tmp_path / "cache" / "validation").glob("*.json"))
    assert cached == sorted(task_digest(t, runs=1, sandbox_config=sandbox) for t in (good, broken))

    # `crl bench --validate`: the verdicts come from the cache (no sandbox runs again), the
    # broken task is left out of the run and listed with its reason in the results folder.
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(t.model_dump_json() + "\n" for t in (good, broken)))
    setup = prepare_benchmark(
        read_benchmark(MANIFEST),
        agent="gold",
        tasks_file=tasks_file,
        results=tmp_path / "results",
        sandbox=sandbox,
        validate_runs=1,
    )
    try:
        assert [t.instance_id for t in setup.tasks] == [good.instance_id]
        assert setup.validation is not None and setup.validation.cached == 2
    finally:
        setup.close()
    listed = json.loads((tmp_path / "results" / QUARANTINE_FILE).read_text())
    assert (listed["validated"], listed["valid"], listed["quarantined"]) == (2, 1, 1)
    assert listed["reasons"] == {"resolved without the fix": 1}
    assert listed["tasks"][0]["instance_id"] == broken.instance_id
    assert "resolved without the fix" in listed["tasks"][0]["problems"][0]

    # `crl train --validate` hands the trainer the same file: every process drops the same task.
    kept = drop_quarantined([good, broken], tmp_path / "results" / QUARANTINE_FILE)
    assert [t.instance_id for t in kept] == [good.instance_id]


def test_a_gold_patch_that_fails_the_integrity_check_is_quarantined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gold patch the plain check resolves but the integrity check does not (here one that
    forges the run from the package: every correct answer to such a task would be graded 0)
    is quarantined, unless validation is told not to grade gold patches that way."""
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    good, _ = good_and_broken()
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}

    async def forged_patch() -> str:
        async with create_sandbox(sandbox, good) as made:
            done = await made.run(append_to_package("iniconf", EXPECTING_FAILURE))
            assert done.exit_code == 0, done.output
            return await made.diff()

    forged = good.model_copy(
        update={"instance_id": "crl-mini__iniconf-1-forged", "patch": asyncio.run(forged_patch())}
    )
    report = asyncio.run(validate_tasks([forged], sandbox_config=sandbox))
    (verdict,) = report.quarantined
    assert verdict.reason == "gold patch fails the integrity check", verdict.problems
    assert "graded 0" in verdict.problems[0]
    assert not asyncio.run(validate_tasks([forged], sandbox_config=sandbox)).valid  # cached
    plain = asyncio.run(validate_tasks([forged], sandbox_config=sandbox, integrity=False))
    assert [t.instance_id for t in plain.valid] == [forged.instance_id]


def test_an_error_of_the_integrity_run_is_not_a_verdict() -> None:
    """A sandbox or harness failure in the gold patch's integrity run is transient (not cached,
    counted as a harness error), unlike the run's finding that the gold patch fails there."""
    from crl_worker.harness.check import InstanceCheck
    from crl_worker.harness.validate import _transient, reason_kind

    failed = "gold through the integrity check: error: the sandbox did not start"
    assert _transient(InstanceCheck(instance_id="x", problems=[failed]))
    assert reason_kind(failed) == "harness error"
    found = "gold through the integrity check: not resolved (canary tests that must fail did not)"
    assert not _transient(InstanceCheck(instance_id="x", problems=[found]))
    assert reason_kind(found) == "gold patch fails the integrity check"


def test_a_changed_task_is_validated_again(tmp_path: Path) -> None:
    """The cache key is the task's content (not its id, nor its metadata), the runs and the
    sandbox's kind; a forged or mismatched cache file is ignored."""
    good, _ = good_and_broken()
    digest = task_digest(good)
    assert task_digest(good.model_copy(update={"metadata": {"note": 1}})) == digest
    assert task_digest(good.model_copy(update={"patch": good.patch + "\n"})) != digest
    assert task_digest(good, runs=3) != digest
    assert task_digest(good, sandbox_config={"type": "docker"}) != digest
    assert task_digest(good, integrity=False) != digest
    assert task_digest(good, sandbox_config={"type": "local", "root": "/x"}) == task_digest(
        good, sandbox_config={"type": "local", "root": "/y"}
    )
    # A task without a gold patch is judged without a sandbox: "no gold patch". A cached
    # verdict that does not match its file name is ignored; one that does is used.
    bare = good.model_copy(update={"patch": ""})
    key = task_digest(bare)
    cache = tmp_path / "v"
    cache.mkdir()
    verdict = {"instance_id": bare.instance_id, "ok": True, "problems": [], "flaky": []}
    (cache / f"{key}.json").write_text(json.dumps({**verdict, "digest": "0" * 64}))
    forged = asyncio.run(validate_tasks([bare], cache=cache))
    assert forged.cached == 0 and forged.quarantined[0].reason == "no gold patch"
    (cache / f"{key}.json").write_text(json.dumps({**verdict, "digest": key}))
    trusted = asyncio.run(validate_tasks([bare], cache=cache))
    assert trusted.cached == 1 and trusted.valid == [bare]
    with pytest.raises(TrainConfigError, match=r"not a quarantine\.json"):
        drop_quarantined([good], cache / f"{key}.json")
