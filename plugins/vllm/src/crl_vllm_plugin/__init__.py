"""CodeRepairRL's vLLM plugin: registers the ``crl_gloo`` weight-transfer backend.

vLLM calls :func:`register` in each of its processes (API server, engine core, workers) through
the ``vllm.general_plugins`` entry point; a server started with ``--weight-transfer-config
'{"backend": "crl_gloo"}'`` then builds :class:`crl_vllm_plugin.gloo.GlooWeightTransferEngine`
in its workers. Nothing is imported from vLLM until then.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

#: The backend name for ``--weight-transfer-config``.
BACKEND = "crl_gloo"


def register() -> None:
    """Register the backend with vLLM's weight-transfer factory (lazily: the engine's module is
    imported when a worker builds it). Called once per process; a second call is a no-op."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND in WeightTransferEngineFactory._registry:
        return
    WeightTransferEngineFactory.register_engine(
        BACKEND, "crl_vllm_plugin.gloo", "GlooWeightTransferEngine"
    )
    logger.debug("registered the %s weight-transfer backend", BACKEND)


__all__ = ["BACKEND", "register"]
