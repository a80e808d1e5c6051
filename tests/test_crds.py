"""The generated CRDs: structural per Kubernetes' rules, complete, and in step with the models.

A real API server loads them in the control-plane tests; `test_crdcheck.py` runs the
apiextensions validation code itself. This file checks the rules in Python so a mistake is
caught in a second, with the offending path named.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from crl_operator.crds import crd, crd_files
from crl_operator.generate import generated_files, stale_files
from crl_worker.api import KINDS
from crl_worker.api.base import CEL_KEY

ALLOWED_KEYS = {
    "description", "type", "format", "nullable", "default", "enum", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems",
    "maxItems", "minProperties", "maxProperties", "anyOf", "required", "properties",
    "additionalProperties", "items", "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type", CEL_KEY,
}  # fmt: skip
FORMATS = {"int32", "int64", "float", "double", "byte", "date-time", "date"}
SCALARS = {"string", "integer", "number", "boolean"}


def structural_violations(node: Any, path: str) -> list[str]:
    """The ways `node` breaks Kubernetes' structural-schema rules (empty when it is structural)."""
    bad: list[str] = []
    if not isinstance(node, dict):
        return [f"{path}: a schema node must be a mapping"]
    for key in node:
        if key not in ALLOWED_KEYS:
            bad.append(f"{path}: keyword {key!r} is not allowed in a CRD schema")
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    if (
        "type" not in node
        and not int_or_string
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        bad.append(f"{path}: no type")
    if node.get("type") not in (None, "object", "array", *SCALARS):
        bad.append(f"{path}: unknown type {node.get('type')!r}")
    if "anyOf" in node and (
        not int_or_string or node["anyOf"] != [{"type": "integer"}, {"type": "string"}]
    ):
        bad.append(f"{path}: anyOf is only allowed as the int-or-string pattern")
    if "format" in node and node["format"] not in FORMATS:
        bad.append(f"{path}: format {node['format']!r} unknown to Kubernetes")
    if node.get("type") == "integer" and node.get("format") not in ("int32", "int64"):
        bad.append(f"{path}: integer without int32/int64 format")
    if node.get("type") == "number" and node.get("format") not in ("float", "double"):
        bad.append(f"{path}: number without float/double format")
    if "properties" in node and "additionalProperties" in node:
        bad.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if node.get("additionalProperties") is False or node.get("additionalProperties") is True:
        bad.append(f"{path}: boolean additionalProperties")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            bad.append(f"{path}: {key} must be a boolean in OpenAPI v3.0")
    if "enum" in node and len(node["enum"]) == 0:
        bad.append(f"{path}: empty enum")
    for req in node.get("required", []):
        if req not in node.get("properties", {}):
            bad.append(f"{path}: required field {req!r} is not a property")
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None and node.get("type") != "array":
        bad.append(f"{path}: list type on a non-array")
    if list_type == "set" and node.get("items", {}).get("type") not in SCALARS:
        bad.append(f"{path}: a set needs scalar items")
    if list_type == "map":
        items = node.get("items", {})
        for key in node.get("x-kubernetes-list-map-keys", []):
            if (
                key not in items.get("required", [])
                or items["properties"][key].get("type") not in SCALARS
            ):
                bad.append(f"{path}: list-map key {key!r} must be a required scalar of the items")
    for name, sub in node.get("properties", {}).items():
        bad += structural_violations(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        bad += structural_violations(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        bad += structural_violations(node["items"], f"{path}[]")
    for rule in node.get(CEL_KEY, []):
        if set(rule) - {
            "rule",
            "message",
            "messageExpression",
            "reason",
            "fieldPath",
            "optionalOldSelf",
        }:
            bad.append(f"{path}: unknown key in a validation rule: {rule}")
        if not rule.get("message"):
            bad.append(f"{path}: a rule without a message: {rule['rule']}")
    return bad


@pytest.mark.parametrize("kind", list(KINDS))
def test_schema_is_structural(kind: str) -> None:
    schema = crd(KINDS[kind])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["type"] == "object"
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert structural_violations(schema, kind) == []


def test_the_checker_catches_what_it_should() -> None:
    """The structural checker is itself tested on schemas that break each rule."""
    cases = {
        "no type": {"properties": {"a": {"type": "string"}}},
        "keyword '$ref'": {"type": "object", "$ref": "#/x"},
        "keyword 'const'": {"type": "string", "const": "a"},
        "anyOf is only": {"type": "string", "anyOf": [{"type": "string"}, {"type": "null"}]},
        "boolean additionalProperties": {"type": "object", "additionalProperties": False},
        "integer without": {"type": "integer"},
        "must be a boolean": {"type": "integer", "format": "int32", "exclusiveMinimum": 0},
        "a set needs scalar items": {
            "type": "array", "x-kubernetes-list-type": "set", "items": {"type": "object"}
        },
    }  # fmt: skip
    for expected, schema in cases.items():
        found = structural_violations(schema, "x")
        assert any(expected in v for v in found), (expected, found)


def _rules(node: dict[str, Any], path: str):
    for rule in node.get(CEL_KEY, []):
        yield path, node, rule
    for name, sub in node.get("properties", {}).items():
        yield from _rules(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _rules(node[key], f"{path}[]")


@pytest.mark.parametrize("kind", list(KINDS))
def test_cel_rules_compile_and_point_at_real_fields(kind: str) -> None:
    schema = crd(KINDS[kind])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    env = celpy.Environment()
    count = reads = 0
    for path, node, rule in _rules(schema, kind):
        env.compile(rule["rule"])  # raises on a syntax error
        count += 1
        if "fieldPath" in rule:
            target = node
            for name in rule["fieldPath"].lstrip(".").split("."):
                if target is schema["properties"]["metadata"]:
                    assert name in ("name", "generateName"), rule  # what CEL may read
                    break
                assert name in target["properties"], f"{path}: {rule['fieldPath']} is no field"
                target = target["properties"][name]
        # Every field a rule reads (self.a.b, oldSelf.a.b) must exist -- catches renamed fields.
        for match in re.finditer(r"\b(?:self|oldSelf)((?:\.[A-Za-z_]\w*)+)", rule["rule"]):
            target = node
            for name in match.group(1).lstrip(".").split("."):
                if target.get("type") != "object" or "properties" not in target:
                    break  # a method of a list or string (.all, .size), or metadata
                assert name in target["properties"], f"{path}: {rule['rule']} reads {name}"
                target = target["properties"][name]
            reads += 1
    assert count >= 2
    assert reads >= count


def test_crd_metadata() -> None:
    run, pool, bench = (crd(KINDS[k]) for k in ("TrainingRun", "RolloutPool", "Benchmark"))
    assert run["metadata"]["name"] == "trainingruns.coderepair.io"
    assert [c["spec"]["names"]["shortNames"] for c in (run, pool, bench)] == [
        ["trun"],
        ["rpool"],
        ["bench"],
    ]
    assert all(c["spec"]["names"]["categories"] == ["crl"] for c in (run, pool, bench))
    for c in (run, pool, bench):
        version = c["spec"]["versions"][0]
        assert version["subresources"]["status"] == {}
        assert {col["name"] for col in version["additionalPrinterColumns"]} >= {"Age"}
    scale = pool["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "scale" not in run["spec"]["versions"][0]["subresources"]
    columns = {c["name"] for c in run["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Ready", "Reason", "Step", "Reward"} <= columns
    columns = {c["name"] for c in pool["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Ready", "Leased", "Desired"} <= columns
    columns = {c["name"] for c in bench["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Progress", "Resolve rate"} <= columns


def test_printer_columns_point_at_schema_fields() -> None:
    for kind in KINDS.values():
        version = crd(kind)["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        for column in version["additionalPrinterColumns"]:
            path = re.sub(r"\[\?\(.*?\)\]", "[]", column["jsonPath"])
            if path.startswith(".metadata"):
                continue
            node = schema
            for part in path.lstrip(".").split("."):
                name = part.split("[")[0]
                node = node["properties"][name]
                if "[" in part:
                    node = node["items"]
            if "[" not in path:
                assert node["type"] == column["type"], column


def test_preserve_unknown_fields_only_where_free_form() -> None:
    text = "".join(crd_files().values())
    # The one free-form field is DeepSpeed's config overrides (in TrainingRun only).
    assert text.count("x-kubernetes-preserve-unknown-fields") == 1


def test_committed_files_match_the_generator(root: Path) -> None:
    stale = stale_files(root)
    assert stale == [], "run: python -m crl_operator.generate"


def test_chart_crds_come_from_the_same_source(root: Path) -> None:
    files = generated_files(root)
    for name in crd_files():
        assert files[root / "crds" / name] == files[root / "charts/coderepairrl/crds" / name]


def test_crd_files_are_plain_yaml(root: Path) -> None:
    for path in (root / "crds").glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["kind"] == "CustomResourceDefinition"
