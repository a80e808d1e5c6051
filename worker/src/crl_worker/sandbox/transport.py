"""How a :class:`~crl_worker.sandbox.shell.ShellSandbox` reaches its environment.

A sandbox needs five things from where it runs, and only these differ between backends:

- a long-lived shell process whose standard input and output are byte streams
  (:meth:`Transport.open_shell`), framed by :class:`~crl_worker.sandbox.session.ShellSession`;
- a way to signal what that shell runs, out of band (:meth:`Transport.signal`), and to kill
  what is left of a session that is given up (:meth:`Transport.end_shell`);
- a one-shot bash script in the repository for the base state
  (:meth:`Transport.run_script`, the scripts of :mod:`crl_worker.sandbox.gitstate`);
- files in and out, as bytes, never through the agent's shell (:meth:`Transport.read_file`,
  :meth:`Transport.write_file`).

Transports here:

- :class:`LocalTransport`: this machine, directly (a child process, ``os.kill``, the file
  system); the local backend's.
- :class:`ExecTransport`: everything through commands exec'd in the environment (a wrapper that
  ``cd``-s and sets the environment, signals by ``/proc`` parentage, files through ``cat`` and
  ``head -c``), over two primitives a subclass provides. :class:`ProcessTransport` implements
  them with local processes (tests, one machine);
  :class:`crl_worker.sandbox.kubernetes.PodExecTransport` with the pod ``exec`` API.
- :class:`crl_worker.sandbox.docker.DockerTransport`: Docker exec and tar archives.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import posixpath
import shlex
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from crl_worker.errors import SandboxError
from crl_worker.sandbox.gitstate import script_command
from crl_worker.sandbox.repos import run_captured
from crl_worker.sandbox.session import (
    SESSION_ENV,
    SHELL_ARGV,
    ByteReader,
    ByteWriter,
    ShellProcess,
)

logger = logging.getLogger(__name__)


def default_interrupts() -> None:
    """In a child before it runs its shell: SIGINT and SIGQUIT back to their defaults.

    A worker started in the background by a non-interactive shell (``crl train ... &`` in a
    script, ``nohup``) inherits both ignored, and an ignored disposition survives ``exec``: its
    sandboxes' shells could then never be interrupted, and every timeout would fall through to
    killing the command's processes (whose shell then runs the rest of the command line)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Transport(Protocol):
    """What a shell sandbox needs from the place it runs in (see the module docs)."""

    @property
    def shell_open(self) -> bool:
        """Whether the transport still holds the shell (a process not yet exited, an exec
        stream still connected); ``True`` where it cannot tell."""
        ...

    async def open_shell(self, workdir: str) -> tuple[ByteReader, ByteWriter]:
        """Start :data:`~crl_worker.sandbox.session.SHELL_ARGV` in ``workdir`` with the session
        environment; return its standard output and standard input (standard error is not
        needed: the framing merges each command's into standard output)."""
        ...

    async def signal(self, sig: int, shell: ShellProcess) -> None:
        """Deliver ``sig`` as a :data:`~crl_worker.sandbox.session.Signaller` must."""
        ...

    async def end_shell(self, shell: ShellProcess | None) -> None:
        """Kill what is left of a session that was closed (its shell and what the shell
        started), so a new one starts clean; ``shell`` is ``None`` when it never answered."""
        ...

    async def run_script(
        self, script: str, workdir: str, *, timeout: float
    ) -> tuple[int, bytes, bytes]:
        """Run a bash ``script`` in ``workdir`` outside the session; exit code, stdout, stderr."""
        ...

    async def read_file(self, path: str) -> bytes:
        """The bytes of ``path`` (absolute); ``FileNotFoundError``/``IsADirectoryError`` for a
        bad path, :class:`SandboxError` when the transport fails."""
        ...

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (absolute), creating parent directories."""
        ...

    async def aclose(self) -> None:
        """Release what the transport holds (processes, connections). Safe to call twice."""
        ...


# --- this machine, directly ---------------------------------------------------------------------


def _proc_stat(pid: str) -> tuple[int, int] | None:
    """(process group, session) of a process from ``/proc``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            line = handle.read()
    except OSError:
        return None
    # Fields after the parenthesised command name: state ppid pgrp session ...
    fields = line[line.rfind(b")") + 2 :].split()
    return int(fields[2]), int(fields[3])


def _processes(*, pgid: int | None = None, sid: int | None = None) -> list[int]:
    """Pids in a process group or a session (Linux ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _proc_stat(entry)
        if stat is None:
            continue
        if (pgid is not None and stat[0] == pgid) or (sid is not None and stat[1] == sid):
            found.append(int(entry))
    return found


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                line = handle.read()
        except OSError:
            continue
        if int(line[line.rfind(b")") + 2 :].split()[1]) == pid:
            found.append(int(entry))
    return found


def _descendant_shell(pid: int) -> int | None:
    """The process under ``pid`` that runs the shell: its only child (following the chain of
    single children while their command is not the shell's), or None when there is none yet."""
    current = pid
    for _ in range(4):
        try:
            with open(f"/proc/{current}/task/{current}/children", "rb") as handle:
                children = handle.read().split()
        except OSError:  # a kernel without CONFIG_PROC_CHILDREN: by parent pid
            children = [str(child).encode() for child in _children(current)]
        if len(children) != 1:
            return None
        current = int(children[0])
        try:
            with open(f"/proc/{current}/comm", "rb") as handle:
                if handle.read().strip() == b"bash":
                    return current
        except OSError:
            return None
    return None


#: util-linux's nsenter (scripts join a confined shell's namespaces with it).
NSENTER = "/usr/bin/nsenter"
#: ``_CD + [folder, command...]``: run the command in ``folder``.
_CD = ["/bin/sh", "-c", 'cd "$1" && shift && exec "$@"', "crl-cd"]


class LocalTransport:
    """This machine: the shell is a child process in a session of its own, signals are
    ``os.kill``, files are the file system, scripts run with the shell's environment minus
    its ``GIT_*`` variables.

    ``env`` is the shell's whole environment (the local backend fills it while provisioning).
    ``prefix`` is a command the shell starts through: the local backend's namespaces
    (:mod:`crl_worker.sandbox.isolation`), in which the shell is process 1 of its own PID
    namespace; the pids the shell reports about itself are then the namespace's, and the
    transport finds the host's from ``/proc``.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        name: str = "local",
        prefix: Sequence[str] = (),
    ) -> None:
        self.env: dict[str, str] = dict(env or {})
        self.name = name
        self.prefix: list[str] = list(prefix)
        self.join: list[str] = []
        """When set (the local backend sets it while a confined session is open), scripts join
        the shell's mount and PID namespaces with ``nsenter`` and run behind this command (it
        drops the capabilities the shell lacks) instead of making namespaces of their own."""
        self.join_front: list[str] = []
        """What such a script starts through before ``nsenter`` (the local backend's keyring
        filter: what it installs, ``nsenter`` and the script inherit)."""
        self.join_network = False
        """Scripts that join the shell's namespaces join its network namespace too (the local
        backend's sandboxes without network)."""
        self.enter: list[str] = []
        """A command in front of everything the transport starts, ``prefix`` and ``nsenter``
        included, that execs what follows (the local backend's: enter the sandbox's cgroup)."""
        self._proc: asyncio.subprocess.Process | None = None
        self._shell: tuple[int, int] | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the process the transport started for the current shell (the shell,
        or the ``prefix`` command in front of it); None when none was started, or it was ended."""
        return self._proc.pid if self._proc is not None else None

    @property
    def shell_pid(self) -> int | None:
        """Process id, on this machine's side of any namespace, of the current shell itself
        (None when there is none, or it has not started yet)."""
        found = self._host_shell()
        return found[0] if found is not None else None

    @property
    def shell_open(self) -> bool:
        """Whether the current shell process has not exited."""
        return self._proc is not None and self._proc.returncode is None

    async def open_shell(self, workdir: str) -> tuple[ByteReader, ByteWriter]:
        """Start the shell as a child process with piped standard input and output."""
        proc = await asyncio.create_subprocess_exec(
            *self.enter,
            *self.prefix,
            *SHELL_ARGV,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=workdir,
            env=self.env,
            # Its own session and process group: signals and cleanup reach the whole tree.
            start_new_session=True,
            preexec_fn=default_interrupts,
        )
        assert proc.stdin is not None and proc.stdout is not None
        self._proc = proc
        self._shell = None
        return proc.stdout, proc.stdin

    def _host_shell(self) -> tuple[int, int] | None:
        """(pid, process group) of the shell on this machine's side of any namespace."""
        proc = self._proc
        if proc is None:
            return None
        if not self.prefix:
            return proc.pid, proc.pid  # ``enter`` execs the shell: the same process
        if self._shell is None:
            # The prefix execs its way to unshare, which forks the shell: the one child of
            # the process started. Being process 1, the shell leads a process group of its own.
            shell = _descendant_shell(proc.pid)
            if shell is None:
                return None
            stat = _proc_stat(str(shell))
            if stat is None:
                return None
            self._shell = (shell, stat[0])
        return self._shell

    async def signal(self, sig: int, shell: ShellProcess) -> None:
        """SIGINT to the shell's process group; any other signal to the group but the shell."""
        del shell  # the shell's own pids are its namespace's; the transport knows the host's
        found = self._host_shell()
        if found is None:
            if self._proc is not None and self._proc.returncode is None:
                logger.warning("%s: cannot find the shell's process to signal", self.name)
            return
        shell_pid, pgid = found
        if sig == signal.SIGINT:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            return
        spared = {shell_pid, self._proc.pid if self._proc is not None else shell_pid}
        for pid in _processes(pgid=pgid):
            if pid not in spared:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    async def end_shell(self, shell: ShellProcess | None) -> None:
        """SIGKILL the shell and everything in its session (background jobs included), and
        wait for the shell. In a PID namespace, killing the shell (its process 1) kills every
        process of the namespace, detached ones included."""
        del shell  # the process handle says more than the shell's own report
        self.kill_now()
        proc, self._proc, self._shell = self._proc, None, None
        if proc is None:
            return
        # Not proc.wait(): it also waits for the pipes to close, which a process that left the
        # session (setsid) and still holds the shell's output never does without namespaces —
        # that stalled every close for 10 s, and the transport then outlived the event loop
        # ('Event loop is closed' at exit). The exit status alone says the shell is gone.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while proc.returncode is None and loop.time() < deadline:
            await asyncio.sleep(0.005)
        if proc.returncode is None:
            logger.warning("%s: the shell (pid %d) did not exit after SIGKILL", self.name, proc.pid)
        # Close our ends of the pipes now, while the loop runs (asyncio has no public handle
        # on the process's transport).
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()

    def kill_now(self) -> None:
        """SIGKILL the shell and what it started, without waiting (interpreter exit)."""
        found = self._host_shell()
        proc = self._proc
        if proc is None:
            return
        first = [found[0]] if found is not None else []
        for pid in [*first, proc.pid, *_processes(sid=proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def run_script(
        self, script: str, workdir: str, *, timeout: float
    ) -> tuple[int, bytes, bytes]:
        """Run ``bash -c script`` in ``workdir`` without input, with the shell's environment
        (never the worker's: the repository's configuration is the agent's to write, and git
        may run what it names)."""
        env = {k: v for k, v in (self.env or os.environ).items() if not k.startswith("GIT_")}
        prefix = self.prefix
        found = self._host_shell() if self.join and self.shell_open else None
        if found is not None:
            # Into the open shell's confined namespaces: the same view of the files, at the cost
            # of two execs instead of new namespaces and a confinement of their own.
            # The shell's root and working directory (nsenter resolves a --wd path before it
            # enters them: a folder the sandbox's user cannot walk to), then into ``workdir``.
            spaces = ["-m", "-p", "-i", "-u", *(["-n"] if self.join_network else [])]
            prefix = [
                *self.join_front, NSENTER, "-t", str(found[0]), *spaces, "-r", "-w",
                *self.join, *_CD, workdir,
            ]  # fmt: skip
        return await run_captured(
            # Through the prefix too: what git runs from the repository's configuration sees no
            # other process (and dies with the script, or with the shell it joined).
            [*self.enter, *prefix, *script_command(script)],
            what=f"{self.name}: a script in {workdir}",
            cwd=workdir,
            env=env,
            timeout=timeout,
        )

    async def read_file(self, path: str) -> bytes:
        """The file's bytes, read in a worker thread."""
        return await asyncio.to_thread(Path(path).read_bytes)

    async def write_file(self, path: str, data: bytes) -> None:
        """Write the bytes in a worker thread, creating parent directories."""
        target = Path(path)

        def write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        await asyncio.to_thread(write)

    async def aclose(self) -> None:
        """Kill the shell's processes."""
        await self.end_shell(None)


# --- everything through exec'd commands ---------------------------------------------------------


def tree_signal_script(sig: int, shell: ShellProcess) -> str:
    """A POSIX shell script that signals the session's shell and what it runs, found by
    parentage rather than by process group.

    An exec'd process's group is whatever the runtime (or a test cluster's fake node, which
    runs execs as local processes) gives it: it may be shared with processes that are not the
    sandbox's, and the group may even lie outside the container's pid namespace. The descendants of the shell are
    the sandbox's by construction. ``SIGINT`` goes to the shell and every descendant (the
    interactive shell abandons the command line; background jobs ignore it); any other signal
    goes to the descendants only, never to the shell.

    The shell is signalled first: a child killed before the shell has its ``SIGINT`` pending
    lets the shell go on to the rest of the command line (``sleep 60; echo after`` printed
    ``after`` now and then).
    """
    targets = "$root $pids" if sig == signal.SIGINT else "$pids"
    return (
        f"root={shell.pid}\n"
        # pid and parent pid of every process; the name in parentheses may hold spaces.
        "parents() { for f in /proc/[0-9]*/stat; do\n"
        '  read -r line < "$f" 2>/dev/null || continue\n'
        '  pid=${line%% *}; rest=${line##*\\) }; set -- $rest; echo "$pid $2"\n'
        "done; }\n"
        'pids=$(parents | awk -v root="$root" \'{ parent[$1] = $2 } END {\n'
        "  for (p in parent) { q = p; n = 0\n"
        "    while ((q in parent) && q != root && q > 1 && n++ < 1000) q = parent[q]\n"
        "    if (q == root && p != root) print p } }')\n"
        f'[ -n "{targets}" ] && kill -{int(sig)} {targets} 2>/dev/null\n'
        "true\n"
    )


class ExecTransport(abc.ABC):
    """A transport that reaches the environment only by running commands in it.

    Subclasses provide two primitives: :meth:`open_process` (a long-lived process with byte
    streams) and :meth:`exec_once` (a command run to completion). The rest is built on them:
    the shell starts through a wrapper that ``cd``-s and sets the session environment (an exec
    API has no parameters for either), signals find the shell's descendants by ``/proc``
    parentage (:func:`tree_signal_script`), files go through ``cat`` and ``head -c``.

    ``shell`` runs the wrapper, the base-state scripts and file writes (the environment's bash).
    """

    def __init__(self, *, shell: str = "/bin/bash", name: str = "sandbox") -> None:
        self.shell = shell
        self.name = name

    @abc.abstractmethod
    async def open_process(self, argv: list[str]) -> tuple[ByteReader, ByteWriter]:
        """Start ``argv`` with standard input and output as byte streams."""

    @abc.abstractmethod
    async def exec_once(
        self, argv: list[str], stdin: bytes | None = None, timeout: float = 300
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` to completion; return exit code, stdout and stderr."""

    @property
    def shell_open(self) -> bool:
        """``True``: a subclass that can tell a dropped shell says so."""
        return True

    def shell_argv(self, workdir: str) -> list[str]:
        """The session's shell, started in ``workdir`` with the session environment."""
        return [
            self.shell,
            "-c",
            'cd -- "$1" || exit 97; shift; exec "$@"',
            "crl-session",
            workdir,
            "env",
            *(f"{k}={v}" for k, v in SESSION_ENV.items()),
            self.shell,
            *SHELL_ARGV[1:],
        ]

    async def open_shell(self, workdir: str) -> tuple[ByteReader, ByteWriter]:
        """Start the shell through :meth:`shell_argv`."""
        return await self.open_process(self.shell_argv(workdir))

    async def signal(self, sig: int, shell: ShellProcess) -> None:
        """Signal the shell's tree with a separate command (:func:`tree_signal_script`)."""
        code, _, err = await self.exec_once(
            ["sh", "-c", tree_signal_script(sig, shell)], timeout=30
        )
        if code != 0:
            logger.warning("%s: signalling the shell failed: %s", self.name, err[-500:])

    async def end_shell(self, shell: ShellProcess | None) -> None:
        """SIGKILL the shell's descendants, then the shell."""
        if shell is None:
            return
        await self.signal(signal.SIGKILL, shell)
        await self.exec_once(
            [self.shell, "-c", f"kill -KILL {shell.pid} 2>/dev/null; true"], timeout=30
        )

    async def run_script(
        self, script: str, workdir: str, *, timeout: float
    ) -> tuple[int, bytes, bytes]:
        """``cd`` to ``workdir`` and run the script with :attr:`shell`."""
        return await self.exec_once(
            [self.shell, "-c", f"cd {shlex.quote(workdir)} || exit 97\n{script}"],
            timeout=timeout,
        )

    async def read_file(self, path: str) -> bytes:
        """The file's bytes through ``cat``."""
        full = posixpath.normpath(path)
        code, out, err = await self.exec_once(["cat", "--", full], timeout=600)
        if code != 0:
            message = err.decode("utf-8", "replace").strip()
            if "No such file" in message:
                raise FileNotFoundError(f"{full} does not exist in the sandbox")
            if "Is a directory" in message:
                raise IsADirectoryError(f"{full} is a directory")
            raise SandboxError(f"{self.name}: reading {full} failed: {message}")
        return out

    async def write_file(self, path: str, data: bytes) -> None:
        """Write the bytes through ``head -c``, creating parent directories."""
        full = posixpath.normpath(path)
        # head -c reads exactly the file's length: the write does not depend on the exec
        # stream delivering the end of stdin (v4 cannot; some kubelets do not pass it on).
        script = 'mkdir -p -- "$(dirname -- "$1")" && head -c "$2" > "$1"'
        code, _, err = await self.exec_once(
            [self.shell, "-c", script, "write", full, str(len(data))], stdin=data, timeout=600
        )
        if code != 0:
            message = err.decode("utf-8", "replace").strip()
            if "Is a directory" in message:
                raise IsADirectoryError(f"{full} is a directory")
            raise SandboxError(f"{self.name}: writing {full} failed: {message}")

    async def aclose(self) -> None:  # noqa: B027 (a hook: most subclasses hold something)
        """Nothing to release unless a subclass holds connections or processes."""


class ProcessTransport(ExecTransport):
    """Local processes standing in for a remote environment: exactly the commands a pod exec
    would run, answered by this machine (tests, one machine)."""

    def __init__(
        self,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        *,
        shell: str = "/bin/bash",
        name: str = "process sandbox",
    ) -> None:
        super().__init__(shell=shell, name=name)
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self._processes: list[asyncio.subprocess.Process] = []

    async def open_process(self, argv: list[str]) -> tuple[ByteReader, ByteWriter]:
        """Start a local process with piped stdin/stdout, in its own session (process group)."""
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=self.cwd,
            env=self.env,
            start_new_session=True,
            preexec_fn=default_interrupts,
        )
        self._processes.append(process)
        assert process.stdout is not None and process.stdin is not None
        return process.stdout, process.stdin

    async def exec_once(
        self, argv: list[str], stdin: bytes | None = None, timeout: float = 300
    ) -> tuple[int, bytes, bytes]:
        """Run a local process to completion."""
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.cwd,
            env=self.env,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin), timeout)
        except TimeoutError as exc:
            process.kill()
            await process.wait()
            raise SandboxError(f"{argv[0]} did not finish within {timeout:.0f} s") from exc
        return process.returncode or 0, out, err

    async def aclose(self) -> None:
        """Stop the shells this transport started."""
        for process in self._processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        self._processes.clear()
