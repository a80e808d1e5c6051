"""The weight-sync interface, the typed updates it pushes, and the error every push raises.

Each implementation takes one kind of update: :class:`AdapterUpdate` (a saved LoRA adapter),
:class:`TensorUpdate` (the full tensor stream) or any :class:`WeightUpdate` (in-process
generation, where nothing moves). ``WeightSync`` is generic in that kind, so pushing the wrong
one to a known implementation is a type error; :func:`push_update` is for a caller that learns
the mode only at run time, and names the mismatch instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, cast, runtime_checkable

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


@dataclass(frozen=True)
class WeightUpdate:
    """A new policy version to push; on its own, the update of a sync that moves nothing."""

    version: int
    """The policy version (the first pushed is 1; 0 is the server's base weights)."""


@dataclass(frozen=True)
class AdapterUpdate(WeightUpdate):
    """Policy ``version`` as a LoRA adapter the trainer saved (PEFT ``save_pretrained``)."""

    adapter_dir: Path
    """The adapter's directory, readable by the server under the same path."""


@dataclass(frozen=True)
class TensorUpdate(WeightUpdate):
    """Policy ``version`` as every tensor of the model, in the order of its manifest."""

    named_tensors: Iterable[tuple[str, torch.Tensor]]
    """``(name, tensor)`` pairs; a one-shot stream is fine (it is read once)."""


U = TypeVar("U", bound=WeightUpdate)
U_contra = TypeVar("U_contra", bound=WeightUpdate, contravariant=True)


@runtime_checkable
class WeightSync(Protocol[U_contra]):
    """How the trainer's policy reaches the server the agents generate with.

    ``U_contra`` is the update the implementation pushes (``update_type`` at run time).
    """

    update_type: ClassVar[type[WeightUpdate]]
    """The kind of update :meth:`push` takes (subclasses included)."""

    version: int
    """The policy version the server holds (0 = the base weights it started with)."""

    def model_name(self) -> str:
        """The ``model`` to send in chat requests to generate with the current version."""
        ...

    async def push(self, update: U_contra) -> None:
        """Make the server hold policy ``update.version`` (an adapter directory or tensors)."""
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


def taking(sync: WeightSync[Any], update_type: type[U]) -> WeightSync[U]:
    """``sync`` typed as pushing ``update_type``; a :class:`TypeError` when it does not."""
    if not issubclass(update_type, sync.update_type):
        raise TypeError(
            f"{type(sync).__name__} pushes {sync.update_type.__name__}, not "
            f"{update_type.__name__}: the weight sync does not match the weight-sync mode"
        )
    return cast("WeightSync[U]", sync)


async def push_update(sync: WeightSync[Any], update: WeightUpdate) -> None:
    """Push ``update`` through a sync whose kind is known only at run time (checked first)."""
    await taking(sync, type(update)).push(update)
