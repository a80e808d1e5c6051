"""In-process generation: the trained model generates itself, so no weights move."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class NoSync:
    """The trained model generates itself: nothing moves, the version follows the pushes."""

    def __init__(self, name: str) -> None:
        self.version = 0
        self._name = name

    def model_name(self) -> str:
        """The fixed name the in-process policy answers to."""
        return self._name

    async def push(
        self,
        version: int,
        *,
        adapter_dir: Path | None = None,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """Record ``version``: the weights being trained are the ones generating."""
        self.version = version

    async def ensure_loaded(self) -> bool:
        """Nothing can be lost: always False."""
        return False

    async def aclose(self) -> None:
        """Nothing to release."""
