"""Namespaces around a local sandbox's shell: its processes see only each other, and all die with it.

The local backend starts its shell through ``unshare`` (util-linux)::

    setpriv --pdeathsig KILL -- unshare --pid --fork --kill-child --mount-proc [--user ...] -- bash ...

- ``--pid --fork``: the shell is process 1 of a new PID namespace. When it dies the kernel
  SIGKILLs every other process of the namespace, whatever it did to get away (``setsid``, a double
  fork, ``nohup``, a daemon): closing the sandbox leaves nothing running.
- ``--mount-proc``: a private ``/proc`` showing only the namespace's processes, so nothing in the
  sandbox can read another process's ``environ``, ``cmdline`` or memory — the worker's API keys
  among them (``/proc/$PPID`` does not exist: the shell's parent is outside the namespace).
- ``--kill-child`` and ``setpriv --pdeathsig KILL``: when the worker dies, even by SIGKILL,
  ``unshare`` gets SIGKILL and passes it to the shell, and with it to the namespace.
- ``--user --map-current-user`` (only when the worker is not root): unprivileged users may make
  the other namespaces inside a user namespace; the user keeps its own id inside.

The same file system, network and user remain: this isolates processes, not files (see
docs/security.md). ``bash`` as process 1 behaves as elsewhere: it reaps the orphans re-parented to
it, and signals sent from outside reach it only for the handlers it installs (SIGINT, which is
what timeouts send; SIGKILL always).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from typing import Literal

from crl_worker.errors import SandboxError

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
    base = [*front, unshare, "--pid", "--fork", "--kill-child", "--mount-proc"]
    if os.geteuid() == 0:
        return [[*base, "--"]]
    return [
        [*base, "--user", mapping, "--"] for mapping in ("--map-current-user", "--map-root-user")
    ]


async def _probe(prefix: tuple[str, ...]) -> str | None:
    """Why ``prefix`` cannot run a program in its namespaces, or None when it can."""
    # In the namespace, the probe is process 1 and sees only itself in /proc.
    check = "[ $$ = 1 ] && [ ! -e /proc/2 ] || { echo 'not in a fresh pid namespace'; exit 3; }"
    try:
        proc = await asyncio.create_subprocess_exec(
            *prefix,
            "/bin/sh",
            "-c",
            check,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", "LANG": "C"},
        )
    except OSError as exc:
        return f"{prefix[0]}: {exc}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), _PROBE_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"unshare did not finish within {_PROBE_TIMEOUT:.0f} s"
    if proc.returncode != 0:
        return out.decode("utf-8", "replace").strip()[-500:] or f"exit {proc.returncode}"
    return None


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
