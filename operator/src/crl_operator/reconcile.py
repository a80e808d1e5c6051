"""One idempotent reconcile for each kind: read, validate, observe, render, apply, prune, status.

Everything here runs in a worker thread (the Kubernetes client is synchronous) and reads the
cluster only through the watch-fed :class:`~crl_operator.cache.Cache`. The only requests are
writes: a server-side apply for a child whose live state differs from what the builders
render, a DELETE for a child the render no longer produces, and one status merge-patch when
the computed status differs from the stored one. A reconcile with nothing to change sends
nothing, which is what keeps the timer and the child events cheap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from crl_operator import builders
from crl_operator import conditions as c
from crl_operator.admission import (
    Admission,
)
from crl_operator.apply import (
    Kube,
    KubeError,
    child_key,
    controller_uid,
    to_prune,
)
from crl_operator.builders import BuildError, RenderState, ResolvedCheckpoint, relocate_images
from crl_operator.cache import Cache, Key
from crl_operator.children import component_of, deployment_state, job_state
from crl_operator.conditions import merge_conditions
from crl_operator.events import transition_events
from crl_operator.kueue import KueueWorkloads
from crl_operator.metrics import (
    ERRORS,
    LATENCY,
    RECONCILES,
    forget_benchmark,
    forget_condition,
    record_benchmark,
    record_conditions,
)
from crl_operator.patches import status_patch
from crl_operator.status import (
    Observed,
    Problem,
    benchmark_status,
    rolloutpool_status,
    served_by_operator,
    trainingrun_status,
)
from crl_operator.writes import ChildWrites
from crl_worker.api import KINDS, AnyResource, Benchmark, RolloutPool, TrainingRun
from crl_worker.api.contract import PROGRESS_KEY, Env
from crl_worker.api.progress import ProgressReport, TrainingProgress, WireReport

log = logging.getLogger(__name__)

#: Ready's reason while a Benchmark waits for the TrainingRun checkpoint it serves.
CHECKPOINT_UNAVAILABLE = "CheckpointUnavailable"


@dataclass(frozen=True)
class Outcome:
    """How a reconcile ended and when to look again without an event."""

    result: str
    """`ok`, `error`, `invalid` or `gone` (the metric label)."""
    requeue_after: float | None = None
    """Reconcile again after this many seconds (e.g. when a Benchmark's TTL expires)."""


def format_validation_error(err: ValidationError) -> str:
    """Pydantic's errors as one line a user can act on: `path: message; ...`."""
    parts = []
    for e in err.errors()[:5]:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{loc}: {e.get('msg')}")
    more = len(err.errors()) - 5
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts) + " (fix the spec; the operator retries once it changes)"


class Reconciler:
    """The reconcile of all three kinds over a shared cache and client."""

    def __init__(
        self,
        kube: Kube,
        cache: Cache,
        *,
        now: Callable[[], datetime] | None = None,
        apply_threads: int = 0,
        image_registry: str | None = None,
    ):
        """`apply_threads`: threads shared by all reconciles to apply the children of one wave
        at once (0 applies them one after another in the reconciling thread). `image_registry`:
        the registry this project's images are run from (:func:`relocate_images`)."""
        self.kube = kube
        self.cache = cache
        self.image_registry = image_registry
        self.now = now or (lambda: datetime.now(UTC))
        # resourceVersion our last status patch produced, per resource: its watch echo is ours.
        self.status_versions: dict[Key, str] = {}
        # resourceVersion of the progress ConfigMap whose malformed report was logged, per
        # Benchmark or TrainingRun: a bad report is logged once, not at every resync.
        self._bad_reports: dict[Key, str] = {}
        # Condition types exported per resource (crl_operator_resource_condition), to drop them.
        self._condition_types: dict[Key, set[str]] = {}
        self.kueue = KueueWorkloads(kube, cache, self.now)
        self.writes = ChildWrites(kube, cache, apply_threads)
        self._lock = threading.Lock()

    def forget(self, key: Key) -> None:
        """Drop what was remembered about an object that was deleted (keeps memory bounded)."""
        with self._lock:
            self.status_versions.pop(key, None)
            self._bad_reports.pop(key, None)
            types = self._condition_types.pop(key, set())
        self.writes.forget(key)
        for type_ in types:
            forget_condition(*key, type_)
        if key[0] == "Benchmark":
            forget_benchmark(key[1], key[2])

    # --- entry point ----------------------------------------------------------------------

    def reconcile(self, key: Key) -> Outcome:
        """Reconcile one resource; never raises (failures become conditions and a result)."""
        kind = key[0]
        started = time.perf_counter()
        try:
            outcome = self._reconcile(key)
        except Exception:  # the boundary: one resource's failure never stops the rest
            log.exception("reconcile of %s %s/%s failed", *key)
            ERRORS.labels(kind=kind, reason="Unexpected").inc()
            outcome = Outcome("error", None)
        LATENCY.labels(kind=kind).observe(time.perf_counter() - started)
        RECONCILES.labels(kind=kind, result=outcome.result).inc()
        return outcome

    def _reconcile(self, key: Key) -> Outcome:
        kind, ns, name = key
        body = self.cache.get(kind, ns, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return Outcome("gone")  # the garbage collector removes the children
        previous = dict(body.get("status") or {})
        generation = (body.get("metadata") or {}).get("generation")
        try:
            resource = KINDS[kind].model.model_validate(
                {k: v for k, v in body.items() if k != "status"}
            )
        except ValidationError as err:
            return self._invalid(key, body, previous, generation, format_validation_error(err))

        uid = str(body["metadata"]["uid"])
        report = self._report(resource, uid)
        admission = self.kueue.admission(resource, uid)
        # `problem`: a Benchmark whose checkpoint cannot be resolved yet (it still renders).
        state, problem = self._render_state(resource, body, previous, report, admission)
        try:
            desired = relocate_images(builders.render(resource, ns, state), self.image_registry)
        except BuildError as err:
            return self._invalid(key, body, previous, generation, str(err))

        if isinstance(resource, RolloutPool):
            try:
                # Before the gateway Deployment: its pods read the token from the Secret.
                self.writes.ensure_token(key, resource, ns, uid)
            except KubeError as err:
                if err.namespace_terminating:
                    return Outcome("gone")
                ERRORS.labels(kind=kind, reason=c.APPLY_FAILED).inc()
                log.warning(
                    "creating the token Secret of RolloutPool %s/%s failed: %s", ns, name, err
                )
                problem = problem or Problem(c.APPLY_FAILED, f"token Secret: {err.message}")

        for obj, failure in self.writes.ensure_all(desired):
            if failure.namespace_terminating:
                # The namespace is going away with the resource in it: nothing to repair.
                return Outcome("gone")
            ERRORS.labels(kind=kind, reason=c.APPLY_FAILED).inc()
            log.warning(
                "apply of %s %s for %s %s/%s failed: %s",
                obj["kind"],
                obj["metadata"]["name"],
                kind,
                ns,
                name,
                failure,
            )
            if failure.invalid and obj["kind"] == "Job":
                # A Job's pod template is immutable: replace the Job (the trainer resumes
                # from its last checkpoint); the next reconcile creates the new one.
                self.writes.replace_job(obj)
            problem = problem or Problem(
                c.APPLY_FAILED, f"{obj['kind']} {obj['metadata']['name']}: {failure.message}"
            )

        wanted = {child_key(o) for o in desired} | self._retained(resource, uid, state, previous)
        for stale in to_prune(self.cache.owned(uid), uid, wanted):
            okind, ons, oname = child_key(stale)
            try:
                if self.kube.delete(okind, ons, oname, uid=stale["metadata"].get("uid")):
                    log.info("pruned %s %s/%s of %s %s", okind, ons, oname, kind, name)
                # Gone either way (Background propagation deletes the object itself at once);
                # the status below must not name it any more.
                self.cache.remove(stale)
            except KubeError as err:
                ERRORS.labels(kind=kind, reason=c.PRUNE_FAILED).inc()
                problem = problem or Problem(c.PRUNE_FAILED, f"{okind} {oname}: {err.message}")

        if (
            admission is not None
            and admission.reserved
            and admission.state in ("Preempted", "Evicted")
            and not isinstance(resource, RolloutPool)
        ):
            # Evicted (preempted, or its pods were not ready in time): the render stopped the
            # children; once they are gone, hand the quota back as Kueue's job integrations do.
            problem = problem or self.kueue.release_quota(resource, uid)
        elif (
            admission is not None
            and admission.state == "Admitted"
            and not isinstance(resource, RolloutPool)
        ):
            # Kueue's waitForPodsReady reads PodsReady, which only a job integration writes.
            problem = problem or self.kueue.report_pods_ready(resource, uid)
        seen = self._observed(resource, uid, problem, report, admission)
        now = self.now()
        if isinstance(resource, TrainingRun):
            computed = trainingrun_status(resource, seen, previous, now)
        elif isinstance(resource, RolloutPool):
            computed = rolloutpool_status(resource, seen, previous, now)
        else:
            computed = benchmark_status(resource, seen, previous, now)
        self._patch_status(key, body, previous, computed)
        if problem is not None and problem.reason != CHECKPOINT_UNAVAILABLE:
            return Outcome("error", None)
        return Outcome("ok", self._requeue_after(resource, body, computed))

    # --- observing --------------------------------------------------------------------------

    def _pool_of(self, resource: TrainingRun | Benchmark, uid: str) -> dict[str, Any] | None:
        ns = resource.metadata.namespace or "default"
        ref = (
            resource.spec.rollout.pool_ref
            if isinstance(resource, TrainingRun)
            else resource.spec.pool_ref
        )
        if ref is not None:
            return self.cache.get("RolloutPool", ns, ref.name)
        for child in self.cache.owned(uid):
            if child.get("kind") == "RolloutPool":
                return child
        return None

    def _observed(
        self,
        resource: AnyResource,
        uid: str,
        problem: Problem | None,
        report: dict[str, Any] | None,
        admission: Admission | None = None,
    ) -> Observed:
        children = tuple(self.cache.owned(uid))
        ns = resource.metadata.namespace or "default"
        if isinstance(resource, RolloutPool):
            pods = tuple(self.cache.pool_pods(ns, resource.metadata.name or ""))
            return Observed(children=children, pods=pods, problem=problem)
        return Observed(
            children=children,
            pool=self._pool_of(resource, uid),
            report=report,
            problem=problem,
            admission=admission,
        )

    def _report(self, resource: AnyResource, uid: str) -> dict[str, Any] | None:
        """The worker's progress report from its ConfigMap (watched like every child): the
        Benchmark runner's or the TrainingRun trainer's; None for a RolloutPool.

        A malformed report is logged (once per version of the ConfigMap) and ignored: the
        status keeps what it recorded before, and the reconcile goes on.
        """
        model: type[WireReport]
        if isinstance(resource, Benchmark):
            model = ProgressReport
        elif isinstance(resource, TrainingRun):
            model = TrainingProgress
        else:
            return None
        ns = resource.metadata.namespace or "default"
        name = builders.progress_name(resource)
        live = self.cache.get("ConfigMap", ns, name)
        if live is None or controller_uid(live) != uid:
            return None
        text = (live.get("data") or {}).get(PROGRESS_KEY)
        if not text:
            return None
        try:
            return model.parse(str(text)).to_wire()
        except ValueError as err:
            key = (resource.kind, ns, resource.metadata.name or "")
            version = str(live["metadata"].get("resourceVersion"))
            with self._lock:
                logged = self._bad_reports.get(key) == version
                self._bad_reports[key] = version
            if not logged:
                log.warning(
                    "ignoring the progress report of %s %s/%s in ConfigMap %s: %s",
                    resource.kind,
                    ns,
                    resource.metadata.name,
                    name,
                    err,
                )
            return None

    def _finished(self, uid: str, previous: Mapping[str, Any]) -> tuple[bool, str | None]:
        """Whether the resource's Job finished (live, or recorded before it was deleted)."""
        for child in self.cache.owned(uid):
            if child.get("kind") == "Job":
                js = job_state(child)
                if js.phase in ("succeeded", "failed"):
                    return True, js.completion_time or previous.get("completionTime")
        conds = previous.get("conditions")
        if c.is_true(conds, c.SUCCEEDED) or c.is_true(conds, c.FAILED):
            return True, previous.get("completionTime")
        return False, None

    def _render_state(
        self,
        resource: AnyResource,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        report: Mapping[str, Any] | None,
        admission: Admission | None = None,
    ) -> tuple[RenderState, Problem | None]:
        """What the builders need from the cluster, and why a checkpoint is unavailable.

        A TrainingRun's evaluations follow its last checkpoint: the trainer's report when it
        names one (so the Benchmark is created in the reconcile that reads it), else the status.
        """
        uid = str(body["metadata"]["uid"])
        if isinstance(resource, RolloutPool):
            return RenderState(inference_ready=True), None
        finished, _ = self._finished(uid, previous)
        inference_ready = False
        job_exists = False
        for child in self.cache.owned(uid):
            if child.get("kind") == "Deployment" and component_of(child) == "inference":
                inference_ready = deployment_state(child).ready
            if child.get("kind") == "Job":
                job_exists = True
        if isinstance(resource, Benchmark) and not served_by_operator(resource):
            inference_ready = True
        # A trainer or runner that exists keeps running through an inference restart: the
        # gate only holds back the *first* creation.
        inference_ready = inference_ready or job_exists
        checkpoint = None
        problem = None
        evaluation: tuple[int, ...] = ()
        queued = admission is not None and admission.state != "Unqueued"
        priority = None
        klass = None if isinstance(resource, RolloutPool) else resource.spec.scheduling
        if queued and klass is not None and klass.workload_priority_class_name:
            priority = self.kueue.workload_priority(klass.workload_priority_class_name)
            if priority is None:
                problem = Problem(
                    c.APPLY_FAILED,
                    f"WorkloadPriorityClass {klass.workload_priority_class_name} does not exist"
                    " (scheduling.workloadPriorityClassName): create it or fix the name",
                )
        if isinstance(resource, Benchmark) and resource.spec.model.checkpoint is not None:
            checkpoint, problem = self._checkpoint(resource)
        baseline = None
        if isinstance(resource, Benchmark) and resource.spec.baseline is not None:
            baseline = self._baseline_results(resource, uid)
        if isinstance(resource, TrainingRun) and resource.spec.evaluation is not None:
            reported = (report or {}).get("lastCheckpoint")
            last = (reported or previous.get("lastCheckpoint") or {}).get("step")
            every = resource.spec.evaluation.every_steps
            if isinstance(last, int) and last >= every:
                evaluation = tuple(range(every, last + 1, every))
        state = RenderState(
            inference_ready=inference_ready,
            suspended=False,
            finished=finished,
            checkpoint=checkpoint,
            evaluation_steps=evaluation,
            baseline_results=baseline,
            queued=queued,
            admitted=admission is None or admission.admitted,
            workload_priority=priority,
        )
        return state, problem

    def _baseline_results(self, bench: Benchmark, uid: str) -> str | None:
        """The baseline's results directory for the runner, when it can read it.

        A runner Job that exists keeps the value it was created with: its pod template is
        immutable, and a baseline created or edited later must not restart a running benchmark.
        """
        for child in self.cache.owned(uid):
            if child.get("kind") == "Job":
                containers = child["spec"]["template"]["spec"].get("containers") or [{}]
                for var in containers[0].get("env") or ():
                    if var.get("name") == Env.BASELINE_RESULTS:
                        return str(var.get("value") or "") or None
                return None
        ref = bench.spec.baseline
        assert ref is not None
        body = self.cache.get("Benchmark", bench.metadata.namespace or "default", ref.name)
        if body is None:
            return None
        try:
            baseline = Benchmark.model_validate({k: v for k, v in body.items() if k != "status"})
        except ValidationError:
            return None
        return builders.baseline_results(bench, baseline)

    def _checkpoint(self, bench: Benchmark) -> tuple[ResolvedCheckpoint | None, Problem | None]:
        """The checkpoint a Benchmark serves, resolved from its TrainingRun in the cache."""
        ref = bench.spec.model.checkpoint
        assert ref is not None
        ns = bench.metadata.namespace or "default"
        body = self.cache.get("TrainingRun", ns, ref.training_run)
        if body is None:
            return None, Problem(
                CHECKPOINT_UNAVAILABLE,
                f"TrainingRun {ref.training_run} does not exist in namespace {ns}",
            )
        try:
            run = TrainingRun.model_validate(body)
        except ValidationError:
            try:
                run = TrainingRun.model_validate({k: v for k, v in body.items() if k != "status"})
            except ValidationError:
                return None, Problem(
                    CHECKPOINT_UNAVAILABLE, f"TrainingRun {ref.training_run} has an invalid spec"
                )
        try:
            return builders.resolve_checkpoint(bench, run), None
        except BuildError as err:
            return None, Problem(CHECKPOINT_UNAVAILABLE, str(err))

    def _retained(
        self, resource: AnyResource, uid: str, state: RenderState, previous: Mapping[str, Any]
    ) -> set[Key]:
        """Owned children kept although the render left them out (finished Jobs).

        A Benchmark's runner Job goes once `ttlSecondsAfterFinished` has passed; the
        Benchmark keeps its status and results.
        """
        if isinstance(resource, Benchmark) and self._ttl_expired(resource, uid, previous):
            return set()
        ns = resource.metadata.namespace or "default"
        return {(kind, ns, name) for kind, name in builders.retained(resource, ns, state)}

    def _ttl_remaining(
        self, bench: Benchmark, uid: str, previous: Mapping[str, Any]
    ) -> float | None:
        ttl = bench.spec.ttl_seconds_after_finished
        finished, when = self._finished(uid, previous)
        if ttl is None or not finished:
            return None
        if not when:
            return float(ttl)
        done = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
        return ttl - (self.now() - done).total_seconds()

    def _ttl_expired(self, bench: Benchmark, uid: str, previous: Mapping[str, Any]) -> bool:
        remaining = self._ttl_remaining(bench, uid, previous)
        return remaining is not None and remaining <= 0

    def _requeue_after(
        self, resource: AnyResource, body: Mapping[str, Any], status: Mapping[str, Any]
    ) -> float | None:
        if isinstance(resource, Benchmark):
            remaining = self._ttl_remaining(resource, str(body["metadata"]["uid"]), status)
            if remaining is not None and remaining > 0:
                return remaining + 1.0
        return None

    def _patch_status(
        self,
        key: Key,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        computed: Mapping[str, Any],
    ) -> None:
        kind, ns, name = key
        with self._lock:
            known = self._condition_types.get(key, set())
            self._condition_types[key] = record_conditions(
                kind, ns, name, computed.get("conditions"), known
            )
        if kind == "Benchmark":
            record_benchmark(ns, name, computed)
        patch = status_patch(kind, previous, computed)
        if not patch:
            return
        self._warn_on_transition(body, previous, computed)
        for event in transition_events(kind, previous, computed):
            self.kube.event(body, event.type, event.reason, event.message)
        try:
            result = self.kube.patch_status(kind, ns, name, patch)
        except KubeError as err:
            ERRORS.labels(kind=kind, reason="StatusFailed").inc()
            if not err.not_found:
                raise
            return
        result.setdefault("kind", kind)
        self.cache.upsert(result)
        with self._lock:
            self.status_versions[key] = str(result["metadata"].get("resourceVersion"))

    def _warn_on_transition(
        self, body: Mapping[str, Any], previous: Mapping[str, Any], computed: Mapping[str, Any]
    ) -> None:
        """Post a Warning event when Ready turns False for a failure (not while starting up)."""
        new = c.find(computed.get("conditions"), c.READY)
        old = c.find(previous.get("conditions"), c.READY)
        if new is None or new.get("status") != "False":
            return
        if new.get("reason") not in (
            c.INVALID_SPEC,
            c.APPLY_FAILED,
            c.JOB_FAILED,
            c.PRUNE_FAILED,
            c.EXCEEDS_QUOTA,
            "Inadmissible",
        ):
            return
        if (
            old is not None
            and old.get("reason") == new.get("reason")
            and old.get("message") == new.get("message")
        ):
            return
        self.kube.event(body, "Warning", str(new["reason"]), str(new.get("message", "")))

    def _invalid(
        self,
        key: Key,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        generation: int | None,
        message: str,
    ) -> Outcome:
        """A spec the operator cannot use: say so in Ready and stop; no retry until it changes."""
        log.warning("%s %s/%s has an invalid spec: %s", *key, message)
        others = [
            c.Cond.stored(p) for p in previous.get("conditions") or () if p.get("type") != c.READY
        ]
        conds = [c.cond(c.READY, False, c.INVALID_SPEC, message), *others]
        computed = {
            **previous,
            "observedGeneration": generation,
            "conditions": merge_conditions(
                previous.get("conditions"), conds, generation=generation, now=self.now()
            ),
        }
        self._patch_status(key, body, previous, computed)
        return Outcome("invalid", None)
