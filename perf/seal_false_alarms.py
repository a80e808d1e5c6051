"""False alarms of sealed expectations on a real repository's own tests (results:
perf/seal_false_alarms.md).

    python perf/seal_false_alarms.py --root CHECKOUT --python PYTHON [--tests tests]
        [--glob 'test_*.py'] [--sample 0] [--seed 7] [--scratch DIR] [--timeout 900]
        [--args '-n 0'] [--src worker/src]

Sealing (:mod:`crl_worker.harness.seals`) takes the expected literal out of a listed test's
top-level equality assertions (``assert <value> == <literal>``, ``self.assertEqual`` and its
family) and has the harness's reporter record the value as plain data instead; the harness then
fails a passed test whose holes recorded nothing or anything but the literal
(:func:`~crl_worker.harness.seals.judge`). On the repository's own code, which passes its tests
(the honest answer), every such test must still pass: one that passes unsealed but is judged
failed sealed is a false alarm (a correct answer graded unresolved).

This copies ``CHECKOUT`` to a scratch folder and, for each test module under ``--tests``
matching ``--glob`` (a random ``--sample`` of them when not 0), seals every test of the module
(all its ids both sealed and listed), runs the module through the harness's reporter
(``PYTHON -m pytest -p <reporter>`` with plugin auto-loading off and the environment's
``pytest11`` plugins loaded by name, as :func:`crl_worker.harness.runner.harden` does) once
unsealed and once sealed, and judges the sealed run. ``PYTHON`` must have the repository's
dependencies (and pytest) installed; ``--args`` are more arguments for pytest (both runs). ``--src`` runs another version
of the harness (a ``git archive`` of a commit's ``worker/src``): the mechanism measured is the
one of a fixed commit, not whatever the working tree holds.

Prints one row per module (test functions, those with a hole, holes, test runs reported
unsealed, runs passed unsealed, passed runs of sealed tests, false alarms), each false alarm
with its holes' recorded values (or why none) against the literals and the sealed line, the
reporter's evidence of either run, and a summary line; asserts nothing.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import random
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


def _src() -> Path:
    """The harness's source folder (``--src``), read before anything imports it."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument(
        "--src", type=Path, default=Path(__file__).resolve().parents[1] / "worker" / "src"
    )
    return Path(early.parse_known_args()[0].src).resolve()


SRC = _src()
sys.path.insert(0, str(SRC))

# The harness is imported from --src, so after it is read.
from crl_worker.harness import runner  # noqa: E402
from crl_worker.harness.mutants import tests_of  # noqa: E402
from crl_worker.harness.result import TestStatus  # noqa: E402
from crl_worker.harness.seals import Seals, base_id, judge, matches, seal_modules  # noqa: E402

logger = logging.getLogger("seal_false_alarms")
#: The folders a copy of the checkout leaves out.
SKIPPED = shutil.ignore_patterns(".git", "__pycache__", ".tox", ".nox", ".pytest_cache")


@dataclass
class Run:
    """One run of a module through the reporter: its report, and why holes recorded nothing
    (by test id and hole: the reporter's ``why``, which :func:`runner.parse_report` drops)."""

    report: runner.ProbeReport
    why: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    output: str = ""


@dataclass
class Row:
    """The figures of one module."""

    path: str
    tests: int = 0
    sealed: int = 0
    holes: int = 0
    runs: int = 0
    passed: int = 0
    judged: int = 0
    #: By the test run's id: how it went sealed, and its holes that did not hold.
    alarms: dict[str, list[str]] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)


def environment_plugins(python: str, root: Path) -> list[str]:
    """The ``pytest11`` plugin modules of ``python``'s environment (as the harness lists them:
    isolated mode, the checkout not on ``sys.path``)."""
    listed = subprocess.run(
        [python, "-I", "-c", runner._LIST_PLUGINS],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    modules: list[str] = []
    for line in listed.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] not in modules:
            modules.append(parts[1])
    return modules


@dataclass(frozen=True)
class Setup:
    """What every run of one probe shares."""

    root: Path
    scratch: Path
    python: str
    plugins: list[str]
    args: list[str]
    timeout: int


def run_module(setup: Setup, path: str, seal: str) -> Run:
    """Run the test module ``path`` of ``root`` through a fresh copy of the reporter (the
    recorder installed as ``seal`` when not empty)."""
    root = setup.root
    harness = Path(tempfile.mkdtemp(prefix="h-", dir=setup.scratch))
    module = "m" + secrets.token_hex(8)
    report = harness / f"{secrets.token_hex(8)}.jsonl"
    (harness / f"{module}.py").write_bytes(runner.probe_source())
    config = {
        "report": str(report),
        "root": str(root),
        "harness": str(harness),
        "protected": [str(root / path)],
        "seal": seal,
    }
    (harness / f"{module}.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_PLUGINS"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = str(harness) + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
    loads = [arg for p in (module, *setup.plugins) for arg in ("-p", p)]
    command = [setup.python, "-m", "pytest", *loads, "-p", "no:cacheprovider", *setup.args, path]
    try:
        done = subprocess.run(
            command,
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=setup.timeout,
            check=False,
        )
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        output = f"timed out after {setup.timeout} s"
    text = report.read_text() if report.exists() else ""
    shutil.rmtree(harness, ignore_errors=True)
    run = Run(runner.parse_report(text), output=output)
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("kind") == "seal" and entry.get("value") is None:
            key = (str(entry.get("test")), str(entry.get("hole")))
            run.why.setdefault(key, []).append(str(entry.get("why")))
    return run


def hole_lines(original: str, sealed: str, name: str) -> dict[str, str]:
    """By hole id, the original statement's first line (a sealed module keeps its lines;
    ``name`` is the recorder's)."""
    before = original.splitlines()
    found: dict[str, str] = {}
    for number, line in enumerate(sealed.splitlines()):
        start = line.find(f'{name}("')
        if start >= 0 and number < len(before):
            hole = line[start + len(name) + 2 : start + len(name) + 14]
            found[hole] = f"line {number + 1}: {before[number].strip()}"
    return found


def describe(test_id: str, seals: Seals, sealed: Run, lines: dict[str, str]) -> list[str]:
    """Each hole of ``test_id`` that did not hold: what it recorded (or why nothing) against
    its literal, and its statement."""
    holes = seals.holes.get(base_id(test_id, "pytest"), {})
    seen = sealed.report.seals.get(test_id, {})
    found = []
    for hole, expected in holes.items():
        values = seen.get(hole, [])
        if values and all(matches(v, expected) for v in values):
            continue
        why = sealed.why.get((test_id, hole), [])
        got = ", ".join("no value" if v is None else str(v)[:120] for v in values) or "nothing"
        reasons = f" (why: {'; '.join(sorted(set(why)))})" if why else ""
        # A hole is the literal's repr (43ac264) or a Hole(op, expected) (later).
        literal = f"{getattr(expected, 'op', '==')} {getattr(expected, 'expected', expected)}"
        found.append(f"  hole {hole}: recorded {got}{reasons}; literal {literal[:120]}")
        found.append(f"    {lines.get(hole, '?')[:160]}")
    return found


def probe_module(setup: Setup, path: str) -> Row | None:
    """Seal every test of ``path``, run it unsealed and sealed, judge; ``None`` when the module
    does not parse."""
    root = setup.root
    original = (root / path).read_text()
    try:
        tree = ast.parse(original)
    except (SyntaxError, ValueError):
        return None
    ids = [t.id for t in tests_of(path, tree, "pytest")]
    seals = seal_modules({path: original}, ids, ids, "pytest")
    row = Row(path, tests=len(ids), sealed=len(seals.holes))
    row.holes = sum(len(h) for h in seals.holes.values())
    plain = run_module(setup, path, "")
    row.evidence += [f"unsealed: {e}" for e in plain.report.evidence]
    passed = {i for i, s in plain.report.statuses.items() if s is TestStatus.PASSED}
    row.runs, row.passed = len(plain.report.statuses), len(passed)
    if not plain.report.statuses:
        logger.info("%s: no tests reported unsealed: %s", path, plain.output[-600:])
    if path not in seals.texts:
        return row
    text = seals.texts[path]
    try:
        (root / path).write_text(text)
        sealed = run_module(setup, path, seals.name)
    finally:
        (root / path).write_text(original)
    row.evidence += [f"sealed: {e}" for e in sealed.report.evidence]
    judged, _ = judge(seals, sealed.report.statuses, sealed.report.seals, "pytest")
    lines = hole_lines(original, text, seals.name)
    for test_id in sorted(passed):
        if base_id(test_id, "pytest") not in seals.holes:
            continue
        ran = sealed.report.statuses.get(test_id)
        row.judged += ran is TestStatus.PASSED
        verdict = judged.get(test_id)
        if verdict is TestStatus.PASSED:
            continue
        how = "judged failed" if ran is TestStatus.PASSED else f"ran {_status(ran)} sealed"
        row.alarms[test_id] = [how, *describe(test_id, seals, sealed, lines)]
    for test_id in sorted(passed):
        ran = sealed.report.statuses.get(test_id)
        if base_id(test_id, "pytest") not in seals.holes and ran is not TestStatus.PASSED:
            row.alarms[test_id] = [f"no hole, ran {_status(ran)} sealed"]  # the module broke
    return row


def _status(status: TestStatus | None) -> str:
    return status.value if status is not None else "unreported"


def modules(root: Path, folder: str, pattern: str) -> list[str]:
    """The test modules under ``folder`` of ``root`` (relative paths)."""
    found = sorted((root / folder).rglob(pattern))
    return [str(p.relative_to(root)) for p in found if p.is_file()]


def main() -> None:
    """Parse the arguments, copy, probe, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="the repository's checkout")
    parser.add_argument("--python", required=True, help="a Python with its dependencies")
    parser.add_argument("--tests", default=".", help="the folder of test modules (relative)")
    parser.add_argument("--glob", default="test_*.py", help="test modules' file names")
    parser.add_argument("--sample", type=int, default=0, help="modules probed at most (0: all)")
    parser.add_argument("--seed", type=int, default=7, help="the sample's draw")
    parser.add_argument("--scratch", type=Path, help="where the copy goes (default: temporary)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--args", default="", help="more arguments for pytest")
    parser.add_argument("--src", type=Path, help="another harness's worker/src (default: this)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    scratch = Path(tempfile.mkdtemp(prefix="sfa-", dir=args.scratch))
    root = scratch / "repo"
    shutil.copytree(args.root.resolve(), root, ignore=SKIPPED, symlinks=True)
    plugins = environment_plugins(args.python, root)
    logger.info("harness %s (seals: %s)", SRC, sys.modules[seal_modules.__module__].__file__)
    logger.info("copy %s, plugins loaded by name: %s", root, " ".join(plugins) or "none")
    setup = Setup(root, scratch, args.python, plugins, shlex.split(args.args), args.timeout)
    paths = modules(root, args.tests, args.glob)
    if args.sample:
        random.Random(args.seed).shuffle(paths)
        paths = sorted(paths[: args.sample])
    totals: dict[str, int] = defaultdict(int)
    print(
        "| module | tests | with a hole | holes | runs | passed unsealed | judged | false alarms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for path in paths:
        row = probe_module(setup, path)
        if row is None:
            logger.info("%s: does not parse, skipped", path)
            continue
        rows.append(row)
        figures = [row.tests, row.sealed, row.holes, row.runs, row.passed, row.judged]
        figures.append(len(row.alarms))
        for key, value in zip(
            ("tests", "sealed", "holes", "runs", "passed", "judged", "alarms"), figures, strict=True
        ):
            totals[key] += value
        print(f"| {path} | " + " | ".join(str(f) for f in figures) + " |", flush=True)
    for row in rows:
        for line in row.evidence:
            logger.info("%s: reporter's evidence: %s", row.path, line)
        for test_id, lines in row.alarms.items():
            print(f"false alarm: {test_id}: {lines[0]}")
            print("\n".join(lines[1:]))
    print(
        f"summary: {len(rows)} modules, {totals['tests']} tests, {totals['sealed']} with a hole,"
        f" {totals['holes']} holes, {totals['runs']} runs, {totals['passed']} passed unsealed,"
        f" {totals['judged']} passed runs of sealed tests judged, {totals['alarms']} false alarms"
    )
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
