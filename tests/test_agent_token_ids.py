"""The token-id recording path: the prompt id array cut out of the raw response bytes, the
byte-prefix deduplication (exact against a full decode in every case), the array-backed storage
and the unchanged JSON line format."""

from __future__ import annotations

import gc
import json
import random
from array import array
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from crl_worker.agent import ChatClient, Trajectory, Turn, run_agent
from crl_worker.agent.client import (
    ModelServerError,
    parse_completion,
    read_answer,
    split_prompt_ids,
)
from crl_worker.agent.loop import tune_gc
from crl_worker.agent.trajectory import (
    PromptIds,
    TokenSequence,
    decode_token_ids,
    dedupe_prompt_ids,
    token_ids,
)
from crl_worker.api.common import AgentSpec
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task
from tests.fixtures.openai_server import (
    ScriptedServer,
    Step,
    call,
    marker,
    render_prompt,
    text,
    tokenize,
)
from tests.fixtures.repos import python_task

# --- cutting the prompt ids out of the body ---------------------------------------------------


def body(**fields: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "id": "chatcmpl-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi", "tool_calls": []},
                "finish_reason": "stop",
                "token_ids": [7, 8],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    answer.update(fields)
    return answer


@pytest.mark.parametrize(
    ("separators", "raw"),
    [((",", ":"), b"1,22,333"), ((", ", ": "), b"1, 22, 333")],
    ids=["compact", "spaced"],
)
def test_the_prompt_array_is_cut_out_and_the_rest_decoded(
    separators: tuple[str, str], raw: bytes
) -> None:
    data = body(prompt_token_ids=[1, 22, 333])
    encoded = json.dumps(data, separators=separators).encode()
    decoded, cut = split_prompt_ids(encoded)
    assert cut == raw
    assert decoded == {**data, "prompt_token_ids": None}
    assert decode_token_ids(cut).tolist() == [1, 22, 333]


def test_whitespace_anywhere_around_and_inside_the_array() -> None:
    encoded = b'{"choices": [], "prompt_token_ids"  :\n [ 1 ,\t2\r\n,3 ] , "x": 1}'
    decoded, cut = split_prompt_ids(encoded)
    assert cut == b" 1 ,\t2\r\n,3 "
    assert decoded == {"choices": [], "prompt_token_ids": None, "x": 1}
    assert decode_token_ids(cut).tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "encoded",
    [
        b'{"choices": [], "prompt_token_ids": null}',  # vLLM without return_token_ids
        b'{"choices": []}',  # a server that never sends them
        b'{"choices": [], "prompt_token_ids": [1.5, 2]}',  # not ints: decoded as is
        b'{"choices": [], "prompt_token_ids": [-1, 2]}',  # a sign: decoded as is
        b'{"choices": [], "prompt_token_ids": [[1], [2]]}',  # nested: decoded as is
        b'{"choices": [], "prompt_token_ids": "1,2"}',  # a string
    ],
)
def test_anything_but_an_array_of_ints_decodes_the_whole_body(encoded: bytes) -> None:
    decoded, cut = split_prompt_ids(encoded)
    assert cut is None
    assert decoded == json.loads(encoded)


def test_the_key_as_text_in_a_message_is_not_cut() -> None:
    tricky = 'see "prompt_token_ids": [9, 9] and prompt_token_ids: [8]'
    data = body(prompt_token_ids=[1, 2])
    data["choices"][0]["message"]["content"] = tricky
    data["choices"][0]["message"]["tool_calls"] = [
        {"function": {"name": "prompt_token_ids", "arguments": '{"prompt_token_ids": [5]}'}}
    ]
    decoded, cut = split_prompt_ids(json.dumps(data).encode())
    assert cut == b"1, 2"
    assert decoded["choices"][0]["message"]["content"] == tricky
    assert (
        decoded["choices"][0]["message"]["tool_calls"]
        == data["choices"][0]["message"]["tool_calls"]
    )


def test_a_nested_or_repeated_key_falls_back_to_decoding_everything() -> None:
    # A nested key first: cutting it would leave the top-level key's own array, so the cut is
    # refused and the body decoded whole (the top-level ids as sent).
    nested = b'{"choices": [{"prompt_token_ids": [5, 6]}], "prompt_token_ids": [1, 2]}'
    decoded, cut = split_prompt_ids(nested)
    assert cut is None and decoded == json.loads(nested)
    # A repeated key: the JSON decoder keeps the last one; so does the fallback.
    repeated = b'{"prompt_token_ids": [1], "prompt_token_ids": [2], "choices": []}'
    decoded, cut = split_prompt_ids(repeated)
    assert cut is None and decoded["prompt_token_ids"] == [2]
    # A key named `x\"prompt_token_ids` also ends with the pattern's bytes.
    escaped = b'{"x\\"prompt_token_ids": [3], "prompt_token_ids": [4]}'
    decoded, cut = split_prompt_ids(escaped)
    assert cut is None and decoded == json.loads(escaped)


def test_a_truncated_or_broken_body_is_still_malformed() -> None:
    with pytest.raises(ValueError):
        split_prompt_ids(b'{"choices": [], "prompt_token_ids": [1, 2')
    with pytest.raises(ValueError):
        split_prompt_ids(b'{"choices": [, "prompt_token_ids": [1, 2]}')


def test_parse_completion_keeps_the_cut_bytes_and_makes_arrays() -> None:
    decoded, cut = split_prompt_ids(json.dumps(body(prompt_token_ids=[1, 2, 3])).encode())
    completion = parse_completion(decoded, latency=0.1, retries=0, prompt_ids_raw=cut)
    assert completion.prompt_token_ids is None and completion.prompt_token_ids_raw == b"1, 2, 3"
    assert completion.prompt_ids() == array("i", [1, 2, 3])
    assert completion.completion_token_ids == array("i", [7, 8])
    # The raw bytes are not part of the serialized answer.
    assert "prompt_token_ids_raw" not in completion.model_dump()
    with pytest.raises(ModelServerError, match="not lists of numbers"):
        parse_completion(body(prompt_token_ids=[2**40]), latency=0.1, retries=0)


# --- deduplication by byte prefix ---------------------------------------------------------------


def encode(ids: list[int], separator: bytes = b",") -> bytes:
    return separator.join(str(i).encode() for i in ids)


def reference(turns: list[tuple[list[int] | None, list[int] | None]]) -> list[tuple[Any, int]]:
    """What deduplication gives with every prompt decoded whole (the logic before the byte
    prefix): (stored ids, offset) per turn."""
    result: list[tuple[Any, int]] = []
    running: list[int] | None = None
    for prompt, completion in turns:
        stored, offset = dedupe_prompt_ids(
            None if running is None else token_ids(running),
            None if prompt is None else token_ids(prompt),
        )
        result.append((None if stored is None else stored.tolist(), offset))
        running = None if prompt is None or completion is None else prompt + completion
    return result


def record(
    turns: list[tuple[list[int] | None, list[int] | None]], separators: list[bytes]
) -> tuple[list[tuple[Any, int]], PromptIds]:
    tracker = PromptIds()
    result: list[tuple[Any, int]] = []
    for (prompt, completion), separator in zip(turns, separators, strict=True):
        raw = None if prompt is None else b" " + encode(prompt, separator) + b"\n"
        found = tracker.add(None, raw, None if completion is None else token_ids(completion))
        assert found.length == (None if prompt is None else len(prompt))
        result.append((None if found.stored is None else found.stored.tolist(), found.offset))
    return result, tracker


def test_a_prompt_extending_the_last_one_decodes_only_what_is_new() -> None:
    turns: list[tuple[list[int] | None, list[int] | None]] = [
        ([1, 2, 3], [4, 5]),
        ([1, 2, 3, 4, 5, 6, 7], [8]),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], [10]),
    ]
    found, tracker = record(turns, [b","] * 3)
    assert found == [([1, 2, 3], 0), ([6, 7], 5), ([9], 8)]
    assert found == reference(turns)
    # The first prompt, then only each later prompt's new part (with the completion it repeats).
    assert tracker.decoded == 3 + 4 + 2


@pytest.mark.parametrize(
    ("previous", "completion", "new", "expected"),
    [
        # The previous prompt's last id goes on (3 -> 34): not a prefix in ids.
        ([1, 2, 3], [4], [1, 2, 34, 5], ([1, 2, 34, 5], 0)),
        # Byte prefix, but the completion is not what follows (a template that renders the
        # answer differently from the sampled ids).
        ([1, 2, 3], [4], [1, 2, 3, 7, 5], ([1, 2, 3, 7, 5], 0)),
        # History re-rendered: the bytes differ early.
        ([1, 2, 3], [4], [1, 9, 3, 4, 5], ([1, 9, 3, 4, 5], 0)),
        # The same prompt again after an empty completion.
        ([1, 2, 3], [], [1, 2, 3], ([], 3)),
        # Shorter than the previous prompt.
        ([1, 2, 3], [4], [1, 2], ([1, 2], 0)),
    ],
)
def test_anything_but_an_exact_extension_gives_what_a_full_decode_gives(
    previous: list[int], completion: list[int], new: list[int], expected: tuple[Any, int]
) -> None:
    turns: list[tuple[list[int] | None, list[int] | None]] = [(previous, completion), (new, [0])]
    found, _ = record(turns, [b","] * 2)
    assert found[1] == expected == reference(turns)[1]


def test_bytes_formatted_differently_still_find_the_extension() -> None:
    turns: list[tuple[list[int] | None, list[int] | None]] = [
        ([1, 2, 3], [4]),
        ([1, 2, 3, 4, 5], [6]),
        ([1, 2, 3, 4, 5, 6, 7], [8]),
    ]
    found, tracker = record(turns, [b",", b", ", b" ,\n"])
    assert found == reference(turns) == [([1, 2, 3], 0), ([5], 4), ([7], 6)]
    assert tracker.decoded > 3 + 2 + 2  # each differently formatted prompt decoded whole


def test_random_conversations_match_the_full_decode_exactly() -> None:
    rng = random.Random(5)
    for _ in range(300):
        turns: list[tuple[list[int] | None, list[int] | None]] = []
        prompt = [rng.randrange(0, 200) for _ in range(rng.randrange(0, 6))]
        for _ in range(rng.randrange(1, 7)):
            completion = [rng.randrange(0, 200) for _ in range(rng.randrange(0, 4))]
            turns.append((prompt, completion))
            extended = prompt + completion + [rng.randrange(0, 200) for _ in range(3)]
            roll = rng.random()
            if roll < 0.15 and extended:  # history re-rendered
                extended[rng.randrange(len(extended))] += 1
            elif roll < 0.25 and prompt:  # the last number goes on
                extended = [*prompt[:-1], prompt[-1] * 10 + 7, *extended[len(prompt) :]]
            elif roll < 0.3:
                extended = list(prompt)
            prompt = extended
            if rng.random() < 0.05:
                turns.append((None, [1]))  # a turn without prompt ids
        separators = [rng.choice([b",", b", ", b" , "]) for _ in turns]
        assert record(turns, separators)[0] == reference(turns)


def test_prompts_given_as_ids_and_as_bytes_mix() -> None:
    tracker = PromptIds()
    first = tracker.add(token_ids([1, 2]), None, token_ids([3]))
    second = tracker.add(None, b"1,2,3,4", token_ids([5]))
    third = tracker.add(token_ids([1, 2, 3, 4, 5, 6]), None, token_ids([7]))
    assert [
        (r.stored.tolist() if r.stored else None, r.offset) for r in (first, second, third)
    ] == [
        ([1, 2], 0),
        ([4], 3),
        ([6], 5),
    ]


def test_malformed_array_bytes_are_refused() -> None:
    tracker = PromptIds()
    tracker.add(None, b"1,2", token_ids([3]))
    with pytest.raises(ValueError):
        tracker.add(None, b"1,2,3,", token_ids([4]))
    with pytest.raises(ValueError):
        PromptIds().add(None, b"1,,2", None)


# --- storage and the JSON line format ---------------------------------------------------------

#: A trajectory line written before the ids became arrays (list fields), byte for byte.
OLD_LINE = (
    '{"instance_id":"x","repo":"o/r","attempt":0,"model":"m","template":"swe-default","tools":[],'
    '"started_at":"2026-11-21T05:00:00Z","duration":0.0,"messages":[],"turns":[{"index":0,'
    '"started":1.5,"latency":0.25,"retries":0,"finish_reason":null,"max_tokens":16,'
    '"prompt_tokens":0,"completion_tokens":0,"message_index":2,"reasoning":null,'
    '"prompt_token_ids":[0,1,151643,2147483647],"prompt_ids_offset":0,'
    '"completion_token_ids":[7,8,9],"completion_logprobs":[-0.1,-0.000025,0.0],"tool_calls":[]},'
    '{"index":1,"started":2.5,"latency":0.25,"retries":0,"finish_reason":null,"max_tokens":16,'
    '"prompt_tokens":0,"completion_tokens":0,"message_index":4,"reasoning":null,'
    '"prompt_token_ids":[10,11],"prompt_ids_offset":7,"completion_token_ids":[12],'
    '"completion_logprobs":[-17.25],"tool_calls":[]},{"index":2,"started":3.5,"latency":0.25,'
    '"retries":0,"finish_reason":null,"max_tokens":16,"prompt_tokens":0,"completion_tokens":0,'
    '"message_index":6,"reasoning":null,"prompt_token_ids":null,"prompt_ids_offset":0,'
    '"completion_token_ids":null,"completion_logprobs":null,"tool_calls":[]}],'
    '"exit_reason":"max_turns","error":null,"prompt_tokens":0,"completion_tokens":0,"diff":"",'
    '"evaluation":null,"reward":null}'
)
#: Its first two turns' token sequence, as the list-backed code wrote it.
OLD_SEQUENCE = (
    '{"ids":[0,1,151643,2147483647,7,8,9,10,11,12],"mask":[0,0,0,0,1,1,1,0,0,1],'
    '"logprobs":[0.0,0.0,0.0,0.0,-0.1,-0.000025,0.0,0.0,0.0,-17.25],'
    '"completion_spans":[[4,7],[9,10]]}'
)


def handmade(**lists: Any) -> Trajectory:
    def turn(index: int, **kw: Any) -> Turn:
        return Turn(index=index, started=1.5 + index, latency=0.25, max_tokens=16,
                    message_index=2 + 2 * index, **kw)  # fmt: skip

    return Trajectory(
        instance_id="x",
        repo="o/r",
        model="m",
        started_at=datetime(2026, 11, 21, 5, 0, tzinfo=UTC),
        exit_reason="max_turns",
        turns=[
            turn(0, prompt_token_ids=lists["p0"], completion_token_ids=lists["c0"],
                 completion_logprobs=lists["l0"]),
            turn(1, prompt_token_ids=lists["p1"], prompt_ids_offset=7,
                 completion_token_ids=lists["c1"], completion_logprobs=lists["l1"]),
            turn(2),
        ],
    )  # fmt: skip


LISTS: dict[str, list[Any]] = {
    "p0": [0, 1, 151643, 2147483647],
    "c0": [7, 8, 9],
    "l0": [-0.1, -2.5e-05, 0.0],
    "p1": [10, 11],
    "c1": [12],
    "l1": [-17.25],
}


def test_array_backed_ids_write_the_same_line_as_lists_did() -> None:
    from_lists = handmade(**LISTS)
    from_arrays = handmade(
        **{k: array("d" if k.startswith("l") else "i", v) for k, v in LISTS.items()}
    )
    assert isinstance(from_lists.turns[0].prompt_token_ids, array)
    assert from_lists == from_arrays
    assert from_lists.to_json() == from_arrays.to_json() == OLD_LINE
    # Old lines still read, into arrays, and write back byte for byte.
    again = Trajectory.model_validate_json(OLD_LINE)
    assert again == from_lists and again.to_json() == OLD_LINE
    assert again.turns[0].completion_logprobs == array("d", LISTS["l0"])
    # The trainer's views are arrays with the same content and the same JSON as before.
    first_two = again.model_copy(update={"turns": again.turns[:2]})
    sequence = first_two.token_sequence()
    assert sequence is not None
    assert sequence.model_dump_json() == OLD_SEQUENCE
    assert TokenSequence.model_validate_json(OLD_SEQUENCE) == sequence
    assert isinstance(sequence.ids, array) and sequence.ids.typecode == "i"
    assert [s.prompt_ids.tolist() for s in first_two.turn_samples()] == [
        [0, 1, 151643, 2147483647],
        [0, 1, 151643, 2147483647, 7, 8, 9, 10, 11],
    ]
    # Python-mode dumps give lists (json.dumps works on them).
    assert json.dumps(again.model_dump(mode="python")["turns"][0]["prompt_token_ids"]) == (
        "[0, 1, 151643, 2147483647]"
    )


@pytest.mark.parametrize(
    "bad",
    [[2**31], ["1"], [True], "12", [1.5]],
)
def test_ids_that_are_not_32_bit_ints_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="token ids"):
        Turn(index=0, started=0.0, latency=0.0, max_tokens=1, message_index=2,
             prompt_token_ids=bad)  # fmt: skip


# --- through the loop, over HTTP ----------------------------------------------------------------


@pytest.fixture
async def roman(tmp_path: Path) -> AsyncIterator[tuple[Task, Sandbox]]:
    task = python_task(tmp_path)
    async with create_sandbox({"type": "local"}, task) as box:
        yield task, box


def keyed(task: Task, key: str) -> Task:
    return task.model_copy(update={"problem_statement": f"{task.problem_statement}\n{marker(key)}"})


async def run(
    server: ScriptedServer, roman: tuple[Task, Sandbox], key: str, *steps: Step
) -> Trajectory:
    task, sandbox = roman
    server.script(key, *steps)
    async with ChatClient(server.url, "scripted", backoff_base=0.01, max_retries=1) as client:
        return await run_agent(keyed(task, key), sandbox, client, AgentSpec())


def stored(trajectory: Trajectory) -> list[tuple[Any, int]]:
    return [
        (None if t.prompt_token_ids is None else t.prompt_token_ids.tolist(), t.prompt_ids_offset)
        for t in trajectory.turns
    ]


def server_prompts(server: ScriptedServer, key: str) -> list[list[int]]:
    return [tokenize(render_prompt(r.body["messages"])) for r in server.requests_for(key)]


VIEW = {"path": "README.md"}


def expected(server: ScriptedServer, key: str, trajectory: Trajectory) -> list[tuple[Any, int]]:
    """What deduplicating the server's own tokenization of each request gives."""
    completions = [
        None if t.completion_token_ids is None else t.completion_token_ids.tolist()
        for t in trajectory.turns
    ]
    return reference(list(zip(server_prompts(server, key), completions, strict=True)))


async def test_bytes_formatted_differently_each_turn_store_the_same_ids(
    server: ScriptedServer, roman: tuple[Task, Sandbox]
) -> None:
    same = [call("view", VIEW), text("hmm"), call("view", VIEW), call("submit")]
    fast = await run(server, roman, "fast", *same)
    flipping = [
        Step(content=s.content, calls=s.calls, compact=n % 2 == 1) for n, s in enumerate(same)
    ]
    slow = await run(server, roman, "slow", *flipping)
    for trajectory, key in ((fast, "fast"), (slow, "slow")):
        assert stored(trajectory) == expected(server, key, trajectory)
        assert all(offset > 0 for _, offset in stored(trajectory)[1:])
        assert [p.tolist() if p is not None else None for p in trajectory.full_prompt_ids()] == (
            server_prompts(server, key)
        )
        assert trajectory.token_sequence_problem() is None


async def test_a_completion_the_template_does_not_render_back_breaks_the_chain(
    server: ScriptedServer, roman: tuple[Task, Sandbox]
) -> None:
    trajectory = await run(
        server,
        roman,
        "eos",
        call("view", VIEW),
        call("view", VIEW, unrendered_eos=True),
        call("view", VIEW),
        call("submit"),
    )
    assert stored(trajectory) == expected(server, "eos", trajectory)
    offsets = [offset for _, offset in stored(trajectory)]
    assert offsets[0] == 0 and offsets[1] > 0 and offsets[2] == 0 and offsets[3] > 0
    prompts = server_prompts(server, "eos")
    assert [p.tolist() if p is not None else None for p in trajectory.full_prompt_ids()] == prompts
    assert stored(trajectory)[2] == (prompts[2], 0)
    problem = trajectory.token_sequence_problem() or ""
    assert "turn 2's prompt does not start with turn 1's" in problem
    assert len(trajectory.turn_samples()) == 4


async def test_a_turn_without_prompt_ids_restarts_the_chain(
    server: ScriptedServer, roman: tuple[Task, Sandbox]
) -> None:
    trajectory = await run(
        server,
        roman,
        "null",
        call("view", VIEW, compact=True),
        call("view", VIEW, null_prompt_ids=True, compact=True),
        call("submit", compact=True),
    )
    prompts = server_prompts(server, "null")
    assert stored(trajectory) == [(prompts[0], 0), (None, 0), (prompts[2], 0)]
    assert trajectory.token_sequence() is None
    assert "turn 1 has no token ids" in (trajectory.token_sequence_problem() or "")


# --- the garbage collector ------------------------------------------------------------------------


def test_an_answer_s_short_lived_objects_trigger_no_collection() -> None:
    entries = [
        {"token": f"t{i}", "logprob": -i / 1000, "bytes": [116, i % 256], "top_logprobs": []}
        for i in range(2000)
    ]
    answer = body(prompt_token_ids=list(range(5000)))
    answer["choices"][0]["logprobs"] = {"content": entries}
    answer["choices"][0]["token_ids"] = list(range(2000))
    encoded = json.dumps(answer).encode()
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.callbacks.append(count)
    try:
        gc.collect()
        collections.clear()
        completion = read_answer(encoded, latency=0.0, retries=0)
        # 6,000 containers decoded and freed again (each entry: a dict and two lists) would
        # have triggered young collections at Python's threshold of 700.
        assert collections == []
        assert gc.isenabled()
        gc.disable()
        read_answer(encoded, latency=0.0, retries=0)
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()
        gc.callbacks.remove(count)
        gc.set_threshold(*thresholds)
    assert completion.completion_logprobs is not None
    assert completion.completion_logprobs.tolist() == [-i / 1000 for i in range(2000)]
    assert completion.prompt_ids() == array("i", range(5000))


def test_tune_gc_freezes_what_exists_and_raises_the_thresholds() -> None:
    thresholds = gc.get_threshold()
    try:
        tune_gc((5000, 7, 9))
        assert gc.get_threshold() == (5000, 7, 9)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
