"""The model side of the agent: a :class:`Policy` answers one chat turn; :class:`ChatClient` is
the policy that talks to any OpenAI-compatible ``/v1/chat/completions`` endpoint over HTTP.

The client is built for many concurrent trajectories in one process: one ``aiohttp`` session
with a connection limit (requests beyond it wait for a free connection: back-pressure), requests
built as plain dicts, responses read as plain JSON without validating the whole body. With
``token_ids=True`` it asks vLLM for the exact token ids and logprobs (``return_token_ids``,
``logprobs``; see docs/agent.md); servers that ignore those fields still work, the ids stay
``None``. Nothing is ever re-tokenized here.

The prompt's ids (vLLM's top-level ``prompt_token_ids``, the whole prompt again every turn:
most of a response's bytes) are not decoded here: :func:`split_prompt_ids` cuts the array out of
the raw body before the rest is decoded and keeps its bytes
(:attr:`Completion.prompt_token_ids_raw`); the loop decodes only what the previous turn did not
already have (see :class:`~crl_worker.agent.trajectory.PromptIds`).

Failures: 429, 5xx, dropped connections and timeouts are retried with exponential backoff and
full jitter (``Retry-After`` honoured); after ``max_retries`` they raise
:class:`ModelServerError` (an infrastructure failure, never a wrong answer). A 400 saying the
prompt is too long raises :class:`ContextLengthError`; any other 4xx raises
:class:`ModelServerError` with the server's message.
"""

from __future__ import annotations

import asyncio
import email.utils
import gc
import json
import logging
import random
import re
import time
from types import TracebackType
from typing import Any, Protocol

import aiohttp
from pydantic import BaseModel, ConfigDict, Field

from crl_worker.agent.sampling import Sampling
from crl_worker.agent.trajectory import (
    IdArray,
    Logprobs,
    TokenIds,
    decode_token_ids,
    logprob_array,
    token_ids,
)
from crl_worker.errors import CrlError, InfrastructureError

try:  # optional: several times faster on the long token id arrays vLLM sends back
    import orjson
except ImportError:  # pragma: no cover - the standard library does the same, slower
    orjson = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)


def _dumps(value: Any) -> bytes:
    if orjson is not None:
        return orjson.dumps(value)
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _loads(data: bytes) -> Any:
    if orjson is not None:
        return orjson.loads(data)
    return json.loads(data)


#: Phrases servers use when the prompt does not fit the context window (vLLM, OpenAI,
#: Anthropic-style proxies, llama.cpp). Matched case-insensitively in a 400's message.
CONTEXT_LENGTH_PHRASES = (
    "maximum context length",
    "context length",
    "context_length_exceeded",
    "prompt is too long",
    "available context size",
    "exceed_context_size",
)

#: 4xx status codes worth another try (every 5xx is retried too).
_RETRY_4XX = frozenset({408, 425, 429})


class ModelServerError(InfrastructureError):
    """The model server could not answer: unreachable, 5xx or 429 after every retry, or a 4xx
    that is not the model's fault (bad model name, bad key). Ends a trajectory as an
    infrastructure failure."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ContextLengthError(CrlError):
    """The server refused the request because the prompt no longer fits the model's context.

    Ends a trajectory as ``context_exhausted``: the agent ran out of room, the infrastructure
    is fine."""


class Completion(BaseModel):
    """One model answer, as the server returned it."""

    model_config = ConfigDict(extra="forbid")

    message: dict[str, Any]
    """The assistant message as the API returned it (role, content, tool_calls, and
    reasoning_content when the server sends it)."""
    finish_reason: str | None
    """Why generation stopped: ``stop``, ``tool_calls``, ``length``, ..."""
    prompt_tokens: int
    """Prompt tokens, from ``usage`` (0 when the server sent no usage)."""
    completion_tokens: int
    """Completion tokens, from ``usage`` (0 when absent)."""
    prompt_token_ids: TokenIds | None = None
    """vLLM's top-level ``prompt_token_ids`` (with ``return_token_ids``), exactly as sent, when
    decoded. :class:`ChatClient` leaves it ``None`` and sets :attr:`prompt_token_ids_raw`
    instead whenever it could cut the array out of the body: use :meth:`prompt_ids`."""
    prompt_token_ids_raw: bytes | None = Field(default=None, exclude=True, repr=False)
    """The bytes of the response's ``prompt_token_ids`` array between ``[`` and ``]``,
    undecoded (digits, commas, whitespace). Not serialized."""
    completion_token_ids: TokenIds | None = None
    """vLLM's per-choice ``token_ids``: the sampled tokens, exactly as sent."""
    completion_logprobs: Logprobs | None = None
    """One logprob per completion token (``choices[0].logprobs.content[].logprob``)."""
    latency: float
    """Seconds the whole call took, retries and backoff included."""
    retries: int = 0
    """Attempts that failed and were retried before this answer."""

    def prompt_ids(self) -> IdArray | None:
        """The prompt's token ids, decoded from :attr:`prompt_token_ids_raw` when that is what
        the client kept (``None`` when the server sent none). Raises :class:`ValueError` for
        raw bytes that are not a list of ints."""
        if self.prompt_token_ids is not None:
            return self.prompt_token_ids
        if self.prompt_token_ids_raw is not None:
            return decode_token_ids(self.prompt_token_ids_raw)
        return None


class Policy(Protocol):
    """Anything that answers a chat turn: an HTTP client, the gold replayer, a test double."""

    model: str
    """Name recorded in the trajectory."""

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]], sampling: Sampling
    ) -> Completion:
        """Answer the conversation ``messages`` with one assistant message."""
        ...


class _Retryable(Exception):
    """One attempt failed in a way worth retrying (internal)."""

    def __init__(self, message: str, *, status: int | None = None, wait: float | None = None):
        super().__init__(message)
        self.status = status
        self.wait = wait


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_message(body: bytes) -> str:
    """The human-readable message of an error response (OpenAI ``{"error": {"message"}}``,
    vLLM, FastAPI ``detail``, or the raw text)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:2000]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(error.get(key), str):
                    return str(error[key])
        elif isinstance(error, str):
            return error
        if isinstance(data.get("detail"), str):
            return str(data["detail"])
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return text[:2000]


def is_context_length_message(message: str) -> bool:
    """Whether a server's error message says the prompt does not fit the context window."""
    lowered = message.lower()
    return any(phrase in lowered for phrase in CONTEXT_LENGTH_PHRASES)


_CONTEXT_SIZE = re.compile(r"maximum context length is (\d+) tokens")
#: vLLM >= 0.10 ("your request has N input tokens") and older ("(N in the messages").
_INPUT_SIZE = re.compile(r"request has (\d+) input tokens|\((\d+) in the messages")


def context_room(message: str) -> int | None:
    """The completion tokens that still fit, from a vLLM context-length error that gives the
    context size and the prompt's size (``None`` when it does not say both).

    vLLM refuses a request whose prompt *plus* ``max_tokens`` exceeds the context, even when
    the prompt alone fits: asked again with at most this many tokens, it answers.
    """
    size, used = _CONTEXT_SIZE.search(message), _INPUT_SIZE.search(message)
    if size is None or used is None:
        return None
    return int(size.group(1)) - int(used.group(1) or used.group(2))


_PROMPT_IDS_KEY = b'"prompt_token_ids"'
_PROMPT_IDS_OPEN = re.compile(rb'"prompt_token_ids"\s*:\s*\[')
#: What the cut-out array is replaced with before decoding the rest: a string no server sends,
#: so finding it as the top-level ``prompt_token_ids`` proves the cut was that key's value.
_CUT_MARK = "\x00crl: prompt_token_ids cut out"
_CUT_MARK_JSON = b'"\\u0000crl: prompt_token_ids cut out"'
#: Bytes a JSON array of non-negative ints can hold between its brackets.
_ID_ARRAY_BYTES = b"0123456789, \t\r\n"


def split_prompt_ids(body: bytes) -> tuple[Any, bytes | None]:
    """Decode a response body with its top-level ``prompt_token_ids`` array cut out first.

    Returns the decoded body (``prompt_token_ids`` set to ``None`` when cut) and the array's
    bytes between ``[`` and ``]`` (``None`` when not cut). Only the key followed by optional
    whitespace, ``:`` and ``[`` counts; the array holds only ints, so its end is the first
    ``]``, and the piece must hold only digits, commas and whitespace. The rest is decoded
    with a marker in the array's place and the marker must come back as the top-level
    ``prompt_token_ids`` (not a nested key, not a duplicate). Anything unexpected decodes the
    whole body instead. Raises :class:`ValueError` for a body that is not JSON.
    """
    at = body.find(_PROMPT_IDS_KEY)
    while at >= 0:
        opened = _PROMPT_IDS_OPEN.match(body, at)
        if opened is not None:
            start = opened.end()
            end = body.find(b"]", start)
            if end < 0:
                break
            raw = body[start:end]
            if raw.translate(None, _ID_ARRAY_BYTES):
                break  # something other than ints: not the array we expect
            data = _loads(body[: start - 1] + _CUT_MARK_JSON + body[end + 1 :])
            if isinstance(data, dict) and data.get("prompt_token_ids") == _CUT_MARK:
                data["prompt_token_ids"] = None
                return data, raw
            break
        at = body.find(_PROMPT_IDS_KEY, at + 1)
    return _loads(body), None


def parse_completion(
    data: Any, *, latency: float, retries: int, prompt_ids_raw: bytes | None = None
) -> Completion:
    """Read one chat completion response body (already JSON-decoded) into a :class:`Completion`.

    Only the fields the agent needs are read; the body is not validated as a whole (the hot path
    of a thousand concurrent trajectories). ``prompt_ids_raw``: the prompt id array's bytes cut
    out by :func:`split_prompt_ids`. Raises :class:`ModelServerError` when the body has no first
    choice with a message, or token ids or logprobs that are not lists of numbers.
    """
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ModelServerError(
            f"the model server answered without a choice: {str(data)[:500]}"
        ) from None
    if not isinstance(message, dict):
        raise ModelServerError(f"the model server's message is not an object: {message!r:.500}")
    usage = data.get("usage") or {}
    prompt_ids = data.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    logprobs = None
    try:
        choice_logprobs = choice.get("logprobs")
        if isinstance(choice_logprobs, dict):
            content = choice_logprobs.get("content")
            if isinstance(content, list):
                logprobs = logprob_array([entry["logprob"] for entry in content])
        # Compact arrays (see trajectory.py): a list of Python ints would be walked by every
        # full garbage collection for as long as the trajectory lives.
        if prompt_ids is not None:
            prompt_ids = token_ids(prompt_ids)
        if completion_ids is not None:
            completion_ids = token_ids(completion_ids)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelServerError(
            f"the model server sent token ids or logprobs that are not lists of numbers: {exc}"
        ) from None
    # model_construct: no per-element validation of what was just converted (hot path).
    return Completion.model_construct(
        message=message,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_token_ids=prompt_ids,
        prompt_token_ids_raw=prompt_ids_raw,
        completion_token_ids=completion_ids,
        completion_logprobs=logprobs,
        latency=latency,
        retries=retries,
    )


def read_answer(body: bytes, *, latency: float, retries: int) -> Completion:
    """Decode and read a 200 answer without letting its short-lived objects trigger the cyclic
    garbage collector.

    Decoding an answer with logprobs allocates hundreds of small containers (one dict and two
    lists per completion token) that are all freed again before this returns: only the message
    survives. Counted by the collector as allocations, they would trigger a young collection
    almost every answer, and with many trajectories in flight those collections promote their
    waiting request state into the old generation, which triggers full collections over every
    live trajectory. With the collector paused for this synchronous stretch (no await, no other
    code runs) and the decoded body freed before it resumes, the net allocation count, which
    is what schedules collections, only grows by what survives. The collector is resumed only
    if it was running.
    """
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        try:
            data, raw = split_prompt_ids(body)
        except ValueError:
            # A truncated body from a proxy that cut the stream: worth another try.
            raise _Retryable(f"malformed JSON in a 200 answer: {body[:200]!r}") from None
        completion = parse_completion(data, latency=latency, retries=retries, prompt_ids_raw=raw)
        del data
        return completion
    finally:
        if paused:
            gc.enable()


class ChatClient:
    """A :class:`Policy` over HTTP to an OpenAI-compatible ``/chat/completions`` endpoint.

    ``base_url`` is the API root (e.g. ``http://vllm:8000/v1``); ``token_ids`` asks vLLM for
    token ids and logprobs; ``request_timeout`` bounds one attempt; ``max_retries`` is the
    number of retries after the first attempt; ``max_connections`` caps concurrent requests
    (more wait their turn). ``backoff_base`` and ``backoff_max`` (seconds) shape the
    exponential backoff: attempt *n* waits a uniform random time in ``[0, min(max, base·2ⁿ)]``
    unless the server sent ``Retry-After``.

    Use as ``async with ChatClient(...) as client`` or call :meth:`aclose` at the end.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        token_ids: bool = True,
        request_timeout: float = 600.0,
        max_retries: int = 8,
        max_connections: int = 1024,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.token_ids = token_ids
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.max_connections = max_connections
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None

    def pinned(self, model: str, *, seed: int | None = None) -> PinnedPolicy:
        """A policy asking this client's server for ``model`` on every turn, seeded from
        ``seed`` when given (:class:`PinnedPolicy`)."""
        return PinnedPolicy(self, model, seed=seed)

    def _get_session(self) -> aiohttp.ClientSession:
        # Created on first use: a ClientSession belongs to the running event loop.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0)
            # The request timeout is applied per attempt *after* a connection slot is free
            # (below), so time spent queueing behind the connection limit does not count.
            self._slots = asyncio.Semaphore(self.max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                # An inference API sets no cookies: skip the cookie jar on every response.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        """Close the HTTP session (idempotent)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def request_body(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]],
        sampling: Sampling,
        model: str | None = None,
    ) -> dict[str, Any]:
        """The JSON body of one request (``model``: its own, else the client's)."""
        body: dict[str, Any] = {
            "model": model or self.model,
            "messages": messages,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.token_ids:
            # vLLM >= 0.10.2: prompt_token_ids (top level) and choices[].token_ids.
            body["return_token_ids"] = True
            # choices[].logprobs.content[].logprob: the sampled token's logprob.
            body["logprobs"] = True
        return body

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]],
        sampling: Sampling,
        model: str | None = None,
    ) -> Completion:
        """One chat completion request, retrying what is worth it (``model``: its own)."""

        def encode() -> bytes:
            body = self.request_body(messages, tools=tools, sampling=sampling, model=model)
            return _dumps(body)

        payload = encode()
        started = time.monotonic()
        retries = 0
        while True:
            try:
                completion = await self._attempt(payload, started, retries)
            except ModelServerError as refused:
                # A strict server (OpenAI's own API) rejects vLLM's extra fields instead of
                # ignoring them: drop them for the rest of this client's life and ask again.
                if not (self.token_ids and refused.status in (400, 422)):
                    raise
                if not any(field in str(refused) for field in ("return_token_ids", "logprobs")):
                    raise
                logger.warning(
                    "the model server at %s refused vLLM's token id fields (%s); continuing "
                    "without token ids",
                    self.url,
                    refused,
                )
                self.token_ids = False
                payload = encode()
                continue
            except _Retryable as failure:
                if retries >= self.max_retries:
                    raise ModelServerError(
                        f"the model server at {self.url} failed {retries + 1} times; "
                        f"last: {failure}. Check that the server is up and not overloaded.",
                        status=failure.status,
                    ) from None
                wait = failure.wait
                if wait is None:
                    wait = random.uniform(0, min(self.backoff_max, self.backoff_base * 2**retries))
                retries += 1
                logger.debug(
                    "model request failed (%s); retry %d/%d in %.2fs",
                    failure,
                    retries,
                    self.max_retries,
                    wait,
                )
                await asyncio.sleep(wait)
                continue
            return completion

    async def _attempt(self, payload: bytes, started: float, retries: int) -> Completion:
        """One request: the answer of a 200 (``started`` and ``retries`` for its latency)."""
        session = self._get_session()
        assert self._slots is not None
        try:
            async with (
                self._slots,
                asyncio.timeout(self.request_timeout),
                session.post(self.url, data=payload, headers=self._headers) as response,
            ):
                body = await response.read()
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise _Retryable(f"connection error: {type(exc).__name__}: {exc}") from None
        except TimeoutError:
            raise _Retryable(f"no answer within {self.request_timeout:g}s") from None
        if status == 200:
            return read_answer(body, latency=time.monotonic() - started, retries=retries)
        message = _error_message(body)
        if status >= 500 or status in _RETRY_4XX:
            wait = _retry_after(retry_after) if status in (429, 503) else None
            if wait is not None:
                wait = min(wait, self.backoff_max * 4)
            raise _Retryable(f"HTTP {status}: {message[:500]}", status=status, wait=wait)
        if status in (400, 413, 422) and is_context_length_message(message):
            raise ContextLengthError(message)
        raise ModelServerError(
            f"the model server at {self.url} refused the request (HTTP {status}): {message}",
            status=status,
        )


class PinnedPolicy:
    """A :class:`ChatClient` with its connections and a fixed served model (an episode keeps
    its weights version); with ``seed``, turn ``k`` carries ``seed + k`` (sampled alone)."""

    def __init__(self, client: ChatClient, model: str, *, seed: int | None = None) -> None:
        self.client = client
        self.model = model
        self.seed = seed
        self.turns = 0

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]], sampling: Sampling
    ) -> Completion:
        """One chat turn from ``model`` (seeded with the turn's seed when the policy has one)."""
        if self.seed is not None:
            sampling = sampling.seeded(self.seed + self.turns)
        self.turns += 1
        return await self.client.complete(
            messages, tools=tools, sampling=sampling, model=self.model
        )
