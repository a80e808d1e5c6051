"""A test runner the candidate cannot reconfigure, and a report it cannot forge by printing.

The candidate's code runs inside the test process, so what that process prints is no evidence.
For a graded run (the integrity check's) the harness:

1. writes its own reporter (``inprocess/*.pyt``, one module) into a
   fresh folder outside the repository under a random module name, with its configuration
   beside it;
2. runs pytest with plugin auto-loading off (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``,
   ``PYTEST_PLUGINS`` unset), its reporter loaded first (``-p <module>``) and only the plugins the
   task's recipe names (``TestSpec.plugins``, and any ``-p`` already in its command) or its
   environment installs (:func:`environment_plugins`: not a ``*.dist-info`` in the repository,
   which ``python -m pytest`` would otherwise find on ``sys.path``); unittest
   through the reporter's runner (``python -m <module>`` for ``python -m unittest``: the same
   ``unittest.main`` with the harness's result class);
3. reads the tests' outcomes from the report file the reporter wrote, not from the output, and
   cross-checks (:func:`cross_check`): the printed outcomes must agree with the report's, the
   report must have its end record (a process that ends itself early, or whose output was
   rewritten, has none), and the reporter's own evidence must be empty: package code opening
   the run's test modules or the harness's files, taking frames of the runner, a pytest report
   turned into a pass after the test raised, the runner's functions or classes replaced while it
   ran, a unittest test reported ``ok`` after a failure was swallowed as expected.

None of this is proof by itself (the candidate could find the reporter in its own process); the
canaries (:mod:`crl_worker.harness.canary`) are the backstop. Other log formats (Django, SymPy,
JUnit) run as the task says, with canaries only.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import secrets
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from crl_worker.errors import InfrastructureError
from crl_worker.harness.parsers import record
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox.base import Sandbox

logger = logging.getLogger(__name__)

#: The reporter's source files, written as one module (Python 3.6 syntax, standard library
#: only): its core, the watch on the runner's code, the sealed expectations' recorder, the watch
#: on pytest's plugins, then the runners' side.
PROBE_PARTS = tuple(
    Path(__file__).with_name("inprocess") / n
    for n in ("probe.pyt", "guard.pyt", "origins.pyt", "seals.pyt", "plugins.pyt", "runners.pyt")
)


def probe_source() -> bytes:
    """The reporter's module as the harness writes it."""
    return b"".join(part.read_bytes() for part in PROBE_PARTS)


#: The most of the reporter's report read back (bytes; a line a test, so a very large suite).
REPORT_LIMIT = 64 << 20
#: Log formats whose runner the harness replaces.
HARDENED_FORMATS = frozenset({"pytest", "unittest"})
_BOUNDARY = r"(?:^|(?<=[\s;&|(]))"
_PYTEST = re.compile(_BOUNDARY + r"(?:\S*python[\d.]*\s+-m\s+pytest|\S*pytest|py\.test)(?=\s|$)")
_UNITTEST = re.compile(_BOUNDARY + r"(?P<python>\S*python[\d.]*)\s+-m\s+unittest(?=\s|$)")


@dataclass(frozen=True)
class Probe:
    """The harness's reporter as installed in one sandbox for one run."""

    folder: str
    module: str
    report: str


@dataclass
class ProbeReport:
    """What the reporter wrote."""

    statuses: dict[str, TestStatus] = field(default_factory=dict)
    started: bool = False
    ended: bool = False
    evidence: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What sealed expectations recorded (:mod:`crl_worker.harness.seals`): by the test running
    #: then, by hole, each value's ``repr`` as plain data (``None``: it had none).
    seals: dict[str, dict[str, list[str | None]]] = field(default_factory=dict)


#: Lists the ``pytest11`` entry points of the task's environment as ``name module`` lines, in
#: isolated mode (``-I``: the working directory is not on ``sys.path``, so a ``*.dist-info`` the
#: candidate added to the repository is not seen, and no package code is imported).
_LIST_PLUGINS = """
try:
    from importlib.metadata import entry_points
    eps = entry_points()
    eps = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    pairs = [(e.name, e.value.split(":")[0]) for e in eps]
except ImportError:
    import pkg_resources
    pairs = [(e.name, e.module_name) for e in pkg_resources.iter_entry_points("pytest11")]
for name, module in pairs:
    print(name, module)
"""
_BLOCKED = re.compile(r"-p\s*no:(\S+)")


async def environment_plugins(sandbox: Sandbox, command: str) -> list[str]:
    """The pytest plugins the task's environment installs (its ``pytest11`` entry points,
    found without the repository on ``sys.path``), as ``-p`` takes them, except those the
    command blocks (``-p no:name``): auto-loading is off, so these are loaded by name. A
    listing that fails gives none."""
    result = await sandbox.run(
        f"cd {shlex.quote(sandbox.workdir)} && python -I -c {shlex.quote(_LIST_PLUGINS)}",
        timeout=60,
    )
    if result.exit_code != 0:
        logger.info("could not list the environment's pytest plugins: %s", result.output[-300:])
        return []
    blocked = set(_BLOCKED.findall(command))
    modules = []
    for line in result.output.splitlines():
        parts = line.split()
        if len(parts) == 2 and not blocked & set(parts) and parts[1] not in modules:
            modules.append(parts[1])
    return modules


def harden(command: str, log_format: str, probe: Probe, plugins: Sequence[str] = ()) -> str | None:
    """``command`` run through the harness's reporter, or ``None`` when it is not a form the
    harness knows (``python -m pytest``, ``pytest``, ``python -m unittest``)."""
    env = (
        f"export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
        f"PYTHONPATH={shlex.quote(probe.folder)}${{PYTHONPATH:+:$PYTHONPATH}}; "
        "unset PYTEST_PLUGINS; "
    )
    if log_format == "pytest":
        match = _PYTEST.search(command)
        if match is None:
            return None
        loads = " ".join(f"-p {shlex.quote(p)}" for p in (probe.module, *plugins))
        return f"{env}{command[: match.end()]} {loads}{command[match.end() :]}"
    if log_format == "unittest":
        match = _UNITTEST.search(command)
        if match is None:
            return None
        runner = f"{match.group('python')} -m {probe.module}"
        return f"{env}{command[: match.start()]}{runner}{command[match.end() :]}"
    return None


async def install(sandbox: Sandbox, protected: Iterable[str], seal: str = "") -> Probe:
    """Write the reporter into a fresh folder outside the repository of ``sandbox``;
    ``protected`` are the test modules (relative to the workdir) package code must not open;
    ``seal`` is the name sealed expectations call the recorder by (none: no recorder)."""
    result = await sandbox.run(
        f"cd {shlex.quote(sandbox.workdir)} && pwd -P && mktemp -d", timeout=60
    )
    lines = result.output.split()
    if result.exit_code != 0 or len(lines) < 2:
        raise InfrastructureError(f"could not make the reporter's folder: {result.output[-500:]}")
    root, folder = lines[-2], lines[-1]
    module = "m" + secrets.token_hex(8)
    probe = Probe(folder, module, f"{folder}/{secrets.token_hex(8)}.jsonl")
    config = {
        "report": probe.report,
        "root": root,
        "harness": folder,
        "protected": sorted({f"{root}/{p}" for p in protected}),
        "seal": seal,
    }
    await _write(sandbox, f"{folder}/{module}.py", probe_source())
    await _write(sandbox, f"{folder}/{module}.json", json.dumps(config).encode("utf-8"))
    return probe


async def _write(sandbox: Sandbox, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through the shell: the reporter's folder lies outside the
    working tree, which a sandbox's file API (the pool gateway's) does not reach."""
    encoded = base64.b64encode(data).decode("ascii")  # [A-Za-z0-9+/=]: safe unquoted
    result = await sandbox.run(f"printf %s {encoded} | base64 -d > {shlex.quote(path)}", timeout=60)
    if result.exit_code != 0:
        raise InfrastructureError(f"could not write the reporter: {result.output[-500:]}")


async def collect(sandbox: Sandbox, probe: Probe) -> ProbeReport:
    """Read what the reporter wrote (through the shell, as :func:`_write`), then remove its
    folder."""
    result = await sandbox.run(
        f"cat {shlex.quote(probe.report)} 2>/dev/null; rm -rf {shlex.quote(probe.folder)}",
        timeout=60,
        max_output=REPORT_LIMIT,
    )
    report = parse_report(result.output)
    if result.truncated:
        report.evidence.append(f"the report is larger than {REPORT_LIMIT} bytes")
    return report


def parse_report(text: str) -> ProbeReport:
    """The reporter's JSON lines as a :class:`ProbeReport`; a line that does not parse is
    evidence (the reporter writes whole lines)."""
    report = ProbeReport()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            kind = entry["kind"]
            if kind == "test":
                record(report.statuses, str(entry["id"]), TestStatus(entry["status"]))
            elif kind == "start":
                report.started = True
            elif kind == "end":
                report.ended = True
            elif kind == "tamper":
                report.evidence.append(str(entry["why"]))
            elif kind == "note":
                report.notes.append(str(entry["why"]))
            elif kind == "seal":
                value = entry["value"]
                holes = report.seals.setdefault(str(entry["test"]), {})
                holes.setdefault(str(entry["hole"]), []).append(
                    None if value is None else str(value)
                )
        except (ValueError, KeyError, TypeError):
            report.evidence.append(f"the report holds a line the reporter did not write: {line!r}")
    return report


def cross_check(report: ProbeReport, printed: Mapping[str, TestStatus]) -> str | None:
    """Why the run cannot be trusted, or ``None``: the reporter's evidence, a missing start or
    end, or an outcome the output gives differently."""
    reasons = list(report.evidence)
    if not report.started and printed:
        reasons.append("tests were reported but the harness's reporter never ran")
    elif report.started and not report.ended:
        reasons.append("the test process ended before its runner finished")
    differ = [
        f"{test_id}: printed {status.value}, ran {report.statuses[test_id].value}"
        for test_id, status in printed.items()
        if test_id in report.statuses and report.statuses[test_id] is not status
    ]
    if differ:
        reasons.append("the output disagrees with the runner: " + "; ".join(differ[:5]))
    if not reasons:
        return None
    return "the test run was tampered with: " + " | ".join(reasons)[:2000]
