"""Finding the Python interpreter a task asks for on this machine (local sandboxes).

A task says ``python: "3.9"`` (or ``"3.9.18"``, or nothing). Candidates, in this order:
``python3.9`` on ``PATH``, ``$PYENV_ROOT/versions/3.9*/bin`` (``~/.pyenv`` by default), and
``uv python find 3.9`` when uv is installed and nothing else matched. Each candidate is run once
to read its real version (pyenv shims exist for versions that are not active and fail when run),
and the highest matching version wins.

A task without a version gets ``python3`` on ``PATH`` (whatever version that is), as the docs
say, not the newest interpreter installed. ``PATH`` here is the worker's without the worker's own
virtual environment (:func:`host_path`): a task's environment is never built on the worker's.
Results are cached for the life of the process.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from crl_worker.errors import SandboxError

logger = logging.getLogger(__name__)

_PROBE = "import sys; print('%d.%d.%d' % tuple(sys.version_info[:3])); print(sys.executable)"
_VERSION_RE = re.compile(r"^\d+(\.\d+){0,2}$")


@dataclass(frozen=True, order=True)
class Interpreter:
    """A Python interpreter found on this machine."""

    version: tuple[int, int, int]
    path: str
    #: What ``path`` runs in the end (its ``sys.executable``): a pyenv shim's real interpreter,
    #: which starts without the shim's shell scripts (about 0.3 s a call); ``path`` when unknown.
    executable: str = field(default="", compare=False)

    @property
    def command(self) -> str:
        """The path to run it by: :attr:`executable` when known, else :attr:`path`."""
        return self.executable or self.path

    @property
    def version_text(self) -> str:
        """The version as ``3.9.18``."""
        return ".".join(str(part) for part in self.version)


class MissingInterpreterError(SandboxError):
    """The interpreter a task needs is not installed on this machine."""


def host_path() -> str:
    """The worker's ``PATH`` without the worker's own virtual environment's ``bin``."""
    own = {str(Path(sys.prefix) / "bin")} if sys.prefix != sys.base_prefix else set()
    if os.environ.get("VIRTUAL_ENV"):
        own.add(str(Path(os.environ["VIRTUAL_ENV"]) / "bin"))
    parts = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p]
    return os.pathsep.join(p for p in parts if p not in own)


def pyenv_root() -> Path:
    """Where pyenv keeps its versions (``$PYENV_ROOT``, else ``~/.pyenv``)."""
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def find_uv(search_path: str | None = None) -> str | None:
    """The uv executable: on ``PATH``, else next to the worker's own interpreter."""
    found = shutil.which("uv", path=search_path)
    if found:
        return found
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


@functools.lru_cache(maxsize=256)
def probe(path: str) -> Interpreter | None:
    """Run ``path`` once and return what it is, or ``None`` if it does not run."""
    try:
        proc = subprocess.run(
            [path, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            env={**os.environ, "PYTHONNOUSERSITE": "1"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    version, _, executable = proc.stdout.strip().partition("\n")
    try:
        major, minor, micro = (int(part) for part in version.split("."))
    except ValueError:
        return None
    # Keep the path as found (a venv's or pyenv's bin), not the resolved symlink target: a
    # resolved path may lose the prefix its standard library is found from. sys.executable is
    # not resolved either (a venv's python stays the venv's), only past a launcher script.
    executable = executable.strip()
    if not (os.path.isabs(executable) and os.access(executable, os.X_OK)):
        executable = ""
    return Interpreter((major, minor, micro), path, executable)


def _matches(found: tuple[int, int, int], wanted: tuple[int, ...]) -> bool:
    return found[: len(wanted)] == wanted


def _parse(version: str) -> tuple[int, ...]:
    text = version.strip().removeprefix("python").removeprefix("py")
    if not _VERSION_RE.match(text):
        raise SandboxError(
            f"cannot read the Python version {version!r}: write it as '3.9' or '3.9.18'"
        )
    return tuple(int(part) for part in text.split("."))


def _candidates(wanted: tuple[int, ...], search_path: str | None) -> list[str]:
    names = []
    if len(wanted) >= 2:
        names.append(f"python{wanted[0]}.{wanted[1]}")
    names += [f"python{wanted[0]}", "python"]
    paths: list[str] = []
    for directory in (search_path or host_path()).split(os.pathsep):
        for name in names:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                paths.append(candidate)
    versions = pyenv_root() / "versions"
    prefix = ".".join(str(part) for part in wanted)
    if versions.is_dir():
        for home in sorted(versions.iterdir()):
            if home.name == prefix or home.name.startswith(prefix + "."):
                for name in names:
                    binary = home / "bin" / name
                    if binary.is_file():
                        paths.append(str(binary))
                        break
    return list(dict.fromkeys(paths))


def _uv_find(prefix: str, search_path: str | None) -> str | None:
    """``uv python find`` (installed interpreters only, never a download)."""
    uv = find_uv(search_path)
    if uv is None:
        return None
    try:
        proc = subprocess.run(
            # --system: never a virtual environment (the worker's own, or a .venv in the cwd).
            [uv, "python", "find", "--system", "--no-python-downloads", prefix],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
        )
    except (OSError, subprocess.SubprocessError):
        logger.debug("uv python find failed", exc_info=True)
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


@functools.lru_cache(maxsize=8)
def available(search_path: str | None = None) -> tuple[Interpreter, ...]:
    """Every Python interpreter found on ``PATH`` and in pyenv (for error messages)."""
    paths: list[str] = []
    pattern = re.compile(r"^python\d(\.\d+)?$")
    for directory in (search_path or host_path()).split(os.pathsep):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        paths += [os.path.join(directory, n) for n in sorted(names) if pattern.match(n)]
    versions = pyenv_root() / "versions"
    if versions.is_dir():
        for home in sorted(versions.iterdir()):
            for name in ("python3", "python"):
                if (home / "bin" / name).is_file():
                    paths.append(str(home / "bin" / name))
                    break
    found: dict[tuple[int, int, int], Interpreter] = {}
    for path in dict.fromkeys(paths):
        interpreter = probe(path)
        if interpreter is not None:
            found.setdefault(interpreter.version, interpreter)
    return tuple(sorted(found.values()))


def _default_python(search_path: str | None) -> Interpreter:
    """``python3`` on ``PATH`` (the first that runs: a pyenv shim of an inactive version fails)."""
    tried = []
    for directory in (search_path or host_path()).split(os.pathsep):
        candidate = os.path.join(directory, "python3")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            interpreter = probe(candidate)
            if interpreter is not None and interpreter.version[0] == 3:
                logger.debug("Python (default): %s (%s)", candidate, interpreter.version_text)
                return interpreter
            tried.append(candidate)
    existing = ", ".join(f"{i.version_text} ({i.path})" for i in available(search_path))
    raise MissingInterpreterError(
        "the task names no Python version, so it gets python3 on PATH, but "
        + (f"none of {', '.join(tried)} runs" if tried else "there is no python3 on PATH")
        + f". Interpreters found: {existing or 'none'}. Install python3, or give the task a "
        "version (python: '3.11')."
    )


@functools.lru_cache(maxsize=64)
def find_python(version: str | None, *, search_path: str | None = None) -> Interpreter:
    """The best interpreter for ``version`` (``None``: ``python3`` on ``PATH``).

    ``search_path`` defaults to :func:`host_path` (the worker's ``PATH`` without its own virtual
    environment). Raises :class:`MissingInterpreterError` naming what was wanted and what exists.
    """
    if not version:
        return _default_python(search_path)
    wanted = _parse(version)

    def matching(paths: list[str]) -> list[Interpreter]:
        return [
            interpreter
            for interpreter in map(probe, paths)
            if interpreter is not None and _matches(interpreter.version, wanted)
        ]

    matches = matching(_candidates(wanted, search_path))
    if not matches:  # uv last: it costs a process even when it finds nothing
        found = _uv_find(".".join(str(part) for part in wanted), search_path)
        matches = matching([found] if found else [])
    if matches:
        best = max(matches, key=lambda interpreter: interpreter.version)
        logger.debug("Python %s: %s (%s)", version, best.path, best.version_text)
        return best
    existing = ", ".join(f"{i.version_text} ({i.path})" for i in available(search_path))
    raise MissingInterpreterError(
        f"Python {version or '3'} is needed but no such interpreter was found on this machine "
        f"(looked for python{version or '3'} on PATH, in {pyenv_root() / 'versions'} and with "
        f"'uv python find'). Interpreters found: {existing or 'none'}. Install it "
        f"(e.g. 'pyenv install {version}' or 'uv python install {version}'), or set "
        "missing_python: fallback in the local sandbox config to use the default interpreter."
    )
