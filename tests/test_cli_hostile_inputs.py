"""Usability findings of issue 17 (a new user with hostile inputs), one test each: `crl validate`
with a 5 MB value, the unknown-field message, `--results` where no folder can be made, `crl
compare` on a corrupt file, and a gold patch that does not apply."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import pytest
import yaml

from crl_worker.agent.gold import GoldPolicy, gold_patch_failure
from crl_worker.agent.trajectory import ToolCallRecord, Trajectory, Turn
from crl_worker.rollout.results import ResultsError, ResultsStore, read_results

from .fixtures.paths import EXAMPLES, run


def crl(*args: str, stdin: str | None = None) -> tuple[int, str]:
    """``crl ARGS``: exit code and stdout + stderr."""
    result = run([sys.executable, "-m", "crl_cli", *args], stdin=stdin, timeout=120)
    return result.returncode, result.stdout + result.stderr


def _pool() -> dict[str, object]:
    path = next(p for p in EXAMPLES if p.name == "rolloutpool-swe-gym.yaml")
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def test_validate_does_not_echo_a_huge_value() -> None:
    for where in ("replicas", "notAField"):
        document = _pool()
        spec = document["spec"]
        assert isinstance(spec, dict)
        spec[where] = "x" * 5_000_000
        code, output = crl("validate", "-", stdin=yaml.safe_dump(document))
        assert code == 1
        assert "Traceback" not in output
        assert len(output) < 5_000, f"{where}: {len(output)} characters"


def test_unknown_field_message_separates_the_allowed_fields() -> None:
    document = _pool()
    spec = document["spec"]
    assert isinstance(spec, dict)
    spec["zzz"] = 1  # nothing close: no "did you mean"
    code, output = crl("validate", "-", stdin=yaml.safe_dump(document))
    assert code == 1
    assert "unknown field 'zzz'; allowed fields: " in output


def test_a_results_folder_that_cannot_be_created_is_an_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ResultsError, match="cannot create the results folder"):
        ResultsStore(blocker / "results").open({"suite": "s"})
    manifest = next(p for p in EXAMPLES if p.name == "local-benchmark-mini.yaml")
    code, output = crl(
        "bench", str(manifest), "--agent", "gold", "--results", str(blocker / "results")
    )
    assert code == 2, output
    assert "Traceback" not in output
    assert "cannot create the results folder" in output


def test_compare_on_a_corrupt_file_suggests_nothing_it_lacks(tmp_path: Path) -> None:
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        record = {"instance_id": "i", "repo": "o/r", "attempt": 0, "resolved": True}
        record["exit_reason"] = "submitted"
        (folder / "results.jsonl").write_text(f"not json\n{json.dumps(record)}\n")
    with pytest.raises(ResultsError) as failed:
        read_results(tmp_path / "a")
    assert "--restart" not in str(failed.value)
    code, output = crl("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 2
    assert "corrupt" in output and "--restart" not in output


def _gold(exit_code: int, output: str) -> Trajectory:
    call = ToolCallRecord.model_construct(
        name="shell", arguments="{}", output=output, exit_code=exit_code, error=False
    )
    turn = Turn.model_construct(tool_calls=[call])
    return Trajectory.model_construct(model=GoldPolicy.model, turns=[turn])


def test_a_gold_patch_that_does_not_apply_is_named() -> None:
    assert gold_patch_failure(_gold(0, "Applied patch a.py cleanly.")) is None
    failure = gold_patch_failure(_gold(1, "error: patch failed: a.py:3"))
    assert failure is not None
    assert "did not apply" in failure and "patch failed: a.py:3" in failure
    other = _gold(1, "x").model_copy(update={"model": "qwen"})
    assert gold_patch_failure(other) is None


async def test_crl_bench_gold_warns_when_the_gold_patch_does_not_apply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from crl_worker.api.common import AgentSpec
    from crl_worker.bench.runner import BenchmarkRunner
    from crl_worker.sandbox.config import LocalSandboxConfig
    from crl_worker.sandbox.registry import create_sandbox

    from .fixtures.repos import python_task

    task = python_task(tmp_path / "repos")
    broken = task.model_copy(
        update={"patch": "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n"}
    )
    store = ResultsStore(tmp_path / "out")
    store.open({"suite": "s", "model": "gold"})
    runner = BenchmarkRunner(
        [broken],
        agent=AgentSpec(),
        store=store,
        sandbox_factory=lambda t: create_sandbox(LocalSandboxConfig(root=str(tmp_path / "sb")), t),
        policy_factory=GoldPolicy,
        suite="s",
        model="gold",
    )
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(runner.run(), 300)
    (record,) = read_results(tmp_path / "out")
    assert record.resolved is False
    assert record.error is not None and "gold patch did not apply" in record.error
    assert any("gold patch did not apply" in r.getMessage() for r in caplog.records)
