"""Offline validation of manifests, with the API server's semantics.

A document goes through what admission does to it: YAML is read as Kubernetes reads it
(`kubeyaml`), `status` is dropped (the status subresource ignores it on create), nulls given
for non-nullable fields are dropped, whole floats become integers where the schema says
integer, sets must not repeat, the models check types (strictly: `"8"` is not an integer),
bounds, enums and unknown fields, defaults are filled in, and then the CEL rules of the
generated schema are evaluated with cel-python: the very expressions the API server runs.
Transition rules (those that read `oldSelf`) need the stored object and are left to the server.
`tests/test_crdcheck.py` holds these verdicts to Kubernetes' own validation code.

Every problem names the file, the line, the field path and what is allowed. Nothing here raises
on bad input: bad input is the normal case.

A document of another API (a Namespace, a Kueue ClusterQueue, an Argo CD Application) is an error
by default; with `skip_foreign=True` it is skipped with a note instead, as kubeconform skips kinds
it has no schema for. Only documents that are clearly another API's are skipped: see
`is_foreign`.
"""

from __future__ import annotations

import difflib
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from crl_worker.api.base import (
    API_VERSION,
    CEL_KEY,
    DNS1035_LABEL,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    GROUP,
    QUANTITY,
)
from crl_worker.api.kubeyaml import Document, FieldPath, documents
from crl_worker.api.resources import KINDS, AnyResource, Kind
from crl_worker.api.schema import resource_schema

log = logging.getLogger(__name__)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: How alike (difflib's ratio) an API group must be to ours to be taken for a misspelling of it:
#: `coderepairrl.io`, `code-repair.io`, `coderepair.oi` are; `kueue.x-k8s.io`, `apps` are not.
GROUP_TYPO_CUTOFF = 0.85

#: The note on a document skipped because it is another API's.
FOREIGN_NOTE = "not a CodeRepairRL kind"

_PATTERN_HINTS = {
    DNS1035_LABEL: "a lowercase RFC 1035 label: at most 63 characters of a-z, 0-9 and '-', "
    "starting with a letter and ending with a letter or digit",
    DNS1123_SUBDOMAIN: "a lowercase RFC 1123 name: a-z, 0-9, '-' and '.', "
    "starting and ending with a letter or digit",
    DNS1123_LABEL: "a lowercase RFC 1123 label of at most 63 characters: a-z, 0-9 and '-', "
    "starting and ending with a letter or digit",
    QUANTITY: "a Kubernetes quantity such as 500m, 4 or 16Gi",
}


class ManifestError(Exception):
    """A manifest is invalid; `problems` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest (or, as a warning, worth knowing)."""

    source: str
    """The file name, or `<stdin>`."""
    line: int | None
    """1-based line of the offending node, when known."""
    path: str
    """Dotted field path (`spec.algorithm.numGenerations`); empty for the whole document."""
    message: str
    """What is wrong and what is allowed."""

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


@dataclass
class DocumentResult:
    """The outcome of validating one YAML document."""

    source: str
    """The file name, or `<stdin>`."""
    index: int
    """0-based position of the document in its file."""
    line: int
    """1-based line where the document starts."""
    kind: str | None = None
    """The document's kind, when it has one."""
    api_version: str | None = None
    """The document's apiVersion, when it has one."""
    name: str | None = None
    """The document's name, when it has one."""
    resource: AnyResource | None = None
    """The validated resource, with defaults filled in; None when invalid."""
    problems: list[Problem] = field(default_factory=list)
    """Everything wrong with the document."""
    warnings: list[Problem] = field(default_factory=list)
    """What is accepted but probably not meant (e.g. a `status` the server will drop)."""
    skipped: str | None = None
    """Why the document was not checked against our schemas (another API's kind, see
    `is_foreign`); None when it was. What is wrong with any YAML (a duplicate key) is still in
    `problems`."""

    @property
    def ok(self) -> bool:
        """Whether the document is valid (a skipped document has no problems: it is ok)."""
        return not self.problems


def format_path(path: FieldPath) -> str:
    """`("spec", "tolerations", 0, "key")` -> `spec.tolerations[0].key`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


# --- walking values along the schema ---------------------------------------------------------


@cache
def kind_schema(kind: str) -> dict[str, Any]:
    """The generated `openAPIV3Schema` of `kind` (computed once)."""
    k = KINDS[kind]
    return resource_schema(k.model, k.spec, k.status)


def _child(schema: dict[str, Any] | None, key: str | int) -> dict[str, Any] | None:
    """The schema of `key` inside `schema`; None where the schema does not describe it."""
    if schema is None or schema.get("x-kubernetes-preserve-unknown-fields"):
        return None
    if isinstance(key, int):
        items = schema.get("items")
        return items if isinstance(items, dict) else None
    props = schema.get("properties", {})
    if key in props:
        return props[key]  # type: ignore[no-any-return]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _sub_schema(schema: dict[str, Any] | None, path: tuple[Any, ...]) -> dict[str, Any] | None:
    for part in path:
        schema = _child(schema, part)
    return schema


def _normalize(
    value: Any, schema: dict[str, Any] | None, path: FieldPath, found: list[tuple[FieldPath, str]]
) -> Any:
    """Apply the API server's decoding and list semantics to `value`, collecting problems.

    Nulls of non-nullable fields are dropped; a float with no fraction is an integer where the
    schema wants one (JSON does not tell 2.0 from 2); integers must fit in 64 bits; sets and
    list-maps must not repeat a value or key.
    """
    if schema is None:
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            sub = _child(schema, k)
            if v is None and sub is not None and not sub.get("nullable"):
                continue
            out[k] = _normalize(v, sub, (*path, k), found)
        return out
    if isinstance(value, list):
        items = [_normalize(v, _child(schema, i), (*path, i), found) for i, v in enumerate(value)]
        list_type = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen: set[str] = set()
        for i, item in enumerate(items):
            if list_type == "set":
                ident = json.dumps(item, sort_keys=True, default=str)
                what = f"duplicate value {item!r}: the list is a set"
            elif list_type == "map" and isinstance(item, dict):
                ident = json.dumps([item.get(k) for k in keys], default=str)
                what = f"duplicate entry for {', '.join(f'{k}={item.get(k)!r}' for k in keys)}"
            else:
                continue
            if ident in seen:
                found.append(((*path, i), what))
            seen.add(ident)
        return items
    wants_int = schema.get("type") == "integer" or schema.get("x-kubernetes-int-or-string")
    if isinstance(value, float) and wants_int and value.is_integer():
        value = int(value)
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not INT64_MIN <= value <= INT64_MAX
    ):
        found.append((path, f"must fit in a signed 64-bit integer (got {value})"))
    return value


# --- CEL ------------------------------------------------------------------------------------


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_problems(
    schema: dict[str, Any], value: Any, path: FieldPath = ()
) -> list[tuple[FieldPath, str]]:
    """Evaluate every CEL rule of `schema` that applies to `value` (transition rules skipped)."""
    found: list[tuple[FieldPath, str]] = []
    for rule in schema.get(CEL_KEY, []):
        if "oldSelf" in rule["rule"]:
            continue
        where = path + tuple(p for p in rule.get("fieldPath", "").split(".") if p)
        try:
            result = _program(rule["rule"]).evaluate({"self": json_to_cel(value)})
        except Exception as exc:
            result = CELEvalError(str(exc))
        if isinstance(result, CELEvalError):
            detail = f"{rule['message']} (the rule could not be evaluated: {result.args[0]})"
            found.append((where, detail))
        elif not bool(result):
            found.append((where, rule["message"]))
    if isinstance(value, dict):
        for k, v in value.items():
            sub = _child(schema, k)
            if sub is not None:
                found.extend(cel_problems(sub, v, (*path, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            sub = _child(schema, i)
            if sub is not None:
                found.extend(cel_problems(sub, v, (*path, i)))
    return found


# --- pydantic errors in a user's words --------------------------------------------------------


#: Longest echo of a wrong value in a message (characters of its repr).
MAX_ECHO = 200


class _Echo:
    """A value whose repr is cut to :data:`MAX_ECHO` characters: a 5 MB string in a manifest
    is named, not printed back in full."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        text = repr(self.value)
        if len(text) <= MAX_ECHO:
            return text
        size = len(self.value) if isinstance(self.value, str | bytes | list | dict) else None
        what = f" ({size} long)" if size is not None else ""
        return f"{text[: MAX_ECHO - 20]}...{what}"


def _describe(err: ErrorDetails, schema: dict[str, Any]) -> str:
    """Turn one pydantic error into a sentence naming what is allowed."""
    kind, loc, raw = err["type"], err["loc"], err.get("input")
    got = _Echo(raw)
    node = _sub_schema(schema, loc)
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        parent = _sub_schema(schema, loc[:-1]) or {}
        allowed = list(parent.get("properties", {}))
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        msg = f"unknown field {_Echo(loc[-1])!r}"
        if close:
            msg += f"; did you mean {close[0]!r}?"
        return msg + (f"; allowed fields: {', '.join(allowed)}" if allowed else "")
    if kind in ("literal_error", "enum"):
        allowed_values = (node or {}).get("enum") or []
        return f"must be one of {', '.join(map(str, allowed_values))} (got {got!r})"
    if kind == "string_pattern_mismatch":
        pattern = str((err.get("ctx") or {}).get("pattern", ""))
        hint = _PATTERN_HINTS.get(pattern, f"a string matching {pattern}")
        return f"must be {hint} (got {got!r})"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping of fields (got {type(raw).__name__} {got!r})"
    if kind == "list_type":
        return f"must be a list (got {type(raw).__name__} {got!r})"
    if kind == "value_error":
        return f"{_cut(err['msg'].removeprefix('Value error, '))} (got {got!r})"
    if kind == "string_type" and isinstance(raw, bool):
        return (
            f"must be a string (got the boolean {str(raw).lower()}: YAML reads unquoted "
            "yes/no/on/off/y/n/true/false as booleans; quote the value)"
        )
    msg = err["msg"]
    for was, now in (
        ("Input should be", "must be"),
        ("String should", "must"),
        ("List should", "must"),
        ("Dictionary should", "must"),
        ("Value should", "must"),
    ):
        msg = msg.replace(was, now)
    if kind.endswith(("_type", "_parsing")) or isinstance(raw, str | int | float):
        msg += f" (got {got!r})"
    return _cut(msg)


def _cut(text: str, limit: int = 4 * MAX_ECHO) -> str:
    """A message of pydantic's own (which may quote the value) cut to ``limit`` characters."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# --- the pipeline ---------------------------------------------------------------------------


def _group(api_version: str) -> str:
    """The API group of an apiVersion: `apps/v1` -> `apps`; the core group's `v1` -> ``""``."""
    return api_version.rpartition("/")[0]


def _near_our_group(group: str) -> bool:
    """Whether `group` is ours or looks like a misspelling of it (`coderepairrl.io`)."""
    return bool(difflib.get_close_matches(group, [GROUP], n=1, cutoff=GROUP_TYPO_CUTOFF))


def is_foreign(data: Any) -> bool:
    """Whether a document is clearly another API's object, which `skip_foreign` skips.

    It must be a mapping with a string `kind` and a string `apiVersion` whose group is neither
    `coderepair.io` nor a near-misspelling of it. One of our kind names (TrainingRun, RolloutPool,
    Benchmark) is foreign only under a group of its own (another project's Benchmark), not under
    the core group (`apiVersion: v1`, a forgotten group). Everything else is meant to be ours
    and is checked, so that a typo (`kind: TrainingRn` in our group, `coderepairrl.io/v1alpha1`,
    no apiVersion at all, a `kind` that is not a string) is an error, never silently skipped. A
    `List` holding any such document is not foreign either: its items are not checked one by one.
    """
    if not isinstance(data, dict):
        return False
    kind, api_version = data.get("kind"), data.get("apiVersion")
    if not (isinstance(kind, str) and kind and isinstance(api_version, str) and api_version):
        return False
    group = _group(api_version)
    if _near_our_group(group) or (kind in KINDS and not group):
        return False
    items = data.get("items")
    if kind == "List" and isinstance(items, list):
        return all(is_foreign(item) for item in items)
    return True


def _check_header(
    doc: Document, source: str, result: DocumentResult, skip_foreign: bool
) -> Kind | None:
    """Check what the document is; return its kind when it is one of ours.

    A foreign document (`is_foreign`) is marked skipped when `skip_foreign`, else a problem.
    """
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
    result.api_version = api_version if isinstance(api_version, str) else None
    meta = data.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("name"), str):
        result.name = meta["name"]
    if skip_foreign and is_foreign(data):
        result.skipped = FOREIGN_NOTE
        return None
    kinds = ", ".join(KINDS)
    if kind is None:
        result.problems.append(
            Problem(source, doc.line, "kind", f"required field is missing; expected one of {kinds}")
        )
        return None
    if not isinstance(kind, str) or kind not in KINDS:
        where = f" ({api_version})" if isinstance(api_version, str) else ""
        hint = ""
        if isinstance(kind, str) and not is_foreign(data):
            close = difflib.get_close_matches(kind, list(KINDS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if kind == "List":
                hint = "; its items are checked only as separate documents (---)"
        result.problems.append(
            Problem(
                source,
                doc.line_of(("kind",)),
                "kind",
                f"{kind!r}{where} is not a CodeRepairRL resource{hint}; expected one of {kinds} "
                f"in {API_VERSION}",
            )
        )
        return None
    if api_version is None:
        result.problems.append(
            Problem(source, doc.line, "apiVersion", f"required field is missing; use {API_VERSION}")
        )
        return None
    if api_version != API_VERSION:
        result.problems.append(
            Problem(
                source,
                doc.line_of(("apiVersion",)),
                "apiVersion",
                f"{kind} is served as {API_VERSION!r} (got {api_version!r})",
            )
        )
        return None
    return KINDS[kind]


def validate_document(doc: Document, source: str, *, skip_foreign: bool = False) -> DocumentResult:
    """Validate one parsed document; with `skip_foreign`, another API's object is skipped."""
    result = DocumentResult(source, doc.index, doc.line)

    def add(path: FieldPath, message: str) -> None:
        result.problems.append(Problem(source, doc.line_of(path), format_path(path), message))

    for path, line in doc.duplicates:
        result.problems.append(
            Problem(source, line, format_path(path), "duplicate key: YAML keeps only the last one")
        )
    k = _check_header(doc, source, result, skip_foreign)
    if k is None:
        return result
    schema = kind_schema(k.kind)
    data = dict(doc.data)
    if data.pop("status", None) is not None:
        result.warnings.append(
            Problem(
                source,
                doc.line_of(("status",)),
                "status",
                "ignored: the operator writes status, and the API server drops it from manifests",
            )
        )
    found: list[tuple[FieldPath, str]] = []
    data = _normalize(data, schema, (), found)
    for path, message in found:
        add(path, message)
    meta = data.get("metadata")
    if meta is None or (
        isinstance(meta, dict) and not (meta.get("name") or meta.get("generateName"))
    ):
        add(("metadata", "name"), "required field is missing: every object needs a name")
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:  # e.g. a NaN, which JSON (and Kubernetes) cannot hold
        add((), f"the document holds a value JSON cannot represent: {exc}")
        return result
    try:
        resource = k.model.model_validate_json(text, strict=True, by_name=False, by_alias=True)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            if err["type"] == "missing" and tuple(err["loc"]) == ("metadata",):
                continue  # reported above, with a clearer message
            add(tuple(err["loc"]), _describe(err, schema))
        return result
    if result.problems:
        return result
    for path, message in cel_problems(schema, resource.to_wire()):
        add(path, message)
    if not result.problems:
        result.resource = resource
    return result


def _yaml_error(exc: yaml.YAMLError, source: str, index: int) -> DocumentResult:
    """A document result for a YAML error, with the line where parsing broke."""
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


def validate_text(
    text: str, source: str = "<stdin>", *, skip_foreign: bool = False
) -> list[DocumentResult]:
    """Validate every document of a YAML stream. Never raises on bad input.

    With `skip_foreign`, documents of other APIs (`is_foreign`) are skipped: their results have
    `skipped` set and no problems. Without it, they are problems.
    """
    results: list[DocumentResult] = []
    try:
        for doc in documents(text):
            if doc.data is None:  # an empty document (`---` with nothing after it)
                continue
            start = time.perf_counter()
            results.append(validate_document(doc, source, skip_foreign=skip_foreign))
            log.debug(
                "%s document %d validated in %.1f ms",
                source,
                doc.index,
                1000 * (time.perf_counter() - start),
            )
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


def _unreadable(source: str, why: str) -> list[DocumentResult]:
    return [DocumentResult(source, 0, 1, problems=[Problem(source, None, "", why)])]


def validate_file(path: str | Path, *, skip_foreign: bool = False) -> list[DocumentResult]:
    """Validate a manifest file (`-` reads standard input); `skip_foreign` as in `validate_text`."""
    source = "<stdin>" if str(path) == "-" else str(path)
    try:
        raw = sys.stdin.buffer.read() if source == "<stdin>" else Path(path).read_bytes()
    except OSError as exc:
        return _unreadable(source, f"cannot read the file: {exc.strerror or exc}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _unreadable(source, f"cannot read the file: not UTF-8 text (byte {exc.start})")
    return validate_text(text, source, skip_foreign=skip_foreign)


def load_resources(path: str | Path) -> list[AnyResource]:
    """Load and validate every resource of a manifest file; raise `ManifestError` if any is bad."""
    results = validate_file(path)
    problems = [p for r in results for p in r.problems]
    if problems:
        raise ManifestError(problems)
    return [r.resource for r in results if r.resource is not None]
