"""The CRDs and manifests through Kubernetes' own validation code (k8s.io/apiextensions-apiserver).

`tests/crdcheck` is a small Go program built from the Kubernetes modules: it runs what a real
kube-apiserver runs when a CRD or a custom object is created (structural-schema checks, CEL
compilation and cost limits; defaulting, OpenAPI and CEL validation). These tests hold the
generated CRDs to it, and hold the offline validator (`crl validate`, CEL by cel-python) to the
same verdicts as the API server on every example and every wrong manifest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from crl_worker.api.validation import validate_file

from .fixtures.crdcheck import CRDCHECK_SRC
from .fixtures.paths import EDGE, EXAMPLES, INVALID, ROOT, run, verdict

pytestmark = pytest.mark.go

CRDS = sorted((ROOT / "crds").glob("*.yaml"))


def _objects(binary: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    args = [str(binary), "objects"]
    for crd in CRDS:
        args += ["--crds", str(crd)]
    return run([*args, *map(str, files)])


def test_the_tool_passes_its_own_tests() -> None:
    if shutil.which("go") is None:
        pytest.skip("Go is not installed")
    env = {
        **os.environ,
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=mod -trimpath",  # the flags of its build: the compiled packages are reused
        "CGO_ENABLED": "0",
    }
    cache = Path(os.environ.get("CRL_CACHE_DIR", Path.home() / ".cache" / "coderepairrl"))
    env.setdefault("GOMODCACHE", str(cache / "go" / "mod"))
    env.setdefault("GOCACHE", str(cache / "go" / "build"))
    result = run(["go", "test", "./..."], cwd=CRDCHECK_SRC, env=env, timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr


def _pins(go_mod: Path) -> dict[str, str]:
    """The version go.mod gives each module it requires, a replacement's where it has one."""
    pins: dict[str, str] = {}
    replaced: dict[str, str] = {}
    block = ""
    for raw in go_mod.read_text().splitlines():
        line = raw.split("//")[0].strip()
        if line.endswith("("):
            block = line[:-1].strip()
            continue
        if line == ")":
            block = ""
            continue
        words = line.split()
        if words and words[0] in ("require", "replace"):
            block, words = words[0], words[1:]
        if block == "require" and len(words) == 2:
            pins[words[0]] = words[1]
        elif block == "replace" and "=>" in words and len(words) == words.index("=>") + 3:
            replaced[words[0]] = words[-1]
    return {module: replaced.get(module, version) for module, version in pins.items()}


#: The Go tools built beside the control plane, each with the modules it may keep at another
#: version (the one its upstream code needs: tests/argocdhealth/go.mod says why).
_GO_TOOLS = {
    "crdcheck": (CRDCHECK_SRC, set()),
    "tools": (ROOT / "tests" / "controlplane" / "tools", set()),
    "argocdhealth": (ROOT / "tests" / "argocdhealth", {"k8s.io/kubectl"}),
}


@pytest.mark.parametrize("tool", sorted(_GO_TOOLS))
def test_go_tools_pin_the_control_planes_versions(tool: str) -> None:
    # A module at another version than the control plane's is compiled twice on a cold machine,
    # with every package above it (minutes of CI); bump them together (tests/build_go_tool.sh).
    module, exceptions = _GO_TOOLS[tool]
    control_plane = _pins(ROOT / "tests" / "controlplane" / "go.mod")
    pinned = _pins(module / "go.mod")
    apart = {
        name: (version, control_plane[name])
        for name, version in pinned.items()
        if name in control_plane and control_plane[name] != version and name not in exceptions
    }
    assert not apart, apart
    assert pinned["k8s.io/apiextensions-apiserver"] == control_plane["k8s.io/apiserver"]


def test_the_api_server_accepts_the_generated_crds(crdcheck: Path) -> None:
    result = run([str(crdcheck), "crds", *map(str, CRDS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == sorted(
        ["ok", "ok", "ok", "benchmarks.coderepair.io", "rolloutpools.coderepair.io",
         "trainingruns.coderepair.io"]
    )  # fmt: skip


def test_the_api_server_rejects_a_broken_crd(crdcheck: Path, tmp_path: Path) -> None:
    """The check above can fail: a CEL rule reading a field that does not exist is refused."""
    text = CRDS[-1].read_text().replace("self.gpus % self.tensorParallelSize", "self.gpu % 2", 1)
    assert text != CRDS[-1].read_text()
    broken = tmp_path / "broken.yaml"
    broken.write_text(text)
    result = run([str(crdcheck), "crds", str(broken)])
    assert result.returncode == 1
    assert "undefined field 'gpu'" in result.stdout


def test_the_api_server_accepts_every_example(crdcheck: Path) -> None:
    result = _objects(crdcheck, *EXAMPLES)
    assert result.returncode == 0, result.stderr
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(docs) == len(EXAMPLES)
    assert [d["errors"] for d in docs] == [[]] * len(EXAMPLES)


def _expected_path(path: Path) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith("# expect-path: "):
            return line.removeprefix("# expect-path: ")
    return None


@pytest.mark.parametrize("manifest", INVALID, ids=lambda p: p.name)
def test_offline_and_api_server_agree_on_wrong_manifests(crdcheck: Path, manifest: Path) -> None:
    offline = [p for r in validate_file(manifest) for p in r.problems]
    assert offline, "crl validate accepted it"
    result = _objects(crdcheck, manifest)
    if result.returncode == 2 or not result.stdout.strip():
        # Not an object of ours at all (another kind, a version not served, not YAML, not a
        # mapping, nothing): the API server would not even get to validation.
        assert result.returncode == 2 or manifest.read_text().count("\n") <= 1, result.stderr
        return
    [doc] = [json.loads(line) for line in result.stdout.splitlines()]
    assert doc["errors"], f"the API server accepts {manifest.name}"
    expected = _expected_path(manifest)
    if expected is not None and "duplicate" not in manifest.name:
        assert any(expected in e for e in doc["errors"]), doc["errors"]


@pytest.mark.parametrize("manifest", EDGE, ids=lambda p: p.name)
def test_the_api_server_gives_the_edge_case_verdict(crdcheck: Path, manifest: Path) -> None:
    """The same verdict as `crl validate` (test_validate.py checks that side)."""
    result = _objects(crdcheck, manifest)
    assert result.returncode == 0, result.stderr
    [doc] = [json.loads(line) for line in result.stdout.splitlines()]
    got = "invalid" if doc["errors"] else "valid"
    assert got == verdict(manifest), doc["errors"]
