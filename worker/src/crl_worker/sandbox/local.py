"""The local sandbox (the embedded default): a temporary clone and a bash process on this machine.

Layout of one sandbox (under ``root``, default the system temp dir)::

    crl-<instance>-XXXX/
        testbed/    the repository at its base commit (``workdir``; SWE-bench's name for it)
        venv/       Python tasks: the virtual environment with the task's interpreter

Provisioning: clone (see :mod:`crl_worker.sandbox.repos`), virtual environment (see
:mod:`crl_worker.sandbox.interpreters`), the task's ``install`` commands in the session, then the
base-state snapshot (:mod:`crl_worker.sandbox.gitstate`) and a fresh session. The shell gets a
clean environment: ``HOME`` of the worker, the session defaults, the variables of
``env_passthrough``, the venv or ``JAVA_HOME``, and ``task.env``; the worker's other variables (API
keys among them) do not reach the agent.

``PATH`` never continues into the worker's: a ``pytest`` (or ``pip``, ``python``) installed on this
machine would run tests against the machine's packages instead of the task's environment. It is,
in this order:

1. the task's environment: ``<sandbox>/venv/bin`` (Python) or ``$JAVA_HOME/bin`` (Java);
2. ``<sandbox>/tools``: links to the few host tools the sandbox needs that are not in the system
   directories — ``git`` and ``patch`` (the harness runs them), ``mvn``/``gradle`` for Java tasks,
   and the names in the config's ``tools``;
3. the system directories :data:`SYSTEM_PATH` (``/usr/sbin:/usr/bin:/sbin:/bin``; not
   ``/usr/local/bin``, where ``pip install`` of the system Python puts its console scripts).

A ``PATH`` in ``task.env`` replaces all of it.

Leftovers: each sandbox's folder holds a lock file while open (:mod:`crl_worker.sandbox.leftovers`);
making a sandbox removes the folders under the same root whose worker is gone.

Isolation (``isolation``, see :mod:`crl_worker.sandbox.isolation`): the shell and the base-state
scripts run in PID and mount namespaces of their own where the machine allows, so the sandbox sees
only its own processes and every process it started dies when it closes. Inside, ``$$`` of the
shell is 1 and the pids the agent sees are the namespace's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path

from crl_worker.errors import SandboxError
from crl_worker.sandbox import identity, isolation, leftovers, limits, node, repos, toolchains
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.files import FileTooLarge, read_local
from crl_worker.sandbox.interpreters import (
    Interpreter,
    MissingInterpreterError,
    find_python,
    find_uv,
    host_path,
)
from crl_worker.sandbox.limited import LimitedSandbox
from crl_worker.sandbox.session import SESSION_ENV
from crl_worker.sandbox.transport import LocalTransport
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

_INSTALL_OUTPUT = 64 << 10

#: The system's base directories, the end of every local sandbox's ``PATH``.
SYSTEM_PATH = toolchains.SYSTEM_PATH

#: The repository's folder in the sandbox (the ``workdir``), whatever the repository's name.
CHECKOUT_FOLDER = "testbed"

#: uv copies into a sandbox's environment what it would hard-link from its shared cache: an
#: in-place edit of an installed file would otherwise change the cache, and with it every later
#: sandbox's environment (the integrity check's fresh one included).
_NO_LINKS = {"UV_LINK_MODE": "copy"}
#: ``uv venv --seed`` takes pip from uv's cache (``--offline`` first), else from the package index
#: in one request: uv's default retries cost about 10 s per sandbox on a machine without network
#: before ``python -m venv`` (ensurepip) took over (an air-gapped GPU machine's sandboxes started
#: in 8 to 18 s instead of 1 to 2). Never an interpreter download: the task's is on this machine.
_UV_VENV_ENV = {**_NO_LINKS, "UV_HTTP_RETRIES": "0", "UV_PYTHON_DOWNLOADS": "never"}
#: Passed-through variables naming caches: writable while the task installs, read-only after.
_CACHE_VARIABLES = frozenset({"GOMODCACHE", "GOCACHE", "GRADLE_USER_HOME"})


def _read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


class LocalSandbox(LimitedSandbox):
    """A sandbox on this machine (see the module docs): provisioning here, the rest is
    :class:`~crl_worker.sandbox.shell.ShellSandbox` over a
    :class:`~crl_worker.sandbox.transport.LocalTransport`."""

    transport: LocalTransport

    def __init__(self, config: LocalSandboxConfig, task: Task) -> None:
        name = f"local sandbox {task.instance_id}"
        super().__init__(
            LocalTransport(name=name),
            workdir="",
            name=name,
            default_timeout=task.timeouts.command,
            interrupt_grace=config.interrupt_grace,
            start_timeout=config.start_timeout,
        )
        self.config = config
        self.task = task
        self.root: Path | None = None
        self.venv: Path | None = None
        self.interpreter: Interpreter | None = None
        self.confined = False
        """Whether the shell's view of the files is confined (see :meth:`confinement`)."""
        self.allowlist = False
        """Whether the confined shell sees an allowlist root rather than the host's (see
        :meth:`confinement`)."""
        self.offline = False
        """Whether the shell has no network once the task is installed (``network: none``)."""
        self._namespaces: list[str] = []
        self._owner: int | None = None
        self.cgroup = None
        self._disk = None
        self._handed = False
        self._overlays: list[isolation.Bind] = []
        self._view: identity.View | None = None
        self._jest: Path | None = None  # JavaScript tasks: the shared Jest install
        self.identity: tuple[int, int] | None = None
        """(uid, gid) the agent's commands run as: the config's ``user`` when the worker is
        root and the sandbox is confined, else None (the worker's own user)."""

    @property
    def env(self) -> dict[str, str]:
        """The shell's whole environment (set while provisioning)."""
        return self.transport.env

    @property
    def shell_pid(self) -> int | None:
        """Process id of the session's shell on this machine (None when no session is open;
        inside the sandbox's PID namespace the shell is process 1)."""
        return self.transport.shell_pid

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Clone, provision, snapshot the base state and open the session."""
        if self._session is not None:
            return
        try:
            async with asyncio.timeout(self.task.timeouts.setup):
                await self._provision()
        except TimeoutError:
            await self.close()
            raise SandboxError(
                f"{self.name}: provisioning took more than {self.task.timeouts.setup:.0f} s "
                "(task.timeouts.setup)"
            ) from None
        except BaseException:
            await self.close()
            raise

    async def _provision(self) -> None:
        task = self.task
        root = Path(self.config.root).expanduser() if self.config.root else None
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
        # Folders of workers that died (SIGKILL, a crash) go now: nothing else would remove them.
        await asyncio.to_thread(leftovers.sweep, root or Path(tempfile.gettempdir()))
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", task.instance_id)[:60]
        self.root = Path(tempfile.mkdtemp(prefix=f"{leftovers.FOLDER_PREFIX}{safe}-", dir=root))
        self._disk = self._mount_disk(self.root)
        self._owner = leftovers.claim(self.root)
        leftovers.register(id(self), self._cleanup_at_exit)
        # Not the repository's name: old test suites put the checkout's parent folder first on
        # sys.path (requests 0.14: sys.path.insert(0, os.path.abspath('..'))), where a folder
        # named like the package is a namespace package that shadows the real one installed by
        # an editable import hook ("cannot import name 'HTTPError' from 'requests' (unknown
        # location)": every test missing).
        repo = self.root / CHECKOUT_FOLDER
        await repos.checkout(task, repo, timeout=task.timeouts.setup)
        self.workdir = str(repo)

        env = self._base_env()
        tools = [*toolchains.HARNESS_TOOLS, *self.config.tools]
        if task.language == "java":
            tools += toolchains.JAVA_TOOLS
        tools += toolchains.LANGUAGE_TOOLS.get(task.language, ())
        missing = await asyncio.to_thread(toolchains.link_tools, self.root / "tools", tools)
        if task.language == "rust":
            missing += await asyncio.to_thread(toolchains.link_rust, self.root / "tools")
        if task.test is not None and task.test.log_format == "jest":  # Jest: sandbox/node.py
            self._jest = await asyncio.to_thread(node.ensure_jest)
            node.link_jest(self._jest, self.root / "tools")
            env.update(node.jest_env(self._jest))
        if missing:
            logger.debug("%s: host tools not found: %s", self.name, ", ".join(missing))
        env["PATH"] = f"{self.root / 'tools'}{os.pathsep}{SYSTEM_PATH}"
        if task.language == "python":
            env.update(await self._python_env(env["PATH"]))
        elif task.language == "java":
            env.update(self._java_env(env["PATH"]))
        namespaces = await isolation.shell_prefix(self.config.isolation, name=self.name)
        confined = await isolation.can_confine(namespaces, self.config.isolation, name=self.name)
        self.offline = (
            confined
            and self.config.network == "none"
            and await isolation.can_go_offline(namespaces, self.config.isolation, name=self.name)
        )
        self.allowlist = confined and await isolation.can_root(namespaces)
        if confined:
            env.update(self._confined_env())
        env.update(task.env)
        self.transport.env = env
        self._namespaces = namespaces
        self.confined = confined
        self.identity = identity.resolve(self.config.user) if confined else None
        self.transport.prefix = self._prefix(installing=True)
        self.cgroup = await asyncio.to_thread(
            limits.make_cgroup, self.resource_limits, name=self.name
        )
        if self.cgroup is not None:
            self.transport.enter = self.cgroup.enter_command()

        if task.install:  # else the agent's session below is the first one
            await self.open_session()
        for number, command in enumerate(task.install, 1):
            try:
                result = await self.run(
                    command, timeout=task.timeouts.setup, max_output=_INSTALL_OUTPUT
                )
            except SandboxError as exc:
                raise SandboxError(
                    f"{self.name}: install command {number} ({command!r}) broke the shell: {exc}"
                ) from exc
            if result.exit_code != 0:
                raise SandboxError(
                    f"{self.name}: install command {number} ({command!r}) failed with exit "
                    f"code {result.exit_code}:\n{result.output[-4000:]}"
                )
        # From here on the caches are read-only: what the agent writes stays in its sandbox.
        self.transport.prefix = self._prefix(installing=False)
        if self.identity is not None:
            # The rest runs as the sandbox's user, in a folder that is now its own; the base
            # state is recorded by it too (git refuses a repository of another owner).
            await self.end_session()
            await asyncio.to_thread(identity.hand_over, self.root, self.identity)
            for bind in self._overlays:
                assert bind.upper is not None
                await asyncio.to_thread(
                    identity.mirror_folders, Path(bind.source), Path(bind.upper), self.identity
                )
            self._handed = True
        if self.confined:
            self._view = self._make_view()
        await self.record_base_state()
        # Install commands may have cd-ed or exported: the agent starts from a fresh shell.
        await self.end_session()
        await self.open_session()
        logger.info("%s ready in %s", self.name, self.workdir)

    async def read_file(self, path: str) -> bytes:
        """The bytes of ``path`` (relative to the workdir); once confined, only a file the
        sandbox could read itself (a link it made to a hidden or unreadable host file reads
        nothing)."""
        if self._view is None:
            return await super().read_file(path)
        return await asyncio.to_thread(self._view.read, self._path(path), _read_bytes)

    async def read_file_limited(self, path: str, limit: int) -> bytes:
        """At most ``limit`` bytes of the regular file ``path``, under the same rule as
        :meth:`read_file`."""
        if self._view is None:
            return await super().read_file_limited(path, limit)
        full = self._path(path)
        try:
            return await asyncio.to_thread(self._view.read, full, partial(read_local, limit=limit))
        except FileTooLarge as exc:
            raise FileTooLarge(full, limit, exc.size) from None

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to the workdir); the sandbox's user owns it."""
        await super().write_file(path, data)
        await self._give(self._path(path))

    async def write_confined(self, path: str, data: bytes) -> None:
        """Write a file inside the working tree (no link may lead outside it); the sandbox's
        user owns it."""
        await super().write_confined(path, data)
        await self._give(self._path(path))

    def _make_view(self) -> identity.View:
        """What the agent's user sees, for the worker's reads on its behalf."""
        assert self.root is not None
        hidden, kept = self.confinement(installing=False).visible()
        return identity.View(
            self.identity or (os.geteuid(), os.getegid()),
            os.path.realpath(self.root),
            tuple(hidden),
            tuple(kept),
        )

    async def _give(self, path: str) -> None:
        if self.identity is not None and self.root is not None:
            await asyncio.to_thread(identity.give, path, str(self.root), self.identity)

    # --- file confinement ------------------------------------------------------------------

    async def open_session(self) -> None:
        """Open the session; once a confined one answers, scripts join its namespaces."""
        await super().open_session()
        if self.confined and isolation.can_join(self._namespaces):
            self.transport.join = isolation.join_command(self.identity if self._handed else None)
            self.transport.join_front = isolation.keyring_filter_command()
            self.transport.join_network = self.offline

    async def end_session(self) -> None:
        """End the session (scripts make namespaces of their own until the next one)."""
        self.transport.join = []
        await super().end_session()

    def _prefix(self, *, installing: bool) -> list[str]:
        if not self.confined:
            return list(self._namespaces)
        plan = self.confinement(installing=installing)
        namespaces = self._namespaces
        if self.offline and not installing:
            # Installed: from here on the shell and the base-state scripts have no network.
            namespaces = isolation.offline(namespaces)
            plan.loopback = True
        user = isolation.identity_command(self.identity) if self.identity and not installing else []
        return [*namespaces, *isolation.confine_command(plan), *user]

    def _confined_env(self) -> dict[str, str]:
        """What a confined shell's environment changes: a ``HOME`` and ``TMPDIR`` of its own in
        the sandbox's folder, and the package caches named where they really are."""
        assert self.root is not None
        for folder in ("home", "tmp"):
            (self.root / folder).mkdir(exist_ok=True)
        env = {
            "HOME": str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            "UV_CACHE_DIR": str(toolchains.cache_dir("UV_CACHE_DIR", "uv")),
            "PIP_CACHE_DIR": str(toolchains.cache_dir("PIP_CACHE_DIR", "pip")),
            **({"GOCACHE": str(toolchains.cache_dir("GOCACHE", "go-build"))} if self._go else {}),
        }
        if self.task.language == "java":
            # Named outright: the sandbox's user may have no home of its own (nobody's is
            # /nonexistent), and Java's user.home is the passwd entry's.
            m2, gradle = toolchains.java_caches()
            opts = (
                os.environ.get("MAVEN_OPTS", "")
                if "MAVEN_OPTS" in self.config.env_passthrough
                else ""
            )
            env["MAVEN_OPTS"] = f"{opts} -Dmaven.repo.local={m2}".strip()
            env["GRADLE_USER_HOME"] = str(gradle)
        return env

    @property
    def _go(self) -> bool:
        """Whether this sandbox's task is a Go task (it gets the shared Go build cache)."""
        return self.task is not None and self.task.language == "go"

    def confinement(self, *, installing: bool) -> isolation.Plan:
        """What this sandbox's shell sees of the machine's files (docs/security.md).

        Root (where the machine allows, :func:`~crl_worker.sandbox.isolation.can_root`): an
        allowlist root of the system directories, a few files of ``/etc``, what is kept below
        and the config's ``extra_paths``; nothing else of the host. Else the host's, read-only.
        Hidden: the worker's ``HOME``, ``/root`` and the folders of pods' secrets, the folder
        the sandboxes are made in, the worker's working directory (its virtual environment
        stays readable).
        Private: ``/tmp``, ``/var/tmp``, ``/dev/shm``. Kept: the sandbox's own folder
        (writable), the interpreter, uv, ``JAVA_HOME``, the linked tools and the paths named by
        passed-through variables (read-only), and the package caches: uv's and pip's writable
        while the task's ``install`` commands run, read-only for the agent; Maven's repository
        and Gradle's home writable (builds resolve plugins while testing).
        """
        assert self.root is not None
        home = os.environ.get("HOME") or str(Path.home())
        hide = [home, *isolation.SECRET_FOLDERS]
        parent = Path(self.config.root).expanduser() if self.config.root else None
        hide.append(str((parent or Path(tempfile.gettempdir())).resolve()))
        cwd = os.getcwd()
        if cwd != "/" and not cwd.startswith(("/usr/", "/etc/", "/bin", "/sbin", "/lib", "/proc")):
            hide.append(cwd)
        plan = isolation.Plan(
            hide=[h for h in hide if h and h != "/"],
            root=isolation.allowlist() if self.allowlist else None,
        )
        plan.keep(self.root, writable=True)
        for extra in self.config.extra_paths:
            if os.path.exists(extra):
                plan.keep(extra)
        # The worker's own interpreter and packages, read-only: a task may name them (a test
        # command with the worker's python), and they hold code, not secrets.
        plan.keep(sys.prefix)
        if self.interpreter is not None:
            found = (self.interpreter.path, self.interpreter.command)
            for binary in {*map(Path, found), *(Path(p).resolve() for p in found)}:
                plan.keep(binary.parent.parent)
        uv = find_uv(host_path()) if self.config.use_uv else None
        if uv is not None:
            plan.keep(Path(uv).resolve())
        tools = self.root / "tools"
        if tools.is_dir():
            for link in tools.iterdir():
                if link.is_symlink():
                    plan.keep(link.resolve())
        if self.task.language == "rust":
            # The toolchain's libraries (the standard library rustc links), not just its programs.
            sysroot = toolchains.rust_sysroot()
            if sysroot is not None:
                plan.keep(sysroot.resolve())
        if self._jest is not None:
            plan.keep(self._jest.resolve())  # read-only: the shared node_modules
        goroot = toolchains.go_root() if self._go else None
        if goroot is not None:
            plan.keep(goroot)  # GOROOT: the standard library
        if self.task.language == "java":
            java_home = toolchains.java_home()
            if java_home is not None:
                plan.keep(Path(java_home).resolve())
            # At their own paths (MAVEN_OPTS and GRADLE_USER_HOME name them). The rest of ~/.m2
            # (settings.xml, which may hold credentials) stays hidden. Writable while the task
            # installs; the agent's builds write copy-on-write, into the sandbox's folder.
            m2, gradle = toolchains.java_caches()
            m2.mkdir(parents=True, exist_ok=True)
            for number, cache in enumerate((m2, gradle)):
                if not cache.is_dir():
                    continue
                if installing or not toolchains.can_overlay():
                    plan.keep(cache, writable=True)
                else:
                    layers = self.root / "caches" / str(number)
                    plan.overlay(cache, layers / "upper", layers / "work", within=self.root)
                    if plan.binds[-1] not in self._overlays:
                        self._overlays.append(plan.binds[-1])
        caches = [("UV_CACHE_DIR", "uv"), ("PIP_CACHE_DIR", "pip")]
        # Go's build cache: the standard library compiled once per machine, not per sandbox;
        # read-only for the agent (go ignores failed writes), so nothing there can stand in for
        # a later sandbox's packages.
        caches += [("GOCACHE", "go-build")] if self._go else []
        for name, tool in caches:
            cache = Path(self.transport.env.get(name) or toolchains.cache_dir(name, tool))
            cache.mkdir(parents=True, exist_ok=True)
            plan.keep(cache, writable=installing)
        for name in self.config.env_passthrough:
            value = os.environ.get(name, "")
            if name in ("UV_CACHE_DIR", "PIP_CACHE_DIR") or not value.startswith("/"):
                continue
            if name == "GOCACHE" and self._go:
                continue
            if os.path.exists(value):
                plan.keep(value, writable=installing and name in _CACHE_VARIABLES)
        return plan

    def _base_env(self) -> dict[str, str]:
        env = {
            "HOME": os.environ.get("HOME", str(Path.home())),
            "LANG": "C.UTF-8",
            "SHELL": "/bin/bash",
            **_NO_LINKS,
        }
        for name in ("USER", "LOGNAME", "PYENV_ROOT", *self.config.env_passthrough):
            if name in os.environ:
                env[name] = os.environ[name]
        env.update(SESSION_ENV)
        return env

    async def _python_env(self, path: str) -> dict[str, str]:
        assert self.root is not None
        try:
            interpreter = await asyncio.to_thread(find_python, self.task.python)
        except MissingInterpreterError:
            if self.config.missing_python != "fallback":
                raise
            interpreter = await asyncio.to_thread(find_python, self.config.default_python)
            logger.warning(
                "%s: Python %s is not installed; falling back to %s (%s)",
                self.name,
                self.task.python,
                interpreter.version_text,
                interpreter.path,
            )
        self.interpreter = interpreter
        self.venv = self.root / "venv"
        await self._make_venv(interpreter, self.venv)
        return {
            "VIRTUAL_ENV": str(self.venv),
            "PATH": f"{self.venv / 'bin'}{os.pathsep}{path}",
        }

    async def _make_venv(self, interpreter: Interpreter, venv: Path) -> None:
        uv = find_uv(host_path()) if self.config.use_uv else None
        extra = ["--system-site-packages"] if self.config.system_site_packages else []
        attempts: list[list[str]] = []
        if uv is not None:
            # Seeded (pip) from uv's cache without asking the package index, else asked once.
            seeded = ["--quiet", "--seed", "--python", interpreter.command, *extra, str(venv)]
            attempts += [[uv, "venv", "--offline", *seeded], [uv, "venv", *seeded]]
        module = "virtualenv" if interpreter.version < (3, 3, 0) else "venv"
        attempts.append([interpreter.command, "-m", module, *extra, str(venv)])
        errors = []
        for argv in attempts:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **_UV_VENV_ENV, "VIRTUAL_ENV": ""},
            )
            out, _ = await proc.communicate()
            if proc.returncode == 0:
                if uv is not None and not (venv / "bin" / "uv").exists():
                    # Install commands may then say 'uv pip install ...' (fast, shared cache).
                    (venv / "bin" / "uv").symlink_to(uv)
                return
            errors.append(f"{' '.join(argv[:2])}: {out.decode(errors='replace').strip()[-1500:]}")
            shutil.rmtree(venv, ignore_errors=True)
        raise SandboxError(
            f"{self.name}: cannot create a virtual environment with Python "
            f"{interpreter.version_text} ({interpreter.path}): " + "; ".join(errors)
        )

    def _java_env(self, path: str) -> dict[str, str]:
        java_home = toolchains.java_home()
        if java_home is None:
            raise SandboxError(
                f"{self.name}: a Java task needs a JDK, but JAVA_HOME is unset and no java is "
                "on PATH; install a JDK or set JAVA_HOME"
            )
        path = f"{Path(java_home) / 'bin'}{os.pathsep}{path}"
        workdir = Path(self.workdir)
        for marker, tool, wrapper in (
            ("pom.xml", "mvn", "mvnw"),
            ("build.gradle", "gradle", "gradlew"),
            ("build.gradle.kts", "gradle", "gradlew"),
        ):
            if (
                (workdir / marker).exists()
                and not (workdir / wrapper).exists()
                and shutil.which(tool, path=path) is None
            ):
                raise SandboxError(
                    f"{self.name}: the repository builds with {tool} ({marker}) but {tool} is "
                    f"not on PATH and the repository has no {wrapper}; install {tool}"
                )
        return {"JAVA_HOME": java_home, "PATH": path}

    async def _release(self) -> None:
        """Forget the exit hook, remove the sandbox's folder (unless kept) and give up its
        claim (after the session's processes were killed, on close)."""
        leftovers.unregister(id(self))
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            await asyncio.to_thread(cgroup.remove)
        if self.root is not None:
            if not self.config.keep:
                await asyncio.to_thread(self._remove_folder, self.root)
            if self._owner is not None:
                leftovers.release(self.root, self._owner, keep=self.config.keep)
                self._owner = None

    def _cleanup_at_exit(self) -> None:
        """At interpreter exit, for a sandbox still open: kill its processes, remove its folder."""
        self.transport.kill_now()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.root is not None and not self.config.keep:
            self._remove_folder(self.root)

    def _remove_folder(self, folder: Path) -> None:
        """Remove the sandbox's folder, unmounting its tmpfs (``disk_limit``) first."""
        if self._disk is not None:
            limits.unmount_folder(folder)
            self._disk = None
        shutil.rmtree(folder, ignore_errors=True)
