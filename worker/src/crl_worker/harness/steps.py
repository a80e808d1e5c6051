"""The harness's own steps in the agent's shell session, and the JUnit reports they find."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from crl_worker.errors import InfrastructureError
from crl_worker.sandbox.base import Sandbox

#: Time limit of the harness's own small steps (apply, reset, list reports), in seconds.
STEP_TIMEOUT = 300.0


def in_workdir(sandbox: Sandbox, command: str) -> str:
    """``command`` as the harness runs it in the agent's session.

    The session is the agent's: it may have changed directory, and it may have defined aliases
    or shell functions named like the tools the harness calls (``git``, ``pytest``, even an
    absolute path: bash accepts ``/usr/bin/python() { ...; }``). Each step runs in a subshell
    that drops every alias and function first, starts in the workdir, and ``eval``s the command
    so that it is parsed after the aliases are gone. Exported variables stay (the task's
    environment lives there); see docs/evaluation.md.
    """
    return (
        "( unalias -a 2>/dev/null; "
        'while read -r _ _ __crl_fn; do unset -f "$__crl_fn"; done < <(declare -F); '
        f"cd {shlex.quote(sandbox.workdir)} && eval {shlex.quote(command)} )"
    )


async def step(sandbox: Sandbox, command: str, *, timeout: float = STEP_TIMEOUT) -> tuple[int, str]:
    """Run one harness step; a timeout is the harness's failure, not the model's."""
    result = await sandbox.run(in_workdir(sandbox, command), timeout=timeout)
    if result.timed_out:
        raise InfrastructureError(f"harness step timed out after {timeout:.0f}s: {command[:200]}")
    return (result.exit_code if result.exit_code is not None else -1), result.output


def _glob_word(pattern: str) -> str:
    # Keep the glob characters live for the shell, escape everything else.
    return "".join(c if c.isalnum() or c in "*?[]/._-" else "\\" + c for c in pattern)


async def list_junit_reports(sandbox: Sandbox, patterns: Sequence[str]) -> list[str]:
    """Paths (relative to the workdir) of the files matching ``patterns``; ``**`` allowed."""
    if not patterns:
        return []
    words = " ".join(_glob_word(p) for p in patterns)
    code, out = await step(
        sandbox,
        f"( shopt -s globstar nullglob; for f in {words}; do "
        '[ -f "$f" ] && printf \'%s\\n\' "$f"; done; true )',
    )
    if code != 0:
        raise InfrastructureError(f"could not list the JUnit reports: {out[-2000:]}")
    return list(dict.fromkeys(line for line in out.splitlines() if line.strip()))


async def clear_junit_reports(sandbox: Sandbox, patterns: Sequence[str]) -> int:
    """Delete the reports matching ``patterns`` before a run; return how many there were.

    Reports left by the agent's own test runs (or written by it) would otherwise be read as
    this run's results when the build fails before the tests run.
    """
    stale = await list_junit_reports(sandbox, patterns)
    if stale:
        code, out = await step(sandbox, "rm -f -- " + " ".join(shlex.quote(p) for p in stale))
        if code != 0:
            raise InfrastructureError(f"could not remove stale JUnit reports: {out[-2000:]}")
    return len(stale)


async def read_junit_reports(sandbox: Sandbox, patterns: Sequence[str]) -> list[str]:
    """The JUnit XML reports matching ``patterns`` (relative to the workdir), as text."""
    reports = []
    for path in await list_junit_reports(sandbox, patterns):
        data = await sandbox.read_file(path)
        reports.append(data.decode("utf-8", errors="replace"))
    return reports
