"""A pool that validates its tasks before serving them (RolloutPool ``spec.validation``): the
gateway checks the mini suite's task and a broken copy on its own (local) sandboxes, holds lease
requests meanwhile, serves only the valid task, reports counts and reasons, writes
``quarantine.json``, and a second gateway takes every verdict from the cache."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from crl_worker.api.common import PoolSettings
from crl_worker.api.progress import PoolProgress
from crl_worker.harness.validate import QUARANTINE_FILE, TaskVerdict
from crl_worker.pool.config import GatewayConfig
from crl_worker.pool.gateway import Gateway
from crl_worker.pool.slots import PoolBusy, UnknownInstance
from crl_worker.pool.validation import progress_report
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

from .fixtures.validation import good_and_broken


def _config(tmp_path: Path) -> GatewayConfig:
    settings = PoolSettings.model_validate(
        {"replicas": 0, "maxSandboxes": 2, "validation": {"enabled": True, "runs": 1}}
    )
    return GatewayConfig(
        pool="mini", backend="local", port=0, local_root=tmp_path / "sandboxes", settings=settings
    )


def test_the_pool_serves_only_the_tasks_that_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    good, broken = good_and_broken()
    reports: list[PoolProgress] = []

    async def publish(report: PoolProgress) -> None:
        reports.append(report)

    # The seam the cluster fills with the progress ConfigMap's publisher.
    monkeypatch.setattr("crl_worker.pool.gateway.publisher_from_env", lambda config: publish)

    async def first() -> None:
        async with Gateway(_config(tmp_path), [good, broken]) as gateway:
            assert gateway.pool is not None
            # While it validates, a lease request waits (here until its short timeout).
            with pytest.raises(PoolBusy, match="validates its 2 tasks"):
                await gateway.pool.acquire(good.instance_id, timeout=0.05)
            await gateway.wait_validated()
            assert list(gateway.pool.tasks) == [good.instance_id]
            with pytest.raises(UnknownInstance, match=r"quarantined.*resolved without the fix"):
                await gateway.pool.acquire(broken.instance_id, timeout=1)

    asyncio.run(first())
    last = reports[-1]
    assert last.finished and (last.total, last.validated, last.quarantined) == (2, 2, 1)
    assert last.reasons == {"resolved without the fix": 1}
    assert [(t.instance_id, t.reason) for t in last.tasks] == [
        (broken.instance_id, "resolved without the fix")
    ]
    listed = json.loads((tmp_path / "cache" / "quarantine" / "mini" / QUARANTINE_FILE).read_text())
    assert [t["instance_id"] for t in listed["tasks"]] == [broken.instance_id]

    # A restarted gateway pays nothing: every verdict comes from the cache, no sandbox is made.
    def no_sandbox(task: Task, sandbox_id: str) -> Sandbox:
        raise AssertionError(f"a sandbox was made for {task.instance_id}")

    async def second() -> None:
        async with Gateway(_config(tmp_path), [good, broken], factory=no_sandbox) as gateway:
            await gateway.wait_validated()
            assert gateway.validation is not None and gateway.validation.cached == 2
            assert gateway.pool is not None and list(gateway.pool.tasks) == [good.instance_id]

    asyncio.run(second())
    assert reports[-1].finished and reports[-1].cached == 2


def test_a_pool_report_lists_the_first_quarantined_tasks_and_must_add_up() -> None:
    verdicts = [
        TaskVerdict(f"t{i}", "d", ok=False, problems=["t: gold patch not resolved"])
        for i in range(250)
    ] + [TaskVerdict("ok", "d", ok=True)]
    report = progress_report(300, verdicts)
    assert (report.validated, report.quarantined, len(report.tasks)) == (251, 250, 200)
    assert report.reasons == {"gold patch does not resolve": 250}
    wire = report.to_wire()
    assert wire["tasks"][0] == {"instanceId": "t0", "reason": "gold patch does not resolve"}
    with pytest.raises(ValidationError, match="exceeds validated"):
        PoolProgress.model_validate({"total": 3, "validated": 1, "quarantined": 2})
    with pytest.raises(ValueError, match="malformed progress report"):
        PoolProgress.parse('{"total": 1, "validated": 2, "quarantined": 0}')
