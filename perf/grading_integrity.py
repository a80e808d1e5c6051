"""What grading integrity costs on the bundled mini suite (and the Java fixture with ``--java``).

    python perf/grading_integrity.py [--repeat N] [--java] [--repo PATH] [--json]
    python perf/grading_integrity.py --compare [--group G]

``--compare`` measures the check both ways on the same machine and tasks, one after the other:
``fresh`` (a sandbox started for the check once the agent's is closed, as before spares) and
``spares`` (:class:`crl_worker.agent.pristine.PristineSpares`: a pristine sandbox starts with
the episode, beside the agent's, and the check takes it; the gold "agent" takes a fraction of a
second, so the check often waits for the rest of the spare's start) and ``spares-ready`` (the
same, the check timed once the spare has started, as it has after a real agent's minutes).
Each task runs ``--group`` gold episodes in a row (a GRPO group, pass@k attempts: default 2).
The spares' starts are paid in machine time beside the episode, not in waiting.

Prints figures; asserts nothing.

For every instance, in local sandboxes, the gold policy runs through the real agent loop, then:

- ``eval``: the in-sandbox evaluation (the unified rollout's fast path, what every episode pays);
- ``confirm``: the integrity check a resolved verdict gets
  (:func:`crl_worker.agent.episode.confirm_resolved`: a fresh sandbox started, the source diff
  applied, the tests run with canaries, the sandbox closed). Gold resolves every instance, so
  this is the worst case: in training the check runs only for the resolved share of episodes
  (and the rare runs that report no tests); an unresolved verdict costs nothing more.

The headline is ``confirm / eval``: the extra evaluation time of a resolved episode, as a
fraction of the in-sandbox evaluation. ``confirm / episode`` relates it to the whole episode
(sandbox start, agent, evaluation) without the check. The clone's dissociation (the git-history
fix) is part of every sandbox start; ``--repo PATH`` times it alone on a bigger repository
(``git clone --shared`` then :func:`crl_worker.sandbox.repos.dissociate`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crl_worker.agent.episode import confirm_resolved  # noqa: E402
from crl_worker.agent.gold import GoldPolicy  # noqa: E402
from crl_worker.agent.loop import run_agent  # noqa: E402
from crl_worker.agent.pristine import PristineSpares  # noqa: E402
from crl_worker.api.common import AgentSpec, TaskSource  # noqa: E402
from crl_worker.harness.evaluate import evaluate  # noqa: E402
from crl_worker.sandbox.base import Sandbox  # noqa: E402
from crl_worker.sandbox.registry import create_sandbox  # noqa: E402
from crl_worker.sandbox.repos import dissociate, git  # noqa: E402
from crl_worker.tasks.model import Task  # noqa: E402
from crl_worker.tasks.sources import load_source  # noqa: E402

SUITE = ROOT / "examples" / "suites" / "mini" / "tasks.jsonl"


def _factory(task: Task) -> Sandbox:
    return create_sandbox({"type": "local"}, task)


async def measure(
    task: Task, spares: PristineSpares | None = None, *, ready_spares: bool = False
) -> dict[str, Any]:
    """One gold episode of ``task`` with the integrity check, timed by phase (with ``spares``:
    the check's sandbox starts with the episode, as ``run_episode`` does with them)."""
    t0 = time.monotonic()
    if spares is not None:
        spares.prefetch(task)
    async with _factory(task) as sandbox:
        started = time.monotonic()
        trajectory = await run_agent(task, sandbox, GoldPolicy(task), AgentSpec())
        agent_done = time.monotonic()
        first = await evaluate(sandbox, task)
        evaluated = time.monotonic()
    if spares is not None and ready_spares:
        # A real agent works for minutes, a sandbox starts in seconds: the spare is ready.
        await spares.ready(task)
    closed = time.monotonic()
    final = await confirm_resolved(task, first, trajectory.diff, _factory, task.instance_id, spares)
    confirmed = time.monotonic()
    return {
        "instance": task.instance_id,
        "start": started - t0,
        "agent": agent_done - started,
        "eval": evaluated - agent_done,
        "episode": closed - t0,
        "confirm": confirmed - closed,
        "resolved_in_sandbox": first.resolved,
        "resolved_final": final.resolved,
        "confirmed": final.confirmed,
        "tampered": final.tampered,
    }


async def dissociate_cost(repo: Path) -> dict[str, float]:
    """Seconds to clone ``repo`` with ``--shared`` and to dissociate the clone."""
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "clone"
        t0 = time.monotonic()
        await git("clone", "--quiet", "--shared", "--no-checkout", str(repo), str(dest))
        head = (await git("rev-parse", "HEAD", cwd=dest)).decode().strip()
        await git("checkout", "--quiet", "--detach", head, cwd=dest)
        t1 = time.monotonic()
        await dissociate(dest, what="perf", timeout=3600)
        t2 = time.monotonic()
        objects = (await git("count-objects", "-v", cwd=dest)).decode()
    return {"clone_and_checkout": t1 - t0, "dissociate": t2 - t1, "objects": objects.count("\n")}


def _tasks(java: bool, tmp: Path) -> list[Task]:
    loaded = load_source(TaskSource(format="task", path=str(SUITE)), base_dir=ROOT)
    if not loaded.ok:
        raise SystemExit(f"cannot load the suite: {loaded.errors}")
    tasks = list(loaded.tasks)
    if java:
        from tests.fixtures.repos import java_task

        tasks.append(java_task(tmp))
    return tasks


def _summary(subset: list[dict[str, Any]]) -> dict[str, Any]:
    evals = sum(r["eval"] for r in subset)
    confirms = sum(r["confirm"] for r in subset)
    return {
        "episodes": len(subset),
        "eval_s_total": evals,
        "confirm_s_total": confirms,
        "confirm_over_eval": confirms / evals,
        "confirm_s_median": statistics.median(r["confirm"] for r in subset),
        "all_gold_confirmed": all(r["resolved_final"] for r in subset),
    }


async def compare(tasks: list[Task], group: int) -> dict[str, Any]:
    """The check with a fresh sandbox, then with spares, ``group`` episodes per task."""
    report: dict[str, Any] = {}
    for mode in ("fresh", "spares", "spares-ready"):
        spares = PristineSpares(_factory) if mode != "fresh" else None
        rows = []
        try:
            for task in tasks:
                for _ in range(group):
                    rows.append(await measure(task, spares, ready_spares=mode == "spares-ready"))
        finally:
            if spares is not None:
                await spares.close()
        report[mode] = {"rows": rows, **_summary(rows)}
        if spares is not None:
            report[mode]["spare_hits"] = spares.hits
            report[mode]["spare_misses"] = spares.misses
    return report


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement the arguments ask for."""
    if args.compare:
        with tempfile.TemporaryDirectory() as tmp:
            return {"compare": await compare(_tasks(args.java, Path(tmp)), args.group)}
    with tempfile.TemporaryDirectory() as tmp:
        tasks = _tasks(args.java, Path(tmp))
        rows = []
        for _ in range(args.repeat):
            for task in tasks:
                rows.append(await measure(task))
    report: dict[str, Any] = {"rows": rows}
    for name, subset in (
        ("python", [r for r in rows if not r["instance"].startswith("crl-fixtures__stringkit")]),
        ("java", [r for r in rows if r["instance"].startswith("crl-fixtures__stringkit")]),
    ):
        if not subset:
            continue
        evals = sum(r["eval"] for r in subset)
        confirms = sum(r["confirm"] for r in subset)
        episodes = sum(r["episode"] for r in subset)
        report[name] = {
            "episodes": len(subset),
            "eval_s_total": evals,
            "confirm_s_total": confirms,
            "episode_s_total": episodes,
            "confirm_over_eval": confirms / evals,
            "confirm_over_episode": confirms / episodes,
            "confirm_s_median": statistics.median(r["confirm"] for r in subset),
            "all_gold_confirmed": all(r["resolved_final"] for r in subset),
        }
    if args.repo:
        report["dissociate"] = await dissociate_cost(Path(args.repo))
    return report


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--java", action="store_true", help="add the Java fixture (Maven)")
    parser.add_argument("--repo", help="a bigger repository to time the dissociation on")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compare", action="store_true", help="fresh sandbox vs spares")
    parser.add_argument("--group", type=int, default=2, help="episodes per task (--compare)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    report = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    if "compare" in report:
        for mode, s in report["compare"].items():
            extra = (
                f"; spares used {s['spare_hits']}, started on demand {s['spare_misses']}"
                if "spare_hits" in s
                else ""
            )
            print(
                f"{mode:7}: {s['episodes']} resolved episodes; in-sandbox evaluation "
                f"{s['eval_s_total']:.2f} s, integrity check {s['confirm_s_total']:.2f} s "
                f"(median {s['confirm_s_median']:.2f} s): check / evaluation = "
                f"{s['confirm_over_eval']:.2f}; every gold confirmed: "
                f"{s['all_gold_confirmed']}{extra}"
            )
        return
    print(f"{'instance':32} {'start':>6} {'agent':>6} {'eval':>6} {'confirm':>8}  final")
    for r in report["rows"]:
        print(
            f"{r['instance']:32} {r['start']:6.2f} {r['agent']:6.2f} {r['eval']:6.2f} "
            f"{r['confirm']:8.2f}  {'resolved' if r['resolved_final'] else 'UNRESOLVED'}"
        )
    for name in ("python", "java"):
        if name in report:
            s = report[name]
            print(
                f"{name}: {s['episodes']} resolved episodes; in-sandbox evaluation "
                f"{s['eval_s_total']:.2f} s, integrity check {s['confirm_s_total']:.2f} s "
                f"(median {s['confirm_s_median']:.2f} s): check / evaluation = "
                f"{s['confirm_over_eval']:.2f}, check / episode = "
                f"{s['confirm_over_episode']:.2f}; every gold confirmed: "
                f"{s['all_gold_confirmed']}"
            )
    if "dissociate" in report:
        d = report["dissociate"]
        print(
            f"dissociate ({args.repo}): clone+checkout {d['clone_and_checkout']:.2f} s, "
            f"dissociate {d['dissociate']:.2f} s"
        )


if __name__ == "__main__":
    main()
