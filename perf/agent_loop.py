"""What the agent loop costs: CPU per turn, memory per trajectory and throughput of 1,000 concurrent
trajectories in one process, against mini-swe-agent's loop on the same scripted workload.

    python perf/agent_loop.py [--trajectories 1000] [--turns 20] [--json]
                               [--mini-trajectories N] [--mini-threads N] [--skip-mini]
                               [--profile FILE]

Prints figures; asserts nothing. Targets: under 1 ms of CPU per turn outside the model and the
tools, and under 2 GiB for 1,000 trajectories of 20 turns.

What is measured. ``--trajectories`` runs of :func:`crl_worker.agent.run_agent` at once in one
fresh process (``asyncio.gather``, one shared :class:`~crl_worker.agent.ChatClient` with its
default connection limit of 1,024, so every trajectory has its own keep-alive connection),
``maxTurns`` = ``--turns``, ending with the model's submit. The model is a scripted
OpenAI-compatible server in a separate process (``agent_loop_server.py``, two pre-forked
workers): it is not counted, and it answers from prebuilt bodies in vLLM's shape with
``prompt_token_ids``, ``token_ids`` and ``logprobs`` when asked, so the token-recording path
runs. The tools are not counted either: :class:`CannedSandbox` answers every command, read and
write at once with the workload's canned output (a few KB, as real commands print). What the
figures cover is everything else: the loop, limits, tool dispatch and argument checks, prompt
templates, message building, JSON encoding and decoding, the HTTP client, and recording the
trajectory (token-id deduplication included).

- CPU per turn: user + system CPU time of that process (``getrusage``) over the concurrent run,
  divided by the turns made. Wall time and turns per second are reported too, but the machine
  is shared (the load average is printed) and the server runs on the same cores, so CPU time is
  the headline.
- Memory: peak RSS of the process (the headline against 2 GiB), and RSS growth from before the
  run to after it, with every trajectory still held (as a runner holds them before writing),
  divided by their number.
- Baseline: one trajectory alone (after an untimed warm-up trajectory) before the concurrent
  run: per-turn latency and CPU without contention.

Rows: ``crl`` asks for token ids and logprobs (the training path against vLLM); ``crl
(no ids)`` does not, like for like with mini-swe-agent, which never asks for them.

mini-swe-agent (2.4.6) runs in the bench venv (see ``perf/sandbox_overhead.py`` for its setup;
litellm 1.106 there also needs ``mcp`` installed, which it imports whenever tools are passed):
``agent_loop_mini.py`` drives ``DefaultAgent`` + ``LitellmModel`` with its SWE-bench config
against the same server, one thread per trajectory (``--mini-threads``), with an environment
answering the same canned output. Same number of turns and the same tool outputs; what differs:
it has one ``bash`` tool, so the view and the edit are ``cat -n`` and ``sed -i`` (the edit prints
nothing, ours prints the edited lines), its prompts are its own (longer instance template),
its observation template wraps the output differently, and it does not record token ids.

``--tune-gc`` adds a row ``crl + tune_gc()``: the token-id run again in a process that first
calls :func:`crl_worker.agent.loop.tune_gc` (``gc.freeze()`` and thresholds (10000, 10, 10)),
as the runner's entry points are meant to; every other row runs with Python's default GC
settings, and the output says so.

Figures (``python perf/agent_loop.py --skip-mini --tune-gc``, a 2-core VM shared with other
work, load average 0.2 before and 1.1 after, CPython 3.11.7, orjson 3.13.0; 2026-11-21, commit
after ``9c8a6b9``)::

                      traj x turns CPU ms/turn  in GC  wall s  turns/s  peak RSS  held/traj
    crl                  1000 x 20        1.03    16%    20.6      969   860 MiB    824 KiB
    crl + tune_gc()      1000 x 20        0.89     8%    17.8     1124   875 MiB    839 KiB
    crl (no ids)         1000 x 20        0.54    24%    11.0     1826   303 MiB    253 KiB
    mini-swe-agent       1000 x 20       25.88      -   514.1       39   741 MiB    489 KiB

The mini-swe-agent row is from the earlier full run of this script (``python
perf/agent_loop.py``, 2026-11-21, load average 0.8 before and 3.8 after), not re-run: nothing on
its side changed. Before the token-id work (commit ``ed9f739``, same machine, load 1.7 -> 2.3)
the ``crl`` row was 2.33 ms per turn, 43% in GC, 2542 MiB peak, 2458 KiB held per trajectory
(2.25 ms and 2510 MiB in the run with mini-swe-agent).

One trajectory alone: 1.35 ms per turn wall (1.13 ms CPU) for crl, 21.7 ms (21.6 ms CPU) for
mini-swe-agent. Targets with token ids: memory met (0.84 GiB); CPU at the target with Python's
default GC (1.03, 1.00 and 0.93 ms in three runs; noise about +-0.05 ms) and under it with
``tune_gc()`` (0.89 and 0.84 ms in two runs). Without ids both met. What the token-id path costs now, from
``--profile`` and micro-timings of the same response bodies:

- The prompt's ids are no longer decoded every turn: the client cuts the ``prompt_token_ids``
  array out of the raw body (~35 us for ~60 KiB, the charset check included) and the loop
  decodes only what each prompt adds after the previous prompt's bytes (~60 us for ~800 ids,
  into ``array('i')``).
- Decoding the rest of the body ~0.13 ms, most of it vLLM's per-token logprob entries (a dict
  with the token's text and bytes per token); the cyclic GC is paused while an answer is
  decoded and read, so those short-lived objects no longer trigger collections (32% of the CPU
  in GC before that pause, 16% after).
- The remaining GC is full collections over every live trajectory, triggered as in-flight
  request state gets promoted; ``tune_gc()`` makes them rare (8%).
- Memory: ids are ``array('i')`` and logprobs ``array('d')`` (~120 KiB per trajectory); RSS
  held per trajectory is ~820 KiB, the rest presumably allocator fragmentation by the per-turn
  60-80 KiB response bodies (not investigated further).
- mini-swe-agent: litellm's completion path (the OpenAI SDK's per-request ``maybe_transform``
  over the messages about 18 ms of every ~40 ms profiled turn) and a Jinja template compiled
  on every observation (~8 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import agent_loop_workload as workload

from crl_worker.agent import ChatClient, Trajectory, run_agent
from crl_worker.agent.loop import GC_THRESHOLDS, tune_gc
from crl_worker.api.common import AgentSpec
from crl_worker.sandbox.base import DEFAULT_MAX_OUTPUT, CommandResult, Sandbox
from crl_worker.sandbox.repos import cache_dir
from crl_worker.tasks.model import Task, TestSpec

HERE = Path(__file__).resolve().parent
PEERS_PYTHON = cache_dir() / "bench-venv" / "bin" / "python"
GiB = 1 << 30
MiB = 1 << 20


class CannedSandbox(Sandbox):
    """A sandbox that runs nothing: every command answers the workload's canned output at once.

    For this benchmark only, so that the tools cost nothing and what remains is the agent's own
    overhead. Writes are dropped (the script's edit always finds its text in the canned file).
    """

    workdir = "/testbed"

    def __init__(self) -> None:
        self._alive = False

    async def start(self) -> None:
        """Nothing to start."""
        self._alive = True

    async def run(
        self, command: str, *, timeout: float | None = None, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> CommandResult:
        """The canned output of ``command``."""
        return CommandResult(
            exit_code=0, output=workload.OUTPUTS.get(command, workload.DEFAULT_OUTPUT)
        )

    async def read_file(self, path: str) -> bytes:
        """The canned source file, whatever the path."""
        return workload.FILE_TEXT.encode()

    async def write_file(self, path: str, data: bytes) -> None:
        """Dropped."""

    async def reset(self) -> None:
        """Nothing to reset."""

    async def close(self) -> None:
        """Nothing to close."""
        self._alive = False

    @property
    def alive(self) -> bool:
        """Whether :meth:`start` ran and :meth:`close` did not."""
        return self._alive

    async def diff(self) -> str:
        """The canned diff."""
        return workload.DIFF


class GcTimer:
    """Wall time the cyclic garbage collector spends, per generation (via ``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        """Called by the collector at the start and the stop of each collection."""
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1


def rss() -> int:
    """Resident set size of this process now, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu() -> float:
    """CPU seconds (user + system) of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def crl_side(
    url: str,
    trajectories: int,
    turns: int,
    token_ids: bool,
    profile: Path | None,
    gc_threshold: tuple[int, ...] | None = None,
    tuned: bool = False,
) -> dict[str, Any]:
    """Our loop: one trajectory alone, then ``trajectories`` at once; the figures.

    ``gc_threshold``: thresholds for :func:`gc.set_threshold` during the run (Python's
    defaults when ``None``); ``tuned``: call :func:`crl_worker.agent.loop.tune_gc` first, as
    a runner's entry point would."""
    if tuned:
        tune_gc()
    spec = AgentSpec(max_turns=turns, max_total_tokens=131072)

    def task(i: int) -> Task:
        return Task(
            instance_id=f"bench-{i}",
            repo="bench/shapes",
            base_commit="0" * 40,
            problem_statement=workload.PROBLEM,
            test=TestSpec(command="python -m pytest tests", log_format="pytest"),
        )

    async def one(client: ChatClient, i: int) -> Trajectory:
        sandbox = CannedSandbox()
        await sandbox.start()
        return await run_agent(task(i), sandbox, client, spec)

    async with ChatClient(f"{url}/v1", workload.CRL_MODEL, token_ids=token_ids) as client:
        await one(client, -2)  # warm-up: first connection, lazy imports, template caches
        start_cpu, start = cpu(), time.perf_counter()
        first = await one(client, -1)
        baseline = {
            "wall": time.perf_counter() - start,
            "cpu": cpu() - start_cpu,
            "turns": len(first.turns),
        }
        tasks = [task(i) for i in range(trajectories)]  # built before: not the loop's cost
        sandboxes = [CannedSandbox() for _ in range(trajectories)]
        for sandbox in sandboxes:
            await sandbox.start()
        gc.collect()
        before = rss()
        profiler = cProfile.Profile() if profile else None
        collector = GcTimer()
        gc.callbacks.append(collector)
        if gc_threshold:
            gc.set_threshold(*gc_threshold)
        start_cpu, start = cpu(), time.perf_counter()
        if profiler:
            profiler.enable()
        held = await asyncio.gather(
            *(run_agent(t, s, client, spec) for t, s in zip(tasks, sandboxes, strict=True))
        )
        if profiler:
            profiler.disable()
        wall, used = time.perf_counter() - start, cpu() - start_cpu
        gc.callbacks.remove(collector)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        gc.collect()
        after = rss()
    if profiler and profile:
        profiler.dump_stats(profile)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        print(text.getvalue(), file=sys.stderr)
    exits: dict[str, int] = {}
    for trajectory in held:
        exits[trajectory.exit_reason] = exits.get(trajectory.exit_reason, 0) + 1
    sample = held[0]
    return {
        "side": "crl" if token_ids else "crl (no ids)",
        "tune_gc": tuned,
        "python": sys.version.split()[0],
        "trajectories": len(held),
        "turns": sum(len(t.turns) for t in held),
        "exit": exits,
        "tool_errors": sum(c.error for t in held for turn in t.turns for c in turn.tool_calls),
        "wall": wall,
        "cpu": used,
        "gc_seconds": collector.seconds,
        "gc_collections": collector.collections,
        "gc_threshold": gc.get_threshold(),
        "rss_before": before,
        "rss_after": after,
        "peak_rss": peak,
        "json_bytes_per_trajectory": len(sample.to_json()),
        "token_sequence": None if not token_ids else sample.token_sequence_problem() or "ok",
        "baseline": baseline,
    }


def start_server(turns: int, workers: int) -> tuple[subprocess.Popen[str], str]:
    """The scripted server (closes when our end of its stdin does) and its URL."""
    server = subprocess.Popen(
        [sys.executable, str(HERE / "agent_loop_server.py"), "--turns", str(turns),
         "--workers", str(workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert server.stdout is not None
    line = server.stdout.readline()
    if not line:
        raise SystemExit("the scripted server did not start (see its error above)")
    return server, f"http://127.0.0.1:{json.loads(line)['port']}"


def run_side(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any] | str:
    """Run one side in its own process; its figures, or why it failed."""
    proc = subprocess.run(
        command, stdout=subprocess.PIPE, text=True, env=env, cwd=HERE.parent, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return f"failed (exit {proc.returncode}); see the error above"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """The derived figures of one side."""
    turns, n = result["turns"], result["trajectories"]
    base = result["baseline"]
    return {
        "cpu_ms_per_turn": 1e3 * result["cpu"] / turns,
        "turns_per_s": turns / result["wall"],
        "peak_rss_mib": result["peak_rss"] / MiB,
        "run_peak_mib": (result["peak_rss"] - result["rss_before"]) / MiB,
        "held_kib_per_trajectory": (result["rss_after"] - result["rss_before"]) / 1024 / n,
        "baseline_ms_per_turn": 1e3 * base["wall"] / base["turns"],
        "baseline_cpu_ms_per_turn": 1e3 * base["cpu"] / base["turns"],
        # Wall time inside the cyclic GC over CPU time (single-threaded: a CPU share).
        "gc_share": sum(result["gc_seconds"]) / result["cpu"] if "gc_seconds" in result else None,
    }


def table(results: dict[str, dict[str, Any] | str]) -> str:
    """The figures of every side as a text table."""
    lines = [
        f"{'':<16} {'traj x turns':>13} {'CPU ms/turn':>11} {'in GC':>6} {'wall s':>7} {'turns/s':>8} "
        f"{'peak RSS':>9} {'run peak':>9} {'held/traj':>10} {'1-traj ms/turn':>14} "
        f"{'(CPU)':>6}  exits"
    ]
    for name, result in results.items():
        if isinstance(result, str):
            lines.append(f"{name:<16} {result}")
            continue
        f = figures(result)
        gc_share = "-" if f["gc_share"] is None else f"{100 * f['gc_share']:.0f}%"
        shape = f"{result['trajectories']} x {result['turns'] // max(1, result['trajectories'])}"
        lines.append(
            f"{name:<16} {shape:>13} {f['cpu_ms_per_turn']:>11.2f} {gc_share:>6} {result['wall']:>7.1f} "
            f"{f['turns_per_s']:>8.0f} {f['peak_rss_mib']:>5.0f} MiB {f['run_peak_mib']:>5.0f} MiB "
            f"{f['held_kib_per_trajectory']:>6.0f} KiB {f['baseline_ms_per_turn']:>14.2f} "
            f"{f['baseline_cpu_ms_per_turn']:>6.2f}  {result['exit']}"
        )
    return "\n".join(lines)


def main() -> None:
    """Run every side against one scripted server and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--mini-trajectories", type=int, help="default: --trajectories")
    parser.add_argument("--mini-threads", type=int, default=0, help="0: one per trajectory")
    parser.add_argument("--skip-mini", action="store_true")
    parser.add_argument("--skip-no-ids", action="store_true", help="skip the crl (no ids) row")
    parser.add_argument(
        "--tune-gc",
        action="store_true",
        help="add a row with token ids where the process first calls crl_worker.agent.loop.tune_gc()",
    )
    parser.add_argument("--server-workers", type=int, default=2)
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON)
    parser.add_argument("--profile", type=Path, help="cProfile the concurrent crl run to FILE")
    parser.add_argument(
        "--gc-threshold",
        help="gc.set_threshold for our side during the run, e.g. 50000,20,100 (default: Python's)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    # Internal: run our side in this process (the parent starts it as a fresh process).
    parser.add_argument(
        "--side", choices=["crl", "crl-no-ids", "crl-tuned"], help=argparse.SUPPRESS
    )
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.side:
        threshold = (
            tuple(int(v) for v in args.gc_threshold.split(",")) if args.gc_threshold else None
        )
        result = asyncio.run(
            crl_side(
                args.url,
                args.trajectories,
                args.turns,
                args.side != "crl-no-ids",
                args.profile,
                threshold,
                args.side == "crl-tuned",
            )
        )
        print(json.dumps(result), flush=True)
        return

    load_before = os.getloadavg()
    server, url = start_server(args.turns, args.server_workers)
    results: dict[str, dict[str, Any] | str] = {}
    try:
        ours = [sys.executable, str(Path(__file__).resolve()), "--url", url,
                "--trajectories", str(args.trajectories), "--turns", str(args.turns)]  # fmt: skip
        if args.gc_threshold:
            ours += ["--gc-threshold", args.gc_threshold]
        profile = ["--profile", str(args.profile)] if args.profile else []
        results["crl"] = run_side([*ours, "--side", "crl", *profile])
        if args.tune_gc:
            results["crl + tune_gc()"] = run_side([*ours, "--side", "crl-tuned"])
        if not args.skip_no_ids:
            results["crl (no ids)"] = run_side([*ours, "--side", "crl-no-ids"])
        if args.skip_mini:
            results["mini-swe-agent"] = "skipped (--skip-mini)"
        elif not args.peers_python.exists():
            results["mini-swe-agent"] = (
                f"skipped: {args.peers_python} does not exist (see perf/sandbox_overhead.py)"
            )
        else:
            results["mini-swe-agent"] = run_side(
                [str(args.peers_python), str(HERE / "agent_loop_mini.py"), "--url", url,
                 "--trajectories", str(args.mini_trajectories or args.trajectories),
                 "--turns", str(args.turns), "--threads", str(args.mini_threads)],
                env={**os.environ, "PYTHONPATH": str(HERE)},
            )  # fmt: skip
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
    load_after = os.getloadavg()

    if args.json:
        print(json.dumps({
            "cpus": os.cpu_count(),
            "load_average": {"before": load_before, "after": load_after},
            "results": {
                name: r if isinstance(r, str) else r | figures(r) for name, r in results.items()
            },
        }, indent=2))  # fmt: skip
        return
    print(
        f"machine: {os.cpu_count()} CPUs; load average before {load_before[0]:.1f} "
        f"{load_before[1]:.1f} {load_before[2]:.1f}, after {load_after[0]:.1f} "
        f"{load_after[1]:.1f} {load_after[2]:.1f}"
    )
    print(f"workload: {args.turns} turns per trajectory, scripted server with "
          f"{args.server_workers} workers (not counted), canned tools (not counted)\n")  # fmt: skip
    print(table(results))
    for name in ("crl", "crl + tune_gc()"):
        crl = results.get(name)
        if not isinstance(crl, dict):
            continue
        f = figures(crl)
        scale = 1000 / crl["trajectories"]
        per_1000 = crl["rss_before"] / GiB + (crl["peak_rss"] - crl["rss_before"]) * scale / GiB
        print(
            f"\ntargets ({name}): CPU per turn {f['cpu_ms_per_turn']:.2f} ms "
            f"({'met' if f['cpu_ms_per_turn'] < 1 else 'MISSED'}: < 1 ms); peak RSS for 1,000 "
            f"trajectories {per_1000:.2f} GiB{' (scaled)' if scale != 1 else ''} "
            f"({'met' if per_1000 < 2 else 'MISSED'}: < 2 GiB); token sequence: "
            f"{crl['token_sequence']}; JSON per trajectory "
            f"{crl['json_bytes_per_trajectory'] / 1024:.0f} KiB"
        )
    if "crl + tune_gc()" in results:
        print(
            "\n'crl + tune_gc()': the same run in a process that first called "
            f"crl_worker.agent.loop.tune_gc() (gc.freeze(), thresholds "
            f"{GC_THRESHOLDS}), as the runner's entry points do; every other row runs with "
            "Python's default GC settings."
        )


if __name__ == "__main__":
    main()
