"""What the harness's reporter costs a suite, against the same suite without it, and what it
takes for tampering in a real repository's own suite (results: perf/runner_guard.md).

    python perf/runner_guard.py [--tests 2000] [--python PYTHON] [--src worker/src] [--runs 2]
    python perf/runner_guard.py --root CHECKOUT --python PYTHON [--select tests ...]
        [--unittest MODULE ...]

Without ``--root``: writes a module of ``--tests`` trivial tests (pytest functions, and a
unittest ``TestCase`` with as many methods) into a temporary folder and times, best of
``--runs``, the plain runner (``python -m pytest``, ``python -m unittest``: the peer) and the
runner with the reporter of ``--src`` loaded as grading loads it (``harness/runner.py``'s
``probe_source``, ``-p`` for pytest, ``python -m`` for unittest). The reporter checks the
runner's critical modules after every pytest test (``inprocess/guard.pyt``), so its cost grows
with the suite; unittest is checked once at the end. With ``--root``: the same for the
checkout's own suite (``--select``: pytest's arguments; ``--unittest``: modules to run with
unittest instead), run with ``PYTHON`` (an environment with the checkout and its test
dependencies installed; pytest plugins load as installed); every file named ``test*.py`` is
protected. On code that passes its own tests, every tamper reason printed is a false alarm.
``--src`` times another version of the harness (a ``git archive`` of an older commit's
``worker/src``) in the same sitting; ``--python`` also an interpreter other than this one
(3.6 on: the reporter's floor).

Prints one line per runner, and each tamper reason; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("runner_guard")


def _probe_source(src: Path) -> bytes:
    """The reporter's module as the harness at ``src`` writes it."""
    code = "import sys; from crl_worker.harness import runner; "
    code += "sys.stdout.buffer.write(runner.probe_source())"
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, check=True
    ).stdout


def _suite(repo: Path, count: int) -> None:
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "__init__.py").write_text("")
    body = "".join(f"def test_{i}():\n    assert {i} == {i}\n\n\n" for i in range(count))
    (repo / "tests" / "test_many.py").write_text(body)
    methods = "".join(
        f"    def test_{i}(self):\n        self.assertEqual({i}, {i})\n\n" for i in range(count)
    )
    text = f"import unittest\n\n\nclass Many(unittest.TestCase):\n{methods}"
    (repo / "tests" / "test_many_unittest.py").write_text(text)


def _time(command: list[str], repo: Path, env: dict[str, str], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
        best = min(best, time.perf_counter() - started)
        if done.returncode != 0:
            logger.warning("%s exited %d: %s", command, done.returncode, done.stdout[-500:])
    return best


def _harness(folder: Path, src: Path, root: Path, protected: list[Path]) -> Path:
    """The reporter of ``src`` and its configuration, written into ``folder/harness``."""
    harness = folder / "harness"
    harness.mkdir()
    (harness / "mprobe.py").write_bytes(_probe_source(src.resolve()))
    config = {"report": str(harness / "report.jsonl"), "root": str(root), "harness": str(harness)}
    config.update(protected=[str(p) for p in protected], seal="")
    (harness / "mprobe.json").write_text(json.dumps(config))
    return harness


def _report(harness: Path) -> tuple[dict[str, int], list[str]]:
    """The reporter's statuses, counted, and its tamper reasons, from its last run."""
    counts: dict[str, int] = {}
    tampered = []
    for line in (harness / "report.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "test":
            counts[record["status"]] = counts.get(record["status"], 0) + 1
        elif record["kind"] == "tamper":
            tampered.append(str(record["why"]))
    (harness / "report.jsonl").unlink()
    return counts, tampered


def _compare(name: str, plain: list[str], reporter: list[str], where: Path, args: Any) -> None:
    """Time ``plain`` and ``reporter`` (the same run with the reporter), and print them."""
    env = (
        {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        if args.root is None
        else {**os.environ}
    )
    env.pop("PYTHONPATH", None)
    seconds = _time(plain, where, env, args.runs)
    harness = args.harness
    with_reporter = _time(reporter, where, {**env, "PYTHONPATH": str(harness)}, args.runs)
    counts, tampered = _report(harness)
    logger.info(
        "%-9s plain %7.2f s  reporter %7.2f s  %4.2fx  %s  tampered: %d",
        name,
        seconds,
        with_reporter,
        with_reporter / seconds,
        " ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        len(tampered),
    )
    for why in sorted(set(tampered)):
        logger.info("  tampered: %s", why[:300])


def main() -> None:
    """Time the plain runners and the reporter's, and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--src", type=Path, default=Path(__file__).parents[1] / "worker" / "src")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--root", type=Path, help="a checkout whose own suite to run instead")
    parser.add_argument("--select", nargs="*", default=["tests"], help="its pytest arguments")
    parser.add_argument("--unittest", nargs="*", help="or its unittest modules")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pytest = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    with tempfile.TemporaryDirectory() as folder:
        if args.root is None:
            repo = Path(folder) / "repo"
            _suite(repo, args.tests)
            protected = sorted((repo / "tests").glob("test_*.py"))
            args.harness = _harness(Path(folder), args.src, repo, protected)
            pytest.append("tests/test_many.py")
            unittest = ["tests.test_many_unittest"]
        else:
            repo = args.root.resolve()
            protected = sorted(p for p in repo.rglob("test*.py") if ".git" not in p.parts)
            args.harness = _harness(Path(folder), args.src, repo, protected)
            pytest += args.select
            unittest = args.unittest
        if args.root is None or args.unittest is None:
            _compare("pytest", pytest, [*pytest[:3], "-p", "mprobe", *pytest[3:]], repo, args)
        if unittest:
            plain = [args.python, "-m", "unittest", *unittest]
            _compare("unittest", plain, [args.python, "-m", "mprobe", *unittest], repo, args)


if __name__ == "__main__":
    main()
