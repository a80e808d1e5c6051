"""`crl tasks`: commands on task files.

`crl tasks check FILE` validates instances the way a benchmark's curators do: the gold patch must
resolve, no patch must not, N runs find flaky tests. It runs every instance in a local sandbox
(or the sandbox the config names) through the same evaluation engine training and benchmarks
use. Imports stay light: the task loaders, the harness and the sandbox registry, no Kubernetes
client.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer
from pydantic import BaseModel, ValidationError
from rich.markup import escape
from rich.table import Table

from crl_cli.common import INVALID, USAGE, Output, err, out, sandbox_config, usage_error
from crl_cli.options import Instances, Limit, Sandbox, TableOrJsonLines, TaskFile, Timeout
from crl_worker.api.common import TaskFilter, TaskFormat
from crl_worker.errors import CrlError, SandboxError
from crl_worker.harness.check import InstanceCheck, check_tasks
from crl_worker.sandbox.registry import parse_config
from crl_worker.tasks.formats import CONVERTERS
from crl_worker.tasks.loaders import LoadResult, load_tasks
from crl_worker.tasks.model import Task

T = TypeVar("T")

if TYPE_CHECKING:
    from crl_worker.sandbox.images import TaskImage

logger = logging.getLogger(__name__)

app = typer.Typer(
    name="tasks",
    help="Validate task files: gold patches resolve, no patch does not, tests are stable.",
    no_args_is_help=True,
)


_VERDICT_STYLE = {
    "resolved": "green",
    "unresolved": "yellow",
    "patch-failed": "red",
    "error": "red",
    "environment-error": "red",
    "mixed": "magenta",
    "not-run": "dim",
}


def _formats() -> list[str]:
    return sorted(CONVERTERS)


def detect_format(file: Path) -> str:
    """`task` when the file's first record is a native Task (it has a `test` object or a
    `task_type`), else `swe-bench`. Only JSON and JSONL are looked at; anything unreadable is left to the loader."""
    try:
        if file.suffix == ".jsonl":
            with file.open() as handle:
                line = next((raw for raw in handle if raw.strip()), "")
            first = json.loads(line) if line else None
        elif file.suffix == ".json":
            loaded = json.loads(file.read_text())
            first = loaded[0] if isinstance(loaded, list) and loaded else loaded
        else:
            return "swe-bench"
    except (OSError, ValueError):
        return "swe-bench"
    native = isinstance(first, dict) and (
        isinstance(first.get("test"), dict) or "task_type" in first
    )
    return "task" if native else "swe-bench"


def _table(results: list[InstanceCheck]) -> Table:
    table = Table(title="Task check", show_lines=False)
    table.add_column("instance", no_wrap=True)
    table.add_column(results[0].patch_label if results else "gold")
    table.add_column("no patch")
    checked = any(r.confirmed for r in results)
    if checked:
        table.add_column("integrity")
    table.add_column("flaky", overflow="fold")
    table.add_column("problems", overflow="fold")
    for r in results:

        def verdict(value: str) -> str:
            return f"[{_VERDICT_STYLE.get(value, 'white')}]{value}[/]"

        problems = "\n".join(escape(p) for p in r.problems) or "[green]ok[/]"
        if r.warnings:
            problems += "\n" + "\n".join(f"[yellow]warning:[/] {escape(w)}" for w in r.warnings)
        table.add_row(
            escape(r.instance_id),
            verdict(r.gold_verdict),
            verdict(r.no_patch_verdict),
            *([verdict(r.integrity_verdict)] if checked else []),
            escape(", ".join(r.flaky)) or "-",
            problems,
        )
    return table


def _load(file: Path, format: str, instance: list[str] | None, limit: int | None) -> LoadResult:
    """The task file's tasks (format detected when empty); exits with a message when the
    format is unknown or the file cannot be read."""
    if not format:
        format = detect_format(file)
    if format not in _formats():
        err.print(
            f"[red]error:[/] unknown format {escape(format)!r}; use one of: "
            + ", ".join(_formats()),
            highlight=False,
        )
        raise typer.Exit(USAGE)
    if not file.exists():
        err.print(f"[red]error:[/] {escape(str(file))} does not exist", highlight=False)
        raise typer.Exit(USAGE)
    try:
        task_filter = TaskFilter(instance_ids=instance or None, limit=limit)
        return load_tasks(file, cast(TaskFormat, format), task_filter)
    except (CrlError, OSError, ValueError, ValidationError) as exc:
        err.print(f"[red]error:[/] cannot read {escape(str(file))}: {escape(str(exc))}")
        raise typer.Exit(INVALID) from exc


def _unread(loaded: LoadResult) -> list[tuple[str, str]]:
    """(instance id, problem) for records that could not be read and ids the file lacks."""
    return [(e.record or "?", f"unreadable record: {e}") for e in loaded.errors] + [
        (i, "no record in the file has this instance id") for i in loaded.missing_ids
    ]


def _sandbox(value: str | None) -> BaseModel:
    """The validated `--sandbox` config. Parsed once, before any instance: a bad config is the
    command line's mistake (a usage exit), not a sandbox failure to report on every instance."""
    try:
        return parse_config(sandbox_config(value))
    except SandboxError as exc:
        raise usage_error(f"--sandbox: {exc}") from exc


def _run_until_sigterm(work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)``, with SIGTERM stopping it the way Ctrl-C does: the work is
    cancelled, so its sandboxes close (their processes killed, their folders removed) before the
    command exits with 143. Without this SIGTERM ended the process at once and left both."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        try:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        except (NotImplementedError, RuntimeError):  # not the main thread
            return await work
        try:
            return await work
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        err.print("[yellow]stopped[/] by SIGTERM", highlight=False)
        raise typer.Exit(128 + signal.SIGTERM) from None


@app.command()
def check(
    file: TaskFile,
    format: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="Record format: a benchmark's (swe-bench, swe-smith, r2e-gym, swe-rebench, bigvul, "
            "...) or 'task' (Task objects as JSON/JSONL). Default: 'task' when the first record "
            "has a 'test' object or a 'task_type' (the native format), else 'swe-bench'.",
        ),
    ] = "",
    runs: Annotated[
        int, typer.Option("--runs", "-n", min=1, help="Runs of each patch, to find flaky tests.")
    ] = 1,
    instance: Instances = None,
    limit: Limit = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Instances at a time.")] = 1,
    timeout: Timeout = None,
    sandbox: Sandbox = None,
    output: TableOrJsonLines = Output.text,
    patch: Annotated[
        Path | None,
        typer.Option(
            "--patch",
            help="A candidate patch (a diff file) to grade instead of each gold patch, as an "
            "episode's resolved verdict is confirmed: a pristine sandbox per run, only its "
            "source changes, canary tests (docs/security.md).",
        ),
    ] = None,
    integrity: Annotated[
        bool,
        typer.Option(
            "--integrity",
            help="Also grade each gold patch (--runs times) as an episode's resolved verdict is "
            "confirmed (a pristine sandbox, only its source changes, canary tests): an "
            "instance whose gold patch does not pass there is invalid, since a correct answer "
            "to it would be graded 0. Not with --patch, which is graded that way already.",
        ),
    ] = False,
) -> None:
    """Run each instance with its gold patch (must resolve) and without (must not)."""
    if integrity and patch is not None:
        err.print(
            "[red]error:[/] --integrity grades the gold patches; a --patch is already graded "
            "through the integrity check: use one of them",
            highlight=False,
        )
        raise typer.Exit(USAGE)
    candidate = _read_patch(patch)
    loaded = _load(file, format, instance, limit)
    config = _sandbox(sandbox)

    def progress(found: InstanceCheck) -> None:
        if output is Output.text:
            mark = "[green]ok[/]" if found.ok else "[red]invalid[/]"
            err.print(f"{escape(found.instance_id)}: {mark}", highlight=False)

    results = _run_until_sigterm(
        check_tasks(
            loaded.tasks,
            runs=runs,
            jobs=jobs,
            sandbox_config=config,
            timeout=timeout,
            progress=progress,
            candidate=candidate,
            integrity=integrity,
        )
    )
    # Records that could not be read, and ids asked for that the file lacks, are failures too.
    everything = [
        *results,
        *(InstanceCheck(instance_id=i, problems=[problem]) for i, problem in _unread(loaded)),
    ]

    if output is Output.json:
        for r in everything:
            # No markup: test ids like `test_x[negative-start]` would be read as rich tags.
            out.print(json.dumps(r.to_dict()), highlight=False, soft_wrap=True, markup=False)
    else:
        out.print(_table(everything))
        valid = sum(r.ok for r in everything)
        out.print(f"{valid} of {len(everything)} instances valid", highlight=False)
    if not everything:
        err.print("[yellow]warning:[/] no instance selected", highlight=False)
    if any(not r.ok for r in everything):
        raise typer.Exit(INVALID)


def _read_patch(path: Path | None) -> str | None:
    """The text of ``--patch`` (``None`` when not given); exits when it cannot be read."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise usage_error(f"--patch: {exc}") from exc


def _kept(result: TaskImage, published: set[str]) -> str:
    """What the "built" column says of a task nothing was built for."""
    if result.instance_id in published:
        return "published"
    return "reused" if result.ok else ""


def _bases(values: list[str] | None) -> dict[str, str]:
    bases: dict[str, str] = {}
    for value in values or []:
        language, sep, image = value.partition("=")
        if not sep or not language or not image:
            raise typer.BadParameter(
                f"{value!r}: give LANGUAGE=IMAGE, e.g. python=python:3.12-slim"
            )
        bases[language] = image
    return bases


@app.command()
def images(
    file: TaskFile,
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write the tasks, each with its image, to this JSONL file (native task format).",
        ),
    ] = None,
    format: Annotated[
        str, typer.Option("--format", "-f", help="Record format (default: detected).")
    ] = "",
    instance: Instances = None,
    limit: Limit = None,
    base: Annotated[
        list[str] | None,
        typer.Option(
            "--base",
            help="Base image of a language's tasks, LANGUAGE=IMAGE (repeatable; {python} is the"
            " task's version). Default: python=python:{python}-slim-bookworm,"
            " java=maven:3.9-eclipse-temurin-17.",
        ),
    ] = None,
    prefix: Annotated[
        str,
        typer.Option(
            "--prefix",
            help="First part of every image name: a registry path to push them to, or a plain"
            " local name.",
        ),
    ] = "crl",
    rebuild_published: Annotated[
        bool,
        typer.Option(
            "--rebuild-published",
            help="Also build tasks that already name an image (SWE-bench's published images are"
            " kept by default).",
        ),
    ] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Tasks at a time.")] = 1,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache",
            help="Run every build step again instead of taking it from the engine's build cache.",
        ),
    ] = False,
    docker_host: Annotated[
        str | None,
        typer.Option("--docker-host", help="Engine address (default: DOCKER_HOST or the socket)."),
    ] = None,
    network: Annotated[
        str,
        typer.Option("--network", help="The builds' network mode (install commands download)."),
    ] = "host",
    output: TableOrJsonLines = Output.text,
) -> None:
    """Build each task's image (toolchain, environment, instance; reused when unchanged)."""
    from crl_worker.sandbox.images import TaskImage, TaskImageBuilder  # the docker SDK: here only

    loaded = _load(file, format, instance, limit)
    try:
        builder = TaskImageBuilder.connect(
            docker_host,
            prefix=prefix,
            bases=_bases(base),
            network=network or None,
            no_cache=no_cache,
        )
    except SandboxError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(INVALID) from exc
    published = [t for t in loaded.tasks if t.image and not rebuild_published]
    wanted = [t for t in loaded.tasks if not (t.image and not rebuild_published)]

    def progress(found: TaskImage) -> None:
        if output is Output.text:
            mark = "[green]ok[/]" if found.ok else "[red]failed[/]"
            err.print(f"{escape(found.instance_id)}: {mark}", highlight=False)

    results = asyncio.run(builder.build_all(wanted, jobs=jobs, progress=progress))
    results += [TaskImage(t.instance_id, image=t.image) for t in published]
    results += [TaskImage(i, error=problem) for i, problem in _unread(loaded)]
    if out_file is not None:
        by_id = {r.instance_id: r for r in results if r.ok}
        with_images = [
            t.model_copy(update={"image": by_id[t.instance_id].image})
            for t in loaded.tasks
            if t.instance_id in by_id
        ]
        try:
            out_file.parent.mkdir(parents=True, exist_ok=True)
            out_file.write_text(
                "".join(json.dumps(t.model_dump(mode="json")) + "\n" for t in with_images)
            )
        except OSError as exc:
            err.print(f"[red]error:[/] cannot write {escape(str(out_file))}: {exc}")
            raise typer.Exit(INVALID) from exc

    if output is Output.json:
        for r in results:
            out.print(json.dumps(r.to_dict()), highlight=False, soft_wrap=True, markup=False)
    else:
        published_ids = {t.instance_id for t in published}
        table = Table("instance", "image", "built", "seconds", "error")
        for r in results:
            table.add_row(
                escape(r.instance_id),
                escape(r.image or ""),
                ", ".join(r.built) or _kept(r, published_ids),
                f"{r.seconds:.1f}",
                escape((r.error or "").splitlines()[0] if r.error else ""),
            )
        out.print(table)
        ok = sum(r.ok for r in results)
        out.print(f"{ok} of {len(results)} tasks have their image", highlight=False)
        if out_file is not None:
            out.print(f"tasks with their images: {escape(str(out_file))}", highlight=False)
    for r in results:
        if r.error and output is Output.text:
            err.print(f"[red]{escape(r.instance_id)}:[/] {escape(r.error)}", highlight=False)
    if any(not r.ok for r in results):
        raise typer.Exit(INVALID)


def _say(instance_id: str, line: str) -> None:
    err.print(f"{escape(instance_id)}: {escape(line)}", highlight=False)


@app.command("derive-implement")
def derive_implement_command(
    file: Annotated[Path, typer.Argument(help="Task file of repair tasks (.json, .jsonl).")],
    out_dir: Annotated[
        Path,
        typer.Option("--out", help="Folder for the derived suite: tasks.jsonl and repos/*.bundle."),
    ],
    format: Annotated[
        str, typer.Option("--format", "-f", help="Record format (as for `crl tasks check`).")
    ] = "",
    instance: Annotated[
        list[str] | None,
        typer.Option("--instance", "-i", help="Only this repair instance id (repeatable)."),
    ] = None,
    function: Annotated[
        list[str] | None,
        typer.Option(
            "--function", help="Only this function, as `name` or `Class.method` (repeatable)."
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="Derived tasks per repair task at most.")
    ] = 3,
    sandbox: Sandbox = None,
) -> None:
    """Derive implement-from-spec tasks: remove the body of functions the tests cover, keep
    the signature and docstring, withhold the deciding tests (the harness adds them only to
    grade), keep those whose tests fail without the body and pass with it
    (docs/task-types.md)."""
    from crl_worker.harness.derive import Derivation, DeriveError, derive_implement

    loaded = _load(file, format, instance, None)
    config = _sandbox(sandbox)
    if out_dir.exists() and not out_dir.is_dir():
        err.print(f"[red]error:[/] --out {escape(str(out_dir))} is not a folder", highlight=False)
        raise typer.Exit(USAGE)
    out_dir.mkdir(parents=True, exist_ok=True)

    async def everything() -> list[Derivation | str]:
        found: list[Derivation | str] = []
        for task in loaded.tasks:
            try:
                found.append(
                    await derive_implement(
                        task,
                        out_dir,
                        sandbox_config=config,
                        limit=limit,
                        functions=function,
                        progress=functools.partial(_say, task.instance_id),
                    )
                )
            except (DeriveError, CrlError) as exc:
                found.append(f"{task.instance_id}: {exc}")
        return found

    results = _run_until_sigterm(everything())
    table = Table(title="Derived implement tasks")
    table.add_column("repair task", no_wrap=True)
    table.add_column("function")
    table.add_column("result", overflow="fold")
    derived: list[Task] = []
    for item in results:
        if isinstance(item, str):
            table.add_row(escape(item.split(":", 1)[0]), "-", f"[red]{escape(item)}[/]")
            continue
        for task in item.tasks:
            derived.append(task)
            table.add_row(
                escape(item.source_id),
                escape(str(task.metadata.get("function"))),
                f"[green]ok[/] {escape(task.instance_id)} ({len(task.fail_to_pass)} FAIL_TO_PASS)",
            )
        for name, reason in item.rejected:
            table.add_row(
                escape(item.source_id), escape(name), f"[yellow]rejected:[/] {escape(reason)}"
            )
    lines = []
    for task in derived:
        record = task.model_dump(mode="json", exclude_defaults=True)
        record["task_type"] = "implement"
        record["source"] = f"repos/{Path(task.source or '').name}"
        lines.append(json.dumps(record, sort_keys=True))
    (out_dir / "tasks.jsonl").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    out_dir.joinpath("repos").mkdir(exist_ok=True)
    kept = {f"{Path(t.source or '').name}" for t in derived}
    for stale in out_dir.joinpath("repos").glob("*.bundle"):
        if stale.name not in kept:
            stale.unlink()
    out.print(table)
    out.print(
        f"{len(derived)} implement tasks written to {escape(str(out_dir / 'tasks.jsonl'))}",
        highlight=False,
    )
    if not derived:
        raise typer.Exit(INVALID)
