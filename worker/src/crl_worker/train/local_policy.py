"""In-process generation: a :class:`~crl_worker.agent.client.Policy` that samples from a
transformers model in this process, for ``crl train`` without a vLLM server and the CPU tests.

It answers a chat turn the way vLLM's OpenAI server does, so the agent loop cannot tell the two
apart: the conversation is rendered with the tokenizer's chat template (``tools`` passed in,
generation prompt added), tokens are sampled one at a time with a KV cache (temperature, top-p)
until an end-of-sequence token or ``max_tokens``, and the answer comes back with the exact prompt
and completion token ids (the end-of-sequence token included, as vLLM returns it), one logprob
per sampled token, and tool calls parsed from Hermes/Qwen ``<tool_call>{json}</tool_call>``
blocks.

Logprobs: ``log_softmax(logits / T)`` of the sampled token over the whole vocabulary — the
model's own distribution at the sampling temperature, which is what the trainer recomputes from
the same weights (so on-policy the two agree exactly). Tokens the policy never samples (see
below) are removed from the sampling distribution only, and top-p truncation likewise; the
logprob is not renormalized for either. With ``temperature == 0`` the most likely token is taken
and its logprob is given at temperature 1.

Never sampled: the tokenizer's special tokens other than the end-of-sequence tokens (``<unk>``,
padding, ``<|im_start|>``, role markers: a model that emits them would corrupt the next prompt)
and ids beyond the tokenizer's vocabulary (the padded rows of an embedding matrix).

Concurrency: many agent loops share one policy; generations run one at a time in a worker thread
(:func:`asyncio.to_thread`), in arrival order of the ``lock`` (pass the trainer's lock to keep
generation and optimizer steps apart). A cancelled call stops its thread at the next token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crl_worker.agent.client import Completion, ContextLengthError, ModelServerError
from crl_worker.agent.sampling import Sampling
from crl_worker.agent.trajectory import logprob_array, token_ids

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: A Hermes/Qwen tool call block: the JSON object between the tags (whitespace around it allowed).
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def new_call_id() -> str:
    """A fresh tool call id (``call_`` and 24 hex digits, unique across trajectories)."""
    return f"call_{secrets.token_hex(12)}"


def _parse_block(body: str) -> tuple[str, str] | None:
    """``(name, arguments as a JSON string)`` of one block's JSON, or ``None`` when malformed."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, dict):
        # ensure_ascii=False and default separators: what vLLM's hermes parser sends.
        return name, json.dumps(arguments, ensure_ascii=False)
    if isinstance(arguments, str):
        return name, arguments  # already a JSON string (some models write it so)
    return None


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split generated text into the message content and OpenAI-shaped tool calls.

    Every well-formed ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block becomes
    a call (``id``, ``type: function``, ``function.name``, ``function.arguments`` as a JSON
    string) and is removed from the text; the content is what remains, stripped, or ``None``
    when nothing does. A malformed block (not JSON, no name, arguments neither an object nor a
    string) and an unclosed one stay in the content, so the agent loop answers the model as it
    would any answer without a usable call. Pure: the ids are the only thing not derived from
    ``text``.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL.finditer(text):
        parsed = _parse_block(match.group(1))
        if parsed is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        name, arguments = parsed
        calls.append(
            {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None), calls


@dataclass
class Sample:
    """One generation: the sampled ids, their logprobs and why it stopped."""

    completion_ids: list[int]
    """Sampled token ids, the end-of-sequence token included when one ended the generation."""
    logprobs: list[float]
    """``log_softmax(logits / T)`` of each sampled token (temperature 1 when ``T == 0``)."""
    finish_reason: str
    """``stop`` (an end-of-sequence token) or ``length`` (``max_tokens`` reached)."""


class GenerationCancelled(Exception):
    """Internal: the call that asked for a generation was cancelled; the thread stops."""


class TransformersPolicy:
    """A :class:`~crl_worker.agent.client.Policy` sampling from a transformers causal LM in
    this process (see the module docs).

    ``module`` is the ``PreTrainedModel`` (the trainer swaps in the model it unwrapped for each
    rollout batch by assigning :attr:`module`); ``tokenizer`` must have a chat template; ``name``
    is recorded in trajectories as the model. ``lock`` serializes generations (its own when not
    given). ``seed`` makes sampling reproducible (a private generator; the global torch RNG is
    left alone). ``max_model_len`` caps prompt + completion (default: the model config's
    ``max_position_embeddings``, when it has one).
    """

    def __init__(
        self,
        module: Any,
        tokenizer: Any,
        *,
        name: str,
        lock: asyncio.Lock | None = None,
        seed: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.module = module
        self.tokenizer = tokenizer
        self.model = name
        self.lock = lock if lock is not None else asyncio.Lock()
        self.seed = seed if seed is not None else secrets.randbits(63)
        self.max_model_len = max_model_len or getattr(
            getattr(module, "config", None), "max_position_embeddings", None
        )
        self.eos_ids = self._eos_ids()
        if not self.eos_ids:
            raise ValueError(
                f"{name}: neither the tokenizer nor the model's generation config names an "
                "end-of-sequence token; set tokenizer.eos_token so generation can stop"
            )
        self.suppressed = self._suppressed_ids()
        # The generating thread holds this: a cancelled call's thread may still be finishing
        # its current token when the next call starts.
        self._busy = threading.Lock()
        self._generator: torch.Generator | None = None
        self._mask: torch.Tensor | None = None

    # --- token sets ------------------------------------------------------------------------

    def wait_idle(self) -> None:
        """Block until no generation runs on the worker thread (one that was cancelled stops
        at its next token)."""
        with self._busy:
            pass

    def _eos_ids(self) -> frozenset[int]:
        found: set[int] = set()
        candidates: list[Any] = [getattr(self.tokenizer, "eos_token_id", None)]
        config = getattr(self.module, "generation_config", None)
        candidates.append(getattr(config, "eos_token_id", None))
        for value in candidates:
            if isinstance(value, int):
                found.add(value)
            elif isinstance(value, Iterable):
                found.update(v for v in value if isinstance(v, int))
        return frozenset(found)

    def _suppressed_ids(self) -> frozenset[int]:
        special: set[int] = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        for token_id, token in (getattr(self.tokenizer, "added_tokens_decoder", {}) or {}).items():
            if getattr(token, "special", False):
                special.add(int(token_id))
        return frozenset(special - self.eos_ids)

    def _vocab_mask(self, size: int, device: torch.device) -> torch.Tensor:
        """``True`` for the ids never sampled, over the logits' ``size`` (cached)."""
        import torch

        mask = self._mask
        if mask is None or mask.shape[0] != size or mask.device != device:
            mask = torch.zeros(size, dtype=torch.bool, device=device)
            known = len(self.tokenizer)
            if known < size:
                mask[known:] = True  # padded embedding rows: no token behind them
            ids = [i for i in self.suppressed if i < size]
            if ids:
                mask[torch.tensor(ids, device=device)] = True
            self._mask = mask
        return mask

    # --- the Policy interface --------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The prompt's token ids: the chat template with ``tools`` and the generation prompt."""
        try:
            encoded = self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )
        except Exception as exc:  # jinja raises many kinds; all mean the same here
            raise ModelServerError(
                f"{self.model}: the tokenizer's chat template cannot render the conversation "
                f"({type(exc).__name__}: {exc}); check the template and the messages"
            ) from exc
        ids = encoded["input_ids"]
        if ids and isinstance(ids[0], list):  # a batch of one
            ids = ids[0]
        return [int(i) for i in ids]

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]], sampling: Sampling
    ) -> Completion:
        """Answer the conversation with one assistant message (see the module docs); with a
        ``sampling.seed``, sampled from a generator of its own seeded with it (as vLLM does a
        seeded request), else from the policy's.

        Raises :class:`ContextLengthError` (with vLLM's wording, so the loop can ask again
        with the room left) when prompt + ``max_tokens`` exceed :attr:`max_model_len`, and
        :class:`ModelServerError` when the template does not render or the model fails.
        """
        started = time.monotonic()
        # In a thread: a long conversation takes a while to render and tokenize, and the event
        # loop drives every other trajectory meanwhile.
        prompt = await asyncio.to_thread(self.render, messages, tools)
        limit = self.max_model_len
        if limit is not None and len(prompt) + sampling.max_tokens > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {len(prompt)} input tokens and asks for {sampling.max_tokens} output "
                "tokens. "
                "Please reduce the length of the input messages or max_tokens."
            )
        cancel = threading.Event()
        async with self.lock:
            try:
                sample = await asyncio.to_thread(self.generate, prompt, sampling, cancel)
            except asyncio.CancelledError:
                cancel.set()  # the thread stops at its next token; nobody reads its result
                raise
            except (RuntimeError, ValueError) as exc:
                raise ModelServerError(
                    f"{self.model}: in-process generation failed: {type(exc).__name__}: {exc}"
                ) from exc
        ids = sample.completion_ids
        text_ids = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        content, calls = parse_tool_calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        finish = sample.finish_reason
        if calls:
            message["tool_calls"] = calls
            finish = "tool_calls"
        return Completion(
            message=message,
            finish_reason=finish,
            prompt_tokens=len(prompt),
            completion_tokens=len(ids),
            prompt_token_ids=token_ids(prompt),
            completion_token_ids=token_ids(ids),
            completion_logprobs=logprob_array(sample.logprobs),
            latency=time.monotonic() - started,
        )

    # --- sampling (in the worker thread) ----------------------------------------------------

    def generate(
        self, prompt: list[int], sampling: Sampling, cancel: threading.Event | None = None
    ) -> Sample:
        """Sample up to ``sampling.max_tokens`` tokens after ``prompt`` (blocking; call it from
        a worker thread), from a generator seeded with ``sampling.seed`` when given. The model
        is switched to eval mode for the generation (no dropout) and back."""
        import torch

        if sampling.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {sampling.max_tokens}")
        if not prompt:
            raise ValueError("the prompt is empty: the chat template rendered no tokens")
        with self._busy, torch.no_grad():
            module = self.module
            was_training = bool(getattr(module, "training", False))
            module.eval()
            try:
                return self._sample_loop(module, prompt, sampling, cancel)
            finally:
                if was_training:
                    module.train()

    def _sample_loop(
        self, module: Any, prompt: list[int], sampling: Sampling, cancel: threading.Event | None
    ) -> Sample:
        import torch

        device = module.device
        if sampling.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(sampling.seed)
        elif self._generator is not None and self._generator.device == device:
            generator = self._generator
        else:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.seed)
            self._generator = generator
        inputs = torch.tensor([prompt], dtype=torch.long, device=device)
        output = module(input_ids=inputs, use_cache=True, logits_to_keep=1)
        completion: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        for step in range(sampling.max_tokens):
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled()
            logits = output.logits[0, -1].float()
            token, logprob = self._pick(logits, sampling, generator)
            completion.append(token)
            logprobs.append(logprob)
            if token in self.eos_ids:
                finish = "stop"
                break
            if step + 1 == sampling.max_tokens:
                break
            output = module(
                input_ids=torch.tensor([[token]], dtype=torch.long, device=device),
                past_key_values=output.past_key_values,
                use_cache=True,
            )
        return Sample(completion_ids=completion, logprobs=logprobs, finish_reason=finish)

    def _pick(
        self, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator
    ) -> tuple[int, float]:
        """One token from ``logits`` (float32, one row) and its logprob (module docs)."""
        import torch

        temperature, top_p = sampling.temperature, sampling.top_p

        scaled = logits / temperature if temperature > 0 else logits
        logprobs = torch.log_softmax(scaled, dim=-1)
        allowed = scaled.masked_fill(self._vocab_mask(scaled.shape[0], scaled.device), -torch.inf)
        if temperature <= 0:
            token = int(torch.argmax(allowed))
            return token, float(logprobs[token])
        probs = torch.softmax(allowed, dim=-1)
        if top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            before = torch.cumsum(ordered, dim=-1) - ordered
            # Keep the smallest prefix whose mass reaches top_p (the first token always).
            ordered = ordered.masked_fill(before >= top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(0, order, ordered)
        token = int(torch.multinomial(probs, 1, generator=generator))
        return token, float(logprobs[token])
