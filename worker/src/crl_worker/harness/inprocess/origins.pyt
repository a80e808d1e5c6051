# --- Whose code a value runs (appended to guard.pyt, before seals.pyt: one module) ---
#
# The runner's snapshot (guard.pyt) finds what changed; what is found here says whether the
# candidate made it, when nothing else can (a change made before pytest is configured, a hook
# implementation no registration brought): by the files of the code the new value would run,
# walked through what it holds, read only through the built-in types' own descriptors, so that
# none of the candidate's code runs while it is looked at, and counted as the candidate's where
# that cannot be told.

import collections
import gc

_REFERENTS = gc.get_referents

#: What :func:`_origins` gives where it cannot tell whose code a value runs: counted as the
#: candidate's (a walk too large, a read that failed, plain data put over a base's method).
_UNKNOWN = "<unknown>"
#: The most objects one walk of :func:`_origins` looks at.
_ORIGINS_LIMIT = 5000
_MODULE = type(sys)
_MODULE_DICT = _MODULE.__dict__["__dict__"].__get__
_CONTAINERS = (tuple, list, dict, set, frozenset)
_CONTAINER_IDS = frozenset(map(id, _CONTAINERS))
_HEAP_TYPE = 1 << 9
_FLAGS_OF = type.__dict__["__flags__"].__get__


def _module_namespace(module):
    """A module's namespace, read past any ``__dict__`` a subclass defines; ``None`` for what
    is not a module."""
    return _MODULE_DICT(module) if issubclass(type(module), _MODULE) else None


def _module_file(module):
    """A module's ``__file__`` when it is a string, read from its namespace, else ``None``."""
    namespace = _module_namespace(module)
    found = dict.get(namespace, "__file__") if namespace is not None else None
    return found if type(found) is str else None


def _module_name(cls):
    """The module a class says it comes from (its ``__module__``, read past any metaclass), or
    ``None`` when that is not a string."""
    name = type.__dict__["__module__"].__get__(cls)
    return name if type(name) is str else None


def _class_file(cls):
    """The file of the module ``cls`` says it comes from (read past any metaclass): a claim,
    which :func:`_origins` does not rest on alone."""
    name = _module_name(cls)
    return _module_file(sys.modules.get(name)) if name is not None else None


def _own_globals(function):
    """Whether ``function`` runs with the namespace of the module its globals name (not the
    runner's code given other globals, where a name it calls is the candidate's)."""
    namespace = _FUNCTION.__dict__["__globals__"].__get__(function)
    name = dict.get(namespace, "__name__")
    if type(name) is not str:
        return False
    return _module_namespace(sys.modules.get(name)) is namespace


def _filename(code):
    """A code object's file name, or :data:`_UNKNOWN` when it is not exactly a string (a
    subclass's methods would be the candidate's code)."""
    filename = code.co_filename
    return filename if type(filename) is str else _UNKNOWN


def _origin_parts(value, found):
    """One step of :func:`_origins`: the files ``value`` itself names go into ``found``; what
    it holds that could run code is returned, to be looked at in turn."""
    kind = type(value)
    if kind is _CODE:
        found.append(_filename(value))
        return ()
    if kind is _FUNCTION:
        filename = _filename(value.__code__)
        found.append(filename)
        if not filename.startswith("<") and not _own_globals(value):
            found.append(_UNKNOWN)
        cells = [_cell(cell) for cell in value.__closure__ or ()]
        return [value.__defaults__ or (), value.__kwdefaults__ or {}, cells]
    if kind is dict:
        return list(dict.keys(value)) + list(dict.values(value))
    if id(kind) in _CONTAINER_IDS:
        return list(value)
    if id(kind) in _PLAIN_IDS or issubclass(kind, _MODULE):
        if issubclass(kind, _MODULE):
            found.append(_module_file(value))
        return ()
    if issubclass(kind, type):
        return _class_parts(value, found)
    # Anything else (a method, a property, a partial, a callable object, a C wrapper of a
    # function): what it holds as Python sees it from C (its class among them), past any
    # ``__getattr__`` or ``__dict__`` of its own.
    return [kind] + _REFERENTS(value)


def _class_parts(cls, found):
    """:func:`_origin_parts` of a class: the file of the module it names, and its metaclass and
    whatever its classes (those defined in Python) hold that can act; plain data in one of them
    over what a later one has that acts is :data:`_UNKNOWN` (no code to say who put it)."""
    if not _FLAGS_OF(cls) & _HEAP_TYPE:
        return ()
    found.append(_class_file(cls))
    parts = [type(cls)]
    mro = [c for c in _CLASS_MRO(cls) if _FLAGS_OF(c) & _HEAP_TYPE]
    for index, klass in enumerate(mro):
        for key, member in list(_CLASS_DICT(klass).items()):
            if _acts(member):
                parts.append(member)
            elif type(key) is not str:
                found.append(_UNKNOWN)  # its hash and equality could be the candidate's code
            elif any(key in _CLASS_DICT(later) and _acts(_CLASS_DICT(later)[key]) for later in mro[index + 1 :]):
                found.append(_UNKNOWN)
    return parts


def _origins(value, runner_objects=False):
    """Every file whose code ``value`` runs when the runner uses it, as far as can be told
    without calling it and without running any of its code (no ``getattr``, ``isinstance`` or
    comparison on the candidate's objects): a code object's or function's file, and what the
    function runs with (defaults, closure); a class's module and what its metaclass and its
    classes hold that can act; any other object's class and what it holds. Nearest first (an
    object's class before what the object holds); :data:`_UNKNOWN` where that cannot be told.
    ``runner_objects``: an object whose class is the runner's own (a test item a function is
    bound to) names its class's file, and what it holds is not walked."""
    seen, todo = set(), collections.deque([value])
    while todo:
        item = todo.popleft()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if len(seen) > _ORIGINS_LIMIT:
            yield _UNKNOWN
            return
        found = []
        try:
            if runner_objects and _is_runner_object(item):
                found.append(_class_file(type(item)))
                parts = ()
            else:
                parts = _origin_parts(item, found)
        except Exception:
            found.append(_UNKNOWN)
            parts = ()
        for filename in found:
            yield filename
        todo.extend(p for p in parts if id(type(p)) in _CONTAINER_IDS or _acts(p))


def _not_told(filename):
    """Whether a file name :func:`_origins` gave says nothing of who wrote the code: not a
    string, :data:`_UNKNOWN`, or code compiled from a string (``<string>``: ``exec`` of the
    candidate's text). For what a test is run by, where no code of the runner's own is
    compiled from a string."""
    return type(filename) is not str or filename.startswith("<")


#: By id: the classes :func:`_runner_made` was asked about, and its answer (a class's own
#: hash could be the candidate's code; a runner class's later changes are the snapshot's).
_RUNNER_CLASSES = {}


def _is_runner_class(cls):
    """:func:`_runner_made`, asked once per class."""
    known = _RUNNER_CLASSES.get(id(cls))
    if known is None or known[0] is not cls:
        known = _RUNNER_CLASSES[id(cls)] = (cls, _runner_made(cls))
    return known[1]


def _is_runner_object(value):
    """Whether ``value`` is an instance (not a class, not a function) of a class the runner
    made."""
    kind = type(value)
    if kind is _FUNCTION or issubclass(kind, type):
        return False
    return _is_runner_class(kind)


def _by_package(value):
    """Whether :func:`_origins` of ``value`` names the candidate's code, or cannot tell (the
    walk stops at the first such file): a value that can act but names no file at all
    (built-ins put together: ``property(operator.truth)`` as a report's ``passed``) has no code
    to say who made it, as plain data over a method has none. Code compiled from a string
    (``<string>``) is not counted either way here: the runner's own dataclasses' methods are
    such code, and what pytest puts in its classes as it configures (its config) leads to
    them."""
    named = False
    try:
        for filename in _origins(value):
            if filename is None:
                continue
            if type(filename) is not str or filename == _UNKNOWN or _is_package_file(filename):
                return True
            named = True
        return not named and _acts(value)
    except Exception:
        return True
