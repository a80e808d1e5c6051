"""What a kind's handler is: the operations the reconcile asks of one kind, in the order it asks.

:class:`~crl_operator.reconcile.Reconciler` runs the same steps for every kind (read, validate,
observe, render, apply, prune, status) and asks the kind's :class:`KindHandler` at each step
that differs between kinds. A handler holds no state of its own: it reads the cluster through
the :class:`Context` the reconciler shares with it (the watch-fed cache, Kueue's side, the
child writes, the clock) and calls the pure builders (``crl_operator.builders``) and the pure
status functions (``crl_operator.status``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar, cast

from crl_operator import builders
from crl_operator.admission import Admission
from crl_operator.builders import RenderState
from crl_operator.cache import Cache, Key
from crl_operator.kinds.progress import ProgressReports
from crl_operator.kueue import KueueWorkloads
from crl_operator.status import Observed, Problem
from crl_operator.writes import ChildWrites
from crl_worker.api import AnyResource

#: The resource model a handler reconciles.
R = TypeVar("R", bound=AnyResource)


@dataclass(frozen=True)
class Context:
    """What handlers read and write through: the reconciler's, shared by every kind."""

    cache: Cache
    """The watch-fed cache: the only way a reconcile reads the cluster."""
    kueue: KueueWorkloads
    """Kueue as the reconcile sees it (admission, priorities, the Workload status writes)."""
    writes: ChildWrites
    """Writes of children beyond the render's (the pool's token Secret)."""
    reports: ProgressReports
    """The workers' progress reports, read from their ConfigMaps."""
    now: Callable[[], datetime]
    """The reconcile's clock."""


@dataclass(frozen=True)
class Subject(Generic[R]):
    """One resource in one reconcile: what the steps after the read share."""

    key: Key
    """(kind, namespace, name), as the work queue named it."""
    resource: R
    """The resource, validated by its model."""
    uid: str
    """Its uid: the controller owner reference of its children."""
    previous: Mapping[str, Any]
    """Its status as stored before this reconcile."""
    report: Mapping[str, Any] | None = None
    """The worker's progress report, validated, as JSON (None: none, or a kind without)."""
    admission: Admission | None = None
    """Kueue's admission (None: Kueue does not queue it)."""

    @property
    def namespace(self) -> str:
        """The resource's namespace."""
        return self.resource.metadata.namespace or "default"


class KindHandler(ABC, Generic[R]):
    """One kind's part in the reconcile. Subclass it once per kind (``crl_operator.kinds``).

    The steps, in the order :meth:`Reconciler.reconcile
    <crl_operator.reconcile.Reconciler.reconcile>` calls them: :meth:`parse`, :meth:`read`,
    :meth:`render_state`, :meth:`render`, :meth:`before_apply` (then the apply),
    :meth:`retained` (then the prune), :meth:`settle_admission`, :meth:`observe`,
    :meth:`status`, then :meth:`waits` and :meth:`requeue_after` for the outcome. :meth:`record`
    and :meth:`forget` follow each status and the resource's deletion.
    """

    kind: ClassVar[str]
    """The kind's name, e.g. ``TrainingRun`` (the registry's key)."""
    model: type[R]
    """The kind's pydantic model (``crl_worker.api``)."""

    def __init__(self, ctx: Context) -> None:
        """``ctx``: the reconciler's cache, Kueue side, writes, reports and clock."""
        self.ctx = ctx

    def parse(self, body: Mapping[str, Any]) -> R:
        """The resource validated by its model (status left out: the operator computes it).

        Raises pydantic's ValidationError for a spec the model refuses.
        """
        resource = self.model.model_validate({k: v for k, v in body.items() if k != "status"})
        return cast(R, resource)  # `model` is `type[R]`: mypy widens the result to R's bound

    def read(self, key: Key, resource: R, uid: str, previous: Mapping[str, Any]) -> Subject[R]:
        """What the later steps share; a kind that has a worker's report or is queued by Kueue
        reads them here."""
        return Subject(key, resource, uid, previous)

    @abstractmethod
    def render_state(self, s: Subject[R]) -> tuple[RenderState, Problem | None]:
        """What the builders need from the cluster, and a problem found while reading it (the
        render still happens; the problem becomes the Ready condition)."""

    def render(self, s: Subject[R], state: RenderState) -> list[dict[str, Any]]:
        """Every child the resource wants in ``state``, in apply order (the pure builders)."""
        return builders.render(s.resource, s.key[1], state)

    def before_apply(self, s: Subject[R]) -> Problem | None:
        """Writes that must come before the children are applied, and what failed in them.

        A KubeError raised here with ``namespace_terminating`` ends the reconcile as gone.
        """
        return None

    def retained(self, s: Subject[R], state: RenderState) -> set[Key]:
        """Owned children kept although the render left them out (finished Jobs)."""
        ns = s.namespace
        return {(kind, ns, name) for kind, name in builders.retained(s.resource, ns, state)}

    def settle_admission(self, s: Subject[R]) -> Problem | None:
        """The Workload status writes Kueue's job integrations make (after the prune); only
        called while the reconcile has no problem yet."""
        return None

    @abstractmethod
    def observe(self, s: Subject[R], problem: Problem | None) -> Observed:
        """What the status depends on, gathered from the cache after the apply and prune."""

    @abstractmethod
    def status(self, s: Subject[R], seen: Observed, now: datetime) -> dict[str, Any]:
        """The status fields the operator owns, computed from ``seen`` (pure)."""

    def waits(self, problem: Problem) -> bool:
        """Whether ``problem`` is a wait for something else (the reconcile ends ``ok``, and the
        other object's event brings it back) rather than an error to retry."""
        return False

    def requeue_after(self, s: Subject[R], status: Mapping[str, Any]) -> float | None:
        """Reconcile again after this many seconds without an event (None: only on events);
        ``status``: the one just computed."""
        return None

    def record(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Export the kind's own metrics of a computed status (beyond its conditions)."""

    def forget(self, namespace: str, name: str) -> None:
        """Drop the kind's own metrics of a resource that was deleted."""
