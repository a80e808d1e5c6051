"""The results folder of one benchmark run, written so that a crash loses at most the attempts
that were running.

A folder holds:

- ``run.json``: what the results are of: the suite, the model, the agent settings, the task
  source, and a fingerprint of those. Resuming into a folder of another fingerprint is refused
  (:class:`ResultsMismatchError`); ``restart`` moves the old folder aside, never deleting it.
- ``results.jsonl``: one :class:`AttemptResult` per finished attempt. Each line is written whole,
  flushed and fsynced before the next attempt's line; this file says which attempts are done.
- ``trajectories.jsonl``: the full trajectory of each attempt, written (and fsynced) *before* its
  result line, so every result line has its trajectory.
- ``summary.json``: written by :mod:`crl_worker.bench.summary` after each run.
- ``.lock``: held by the run writing to the folder, so that a second run into it (the same
  command in another terminal, a replacement pod while the old one still ends) is refused
  instead of truncating the other's line in progress and running the same attempts twice.
- ``cancelled.jsonl``: the trajectory so far of each attempt stopped by a cancellation (Ctrl-C,
  SIGTERM). Only kept: neither resume nor the summary reads it, and the attempt runs again.

A line cut short by a crash (no newline at the end, or not JSON) can only be the last one: it is
logged, ignored, and cut off before anything is appended. When an attempt has several lines (an
infrastructure failure retried on resume), the last one wins.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from crl_worker.errors import CrlError

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
TRAJECTORIES_FILE = "trajectories.jsonl"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"
CANCELLED_FILE = "cancelled.jsonl"
#: Held (``flock``) by the one run writing to a folder.
LOCK_FILE = ".lock"


class ResultsError(CrlError):
    """The results folder cannot be used (unreadable, corrupt in the middle, not a folder)."""


class ResultsMismatchError(ResultsError):
    """The results folder holds a run of another model, agent or suite."""


class AttemptResult(BaseModel):
    """One line of ``results.jsonl``: the outcome of one attempt at one instance."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str
    """The instance."""
    repo: str
    """Its repository, ``owner/name``."""
    attempt: int
    """Attempt index, from 0."""
    resolved: bool | None
    """The verdict; ``None`` for an infrastructure failure (no verdict)."""
    exit_reason: str
    """Why the agent stopped (``submitted``, ``max_turns``, ..., ``infrastructure_error``)."""
    infrastructure_error: str | None = None
    """What failed when the attempt has no verdict (sandbox, model server, harness)."""
    reward: float | None = None
    """The test reward (binary); ``None`` with an infrastructure failure."""
    prompt_tokens: int = 0
    """Prompt tokens over all turns."""
    completion_tokens: int = 0
    """Completion tokens over all turns."""
    turns: int = 0
    """Model calls."""
    agent_seconds: float = 0.0
    """Wall time of the agent loop."""
    eval_seconds: float = 0.0
    """Wall time of the evaluation."""
    wall_seconds: float = 0.0
    """Wall time of the whole attempt, sandbox start and close included."""
    model: str = ""
    """Model name the attempt used (``gold`` for the gold agent)."""
    started_at: datetime | None = None
    """When the attempt started (UTC)."""
    error: str | None = None
    """The trajectory's error text for any ending other than ``submitted``."""
    task_type: str = "repair"
    """The task's type (``repair``, ``implement``, ``classify``)."""
    language: str | None = None
    """The task's language (``python``, ``go``, ...); ``None`` in results written before it was
    recorded."""
    label: str | None = None
    """Classify tasks: the CWE label."""
    answer: str | None = None
    """Classify tasks: the CWE id the agent answered (``None``: no ``classify`` call)."""
    credit: float | None = None
    """Classify tasks: the answer's credit along the CWE hierarchy."""
    first_try_resolved: bool | None = None
    """With ``agent.tries: 2``: the first try's verdict (``resolved`` is the final one, after
    the second try); ``None`` without the option or without a verdict."""

    @property
    def key(self) -> tuple[str, int]:
        """``(instance_id, attempt)``."""
        return (self.instance_id, self.attempt)

    @property
    def infrastructure_failure(self) -> bool:
        """The attempt has no verdict."""
        return self.resolved is None

    @property
    def environment_error(self) -> bool:
        """The attempt has no verdict because its test run graded nothing (the task's
        environment: runner missing, nothing collected, nothing selected), not because a
        machine failed; counted among the errored attempts, and apart in the summary."""
        return self.resolved is None and (self.infrastructure_error or "").startswith(
            ENVIRONMENT_ERROR_PREFIX
        )


#: How an attempt's ``infrastructure_error`` starts when its test run graded nothing (the
#: evaluation's environment error, prefixed by the episode).
ENVIRONMENT_ERROR_PREFIX = "evaluation: environment error: "


def fingerprint(identity: Mapping[str, Any]) -> str:
    """A short stable hash of a JSON-ready mapping (keys sorted)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: What to do about a corrupt results file, for a command that writes results (``crl bench``).
RESTART_HINT = "move it aside (or run with --restart) to start over"
#: The same for a command that only reads them (``crl compare``): it has no --restart.
READ_ONLY_HINT = "repair or remove that line, or rerun the benchmark into a new folder"


def _read_lines(path: Path, hint: str = RESTART_HINT) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSONL file and the byte length of its whole, parsed lines.

    A last line without its newline, or one that is not JSON, is a write cut short: it is
    logged and left out. A bad line anywhere else means the file is corrupt (``hint`` says what
    to do about it).
    """
    if not path.exists():
        return [], 0
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ResultsError(f"cannot read {path}: {exc}") from exc
    objects: list[dict[str, Any]] = []
    good = 0
    position = 0
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        last = number == len(lines)
        if last and not raw:
            break  # the file ends with a newline
        try:
            if last:
                raise ValueError("no newline at the end")
            value = json.loads(raw)
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            complete_after = all(not rest.strip() for rest in lines[number:])
            if last or complete_after:
                logger.warning(
                    "%s: ignoring its last line, cut short by an interrupted write (%s)",
                    path,
                    exc,
                )
                break
            raise ResultsError(
                f"{path}, line {number}: not a JSON object ({exc}); the file is corrupt — {hint}"
            ) from exc
        objects.append(value)
        position += len(raw) + 1
        good = position
    return objects, good


def _whole_lines_length(path: Path, chunk: int = 1 << 16) -> int:
    """Bytes of ``path`` up to and including its last newline (0 when it has none)."""
    if not path.exists():
        return 0
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        position = end
        while position > 0:
            start = max(0, position - chunk)
            f.seek(start)
            block = f.read(position - start)
            found = block.rfind(b"\n")
            if found >= 0:
                length = start + found + 1
                if length < end:
                    logger.warning(
                        "%s: ignoring its last line, cut short by an interrupted write", path
                    )
                return length
            position = start
    if end:
        logger.warning("%s: ignoring its only line, cut short by an interrupted write", path)
    return 0


def _truncate(path: Path, length: int) -> None:
    """Cut ``path`` to ``length`` bytes (a torn last line goes before anything is appended)."""
    if path.exists() and path.stat().st_size > length:
        with path.open("r+b") as f:
            f.truncate(length)
            f.flush()
            os.fsync(f.fileno())


class ResultsStore:
    """A results folder: which attempts are done, and appending new ones durably."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._records: dict[tuple[str, int], AttemptResult] = {}
        self._opened = False
        self._lock_fd: int | None = None

    @property
    def results_file(self) -> Path:
        """``results.jsonl``."""
        return self.path / RESULTS_FILE

    @property
    def trajectories_file(self) -> Path:
        """``trajectories.jsonl``."""
        return self.path / TRAJECTORIES_FILE

    @property
    def summary_file(self) -> Path:
        """``summary.json``."""
        return self.path / SUMMARY_FILE

    @property
    def cancelled_file(self) -> Path:
        """``cancelled.jsonl``."""
        return self.path / CANCELLED_FILE

    @property
    def run_file(self) -> Path:
        """``run.json``."""
        return self.path / RUN_FILE

    def open(self, identity: Mapping[str, Any], *, restart: bool = False) -> None:
        """Create the folder or resume it, checking that it holds a run of ``identity``.

        ``identity`` says what the results are of (suite, model, agent, tasks); its fingerprint
        must match the folder's. ``restart`` moves an existing folder aside to
        ``<name>.old-<UTC time>`` and starts an empty one. The folder stays locked against
        other runs until :meth:`close` (or the process ends); a folder another run holds is
        refused with :class:`ResultsError`.
        """
        if self.path.exists() and not self.path.is_dir():
            raise ResultsError(f"{self.path} exists and is not a folder")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsError(
                f"cannot create the results folder {self.path}: {exc.strerror or exc}; choose"
                " a folder you can write (--results)"
            ) from exc
        self._take_folder_lock()
        try:
            self._open(identity, restart=restart)
        except BaseException:
            self.close()
            raise

    def _take_folder_lock(self) -> None:
        """Hold the folder's lock, or say which process does."""
        try:
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ResultsError(
                f"cannot open {self.path / LOCK_FILE}: {exc}; is the results folder writable?"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ResultsError(
                f"another run is writing to {self.path} (process {holder}); wait for it to end "
                "or stop it, or use another results folder"
            ) from None
        except OSError as exc:
            # A file system without locks (some network volumes: ENOLCK, EOPNOTSUPP) must not
            # stop the run; it only loses the guard against a second writer.
            logger.warning(
                "%s: cannot lock the results folder (%s); make sure no other run writes to it",
                self.path,
                exc,
            )
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def close(self) -> None:
        """Let another run use the folder (also at the end of the process). Idempotent."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None
        self._opened = False

    def _open(self, identity: Mapping[str, Any], *, restart: bool) -> None:
        if restart and any(p.name != LOCK_FILE for p in self.path.iterdir()):
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            aside = self.path.with_name(f"{self.path.name}.old-{stamp}")
            number = 1
            while aside.exists():  # two restarts within a second
                number += 1
                aside = self.path.with_name(f"{self.path.name}.old-{stamp}-{number}")
            self.path.rename(aside)
            logger.warning("moved the previous results %s aside to %s", self.path, aside)
            # The lock held moved with the folder: take the new folder's.
            self.close()
            self.path.mkdir(parents=True, exist_ok=True)
            self._take_folder_lock()
        wanted = {"fingerprint": fingerprint(identity), **identity}
        if self.run_file.exists():
            self._check_identity(wanted)
        elif self.results_file.exists() and self.results_file.stat().st_size > 0:
            raise ResultsMismatchError(
                f"{self.path} holds results but no {RUN_FILE}: they cannot be matched to this "
                "run; use another results folder, or --restart to move them aside"
            )
        else:
            wanted["createdAt"] = datetime.now(UTC).isoformat()
            self._write_json(self.run_file, wanted)
        records, good = _read_lines(self.results_file)
        _truncate(self.results_file, good)
        # Trajectories can run to gigabytes: only their tail is looked at.
        _truncate(self.trajectories_file, _whole_lines_length(self.trajectories_file))
        _truncate(self.cancelled_file, _whole_lines_length(self.cancelled_file))
        for number, raw in enumerate(records, 1):
            try:
                record = AttemptResult.model_validate(raw)
            except ValidationError as exc:
                raise ResultsError(f"{self.results_file}, line {number}: {exc}") from exc
            self._records[record.key] = record
        self._opened = True
        if self._records:
            logger.info("resuming %s: %d attempts on record", self.path, len(self._records))

    def _check_identity(self, wanted: Mapping[str, Any]) -> None:
        try:
            found = json.loads(self.run_file.read_text())
        except (OSError, ValueError) as exc:
            raise ResultsError(f"cannot read {self.run_file}: {exc}") from exc
        if found.get("fingerprint") == wanted["fingerprint"]:
            return
        changed = [
            key
            for key in sorted(set(wanted) | set(found))
            if key not in ("fingerprint", "createdAt") and found.get(key) != wanted.get(key)
        ]
        detail = "; ".join(
            f"{key}: {_short(found.get(key))} then, {_short(wanted.get(key))} now"
            for key in changed
        )
        raise ResultsMismatchError(
            f"{self.path} holds results of another run ({detail or 'different fingerprint'}). "
            "Use another results folder, or --restart to move these results aside and start over"
        )

    @staticmethod
    def _write_json(path: Path, value: Any) -> None:
        partial = path.with_name(path.name + ".part")
        try:
            with partial.open("w") as f:
                json.dump(value, f, indent=2, sort_keys=True, default=str)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            partial.replace(path)
            _fsync_dir(path.parent)
        except BaseException:
            partial.unlink(missing_ok=True)  # no half-written leftover beside the file
            raise

    def identity(self) -> dict[str, Any]:
        """The contents of ``run.json`` (suite, model, agent, fingerprint)."""
        loaded: dict[str, Any] = json.loads(self.run_file.read_text())
        return loaded

    def records(self) -> list[AttemptResult]:
        """The latest result of every attempt on record, in instance then attempt order."""
        with self._lock:
            return [self._records[k] for k in sorted(self._records)]

    def finished(self) -> set[tuple[str, int]]:
        """Attempts that need no rerun: on record without an infrastructure failure."""
        with self._lock:
            return {k for k, r in self._records.items() if not r.infrastructure_failure}

    def append(self, result: AttemptResult, trajectory_json: str) -> None:
        """Write one attempt durably: its trajectory line, then its result line, each fsynced.

        Blocking (disk); call through ``asyncio.to_thread`` from a running loop.
        """
        if not self._opened:
            raise ResultsError("open() the results store before appending to it")
        line = result.model_dump_json() + "\n"
        if "\n" in trajectory_json.rstrip("\n"):
            raise ValueError("a trajectory must be one line of JSON")
        with self._lock:
            _append(self.trajectories_file, trajectory_json.rstrip("\n") + "\n")
            _append(self.results_file, line)
            self._records[result.key] = result

    def append_cancelled(self, trajectory_json: str) -> None:
        """Keep the trajectory of a cancelled attempt (blocking, like :meth:`append`). It does
        not make the attempt done."""
        if not self._opened:
            raise ResultsError("open() the results store before appending to it")
        if "\n" in trajectory_json.rstrip("\n"):
            raise ValueError("a trajectory must be one line of JSON")
        with self._lock:
            _append(self.cancelled_file, trajectory_json.rstrip("\n") + "\n")

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """Replace ``summary.json`` atomically."""
        self._write_json(self.summary_file, summary)


def _fsync_dir(folder: Path) -> None:
    """Make a file created or renamed in ``folder`` survive a crash of the machine: the file's
    own fsync does not persist its directory entry. Skipped where directories cannot be opened
    or synced (some network file systems)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _append(path: Path, text: str) -> None:
    """Append ``text`` durably, or leave the file as it was.

    A write that fails half-way (a full disk, a file size limit) would leave a line without its
    end, and the next append would glue a whole line onto it: a corrupt line in the middle of
    the file, which stops every later resume. So a failed append cuts the file back to where it
    started before the error goes up.
    """
    data = text.encode("utf-8")
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
            if created:
                _fsync_dir(path.parent)
        except BaseException:
            try:
                os.ftruncate(fd, start)
                os.fsync(fd)
            except OSError as exc:  # the torn line is cut on the next open() instead
                logger.error("%s: cannot cut off a failed write: %s", path, exc)
            raise
    finally:
        os.close(fd)


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_results(path: Path) -> list[AttemptResult]:
    """The latest result of every attempt in a results folder (or a ``results.jsonl`` file),
    read-only: a torn last line is ignored, nothing is written."""
    file = path / RESULTS_FILE if path.is_dir() else path
    if not file.exists():
        raise ResultsError(f"{path} has no {RESULTS_FILE}: is it a benchmark results folder?")
    objects, _ = _read_lines(file, READ_ONLY_HINT)
    latest: dict[tuple[str, int], AttemptResult] = {}
    for number, raw in enumerate(objects, 1):
        try:
            record = AttemptResult.model_validate(raw)
        except ValidationError as exc:
            raise ResultsError(f"{file}, line {number}: {exc}") from exc
        latest[record.key] = record
    return [latest[k] for k in sorted(latest)]


def read_trajectories(path: Path) -> Iterator[dict[str, Any]]:
    """The trajectories of a results folder as JSON objects, in file order, one at a time (a
    torn last line is skipped). When an attempt has several, the last one is current."""
    file = path / TRAJECTORIES_FILE
    if not file.exists():
        return
    with file.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                logger.warning(
                    "%s: ignoring its last line, cut short by an interrupted write", file
                )
                return
            yield json.loads(raw)
