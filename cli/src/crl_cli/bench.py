"""`crl bench` and `crl compare`: run a Benchmark on this machine, compare two results folders.

`crl bench FILE` runs the Benchmark manifest's suite with local (or `--sandbox`) sandboxes: `--agent gold`
replays each instance's gold patch through the agent's own tools (a harness check), `--agent
openai` talks to any OpenAI-compatible endpoint. It resumes from the results folder unless told
to `--restart`. `crl compare RESULTS BASELINE` is the paired comparison over shared instances;
its exit code says whether a minimum improvement was met, so a success criterion is one command.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from crl_cli.common import (
    INVALID,
    Output,
    err,
    out,
    sandbox_config,
    single_resource,
    usage_error,
)
from crl_cli.options import Instances, Limit, ValidateRuns
from crl_worker.api import Benchmark
from crl_worker.api.contract import Env

if TYPE_CHECKING:
    # The runner pulls in the agent's HTTP client and the sandboxes: imported when a command
    # runs, so that `crl validate` and friends need only the base install.
    from crl_worker.bench.config import BenchmarkConfig
    from crl_worker.harness.validate import ValidationReport
    from crl_worker.rollout.results import AttemptResult


class Agent(StrEnum):
    """Who answers the agent's turns."""

    gold = "gold"
    openai = "openai"


#: Exit code of a finished run in which some attempts had infrastructure failures (rerun to
#: retry them).
ERRORED = 1


def _benchmark(file: Path) -> BenchmarkConfig:
    """The one Benchmark of a manifest, validated as the API server would."""
    from crl_worker.bench.config import BenchmarkConfig

    found = single_resource(file, Benchmark, "crl bench")
    return BenchmarkConfig(name=found.metadata.name or file.stem, spec=found.spec, path=file)


def _native_tasks(config: BenchmarkConfig, tasks: Path | None) -> BenchmarkConfig:
    """`config` reading `tasks` as native Task records when they are (what `crl tasks images
    --out` writes for any suite, a polyglot or QuixBugs one included), else as it is."""
    from crl_cli.tasks import detect_format

    source = config.spec.suite.tasks
    if tasks is None or source.format == "task" or detect_format(tasks) != "task":
        return config
    suite = config.spec.suite.model_copy(
        update={"tasks": source.model_copy(update={"format": "task"})}
    )
    return dataclasses.replace(config, spec=config.spec.model_copy(update={"suite": suite}))


class _Display:
    """A progress bar on a terminal, one line per attempt otherwise (both on standard error)."""

    def __init__(self, total: int, done: int, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Progress | None = None
        if not quiet and err.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]bench"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("[green]{task.fields[resolved]} resolved"),
                TextColumn("[red]{task.fields[errored]} errored"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=err,
                transient=True,
            )
            self.task = self.bar.add_task(
                "bench", total=total, completed=done, resolved=0, errored=0
            )

    def __enter__(self) -> _Display:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, result: AttemptResult, report: Mapping[str, Any]) -> None:
        """Show one finished attempt."""
        verdict = (
            "[red]error[/]"
            if result.resolved is None
            else "[green]resolved[/]"
            if result.resolved
            else "[yellow]unresolved[/]"
        )
        line = (
            f"[{report['done']}/{report['total']}] {escape(result.instance_id)}#{result.attempt}:"
            f" {verdict} ({escape(result.exit_reason)}, {result.wall_seconds:.1f}s)"
        )
        if result.infrastructure_error:
            line += f" {escape(result.infrastructure_error[:300])}"
        if self.bar is not None:
            self.bar.update(
                self.task,
                completed=report["done"],
                resolved=report["resolved"],
                errored=report["errored"],
            )
            self.bar.console.print(line, highlight=False)
        elif not self.quiet:
            err.print(line, highlight=False)


def bench(
    file: Annotated[Path, typer.Argument(help="Benchmark manifest (YAML).")],
    agent: Annotated[
        Agent,
        typer.Option(
            "--agent",
            help="gold: replay the gold patches through the agent's tools (harness check); "
            "openai: an OpenAI-compatible endpoint.",
        ),
    ] = Agent.openai,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", help=f"API root, e.g. http://localhost:8000/v1 (else ${Env.MODEL_URL})."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help=f"Model name (else ${Env.MODEL_NAME}).")
    ] = None,
    results: Annotated[
        Path | None,
        typer.Option("--results", help="Results folder (default: spec.results.path, from here)."),
    ] = None,
    tasks: Annotated[
        Path | None,
        typer.Option("--tasks", help="Task file to use instead of the suite's source."),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(
            "--sandbox",
            help='Sandbox config as JSON or a JSON file (default: {"type": "local"}); e.g.'
            ' {"type": "docker", "network": "none"} with tasks that name their images.',
        ),
    ] = None,
    limit: Limit = None,
    instance: Instances = None,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", min=1, help="Attempts at a time (default: spec.parallelism)."),
    ] = None,
    restart: Annotated[
        bool,
        typer.Option("--restart", help="Move existing results aside (never deleted), start over."),
    ] = False,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", help="Results folder to compare with in the summary."),
    ] = None,
    spares: Annotated[
        bool,
        typer.Option(
            "--spares",
            help="Start a pristine sandbox for the integrity check with each episode, beside the"
            " agent's, so a resolved episode does not wait for one (up to twice the sandboxes).",
        ),
    ] = False,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            min=0,
            help="Run an attempt that had an infrastructure failure again, after the rest, up to"
            " this many times.",
        ),
    ] = 1,
    max_errors: Annotated[
        int | None,
        typer.Option(
            "--max-errors",
            min=0,
            help="Give up after this many infrastructure failures in a row (default: max(10, 2 x"
            " jobs); 0: never).",
        ),
    ] = None,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate",
            help="Validate the tasks first (gold resolves, no patch does not, flaky tests), in"
            " parallel, verdicts cached by content hash; failing tasks are left out and listed"
            " in the results folder's quarantine.json.",
        ),
    ] = False,
    validate_runs: ValidateRuns = 2,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="text (a table) or json (the summary).")
    ] = Output.text,
) -> None:
    """Run a Benchmark's suite on this machine with local sandboxes (or --sandbox's).

    Every attempt runs the agent and then the evaluation in the same sandbox; results go to a
    folder (results.jsonl, trajectories.jsonl, summary.json) and a rerun resumes where the last
    one stopped. Exits 0 when the suite finished, 1 when it finished with infrastructure
    failures (rerun to retry them) or gave up after too many in a row, 2 on wrong usage,
    130/143 when interrupted.
    """
    from crl_worker.bench.config import BenchConfigError, BenchTasksError
    from crl_worker.bench.setup import prepare_benchmark
    from crl_worker.bench.summary import summary_table

    config = _native_tasks(_benchmark(file), tasks)
    try:
        setup = prepare_benchmark(
            config,
            agent="gold" if agent is Agent.gold else "openai",
            url=url,
            model=model,
            tasks_file=tasks,
            instance_ids=instance,
            limit=limit,
            results=results,
            restart=restart,
            baseline=baseline,
            parallelism=jobs,
            retries=retries,
            spares=spares,
            max_errors=max_errors,
            sandbox=sandbox_config(sandbox),
            validate_runs=validate_runs if validate else None,
        )
    except BenchTasksError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(INVALID) from None
    except BenchConfigError as exc:
        raise usage_error(str(exc)) from None
    folder = setup.folder
    quiet = output is Output.json
    if setup.validation is not None and not quiet:
        _say_validation(setup.validation, folder)
    with _Display(setup.total, setup.done_before, quiet) as display:
        setup.runner.progress = display.update
        if not quiet:
            err.print(
                f"{escape(config.name)}: {len(setup.tasks)} instances x {config.spec.attempts}"
                f" attempts with {escape(setup.model)}; {setup.done_before} already done;"
                f" results in {escape(str(folder))}",
                highlight=False,
            )
        outcome, signalled = setup.run()
    summary = outcome.summary
    if quiet:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        out.print(summary_table(summary))
        out.print(f"results: {escape(str(folder.resolve()))}", highlight=False)
    if agent is Agent.gold and not quiet:
        _warn_about_gold_patches(folder)
    if outcome.gave_up:
        err.print(
            f"[red]gave up:[/] {escape(outcome.gave_up)}; {summary['done']} of"
            f" {summary['total']} attempts are in {escape(str(folder))}; run the same command"
            " again to resume once the cause is fixed",
            highlight=False,
        )
        raise typer.Exit(ERRORED)
    if outcome.interrupted:
        err.print(
            f"[yellow]interrupted:[/] {summary['done']} of {summary['total']} attempts are in"
            f" {escape(str(folder))}; run the same command again to resume",
            highlight=False,
        )
        raise typer.Exit(128 + signalled if signalled else INVALID)
    if summary["errored"]:
        environment = summary.get("environmentErrors") or 0
        if environment:
            err.print(
                f"[red]{environment} attempts graded no test[/]: their task's environment is"
                " broken (runner missing, nothing collected); fix the tasks (`crl tasks check`"
                " shows the exit code and the log), then run the same command again",
                highlight=False,
            )
        if summary["errored"] > environment:
            err.print(
                f"[red]{summary['errored'] - environment} attempts had infrastructure"
                " failures[/] (not counted as unresolved); run the same command again to retry"
                " them",
                highlight=False,
            )
        raise typer.Exit(ERRORED)


def _say_validation(report: ValidationReport, folder: Path) -> None:
    """One line on what validating the tasks found, and the quarantined tasks with reasons."""
    from crl_worker.harness.validate import QUARANTINE_FILE

    total = len(report.valid) + len(report.quarantined)
    err.print(
        f"validated {total} tasks ({report.cached} verdicts cached): {len(report.valid)} valid,"
        f" {len(report.quarantined)} quarantined",
        highlight=False,
    )
    for verdict in report.quarantined:
        err.print(
            f"  [yellow]quarantined[/] {escape(verdict.instance_id)}:"
            f" {escape(verdict.problems[0])}",
            highlight=False,
        )
    if report.quarantined:
        err.print(f"  listed in {escape(str(folder / QUARANTINE_FILE))}", highlight=False)


def _warn_about_gold_patches(folder: Path) -> None:
    """Say which instances' gold patches did not apply: their 'unresolved' is a broken task or
    harness, not a hard instance."""
    from crl_worker.rollout.results import ResultsError, read_results

    try:
        records = read_results(folder)
    except ResultsError:
        return
    failed = sorted(
        {r.instance_id for r in records if r.error and r.error.startswith("the gold patch")}
    )
    if failed:
        shown = ", ".join(failed[:10]) + (
            f" and {len(failed) - 10} more" if len(failed) > 10 else ""
        )
        err.print(
            f"[yellow]warning:[/] the gold patch did not apply for {len(failed)} instances"
            f" ({escape(shown)}): their tasks (patch, base commit) or the harness are broken;"
            " see the 'error' field in results.jsonl",
            highlight=False,
        )


def compare(
    results: Annotated[Path, typer.Argument(help="Results folder (or results.jsonl) to judge.")],
    baseline: Annotated[Path, typer.Argument(help="Baseline results folder (or results.jsonl).")],
    min_improvement: Annotated[
        float | None,
        typer.Option(
            "--min-improvement",
            help="Absolute improvement (0.05 = 5 points) the interval's lower end must clear.",
        ),
    ] = None,
    confidence: Annotated[
        float, typer.Option("--confidence", help="Level of the bootstrap interval.")
    ] = 0.95,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap.")] = 0,
    resamples: Annotated[
        int, typer.Option("--resamples", min=100, help="Bootstrap resamples.")
    ] = 10_000,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="text or json (the comparison).")
    ] = Output.text,
) -> None:
    """Paired comparison of two results over their shared instances.

    Prints the difference in resolve rate, its bootstrap confidence interval, McNemar's exact
    p-value and the verdict. Exits 0 when the minimum improvement is met (or none was asked
    for), 1 when it is not, 2 on wrong usage (unreadable folders, nothing shared).
    """
    from crl_worker.bench.compare import compare_results
    from crl_worker.bench.stats import ComparisonError
    from crl_worker.bench.summary import comparison_line, comparison_wire
    from crl_worker.rollout.results import ResultsError

    if not 0.5 < confidence < 1.0:
        raise usage_error("--confidence must be between 0.5 and 1")
    try:
        found = compare_results(
            results,
            baseline,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
            minimum_improvement=min_improvement,
        )
    except (ResultsError, ComparisonError, OSError) as exc:
        raise usage_error(str(exc)) from None
    wire = comparison_wire(found, str(baseline))
    if output is Output.json:
        sys.stdout.write(json.dumps(wire) + "\n")
    else:
        out.print(
            f"{escape(str(results))}: {100 * found.rate:.1f}% vs {escape(str(baseline))}:"
            f" {100 * found.baseline_rate:.1f}% on {found.shared_instances} shared instances"
            + (
                f" ({found.only_in_results} only in the results, {found.only_in_baseline} only in"
                " the baseline)"
                if found.only_in_results or found.only_in_baseline
                else ""
            ),
            highlight=False,
        )
        out.print(escape(comparison_line(wire)), highlight=False)
        out.print(
            f"discordant pairs: {found.discordant_results} resolved only by the results,"
            f" {found.discordant_baseline} only by the baseline (first valid attempt)",
            highlight=False,
        )
    if found.meets_minimum_improvement is False:
        raise typer.Exit(INVALID)


def register(app: typer.Typer) -> None:
    """Add `bench` and `compare` to the `crl` command."""
    app.command("bench")(bench)
    app.command("compare")(compare)


__all__ = ["bench", "compare", "register"]
