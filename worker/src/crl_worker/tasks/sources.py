"""Read the tasks of a ``TaskSource`` wherever they live: a path, a URL, a Hugging Face dataset,
or a ConfigMap key / PersistentVolumeClaim file that the operator mounted into the pod.

The pool gateway and the benchmark runner call :func:`load_source`; they never need to know which
kind of source a resource names.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from crl_worker.api.common import TaskSource
from crl_worker.api.contract import Env
from crl_worker.errors import CrlError
from crl_worker.tasks.loaders import LoadResult, load_records, load_tasks
from crl_worker.tasks.records import rows_with_refs

logger = logging.getLogger(__name__)

#: Task files suffixes the readers understand; a URL without one is read as JSONL.
_SUFFIXES = (".jsonl", ".json", ".parquet")


class TaskSourceError(CrlError):
    """The task source cannot be read (unreachable URL, missing library, unmounted file)."""


def cache_dir() -> Path:
    """Where downloaded task files are kept (``$CRL_CACHE_DIR/tasks``)."""
    root = Path(os.environ.get(Env.CACHE_DIR) or Path.home() / ".cache" / "coderepairrl")
    return root / "tasks"


def load_source(
    source: TaskSource,
    *,
    mounted_path: str | Path | None = None,
    base_dir: Path | None = None,
    strict: bool = False,
) -> LoadResult:
    """Load and filter the tasks of ``source``.

    ``mounted_path`` is where the operator mounted a ConfigMap key or a volume file (it wins over
    the source when given); ``base_dir`` resolves a relative ``path`` (the manifest's folder on
    one machine).
    """
    common: dict[str, Any] = {
        "image_template": source.image_template,
        "strict": strict,
        "task_type": source.task_type,
    }
    if mounted_path is not None:
        return load_tasks(Path(mounted_path), source.format, source.filter, **common)
    if source.path is not None:
        path = Path(source.path)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return load_tasks(path, source.format, source.filter, **common)
    if source.url is not None:
        # The download lies in the cache, not beside the repositories its relative sources
        # name: anchoring them there would point at folders that never exist.
        return load_tasks(
            download(source.url), source.format, source.filter, anchor_sources=False, **common
        )
    if source.hugging_face is not None:
        rows = _hugging_face_rows(source)
        return load_records(rows_with_refs(rows), source.format, source.filter, **common)
    where = "configMap" if source.config_map is not None else "volume"
    raise TaskSourceError(
        f"a {where} task source is read from the file the operator mounts into the pod; outside"
        " a cluster, give the file itself (tasks.path, or --tasks FILE)"
    )


def download(url: str, *, timeout: float = 300.0) -> Path:
    """Download ``url`` once into the cache (by the URL's hash) and return the file."""
    import httpx  # the worker extra

    suffix = next((s for s in _SUFFIXES if urlparse(url).path.endswith(s)), ".jsonl")
    target = cache_dir() / f"{hashlib.sha256(url.encode()).hexdigest()[:24]}{suffix}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".part")
    try:
        with (
            httpx.stream("GET", url, follow_redirects=True, timeout=timeout) as response,
            partial.open("wb") as out,
        ):
            response.raise_for_status()
            for chunk in response.iter_bytes():
                out.write(chunk)
    except (httpx.HTTPError, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise TaskSourceError(f"cannot download the task file {url}: {exc}") from exc
    partial.replace(target)  # only a complete download is ever read
    logger.info("downloaded %s to %s", url, target)
    return target


def _hugging_face_rows(source: TaskSource) -> list[dict[str, Any]]:
    dataset = source.hugging_face
    assert dataset is not None
    try:
        import datasets  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError as exc:
        raise TaskSourceError(
            "reading a Hugging Face dataset needs the `datasets` package (pip install"
            " datasets), or export the split to JSONL/Parquet and use tasks.path or tasks.url"
        ) from exc
    try:
        split = datasets.load_dataset(
            dataset.name, dataset.config, split=dataset.split, revision=dataset.revision
        )
    except Exception as exc:  # the hub client raises many types; all mean "cannot read it"
        raise TaskSourceError(
            f"cannot load the Hugging Face dataset {dataset.name} (split {dataset.split}): {exc}"
        ) from exc
    return [dict(row) for row in split]
