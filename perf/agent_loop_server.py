"""The fast scripted OpenAI-compatible server of ``perf/agent_loop.py`` (a separate process).

    python perf/agent_loop_server.py --turns 20 [--workers 2] [--port 0]

Answers ``POST /v1/chat/completions`` with the scripted turn of ``agent_loop_workload``: one tool
call per answer, the submit on the last turn, in vLLM's response shape: ``prompt_token_ids`` at
the top and ``token_ids`` on the choice when the request asks ``return_token_ids``, and
per-token ``logprobs`` when it asks ``logprobs``. Standard library only, so it runs under any
interpreter.

It does as little as it can per request, because it is not what is measured: the turn is the
number of assistant messages in the request plus one (counted on the raw bytes: inside JSON
strings quotes are escaped, so ``"role": "assistant"`` can only be a key and its value), the
side is told by the model name, and every answer body is built once and reused. A pre-forked
process per ``--workers`` accepts on one shared listening socket. It prints ``{"port": N}`` on
stdout when ready and exits when its standard input closes (so it never outlives the benchmark)
or on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sys
from functools import cache

import agent_loop_workload as workload

_ASSISTANT = (b'"role":"assistant"', b'"role": "assistant"')
_TOKEN_IDS = re.compile(rb'"return_token_ids"\s*:\s*true')
_LOGPROBS = re.compile(rb'"logprobs"\s*:\s*true')


@cache
def _prompts(turns: int) -> list[list[int]]:
    return workload.prompt_ids(turns)


@cache
def answer(turns: int, turn: int, mini: bool, token_ids: bool, logprobs: bool) -> bytes:
    """The whole HTTP response (head and body) of ``turn`` for one side and request flags."""
    turn = min(turn, turns)
    step = workload.action(turn, turns)
    if mini:
        name, arguments = "bash", {"command": step.command}
    else:
        name, arguments = step.tool, step.arguments
    completion = workload.completion_ids(turn, turns)
    prompt = _prompts(turns)[turn - 1]
    text = workload.completion_text(turn, turns)
    choice: dict[str, object] = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": step.thought,
            "tool_calls": [
                {
                    "id": f"call_{turn}_0",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        },
        "logprobs": None,
        "finish_reason": "tool_calls",
        "stop_reason": None,
    }
    if logprobs:
        pieces = [text[i : i + 4] for i in range(0, len(text), 4)] + ["<|im_end|>"]
        choice["logprobs"] = {
            "content": [
                {
                    "token": piece,
                    "logprob": -((k * 2654435761) % 1000) / 1000.0,
                    "bytes": list(piece.encode()),
                    "top_logprobs": [],
                }
                for k, piece in enumerate(pieces)
            ]
        }
    if token_ids:
        choice["token_ids"] = completion
    body: dict[str, object] = {
        "id": f"chatcmpl-scripted-{turn}",
        "object": "chat.completion",
        "created": 1763697600,
        "model": workload.MINI_MODEL if mini else workload.CRL_MODEL,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(completion),
            "total_tokens": len(prompt) + len(completion),
        },
        "prompt_logprobs": None,
    }
    if token_ids:
        body["prompt_token_ids"] = prompt
    data = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    return head + data


def respond(turns: int, body: bytes) -> bytes:
    """The answer to one request body."""
    turn = 1 + sum(body.count(pattern) for pattern in _ASSISTANT)
    mini = workload.MINI_MODEL.encode() in body
    return answer(
        turns, turn, mini, _TOKEN_IDS.search(body) is not None, _LOGPROBS.search(body) is not None
    )


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: requests with a Content-Length body, in order."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            start = head.find(b"\r\ncontent-length:")
            if start < 0:
                length = 0
            else:
                stop = head.find(b"\r\n", start + 2)
                length = int(head[start + 17 : stop if stop > 0 else len(head)])
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            if head.startswith(b"post"):
                self.transport.write(respond(self.turns, body))
            else:
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            if b"\r\nconnection: close" in head:
                self.transport.close()
                return


async def _serve(sock: socket.socket, turns: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(turns), sock=sock)
    parent = os.getppid()
    async with server:
        while os.getppid() == parent:  # the parent died: stop too
            await asyncio.sleep(1.0)


def main() -> None:
    """Bind, fork the workers, announce the port, wait for stdin to close."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    for turn in range(1, args.turns + 1):  # build every answer before the first request
        for flags in range(8):
            answer(args.turns, turn, bool(flags & 1), bool(flags & 2), bool(flags & 4))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(4096)
    sock.setblocking(False)
    children = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:
            try:
                asyncio.run(_serve(sock, args.turns))
            finally:
                os._exit(0)
        children.append(pid)

    def stop(*_: object) -> None:
        for pid in children:
            os.kill(pid, signal.SIGTERM)
        for pid in children:
            os.waitpid(pid, 0)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(json.dumps({"port": sock.getsockname()[1], "workers": children}), flush=True)
    sys.stdin.read()
    stop()


if __name__ == "__main__":
    main()
