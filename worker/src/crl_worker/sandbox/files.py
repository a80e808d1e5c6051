"""Bounded and confined file access for sandboxes.

Two guarantees a caller that does not trust the path can ask for:

- **bounded**: a read never holds more than ``limit`` bytes in this process, whatever the path
  names (``/dev/zero``, a FIFO, a file that grows while it is read): :class:`FileTooLarge`
  instead. Only regular files are read.
- **confined**: the path, relative or absolute, names something inside the sandbox's working
  tree, after ``..`` and after symbolic links: :class:`PathOutsideSandbox` otherwise. A NUL
  byte or a path that is not valid UTF-8 is refused the same way.

Local files are opened once and checked through the open descriptor (``/proc/self/fd``), so a
link swapped between a check and the open cannot lead outside; writes walk the tree one
directory at a time without following links. In a container (an exec transport) the same checks
run inside it with ``realpath``: there the working tree's outside is the sandbox's own container.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat

from crl_worker.errors import CrlError

#: Longest path accepted (bytes), as Linux's ``PATH_MAX``.
MAX_PATH = 4096
_CHUNK = 1 << 20
_LINK_RESTARTS = 8


class PathOutsideSandbox(CrlError):
    """A file path leads outside the sandbox's working tree, or is malformed (NUL, not UTF-8)."""


class FileTooLarge(CrlError):
    """A file is larger than the limit of the read or write that asked for it."""

    def __init__(
        self, path: str, limit: int, size: int | None = None, *, message: str | None = None
    ) -> None:
        self.path = path
        self.limit = limit
        self.size = size
        what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
        super().__init__(message or f"{path} is {what}; the limit is {limit} bytes")


class NotARegularFile(CrlError):
    """The path names a device, a FIFO or a socket: only regular files are read or written."""


def _regular(fd: int, path: str) -> os.stat_result:
    """The open file's status; refuses a directory and anything that is not a regular file."""
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if not stat.S_ISREG(info.st_mode):
        raise NotARegularFile(f"{path} is not a regular file (a device, FIFO or socket)")
    return info


def check_path(path: str) -> None:
    """Refuse a path no file system holds: empty, with a NUL byte, not UTF-8, too long."""
    if not path:
        raise PathOutsideSandbox("the path is empty")
    if "\x00" in path:
        raise PathOutsideSandbox("the path contains a NUL byte")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise PathOutsideSandbox("the path is not valid UTF-8") from None
    if len(encoded) > MAX_PATH:
        raise PathOutsideSandbox(f"the path is longer than {MAX_PATH} bytes")


def inside(path: str, root: str) -> bool:
    """Whether normalized absolute ``path`` is ``root`` or below it."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


def confine(workdir: str, path: str) -> str:
    """The absolute, normalized form of ``path`` (relative to ``workdir``); raises
    :class:`PathOutsideSandbox` when it lies outside ``workdir`` before any link is followed."""
    check_path(path)
    if not workdir:
        raise PathOutsideSandbox("the sandbox has no working tree yet")
    root = posixpath.normpath(workdir)
    full = posixpath.normpath(posixpath.join(root, path))
    if full.startswith("//"):
        full = "/" + full.lstrip("/")
    if not inside(full, root):
        raise PathOutsideSandbox(f"{path!r} is outside the sandbox's working tree {root}")
    return full


def _fd_path(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def read_local(path: str, limit: int, *, root: str | None = None) -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` (blocking; run it in a thread).

    With ``root``, the file actually opened (links followed) must lie under ``root``.
    Raises :class:`FileTooLarge`, :class:`NotARegularFile`, :class:`PathOutsideSandbox`,
    ``FileNotFoundError``, ``IsADirectoryError`` or another ``OSError``.
    """
    check_path(path)
    real_root = os.path.realpath(root) if root is not None else None
    if real_root is not None and not inside(os.path.realpath(path), real_root):
        raise PathOutsideSandbox(f"{path} leads outside the sandbox's working tree")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = _regular(fd, path)
        if real_root is not None:
            opened = _fd_path(fd)
            if opened is not None and not inside(opened, real_root):
                raise PathOutsideSandbox(f"{path} leads outside the sandbox's working tree")
        if info.st_size > limit:
            raise FileTooLarge(path, limit, info.st_size)
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                # /proc files say 0 bytes; a file may grow while it is read.
                raise FileTooLarge(path, limit)
        return b"".join(parts)
    finally:
        os.close(fd)


def _open_dir(name: str, dir_fd: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def write_local(root: str, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` under ``root`` (blocking; run it in a thread), creating the
    parent directories, never through a link that leads outside ``root``.

    The tree is walked one directory at a time with ``O_NOFOLLOW``; a link met on the way is
    resolved and, when it stays under ``root``, the walk restarts on the resolved path.
    """
    check_path(path)
    real_root = os.path.realpath(root)
    lexical_root = posixpath.normpath(root)
    if not inside(path, lexical_root):
        raise PathOutsideSandbox(f"{path} is outside the sandbox's working tree")
    rel = posixpath.relpath(path, lexical_root)
    parts = [] if rel == "." else rel.split("/")
    for _ in range(_LINK_RESTARTS):
        if not parts:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        try:
            _write_walk(real_root, parts, data, path)
            return
        except _LinkMet as link:
            resolved = os.path.realpath(posixpath.join(real_root, *parts[: link.depth + 1]))
            if not inside(resolved, real_root):
                raise PathOutsideSandbox(
                    f"{path} leads outside the sandbox's working tree (a symbolic link)"
                ) from None
            rel = posixpath.relpath(resolved, real_root)
            parts = ([] if rel == "." else rel.split("/")) + parts[link.depth + 1 :]
    raise PathOutsideSandbox(f"{path}: too many symbolic links")


class _LinkMet(Exception):
    def __init__(self, depth: int) -> None:
        self.depth = depth


def _write_walk(real_root: str, parts: list[str], data: bytes, path: str) -> None:
    fds = [os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for depth, name in enumerate(parts[:-1]):
            if name in ("", ".", ".."):
                raise PathOutsideSandbox(f"{path}: unexpected path component {name!r}")
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fds[-1])
            try:
                fds.append(_open_dir(name, fds[-1]))
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(
                    posixpath.join(real_root, *parts[: depth + 1])
                ):
                    raise _LinkMet(depth) from None
                raise
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(parts[-1], flags, 0o644, dir_fd=fds[-1])
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _LinkMet(len(parts) - 1) from None
            raise
        try:
            _regular(fd, path)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                written = os.write(fd, view[:_CHUNK])
                view = view[written:]
        finally:
            os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


#: A POSIX shell script for exec transports: ``$1`` the path, ``$2`` the working tree or empty
#: (no confinement), ``$3`` the limit. Exit 3: outside; 4: a directory; 5: not a regular file;
#: the caller sees more than ``limit`` bytes when the file is larger.
READ_SCRIPT = (
    '[ -e "$1" ] || { echo "No such file: $1" >&2; exit 2; }\n'
    'real=$(readlink -f -- "$1") || exit 6\n'
    'if [ -n "$2" ]; then root=$(readlink -f -- "$2") || exit 6\n'
    '  case "$real/" in "$root"/*) ;; *) echo "outside: $1" >&2; exit 3;; esac; fi\n'
    '[ -d "$real" ] && { echo "Is a directory: $1" >&2; exit 4; }\n'
    '[ -f "$real" ] || { echo "not a regular file: $1" >&2; exit 5; }\n'
    'exec head -c "$3" -- "$real"\n'
)

#: The write counterpart: ``$1`` the path, ``$2`` the working tree, ``$3`` the byte count on
#: standard input. Exit 3: outside; 4: a directory; 5: not a regular file. Without GNU
#: ``realpath -m`` (busybox) the check is on the path as given (links not followed).
WRITE_SCRIPT = (
    'root=$(readlink -f -- "$2") || exit 6\n'
    'real=$(realpath -m -- "$1" 2>/dev/null) || real=$1\n'
    'case "$real/" in "$root"/*) ;; *) echo "outside: $1" >&2; exit 3;; esac\n'
    'if [ "$real" = "$root" ] || [ -d "$real" ]; then echo "Is a directory: $1" >&2; exit 4; fi\n'
    'if [ -e "$real" ] && [ ! -f "$real" ]; then echo "not a regular file: $1" >&2; exit 5; fi\n'
    'mkdir -p -- "$(dirname -- "$real")" && head -c "$3" > "$real"\n'
)


def script_error(code: int, path: str, message: str) -> Exception | None:
    """The exception an exec'd :data:`READ_SCRIPT` or :data:`WRITE_SCRIPT` exit code stands for
    (``None`` for an exit code of its own: the caller's failure)."""
    if code == 2:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    if code == 3:
        return PathOutsideSandbox(f"{path} leads outside the sandbox's working tree")
    if code == 4:
        return IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if code == 5:
        return NotARegularFile(f"{path} is not a regular file (a device, FIFO or socket)")
    del message
    return None
