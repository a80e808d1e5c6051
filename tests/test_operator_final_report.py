"""A Benchmark or TrainingRun says Succeeded only with its worker's last report in its status.

The Job's completion and the worker's last write to its progress ConfigMap reach the operator
as two watch events, in either order. Before, the resource said Succeeded at the Job's event,
so whoever read it then (``kubectl wait --for=condition=Succeeded``, then the status) could see
the progress of the report before the last (the in-cluster gold benchmark read 3 of 8 done).
Now it waits for the last report (``finished: true``), for at most
:data:`~crl_operator.reports.FINAL_REPORT_GRACE` from the Job's completion, and is reconciled
again when the wait ends; its runner Job's TTL does not start the deletion while it waits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest

from crl_operator.cache import Cache
from crl_operator.kinds.base import Context, Subject
from crl_operator.kinds.benchmark import BenchmarkKind
from crl_operator.kinds.progress import ProgressReports
from crl_operator.reports import FINAL_REPORT_GRACE, final_report_requeue
from crl_operator.status import Observed, benchmark_status, trainingrun_status
from crl_worker.api import Benchmark

from .fixtures.status_objects import T0, children, job_with, load, run_model

#: When the Job completed in these tests (the job controller's completionTime).
DONE = T0.isoformat().replace("+00:00", "Z")


def _conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {x["type"]: (x["status"], x["reason"]) for x in status["conditions"]}


def _bench() -> Benchmark:
    doc = load("benchmark-swe-bench-verified-baseline.yaml")
    doc["spec"]["ttlSecondsAfterFinished"] = 5
    return Benchmark.model_validate(doc)


def _job(resource: Any, outcome: str = "Complete") -> dict[str, Any]:
    job = next(k for k in children(resource, inference_ready=True) if k["kind"] == "Job")
    return job_with(job, conditions=[{"type": outcome, "status": "True"}], completionTime=DONE)


def _report(done: int, finished: bool) -> dict[str, Any]:
    return {"total": 8, "done": done, "resolved": done, "errored": 0, "finished": finished}


def test_a_benchmark_waits_for_the_runners_last_report() -> None:
    bench = _bench()
    job = _job(bench)
    early = benchmark_status(
        bench, Observed(children=(job,), report=_report(3, False)), None, T0 + timedelta(seconds=1)
    )
    got = _conds(early)
    assert got["Succeeded"] == ("False", "AwaitingReport")
    assert got["Failed"] == ("False", "AwaitingReport")
    assert got["Ready"] == ("False", "AwaitingReport")
    assert early["progress"]["summary"] == "3/8"
    assert early["completionTime"] == DONE
    # Reconciled again when the wait ends, if the report's event does not come first.
    assert final_report_requeue(early, T0 + timedelta(seconds=1)) == FINAL_REPORT_GRACE

    last = benchmark_status(
        bench, Observed(children=(job,), report=_report(8, True)), early, T0 + timedelta(seconds=2)
    )
    assert _conds(last)["Succeeded"] == ("True", "JobSucceeded")
    assert _conds(last)["Ready"] == ("True", "Reconciled")
    assert last["progress"]["summary"] == "8/8" and last["resolveRate"] == 1.0
    assert final_report_requeue(last, T0) is None


def test_the_wait_ends_without_the_report_and_never_holds_back_a_failure() -> None:
    bench = _bench()
    late = T0 + timedelta(seconds=FINAL_REPORT_GRACE + 1)
    stale = Observed(children=(_job(bench),), report=_report(3, False))
    assert _conds(benchmark_status(bench, stale, None, late))["Succeeded"][0] == "True"
    # A runner of which no report was read (it publishes none) is not waited for.
    quiet = Observed(children=(_job(bench),))
    assert _conds(benchmark_status(bench, quiet, None, T0))["Succeeded"][0] == "True"
    failed = Observed(children=(_job(bench, "Failed"),), report=_report(3, False))
    assert _conds(benchmark_status(bench, failed, None, T0))["Failed"] == ("True", "JobFailed")


@pytest.mark.parametrize(("finished", "succeeded"), [(False, "False"), (True, "True")])
def test_a_trainingrun_waits_for_the_trainers_last_report(finished: bool, succeeded: str) -> None:
    run = run_model()
    report = {"step": 199 + finished, "totalSteps": 200, "finished": finished}
    status = trainingrun_status(run, Observed(children=(_job(run),), report=report), None, T0)
    assert _conds(status)["Succeeded"][0] == succeeded
    assert status["step"] == 199 + finished


def test_the_runner_job_outlives_its_ttl_while_the_benchmark_waits() -> None:
    bench = _bench()
    job = _job(bench)
    cache = Cache()
    cache.upsert(job)
    now = T0 + timedelta(seconds=10)  # past the TTL of 5 s, within the grace
    ctx = Context(cache, cast(Any, None), cast(Any, None), ProgressReports(cache), lambda: now)
    kind = BenchmarkKind(ctx)
    uid = str(bench.metadata.uid)
    waiting = benchmark_status(
        bench, Observed(children=(job,), report=_report(3, False)), None, now
    )
    subject = Subject(("Benchmark", "team-repair", "b"), bench, uid, waiting)
    assert kind.ttl_remaining(bench, uid, waiting) is None
    assert kind.requeue_after(subject, waiting) == FINAL_REPORT_GRACE - 10 + 1
    done = benchmark_status(bench, Observed(children=(job,), report=_report(8, True)), waiting, now)
    ttl = kind.ttl_remaining(bench, uid, done)
    assert ttl is not None and ttl < 0  # the Job goes at the next reconcile
    # A Job gone while the Benchmark waited (deleted by hand) is still a finished one: the
    # render does not start the runner again, and the wait is over.
    assert kind.finished("no-such-uid", waiting) == (True, DONE)
    gone = benchmark_status(bench, Observed(), waiting, now)
    assert _conds(gone)["Succeeded"] == ("True", "JobSucceeded")
    assert _conds(gone)["Ready"] == ("True", "Reconciled")
    assert (gone["completionTime"], gone["progress"]["summary"]) == (DONE, "3/8")
