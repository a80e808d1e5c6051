"""The benchmark runner with spares (``crl bench --spares``): the integrity check of a resolved
episode takes the pristine sandbox that started beside it (crl_worker/agent/pristine.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crl_worker.agent.gold import GoldPolicy
from crl_worker.api.common import AgentSpec
from crl_worker.bench.runner import BenchmarkRunner
from crl_worker.rollout.results import ResultsStore
from crl_worker.rollout.setup import Sandboxes
from crl_worker.tasks.model import Task
from tests.fixtures.repos import python_task, unittest_task

IDENTITY = {"suite": "fixtures", "model": "gold", "agent": {"maxTurns": 5}}


async def test_the_check_takes_the_spare_started_beside_the_episode(tmp_path: Path) -> None:
    tasks = [python_task(tmp_path / "repos"), unittest_task(tmp_path / "repos")]
    factory = Sandboxes.make(None).factory
    order: list[str] = []

    def sandbox(task: Task) -> Any:
        order.append(task.instance_id)
        return factory(task)

    store = ResultsStore(tmp_path / "results")
    store.open(IDENTITY)
    runner = BenchmarkRunner(
        tasks,
        agent=AgentSpec(max_turns=5),
        store=store,
        policy_factory=GoldPolicy,
        sandbox_factory=sandbox,
        suite="fixtures",
        model="gold",
        parallelism=1,
        spares=True,
    )
    outcome = await runner.run()
    assert outcome.summary["resolved"] == 2
    # Each episode: its own sandbox and the spare, which its integrity check takes, started
    # with the episode (without spares, the check starts one once the episode's is closed).
    assert order == [t.instance_id for t in tasks for _ in range(2)]
    assert runner.spares is not None
    assert (runner.spares.hits, runner.spares.misses) == (2, 0)
    lines = [json.loads(line) for line in store.results_file.read_text().splitlines()]
    assert [r["resolved"] for r in lines] == [True, True]
