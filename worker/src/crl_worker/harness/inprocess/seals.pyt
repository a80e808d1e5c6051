# --- Sealed expectations (appended to probe.pyt, before runners.pyt: one module) ---------------
#
# crl_worker.harness.seals takes the expected literal out of a listed test's equality assertions
# (``assert <value> == <literal>``, ``self.assertEqual(<value>, <literal>)``; ``assert "<text>"
# in <value>``) before the run: the
# statement becomes a call of the function below under a name drawn for the run, with a hole id
# and the literal's type only. The function writes the value, as plain data, to the report, and
# the harness compares it with the literal outside the process: a value the package cannot know
# is not in the process to be read, so reading the test or its frames gives no answer, and an
# object equal to everything is not plain data. It returns True (the test goes on), so what the
# statement decided is decided by the harness alone, from the report.

_CURRENT = {"id": None}

# <pure> (crl_worker.harness.seals also appends this part, inside a function of its own, to
# test modules of runs without the reporter)
#: A value written longer than this (characters of its ``repr``) is recorded as too large.
_SEAL_LIMIT = 1 << 20
_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _plain_items(value, depth):
    return [_plain(item, None, depth + 1) for item in value]


def _plain(value, kind, depth=0):
    """``value`` as plain data (exact built-in types, recursively), made by its own protocols
    (a subclass of a built-in type as that type, a number by ``__index__`` or ``__float__``, a
    mapping by its items, anything else by the literal's ``kind``), and equal to it; raises
    otherwise."""
    if depth > 40:
        raise ValueError("nested too deep")
    exact = type(value)
    if any(exact is plain for plain in _PLAIN):  # identity: a metaclass may say it equals int
        return value
    if exact is list or exact is tuple:
        items = _plain_items(value, depth)
        return items if exact is list else tuple(items)
    if exact is dict:
        return dict((_plain(k, None, depth + 1), _plain(v, None, depth + 1)) for k, v in value.items())
    if exact is set or exact is frozenset:
        return set(_plain_items(value, depth))
    plain = _converted(value, kind, depth)
    if not bool(value == plain):
        raise ValueError("not equal to its plain value")
    return plain


def _converted(value, kind, depth):
    import numbers

    if isinstance(value, str):
        return "".join((value,))
    if isinstance(value, bytes):
        return b"".join((value,))
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, complex):
        return complex(value.real, value.imag)
    if isinstance(value, tuple) or (kind == "tuple" and not isinstance(value, (str, bytes))):
        return tuple(_plain_items(value, depth))
    if isinstance(value, list) or kind == "list":
        return _plain_items(value, depth)
    if isinstance(value, dict) or kind == "dict" or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        return dict((_plain(k, None, depth + 1), _plain(value[k], None, depth + 1)) for k in list(value.keys()))
    if isinstance(value, (set, frozenset)) or kind == "set":
        return set(_plain_items(value, depth))
    if kind == "str":
        return str(value)
    if kind == "bytes":
        return bytes(value)
    if kind == "bool":
        return bool(value)
    import operator

    if isinstance(value, numbers.Number) or kind in ("int", "float", "complex"):
        try:
            return operator.index(value)
        except TypeError:
            pass
        try:
            return float(value)
        except (TypeError, ValueError):
            return complex(value)
    if kind is None:
        # An item of a container, whose literal's type is not known here: a number, else its
        # text (a version equal to its string, a lazy translation), whichever it equals.
        for convert in (operator.index, float, str):
            try:
                plain = convert(value)
                if bool(value == plain):
                    return plain
            except Exception:
                pass
    raise TypeError("no plain value")


def _members(value, kind):
    """What ``value`` holds, for a containment check of a literal of type ``kind``: a string's
    (or bytes') text, a mapping's keys, else the items its iteration gives, each as plain data
    (an item that has none cannot be the literal, and is left out)."""
    if isinstance(value, (str, bytes)):
        return _converted(value, kind, 0)
    items = list(value.keys()) if hasattr(value, "keys") else list(value)
    found = []
    for item in items:
        try:
            found.append(_plain(item, kind))
        except Exception:
            pass
    return found


def _sealed_record(hole, kind, value, test):
    """The report's record of ``value`` for the hole ``hole`` of the test ``test``. ``kind`` is
    the literal's type, or ``in:<type>`` when the literal is to be in the value."""
    record = {"kind": "seal", "test": test, "hole": hole, "value": None}
    try:
        if kind.startswith("in:"):
            text = repr(_members(value, kind[3:]))
        else:
            text = repr(_plain(value, kind))
        if len(text) > _SEAL_LIMIT:
            record["why"] = "too large"
        else:
            record["value"] = text
    except Exception as exc:
        try:
            record["why"] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
        except Exception:
            record["why"] = "no plain value"
    return record


# </pure>


def _seal(hole, kind, value):
    """Record ``value`` for the hole ``hole`` of the test running now; the test goes on."""
    _emit(_sealed_record(hole, kind, value, _CURRENT["id"]))
    return True


def _install_seal():
    name = _CONFIG.get("seal")
    if name:
        import builtins

        setattr(builtins, name, _seal)
