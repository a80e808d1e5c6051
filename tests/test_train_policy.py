"""The in-process policy and the toy model/suite: tool call parsing, sampling (logprobs against a
manual forward pass, stop reasons, suppressed tokens, top-p), and real agent runs on the toy
suite in local sandboxes, token-exact, graded by the real evaluation."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import math
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from crl_worker.agent import run_agent  # noqa: E402
from crl_worker.agent.client import ContextLengthError, context_room  # noqa: E402
from crl_worker.agent.sampling import Sampling  # noqa: E402
from crl_worker.api.common import AgentSpec  # noqa: E402
from crl_worker.harness.evaluate import evaluate  # noqa: E402
from crl_worker.sandbox.base import Sandbox  # noqa: E402
from crl_worker.sandbox.registry import create_sandbox  # noqa: E402
from crl_worker.tasks.loaders import load_tasks  # noqa: E402
from crl_worker.tasks.model import Task  # noqa: E402
from crl_worker.train import toy  # noqa: E402
from crl_worker.train.local_policy import TransformersPolicy, parse_tool_calls  # noqa: E402

ACTIONS = toy.action_ids()
IM_END = 3
CONVERSATION = [
    {"role": "system", "content": "You repair code."},
    {"role": "user", "content": "add() subtracts; fix it."},
]


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return toy.build_toy_model(tmp_path_factory.mktemp("toy-model"))


@pytest.fixture(scope="module")
def tokenizer(toy_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(toy_dir)


@pytest.fixture(scope="module")
def module(toy_dir: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(toy_dir)


@pytest.fixture(scope="module")
def toy_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    tasks_file = toy.build_toy_suite(tmp_path_factory.mktemp("toy-suite"))
    (task,) = load_tasks(tasks_file, "task").tasks
    return task


@pytest.fixture
async def sandbox(toy_task: Task) -> AsyncIterator[Sandbox]:
    async with create_sandbox({"type": "local"}, toy_task) as box:
        yield box


def rigged(module: Any, logits: dict[int, float], default: float = 0.0) -> Any:
    """A copy of the toy model whose next-token logits are ``logits`` (``default`` for the
    other ids) at every position: all embeddings equal, attention and MLP outputs zeroed, so
    the final hidden state is one constant vector and the output head sets each logit."""
    rig = copy.deepcopy(module)
    with torch.no_grad():
        rig.model.embed_tokens.weight.zero_()
        rig.model.embed_tokens.weight[:, 0] = 1.0
        for layer in rig.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        rig.model.norm.weight.fill_(1.0)
        hidden = rig.model.norm(rig.model.embed_tokens.weight[:1])[0, 0].item()
        rig.lm_head.weight.zero_()
        rig.lm_head.weight[:, 0] = default / hidden
        for token, value in logits.items():
            rig.lm_head.weight[token, 0] = value / hidden
    return rig


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# --- parsing ------------------------------------------------------------------------------------


def test_parse_one_call_with_content() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "view", "arguments": {"path": "a.py"}}\n</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content == "Let me look."
    assert len(calls) == 1
    call = calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "view", "arguments": '{"path": "a.py"}'}


def test_parse_several_calls_and_no_content() -> None:
    text = (
        '<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>'
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content is None
    assert [c["function"]["name"] for c in calls] == ["shell", "submit"]
    assert calls[1]["function"]["arguments"] == "{}"
    assert calls[0]["id"] != calls[1]["id"]


def test_parse_keeps_malformed_blocks_as_text() -> None:
    bad = [
        '<tool_call>{"name": "view", "arguments": {"path": </tool_call>',  # not JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["view"]</tool_call>',  # not an object
        '<tool_call>{"name": "view", "arguments": 3}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "view", "arguments": {}}',  # never closed (cut by max_tokens)
    ]
    for text in bad:
        content, calls = parse_tool_calls(text)
        assert calls == [] and content == text, text
    good = '<tool_call>{"name": "submit"}</tool_call>'
    content, calls = parse_tool_calls(bad[0] + good)
    assert content == bad[0]
    assert calls[0]["function"] == {"name": "submit", "arguments": "{}"}


def test_parse_arguments_string_and_unicode() -> None:
    _, calls = parse_tool_calls(
        '<tool_call>{"name": "shell", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
        '<tool_call>{"name": "shell", "arguments": {"command": "echo é"}}</tool_call>'
    )
    assert calls[0]["function"]["arguments"] == '{"command": "ls"}'
    assert calls[1]["function"]["arguments"] == '{"command": "echo é"}'
    assert parse_tool_calls("") == (None, [])
    assert parse_tool_calls("  plain answer \n") == ("plain answer", [])


# --- the toy tokenizer and model ------------------------------------------------------------------


def test_toy_tokenizer_maps_unknown_text_to_one_unk(tokenizer: Any) -> None:
    assert len(tokenizer) == 14
    ids = tokenizer.apply_chat_template(
        CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    im_start, system, user, assistant = (
        tokenizer.convert_tokens_to_ids(t)
        for t in ("<|im_start|>", "<|system|>", "<|user|>", "<|assistant|>")
    )
    assert ids == [im_start, system, 0, IM_END, im_start, user, 0, IM_END, im_start, assistant]
    for name, token in ACTIONS.items():
        text = tokenizer.decode([token])
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == [token], name


def test_toy_model_is_deterministic(tmp_path: Path) -> None:
    def digest(folder: Path) -> str:
        return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()

    first = toy.build_toy_model(tmp_path / "a", seed=3)
    again = toy.build_toy_model(tmp_path / "b", seed=3)
    other = toy.build_toy_model(tmp_path / "c", seed=4)
    assert digest(first) == digest(again) != digest(other)
    suite_a = toy.build_toy_suite(tmp_path / "suite-a").read_text()
    suite_b = toy.build_toy_suite(tmp_path / "suite-b").read_text()
    assert suite_a == suite_b


# --- sampling -----------------------------------------------------------------------------------


def test_logprobs_match_a_manual_forward_pass(module: Any, tokenizer: Any) -> None:
    module.train()  # the policy samples in eval mode and puts the model back as it found it
    policy = TransformersPolicy(module, tokenizer, name="toy", seed=7)
    for temperature in (0.7, 1.3):
        completion = run(
            policy.complete(
                CONVERSATION,
                tools=[],
                sampling=Sampling(max_tokens=12, temperature=temperature, top_p=1.0),
            )
        )
        prompt = completion.prompt_token_ids.tolist()
        sampled = completion.completion_token_ids.tolist()
        assert prompt == policy.render(CONVERSATION, [])
        assert completion.prompt_tokens == len(prompt)
        assert completion.completion_tokens == len(sampled) == len(completion.completion_logprobs)
        module.eval()
        with torch.no_grad():
            logits = module(torch.tensor([prompt + sampled])).logits[0].float()
        module.train()
        expected = torch.log_softmax(logits / temperature, dim=-1)
        for k, token in enumerate(sampled):
            assert math.isclose(
                completion.completion_logprobs[k],
                expected[len(prompt) - 1 + k, token].item(),
                abs_tol=1e-5,
            )
    assert module.training


def test_stop_at_eos_and_at_max_tokens(module: Any, tokenizer: Any) -> None:
    prompt = TransformersPolicy(module, tokenizer, name="toy").render(CONVERSATION, [])
    stops = rigged(module, {IM_END: 30.0})
    sample = TransformersPolicy(stops, tokenizer, name="toy").generate(
        prompt, Sampling(max_tokens=5, temperature=1.0, top_p=1.0)
    )
    assert sample.completion_ids == [IM_END] and sample.finish_reason == "stop"
    completion = run(
        TransformersPolicy(stops, tokenizer, name="toy").complete(
            CONVERSATION, tools=[], sampling=Sampling(max_tokens=5, temperature=1.0, top_p=1.0)
        )
    )
    assert completion.finish_reason == "stop"
    assert completion.message == {"role": "assistant", "content": None}
    assert completion.completion_token_ids.tolist() == [IM_END]

    views = rigged(module, {ACTIONS["view"]: 30.0, IM_END: -30.0})
    policy = TransformersPolicy(views, tokenizer, name="toy")
    sample = policy.generate(prompt, Sampling(max_tokens=3, temperature=1.0, top_p=1.0))
    assert sample.completion_ids == [ACTIONS["view"]] * 3 and sample.finish_reason == "length"
    completion = run(
        policy.complete(
            CONVERSATION, tools=[], sampling=Sampling(max_tokens=3, temperature=0.0, top_p=1.0)
        )
    )
    # Cut by the length limit, but three whole calls were made: vLLM says tool_calls.
    assert completion.finish_reason == "tool_calls"
    assert [c["function"]["name"] for c in completion.message["tool_calls"]] == ["view"] * 3
    assert completion.message["content"] is None


def test_special_tokens_are_never_sampled(module: Any, tokenizer: Any) -> None:
    specials = [0, 1, 2, *range(4, 8)]  # <unk>, pad, <|im_start|>, the role markers
    rig = rigged(module, dict.fromkeys(specials, 20.0) | {IM_END: -30.0})
    policy = TransformersPolicy(rig, tokenizer, name="toy", seed=1)
    assert policy.suppressed == frozenset(specials)
    prompt = policy.render(CONVERSATION, [])
    sample = policy.generate(prompt, Sampling(max_tokens=300, temperature=1.0, top_p=1.0))
    assert len(sample.completion_ids) == 300
    counts = Counter(sample.completion_ids)
    assert set(counts) == {ACTIONS[name] for name in ACTIONS}, counts
    # The logprob is the model's own (unrenormalized) distribution: the special tokens hold
    # nearly all of its mass, so each sampled action token's logprob is about -20 - log(7).
    expected = -20.0 - math.log(len(specials))
    assert all(abs(lp - expected) < 0.05 for lp in sample.logprobs)
    greedy = policy.generate(prompt, Sampling(max_tokens=2, temperature=0.0, top_p=1.0))
    assert greedy.completion_ids[0] not in specials


def test_temperature_and_top_p_shape_the_distribution(module: Any, tokenizer: Any) -> None:
    fix, view = ACTIONS["fix"], ACTIONS["view"]
    rig = rigged(module, {fix: 2.0, view: 1.0, IM_END: -40.0}, default=-40.0)
    policy = TransformersPolicy(rig, tokenizer, name="toy", seed=2)
    prompt = policy.render(CONVERSATION, [])
    # At T = 0.5 the odds fix:view are e^(1/0.5) = e^2 (p ≈ 0.881).
    sample = policy.generate(prompt, Sampling(max_tokens=600, temperature=0.5, top_p=1.0))
    share = Counter(sample.completion_ids)[fix] / 600
    p = math.exp(2) / (math.exp(2) + 1)
    assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / 600)
    # top_p = 0.8 < p: only the most likely token is left.
    sample = policy.generate(prompt, Sampling(max_tokens=100, temperature=0.5, top_p=0.8))
    assert set(sample.completion_ids) == {fix}


def test_context_length_error_says_the_room_left(module: Any, tokenizer: Any) -> None:
    policy = TransformersPolicy(module, tokenizer, name="toy", max_model_len=20)
    with pytest.raises(ContextLengthError) as refused:
        run(
            policy.complete(
                CONVERSATION, tools=[], sampling=Sampling(max_tokens=16, temperature=1.0, top_p=1.0)
            )
        )
    assert context_room(str(refused.value)) == 10


async def test_concurrent_calls_and_cancellation(module: Any, tokenizer: Any) -> None:
    endless = rigged(module, {ACTIONS["view"]: 5.0, IM_END: -30.0})
    policy = TransformersPolicy(endless, tokenizer, name="toy", seed=3)
    long = asyncio.create_task(
        policy.complete(
            CONVERSATION, tools=[], sampling=Sampling(max_tokens=20000, temperature=1.0, top_p=1.0)
        )
    )
    await asyncio.sleep(0.3)
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    # The cancelled generation's thread stops at its next token and frees the model.
    for _ in range(100):
        if not policy._busy.locked():
            break
        await asyncio.sleep(0.02)
    assert not policy._busy.locked()
    answers = await asyncio.gather(
        *(
            policy.complete(
                CONVERSATION, tools=[], sampling=Sampling(max_tokens=4, temperature=1.0, top_p=1.0)
            )
            for _ in range(4)
        )
    )
    assert [a.completion_tokens for a in answers] == [4] * 4


# --- agent runs on the toy suite ------------------------------------------------------------------


async def test_agent_runs_on_the_toy_suite_are_token_exact(
    module: Any, tokenizer: Any, toy_task: Task, sandbox: Sandbox
) -> None:
    spec = AgentSpec(max_turns=4, max_tokens_per_turn=16)
    multi_turn = 0
    for seed in range(6):
        if seed:
            await sandbox.reset()
        policy = TransformersPolicy(module, tokenizer, name="toy", seed=seed)
        trajectory = await run_agent(toy_task, sandbox, policy, spec)
        assert trajectory.exit_reason in ("submitted", "max_turns"), trajectory.error
        sequence = trajectory.token_sequence()
        assert sequence is not None, trajectory.token_sequence_problem()
        ids, mask = sequence.ids.tolist(), sequence.mask.tolist()
        completions = [turn.completion_token_ids.tolist() for turn in trajectory.turns]
        # The mask marks exactly the sampled tokens, turn by turn.
        assert [ids[a:b] for a, b in sequence.completion_spans] == completions
        assert sum(mask) == sum(map(len, completions)) == trajectory.completion_tokens
        assert [i for i, m in zip(ids, mask, strict=True) if m] == [
            t for c in completions for t in c
        ]
        marked = {k for a, b in sequence.completion_spans for k in range(a, b)}
        assert {k for k, m in enumerate(mask) if m} == marked
        assert sequence.logprobs is not None
        assert [sequence.logprobs[k] for k in sorted(marked)] == [
            lp for turn in trajectory.turns for lp in turn.completion_logprobs
        ]
        # And the whole chat, rendered again, starts with exactly that sequence.
        rendered = tokenizer.apply_chat_template(
            trajectory.messages, tokenize=True, return_dict=True
        )["input_ids"]
        assert rendered[: len(ids)] == ids
        multi_turn += len(trajectory.turns) > 1
    assert multi_turn >= 2


async def test_toy_gold_patch_resolves_and_is_the_fix_token(
    module: Any, tokenizer: Any, toy_task: Task, sandbox: Sandbox
) -> None:
    untouched = await evaluate(sandbox, toy_task)
    assert not untouched.resolved
    gold = await evaluate(sandbox, toy_task, model_patch=toy_task.patch)
    assert gold.resolved, gold.log
    spec = AgentSpec(max_turns=1, max_tokens_per_turn=16, temperature=0.0)
    verdicts = {}
    for name in ("fix", "wrong_times", "wrong_swap"):
        await sandbox.reset()
        # Greedy on a model that always says this action: the first edit applies, the rest
        # find their old_str gone.
        rig = rigged(module, {ACTIONS[name]: 10.0})
        policy = TransformersPolicy(rig, tokenizer, name="toy")
        ahead = await run_agent(toy_task, sandbox, policy, spec)
        edits = [call for call in ahead.turns[0].tool_calls if call.name == "edit"]
        assert not edits[0].error and all(call.error for call in edits[1:])
        if name == "fix":
            assert ahead.diff == toy_task.patch
        verdicts[name] = (await evaluate(sandbox, toy_task)).resolved
    assert verdicts == {"fix": True, "wrong_times": False, "wrong_swap": False}


def test_action_tokens_are_the_tools_the_agent_offers() -> None:
    from crl_worker.agent.tools import TOOL_ARGUMENTS, parse_arguments

    for name, (tool, arguments) in toy.ACTIONS.items():
        assert tool in AgentSpec().tools, name
        assert parse_arguments(tool, json.dumps(arguments)) == arguments
        assert set(arguments) <= set(TOOL_ARGUMENTS[tool])


def test_a_template_that_does_not_render_is_a_model_server_error(
    module: Any, tokenizer: Any
) -> None:
    from crl_worker.agent.client import ModelServerError

    broken = copy.deepcopy(tokenizer)
    broken.chat_template = "{{ raise_exception('this template knows no tools') }}"
    policy = TransformersPolicy(module, broken, name="toy")
    with pytest.raises(ModelServerError, match="this template knows no tools"):
        run(
            policy.complete(
                CONVERSATION, tools=[], sampling=Sampling(max_tokens=4, temperature=1.0, top_p=1.0)
            )
        )
