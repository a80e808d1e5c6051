"""Building blocks shared by the three custom resources.

Every model here is a piece of the wire format: camelCase keys, unknown keys rejected, each field
documented by its attribute docstring (which becomes the CRD's `description` and therefore what
`kubectl explain` shows). Cross-field rules are written once, in CEL, and attached to the model's
JSON schema; the API server evaluates them on admission and `crl validate` evaluates the same
expressions offline.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

GROUP = "coderepair.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

CEL_KEY = "x-kubernetes-validations"


def cel(
    rule: str, message: str, *, field_path: str | None = None, reason: str | None = None
) -> dict[str, str]:
    """Return one CEL validation rule in the CRD's `x-kubernetes-validations` shape.

    `message` is what a user sees when the rule fails: say what is wrong and what is allowed.
    `field_path` (e.g. `.numGenerations`) points the error at the field to fix rather than at
    the object that holds the rule.
    """
    out = {"rule": rule, "message": message}
    if field_path is not None:
        out["fieldPath"] = field_path
    if reason is not None:
        out["reason"] = reason
    return out


def with_rules(*rules: dict[str, str]) -> dict[str, Any]:
    """JSON-schema extras that attach CEL rules to a model or a field."""
    return {CEL_KEY: list(rules)}


class ApiModel(BaseModel):
    """Base of every spec and status model: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        use_attribute_docstrings=True,
        protected_namespaces=(),
        validate_default=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """Serialize as the API server stores it: camelCase keys, defaults filled, nulls omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- constrained scalars ------------------------------------------------------------------

DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

#: The name of an object in the same namespace (a DNS-1123 subdomain).
ObjectName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)
]
#: A DNS-1035 label: names that become Service names.
DnsLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS1035_LABEL)]
#: A DNS-1123 label: Kueue queue names, container-port names and the like.
LabelName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS1123_LABEL)]
#: A container image reference.
Image = Annotated[str, StringConstraints(min_length=1, max_length=512)]
#: A filesystem path.
Path = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
#: A short free-form string (label values, keys, reasons).
Short = Annotated[str, StringConstraints(max_length=256)]
#: A longer free-form string (messages, URLs).
Text = Annotated[str, StringConstraints(max_length=32768)]


def _quantity(value: Any) -> int | str:
    """Accept what Kubernetes accepts as a quantity: an integer or a string like ``16Gi``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and len(value) <= 64 and re.fullmatch(QUANTITY, value):
        return value
    raise ValueError("must be a Kubernetes quantity: an integer or a string such as 500m, 4, 16Gi")


_SUFFIXES = {
    **{
        suffix: Decimal(1024) ** power
        for power, suffix in enumerate(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"], 1)
    },
    **{suffix: Decimal(1000) ** power for power, suffix in enumerate("kMGTPE", 1)},
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
}


def quantity_value(quantity: int | str) -> Decimal:
    """The number a Kubernetes quantity stands for (``500m`` is 0.5, ``1Gi`` is 2**30)."""
    if isinstance(quantity, int):
        return Decimal(quantity)
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9.]+)?)([KMGTPE]i|[numkMGTPE])?", quantity)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    return Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""]


#: A Kubernetes resource quantity: an integer, or a string such as `500m`, `16Gi`.
Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


class ResourceRequirements(ApiModel):
    """Compute resources of a container, as in a pod spec."""

    requests: dict[str, Quantity] | None = Field(default=None, max_length=16)
    """Minimum resources the scheduler reserves, e.g. `{cpu: "4", memory: 16Gi}`."""
    limits: dict[str, Quantity] | None = Field(default=None, max_length=16)
    """Maximum resources, e.g. `{nvidia.com/gpu: 8}`; GPUs are set from the GPU counts."""


class Toleration(ApiModel):
    """A pod toleration, as in a pod spec."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "a toleration with operator Exists matches every value: leave value empty",
                field_path=".value",
            ),
        )
    )

    key: Short | None = None
    """The taint key the toleration applies to; empty matches all keys."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """`Exists` matches any value; `Equal` matches `value`."""
    value: Short | None = None
    """The taint value to match when the operator is `Equal`."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect to match; empty matches all effects."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """How long a `NoExecute` taint is tolerated before eviction."""


class Placement(ApiModel):
    """Where the pods of a component may run."""

    node_selector: dict[str, Short] | None = Field(default=None, max_length=32)
    """Node labels the pods require, e.g. `{nvidia.com/gpu.product: H100-SXM}`."""
    tolerations: list[Toleration] | None = Field(default=None, max_length=32)
    """Taints the pods tolerate (GPU nodes are often tainted)."""


class VolumeSource(ApiModel):
    """A directory on a PersistentVolumeClaim."""

    claim_name: ObjectName
    """Name of the PersistentVolumeClaim in the resource's namespace."""
    sub_path: Path | None = None
    """Directory inside the volume; the volume's root when empty."""


class SecretKeyRef(ApiModel):
    """A key of a Secret in the resource's namespace."""

    name: ObjectName
    """Name of the Secret."""
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = "api-key"
    """Key inside the Secret."""


class LocalObjectReference(ApiModel):
    """A reference to another object of the same namespace, by name."""

    name: ObjectName
    """Name of the referenced object."""


class EnvVar(ApiModel):
    """An environment variable for a container."""

    name: Annotated[
        str,
        StringConstraints(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"),
    ]
    """Variable name."""
    value: Text = ""
    """Variable value."""


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """One aspect of the resource's state, in the Kubernetes convention."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=316)]
    """Condition type in CamelCase, e.g. `Ready` or `InferenceReady`."""
    status: ConditionStatus
    """`True`, `False` or `Unknown`."""
    reason: Annotated[
        str,
        StringConstraints(
            min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
        ),
    ]
    """Machine-readable reason for the last transition, in CamelCase."""
    message: Text = ""
    """Human-readable details of the last transition."""
    last_transition_time: datetime
    """When the status last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The `metadata.generation` this condition was computed from."""


_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _check_key(key: str) -> str:
    """A label or annotation key: an optional DNS-subdomain prefix and `/`, then a name."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not re.fullmatch(DNS1123_SUBDOMAIN, prefix)):
        raise ValueError(f"key {key!r}: the prefix before '/' must be a lowercase DNS subdomain")
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        raise ValueError(
            f"key {key!r}: the name must be 1-63 characters of A-Z, a-z, 0-9, '-', '_' and '.',"
            " starting and ending with a letter or digit"
        )
    return key


def _check_labels(labels: dict[str, str] | None) -> dict[str, str] | None:
    for key, value in (labels or {}).items():
        _check_key(key)
        if len(value) > 63 or (value and not _LABEL_NAME.match(value)):
            raise ValueError(
                f"label {key}={value!r}: a value must be at most 63 characters of A-Z, a-z, 0-9,"
                " '-', '_' and '.', starting and ending with a letter or digit (or be empty)"
            )
    return labels


def _check_annotations(annotations: dict[str, str] | None) -> dict[str, str] | None:
    for key in annotations or {}:
        _check_key(key)
    return annotations


class ObjectMeta(BaseModel):
    """The part of `metadata` that offline validation checks; other keys are passed through."""

    model_config = ConfigDict(extra="allow", validate_by_alias=True, validate_by_name=True)

    name: DnsLabel | None = None
    """Name of the resource, unique in its namespace. A DNS-1035 label: child Services and label
    values are derived from it."""
    generate_name: (
        Annotated[str, StringConstraints(max_length=58, pattern=r"^[a-z]([-a-z0-9]*)?$")] | None
    ) = Field(default=None, alias="generateName")
    """Prefix for a name the server generates."""
    namespace: LabelName | None = None
    """Namespace of the resource."""
    labels: Annotated[dict[str, str] | None, AfterValidator(_check_labels)] = None
    """Labels."""
    annotations: Annotated[dict[str, str] | None, AfterValidator(_check_annotations)] = None
    """Annotations."""
