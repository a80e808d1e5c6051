"""Errors of the trainer."""

from __future__ import annotations

from crl_worker.errors import CrlError


class TrainConfigError(CrlError):
    """A TrainingRun the trainer cannot honour; ``field`` names the spec field (or flag)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
