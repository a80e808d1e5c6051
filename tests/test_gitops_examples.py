"""examples/gitops: the app of apps a team copies, held to Argo CD's own Application CRD (through
tests/crdcheck, the API server's validation code) and to the project's validation.

The Application CRD is the one in Argo CD's Go module (v3.5.7, the version whose Lua health code
tests/argocdhealth runs), fetched into the Go module cache as tests/argocdhealth's build does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl_worker.api.validation import validate_file

from .fixtures.helm import helm_binary
from .fixtures.paths import ROOT, run

pytestmark = pytest.mark.go

GITOPS = ROOT / "examples" / "gitops"
APPLICATIONS = [GITOPS / "root-app.yaml", *sorted((GITOPS / "apps").glob("*.yaml"))]
TEAM = sorted((GITOPS / "team-a").glob("*.yaml"))
ARGOCD = "github.com/argoproj/argo-cd/v3@v3.5.7"


@pytest.fixture(scope="module")
def application_crd(crdcheck: Path) -> Path:
    """Argo CD's Application CRD from its Go module."""
    cache = Path(os.environ.get("CRL_CACHE_DIR", Path.home() / ".cache" / "coderepairrl"))
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    env.setdefault("GOMODCACHE", str(cache / "go" / "mod"))
    result = run(["go", "mod", "download", "-json", ARGOCD], cwd=Path("/"), env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    crd = Path(json.loads(result.stdout)["Dir"]) / "manifests" / "crds" / "application-crd.yaml"
    assert crd.is_file()
    return crd


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def check(crdcheck: Path, crd: Path, *files: Path) -> list[dict[str, Any]]:
    result = run([str(crdcheck), "objects", "--crds", str(crd), *map(str, files)])
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_argo_cd_accepts_the_applications(crdcheck: Path, application_crd: Path) -> None:
    docs = check(crdcheck, application_crd, *APPLICATIONS)
    assert len(docs) == len(APPLICATIONS)
    assert [d["errors"] for d in docs] == [[]] * len(APPLICATIONS)


def test_argo_cd_refuses_a_wrong_application(
    crdcheck: Path,
    application_crd: Path,
    tmp_path: Path,
) -> None:
    """The check above can fail: a sync policy of the wrong type is refused."""
    doc = load(GITOPS / "apps" / "team-a.yaml")
    doc["spec"]["syncPolicy"]["automated"]["prune"] = "sometimes"
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(doc))
    [got] = check(crdcheck, application_crd, wrong)
    assert any("prune" in e for e in got["errors"]), got


def test_the_team_s_resources_are_valid() -> None:
    assert TEAM
    for path in TEAM:
        for result in validate_file(path):
            assert not result.problems, (path, result.problems)


def test_the_app_of_apps_holds_together() -> None:
    root = load(GITOPS / "root-app.yaml")
    assert (ROOT / root["spec"]["source"]["path"]) == GITOPS / "apps"
    apps = {load(p)["metadata"]["name"]: load(p) for p in APPLICATIONS[1:]}
    for app in apps.values():
        assert (ROOT / app["spec"]["source"]["path"]).is_dir()
    operator = apps["coderepairrl-operator"]
    team = apps["coderepairrl-team-a"]

    def wave(app: dict[str, Any]) -> int:
        return int(app["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])

    assert wave(operator) < wave(team), "the CRDs and the operator sync before the resources"
    assert "SkipDryRunOnMissingResource=true" in team["spec"]["syncPolicy"]["syncOptions"]
    assert "ServerSideApply=true" in operator["spec"]["syncPolicy"]["syncOptions"]
    assert team["spec"]["source"]["path"] == "examples/gitops/team-a"


def test_the_operator_application_s_values_render(tmp_path: Path) -> None:
    values = load(GITOPS / "apps" / "coderepairrl-operator.yaml")["spec"]["source"]["helm"]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values["valuesObject"]))
    result = run([helm_binary(), "template", values["releaseName"], str(ROOT / "charts/coderepairrl"),
                  "-f", str(path)])  # fmt: skip
    assert result.returncode == 0, result.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    assert {"PrometheusRule", "ServiceMonitor", "ConfigMap", "Deployment"} <= kinds
