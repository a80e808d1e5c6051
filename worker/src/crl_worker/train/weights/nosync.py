"""In-process generation: the trained model generates itself, so no weights move."""

from __future__ import annotations

from typing import ClassVar

from crl_worker.train.weights.protocol import WeightUpdate


class NoSync:
    """The trained model generates itself: nothing moves, the version follows the pushes."""

    update_type: ClassVar[type[WeightUpdate]] = WeightUpdate
    """Any update: none of it is moved."""

    def __init__(self, name: str) -> None:
        self.version = 0
        self._name = name

    def model_name(self) -> str:
        """The fixed name the in-process policy answers to."""
        return self._name

    async def push(self, update: WeightUpdate) -> None:
        """Record ``update.version``: the weights being trained are the ones generating."""
        self.version = update.version

    async def ensure_loaded(self) -> bool:
        """Nothing can be lost: always False."""
        return False

    async def aclose(self) -> None:
        """Nothing to release."""
