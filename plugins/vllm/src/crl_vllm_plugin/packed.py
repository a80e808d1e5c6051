"""The receiving end of vLLM's packed weight stream, over a torch.distributed process group.

The stream (vLLM's ``packed_tensor`` producer, and the worker's
``crl_worker.train.weights.TorchDistributedTransport``): whole tensors flattened to bytes in
manifest order, cut into a chunk once the chunk exceeds ``buffer_size_bytes`` (the tensor that
crossed the limit included), each chunk one ``uint8`` broadcast from rank 0.

One piece of code for both receivers: the ``crl_gloo`` engine (:mod:`crl_vllm_plugin.gloo`) and
the test suite's fake vLLM server (tests/fixtures/fake_vllm.py), so the fake cannot cut or read
the stream differently from the plugin it stands in for. Imports only torch (the fake runs
where vLLM is not installed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Entry:
    """One tensor of the stream."""

    name: str
    """Checkpoint-format parameter name."""
    dtype: torch.dtype
    """Its dtype."""
    shape: tuple[int, ...]
    """Its full shape."""

    @property
    def nbytes(self) -> int:
        """Bytes it takes in a chunk."""
        return math.prod(self.shape) * self.dtype.itemsize


def chunks(
    names: list[str], dtype_names: list[str], shapes: list[list[int]], buffer_size_bytes: int
) -> Iterator[list[Entry]]:
    """The manifest cut into chunks where the producer cuts it (the module docs)."""
    pending: list[Entry] = []
    size = 0
    for name, dtype_name, shape in zip(names, dtype_names, shapes, strict=True):
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{name}: {dtype_name!r} is not a torch dtype name")
        entry = Entry(name, dtype, tuple(int(n) for n in shape))
        pending.append(entry)
        size += entry.nbytes
        if size > buffer_size_bytes:
            yield pending
            pending, size = [], 0
    if pending:
        yield pending


def receive_packed(
    group: Any,
    names: list[str],
    dtype_names: list[str],
    shapes: list[list[int]],
    buffer_size_bytes: int,
    load: Callable[[list[tuple[str, torch.Tensor]]], None],
) -> None:
    """Receive one update's chunks from rank 0 of ``group`` (a ``ProcessGroupGloo``), in order,
    and hand each chunk's tensors to ``load`` as ``(name, tensor)`` pairs: views into that
    chunk's buffer (a copy where a tensor's offset in it is not a multiple of its element size,
    after a tensor of a narrower dtype and an odd size)."""
    dist: Any = torch.distributed
    for chunk in chunks(names, dtype_names, shapes, buffer_size_bytes):
        buffer = torch.empty(sum(entry.nbytes for entry in chunk), dtype=torch.uint8)
        options = dist.BroadcastOptions()
        options.rootRank = 0
        group.broadcast([buffer], options).wait()
        tensors: list[tuple[str, torch.Tensor]] = []
        offset = 0
        for entry in chunk:
            part = buffer[offset : offset + entry.nbytes]
            if offset % entry.dtype.itemsize:
                part = part.clone()  # a view as a wider dtype must start at a multiple of it
            tensors.append((entry.name, part.view(entry.dtype).view(entry.shape)))
            offset += entry.nbytes
        load(tensors)


__all__ = ["Entry", "chunks", "receive_packed"]
