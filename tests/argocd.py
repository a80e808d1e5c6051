"""Argo CD pieces the GitOps tests share: the health checks' folder and the argocdhealth tool.

`tests/argocdhealth` is a small Go program built from Argo CD's own module (v3.5.7): it runs the
health.lua scripts through `util/lua`, the code Argo CD's application controller runs.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from .paths import ROOT, run

#: The health checks in Argo CD's resource_customizations layout (<group>/<Kind>/health.lua).
CUSTOMIZATIONS = ROOT / "gitops" / "argocd" / "resource_customizations"
GROUP_DIR = CUSTOMIZATIONS / "coderepair.io"
KINDS = ("TrainingRun", "RolloutPool", "Benchmark")
#: The argocd-cm snippet built from the scripts (crl_operator.generate writes it).
ARGOCD_CM = ROOT / "gitops" / "argocd" / "argocd-cm.yaml"


def build_argocdhealth() -> Path:
    """Build (or reuse) the argocdhealth binary; skip without Go, except under CI=true."""
    if shutil.which("go") is None:
        if os.environ.get("CI"):
            pytest.fail("Go is needed in CI to build tests/argocdhealth")
        pytest.skip("Go is not installed: tests/argocdhealth is built from Argo CD's Go module")
    result = run(["bash", str(ROOT / "tests" / "argocdhealth" / "build.sh")], timeout=1800)
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])


def evaluate(binary: Path, customizations: Path, *files: Path) -> list[dict[str, Any]]:
    """Argo CD's health of every object in `files`, one dict per object."""
    result = run([str(binary), "eval", str(customizations), *map(str, files)])
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]
