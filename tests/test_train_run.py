"""The trainer for real on the CPU: a tiny model the tests build (no downloads), GRPO through
TRL over local sandboxes on the toy repair task, in separate processes as a user runs it.

What is checked: the model learns (mean reward of the last steps clearly above the first),
parameters change, environment tokens stay out of what TRL trains on, checkpoints rotate and
resume to the same step, SIGTERM writes a checkpoint and resumes, an infrastructure failure is
left out rather than scored 0, DeepSpeed ZeRO-3 really shards the parameters across two
processes, and configs the trainer cannot honour fail before any training with the field named.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from crl_worker.sandbox.base import Sandbox  # noqa: E402
from crl_worker.tasks.model import Task  # noqa: E402
from crl_worker.train.errors import TrainConfigError  # noqa: E402
from crl_worker.train.settings import resolve_settings  # noqa: E402

from .fixtures.ports import free_port  # noqa: E402
from .fixtures.trainer import (  # noqa: E402
    ShortRuns,
    checkpoints,
    env,
    manifest,
    metrics,
    train,
    trajectories,
    weights,
)

pytestmark = pytest.mark.train


# --- learning, masking, checkpoints -------------------------------------------------------------


def test_grpo_learns_the_toy_repair_and_records_every_step(toy_files: Path, tmp_path: Path) -> None:
    config = manifest(
        toy_files,
        tmp_path,
        # 16 rollouts a step: with 8, an unlucky run can collapse onto a wrong action (every
        # group all-zero, so no gradient) — seeds 1-3 all reach >= 0.94 with 16 by step 12.
        # 6 steps: this seed's steps 1-3 average 0.29, steps 4-6 0.85 (the in-process run is
        # deterministic: 0.19, 0.31, 0.38, 0.81, 0.81, 0.94; 2026-11-29).
        algorithm={"steps": 6, "learningRate": 0.02, "numGenerations": 16},
        checkpoints={"everySteps": 3, "keepLast": 2},
    )
    out = tmp_path / "out"
    done = train(config, out)
    assert done.returncode == 0, done.stderr[-4000:]
    records = metrics(out)
    assert [r["step"] for r in records] == list(range(1, 7))
    rewards = [r["reward_mean"] for r in records]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    # Untrained, the toy model resolves about one rollout in four; GRPO drives it up.
    assert last >= first + 0.4 and last >= 0.75, rewards

    # Parameters changed.
    before, after = weights(toy_files / "model"), weights(out / "final")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) >= len(before) // 2

    # Environment tokens are not trained: TRL's count of completion tokens (those its loss
    # mask keeps) is exactly the model-sampled tokens, fewer than the completion holds.
    for record in records[:3]:
        lines = trajectories(out, record["step"])
        assert len(lines) == 16
        sampled = [
            sum(len(t["completion_token_ids"]) for t in line["trajectory"]["turns"])
            for line in lines
        ]
        assert record["trl"]["completions/mean_length"] == pytest.approx(
            sum(sampled) / len(sampled)
        )
        prompts = [line["trajectory"]["turns"][-1]["prompt_tokens"] for line in lines]
        first_prompt = [line["trajectory"]["turns"][0]["prompt_tokens"] for line in lines]
        whole = [p - f + s for p, f, s in zip(prompts, first_prompt, sampled, strict=True)]
        assert sum(whole) > sum(sampled)  # there were environment tokens in between

    # Checkpoints every 3 steps, the last 2 kept; the status says where the run is.
    assert checkpoints(out) == ["checkpoint-3", "checkpoint-6"]
    # ... under the names Benchmarks and resumeFrom use.
    assert (out / "latest").resolve() == (out / "checkpoint-6").resolve()
    assert sorted(p.name for p in out.glob("step-*")) == ["step-3", "step-6"]
    status = json.loads((out / "status.json").read_text())
    assert status["step"] == 6 and status["finished"] and status["phase"] == "Succeeded"
    assert status["lastCheckpoint"]["step"] == 6 and status["lastCheckpoint"]["path"] == "step-6"
    assert status["metrics"]["rewardMean"] == rewards[-1]


def _sampled(output: Path, step: int) -> list[tuple[Any, ...]]:
    """Each rollout of a step: its attempt, every token the model sampled, its reward."""
    return sorted(
        (
            line["trajectory"]["attempt"],
            [t for turn in line["trajectory"]["turns"] for t in turn["completion_token_ids"]],
            line["reward"],
        )
        for line in trajectories(output, step)
    )


def test_the_same_seed_gives_the_same_run(short_runs: ShortRuns) -> None:
    # In-process sampling has a generator per rollout, seeded from the spec's seed, the step,
    # the rank and the rollout: the episodes may interleave differently, the run does not.
    # The two short runs (tests/fixtures/trainer.py) are one config run twice.
    runs = [short_runs.terminal, short_runs.piped_out]
    assert short_runs.terminal_status == 0 and short_runs.piped.returncode == 0
    for step in (1, 2):
        first, second = (_sampled(out, step) for out in runs)
        assert len(first) == 4 and first == second
    assert [r["loss"] for r in metrics(runs[0])] == [r["loss"] for r in metrics(runs[1])]


def test_resume_continues_from_the_last_checkpoint(short_runs: ShortRuns, tmp_path: Path) -> None:
    # A copy of the short run on the terminal (`crl train`, a checkpoint every step, two kept).
    out = tmp_path / "out"
    shutil.copytree(short_runs.terminal, out, symlinks=True)
    assert checkpoints(out) == ["checkpoint-1", "checkpoint-2"]
    # A crash after step 2 was logged but before its checkpoint was written.
    shutil.rmtree(out / "checkpoint-2")
    done = train(short_runs.config, out, "--steps", "3")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "resuming from" in done.stderr and "checkpoint-1" in done.stderr
    # Step 2 was run again and logged once; the run went on to step 3.
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert checkpoints(out) == ["checkpoint-2", "checkpoint-3"]
    assert (out / "latest").resolve().name == "checkpoint-3"


def test_sigterm_writes_a_checkpoint_and_the_run_resumes(toy_files: Path, tmp_path: Path) -> None:
    config = manifest(
        toy_files,
        tmp_path,
        algorithm={"steps": 40, "numGenerations": 4},
        checkpoints={"everySteps": 100, "keepLast": 2},
    )
    out = tmp_path / "out"
    log = (tmp_path / "trainer.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "crl_worker.train", "--config", str(config), "--output", str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env(),
    )
    try:
        deadline = time.monotonic() + 300
        while len(metrics(out)) < 2 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
        assert len(metrics(out)) >= 2, (tmp_path / "trainer.log").read_text()[-3000:]
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=180) == 143
    finally:
        if child.poll() is None:
            child.kill()
        log.close()
    done = max(r["step"] for r in metrics(out))
    assert checkpoints(out) == [f"checkpoint-{done}"]
    status = json.loads((out / "status.json").read_text())
    assert status["phase"] == "Stopped" and status["step"] == done and not status["finished"]
    resumed = train(config, out, "--steps", str(done + 1))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert [r["step"] for r in metrics(out)][-1] == done + 1


# --- infrastructure failures --------------------------------------------------------------------


class _FailingStart(Sandbox):
    """A sandbox whose start fails, as a pod that never comes up."""

    def __init__(self, task: Task) -> None:
        self.task = task

    async def start(self) -> None:
        raise OSError("injected: the sandbox pod never became ready")

    async def close(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def test_an_infrastructure_failure_is_left_out_not_scored_zero(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In this process: every other sandbox of the batch fails to start (fault injection around
    # the real local sandboxes of the in-process pool).
    from crl_worker.train.__main__ import load_tasks
    from crl_worker.train.trainer import TrainingJob

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    config = manifest(toy_files, tmp_path, algorithm={"steps": 1}, checkpoints={"everySteps": 5})
    settings = resolve_settings(config, output=tmp_path / "out")
    tasks = load_tasks(settings)

    class Job(TrainingJob):
        async def _start_services(self) -> None:
            await super()._start_services()
            assert self.runner is not None
            real: Callable[[Task], Sandbox] = self.runner.sandbox_factory
            calls = iter(range(1_000))

            def flaky(task: Task) -> Sandbox:
                return _FailingStart(task) if next(calls) % 2 else real(task)

            self.runner.sandbox_factory = flaky

    assert Job(settings, tasks).run() == 0
    (record,) = metrics(settings.run_dir)
    assert record["infrastructure_failures"] == 4 and record["rollouts"] == 8
    lines = trajectories(settings.run_dir, 1)
    failed = [line for line in lines if line["reward"] is None]
    scored = [line["reward"] for line in lines if line["reward"] is not None]
    assert len(failed) == 4
    assert all(line["trajectory"]["exit_reason"] == "infrastructure_error" for line in failed)
    assert record["reward_mean"] == pytest.approx(sum(scored) / 4)
    # TRL's own reward mean is over the scored rollouts only: a failure counted as 0 would
    # have pulled it to sum(scored) / 8.
    assert record["trl"]["reward"] == pytest.approx(sum(scored) / 4)


def test_a_step_whose_every_rollout_failed_is_retried_then_fails_the_run(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The infrastructure is down: nothing to learn from, so no optimizer step may happen (its
    # momentum would still move the weights); the batch is tried again, then the run fails.
    from crl_worker.errors import InfrastructureError
    from crl_worker.train.__main__ import load_tasks
    from crl_worker.train.trainer import BATCH_ATTEMPTS, TrainingJob

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    config = manifest(toy_files, tmp_path, algorithm={"steps": 2, "numGenerations": 4})
    settings = resolve_settings(config, output=tmp_path / "out")

    class Job(TrainingJob):
        async def _start_services(self) -> None:
            await super()._start_services()
            assert self.runner is not None
            self.runner.sandbox_factory = _FailingStart

    with pytest.raises(InfrastructureError, match="every rollout failed"):
        Job(settings, load_tasks(settings)).run()
    out = settings.run_dir
    assert metrics(out) == [] and checkpoints(out) == []
    failed = sorted(p.name for p in (out / "trajectories").glob("step-000001.failed*"))
    assert len(failed) == BATCH_ATTEMPTS
    status = json.loads((out / "status.json").read_text())
    assert status["phase"] == "Failed" and "every rollout failed" in status["message"]


# --- DeepSpeed ZeRO-3 across two processes ------------------------------------------------------


def test_zero3_shards_the_parameters_across_two_processes(toy_files: Path, tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    config = manifest(
        toy_files,
        tmp_path,
        algorithm={"numGenerations": 4},
        trainer={"deepspeed": {"zeroStage": 3}},
        checkpoints={"everySteps": 2},
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "crl_worker.train",
            "--config",
            str(config),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    held = [line for line in done.stderr.splitlines() if "parameter values" in line]
    assert len(held) == 2, done.stderr[-3000:]
    for rank in (0, 1):
        assert any(f"rank {rank} of 2 holds" in line and "(50.0%)" in line for line in held)
    # Each rank's rollouts are logged, and the DeepSpeed checkpoint holds one shard per rank.
    assert len(trajectories(out, 2)) == 4
    shards = sorted(p.name for p in (out / "checkpoint-2" / "global_step2").iterdir())
    assert any("rank_0" in name for name in shards) and any("rank_1" in name for name in shards)
    # DeepSpeed's CPU all-reduce kernel was not compiled (build.without_shm_kernel): DeepSpeed
    # prints "deepspeed.ops.comm.deepspeed_shm_comm_op built successfully" when it is.
    assert "deepspeed_shm_comm" not in done.stdout + done.stderr, done.stdout[-2000:]


# --- configs that cannot work ---------------------------------------------------------------------


def test_a_lora_rank_above_the_hidden_size_fails_before_training(
    toy_files: Path, tmp_path: Path
) -> None:
    config = manifest(toy_files, tmp_path, algorithm={"lora": {"rank": 128, "alpha": 16}})
    done = train(config, tmp_path / "out", timeout=120)
    assert done.returncode == 2
    assert "spec.algorithm.lora.rank" in done.stderr and "hidden size 64" in done.stderr
    assert "rank 0 of" not in done.stderr  # the model was never loaded for training


def test_crl_train_with_several_processes_still_exits_2_on_a_config_error(
    toy_files: Path, tmp_path: Path
) -> None:
    # torchrun would turn a worker's 2 into 1: crl train checks the config before launching.
    config = manifest(toy_files, tmp_path, algorithm={"numGenerations": 3})
    done = subprocess.run(
        [str(Path(sys.executable).parent / "crl"), "train", str(config), "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env(),
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "spec.algorithm.tasksPerStep" in done.stderr
    assert "torch.distributed" not in done.stderr


def check(config: Path, **kwargs: Any) -> TrainConfigError:
    from crl_worker.train.__main__ import load_tasks
    from crl_worker.train.preflight import preflight

    settings = resolve_settings(config, **kwargs.pop("resolve", {}))
    with pytest.raises(TrainConfigError) as caught:
        preflight(settings, load_tasks(settings), world=kwargs.pop("world", 1))
    return caught.value


def test_preflight_names_the_field(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tp = check(
        manifest(toy_files, tmp_path / "tp", inference={"gpus": 3, "tensorParallelSize": 2}),
        resolve={"output": tmp_path / "tp" / "out"},
    )
    assert tp.field == "spec.inference.tensorParallelSize"

    split = check(
        manifest(toy_files, tmp_path / "split", algorithm={"numGenerations": 3}),
        resolve={"output": tmp_path / "split" / "out"},
        world=2,
    )
    assert split.field == "spec.algorithm.tasksPerStep" and "2 process" in str(split)

    down = check(
        manifest(toy_files, tmp_path / "down", algorithm={"lora": {"rank": 8, "alpha": 16}}),
        resolve={"output": tmp_path / "down" / "out", "url": f"http://127.0.0.1:{free_port()}/v1"},
    )
    assert down.field == "spec.inference" and "does not answer" in str(down)

    cold = check(
        manifest(toy_files, tmp_path / "cold", rollout={"agent": {"temperature": 0.0}}),
        resolve={"output": tmp_path / "cold" / "out"},
    )
    assert cold.field == "spec.rollout.agent.temperature"

    few = check(
        manifest(toy_files, tmp_path / "few", algorithm={"tasksPerStep": 2}),
        resolve={"output": tmp_path / "few" / "out"},
    )
    assert few.field == "spec.algorithm.tasksPerStep" and "only 1" in str(few)

    if importlib.util.find_spec("vllm") is None:
        nccl = check(
            manifest(toy_files, tmp_path / "nccl"),
            resolve={"output": tmp_path / "nccl" / "out", "url": "http://127.0.0.1:1/v1"},
        )
        assert nccl.field == "spec.weightSync" and "vllm" in str(nccl)

    monkeypatch.setenv("CRL_CHECKPOINT_DIR", str(tmp_path / "no-volume" / "checkpoints"))
    volume = check(manifest(toy_files, tmp_path / "volume"))
    assert volume.field == "spec.checkpoints.volume" and "not mounted" in str(volume)
