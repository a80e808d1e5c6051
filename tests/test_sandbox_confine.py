"""File confinement of the local sandbox (crl_worker.sandbox.confine), tried from inside a real one.

Every check runs a command in a real local sandbox (PID and mount namespaces, the confine step,
bash) and looks for what a hostile agent would: the worker's secrets, other sandboxes, the worker's
environment, host sockets, writable places outside its folder, the shared package caches. The
sandbox's own work (its repository, HOME, /tmp, installing with uv) must keep working.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from crl_worker.sandbox import isolation
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.interpreters import find_uv
from crl_worker.sandbox.local import LocalSandbox
from tests.fixtures.local_sandbox import make_repo, python_task

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        not isolation.namespace_candidates(), reason="unshare (util-linux) is not installed"
    ),
]

SECRET = "crl-confine-secret-d41d8cd9"


@pytest.fixture(scope="module")
def worker_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A worker HOME holding what a real one does: an SSH key and a pool token."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text(SECRET)
    (home / ".cache" / "coderepairrl").mkdir(parents=True)
    (home / ".cache" / "coderepairrl" / "pool-token").write_text(SECRET)
    return home


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A uv cache of this module's own: an attack on it must not reach the real one."""
    return tmp_path_factory.mktemp("uv-cache")


@pytest.fixture(scope="module")
def environment(worker_home: Path, caches: Path) -> Iterator[None]:
    """The worker's HOME and uv cache of this module, as a worker started with them has."""
    saved = {name: os.environ.get(name) for name in ("HOME", "UV_CACHE_DIR")}
    os.environ["HOME"] = str(worker_home)
    os.environ["UV_CACHE_DIR"] = str(caches)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("calc")
    return path, make_repo(path)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandboxes")


def _task(repo: tuple[Path, str], **changes: object) -> object:
    # No install commands unless asked: the module's uv cache is cold.
    return python_task(*repo, **{"install": [], **changes})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(
    environment: None, repo: tuple[Path, str], root: Path
) -> AsyncIterator[tuple[LocalSandbox, LocalSandbox]]:
    """Two sandboxes side by side under one root, as a GRPO group's episodes run."""
    config = LocalSandboxConfig(root=str(root), isolation="namespaces")
    first = LocalSandbox(config, _task(repo))  # type: ignore[arg-type]
    second = LocalSandbox(config, _task(repo))  # type: ignore[arg-type]
    async with first, second:
        yield first, second


async def _sh(sandbox: LocalSandbox, command: str) -> tuple[int, str]:
    result = await sandbox.run(command)
    return result.exit_code, result.output


async def test_confined_and_its_own_home(pair: tuple[LocalSandbox, LocalSandbox]) -> None:
    sandbox, _ = pair
    assert sandbox.confined
    assert sandbox.root is not None
    _, home = await _sh(sandbox, 'echo "$HOME $TMPDIR"')
    assert home.split() == [str(sandbox.root / "home"), str(sandbox.root / "tmp")]


async def test_worker_secrets_are_not_there(
    pair: tuple[LocalSandbox, LocalSandbox], worker_home: Path
) -> None:
    sandbox, _ = pair
    for path in (
        worker_home / ".ssh" / "id_ed25519",
        worker_home / ".cache" / "coderepairrl" / "pool-token",
    ):
        assert path.read_text() == SECRET  # the worker still has it
        code, output = await _sh(sandbox, f"cat {path}")
        assert code != 0 and SECRET not in output
    assert sandbox.root is not None
    code, output = await _sh(sandbox, f"grep -rls {SECRET} {worker_home} {sandbox.root.parent}")
    assert output == ""
    # The worker's own environment (its packages, its code) is there, read-only.
    code, _ = await _sh(sandbox, f"ls {sys.prefix}/lib && touch {sys.prefix}/planted")
    assert code != 0 and not Path(sys.prefix, "planted").exists()


async def test_other_sandboxes_are_not_there(pair: tuple[LocalSandbox, LocalSandbox]) -> None:
    first, second = pair
    assert first.root is not None and second.root is not None
    code, _ = await _sh(first, f"ls {second.root}")
    assert code != 0
    code, _ = await _sh(first, f"echo planted > {second.workdir}/calc/__init__.py")
    assert code != 0
    assert "planted" not in (Path(second.workdir) / "calc" / "__init__.py").read_text()
    # /tmp is each sandbox's own.
    assert (await _sh(first, "echo mine > /tmp/crl-note && cat /tmp/crl-note")) == (0, "mine\n")
    code, _ = await _sh(second, "cat /tmp/crl-note")
    assert code != 0


async def test_only_its_own_folder_is_writable(pair: tuple[LocalSandbox, LocalSandbox]) -> None:
    sandbox, _ = pair
    for path in ("/usr/crl-planted", "/etc/crl-planted", f"{Path(sys.executable).parent}/x"):
        code, output = await _sh(sandbox, f"touch {path}")
        assert code != 0, output
        assert not Path(path).exists()
    # Its own work goes on: the repository, HOME, TMPDIR.
    code, output = await _sh(
        sandbox, 'echo x > calc/new.py && touch "$HOME/.bashrc" "$TMPDIR/t" && echo ok'
    )
    assert (code, output) == (0, "ok\n")


async def test_mounts_cannot_be_undone(pair: tuple[LocalSandbox, LocalSandbox]) -> None:
    sandbox, _ = pair
    for command in ("umount /tmp", "umount -l /root", "mount -t tmpfs x /mnt", "unshare -m true"):
        code, output = await _sh(sandbox, command)
        assert code != 0, (command, output)
    _, caps = await _sh(sandbox, "grep CapBnd /proc/self/status")
    bounding = int(caps.split()[1], 16)
    assert not bounding & (1 << 21)  # CAP_SYS_ADMIN
    assert not bounding & (1 << 2)  # CAP_DAC_READ_SEARCH (open_by_handle_at)


async def test_host_unix_sockets_are_covered(pair: tuple[LocalSandbox, LocalSandbox]) -> None:
    run = Path("/run")
    if not os.access(run, os.W_OK):
        pytest.skip("/run is not writable here: no place visible to the sandbox for a socket")
    path = run / f"crl-confine-{os.getpid()}.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        server.listen()
        config = LocalSandboxConfig(root=str(pair[0].config.root), isolation="namespaces")
        # A sandbox made after the socket exists (the cover is decided as it starts).
        async with LocalSandbox(config, pair[0].task) as sandbox:
            probe = (
                "python -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); "
                f's.connect("{path}"); print("connected")\''
            )
            code, output = await _sh(sandbox, probe)
        assert code != 0 and "connected" not in output
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(path))  # the host still reaches it
        client.close()
    finally:
        server.close()
        path.unlink(missing_ok=True)


@pytest.mark.skipif(find_uv() is None, reason="uv is not installed")
async def test_caches_writable_while_installing_read_only_after(
    environment: None, repo: tuple[Path, str], root: Path, caches: Path
) -> None:
    install = [f'touch "$UV_CACHE_DIR/while-installing" && test "$UV_CACHE_DIR" = {caches}']
    task = _task(repo, install=install)
    config = LocalSandboxConfig(root=str(root), isolation="namespaces")
    async with LocalSandbox(config, task) as sandbox:  # type: ignore[arg-type]
        assert (caches / "while-installing").exists()
        code, _ = await _sh(sandbox, 'touch "$UV_CACHE_DIR/by-the-agent"')
        assert code != 0
        assert not (caches / "by-the-agent").exists()
        # The agent's own installs still work, with a cache of its own.
        code, output = await _sh(sandbox, 'UV_CACHE_DIR="$TMPDIR/uv" uv --version')
        assert code == 0, output


@pytest.mark.skipif(find_uv() is None, reason="uv is not installed")
async def test_installed_files_are_copies_not_links_to_the_cache(
    repo: tuple[Path, str], root: Path
) -> None:
    """An in-place edit of an installed module changes this sandbox's copy only (uv would
    otherwise hard-link it to the shared cache, and every later environment with it)."""
    task = _task(repo, install=["uv pip install -q 'pytest>=7.4,<9'"])
    config = LocalSandboxConfig(root=str(root), isolation="none")  # the copy holds unconfined too
    async with LocalSandbox(config, task) as sandbox:  # type: ignore[arg-type]
        assert sandbox.venv is not None
        venv = sandbox.venv

        def linked_files() -> list[Path]:
            files = (p for p in venv.rglob("*") if p.is_file() and not p.is_symlink())
            return [p for p in files if p.stat().st_nlink > 1]

        linked = await asyncio.to_thread(linked_files)
        assert linked == []
        assert sandbox.env["UV_LINK_MODE"] == "copy"


async def test_unconfined_sandbox_keeps_the_workers_home(
    repo: tuple[Path, str], root: Path
) -> None:
    config = LocalSandboxConfig(root=str(root), isolation="none")
    async with LocalSandbox(config, _task(repo)) as sandbox:  # type: ignore[arg-type]
        assert not sandbox.confined
        assert sandbox.env["HOME"] == os.environ["HOME"]


async def test_scripts_see_what_the_shell_sees(
    pair: tuple[LocalSandbox, LocalSandbox], worker_home: Path
) -> None:
    """The base-state scripts (which run what the agent's git configuration names) join the
    shell's confined namespaces, with the same capabilities dropped."""
    sandbox, _ = pair
    assert sandbox.transport.join, "scripts make namespaces of their own"
    secret = worker_home / ".ssh" / "id_ed25519"
    _, out, _ = await sandbox.transport.run_script(
        f"cat {secret}; umount /root && echo unmounted; grep CapBnd /proc/self/status; pwd",
        sandbox.workdir,
        timeout=30,
    )
    text = out.decode()
    assert SECRET not in text and "unmounted" not in text
    assert not int(text.split("CapBnd:")[1].split()[0], 16) & (1 << 21)
    assert text.strip().endswith(sandbox.workdir)
    await sandbox.run("echo changed >> calc/__init__.py")
    assert "+changed" in await sandbox.diff()


async def test_no_network_once_installed(
    environment: None, repo: tuple[Path, str], root: Path
) -> None:
    """The task's install reaches a server on the host's 127.0.0.1; the shell after it does not
    (``network: none``, the default), while its own loopback works; ``network: host`` keeps it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]
    connect = (
        'python -c \'import socket; socket.create_connection(("127.0.0.1", '
        f'{port}), timeout=3); print("reached")\''
    )
    loopback = (
        'python -c \'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); '
        'socket.create_connection(s.getsockname(), timeout=3); print("loopback")\''
    )
    task = _task(repo, install=[connect])  # fails the start unless the install reaches it
    try:
        config = LocalSandboxConfig(root=str(root), isolation="namespaces")
        async with LocalSandbox(config, task) as sandbox:  # type: ignore[arg-type]
            assert sandbox.offline
            code, output = await _sh(sandbox, connect)
            assert code != 0 and "reached" not in output
            code, output = await _sh(sandbox, loopback)
            assert code == 0 and "loopback" in output, output
            # The harness's own scripts (diff, reset) still work offline.
            await sandbox.reset()
        config = LocalSandboxConfig(root=str(root), isolation="namespaces", network="host")
        async with LocalSandbox(config, task) as sandbox:  # type: ignore[arg-type]
            code, output = await _sh(sandbox, connect)
            assert code == 0 and "reached" in output, output
    finally:
        server.close()
