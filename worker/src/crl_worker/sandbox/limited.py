"""The resource limits of a local sandbox at work: its cgroup and disk, and what a command that
hits one gets (see :mod:`crl_worker.sandbox.limits` for the cgroups themselves)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from crl_worker.errors import SandboxError
from crl_worker.sandbox import limits
from crl_worker.sandbox.base import DEFAULT_MAX_OUTPUT, CommandResult
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.shell import ShellSandbox

logger = logging.getLogger(__name__)
_disk_warned = False


class LimitedSandbox(ShellSandbox):
    """A :class:`~crl_worker.sandbox.shell.ShellSandbox` whose commands run under the
    config's resource limits (the local backend's base)."""

    config: LocalSandboxConfig
    root: Path | None
    cgroup: limits.Cgroup | None = None
    """The sandbox's cgroup holding its resource limits (None: it runs without)."""
    _disk: int | None = None

    @property
    def resource_limits(self) -> limits.Limits:
        """The resource limits of the config (docs/sandboxes.md)."""
        config = self.config
        memory = limits.parse_size(config.mem_limit) if config.mem_limit else None
        return limits.Limits(memory=memory, pids=config.pids_limit, cpus=config.cpus)

    def _mount_disk(self, folder: Path) -> int | None:
        """The sandbox's folder as a tmpfs of ``disk_limit`` (its size), or None without one."""
        if self.config.disk_limit is None:
            return None
        size = limits.parse_size(self.config.disk_limit)
        reason = limits.mount_folder(folder, size)
        if reason is None:
            return size
        global _disk_warned
        if not _disk_warned:
            _disk_warned = True
            logger.warning(
                "%s: local sandboxes run without a disk limit (%s); see docs/sandboxes.md",
                self.name,
                reason,
            )
        return None

    async def run(
        self, command: str, *, timeout: float | None = None, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> CommandResult:
        """Run ``command`` in the session; when it ran into a resource limit its result says
        so (the candidate's doing, not a failure of the sandbox): past the memory limit the
        kernel killed a process, the shell's if need be (a fresh shell then answers the next
        command); past the process limit every process of the sandbox is killed and the shell
        restarted."""
        cgroup = self.cgroup
        if cgroup is None:
            return self._disk_note(
                await super().run(command, timeout=timeout, max_output=max_output)
            )
        before = cgroup.usage()
        began = asyncio.get_running_loop().time()
        try:
            result = await super().run(command, timeout=timeout, max_output=max_output)
        except SandboxError:
            found = limits.exceeded(cgroup, before)
            if found is None:
                raise
            logger.info("%s: %s", self.name, found[0])
            await self._restart(cgroup)
            duration = asyncio.get_running_loop().time() - began
            return CommandResult(exit_code=137, output=found[0], duration=duration)
        found = limits.exceeded(cgroup, before)
        if found is None:
            return self._disk_note(result)
        note, restart = found
        logger.info("%s: %s", self.name, note)
        if restart:
            await self._restart(cgroup)
        output = f"{result.output.rstrip()}\n{note}\n" if result.output else f"{note}\n"
        return result.model_copy(update={"output": output})

    def _disk_note(self, result: CommandResult) -> CommandResult:
        """``result``, with a note at the end when the sandbox's folder is full."""
        if self._disk is None or self.root is None:
            return result
        note = limits.disk_full(self.root, self._disk)
        if note is None:
            return result
        output = f"{result.output.rstrip()}\n{note}\n" if result.output else f"{note}\n"
        return result.model_copy(update={"output": output})

    async def _restart(self, cgroup: limits.Cgroup) -> None:
        """A fresh shell after a limit was hit, with nothing of the old one left running."""
        await self.end_session()
        await asyncio.to_thread(cgroup.kill_all)
        await self.open_session()
