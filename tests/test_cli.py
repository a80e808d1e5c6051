"""The `crl` command line, run as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from crl_operator.crds import all_crds_yaml

from .fixtures.cli import crl
from .fixtures.paths import EXAMPLES, INVALID, ROOT


def test_validate_examples_exits_zero() -> None:
    result = crl("validate", *(str(p) for p in EXAMPLES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(EXAMPLES)} valid, 0 invalid" in result.stdout


def test_validate_wrong_manifests_exits_one_without_traceback() -> None:
    # --strict-kinds: 07-other-kind (a Deployment) is wrong only then; test_validate.py has the
    # default, which skips it.
    result = crl("validate", "--strict-kinds", *(str(p) for p in INVALID))
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert f"0 valid, {len(INVALID)} invalid" in result.stdout
    assert "did you mean 'numGenerations'?" in result.stdout


def test_validate_reads_stdin_and_prints_json() -> None:
    text = (ROOT / "examples" / "rolloutpool-swe-gym.yaml").read_text()
    text += "---\n" + text.replace("replicas: 32", "replicas: -1")
    result = crl("validate", "-", "-o", "json", stdin=text)
    assert result.returncode == 1
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["valid"] for d in docs] == [True, False]
    assert docs[1]["problems"][0]["path"] == "spec.replicas"
    assert docs[0]["source"] == "<stdin>"


def test_validate_a_directory() -> None:
    result = crl("validate", "examples")
    assert result.returncode == 0, result.stdout
    assert f"{len(EXAMPLES)} valid, 0 invalid" in result.stdout


def test_render_prints_the_children() -> None:
    result = crl("render", "examples/trainingrun-qwen3-8b-swe-gym.yaml")
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert kinds == [
        ("ConfigMap", "qwen3-8b-swe-gym-config"),
        ("ConfigMap", "qwen3-8b-swe-gym-progress"),
        ("Deployment", "qwen3-8b-swe-gym-inference"),
        ("Service", "qwen3-8b-swe-gym-inference"),
        ("Service", "qwen3-8b-swe-gym-inference-peers"),
        ("RolloutPool", "qwen3-8b-swe-gym-pool"),
        ("Service", "qwen3-8b-swe-gym-trainer"),
        # The trainer's identity (it publishes its progress) exists before the trainer.
        ("ServiceAccount", "qwen3-8b-swe-gym-trainer"),
        ("Role", "qwen3-8b-swe-gym-trainer"),
        ("RoleBinding", "qwen3-8b-swe-gym-trainer"),
        ("Job", "qwen3-8b-swe-gym-trainer"),
    ]
    # Offline, render shows the trainer as if inference were ready, and says so.
    assert "as if inference were ready" in result.stderr
    config = yaml.safe_load(docs[0]["data"]["config.yaml"])
    assert config["spec"]["trainer"]["deepspeed"]["zeroStage"] == 3
    assert docs[0]["metadata"]["namespace"] == "team-repair"
    # The inline pool carries the run's task source and passes validation itself.
    pool = docs[5]
    assert pool["spec"]["tasks"]["format"] == "swe-gym"
    again = crl("validate", "-", stdin=yaml.safe_dump(pool))
    assert again.returncode == 0, again.stdout


def test_render_refuses_an_invalid_manifest() -> None:
    bad = next(p for p in INVALID if "one-generation" in p.name)
    result = crl("render", str(bad))
    assert result.returncode == 1
    assert "numGenerations" in result.stderr
    assert result.stdout == ""


def test_crds_prints_the_generated_crds(tmp_path: Path) -> None:
    result = crl("crds")
    assert result.returncode == 0
    assert result.stdout == all_crds_yaml()
    assert crl("crds", "-d", str(tmp_path)).returncode == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(p.name for p in (ROOT / "crds").iterdir())


def test_version() -> None:
    result = crl("version", "-o", "json")
    info = json.loads(result.stdout)
    assert info["apiVersion"] == "coderepair.io/v1alpha1"
    assert crl("version").returncode == 0


def test_no_arguments_shows_help() -> None:
    result = crl()
    assert "validate" in result.stdout + result.stderr


def test_stdin_that_is_not_utf8() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "crl_cli", "validate", "-"],
        input=b"kind: \xff\xfe\n",
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert b"not UTF-8" in result.stdout
    assert b"Traceback" not in result.stderr


def test_usage_errors_exit_two(tmp_path: Path) -> None:
    assert crl("validate", "-", "-", stdin="").returncode == 2
    assert crl("validate", str(tmp_path)).returncode == 2  # no YAML files there
    assert crl("version", "-o", "bogus").returncode == 2
    assert crl("validate", "-o", "xml", "examples").returncode == 2


def test_missing_file_is_invalid_input(tmp_path: Path) -> None:
    result = crl("validate", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert "cannot read the file" in result.stdout


def test_render_needs_a_name() -> None:
    text = (ROOT / "examples" / "rolloutpool-swe-gym.yaml").read_text()
    text = text.replace("name: swe-gym\n", "generateName: swe-gym-\n", 1)
    result = crl("render", "-", stdin=text)
    assert result.returncode == 1
    assert "metadata.generateName cannot be rendered" in result.stderr
    assert "Traceback" not in result.stderr
