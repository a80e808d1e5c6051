"""Validate tasks before a run serves them: the checks of ``crl tasks check``, with verdicts cached.

Large task sets carry broken instances (a gold patch that does not resolve in its environment,
tests that pass without the fix, flaky tests); trained or benchmarked on, they are noise.
:func:`validate_tasks` runs :func:`~crl_worker.harness.check.check_tasks` on the tasks (the
gold patch must resolve, no patch must not, ``runs`` runs of each find flaky tests), in
parallel, and splits them into the valid ones and the quarantined ones with their reasons.

Each verdict is cached under the task's content hash (:func:`task_digest`: every field of the
task but its metadata, the number of runs and the kind of sandbox), in ``$CRL_CACHE_DIR/validation``,
so a restart or a second run does not pay again; a changed task is a new hash. Verdicts that a
transient failure decided (the sandbox could not start, a harness error) are not cached.

Validation grades only gold patches, which the task set's authors wrote: it takes no candidate
patch, so it is no way to have a policy's answer graded outside the integrity path.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from crl_worker.harness.check import InstanceCheck, SandboxMaker, check_tasks
from crl_worker.sandbox.repos import cache_dir
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: The file a results folder gets, listing the quarantined tasks and why.
QUARANTINE_FILE = "quarantine.json"
#: Version of the cached verdicts' layout (and of what the hash covers).
_VERSION = 1


@dataclass
class TaskVerdict:
    """One task's validation verdict."""

    instance_id: str
    digest: str
    """The task's content hash (:func:`task_digest`)."""
    ok: bool
    problems: list[str] = field(default_factory=list)
    """Why the task is quarantined (empty when ``ok``)."""
    flaky: list[str] = field(default_factory=list)
    """Tests whose status changed between runs of the same patch."""
    cached: bool = False
    """The verdict came from the cache, not from a run now."""

    @property
    def reason(self) -> str:
        """The kind of the first problem, for counting (``gold patch does not resolve``,
        ``resolved without the fix``, ``flaky tests``, ...)."""
        return reason_kind(self.problems[0]) if self.problems else "valid"


@dataclass
class ValidationReport:
    """What validating a task set found."""

    valid: list[Task] = field(default_factory=list)
    """The tasks that passed, in their order."""
    quarantined: list[TaskVerdict] = field(default_factory=list)
    """The tasks that failed, with their reasons."""
    cached: int = 0
    """Verdicts taken from the cache."""

    def reasons(self) -> Counter[str]:
        """How many quarantined tasks each reason kind accounts for."""
        return Counter(v.reason for v in self.quarantined)


def reason_kind(problem: str) -> str:
    """A problem of :func:`~crl_worker.harness.check.judge`, reduced to its kind."""
    kinds = (
        ("flaky tests", "flaky tests"),
        ("resolved without the fix", "resolved without the fix"),
        ("does not apply", "gold patch does not apply"),
        ("through the integrity check: error", "harness error"),
        ("through the integrity check", "gold patch fails the integrity check"),
        ("not resolved", "gold patch does not resolve"),
        ("environment error", "environment error"),
        ("no FAIL_TO_PASS", "no FAIL_TO_PASS tests"),
        ("no gold patch", "no gold patch"),
    )
    for needle, kind in kinds:
        if needle in problem:
            return kind
    return problem.split(":", 1)[0]


def _sandbox_identity(config: BaseModel | Mapping[str, Any] | None) -> dict[str, Any]:
    """What of a sandbox config decides a verdict: its type and image, not its paths."""
    values = config.model_dump() if isinstance(config, BaseModel) else dict(config or {})
    return {k: values[k] for k in ("type", "image", "platform") if values.get(k) is not None}


def task_digest(
    task: Task,
    *,
    runs: int = 1,
    sandbox_config: BaseModel | Mapping[str, Any] | None = None,
    integrity: bool = True,
) -> str:
    """The content hash a verdict is cached under: the task without its metadata, the runs,
    the sandbox's kind (a verdict found in Docker says nothing of a local sandbox) and whether
    the gold patch went through the integrity check."""
    payload = {
        "version": _VERSION,
        "task": task.model_dump(mode="json", exclude={"metadata"}),
        "runs": runs,
        "sandbox": _sandbox_identity(sandbox_config),
        # The grader's own code decides the integrity check's verdict: a changed canary or
        # reporter checks again.
        "integrity": integrity and _grader_digest(),
    }
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()


@functools.cache
def _grader_digest() -> str:
    """A hash of the grader's code: every module of this package (the canaries, the reporter,
    the parsers, the grading rules), by path and content."""
    digest = hashlib.sha256()
    folder = Path(__file__).parent
    for path in sorted(p for p in folder.rglob("*") if p.suffix in (".py", ".pyt")):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _transient(check: InstanceCheck) -> bool:
    """The verdict came from a failure that may not happen again (not to be cached)."""
    return any(
        p.startswith(("sandbox:", "error:"))
        or ": harness error:" in p
        or "through the integrity check: error:" in p
        for p in check.problems
    )


def _read_cached(folder: Path, digest: str) -> TaskVerdict | None:
    path = folder / f"{digest}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        verdict = TaskVerdict(
            instance_id=str(data["instance_id"]),
            digest=str(data["digest"]),
            ok=data["ok"] is True,
            problems=[str(p) for p in data["problems"]],
            flaky=[str(f) for f in data["flaky"]],
            cached=True,
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring the unreadable cached verdict %s: %s", path, exc)
        return None
    if verdict.digest != digest or verdict.ok == bool(verdict.problems):
        logger.warning("ignoring the cached verdict %s: it does not match its name", path)
        return None
    return verdict


def _write_cached(folder: Path, verdict: TaskVerdict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {k: v for k, v in asdict(verdict).items() if k != "cached"}
    data["checked_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    temporary = folder / f".{verdict.digest}.json.tmp"
    temporary.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    temporary.replace(folder / f"{verdict.digest}.json")  # never a half-written verdict


async def validate_tasks(
    tasks: Sequence[Task],
    *,
    runs: int = 1,
    jobs: int = 1,
    sandbox_config: BaseModel | Mapping[str, Any] | None = None,
    timeout: float | None = None,
    cache: Path | None = None,
    use_cache: bool = True,
    progress: Callable[[TaskVerdict], None] | None = None,
    sandboxes: SandboxMaker | None = None,
    integrity: bool = True,
) -> ValidationReport:
    """Check ``tasks`` (gold resolves, no patch does not, ``runs`` runs each; with
    ``integrity``, the gold patch also resolves through the integrity check an episode's
    resolved verdict goes through, so that no correct answer to a valid task is graded 0 by a
    false alarm), ``jobs`` at a time in sandboxes made from ``sandbox_config``; a verdict cached under a task's
    :func:`task_digest` in ``cache`` (default ``$CRL_CACHE_DIR/validation``) is used instead of
    a run unless ``use_cache`` is false. A pool passes ``sandboxes`` to validate on its own
    sandboxes (``sandbox_config`` then only names their kind in the hash). Returns the valid
    tasks and the quarantined ones."""
    folder = cache if cache is not None else cache_dir() / "validation"
    digests = {
        t.instance_id: task_digest(t, runs=runs, sandbox_config=sandbox_config, integrity=integrity)
        for t in tasks
    }
    verdicts: dict[str, TaskVerdict] = {}
    if use_cache:
        for task in tasks:
            found = _read_cached(folder, digests[task.instance_id])
            if found is not None and found.instance_id == task.instance_id:
                verdicts[task.instance_id] = found
                if progress is not None:
                    progress(found)
    todo = [t for t in tasks if t.instance_id not in verdicts]

    def checked(found: InstanceCheck) -> None:
        verdict = TaskVerdict(
            instance_id=found.instance_id,
            digest=digests[found.instance_id],
            ok=found.ok,
            problems=list(found.problems),
            flaky=list(found.flaky),
        )
        verdicts[found.instance_id] = verdict
        if not _transient(found):
            try:
                _write_cached(folder, verdict)
            except OSError as exc:
                logger.warning("cannot cache the verdict of %s: %s", found.instance_id, exc)
        if progress is not None:
            progress(verdict)

    if todo:
        logger.info(
            "validating %d tasks (%d verdicts cached), %d at a time",
            len(todo),
            len(verdicts),
            jobs,
        )
        # No candidate: only the gold patches, which the task set's authors wrote, are graded.
        await check_tasks(
            todo, runs=runs, jobs=jobs, sandbox_config=sandbox_config, timeout=timeout,
            progress=checked, sandboxes=sandboxes, integrity=integrity,
        )  # fmt: skip
    report = ValidationReport(cached=sum(v.cached for v in verdicts.values()))
    for task in tasks:
        verdict = verdicts[task.instance_id]
        if verdict.ok:
            report.valid.append(task)
        else:
            report.quarantined.append(verdict)
    if report.quarantined:
        logger.warning(
            "%d of %d tasks quarantined: %s",
            len(report.quarantined),
            len(tasks),
            ", ".join(f"{kind} ({n})" for kind, n in report.reasons().most_common()),
        )
    return report


def write_quarantine(folder: Path, report: ValidationReport) -> Path:
    """Write ``quarantine.json`` in a results folder: the counts, the reasons, and each
    quarantined task with its problems; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "validated": len(report.valid) + len(report.quarantined),
        "valid": len(report.valid),
        "quarantined": len(report.quarantined),
        "cached": report.cached,
        "reasons": dict(report.reasons().most_common()),
        "tasks": [
            {
                "instance_id": v.instance_id,
                "reason": v.reason,
                "problems": v.problems,
                "flaky": v.flaky,
                "digest": v.digest,
            }
            for v in report.quarantined
        ],
    }
    path = folder / QUARANTINE_FILE
    temporary = folder / f".{QUARANTINE_FILE}.tmp"
    temporary.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    temporary.replace(path)
    return path


__all__ = [
    "QUARANTINE_FILE",
    "TaskVerdict",
    "ValidationReport",
    "reason_kind",
    "task_digest",
    "validate_tasks",
    "write_quarantine",
]
