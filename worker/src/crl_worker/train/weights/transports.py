"""The tensor side of a full-weight push: the stream's manifest, packing, and two transports.

The HTTP choreography (:mod:`crl_worker.train.weights.nccl`) tells the servers what is coming;
a :class:`WeightTransport` moves the bytes over a collective group in which the trainer is rank
0. :class:`VllmNcclTransport` is vLLM's own (what a stock server joins);
:class:`TorchDistributedTransport` is the same packed broadcast over plain ``torch.distributed``
(what the test suite's fake server joins). torch is imported only inside the transports.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from crl_worker.train.errors import TrainConfigError
from crl_worker.train.weights.protocol import TRANSFER_TIMEOUT

if TYPE_CHECKING:
    import torch

#: vLLM's packed-broadcast chunk size: both ends must cut the stream at the same places.
PACKED_BUFFER_SIZE_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one tensor of the stream, in stream order."""

    name: str
    dtype: str
    """torch dtype name without the ``torch.`` prefix, e.g. ``bfloat16``."""
    shape: tuple[int, ...]


class WeightTransport(Protocol):
    """The trainer's end (rank 0) of the collective group the servers' workers join."""

    def open(self, master_address: str, master_port: int, world_size: int) -> None:
        """Host the rendezvous at the address and join as rank 0; blocks until all joined."""
        ...

    def send(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Broadcast the tensors in order, packed the way the receivers unpack them."""
        ...

    def close(self) -> None:
        """Leave the group (the receivers' next collective fails instead of waiting)."""
        ...


class VllmNcclTransport:
    """vLLM's own trainer side: ``StatelessProcessGroup`` + ``PyNcclCommunicator``, packed.

    The rendezvous (a TCPStore hosted by rank 0, the NCCL unique id passed through it) and the
    NCCL communicator are vLLM's, so vLLM must be installed where the trainer runs; it is
    imported here, on first use, and nowhere else. The chunking uses vLLM's defaults, which the
    server's consumer uses too when the init/update info names no buffer size.
    """

    def __init__(self) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise TrainConfigError(
                "spec.weightSync",
                "NCCL weight sync into vLLM needs the vllm package in the trainer image (its "
                "StatelessProcessGroup rendezvous and PyNccl communicator are the wire "
                "protocol the server speaks); install vllm next to the trainer, or train "
                "with LoRA (spec.algorithm.lora) and weightSync: lora-adapter",
            )
        import torch

        # The transfer runs in a thread of its own, whose CUDA device would default to 0: the
        # device current where the sync is built (the trainer's rank-0 device) is used there.
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else None
        self._group: Any = None

    def _use_device(self) -> None:
        import torch

        if self.device is not None:
            torch.cuda.set_device(self.device)

    def open(self, master_address: str, master_port: int, world_size: int) -> None:
        """Join as rank 0 through vLLM's ``trainer_init``."""
        self._use_device()
        info = {
            "master_address": master_address,
            "master_port": master_port,
            "world_size": world_size,
            "rank_offset": 1,
        }
        # Imported by name: vllm is optional (and untyped) for everything else in the worker.
        try:  # vLLM >= 0.28 keeps the rendezvous helpers in nccl_common
            common = importlib.import_module("vllm.distributed.weight_transfer.nccl_common")
            self._group = common.trainer_init(info)
        except ImportError:
            engine = importlib.import_module("vllm.distributed.weight_transfer.nccl_engine")
            self._group = engine.NCCLWeightTransferEngine.trainer_init(info)

    def send(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Stream the tensors with vLLM's packed broadcast producer."""
        self._use_device()
        packed = importlib.import_module("vllm.distributed.weight_transfer.packed_tensor")
        # Renamed in vLLM 0.28 when the IPC backend got its own packed helpers.
        producer = getattr(packed, "packed_nccl_broadcast_producer", None)
        if producer is None:
            producer = packed.packed_broadcast_producer
        producer(iterator=tensors, group=self._group, src=0, post_iter_func=lambda item: item[1])

    def close(self) -> None:
        """Drop the communicator (vLLM has no explicit destroy on the trainer side)."""
        self._group = None


class TorchDistributedTransport:
    """The same packed broadcast over a plain ``torch.distributed`` process group.

    Rank 0 hosts a ``TCPStore`` at the master address; the group (gloo on the CPU, or NCCL) is
    built on that store under the prefix :attr:`STORE_PREFIX` without touching the default
    process group, so it coexists with DeepSpeed's. Tensors are cut into chunks exactly as
    vLLM's packed producer cuts them (append whole tensors until the chunk exceeds
    ``buffer_size_bytes``) and each chunk is one ``uint8`` broadcast. This is not vLLM's
    PyNccl rendezvous: a stock vLLM worker cannot join it. It serves receivers that speak this
    protocol (the test suite's fake server) and documents the wire format.
    """

    STORE_PREFIX = "crl-weight-sync"

    def __init__(
        self,
        backend: Literal["gloo", "nccl"] = "gloo",
        *,
        buffer_size_bytes: int = PACKED_BUFFER_SIZE_BYTES,
        timeout_s: float = TRANSFER_TIMEOUT,
    ) -> None:
        self.backend = backend
        self.buffer_size_bytes = buffer_size_bytes
        self.timeout_s = timeout_s
        self._store: Any = None
        self._group: Any = None

    def open(self, master_address: str, master_port: int, world_size: int) -> None:
        """Host the TCPStore and join the group as rank 0."""
        import datetime

        # torch's stubs do not re-export the c10d classes (TCPStore, PrefixStore, the groups).
        dist: Any = importlib.import_module("torch.distributed")
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self._store = dist.TCPStore(
            master_address, master_port, world_size, True, timeout=timeout, wait_for_workers=True
        )
        store = dist.PrefixStore(self.STORE_PREFIX, self._store)
        if self.backend == "gloo":
            self._group = dist.ProcessGroupGloo(store, 0, world_size, timeout)
        else:
            self._group = dist.ProcessGroupNCCL(store, 0, world_size)

    def send(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Broadcast the packed chunks from rank 0."""
        import torch

        dist: Any = importlib.import_module("torch.distributed")
        if self._group is None:
            raise RuntimeError("TorchDistributedTransport.send before open")
        for chunk in pack_chunks(tensors, self.buffer_size_bytes):
            if self.backend == "nccl":
                chunk = chunk.to(torch.device("cuda", torch.cuda.current_device()))
            options = dist.BroadcastOptions()
            options.rootRank = 0
            self._group.broadcast([chunk], options).wait()

    def close(self) -> None:
        """Drop the group and the store (receivers blocked in a collective then fail)."""
        self._group = None
        self._store = None


def pack_chunks(
    tensors: Iterator[tuple[str, torch.Tensor]], buffer_size_bytes: int
) -> Iterator[torch.Tensor]:
    """Flat ``uint8`` chunks of whole tensors, each closed once it exceeds the buffer size.

    The cut rule is vLLM's packed producer's, so a consumer that sums the byte sizes of the
    announced tensors in the same order cuts the same chunks.
    """
    import torch

    parts: list[torch.Tensor] = []
    size = 0
    for _, tensor in tensors:
        flat = tensor.detach().contiguous().view(torch.uint8).view(-1)
        parts.append(flat)
        size += flat.numel()
        if size > buffer_size_bytes:
            yield torch.cat(parts)
            parts, size = [], 0
    if parts:
        yield torch.cat(parts)


def tensor_specs(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    """The manifest of a tensor stream (what the server sizes its receive buffers from)."""
    return [
        TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        for name, t in named_tensors
    ]
