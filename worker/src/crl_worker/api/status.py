"""Status pieces shared by the three custom resources."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from crl_worker.api.base import ApiModel, Condition

#: Conditions are a map keyed by `type` so server-side apply merges them per type.
CONDITIONS_LIST: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


class CommonStatus(ApiModel):
    """Fields every status carries."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The `metadata.generation` the operator last reconciled."""
    conditions: list[Condition] | None = Field(
        default=None, max_length=32, json_schema_extra=CONDITIONS_LIST
    )
    """Current state in the Kubernetes convention; `Ready` summarizes the others."""
