"""Policy weights into the inference server: LoRA adapters, NCCL broadcast, or nothing.

The trainer owns a :class:`WeightSync` and, after each optimizer step that publishes a new
policy, calls :meth:`WeightSync.push` with the new policy version as a typed update; the agents
then send :meth:`WeightSync.model_name` as the ``model`` of their chat requests. ``version`` is
the policy version the server really holds (0 = the base weights it started with): a push that
fails raises :class:`WeightSyncError` (an :class:`~crl_worker.errors.InfrastructureError`) and
leaves ``version`` where it was. :meth:`WeightSync.ensure_loaded` notices an inference pod that
restarted (and so lost what it was given) and re-pushes the current version.

Three implementations, each taking its own kind of update (docs/weight-sync.md has the wire
details and what was checked):

- :class:`LoraAdapterSync` (:mod:`.lora`) takes an :class:`AdapterUpdate`: vLLM's runtime LoRA
  API, one new adapter name per version.
- :class:`NcclWeightSync` (:mod:`.nccl`) takes a :class:`TensorUpdate`: vLLM's native
  weight-transfer API, HTTP driving the server while the tensors travel over a collective group
  through a pluggable :class:`WeightTransport` (:mod:`.transports`; torch is imported only there).
- :class:`NoSync` (:mod:`.nosync`) takes any :class:`WeightUpdate`: generation in the trainer's
  own process, nothing to move.

The interface and the updates are in :mod:`.protocol`, server resolution and the HTTP client in
:mod:`.servers`, :func:`make_weight_sync` in :mod:`.factory`.
"""

from crl_worker.train.weights.factory import AnyWeightSync, make_weight_sync
from crl_worker.train.weights.lora import LoraAdapterSync
from crl_worker.train.weights.nccl import PACKED_IN_INIT_INFO_SINCE, NcclWeightSync
from crl_worker.train.weights.nosync import NoSync
from crl_worker.train.weights.protocol import (
    CONTROL_TIMEOUT,
    TRANSFER_TIMEOUT,
    AdapterUpdate,
    TensorUpdate,
    WeightSync,
    WeightSyncError,
    WeightSyncMode,
    WeightUpdate,
    push_update,
    taking,
)
from crl_worker.train.weights.servers import peers_url, resolve_servers, server_root
from crl_worker.train.weights.transports import (
    PACKED_BUFFER_SIZE_BYTES,
    TensorSpec,
    TorchDistributedTransport,
    VllmNcclTransport,
    WeightTransport,
    pack_chunks,
    tensor_specs,
)
from crl_worker.train.weights.verify import ServedWeightsCheck, WeightsMismatch

__all__ = [
    "CONTROL_TIMEOUT",
    "PACKED_BUFFER_SIZE_BYTES",
    "PACKED_IN_INIT_INFO_SINCE",
    "TRANSFER_TIMEOUT",
    "AdapterUpdate",
    "AnyWeightSync",
    "LoraAdapterSync",
    "NcclWeightSync",
    "NoSync",
    "ServedWeightsCheck",
    "TensorSpec",
    "TensorUpdate",
    "TorchDistributedTransport",
    "VllmNcclTransport",
    "WeightSync",
    "WeightSyncError",
    "WeightSyncMode",
    "WeightTransport",
    "WeightUpdate",
    "WeightsMismatch",
    "make_weight_sync",
    "pack_chunks",
    "peers_url",
    "push_update",
    "resolve_servers",
    "server_root",
    "taking",
    "tensor_specs",
]
