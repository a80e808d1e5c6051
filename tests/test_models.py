"""The API models: descriptions, defaults, camelCase, and what the wire format holds."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from crl_worker.api import KINDS, Benchmark, RolloutPool, TrainingRun
from crl_worker.api.base import ApiModel
from crl_worker.api.validation import kind_schema


def _walk(node: dict[str, Any], path: str):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_field_has_a_description(kind: str) -> None:
    schema = kind_schema(kind)
    missing = [
        f"{p}.{name}"
        for p, node in _walk(schema["properties"]["spec"], f"{kind}.spec")
        for name, sub in node.get("properties", {}).items()
        if not sub.get("description")
    ]
    missing += [
        f"{p}.{name}"
        for p, node in _walk(schema["properties"]["status"], f"{kind}.status")
        for name, sub in node.get("properties", {}).items()
        if not sub.get("description")
    ]
    assert missing == []


def _models() -> set[type[ApiModel]]:
    seen: set[type[ApiModel]] = set()
    todo: list[type[ApiModel]] = [k.model for k in KINDS.values()]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for field in model.model_fields.values():
            for arg in _type_args(field.annotation):
                if isinstance(arg, type) and issubclass(arg, ApiModel):
                    todo.append(arg)
    return seen


def _type_args(tp: Any) -> list[Any]:
    out = [tp]
    for arg in getattr(tp, "__args__", ()) or ():
        out.extend(_type_args(arg))
    return out


def test_every_model_and_field_is_documented_in_code() -> None:
    undocumented = [m.__name__ for m in _models() if not (m.__doc__ or "").strip()]
    undocumented += [
        f"{m.__name__}.{name}"
        for m in _models()
        for name, f in m.model_fields.items()
        if not (f.description or "").strip()
    ]
    assert undocumented == []


def test_wire_names_are_camel_case() -> None:
    for kind in KINDS:
        for path, node in _walk(kind_schema(kind), kind):
            for name in node.get("properties", {}):
                assert "_" not in name, f"{path}.{name}"


MINIMAL_RUN = {
    "apiVersion": "coderepair.io/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "r"},
    "spec": {"model": {"name": "m"}, "tasks": {"path": "tasks.jsonl"}},
}


def test_defaults_fill_the_whole_spec() -> None:
    run = TrainingRun.model_validate(MINIMAL_RUN)
    wire = run.spec.to_wire()
    assert wire["algorithm"]["numGenerations"] == 8
    assert wire["trainer"]["deepspeed"] == {
        "zeroStage": 3,
        "offloadOptimizer": "none",
        "offloadParameters": "none",
    }
    assert wire["rollout"]["agent"]["tools"] == ["shell", "view", "edit", "submit"]
    assert wire["checkpoints"]["resumeFrom"] == "latest"
    assert "evaluation" not in wire  # optional objects stay absent
    # The wire form validates back to the same model.
    again = TrainingRun.model_validate({**MINIMAL_RUN, "spec": wire}, by_name=False)
    assert again == run


def test_snake_case_keys_are_unknown_on_the_wire() -> None:
    doc = {**MINIMAL_RUN, "spec": {**MINIMAL_RUN["spec"], "weight_sync": "nccl"}}
    with pytest.raises(ValidationError) as info:
        TrainingRun.model_validate(doc, by_name=False)
    assert info.value.errors()[0]["type"] == "extra_forbidden"


def test_each_kind_has_its_own_literal() -> None:
    pool = {
        "apiVersion": "coderepair.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": "p"},
        "spec": {"tasks": {"path": "t.jsonl"}},
    }
    assert RolloutPool.model_validate(pool).spec.replicas == 4
    with pytest.raises(ValidationError):
        Benchmark.model_validate(pool)


def _fits(value: Any, node: dict[str, Any], path: str) -> list[str]:
    """Where `value` breaks `node` (types, enums, bounds, required fields, unknown keys)."""
    kind = node.get("type")
    if "enum" in node and value not in node["enum"]:
        return [f"{path}: {value!r} not in enum"]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        props = node.get("properties")
        bad = [f"{path}.{r}: required" for r in node.get("required", []) if r not in value]
        for k, v in value.items():
            if props is not None and k not in props:
                bad.append(f"{path}.{k}: unknown")
            sub = props[k] if props is not None and k in props else node.get("additionalProperties")
            if isinstance(sub, dict):
                bad += _fits(v, sub, f"{path}.{k}")
        return bad
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [e for i, v in enumerate(value) for e in _fits(v, node["items"], f"{path}[{i}]")]
    expected = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    if kind in expected and not isinstance(value, expected[kind]):
        return [f"{path}: {value!r} is not {kind}"]
    if kind in ("integer", "number") and not (
        node.get("minimum", value) <= value <= node.get("maximum", value)
    ):
        return [f"{path}: {value!r} out of bounds"]
    return []


def test_schema_defaults_are_valid_values() -> None:
    """Every `default` the CRD carries must fit its own schema (the API server checks)."""
    bad: list[str] = []
    count = 0
    for kind in KINDS:
        for path, node in _walk(kind_schema(kind), kind):
            if "default" in node:
                count += 1
                bad += _fits(node["default"], node, path)
    assert bad == []
    assert count > 50


def test_the_defaults_check_can_fail() -> None:
    node = {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "integer", "maximum": 3}},
    }
    assert _fits({"a": 5}, node, "x") == ["x.a: 5 out of bounds"]
    assert _fits({}, node, "x") == ["x.a: required"]
    assert _fits({"a": 1, "b": 2}, node, "x") == ["x.b: unknown"]
