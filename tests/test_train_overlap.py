"""Overlap of rollouts with training (crl_worker.train.overlap): the plan of the next batches and
the staleness bound, without a trainer (the trained path: tests/test_train_server.py)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

from crl_worker.train.overlap import BatchPlan, PlannedSampler, Producer, fresh_enough


class Seeded:
    """A sampler whose epochs differ (as TRL's seeded RepeatSampler's do): 0..n-1 rotated."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.drawn = 0

    def __iter__(self) -> Any:
        shift = self.drawn
        self.drawn += 1
        return iter([(i + shift) % self.n for i in range(self.n)])

    def __len__(self) -> int:
        return self.n


PROMPTS = [f"task-{i}" for i in range(8)]


def plan(rank: int = 0, world: int = 1, per_rank: int = 2, every: int = 1) -> BatchPlan:
    return BatchPlan(PlannedSampler(Seeded(8)), PROMPTS, rank, world, per_rank, every)


def producer(bound: int, started: list[tuple[list[str], int, int]]) -> Producer:
    def start(prompts: list[str], version: int, step: int) -> concurrent.futures.Future[Any]:
        started.append((prompts, version, step))
        return concurrent.futures.Future()

    return Producer(plan(), bound, start=start)


@pytest.mark.parametrize(
    ("version", "step", "bound", "fresh"),
    [(3, 3, 0, True), (2, 3, 0, False), (2, 3, 1, True), (1, 3, 1, False), (1, 3, 2, True)],
)
def test_fresh_enough(version: int, step: int, bound: int, fresh: bool) -> None:
    assert fresh_enough(version, step, bound) is fresh


def test_the_plan_cuts_each_ranks_batches_as_the_dataloader_does() -> None:
    # Per-process batches go to the ranks in turn; one generation every `every` batches.
    assert plan(rank=0, world=2).epoch_batches(0) == [["task-0", "task-1"], ["task-4", "task-5"]]
    assert plan(rank=1, world=2).epoch_batches(0) == [["task-2", "task-3"], ["task-6", "task-7"]]
    assert plan(every=2).epoch_batches(0) == [["task-0", "task-1"], ["task-4", "task-5"]]
    # Later epochs come from the same sampler, drawn ahead in order; the dataloader then gets
    # exactly the orders the plan saw.
    whole = plan()
    assert whole.batch(4) == ["task-1", "task-2"]
    assert list(whole.sampler) == list(range(8))
    assert list(whole.sampler) == [1, 2, 3, 4, 5, 6, 7, 0]


def test_batches_older_than_the_bound_are_run_again_never_handed_out() -> None:
    started: list[tuple[list[str], int, int]] = []
    made = producer(1, started)
    assert made.take(["task-0", "task-1"], step=0) is None  # nothing ran ahead yet
    assert made.fill(step=0, version=0, total_steps=10) == 1
    # The batch of step 1 (0-based, as TRL counts), started on version 0.
    assert started == [(["task-2", "task-3"], 0, 1)]
    # Step 1 on version 1: the batch from version 0 lags one version, within the bound.
    got = made.take(["task-2", "task-3"], step=1)
    assert got is not None and got.version == 0
    # The push of version 2 failed: the server still holds 1, and step 2's batch starts there...
    made.fill(step=1, version=1, total_steps=10)
    assert started[-1] == (["task-4", "task-5"], 1, 2)
    ahead = made.ahead[2].future
    # ... and at step 3 it lags two versions: dropped (cancelled, counted), never handed out.
    made.position = 2
    assert made.take(["task-4", "task-5"], step=3) is None
    assert ahead.cancelled()
    assert made.dropped_stale == 2 and made.hits == 1


def test_an_unplanned_batch_drops_what_ran_ahead_and_resyncs() -> None:
    started: list[tuple[list[str], int, int]] = []
    made = producer(2, started)
    made.take(["task-0", "task-1"], step=0)
    made.fill(step=0, version=0, total_steps=10)
    assert [(p, s) for p, _, s in started] == [(["task-2", "task-3"], 1), (["task-4", "task-5"], 2)]
    # TRL skipped a batch (as on a resume): the one started for it is dropped, the next kept.
    assert made.take(["task-4", "task-5"], step=1) is not None
    assert made.dropped_unplanned == 2 and made.position == 3
    # Nothing is started past the last step.
    assert made.fill(step=8, version=1, total_steps=10) == 1
    assert made.fill(step=9, version=1, total_steps=10) == 0
