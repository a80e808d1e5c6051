"""Reading a worker's config file: the operator's ``config.yaml`` (``{apiVersion, kind, name,
spec}``) or the resource's own manifest (``metadata.name``), shared by the benchmark runner and
the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from crl_worker.errors import CrlError

SpecT = TypeVar("SpecT", bound=BaseModel)


@dataclass(frozen=True)
class ResourceFile(Generic[SpecT]):
    """One resource read from a file: its name, its validated spec and the file."""

    name: str
    spec: SpecT
    path: Path


def read_resource_file(
    path: Path,
    kind: str,
    spec_model: type[SpecT],
    *,
    error: type[CrlError] = CrlError,
) -> ResourceFile[SpecT]:
    """The one ``kind`` document of ``path`` (other kinds in a multi-document file are skipped),
    its name (``name``, else ``metadata.name``, else the file's stem) and its spec validated by
    ``spec_model``. Every problem raises ``error`` with a message saying what to fix."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"cannot read the {kind} config {path}: {exc}") from exc
    found = [d for d in documents if isinstance(d, dict) and d.get("kind") == kind]
    if not found:
        kinds = sorted({str(d.get("kind")) for d in documents if isinstance(d, dict)})
        raise error(
            f"{path} holds no {kind} (kinds found: {', '.join(kinds) or 'none'}); give the "
            f"{kind}'s manifest or the operator's config.yaml of a {kind}"
        )
    if len(found) > 1:
        raise error(f"{path} holds {len(found)} {kind}s; give a file with one")
    document = found[0]
    name = document.get("name") or (document.get("metadata") or {}).get("name") or path.stem
    try:
        spec = spec_model.model_validate(document.get("spec") or {})
    except ValidationError as exc:
        raise error(
            f"{path}: the {kind} spec is invalid (check it with `crl validate`):\n{exc}"
        ) from exc
    return ResourceFile(name=str(name), spec=spec, path=path)
