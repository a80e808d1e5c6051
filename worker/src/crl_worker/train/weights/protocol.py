"""The weight-sync interface and the error every push raises."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from crl_worker.errors import InfrastructureError

if TYPE_CHECKING:
    import torch

WeightSyncMode = Literal["nccl", "lora-adapter", "none"]
#: Seconds allowed for requests that do not move weights (pause, resume, list, unload).
CONTROL_TIMEOUT = 300.0
#: Seconds allowed for requests that scale with the model (group setup, transfer, adapter load).
TRANSFER_TIMEOUT = 1800.0


class WeightSyncError(InfrastructureError):
    """A weight push or check the inference server refused or did not answer.

    ``status`` is the HTTP status (None when the server could not be reached) and
    ``server_message`` what the server said.
    """

    def __init__(self, message: str, *, status: int | None = None, server_message: str = ""):
        super().__init__(message)
        self.status = status
        self.server_message = server_message


@runtime_checkable
class WeightSync(Protocol):
    """How the trainer's policy reaches the server the agents generate with."""

    version: int
    """The policy version the server holds (0 = the base weights it started with)."""

    def model_name(self) -> str:
        """The ``model`` to send in chat requests to generate with the current version."""
        ...

    async def push(
        self,
        version: int,
        *,
        adapter_dir: Path | None = None,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """Make the server hold policy ``version`` (an adapter directory or full tensors)."""
        ...

    async def ensure_loaded(self) -> bool:
        """Whether the server had lost the current version (restarted), re-pushing if it can.

        True means the server did not hold ``version``: the sync loaded it again where it can
        do so alone (an adapter directory); where it cannot (full weights without ``reload``)
        ``version`` is set to 0 and the caller pushes.
        """
        ...

    async def aclose(self) -> None:
        """Release connections (the server keeps what it holds)."""
        ...
