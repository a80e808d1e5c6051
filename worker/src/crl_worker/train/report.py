"""The trainer's progress reporter, as the operator configures it in a cluster.

The trainer (its rank 0) publishes a :class:`~crl_worker.api.progress.TrainingProgress` after
each optimizer step, after each checkpoint and once at the end. In a cluster the operator gives
the trainer pods a ConfigMap of their own (`CRL_PROGRESS_CONFIGMAP`, `<run>-progress`); the
reporter from :func:`training_reporter_from_env` merge-patches the report into its key
`progress.json`, and the operator copies it into the TrainingRun's status. On one machine there
is no reporter (None); the trainer's logs and metrics say the same.

The transport is crl_worker.rollout.report's :class:`ConfigMapReporter`: coalesced publishes,
failures logged and never raised, the final report retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from crl_worker.api.contract import TRAINER_FIELD_MANAGER
from crl_worker.api.progress import TrainingProgress
from crl_worker.rollout.report import reporter_from_env


class TrainingReporter(Protocol):
    """Where the trainer's progress goes (a ConfigMap reporter in a cluster)."""

    async def publish(self, report: Mapping[str, Any]) -> None:
        """Make `report` (a :class:`TrainingProgress` as JSON) the current progress; never
        raises (an invalid report is logged and not sent)."""
        ...

    async def aclose(self) -> None:
        """Wait for a publish in flight and release the connection."""
        ...


def training_reporter_from_env(env: Mapping[str, str] | None = None) -> TrainingReporter | None:
    """The trainer's ConfigMap reporter as the operator configured it (`CRL_PROGRESS_CONFIGMAP`,
    `POD_NAMESPACE`; `KUBECONFIG` instead of the pod's ServiceAccount when set); None outside a
    cluster, where nothing reads progress."""
    return reporter_from_env(env, field_manager=TRAINER_FIELD_MANAGER, model=TrainingProgress)
