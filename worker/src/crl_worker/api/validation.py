"""Offline validation of manifests, with the API server's semantics.

A document goes through what admission would do to it: nulls given for non-nullable fields are
dropped, the models check types, bounds, enums and unknown fields (strictly: ``"8"`` is not an
integer), defaults are filled in, and then the CEL rules of the generated schema are evaluated
with cel-python: the very expressions the API server runs. Transition rules (those that read
``oldSelf``) need the stored object and are left to the server.

Every problem names the file, the line, the field path and what is allowed. Nothing here raises
on bad input: bad input is the normal case.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from crl_worker.api.base import API_VERSION, CEL_KEY, DNS1123_LABEL, DNS1123_SUBDOMAIN, QUANTITY
from crl_worker.api.resources import KINDS, AnyResource, Kind
from crl_worker.api.schema import resource_schema

log = logging.getLogger(__name__)

FieldPath = tuple[str | int, ...]

_PATTERN_HINTS = {
    DNS1123_SUBDOMAIN: "a lowercase RFC 1123 name: a-z, 0-9, '-' and '.', "
    "starting and ending with a letter or digit",
    DNS1123_LABEL: "a lowercase RFC 1123 label of at most 63 characters: a-z, 0-9 and '-', "
    "starting and ending with a letter or digit",
    QUANTITY: "a Kubernetes quantity such as 500m, 4 or 16Gi",
}


class ManifestError(Exception):
    """A manifest is invalid; ``problems`` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest."""

    source: str
    """The file name, or ``<stdin>``."""
    line: int | None
    """1-based line of the offending node, when known."""
    path: str
    """Dotted field path (``spec.algorithm.numGenerations``); empty for the whole document."""
    message: str
    """What is wrong and what is allowed."""

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


@dataclass
class DocumentResult:
    """The outcome of validating one YAML document."""

    source: str
    """The file name, or ``<stdin>``."""
    index: int
    """0-based position of the document in its file."""
    line: int
    """1-based line where the document starts."""
    kind: str | None = None
    """The document's kind, when it has one."""
    name: str | None = None
    """The document's name, when it has one."""
    resource: AnyResource | None = None
    """The validated resource, with defaults filled in; None when invalid."""
    problems: list[Problem] = field(default_factory=list)
    """Everything wrong with the document."""

    @property
    def ok(self) -> bool:
        """Whether the document is valid."""
        return not self.problems


# --- YAML with positions --------------------------------------------------------------------


def _positions(
    node: yaml.Node, path: FieldPath, out: dict[FieldPath, int], dups: list[tuple[FieldPath, int]]
) -> None:
    """Record the line of every node under ``node``, and duplicate mapping keys."""
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                dups.append(((*path, key), key_node.start_mark.line + 1))
            seen.add(key)
            out[(*path, key)] = key_node.start_mark.line + 1
            _positions(value_node, (*path, key), out, dups)
            out[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _positions(item, (*path, i), out, dups)


# libyaml's parser when PyYAML was built with it: same nodes and marks, several times faster.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class _Document:
    index: int
    line: int
    data: Any
    positions: dict[FieldPath, int]
    duplicates: list[tuple[FieldPath, int]]


def _documents(text: str) -> Iterator[_Document]:
    """Parse a YAML stream document by document; raises ``yaml.YAMLError`` where it breaks."""
    loader = _Loader(text)
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            positions: dict[FieldPath, int] = {}
            dups: list[tuple[FieldPath, int]] = []
            _positions(node, (), positions, dups)
            data = loader.construct_document(node)
            yield _Document(index, node.start_mark.line + 1, data, positions, dups)
            index += 1
    finally:
        loader.dispose()


def _line(doc: _Document, path: FieldPath) -> int:
    """The line of ``path``, or of its nearest ancestor that is in the file."""
    while path not in doc.positions and path:
        path = path[:-1]
    return doc.positions.get(path, doc.line)


def format_path(path: FieldPath) -> str:
    """``("spec", "tolerations", 0, "key")`` -> ``spec.tolerations[0].key``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


# --- schema helpers -------------------------------------------------------------------------


@cache
def kind_schema(kind: str) -> dict[str, Any]:
    """The generated ``openAPIV3Schema`` of ``kind`` (computed once)."""
    k = KINDS[kind]
    return resource_schema(k.model, k.spec, k.status)


def _sub_schema(schema: dict[str, Any], path: FieldPath) -> dict[str, Any] | None:
    """The schema node at ``path``, or None when the path leaves the schema."""
    node: dict[str, Any] | None = schema
    for part in path:
        if node is None:
            return None
        if isinstance(part, int):
            node = node.get("items")
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return node


def _prune_nulls(value: Any, schema: dict[str, Any] | None) -> Any:
    """Drop nulls given for non-nullable fields, as the API server does before defaulting."""
    if schema is None or schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for k, v in value.items():
            sub = props.get(k) if k in props else (extra if isinstance(extra, dict) else None)
            if v is None and sub is not None and not sub.get("nullable"):
                continue
            out[k] = _prune_nulls(v, sub)
        return out
    if isinstance(value, list):
        return [_prune_nulls(v, schema.get("items")) for v in value]
    return value


# --- CEL ------------------------------------------------------------------------------------


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_problems(
    schema: dict[str, Any], value: Any, path: FieldPath = ()
) -> list[tuple[FieldPath, str]]:
    """Evaluate every CEL rule of ``schema`` that applies to ``value`` (transition rules skipped)."""
    found: list[tuple[FieldPath, str]] = []
    for rule in schema.get(CEL_KEY, []):
        if "oldSelf" in rule["rule"]:
            continue
        where = path + tuple(p for p in rule.get("fieldPath", "").split(".") if p)
        try:
            result = _program(rule["rule"]).evaluate({"self": json_to_cel(value)})
        except CELEvalError as exc:
            result = exc
        if isinstance(result, CELEvalError):
            detail = f"{rule['message']} (the rule could not be evaluated: {result.args[0]})"
            found.append((where, detail))
        elif not bool(result):
            found.append((where, rule["message"]))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                found.extend(cel_problems(sub, v, (*path, k)))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            found.extend(cel_problems(schema["items"], v, (*path, i)))
    return found


# --- pydantic errors in a user's words --------------------------------------------------------


def _describe(err: ErrorDetails, schema: dict[str, Any]) -> str:
    """Turn one pydantic error into a sentence naming what is allowed."""
    kind, loc, got = err["type"], err["loc"], err.get("input")
    node = _sub_schema(schema, loc)
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        parent = _sub_schema(schema, loc[:-1]) or {}
        allowed = list(parent.get("properties", {}))
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        msg = f"unknown field {loc[-1]!r}"
        if hint:
            msg += f"; did you mean {hint[0]!r}?"
        return msg + (f" Allowed fields: {', '.join(allowed)}" if allowed else "")
    if kind in ("literal_error", "enum"):
        allowed_values = (node or {}).get("enum") or []
        return f"must be one of {', '.join(map(str, allowed_values))} (got {got!r})"
    if kind == "string_pattern_mismatch":
        pattern = str((err.get("ctx") or {}).get("pattern", ""))
        return (
            f"must be {_PATTERN_HINTS.get(pattern, f'a string matching {pattern}')} (got {got!r})"
        )
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping of fields (got {type(got).__name__} {got!r})"
    if kind == "list_type":
        return f"must be a list (got {type(got).__name__} {got!r})"
    if kind == "value_error":
        return f"{err['msg'].removeprefix('Value error, ')} (got {got!r})"
    msg = err["msg"]
    msg = msg.replace("Input should be", "must be").replace("String should", "must")
    msg = msg.replace("List should", "must").replace("Dictionary should", "must")
    msg = msg.replace("Value should", "must")
    if kind.endswith("_type") or kind.endswith("_parsing") or isinstance(got, str | int | float):
        msg += f" (got {got!r})"
    return msg


def _json_default(value: Any) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


# --- the pipeline ---------------------------------------------------------------------------


def _check_header(doc: _Document, source: str, result: DocumentResult) -> Kind | None:
    data = doc.data
    if not isinstance(data, dict):
        what = "a list" if isinstance(data, list) else f"a {type(data).__name__} ({data!r})"
        result.problems.append(
            Problem(
                source,
                doc.line,
                "",
                f"a manifest must be a mapping with apiVersion, kind, metadata and spec; got {what}",
            )
        )
        return None
    kind, api_version = data.get("kind"), data.get("apiVersion")
    result.kind = kind if isinstance(kind, str) else None
    meta = data.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("name"), str):
        result.name = meta["name"]
    kinds = ", ".join(KINDS)
    if kind is None:
        result.problems.append(
            Problem(source, doc.line, "kind", f"required field is missing; expected one of {kinds}")
        )
        return None
    if kind not in KINDS:
        result.problems.append(
            Problem(
                source,
                _line(doc, ("kind",)),
                "kind",
                f"{kind!r} ({api_version}) is not a CodeRepairRL resource; expected one of {kinds} "
                f"in {API_VERSION}",
            )
        )
        return None
    if api_version != API_VERSION:
        result.problems.append(
            Problem(
                source,
                _line(doc, ("apiVersion",)),
                "apiVersion",
                f"{kind} is served as {API_VERSION!r} (got {api_version!r})",
            )
        )
        return None
    return KINDS[kind]


def validate_document(doc: _Document, source: str) -> DocumentResult:
    """Validate one parsed document."""
    result = DocumentResult(source, doc.index, doc.line)
    for path, line in doc.duplicates:
        result.problems.append(
            Problem(source, line, format_path(path), "duplicate key: YAML keeps only the last one")
        )
    k = _check_header(doc, source, result)
    if k is None:
        return result
    schema = kind_schema(k.kind)
    data = _prune_nulls(doc.data, schema)
    meta = data.get("metadata")
    if not isinstance(meta, dict) or not (meta.get("name") or meta.get("generateName")):
        result.problems.append(
            Problem(
                source,
                _line(doc, ("metadata",)),
                "metadata.name",
                "required field is missing: every object needs a name",
            )
        )
    try:
        resource = k.model.model_validate_json(
            json.dumps(data, default=_json_default), strict=True, by_name=False, by_alias=True
        )
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            result.problems.append(
                Problem(source, _line(doc, loc), format_path(loc), _describe(err, schema))
            )
        return result
    for path, message in cel_problems(schema, resource.to_wire()):
        result.problems.append(Problem(source, _line(doc, path), format_path(path), message))
    if not result.problems:
        result.resource = resource
    return result


def _yaml_error(exc: yaml.YAMLError, source: str, index: int) -> DocumentResult:
    """A document result for a YAML syntax error, with the line where parsing broke."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    detail = getattr(exc, "problem", None) or str(exc)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark.line + 1 != line:
        detail += (
            f" ({context.removeprefix('while ')} that started on line {context_mark.line + 1})"
        )
    elif context:
        detail += f" ({context.removeprefix('while ')})"
    problem = Problem(source, line, "", f"invalid YAML: {detail}")
    return DocumentResult(source, index, line or 1, problems=[problem])


def validate_text(text: str, source: str = "<stdin>") -> list[DocumentResult]:
    """Validate every document of a YAML stream. Never raises on bad input."""
    results: list[DocumentResult] = []
    try:
        for doc in _documents(text):
            if doc.data is None:  # an empty document (`---` with nothing after it)
                continue
            results.append(validate_document(doc, source))
    except yaml.YAMLError as exc:
        results.append(_yaml_error(exc, source, len(results)))
        return results
    if not results:
        results.append(
            DocumentResult(
                source,
                0,
                1,
                problems=[Problem(source, None, "", "the file holds no YAML documents")],
            )
        )
    return results


def validate_file(path: str | Path) -> list[DocumentResult]:
    """Validate a manifest file (``-`` reads standard input)."""
    import sys

    if str(path) == "-":
        return validate_text(sys.stdin.read(), "<stdin>")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [
            DocumentResult(
                str(p), 0, 1, problems=[Problem(str(p), None, "", f"cannot read the file: {exc}")]
            )
        ]
    return validate_text(text, str(p))


def load_resources(path: str | Path) -> list[AnyResource]:
    """Load and validate every resource of a manifest file; raise ``ManifestError`` if any is bad."""
    results = validate_file(path)
    problems = [p for r in results for p in r.problems]
    if problems:
        raise ManifestError(problems)
    return [r.resource for r in results if r.resource is not None]
