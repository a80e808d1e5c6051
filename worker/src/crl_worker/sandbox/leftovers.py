"""Local sandbox folders that outlive their worker, found and removed.

Each local sandbox's folder holds a lock file, :data:`OWNER_FILE`, that the worker holds an
exclusive ``flock`` on for as long as the sandbox is open. The kernel releases the lock when the
worker exits, however it exits (SIGKILL, a crash, a power cut's reboot), so a folder whose lock can
be taken belongs to nobody: :func:`sweep`, run before each local sandbox is made, removes those
under the same parent. A folder without the file (being made, kept with ``keep``, or made by an
older version) is never touched.

The lock file is created under a temporary name, locked, then renamed into place, so a sweep never
sees it unlocked. Besides, :func:`register` keeps the open sandboxes of this process, and an
``atexit`` hook removes what a normal interpreter exit (after Ctrl-C included) left open.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

#: The lock file in each local sandbox's folder.
OWNER_FILE = ".crl-owner"
#: Prefix of every local sandbox's folder name.
FOLDER_PREFIX = "crl-"

_open: dict[int, Callable[[], None]] = {}
_hooked = False


def claim(folder: Path) -> int:
    """Mark ``folder`` as this process's: create its :data:`OWNER_FILE`, locked. Returns the
    descriptor holding the lock (close it with :func:`release`)."""
    temporary = folder / f"{OWNER_FILE}.{os.getpid()}"
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.rename(temporary, folder / OWNER_FILE)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    return fd


def release(folder: Path, fd: int, *, keep: bool) -> None:
    """Give up ``folder``'s lock; with ``keep`` also remove the lock file, so that no sweep
    removes a folder kept on purpose."""
    if keep:
        with contextlib.suppress(OSError):
            (folder / OWNER_FILE).unlink()
    os.close(fd)


def sweep(parent: Path) -> list[Path]:
    """Remove the sandbox folders under ``parent`` whose owner is gone; returns them."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(FOLDER_PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            fd = os.open(
                os.path.join(entry.path, OWNER_FILE), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
            )
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its owner holds it: in use
            # Ours now: no one else removes it meanwhile, and its owner cannot come back.
            shutil.rmtree(entry.path, ignore_errors=True)
            if os.path.ismount(entry.path):  # a disk-limited sandbox's tmpfs (see limits.py)
                from crl_worker.sandbox.limits import unmount_folder

                unmount_folder(Path(entry.path))
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)
            removed.append(Path(entry.path))
        finally:
            os.close(fd)
    if removed:
        logger.info(
            "removed %d local sandbox folder(s) left by workers that are gone: %s",
            len(removed),
            ", ".join(str(path) for path in removed),
        )
    return removed


def register(key: int, cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` (synchronous: kill, remove) at interpreter exit unless :func:`unregister`
    -ed first."""
    global _hooked
    if not _hooked:
        atexit.register(_cleanup_open)
        _hooked = True
    _open[key] = cleanup


def unregister(key: int) -> None:
    """Forget a cleanup (its sandbox closed)."""
    _open.pop(key, None)


def _cleanup_open() -> None:
    for key, cleanup in list(_open.items()):
        _open.pop(key, None)
        try:
            cleanup()
        except Exception:
            logger.debug("cleaning up a local sandbox at exit failed", exc_info=True)
