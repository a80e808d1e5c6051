"""The trainer's check of the installed libraries, and the lock it is installed from.

The break this guards against happened on 2026-11-24: a fresh resolve took transformers 5.24.0,
which asks for PEFT >= 0.22.0 when the first adapter loads, while the newest PEFT was 0.21.2.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from crl_worker.train import packages
from crl_worker.train.packages import Conflict, find_conflicts

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "lock.txt"


def locked() -> dict[str, str]:
    """Canonical name -> version of every lock line whose marker holds for this interpreter."""
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==([^ ;]+)\s*(?:;\s*(.*))?$", line)
        if match and (match[3] is None or Marker(match[3]).evaluate()):
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def declared() -> dict[str, list[Requirement]]:
    """pyproject.toml's requirements per extra ("" for the base install)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {name: [Requirement(r) for r in lines] for name, lines in groups.items()}


# --- the pure comparison -------------------------------------------------------------------------


def test_the_break_of_2026_11_24_is_one_sentence() -> None:
    conflicts = find_conflicts(
        {"transformers": "5.24.0", "peft": "0.21.2"},
        [("transformers 5.24.0", Requirement("peft>=0.22.0"))],
    )
    assert conflicts == [Conflict("peft", "0.21.2", ">=0.22.0", "transformers 5.24.0")]
    assert conflicts[0].sentence() == (
        "transformers 5.24.0 needs peft>=0.22.0, but peft 0.21.2 is installed"
    )


def test_only_installed_libraries_out_of_range_are_reported() -> None:
    requirements = [
        ("trl[peft] 1.16.0", Requirement("peft>=0.13.0")),
        ("trl 1.16.0", Requirement("transformers>=4.56.2")),
        ("trl[deepspeed] 1.16.0", Requirement("deepspeed>=0.18.6")),  # not installed: skipped
        ("coderepairrl 0.1.0", Requirement("transformers<5.24,>=4.56.2")),
        ("coderepairrl 0.1.0", Requirement("torch")),  # no range: nothing to compare
    ]
    installed = {"peft": "0.21.2", "transformers": "5.24.0", "torch": "2.15.0"}
    assert [c.sentence() for c in find_conflicts(installed, requirements)] == [
        "coderepairrl 0.1.0 needs transformers<5.24,>=4.56.2, but transformers 5.24.0 is installed"
    ]


def test_a_release_candidate_is_compared_not_ignored() -> None:
    conflicts = find_conflicts(
        {"peft": "0.22.0rc1"}, [("transformers 5.24.0", Requirement("peft>=0.22.0"))]
    )
    assert [c.installed for c in conflicts] == ["0.22.0rc1"]  # 0.22.0rc1 < 0.22.0
    assert not find_conflicts(
        {"peft": "0.22.0rc1"}, [("transformers 5.24.0", Requirement("peft>=0.21"))]
    )


def test_a_requirement_stated_twice_is_reported_once() -> None:
    same = ("trl 1.16.0", Requirement("transformers>=4.56.2"))
    assert len(find_conflicts({"transformers": "4.50.0"}, [same, same])) == 1


# --- what the installed libraries declare ---------------------------------------------------------


def test_trl_extras_in_use_are_read_and_labelled() -> None:
    pytest.importorskip("trl")
    found = {(by.split()[0], str(r)) for by, r in packages.declared_requirements("trl", ("peft",))}
    assert any(by == "trl[peft]" and r.startswith("peft") for by, r in found)
    assert any(by == "trl" and r.startswith("transformers") for by, r in found)
    # Extras not asked for (TRL's vLLM and quality tooling) stay out.
    assert not any(r.startswith("vllm") for _, r in found)


def test_transformers_runtime_minimum_for_peft_is_read() -> None:
    transformers = pytest.importorskip("transformers")
    floors = {str(r.specifier) for _, r in packages.transformers_minimums() if r.name == "peft"}
    from transformers.integrations.peft import MIN_PEFT_VERSION

    # The floor its adapter methods check is among them (the table states it too since 5.0).
    assert f">={MIN_PEFT_VERSION}" in floors, transformers.__version__
    assert not any(r.name == "pytest" for _, r in packages.transformers_minimums())


def test_the_installed_training_stack_has_no_conflict() -> None:
    pytest.importorskip("transformers")
    conflicts = packages.check_installed()
    assert conflicts == [], packages.describe(conflicts)


def test_the_trainer_refuses_an_incompatible_peft_before_loading_anything(tmp_path: Path) -> None:
    """A PEFT older than transformers' floor makes the trainer exit 2 with the sentence.

    The older PEFT is its installed metadata only (a dist-info folder first on the path): the
    check reads versions from metadata, as pip does, and no download happens in a test.
    """
    pytest.importorskip("transformers")
    from transformers.integrations.peft import MIN_PEFT_VERSION

    floor = Version(MIN_PEFT_VERSION)
    old = f"{floor.major}.{max(floor.minor - 1, 0)}.0"
    if Version(old) >= floor:
        pytest.skip(f"no PEFT release below transformers' floor {floor}")
    site = tmp_path / "site"
    (site / f"peft-{old}.dist-info").mkdir(parents=True)
    (site / f"peft-{old}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: peft\nVersion: {old}\n"
    )
    from crl_worker.train import toy

    toy.build_toy_suite(tmp_path / "suite")
    run = tmp_path / "run.yaml"
    run.write_text(
        "apiVersion: coderepair.io/v1alpha1\nkind: TrainingRun\nmetadata: {name: old-peft}\n"
        f"spec:\n  model: {{name: {tmp_path / 'no-model'}}}\n"
        f"  tasks: {{format: task, path: {tmp_path / 'suite' / 'tasks.jsonl'}}}\n"
        "  algorithm: {numGenerations: 2, tasksPerStep: 1, steps: 1}\n"
        "  trainer: {gpusPerNode: 0}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "crl_worker.train", "--config", str(run), "--preflight-only"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"},
    )
    assert done.returncode == 2, done.stderr[-3000:]
    transformers_version = importlib.metadata.version("transformers")
    assert f"transformers {transformers_version} needs peft>={floor}" in done.stderr
    assert f"but peft {old} is installed" in done.stderr
    assert "spec.trainer.image" in done.stderr and "requirements/lock.txt" in done.stderr
    # Nothing after the library check ran: the missing model was never looked at.
    assert "cannot load the model config" not in done.stderr


# --- the lock ------------------------------------------------------------------------------------


def test_every_direct_dependency_is_locked_inside_its_declared_range() -> None:
    pins = locked()
    for extra, requirements in declared().items():
        for requirement in requirements:
            name = canonicalize_name(requirement.name)
            if name == "coderepairrl":
                continue
            assert name in pins, f"{requirement} ([{extra}]) is not in requirements/lock.txt"
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"the lock pins {name}=={pins[name]}, outside pyproject.toml's {requirement}"
            )


def test_the_declared_ranges_exclude_the_known_broken_transformers() -> None:
    train = {canonicalize_name(r.name): r for r in declared()["train"]}
    assert not train["transformers"].specifier.contains("5.24.0")
    assert train["transformers"].specifier.contains(locked()["transformers"])


def test_this_environment_is_the_locked_one() -> None:
    """What the tests run with is what requirements/lock.txt pins (CI installs from it)."""
    if os.environ.get("CRL_COMPAT"):
        pytest.skip(f"{os.environ['CRL_COMPAT']} versions on purpose (bash .ci/compat)")
    pins = locked()
    differ = []
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in pins and dist.version != pins[name]:
            differ.append(f"{name} {dist.version} (locked {pins[name]})")
    assert not differ, (
        "installed versions differ from requirements/lock.txt: "
        + ", ".join(sorted(differ))
        + '; install with -c requirements/lock.txt (pip install -c requirements/lock.txt -e ".[dev,operator,worker,train]")'
    )
