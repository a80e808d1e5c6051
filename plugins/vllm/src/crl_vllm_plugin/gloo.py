"""The ``crl_gloo`` weight-transfer engine: vLLM's dense NCCL engine with gloo for NCCL.

Same HTTP routes and the same infos as vLLM's ``nccl`` backend (``init_info``: master address
and port, ``rank_offset``, ``world_size``, the packed wire parameters; ``update_info``: names,
dtype names, shapes), and the same packed stream: whole tensors flattened to bytes in manifest
order, cut into chunks once a chunk exceeds ``packed_buffer_size_bytes``, each chunk one
``uint8`` broadcast from rank 0. The group is a plain ``ProcessGroupGloo`` on the trainer's
``TCPStore`` under the prefix ``crl-weight-sync`` — the receiving end of the worker's
``crl_worker.train.weights.TorchDistributedTransport("gloo")``. Received tensors are loaded
through the model's ``load_weights`` inside vLLM's layerwise reload, as the NCCL engine does.

This runs inside vLLM's worker processes, so it imports only vLLM and torch.
"""

from __future__ import annotations

import datetime
import importlib
import logging
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from crl_vllm_plugin.packed import receive_packed

logger = logging.getLogger(__name__)

#: Prefix of the group's keys in the trainer's TCPStore (TorchDistributedTransport's).
STORE_PREFIX = "crl-weight-sync"
#: vLLM's packed chunk size (``packed_tensor.DEFAULT_PACKED_BUFFER_SIZE_BYTES``).
DEFAULT_BUFFER_SIZE_BYTES = 1024 * 1024 * 1024
#: Seconds a collective (joining, one chunk) may wait for the trainer.
TIMEOUT_S = 600.0


@dataclass(kw_only=True)
class GlooInitInfo(WeightTransferInitInfo):  # type: ignore[misc]
    """Where the trainer's TCPStore listens and this server's place in the group."""

    master_address: str
    """The trainer's address (it hosts the TCPStore)."""
    master_port: int
    """The TCPStore's port."""
    rank_offset: int
    """The rank of this server's first worker (the trainer is rank 0)."""
    world_size: int
    """Trainer plus every worker of every server."""
    packed: bool = True
    """Accepted for the NCCL backend's schema; the stream is always packed."""
    packed_buffer_size_bytes: int = DEFAULT_BUFFER_SIZE_BYTES
    """Chunk size: must be the trainer's."""
    packed_num_buffers: int = 2
    """Accepted for the NCCL backend's schema; unused (one chunk at a time)."""


@dataclass(kw_only=True)
class GlooUpdateInfo(WeightTransferUpdateInfo):  # type: ignore[misc]
    """The manifest of one update: what the stream holds, in order."""

    names: list[str]
    """Checkpoint-format parameter names."""
    dtype_names: list[str]
    """torch dtype names without ``torch.``."""
    shapes: list[list[int]]
    """Full shapes."""

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                f"{len(self.dtype_names)}, {len(self.shapes)}"
            )


class GlooWeightTransferEngine(WeightTransferEngine):  # type: ignore[misc]
    """Receives full weights over gloo and loads them with vLLM's layerwise reload."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store: Any = None
        self._group: Any = None
        self.buffer_size_bytes = DEFAULT_BUFFER_SIZE_BYTES

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        """Join the trainer's group at rank ``rank_offset`` + this worker's global rank."""
        parallel = self.parallel_config
        rank = (
            parallel.data_parallel_index * parallel.world_size
            + parallel.rank
            + init_info.rank_offset
        )
        dist: Any = importlib.import_module("torch.distributed")
        timeout = datetime.timedelta(seconds=TIMEOUT_S)
        self.shutdown()
        store = dist.TCPStore(
            init_info.master_address,
            init_info.master_port,
            init_info.world_size,
            False,
            timeout=timeout,
        )
        self._group = dist.ProcessGroupGloo(
            dist.PrefixStore(STORE_PREFIX, store), rank, init_info.world_size, timeout
        )
        self._store = store
        self.buffer_size_bytes = init_info.packed_buffer_size_bytes
        logger.info(
            "joined the trainer's gloo group at %s:%d as rank %d of %d",
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
        )

    def start_weight_update(self) -> None:
        """Begin vLLM's layerwise reload of checkpoint-format weights."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        """End the layerwise reload (the weights are processed into their served form)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive and load one update; the base class's device synchronize is skipped on the
        CPU, where ``torch.accelerator.synchronize()`` fails ("Found no NVIDIA driver") and
        gloo's broadcast has already completed."""
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        """Receive the packed chunks in order and load each chunk's tensors
        (:func:`crl_vllm_plugin.packed.receive_packed`)."""
        if self._group is None:
            raise RuntimeError("gloo weight transfer not initialized: call init first")

        def load(tensors: list[tuple[str, torch.Tensor]]) -> None:
            self.model.load_weights([(name, t.to(self.device)) for name, t in tensors])

        receive_packed(
            self._group,
            update_info.names,
            update_info.dtype_names,
            update_info.shapes,
            self.buffer_size_bytes,
            load,
        )

    def shutdown(self) -> None:
        """Leave the group (a trainer waiting in a collective then fails)."""
        self._group = None
        self._store = None


__all__ = ["GlooInitInfo", "GlooUpdateInfo", "GlooWeightTransferEngine"]
