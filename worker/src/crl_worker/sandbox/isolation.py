"""Namespaces around a local sandbox's shell: its processes see only each other, and all die with it.

The local backend starts its shell through ``unshare`` (util-linux)::

    setpriv --pdeathsig KILL -- unshare --pid --ipc --uts --fork --kill-child --mount-proc [--user ...] -- bash ...

- ``--pid --fork``: the shell is process 1 of a new PID namespace. When it dies the kernel
  SIGKILLs every other process of the namespace, whatever it did to get away (``setsid``, a double
  fork, ``nohup``, a daemon): closing the sandbox leaves nothing running.
- ``--mount-proc``: a private ``/proc`` showing only the namespace's processes, so nothing in the
  sandbox can read another process's ``environ``, ``cmdline`` or memory — the worker's API keys
  among them (``/proc/$PPID`` does not exist: the shell's parent is outside the namespace).
- ``--kill-child`` and ``setpriv --pdeathsig KILL``: when the worker dies, even by SIGKILL,
  ``unshare`` gets SIGKILL and passes it to the shell, and with it to the namespace.
- ``--ipc --uts``: System V shared memory, semaphores and message queues, POSIX message
  queues and the host name of its own: such objects outlive the processes that made them, so in
  the host's namespaces one sandbox (a grading with the hidden tests in it) could leave them for
  the next (issue 30). The kernel keyrings, which no namespace separates for a root worker, are
  closed by the confinement's seccomp filter (:mod:`crl_worker.sandbox.confine`, step 8).
- ``--user --map-current-user`` (only when the worker is not root): unprivileged users may make
  the other namespaces inside a user namespace; the user keeps its own id inside.

Files (``confine``, see :mod:`crl_worker.sandbox.confine`): in the same mount namespace, before
the shell starts, the shell is moved into an allowlist root where the kernel allows
(:func:`can_root`: the system directories, a few files of ``/etc``, its own ``/dev`` and
``/proc``, nothing else of the host), the worker's ``HOME``, other sandboxes and the worker's
working directory are hidden, everything else is read-only but the sandbox's own folder, private
``/tmp`` and what a plan gives back, unix sockets are covered and the capabilities that would
undo it are dropped. Network
(``offline``): once the task's install commands have run, the shell starts again in a network
namespace of its own (``unshare --net``) with only a loopback interface, so nothing it runs
reaches the host's network or its ``127.0.0.1``. The user remains the host's (see
docs/security.md). ``bash`` as process 1 behaves as elsewhere: it reaps the orphans re-parented to
it, and signals sent from outside reach it only for the handlers it installs (SIGINT, which is
what timeouts send; SIGKILL always).
"""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from crl_worker.errors import SandboxError
from crl_worker.sandbox.transport import NSENTER

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "namespaces", "none"]
"""``namespaces``: required (a sandbox fails to start without them); ``none``: a plain child
process; ``auto``: namespaces when this machine allows them, else none with a warning."""

_PROBE_TIMEOUT = 10.0
_probed: dict[tuple[str, ...], str | None] = {}
_warned = False


def namespace_candidates() -> list[list[str]]:
    """The command prefixes that run a program in fresh PID and mount namespaces (see the
    module docs), best first; empty when ``unshare`` is not installed.

    Not root: in a user namespace too, mapping the user to itself (util-linux 2.38+), else to
    root inside (older ``unshare``; ``id -u`` then says 0 in the sandbox).
    """
    system = "/usr/bin:/bin:/usr/sbin:/sbin"
    unshare = shutil.which("unshare", path=system)
    if unshare is None:
        return []
    setpriv = shutil.which("setpriv", path=system)
    front = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv is not None else []
    base = [*front, unshare, "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
    if os.geteuid() == 0:
        return [[*base, "--"]]
    return [
        [*base, "--user", mapping, "--"] for mapping in ("--map-current-user", "--map-root-user")
    ]


async def _trial(argv: list[str], check: str, what: str) -> str | None:
    """Run the shell ``check`` behind ``argv``: why it failed, or None when it exited 0."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            "/bin/sh",
            "-c",
            check,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", "LANG": "C"},
        )
    except OSError as exc:
        return f"{argv[0]}: {exc}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), _PROBE_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"{what} did not finish within {_PROBE_TIMEOUT:.0f} s"
    if proc.returncode != 0:
        return out.decode("utf-8", "replace").strip()[-500:] or f"exit {proc.returncode}"
    return None


async def _probe(prefix: tuple[str, ...]) -> str | None:
    """Why ``prefix`` cannot run a program in its namespaces, or None when it can."""
    # In the namespace, the probe is process 1 and sees only itself in /proc.
    check = "[ $$ = 1 ] && [ ! -e /proc/2 ] || { echo 'not in a fresh pid namespace'; exit 3; }"
    return await _trial(list(prefix), check, "unshare")


async def shell_prefix(mode: Isolation, *, name: str = "sandbox") -> list[str]:
    """The command prefix a local sandbox's shell starts through for isolation ``mode``.

    ``namespaces`` raises :class:`SandboxError` when this machine cannot make them; ``auto`` then
    logs a warning (once per process) and returns no prefix. The check runs once per process.
    """
    global _warned
    if mode == "none":
        return []
    reason = "unshare (util-linux) is not installed"
    for candidate in namespace_candidates():
        prefix = tuple(candidate)
        if prefix not in _probed:
            _probed[prefix] = await _probe(prefix)
        found = _probed[prefix]
        if found is None:
            return candidate
        reason = found
    if mode == "namespaces":
        raise SandboxError(
            f"{name}: isolation 'namespaces' is required but unavailable here ({reason}); "
            "set isolation: none to run without it"
        )
    if not _warned:
        _warned = True
        logger.warning(
            "local sandboxes run without namespaces (%s): their processes can see the worker's "
            "(and its environment), and detached ones outlive the sandbox; see docs/security.md",
            reason,
        )
    return []


#: Where :mod:`crl_worker.sandbox.confine` stages what it keeps: the first of these that exists
#: (a tmpfs covers it briefly, in the sandbox's mount namespace only).
STAGE_CANDIDATES = ("/mnt", "/media", "/srv", "/opt")
#: Folders that get a private, writable tmpfs in a confined sandbox.
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
#: Folders a confined sandbox never sees, besides the worker's ``HOME`` and environment: where
#: Kubernetes and Docker put a pod's secrets.
SECRET_FOLDERS = ("/root", "/run/secrets", "/var/run/secrets")
#: What an allowlist root shows of the host's system, read-only (those that exist; a link among
#: them stays a link): the programs and libraries.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What an allowlist root shows of ``/etc`` (names or globs, those that exist): users and groups
#: by name, name resolution and TLS for the install commands, the dynamic linker's cache, the
#: alternatives and configuration that the toolchains' own files link to (the JDK's ``conf``,
#: Maven's, Debian's Python ``sitecustomize``), time zone, system identification, and the
#: package tools' system-wide settings (an index mirror, a wheel folder). Not ``shadow``, not
#: ``ssh``, not service configuration.
ETC_ENTRIES = (
    "passwd", "group", "nsswitch.conf", "hosts", "host.conf", "resolv.conf", "gai.conf",
    "protocols", "services", "networks", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl",
    "pki", "ca-certificates", "ca-certificates.conf", "crypto-policies", "alternatives",
    "localtime", "timezone", "os-release", "lsb-release", "debian_version", "mime.types",
    "mtab", "gitconfig", "pip.conf", "uv", "npmrc", "fonts", "terminfo", "locale.alias",
    "java-*", "maven", "python3*",
)  # fmt: skip


def allowlist() -> list[str]:
    """The host paths an allowlist root shows read-only (:data:`SYSTEM_DIRS` and the
    :data:`ETC_ENTRIES` that exist here), sorted."""
    found = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    for entry in ETC_ENTRIES:
        found += glob.glob(os.path.join("/etc", entry)) if "*" in entry else [f"/etc/{entry}"]
    return sorted(p for p in dict.fromkeys(found) if os.path.lexists(p))


@dataclass(frozen=True)
class Bind:
    """Something a confined sandbox keeps seeing: ``source`` shown at ``target``."""

    source: str
    target: str
    writable: bool = False
    upper: str | None = None
    """An overlay instead of a bind: ``source`` read-only below, what the sandbox writes kept
    in this folder (``work`` is overlayfs's work folder beside it, on the same file system)."""
    work: str | None = None
    within: str | None = None
    """The folder ``upper`` and ``work`` lie in (the sandbox's, which its user may change):
    :mod:`crl_worker.sandbox.confine` refuses layers reached through a link in it, which would
    turn the overlay onto a host folder the user names."""


@dataclass
class Plan:
    """What a confined sandbox sees of this machine's files (see
    :mod:`crl_worker.sandbox.confine`, which applies it)."""

    hide: list[str] = field(default_factory=list)
    """Folders replaced by an empty, read-only tmpfs."""
    scratch: list[str] = field(default_factory=lambda: list(SCRATCH))
    """Folders replaced by a private, writable tmpfs."""
    binds: list[Bind] = field(default_factory=list)
    """What stays visible inside hidden folders, writable or not; everything else is read-only."""
    scratch_size: str = "512m"
    """Size cap of each scratch tmpfs (memory, used only as written)."""
    loopback: bool = False
    """Bring ``lo`` up: the shell has a network namespace of its own (:func:`offline`)."""
    root: list[str] | None = None
    """An allowlist root (:func:`allowlist`): the shell sees a new root holding these host paths
    (read-only), ``/dev``, ``/proc``, the scratch folders and the binds, nothing else of the
    host. None: the host's root, read-only, with ``hide`` hidden."""

    def hidden(self, path: str | Path) -> bool:
        """Whether ``path`` lies in a hidden or scratch folder, or outside an allowlist root's
        paths (so needs a bind to be seen)."""
        text = str(path)
        if self.root is not None and not _inside(text, self.root):
            return True
        return _inside(text, [*self.hide, *self.scratch])

    def visible(self) -> tuple[list[str], list[str]]:
        """What the sandbox sees of the host, for :class:`~crl_worker.sandbox.identity.View`:
        (folders hidden, what shows again inside them), resolved."""
        real = os.path.realpath
        kept = [real(b.target) for b in self.binds]
        if self.root is None:
            return [real(f) for f in (*self.hide, *self.scratch)], kept
        # Each entry as what it shows: a link's target (inside the others, or bound as such);
        # and the device nodes of the root's own /dev (a read of them is refused as a device).
        from crl_worker.sandbox.confine import DEVICES

        devices = [f"/dev/{name}" for name in DEVICES]
        return ["/"], [*(real(p) for p in self.root), *devices, *kept]

    def keep(
        self, source: str | Path, *, target: str | Path | None = None, writable: bool = False
    ) -> None:
        """Keep ``source`` visible (at ``target``, default its own path) when a hidden folder
        covers it or the target differs; a writable bind is always kept (it lifts read-only)."""
        destination = str(target or source)
        if destination == str(source) and not writable and not self.hidden(source):
            return
        self.binds.append(Bind(str(source), destination, writable))

    def overlay(self, source: str | Path, upper: Path, work: Path, *, within: Path) -> None:
        """Show ``source`` at its own path copy-on-write: what the sandbox writes there goes to
        ``upper`` (made here, with ``work``, both in the folder ``within``), the original stays
        as it was."""
        for text in (str(source), str(upper), str(work)):
            if any(c in text for c in ",:\\"):
                raise SandboxError(f"cannot overlay {text}: overlayfs takes no ',', ':' or '\\'")
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        self.binds.append(Bind(str(source), str(source), True, str(upper), str(work), str(within)))

    def to_json(self) -> str:
        """The plan as :mod:`crl_worker.sandbox.confine` reads it (binds outermost first)."""
        # Not one that holds what is bound: the staging tmpfs (and the new root) would cover it.
        held = [p for b in self.binds for p in (b.source, b.upper, b.work) if p]
        stage = next(
            (
                c
                for c in STAGE_CANDIDATES
                if os.path.isdir(c) and not any(_inside(p, [c]) for p in held)
            ),
            None,
        )
        if stage is None:
            raise SandboxError(
                "no folder to stage a confined sandbox's mounts in: none of "
                + ", ".join(STAGE_CANDIDATES)
                + " exists apart from what the sandbox keeps"
            )
        binds = sorted(self.binds, key=lambda b: (b.target.count("/"), b.target))
        covers = [*self.hide, *self.scratch]

        def outermost(folders: list[str]) -> list[str]:
            # A folder inside another covered one is covered already.
            return [
                f
                for f in dict.fromkeys(folders)
                if not any(f != o and f.startswith(o.rstrip("/") + "/") for o in covers)
            ]

        # A hidden folder that is also scratch is scratch (private and writable).
        hide = [h for h in self.hide if h not in self.scratch]
        data: dict[str, Any] = {
            "stage": stage,
            "hide": sorted(outermost(hide)),
            "scratch": outermost(self.scratch),
            "scratch_size": self.scratch_size,
            "binds": [b.__dict__ for b in binds],
            "loopback": self.loopback,
        }
        if self.root is not None:
            data["root"] = self.root
        if self.loopback:
            # The host's sockets, listed in the host's network namespace (see confine.py).
            from crl_worker.sandbox.confine import listening_sockets

            data["sockets"] = listening_sockets()
        return json.dumps(data)


def confine_command(plan: Plan) -> list[str]:
    """The command that applies ``plan`` and then runs the command placed after it."""
    script = Path(__file__).with_name("confine.py")
    return [sys.executable, "-I", "-S", str(script), plan.to_json(), "--"]


_confine_probed: dict[tuple[str, ...], str | None] = {}


def _inside(path: str, folders: list[str] | tuple[str, ...]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


async def _probe_confinement(prefix: tuple[str, ...], *, root: bool = False) -> str | None:
    """Why confinement (with an allowlist ``root``) fails behind ``prefix``, or None when a
    trial plan holds."""
    with tempfile.TemporaryDirectory(prefix="crl-confine-probe-") as folder:
        hidden, kept = Path(folder, "hidden"), Path(folder, "hidden", "kept")
        kept.mkdir(parents=True)
        (hidden / "secret").write_text("x")
        plan = Plan(hide=[str(hidden)], scratch=[], binds=[Bind(str(kept), str(kept), True)])
        check = (
            f"[ ! -e {hidden}/secret ] && touch {kept}/ok && ! touch {folder}/no 2>/dev/null "
            "|| { echo 'the trial plan did not hold'; exit 3; }"
        )
        if root:
            # Outside the allowlist, though neither hidden nor private: not there at all.
            (Path(folder) / "outside").write_text("x")
            plan = Plan(hide=[], scratch=[], binds=plan.binds, root=allowlist())
            check = f"[ ! -e {folder}/outside ] && [ -e /dev/null ] && {check}"
        found = await _trial([*prefix, *confine_command(plan)], check, "the confinement probe")
        if found is None and not (kept / "ok").exists():
            found = "the trial plan did not hold"
        return found


async def can_confine(prefix: list[str], mode: Isolation, *, name: str = "sandbox") -> bool:
    """Whether a sandbox behind the namespace ``prefix`` can have its files confined.

    ``namespaces`` raises :class:`SandboxError` when it cannot; ``auto`` logs a warning once.
    """
    global _confine_warned
    if not prefix:
        return False
    key = tuple(prefix)
    if key not in _confine_probed:
        _confine_probed[key] = await _probe_confinement(key)
    reason = _confine_probed[key]
    if reason is None:
        return True
    if mode == "namespaces":
        raise SandboxError(
            f"{name}: isolation 'namespaces' is required but its file confinement fails here "
            f"({reason}); set isolation: none to run without it"
        )
    if not _confine_warned:
        _confine_warned = True
        logger.warning(
            "local sandboxes run without file confinement (%s): they can read the worker's "
            "files; see docs/security.md",
            reason,
        )
    return False


_confine_warned = False
_root_probed: dict[tuple[str, ...], str | None] = {}
_root_warned = False


async def can_root(prefix: list[str]) -> bool:
    """Whether a confined sandbox behind ``prefix`` can have an allowlist root (a new root it
    is moved into with ``pivot_root``); where it cannot it keeps the host's root with a hide
    list, and a warning says why (once per process)."""
    global _root_warned
    if not prefix:
        return False
    key = tuple(prefix)
    if key not in _root_probed:
        _root_probed[key] = await _probe_confinement(key, root=True)
    reason = _root_probed[key]
    if reason is not None and not _root_warned:
        _root_warned = True
        logger.warning(
            "local sandboxes keep the host's root, read-only with a hide list, instead of an "
            "allowlist root (%s): they can read what the list misses (/etc, /opt, other "
            "users' homes); see docs/security.md",
            reason,
        )
    return reason is None


def offline(prefix: list[str]) -> list[str]:
    """``prefix`` (of :func:`namespace_candidates`) with a network namespace of its own too:
    only a loopback interface (which the confinement brings up), no route out."""
    if "--net" in prefix or not prefix:
        return list(prefix)
    at = next(i for i, word in enumerate(prefix) if os.path.basename(word) == "unshare")
    return [*prefix[: at + 1], "--net", *prefix[at + 1 :]]


_offline_probed: dict[tuple[str, ...], str | None] = {}
_offline_warned = False


async def can_go_offline(prefix: list[str], mode: Isolation, *, name: str = "sandbox") -> bool:
    """Whether a confined sandbox behind ``prefix`` can lose the network once installed (a
    network namespace and its loopback up). ``namespaces`` raises :class:`SandboxError` when it
    cannot; ``auto`` logs a warning once."""
    global _offline_warned
    if not prefix:
        return False
    key = tuple(prefix)
    if key not in _offline_probed:
        plan = Plan(hide=[], scratch=[], loopback=True)
        argv = [*offline(prefix), *confine_command(plan)]
        _offline_probed[key] = await _trial(argv, "true", "the network namespace probe")
    reason = _offline_probed[key]
    if reason is None:
        return True
    if mode == "namespaces":
        raise SandboxError(
            f"{name}: isolation 'namespaces' is required but a network namespace fails here "
            f"({reason}); set network: host (or isolation: none) to run without it"
        )
    if not _offline_warned:
        _offline_warned = True
        logger.warning(
            "local sandboxes keep the host's network (%s): a candidate can fetch code while it "
            "is graded; see docs/security.md",
            reason,
        )
    return False


def keyring_filter_command() -> list[str]:
    """What a script joining a confined shell's namespaces starts through, before ``nsenter``:
    the confinement's keyring filter alone (:mod:`crl_worker.sandbox.confine`, step 8), which
    ``nsenter`` and the script inherit."""
    script = Path(__file__).with_name("confine.py")
    return [sys.executable, "-I", "-S", str(script), "--no-keyrings", "--"]


def join_command(identity: tuple[int, int] | None = None) -> list[str]:
    """What a script joining a confined shell's namespaces runs behind: ``setpriv`` dropping the
    capabilities :mod:`crl_worker.sandbox.confine` dropped for the shell, and taking the shell's
    ``identity`` (uid, gid) when it has one (:func:`identity_command`)."""
    if identity is not None:
        return identity_command(identity)
    from crl_worker.sandbox.confine import DROPPED_CAP_NAMES

    drop = ",".join(f"-{name}" for name in DROPPED_CAP_NAMES)
    return [_setpriv(), "--bounding-set", drop, "--"]


def _setpriv() -> str:
    return shutil.which("setpriv", path="/usr/bin:/bin") or "setpriv"


def identity_command(identity: tuple[int, int]) -> list[str]:
    """A command prefix that runs what follows as ``identity`` (uid, gid), with no
    supplementary groups, no capabilities (none to keep, none to inherit, an empty bounding
    set) and ``no_new_privs`` (no set-user-ID program or file capability gives any back)."""
    uid, gid = identity
    return [
        _setpriv(), f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip


def can_join(prefix: list[str]) -> bool:
    """Whether scripts may join the namespaces a shell started behind ``prefix``: only without a
    user namespace (as root), where ``nsenter`` needs nothing more."""
    return bool(prefix) and "--user" not in prefix and os.path.exists(NSENTER)
