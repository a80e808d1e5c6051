"""Record converters: one function per benchmark format, each turning one raw record into a
:class:`Task` or raising :class:`TaskFormatError` naming the record and the field.

One module per family of formats (:mod:`.swebench`, :mod:`.swesmith`, :mod:`.r2egym`, :mod:`.swerebench`, :mod:`.java`, :mod:`.exercises`,
:mod:`.vulns`), their shared pieces in :mod:`.common`, and here the table of every format's
converter. Record shapes and field mappings are documented in ``docs/tasks.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from crl_worker.errors import TaskFormatError
from crl_worker.tasks.formats.exercises import (
    QUIXBUGS_REPO,
    convert_bugsinpy,
    convert_native,
    convert_polyglot,
    convert_quixbugs,
)
from crl_worker.tasks.formats.java import (
    DEFECTS4J_PROJECTS,
    MULTI_SWE_BENCH_JAVA_BUILDS,
    convert_defects4j,
    convert_gitbug_java,
    convert_multi_swe_bench,
)
from crl_worker.tasks.formats.r2egym import convert_r2egym
from crl_worker.tasks.formats.swebench import (
    RECORD_HARNESS_KEYS,
    REFUSED_RECORD_KEYS,
    convert_swebench,
    convert_swegym,
    drop_log_fragments,
)
from crl_worker.tasks.formats.swerebench import convert_swerebench
from crl_worker.tasks.formats.swesmith import convert_swesmith
from crl_worker.tasks.formats.vulns import convert_bigvul, convert_cvefixes, convert_primevul
from crl_worker.tasks.model import Task
from crl_worker.tasks.records import ConvertOptions, Record, RecordRef

Converter = Callable[[Record, RecordRef, ConvertOptions], Task]

#: Converter of each ``TaskFormat`` name.
CONVERTERS: dict[str, Converter] = {
    "swe-bench": convert_swebench,
    "swe-gym": convert_swegym,
    "swe-smith": convert_swesmith,
    "r2e-gym": convert_r2egym,
    "swe-rebench": convert_swerebench,
    "multi-swe-bench": convert_multi_swe_bench,
    "defects4j": convert_defects4j,
    "gitbug-java": convert_gitbug_java,
    "bugsinpy": convert_bugsinpy,
    "quixbugs": convert_quixbugs,
    "polyglot": convert_polyglot,
    "bigvul": convert_bigvul,
    "cvefixes": convert_cvefixes,
    "primevul": convert_primevul,
    "task": convert_native,
}


def converter(format_name: str) -> Converter:
    """The converter of a format; a clear error for a name no loader knows."""
    try:
        return CONVERTERS[format_name]
    except KeyError:
        raise TaskFormatError(
            f"task format {format_name!r} is not supported yet; known formats:"
            f" {', '.join(sorted(CONVERTERS))}"
        ) from None


__all__ = [
    "CONVERTERS",
    "DEFECTS4J_PROJECTS",
    "MULTI_SWE_BENCH_JAVA_BUILDS",
    "QUIXBUGS_REPO",
    "RECORD_HARNESS_KEYS",
    "REFUSED_RECORD_KEYS",
    "Converter",
    "convert_bigvul",
    "convert_bugsinpy",
    "convert_cvefixes",
    "convert_defects4j",
    "convert_gitbug_java",
    "convert_multi_swe_bench",
    "convert_native",
    "convert_polyglot",
    "convert_primevul",
    "convert_quixbugs",
    "convert_r2egym",
    "convert_swebench",
    "convert_swegym",
    "convert_swerebench",
    "convert_swesmith",
    "converter",
    "drop_log_fragments",
]
