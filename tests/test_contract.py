"""The operator-worker contract holds: what the builders set is what the workers read.

Both sides import their names from crl_worker.api.contract; these tests check that they also
use them consistently:

- every environment variable a builder sets on a worker's container is read by the entry point
  that container runs, and is either a contract variable or a known third-party one;
- every contract variable a worker entry point reads is set for it by a builder, or is one a
  user may set (and :data:`ENVIRONMENT` says exactly which builder sets what);
- every sandbox state the gateway writes is counted by the RolloutPool status, and the status
  counts no state the gateway does not write;
- nothing outside the contract spells a contract name again.

What a worker "reads" is found statically: the ``Env.<NAME>`` references in the modules its
entry point imports (transitively, lazy imports included). A rename on one side only fails here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from crl_operator.builders import render_offline
from crl_operator.status import sandbox_state
from crl_worker.api import Benchmark, RolloutPool
from crl_worker.api.contract import (
    API_KEY_ENVS,
    ENTRY_POINTS,
    ENVIRONMENT,
    THIRD_PARTY_ENV,
    Component,
    Env,
    Label,
    SandboxState,
)
from crl_worker.api.validation import load_resources

from .fixtures.paths import ROOT

WORKER_SRC = ROOT / "worker" / "src"
SOURCES = [ROOT / "worker" / "src", ROOT / "operator" / "src", ROOT / "cli" / "src"]
CONTRACT = WORKER_SRC / "crl_worker" / "api" / "contract.py"

# --- what the builders set ------------------------------------------------------------------


def _examples() -> list[Any]:
    """Every example, as the live object (with a uid, as the API server gives it)."""
    out = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for resource in load_resources(path):
            data = resource.model_dump(mode="json", by_alias=True, exclude_none=True)
            data["metadata"]["uid"] = "0e6c1c3a-5f49-4d0b-9d4e-6b1f0f3f0c11"
            out.append(type(resource).model_validate(data))
    return out


def _rendered(resources: list[Any]) -> Iterator[dict[str, Any]]:
    """Every child the operator applies for ``resources``, and for the inline RolloutPools and
    Benchmarks among those children (rendered in turn), as ``crl render`` shows them."""
    children, _ = render_offline(resources)
    for child in children:
        yield child
        kind = child.get("kind")
        if kind in ("RolloutPool", "Benchmark") and str(child.get("apiVersion", "")).startswith(
            "coderepair.io/"
        ):
            model = RolloutPool if kind == "RolloutPool" else Benchmark
            yield from _rendered([model.model_validate(child)])


def _component(container: dict[str, Any]) -> Component | None:
    """The worker a container runs, from its command line."""
    text = " ".join([*container.get("command", []), *container.get("args", [])])
    for component, module in ENTRY_POINTS.items():
        if re.search(rf"(-m|--module)\s+{re.escape(module)}(\s|$)", text):
            return component
    return None


def _user_env(resource: Any) -> set[str]:
    """Names a manifest itself sets in some `env` list (passed through as the user wrote them)."""
    names: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "env" and isinstance(item, list):
                    names.update(e["name"] for e in item if isinstance(e, dict) and "name" in e)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(resource.model_dump(mode="json", by_alias=True, exclude_none=True))
    return names


@cache
def builder_env() -> dict[Component, set[str]]:
    """The variables the builders set on each worker's containers, over every example."""
    resources = _examples()
    user = set().union(*(_user_env(r) for r in resources))
    out: dict[Component, set[str]] = {c: set() for c in ENTRY_POINTS}
    for child in _rendered(resources):
        template = (child.get("spec") or {}).get("template") or {}
        for container in (template.get("spec") or {}).get("containers") or []:
            component = _component(container)
            if component is not None:
                out[component] |= {e["name"] for e in container.get("env") or []} - user
    return out


def test_every_worker_is_started_by_some_builder() -> None:
    assert all(builder_env().values()), builder_env()


# --- what the workers read ------------------------------------------------------------------


def _module_file(module: str) -> Path | None:
    base = WORKER_SRC / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


@cache
def closure(entry: str) -> frozenset[Path]:
    """The worker's source files an entry module imports, transitively (lazy imports too)."""
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        module = todo.pop()
        path = _module_file(module)
        if path is None or path in seen:
            continue
        seen.add(path)
        parts = module.split(".")
        # A package's __init__ runs before any of its modules.
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += [m for m in _imports(ast.parse(path.read_text())) if m.startswith("crl_worker")]
    return frozenset(seen)


def env_reads(path: Path) -> set[str]:
    """The contract variables a source file names (``Env.X``, or the API key list)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "Env" and node.attr in Env.__members__:
                found.add(Env[node.attr].value)
        elif isinstance(node, ast.Name) and node.id == "API_KEY_ENVS":
            found |= {e.value for e in API_KEY_ENVS}
    return found


@cache
def worker_reads() -> dict[Component, set[str]]:
    """The contract variables each worker's entry point reads."""
    out: dict[Component, set[str]] = {}
    for component, module in ENTRY_POINTS.items():
        files = closure(f"{module}.__main__")
        assert files, f"{module}.__main__ not found"
        out[component] = set().union(*(env_reads(f) for f in files if f != CONTRACT))
    return out


@pytest.mark.parametrize("component", list(ENTRY_POINTS))
def test_every_variable_a_builder_sets_is_read_by_the_worker_it_starts(
    component: Component,
) -> None:
    set_here = builder_env()[component]
    ours = {name for name in set_here if name not in THIRD_PARTY_ENV}
    unknown = ours - {e.value for e in Env}
    assert not unknown, f"{component}: builders set {sorted(unknown)}, not contract variables"
    unread = ours - worker_reads()[component]
    assert not unread, f"{component}: builders set {sorted(unread)}; {ENTRY_POINTS[component]} "
    "never reads them"


@pytest.mark.parametrize("component", list(ENTRY_POINTS))
def test_every_variable_a_worker_reads_is_set_for_it_or_user_set(component: Component) -> None:
    unset = {
        name
        for name in worker_reads()[component]
        if name not in builder_env()[component] and not ENVIRONMENT[Env(name)].user_set
    }
    assert not unset, (
        f"{ENTRY_POINTS[component]} reads {sorted(unset)}: no builder sets them and they are "
        "not documented as user-set"
    )


def test_the_environment_table_says_who_sets_what() -> None:
    assert set(ENVIRONMENT) == set(Env)
    for name, var in ENVIRONMENT.items():
        actual = {c for c, names in builder_env().items() if name.value in names}
        assert actual == set(var.set_for), f"{name.value}: set for {sorted(actual)}"


# --- sandbox states -------------------------------------------------------------------------


def _pod(state: str | None) -> dict[str, Any]:
    labels = {Label.POOL.value: "p", **({Label.STATE.value: state} if state else {})}
    return {
        "metadata": {"name": "s", "labels": labels},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _states_named(folder: Path) -> set[str]:
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "SandboxState"
                and node.attr in SandboxState.__members__
            ):
                found.add(SandboxState[node.attr].value)
    return found


def test_every_state_the_gateway_writes_is_counted_and_nothing_else() -> None:
    written = _states_named(WORKER_SRC / "crl_worker" / "pool") | _states_named(
        WORKER_SRC / "crl_worker" / "sandbox"
    )
    assert written == {s.value for s in SandboxState}, "a contract state the gateway never writes"
    counted = {s.value: sandbox_state(_pod(s.value)) for s in SandboxState}
    assert counted == {"starting": "starting", "ready": "ready", "leased": "leased"}
    # The status code names only contract states.
    status = ROOT / "operator" / "src" / "crl_operator" / "status.py"
    literals = {
        n.value
        for n in ast.walk(ast.parse(status.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    invented = {"busy", "in-use", "cold", "draining", "creating", "resetting"}
    assert not literals & invented


# --- nothing spells a contract name twice ---------------------------------------------------

#: Literals that look like contract names but are not: the operator's own settings (the Helm
#: chart sets them for the operator, no worker reads them) and the gold agent's heredoc marker.
NOT_CONTRACT = re.compile(r"^CRL_OPERATOR_[A-Z_]+$|^CRL_GOLD_PATCH_EOF$")
NAME_LIKE = re.compile(r"\bCRL_[A-Z][A-Z_]*\b|\bcoderepair\.io/(?!v1)[a-z][a-z-]*")


def _string_literals(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    # Docstrings (of modules, classes, functions and attributes) are documentation.
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node.lineno, node.value


def test_no_contract_name_is_spelled_outside_the_contract() -> None:
    spelled = []
    for folder in SOURCES:
        for path in folder.rglob("*.py"):
            if path == CONTRACT:
                continue
            for line, text in _string_literals(path):
                for match in NAME_LIKE.finditer(text):
                    if not NOT_CONTRACT.match(match.group()):
                        spelled.append(f"{path.relative_to(ROOT)}:{line}: {match.group()}")
    assert not spelled, "names the contract defines, spelled again:\n" + "\n".join(spelled)


def test_the_docs_list_every_variable() -> None:
    text = (ROOT / "docs" / "operator.md").read_text()
    section = text[text.index("## The operator-worker contract") :]
    section = section[: section.index("\n## ", 1)]
    missing = [e.value for e in Env if f"`{e.value}`" not in section]
    assert not missing, f"docs/operator.md's contract table lacks {missing}"
