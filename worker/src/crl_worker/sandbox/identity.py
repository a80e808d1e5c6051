"""The unprivileged user a local sandbox's commands run as when the worker is root.

A worker running as root would give the sandbox root's reading rights over every file the
confinement leaves visible. Once the task's ``install`` commands have run (as the worker: they
fill the shared package caches), the sandbox's folder is handed to the config's ``user``
(``nobody`` by default) and the agent's shell, the base-state scripts and the harness's scripts
run as that user (``setpriv``, see :func:`crl_worker.sandbox.isolation.identity_command`). A
worker that is not root needs none of this: the sandbox runs as the worker's own user.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from crl_worker.errors import SandboxError

T = TypeVar("T")


def resolve(user: str | None) -> tuple[int, int] | None:
    """(uid, gid) the sandbox runs as for the config's ``user``: a name in the passwd database
    or ``uid[:gid]``; None when the worker is not root, or ``user`` is ``root``/``None``.

    Raises :class:`SandboxError` naming an unknown user.
    """
    if os.geteuid() != 0 or user in (None, "root", "0"):
        return None
    assert user is not None
    uid_text, _, gid_text = user.partition(":")
    if uid_text.isdigit() and (not gid_text or gid_text.isdigit()):
        uid = int(uid_text)
        return uid, int(gid_text) if gid_text else uid
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SandboxError(
            f"the local sandbox's user {user!r} is not in the passwd database: name an "
            "existing user or give 'uid:gid'"
        ) from None
    if entry.pw_uid == 0:
        raise SandboxError(f"the local sandbox's user {user!r} is root: name an unprivileged one")
    return entry.pw_uid, entry.pw_gid


def hand_over(folder: Path, identity: tuple[int, int]) -> None:
    """Give ``folder`` and everything in it to ``identity`` (links themselves, not what they
    point to; blocking: run it in a thread)."""
    uid, gid = identity
    os.lchown(folder, uid, gid)
    for parent, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            os.lchown(os.path.join(parent, name), uid, gid)


def give(path: str, root: str, identity: tuple[int, int]) -> None:
    """Give the file ``path`` the worker just wrote in the sandbox's folder ``root``, and the
    folders it made on the way, to ``identity`` (blocking: run it in a thread).

    The walk opens one folder at a time without following links and changes each through its
    descriptor, so a link the sandbox swaps in meanwhile cannot turn it onto a host file.
    """
    uid, gid = identity
    relative = os.path.relpath(os.path.normpath(path), os.path.normpath(root))
    if relative.startswith("..") or relative == ".":
        return
    *folders, name = relative.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for folder in folders:
            child = os.open(
                folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = child
            if os.fstat(fd).st_uid != uid:
                os.fchown(fd, uid, gid)
        if os.stat(name, dir_fd=fd, follow_symlinks=False).st_uid != uid:
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
    except OSError:
        pass  # a link on the way (not the worker's own folder) or gone: nothing of ours to give
    finally:
        os.close(fd)


def mirror_folders(lower: Path, upper: Path, identity: tuple[int, int]) -> int:
    """Make in ``upper`` each folder of ``lower``, owned by ``identity`` (blocking; returns how
    many). An overlay shows a folder present in both with the upper one's owner, so the sandbox's
    user may add and replace files anywhere in a copy-on-write cache the worker's user filled
    (build tools replace a file by writing a new one and renaming it over)."""
    uid, gid = identity
    made = 0
    for parent, dirs, _ in os.walk(lower):
        relative = os.path.relpath(parent, lower)
        target = upper if relative == "." else upper / relative
        target.mkdir(exist_ok=True)
        os.lchown(target, uid, gid)
        made += 1
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(parent, d))]
    return made


@dataclass(frozen=True)
class View:
    """What a confined sandbox's user may read of the machine's files, as the worker checks it
    before reading a file for the sandbox (the harness's and the agent tools' reads)."""

    identity: tuple[int, int]
    own: str
    """The sandbox's folder (resolved): all of it is the sandbox's."""
    hidden: tuple[str, ...] = ()
    """Folders the confinement hides (resolved)."""
    kept: tuple[str, ...] = ()
    """What it shows again inside them (resolved)."""

    def allows(self, real: str, status: os.stat_result) -> bool:
        """Whether the sandbox's user could read the file at the resolved path ``real``
        (ancestor folders' search rights aside)."""
        if _inside(real, (self.own,)):
            return True
        if _inside(real, self.hidden) and not _inside(real, self.kept):
            return False
        uid, gid = self.identity
        if status.st_uid == uid:
            return bool(status.st_mode & stat.S_IRUSR)
        if status.st_gid == gid:
            return bool(status.st_mode & stat.S_IRGRP)
        return bool(status.st_mode & stat.S_IROTH)

    def read(self, path: str, reader: Callable[[str], T]) -> T:
        """``reader`` of the file at ``path`` once :meth:`allows` says yes for what ``path``
        leads to (blocking). The file is opened once (``O_PATH``, links followed) and both
        checked and read through that descriptor, so a link swapped meanwhile changes nothing.
        Raises ``PermissionError`` naming ``path`` otherwise."""
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            through = f"/proc/self/fd/{fd}"
            if not self.allows(os.readlink(through), os.fstat(fd)):
                raise PermissionError(errno.EACCES, "the sandbox may not read it", path)
            return reader(through)
        finally:
            os.close(fd)


def _inside(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)
