"""Resource limits of a local sandbox: a cgroup of its own for memory, processes and CPU.

Each local sandbox's shell (and the scripts run beside it) enter a cgroup made for that sandbox
under the worker's own cgroup, so the worker's limits still hold around it::

    <the worker's cgroup>/crl-sandboxes/<worker pid>-<n>/

- **cgroup v1** (one hierarchy per controller): the ``memory``, ``pids`` and ``cpu`` hierarchies,
  each at the worker's path in it (``/proc/self/cgroup``); ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` where swap is accounted), ``pids.max``,
  ``cpu.cfs_quota_us``.
- **cgroup v2** (one unified hierarchy): the worker's cgroup must hand the controllers down
  (``cgroup.subtree_control``). A cgroup with processes of its own cannot, so when enabling them
  fails with ``EBUSY`` the processes of the worker's cgroup move to a leaf ``crl-worker`` beside
  the sandboxes first (what container runtimes do when nested); ``memory.max``,
  ``memory.swap.max`` 0, ``pids.max``, ``cpu.max``.

A controller the worker's cgroup lacks on v2 is asked of the cgroups above it (root only: each
ancestor from the mount's root down hands it on, where the kernel lets it; an ancestor holding
processes of its own cannot, and is left as it is). The limits of the controllers the worker got
are set and the others are not: one warning names what is not enforced and why. A machine where
nothing works (no cgroup file system, no write access to the worker's cgroup: a worker that is
not root on cgroup v1, or a v2 cgroup not delegated to its user) runs sandboxes without limits,
with a warning naming the reason.

The kernel enforces the limits: past ``memory`` its OOM killer ends a process of that sandbox
only; past ``pids`` ``fork`` fails with ``EAGAIN``. :meth:`Cgroup.usage` reads the counters the
sandbox compares before and after each command, to say in the result which limit it hit.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

#: Folder under the worker's cgroup that holds the sandboxes' cgroups.
PARENT = "crl-sandboxes"
#: Leaf the worker's own processes move to on cgroup v2 (see the module docs).
WORKER_LEAF = "crl-worker"
CONTROLLERS = ("memory", "pids", "cpu")
#: The CFS period the CPU quota is expressed in (microseconds; the kernel's default).
CPU_PERIOD = 100_000

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of a size such as ``8g``, ``512m``, ``1.5GiB`` or ``1048576`` (powers of 1024).

    Raises :class:`ValueError` naming the text when it is not one.
    """
    found = _SIZE.match(text)
    if found is None:
        raise ValueError(
            f"not a size: {text!r} (write a number of bytes, or one with k, m, g or t: '8g')"
        )
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def show_size(size: int) -> str:
    """``size`` bytes for a person: ``64 MiB``, ``8 GiB``."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:g} {unit}"
    return f"{size} bytes"


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use; ``None``: no limit of that kind."""

    memory: int | None = None
    """Bytes of memory (the page cache and tmpfs files it writes count too)."""
    pids: int | None = None
    """Processes and threads at once."""
    cpus: float | None = None
    """CPU time per second of wall time, in CPUs (``1.5``: one and a half cores)."""

    def __bool__(self) -> bool:
        return any(value is not None for value in self.by_controller().values())

    def by_controller(self) -> dict[str, float | None]:
        """Each limit under the name of the cgroup controller that enforces it."""
        return {"memory": self.memory, "pids": self.pids, "cpu": self.cpus}


@dataclass(frozen=True)
class Usage:
    """Counters of a sandbox's cgroup that only grow."""

    oom_kills: int = 0
    """Processes the kernel's OOM killer ended for exceeding the memory limit."""
    pids_refused: int = 0
    """Forks refused for the process limit."""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == key and words[1].isdigit():
            return int(words[1])
    return 0


class Cgroup:
    """One sandbox's cgroup: a folder per v1 hierarchy, or one folder on v2."""

    def __init__(self, folders: dict[str, Path], *, version: int, limits: Limits) -> None:
        self.folders = folders
        """The folder of each controller (on v2 all the same)."""
        self.version = version
        self.limits = limits

    @property
    def procs(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to enter the cgroup."""
        return [str(folder / "cgroup.procs") for folder in dict.fromkeys(self.folders.values())]

    def enter_command(self) -> list[str]:
        """A command prefix that enters this cgroup, then execs what follows (``/bin/sh``: the
        pid that enters is the one that runs the command; exit 125 when it cannot)."""
        script = (
            'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        )
        return ["/bin/sh", "-c", script, "crl-cgroup", *self.procs, "--"]

    def usage(self) -> Usage:
        """The OOM kills and refused forks so far."""
        memory = self.folders.get("memory")
        pids = self.folders.get("pids")
        oom = 0
        if memory is not None:
            name = "memory.oom_control" if self.version == 1 else "memory.events"
            oom = _counter(_read(memory / name), "oom_kill")
        refused = _counter(_read(pids / "pids.events"), "max") if pids is not None else 0
        return Usage(oom_kills=oom, pids_refused=refused)

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        found: set[int] = set()
        for procs in self.procs:
            found.update(int(word) for word in _read(Path(procs)).split() if word.isdigit())
        return sorted(found)

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup until none is left (a fork bomb included: at the
        process limit it cannot replace them as fast as they go)."""
        kill = next(iter(self.folders.values())) / "cgroup.kill"
        if self.version == 2 and kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
        for _ in range(200):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        logger.warning("cgroup %s still has processes after SIGKILL", self.procs[0])

    def remove(self) -> None:
        """Kill what is left in the cgroup and remove its folders."""
        self.kill_all()
        for folder in dict.fromkeys(self.folders.values()):
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        logger.debug("cannot remove cgroup %s: %s", folder, exc)
                        break
                    time.sleep(0.01)  # dying processes leave it a moment later


@dataclass(frozen=True)
class Hierarchy:
    """Where this worker makes its sandboxes' cgroups."""

    version: int
    parents: dict[str, Path]
    """The :data:`PARENT` folder of each controller the worker got (on v2 with none of them:
    ``{"cgroup": folder}``, processes only)."""
    lacking: str = ""
    """Why the wanted controllers not in :attr:`parents` are missing ("" when none is)."""

    def unenforced(self, limits: Limits) -> list[str]:
        """The limits of ``limits`` this hierarchy cannot set (their controller is missing)."""
        asked = limits.by_controller()
        return [c for c, value in asked.items() if value is not None and c not in self.parents]

    def make(self, name: str, limits: Limits) -> Cgroup:
        """A new cgroup ``name`` with ``limits`` written before any process enters it.

        Raises :class:`OSError` when the kernel refuses (nothing is left behind then).
        """
        # Only the hierarchies a limit needs: on v1 each one a process enters costs a migration
        # (tens of milliseconds on a busy machine).
        needed = limits.by_controller()
        folders = {
            controller: parent / name
            for controller, parent in self.parents.items()
            if needed.get(controller) is not None or self.version == 2
        }
        if not folders:
            raise OSError(errno.EINVAL, "no limit to set")
        cgroup = Cgroup(folders, version=self.version, limits=limits)
        try:
            for folder in dict.fromkeys(folders.values()):
                folder.mkdir()
            _write_limits(cgroup)
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def sweep(self) -> None:
        """Remove the empty cgroups of workers that are gone."""
        for parent in dict.fromkeys(self.parents.values()):
            with contextlib.suppress(OSError):
                for folder in parent.iterdir():
                    owner = folder.name.split("-", 1)[0]
                    if folder.is_dir() and owner.isdigit() and not _alive(int(owner)):
                        with contextlib.suppress(OSError):
                            folder.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_limits(cgroup: Cgroup) -> None:
    limits, folders = cgroup.limits, cgroup.folders
    # The process limit first: nothing may fork without bound even for a moment.
    if limits.pids is not None and "pids" in folders:
        (folders["pids"] / "pids.max").write_text(str(limits.pids))
    if limits.memory is not None and "memory" in folders:
        memory = folders["memory"]
        if cgroup.version == 1:
            (memory / "memory.limit_in_bytes").write_text(str(limits.memory))
            swap = memory / "memory.memsw.limit_in_bytes"
            if swap.exists():
                with contextlib.suppress(OSError):  # swap accounting off: nothing to bound
                    swap.write_text(str(limits.memory))
        else:
            (memory / "memory.max").write_text(str(limits.memory))
            swap = memory / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
    if limits.cpus is not None and "cpu" in folders:
        quota = max(1000, int(limits.cpus * CPU_PERIOD))
        cpu = folders["cpu"]
        if cgroup.version == 1:
            (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD))
            (cpu / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (cpu / "cpu.max").write_text(f"{quota} {CPU_PERIOD}")


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root in the hierarchy, file system type, super options) of each cgroup
    mount in ``mountinfo``."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((fields[4], fields[3], tail[0], set(tail[2].split(","))))
    return found


def find(
    wanted: tuple[str, ...] = CONTROLLERS,
    *,
    proc: Path = Path("/proc/self"),
) -> Hierarchy | str:
    """This worker's place to make sandbox cgroups with the controllers ``wanted``, or why
    there is none (see the module docs)."""
    mountinfo, membership = _read(proc / "mountinfo"), _read(proc / "cgroup")
    if not mountinfo or not membership:
        return f"cannot read {proc}/mountinfo or {proc}/cgroup"
    own_v1: dict[str, str] = {}
    own_v2: str | None = None
    for line in membership.splitlines():
        number, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if number == "0" and names == "":
            own_v2 = path
        for name in names.split(","):
            own_v1[name] = path
    mounts = _mounts(mountinfo)
    v1: dict[str, Path] = {}
    for point, root, kind, options in mounts:
        for controller in wanted:
            if kind == "cgroup" and controller in options and controller in own_v1:
                relative = os.path.relpath(own_v1[controller], root)
                if not relative.startswith(".."):
                    v1[controller] = Path(point, relative).resolve()
    if v1:
        missing = [c for c in wanted if c not in v1]
        try:
            parents = {c: _ensure(folder / PARENT) for c, folder in v1.items()}
        except OSError as exc:
            return f"cannot make cgroups under the worker's ({exc})"
        lacking = f"cgroup v1 without {_names(missing)} mounted" if missing else ""
        return Hierarchy(1, parents, lacking)
    unified = next(((p, r) for p, r, kind, _ in mounts if kind == "cgroup2"), None)
    if unified is None or own_v2 is None:
        return "no cgroup file system is mounted"
    relative = os.path.relpath(own_v2, unified[1])
    if relative.startswith(".."):
        return f"the worker's cgroup {own_v2} is outside the mounted cgroup2 {unified[0]}"
    own = Path(unified[0], relative).resolve()
    lacking = ""
    got = tuple(c for c in wanted if c in _read(own / "cgroup.controllers").split())
    if got != wanted:
        got, lacking = _from_ancestors(Path(unified[0]), own, wanted)
    try:
        parent = _delegate(own, got)
    except OSError as exc:
        return f"cannot hand {_names(got)} down from {own} ({exc})"
    # One folder for all (named "cgroup" when no controller is had: processes only).
    return Hierarchy(2, dict.fromkeys(got or ("cgroup",), parent), lacking)


def _names(controllers: Sequence[str]) -> str:
    """``the pids, cpu controllers``, ``the cpu controller``."""
    return f"the {', '.join(controllers)} controller{'s' if len(controllers) > 1 else ''}"


def _from_ancestors(top: Path, own: Path, wanted: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """On cgroup v2: the controllers of ``wanted`` that ``own`` can have once each cgroup from
    ``top`` (the mount's root) down to ``own``'s parent hands them on, and why the others
    cannot be had ("" when all can). Only root asks: an ancestor is not the worker's to change
    otherwise, and one holding processes of its own refuses (``EBUSY``) and is left as it is."""
    why = ""
    if os.geteuid() == 0:
        for relative in reversed(own.relative_to(top).parents):  # top first, own's parent last
            folder = top / relative
            has = _read(folder / "cgroup.controllers").split()
            try:
                _enable(folder, tuple(c for c in wanted if c in has))
            except OSError as exc:
                why = f"{folder} cannot hand them on: {exc.strerror or exc}"
                break
    available = _read(own / "cgroup.controllers").split()
    got = tuple(c for c in wanted if c in available)
    missing = [c for c in wanted if c not in got]
    if not missing:
        return got, ""
    reason = why or ("only root asks the cgroups above for them" if os.geteuid() else "")
    return got, f"{own} lacks {_names(missing)}" + (f" ({reason})" if reason else "")


def _ensure(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    return folder


def _enable(folder: Path, wanted: tuple[str, ...]) -> None:
    available = set(_read(folder / "cgroup.controllers").split())
    missing = [c for c in wanted if c not in available]
    if missing:
        raise OSError(errno.ENOTSUP, f"{folder} lacks the {', '.join(missing)} controller")
    enabled = set(_read(folder / "cgroup.subtree_control").split())
    todo = " ".join(f"+{c}" for c in wanted if c not in enabled)
    if todo:
        (folder / "cgroup.subtree_control").write_text(todo)


def _delegate(own: Path, wanted: tuple[str, ...]) -> Path:
    """On cgroup v2: :data:`PARENT` under ``own`` with ``wanted`` handed down to its children."""
    try:
        _enable(own, wanted)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        # "No internal processes": move the worker's cgroup's processes to a leaf, then retry.
        leaf = _ensure(own / WORKER_LEAF)
        for pid in _read(own / "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError):
                (leaf / "cgroup.procs").write_text(pid)
        logger.info("moved the processes of cgroup %s to %s to delegate controllers", own, leaf)
        _enable(own, wanted)
    parent = _ensure(own / PARENT)
    _enable(parent, wanted)
    return parent


_found: Hierarchy | str | None = None
_warned = False
_warned_unenforced = False
_made = 0


def make_cgroup(limits: Limits, *, name: str = "sandbox") -> Cgroup | None:
    """A cgroup with ``limits`` for one sandbox, or None (with a warning, once) when this
    machine cannot make one, or when there are no limits."""
    global _found, _warned, _warned_unenforced, _made
    if not limits:
        return None
    if _found is None:
        _found = find()
        if isinstance(_found, Hierarchy):
            _found.sweep()
    reason: str
    if isinstance(_found, Hierarchy):
        reason = "no free cgroup name"
        unenforced = _found.unenforced(limits)
        if unenforced and not _warned_unenforced:
            _warned_unenforced = True
            logger.warning(
                "%s runs without its %s limit%s (%s): the other limits hold; see docs/sandboxes.md",
                name,
                ", ".join(unenforced),
                "s" if len(unenforced) > 1 else "",
                _found.lacking,
            )
        for _ in range(20):  # names of a dead worker with the same pid may still be there
            _made += 1
            try:
                return _found.make(f"{os.getpid()}-{_made}", limits)
            except FileExistsError:
                continue
            except OSError as exc:
                reason = f"making its cgroup failed: {exc}"
                break
    else:
        reason = _found
    if not _warned:
        _warned = True
        logger.warning(
            "%s runs without resource limits (%s): a fork bomb or a memory hog in a local "
            "sandbox can take down the worker; see docs/sandboxes.md",
            name,
            reason,
        )
    return None


def mount_folder(folder: Path, size: int) -> str | None:
    """Make the empty ``folder`` a tmpfs of ``size`` bytes (the sandbox's disk limit): None, or
    why it cannot be (only root mounts here)."""
    if os.geteuid() != 0:
        return "only a worker running as root can mount the sandbox's folder"
    from crl_worker.sandbox.confine import MS_NODEV, MS_NOSUID, mount

    try:
        mount("crl-sandbox", str(folder), "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700")
    except OSError as exc:
        return str(exc)
    return None


def unmount_folder(folder: Path) -> None:
    """Undo :func:`mount_folder` (nothing when ``folder`` is not a mount point)."""
    if os.path.ismount(folder):
        from crl_worker.sandbox.confine import unmount

        try:
            unmount(str(folder))
        except OSError as exc:
            logger.warning("cannot unmount the sandbox folder %s: %s", folder, exc)


def disk_full(folder: Path, size: int) -> str | None:
    """The note for a command's result when the sandbox's folder (a tmpfs of ``size`` bytes)
    is full, else None."""
    try:
        free = os.statvfs(folder)
    except OSError:
        return None
    if free.f_bavail * free.f_frsize >= min(1 << 20, size // 100):
        return None
    return (
        f"crl: the sandbox's folder is full: the command exceeded its disk limit "
        f"({show_size(size)})"
    )


def exceeded(cgroup: Cgroup, before: Usage) -> tuple[str, bool] | None:
    """What the sandbox's last command ran into since ``before``: the note for its result and
    whether its processes must go (the process limit: a fork bomb stays at it), or None."""
    after = cgroup.usage()
    limits = cgroup.limits
    if after.oom_kills > before.oom_kills and limits.memory is not None:
        killed = after.oom_kills - before.oom_kills
        return (
            f"crl: the command exceeded its memory limit ({show_size(limits.memory)}): the "
            f"kernel killed {killed} process{'es' if killed > 1 else ''} of the sandbox",
            False,
        )
    if after.pids_refused > before.pids_refused and limits.pids is not None:
        return (
            f"crl: the command exceeded its process limit ({limits.pids} processes and "
            "threads): every process of the sandbox was killed and the shell restarted",
            True,
        )
    return None
