"""Model FLOPs of the GPU check (perf/gpu_check.py): generation and GRPO training of a
decoder-only transformer (Qwen2/Llama), counted from its config.

Model FLOPs, padding and flash attention's recomputation left out. A forward pass over ``T``
tokens costs ``2 * N_body * T`` for the linear layers of the blocks (q/k/v/o and the MLP:
``N_body`` weights), ``2 * d * V`` per token whose logits are computed (the last prompt token
and each decoded token when generating; the completion tokens and one more when TRL scores a
sequence), and ``4 * L * H * h_d * c`` per token for attention over its ``c`` context positions
(causal). Generation counts the prefill of each turn's prompt (the whole conversation: the
policy keeps no cache across turns) and one forward per further token. Training counts, per
sample TRL trains on, one forward and a backward of twice the forward with full weights; with
LoRA the backward of the linear layers is one forward (no weight gradients of the frozen base)
and that of attention two; a reference forward is added when ``beta > 0``.

tests/test_train_gpu_check.py checks these counts against torch's own FLOP counter, on the
trainer's policy generating and on a forward and backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Qwen2.5's shapes (their config.json), and a tiny one for the CPU dry run.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
    },
    "1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
    },
}

#: Dense bf16 peak FLOP/s by device name (the vendor's figure without sparsity).
PEAK_FLOPS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989.4e12), ("H200", 989.4e12))


@dataclass(frozen=True)
class Shape:
    """What the FLOPs count needs of a decoder-only model's config."""

    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        """From a config's fields (Qwen2/Llama names)."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            head_dim=int(config.get("head_dim") or hidden // heads),
            kv_heads=int(config["num_key_value_heads"]),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
        )

    @property
    def body_weights(self) -> int:
        """Weights of the blocks' linear layers (q, k, v, o and the gated MLP)."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (q_o + k_v + mlp)


def forward_flops(shape: Shape, start: int, tokens: int, logits: int) -> tuple[float, float]:
    """(linear, attention) FLOPs of a causal forward over ``tokens`` new tokens after ``start``
    cached ones, computing ``logits`` rows of the output layer (module docs)."""
    linear = 2.0 * shape.body_weights * tokens + 2.0 * shape.hidden * shape.vocab * logits
    # Token i (1-based over the whole sequence) attends to i positions.
    end = start + tokens
    positions = (end * (end + 1) - start * (start + 1)) / 2
    attention = 4.0 * shape.layers * shape.heads * shape.head_dim * positions
    return linear, attention


def generation_flops(shape: Shape, prompt: int, generated: int) -> float:
    """One call of the policy: the prompt's prefill (logits of its last token), then one
    forward per token after the first."""
    linear, attention = forward_flops(shape, 0, prompt, 1)
    total = linear + attention
    for index in range(1, generated):
        linear, attention = forward_flops(shape, prompt + index - 1, 1, 1)
        total += linear + attention
    return total


def training_flops(shape: Shape, prompt: int, completion: int, *, lora: bool, beta: float) -> float:
    """One sample TRL trains on: forward and backward (module docs)."""
    # TRL asks for the logits of the completion and the token after it (then drops the last).
    linear, attention = forward_flops(shape, 0, prompt + completion, completion + 1)
    total = (2.0 if lora else 3.0) * linear + 3.0 * attention
    if beta > 0:
        total += linear + attention
    return total


def peak_flops(device_name: str | None, override_tflops: float | None) -> float | None:
    """The device's dense bf16 peak in FLOP/s, ``None`` when unknown."""
    if override_tflops is not None:
        return override_tflops * 1e12
    if device_name is None:
        return None
    for needle, flops in PEAK_FLOPS:
        if needle in device_name:
            return flops
    return None
