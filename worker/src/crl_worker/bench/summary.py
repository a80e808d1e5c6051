"""What a benchmark run amounts to: ``summary.json``, the progress report the runner publishes,
and the table ``crl bench`` prints.

Counting rules (docs/benchmarks.md): an attempt with an infrastructure failure is *errored*: it
counts as done but never as unresolved, and is left out of the resolve rate and pass@k. The
resolve rate is resolved attempts over done attempts minus errored ones.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from crl_worker.bench.stats import Comparison, resolve_rate, suite_pass_at_k
from crl_worker.rollout.results import ENVIRONMENT_ERROR_PREFIX, AttemptResult


def now_rfc3339() -> str:
    """The current UTC time as RFC 3339 (seconds, ``Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def outcomes_by_instance(records: Iterable[AttemptResult]) -> dict[str, list[bool]]:
    """Each instance's valid attempts' verdicts (instances with none are left out)."""
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        if r.resolved is not None:
            outcomes[r.instance_id].append(r.resolved)
    return dict(outcomes)


def pass_at_k_values(records: Sequence[AttemptResult], ks: Iterable[int]) -> list[dict[str, Any]]:
    """pass@k for each k: ``{"k", "value", "instances", "excluded"}`` (value None when no
    instance had k valid attempts)."""
    outcomes = outcomes_by_instance(records)
    values = []
    for k in sorted(set(ks)):
        found = suite_pass_at_k(outcomes, k)
        values.append(
            {
                "k": k,
                "value": found.value,
                "instances": found.instances,
                "excluded": found.excluded,
            }
        )
    return values


def report_pass_at_k(records: Sequence[AttemptResult], ks: Iterable[int]) -> list[dict[str, Any]]:
    """pass@k as the progress report holds it: ``{"k", "value"}``, values without any instance
    left out."""
    return [
        {"k": v["k"], "value": v["value"]}
        for v in pass_at_k_values(records, ks)
        if v["value"] is not None
    ]


def progress_report(
    records: Sequence[AttemptResult],
    *,
    total: int,
    ks: Iterable[int],
    finished: bool,
    pass_at_k: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The progress report of the contract (what the Benchmark's status shows).

    ``records`` are the attempts done so far (latest result of each, only the selected ones);
    ``pass_at_k`` may be passed in when the caller computed it (see :func:`report_pass_at_k`).
    """
    errored = sum(r.infrastructure_failure for r in records)
    resolved = sum(r.resolved is True for r in records)
    return {
        "total": total,
        "done": len(records),
        "resolved": resolved,
        "errored": errored,
        "resolveRate": resolve_rate(resolved, len(records) - errored),
        "passAtK": report_pass_at_k(records, ks) if pass_at_k is None else pass_at_k,
        "finished": finished,
        "updatedAt": now_rfc3339(),
    }


def _per_attempt(total: float, count: int) -> float | None:
    return total / count if count else None


def comparison_wire(comparison: Comparison, baseline: str) -> dict[str, Any]:
    """A comparison with camelCase keys, as summary.json and the Benchmark's status hold it."""
    return {
        "baseline": baseline,
        "sharedInstances": comparison.shared_instances,
        "onlyInResults": comparison.only_in_results,
        "onlyInBaseline": comparison.only_in_baseline,
        "rate": comparison.rate,
        "baselineRate": comparison.baseline_rate,
        "difference": comparison.difference,
        "ciLow": comparison.ci_low,
        "ciHigh": comparison.ci_high,
        "confidenceLevel": comparison.confidence_level,
        "resamples": comparison.resamples,
        "seed": comparison.seed,
        "discordantResults": comparison.discordant_results,
        "discordantBaseline": comparison.discordant_baseline,
        "mcnemarPValue": comparison.mcnemar_p_value,
        "minimumImprovement": comparison.minimum_improvement,
        "meetsMinimumImprovement": comparison.meets_minimum_improvement,
    }


def _group_rows(records: Sequence[AttemptResult], key: str) -> list[dict[str, Any]]:
    """Counts and resolve rate per value of ``key`` (an :class:`AttemptResult` field), sorted;
    records without a value are left out."""
    groups: dict[str, list[AttemptResult]] = defaultdict(list)
    for r in records:
        value = getattr(r, key)
        if value is not None:
            groups[value].append(r)
    rows = []
    for value in sorted(groups):
        group = groups[value]
        valid = [r for r in group if not r.infrastructure_failure]
        resolved = sum(r.resolved is True for r in valid)
        rows.append(
            {
                key: value,
                "instances": len({r.instance_id for r in group}),
                "attempts": len(group),
                "resolved": resolved,
                "errored": len(group) - len(valid),
                "resolveRate": resolve_rate(resolved, len(valid)),
                **_first_try(valid),
            }
        )
    return rows


def _first_try(valid: Sequence[AttemptResult]) -> dict[str, Any]:
    """With ``agent.tries: 2`` (some attempt has a first-try verdict): the first try's resolved
    count and rate over ``valid`` (the attempts with a verdict); ``resolveRate`` is then the
    rate after the second try. Empty otherwise."""
    if all(r.first_try_resolved is None for r in valid):
        return {}
    first = sum(r.first_try_resolved is True for r in valid)
    return {"firstTryResolved": first, "firstTryRate": resolve_rate(first, len(valid))}


def build_summary(
    records: Sequence[AttemptResult],
    *,
    suite: str,
    model: str,
    total: int,
    ks: Iterable[int],
    finished: bool,
    elapsed: float | None = None,
    comparison: Mapping[str, Any] | None = None,
    quarantined: int = 0,
) -> dict[str, Any]:
    """``summary.json`` of a run from its attempts' results (latest result of each attempt);
    ``quarantined``: the tasks its validation left out (not in ``total``)."""
    ks = list(ks)
    errored = [r for r in records if r.infrastructure_failure]
    valid = [r for r in records if not r.infrastructure_failure]
    resolved = sum(r.resolved is True for r in valid)
    repositories = _group_rows(records, "repo")
    prompt = sum(r.prompt_tokens for r in records)
    completion = sum(r.completion_tokens for r in records)
    agent_seconds = sum(r.agent_seconds for r in records)
    eval_seconds = sum(r.eval_seconds for r in records)
    attempt_seconds = sum(r.wall_seconds for r in records)
    return {
        "suite": suite,
        "model": model,
        "finished": finished,
        "updatedAt": now_rfc3339(),
        "total": total,
        "quarantined": quarantined,
        "done": len(records),
        "instances": len({r.instance_id for r in records}),
        "resolved": resolved,
        "unresolved": len(valid) - resolved,
        "errored": len(errored),
        "environmentErrors": sum(r.environment_error for r in errored),
        "resolveRate": resolve_rate(resolved, len(valid)),
        **_first_try(valid),
        "passAtK": pass_at_k_values(records, ks),
        "repositories": repositories,
        "languages": _group_rows(records, "language"),
        "tokens": {
            "prompt": prompt,
            "completion": completion,
            "promptPerAttempt": _per_attempt(prompt, len(records)),
            "completionPerAttempt": _per_attempt(completion, len(records)),
        },
        "time": {
            "wallSeconds": elapsed,
            "agentSeconds": agent_seconds,
            "evalSeconds": eval_seconds,
            "attemptSeconds": attempt_seconds,
            "agentSecondsPerAttempt": _per_attempt(agent_seconds, len(records)),
            "evalSecondsPerAttempt": _per_attempt(eval_seconds, len(records)),
            "attemptSecondsPerAttempt": _per_attempt(attempt_seconds, len(records)),
        },
        "exitReasons": dict(sorted(Counter(r.exit_reason for r in records).items())),
        "infrastructureErrors": [
            {"instanceId": r.instance_id, "attempt": r.attempt, "error": r.infrastructure_error}
            for r in errored[:50]
        ],
        "comparison": dict(comparison) if comparison is not None else None,
        "taskTypes": dict(sorted(Counter(r.task_type for r in records).items())),
        "classification": classification_summary(valid),
    }


def classification_summary(valid: Sequence[AttemptResult]) -> dict[str, Any] | None:
    """Accuracy, mean credit and a per-class (per CWE label) table of the classify attempts
    with a verdict; ``None`` when there are none."""
    rows = [r for r in valid if r.task_type == "classify" and r.label is not None]
    if not rows:
        return None
    by_label: dict[str, list[AttemptResult]] = defaultdict(list)
    for r in rows:
        assert r.label is not None
        by_label[r.label].append(r)

    def mean_credit(group: Sequence[AttemptResult]) -> float:
        return sum(r.credit or 0.0 for r in group) / len(group)

    classes = []
    for label in sorted(by_label, key=lambda k: int(k.split("-")[-1])):
        group = by_label[label]
        correct = sum(r.resolved is True for r in group)
        predicted = sum(r.answer == label for r in rows)
        classes.append(
            {
                "cwe": label,
                "attempts": len(group),
                "correct": correct,
                "accuracy": correct / len(group),
                "precision": correct / predicted if predicted else None,
                "meanCredit": mean_credit(group),
            }
        )
    correct = sum(r.resolved is True for r in rows)
    return {
        "attempts": len(rows),
        "correct": correct,
        "accuracy": correct / len(rows),
        "meanCredit": mean_credit(rows),
        "unanswered": sum(r.answer is None for r in rows),
        "classes": classes,
    }


def classification_table(classification: Mapping[str, Any]) -> Table:
    """The per-class table of a classify run, with a totals row."""
    table = Table(title="classification by CWE label")
    table.add_column("label", no_wrap=True)
    for name in ("attempts", "correct", "accuracy", "precision", "mean credit"):
        table.add_column(name, justify="right")
    for row in classification["classes"]:
        table.add_row(
            escape(row["cwe"]),
            str(row["attempts"]),
            str(row["correct"]),
            _rate(row["accuracy"]),
            _rate(row["precision"]),
            f"{row['meanCredit']:.2f}",
        )
    table.add_section()
    table.add_row(
        "[bold]total[/]",
        str(classification["attempts"]),
        str(classification["correct"]),
        f"[bold]{_rate(classification['accuracy'])}[/]",
        "",
        f"{classification['meanCredit']:.2f}",
    )
    return table


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def environment_errors_line(summary: Mapping[str, Any], shown: int = 3) -> str:
    """One line for people: how many errored attempts were environment errors (the task's test
    run reported no tests, so the task or its recipe is broken, not the model or a machine),
    with the first few instances and why, from the summary's ``infrastructureErrors``."""
    count = summary.get("environmentErrors") or 0
    listed = [
        e
        for e in summary.get("infrastructureErrors", [])
        if (e.get("error") or "").startswith(ENVIRONMENT_ERROR_PREFIX)
    ]
    parts = [
        f"{e['instanceId']}#{e['attempt']}: {e['error'][len(ENVIRONMENT_ERROR_PREFIX) :]}"
        for e in listed[:shown]
    ]
    more = count - len(parts)
    return (
        f"{count} attempts graded no test (task environment, not the model)"
        + (": " + "; ".join(parts) if parts else "")
        + (f"; and {more} more" if parts and more > 0 else "")
    )


def summary_table(summary: Mapping[str, Any]) -> Group:
    """The per-repository table with a totals row, then pass@k, tokens and time, for people."""
    table = Table(title=f"{escape(summary['suite'])} · {escape(summary['model'])}")
    table.add_column("repository", no_wrap=True)
    for name in ("instances", "attempts", "resolved", "errored", "rate"):
        table.add_column(name, justify="right")
    for row in summary["repositories"]:
        table.add_row(
            escape(row["repo"]),
            str(row["instances"]),
            str(row["attempts"]),
            str(row["resolved"]),
            f"[red]{row['errored']}[/]" if row["errored"] else "0",
            _rate(row["resolveRate"]),
        )
    table.add_section()
    table.add_row(
        "[bold]total[/]",
        str(summary["instances"]),
        str(summary["done"]),
        str(summary["resolved"]),
        f"[red]{summary['errored']}[/]" if summary["errored"] else "0",
        f"[bold]{_rate(summary['resolveRate'])}[/]",
    )
    lines: list[Any] = [table]
    languages = summary.get("languages") or []
    tries = "firstTryRate" in summary
    if len(languages) > 1 or (languages and tries):
        by_language = Table(title="per language")
        by_language.add_column("language", no_wrap=True)
        names = ("instances", "attempts", "resolved", "errored", "rate")
        for name in names if not tries else (*names[:-1], "try 1", "try 2"):
            by_language.add_column(name, justify="right")
        for row in languages:
            first = [_rate(row["firstTryRate"])] if tries and "firstTryRate" in row else []
            by_language.add_row(
                escape(row["language"]),
                str(row["instances"]),
                str(row["attempts"]),
                str(row["resolved"]),
                f"[red]{row['errored']}[/]" if row["errored"] else "0",
                *(first or (["-"] if tries else [])),
                _rate(row["resolveRate"]),
            )
        lines.append(by_language)
    classification = summary.get("classification")
    if classification:
        lines.append(classification_table(classification))
    pass_at = ", ".join(
        f"pass@{v['k']} {_rate(v['value'])}"
        + (f" ({v['excluded']} instances with fewer attempts left out)" if v["excluded"] else "")
        for v in summary["passAtK"]
    )
    tokens, time = summary["tokens"], summary["time"]
    per_prompt = tokens["promptPerAttempt"]
    per_completion = tokens["completionPerAttempt"]
    extra = Table.grid(padding=(0, 2))
    extra.add_column(style="bold")
    extra.add_column()
    extra.add_row("pass@k", pass_at or "-")
    extra.add_row(
        "tokens",
        f"{tokens['prompt']:,} prompt, {tokens['completion']:,} completion"
        + (
            f" ({per_prompt:,.0f} / {per_completion:,.0f} per attempt)"
            if per_prompt is not None and per_completion is not None
            else ""
        ),
    )
    wall = time["wallSeconds"]
    extra.add_row(
        "time",
        (f"{wall:.1f}s wall, " if wall is not None else "")
        + f"agent {time['agentSeconds']:.1f}s, evaluation {time['evalSeconds']:.1f}s"
        + (
            f" ({time['attemptSecondsPerAttempt']:.1f}s per attempt)"
            if time["attemptSecondsPerAttempt"] is not None
            else ""
        ),
    )
    environment = summary.get("environmentErrors") or 0
    if environment:
        extra.add_row("environment", escape(environment_errors_line(summary)))
    reasons = ", ".join(f"{k} {v}" for k, v in summary["exitReasons"].items())
    extra.add_row("endings", escape(reasons) or "-")
    if classification:
        extra.add_row(
            "classify",
            f"accuracy {_rate(classification['accuracy'])}, mean credit "
            f"{classification['meanCredit']:.2f}, {classification['unanswered']} attempts "
            "ended without an answer",
        )
    comparison = summary.get("comparison")
    if comparison:
        extra.add_row("vs baseline", escape(comparison_line(comparison)))
    return Group(*lines, extra)


def comparison_line(comparison: Mapping[str, Any]) -> str:
    """One line for people: difference, interval, p-value and verdict."""
    level = round(100 * comparison["confidenceLevel"])
    text = (
        f"{100 * comparison['difference']:+.1f} points over {comparison['sharedInstances']} shared"
        f" instances ({level}% CI {100 * comparison['ciLow']:+.1f} to"
        f" {100 * comparison['ciHigh']:+.1f}; McNemar p = {comparison['mcnemarPValue']:.4g})"
    )
    minimum = comparison.get("minimumImprovement")
    if minimum is not None:
        verdict = "meets" if comparison["meetsMinimumImprovement"] else "does not meet"
        text += f"; {verdict} the minimum improvement of {100 * minimum:+.1f} points"
    return text
