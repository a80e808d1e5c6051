"""The harness's own reporter, loaded into the test process before anything of the package.

Written by crl_worker.harness.runner into a fresh folder outside the repository under a random
module name, with its configuration beside it (``<module>.json``), and loaded first: as a pytest
plugin (``-p <module>``, with plugin auto-loading off) or as the unittest runner
(``python -m <module>`` in place of ``python -m unittest``). It writes one JSON object a line to
the report file the harness named: each test's outcome as the runner saw it, evidence of
tampering, and an end record. Nothing here is trusted by itself (the candidate's code shares the
process); the harness cross-checks it with the runner's output and the canaries.

Runs on the task's interpreter: Python 3.6 syntax, standard library only (the audit hook needs
3.8; older interpreters go without it).
"""

import dis
import json
import linecache
import os
import sys

_CONFIG_PATH = os.path.splitext(os.path.abspath(__file__))[0] + ".json"
# Taken before any package code runs: the hook raises the recursion limit for itself with them.
_GET_LIMIT = sys.getrecursionlimit
_SET_LIMIT = sys.setrecursionlimit
_STATE = {"busy": False, "started": False}
_RUNNERS = ("_pytest", "pytest", "pluggy", "unittest")


def _load_config():
    try:
        with open(_CONFIG_PATH) as handle:
            return json.load(handle)
    except OSError:
        return None


_CONFIG = _load_config()
_OUT = None
_SNAPSHOT = {}


def _emit(record):
    if _OUT is None:
        return
    try:
        _OUT.write(json.dumps(record) + "\n")
        _OUT.flush()
    except Exception:
        pass


def _evidence(why):
    _emit({"kind": "tamper", "why": why})


def _note(why):
    _emit({"kind": "note", "why": why})


def _under(path, folder):
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _is_package_file(filename):
    """A file of the repository that is not a test module: the candidate's code."""
    if not filename or filename.startswith("<"):
        return False
    path = _real(filename)
    if not _under(path, _CONFIG["root"]):
        return False
    parts = os.path.relpath(path, _CONFIG["root"]).split(os.sep)
    name = parts[-1]
    if name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py"):
        return False
    return not any(p in ("test", "tests", "testing") for p in parts[:-1])


def _provenance(frame):
    """The file of the module whose own namespace ``frame`` runs in (``None`` for ``exec`` in a
    dictionary of its own); not the code's ``co_filename``, which ``compile`` sets to anything."""
    try:
        module = sys.modules.get(frame.f_globals.get("__name__") or "")
        if module is None or getattr(module, "__dict__", None) is not frame.f_globals:
            return None
        name = getattr(module, "__file__", None)
    except Exception:
        return None
    return name if isinstance(name, str) else None


def _caller(frame):
    """The frame that answers for an open made at ``frame``: the nearest one at or above it not
    of the standard library (file helpers, ``configparser``, the import machinery) nor run in a
    namespace of its own. Package code reading through the standard library is the reader; an
    installed library (a linter's parser, the runner) answers for itself."""
    while frame is not None:
        name = _provenance(frame)
        if name and not _is_stdlib(_real(name)):
            return frame
        frame = frame.f_back
    return None


def _stdlib_folders():
    import sysconfig

    paths = sysconfig.get_paths()
    site = set(_real(paths[k]) for k in ("purelib", "platlib") if paths.get(k))
    lib = set(_real(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k))
    return sorted(lib), sorted(site)


def _is_stdlib(path):
    """A file of the standard library (not of an installed package)."""
    lib, site = _CONFIG["stdlib"]
    if any(_under(path, folder) for folder in site):
        return False
    return any(_under(path, folder) for folder in lib)


#: Modules that read source lines to show a traceback or a warning (the test module's too, when
#: its frame is in one): a read made through them is noted, not evidence. An oracle could read
#: the calling test's line that way; the canaries stand against it.
_FORMATTERS = frozenset(("traceback", "warnings", "logging"))


def _formatting(frame, caller):
    """Whether a module of :data:`_FORMATTERS` runs between ``frame`` and ``caller``."""
    while frame is not None and frame is not caller:
        if frame.f_globals.get("__name__") in _FORMATTERS:
            return True
        frame = frame.f_back
    return False


def _real(path):
    """``path`` with links resolved."""
    return os.path.realpath(path)


def _is_protected_path(path):
    """A test module of the run or a harness file, by path (links resolved) or by inode (a hard
    link to one)."""
    if _protected(path):
        return True
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return (info.st_dev, info.st_ino) in _CONFIG["inodes"]


def _check_open(args):
    target = args[0] if args else None
    if isinstance(target, int) or target is None:
        return
    try:
        path = os.path.abspath(os.fsdecode(os.fspath(target)))
    except (TypeError, ValueError):
        return
    if not _is_protected_path(path):
        return
    path = _real(path)
    opener = sys._getframe(2)
    frame = _caller(opener)
    if frame is not None and _is_package_file(_provenance(frame) or ""):
        # A test that hands its own file to the package (Flask's config tests:
        # ``from_pyfile(__file__)``) asked for it, and a traceback or a warning being shown
        # reads the lines of its frames: noted only.
        asked = _formatting(opener, frame) or _handed_over(frame, path)
        (_note if asked else _evidence)(
            "package code (%s:%d) opened %s"
            % (frame.f_code.co_filename, frame.f_lineno, os.path.relpath(path, _CONFIG["root"]))
        )


#: The changes of a file Python audits (3.8 on) that could put another text in a test module's
#: place without opening it, or take it away: the event, what it does in words, and where its
#: arguments hold each path and that path's directory descriptor.
_CHANGES = {
    "os.rename": ("renamed", ((0, 2), (1, 3))),
    "os.remove": ("removed", ((0, 1),)),
    "os.truncate": ("truncated", ((0, None),)),
}


def _event_path(args, at, dir_at):
    """The absolute path of argument ``at`` of an audit event (relative to the directory
    descriptor at ``dir_at`` when one is given; a descriptor for the path itself is named
    through ``/proc``); ``None`` when there is none."""
    target = args[at] if len(args) > at else None
    if target is None:
        return None
    if isinstance(target, int):
        return "/proc/self/fd/%d" % target
    path = os.fsdecode(os.fspath(target))
    folder = args[dir_at] if dir_at is not None and len(args) > dir_at else None
    if isinstance(folder, int) and folder >= 0 and not os.path.isabs(path):
        path = os.path.join(os.readlink("/proc/self/fd/%d" % folder), path)
    return os.path.abspath(path)


def _check_change(event, args):
    verb, places = _CHANGES[event]
    for at, dir_at in places:
        path = _event_path(args, at, dir_at)
        if path is None or not _is_protected_path(path):
            continue
        frame = _caller(sys._getframe(2))
        if frame is not None and _is_package_file(_provenance(frame) or ""):
            _evidence(
                "package code (%s:%d) %s %s"
                % (frame.f_code.co_filename, frame.f_lineno, verb,
                   os.path.relpath(_real(path), _CONFIG["root"]))
            )
        return


def _handed_over(frame, path):
    """Whether the test running above ``frame`` handed ``path`` to the package: it is that
    test's own module, and the test function that called into the package names ``__file__``
    (``from_pyfile(__file__)``; pylint's runner tests lint ``abspath(__file__)`` a few lines
    after naming it). The hidden tests are the task's, so a forgery cannot write such a line;
    an oracle reading a test that does not name its file, or another test module, is still
    evidence."""
    while frame is not None:
        name = _provenance(frame)
        if name and _real(name) in _CONFIG["protected"]:
            break
        frame = frame.f_back
    if frame is None or _real(_provenance(frame) or "") != path:
        return False
    # The frame runs one of the module's own functions (not code compiled under its name).
    if frame.f_code not in _codes(frame.f_globals):
        return False
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except (OSError, ValueError):
        return False
    # The running function's lines: from its first (a decorator's, or its ``def``) to the start
    # of its last statement, and two more (a statement spread over lines).
    starts = [line for _, line in dis.findlinestarts(frame.f_code) if line]
    first = max(frame.f_code.co_firstlineno - 1, 0)
    body = lines[first : max(starts + [first + 1]) + 2]
    return any("__file__" in line for line in body)


def _codes(namespace):
    """The code objects of a module's functions and of its classes' methods."""
    found = set()
    for value in list(namespace.values()):
        # Any object at all: a proxy (Flask's ``current_app``) raises on the first look.
        try:
            members = list(vars(value).values()) if isinstance(value, type) else [value]
        except Exception:
            continue
        for member in members:
            try:
                code = getattr(getattr(member, "__func__", member), "__code__", None)
            except Exception:
                continue
            if isinstance(code, type(_codes.__code__)):
                found.add(code)
    return found


def _check_getframe(args):
    if not args:
        return
    got = args[0]
    filename = getattr(getattr(got, "f_code", None), "co_filename", "")
    name = got.f_globals.get("__name__", "") if hasattr(got, "f_globals") else ""
    test_frame = _real(filename) in _CONFIG["protected"] if filename else False
    runner_frame = name.split(".")[0] in _RUNNERS
    if not (test_frame or runner_frame):
        return
    caller = _caller(sys._getframe(2))
    if caller is not None and _is_package_file(_provenance(caller) or ""):
        # A test's frame: libraries take their caller's frame for its namespace (pydantic,
        # pandas' stack levels), so that is noted only; the runner's frames are no one's.
        (_evidence if runner_frame else _note)(
            "package code (%s:%d) took the frame of %s"
            % (caller.f_code.co_filename, caller.f_lineno, name or filename)
        )


def _protected(filename):
    try:
        path = _real(os.fsdecode(os.fspath(filename)))
    except (TypeError, ValueError):
        return False
    return path in _CONFIG["protected"] or _under(path, _CONFIG["harness"])


class _GuardedCache(dict):
    """``linecache``'s cache, which keeps no line of a protected file (a test module, the
    harness's files): every read of one through ``linecache`` or ``inspect`` opens the file
    again, where the audit hook sees who asked, instead of being served from memory that the
    runner (a traceback) or anyone filled."""

    def __setitem__(self, key, value):
        if not _protected(key):
            dict.__setitem__(self, key, value)

    def setdefault(self, key, default=None):
        if _protected(key):
            return default
        return dict.setdefault(self, key, default)

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


_LINECACHE = {"cache": None}


def _guard_linecache():
    guarded = _GuardedCache()
    for key, value in list(linecache.cache.items()):
        guarded[key] = value
    linecache.cache = guarded
    _LINECACHE["cache"] = guarded


def _check_linecache():
    """Evidence when ``linecache``'s cache is no longer the guarded one, or holds a protected
    file (put there past the guard)."""
    cache = getattr(linecache, "cache", None)
    if _LINECACHE["cache"] is None or "linecache" in _REPORTED:
        return
    held = [k for k in list(dict.keys(cache)) if _protected(k)] if isinstance(cache, dict) else []
    if cache is not _LINECACHE["cache"] or held:
        _REPORTED.add("linecache")
        _evidence("linecache's cache was replaced or filled with a test module behind its guard")


def _check_compile(args):
    """Evidence when package code makes code that claims a file of the runner or of the harness
    (``compile(source, <that file>)``, ``code.replace(co_filename=...)``): a replacement of a
    runner function, made before the runner was configured, would then read as the runner's own
    (:func:`_check_runner` asks where a replacement was defined). A test module's file is not
    asked: Hypothesis gives its wrappers the test's (``impersonate``)."""
    filename = args[1] if len(args) > 1 else None
    if not isinstance(filename, (str, bytes)) or not filename or filename[:1] in ("<", b"<"):
        return
    try:
        path = _real(os.fsdecode(filename))
    except (TypeError, ValueError):
        return
    folders = [_CONFIG["harness"]] + _CONFIG["runner_folders"]
    claimed = any(_under(path, folder) for folder in folders)
    if not claimed:
        return
    frame = _caller(sys._getframe(2))
    if frame is not None and _is_package_file(_provenance(frame) or ""):
        _evidence(
            "package code (%s:%d) made code that claims to be %s"
            % (frame.f_code.co_filename, frame.f_lineno, path)
        )


_EVENTS = frozenset(
    ("open", "sys._getframe", "compile", "code.__new__", "object.__setattr__") + tuple(_CHANGES)
)


def _hook(event, args):
    if _STATE["busy"]:
        return
    if event not in _EVENTS:
        return
    _STATE["busy"] = True
    # Room of its own: package code that sets the limit just above its depth would make the
    # check fail here, and the open go on unseen.
    limit = _GET_LIMIT()
    try:
        _SET_LIMIT(limit + 1000)
    except Exception:
        pass
    try:
        if event == "open":
            _check_open(args)
        elif event in _CHANGES:
            _check_change(event, args)
        elif event == "sys._getframe":
            _check_getframe(args)
        elif event == "object.__setattr__":
            _check_setattr(args)
        else:
            _check_compile(args)
    except Exception as exc:
        if event == "open" or event in _CHANGES:
            try:
                _evidence(
                    "the harness could not check an %s (%s: %s)"
                    % (event, type(exc).__name__, str(exc)[:200])
                )
            except Exception:
                pass
    finally:
        try:
            _SET_LIMIT(limit)
        except Exception:
            pass
        _STATE["busy"] = False


def _start():
    global _OUT, _SNAPSHOT
    if _CONFIG is None or _STATE["started"]:
        return
    _STATE["started"] = True
    _OUT = open(_CONFIG["report"], "a")
    runner_files = [getattr(sys.modules.get(n), "__file__", None) or "" for n in _RUNNERS]
    _CONFIG["root"] = _real(_CONFIG["root"])
    _CONFIG["runner_in_repo"] = any(_under(_real(f), _CONFIG["root"]) for f in runner_files if f)
    _CONFIG["protected"] = set(_real(p) for p in _CONFIG["protected"])
    _CONFIG["harness"] = _real(_CONFIG["harness"])
    _CONFIG["stdlib"] = _stdlib_folders()
    # The runner's packages' folders (``_pytest``, ``pluggy``, ``unittest``), or a module's own
    # file (``pytest.py`` before pytest 6).
    _CONFIG["runner_folders"] = sorted(
        set(_real(os.path.dirname(f) if f.endswith("__init__.py") else f) for f in runner_files if f)
    )
    inodes = set()
    for protected in _CONFIG["protected"]:
        try:
            info = os.stat(protected)
        except OSError:
            continue
        inodes.add((info.st_dev, info.st_ino))
    _CONFIG["inodes"] = inodes
    _emit({"kind": "start", "pid": os.getpid()})
    _install_seal()
    _SNAPSHOT = _take_snapshot()
    if hasattr(sys, "addaudithook") and not _CONFIG["runner_in_repo"]:
        _guard_linecache()
        sys.addaudithook(_hook)


def _record(test_id, status):
    _emit({"kind": "test", "id": test_id, "status": status})


