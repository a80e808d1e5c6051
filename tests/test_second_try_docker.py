"""The second try (``agent.tries: 2``) in Docker sandboxes: the first try is graded in a
container of its own, the second continues in the agent's, where the hidden tests never were."""

from __future__ import annotations

from crl_worker.sandbox.images import TaskImageBuilder

from .fixtures.docker import DockerEngine
from .fixtures.second_try import (
    LOOK_FOR_THE_TESTS,
    TwoTries,
    apply_patch_command,
    two_try_episode,
)
from .fixtures.task_types import IMPLEMENT, suite_tasks


async def test_the_second_try_in_docker_sees_the_failures_not_the_tests(
    docker_engine: DockerEngine, docker_base: str
) -> None:
    """The implement suite's first task in its image: the stub submitted first is graded
    unresolved in another container; the second try, shown the failures, finds no trace of the
    hidden tests in its own container, applies the reference, and is resolved and confirmed."""
    task = suite_tasks(IMPLEMENT / "tasks.jsonl")[0]
    client = docker_engine.client()
    try:
        (built,) = await TaskImageBuilder(client, bases={"python": docker_base}).build_all([task])
    finally:
        client.close()
    assert built.ok, built.error
    task = task.model_copy(update={"image": built.image})
    policy = TwoTries((), (LOOK_FOR_THE_TESTS, apply_patch_command(task.patch)), "NotImplemented")
    config = {"type": "docker", "base_url": docker_engine.host, "pull": "never"}
    trajectory, made = await two_try_episode(task, policy, config)
    assert [t.exit_reason for t in trajectory.tries] == ["submitted", "submitted"]
    first = trajectory.tries[0].evaluation
    assert first is not None and not first.resolved and first.tampered is None
    assert trajectory.evaluation is not None and trajectory.evaluation.resolved
    assert trajectory.evaluation.confirmed is True
    assert "NotImplementedError" in (policy.shown or "")
    looked = trajectory.turns[trajectory.tries[1].first_turn].tool_calls[0].output
    assert looked.split()[-4:] == ["0", "0", "0", "0"], looked
    # The agent's container, the first try's and the confirmation's: three sandboxes.
    assert made >= 3
