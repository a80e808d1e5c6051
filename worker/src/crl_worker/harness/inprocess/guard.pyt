# --- The runner's own code, watched (appended to probe.pyt, before origins.pyt: one module) --
#
# A snapshot of what the runner's modules and classes hold, taken as the run starts and once the
# runner is configured, compared with what they hold later: a change is evidence when the runner
# did not make it (see _check_runner).


import operator

_IS = operator.is_
_CODE_OF = operator.attrgetter("__code__")
_DEFAULTS_OF = operator.attrgetter("__defaults__")
_KWDEFAULTS_OF = operator.attrgetter("__kwdefaults__")
_BASES_OF = type.__dict__["__bases__"].__get__
_QUALNAME_OF = type.__dict__["__qualname__"].__get__


def _qualname(target):
    """A function's or class's qualified name, or an object's class's (read without running any
    of the candidate's code)."""
    if type(target) is _FUNCTION:
        return _FUNCTION.__dict__["__qualname__"].__get__(target)
    return _QUALNAME_OF(target if issubclass(type(target), type) else type(target))
_PLAIN_DATA = (str, bytes, int, float, complex, bool, type(None), tuple, list, dict, set, frozenset)
# By id: ``type(x) in (...)`` would ask a metaclass's ``__eq__``, the candidate's code.
_PLAIN_IDS = frozenset(map(id, _PLAIN_DATA))


def _plain_type(value):
    """Whether ``value``'s type is exactly one of :data:`_PLAIN_DATA`."""
    return id(type(value)) in _PLAIN_IDS
_FUNCTION = type(lambda: None)
_CODE = type((lambda: None).__code__)
# A class's own namespace and its method resolution order, read past any metaclass.
_CLASS_DICT = type.__dict__["__dict__"].__get__
_CLASS_MRO = type.__dict__["__mro__"].__get__


def _descriptor(value):
    """Whether ``value`` acts when looked up on a class: a function, a property, any object
    whose type defines ``__get__``, ``__set__`` or ``__delete__`` (as Python looks them up, past
    a metaclass that says otherwise)."""
    try:
        return any(
            name in _CLASS_DICT(klass)
            for klass in _CLASS_MRO(type(value))
            for name in ("__get__", "__set__", "__delete__")
        )
    except Exception:
        return True


def _watched(value):
    """Whether a snapshot keeps ``value``: anything but plain data (a function, a class, a
    module, a descriptor, any object that might be called or bound)."""
    return not _plain_type(value) or callable(value) or _descriptor(value)


def _acts(value):
    """Whether ``value`` is code or can run code where it is kept: a code object, anything
    that can be called, a descriptor."""
    return type(value) is _CODE or callable(value) or _descriptor(value)


#: A cell with nothing in it, as a snapshot keeps it.
_EMPTY_CELL = object()


def _functions_in(value):
    """The functions ``value`` runs when looked up: itself, the one a ``classmethod`` or
    ``staticmethod`` wraps, a property's accessors; each with the suffix its keys get (read
    through the built-in types' own descriptors, whatever a subclass says)."""
    for wrapper in (classmethod, staticmethod):
        if issubclass(type(value), wrapper):
            value = wrapper.__dict__["__func__"].__get__(value)
            break
    if type(value) is _FUNCTION:
        return [("", value)]
    if issubclass(type(value), property):
        parts = [(n, property.__dict__[n].__get__(value)) for n in ("fget", "fset", "fdel")]
        return [("." + n, f) for n, f in parts if type(f) is _FUNCTION]
    return []


def _function_parts(function):
    """What a function runs with besides its name: its code, its defaults and its closure's
    cells (``approx.__defaults__`` set to huge tolerances passes every comparison)."""
    kwdefaults = function.__kwdefaults__
    cells = []
    for cell in function.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:
            cells.append(_EMPTY_CELL)
    return (
        ("__code__", function.__code__),
        ("__defaults__", function.__defaults__),
        ("__kwdefaults__", tuple(kwdefaults.items()) if kwdefaults else None),
        ("__closure__", tuple(cells)),
    )


def _callables(namespace, everything=False):
    """What a module's (or, ``everything``, a class's) namespace holds that the snapshot keeps,
    and, for each function it holds (in a method or property too), the code, defaults and
    closure it runs with (``<name>.__code__``, …: changed in place, not replaced)."""
    kept = {}
    for key, value in list(namespace.items()):
        if everything or _watched(value):
            kept[key] = value
            for suffix, function in _functions_in(value):
                for part, held in _function_parts(function):
                    kept[key + suffix + "." + part] = held
    return kept


def _same(old, new):
    """``old`` and ``new`` are the same object, or tuples of the same objects (a snapshot's
    defaults and closures are taken anew each time)."""
    if old is new:
        return True
    if type(old) is not tuple or type(new) is not tuple or len(old) != len(new):
        return False
    return all(_same(a, b) for a, b in zip(old, new))


def _resolve_lazy():
    """A snapshot once ``__all__`` names runner modules load on first use are, not from the repo."""
    path = sys.path[:]
    sys.path[:] = [p for p in path if p not in ("", ".") and not _under(_real(p), _CONFIG["root"])]
    try:
        for name, module in list(sys.modules.items()):
            try:
                namespace = vars(module) if name.split(".")[0] in _RUNNERS else {}
                for attr in list(namespace.get("__all__", ())) if "__getattr__" in namespace else []:
                    if isinstance(attr, str) and attr not in namespace:
                        getattr(module, attr)
            except Exception:
                continue
    finally:
        sys.path[:] = path
    return _take_snapshot()


def _runner_scopes(critical_only=False):
    """The runner's modules a snapshot covers (``critical_only``: the critical ones), then the
    reporter's own: each one's name, namespace, and the classes it defines, by the names it
    holds them under."""
    names = [
        n for n, m in list(sys.modules.items()) if type(n) is str and m is not None and n.split(".")[0] in _RUNNERS
    ]
    if critical_only:
        names = [n for n in names if n in _CRITICAL_MODULES]
    found = []
    for name in names + [__name__]:
        module = sys.modules.get(name)
        if module is None:
            continue
        namespace = _module_namespace(module)
        if namespace is None:
            namespace = {}
        classes = [
            (key, value)
            for key, value in list(namespace.items())
            if issubclass(type(value), type) and _module_name(value) == name
        ]
        found.append((name, namespace, classes))
    return found


def _take_snapshot(critical_only=False):
    shot = {}
    for name, namespace, classes in _runner_scopes(critical_only):
        shot[name] = _callables(namespace)
        for key, cls in classes:
            shot[name + ":" + key] = _class_shot(cls)
    return shot


def _class_shot(cls):
    """A runner class's snapshot: what its namespace holds that can act (a descriptor hides
    the instances' own attributes), and plain data that hides a base's method or property
    (named in ``<hides>``); plain data over plain data is a setting (pytest sets flags of its
    own on classes: ``_pytest_diamond_inheritance_warning_shown``). Then its bases and its
    metaclass."""
    namespace = _CLASS_DICT(cls)
    bases = [_CLASS_DICT(base) for base in _CLASS_MRO(cls)[1:]]
    shot, hides = {}, []
    for key, value in list(namespace.items()):
        if _watched(value):
            shot[key] = value
        elif any(key in b and _watched(b[key]) for b in bases):
            shot[key] = value
            if any(key in b and _acts(b[key]) for b in bases):
                hides.append(key)
    shot = _callables(shot, everything=True)
    shot["<bases>"] = type.__dict__["__bases__"].__get__(cls)
    shot["<metaclass>"] = type(cls)
    shot["<hides>"] = frozenset(hides)
    return shot


_CRITICAL_MODULES = frozenset(
    "_pytest.runner _pytest.reports _pytest.python _pytest.skipping _pytest.outcomes "
    "_pytest.terminal _pytest.main _pytest.unittest pluggy._callers pluggy._hooks "
    "pluggy._manager unittest.case unittest.result unittest.runner unittest.main".split()
)


def _compare(before, after, settings_ok=False):
    """What was replaced or removed, and what was added that can act: in a class, anything (a
    value hides a base's attribute of its name); in a module, anything but plain data and
    modules (a package's submodule is set on it as it is imported). In a class, plain data
    replaced by plain data is a setting (``TestCase.maxDiff = None``), and so, with
    ``settings_ok``, is any value that cannot act replaced by another (Python 3.6's ``abc``
    renews a class's ``_abc_negative_cache``); a function's code, defaults and closure, a
    class's bases and metaclass are never settings. Pairs of the scope and the key, sorted."""
    changed = []
    for scope, values in before.items():
        now = after.get(scope)
        if now is None:
            continue
        hid = values.get("<hides>", ())
        for key in set(values) | set(now):
            if key == "<hides>":
                continue
            derived = key.startswith("<") or "." in key
            if key not in now:
                plain = _plain_type(values[key]) and not _acts(values[key])
                if derived or not (plain and ":" in scope and key not in hid):
                    changed.append((scope, key))
            elif key in values:
                old, new = values[key], now[key]
                if _same(old, new):
                    continue
                if ":" in scope and not derived:
                    if _plain_type(old) and _plain_type(new):
                        continue
                    if settings_ok and not _acts(old) and not _acts(new):
                        continue
                changed.append((scope, key))
            elif ":" in scope or derived or (_watched(now[key]) and type(now[key]) is not type(sys)):
                changed.append((scope, key))
    return sorted(changed)


_REPORTED = set()
_CONFIGURED = {}


def _is_runner_file(filename):
    """A file of the runner's packages (``_pytest``, ``pluggy``, ``unittest``)."""
    if type(filename) is not str or not filename or filename.startswith("<"):
        return False
    path = _real(filename)
    return any(_under(path, folder) for folder in _CONFIG["runner_folders"])


#: Names the runner fills on first use, after it is configured, with a class of its own:
#: pytest's doctest plugin under ``--doctest-modules`` (httpie's ``setup.cfg``). Only these.
_FILLED_LATER = frozenset(("_pytest.doctest.RUNNER_CLASS", "_pytest.doctest.CHECKER_CLASS"))


def _own_code(value, folders_ok):
    """Whether every function ``value`` (a class) defines, its properties' included, has code
    in a file ``folders_ok`` accepts and runs with its module's globals and the runner's own
    cells; a built-in, a class or any other callable as a method is nobody's."""
    for member in list(_CLASS_DICT(value).values()):
        kind = type(member)
        if not (callable(member) or issubclass(kind, (classmethod, staticmethod, property))):
            continue
        if issubclass(kind, property):
            accessors = [property.__dict__[n].__get__(member) for n in ("fget", "fset", "fdel")]
            if any(a is not None and type(a) is not _FUNCTION for a in accessors):
                return False
        functions = [function for _, function in _functions_in(member)]
        if not functions and not issubclass(kind, property):
            return False
        for function in functions:
            # The runner's code run with other globals, or other cells, is not the runner's.
            if not folders_ok(function.__code__.co_filename) or not _own_globals(function):
                return False
            for cell in function.__closure__ or ():
                if not _own_cell(cell.cell_contents, value, folders_ok):
                    return False
    return True


def _own_cell(content, owner, folders_ok):
    """A closure's cell the runner's own methods hold: the class itself (``super()``), or a
    module that is the loaded one (``doctest``), or a class of the runner or the standard
    library."""
    if content is owner:
        return True
    if type(content) is _MODULE:
        name = dict.get(_MODULE_DICT(content), "__name__")
        return type(name) is str and sys.modules.get(name) is content and folders_ok(_module_file(content))
    return type(content) is type and folders_ok(_class_file(content))


def _runner_made(value):
    """Whether ``value`` is a class the runner made: its metaclass is ``type``, its module is a
    runner file, and every class of its MRO (but ``object``) defines only functions whose code
    lies in the runner's files or the standard library (pytest's doctest runner derives from
    ``doctest``'s): a class's ``__module__`` can be set to anything, a base can carry the
    candidate's methods; code made to claim such a file is evidence already (``_check_compile``)."""

    def runner_or_stdlib(filename):
        if _is_runner_file(filename):
            return True
        return type(filename) is str and not filename.startswith("<") and _is_stdlib(_real(filename))

    try:
        if type(value) is not type:
            return False
        if not _is_runner_file(_class_file(value)):
            return False
        for cls in value.__mro__:
            if cls is object:
                continue
            if type(cls) is not type or not runner_or_stdlib(_class_file(cls)):
                return False
            if not _own_code(cls, runner_or_stdlib):
                return False
    except Exception:
        return False
    return True


def _quick_marks():
    """What the check after each test looks at before anything else: the critical modules' and
    the reporter's namespaces and their classes' (each one's keys and values, in order), the
    classes' bases and metaclasses, and every function's code, defaults and closure's cells
    there. Reading them again is a matter of identities, compared in C (``map``); only when one
    differs is the full snapshot taken and compared (perf/runner_guard.md)."""
    spaces, classes, functions = [], [], []
    for _, namespace, defined in _runner_scopes(critical_only=True):
        classes += [cls for _, cls in defined]
        for space in [namespace] + [_CLASS_DICT(cls) for _, cls in defined]:
            spaces.append((space, tuple(space), tuple(space.values())))
            for value in spaces[-1][2]:
                functions += [f for _, f in _functions_in(value)]
    kwdefaults = [f.__kwdefaults__ for f in functions]
    # A function's keyword defaults are a dict that can change in place: read like a namespace.
    spaces += [(k, tuple(k), tuple(k.values())) for k in kwdefaults if k]
    cells = [c for f in functions for c in f.__closure__ or ()]
    return (
        spaces,
        (classes, [_BASES_OF(c) for c in classes], [type(c) for c in classes]),
        (functions, [f.__code__ for f in functions], [f.__defaults__ for f in functions]),
        kwdefaults,
        (cells, [_cell(c) for c in cells]),
    )


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY_CELL


def _quick_same(marks):
    """Whether nothing :func:`_quick_marks` took has changed since."""
    spaces, (classes, bases, metas), (functions, codes, defaults), kws, cells = marks
    for space, keys, values in spaces:
        if len(space) != len(keys) or not all(map(_IS, space.values(), values)):
            return False
        if not all(map(_IS, space, keys)):
            return False
    if not all(map(_IS, map(_BASES_OF, classes), bases)) or not all(map(_IS, map(type, classes), metas)):
        return False
    if not all(map(_IS, map(_CODE_OF, functions), codes)):
        return False
    if not all(map(_IS, map(_DEFAULTS_OF, functions), defaults)):
        return False
    if not all(map(_IS, map(_KWDEFAULTS_OF, functions), kws)):
        return False
    return all(map(_IS, map(_cell, cells[0]), cells[1]))


_QUICK = []
_DEFAULTS = (".__defaults__", ".__kwdefaults__")


def _owner(shot, key):
    """The function whose defaults ``key`` (``<name>[.fget].__defaults__``) names in ``shot``."""
    name, _, part = key.rsplit(".", 1)[0].partition(".")
    for suffix, function in _functions_in(shot.get(name)):
        if suffix == ("." + part if part else ""):
            return function
    return None


def _check_runner(critical_only=False):
    """Evidence when the runner's code changed: since the runner was configured (its own
    plugins patch it while they configure), or since the start with the candidate's code.
    After each test (``critical_only``) only the runner's critical modules are looked at, and
    first only through :func:`_quick_marks`."""
    if _CONFIG.get("runner_in_repo"):
        return
    if critical_only and _QUICK and _quick_same(_QUICK[0]):
        _check_linecache()
        return
    now = _take_snapshot(critical_only)
    changed = []
    if _CONFIGURED:
        for scope, key in _compare(_CONFIGURED, now, settings_ok=True):
            name = scope + "." + key
            if name in _FILLED_LATER and key not in _CONFIGURED[scope]:
                if _runner_made(now[scope].get(key)):
                    continue
            changed.append(name)
    for scope, key in _compare(_SNAPSHOT, now):
        # Made by package code; or plain data, which has no code to tell who made it, put over
        # a base's method or property, or as new defaults of the same function: the runner
        # does neither (a plugin that puts its own function in place brings its own).
        by_package = _by_package(now[scope].get(key))
        owner = _owner(_SNAPSHOT[scope], key) if key.endswith(_DEFAULTS) else None
        defaults = owner is not None and owner is _owner(now[scope], key)
        plain = defaults or key in now[scope].get("<hides>", ())
        if plain or by_package:
            changed.append(scope + "." + key)
    _check_linecache()
    if critical_only:
        _QUICK[:] = [_quick_marks()]
    changed = sorted(set(changed) - _REPORTED)
    if changed:
        _REPORTED.update(changed)
        _evidence("the test runner's code was changed while it ran: " + ", ".join(changed[:10]))


#: The attribute assignments Python audits (``object.__setattr__``, 3.8 on) that change what a
#: runner's function or class runs, whatever the snapshot can tell of who made the new value.
_AUDITED_PARTS = frozenset(("__code__", "__defaults__", "__kwdefaults__", "__bases__", "__class__"))


def _check_setattr(args):
    """Evidence when package code sets the code or defaults of a function of the runner or the
    harness, the bases or metaclass of one of their classes, or the class of one of their
    objects (unittest's ``_Outcome`` of the running test, reached up a traceback's frames, made
    one whose properties swallow failures): a tolerance put into ``approx``'s defaults is plain
    data and names no file, an object's class is no snapshot's."""
    if len(args) < 2 or args[1] not in _AUDITED_PARTS:
        return
    target = args[0]
    if type(target) is _FUNCTION:
        where = target.__code__.co_filename
    elif issubclass(type(target), type):
        where = _class_file(target)
    elif args[1] == "__class__":
        where = _class_file(type(target))
    else:
        return
    if type(where) is not str or where.startswith("<"):
        return
    if not (_is_runner_file(where) or _under(_real(where), _CONFIG["harness"])):
        return
    frame = _caller(sys._getframe(2))
    if frame is not None and _is_package_file(_provenance(frame) or ""):
        _evidence(
            "package code (%s:%d) set %s of the test runner's %s"
            % (frame.f_code.co_filename, frame.f_lineno, args[1], _qualname(target))
        )
