"""The operator's kinds: one handler each (crl_operator.kinds), and every table that names the
kinds agrees with the registry, so a kind added in one place and forgotten in another fails here
and says where (docs/development.md, "Adding a kind")."""

from __future__ import annotations

from crl_operator import apply, crds, patches
from crl_operator.handlers import PRIMARY_KINDS
from crl_operator.kinds import HANDLERS
from crl_worker.api import KINDS


def test_every_kind_has_one_complete_handler_with_its_model() -> None:
    assert list(HANDLERS) == list(KINDS)
    for kind, cls in HANDLERS.items():
        assert cls.kind == kind
        assert cls.model is KINDS[kind].model
        assert not cls.__abstractmethods__, f"{cls.__name__} leaves steps out"


def test_every_table_of_the_kinds_names_each_kind() -> None:
    kinds = set(HANDLERS)
    assert set(PRIMARY_KINDS) == kinds, "crl_operator.handlers.PRIMARY_KINDS (the watches)"
    assert set(patches.OWNED_KEYS) == kinds, "crl_operator.patches.OWNED_KEYS (status keys)"
    assert set(crds.PRINTER_COLUMNS) == kinds, "crl_operator.crds.PRINTER_COLUMNS"
    for kind in kinds:
        info = apply.KINDS.get(kind)
        assert info is not None, f"crl_operator.apply.KINDS has no {kind} (its API path)"
        assert info.plural == KINDS[kind].plural
