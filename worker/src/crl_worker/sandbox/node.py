"""Jest for JavaScript tasks: installed once per machine, shared read-only by every sandbox.

Exercism's JavaScript exercises (Aider's polyglot benchmark) each name the same development
dependencies in their ``package.json`` (Jest, Babel and Exercism's Babel preset). Installing them
per exercise would take seconds and a hundred megabytes each, and need the network in every
sandbox. Instead the worker installs them once, from the lock file beside this module
(``jest/package-lock.json``), with ``npm ci`` into
``${CRL_CACHE_DIR:-~/.cache/coderepairrl}/node/jest-<digest of the lock>/node_modules``:

- under a file lock, into a temporary folder renamed into place when ``npm ci`` succeeded, so
  concurrent sandboxes install it once and nobody sees a half-installed tree;
- with npm's download cache in ``…/node/npm-cache``, so installing it again (another lock, a
  removed folder) needs the registry only for what is not there yet;
- with ``--ignore-scripts``: no package's install script runs.

A JavaScript sandbox gets ``NODE_PATH`` naming that ``node_modules`` (Node, Babel and Jest
resolve the exercise's preset and the test runner through it) and a ``jest`` command; the folder
is readable, never writable, from inside the sandbox.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from crl_worker.errors import SandboxError
from crl_worker.sandbox.interpreters import host_path
from crl_worker.sandbox.repos import cache_dir

logger = logging.getLogger(__name__)

#: The pinned ``package.json`` and ``package-lock.json`` that ``npm ci`` installs.
MANIFEST_DIR = Path(__file__).resolve().parent / "jest"
#: The file inside the installed tree that says the install finished.
_DONE = ".crl-installed"
#: How long one ``npm ci`` may take, in seconds.
INSTALL_TIMEOUT = 900


def jest_home(cache: Path | None = None) -> Path:
    """Where this lock file's install lives (``…/node/jest-<digest>``); not necessarily there."""
    digest = hashlib.sha256((MANIFEST_DIR / "package-lock.json").read_bytes()).hexdigest()[:12]
    return (cache or cache_dir()) / "node" / f"jest-{digest}"


def jest_script(home: Path) -> Path:
    """Jest's command-line script in the install at ``home``."""
    return home / "node_modules" / "jest" / "bin" / "jest.js"


def ensure_jest(cache: Path | None = None, *, timeout: float = INSTALL_TIMEOUT) -> Path:
    """The folder holding the shared ``node_modules`` with Jest; installed first if missing.

    Raises :class:`SandboxError` (naming what to do) when ``node``/``npm`` are missing or
    ``npm ci`` fails; nothing is left half-installed.
    """
    home = jest_home(cache)
    if (home / "node_modules" / _DONE).is_file():
        return home
    npm = shutil.which("npm", path=host_path())
    if npm is None or shutil.which("node", path=host_path()) is None:
        raise SandboxError(
            "JavaScript tasks need Node.js and npm on this machine's PATH: Jest is installed "
            f"once into {home} with npm ci (install nodejs and npm, or run elsewhere)"
        )
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if (home / "node_modules" / _DONE).is_file():  # another process installed it meanwhile
            return home
        _install(npm, home, timeout)
    return home


def _install(npm: str, home: Path, timeout: float) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f"{home.name}.", suffix=".tmp", dir=home.parent))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(MANIFEST_DIR / name, scratch / name)
        command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline",
                   "--cache", str(home.parent / "npm-cache")]  # fmt: skip
        logger.info("installing Jest for JavaScript tasks into %s (once per machine)", home)
        try:
            done = subprocess.run(
                command, cwd=scratch, capture_output=True, text=True, timeout=timeout,
                env={**os.environ, "npm_config_update_notifier": "false"},
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SandboxError(
                f"npm ci of Jest into {home} took more than {timeout:.0f} s"
            ) from None
        if done.returncode != 0:
            raise SandboxError(
                f"npm ci of Jest into {home} failed (exit {done.returncode}; the npm registry "
                f"must be reachable the first time):\n{(done.stdout + done.stderr)[-3000:]}"
            )
        (scratch / "node_modules" / _DONE).write_text("npm ci finished\n")
        scratch.chmod(0o755)  # mkdtemp's 0700 would hide it from the sandboxes' user
        shutil.rmtree(home, ignore_errors=True)
        scratch.rename(home)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def jest_env(home: Path) -> dict[str, str]:
    """The variables a JavaScript test run needs beside a ``jest`` command: ``NODE_PATH``."""
    return {"NODE_PATH": str(home / "node_modules")}


def link_jest(home: Path, tools: Path) -> None:
    """Link ``jest`` (the shared install's script) into the sandbox's ``tools`` folder."""
    tools.mkdir(parents=True, exist_ok=True)
    link = tools / "jest"
    if not link.exists():
        link.symlink_to(jest_script(home))


__all__ = ["MANIFEST_DIR", "ensure_jest", "jest_env", "jest_home", "jest_script", "link_jest"]
