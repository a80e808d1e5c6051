"""Confine a local sandbox's view of the file system, then run its shell (standard library only).

Run as process 1 of the sandbox's fresh PID and mount namespaces (see
:mod:`crl_worker.sandbox.isolation`), before the shell::

    python -I -S confine.py '<plan as JSON>' -- bash ...

It changes only the new mount namespace (the worker and the host see nothing of it), in this order:

0. **Allowlist root** (``root``, where the worker's probe found it possible): a tmpfs at
   ``stage`` becomes the new root, holding read-only binds of the ``root`` paths (the system
   directories and a few files of ``/etc``; a link among them stays a link when it leads inside
   them, else shows what it leads to), a ``/dev`` of its own (``null``, ``zero``, ``full``,
   ``random``, ``urandom``, ``tty``, the ``fd`` links, a private ``pts`` where allowed), the
   namespace's ``/proc``, mount points for the binds and scratch folders, and the staging
   folder of step 1; ``pivot_root`` moves the sandbox into it and the host's root is detached.
   Nothing else of the host is there: the steps below then run on the new root.
1. **Stage** what the sandbox must keep (``binds``: its own folder, the interpreter, caches) by
   bind-mounting each onto a private tmpfs at ``stage``: step 3 covers some of their paths. A
   bind with an ``upper`` folder is an overlay instead: the source read-only below, what the
   sandbox writes going to ``upper`` (copy-on-write build caches).
2. **Read-only everywhere**: every mount of the namespace becomes read-only (``mount_setattr``,
   recursive), so the sandbox writes nothing outside what step 4 gives back.
3. **Hide** (``hide``): an empty tmpfs over each folder that holds secrets or other sandboxes
   (the worker's ``HOME``, ``/root``, the sandboxes' parent folder, the worker's working
   directory); **scratch** (``scratch``): a writable tmpfs of its own over ``/tmp``,
   ``/var/tmp`` and ``/dev/shm``.
4. **Give back** each staged bind at its own path (mount points are made in the tmpfs where
   needed), writable where the plan says so.
5. **Unix sockets**: every socket file the host listens on (``/proc/net/unix``) that the sandbox
   still sees gets ``/dev/null`` bound over it: no Docker or containerd socket, no D-Bus.
6. **Loopback** (``loopback``, when the sandbox has a network namespace of its own: no network
   once the task is installed): ``lo`` is brought up, so tests that serve on ``127.0.0.1`` still
   work; nothing else is there to reach.
7. **Capabilities**: the bounding set loses those that would undo this (mount and unmount,
   ``open_by_handle_at``, ptrace, raw I/O, modules, device nodes...).
8. **No kernel keyrings**: a seccomp filter makes ``add_key``, ``request_key`` and ``keyctl``
   fail with ``EPERM`` (as Docker's default profile does): a user's keyring is one per user
   across every sandbox that runs as it and outlives them, a channel from one grading to the next
   (issue 30). Then ``exec`` of the command.

``confine.py --no-keyrings -- COMMAND...`` applies step 8 alone (scripts that join a confined
shell's namespaces start through it).

Any failure exits with status 125 and a message on standard error before the shell starts: a
sandbox is never started half-confined.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import socket
import stat
import struct
import sys
from typing import Any

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MNT_DETACH = 0x2
MS_NOEXEC = 0x8
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
#: mount_setattr(2): the same number on every architecture (the unified syscall table, 5.12+).
SYS_MOUNT_SETATTR = 442
PR_CAPBSET_DROP = 24
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
#: The keyring system calls (add_key, request_key, keyctl) by seccomp's audit architecture,
#: with the mask that folds x32's numbers onto x86-64's, per machine: its own table and the
#: 32-bit one it also runs.
KEYRING_CALLS = {
    "x86_64": [(0xC000003E, 0xBFFFFFFF, (248, 249, 250)), (0x40000003, 0xFFFFFFFF, (286, 287, 288))],
    "aarch64": [(0xC00000B7, 0xFFFFFFFF, (217, 218, 219)), (0x40000028, 0xFFFFFFFF, (309, 310, 311))],
}  # fmt: skip

#: pivot_root(2) by machine (no C library wraps it).
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
#: The device nodes an allowlist root's ``/dev`` shows (bound from the host's).
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: Its links.
DEVICE_LINKS = {
    "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx",
}  # fmt: skip

#: Capabilities the sandbox's root loses: each could undo the confinement or reach the host
#: (sys_admin: mount/umount/setns; dac_read_search: open_by_handle_at; sys_ptrace; sys_module;
#: sys_rawio; mknod; sys_boot; sys_time; net_admin; syslog; mac_admin/override; audit; bpf;
#: perfmon; linux_immutable; sys_chroot).
DROPPED_CAPS = (21, 2, 19, 16, 17, 27, 22, 25, 12, 34, 33, 32, 30, 29, 39, 38, 9, 18)
#: The same, by the names ``setpriv --bounding-set`` takes (scripts that join the shell's
#: namespaces drop them so).
DROPPED_CAP_NAMES = (
    "sys_admin", "dac_read_search", "sys_ptrace", "sys_module", "sys_rawio", "mknod",
    "sys_boot", "sys_time", "net_admin", "syslog", "mac_admin", "mac_override",
    "audit_control", "audit_write", "bpf", "perfmon", "linux_immutable", "sys_chroot",
)  # fmt: skip


class SockFilter(ctypes.Structure):
    """``struct sock_filter``: one classic BPF instruction."""

    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class SockFprog(ctypes.Structure):
    """``struct sock_fprog``: a BPF program."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


class MountAttr(ctypes.Structure):
    """``struct mount_attr`` of mount_setattr(2)."""

    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    """mount(2)."""
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def unmount(target: str) -> None:
    """umount2(2), detached: the mount goes once nothing uses it."""
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def set_readonly(path: str, readonly: bool) -> None:
    """Make the mount at ``path`` and every mount below it read-only, or writable again."""
    attr = MountAttr(MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else MOUNT_ATTR_RDONLY)
    _check(
        _libc.syscall(
            SYS_MOUNT_SETATTR,
            AT_FDCWD,
            path.encode(),
            ctypes.c_uint(AT_RECURSIVE),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        ),
        f"mount_setattr {path}",
    )


def _mount_point(path: str, like_directory: bool) -> None:
    """Make ``path`` exist as a directory or an empty file to mount on."""
    if like_directory:
        os.makedirs(path, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.lexists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def listening_sockets() -> list[str]:
    """Paths of the unix sockets bound on this machine (``/proc/net/unix``)."""
    found = []
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as lines:
            next(lines, None)
            for line in lines:
                fields = line.split(maxsplit=7)
                if len(fields) == 8 and fields[7].startswith("/"):
                    found.append(fields[7].rstrip("\n"))
    except OSError:
        pass
    return found


def _inside(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def loopback_up() -> None:
    """Bring ``lo`` up in this network namespace (a fresh one has it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _unlinked(layer: str, within: str | None) -> None:
    """Refuse an overlay ``layer`` that a link in ``within`` (a folder the sandbox's user may
    change, e.g. by replacing the layer with a link to a host folder) leads elsewhere."""
    if within is None:
        return
    relative = os.path.relpath(layer, within)
    if relative.startswith(".."):
        raise OSError(errno.EINVAL, f"overlay layer {layer} is outside {within}")
    if os.path.realpath(layer) != os.path.join(os.path.realpath(within), relative):
        raise OSError(errno.ELOOP, f"overlay layer {layer} is reached through a link: refused")


def pivot_root(new_root: str) -> None:
    """Make ``new_root`` (a mount point) this mount namespace's root and detach the old one."""
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown on {os.uname().machine}")
    os.chdir(new_root)
    # pivot_root(".", "."): the old root ends up stacked under the new one, then goes.
    _check(_libc.syscall(number, b".", b"."), f"pivot_root {new_root}")
    unmount(".")
    os.chdir("/")


def _bind_allowed(path: str, new_root: str, allowed: list[str]) -> None:
    """Show the host's ``path`` at the same place under ``new_root``: a link that leads inside
    ``allowed`` as a link, anything else as a read-only (later) bind of what it is or leads to."""
    place = new_root + path
    real = os.path.realpath(path)
    if os.path.islink(path) and _inside(real, [*allowed, "/proc", "/dev"]):
        os.makedirs(os.path.dirname(place), exist_ok=True)
        os.symlink(os.readlink(path), place)
        return
    try:
        is_dir = stat.S_ISDIR(os.stat(real).st_mode)
    except OSError:
        return  # a dangling link: nothing to show
    _mount_point(place, is_dir)
    mount(real, place, None, MS_BIND | MS_REC, None)


def _make_dev(new_root: str) -> None:
    """A ``/dev`` of its own under ``new_root`` (see the module docs)."""
    dev = f"{new_root}/dev"
    os.makedirs(dev, exist_ok=True)
    mount("crl-dev", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _mount_point(f"{dev}/{name}", False)
            mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND, None)
    for name, target in DEVICE_LINKS.items():
        os.symlink(target, f"{dev}/{name}")
    for folder in ("shm", "pts"):
        os.mkdir(f"{dev}/{folder}")
    try:
        options = "newinstance,ptmxmode=0666,mode=0620"
        mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC, options)
    except OSError:
        pass  # no pseudo-terminals in this sandbox: nothing else depends on them


def build_root(plan: dict[str, Any], new_root: str) -> None:
    """Step 0 (see the module docs) up to the pivot: the new root at ``new_root``."""
    allowed = sorted(plan["root"], key=lambda p: (p.count("/"), p))
    for path in allowed:
        _bind_allowed(path, new_root, allowed)
    _make_dev(new_root)
    os.makedirs(f"{new_root}/proc", exist_ok=True)
    mount("/proc", f"{new_root}/proc", None, MS_BIND | MS_REC, None)
    for folder in plan["scratch"]:
        if not _inside(folder, allowed):
            os.makedirs(new_root + folder, exist_ok=True)


def confine(plan: dict[str, Any]) -> None:
    """Apply ``plan`` to this mount namespace (see the module docs)."""
    stage = plan["stage"]
    # The working directory was entered before the mounts: enter it again through them at the end.
    cwd = os.getcwd()
    # With an allowlist root the stage is made in the new root, at the path it has after the
    # pivot; the new root's own folders are made at ``near`` until then.
    near = stage if "root" in plan else ""
    if near:
        mount("crl-root", near, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        os.makedirs(near + stage)
    mount("crl-stage", near + stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0700")
    staged: list[tuple[str, dict[str, Any], bool]] = []
    for number, bind in enumerate(plan["binds"]):
        source = bind["source"]
        try:
            is_dir = stat.S_ISDIR(os.stat(source).st_mode)
        except OSError:
            continue  # nothing to keep
        point = f"{stage}/{number}"
        _mount_point(near + point, is_dir)
        if bind.get("upper"):
            # Copy-on-write: the source read-only below, what the sandbox writes in ``upper``.
            _unlinked(bind["upper"], bind.get("within"))
            _unlinked(bind["work"], bind.get("within"))
            layers = f"lowerdir={source},upperdir={bind['upper']},workdir={bind['work']}"
            mount("crl-overlay", near + point, "overlay", MS_NOSUID | MS_NODEV, layers)
        else:
            mount(source, near + point, None, MS_BIND | MS_REC, None)
        staged.append((point, bind, is_dir))
    if near:
        build_root(plan, near)
        for _, bind, is_dir in staged:
            if not _inside(bind["target"], [*plan["root"], *plan["scratch"]]):
                # Its mount point, in the new root's tmpfs (read-only by the time it moves
                # there); made after the new root's own /dev, which would cover one below it.
                _mount_point(near + bind["target"], is_dir)
        pivot_root(near)

    set_readonly("/", True)

    for folder in plan["hide"]:
        if os.path.isdir(folder) and not os.path.islink(folder):
            mount("crl-hidden", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for folder in plan["scratch"]:
        if os.path.isdir(folder) and not os.path.islink(folder):
            options = f"size={plan.get('scratch_size', '1g')},mode=1777"
            mount("crl-scratch", folder, "tmpfs", MS_NOSUID | MS_NODEV, options)

    for point, bind, is_dir in staged:
        target = bind["target"]
        _mount_point(target, is_dir)
        mount(point, target, None, MS_MOVE, None)
        if bind.get("writable"):
            set_readonly(target, False)

    for folder in plan["hide"]:
        if os.path.ismount(folder):
            # Empty and read-only from now on (the mount points made above stay).
            mount("crl-hidden", folder, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)

    keep = [bind["target"] for _, bind, _ in staged]
    # In a network namespace of its own, /proc/net/unix lists only the namespace's sockets, yet
    # the host's are still reachable through their files: the worker lists them in the plan.
    for path in dict.fromkeys([*plan.get("sockets", []), *listening_sockets()]):
        if _inside(path, keep):
            continue
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
            mount("/dev/null", path, None, MS_BIND, None)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
                raise

    unmount(stage)
    try:
        os.chdir(cwd)
    except FileNotFoundError:
        if not near or _inside(cwd, [bind["target"] for _, bind, _ in staged]):
            raise
        os.chdir("/")  # never part of the new root (the worker's own folder, for a probe)
    if plan.get("loopback"):
        loopback_up()

    for cap in DROPPED_CAPS:
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            code = ctypes.get_errno()
            if code != errno.EINVAL:  # a capability this kernel does not know
                raise OSError(code, f"drop capability {cap}: {os.strerror(code)}")


def keyring_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The seccomp program (classic BPF: code, jt, jf, k) that fails the keyring calls with
    ``EPERM`` and allows everything else; empty for a machine :data:`KEYRING_CALLS` lacks."""
    ld_arch, ld_nr, and_k = (0x20, 0, 0, 4), (0x20, 0, 0, 0), 0x54  # BPF_LD|W|ABS, ALU|AND|K
    jeq, ret = 0x15, 0x06  # BPF_JMP|JEQ|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, RET_ERRNO
    tables = KEYRING_CALLS.get(machine, [])
    if not tables:
        return []
    block = 7  # per architecture: jeq arch, load, and, three jeq, ret allow
    deny_at = 1 + block * len(tables) + 1
    program = [ld_arch]
    for arch, mask, calls in tables:
        program.append((jeq, 0, block - 1, arch))
        program += [ld_nr, (and_k, 0, 0, mask)]
        for call in calls:
            program.append((jeq, deny_at - len(program) - 1, 0, call))
        program.append((ret, 0, 0, allow))
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return program


def deny_keyrings() -> None:
    """Install :func:`keyring_filter` for this process and what it executes (needs
    ``CAP_SYS_ADMIN`` in its user namespace, or ``no_new_privs``)."""
    program = keyring_filter(os.uname().machine)
    if not program:
        return
    instructions = (SockFilter * len(program))(*(SockFilter(*i) for i in program))
    fprog = SockFprog(len(program), instructions)
    mode = ctypes.c_ulong(SECCOMP_MODE_FILTER)
    result = _libc.prctl(PR_SET_SECCOMP, mode, ctypes.byref(fprog), 0, 0)
    _check(result, "seccomp filter for the keyring calls")


def main(argv: list[str]) -> int:
    """``confine.py PLAN -- COMMAND...``: confine, then exec the command (125 on failure);
    ``confine.py --no-keyrings -- COMMAND...``: only the keyring filter (step 8)."""
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: confine.py PLAN_JSON|--no-keyrings -- COMMAND [ARGS...]\n")
        return 125
    try:
        if argv[1] != "--no-keyrings":
            confine(json.loads(argv[1]))
        deny_keyrings()
        os.execvp(argv[3], argv[3:])
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"crl sandbox confinement failed: {exc}\n")
    return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv))
