"""The ConfigMap each resource hands its pods: the resolved worker config, and for a TrainingRun
the DeepSpeed and accelerate configs derived from `spec.trainer` (by crl_worker.api.launch, so
the trainer derives the same ones on one machine)."""

from __future__ import annotations

import json
from typing import Any

from crl_operator.builders.meta import COMPONENT_CONFIG, child_name, object_meta, owner_name
from crl_operator.builders.pods import CONFIG_DIR
from crl_worker.api import API_VERSION, AnyResource, TrainingRun
from crl_worker.api.launch import accelerate_config, deepspeed_config
from crl_worker.yamlutil import dump

CONFIG_KEY = "config.yaml"
DEEPSPEED_KEY = "deepspeed.json"
ACCELERATE_KEY = "accelerate.yaml"
#: Paths of the three files inside the worker pods.
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
DEEPSPEED_PATH = f"{CONFIG_DIR}/{DEEPSPEED_KEY}"
ACCELERATE_PATH = f"{CONFIG_DIR}/{ACCELERATE_KEY}"


def config_map_name(resource: AnyResource) -> str:
    """Name of the resource's ConfigMap."""
    return child_name(owner_name(resource), COMPONENT_CONFIG)


def worker_config(resource: AnyResource) -> dict[str, Any]:
    """The resolved worker config: the resource's spec with every default filled in."""
    return {
        "apiVersion": API_VERSION,
        "kind": resource.kind,
        "name": resource.metadata.name,
        "spec": resource.spec.to_wire(),
    }


def config_map(resource: AnyResource, namespace: str) -> dict[str, Any]:
    """The ConfigMap that hands the resolved config (and the trainer's configs) to the pods."""
    data = {CONFIG_KEY: dump(worker_config(resource))}
    if isinstance(resource, TrainingRun):
        data[DEEPSPEED_KEY] = json.dumps(deepspeed_config(resource), indent=2) + "\n"
        data[ACCELERATE_KEY] = dump(accelerate_config(resource, DEEPSPEED_PATH))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(resource, config_map_name(resource), COMPONENT_CONFIG, namespace),
        "data": data,
    }
