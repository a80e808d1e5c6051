"""The chart's alerts (PrometheusRule) and Grafana dashboard, checked with promtool, and the
metrics they read checked against what the components really export.

promtool is Debian's (Prometheus 2.42, unpacked from the package) where apt can fetch it, else
built from the Prometheus Go module (Prometheus 3.16.0; tests/promtool/build.sh): `promtool
check rules` parses every alert and every dashboard query; `promtool test rules` runs
tests/promtool/alerts_test.yaml, where each alert fires on one input and stays quiet on others.
The metric names are read from /metrics of a real pool gateway process and a real trainer
monitor over HTTP, and from the operator's registry (tests/test_gitops_e2e.py scrapes the real
operator process too).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml

from crl_operator import metrics as operator_metrics
from crl_operator.dashboard import DASHBOARD_PATH, dashboard, queries
from crl_worker.train.monitor import Monitor, RolloutStats

from .fixtures.gateway import GatewayProcess
from .fixtures.helm import helm_binary
from .fixtures.observability import (
    ALERT_TESTS,
    CHART,
    build_promtool,
    exported_names,
    helm_template,
    metric_names,
    rendered_rules,
)
from .fixtures.paths import ROOT, run
from .fixtures.ports import free_port

pytestmark = pytest.mark.go


@pytest.fixture(scope="module")
def promtool() -> Path:
    """promtool: Debian's, or built from the Prometheus Go module on first use (minutes)."""
    return build_promtool()


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def write_rules(directory: Path, rules: dict[str, Any]) -> Path:
    """The rule file promtool reads, with the unit tests beside it."""
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copyfile(ALERT_TESTS, directory / ALERT_TESTS.name)
    return path


def alerts(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rules["groups"] for r in group["rules"] if "alert" in r}


# --- alerts ------------------------------------------------------------------------------------


def test_the_rule_is_off_by_default(helm: str) -> None:
    kinds = {d["kind"] for d in helm_template(helm)}
    assert "PrometheusRule" not in kinds


def test_the_issue_s_alerts_are_there(helm: str) -> None:
    assert set(alerts(rendered_rules(helm))) == {
        "CRLTrainingStalled", "CRLRewardCollapsed", "CRLRewardOrLossNotFinite",
        "CRLInfrastructureFailuresHigh", "CRLWeightSyncLagging", "CRLPoolNoReadySandboxes",
        "CRLSandboxFailures", "CRLInferenceUnavailable", "CRLOperatorReconcileErrors",
    }  # fmt: skip


def test_promtool_accepts_the_rules(helm: str, promtool: Path, tmp_path: Path) -> None:
    path = write_rules(tmp_path, rendered_rules(helm))
    result = run([str(promtool), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_each_alert_fires_and_stays_quiet(helm: str, promtool: Path, tmp_path: Path) -> None:
    write_rules(tmp_path, rendered_rules(helm))
    result = run([str(promtool), "test", "rules", str(tmp_path / ALERT_TESTS.name)])
    assert result.returncode == 0, result.stdout + result.stderr
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    checks = [c for t in cases for c in t["alert_rule_test"]]
    for name in alerts(rendered_rules(helm)):
        mine = [c for c in checks if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name} has no firing case"
        assert any(not c["exp_alerts"] for c in mine), f"{name} has no quiet case"


def test_the_unit_tests_can_fail(helm: str, promtool: Path, tmp_path: Path) -> None:
    """A threshold from values changes what fires, and promtool says so."""
    rules = rendered_rules(helm, "--set", "metrics.prometheusRule.weightSyncLagSteps=100")
    assert "> 100" in alerts(rules)["CRLWeightSyncLagging"]["expr"]
    write_rules(tmp_path, rules)
    result = run([str(promtool), "test", "rules", str(tmp_path / ALERT_TESTS.name)])
    assert result.returncode != 0
    assert "CRLWeightSyncLagging" in result.stdout + result.stderr


def test_the_rule_carries_the_selected_labels(helm: str) -> None:
    docs = helm_template(helm, "--set", "metrics.prometheusRule.enabled=true",
                         "--set", "metrics.prometheusRule.labels.release=prom")  # fmt: skip
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["namespace"] == "crl-system"


def test_the_schema_refuses_a_wrong_threshold(helm: str) -> None:
    result = run([helm, "template", "crl", str(CHART),
                  "--set", "metrics.prometheusRule.stalledAfter=soon"])  # fmt: skip
    assert result.returncode != 0
    assert "stalledAfter" in result.stderr


PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"


def test_the_prometheus_operator_accepts_the_rule_and_the_monitor(
    helm: str,
    crdcheck: Path,
    tmp_path: Path,
) -> None:
    """The PrometheusRule and ServiceMonitor through the API server's validation (tests/crdcheck)
    with the Prometheus Operator's own CRDs, from its Go module."""
    cache = Path(os.environ.get("CRL_CACHE_DIR", Path.home() / ".cache" / "coderepairrl"))
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    env.setdefault("GOMODCACHE", str(cache / "go" / "mod"))
    got = run(["go", "mod", "download", "-json", PROMETHEUS_OPERATOR], cwd=Path("/"), env=env)
    assert got.returncode == 0, got.stdout + got.stderr
    crds = Path(json.loads(got.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    docs = [d for d in helm_template(helm, "--set", "metrics.prometheusRule.enabled=true",
                                     "--set", "metrics.serviceMonitor.enabled=true")
            if d["kind"] in ("PrometheusRule", "ServiceMonitor")]  # fmt: skip
    manifest = tmp_path / "monitoring.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    args = [str(crdcheck), "objects", "--crds", str(crds / "monitoring.coreos.com_prometheusrules.yaml"),
            "--crds", str(crds / "monitoring.coreos.com_servicemonitors.yaml"), str(manifest)]  # fmt: skip
    result = run(args)
    assert result.returncode == 0, result.stderr
    verdicts = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(v["kind"] for v in verdicts) == ["PrometheusRule", "ServiceMonitor"]
    assert [v["errors"] for v in verdicts] == [[], []]
    # It can fail: a rule without an expression is refused.
    docs[0 if docs[0]["kind"] == "PrometheusRule" else 1]["spec"]["groups"][0]["rules"][0].pop(
        "expr"
    )
    manifest.write_text(yaml.safe_dump_all(docs))
    result = run(args)
    assert any(json.loads(line)["errors"] for line in result.stdout.splitlines()), result.stdout


# --- dashboard ---------------------------------------------------------------------------------


def test_the_dashboard_ships_for_the_sidecar(helm: str) -> None:
    names = {d["metadata"]["name"] for d in helm_template(helm) if d["kind"] == "ConfigMap"}
    assert not any(n.endswith("-dashboard") for n in names)  # off by default
    docs = helm_template(helm, "--set", "metrics.dashboard.enabled=true",
                         "--set", "metrics.dashboard.folder=Training")  # fmt: skip
    [cm] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Training"}
    assert json.loads(cm["data"]["coderepairrl.json"]) == dashboard()
    assert json.loads((ROOT / DASHBOARD_PATH).read_text()) == dashboard()


def test_the_dashboard_has_the_issue_s_panels() -> None:
    titles = {p["title"] for p in dashboard()["panels"]}
    for wanted in ("Mean reward per run", "Loss per run", "Steps per hour",
                   "Weight-sync version and lag", "Rollouts by outcome (per minute)",
                   "Pool occupancy", "Lease latency", "Benchmark progress",
                   "Benchmark resolve rate", "Reconcile latency",
                   "Reconciles and errors (per minute)"):  # fmt: skip
        assert wanted in titles
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_every_dashboard_query_parses(promtool: Path, tmp_path: Path) -> None:
    """promtool parses each query as a recording rule (Grafana's $namespace sits in a regex
    string, so the query is valid PromQL as written)."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries())
    ]}]}  # fmt: skip
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = run([str(promtool), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yaml"
    rules["groups"][0]["rules"][0]["expr"] = "sum by (pool (crl_pool_sandboxes)"
    broken.write_text(yaml.safe_dump(rules))
    assert run([str(promtool), "check", "rules", str(broken)]).returncode != 0


# --- the metric names are real -----------------------------------------------------------------


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.fixture
def trainer_names(tmp_path: Path) -> set[str]:
    """What a trainer's /metrics serves over HTTP after one step."""
    port = free_port()
    monitor = Monitor(tmp_path, run_name="obs", total_steps=10, metrics_port=port)
    stats = RolloutStats(rollouts=2, scored=2, resolved=1, reward_sum=1.0, reward_sq_sum=1.0)
    monitor.record_step(1, stats, {"loss": 0.5}, policy_version=1, step_seconds=2.0)
    return exported_names(scrape(f"http://127.0.0.1:{port}/metrics"))


@pytest.fixture
def gateway_names(start_gateway: Callable[..., GatewayProcess]) -> set[str]:
    """What a real pool gateway process serves on /metrics."""
    gateway = start_gateway("--max-sandboxes", "1", "--warm", "0")
    return exported_names(scrape(f"{gateway.url}/metrics"))


def operator_names() -> set[str]:
    """The operator's registry (the process-global one its /metrics serves)."""
    return exported_names(prometheus_client.generate_latest().decode())


def test_every_metric_the_rules_and_dashboard_read_is_exported(
    helm: str, trainer_names: set[str], gateway_names: set[str]
) -> None:
    exported = trainer_names | gateway_names | operator_names()
    used: set[str] = set()
    for rule in alerts(rendered_rules(helm)).values():
        used |= metric_names(rule["expr"])
    for expr in queries():
        used |= metric_names(expr)
    assert used, "no metric names found"
    assert sorted(used - exported) == []
    # Each component contributes: a rename in any of them fails this test.
    assert used & trainer_names and used & gateway_names and used & operator_names()


# --- the metrics added for the alerts ----------------------------------------------------------


def test_a_non_finite_loss_is_counted(tmp_path: Path) -> None:
    port = free_port()
    monitor = Monitor(tmp_path, run_name="nan", total_steps=10, metrics_port=port)
    before = exported_names(scrape(f"http://127.0.0.1:{port}/metrics"))
    assert "crl_train_nonfinite_values_total" in before  # exported at 0 from the start
    stats = RolloutStats(rollouts=1, scored=1, reward_sum=0.0)
    monitor.record_step(1, stats, {"loss": math.nan, "kl": 0.1}, policy_version=1, step_seconds=1)
    monitor.record_step(2, stats, {"loss": math.inf}, policy_version=2, step_seconds=1)
    text = scrape(f"http://127.0.0.1:{port}/metrics")
    assert 'crl_train_nonfinite_values_total{metric="loss"} 2.0' in text
    assert 'crl_train_nonfinite_values_total{metric="kl"} 0.0' in text


def series(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one operator metric in the global registry, by sorted labels."""
    out = {}
    for family in prometheus_client.REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_conditions_are_exported_and_forgotten() -> None:
    name = "crl_operator_resource_condition"
    conds = [{"type": "Ready", "status": "True"}, {"type": "InferenceReady", "status": "False"}]
    known = operator_metrics.record_conditions("TrainingRun", "obs-ns", "r1", conds, set())
    assert known == {"Ready", "InferenceReady"}
    mine = {k: v for k, v in series(name).items() if ("resource_namespace", "obs-ns") in k}
    ready = (("condition", "Ready"), ("kind", "TrainingRun"),
             ("resource_name", "r1"), ("resource_namespace", "obs-ns"))  # fmt: skip
    assert mine[ready] == 1.0 and len(mine) == 2
    # A condition that went away, then the whole resource.
    known = operator_metrics.record_conditions("TrainingRun", "obs-ns", "r1", conds[:1], known)
    assert len([k for k in series(name) if ("resource_namespace", "obs-ns") in k]) == 1
    operator_metrics.record_conditions("TrainingRun", "obs-ns", "r1", "not a list", known)
    assert not [k for k in series(name) if ("resource_namespace", "obs-ns") in k]


def test_benchmark_progress_is_exported() -> None:
    status = {"progress": {"total": 300, "done": 10, "resolved": 4, "errored": 2},
              "resolveRate": 0.5}  # fmt: skip
    operator_metrics.record_benchmark("obs-ns", "b1", status)
    got = {dict(k)["state"]: v for k, v in series("crl_operator_benchmark_instances").items()
           if ("resource_name", "b1") in k}  # fmt: skip
    assert got == {"total": 300, "done": 10, "resolved": 4, "errored": 2}
    assert (
        series("crl_operator_benchmark_resolve_rate")[
            (("resource_name", "b1"), ("resource_namespace", "obs-ns"))
        ]
        == 0.5
    )
    operator_metrics.record_benchmark("obs-ns", "b1", {"progress": {"done": True}})  # ignored
    operator_metrics.forget_benchmark("obs-ns", "b1")
    assert not [
        k for k in series("crl_operator_benchmark_instances") if ("resource_name", "b1") in k
    ]
