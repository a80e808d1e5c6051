"""What one agent run leaves behind: the chat, every model call, the tool calls and their
outputs, the final diff, and why it ended. One :class:`Trajectory` is one line of
``trajectories.jsonl`` (``to_json``; read back with ``Trajectory.model_validate_json``).

Token ids. When the server returns them (vLLM's ``return_token_ids``), each :class:`Turn` keeps
the prompt and completion ids exactly as sent. A prompt that starts with the previous turn's
prompt and completion ids is stored without that prefix (``prompt_ids_offset`` says how many ids
were left out), so a long trajectory stays linear in size instead of quadratic;
:meth:`Trajectory.turn_samples` gives each turn's full prompt back. :meth:`Trajectory.token_sequence`
lays the whole conversation out as one sequence with a mask (1 = sampled by the model, 0 = prompt
and environment) when every turn's prompt extends the previous one; otherwise it is ``None`` and
:meth:`Trajectory.token_sequence_problem` says which turn broke the chain. Nothing is ever
re-tokenized.

docs/agent.md documents every field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from crl_worker.harness.result import EvalResult

ExitReason = Literal[
    "submitted", "max_turns", "context_exhausted", "timeout", "infrastructure_error", "cancelled"
]
"""Why a trajectory ended (see docs/agent.md)."""


class ToolCallRecord(BaseModel):
    """One tool call the model made and what the environment answered."""

    model_config = ConfigDict(extra="forbid")

    id: str
    """The call's id (the server's, or ``call_<turn>_<n>`` when the server sent none)."""
    name: str
    """The tool the model asked for (as written, even when no such tool exists)."""
    arguments: str
    """The arguments exactly as the model wrote them (a JSON string, possibly malformed; a
    server that sent a JSON object instead: that object's JSON string)."""
    output: str
    """The content of the tool message sent back to the model."""
    error: bool = False
    """The call failed: malformed, unknown tool, or the tool refused (e.g. ``old_str`` not
    found). The model was told why in ``output``."""
    exit_code: int | None = None
    """``shell`` only: the command's exit status (``None`` when it timed out)."""
    duration: float = 0.0
    """Seconds the tool took."""


class Turn(BaseModel):
    """One model call and the tool calls its answer made."""

    model_config = ConfigDict(extra="forbid")

    index: int
    """0-based position in the trajectory."""
    started: float
    """When the call was sent (Unix time, seconds)."""
    latency: float
    """Seconds the call took, retries and backoff included."""
    retries: int = 0
    """Failed attempts retried before the answer."""
    finish_reason: str | None = None
    """Why generation stopped, as the server said (``stop``, ``tool_calls``, ``length``)."""
    max_tokens: int
    """The ``max_tokens`` the request asked for."""
    prompt_tokens: int = 0
    """Prompt tokens (the server's ``usage``)."""
    completion_tokens: int = 0
    """Completion tokens (the server's ``usage``)."""
    message_index: int
    """Index of this turn's assistant message in :attr:`Trajectory.messages`."""
    reasoning: str | None = None
    """The server's ``reasoning_content``, when it sent one (kept here, not sent back)."""
    prompt_token_ids: list[int] | None = None
    """The prompt's token ids as the server sent them, minus the first ``prompt_ids_offset``
    (which equal the previous turn's prompt + completion ids). ``None``: the server sent none."""
    prompt_ids_offset: int = 0
    """How many leading prompt ids were left out of ``prompt_token_ids`` because they repeat
    the previous turn's prompt + completion ids (0 for the first turn, or when the prompt does
    not extend the previous turn)."""
    completion_token_ids: list[int] | None = None
    """The sampled token ids as the server sent them."""
    completion_logprobs: list[float] | None = None
    """One logprob per sampled token, as the server sent them."""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    """The tool calls of this turn's answer, in order, with the environment's answers."""


class TokenSequence(BaseModel):
    """The whole conversation as one token sequence, for training."""

    model_config = ConfigDict(extra="forbid")

    ids: list[int]
    """Token ids: the first prompt, then each completion and the environment tokens between."""
    mask: list[int]
    """1 for tokens the model sampled (completions), 0 for prompt and environment tokens."""
    logprobs: list[float] | None
    """Aligned with ``ids``: the sampling logprob of each model token, 0.0 for prompt and
    environment tokens (use ``mask``). ``None`` when some turn came without logprobs."""
    completion_spans: list[tuple[int, int]]
    """``[start, end)`` of each turn's completion in ``ids``."""


class TurnSample(BaseModel):
    """One turn as a separate (prompt, completion) sample: the trainer's fallback when the
    conversation is not one token sequence."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    """The turn's index."""
    prompt_ids: list[int]
    """The full prompt ids of the turn."""
    completion_ids: list[int]
    """The sampled ids."""
    completion_logprobs: list[float] | None
    """Their logprobs, when the server sent them."""


def dedupe_prompt_ids(
    running: list[int] | None, prompt_ids: list[int] | None
) -> tuple[list[int] | None, int]:
    """Split a turn's prompt ids into what to store and how many leading ids were left out.

    ``running`` is the previous turn's prompt + completion ids (``None`` for the first turn or
    when unknown). When the prompt starts with all of them, only the rest is stored.
    """
    if prompt_ids is None or not running:
        return prompt_ids, 0
    size = len(running)
    if len(prompt_ids) >= size and prompt_ids[:size] == running:
        return prompt_ids[size:], size
    return prompt_ids, 0


def _first_difference(a: list[int], b: list[int]) -> int:
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return position
    return min(len(a), len(b))


class Trajectory(BaseModel):
    """One agent run on one task instance (one line of ``trajectories.jsonl``)."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str
    """The task's id."""
    repo: str
    """The task's repository (``owner/name``)."""
    attempt: int = 0
    """0-based attempt number (pass@k runs several)."""
    model: str
    """The policy's model name (``gold`` for the gold replay)."""
    template: str = "swe-default"
    """The prompt template set."""
    tools: list[str] = Field(default_factory=list)
    """The tools offered to the model."""
    started_at: datetime
    """When the run started (UTC)."""
    duration: float = 0.0
    """Seconds from start to end, final diff included."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The whole chat as sent to the model, system prompt first (OpenAI message format)."""
    turns: list[Turn] = Field(default_factory=list)
    """Every model call, in order."""
    exit_reason: ExitReason
    """Why the run ended."""
    error: str | None = None
    """Human-readable detail for any ending other than ``submitted``."""
    prompt_tokens: int = 0
    """Sum of the turns' prompt tokens."""
    completion_tokens: int = 0
    """Sum of the turns' completion tokens."""
    diff: str = ""
    """The agent's changes at the end (``sandbox.diff()``); empty when there were none or the
    sandbox was gone."""
    evaluation: EvalResult | None = None
    """The test verdict, filled in by the runner after the evaluation."""
    reward: float | None = None
    """The reward, filled in by the runner (``None``: infrastructure failure, not scored)."""

    @property
    def infrastructure_failure(self) -> bool:
        """The run says nothing about the model: the infrastructure failed (agent side or
        evaluation side)."""
        return self.exit_reason == "infrastructure_error" or (
            self.evaluation is not None and self.evaluation.infrastructure_error is not None
        )

    def to_json(self) -> str:
        """One line of JSON (no newline inside)."""
        return self.model_dump_json()

    # --- token ids ----------------------------------------------------------------------------

    def full_prompt_ids(self) -> list[list[int] | None]:
        """Each turn's full prompt ids (the stored ids with their left-out prefix restored)."""
        result: list[list[int] | None] = []
        running: list[int] | None = None
        for turn in self.turns:
            prompt: list[int] | None = None
            if turn.prompt_token_ids is not None:
                if turn.prompt_ids_offset:
                    if running is None or len(running) < turn.prompt_ids_offset:
                        prompt = None  # the prefix it refers to is unknown: cannot rebuild
                    else:
                        prompt = running[: turn.prompt_ids_offset] + turn.prompt_token_ids
                else:
                    prompt = list(turn.prompt_token_ids)
            result.append(prompt)
            if prompt is not None and turn.completion_token_ids is not None:
                running = prompt + turn.completion_token_ids
            else:
                running = None
        return result

    def turn_samples(self) -> list[TurnSample]:
        """One (prompt, completion) sample per turn that has token ids."""
        samples = []
        for turn, prompt in zip(self.turns, self.full_prompt_ids(), strict=True):
            if prompt is None or turn.completion_token_ids is None:
                continue
            samples.append(
                TurnSample(
                    turn=turn.index,
                    prompt_ids=prompt,
                    completion_ids=list(turn.completion_token_ids),
                    completion_logprobs=turn.completion_logprobs,
                )
            )
        return samples

    def token_sequence_problem(self) -> str | None:
        """Why :meth:`token_sequence` is ``None`` (``None`` when it is not)."""
        if not self.turns:
            return "the trajectory has no turns"
        prompts = self.full_prompt_ids()
        running: list[int] = []
        for turn, prompt in zip(self.turns, prompts, strict=True):
            if prompt is None or turn.completion_token_ids is None:
                return (
                    f"turn {turn.index} has no token ids: the server did not return them "
                    "(vLLM >= 0.10.2 does with return_token_ids)"
                )
            if turn.index > 0 and prompt[: len(running)] != running:
                at = _first_difference(prompt, running)
                return (
                    f"turn {turn.index}'s prompt does not start with turn {turn.index - 1}'s "
                    f"prompt + completion ids (first difference at token {at} of {len(running)}): "
                    "the chat template re-renders earlier turns differently from how they were "
                    "sampled"
                )
            running = prompt + turn.completion_token_ids
        return None

    def token_sequence(self) -> TokenSequence | None:
        """The conversation as one token sequence with its model/environment mask, when every
        turn has token ids and each prompt extends the previous prompt + completion; ``None``
        otherwise (see :meth:`token_sequence_problem`). Never re-tokenizes."""
        if self.token_sequence_problem() is not None:
            return None
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] | None = []
        spans: list[tuple[int, int]] = []
        for turn, prompt in zip(self.turns, self.full_prompt_ids(), strict=True):
            assert prompt is not None and turn.completion_token_ids is not None
            new = prompt[len(ids) :]
            ids.extend(new)
            mask.extend([0] * len(new))
            completion = turn.completion_token_ids
            start = len(ids)
            ids.extend(completion)
            mask.extend([1] * len(completion))
            spans.append((start, len(ids)))
            if logprobs is not None:
                if turn.completion_logprobs is None or len(turn.completion_logprobs) != len(
                    completion
                ):
                    logprobs = None
                else:
                    logprobs.extend([0.0] * len(new))
                    logprobs.extend(turn.completion_logprobs)
        return TokenSequence(ids=ids, mask=mask, logprobs=logprobs, completion_spans=spans)
