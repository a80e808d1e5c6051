"""Getting a task's repository at its base commit into a local folder, fast the second time.

Where from: ``task.source`` (a git URL, a local repository, or a git bundle file) when set;
otherwise the mirror named by ``$CRL_GIT_MIRROR`` (a directory or URL prefix holding
``owner__name.git``); otherwise ``https://github.com/{owner}/{name}.git``. Remote sources and
bundles are cloned once into a bare mirror under
``${CRL_CACHE_DIR:-~/.cache/coderepairrl}/repos/owner__name.git`` (fetched again only when the
base commit is missing); every sandbox then clones that cache (or a local repository) with
``--shared``, which links the object store instead of copying it.

The sandbox's clone keeps only what the task allows the agent to see: ``HEAD`` detached at the
base commit, no remote, no branches or tags, no reflog, and no object beyond the base commit's
history. ``--shared`` alone would leave the source's whole object store readable through
``.git/objects/info/alternates`` (``git cat-file --batch-all-objects`` and ``git fsck`` list the
fix's commit, a descendant of the base), and the clone's reflog names the source's newest
commit. So the clone is dissociated, as ``git clone --dissociate`` does: the reflog expired,
the objects reachable from ``HEAD`` copied into a pack of its own (``git repack -a -d``), the
alternates file removed. That costs a pack of the base's history per sandbox (milliseconds for
small repositories; seconds for large ones), paid when the sandbox is made, not per rollout.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from crl_worker.api.contract import Env
from crl_worker.errors import SandboxError
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """The project's cache root (``$CRL_CACHE_DIR``, else ``~/.cache/coderepairrl``)."""
    return Path(os.environ.get(Env.CACHE_DIR) or Path.home() / ".cache" / "coderepairrl")


def repo_key(task: Task) -> str:
    """The file-system name of the task's repository: ``owner__name``."""
    return f"{task.owner}__{task.name}".replace("/", "__")


#: First line of a git bundle file (format 2 or 3), as ``git bundle create`` writes it.
_BUNDLE_SIGNATURES = (b"# v2 git bundle\n", b"# v3 git bundle\n")


def is_bundle(path: str | Path) -> bool:
    """Whether ``path`` is a git bundle file (by its first line, whatever its name)."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(_BUNDLE_SIGNATURES[0]))
    except OSError:
        return False
    return head in _BUNDLE_SIGNATURES


def resolve_source(task: Task) -> str:
    """Where the repository comes from: a local directory, a git bundle file or a URL (see the
    module docs). A relative path is taken from the current directory; task files resolve
    their relative sources against their own folder when they are loaded."""
    if task.source:
        source = task.source
        if "://" not in source and not source.startswith("git@"):
            path = Path(source).expanduser()
            if path.is_dir():
                return str(path.resolve())
            if path.is_file():
                if not is_bundle(path):
                    raise SandboxError(
                        f"task {task.instance_id}: source {source!r} is a file but not a git "
                        "bundle; give a repository folder, a URL, or a bundle made with "
                        "'git bundle create FILE --all'"
                    )
                return str(path.resolve())
            raise SandboxError(
                f"task {task.instance_id}: source {source!r} is neither a URL nor an existing "
                "directory or git bundle"
            )
        return source
    mirror = os.environ.get(Env.GIT_MIRROR)
    if mirror:
        if "://" in mirror or mirror.startswith("git@"):
            return f"{mirror.rstrip('/')}/{repo_key(task)}.git"
        path = Path(mirror).expanduser() / f"{repo_key(task)}.git"
        if not path.exists():
            raise SandboxError(
                f"task {task.instance_id}: {Env.GIT_MIRROR}={mirror} holds no {path.name}; "
                f"add it (git clone --mirror https://github.com/{task.repo}.git {path}) or "
                f"unset {Env.GIT_MIRROR}"
            )
        return str(path.resolve())
    return f"https://github.com/{task.repo}.git"


async def run_captured(
    argv: list[str],
    *,
    what: str,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> tuple[int, bytes, bytes]:
    """Run a program without input; its exit status, standard output and standard error. A
    timeout kills it and raises :class:`SandboxError` naming ``what``."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=None if env is None else dict(env),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SandboxError(f"{what} took more than {timeout:.0f} s") from None
    return proc.returncode or 0, out, err


async def run_checked(
    argv: list[str],
    *,
    what: str,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> bytes:
    """Run a program without input and return its standard output; a timeout (the process is
    killed) or a non-zero exit raises :class:`SandboxError` naming ``what``, with its stderr."""
    code, out, err = await run_captured(argv, what=what, cwd=cwd, env=env, timeout=timeout)
    if code != 0:
        raise SandboxError(
            f"{what} failed (exit {code}): {err.decode('utf-8', 'replace').strip()[-2000:]}"
        )
    return out


async def git(
    *args: str,
    cwd: str | Path | None = None,
    timeout: float = 600,
    what: str = "git",
) -> bytes:
    """Run git and return its standard output; raise :class:`SandboxError` with its stderr."""
    return await run_checked(
        ["git", *args],
        what=f"{what}: git {' '.join(args[:3])}",
        cwd=cwd,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        timeout=timeout,
    )


async def _has_commit(repo: str | Path, commit: str) -> bool:
    try:
        await git("cat-file", "-e", f"{commit}^{{commit}}", cwd=repo, what="cache")
    except SandboxError:
        return False
    return True


async def ensure_cached(task: Task, source: str, *, timeout: float) -> str:
    """A local repository holding ``task.base_commit``: the source itself when it is a local
    repository, else the bare cache mirror of the URL or bundle (cloned or fetched under a file
    lock, safe across processes)."""
    if os.path.isdir(source):
        return source
    root = cache_dir() / "repos"
    root.mkdir(parents=True, exist_ok=True)
    mirror = root / f"{repo_key(task)}.git"
    with open(root / f"{repo_key(task)}.lock", "w") as lock:
        await asyncio.to_thread(fcntl.flock, lock.fileno(), fcntl.LOCK_EX)
        try:
            if not mirror.exists():
                logger.info("caching %s from %s", task.repo, source)
                partial = root / f"{repo_key(task)}.git.partial"
                shutil.rmtree(partial, ignore_errors=True)
                await git(
                    "clone",
                    "--mirror",
                    "--quiet",
                    source,
                    str(partial),
                    timeout=timeout,
                    what=f"task {task.instance_id}: cloning {source}",
                )
                partial.rename(mirror)
            elif not await _has_commit(mirror, task.base_commit):
                logger.info("fetching %s into the cache for %s", source, task.base_commit)
                await git(
                    "fetch",
                    "--quiet",
                    source,
                    "+refs/*:refs/*",
                    cwd=mirror,
                    timeout=timeout,
                    what=f"task {task.instance_id}: fetching",
                )
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    return str(mirror)


async def checkout(task: Task, dest: Path, *, timeout: float) -> None:
    """Clone the task's repository into ``dest`` (which must not exist) at its base commit."""
    source = resolve_source(task)
    local = await ensure_cached(task, source, timeout=timeout)
    what = f"task {task.instance_id}"
    await git(
        "clone",
        "--quiet",
        "--shared",
        "--no-checkout",
        local,
        str(dest),
        timeout=timeout,
        what=f"{what}: cloning {local}",
    )
    if not await _has_commit(dest, task.base_commit):
        if is_bundle(source):
            raise SandboxError(
                f"{what}: base commit {task.base_commit} is not in the git bundle {source}; "
                "the bundle is older or newer than the task file: rebuild them together, or "
                "fix the task's base_commit"
            )
        raise SandboxError(
            f"{what}: base commit {task.base_commit} is not in {source}; check the task's "
            "base_commit and source"
        )
    await git(
        "-c",
        "advice.detachedHead=false",
        "checkout",
        "--quiet",
        "--detach",
        task.base_commit,
        cwd=dest,
        timeout=timeout,
        what=f"{what}: checking out the base commit",
    )
    # Nothing beyond the base commit stays reachable: no remote, no branches, no tags.
    await git("remote", "remove", "origin", cwd=dest, what=what)
    refs = await git("for-each-ref", "--format=delete %(refname)", cwd=dest, what=what)
    if refs.strip():
        proc = await asyncio.create_subprocess_exec(
            "git",
            "update-ref",
            "--no-deref",
            "--stdin",
            cwd=dest,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate(refs)
        if proc.returncode != 0:
            raise SandboxError(f"{what}: removing refs failed: {err.decode(errors='replace')}")
    await dissociate(dest, what=what, timeout=timeout)


async def dissociate(repo: Path, *, what: str, timeout: float) -> None:
    """Keep in ``repo`` only the objects reachable from ``HEAD`` and stop borrowing from the
    repository it was cloned from with ``--shared`` (see the module docs): expire every reflog,
    pack what ``HEAD`` reaches (borrowed objects included) and remove the alternates file."""
    head = (await git("rev-parse", "HEAD", cwd=repo, what=what)).decode().strip()
    await git("reflog", "expire", "--expire=all", "--all", cwd=repo, what=what)
    # One entry back, naming only the base, so that git still says "HEAD detached at <base>".
    logs = repo / ".git" / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "HEAD").write_text(
        f"{'0' * len(head)} {head} coderepairrl <sandbox@coderepair.io> {int(time.time())} +0000\t"
        f"checkout: moving from {head} to {head}\n"
    )
    alternates = repo / ".git" / "objects" / "info" / "alternates"
    if not alternates.exists():
        return
    await git(
        "-c",
        "pack.writeBitmaps=false",
        "repack",
        "-a",
        "-d",
        "-q",
        cwd=repo,
        timeout=timeout,
        what=f"{what}: copying the base commit's history out of the shared object store",
    )
    alternates.unlink()
