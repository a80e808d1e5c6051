"""CustomResourceDefinitions generated from the API models (the single source of the schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crl_worker.api import GROUP, KINDS, VERSION, Kind
from crl_worker.api.validation import kind_schema
from crl_worker.yamlutil import dump

CATEGORY = "crl"
PART_OF = "coderepairrl"


def _ready(field: str) -> str:
    return f'.status.conditions[?(@.type=="Ready")].{field}'


def _age() -> dict[str, Any]:
    return {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "TrainingRun": [
        {"name": "Ready", "type": "string", "jsonPath": _ready("status")},
        {"name": "Reason", "type": "string", "jsonPath": _ready("reason")},
        {"name": "Admission", "type": "string", "jsonPath": ".status.queue.state"},
        {"name": "Queue", "type": "string", "jsonPath": ".status.queue.name"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
        {"name": "Validated", "type": "integer", "jsonPath": ".status.validation.validated"},
        {"name": "Quarantined", "type": "integer", "jsonPath": ".status.validation.quarantined"},
        {"name": "Reward", "type": "number", "jsonPath": ".status.metrics.rewardMean"},
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "priority": 1},
        {
            "name": "Resolve rate",
            "type": "number",
            "priority": 1,
            "jsonPath": ".status.metrics.resolveRate",
        },
        _age(),
    ],
    "RolloutPool": [
        {"name": "Ready", "type": "integer", "jsonPath": ".status.ready"},
        {"name": "Leased", "type": "integer", "jsonPath": ".status.leased"},
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Validated", "type": "integer", "jsonPath": ".status.validation.validated"},
        {"name": "Quarantined", "type": "integer", "jsonPath": ".status.validation.quarantined"},
        {"name": "Max", "type": "integer", "jsonPath": ".spec.maxSandboxes", "priority": 1},
        {"name": "Hit ratio", "type": "number", "jsonPath": ".status.hitRatio", "priority": 1},
        _age(),
    ],
    "Benchmark": [
        {"name": "Suite", "type": "string", "jsonPath": ".spec.suite.name"},
        {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary"},
        {"name": "Admission", "type": "string", "jsonPath": ".status.queue.state"},
        {"name": "Queue", "type": "string", "jsonPath": ".status.queue.name", "priority": 1},
        {"name": "Resolve rate", "type": "number", "jsonPath": ".status.resolveRate"},
        {"name": "Quarantined", "type": "integer", "jsonPath": ".status.validation.quarantined"},
        {"name": "Ready", "type": "string", "jsonPath": _ready("status"), "priority": 1},
        {"name": "Reason", "type": "string", "jsonPath": _ready("reason"), "priority": 1},
        _age(),
    ],
}


def _subresources(kind: str) -> dict[str, Any]:
    sub: dict[str, Any] = {"status": {}}
    if kind == "RolloutPool":
        sub["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return sub


def crd(kind: Kind) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": PART_OF},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": _subresources(kind.kind),
                    "additionalPrinterColumns": PRINTER_COLUMNS[kind.kind],
                    "schema": {"openAPIV3Schema": kind_schema(kind.kind)},
                }
            ],
        },
    }


HEADER = "# Generated from the models in worker/src/crl_worker/api by `crl crds`. Do not edit.\n"


def crd_yaml(kind: Kind) -> str:
    """One CRD as a YAML document, with the generated-file header."""
    body = dump(crd(kind))
    return HEADER + body


def crd_files() -> dict[str, str]:
    """File name -> content for every CRD (what ``crds/`` and the chart's ``crds/`` hold)."""
    return {f"{GROUP}_{k.plural}.yaml": crd_yaml(k) for k in KINDS.values()}


def all_crds_yaml() -> str:
    """Every CRD as one multi-document YAML stream."""
    return "---\n".join(crd_files().values())


def write_crds(directory: Path) -> list[Path]:
    """Write the CRD files into ``directory``; return the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in crd_files().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
