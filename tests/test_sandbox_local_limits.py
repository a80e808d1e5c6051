"""Resource limits of the local sandbox (crl_worker.sandbox.limits), attacked from inside real ones.

Two real sandboxes side by side with small limits (64 MiB, 48 processes): a memory hog and a fork
bomb in the first end its command with a result that says which limit it hit, while the second
sandbox and the worker (this process) run on. The limits are small so each attack takes
seconds and can never reach the machine: the process limit is written before any process enters.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from crl_worker.sandbox import isolation, limits
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.local import LocalSandbox
from tests.fixtures.local_sandbox import make_repo, python_task

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        not isolation.namespace_candidates(), reason="unshare (util-linux) is not installed"
    ),
]

MEMORY = "64m"
PIDS = 48


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("calc")
    return path, make_repo(path)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(
    repo: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[LocalSandbox, LocalSandbox]]:
    """Two limited sandboxes side by side, as a GRPO group's episodes run."""
    where = limits.find()
    if isinstance(where, str):
        pytest.skip(f"no cgroup to limit a sandbox with here: {where}")
    config = LocalSandboxConfig(
        root=str(tmp_path_factory.mktemp("sandboxes")),
        isolation="namespaces",
        mem_limit=MEMORY,
        pids_limit=PIDS,
        cpus=1,
    )
    first = LocalSandbox(config, python_task(*repo, install=[]))
    second = LocalSandbox(config, python_task(*repo, install=[]))
    async with first, second:
        assert first.cgroup is not None and second.cgroup is not None
        yield first, second


async def _unaffected(pair: tuple[LocalSandbox, LocalSandbox]) -> None:
    """The worker and both sandboxes still work after an attack in the first."""
    for sandbox in pair:
        result = await sandbox.run("echo alive && python -c 'print(6 * 7)'")
        assert (result.exit_code, result.output) == (0, "alive\n42\n"), sandbox.name
    assert os.getpid() > 0


async def test_limits_are_the_configs(pair: tuple[LocalSandbox, LocalSandbox]) -> None:
    first, _ = pair
    assert first.cgroup is not None
    folders = first.cgroup.folders
    if first.cgroup.version == 1:
        memory = (folders["memory"] / "memory.limit_in_bytes").read_text()
        cpu = (folders["cpu"] / "cpu.cfs_quota_us").read_text()
        assert (int(memory), int(cpu)) == (64 << 20, limits.CPU_PERIOD)
    else:
        memory = (folders["memory"] / "memory.max").read_text()
        assert int(memory) == 64 << 20
    assert (folders["pids"] / "pids.max").read_text().strip() == str(PIDS)
    # The shell is in it: a process of the sandbox lists its own pid in the cgroup.
    assert first.shell_pid in first.cgroup.pids()


async def test_memory_hog_ends_its_command_not_the_sandbox(
    pair: tuple[LocalSandbox, LocalSandbox],
) -> None:
    first, _ = pair
    hog = "python -c \"chunks = [b'x' * (1 << 20) for _ in range(256)]; print('survived')\""
    result = await first.run(hog, timeout=20)
    assert "survived" not in result.output
    assert result.exit_code == 137
    assert "exceeded its memory limit (64 MiB)" in result.output
    await _unaffected(pair)


async def test_fork_bomb_ends_its_command_not_the_sandbox(
    pair: tuple[LocalSandbox, LocalSandbox],
) -> None:
    first, _ = pair
    # A foreground bomb: it keeps the command busy at the limit until the timeout.
    result = await first.run("bomb() { bomb | bomb; }; bomb", timeout=3)
    assert "exceeded its process limit (48 processes and threads)" in result.output
    assert first.cgroup is not None
    # Nothing of the bomb is left: only the new shell.
    assert len(first.cgroup.pids()) <= 2
    await _unaffected(pair)


async def test_detached_fork_bomb_is_caught_by_the_next_command(
    pair: tuple[LocalSandbox, LocalSandbox],
) -> None:
    first, _ = pair
    await first.run("bomb() { bomb | bomb & }; bomb", timeout=3)
    # Whether or not the first result caught it, the bomb cannot outlive the next command.
    await first.run("sleep 1", timeout=10)
    assert first.cgroup is not None
    assert len(first.cgroup.pids()) <= 2
    await _unaffected(pair)


async def test_sizes_parse_and_bad_ones_are_named() -> None:
    assert limits.parse_size("8g") == 8 << 30
    assert limits.parse_size("512MiB") == 512 << 20
    assert limits.parse_size("1.5G") == 3 << 29
    assert limits.show_size(64 << 20) == "64 MiB"
    with pytest.raises(ValueError, match="not a size: 'lots'"):
        limits.parse_size("lots")
    with pytest.raises(ValueError, match="below 16m"):
        LocalSandboxConfig(mem_limit="1m")
