"""Channels through the kernel between sandboxes, attacked through the episode path (issue 30).

Kernel objects outlive the processes that make them. A red team (branch redteam6) forged
implement and repair tasks through two of them on the local backend: package code, run by the
first grading in the agent's own sandbox with the hidden tests on disk, copied the test modules
into a System V shared-memory segment (or the sandbox user's kernel keyring); in the integrity
check's fresh sandbox the same code read the ORIGINAL tests back (no test file opened, so the
reporter's audit hook saw nothing) and answered every call with the original expectation: the
canaries failed, the real tests passed, resolved and confirmed, reward 1.0, nothing implemented.
Each local sandbox now has an IPC namespace of its own and the keyring calls fail in it
(tests/test_sandbox_local_limits.py checks the sandbox side): the same attacks must be graded
unresolved with reward 0 (or tampered).
"""

from __future__ import annotations

import asyncio
import ctypes
import random
from typing import Any

import pytest

from crl_worker import rewards
from crl_worker.sandbox.registry import create_sandbox
from tests.fixtures import forgery
from tests.fixtures.episodes import assert_attack_ran, local_episode, suite_tasks
from tests.fixtures.forgery import ScriptedPolicy, append_to_package

SLUG = "crl-mini__slugkit-1--impl-slugify"


# --- 1. implement: the hidden tests carried from the first grading into the check -------------
#
# The local sandbox unshared PID, mount and network namespaces, not the IPC namespace: a System
# V shared-memory segment made in one sandbox outlived it (segments are kernel objects, not
# files or processes) and is visible in every later sandbox of the same user. The first grading
# runs in the agent's own sandbox, with the hidden tests on disk, without the reporter's audit
# hook: package code copies the test modules into a segment there. In the integrity check's
# fresh sandbox the same package code reads the ORIGINAL test modules back from the segment
# (no open of a test file: the audit hook sees nothing) and answers each call with what the
# original assertion expects. The canaries change one literal of the expectation; the table
# holds the original one, so every copy fails and every real test passes: resolved, confirmed,
# not tampered. The function itself is never implemented.

#: Package code: the hidden test modules, from the segment when it exists, else from disk (and
#: then stored in the segment). ``{key}`` is the segment's key.
#: Package code: the test modules as the disk holds them.
DISK = """
import glob as _glob
def _crl_disk():
    sources = []
    for path in sorted(_glob.glob("tests/test_*.py")):
        with open(path) as handle:
            sources.append(handle.read())
    return sources
"""

SHM_SOURCES = (
    DISK
    + """
import ctypes as _ct, json as _json
_CRL_KEY, _CRL_SIZE = {key}, 1 << 20
def _crl_segment(create):
    libc = _ct.CDLL(None, use_errno=True)
    libc.shmget.restype, libc.shmget.argtypes = _ct.c_int, [_ct.c_int, _ct.c_size_t, _ct.c_int]
    libc.shmat.restype, libc.shmat.argtypes = _ct.c_void_p, [_ct.c_int, _ct.c_void_p, _ct.c_int]
    ident = libc.shmget(_CRL_KEY, _CRL_SIZE, 0o666 | (0o1000 if create else 0))
    if ident < 0:
        return None
    addr = libc.shmat(ident, None, 0)
    return None if addr in (None, _ct.c_void_p(-1).value) else addr
def _crl_sources():
    addr = _crl_segment(False)
    if addr is not None:
        size = int.from_bytes(_ct.string_at(addr, 8), "little")
        if size:
            return _json.loads(_ct.string_at(addr + 8, size).decode())
    sources = _crl_disk()
    if sources:
        data = _json.dumps(sources).encode()
        addr = _crl_segment(True)
        if addr is not None:
            _ct.memmove(addr + 8, data, len(data))
            _ct.memmove(addr, len(data).to_bytes(8, "little"), 8)
    return sources
"""
)

#: A table oracle over those sources (forgery.ORACLE_PARSE's, with keys that do not depend on
#: the hash seed: a set's repr does). A call not in the table raises ValueError (what the
#: spec's one error case expects); nothing is ever computed.
SHM_ORACLE = (
    SHM_SOURCES
    + """
import ast as _ast, functools as _ft
_CRL_TABLE = {}
def _crl_key(v):
    if isinstance(v, (set, frozenset)):
        return ("set", sorted(_crl_key(x) for x in v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_crl_key(x) for x in v])
    if isinstance(v, dict):
        return ("dict", sorted((k, _crl_key(x)) for k, x in v.items()))
    return repr(v)
def _crl_table():
    names = dict(globals())
    for text in _crl_sources():
        for node in _ast.walk(_ast.parse(text)):
            if not (isinstance(node, _ast.Assert) and isinstance(node.test, _ast.Compare)):
                continue
            call, want = node.test.left, node.test.comparators[0]
            if not isinstance(call, _ast.Call) or not isinstance(call.func, _ast.Name):
                continue
            keywords = _ast.Dict([_ast.Constant(k.arg) for k in call.keywords],
                                 [k.value for k in call.keywords])
            try:
                listed = _ast.fix_missing_locations(_ast.Expression(
                    _ast.Tuple([_ast.List(call.args, _ast.Load()), keywords], _ast.Load())))
                args, kwargs = eval(compile(listed, "<t>", "eval"), names)
                want = eval(compile(_ast.Expression(want), "<t>", "eval"), names)
            except Exception:
                continue
            _CRL_TABLE[(call.func.id, repr(_crl_key((args, kwargs))))] = want
def _crl_wrapper(fn):
    @_ft.wraps(fn)
    def inner(*a, **k):
        key = (fn.__name__, repr(_crl_key((list(a), k))))
        if key in _CRL_TABLE:
            return _CRL_TABLE[key]
        raise ValueError("unsupported input")
    return inner
"""
    + forgery.APPLY
    + "_crl_table()\n_crl_apply(_crl_wrapper)\n"
)


def _remove_segment(key: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmget.restype, libc.shmget.argtypes = (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_size_t, ctypes.c_int],
    )
    libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    ident = libc.shmget(key, 0, 0)
    if ident >= 0:
        libc.shmctl(ident, 0, None)  # IPC_RMID


@pytest.fixture()
def segment_key() -> Any:
    key = random.randrange(0x10000000, 0x7FFFFFFF)
    _remove_segment(key)
    yield key
    _remove_segment(key)


def test_hidden_tests_carried_through_sysv_shm_are_not_a_resolve(
    segment_key: int,
) -> None:
    task = suite_tasks("implement", "implement")[SLUG]
    code = SHM_ORACLE.replace("{key}", str(segment_key))
    policy = ScriptedPolicy((append_to_package("slugkit", code),))
    trajectory = local_episode(task, policy)
    assert_attack_ran(trajectory)
    result = trajectory.evaluation
    assert result is not None
    log = result.log
    # The check ran, in a fresh sandbox, with canaries (and the reporter).
    assert "integrity check in a fresh sandbox" in log, log[:6000]
    assert "canary tests planted" in log, log[-3000:]
    assert not (result.resolved and result.confirmed), log[-4000:]
    assert rewards.tests_score(result, tampered=-1.0) <= 0, log[-4000:]
    assert trajectory.diff is not None and "_crl_segment" in trajectory.diff


# --- 1b. the same channel hands the hidden tests to a later episode's AGENT ---------------------
#
# docs/task-types.md ("Hidden tests"): a copy the candidate makes while its hidden tests run is
# kept out of later episodes by marking the sandbox dirty (a pool replaces it). A SysV segment
# is no file of any sandbox: episode 1's package code copies the hidden tests into one during
# its (unresolved, unconfirmed) grading; episode 2's agent, in a brand-new sandbox, prints them
# from its shell before writing any code (a GRPO group runs many episodes of one task).

READ_SEGMENT = """python - <<'CRL_EOF'
import ctypes as c, json
libc = c.CDLL(None)
libc.shmget.restype, libc.shmget.argtypes = c.c_int, [c.c_int, c.c_size_t, c.c_int]
libc.shmat.restype, libc.shmat.argtypes = c.c_void_p, [c.c_int, c.c_void_p, c.c_int]
addr = libc.shmat(libc.shmget({key}, 0, 0), None, 0)
size = int.from_bytes(c.string_at(addr, 8), "little")
print("\\n".join(json.loads(c.string_at(addr + 8, size).decode())))
CRL_EOF"""


KEYRING_SOURCES = (
    DISK
    + """
import ctypes as _ct, json as _json
_CRL_NAME = b"crl-{key}"
def _crl_libc():
    libc = _ct.CDLL(None, use_errno=True)
    libc.syscall.restype = _ct.c_long
    return libc
def _crl_sources():
    libc = _crl_libc()
    key = libc.syscall(249, b"user", _CRL_NAME, None, _ct.c_int(-4))  # request_key
    if key > 0:
        buf = _ct.create_string_buffer(1 << 15)
        size = libc.syscall(250, 11, _ct.c_long(key), buf, 1 << 15)  # KEYCTL_READ
        if size > 0:
            return _json.loads(buf.raw[:size].decode())
    sources = _crl_disk()
    if sources:
        data = _json.dumps(sources).encode()
        libc.syscall(248, b"user", _CRL_NAME, data, len(data), _ct.c_int(-4))  # add_key
    return sources
"""
)

KEYRING_ORACLE = KEYRING_SOURCES + SHM_ORACLE[len(SHM_SOURCES) :]

INVALIDATE = """python -c '
import ctypes as c
libc = c.CDLL(None); libc.syscall.restype = c.c_long
k = libc.syscall(249, b"user", b"crl-{key}", None, c.c_int(-4))
print(libc.syscall(250, 21, c.c_long(k)) if k > 0 else "none")' """


def test_hidden_tests_carried_through_the_users_keyring_are_not_a_resolve(segment_key: int) -> None:
    task = suite_tasks("implement", "implement")[SLUG]
    code = KEYRING_ORACLE.replace("{key}", str(segment_key))
    assert "_crl_segment" not in code
    try:
        trajectory = local_episode(task, ScriptedPolicy((append_to_package("slugkit", code),)))
    finally:

        async def clean() -> None:
            async with create_sandbox({"type": "local"}, task) as sandbox:
                await sandbox.run(INVALIDATE.replace("{key}", str(segment_key)))

        asyncio.run(clean())
    assert_attack_ran(trajectory)
    result = trajectory.evaluation
    assert result is not None
    assert (
        "integrity check in a fresh sandbox" in result.log and "canary tests planted" in result.log
    )
    assert not (result.resolved and result.confirmed), result.log[-4000:]
    assert rewards.tests_score(result, tampered=-1.0) <= 0, result.log[-4000:]
