"""The API reference (`docs/api-reference.md`), generated from the same schemas as the CRDs."""

from __future__ import annotations

import json
from typing import Any

from crl_operator.crds import PRINTER_COLUMNS
from crl_worker.api import API_VERSION, KINDS
from crl_worker.api.base import CEL_KEY
from crl_worker.api.validation import kind_schema


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    kind = str(node.get("type", "?"))
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {_type(node['additionalProperties'])}"
    if node.get("format") == "date-time":
        return "timestamp (RFC 3339)"
    return kind


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    items = node.get("items", {})
    if "enum" in items:
        parts.append("each one of " + ", ".join(f"`{v}`" for v in items["enum"]))
    for key, sym in (("minimum", "≥"), ("maximum", "≤")):
        if key in node:
            strict = node.get("exclusive" + key.capitalize())
            parts.append(f"{'>' if strict and sym == '≥' else '<' if strict else sym} {node[key]}")
    for key, label in (
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("maxProperties", "max entries"),
    ):
        if key in node:
            parts.append(f"{label} {node[key]}")
    if "pattern" in node and not node.get("x-kubernetes-int-or-string"):
        parts.append(f"pattern `{node['pattern']}`")
    return "; ".join(parts)


def _rules(rules: list[dict[str, str]]) -> list[str]:
    """Markdown bullets for CEL rules: the message, then the expression."""
    return [f"- {r['message']} — `{r['rule']}`" for r in rules]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n\n", "<br><br>").replace("\n", " ")


def _anchor(path: str) -> str:
    return path.lower().replace(".", "").replace("[]", "")


def _shape(node: dict[str, Any]) -> str:
    """Identity of an object type regardless of where it is used (descriptions aside)."""

    def strip(n: Any) -> Any:
        if isinstance(n, dict):
            return {k: strip(v) for k, v in n.items() if k not in ("description", "default")}
        if isinstance(n, list):
            return [strip(x) for x in n]
        return n

    return json.dumps(strip(node), sort_keys=True)


def _object_node(node: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema that gets a section of its own, if `node` leads to one."""
    if node.get("type") == "array":
        node = node.get("items", {})
    if node.get("type") == "object" and node.get("properties"):
        return node
    return None


def _sections(kind: str) -> list[str]:
    schema = kind_schema(kind)
    out: list[str] = []
    seen: dict[str, str] = {}
    queue: list[tuple[str, dict[str, Any]]] = [
        (f"{kind}.spec", schema["properties"]["spec"]),
        (f"{kind}.status", schema["properties"]["status"]),
    ]
    while queue:
        path, node = queue.pop(0)
        seen.setdefault(_shape(node), path)
        lines = [f"### `{path}`", "", _cell(node.get("description", "")), ""]
        required = set(node.get("required", []))
        lines += ["| Field | Type | Default | Description |", "|---|---|---|---|"]
        for name, sub in node["properties"].items():
            desc = sub.get("description", "")
            extra = _constraints(sub)
            obj = _object_node(sub)
            type_text = _type(sub)
            if obj is not None:
                first = seen.get(_shape(obj))
                target = first or f"{path}.{name}"
                type_text = f"[{type_text}](#{_anchor(target)})"
                if first is None:
                    seen[_shape(obj)] = target
                    queue.append((target, obj))
            if "default" not in sub:
                default = ""
            elif isinstance(sub["default"], dict) and sub["default"]:
                default = "its fields' defaults"  # written out whole in the CRD
            else:
                default = f"`{json.dumps(sub['default'])}`"
            req = " **Required.**" if name in required else ""
            more = f" ({extra})" if extra else ""
            lines.append(f"| `{name}` | {type_text} | {default} | {_cell(desc)}{req}{more} |")
        rules = node.get(CEL_KEY, [])
        if rules:
            lines += ["", "Rules:", "", *_rules(rules)]
        out.append("\n".join(lines) + "\n")
    return out


def api_reference() -> str:
    """The whole API reference as Markdown."""
    parts = [
        "# API reference: `coderepair.io/v1alpha1`",
        "",
        "Generated from the models in `worker/src/crl_worker/api` by "
        "`python -m crl_operator.generate`; do not edit. `kubectl explain <kind>.spec` shows the "
        "same descriptions from the installed CRDs.",
        "",
    ]
    for kind in KINDS.values():
        schema = kind_schema(kind.kind)
        parts += [
            f"## {kind.kind}",
            "",
            schema.get("description", ""),
            "",
            f"`apiVersion: {API_VERSION}`, `kind: {kind.kind}`; short name "
            f"`{', '.join(kind.short_names)}`, category `crl`. Printer columns: "
            + ", ".join(c["name"] for c in PRINTER_COLUMNS[kind.kind])
            + ".",
            "",
        ]
        root_rules = schema.get(CEL_KEY, [])
        if root_rules:
            parts += ["Rules on the whole object:", "", *_rules(root_rules), ""]
        parts += _sections(kind.kind)
    return "\n".join(parts)
