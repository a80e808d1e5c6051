"""Rewards in the shape TRL's GRPO trainers call: a batch in, one ``float | None`` per sample out.

Every reward function takes keyword arguments (``prompts``, ``completions`` and whatever columns
the dataset or the rollout worker adds), one list entry per sample, and returns a list of the
same length. ``None`` means "no reward": the rollout is left out of the update (TRL ignores a
``None`` from one reward function when others score the sample; our trainer drops the sample).
An infrastructure failure (sandbox died, the harness timed out) is always ``None``, never 0.

The columns read here:

- ``eval_result``: the harness's :class:`~crl_worker.harness.result.EvalResult` (or its dict);
  ``None`` when no evaluation happened;
- ``patch``: the gold patch (the SWE-bench column of that name);
- ``model_patch``: the agent's diff (``git diff`` of the sandbox) when the rollout worker sends
  it, read by its hunk counts; otherwise the completion's text is read for a unified diff or
  SEARCH/REPLACE blocks.

Formulas (see docs/rewards.md):

- tests, binary: 1.0 when resolved, else 0.0.
- tests, fraction: ``(f2p + p2p) / 2``, the mean of the share of FAIL_TO_PASS tests that pass and
  the share of PASS_TO_PASS tests kept; 1.0 exactly when resolved. 0.0 when the patch did not
  apply. A run tampered with (a canary test passed) scores ``RewardSpec.tampered`` in training
  (-1 by default: a forgery that guesses which test is real must lose when caught), 0.0 here.
- diff similarity: per file, ``difflib.SequenceMatcher`` ratio between the gold patch's and the
  prediction's changed lines; the mean over the union of files either one touches, so a file
  only one of them touches counts 0 (touching more files never raises the score).
- mix: ``w_tests * tests + w_diff * diff`` with the weights of ``RewardSpec.weights``.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from crl_worker.api.reward import RewardSpec
from crl_worker.harness.result import EvalResult

logger = logging.getLogger(__name__)

RewardFunc = Callable[..., list[float | None]]
TestsMode = Literal["binary", "fraction"]

#: Above this many characters on either side, similarity is computed over lines instead of
#: characters (``SequenceMatcher`` is quadratic in the worst case).
CHAR_LEVEL_LIMIT = 50_000


# --- reading the inputs -------------------------------------------------------------------------


def as_eval_result(value: EvalResult | Mapping[str, Any] | None) -> EvalResult | None:
    """An :class:`EvalResult` from what a rollout worker sent (the model, its dict, or None)."""
    if value is None or isinstance(value, EvalResult):
        return value
    return EvalResult.model_validate(value)


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or the last assistant message of a conversation."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        content = completion.get("content", "")
        return content if isinstance(content, str) else str(content)
    if isinstance(completion, Sequence):
        for message in reversed(completion):
            if isinstance(message, Mapping) and message.get("role", "assistant") == "assistant":
                return completion_text(message)
        return ""
    return str(completion)


def _column(kwargs: Mapping[str, Any], name: str, size: int) -> list[Any]:
    values = kwargs.get(name)
    if values is None:
        return [None] * size
    values = list(values)
    if len(values) != size:
        raise ValueError(f"reward column {name!r} has {len(values)} entries for {size} samples")
    return values


def _batch_size(completions: Sequence[Any] | None, kwargs: Mapping[str, Any], *names: str) -> int:
    if completions is not None:
        return len(completions)
    for name in names:
        if kwargs.get(name) is not None:
            return len(kwargs[name])
    raise ValueError(f"a reward function needs completions or one of the columns {names}")


# --- test-based rewards -------------------------------------------------------------------------


def tests_score(
    result: EvalResult | None, mode: TestsMode = "binary", tampered: float = 0.0
) -> float | None:
    """The test reward of one evaluation; ``None`` when there is no verdict. A run tampered
    with scores ``tampered`` (a training run's ``RewardSpec.tampered``), never ``None``."""
    if result is None or result.infrastructure_error is not None:
        return None
    if result.tampered is not None:
        # The model's answer, never left out: no better than a wrong one.
        return min(tampered, 0.0)
    if not result.patch_applied:
        return 0.0
    if result.credit is not None:
        # A classify task: the credit along the CWE hierarchy, whichever the mode.
        return result.credit
    if mode == "binary":
        return 1.0 if result.resolved else 0.0
    return (result.fail_to_pass_fraction + result.pass_to_pass_fraction) / 2


def _tests_reward(
    mode: TestsMode,
    completions: Sequence[Any] | None,
    kwargs: Mapping[str, Any],
    tampered: float = 0.0,
) -> list[float | None]:
    size = _batch_size(completions, kwargs, "eval_result")
    results = _column(kwargs, "eval_result", size)
    return [tests_score(as_eval_result(r), mode, tampered) for r in results]


def resolution_reward(
    prompts: Sequence[Any] | None = None,
    completions: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 for a resolved instance, 0.0 otherwise, ``None`` without a verdict (``eval_result``)."""
    return _tests_reward("binary", completions, kwargs)


def pass_fraction_reward(
    prompts: Sequence[Any] | None = None,
    completions: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Mean of the FAIL_TO_PASS and PASS_TO_PASS pass fractions (``eval_result``)."""
    return _tests_reward("fraction", completions, kwargs)


# --- diff similarity ----------------------------------------------------------------------------

_SEARCH = re.compile(r"^<{5,9} ?SEARCH\s*$")
_DIVIDER = re.compile(r"^={5,9}\s*$")
_REPLACE = re.compile(r"^>{5,9} ?REPLACE\s*$")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_DIFF_GIT = re.compile(r"^diff --git a/(?P<a>.+?) b/(?P<b>.+?)\s*$")
_HUNK = re.compile(r"^@@ -\d+(?:,(?P<old>\d+))? \+\d+(?:,(?P<new>\d+))? @@")


def _lines(text: str) -> list[str]:
    """``text`` split at newlines only (a trailing ``\\r`` dropped). Not ``str.splitlines``:
    it also splits at form feeds, lone carriage returns, ``\\x1c``-``\\x1e``, ``\\x85`` and
    U+2028/U+2029, which git leaves inside a changed line, so a file's content could inject
    header or hunk lines into the reading of a real diff."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def _strip_prefix(path: str) -> str:
    path = path.strip().split("\t", 1)[0]
    return path[2:] if path.startswith(("a/", "b/")) else path


def unified_diff_changes(diff: str) -> dict[str, list[str]]:
    """Changed lines per file of a unified diff: ``-old`` and ``+new`` lines, in order.

    Tolerates what models write: wrong hunk counts, missing ``diff --git`` headers.
    """
    changes: dict[str, list[str]] = {}
    current: str | None = None
    lines = _lines(diff)
    in_hunk = False
    for index, line in enumerate(lines):
        git = _DIFF_GIT.match(line)
        if git is not None:
            current, in_hunk = git.group("b"), False
            changes.setdefault(current, [])
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if line.startswith("--- ") and following.startswith("+++ "):
            # A file header (even inside what looked like a hunk: counts may be wrong).
            old, new = _strip_prefix(line[4:]), _strip_prefix(following[4:])
            current, in_hunk = (old if new == "/dev/null" else new), False
            changes.setdefault(current, [])
            continue
        if line.startswith("+++ ") and not in_hunk:
            continue
        if _HUNK.match(line):
            in_hunk = current is not None
            continue
        if in_hunk and current is not None and line[:1] in ("+", "-"):
            changes[current].append(line)
    return changes


def git_diff_changes(diff: str) -> dict[str, list[str]]:
    """Changed lines per file of a diff that ``git diff`` wrote (the sandbox's ``model_patch``),
    read by its hunk counts: every line a hunk counts is content, whatever it looks like, so
    no changed line (a deleted ``-- x``, an added ``++ b/other.py``, a ``<<<<<<< SEARCH``)
    can pass for a header. Files outside a ``diff --git`` header are not read."""
    changes: dict[str, list[str]] = {}
    current: str | None = None
    old = new = 0
    for line in _lines(diff):
        if old > 0 or new > 0:
            kind = line[:1]
            if kind in (" ", ""):
                old, new = old - 1, new - 1
            elif kind == "-":
                old -= 1
            elif kind == "+":
                new -= 1
            elif kind != "\\":  # "\ No newline at end of file" counts for neither side
                old = new = 0  # a malformed hunk ends here
                continue
            if kind in ("+", "-") and current is not None:
                changes[current].append(line)
            continue
        git = _DIFF_GIT.match(line)
        if git is not None:
            current = git.group("b")
            changes.setdefault(current, [])
            continue
        counts = _HUNK.match(line)
        if counts is not None and current is not None:
            old = int(counts.group("old") or 1)
            new = int(counts.group("new") or 1)
    return changes


def search_replace_changes(text: str) -> dict[str, list[str]]:
    """Changed lines per file of SEARCH/REPLACE blocks (the file named on a line before each)."""
    changes: dict[str, list[str]] = {}
    lines = _lines(text)
    index = 0
    while index < len(lines):
        if not _SEARCH.match(lines[index]):
            index += 1
            continue
        path = _block_path(lines, index)
        search: list[str] = []
        replace: list[str] = []
        target = search
        index += 1
        while index < len(lines) and not _REPLACE.match(lines[index]):
            if _DIVIDER.match(lines[index]) and target is search:
                target = replace
            else:
                target.append(lines[index])
            index += 1
        index += 1
        if path is None:
            logger.debug("a SEARCH/REPLACE block without a file name is ignored")
            continue
        matcher = difflib.SequenceMatcher(None, search, replace, autojunk=False)
        out = changes.setdefault(path, [])
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag in ("replace", "delete"):
                out += [f"-{line}" for line in search[i1:i2]]
            if tag in ("replace", "insert"):
                out += [f"+{line}" for line in replace[j1:j2]]
    return changes


def _block_path(lines: Sequence[str], search_index: int) -> str | None:
    """The file of a block: the nearest non-empty line above that is not a code fence."""
    for line in reversed(lines[max(0, search_index - 3) : search_index]):
        stripped = line.strip()
        if not stripped or _FENCE.match(stripped):
            continue
        return stripped.strip("`*: ").removeprefix("File").strip("`*: ") or None
    return None


def patch_changes(text: str) -> dict[str, list[str]]:
    """Changed lines per file of a prediction in either format (empty when it holds neither)."""
    if any(_SEARCH.match(line) for line in _lines(text)):
        return search_replace_changes(text)
    return unified_diff_changes(text)


def _ratio(gold: list[str], predicted: list[str]) -> float:
    a, b = "\n".join(gold), "\n".join(predicted)
    if len(a) > CHAR_LEVEL_LIMIT or len(b) > CHAR_LEVEL_LIMIT:
        return difflib.SequenceMatcher(None, gold, predicted, autojunk=False).ratio()
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def diff_similarity(gold_patch: str, prediction: str, *, git_diff: bool = False) -> float | None:
    """Similarity in [0, 1] of a prediction (unified diff or SEARCH/REPLACE) to the gold patch.

    The mean, over the union of files either touches, of the per-file similarity of the changed
    lines; a file only one side touches scores 0. ``None`` when the gold patch is empty or
    unreadable (nothing to compare with). ``git_diff``: the prediction is ``git diff``'s own
    output (the sandbox's), read strictly by :func:`git_diff_changes`.
    """
    gold = unified_diff_changes(gold_patch)
    if not gold:
        return None
    predicted = git_diff_changes(prediction) if git_diff else patch_changes(prediction)
    files = set(gold) | set(predicted)
    total = sum(_ratio(gold[f], predicted[f]) for f in files if f in gold and f in predicted)
    return total / len(files)


def diff_similarity_reward(
    prompts: Sequence[Any] | None = None,
    completions: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Similarity of each prediction to the gold ``patch`` (see :func:`diff_similarity`).

    The prediction is ``model_patch`` when given, else the completion's text. ``None`` when the
    gold patch is missing or the rollout's ``eval_result`` reports an infrastructure failure.
    """
    size = _batch_size(completions, kwargs, "patch", "model_patch")
    golds = _column(kwargs, "patch", size)
    predictions = _column(kwargs, "model_patch", size)
    results = _column(kwargs, "eval_result", size)
    texts = list(completions) if completions is not None else [None] * size
    scores: list[float | None] = []
    for gold, prediction, result, completion in zip(
        golds, predictions, results, texts, strict=True
    ):
        evaluated = as_eval_result(result)
        if evaluated is not None and evaluated.infrastructure_error is not None:
            scores.append(None)
            continue
        if not gold:
            scores.append(None)
            continue
        if prediction is not None:  # the sandbox's git diff: file contents never read as headers
            scores.append(diff_similarity(gold, prediction, git_diff=True))
        else:
            scores.append(diff_similarity(gold, completion_text(completion)))
    return scores


# --- the reward a RewardSpec asks for -----------------------------------------------------------


def _tests_function(spec: RewardSpec) -> RewardFunc:
    """The test reward of ``spec``: its mode, with ``spec.tampered`` for a run tampered with."""
    plain = resolution_reward if spec.tests_mode == "binary" else pass_fraction_reward
    mode, penalty = spec.tests_mode, spec.tampered

    def scored(
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        return _tests_reward(mode, completions, kwargs, penalty)

    scored.__name__ = plain.__name__  # TRL logs a reward under its function's name
    scored.__doc__ = plain.__doc__
    return scored


def make_reward(spec: RewardSpec) -> RewardFunc:
    """The reward function a TrainingRun's ``rollout.reward`` describes.

    ``tests`` and ``diff-similarity`` return the functions above; ``mix`` returns
    ``w_tests * tests + w_diff * diff_similarity`` per sample, ``None`` when a component with a
    positive weight has no value.
    """
    tests_func = _tests_function(spec)
    if spec.type == "tests":
        return tests_func
    if spec.type == "diff-similarity":
        return diff_similarity_reward
    if spec.weights is None:
        raise ValueError("reward type 'mix' needs weights (tests, diffSimilarity)")
    w_tests, w_diff = spec.weights.tests, spec.weights.diff_similarity
    if w_tests + w_diff <= 0:
        raise ValueError("reward weights must not all be zero")

    def mixed_reward(
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        tests = tests_func(prompts, completions, **kwargs) if w_tests > 0 else None
        diffs = diff_similarity_reward(prompts, completions, **kwargs) if w_diff > 0 else None
        size = len(tests if tests is not None else diffs or [])
        out: list[float | None] = []
        for i in range(size):
            t = tests[i] if tests is not None else 0.0
            d = diffs[i] if diffs is not None else 0.0
            out.append(None if t is None or d is None else w_tests * t + w_diff * d)
        return out

    # TRL logs each reward function under its __name__.
    mixed_reward.__name__ = f"mix_{tests_func.__name__}_{w_tests:g}_diff_similarity_{w_diff:g}"
    return mixed_reward
