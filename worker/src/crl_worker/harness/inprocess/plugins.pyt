# --- pytest plugins registered while the run goes (after seals.pyt, before runners.pyt) ----------
#
# Package code that reaches pytest's plugin manager (through the objects ``gc`` lists, or a frame
# reached from a traceback) can register a plugin of its own whose hook wrapper swallows a test's
# exception, and nothing of the runner's code changes. So every registration is looked at as it
# happens (``pytest_plugin_registered``, from runners.pyt), and the hook implementations the
# manager holds are looked at after each test and at the end: one whose code is package code
# stands only if pytest registered its plugin (a plugin the task names, an entry point, a
# conftest) or an accepted plugin's own hook implementation did (a plugin repository's).

_PLUGINS = {"manager": None, "functions": {}, "codes": {}, "folders": set()}


def _hookimpls(manager):
    """Every hook implementation ``manager`` holds, with its hook's name (read only through
    the runner's own classes: a hook relay or hook caller put in place by package code is
    evidence, and is not asked)."""
    relay = object.__getattribute__(manager, "hook")
    callers = []
    if _is_runner_class(type(relay)):
        callers = list(object.__getattribute__(relay, "__dict__").items())
    elif _by_package(relay):
        _hook_replaced("hook")
    found = []
    # By id: a class's own hash and equality could be the candidate's code.
    kinds = dict((id(type(caller)), type(caller)) for _, caller in callers)
    strange = set(key for key, kind in kinds.items() if not _is_runner_class(kind))
    for name, caller in callers:
        if strange and id(type(caller)) in strange:
            if _by_package(caller):
                _hook_replaced(name)
            continue
        try:
            found += [(name, impl) for impl in caller.get_hookimpls()]
        except Exception:
            continue
    return found


def _hook_replaced(name):
    if "hook:" + name not in _REPORTED:
        _REPORTED.add("hook:" + name)
        _evidence("package code replaced pytest's %s" % name)


_METHOD = type(_hook_replaced.__get__(1))


def _code_of(function):
    """A hook implementation's code (a method's function's), or ``None``."""
    if type(function) is _METHOD:
        function = _METHOD.__dict__["__func__"].__get__(function)
    return function.__code__ if type(function) is _FUNCTION else None


def _accept(manager, plugin):
    """Take ``plugin``'s hook implementations, and their code, as the run's own."""
    for _, impl in _hookimpls(manager):
        if impl.plugin is plugin:
            function = impl.function
            _PLUGINS["functions"][id(function)] = function
            code = _code_of(function)
            if code is not None:
                _PLUGINS["codes"][id(code)] = code
                folder = _plugin_folder(code.co_filename, impl.plugin)
                if not _is_runner_file(folder):
                    _PLUGINS["folders"].add(folder)


def _plugin_folder(filename, plugin):
    """The folder of an accepted plugin's code: its top-level package's (a plugin module
    ``pkg.plugin`` lives in ``pkg/``), or its file's own for a module on its own."""
    path = _real(filename)
    name = dict.get(_module_namespace(plugin) or {}, "__name__")
    depth = name.count(".") if type(name) is str else -1
    if os.path.basename(path) != "__init__.py":
        depth -= 1
    if depth < 0:
        return path
    folder = os.path.dirname(path)
    for _ in range(depth):
        folder = os.path.dirname(folder)
    return folder


def _package_frame(frame):
    """The nearest frame at or above ``frame`` that runs package code, or ``None``."""
    while frame is not None:
        if _is_package_file(_provenance(frame) or ""):
            return frame
        frame = frame.f_back
    return None


def _as_hook(frame):
    """Whether the package code running at ``frame`` was called by pluggy as the hook
    implementation of an accepted plugin (through the standard library, or package helpers)."""
    called = frame
    frame = frame.f_back
    while frame is not None:
        name = _provenance(frame)
        if name is None or _is_package_file(name) or _is_stdlib(_real(name)):
            called, frame = frame, frame.f_back
            continue
        known = _PLUGINS["codes"].get(id(called.f_code)) is called.f_code
        return frame.f_code.co_name == "_multicall" and _is_runner_file(name) and known
    return False


def _plugin_registered(plugin, manager):
    """Accept ``plugin``, or give evidence when package code registered it, not as a hook of
    an accepted plugin."""
    _PLUGINS["manager"] = manager
    if _CONFIG.get("runner_in_repo"):
        return
    frame = _package_frame(sys._getframe(1))
    if frame is None or _as_hook(frame):
        _accept(manager, plugin)
        return
    _evidence(
        "package code (%s:%d) registered a pytest plugin while the run went"
        % (frame.f_code.co_filename, frame.f_lineno)
    )


def _check_plugins():
    """Evidence when the plugin manager holds a hook implementation of package code that no
    accepted registration brought (put in its lists, or under an accepted plugin's name)."""
    manager = _PLUGINS["manager"]
    if manager is None or _CONFIG.get("runner_in_repo"):
        return
    for name, impl in _hookimpls(manager):
        function = impl.function
        if _PLUGINS["functions"].get(id(function)) is function:
            continue
        if _by_package(function) and "plugin:" + name not in _REPORTED:
            _REPORTED.add("plugin:" + name)
            _evidence("a hook implementation of package code was put into pytest's %s" % name)
