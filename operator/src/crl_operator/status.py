"""Status of each kind, computed from what was observed (pure: no client, no clock).

The reconcile gathers the live children and the worker's progress report from its cache into
an :class:`Observed`, and these functions turn that into the status fields the operator owns.
Fields written by others (the pool gateway's latency figures) are not touched here:
:func:`status_patch` only sets or removes the keys in :data:`OWNED_KEYS`. A report that is
missing or malformed changes nothing it would have said: the status keeps what it recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crl_operator import conditions as c
from crl_operator.conditions import Cond, cond, merge_conditions, timestamp
from crl_worker.api import Benchmark, RolloutPool, TrainingRun
from crl_worker.api.contract import Label, SandboxState

Obj = Mapping[str, Any]

#: Label the pool gateway puts on each sandbox pod: which pool it belongs to.
POOL_LABEL = Label.POOL
#: Label the gateway sets on each sandbox pod: a SandboxState (crl_worker.api.contract).
SANDBOX_STATE_KEY = Label.STATE

#: Status keys each kind's reconcile owns; the rest belongs to other writers.
OWNED_KEYS: dict[str, frozenset[str]] = {
    "TrainingRun": frozenset(
        {
            "observedGeneration",
            "conditions",
            "startTime",
            "completionTime",
            "step",
            "totalSteps",
            "policyVersion",
            "lastCheckpoint",
            "metrics",
            "children",
            "queue",
        }
    ),
    "RolloutPool": frozenset(
        {
            "observedGeneration",
            "conditions",
            "replicas",
            "desired",
            "ready",
            "leased",
            "coldStarting",
            "selector",
            "gatewayUrl",
        }
    ),
    "Benchmark": frozenset(
        {
            "observedGeneration",
            "conditions",
            "startTime",
            "completionTime",
            "progress",
            "resolveRate",
            "passAtK",
            "comparison",
            "resultsPath",
            "children",
            "queue",
        }
    ),
}


@dataclass(frozen=True)
class Problem:
    """Why a reconcile could not do its whole job; becomes the Ready condition."""

    reason: str
    message: str


#: Kueue's Workload condition types the operator reads.
WL_QUOTA_RESERVED = "QuotaReserved"
WL_ADMITTED = "Admitted"
WL_EVICTED = "Evicted"
WL_PODS_READY = "PodsReady"
#: The part of Kueue's flavor-assigner message that says a pod set can never fit.
_NEVER_FITS = "> maximum capacity"


@dataclass(frozen=True)
class Admission:
    """How Kueue sees a TrainingRun or Benchmark that names a queue (docs/scheduling.md)."""

    state: str
    """`Queued`, `Admitted`, `Preempted`, `Evicted` (another eviction reason) or `Unqueued`
    (Kueue is not installed): `status.queue.state`, a printer column."""
    reason: str
    """The Admitted condition's reason: Kueue's (`Pending`, `Inadmissible`, `Preempted`,
    `PodsReadyTimeout`, ...) or the operator's (`Admitted`, `ExceedsQuota`, `KueueAbsent`,
    `WorkloadMissing`)."""
    message: str
    queue: str
    """The LocalQueue (`scheduling.queueName`)."""
    cluster_queue: str | None = None
    """The ClusterQueue that reserved quota, while it holds it."""
    reserved: bool = False
    """Kueue has reserved quota for the Workload (`status.admission` is set)."""

    @property
    def admitted(self) -> bool:
        """The children may run: quota is reserved and the Workload was not evicted."""
        return self.state in ("Admitted", "Unqueued")

    def condition(self) -> Cond:
        """The resource's `Admitted` condition."""
        return cond(c.ADMITTED, self.admitted, self.reason, self.message)

    def status(self) -> dict[str, Any]:
        """`status.queue`."""
        out = {"name": self.queue, "state": self.state, "clusterQueue": self.cluster_queue}
        return {k: v for k, v in out.items() if v is not None}


def workload_admission(queue: str, workload: Obj | None, *, kueue: bool) -> Admission:
    """The admission of a resource queued in `queue`, from its Kueue Workload (or its absence).

    `kueue`: whether Kueue is installed; without it the resource runs unqueued and says so.
    """
    if not kueue:
        return Admission(
            "Unqueued",
            c.KUEUE_ABSENT,
            f"scheduling.queueName is {queue!r} but Kueue is not installed (no"
            " kueue.x-k8s.io/v1beta2 API): running without queueing or quota",
            queue,
        )
    if workload is None:
        return Admission("Queued", c.WORKLOAD_MISSING, "the Kueue Workload is being created", queue)
    status = workload.get("status") or {}
    conds = status.get("conditions")
    admission = status.get("admission") or {}
    cq = admission.get("clusterQueue") if admission else None
    reserved = bool(admission)
    evicted = c.find(conds, WL_EVICTED)
    if evicted is not None and evicted.get("status") == "True":
        reason = str(evicted.get("reason") or "Evicted")
        again = (
            "stopping its pods (the trainer checkpoints) before the quota is released"
            if reserved
            else "requeued; it resumes from its last checkpoint when admitted again"
        )
        return Admission(
            "Preempted" if reason == "Preempted" else "Evicted",
            reason,
            f"{evicted.get('message') or reason}; {again}",
            queue,
            cq,
            reserved,
        )
    if c.is_true(conds, WL_ADMITTED) and reserved:
        return Admission(
            "Admitted",
            c.KUEUE_ADMITTED,
            f"admitted by ClusterQueue {cq} (LocalQueue {queue})",
            queue,
            cq,
            True,
        )
    pending = c.find(conds, WL_QUOTA_RESERVED)
    if pending is None or pending.get("status") == "True":
        # Reserved but admission checks not ready, or Kueue has not looked at it yet.
        return Admission("Queued", c.QUEUED, f"waiting in LocalQueue {queue}", queue, cq, reserved)
    message = str(pending.get("message") or "")
    reason = str(pending.get("reason") or c.QUEUED)
    if _NEVER_FITS in message:
        reason = c.EXCEEDS_QUOTA
        message = f"larger than the quota it can ever get, it will not be admitted: {message}"
    return Admission("Queued", reason, f"queued in LocalQueue {queue}: {message}", queue, cq)


_PODS_NOT_READY = "Not all pods are ready or succeeded"
_PODS_RECOVERING = "At least one pod has failed, waiting for recovery"
_PODS_READY = "All pods reached readiness and the workload is running"


def _pod_set_ready(name: str, children: Iterable[Obj]) -> bool:
    """Whether the child that runs pod set `name` has all its pods ready (or succeeded)."""
    for child in children:
        if component_of(child) != name:
            continue
        if child.get("kind") == "Deployment":
            return deployment_state(child).ready
        if child.get("kind") == "Job":
            return job_state(child).phase in ("running", "succeeded")
    return False


def pods_ready_condition(workload: Obj, children: Iterable[Obj]) -> tuple[str, str, str]:
    """The `PodsReady` condition (status, reason, message) an admitted Workload should carry.

    What Kueue's job integrations write for the jobs they manage (Kueue computes it for no
    other Workload), so that its `waitForPodsReady` timeout measures this run's pods: every pod
    set's child (the vLLM Deployment, the trainer or runner Job) has all its pods ready:
    `Started` (or `Recovered` after a recovery); otherwise `WaitForStart`, or
    `WaitForRecovery` once they had all been ready.
    """
    status = workload.get("status") or {}
    conds = status.get("conditions")
    current = c.find(conds, WL_PODS_READY)
    admitted = c.is_true(conds, WL_ADMITTED) and bool(status.get("admission"))
    kids = list(children)
    names = [str(p.get("name")) for p in (workload.get("spec") or {}).get("podSets") or ()]
    if admitted and names and all(_pod_set_ready(n, kids) for n in names):
        recovering = current is not None and current.get("reason") in (
            "WaitForRecovery",
            "Recovered",
        )
        return "True", "Recovered" if recovering else "Started", _PODS_READY
    if not admitted or current is None:
        return "False", "WaitForStart", _PODS_NOT_READY
    if current.get("status") == "True" or current.get("reason") == "WaitForRecovery":
        return "False", "WaitForRecovery", _PODS_RECOVERING
    return "False", "WaitForStart", _PODS_NOT_READY


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


def component_of(obj: Obj) -> str:
    """The child's `app.kubernetes.io/component` label."""
    return str(
        ((obj.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component", "")
    )


def name_of(obj: Obj | None) -> str | None:
    """`metadata.name`, or None for a missing object."""
    if obj is None:
        return None
    return str((obj.get("metadata") or {}).get("name", "")) or None


# --- children ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeploymentState:
    """Replica counts of a Deployment and whether it is fully available."""

    desired: int
    available: int
    current: bool
    """The Deployment controller has seen the latest spec (observedGeneration)."""

    @property
    def ready(self) -> bool:
        """All desired replicas are available for the current spec (and at least one is wanted)."""
        return self.current and self.desired > 0 and self.available >= self.desired


def deployment_state(dep: Obj) -> DeploymentState:
    """Read a Deployment's replica counts."""
    spec = dep.get("spec") or {}
    st = dep.get("status") or {}
    generation = int((dep.get("metadata") or {}).get("generation") or 0)
    desired = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
    available = int(st.get("availableReplicas") or 0)
    updated = int(st.get("updatedReplicas") or 0)
    current = int(st.get("observedGeneration") or 0) >= generation and updated >= desired
    return DeploymentState(desired, available, current)


@dataclass(frozen=True)
class JobState:
    """Phase of a Job, from its conditions and counts."""

    phase: str
    """`suspended`, `pending`, `running`, `succeeded` or `failed`."""
    message: str
    completion_time: str | None = None
    start_time: str | None = None


def _job_condition(job: Obj, type_: str) -> Obj | None:
    for jc in (job.get("status") or {}).get("conditions") or ():
        if jc.get("type") == type_ and jc.get("status") == "True":
            return dict(jc)
    return None


def job_state(job: Obj) -> JobState:
    """Classify a Job: finished (Complete/Failed), suspended (e.g. by Kueue), or how far its pods are."""
    spec = job.get("spec") or {}
    st = job.get("status") or {}
    done = _job_condition(job, "Complete") or _job_condition(job, "SuccessCriteriaMet")
    if done is not None:
        return JobState(
            "succeeded", "the Job completed", st.get("completionTime"), st.get("startTime")
        )
    failed = _job_condition(job, "Failed") or _job_condition(job, "FailureTarget")
    if failed is not None:
        why = failed.get("message") or failed.get("reason") or "the Job failed"
        return JobState("failed", str(why), failed.get("lastTransitionTime"), st.get("startTime"))
    if spec.get("suspend") or _job_condition(job, "Suspended") is not None:
        return JobState("suspended", "the Job is suspended (waiting for admission, e.g. by Kueue)")
    want = int(spec.get("parallelism") or 1)
    if spec.get("completions") is not None:
        want = min(want, int(spec["completions"]))
    ready = int(st.get("ready") or 0)
    if want > 0 and ready >= want:
        return JobState("running", f"{ready}/{want} pods ready", None, st.get("startTime"))
    return JobState("pending", f"{ready}/{want} pods ready", None, st.get("startTime"))


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


def _verdict(js: JobState | None) -> tuple[Cond, Cond]:
    """Succeeded and Failed of a resource whose outcome is its Job's (trainer or runner)."""
    succeeded, failed = _finished_as(js)
    message = js.message if js is not None else ""
    return (
        cond(
            c.SUCCEEDED,
            succeeded,
            c.JOB_SUCCEEDED if succeeded else c.IN_PROGRESS,
            message if succeeded else "",
        ),
        cond(
            c.FAILED, failed, c.JOB_FAILED if failed else c.IN_PROGRESS, message if failed else ""
        ),
    )


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


def trainingrun_conditions(run: TrainingRun, seen: Observed) -> list[Cond]:
    """Conditions of a TrainingRun from its children."""
    suspended = run.spec.suspend
    dep = seen.of_kind("Deployment")
    job = seen.of_kind("Job")
    js = job_state(job) if job is not None else None
    inference = _inference(
        dep,
        served=run.spec.generation == "vllm",
        suspended=suspended,
        why="generation is in-process: the trainer generates from the weights it trains",
    )
    sandboxes = pool_ready(seen.pool)
    if js is not None and js.phase in ("succeeded", "failed") and run.spec.generation == "vllm":
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
    elif js is None:
        if inference.true:
            training = cond(c.TRAINING, False, c.JOB_MISSING, "the trainer Job is being created")
        else:
            training = cond(
                c.TRAINING,
                False,
                c.WAITING_FOR_INFERENCE,
                "the trainer starts once inference is ready",
            )
    elif js.phase == "running":
        said = trainer_says(seen.report)
        training = cond(
            c.TRAINING, True, c.JOB_RUNNING, f"{js.message}; {said}" if said else js.message
        )
    elif js.phase == "succeeded":
        training = cond(c.TRAINING, False, c.JOB_SUCCEEDED, js.message)
    elif js.phase == "failed":
        training = cond(c.TRAINING, False, c.JOB_FAILED, js.message)
    elif js.phase == "suspended":
        training = cond(c.TRAINING, False, c.JOB_SUSPENDED, js.message)
    else:
        training = cond(c.TRAINING, False, c.WAITING_FOR_PODS, js.message)

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
        *_verdict(js),
    ]
    if succeeded:
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
            "inference, sandboxes and trainer are up",
        )
    return [ready, *out]


def weight_sync_condition(report: Obj | None, previous: Mapping[str, Any]) -> Cond | None:
    """The `WeightSync` condition from the trainer's report (its watchdog's last finding); the
    recorded one while no report says anything of it; none before the first."""
    found = (report or {}).get("weightSync")
    if isinstance(found, Mapping):
        return cond(
            c.WEIGHT_SYNC, bool(found["ok"]), str(found["reason"]), str(found.get("message", ""))
        )
    for entry in previous.get("conditions") or ():
        if entry.get("type") == c.WEIGHT_SYNC:
            return Cond.stored(entry)
    return None


def trainer_says(report: Obj | None) -> str:
    """The trainer's report in a few words for the Training condition: `step 12/200,
    checkpointing: <message>` ("" without a report)."""
    if report is None:
        return ""
    out = f"step {report['step']}/{report['totalSteps']}"
    if report.get("phase"):
        out += f", {report['phase']}"
    if report.get("message"):
        out += f": {report['message']}"
    return out


def significant(value: float, digits: int = 6) -> float:
    """`value` rounded to `digits` significant digits (a reward of 0.123456789 reads 0.123457,
    a KL of 1.23456789e-05 keeps its magnitude)."""
    return float(f"{value:.{digits}g}")


def training_progress(report: Obj | None, previous: Mapping[str, Any]) -> dict[str, Any]:
    """`step`, `policyVersion`, `lastCheckpoint` and `metrics` from the trainer's report.

    Without a report (not written yet, malformed, or gone) what was recorded stays; a report
    that says nothing of a checkpoint, a policy version or metrics (none yet) keeps the recorded
    ones too, so a restarted trainer's first report does not blank them.
    """
    keys = ("step", "policyVersion", "lastCheckpoint", "metrics")
    out = {k: previous[k] for k in keys if previous.get(k) is not None}
    if report is None:
        return out
    out["step"] = int(report["step"])
    if report.get("policyVersion") is not None:
        out["policyVersion"] = int(report["policyVersion"])
    checkpoint = report.get("lastCheckpoint")
    if checkpoint:
        ref: dict[str, Any] = {"step": int(checkpoint["step"]), "path": str(checkpoint["path"])}
        if checkpoint.get("time"):
            when = datetime.fromisoformat(str(checkpoint["time"]).replace("Z", "+00:00"))
            ref["time"] = timestamp(when)
        out["lastCheckpoint"] = ref
    metrics = report.get("metrics")
    if metrics:
        out["metrics"] = {
            k: significant(v) if isinstance(v, float) else v
            for k, v in metrics.items()
            if v is not None
        }
    return out


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
    conds = trainingrun_conditions(run, seen)
    weight_sync = weight_sync_condition(seen.report, prev)
    if weight_sync is not None:
        conds.append(weight_sync)
    generation = run.metadata.model_dump().get("generation")
    job = seen.of_kind("Job")
    js = job_state(job) if job is not None else None
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
    if seen.admission is not None:
        out["queue"] = seen.admission.status()
    out["completionTime"] = _completion_time(prev, js, now)
    return _drop_none(out)


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
    ready_cond = _ready(seen.problem, (gateway,), f"gateway up; {warm}")
    svc = seen.of_kind("Service")
    url = None
    if svc is not None:
        ports = (svc.get("spec") or {}).get("ports") or [{}]
        port = ports[0].get("port", 80)
        url = f"http://{name_of(svc)}.{pool.metadata.namespace or 'default'}.svc:{port}"
    out = {
        "observedGeneration": generation,
        "conditions": merge_conditions(
            prev.get("conditions"), [ready_cond, gateway], generation=generation, now=now
        ),
        "replicas": ready + starting,
        "desired": desired,
        "ready": ready,
        "leased": leased,
        "coldStarting": starting,
        "selector": f"{POOL_LABEL}={name}",
        "gatewayUrl": url,
    }
    return _drop_none(out)


# --- Benchmark ----------------------------------------------------------------------------


def served_by_operator(bench: Benchmark) -> bool:
    """Whether the operator serves the benchmark's model (not an endpoint, not the gold replay)."""
    return bench.spec.model.endpoint is None and bench.spec.model.gold is None


def benchmark_conditions(bench: Benchmark, seen: Observed, finished_cleanup: bool) -> list[Cond]:
    """Conditions of a Benchmark from its children (or, after cleanup, from what was recorded)."""
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
    if js is None:
        running = cond(
            c.RUNNING,
            False,
            c.WAITING_FOR_INFERENCE if not inference.true else c.JOB_MISSING,
            "the runner starts once inference is ready"
            if not inference.true
            else "the runner Job is being created",
        )
    elif js.phase == "running":
        running = cond(c.RUNNING, True, c.JOB_RUNNING, js.message)
    elif js.phase in ("succeeded", "failed"):
        running = cond(c.RUNNING, False, c.FINISHED, js.message)
    elif js.phase == "suspended":
        running = cond(c.RUNNING, False, c.JOB_SUSPENDED, js.message)
    else:
        running = cond(c.RUNNING, False, c.WAITING_FOR_PODS, js.message)
    succeeded, failed = _finished_as(js)
    out = [
        inference,
        sandboxes,
        running,
        *_verdict(js),
    ]
    queued: tuple[Cond, ...] = ()
    if seen.admission is not None and not (succeeded or failed):
        admitted = seen.admission.condition()
        out.insert(0, admitted)
        queued = () if admitted.true else (admitted,)
    if succeeded:
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
    finished_before = c.is_true(prev.get("conditions"), c.SUCCEEDED) or c.is_true(
        prev.get("conditions"), c.FAILED
    )
    if job is None and finished_before:
        # Cleaned up after ttlSecondsAfterFinished: keep the verdict, mark inference gone.
        kept = [
            Cond.stored(pc)
            for pc in prev.get("conditions") or ()
            if pc.get("type") != c.INFERENCE_READY
        ]
        conds = [
            *kept,
            *[x for x in benchmark_conditions(bench, seen, True) if x.type == c.INFERENCE_READY],
        ]
    else:
        conds = benchmark_conditions(bench, seen, False)
    total = (
        len(bench.spec.suite.tasks.filter.instance_ids or ()) * bench.spec.attempts
        if (
            bench.spec.suite.tasks.filter is not None and bench.spec.suite.tasks.filter.instance_ids
        )
        else None
    )
    progress = _progress(seen.report, prev.get("progress"), total)
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
    out.update(_results(seen.report, progress, prev))
    if seen.admission is not None:
        out["queue"] = seen.admission.status()
    out["completionTime"] = _completion_time(prev, js, now)
    return _drop_none(out)


def _results(report: Obj | None, progress: Obj | None, prev: Obj) -> dict[str, Any]:
    """`resolveRate`, `passAtK` and `comparison`: the runner's report says them exactly; without
    one (not written yet, malformed, or gone) what was recorded stays."""
    if report is None:
        return {k: prev[k] for k in ("resolveRate", "passAtK", "comparison") if k in prev}
    out: dict[str, Any] = {}
    rate = report.get("resolveRate")
    if rate is None and progress is not None:
        # Resolved over finished attempts; an infrastructure failure is not a wrong answer.
        finished = progress["done"] - progress["errored"]
        if finished > 0:
            rate = progress["resolved"] / finished
    if rate is not None:
        out["resolveRate"] = round(float(rate), 6)
    if report.get("passAtK"):
        out["passAtK"] = [
            {"k": int(p["k"]), "value": round(float(p["value"]), 6)}
            for p in sorted(report["passAtK"], key=lambda p: int(p["k"]))
        ]
    if report.get("comparison"):
        out["comparison"] = dict(report["comparison"])
    return out


def _progress(report: Obj | None, previous: Obj | None, total: int | None) -> dict[str, Any] | None:
    """Progress from the runner's report, else what was recorded, else the known total."""
    if report is not None:
        done = int(report.get("done", 0))
        tot = int(report.get("total", total or 0))
        return {
            "total": tot,
            "done": done,
            "resolved": int(report.get("resolved", 0)),
            "errored": int(report.get("errored", 0)),
            "summary": f"{done}/{tot}",
        }
    if previous is not None:
        return dict(previous)
    if total is not None:
        return {"total": total, "done": 0, "resolved": 0, "errored": 0, "summary": f"0/{total}"}
    return None


# --- patches ------------------------------------------------------------------------------


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def status_patch(
    kind: str, current: Mapping[str, Any] | None, computed: Mapping[str, Any]
) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) taking `current` status to `computed` on the owned keys.

    Owned keys that `computed` no longer has are removed (set to null); keys owned by other
    writers are left alone. An empty patch means nothing changed: no request is needed.
    """
    cur = dict(current or {})
    patch: dict[str, Any] = {}
    for key in OWNED_KEYS[kind]:
        if key in computed:
            diff = merge_diff(cur.get(key), computed[key])
            if diff is not _SAME:
                patch[key] = diff
        elif cur.get(key) is not None:
            patch[key] = None
    return patch


class _Same:
    """Marker: no difference."""


_SAME: Any = _Same()


def merge_diff(old: Any, new: Any) -> Any:
    """The merge-patch value that turns `old` into `new`, or the marker `_SAME`."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: dict[str, Any] = {}
        for k, v in new.items():
            d = merge_diff(old.get(k), v)
            if d is not _SAME:
                out[k] = d
        for k in old:
            if k not in new and old[k] is not None:
                out[k] = None
        return out if out else _SAME
    if old == new:
        return _SAME
    return new
