"""What the observability tests share: promtool, the chart's rendered alert rules, and the
metric names the rules and the dashboard use."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .paths import ROOT, run

CHART = ROOT / "charts" / "coderepairrl"
ALERT_TESTS = ROOT / "tests" / "promtool" / "alerts_test.yaml"
#: PromQL words that look like metric names but are not.
_NOT_METRICS = {"bool", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
                "and", "or", "unless", "le"}  # fmt: skip
_NAME = re.compile(r"\b(crl_[a-z0-9_]+)\b")


def build_promtool() -> Path:
    """Build (or reuse) promtool from the Prometheus Go module; skip without Go (not in CI)."""
    if shutil.which("go") is None:
        if os.environ.get("CI"):
            pytest.fail("Go is needed in CI to build promtool (tests/promtool)")
        pytest.skip("Go is not installed: promtool is built from the Prometheus Go module")
    result = run(["bash", str(ROOT / "tests" / "promtool" / "build.sh")], timeout=3600)
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])


def helm_template(helm: str, *args: str) -> list[dict[str, Any]]:
    """`helm template` of the chart, as documents."""
    result = run([helm, "template", "crl", str(CHART), "--namespace", "crl-system", *args])
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def rendered_rules(helm: str, *args: str) -> dict[str, Any]:
    """The PrometheusRule's spec (a Prometheus rule file) with the rule enabled."""
    docs = helm_template(helm, "--set", "metrics.prometheusRule.enabled=true", *args)
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    spec: dict[str, Any] = rule["spec"]
    return spec


def metric_names(expr: str) -> set[str]:
    """The project's metric names (crl_*) an expression reads."""
    return {m for m in _NAME.findall(expr) if m not in _NOT_METRICS}


def exported_names(text: str) -> set[str]:
    """Every series name a /metrics page can hold, from its families (samples or not yet):
    counters as name_total, histograms as name_bucket/_sum/_count."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type in ("histogram", "summary"):
            names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names
