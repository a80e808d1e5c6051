"""The host's toolchains and package caches as a local sandbox finds them (see
:mod:`crl_worker.sandbox.local`): which tools it links, where the JDK, the Rust toolchain and Go
live, and where the worker's caches are.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from crl_worker.sandbox.interpreters import host_path

#: The system's base directories, the end of every local sandbox's ``PATH``.
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: Host tools every sandbox gets (the harness applies patches with them).
HARNESS_TOOLS = ("git", "patch")
#: Host tools a Java sandbox gets besides the JDK.
JAVA_TOOLS = ("mvn", "gradle")
#: Host tools the sandboxes of the other compiled languages get (Rust's come from the toolchain
#: itself, see :func:`rust_sysroot`: rustup's proxies need the hidden ``~/.rustup``).
LANGUAGE_TOOLS = {
    "go": ("go", "gofmt"),
    "cpp": ("cmake", "make", "c++", "g++", "cc"),
    "javascript": ("node",),  # and ``jest``, see crl_worker.sandbox.node
}
#: The Rust toolchain's programs linked into a Rust sandbox.
RUST_TOOLS = ("cargo", "rustc", "rustdoc")


def cache_dir(variable: str, name: str) -> Path:
    """Where the worker's ``name`` tool (uv, pip, go-build) keeps its cache: ``$variable``, else
    the XDG cache folder."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / name


def java_home() -> str | None:
    """``$JAVA_HOME``, else the JDK that ``java`` on ``PATH`` belongs to."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java", path=host_path())
    if java is None:
        return None
    return str(Path(java).resolve().parent.parent)


def java_caches() -> tuple[Path, Path]:
    """The worker's Maven repository and Gradle home."""
    home = os.environ.get("HOME") or str(Path.home())
    gradle = Path(os.environ.get("GRADLE_USER_HOME") or Path(home) / ".gradle")
    return Path(home) / ".m2" / "repository", gradle


def go_root() -> Path | None:
    """The Go installation ``go`` on the host's ``PATH`` belongs to (its standard library),
    None without Go."""
    go = shutil.which("go", path=host_path())
    return Path(go).resolve().parent.parent if go is not None else None


def can_overlay() -> bool:
    """Whether a confined sandbox may mount an overlay: as root, or in a user namespace from
    Linux 5.11 on."""
    if os.geteuid() == 0:
        return True
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (5, 11)


def link_tools(directory: Path, names: Iterable[str]) -> list[str]:
    """Link each host tool of ``names`` that is not in :data:`SYSTEM_PATH` into ``directory``.

    Returns the names found nowhere (the caller decides whether that matters).
    """
    missing = []
    directory.mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(names):
        if shutil.which(name, path=SYSTEM_PATH) is not None:
            continue
        found = shutil.which(name, path=host_path())
        if found is None:
            missing.append(name)
            continue
        link = directory / name
        if not link.exists():
            # Scripts such as mvn find their installation by resolving their own links.
            link.symlink_to(Path(found).resolve())
    return missing


def rust_sysroot() -> Path | None:
    """The default Rust toolchain's folder (``rustc --print sysroot``), None without Rust."""
    rustc = shutil.which("rustc", path=host_path())
    if rustc is None:
        return None
    try:
        out = subprocess.run(
            [rustc, "--print", "sysroot"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out and (Path(out) / "bin").is_dir() else None


def link_rust(directory: Path) -> list[str]:
    """Link the Rust toolchain's :data:`RUST_TOOLS` into ``directory``; the names not found."""
    sysroot = rust_sysroot()
    directory.mkdir(parents=True, exist_ok=True)
    missing = []
    for name in RUST_TOOLS:
        binary = sysroot / "bin" / name if sysroot is not None else None
        if binary is None or not binary.is_file():
            missing.append(name)
        elif not (directory / name).exists():
            (directory / name).symlink_to(binary.resolve())
    return missing
