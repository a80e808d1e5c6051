"""Load a task file of any supported benchmark format into :class:`Task` objects.

``load_tasks(path, format, filter)`` reads the file (JSON array, JSONL or Parquet as the
Hugging Face ``datasets`` library exports it), converts each record with its format's
converter, applies the task source's filter, and returns the good tasks together with one
:class:`TaskFormatError` per bad record: a malformed record never loses the others. With
``strict=True`` the first bad record raises instead.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from crl_worker.api.common import TaskFilter, TaskFormat
from crl_worker.errors import TaskFormatError
from crl_worker.tasks.formats import Converter, converter
from crl_worker.tasks.model import Task
from crl_worker.tasks.records import ConvertOptions, Record, RecordRef, read_records

logger = logging.getLogger(__name__)


@dataclass
class LoadResult:
    """What a load produced: the tasks that passed the filter, and the records that failed."""

    tasks: list[Task] = field(default_factory=list)
    """Converted tasks, filtered, in source order (or shuffled when the filter says so)."""
    errors: list[TaskFormatError] = field(default_factory=list)
    """One error per malformed record (records the filter excludes by id are not reported)."""
    missing_ids: list[str] = field(default_factory=list)
    """Ids the filter asked for that no record (good or bad) carries."""

    @property
    def ok(self) -> bool:
        """No record failed."""
        return not self.errors


@dataclass
class _Failure:
    error: TaskFormatError
    instance_id: str | None


def convert_records(
    records: Iterable[tuple[RecordRef, Record | TaskFormatError]],
    format: TaskFormat,
    *,
    options: ConvertOptions | None = None,
    strict: bool = False,
) -> tuple[list[Task], list[_Failure]]:
    """Convert raw records; duplicates of an instance id are errors (the first one wins)."""
    convert = converter(format)
    options = options or ConvertOptions()
    tasks: list[Task] = []
    failures: list[_Failure] = []
    seen: dict[str, str] = {}
    for ref, record in records:
        try:
            if isinstance(record, TaskFormatError):
                raise record
            task = _convert_one(convert, record, ref, options, format)
            if options.task_type is not None and task.task_type != options.task_type:
                raise ref.error(
                    f"a {task.task_type} task in a source whose taskType is "
                    f"{options.task_type}; set the source's taskType or fix the record",
                    "task_type",
                )
            if task.instance_id in seen:
                raise ref.error(
                    f"duplicate instance id (first at {seen[task.instance_id]}); this record"
                    " is skipped",
                    "instance_id",
                )
        except TaskFormatError as exc:
            if strict:
                raise
            logger.warning("skipping a task record: %s", exc)
            failures.append(_Failure(exc, ref.instance_id))
            continue
        seen[task.instance_id] = ref.location
        tasks.append(task)
    return tasks, failures


def _convert_one(
    convert: Converter, record: Record, ref: RecordRef, options: ConvertOptions, format: str
) -> Task:
    """``convert(record)``; an unexpected failure (a converter bug on a shape it did not
    foresee) becomes a :class:`TaskFormatError` of this record, so the load goes on."""
    try:
        return convert(record, ref, options)
    except TaskFormatError:
        raise
    except Exception as exc:  # any converter bug must cost this record only, never the load
        logger.debug("the %s converter failed on %s", format, ref.describe(), exc_info=True)
        raise ref.error(
            f"the {format} converter could not read this record ({type(exc).__name__}: {exc});"
            " check the record against docs/tasks.md, and report the record if it matches"
        ) from exc


def apply_filter(tasks: list[Task], task_filter: TaskFilter | None) -> list[Task]:
    """Keep the tasks a :class:`TaskFilter` selects: ids, excluded ids, repositories, then
    shuffle (with the seed) and limit."""
    if task_filter is None:
        return list(tasks)
    selected = list(tasks)
    if task_filter.instance_ids:
        wanted = set(task_filter.instance_ids)
        selected = [t for t in selected if t.instance_id in wanted]
    if task_filter.exclude_instance_ids:
        excluded = set(task_filter.exclude_instance_ids)
        selected = [t for t in selected if t.instance_id not in excluded]
    if task_filter.repos:
        # GitHub names are case-insensitive (FasterXML/jackson-core == fasterxml/jackson-core).
        repos = {r.lower() for r in task_filter.repos}
        selected = [t for t in selected if t.repo.lower() in repos]
    if task_filter.shuffle_seed is not None:
        random.Random(task_filter.shuffle_seed).shuffle(selected)
    if task_filter.limit is not None:
        selected = selected[: task_filter.limit]
    return selected


def _error_selected(failure: _Failure, task_filter: TaskFilter | None) -> bool:
    """Whether a failed record is one the filter would have kept (unknown ids always count)."""
    if task_filter is None or failure.instance_id is None:
        return True
    if task_filter.instance_ids and failure.instance_id not in set(task_filter.instance_ids):
        return False
    return not (
        task_filter.exclude_instance_ids
        and failure.instance_id in set(task_filter.exclude_instance_ids)
    )


def load_records(
    records: Iterable[tuple[RecordRef, Record | TaskFormatError]],
    format: TaskFormat,
    task_filter: TaskFilter | None = None,
    *,
    image_template: str | None = None,
    strict: bool = False,
    task_type: str | None = None,
) -> LoadResult:
    """:func:`load_tasks` for records already in memory (a Hugging Face dataset's rows, a
    ConfigMap's text): pass ``(RecordRef("index 0"), row)`` pairs."""
    tasks, failures = convert_records(
        records,
        format,
        options=ConvertOptions(image_template=image_template, task_type=task_type),
        strict=strict,
    )
    selected = apply_filter(tasks, task_filter)
    errors = [f.error for f in failures if _error_selected(f, task_filter)]
    missing: list[str] = []
    if task_filter is not None and task_filter.instance_ids:
        known = {t.instance_id for t in tasks} | {f.instance_id for f in failures}
        missing = [i for i in task_filter.instance_ids if i not in known]
        if missing:
            logger.warning(
                "%d requested instance ids are not in the source: %s",
                len(missing),
                ", ".join(missing[:10]),
            )
    logger.info(
        "loaded %d %s tasks (%d after the filter), %d malformed records",
        len(tasks),
        format,
        len(selected),
        len(failures),
    )
    return LoadResult(tasks=selected, errors=errors, missing_ids=missing)


def load_tasks(
    path: str | Path,
    format: TaskFormat = "swe-bench",
    task_filter: TaskFilter | None = None,
    *,
    image_template: str | None = None,
    strict: bool = False,
    anchor_sources: bool = True,
    task_type: str | None = None,
) -> LoadResult:
    """Load the tasks of a file (``.json`` array, ``.jsonl``, ``.parquet``) in ``format``.

    ``image_template`` overrides the format's usual images (the ``imageTemplate`` of a task
    source). ``strict`` raises the first malformed record's :class:`TaskFormatError` instead of
    collecting it. A file that cannot be read at all always raises. A task whose ``source`` is a
    relative path (``repos/intervals.bundle``) gets it resolved against the file's folder, so a
    suite that ships its repositories beside its task file loads from any working directory.
    ``anchor_sources=False`` keeps sources as written, for a file whose folder is not where its
    author put it (a download in the cache: its relative sources meant the URL's folder).
    ``task_type`` makes a record of another task type an error (``None``: any type).
    """
    result = load_records(
        read_records(Path(path)),
        format,
        task_filter,
        image_template=image_template,
        strict=strict,
        task_type=task_type,
    )
    if anchor_sources:
        folder = Path(path).resolve().parent
        result.tasks = [anchor_source(task, folder) for task in result.tasks]
    return result


def anchor_source(task: Task, folder: Path) -> Task:
    """``task`` with a relative local ``source`` made absolute against ``folder``; URLs
    (``https://…``, ``git@host:…``), absolute and ``~`` paths are left as they are."""
    source = task.source
    if not source or "://" in source or source.startswith(("git@", "~")):
        return task
    path = Path(source)
    if path.is_absolute():
        return task
    return task.model_copy(update={"source": str(folder / path)})


__all__ = [
    "LoadResult",
    "anchor_source",
    "apply_filter",
    "convert_records",
    "load_records",
    "load_tasks",
]
