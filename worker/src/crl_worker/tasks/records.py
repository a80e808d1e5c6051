"""Reading task files (JSON array, JSONL, Parquet) into raw records, and reading their fields.

Readers yield each record with where it came from, and a record that cannot be read at all (a
broken JSON line) as a :class:`TaskFormatError` in its place, so one bad record never loses the
others. The field helpers raise :class:`TaskFormatError` naming the record and the field.
"""

from __future__ import annotations

import ast
import datetime
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from crl_worker.errors import TaskFormatError

logger = logging.getLogger(__name__)

FileKind = Literal["json", "jsonl", "parquet"]

Record = Mapping[str, Any]


@dataclass
class RecordRef:
    """Where a record is (``line 3`` of a JSONL file, ``index 3`` of an array or Parquet file)
    and, once known, its instance id: what error messages name."""

    location: str
    instance_id: str | None = None

    def describe(self) -> str:
        """``'sympy__sympy-20590' (line 3)``, or ``line 3`` before the id is known."""
        if self.instance_id:
            return f"{self.instance_id!r} ({self.location})"
        return self.location

    def error(self, message: str, field: str | None = None) -> TaskFormatError:
        """A :class:`TaskFormatError` naming this record and ``field``."""
        return TaskFormatError(message, record=self.describe(), field=field)


@dataclass(frozen=True)
class ConvertOptions:
    """Settings that apply to every record of a load."""

    image_template: str | None = None
    """Image per instance with ``{instance_id}``, ``{repo}``, ``{owner}``, ``{name}``,
    ``{version}`` placeholders; the format's usual images when ``None``."""
    task_type: str | None = None
    """The task type every record must have (a task source's ``taskType``); ``None``: any."""


def file_kind(path: Path) -> FileKind:
    """The file's kind from its name: ``.json``, ``.jsonl``/``.ndjson``, ``.parquet``."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffixes and suffixes[-1] == ".json":
        return "json"
    if suffixes and suffixes[-1] in (".parquet", ".pq"):
        return "parquet"
    raise TaskFormatError(
        f"cannot tell the format of task file {str(path)!r} from its name: use .json (an array"
        " of records), .jsonl (one record per line) or .parquet"
    )


def read_records(path: Path) -> Iterator[tuple[RecordRef, Record | TaskFormatError]]:
    """Records of a task file, each with its :class:`RecordRef`; unreadable ones as errors.

    A file that cannot be read at all (missing, not JSON, not Parquet) raises
    :class:`TaskFormatError`.
    """
    kind = file_kind(path)
    if not path.is_file():
        raise TaskFormatError(f"task file {str(path)!r} does not exist or is not a file")
    if kind == "jsonl":
        yield from _read_jsonl(path)
    elif kind == "json":
        yield from _read_json(path)
    else:
        yield from _read_parquet(path)


def _read_jsonl(path: Path) -> Iterator[tuple[RecordRef, Record | TaskFormatError]]:
    with path.open(encoding="utf-8") as handle:
        yield from _jsonl_lines(handle)


def _jsonl_lines(lines: Iterable[str]) -> Iterator[tuple[RecordRef, Record | TaskFormatError]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        ref = RecordRef(f"line {number}")
        try:
            value = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as exc:
            yield ref, ref.error(f"not valid JSON: {exc.msg} at column {exc.colno}")
            continue
        yield ref, _as_record(value, ref)


def _read_json(path: Path) -> Iterator[tuple[RecordRef, Record | TaskFormatError]]:
    yield from _json_document(path.read_text(encoding="utf-8"), f"task file {str(path)!r}")


def _json_document(
    document: str, what: str
) -> Iterator[tuple[RecordRef, Record | TaskFormatError]]:
    try:
        value = json.loads(document)
    except json.JSONDecodeError as exc:
        raise TaskFormatError(
            f"{what} is not valid JSON ({exc.msg} at line {exc.lineno}); a .json task file"
            " holds one array of records (use .jsonl for one record per line)"
        ) from exc
    rows: list[Any]
    if isinstance(value, dict):
        # A single record, or {"data": [...]}-style wrappers some exports use.
        data = value.get("data")
        rows = data if isinstance(data, list) else [value]
    elif isinstance(value, list):
        rows = value
    else:
        raise TaskFormatError(
            f"{what} holds a JSON {type(value).__name__}: expected an array of records"
        )
    for index, row in enumerate(rows):
        ref = RecordRef(f"index {index}")
        yield ref, _as_record(row, ref)


def read_text_records(
    content: str, kind: FileKind
) -> Iterator[tuple[RecordRef, Record | TaskFormatError]]:
    """Records of task-file text already in memory (a ConfigMap key): ``json`` or ``jsonl``."""
    if kind == "jsonl":
        return _jsonl_lines(content.splitlines())
    if kind == "json":
        return _json_document(content, "the task text")
    raise TaskFormatError("Parquet task data must be read from a file, not from text")


def rows_with_refs(rows: Iterable[Record]) -> Iterator[tuple[RecordRef, Record]]:
    """Rows already in memory (a Hugging Face dataset split) with ``index N`` references."""
    for index, row in enumerate(rows):
        yield RecordRef(f"index {index}"), row


def _read_parquet(path: Path) -> Iterator[tuple[RecordRef, Record | TaskFormatError]]:
    import pyarrow.parquet as pq  # the worker extra; imported here so JSON needs no pyarrow

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise TaskFormatError(f"task file {str(path)!r} is not a Parquet file: {exc}") from exc
    index = 0
    # Batches keep memory flat on large splits (SWE-Gym's full split is ~2,400 rows of patches).
    for batch in parquet.iter_batches(batch_size=256):
        for row in batch.to_pylist():
            yield RecordRef(f"index {index}"), row
            index += 1


def _as_record(value: Any, ref: RecordRef) -> Record | TaskFormatError:
    if isinstance(value, dict):
        return value
    return ref.error(f"a record must be a JSON object, not {type(value).__name__}")


# --- fields ---------------------------------------------------------------------------------------


def text(record: Record, ref: RecordRef, name: str, *, required: bool = False) -> str:
    """A string field; ``""`` when absent and not required. Integers are accepted (ids)."""
    value = record.get(name)
    if value is None:
        if required:
            raise ref.error("required field is missing", name)
        return ""
    if isinstance(value, bool):
        raise ref.error(f"must be a string, not {value!r}", name)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date):
        # Parquet exports can type created_at as a timestamp column.
        return value.isoformat()
    if isinstance(value, float):
        # A float version loses its trailing zero (1.10 -> 1.1) and picks the wrong recipe.
        raise ref.error(
            f'must be a string, not the number {value!r} (write versions as strings: "1.10")',
            name,
        )
    if not isinstance(value, str):
        raise ref.error(f"must be a string, not {type(value).__name__}", name)
    if required and not value.strip():
        raise ref.error("required field is empty", name)
    return value


def optional_text(record: Record, ref: RecordRef, name: str) -> str | None:
    """A string field, ``None`` when absent or empty."""
    value = text(record, ref, name)
    return value or None


def string_list(record: Record, ref: RecordRef, name: str, *, required: bool = False) -> list[str]:
    """A list of strings: a real list, a JSON string holding one (SWE-bench's files), or a
    Python-repr list (Multi-SWE-bench exports), parsed with ``ast.literal_eval`` (never eval)."""
    value = record.get(name)
    if value is None:
        if required:
            raise ref.error("required field is missing", name)
        return []
    if isinstance(value, str):
        value = _parse_list_string(value, ref, name)
    if not isinstance(value, list | tuple):
        raise ref.error(f"must be a list of strings, not {type(value).__name__}", name)
    out: list[str] = []
    for position, item in enumerate(value):
        if not isinstance(item, str):
            raise ref.error(
                f"item {position} must be a string, not {type(item).__name__} ({item!r})", name
            )
        out.append(item)
    return out


def _parse_list_string(value: str, ref: RecordRef, name: str) -> Any:
    stripped = value.strip()
    if not stripped:
        return []
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    try:
        # Literals only: a string like "__import__('os')" is a ValueError here, not a call.
        return ast.literal_eval(stripped)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise ref.error(
            f"must be a list of strings (a list, or a JSON or Python list literal); got the"
            f" string {_clip(stripped)!r}",
            name,
        ) from None


def mapping(record: Record, ref: RecordRef, name: str) -> Mapping[str, Any]:
    """An object field (``{}`` when absent); JSON strings holding an object are accepted."""
    value = record.get(name)
    if value is None:
        return {}
    if isinstance(value, str):
        raw = value
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            raise ref.error(f"must be an object; got the string {_clip(raw)!r}", name) from None
    if not isinstance(value, dict):
        raise ref.error(f"must be an object, not {type(value).__name__}", name)
    return value


def _clip(value: str, limit: int = 80) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."
