"""The Argo CD health checks (gitops/argocd/resource_customizations) through Argo CD's own code.

`argocdhealth test` runs every health_test.yaml the way Argo CD's repository tests its built-in
checks: health.lua on each testdata object, compared with the expected status and message. The
fixtures are status objects the operator wrote (tests/test_gitops_e2e.py captures them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from crl_operator.gitops import argocd_cm, health_scripts

from .fixtures.argocd_health import (
    ARGOCD_CM,
    CUSTOMIZATIONS,
    GROUP_DIR,
    KINDS,
    build_argocdhealth,
    evaluate,
)
from .fixtures.paths import ROOT, run

pytestmark = pytest.mark.go


@pytest.fixture(scope="module")
def argocdhealth() -> Path:
    """The argocdhealth binary (built from Argo CD's Go module on first use: minutes)."""
    return build_argocdhealth()


def cases(kind: str) -> list[dict[str, object]]:
    """The test cases of one kind's health_test.yaml."""
    tests: list[dict[str, object]] = yaml.safe_load(
        (GROUP_DIR / kind / "health_test.yaml").read_text()
    )["tests"]
    return tests


def test_every_kind_has_a_check_tests_and_fixtures() -> None:
    for kind in KINDS:
        assert (GROUP_DIR / kind / "health.lua").is_file()
        used = {str(c["inputPath"]) for c in cases(kind)}
        on_disk = {f"testdata/{p.name}" for p in (GROUP_DIR / kind / "testdata").glob("*.yaml")}
        assert used == on_disk, f"{kind}: every fixture is a case and every case has a fixture"


def test_the_states_a_person_cares_about_are_covered() -> None:
    def statuses(kind: str) -> set[str]:
        return {str(c["healthStatus"]["status"]) for c in cases(kind)}  # type: ignore[index]

    batch = {"Healthy", "Progressing", "Degraded", "Suspended"}
    assert statuses("TrainingRun") == batch
    assert statuses("Benchmark") == batch
    assert statuses("RolloutPool") == {"Healthy", "Progressing", "Degraded"}
    # A queued (Kueue) or suspended run is not Degraded; a failed trainer is.
    by_file = {c["inputPath"]: c["healthStatus"]["status"] for c in cases("TrainingRun")}  # type: ignore[index]
    assert by_file["testdata/suspended_queued_by_kueue.yaml"] == "Suspended"
    assert by_file["testdata/suspended_by_spec.yaml"] == "Suspended"
    assert by_file["testdata/degraded_trainer_failed.yaml"] == "Degraded"


def test_argo_cd_gives_every_expected_health(argocdhealth: Path) -> None:
    result = run([str(argocdhealth), "test", str(CUSTOMIZATIONS)])
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == sum(len(cases(k)) for k in KINDS)
    assert all(line["ok"] for line in lines)


def test_a_wrong_expectation_fails(argocdhealth: Path, tmp_path: Path) -> None:
    """The check above can fail: one expected status changed makes the tool exit 1."""
    copy = tmp_path / "resource_customizations"
    shutil.copytree(CUSTOMIZATIONS, copy)
    path = copy / "coderepair.io" / "TrainingRun" / "health_test.yaml"
    text = path.read_text()
    assert "status: Degraded" in text
    path.write_text(text.replace("status: Degraded", "status: Healthy", 1))
    result = run([str(argocdhealth), "test", str(copy)])
    assert result.returncode == 1, result.stdout + result.stderr
    assert any(not json.loads(line)["ok"] for line in result.stdout.splitlines())


def test_a_broken_script_is_an_error_not_a_health(argocdhealth: Path, tmp_path: Path) -> None:
    copy = tmp_path / "resource_customizations"
    shutil.copytree(CUSTOMIZATIONS, copy)
    script = copy / "coderepair.io" / "RolloutPool" / "health.lua"
    script.write_text(
        script.read_text().replace("local ready = ", "local ready = obj.nothing.here + ", 1)
    )
    [got] = evaluate(
        argocdhealth, copy, GROUP_DIR / "RolloutPool" / "testdata" / "healthy_gateway_up.yaml"
    )
    assert "attempt to index" in got["error"], got


def test_other_kinds_are_left_to_argo_cd(argocdhealth: Path, tmp_path: Path) -> None:
    other = tmp_path / "cm.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    [got] = evaluate(argocdhealth, CUSTOMIZATIONS, other)
    assert "no health check" in got["error"]


def test_the_argocd_cm_snippet_holds_the_scripts_verbatim() -> None:
    doc = yaml.safe_load(ARGOCD_CM.read_text())
    assert doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "argocd-cm"
    assert doc["data"] == {
        f"resource.customizations.health.coderepair.io_{kind}": (
            GROUP_DIR / kind / "health.lua"
        ).read_text()
        for kind in KINDS
    }
    assert ARGOCD_CM.read_text() == argocd_cm(ROOT)
    assert len(health_scripts(ROOT)) == len(KINDS)
