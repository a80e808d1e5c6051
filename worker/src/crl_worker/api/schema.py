"""Turn the pydantic models into structural OpenAPI v3 schemas that a Kubernetes API server accepts.

Pydantic emits JSON Schema 2020-12; a CRD needs OpenAPI v3 in Kubernetes' structural dialect:
no ``$ref``, no unions with ``null`` (see below), one-value ``enum`` instead of
``const``, boolean ``exclusiveMinimum``, integer and number formats, no
``additionalProperties: false`` (pruning already drops unknown fields), and a ``type`` on every
node except int-or-string and free-form ones. Anything else the generator meets is an error, so a
new pydantic construct cannot slip an unstructural schema into the CRDs unnoticed.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

from crl_worker.api.base import CEL_KEY

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# Keywords a structural schema node may carry, in the order they are written out.
_KEY_ORDER = (
    "description",
    "type",
    "format",
    "nullable",
    "default",
    "enum",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "anyOf",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    CEL_KEY,
)
_KEEP_FORMATS = {"int32", "int64", "float", "double", "byte", "date-time", "date"}
# Pydantic metadata that has no place in a CRD.
_DROP = {"title", "$defs", "examples"}


class SchemaError(ValueError):
    """The models produced a JSON schema the generator cannot make structural."""


class _DefaultFactorySchema(GenerateJsonSchema):
    """Also emit defaults produced by ``default_factory``.

    A nested object's default is written out whole. ``default: {}`` would be shorter, but the
    API server validates a default as written -- without the defaults of its fields -- so a
    CEL rule such as ``self.gpus % self.tensorParallelSize == 0`` fails on ``{}`` and the CRD
    is rejected.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        """Return the static default, or the factory's value for a no-argument factory."""
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().get_default_value(schema)
        value = factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", by_alias=True, exclude_none=True)
        return value if value is not None else NoDefault


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline every ``$ref`` (pydantic writes a sibling description next to a ref)."""
    if isinstance(node, list):
        return [_resolve(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        node = {**inner, **node}
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        if name not in defs:
            raise SchemaError(f"unresolvable $ref {name!r}")
        target = dict(defs[name])
        # The field's own description (and default) win over the model's docstring.
        node = {**target, **node}
    return {k: _resolve(v, defs) for k, v in node.items()}


def _one_line(text: str) -> str:
    """Collapse a docstring into one paragraph per blank-line-separated block."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _structural(node: dict[str, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "anyOf" in node:
        # `X | None` becomes plain X. The API server prunes a null given for a non-nullable
        # field, so `x: null` means "absent", as None means "absent" to the models; with
        # `nullable: true` a stored null would be present to CEL's has() and break the rules.
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if node.get("x-kubernetes-int-or-string"):
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            node = rest
        elif len(variants) == 1:
            node = {**variants[0], **rest}
        else:
            raise SchemaError(f"{path}: unions other than `X | None` cannot be structural")
    if node.get("default", 0) is None:
        node = {k: v for k, v in node.items() if k != "default"}

    if "const" in node:
        node = dict(node)
        node["enum"] = [node.pop("const")]

    if "enum" in node and "type" not in node:
        values = node["enum"]
        if all(isinstance(v, str) for v in values):
            node = {**node, "type": "string"}
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            node = {**node, "type": "integer"}
        else:
            raise SchemaError(f"{path}: enum of mixed types")

    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "description":
            out[key] = _one_line(value)
        elif key == "properties":
            out[key] = {name: _structural(sub, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value, f"{path}[]")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _structural(value, f"{path}.*")
            # `false` comes from extra="forbid" and `true` from dict[str, Any]: pruning and
            # x-kubernetes-preserve-unknown-fields say the same in Kubernetes' terms.
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "format":
            if value in _KEEP_FORMATS:
                out[key] = value
        elif key in _KEY_ORDER:
            out[key] = value
        else:
            raise SchemaError(f"{path}: JSON-schema keyword {key!r} has no structural equivalent")

    kind = out.get("type")
    if kind == "integer" and "format" not in out:
        # int32 only when both bounds fit: the API server enforces the format's range.
        lo, hi = out.get("minimum"), out.get("maximum")
        fits = lo is not None and hi is not None and lo >= INT32_MIN and hi <= INT32_MAX
        out["format"] = "int32" if fits else "int64"
    elif kind == "number" and "format" not in out:
        out["format"] = "double"
    if "type" not in out and not (
        out.get("x-kubernetes-int-or-string") or out.get("x-kubernetes-preserve-unknown-fields")
    ):
        raise SchemaError(f"{path}: every node of a structural schema needs a type")
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"
    return {k: out[k] for k in _KEY_ORDER if k in out}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Return the structural OpenAPI v3 schema of ``model`` as a plain dict."""
    raw = model.model_json_schema(
        by_alias=True, mode="validation", schema_generator=_DefaultFactorySchema
    )
    defs = raw.pop("$defs", {})
    resolved = _resolve(raw, defs)
    return _structural(resolved, model.__name__)


def resource_schema(
    resource: type[BaseModel], spec: type[BaseModel], status: type[BaseModel]
) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of a whole custom resource, root-level CEL rules included."""
    root: dict[str, Any] = {
        "description": _one_line(resource.__doc__ or ""),
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation"
                " of an object.",
                "type": "string",
            },
            "kind": {
                "description": "Kind is a string value representing the REST resource this"
                " object represents.",
                "type": "string",
            },
            "metadata": {"type": "object"},
            "spec": structural_schema(spec),
            "status": structural_schema(status),
        },
    }
    rules = model_rules(resource)
    if rules:
        root[CEL_KEY] = rules
    return root


def model_rules(model: type[BaseModel]) -> list[dict[str, str]]:
    """The CEL rules attached to ``model`` itself (not to its fields)."""
    extra = model.model_config.get("json_schema_extra")
    if isinstance(extra, dict):
        rules = extra.get(CEL_KEY, [])
        if isinstance(rules, list):
            return [{k: str(v) for k, v in r.items()} for r in rules if isinstance(r, dict)]
    return []
