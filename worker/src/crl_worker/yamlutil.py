"""YAML output that people read: block style for multi-line strings, keys in model order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """A safe dumper that writes multi-line strings as `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    value = str.__str__(value)  # a str subclass (a contract name, a StrEnum) as its plain text
    if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)
# Subclasses too: the builders name variables and labels with crl_worker.api.contract's StrEnums.
_Dumper.add_multi_representer(str, _str)


def dump(obj: Any) -> str:
    """One YAML document."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def dump_all(docs: Iterable[Any]) -> str:
    """A multi-document YAML stream."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
