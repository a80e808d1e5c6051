"""The weight sync of a weight-sync mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias, overload

from crl_worker.train.errors import TrainConfigError
from crl_worker.train.weights.lora import LoraAdapterSync
from crl_worker.train.weights.nccl import NcclWeightSync
from crl_worker.train.weights.nosync import NoSync
from crl_worker.train.weights.protocol import WeightSyncMode
from crl_worker.train.weights.transports import TensorSpec, TorchDistributedTransport

#: What :func:`make_weight_sync` builds when the mode is known only at run time: pushing to it
#: needs the kind checked (:func:`~crl_worker.train.weights.push_update`), as no one update
#: type fits all three.
AnyWeightSync: TypeAlias = LoraAdapterSync | NcclWeightSync | NoSync


@overload
def make_weight_sync(
    mode: Literal["lora-adapter"],
    base_url: str | None,
    base_model: str,
    run_name: str,
    keep: int,
    api_key: str | None = None,
    *,
    peers: Sequence[str] | None = None,
    manifest: Sequence[TensorSpec] | None = None,
    verify_every: int = 0,
    transport: Literal["vllm", "gloo"] = "vllm",
) -> LoraAdapterSync: ...


@overload
def make_weight_sync(
    mode: Literal["nccl"],
    base_url: str | None,
    base_model: str,
    run_name: str,
    keep: int,
    api_key: str | None = None,
    *,
    peers: Sequence[str] | None = None,
    manifest: Sequence[TensorSpec] | None = None,
    verify_every: int = 0,
    transport: Literal["vllm", "gloo"] = "vllm",
) -> NcclWeightSync: ...


@overload
def make_weight_sync(
    mode: Literal["none"],
    base_url: str | None,
    base_model: str,
    run_name: str,
    keep: int,
    api_key: str | None = None,
    *,
    peers: Sequence[str] | None = None,
    manifest: Sequence[TensorSpec] | None = None,
    verify_every: int = 0,
    transport: Literal["vllm", "gloo"] = "vllm",
) -> NoSync: ...


@overload
def make_weight_sync(
    mode: WeightSyncMode,
    base_url: str | None,
    base_model: str,
    run_name: str,
    keep: int,
    api_key: str | None = None,
    *,
    peers: Sequence[str] | None = None,
    manifest: Sequence[TensorSpec] | None = None,
    verify_every: int = 0,
    transport: Literal["vllm", "gloo"] = "vllm",
) -> AnyWeightSync: ...


def make_weight_sync(
    mode: WeightSyncMode,
    base_url: str | None,
    base_model: str,
    run_name: str,
    keep: int,
    api_key: str | None = None,
    *,
    peers: Sequence[str] | None = None,
    manifest: Sequence[TensorSpec] | None = None,
    verify_every: int = 0,
    transport: Literal["vllm", "gloo"] = "vllm",
) -> AnyWeightSync:
    """The weight sync for ``mode`` (``launch.weight_sync_mode``, or ``none`` in-process).

    ``peers``: every replica (see :func:`~crl_worker.train.weights.servers.peers_url`); ``manifest``: the full-weight stream's
    tensors (NCCL only; without it each push holds the whole stream to describe it first);
    ``verify_every``: check the served weights every that many full-weight pushes (0: never);
    ``transport``: vLLM's PyNccl group, or gloo (the project's vLLM plugin, CPU servers).
    """
    if mode == "none":
        return NoSync(base_model)
    if base_url is None:
        raise TrainConfigError(
            "spec.inference", f"weightSync {mode} needs an inference server URL; none was given"
        )
    if mode == "lora-adapter":
        return LoraAdapterSync(
            base_url, base_model, run_name, keep=keep, api_key=api_key, peers=peers
        )
    if mode == "nccl":
        return NcclWeightSync(
            base_url,
            base_model,
            peers=peers,
            api_key=api_key,
            manifest=manifest,
            verify_every=verify_every,
            transport=TorchDistributedTransport("gloo") if transport == "gloo" else None,
        )
    raise ValueError(f"unknown weight sync mode {mode!r}")
