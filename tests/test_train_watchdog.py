"""The weight-sync watchdog in a real LoRA training run: the trainer and the toy inference server
(tests/fixtures/toy_server.py, a real model over real HTTP) each in its own process, the server
given faults on chosen adapter loads.

One run meets all three: a load that hangs (the push's deadline passes; the push is retried), a
load the server answers but does not do (it serves the wrong version; the check after the push
notices and loads it again), and a load whose weights the server scrambles (the right name,
the wrong weights: only the trainer-vs-server logprob gap tells; the weights are pushed again).
Each shows as a WeightSync finding in the logs and the status, each is followed by the recovery,
and no batch is rolled out on a version the server does not hold. A second run whose every push
hangs stops with a clear message instead of training on stale weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.fixtures.toy_training import BASE, chats, trajectories

from .fixtures.lora_run import RUN, SUBPROCESS_ENV, write_run
from .fixtures.paths import ROOT
from .fixtures.toy_server import ToyServerProcess, read_request_log

pytestmark = pytest.mark.train

#: Seconds a push may take here (a toy adapter loads in well under a second; each hung push
#: waits this long, four times in this module).
DEADLINE = "5"
#: The gap threshold here: the toy server's logprobs match the trainer's to float noise.
GAP = "0.01"


def train(
    config: Path, out: Path, server: ToyServerProcess, steps: int
) -> subprocess.CompletedProcess[str]:
    """``python -m crl_worker.train`` against the server, with the watchdog's limits set."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "crl_worker.train",
            "--config",
            str(config),
            "--output",
            str(out),
            "--url",
            server.base_url,
            "--model",
            BASE,
            "--steps",
            str(steps),
        ],
        cwd=ROOT,
        env={
            **SUBPROCESS_ENV,
            "CRL_PUSH_DEADLINE_SECONDS": DEADLINE,
            "CRL_MAX_LOGPROB_GAP": GAP,
        },
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def findings(stderr: str) -> list[tuple[str, bool]]:
    """The watchdog's (reason, ok) log events, in order."""
    out = []
    for line in stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "train.weight_sync":
            out.append((record["reason"], record["ok"]))
    return out


def test_a_hang_a_lost_version_and_wrong_weights_are_found_and_recovered(
    serve: Any, suite: Path, tmp_path: Path
) -> None:
    # Loads: 1 = v1 (hangs), 2 = v1 again, 3 = v2 (not done), 4 = v2 again, 5 = v3 (scrambled),
    # 6 = v4.
    server = serve("--fault", "1:hang", "--fault", "3:drop", "--fault", "5:scramble")
    out = tmp_path / "out"
    config = write_run(tmp_path, Path(server.model_dir), suite, max_staleness=0)
    done = train(config, out, server, steps=5)
    assert done.returncode == 0, done.stderr[-6000:]
    assert findings(done.stderr) == [
        ("PushTimedOut", False),
        ("Recovered", True),
        ("WrongVersion", False),
        ("Recovered", True),
        ("LogprobGap", False),
        ("Recovered", True),
    ], done.stderr[-6000:]
    assert f"did not finish within {DEADLINE} s" in done.stderr

    log = read_request_log(tmp_path / "requests.jsonl")
    loads = [
        r for r in log if r.get("path") == "/v1/load_lora_adapter" and r.get("fault") != "hang"
    ]
    # The hung request answers (a 503) long after its deadline, if ever: the rest in order.
    assert [(r["lora_name"], r["status"], r.get("fault")) for r in loads] == [
        (f"{RUN}-v1", 200, None),
        (f"{RUN}-v2", 200, "drop"),
        (f"{RUN}-v2", 200, None),
        (f"{RUN}-v3", 200, "scramble"),
        (f"{RUN}-v4", 200, None),
    ]
    # Never a batch on a version the server did not hold: each step's chats name the version
    # that was checked before them, and all of them were answered.
    for step, name in ((2, f"{RUN}-v1"), (3, f"{RUN}-v2"), (5, f"{RUN}-v4")):
        records = trajectories(out, step)
        assert {r["policy_version"] for r in records} == {step - 1}
        assert {r["trajectory"]["model"] for r in records} == {name}
        assert all(r["reward"] is not None for r in records)
    assert {r["status"] for r in chats(log)} == {200}

    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gaps = [m["trl"]["sampling/sampling_logp_difference/mean"] for m in metrics]
    # The scrambled v3 served step 4: its gap is far above the threshold, the others under it.
    assert gaps[3] > float(GAP) and max(gaps[:3] + gaps[4:]) < float(GAP), gaps
    # Pushes are counted with the step they preceded (the hung one and its retry for step 2).
    assert [m["weight_pushes"] for m in metrics] == [0, 2, 1, 1, 1]
    assert metrics[1]["push_seconds"] >= float(DEADLINE)
    status = json.loads((out / "status.json").read_text())
    assert status["finished"] and status["policyVersion"] == 4
    assert status["weightSync"]["ok"] is True and status["weightSync"]["reason"] == "Recovered"
    assert "LogprobGap" in status["weightSync"]["message"]


def test_pushes_that_keep_hanging_stop_the_run_with_the_reason(
    serve: Any, suite: Path, tmp_path: Path
) -> None:
    server = serve(*(arg for n in range(1, 4) for arg in ("--fault", f"{n}:hang")))
    out = tmp_path / "out"
    config = write_run(tmp_path, Path(server.model_dir), suite, max_staleness=0)
    done = train(config, out, server, steps=3)
    assert done.returncode == 1
    assert findings(done.stderr) == [("PushTimedOut", False)] * 3
    # Step 1 trained on the base weights; step 2 never rolled out on them as if they were v1.
    assert not list((out / "trajectories").glob("step-000002*"))
    status = json.loads((out / "status.json").read_text())
    assert status["phase"] == "Failed" and status["step"] == 1
    assert "failed 3 times" in status["message"]
    assert status["weightSync"] == {
        "ok": False,
        "reason": "PushTimedOut",
        "message": f"pushing version 1 failed: the push did not finish within {DEADLINE} s",
    }


# --- the watchdog's rules on their own ----------------------------------------------------------


def test_the_limits_come_from_the_environment_and_bad_values_keep_the_defaults() -> None:
    from crl_worker.train.watchdog import MAX_LOGPROB_GAP, PUSH_DEADLINE, Watchdog

    set_ = Watchdog({"CRL_PUSH_DEADLINE_SECONDS": "30", "CRL_MAX_LOGPROB_GAP": "0.05"})
    assert (set_.push_deadline, set_.max_gap) == (30.0, 0.05)
    for bad in ("soon", "0", "-1", "nan", "inf"):
        kept = Watchdog({"CRL_PUSH_DEADLINE_SECONDS": bad, "CRL_MAX_LOGPROB_GAP": bad})
        assert (kept.push_deadline, kept.max_gap) == (PUSH_DEADLINE, MAX_LOGPROB_GAP), bad
    assert Watchdog({}).check_every == 0
    assert Watchdog({"CRL_WEIGHT_CHECK_EVERY": "5"}).check_every == 5
    assert Watchdog({"CRL_WEIGHT_CHECK_EVERY": "often"}).check_every == 0
    assert Watchdog({}).gap({"sampling/sampling_logp_difference/mean": 0.2}) == 0.2
    assert Watchdog({}).gap({"loss": 1.0}) is None


def test_problems_in_a_row_are_counted_until_a_step_is_in_sync() -> None:
    from crl_worker.train.watchdog import MAX_RECOVERIES, Watchdog

    dog = Watchdog({})
    assert dog.in_sync(1).reason == "InSync"
    dog.problem("LogprobGap", "gap 0.2")
    state = dog.in_sync(2)
    assert state.ok and state.reason == "Recovered" and "LogprobGap: gap 0.2" in state.message
    assert dog.in_sync(3).reason == "Recovered"  # stays, so the status shows what happened
    for _ in range(MAX_RECOVERIES - 1):
        dog.problem("LogprobGap", "gap 0.2")  # the gap persists after each push again
    assert not dog.exhausted()
    dog.problem("LogprobGap", "gap 0.2")
    assert dog.exhausted()
    dog.in_sync(4)
    dog.step_done()  # a step in sync starts the count over
    assert dog.problems == 0 and not dog.exhausted()
