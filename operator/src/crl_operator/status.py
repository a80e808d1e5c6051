"""Status of each kind, computed from what was observed (pure: no client, no clock).

The reconcile gathers the live children and the worker's progress report from its cache into
an :class:`Observed`, and these functions turn that into the status fields the operator owns.
Fields written by others (the pool gateway's latency figures) are not touched here:
:func:`~crl_operator.patches.status_patch` only sets or removes the keys in
:data:`~crl_operator.patches.OWNED_KEYS`. A report that is
missing or malformed changes nothing it would have said: the status keeps what it recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crl_operator import conditions as c
from crl_operator.admission import Admission
from crl_operator.children import JobState, Obj, component_of, deployment_state, job_state, name_of
from crl_operator.conditions import Cond, cond, merge_conditions, timestamp
from crl_operator.reports import (
    awaiting_final_report,
    benchmark_progress,
    benchmark_results,
    final_report_wait,
    pool_validation,
    trainer_says,
    training_progress,
    validation_condition,
    weight_sync_condition,
)
from crl_worker.api import Benchmark, RolloutPool, TrainingRun
from crl_worker.api.contract import Label, SandboxState

#: Label the pool gateway puts on each sandbox pod: which pool it belongs to.
POOL_LABEL = Label.POOL
#: Label the gateway sets on each sandbox pod: a SandboxState (crl_worker.api.contract).
SANDBOX_STATE_KEY = Label.STATE


@dataclass(frozen=True)
class Problem:
    """Why a reconcile could not do its whole job; becomes the Ready condition."""

    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What a reconcile saw: the live children and the objects the status depends on."""

    children: tuple[Obj, ...] = ()
    """Live children owned by the resource (any kind)."""
    pods: tuple[Obj, ...] = ()
    """Sandbox pods of a RolloutPool (labelled with the pool's name)."""
    pool: Obj | None = None
    """The RolloutPool a TrainingRun or Benchmark uses (owned inline or referenced)."""
    report: Obj | None = None
    """The worker's progress report, validated, as JSON: the runner's of a Benchmark
    (crl_worker.api.progress.ProgressReport), the trainer's of a TrainingRun
    (crl_worker.api.progress.TrainingProgress); None when there is none or it is malformed."""
    problem: Problem | None = None
    """A failure of this reconcile (invalid spec, a child that could not be applied)."""
    admission: Admission | None = None
    """Kueue's admission, for a TrainingRun or Benchmark that names a queue."""

    def of_kind(self, kind: str, component: str | None = None) -> Obj | None:
        """The one child of `kind` (and of `component` when given), or None."""
        for child in self.children:
            if child.get("kind") != kind:
                continue
            if component is not None and component_of(child) != component:
                continue
            return child
        return None


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def pool_ready(pool: Obj | None) -> Cond:
    """SandboxesReady of a TrainingRun or Benchmark, from its RolloutPool's status."""
    if pool is None:
        return cond(c.SANDBOXES_READY, False, c.POOL_MISSING, "the RolloutPool does not exist yet")
    st = pool.get("status") or {}
    ready = c.find(st.get("conditions"), c.READY)
    name = name_of(pool)
    counts = f"{st.get('ready', 0)}/{st.get('desired', '?')} sandboxes ready"
    if ready is not None and ready.get("status") == "True":
        return cond(c.SANDBOXES_READY, True, c.POOL_READY, f"RolloutPool {name}: {counts}")
    if ready is not None and ready.get("reason") == c.VALIDATING:
        return cond(
            c.SANDBOXES_READY, False, c.VALIDATING, f"RolloutPool {name}: {ready.get('message')}"
        )
    return cond(c.SANDBOXES_READY, False, c.POOL_NOT_READY, f"RolloutPool {name}: {counts}")


def _inference(
    dep: Obj | None, *, served: bool, suspended: bool, why: str = "the model is served elsewhere"
) -> Cond:
    if not served:
        return cond(c.INFERENCE_READY, True, c.NOT_SERVED, why)
    if suspended:
        return cond(c.INFERENCE_READY, False, c.SCALED_TO_ZERO, "suspended: inference scaled to 0")
    if dep is None:
        return cond(
            c.INFERENCE_READY, False, c.DEPLOYMENT_MISSING, "the vLLM Deployment does not exist yet"
        )
    ds = deployment_state(dep)
    counts = f"{ds.available}/{ds.desired} replicas available"
    if ds.desired == 0:
        return cond(c.INFERENCE_READY, False, c.SCALED_TO_ZERO, "inference.replicas is 0")
    if ds.ready:
        return cond(c.INFERENCE_READY, True, c.DEPLOYMENT_AVAILABLE, counts)
    return cond(c.INFERENCE_READY, False, c.DEPLOYMENT_PROGRESSING, counts)


def _finished_as(js: JobState | None) -> tuple[bool, bool]:
    """(succeeded, failed) of a Job's state; both False while it runs or does not exist."""
    return js is not None and js.phase == "succeeded", js is not None and js.phase == "failed"


def _awaiting(who: str) -> Problem:
    """Why a resource whose Job succeeded does not say so yet (:func:`final_report_wait`)."""
    return Problem(
        c.AWAITING_REPORT, f"the Job completed; waiting for the {who}'s last progress report"
    )


def _verdict(js: JobState | None, awaiting: Problem | None = None) -> tuple[Cond, Cond]:
    """Succeeded and Failed of a resource whose outcome is its Job's (trainer or runner): both
    give the Job's outcome as their reason once it has one (a failed run's ``Succeeded`` is
    ``False`` because the Job failed, not because it is still in progress); while ``awaiting``
    the worker's last report, both are ``False`` and say so."""
    if awaiting is not None:
        return (
            cond(c.SUCCEEDED, False, awaiting.reason, awaiting.message),
            cond(c.FAILED, False, awaiting.reason, awaiting.message),
        )
    succeeded, failed = _finished_as(js)
    message = js.message if js is not None else ""
    reason = c.JOB_SUCCEEDED if succeeded else c.JOB_FAILED if failed else c.IN_PROGRESS
    return (
        cond(c.SUCCEEDED, succeeded, reason, message if succeeded or failed else ""),
        cond(c.FAILED, failed, reason, message if succeeded or failed else ""),
    )


#: The reason a worker Job's phase gives the condition that follows it (Training, Running).
_PHASE_REASONS = {
    "running": c.JOB_RUNNING,
    "succeeded": c.JOB_SUCCEEDED,
    "failed": c.JOB_FAILED,
    "suspended": c.JOB_SUSPENDED,
}


def _job_phase(
    type_: str,
    js: JobState | None,
    *,
    inference_up: bool,
    who: str,
    running: str | None = None,
    finished: str | None = None,
) -> Cond:
    """The condition ``type_`` that follows the ``who`` Job's phase: true while its pods run
    (``running`` replaces the Job's message then); before the Job exists, waiting for inference
    or for the Job; ``finished`` replaces the reason of both ends when given."""
    if js is None:
        if inference_up:
            return cond(type_, False, c.JOB_MISSING, f"the {who} Job is being created")
        return cond(
            type_, False, c.WAITING_FOR_INFERENCE, f"the {who} starts once inference is ready"
        )
    reason = _PHASE_REASONS.get(js.phase, c.WAITING_FOR_PODS)
    if finished is not None and js.phase in ("succeeded", "failed"):
        reason = finished
    message = running if js.phase == "running" and running else js.message
    return cond(type_, js.phase == "running", reason, message)


def _completion_time(prev: Mapping[str, Any], js: JobState | None, now: datetime) -> str | None:
    """Set once, when the Job is first seen finished; kept after the Job is gone."""
    completion = prev.get("completionTime")
    if completion is None and js is not None and js.phase in ("succeeded", "failed"):
        completion = js.completion_time or timestamp(now)
    return completion


def _ready(problem: Problem | None, parts: Iterable[Cond], ok_message: str) -> Cond:
    """Ready summarizes: a reconcile problem first, then the first condition that does not hold."""
    if problem is not None:
        return cond(c.READY, False, problem.reason, problem.message)
    for part in parts:
        if not part.true:
            return cond(c.READY, False, part.reason, f"{part.type}: {part.message}")
    return cond(c.READY, True, c.RECONCILED, ok_message)


# --- TrainingRun --------------------------------------------------------------------------


#: InferenceReady's and SandboxesReady's message for supervised fine-tuning: both hold at once.
_NO_ROLLOUTS = "algorithm.type is sft: it trains on recorded trajectories, no rollouts run"


def trainingrun_conditions(
    run: TrainingRun, seen: Observed, awaiting_report: bool = False
) -> list[Cond]:
    """Conditions of a TrainingRun from its children (supervised fine-tuning has no server and
    no pool: InferenceReady and SandboxesReady hold, and Ready follows the trainer);
    ``awaiting_report``: its Job succeeded, the trainer's last report has not been read."""
    suspended = run.spec.suspend
    dep = seen.of_kind("Deployment")
    job = seen.of_kind("Job")
    js = job_state(job) if job is not None else None
    sft = run.spec.algorithm.type == "sft"
    served = run.spec.generation == "vllm" and not sft
    inference = _inference(
        dep,
        served=served,
        suspended=suspended,
        why=(
            _NO_ROLLOUTS
            if sft
            else "generation is in-process: the trainer generates from the weights it trains"
        ),
    )
    sandboxes = (
        cond(c.SANDBOXES_READY, True, c.NO_ROLLOUTS, _NO_ROLLOUTS) if sft else pool_ready(seen.pool)
    )
    if js is not None and js.phase in ("succeeded", "failed") and served:
        # A finished run keeps only its config and trainer Job; the rest was removed on purpose.
        if dep is None:
            inference = cond(
                c.INFERENCE_READY, False, c.FINISHED, "the run finished; inference was removed"
            )
        if seen.pool is None:
            sandboxes = cond(
                c.SANDBOXES_READY, False, c.FINISHED, "the run finished; its pool was removed"
            )

    if seen.admission is not None and not (js is not None and js.phase in ("succeeded", "failed")):
        admitted = seen.admission.condition()
    elif js is None:
        admitted = cond(c.ADMITTED, None, c.JOB_MISSING, "the trainer Job does not exist")
    elif js.phase == "suspended":
        admitted = cond(c.ADMITTED, False, c.JOB_SUSPENDED, js.message)
    else:
        admitted = cond(c.ADMITTED, True, c.JOB_CREATED, "the trainer Job is admitted")

    if suspended:
        training = cond(c.TRAINING, False, c.SUSPENDED_BY_USER, "spec.suspend is true")
    else:
        said = trainer_says(seen.report) if js is not None else ""
        training = _job_phase(
            c.TRAINING,
            js,
            inference_up=inference.true,
            who="trainer",
            running=f"{js.message}; {said}" if js is not None and said else None,
        )

    succeeded, failed = _finished_as(js)
    out = [
        inference,
        sandboxes,
        admitted,
        training,
        cond(
            c.SUSPENDED,
            suspended,
            c.SUSPENDED_BY_USER if suspended else c.NOT_SUSPENDED,
            "spec.suspend is true" if suspended else "",
        ),
        *_verdict(js, _awaiting("trainer") if awaiting_report else None),
    ]
    if succeeded and awaiting_report:
        ready = _ready(seen.problem or _awaiting("trainer"), (), "")
    elif succeeded:
        ready = _ready(seen.problem, (), "training finished")
    elif failed and js is not None:
        ready = _ready(seen.problem or Problem(c.JOB_FAILED, js.message), (), "")
    elif suspended:
        ready = _ready(seen.problem or Problem(c.SUSPENDED_BY_USER, "spec.suspend is true"), (), "")
    else:
        queued = () if seen.admission is None or admitted.true else (admitted,)
        ready = _ready(
            seen.problem,
            (*queued, inference, sandboxes, training),
            "the trainer is up" if sft else "inference, sandboxes and trainer are up",
        )
    return [ready, *out]


def _total_steps(run: TrainingRun, report: Obj | None, prev: Mapping[str, Any]) -> int:
    """The trainer's own count once it reported (what it really runs), the spec's before; the
    recorded one while a report that was read before cannot be read now."""
    if report is not None:
        return int(report["totalSteps"])
    if prev.get("step") is not None and prev.get("totalSteps") is not None:
        return int(prev["totalSteps"])
    return run.spec.algorithm.steps


def trainingrun_status(
    run: TrainingRun, seen: Observed, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """The status fields a TrainingRun's reconcile owns: conditions and children from what was
    observed, step, policy version, last checkpoint and metrics from the trainer's report."""
    prev = previous or {}
    job = seen.of_kind("Job")
    js = job_state(job) if job is not None else None
    completion = _completion_time(prev, js, now)
    succeeded, _ = _finished_as(js)
    wait = final_report_wait(seen.report, succeeded, completion, now)
    conds = trainingrun_conditions(run, seen, awaiting_report=wait > 0)
    weight_sync = weight_sync_condition(seen.report, prev)
    if weight_sync is not None:
        conds.append(weight_sync)
    generation = run.metadata.model_dump().get("generation")
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": merge_conditions(
            prev.get("conditions"), conds, generation=generation, now=now
        ),
        # Set once: the CRD's immutability rule for model and tasks keys on it.
        "startTime": prev.get("startTime") or timestamp(now),
        "totalSteps": _total_steps(run, seen.report, prev),
        **training_progress(seen.report, prev),
        "children": _children(
            seen,
            {
                "configMap": ("ConfigMap", "config"),
                "inferenceDeployment": ("Deployment", None),
                "inferenceService": ("Service", "inference"),
                "trainerJob": ("Job", None),
                "trainerService": ("Service", "trainer"),
                "rolloutPool": ("RolloutPool", None),
            },
        ),
    }
    if run.spec.rollout.pool_ref is not None and seen.pool is not None:
        out["children"]["rolloutPool"] = name_of(seen.pool)
    out["validation"] = _pool_validation(seen, prev)
    if seen.admission is not None:
        out["queue"] = seen.admission.status()
    out["completionTime"] = completion
    return _drop_none(out)


def _pool_validation(seen: Observed, prev: Mapping[str, Any]) -> dict[str, Any] | None:
    """A copy of the observed RolloutPool's ``status.validation``, when it has one; once the
    pool is gone (an inline pool goes with the run's cleanup), the copy made before."""
    if seen.pool is None and isinstance(prev.get("validation"), Mapping):
        return dict(prev["validation"])
    validation = ((seen.pool or {}).get("status") or {}).get("validation")
    return dict(validation) if isinstance(validation, Mapping) else None


def _children(seen: Observed, refs: Mapping[str, tuple[str, str | None]]) -> dict[str, Any]:
    """Names of live children for the status's `children` block (a component may disambiguate)."""
    out: dict[str, Any] = {}
    for key, (kind, component) in refs.items():
        name = name_of(seen.of_kind(kind, component))
        if name is not None:
            out[key] = name
    return out


# --- RolloutPool --------------------------------------------------------------------------


def sandbox_state(pod: Obj) -> str:
    """`leased`, `ready`, `starting` or `gone` for one sandbox pod."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "gone"
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return "gone"
    label = (meta.get("labels") or {}).get(SANDBOX_STATE_KEY)
    if label == SandboxState.LEASED:
        return "leased"
    pod_ready = any(
        pc.get("type") == "Ready" and pc.get("status") == "True"
        for pc in (pod.get("status") or {}).get("conditions") or ()
    )
    if phase != "Running" or not pod_ready:
        return "starting"
    if label is None or label == SandboxState.READY:
        return "ready"
    # STARTING, or a state this operator does not know (a newer gateway's): not claimed as a
    # warm sandbox.
    return "starting"


def rolloutpool_status(
    pool: RolloutPool, seen: Observed, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """The status fields a RolloutPool's reconcile owns: sandbox counts, selector, conditions."""
    prev = previous or {}
    name = pool.metadata.name or ""
    generation = pool.metadata.model_dump().get("generation")
    states = [sandbox_state(p) for p in seen.pods]
    ready = states.count("ready")
    leased = states.count("leased")
    starting = states.count("starting")
    desired = pool.spec.replicas
    dep = seen.of_kind("Deployment")
    if dep is None:
        gateway = cond(
            c.GATEWAY_READY,
            False,
            c.DEPLOYMENT_MISSING,
            "the gateway Deployment does not exist yet",
        )
    else:
        ds = deployment_state(dep)
        msg = f"{ds.available}/{ds.desired} gateway replicas available"
        gateway = cond(
            c.GATEWAY_READY,
            ds.ready,
            c.DEPLOYMENT_AVAILABLE if ds.ready else c.DEPLOYMENT_PROGRESSING,
            msg,
        )
    # Ready means the pool can serve leases (its gateway is up); how many sandboxes are warm
    # is in the counts and the message, since filling a large pool can take a long time.
    warm = f"{ready}/{desired} warm sandboxes ready, {leased} leased, {starting} starting"
    parts = [gateway]
    validation = None
    if pool.spec.validation.enabled:
        # A pool that validates serves nothing until its gateway's last report says so.
        validation = pool_validation(seen.report, prev)
        parts.append(validation_condition(validation))
    ready_cond = _ready(seen.problem, parts, f"gateway up; {warm}")
    svc = seen.of_kind("Service")
    url = None
    if svc is not None:
        ports = (svc.get("spec") or {}).get("ports") or [{}]
        port = ports[0].get("port", 80)
        url = f"http://{name_of(svc)}.{pool.metadata.namespace or 'default'}.svc:{port}"
    out = {
        "observedGeneration": generation,
        "conditions": merge_conditions(
            prev.get("conditions"), [ready_cond, *parts], generation=generation, now=now
        ),
        "replicas": ready + starting,
        "desired": desired,
        "ready": ready,
        "leased": leased,
        "coldStarting": starting,
        "selector": f"{POOL_LABEL}={name}",
        "gatewayUrl": url,
        "validation": validation,
    }
    return _drop_none(out)


# --- Benchmark ----------------------------------------------------------------------------


def served_by_operator(bench: Benchmark) -> bool:
    """Whether the operator serves the benchmark's model (not an endpoint, not the gold replay)."""
    return bench.spec.model.endpoint is None and bench.spec.model.gold is None


def benchmark_conditions(
    bench: Benchmark, seen: Observed, finished_cleanup: bool, awaiting_report: bool = False
) -> list[Cond]:
    """Conditions of a Benchmark from its children (or, after cleanup, from what was recorded);
    ``awaiting_report``: its Job succeeded, the runner's last report has not been read."""
    job = seen.of_kind("Job")
    js = job_state(job) if job is not None else None
    served = served_by_operator(bench)
    if finished_cleanup:
        inference = cond(
            c.INFERENCE_READY,
            False,
            c.WORKLOADS_DELETED,
            "the benchmark finished; its workloads were deleted",
        )
    else:
        inference = _inference(seen.of_kind("Deployment"), served=served, suspended=False)
    sandboxes = pool_ready(seen.pool)
    running = _job_phase(
        c.RUNNING, js, inference_up=inference.true, who="runner", finished=c.FINISHED
    )
    succeeded, failed = _finished_as(js)
    out = [
        inference,
        sandboxes,
        running,
        *_verdict(js, _awaiting("runner") if awaiting_report else None),
    ]
    queued: tuple[Cond, ...] = ()
    if seen.admission is not None and not (succeeded or failed):
        admitted = seen.admission.condition()
        out.insert(0, admitted)
        queued = () if admitted.true else (admitted,)
    if succeeded and awaiting_report:
        ready = _ready(seen.problem or _awaiting("runner"), (), "")
    elif succeeded:
        ready = _ready(seen.problem, (), "the benchmark finished")
    elif failed and js is not None:
        ready = _ready(seen.problem or Problem(c.JOB_FAILED, js.message), (), "")
    else:
        ready = _ready(
            seen.problem, (*queued, inference, sandboxes, running), "the runner is running"
        )
    return [ready, *out]


def benchmark_status(
    bench: Benchmark, seen: Observed, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """The status fields a Benchmark's reconcile owns.

    Once the runner Job finished and its workloads were cleaned up, the conditions and
    progress recorded before stay: a Job that no longer exists says nothing new.
    """
    prev = previous or {}
    generation = bench.metadata.model_dump().get("generation")
    job = seen.of_kind("Job")
    js = job_state(job) if job is not None else None
    # A Job gone while the verdict waited for the runner's last report (deleted by hand): it
    # had succeeded, and there is nothing left to wait for.
    awaited = job is None and awaiting_final_report(prev)
    finished_before = (
        awaited
        or c.is_true(prev.get("conditions"), c.SUCCEEDED)
        or c.is_true(prev.get("conditions"), c.FAILED)
    )
    if job is None and finished_before:
        # Cleaned up after ttlSecondsAfterFinished: keep the verdict, mark inference gone.
        replaced = {c.INFERENCE_READY, *((c.SUCCEEDED, c.FAILED, c.READY) if awaited else ())}
        kept = [
            Cond.stored(pc) for pc in prev.get("conditions") or () if pc.get("type") not in replaced
        ]
        if awaited:
            kept += [
                *_verdict(JobState("succeeded", "the Job completed")),
                _ready(None, (), "the benchmark finished"),
            ]
        conds = [
            *kept,
            *[x for x in benchmark_conditions(bench, seen, True) if x.type == c.INFERENCE_READY],
        ]
    else:
        completion = _completion_time(prev, js, now)
        wait = final_report_wait(seen.report, _finished_as(js)[0], completion, now)
        conds = benchmark_conditions(bench, seen, False, awaiting_report=wait > 0)
    total = (
        len(bench.spec.suite.tasks.filter.instance_ids or ()) * bench.spec.attempts
        if (
            bench.spec.suite.tasks.filter is not None and bench.spec.suite.tasks.filter.instance_ids
        )
        else None
    )
    progress = benchmark_progress(seen.report, prev.get("progress"), total)
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": merge_conditions(
            prev.get("conditions"), conds, generation=generation, now=now
        ),
        "startTime": prev.get("startTime") or timestamp(now),
        "resultsPath": bench.spec.results.path,
        "progress": progress,
        "children": {
            **(prev.get("children") or {} if job is None and finished_before else {}),
            **_children(
                seen,
                {
                    "configMap": ("ConfigMap", "config"),
                    "runnerJob": ("Job", None),
                    "inferenceDeployment": ("Deployment", None),
                    "inferenceService": ("Service", "inference"),
                    "rolloutPool": ("RolloutPool", None),
                },
            ),
        },
    }
    if bench.spec.pool_ref is not None and seen.pool is not None:
        out["children"]["rolloutPool"] = name_of(seen.pool)
    out["validation"] = _pool_validation(seen, prev)
    out.update(benchmark_results(seen.report, progress, prev))
    if seen.admission is not None:
        out["queue"] = seen.admission.status()
    out["completionTime"] = _completion_time(prev, js, now)
    return _drop_none(out)
