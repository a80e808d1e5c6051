"""Rewards: TRL's batch shape, the formulas, None for infrastructure failures, diff similarity on
real patches (the fixtures' and SWE-bench Lite's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crl_worker.api.reward import RewardSpec
from crl_worker.harness import canary
from crl_worker.harness.result import EvalResult, TestOutcome, TestStatus
from crl_worker.rewards import (
    completion_text,
    diff_similarity,
    diff_similarity_reward,
    git_diff_changes,
    make_reward,
    pass_fraction_reward,
    patch_changes,
    resolution_reward,
    search_replace_changes,
    unified_diff_changes,
)
from tests.fixtures.paths import ROOT
from tests.fixtures.repos import FixtureRepo, python_repo, worktree_diff

LITE = ROOT.parent / "shared" / "data" / "swe-bench-lite.jsonl"


def result(
    *,
    resolved: bool = False,
    f2p: float = 0.0,
    p2p: float = 1.0,
    applied: bool = True,
    infra: str | None = None,
    tampered: str | None = None,
) -> EvalResult:
    return EvalResult(
        instance_id="x",
        resolved=resolved,
        fail_to_pass=[TestOutcome(name="t", status=TestStatus.PASSED)],
        fail_to_pass_fraction=f2p,
        pass_to_pass_fraction=p2p,
        patch_applied=applied,
        infrastructure_error=infra,
        tampered=tampered,
    )


@pytest.fixture(scope="module")
def roman(tmp_path_factory: pytest.TempPathFactory) -> FixtureRepo:
    return python_repo(tmp_path_factory.mktemp("roman"))


# --- tests rewards ------------------------------------------------------------------------------


def test_binary_reward_batch() -> None:
    batch = [
        result(resolved=True, f2p=1.0),
        result(f2p=0.5),
        result(applied=False),
        result(infra="sandbox died"),
        None,
    ]
    rewards = resolution_reward(prompts=["p"] * 5, completions=["c"] * 5, eval_result=batch)
    assert rewards == [1.0, 0.0, 0.0, None, None]


def test_fraction_reward_is_the_mean_of_both_fractions() -> None:
    batch = [
        result(resolved=True, f2p=1.0, p2p=1.0),
        result(f2p=0.5, p2p=1.0),
        result(f2p=1.0, p2p=0.5),
        result(f2p=0.0, p2p=0.0),
        result(f2p=0.75, applied=False),
        result(f2p=1.0, infra="harness timed out"),
    ]
    assert pass_fraction_reward(completions=[""] * 6, eval_result=batch) == [
        1.0,
        0.75,
        0.75,
        0.0,
        0.0,
        None,
    ]


def test_eval_results_arrive_as_dicts_too() -> None:
    payload = json.loads(result(resolved=True, f2p=1.0).model_dump_json())
    assert resolution_reward(completions=["c"], eval_result=[payload]) == [1.0]


def test_columns_must_match_the_batch() -> None:
    with pytest.raises(ValueError, match="'eval_result' has 1 entries for 2 samples"):
        resolution_reward(completions=["a", "b"], eval_result=[None])


# --- diff similarity ----------------------------------------------------------------------------


def test_gold_patch_is_similar_to_itself_and_a_partial_fix_less(roman: FixtureRepo) -> None:
    gold = roman.task.patch
    assert diff_similarity(gold, gold) == 1.0
    wrong = diff_similarity(gold, roman.patches["wrong"])
    breaking = diff_similarity(gold, roman.patches["breaking"])
    assert wrong is not None and breaking is not None
    # "breaking" is the gold fix minus .upper(): nearly the same change; "wrong" is another one.
    assert 0.0 < wrong < breaking < 1.0
    assert diff_similarity(gold, "") == 0.0
    assert diff_similarity("", gold) is None


def test_touching_more_files_never_raises_the_score(roman: FixtureRepo) -> None:
    gold = roman.task.patch
    # The gold change plus edits of two more files (the test patch's): three files, one matches.
    padded = gold + roman.task.test_patch
    assert diff_similarity(gold, padded) == pytest.approx(1 / 3)
    assert diff_similarity(gold, roman.task.test_patch) == 0.0
    wrong = roman.patches["wrong"]
    assert diff_similarity(gold, wrong + roman.task.test_patch) < diff_similarity(gold, wrong)  # type: ignore[operator]


def test_search_replace_blocks_equal_to_the_gold_hunks_score_one() -> None:
    gold = (
        "diff --git a/src/app/util.py b/src/app/util.py\n"
        "--- a/src/app/util.py\n"
        "+++ b/src/app/util.py\n"
        "@@ -10,4 +10,4 @@ def clamp(value, low, high):\n"
        "     if value < low:\n"
        "         return low\n"
        "-    if value >= high:\n"
        "+    if value > high:\n"
        "         return high\n"
    )
    blocks = (
        "I found the off-by-one.\n\n"
        "src/app/util.py\n"
        "```python\n"
        "<<<<<<< SEARCH\n"
        "    if value < low:\n"
        "        return low\n"
        "    if value >= high:\n"
        "=======\n"
        "    if value < low:\n"
        "        return low\n"
        "    if value > high:\n"
        ">>>>>>> REPLACE\n"
        "```\n"
    )
    assert search_replace_changes(blocks) == {
        "src/app/util.py": ["-    if value >= high:", "+    if value > high:"]
    }
    assert diff_similarity(gold, blocks) == 1.0
    other_file = blocks.replace("src/app/util.py", "src/app/other.py")
    assert diff_similarity(gold, other_file) == 0.0


def test_model_diffs_with_wrong_counts_and_no_git_header() -> None:
    sloppy = (
        "--- a/pkg/mod.py\n"
        "+++ b/pkg/mod.py\n"
        "@@ -1,1 +1,1 @@\n"
        "-x = 1\n"
        "+x = 2\n"
        "+y = 3\n"
        "--- a/pkg/new.py\n"
        "+++ b/pkg/new.py\n"
        "@@ -0,0 +1 @@\n"
        "+-- not a header\n"
    )
    assert unified_diff_changes(sloppy) == {
        "pkg/mod.py": ["-x = 1", "+x = 2", "+y = 3"],
        "pkg/new.py": ["+-- not a header"],
    }
    deleted = "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-print(1)\n"
    assert patch_changes(deleted) == {"gone.py": ["-print(1)"]}


CALC_GOLD = """\
diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def area(w, h):
-    return w + h
+    return w * h
"""


def test_file_contents_are_never_read_as_diff_lines(tmp_path: Path) -> None:
    """A red-team review's forgery: the sandbox's git diff touches only notes and junk, whose
    contents hold lines that read as an edit of the gold file: after a form feed (which
    ``str.splitlines`` splits at, git does not) a SEARCH/REPLACE block; a deleted ``-- x`` line
    followed by an added ``++ b/calc.py`` (a file header, to a tolerant reader). It scored
    similarity 1.0, and a mix paid 0.5 for nothing fixed."""
    base = {"calc.py": "def area(w, h):\n    return w + h\n", "schema.sql": "-- tables\n"}
    ff = "\x0c"
    block = ff.join(["", "calc.py", "<<<<<<< SEARCH", "    return w + h", "=======",
                     "    return w * h", ">>>>>>> REPLACE"])  # fmt: skip
    diff = worktree_diff(tmp_path, base, {"notes.txt": f"plan{block}\n", "junk.py": "x = 1\n"})
    assert "calc.py" not in patch_changes(diff)  # lines end at newlines only
    assert set(git_diff_changes(diff)) == {"notes.txt", "junk.py"}
    assert diff_similarity(CALC_GOLD, diff, git_diff=True) == 0.0
    # A repository line starting '-- ' (an SQL comment) deleted, an added '++ b/calc.py' after
    # it: a header to a reader that tolerates wrong counts, so the file's next hunk counts as
    # an edit of calc.py.
    filler = "".join(f"-- {n}\n" for n in range(8))
    sql = {"schema.sql": f"-- tables\n{filler}    return w + h\n"}
    header = worktree_diff(
        tmp_path / "h", {**base, **sql}, {"schema.sql": f"++ b/calc.py\n{filler}    return w * h\n"}
    )
    assert unified_diff_changes(header)["calc.py"] == ["-    return w + h", "+    return w * h"]
    assert set(git_diff_changes(header)) == {"schema.sql"}
    unresolved = EvalResult(instance_id="x", resolved=False, patch_applied=True)
    mix = make_reward(
        RewardSpec.model_validate({"type": "mix", "weights": {"tests": 0.5, "diffSimilarity": 0.5}})
    )
    for forged in (diff, header):
        scores = mix(
            completions=[""], eval_result=[unresolved], patch=[CALC_GOLD], model_patch=[forged]
        )
        assert scores == [0.0]
    # The honest fix, read the same way, still scores 1; with the same extra files, 1/3.
    honest = worktree_diff(tmp_path / "g", base, {"calc.py": "def area(w, h):\n    return w * h\n"})
    assert diff_similarity(CALC_GOLD, honest, git_diff=True) == 1.0
    padded = worktree_diff(
        tmp_path / "p",
        base,
        {
            "calc.py": "def area(w, h):\n    return w * h\n",
            "notes.txt": "plan\n",
            "junk.py": "x = 1\n",
        },
    )
    assert diff_similarity(CALC_GOLD, padded, git_diff=True) == pytest.approx(1 / 3)


@pytest.mark.skipif(not LITE.exists(), reason=f"{LITE} (SWE-bench Lite) is not on this machine")
def test_swe_bench_gold_patches_against_each_other() -> None:
    records = [json.loads(line) for line in LITE.read_text().splitlines()[:40]]
    for record in records:
        assert diff_similarity(record["patch"], record["patch"]) == 1.0
    # Two different instances' fixes share no file, or little.
    first, second = records[0]["patch"], records[1]["patch"]
    assert diff_similarity(first, second) == 0.0 or records[0]["repo"] == records[1]["repo"]


def test_diff_similarity_reward_reads_model_patch_or_completion(roman: FixtureRepo) -> None:
    gold = roman.task.patch
    conversation = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "Here:\n" + gold},
    ]
    rewards = diff_similarity_reward(
        prompts=["p"] * 4,
        completions=["no diff here", conversation, "", "x"],
        patch=[gold, gold, "", gold],
        model_patch=[gold, None, gold, gold],
        eval_result=[None, None, None, result(infra="pod evicted")],
    )
    assert rewards == [1.0, 1.0, None, None]
    assert completion_text(conversation).startswith("Here:")


# --- RewardSpec ---------------------------------------------------------------------------------


def test_make_reward_follows_the_spec(roman: FixtureRepo) -> None:
    gold = roman.task.patch
    kwargs = {
        "completions": ["", "", ""],
        "patch": [gold, gold, gold],
        "model_patch": [gold, roman.patches["wrong"], gold],
        "eval_result": [result(resolved=True, f2p=1.0), result(f2p=0.5), result(infra="boom")],
    }
    binary = make_reward(RewardSpec())
    assert binary(**kwargs) == [1.0, 0.0, None]
    fraction = make_reward(RewardSpec.model_validate({"type": "tests", "testsMode": "fraction"}))
    assert fraction(**kwargs) == [1.0, 0.75, None]
    similarity = make_reward(RewardSpec.model_validate({"type": "diff-similarity"}))
    similar = similarity(**kwargs)
    assert similar[0] == 1.0 and similar[2] is None
    mix = make_reward(
        RewardSpec.model_validate({"type": "mix", "weights": {"tests": 0.8, "diffSimilarity": 0.2}})
    )
    mixed = mix(**kwargs)
    assert mixed[0] == pytest.approx(1.0)
    assert mixed[1] == pytest.approx(0.2 * similar[1])  # type: ignore[operator]
    assert mixed[2] is None
    assert mix.__name__.startswith("mix_")


def test_a_run_tampered_with_costs_more_than_a_wrong_answer() -> None:
    """Training scores a caught forgery below an honest wrong answer; the verdict's own score
    (a Benchmark's) stays 0. Its test results, resolved included, count for nothing."""
    caught = result(resolved=True, f2p=1.0, tampered="canary test_x_3 passed")
    batch = {"completions": [""] * 4, "eval_result": [caught, result(), result(infra="x"), None]}
    assert make_reward(RewardSpec())(**batch) == [-1.0, 0.0, None, None]
    fraction = RewardSpec.model_validate({"testsMode": "fraction", "tampered": -0.5})
    assert make_reward(fraction)(**batch) == [-0.5, 0.5, None, None]
    assert make_reward(RewardSpec.model_validate({"tampered": 0}))(**batch)[0] == 0.0
    mix = {"type": "mix", "weights": {"tests": 0.5, "diffSimilarity": 0.5}}
    mixed = make_reward(RewardSpec.model_validate(mix))
    gold = "--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert mixed(**batch, patch=[gold] * 4, model_patch=[""] * 4)[0] == pytest.approx(-0.5)
    assert resolution_reward(**batch)[0] == 0.0
    assert make_reward(RewardSpec()).__name__ == "resolution_reward"
    with pytest.raises(ValueError, match="less than or equal to 0"):
        RewardSpec.model_validate({"tampered": 0.5})


def test_the_default_penalty_makes_a_guessing_forgery_lose() -> None:
    """A forgery that passes one test of each canary group (the real one or a copy, unable to
    tell them apart) is caught unless it picks the real test: with the fewest groups (one
    FAIL_TO_PASS test), its expected reward must stay below an honest wrong answer's 0."""
    lucky = 1 / (canary.COUNT + 1)
    assert lucky * 1.0 + (1 - lucky) * RewardSpec().tampered < 0.0


def test_mix_without_weights_is_refused() -> None:
    spec = RewardSpec.model_construct(type="mix", tests_mode="binary", weights=None)
    with pytest.raises(ValueError, match="needs weights"):
        make_reward(spec)
