"""A toy model and a toy repair task, for the trainer's CPU tests and its learning test
(docs/toy-model.md).

:func:`build_toy_model` writes a tiny Llama-architecture causal LM and a tokenizer whose whole
vocabulary is 14 tokens: special tokens (``<unk>``, padding, ``<|im_start|>``,
``<|im_end|>`` which ends a turn, one marker per chat role) and six *action tokens*, each the
complete text of one tool call on the toy task: the right fix, two wrong fixes, ``view``, a
``shell`` test run and ``submit``. Text the tokenizer does not know maps to one ``<unk>`` per
stretch between known tokens, so a prompt is a dozen tokens whatever the tool outputs say.

The policy samples only the end-of-turn token and the action tokens (the others are special and
suppressed), and every sampled sequence re-renders to itself: the chat template writes an
assistant turn as its tool calls' exact text followed by ``<|im_end|>``, so each turn's prompt
extends the previous prompt and completion token for token
(:meth:`~crl_worker.agent.trajectory.Trajectory.token_sequence` is never ``None``). There are no
sampleable plain-text tokens on purpose: text between tool calls is not kept in the chat message
at its position, so it could not re-render to the same tokens.

:func:`build_toy_suite` writes the task: ``toycalc``, one module whose ``add`` subtracts, a git
bundle and a native ``tasks.jsonl`` whose gold patch is exactly what the right action token does.
The first fix applied decides the outcome (the edit's ``old_str`` no longer matches after it), so
a randomly initialized model resolves the task with a probability near one in four (measured
by ``perf/toy_resolve_rate.py``).

``task_type="implement"`` and ``task_type="classify"`` give the toys of the other task types
(docs/task-types.md): ``add`` without a body (the right body, two wrong ones, ``view``, a test run,
``submit``), and a module that pastes input into a shell command (``classify`` with CWE-78, its
parent CWE-77, CWE-79, CWE-89, ``view``, ``shell``), six action tokens each.

Everything is deterministic: the same seed gives the same weights, and the suite's commits have
fixed authors and dates (the commit ids are stable; the bundle's pack bytes may differ between
git versions).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from crl_worker.errors import CrlError

logger = logging.getLogger(__name__)

#: The toy module and the edit every fix action makes (the wrong fixes replace the same text,
#: so after any fix the others no longer apply).
MODULE = "calc.py"
BUGGY = "def add(a, b):\n    return a - b"
RIGHT = "def add(a, b):\n    return a + b"
WRONG = ("def add(a, b):\n    return a * b", "def add(a, b):\n    return b - a")

#: Special tokens, in id order from 0. ``<|im_end|>`` ends a turn (the eos token).
UNK, PAD, IM_START, IM_END = "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool")


def role_token(role: str) -> str:
    """The marker token of a chat role."""
    return f"<|{role}|>"


def action_text(name: str, arguments: dict[str, Any]) -> str:
    """The text of one tool call as the toy chat template renders it (and as
    :func:`~crl_worker.train.local_policy.parse_tool_calls` reads it back)."""
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


#: The action tokens: name -> (tool, arguments).
ACTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "fix": ("edit", {"path": MODULE, "old_str": BUGGY, "new_str": RIGHT}),
    "wrong_times": ("edit", {"path": MODULE, "old_str": BUGGY, "new_str": WRONG[0]}),
    "wrong_swap": ("edit", {"path": MODULE, "old_str": BUGGY, "new_str": WRONG[1]}),
    "view": ("view", {"path": MODULE}),
    "test": ("shell", {"command": "python -m unittest -q"}),
    "submit": ("submit", {}),
}

#: The implement toy: ``add``'s body is missing; the right body, two wrong ones.
STUB = 'def add(a, b):\n    """Return the sum of a and b."""\n    raise NotImplementedError("add")'
_SPEC = 'def add(a, b):\n    """Return the sum of a and b."""\n'
IMPLEMENT_ACTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "fix": ("edit", {"path": MODULE, "old_str": STUB, "new_str": _SPEC + "    return a + b"}),
    "wrong_times": (
        "edit",
        {"path": MODULE, "old_str": STUB, "new_str": _SPEC + "    return a * b"},
    ),
    "wrong_swap": (
        "edit",
        {"path": MODULE, "old_str": STUB, "new_str": _SPEC + "    return b - a"},
    ),
    "view": ("view", {"path": MODULE}),
    "test": ("shell", {"command": "python -m unittest -q"}),
    "submit": ("submit", {}),
}

#: The classify toy: a shell command built from input (CWE-78). The answers score 1 (CWE-78),
#: 0.5 (CWE-77, its parent), 0.125 (CWE-79, three edges away through CWE-74) and 0.0625
#: (CWE-89, four edges away); the first accepted answer ends the episode.
VULNERABLE_MODULE = "net.py"
CLASSIFY_LABEL = "CWE-78"
_WHY = "the host is pasted into a shell command"
CLASSIFY_ACTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "right": ("classify", {"cwe": CLASSIFY_LABEL, "reasoning": _WHY}),
    "parent": ("classify", {"cwe": "CWE-77", "reasoning": _WHY}),
    "wrong_xss": ("classify", {"cwe": "CWE-79", "reasoning": _WHY}),
    "wrong_sql": ("classify", {"cwe": "CWE-89", "reasoning": _WHY}),
    "view": ("view", {"path": VULNERABLE_MODULE}),
    "shell": ("shell", {"command": f"cat {VULNERABLE_MODULE}"}),
}

#: The action tokens of each task type's toy (six each: the model is the same size).
ACTIONS_BY_TYPE: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "repair": ACTIONS,
    "implement": IMPLEMENT_ACTIONS,
    "classify": CLASSIFY_ACTIONS,
}


def _actions(task_type: str) -> dict[str, tuple[str, dict[str, Any]]]:
    try:
        return ACTIONS_BY_TYPE[task_type]
    except KeyError:
        raise ToyBuildError(
            f"no toy for task type {task_type!r}; known: {', '.join(ACTIONS_BY_TYPE)}"
        ) from None


#: The chat template: ``<|im_start|><|role|>content[tool calls]<|im_end|>``, no separators, the
#: tools not rendered (the model cannot read them anyway). Arguments are written as the message
#: holds them (a JSON string), so a parsed call renders back to its action token's text.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|><|{{ message.role }}|>"
    "{%- if message.content is string -%}{{ message.content }}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments '
    "if call.function.arguments is string else call.function.arguments | tojson }}}</tool_call>"
    "{%- endfor -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|><|assistant|>{%- endif -%}"
)

#: The model's context: generous (rotary positions cost nothing until used), so the agent's
#: default token limits fit without the context-length retry.
MAX_POSITIONS = 32768


class ToyBuildError(CrlError):
    """The toy suite could not be written (git failed)."""


def toy_vocabulary(task_type: str = "repair") -> list[str]:
    """Every token of the toy tokenizer of ``task_type``'s toy, in id order."""
    specials = [UNK, PAD, IM_START, IM_END, *(role_token(r) for r in ROLES)]
    return specials + [action_text(tool, args) for tool, args in _actions(task_type).values()]


def action_ids(task_type: str = "repair") -> dict[str, int]:
    """The id of each action token (``fix``, ``wrong_times``, ..., ``submit`` for repair)."""
    vocabulary = toy_vocabulary(task_type)
    actions = _actions(task_type)
    return {name: vocabulary.index(action_text(*actions[name])) for name in actions}


def build_toy_tokenizer(task_type: str = "repair") -> Any:
    """The toy ``PreTrainedTokenizerFast`` of ``task_type``'s toy (see the module docs)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocabulary = toy_vocabulary(task_type)
    # A word-level model knowing only <unk> and no pre-tokenizer: each stretch of text between
    # added tokens is one "word", hence one <unk>.
    backend = Tokenizer(models.WordLevel({UNK: 0}, unk_token=UNK))
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in vocabulary[1:8]]
    )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in vocabulary[8:]])
    backend.decoder = decoders.Fuse()  # decode concatenates: no spaces between tokens
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        unk_token=UNK,
        pad_token=PAD,
        eos_token=IM_END,
        additional_special_tokens=[IM_START, *(role_token(r) for r in ROLES)],
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if len(tokenizer) != len(vocabulary) or tokenizer.convert_tokens_to_ids(IM_END) != 3:
        raise ToyBuildError("the toy tokenizer's ids are not the toy vocabulary's order")
    return tokenizer


def build_toy_model(
    dest: Path, *, seed: int = 0, head_dim: int | None = None, task_type: str = "repair"
) -> Path:
    """Write the toy model and tokenizer to ``dest`` (``from_pretrained`` loads it) and return
    ``dest``. The weights are a random initialization from ``seed`` (float32); the global torch
    random state is left as it was. ``head_dim`` widens the attention heads beyond
    hidden size / heads (16): a real vLLM's CPU attention kernels need 64 or more
    (tests/fixtures/vllm.py). ``task_type`` picks the action tokens (docs/task-types.md)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_toy_tokenizer(task_type)
    widened: dict[str, Any] = {} if head_dim is None else {"head_dim": head_dim}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # Small enough for a CPU training step in milliseconds.
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        **widened,
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
    logger.info("wrote the toy model (%d parameters) to %s", model.num_parameters(), dest)
    return dest


# --- the toy suite -----------------------------------------------------------------------------

SUITE_REPO = "crl-toy/toycalc"
INSTANCE_ID = "crl-toy__toycalc-1"
BUNDLE = "repos/toycalc.bundle"
_DATE = "2024-01-01T09:00:00+00:00"

_BASE_FILES = {
    MODULE: f'"""Arithmetic helpers."""\n\n\n{BUGGY}\n\n\ndef sub(a, b):\n    return a - b\n',
    "test_calc.py": (
        "import unittest\n\nfrom calc import sub\n\n\n"
        "class SubTests(unittest.TestCase):\n"
        "    def test_sub(self):\n"
        "        self.assertEqual(sub(5, 3), 2)\n"
    ),
}

_TESTS_AFTER = (
    "import unittest\n\nfrom calc import add, sub\n\n\n"
    "class AddTests(unittest.TestCase):\n"
    "    def test_add(self):\n"
    "        self.assertEqual(add(2, 3), 5)\n"
    "        self.assertEqual(add(-1, 1), 0)\n\n\n"
    "class SubTests(unittest.TestCase):\n"
    "    def test_sub(self):\n"
    "        self.assertEqual(sub(5, 3), 2)\n"
)

PROBLEM = (
    "add() subtracts\n\n`calc.add(2, 3)` returns -1 instead of 5. It should return the sum "
    "of its arguments.\n"
)

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "CodeRepairRL toy suite",
    "GIT_AUTHOR_EMAIL": "suite@coderepair.io",
    "GIT_COMMITTER_NAME": "CodeRepairRL toy suite",
    "GIT_COMMITTER_EMAIL": "suite@coderepair.io",
    "GIT_AUTHOR_DATE": _DATE,
    "GIT_COMMITTER_DATE": _DATE,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | _GIT_ENV
    done = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ToyBuildError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()}")
    return done.stdout


def _diff_after(repo: Path, path: str, text: str) -> str:
    """``git diff`` of writing ``text`` to ``path`` (the tree is restored after)."""
    (repo / path).write_text(text, encoding="utf-8")
    diff = _git(repo, "diff", "--no-color", "--no-ext-diff", "HEAD")
    _git(repo, "checkout", "--quiet", "--", path)
    return diff


_VULNERABLE = (
    '"""Network helpers."""\n\nimport os\n\n\n'
    "def ping(host):\n"
    '    """Ping a host the user names."""\n'
    '    return os.system("ping -c 1 " + host)\n'
)


def _one_commit_repo(repo: Path, files: dict[str, str], message: str) -> str:
    repo.mkdir()
    _git(repo, "init", "--quiet", "--initial-branch=main")
    for name, text in files.items():
        (repo / name).write_text(text, encoding="utf-8")
    _git(repo, "add", "--all")
    _git(repo, "commit", "--quiet", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


def _bundle(repo: Path, bundle: Path) -> None:
    partial = bundle.with_name(bundle.name + ".partial")
    _git(repo, "bundle", "create", "--quiet", str(partial), "main")
    partial.replace(bundle)


def _other_toy(dest: Path, task_type: str) -> Any:
    """The implement or the classify toy task (its bundle written under ``dest``)."""
    from crl_worker.tasks.model import Task

    common: dict[str, Any] = {
        "created_at": "2024-01-02T09:00:00Z",
        "language": "python",
        "env": {"PYTHONDONTWRITEBYTECODE": "1"},
        "timeouts": {"setup": 300, "test": 60, "command": 30},
        "metadata": {"suite": "crl-toy"},
        "task_type": task_type,
    }
    with tempfile.TemporaryDirectory(prefix="crl-toy-") as scratch:
        repo = Path(scratch) / "toy"
        if task_type == "implement":
            # The tests are hidden, as in derived implement tasks: the test patch adds them
            # when the harness grades; the repository holds only the module.
            files = {MODULE: _BASE_FILES[MODULE].replace(BUGGY, STUB)}
            base = _one_commit_repo(repo, files, "toycalc: add() to implement")
            fixed = files[MODULE].replace(STUB, _SPEC + "    return a + b")
            patch = _diff_after(repo, MODULE, fixed)
            (repo / "test_calc.py").write_text(_TESTS_AFTER, encoding="utf-8")
            _git(repo, "add", "--intent-to-add", "test_calc.py")
            test_patch = _git(repo, "diff", "--no-color", "--no-ext-diff", "HEAD")
            _git(repo, "rm", "--cached", "--quiet", "test_calc.py")
            (repo / "test_calc.py").unlink()
            _bundle(repo, dest / "repos" / "toycalc-implement.bundle")
            return Task(
                instance_id="crl-toy__toycalc-implement-1",
                repo="crl-toy/toycalc-implement",
                base_commit=base,
                patch=patch,
                test_patch=test_patch,
                fail_to_pass=["test_add (test_calc.AddTests)"],
                pass_to_pass=["test_sub (test_calc.SubTests)"],
                problem_statement=(
                    "The body of `add` in `calc.py` is missing. Implement it:\n\n"
                    f"```python\n{_SPEC}```\n"
                ),
                source="repos/toycalc-implement.bundle",
                test={"command": "python -m unittest -v test_calc", "log_format": "unittest"},
                **common,
            )
        base = _one_commit_repo(repo, {VULNERABLE_MODULE: _VULNERABLE}, "toynet")
        _bundle(repo, dest / "repos" / "toynet.bundle")
        return Task(
            instance_id="crl-toy__toynet-classify-1",
            repo="crl-toy/toynet",
            base_commit=base,
            classification={"cwe": CLASSIFY_LABEL, "location": f"{VULNERABLE_MODULE}::ping"},
            problem_statement="A helper that pings hosts users name.",
            source="repos/toynet.bundle",
            **common,
        )


def build_toy_suite(dest: Path, *, task_type: str = "repair") -> Path:
    """Write the toy suite of ``task_type`` to ``dest``: its git bundle under ``repos/`` and
    ``tasks.jsonl`` (one native task, its ``source`` relative to the file, as
    ``crl_worker.tasks.loaders`` reads it). Returns the path of ``tasks.jsonl``."""
    from crl_worker.tasks.model import Task

    _actions(task_type)  # an unknown type fails here, before anything is written
    if task_type != "repair":
        dest = dest.resolve()
        (dest / "repos").mkdir(parents=True, exist_ok=True)
        other = _other_toy(dest, task_type)
        tasks = dest / "tasks.jsonl"
        record = other.model_dump(mode="json", exclude_defaults=True)
        record["task_type"] = task_type
        tasks.write_text(json.dumps(record) + "\n", encoding="utf-8")
        logger.info("wrote the %s toy suite to %s", task_type, dest)
        return tasks

    dest = dest.resolve()  # git runs inside the scratch repository
    (dest / BUNDLE).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crl-toy-") as scratch:
        repo = Path(scratch) / "toycalc"
        repo.mkdir()
        _git(repo, "init", "--quiet", "--initial-branch=main")
        for name, text in _BASE_FILES.items():
            (repo / name).write_text(text, encoding="utf-8")
        _git(repo, "add", "--all")
        _git(repo, "commit", "--quiet", "-m", "toycalc: initial import")
        base = _git(repo, "rev-parse", "HEAD").strip()
        fixed = _BASE_FILES[MODULE].replace(BUGGY, RIGHT)
        patch = _diff_after(repo, MODULE, fixed)
        test_patch = _diff_after(repo, "test_calc.py", _TESTS_AFTER)
        bundle = dest / BUNDLE
        partial = bundle.with_name(bundle.name + ".partial")
        _git(repo, "bundle", "create", "--quiet", str(partial), "main")
        partial.replace(bundle)
    task = Task(
        instance_id=INSTANCE_ID,
        repo=SUITE_REPO,
        base_commit=base,
        patch=patch,
        test_patch=test_patch,
        fail_to_pass=["test_add (test_calc.AddTests)"],
        pass_to_pass=["test_sub (test_calc.SubTests)"],
        problem_statement=PROBLEM,
        created_at="2024-01-02T09:00:00Z",
        language="python",
        source=BUNDLE,
        test={"command": "python -m unittest -v {tests}", "log_format": "unittest"},
        env={"PYTHONDONTWRITEBYTECODE": "1"},
        timeouts={"setup": 300, "test": 60, "command": 30},
        metadata={"suite": "crl-toy"},
    )
    tasks = dest / "tasks.jsonl"
    tasks.write_text(
        json.dumps(task.model_dump(mode="json", exclude_defaults=True)) + "\n", encoding="utf-8"
    )
    logger.info("wrote the toy suite to %s", dest)
    return tasks


def main(argv: list[str] | None = None) -> int:
    """``python -m crl_worker.train.toy DEST``: write the toy model (``DEST/model``) and the toy
    suite (``DEST/suite``), what ``examples/local-trainingrun-toy.yaml`` trains on."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m crl_worker.train.toy",
        description="Write the toy model and a toy suite (no downloads).",
    )
    parser.add_argument("dest", type=Path, help="folder to write model/ and suite/ into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument(
        "--task-type",
        choices=sorted(ACTIONS_BY_TYPE),
        default="repair",
        help="which toy: repair (add subtracts), implement (add has no body) or classify "
        "(a shell command built from input, CWE-78)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model = build_toy_model(args.dest / "model", seed=args.seed, task_type=args.task_type)
    tasks = build_toy_suite(args.dest / "suite", task_type=args.task_type)
    logger.info("toy model in %s, toy suite in %s", model, tasks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
