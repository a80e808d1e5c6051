"""YAML as Kubernetes reads it, with the line of every node.

kubectl and the API server read YAML with sigs.k8s.io/yaml (go-yaml v2, YAML 1.1 resolution),
and PyYAML differs in a few places that change what a manifest means. This loader follows the
Kubernetes side:

- `y`, `Y`, `n`, `N` are booleans (as are yes/no/on/off/true/false);
- `1e3` is a number (PyYAML wants a dot), while sexagesimal `12:30` stays a string (PyYAML reads
  750) and so does `=`;
- timestamps stay strings as written (JSON has no timestamp type);
- `!!binary`, `!!set`, `!!omap` and `!!pairs` are refused: they have no JSON form;
- alias expansion is bounded, and a recursive alias is an error, not a hang.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml

FieldPath = tuple[str | int, ...]

#: Nodes a document may expand to through aliases (go-yaml refuses "excessive aliasing" too).
MAX_EXPANDED_NODES = 200_000

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it


class KubeLoader(_Base):  # type: ignore[misc]
    """PyYAML's safe loader with go-yaml v2's implicit types."""

    yaml_implicit_resolvers: ClassVar[dict[str | None, list[tuple[str, re.Pattern[str]]]]] = {}
    yaml_constructors: ClassVar[dict[str | None, Any]] = {
        tag: ctor
        for tag, ctor in yaml.SafeLoader.yaml_constructors.items()
        if tag
        not in (
            "tag:yaml.org,2002:binary",
            "tag:yaml.org,2002:set",
            "tag:yaml.org,2002:omap",
            "tag:yaml.org,2002:pairs",
            "tag:yaml.org,2002:timestamp",
        )
    }
    bool_values: ClassVar[dict[str, bool]] = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


KubeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(
        r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE"
        r"|on|On|ON|off|Off|OFF)$"
    ),
    list("yYnNtTfFoO"),
)
KubeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
KubeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
KubeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
KubeLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])


class AliasError(yaml.YAMLError):
    """A document whose aliases recurse or expand beyond `MAX_EXPANDED_NODES`."""


@dataclass
class Document:
    """One parsed YAML document."""

    index: int
    """0-based position in the stream."""
    line: int
    """1-based line where it starts."""
    data: Any
    """The document as plain Python values."""
    positions: dict[FieldPath, int]
    """Line of every field path (the key's line for mapping entries)."""
    duplicates: list[tuple[FieldPath, int]]
    """Mapping keys given twice, with the line of the second."""

    def line_of(self, path: FieldPath) -> int:
        """The line of `path`, or of its nearest ancestor that is in the file."""
        while path not in self.positions and path:
            path = path[:-1]
        return self.positions.get(path, self.line)


class _Walk:
    """Records positions and duplicate keys, bounding alias expansion."""

    def __init__(self) -> None:
        self.positions: dict[FieldPath, int] = {}
        self.duplicates: list[tuple[FieldPath, int]] = []
        self.count = 0
        self.stack: set[int] = set()

    def node(self, node: yaml.Node, path: FieldPath) -> None:
        self.count += 1
        if self.count > MAX_EXPANDED_NODES:
            raise AliasError(f"document expands to more than {MAX_EXPANDED_NODES} nodes")
        if id(node) in self.stack:
            raise AliasError(f"recursive alias at {'.'.join(map(str, path)) or 'the root'}")
        self.positions.setdefault(path, node.start_mark.line + 1)
        self.stack.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key in seen:
                    self.duplicates.append(((*path, key), key_node.start_mark.line + 1))
                seen.add(key)
                self.positions[(*path, key)] = key_node.start_mark.line + 1
                self.node(value_node, (*path, key))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.node(item, (*path, i))
        self.stack.discard(id(node))


def documents(text: str) -> Iterator[Document]:
    """Parse a YAML stream document by document; raises `yaml.YAMLError` where it breaks."""
    loader = KubeLoader(text)
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            walk = _Walk()
            walk.node(node, ())
            data = loader.construct_document(node)
            yield Document(index, node.start_mark.line + 1, data, walk.positions, walk.duplicates)
            index += 1
    finally:
        loader.dispose()
