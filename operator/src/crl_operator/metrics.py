"""Prometheus metrics of the operator (served on ``--metrics-port``, default 8080)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "crl_operator_reconciles_total",
    "Reconciles finished, by kind and result (ok, error, invalid, gone).",
    ["kind", "result"],
)
ERRORS = Counter(
    "crl_operator_reconcile_errors_total",
    "Reconcile errors, by kind and reason (ApplyFailed, StatusFailed, Unexpected).",
    ["kind", "reason"],
)
LATENCY = Histogram(
    "crl_operator_reconcile_duration_seconds",
    "Wall time of one reconcile, by kind.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
CHILDREN = Gauge(
    "crl_operator_children",
    "Children in the operator's cache, by kind and state (ready, progressing, finished, other).",
    ["kind", "state"],
)
API_REQUESTS = Counter(
    "crl_operator_api_requests_total",
    "Requests the reconciles sent to the API server, by verb and kind (watches not counted).",
    ["verb", "kind"],
)
APPLIES_SKIPPED = Counter(
    "crl_operator_applies_skipped_total",
    "Child applies skipped because the live object already matched, by kind.",
    ["kind"],
)
QUEUE_DEPTH = Gauge("crl_operator_queue_depth", "Resources waiting for a reconcile.")
CONDITIONS = Gauge(
    "crl_operator_resource_condition",
    "Conditions of each resource as its last reconcile wrote them: 1 when True, 0 otherwise,"
    " by kind, the resource's namespace and name, and condition type (for alerts such as"
    " inference unavailable). Not `namespace`/`name`: a scrape sets `namespace` to the"
    " operator's own.",
    ["kind", "resource_namespace", "resource_name", "condition"],
)


def record_conditions(
    kind: str, namespace: str, name: str, conditions: object, known: set[str]
) -> set[str]:
    """Set CONDITIONS for one resource from its status conditions; drop the series of types it
    no longer has. `known` holds the types set last time; returns the types set now."""
    now: set[str] = set()
    for entry in conditions if isinstance(conditions, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("type"), str):
            now.add(entry["type"])
            value = 1.0 if entry.get("status") == "True" else 0.0
            CONDITIONS.labels(kind, namespace, name, entry["type"]).set(value)
    for gone in known - now:
        forget_condition(kind, namespace, name, gone)
    return now


def forget_condition(kind: str, namespace: str, name: str, type_: str) -> None:
    """Remove one series of CONDITIONS (a condition or a resource that went away)."""
    with contextlib.suppress(KeyError):
        CONDITIONS.remove(kind, namespace, name, type_)


BENCHMARK_INSTANCES = Gauge(
    "crl_operator_benchmark_instances",
    "A Benchmark's progress as its status shows it: instances by state (total, done, resolved,"
    " errored), by the resource's namespace and name.",
    ["resource_namespace", "resource_name", "state"],
)
BENCHMARK_RESOLVE_RATE = Gauge(
    "crl_operator_benchmark_resolve_rate",
    "A Benchmark's resolve rate as its status shows it (resolved over finished instances).",
    ["resource_namespace", "resource_name"],
)
#: The progress fields exported by BENCHMARK_INSTANCES.
BENCHMARK_STATES = ("total", "done", "resolved", "errored")


def record_benchmark(namespace: str, name: str, status: object) -> None:
    """Set the Benchmark gauges from a computed status (fields it lacks are left out)."""
    if not isinstance(status, dict):
        return
    progress = status.get("progress")
    if isinstance(progress, dict):
        for state in BENCHMARK_STATES:
            value = progress.get(state)
            if isinstance(value, int | float) and not isinstance(value, bool):
                BENCHMARK_INSTANCES.labels(namespace, name, state).set(value)
    rate = status.get("resolveRate")
    if isinstance(rate, int | float) and not isinstance(rate, bool):
        BENCHMARK_RESOLVE_RATE.labels(namespace, name).set(rate)


def forget_benchmark(namespace: str, name: str) -> None:
    """Remove a deleted Benchmark's series."""
    for state in BENCHMARK_STATES:
        with contextlib.suppress(KeyError):
            BENCHMARK_INSTANCES.remove(namespace, name, state)
    with contextlib.suppress(KeyError):
        BENCHMARK_RESOLVE_RATE.remove(namespace, name)


QUARANTINED = Gauge(
    "crl_operator_pool_quarantined_tasks",
    "Tasks a RolloutPool's validation quarantined (never leased), by reason (the most common"
    " ones, as its status shows them), the resource's namespace and name.",
    ["resource_namespace", "resource_name", "reason"],
)
#: The reasons each pool's series were last set for (to drop the ones that went away).
_QUARANTINE_REASONS: dict[tuple[str, str], set[str]] = {}


def record_quarantined(namespace: str, name: str, status: object) -> None:
    """Set QUARANTINED for one pool from its computed status (`status.validation.reasons`)."""
    validation = status.get("validation") if isinstance(status, dict) else None
    if not isinstance(validation, dict):
        return
    now: set[str] = set()
    for entry in validation.get("reasons") or ():
        if isinstance(entry, dict) and isinstance(entry.get("reason"), str):
            now.add(entry["reason"])
            QUARANTINED.labels(namespace, name, entry["reason"]).set(int(entry.get("count", 0)))
    for gone in _QUARANTINE_REASONS.get((namespace, name), set()) - now:
        with contextlib.suppress(KeyError):
            QUARANTINED.remove(namespace, name, gone)
    _QUARANTINE_REASONS[(namespace, name)] = now


def forget_quarantined(namespace: str, name: str) -> None:
    """Remove a deleted pool's series."""
    for reason in _QUARANTINE_REASONS.pop((namespace, name), set()):
        with contextlib.suppress(KeyError):
            QUARANTINED.remove(namespace, name, reason)
