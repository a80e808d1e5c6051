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

Storage. Token ids are kept as ``array('i')`` (4 bytes each, signed 32-bit: vocabularies are far
below 2^31; an id that does not fit is refused) and logprobs as ``array('d')`` (8 bytes,
the server's float64 values exactly, so the JSON written is the same as from a list). A
trajectory of 20,000 ids then holds 80 KB in a handful of objects instead of 20,000 list slots
the garbage collector walks on every full collection. The fields validate from lists (or
arrays) and serialize to JSON lists of ints/floats (:data:`TokenIds`, :data:`Logprobs`), so the
``trajectories.jsonl`` format is unchanged and old lines still read. Arrays index, slice,
iterate, compare with arrays, and expose the buffer protocol (``numpy.frombuffer`` /
``torch.frombuffer`` without a copy); ``.tolist()`` gives a list. An array never equals a list
(``array('i', [1]) == [1]`` is false): compare ``.tolist()``.

docs/agent.md documents every field.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from crl_worker.harness.result import EvalResult

try:  # optional: several times faster on long id arrays
    import orjson
except ImportError:  # pragma: no cover - the standard library does the same, slower
    orjson = None  # type: ignore[assignment]

if TYPE_CHECKING:
    IdArray: TypeAlias = array[int]
    FloatArray: TypeAlias = array[float]
else:  # array is not subscriptable at run time before Python 3.12
    IdArray = array
    FloatArray = array

#: Typecode of token id arrays: C ``int``, 32-bit signed on every platform CPython supports.
ID_TYPECODE = "i"
#: Typecode of logprob arrays: C ``double``, exactly the float64 the server's JSON decodes to.
LOGPROB_TYPECODE = "d"


def token_ids(values: Iterable[int]) -> IdArray:
    """Token ids as a compact ``array('i')``; raises :class:`ValueError` for a value that is
    not an int or does not fit 32 bits (no tokenizer has 2^31 tokens)."""
    if isinstance(values, array) and values.typecode == ID_TYPECODE:
        return values
    try:
        return array(ID_TYPECODE, values)
    except OverflowError:
        raise ValueError(
            "a token id does not fit a signed 32-bit integer; token ids are indexes into a "
            "vocabulary, far below 2^31: the server sent something else"
        ) from None
    except TypeError as exc:
        raise ValueError(f"token ids must be integers: {exc}") from None


def logprob_array(values: Iterable[float]) -> FloatArray:
    """Logprobs as a compact ``array('d')`` (float64: the values exactly as decoded)."""
    if isinstance(values, array) and values.typecode == LOGPROB_TYPECODE:
        return values
    try:
        return array(LOGPROB_TYPECODE, values)
    except TypeError as exc:
        raise ValueError(f"logprobs must be numbers: {exc}") from None


def decode_token_ids(raw: bytes) -> IdArray:
    """The ids of a JSON array's inside (``b"1,2, 3"``, the bytes between ``[`` and ``]``).

    Raises :class:`ValueError` when they are not a well-formed list of integers."""
    text = b"[" + raw + b"]"
    values = orjson.loads(text) if orjson is not None else _json_loads(text)
    if not isinstance(values, list):  # pragma: no cover - "[...]" always decodes to a list
        raise ValueError("token ids are not a JSON array")
    return token_ids(values)


def _json_loads(text: bytes) -> Any:
    import json

    return json.loads(text)


class _ArrayField:
    """Pydantic schema of an array-backed field: validated from a list or an array, serialized
    to a list (so JSON is exactly what a ``list[int]`` / ``list[float]`` field wrote)."""

    def __init__(self, typecode: str) -> None:
        self.typecode = typecode

    def _validate(self, value: Any) -> Any:
        if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
            kind = "token ids" if self.typecode == ID_TYPECODE else "logprobs"
            raise ValueError(f"{kind} must be a list of numbers, not {type(value).__name__}")
        if self.typecode == ID_TYPECODE:
            if isinstance(value, list) and any(isinstance(v, bool) for v in value):
                raise ValueError("token ids must be integers, not booleans")
            return token_ids(value)
        return logprob_array(value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        item = (
            core_schema.int_schema() if self.typecode == ID_TYPECODE else core_schema.float_schema()
        )
        return core_schema.no_info_plain_validator_function(
            self._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                _to_list, return_schema=core_schema.list_schema(item), when_used="always"
            ),
        )

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        item = "integer" if self.typecode == ID_TYPECODE else "number"
        return {"type": "array", "items": {"type": item}}


def _to_list(value: Any) -> list[Any]:
    return value.tolist() if isinstance(value, array) else list(value)


TokenIds = Annotated[IdArray, _ArrayField(ID_TYPECODE)]
"""Token ids: ``array('i')`` in memory, a JSON list of ints on disk."""
Logprobs = Annotated[FloatArray, _ArrayField(LOGPROB_TYPECODE)]
"""Logprobs: ``array('d')`` in memory, a JSON list of floats on disk."""

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
    prompt_token_ids: TokenIds | None = None
    """The prompt's token ids as the server sent them, minus the first ``prompt_ids_offset``
    (which equal the previous turn's prompt + completion ids). ``None``: the server sent none."""
    prompt_ids_offset: int = 0
    """How many leading prompt ids were left out of ``prompt_token_ids`` because they repeat
    the previous turn's prompt + completion ids (0 for the first turn, or when the prompt does
    not extend the previous turn)."""
    completion_token_ids: TokenIds | None = None
    """The sampled token ids as the server sent them."""
    completion_logprobs: Logprobs | None = None
    """One logprob per sampled token, as the server sent them."""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    """The tool calls of this turn's answer, in order, with the environment's answers."""


class TokenSequence(BaseModel):
    """The whole conversation as one token sequence, for training (arrays: ``ids`` and ``mask``
    are ``array('i')``, ``logprobs`` ``array('d')``; ``numpy.frombuffer`` / ``torch.frombuffer``
    read them without a copy, ``.tolist()`` gives lists)."""

    model_config = ConfigDict(extra="forbid")

    ids: TokenIds
    """Token ids: the first prompt, then each completion and the environment tokens between."""
    mask: TokenIds
    """1 for tokens the model sampled (completions), 0 for prompt and environment tokens."""
    logprobs: Logprobs | None
    """Aligned with ``ids``: the sampling logprob of each model token, 0.0 for prompt and
    environment tokens (use ``mask``). ``None`` when some turn came without logprobs."""
    completion_spans: list[tuple[int, int]]
    """``[start, end)`` of each turn's completion in ``ids``."""


class TurnSample(BaseModel):
    """One turn as a separate (prompt, completion) sample: the trainer's fallback when the
    conversation is not one token sequence (arrays, like :class:`TokenSequence`)."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    """The turn's index."""
    prompt_ids: TokenIds
    """The full prompt ids of the turn."""
    completion_ids: TokenIds
    """The sampled ids."""
    completion_logprobs: Logprobs | None
    """Their logprobs, when the server sent them."""


def dedupe_prompt_ids(
    running: IdArray | None, prompt_ids: IdArray | None
) -> tuple[IdArray | None, int]:
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


class PromptRecord(NamedTuple):
    """What :meth:`PromptIds.add` found for one turn."""

    stored: IdArray | None
    """The prompt ids to store in the :class:`Turn` (without the left-out prefix)."""
    offset: int
    """How many leading ids were left out (:attr:`Turn.prompt_ids_offset`)."""
    length: int | None
    """The whole prompt's length in ids (``None`` without ids)."""


class PromptIds:
    """Deduplicates each turn's prompt ids against the previous turn's prompt + completion
    without decoding or comparing the whole prompt every turn.

    A prompt comes either as ids or as the raw bytes of its JSON array (what
    :class:`~crl_worker.agent.client.ChatClient` cuts out of the response, undecoded). When
    this turn's raw bytes start with the previous turn's raw bytes exactly, the previous
    prompt's ids are known without decoding them again: only the bytes after it are decoded,
    and they must start with the previous completion's ids (a compare of a few hundred ids).
    Anything else (a chat template that re-renders history, a prompt given as ids, a first
    turn) decodes the whole prompt and compares it as :func:`dedupe_prompt_ids` does. Every id
    stored was decoded from the server's bytes or matched byte for byte; nothing is inferred
    or re-tokenized. Raises :class:`ValueError` for raw bytes that are not a list of ints.
    """

    def __init__(self) -> None:
        # The previous prompt: its raw array bytes (stripped) or its ids; None when unknown.
        self._prompt: bytes | IdArray | None = None
        self._length = 0
        self._completion: IdArray | None = None
        self.decoded = 0
        """Ids decoded from raw bytes so far (the first prompt, then what each prompt adds
        when its bytes extend the previous prompt's)."""

    def add(
        self, prompt: IdArray | None, raw: bytes | None, completion: IdArray | None
    ) -> PromptRecord:
        """Record one turn (its prompt as ids or raw bytes, and its completion ids)."""
        if raw is not None:
            raw = raw.strip()
        record = self._split(prompt, raw)
        if record.length is None:
            self._prompt = None
        else:
            self._prompt = raw if raw is not None else prompt
            self._length = record.length
        self._completion = completion
        return record

    def _split(self, prompt: IdArray | None, raw: bytes | None) -> PromptRecord:
        if prompt is None and raw is None:
            return PromptRecord(None, 0, None)
        previous, completion = self._prompt, self._completion
        if (
            raw is not None
            and isinstance(previous, bytes)
            and previous
            and completion is not None
            and raw.startswith(previous)
        ):
            tail = _tail_ids(raw[len(previous) :])
            self.decoded += 0 if tail is None else len(tail)
            size = len(completion)
            if tail is not None and tail[:size] == completion:
                return PromptRecord(tail[size:], self._length + size, self._length + len(tail))
        ids = prompt if prompt is not None else self._decode(raw or b"")
        if previous is None or completion is None:
            return PromptRecord(ids, 0, len(ids))
        running = self._decode(previous) if isinstance(previous, bytes) else previous[:]
        running.extend(completion)
        stored, offset = dedupe_prompt_ids(running, ids)
        return PromptRecord(stored, offset, len(ids))

    def _decode(self, raw: bytes) -> IdArray:
        ids = decode_token_ids(raw)
        self.decoded += len(ids)
        return ids


def _tail_ids(rest: bytes) -> IdArray | None:
    """The ids after a byte-identical prefix: ``rest`` must be a separator (``,`` with any
    whitespace) and at least one id; ``None`` when it is not (the prefix's last number goes on,
    or nothing follows)."""
    rest = rest.lstrip()
    if not rest.startswith(b","):
        return None
    rest = rest[1:]
    if not rest.strip():
        raise ValueError("a token id array ends with a comma")
    return decode_token_ids(rest)


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return position
    return min(len(a), len(b))


class TryRecord(BaseModel):
    """One try of a run with ``agent.tries: 2`` (a benchmark's second try, Aider's pass@2)."""

    model_config = ConfigDict(extra="forbid")

    first_turn: int
    """Index (in :attr:`Trajectory.turns`) of the try's first model call; the second try's
    message with the test output is the user message just before it."""
    exit_reason: ExitReason
    """Why the try ended."""
    diff: str = ""
    """The candidate's changes the try ended with (graded for every try but the last; the
    last one's is :attr:`Trajectory.diff`)."""
    evaluation: EvalResult | None = None
    """The try's verdict, for every try but the last (whose verdict is
    :attr:`Trajectory.evaluation`)."""


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
    # Left out of the JSON when empty: lines of one-try runs stay as they were, byte for byte.
    tries: list[TryRecord] = Field(default_factory=list, exclude_if=lambda tries: not tries)
    """With ``agent.tries: 2``: each try, in order (empty otherwise, and then not written);
    the last one's verdict is :attr:`evaluation`."""

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

    def full_prompt_ids(self) -> list[IdArray | None]:
        """Each turn's full prompt ids (the stored ids with their left-out prefix restored)."""
        result: list[IdArray | None] = []
        running: IdArray | None = None
        for turn in self.turns:
            prompt: IdArray | None = None
            if turn.prompt_token_ids is not None:
                if turn.prompt_ids_offset:
                    if running is None or len(running) < turn.prompt_ids_offset:
                        prompt = None  # the prefix it refers to is unknown: cannot rebuild
                    else:
                        prompt = running[: turn.prompt_ids_offset]
                        prompt.extend(turn.prompt_token_ids)
                else:
                    prompt = token_ids(turn.prompt_token_ids)[:]
            result.append(prompt)
            if prompt is not None and turn.completion_token_ids is not None:
                running = prompt[:]
                running.extend(turn.completion_token_ids)
            else:
                running = None
        return result

    def turn_samples(self) -> list[TurnSample]:
        """One (prompt, completion) sample per turn that has token ids."""
        samples = []
        for turn, prompt in zip(self.turns, self.full_prompt_ids(), strict=True):
            if prompt is None or turn.completion_token_ids is None:
                continue
            logprobs = turn.completion_logprobs
            samples.append(
                TurnSample.model_construct(
                    turn=turn.index,
                    prompt_ids=prompt,
                    completion_ids=token_ids(turn.completion_token_ids)[:],
                    completion_logprobs=None if logprobs is None else logprob_array(logprobs)[:],
                )
            )
        return samples

    def token_sequence_problem(self) -> str | None:
        """Why :meth:`token_sequence` is ``None`` (``None`` when it is not)."""
        if not self.turns:
            return "the trajectory has no turns"
        prompts = self.full_prompt_ids()
        running = array(ID_TYPECODE)
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
            running = prompt[:]
            running.extend(turn.completion_token_ids)
        return None

    def token_sequence(self) -> TokenSequence | None:
        """The conversation as one token sequence with its model/environment mask, when every
        turn has token ids and each prompt extends the previous prompt + completion; ``None``
        otherwise (see :meth:`token_sequence_problem`). Never re-tokenizes."""
        if self.token_sequence_problem() is not None:
            return None
        ids = array(ID_TYPECODE)
        mask = array(ID_TYPECODE)
        logprobs: FloatArray | None = array(LOGPROB_TYPECODE)
        spans: list[tuple[int, int]] = []
        for turn, prompt in zip(self.turns, self.full_prompt_ids(), strict=True):
            assert prompt is not None and turn.completion_token_ids is not None
            new = prompt[len(ids) :]
            ids.extend(new)
            mask.extend(_ZERO_ID * len(new))
            completion = turn.completion_token_ids
            start = len(ids)
            ids.extend(completion)
            mask.extend(_ONE_ID * len(completion))
            spans.append((start, len(ids)))
            if logprobs is not None:
                if turn.completion_logprobs is None or len(turn.completion_logprobs) != len(
                    completion
                ):
                    logprobs = None
                else:
                    logprobs.extend(_ZERO_LOGPROB * len(new))
                    logprobs.extend(turn.completion_logprobs)
        return TokenSequence.model_construct(
            ids=ids, mask=mask, logprobs=logprobs, completion_spans=spans
        )


_ZERO_ID = array(ID_TYPECODE, [0])
_ONE_ID = array(ID_TYPECODE, [1])
_ZERO_LOGPROB = array(LOGPROB_TYPECODE, [0.0])
