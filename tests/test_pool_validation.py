"""A pool that validates its tasks before serving them (RolloutPool ``spec.validation``): the
gateway checks the mini suite's task and a broken copy on its own (local) sandboxes, holds lease
requests meanwhile, serves only the valid task, reports counts and reasons, writes
``quarantine.json``, and a second gateway takes every verdict from the cache. A trainer and a
benchmark runner on such a pool sample only the tasks it serves: the quarantined one is left
out with its reason, never leased (a 404 would be an infrastructure failure)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from pydantic import ValidationError

from crl_worker.api.common import PoolSettings
from crl_worker.api.progress import PoolProgress
from crl_worker.bench.config import BenchTasksError, read_benchmark
from crl_worker.bench.setup import prepare_benchmark
from crl_worker.harness.validate import QUARANTINE_FILE, TaskVerdict, ValidationReport
from crl_worker.pool.client import GatewayClient, GatewayError
from crl_worker.pool.config import GatewayConfig
from crl_worker.pool.gateway import Gateway
from crl_worker.pool.leases import SandboxPool
from crl_worker.pool.metrics import PoolMetrics
from crl_worker.pool.server import make_app
from crl_worker.pool.serving import TaskGate
from crl_worker.pool.slots import PoolBusy, UnknownInstance
from crl_worker.pool.validation import progress_report
from crl_worker.rollout.served import served_tasks
from crl_worker.rollout.setup import RolloutSetupError
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.runtime import Engine
from crl_worker.train.settings import resolve_settings
from crl_worker.train.tasklist import load_tasks
from crl_worker.train.trainer import TrainingJob

from .fixtures.trainer import manifest
from .fixtures.validation import BROKEN_PROBLEM, MINI_SUITE, cache_verdicts, good_and_broken

BENCHMARK = MINI_SUITE.parents[2] / "local-benchmark-mini.yaml"


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


def _trainer_tasks(tmp_path: Path, tasks_file: Path, pool_url: str, name: str) -> list[str]:
    """The instance ids a trainer on the pool at ``pool_url`` samples from (its dataset)."""
    config = manifest(tmp_path, tmp_path / name, name=name, tasks={"path": str(tasks_file)})
    settings = resolve_settings(config, output=tmp_path / name / "run", pool_url=pool_url)
    job = TrainingJob(settings, load_tasks(settings))
    try:
        job.engine.call(job._start_services())
        return list(job.task_order)
    finally:
        job.engine.call(job._stop_services())
        job.engine.close()


def test_a_trainer_and_a_benchmark_on_a_validating_pool_use_only_its_served_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    good, broken = good_and_broken()
    # The verdicts of the test above, from the cache: the pool validates without a test run.
    cache_verdicts(tmp_path / "cache", good, broken)
    both, only_broken = tmp_path / "both.jsonl", tmp_path / "broken.jsonl"
    both.write_text("".join(t.model_dump_json() + "\n" for t in (good, broken)))
    only_broken.write_text(broken.model_dump_json() + "\n")
    engine = Engine()  # the gateway runs on a loop of its own, as in its own pod
    gateway = Gateway(_config(tmp_path), [good, broken])
    engine.call(gateway.start())
    try:
        url = f"http://127.0.0.1:{gateway.port}"
        monkeypatch.setenv("CRL_POOL_TOKEN", gateway.token)
        # The trainer waits for the pool's verdicts, then samples only the served task.
        assert _trainer_tasks(tmp_path, both, url, "train") == [good.instance_id]

        # A benchmark through the pool: the quarantined task is excluded with its reason (in
        # the results folder's quarantine.json), not run and counted as errored or unresolved.
        setup = prepare_benchmark(
            read_benchmark(BENCHMARK),
            agent="gold",
            tasks_file=both,
            results=tmp_path / "results",
            pool_url=url,
        )
        assert [t.instance_id for t in setup.tasks] == [good.instance_id]
        assert setup.validation is not None
        assert [v.instance_id for v in setup.validation.quarantined] == [broken.instance_id]
        outcome, _ = setup.run()
        summary = outcome.summary
        assert (summary["total"], summary["resolved"], summary["errored"]) == (1, 1, 0)
        assert summary["quarantined"] == 1
        listed = json.loads((tmp_path / "results" / QUARANTINE_FILE).read_text())
        assert listed["reasons"] == {"resolved without the fix": 1}
        assert listed["tasks"][0]["problems"] == [BROKEN_PROBLEM]

        # Nothing left to serve: both stop at once with the reason, before any rollout.
        with pytest.raises(
            TrainConfigError, match=r"every one of the 1 tasks.*resolved without the fix"
        ):
            _trainer_tasks(tmp_path, only_broken, url, "none")
        with pytest.raises(
            BenchTasksError, match=r"every one of the 1 tasks.*resolved without the fix"
        ):
            prepare_benchmark(
                read_benchmark(BENCHMARK),
                agent="gold",
                tasks_file=only_broken,
                results=tmp_path / "none",
                pool_url=url,
            )
    finally:
        engine.call(gateway.stop())
        engine.close()


def test_clients_wait_for_the_verdicts_and_learn_the_quarantined_tasks() -> None:
    """``GET /v1/tasks`` on a real server: held while validating (a client may stop waiting),
    then the served count and the quarantined tasks with their problems, or the failure."""
    good, broken = good_and_broken()
    verdict = TaskVerdict(broken.instance_id, "d" * 64, ok=False, problems=[BROKEN_PROBLEM])

    def no_sandbox(task: Task, sandbox_id: str) -> Sandbox:
        raise AssertionError("nothing is leased here")

    async def scenario() -> None:
        pool = SandboxPool(
            [good, broken], no_sandbox, metrics=PoolMetrics("gate"), max_sandboxes=1, warm=0
        )
        gate = TaskGate(pool)
        gate.hold("the pool validates its 2 tasks")
        runner = web.AppRunner(make_app(pool, "local", token="t", gate=gate))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with GatewayClient(f"http://127.0.0.1:{port}", token="t") as client:
                held = await client.tasks()
                assert (held.state, held.served, held.quarantined) == ("validating", 0, [])
                with pytest.raises(GatewayError, match="'wait' must be a number"):
                    await client.tasks(wait=-1)
                stopping = served_tasks(client, [good, broken], stopped=lambda: True, poll=0.01)
                assert await stopping is None
                waiting = asyncio.create_task(served_tasks(client, [good, broken], poll=30))
                await asyncio.sleep(0)
                gate.serve(ValidationReport(valid=[good], quarantined=[verdict]))
                served = await waiting
                assert served is not None and served.tasks == [good]
                assert [(q.instance_id, q.problems) for q in served.quarantined] == [
                    (broken.instance_id, [BROKEN_PROBLEM])
                ]
                assert served.report().reasons() == {"resolved without the fix": 1}
                assert (await client.tasks()).served == 1
                gate.fail("validating the pool's tasks failed (boom)")
                with pytest.raises(RolloutSetupError, match=r"serves no task.*\(boom\)"):
                    await served_tasks(client, [good])
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


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
