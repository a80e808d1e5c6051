"""ChatClient against the scripted OpenAI-compatible server over real HTTP: request shape, vLLM
token ids, retries, and the errors that end a trajectory."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from crl_worker.agent import ChatClient, ContextLengthError, ModelServerError
from crl_worker.agent.client import context_room, is_context_length_message
from crl_worker.agent.sampling import Sampling
from crl_worker.errors import InfrastructureError
from tests.fixtures.openai_server import (
    CONTEXT_LENGTH_MESSAGE,
    ScriptedServer,
    Step,
    call,
    context_length,
    drop,
    error,
    marker,
    render_completion,
    render_prompt,
    text,
    tokenize,
    toy_logprob,
)
from tests.fixtures.ports import free_port

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def chat(key: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": f"Fix it. {marker(key)}"},
    ]


async def ask(client: ChatClient, key: str, max_tokens: int = 64) -> Any:
    return await client.complete(
        chat(key), tools=TOOLS, sampling=Sampling(max_tokens=max_tokens, temperature=0.7, top_p=0.9)
    )


def fast_client(url: str, **kw: Any) -> ChatClient:
    options: dict[str, Any] = {"backoff_base": 0.01, "max_retries": 3, **kw}
    return ChatClient(url, "scripted", **options)


async def test_request_shape_and_vllm_token_ids(server: ScriptedServer) -> None:
    server.script("ids", call("shell", {"command": "ls"}, content="Let me look."))
    async with fast_client(server.url, api_key="secret") as client:
        completion = await ask(client, "ids", max_tokens=77)
    body = server.requests_for("ids")[0].body
    assert body["model"] == "scripted"
    assert body["max_tokens"] == 77
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9)
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto"
    assert body["return_token_ids"] is True and body["logprobs"] is True
    assert body["messages"] == chat("ids")
    # Token ids and logprobs exactly as the server sent them; the prompt's array was cut out of
    # the body undecoded (its bytes kept), the rest decoded.
    assert completion.prompt_token_ids is None
    assert completion.prompt_token_ids_raw is not None
    prompt_ids = completion.prompt_ids()
    assert prompt_ids is not None
    assert prompt_ids.tolist() == tokenize(render_prompt(chat("ids")))
    assert completion.completion_token_ids is not None
    ids = completion.completion_token_ids.tolist()
    assert ids == tokenize(render_completion(completion.message))
    assert completion.completion_logprobs is not None
    assert completion.completion_logprobs.tolist() == [toy_logprob(t) for t in ids]
    assert completion.prompt_tokens == len(prompt_ids)
    assert completion.completion_tokens == len(ids)
    assert completion.finish_reason == "tool_calls"
    assert completion.message["content"] == "Let me look."
    assert completion.message["tool_calls"][0]["function"]["name"] == "shell"
    assert completion.retries == 0 and completion.latency > 0


async def test_server_ignoring_token_fields_still_works() -> None:
    async with ScriptedServer(vllm=False) as plain, fast_client(plain.url) as client:
        plain.script("plain", text("hello"))
        completion = await ask(client, "plain")
    assert plain.requests_for("plain")[0].body["return_token_ids"] is True
    assert completion.message["content"] == "hello"
    assert completion.prompt_ids() is None and completion.prompt_token_ids_raw is None
    assert completion.completion_token_ids is None
    assert completion.completion_logprobs is None
    assert completion.prompt_tokens > 0


async def test_token_ids_off_sends_no_vllm_fields(server: ScriptedServer) -> None:
    server.script("off", text("hi"))
    async with fast_client(server.url, token_ids=False) as client:
        completion = await ask(client, "off")
    body = server.requests_for("off")[0].body
    assert "return_token_ids" not in body and "logprobs" not in body
    assert completion.prompt_token_ids is None


async def test_429_honours_retry_after(server: ScriptedServer) -> None:
    server.script("busy", error(429, "slow down", retry_after="1"), text("ok"))
    async with fast_client(server.url) as client:
        completion = await ask(client, "busy")
    assert completion.message["content"] == "ok"
    assert completion.retries == 1
    # The jittered backoff alone would have waited at most 0.01 s.
    assert completion.latency >= 1.0
    assert [r.status for r in server.requests_for("busy")] == [429, 200]


async def test_500_and_dropped_connection_are_retried(server: ScriptedServer) -> None:
    server.script("flaky", error(500, "engine hiccup"), drop(), error(503), text("ok"))
    async with fast_client(server.url) as client:
        completion = await ask(client, "flaky")
    assert completion.message["content"] == "ok"
    assert completion.retries == 3
    assert [r.status for r in server.requests_for("flaky")] == [500, 0, 503, 200]


async def test_persistent_5xx_is_a_model_server_error(server: ScriptedServer) -> None:
    server.script("down", *[error(502, "bad gateway")] * 4)
    async with fast_client(server.url) as client:
        with pytest.raises(ModelServerError) as caught:
            await ask(client, "down")
    assert isinstance(caught.value, InfrastructureError)
    assert "failed 4 times" in str(caught.value) and "bad gateway" in str(caught.value)
    assert caught.value.status == 502
    assert len(server.requests_for("down")) == 4  # the first attempt and three retries


async def test_unreachable_server_is_a_model_server_error() -> None:
    async with fast_client(f"http://127.0.0.1:{free_port()}/v1", max_retries=2) as client:
        with pytest.raises(ModelServerError, match="connection error"):
            await ask(client, "nobody")


async def test_slow_answers_time_out_and_are_retried(server: ScriptedServer) -> None:
    server.script("slow", Step(content="late", delay=2.0), text("in time"))
    async with fast_client(server.url, request_timeout=0.5) as client:
        completion = await ask(client, "slow")
    assert completion.message["content"] == "in time"
    assert completion.retries == 1


async def test_context_length_400_is_not_retried(server: ScriptedServer) -> None:
    server.script("long", context_length(), text("never sent"))
    async with fast_client(server.url) as client:
        with pytest.raises(ContextLengthError, match="maximum context length"):
            await ask(client, "long")
    assert len(server.requests_for("long")) == 1


async def test_other_4xx_is_a_model_server_error_with_the_message(server: ScriptedServer) -> None:
    server.script("nomodel", error(404, "The model `scripted` does not exist."))
    async with fast_client(server.url) as client:
        with pytest.raises(ModelServerError, match=r"HTTP 404.*does not exist") as caught:
            await ask(client, "nomodel")
    assert caught.value.status == 404
    assert len(server.requests_for("nomodel")) == 1


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("This model's maximum context length is 32768 tokens. However, you requested 33000", True),
        ("prompt is too long: 210000 tokens > 200000 maximum", True),
        ("the request exceeds the available context size, try increasing it", True),
        ("Invalid value for temperature", False),
    ],
)
def test_context_length_phrases(message: str, expected: bool) -> None:
    assert is_context_length_message(message) is expected


async def test_connection_limit_is_back_pressure(server: ScriptedServer) -> None:
    for n in range(40):
        server.script(f"c{n}", Step(content="ok", delay=0.05))
    async with fast_client(server.url, max_connections=4) as client:
        answers = await asyncio.gather(*(ask(client, f"c{n}") for n in range(40)))
    assert all(a.message["content"] == "ok" for a in answers)
    assert server.max_in_flight <= 4
    assert len(server.requests) == 40


async def test_waiting_for_a_connection_does_not_count_as_request_time(
    server: ScriptedServer,
) -> None:
    # Each answer takes 0.4 s against a 1.2 s limit (room for a loaded CI machine: with 0.3 s
    # against 0.6 s one request was timed out at load 7); the last waits ~1.2 s for the one
    # connection and ends ~1.6 s after it was asked, past the limit were waiting counted.
    for n in range(4):
        server.script(f"q{n}", Step(content="ok", delay=0.4))
    async with fast_client(server.url, max_connections=1, request_timeout=1.2) as client:
        answers = await asyncio.gather(*(ask(client, f"q{n}") for n in range(4)))
    # The last request waited ~1.2 s for the one connection, yet none timed out.
    assert [a.retries for a in answers] == [0, 0, 0, 0]
    assert server.max_in_flight == 1


async def test_strict_server_refusing_vllm_fields_is_asked_again_without_them() -> None:
    async with ScriptedServer(strict=True) as strict, fast_client(strict.url) as client:
        strict.script("strict", text("one"), text("two"))
        first = await ask(client, "strict")
        second = await ask(client, "strict")
    assert (first.message["content"], second.message["content"]) == ("one", "two")
    assert first.prompt_token_ids is None and first.retries == 0
    assert [r.status for r in strict.requests] == [400, 200, 200]
    assert "return_token_ids" not in strict.requests[2].body  # remembered for later calls
    assert client.token_ids is False


@pytest.mark.parametrize(
    ("message", "room"),
    [
        # vLLM >= 0.10: the prompt fits, prompt + max_tokens does not.
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 4096. This model's maximum"
            " context length is 32768 tokens and your request has 30000 input tokens"
            " (4096 > 32768 - 30000).",
            2768,
        ),
        # Older vLLM.
        (
            "This model's maximum context length is 4096 tokens. However, you requested 4500"
            " tokens (4000 in the messages, 500 in the completion). Please reduce the length of"
            " the messages or completion.",
            96,
        ),
        # The prompt alone is too long: no room.
        (CONTEXT_LENGTH_MESSAGE, -904),
        ("prompt is too long: 210000 tokens > 200000 maximum", None),
    ],
)
def test_context_room_from_vllm_messages(message: str, room: int | None) -> None:
    assert context_room(message) == room
