"""The trainer's LoRA weight sync against a real vLLM (the session's ``vllm`` fixture): adapters
loaded, served and unloaded through ``LoraAdapterSync`` (``/v1/load_lora_adapter``), the served
logprobs compared with PEFT's on the same adapter, and a server restart healed.

The adapters are PEFT's own (the trainer's format), with random non-zero ``lora_B`` so that an
adapter changes the model's output measurably; the comparison shows which weights served a
request: the adapter's (the gap is float noise) or the base model's (the gap is the adapter's
effect).

This file runs after tests/test_vllm_real.py (pytest's file order): its last test restarts the
shared server.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from crl_worker.train import toy
from crl_worker.train.weights import AdapterUpdate, LoraAdapterSync
from tests.fixtures.lora_run import RUN, SUBPROCESS_ENV, write_run
from tests.fixtures.vllm import VllmServer, write_adapter

log = logging.getLogger(__name__)

#: Bound on |server - PEFT| per sampled token (float32 both sides; measured: about 1e-6).
GAP_BOUND = 1e-4
#: The adapter's effect must stand out of the noise by far (measured: above 0.1).
EFFECT_FLOOR = 1e-2


def peft_model(model_dir: str, adapter: Path) -> Any:
    """The base model with ``adapter`` in PEFT (the trainer's view)."""
    import peft
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    return peft.PeftModel.from_pretrained(base, adapter).eval()


def served_sample(vllm: VllmServer, model: str) -> tuple[list[int], list[int], list[float]]:
    """One chat completion from ``model``: prompt ids, completion ids, their logprobs."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "fix the bug"}],
        "max_tokens": 24,
        "temperature": 1.0,
        "logprobs": True,
        "return_token_ids": True,
        "seed": 7,
    }
    answer = httpx.post(f"{vllm.base_url}/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    [choice] = data["choices"]
    logprobs = [float(c["logprob"]) for c in choice["logprobs"]["content"]]
    return data["prompt_token_ids"], choice["token_ids"], logprobs


def reference_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    picked = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt) :, None])
    return [float(x) for x in picked[:, 0]]


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def models(vllm: VllmServer) -> list[str]:
    return [c["id"] for c in httpx.get(f"{vllm.base_url}/models", timeout=10).json()["data"]]


@pytest.fixture(scope="module")
def adapters(vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two adapters of different weights (policy versions 1 and 2)."""
    root = tmp_path_factory.mktemp("adapters")
    return [write_adapter(vllm.model, root / f"v{v}", seed=v) for v in (1, 2)]


async def test_each_version_is_loaded_served_with_its_own_weights_and_unloaded(
    vllm: VllmServer, adapters: list[Path]
) -> None:
    sync = LoraAdapterSync(vllm.base_url, vllm.served_name, "real", keep=1)
    try:
        for version, adapter in enumerate(adapters, start=1):
            await sync.push(AdapterUpdate(version=version, adapter_dir=adapter))
            name = sync.model_name()
            assert name == f"real-v{version}"
            # keep = 1: the previous version is unloaded once the new one is live.
            assert models(vllm) == [vllm.served_name, name]
            prompt, completion, served = served_sample(vllm, name)
            adapted = peft_model(vllm.model, adapter)
            ours = reference_logprobs(adapted, prompt, completion)
            with adapted.disable_adapter():
                base = reference_logprobs(adapted, prompt, completion)
            log.info(
                "version %d: |server - PEFT| max %.2e; adapter's effect max %.2e",
                version,
                gap(served, ours),
                gap(served, base),
            )
            assert gap(served, ours) < GAP_BOUND
            assert gap(served, base) > EFFECT_FLOOR  # the adapter, not the base, served it
    finally:
        await sync.aclose()


def test_lora_training_steps_are_served_with_the_trainers_own_logprobs(
    vllm: VllmServer, tmp_path: Path
) -> None:
    # `crl train --url` as the trainer pod runs it, three steps, the adapter pushed after each.
    # A graded reward (diff similarity) so that the adapter moves from the first step on.
    suite = toy.build_toy_suite(tmp_path / "suite")
    config = write_run(tmp_path, Path(vllm.model), suite, max_staleness=0, checkpoint_every=1)
    manifest = yaml.safe_load(config.read_text())
    manifest["spec"]["rollout"]["reward"] = {"type": "diff-similarity"}
    config.write_text(yaml.safe_dump(manifest, sort_keys=False))
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "crl_worker.train", "--config", str(config)),
            *("--output", str(out), "--url", vllm.base_url, "--model", vllm.served_name),
        ],
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["policy_version"] for m in metrics] == [0, 1, 2]
    assert f"{RUN}-v2" in models(vllm)
    from safetensors.torch import load_file

    moved = load_file(out / "checkpoint-2" / "adapter_model.safetensors")
    assert max(float(v.abs().max()) for k, v in moved.items() if "lora_B" in k) > 1e-4
    for m in metrics:
        mean = m["trl"]["sampling/sampling_logp_difference/mean"]
        worst = m["trl"]["sampling/sampling_logp_difference/max"]
        log.info(
            "step at version %d: trainer vs server logprob gap mean %.2e max %.2e",
            m["policy_version"],
            mean,
            worst,
        )
        # Float noise with the adapter served (LoRA dropout 0, the default): with dropout 0.05
        # the same run measures 7e-4 to 2e-3 mean from the second step on.
        assert worst < 1e-5


async def test_a_restarted_server_gets_the_current_adapter_back(
    vllm: VllmServer, adapters: list[Path]
) -> None:
    sync = LoraAdapterSync(vllm.base_url, vllm.served_name, "healed", keep=1)
    try:
        await sync.push(AdapterUpdate(version=1, adapter_dir=adapters[0]))
        assert not await sync.ensure_loaded()  # nothing lost yet
        vllm.restart()
        assert "healed-v1" not in models(vllm)
        assert await sync.ensure_loaded()
        assert "healed-v1" in models(vllm)
        prompt, completion, served = served_sample(vllm, "healed-v1")
        ours = reference_logprobs(peft_model(vllm.model, adapters[0]), prompt, completion)
        assert gap(served, ours) < GAP_BOUND
    finally:
        await sync.aclose()
