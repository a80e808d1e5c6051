"""The shared Jest install of JavaScript sandboxes (crl_worker.sandbox.node), with a stand-in
``npm`` script on PATH: installed once per lock file, atomically, and a failed install leaves
nothing behind and says what went wrong."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crl_worker.errors import SandboxError
from crl_worker.sandbox import node

_NPM = """#!/bin/sh
# A stand-in for npm: records its arguments, then installs a Jest script or fails.
echo "$*" >> "{calls}"
[ "$1" = ci ] || exit 2
if [ -n "{fail}" ]; then echo "npm error network unreachable" >&2; mkdir -p node_modules; exit 1; fi
mkdir -p node_modules/jest/bin && echo "#!/usr/bin/env node" > node_modules/jest/bin/jest.js
"""


def _fake_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, fail: bool) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    npm = bin_dir / "npm"
    npm.write_text(_NPM.format(calls=calls, fail="yes" if fail else ""))
    npm.chmod(0o755)
    (bin_dir / "node").symlink_to("/bin/true")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}")
    return calls


def test_jest_is_installed_once_from_the_pinned_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_npm(tmp_path, monkeypatch, fail=False)
    cache = tmp_path / "cache"
    home = node.ensure_jest(cache)
    assert home == node.jest_home(cache) and home.parent == cache / "node"
    assert node.jest_script(home).is_file()
    assert json.loads((home / "package.json").read_text())["devDependencies"]["jest"]
    assert (home / "package-lock.json").read_bytes() == (
        node.MANIFEST_DIR / "package-lock.json"
    ).read_bytes()
    assert oct(home.stat().st_mode & 0o777) == "0o755"  # readable by the sandboxes' user
    assert node.ensure_jest(cache) == home  # the second call finds it: npm runs once
    (command,) = calls.read_text().splitlines()
    assert (
        command.startswith("ci --ignore-scripts") and str(cache / "node" / "npm-cache") in command
    )
    assert node.jest_env(home) == {"NODE_PATH": str(home / "node_modules")}
    node.link_jest(home, tmp_path / "tools")
    assert (tmp_path / "tools" / "jest").resolve() == node.jest_script(home).resolve()
    # No temporary folder is left beside it (the fake npm makes no download cache).
    assert sorted(p.name for p in (cache / "node").iterdir()) == [home.name, f"{home.name}.lock"]


def test_a_failed_install_leaves_nothing_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_npm(tmp_path, monkeypatch, fail=True)
    cache = tmp_path / "cache"
    with pytest.raises(SandboxError) as raised:
        node.ensure_jest(cache)
    message = str(raised.value)
    assert "npm ci of Jest" in message and "registry must be reachable" in message
    assert "network unreachable" in message  # npm's own words
    assert not node.jest_home(cache).exists()
    assert [p.name for p in (cache / "node").iterdir()] == [f"{node.jest_home(cache).name}.lock"]
