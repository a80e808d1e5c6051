"""The Grafana dashboard the chart ships (charts/coderepairrl/files/dashboard.json).

Written by `python -m crl_operator.generate` from the panels below, so the queries live in one
reviewed place; the tests parse every query with promtool and check that each metric it names is
exported by the operator, the pool gateway or the trainer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: Where the chart keeps the dashboard, relative to the repository root.
DASHBOARD_PATH = "charts/coderepairrl/files/dashboard.json"
#: The namespace filter every query carries (a Grafana variable; a valid PromQL regex string).
NS = 'namespace=~"$namespace"'


@dataclass(frozen=True)
class Panel:
    """One time-series panel: a title, its unit and PromQL queries with their legends."""

    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]
    description: str = ""


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Training",
        (
            Panel(
                "Mean reward per run",
                "none",
                ((f"crl_train_reward_mean{{{NS}}}", "{{namespace}}/{{pod}}"),),
                "Mean reward of the last optimizer step, per trainer (the pod name starts with"
                " the TrainingRun's).",
            ),
            Panel(
                "Loss per run",
                "none",
                ((f"crl_train_loss{{{NS}}}", "{{namespace}}/{{pod}}"),),
            ),
            Panel(
                "Steps per hour",
                "none",
                ((f"delta(crl_train_step{{{NS}}}[1h])", "{{namespace}}/{{pod}}"),),
            ),
            Panel(
                "Resolve rate and KL",
                "none",
                (
                    (f"crl_train_resolve_rate{{{NS}}}", "resolve {{pod}}"),
                    (f"crl_train_kl{{{NS}}}", "KL {{pod}}"),
                ),
            ),
            Panel(
                "Weight-sync version and lag",
                "none",
                (
                    (f"crl_train_policy_version{{{NS}}}", "version {{pod}}"),
                    (
                        f"crl_train_step{{{NS}}} - crl_train_policy_version{{{NS}}}",
                        "lag (steps) {{pod}}",
                    ),
                ),
                "The weights version the inference server holds, and how many steps it lags the"
                " trainer.",
            ),
            Panel(
                "Rollout staleness (p95, policy versions)",
                "none",
                (
                    (
                        "histogram_quantile(0.95, sum by (le, namespace, pod)"
                        f" (rate(crl_train_staleness_bucket{{{NS}}}[10m])))",
                        "{{namespace}}/{{pod}}",
                    ),
                ),
            ),
            Panel(
                "Rollouts by outcome (per minute)",
                "none",
                (
                    (
                        f"sum by (outcome) (rate(crl_train_rollouts_total{{{NS}}}[10m])) * 60",
                        "{{outcome}}",
                    ),
                ),
                "Resolved, unresolved, and infrastructure failures (dropped, not a zero reward).",
            ),
            Panel(
                "Rollout time (lease to verdict, evaluation included)",
                "s",
                (
                    (
                        "histogram_quantile(0.5, sum by (le)"
                        f" (rate(crl_train_rollout_seconds_bucket{{{NS}}}[10m])))",
                        "p50",
                    ),
                    (
                        "histogram_quantile(0.95, sum by (le)"
                        f" (rate(crl_train_rollout_seconds_bucket{{{NS}}}[10m])))",
                        "p95",
                    ),
                ),
            ),
        ),
    ),
    (
        "Sandboxes",
        (
            Panel(
                "Pool occupancy",
                "none",
                (
                    (
                        f"sum by (pool, state) (crl_pool_sandboxes{{{NS}}})",
                        "{{pool}} {{state}}",
                    ),
                    (f"sum by (pool) (crl_pool_waiting_requests{{{NS}}})", "{{pool}} waiting"),
                ),
                "Sandboxes by state (ready, leased, starting, resetting) and lease requests"
                " waiting for one.",
            ),
            Panel(
                "Lease latency",
                "s",
                (
                    (
                        "histogram_quantile(0.5, sum by (le, pool)"
                        f" (rate(crl_pool_acquire_seconds_bucket{{{NS}}}[10m])))",
                        "{{pool}} p50",
                    ),
                    (
                        "histogram_quantile(0.95, sum by (le, pool)"
                        f" (rate(crl_pool_acquire_seconds_bucket{{{NS}}}[10m])))",
                        "{{pool}} p95",
                    ),
                ),
            ),
            Panel(
                "Leases by source (per minute)",
                "none",
                (
                    (
                        f"sum by (pool, source) (rate(crl_pool_leases_total{{{NS}}}[10m])) * 60",
                        "{{pool}} {{source}}",
                    ),
                ),
            ),
            Panel(
                "Sandbox failures by stage (per minute)",
                "none",
                (
                    (
                        "sum by (pool, stage)"
                        f" (rate(crl_pool_sandbox_failures_total{{{NS}}}[10m])) * 60",
                        "{{pool}} {{stage}}",
                    ),
                    (
                        "sum by (pool, reason)"
                        f" (rate(crl_pool_sandboxes_replaced_total{{{NS}}}[10m])) * 60",
                        "{{pool}} replaced: {{reason}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Benchmarks",
        (
            Panel(
                "Benchmark progress",
                "none",
                (
                    (
                        'crl_operator_benchmark_instances{state=~"done|resolved|errored",'
                        'resource_namespace=~"$namespace"}',
                        "{{resource_name}} {{state}}",
                    ),
                    (
                        'crl_operator_benchmark_instances{state="total",'
                        'resource_namespace=~"$namespace"}',
                        "{{resource_name}} total",
                    ),
                ),
                "Instances done, resolved and errored, from each Benchmark's status.",
            ),
            Panel(
                "Benchmark resolve rate",
                "percentunit",
                (
                    (
                        'crl_operator_benchmark_resolve_rate{resource_namespace=~"$namespace"}',
                        "{{resource_name}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Operator",
        (
            Panel(
                "Reconcile latency",
                "s",
                (
                    (
                        "histogram_quantile(0.95, sum by (le, kind)"
                        " (rate(crl_operator_reconcile_duration_seconds_bucket[10m])))",
                        "{{kind}} p95",
                    ),
                ),
            ),
            Panel(
                "Reconciles and errors (per minute)",
                "none",
                (
                    (
                        "sum by (kind, result) (rate(crl_operator_reconciles_total[10m])) * 60",
                        "{{kind}} {{result}}",
                    ),
                    (
                        "sum by (kind, reason)"
                        " (rate(crl_operator_reconcile_errors_total[10m])) * 60",
                        "{{kind}} error {{reason}}",
                    ),
                ),
            ),
            Panel(
                "Resources not Ready",
                "none",
                (
                    (
                        'sum by (kind) (crl_operator_resource_condition{condition="Ready",'
                        'resource_namespace=~"$namespace"} == bool 0)',
                        "{{kind}}",
                    ),
                ),
            ),
            Panel(
                "Work queue depth",
                "none",
                (("crl_operator_queue_depth", "queue"),),
            ),
        ),
    ),
)


def queries() -> list[str]:
    """Every PromQL query of the dashboard."""
    return [expr for _, panels in ROWS for panel in panels for expr, _ in panel.queries]


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "expr": expr,
                "legendFormat": legend,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
            }
            for i, (expr, legend) in enumerate(panel.queries)
        ],
    }


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    panels: list[dict[str, Any]] = []
    y, next_id = 0, 1
    for title, row in ROWS:
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        for i, panel in enumerate(row):
            panels.append(_panel(panel, next_id, 12 * (i % 2), y + 8 * (i // 2)))
            next_id += 1
        y += 8 * ((len(row) + 1) // 2)
    return {
        "uid": "coderepairrl",
        "title": "CodeRepairRL",
        "description": "Training runs, sandbox pools, benchmarks and the operator (coderepair.io).",
        "tags": ["coderepairrl"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                },
                {
                    "name": "namespace",
                    "label": "Namespace",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(crl_operator_resource_condition, resource_namespace)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }


def dashboard_json() -> str:
    """The dashboard file's text."""
    return json.dumps(dashboard(), indent=2) + "\n"
