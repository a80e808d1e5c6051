"""What every record converter shares: field readers, the image a task runs in, the metadata it
keeps, and the last step, a validated :class:`Task` (:func:`finish`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from crl_worker.tasks.model import Task
from crl_worker.tasks.recipes import Recipe, render_image_template
from crl_worker.tasks.records import ConvertOptions, Record, RecordRef, string_list, text

_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def repo_name(value: str, ref: RecordRef, field: str = "repo") -> str:
    """``value`` when it is a repository as owner/name; otherwise an error naming ``field``."""
    if not _REPO.match(value):
        raise ref.error(f"must be a repository as owner/name, not {value!r}", field)
    return value


def image_for(
    options: ConvertOptions,
    default: str | None,
    *,
    instance_id: str,
    repo: str,
    version: str | None,
) -> str | None:
    """The task's image: the source's ``imageTemplate`` filled in when it has one, else
    ``default`` (the benchmark's own image naming, or none: built by the harness)."""
    if options.image_template:
        return render_image_template(
            options.image_template, instance_id=instance_id, repo=repo, version=version
        )
    return default


def extras(record: Record, consumed: Iterable[str]) -> dict[str, Any]:
    """Fields the converter did not map, kept in ``metadata`` (small scalars and lists only:
    large run logs stay out of every task object)."""
    skip = set(consumed)
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key in skip or value is None:
            continue
        if isinstance(value, str | int | float | bool) and len(str(value)) <= 2000:
            out[key] = value
    return out


def build_task(ref: RecordRef, **fields: Any) -> Task:
    """``Task(**fields)``, with pydantic's complaints turned into a :class:`TaskFormatError`
    naming the record and the field."""
    try:
        return Task(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise ref.error(first["msg"], location or _fields_named(first["msg"])) from None


def _fields_named(message: str) -> str:
    """The task fields a whole-record check's message names (``a repair task needs test``
    -> ``test``), so that its error names a field too; ``task_type`` when it names none."""
    words = set(re.findall(r"[a-z_]+", message))
    named = [name for name in Task.model_fields if name in words and name != "task_type"]
    return ", ".join(named) or "task_type"


def finish(
    ref: RecordRef,
    options: ConvertOptions,
    record: Record,
    consumed: Iterable[str],
    *,
    default_image: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Task:
    """The converters' last step: the record's unmapped fields (:func:`extras`, less
    ``consumed``) and ``metadata`` become the task's metadata, the image comes from
    :func:`image_for`, and ``fields`` (``instance_id`` and ``repo`` among them) are validated
    into a :class:`Task` (:func:`build_task`)."""
    image = image_for(
        options,
        default_image,
        instance_id=fields["instance_id"],
        repo=fields["repo"],
        version=fields.get("version"),
    )
    kept = {**extras(record, consumed), **(metadata or {})}
    return build_task(ref, image=image, metadata=kept, **fields)


def recipe_fields(recipe: Recipe, version: str | None = None) -> dict[str, Any]:
    """The task fields a recipe decides: language, interpreter, install, tests, environment."""
    return {
        "language": recipe.language,
        "python": recipe.python,
        "install": list(recipe.install),
        "test": recipe.test_spec(),
        "env": recipe.environment(version),
    }


def list_field(record: Record, ref: RecordRef, *names: str, required: bool = False) -> list[str]:
    """The first of ``names`` present (SWE-bench's upper-case names, or lower-case aliases)."""
    for name in names:
        if name in record and record[name] is not None:
            return string_list(record, ref, name)
    if required:
        raise ref.error("required field is missing", names[0])
    return []


def first_text(record: Record, ref: RecordRef, *names: str, required: bool = False) -> str:
    """The first of ``names`` present, as text (formats that spell a column several ways)."""
    for name in names:
        if record.get(name) is not None:
            return text(record, ref, name)
    if required:
        raise ref.error("required field is missing", names[0])
    return ""


__all__ = [
    "build_task",
    "extras",
    "finish",
    "first_text",
    "image_for",
    "list_field",
    "recipe_fields",
    "repo_name",
]
