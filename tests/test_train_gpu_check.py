"""The GPU check (perf/gpu_check.py) cannot rot: its CPU dry run trains the tiny config with LoRA
and with full weights through the real trainer and writes every figure, and the FLOPs it counts
for MFU are the FLOPs torch counts for the same forward and backward passes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from crl_worker.agent.sampling import Sampling  # noqa: E402
from crl_worker.train import toy  # noqa: E402
from crl_worker.train.local_policy import TransformersPolicy  # noqa: E402

from .fixtures.paths import ROOT, import_file  # noqa: E402
from .fixtures.trainer import env  # noqa: E402

pytestmark = pytest.mark.train

SCRIPT = ROOT / "perf" / "gpu_check.py"

#: What every configuration must report (docs/training.md#gpu-check).
FIGURES = (
    "step_seconds",
    "rollout_seconds",
    "generated_tokens",
    "generated_tokens_per_second",
    "flops_per_step",
    "mfu",
    "update_mfu",
    "peak_memory_gib",
)


def _flops() -> ModuleType:
    """perf/gpu_flops.py, the FLOPs count of the check."""
    return import_file("perf_gpu_flops", ROOT / "perf" / "gpu_flops.py")


def test_the_dry_run_trains_lora_and_full_weights_and_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--peak-tflops", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env(),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert figures["device"] == "cpu" and figures["peak_tflops"] == 1
    configs = {c["name"]: c for c in figures["configs"]}
    assert sorted(configs) == ["tiny-full", "tiny-lora"]
    for config in configs.values():
        assert config["error"] is None
        for name in FIGURES:
            value = config[name]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, value)
        (step,) = config["steps"]
        assert step["generated_tokens"] > 0 and step["loss"] is not None
        assert config["flops_per_step"] == pytest.approx(
            step["generation_flops"] + step["training_flops"]
        )
    lora, full = configs["tiny-lora"], configs["tiny-full"]
    assert 0 < lora["trainable_parameters"] < lora["parameters"]
    assert full["trainable_parameters"] == full["parameters"]
    # The table is printed too.
    assert "tiny-lora" in done.stdout and "MFU" in done.stdout


def _tiny_model() -> tuple[object, object]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    gpu_flops = _flops()
    tokenizer = toy.build_toy_tokenizer()
    config = Qwen2Config(
        **gpu_flops.SHAPES["tiny"],
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(config), tokenizer


def _counted(counter: object) -> tuple[int, int, int]:
    """(linear layers, attention forward, attention backward) FLOPs torch counted."""
    counts = {
        str(op).split(".")[-1]: v
        for op, v in counter.get_flop_counts()["Global"].items()  # type: ignore[attr-defined]
    }
    linear = counts.pop("mm", 0) + counts.pop("addmm", 0)
    backward = sum(counts.pop(op) for op in list(counts) if "attention" in op and "backward" in op)
    forward = sum(counts.pop(op) for op in list(counts) if "attention" in op)
    assert not counts, counts
    return linear, forward, backward


def test_the_flops_counted_for_mfu_are_what_torch_counts() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    gpu_flops = _flops()
    shape = gpu_flops.Shape.of(gpu_flops.SHAPES["tiny"])
    model, tokenizer = _tiny_model()
    per_position = 4 * shape.layers * shape.heads * shape.head_dim

    # Generation, through the policy the trainer uses: the prefill then one pass per token.
    policy = TransformersPolicy(model, tokenizer, name="tiny")
    prompt = policy.render([{"role": "user", "content": "add() subtracts"}], [])
    # A seed whose sample is several tokens long (a seeded call samples the same again).
    sampling = next(
        s
        for s in (Sampling(max_tokens=12, temperature=1.0, top_p=1.0, seed=i) for i in range(50))
        if len(policy.generate(prompt, s).completion_ids) >= 4
    )
    with FlopCounterMode(display=False) as counter:
        sample = policy.generate(prompt, sampling)
    n, p = len(sample.completion_ids), len(prompt)
    assert n >= 4
    linear, attention, _ = _counted(counter)
    expected = gpu_flops.generation_flops(shape, p, n)
    # torch counts the causal prefill's attention over the whole square (the kernel's work);
    # the check counts the causal half (the model's work). Every other FLOP is the same.
    square, causal = per_position * p * p, per_position * p * (p + 1) / 2
    assert linear + attention - square == pytest.approx(expected - causal)
    assert attention - square == sum(per_position * (p + i) for i in range(1, n))

    # Training on one sample with full weights: TRL's forward (the completion's logits and one
    # more), then the backward: twice the forward's linear FLOPs (gradients of the inputs and
    # of the weights) and twice its attention (torch counts 2.5 times: the flash kernel's
    # recomputation of the scores, which model FLOPs leave out).
    ids = torch.tensor([prompt + sample.completion_ids])
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=ids, logits_to_keep=n + 1).logits
        logits.float().logsumexp(-1).sum().backward()
    linear, forward, backward = _counted(counter)
    t = p + n
    square, causal = per_position * t * t, per_position * t * (t + 1) / 2
    assert forward == square and backward == 2.5 * square
    expected = gpu_flops.training_flops(shape, p, n, lora=False, beta=0.0)
    assert expected == pytest.approx(linear + 3 * causal)
