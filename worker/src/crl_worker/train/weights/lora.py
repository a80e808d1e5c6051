"""New policy versions as LoRA adapters loaded into vLLM at runtime (``weightSync: lora-adapter``).

vLLM's runtime LoRA API (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): ``POST /v1/load_lora_adapter``
with the adapter directory the trainer saved, one new name per version (``<run>-v<N>``), older
versions unloaded once more than ``keep`` are loaded.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from crl_worker.train.weights.protocol import (
    TRANSFER_TIMEOUT,
    AdapterUpdate,
    WeightSyncError,
    WeightUpdate,
)
from crl_worker.train.weights.servers import Servers, on_all

logger = logging.getLogger(__name__)

_ALREADY_LOADED = "already been loaded"


class LoraAdapterSync:
    """New policy versions as LoRA adapters loaded into vLLM at runtime.

    Each version gets its own name (``<run>-v<N>``): vLLM keys its prefix cache on the adapter
    name, so reusing one name for new weights could serve the old policy's cached blocks. The
    adapter directory must be readable by the server under the same path (the operator mounts
    the checkpoint volume at the same place in both pods).
    """

    update_type: ClassVar[type[WeightUpdate]] = AdapterUpdate
    """Pushes take a saved adapter."""

    def __init__(
        self,
        base_url: str,
        base_model: str,
        run_name: str,
        *,
        keep: int,
        api_key: str | None = None,
        peers: Sequence[str] | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (the current adapter), got {keep}")
        self.version = 0
        self.base_model = base_model
        self.run_name = run_name
        self.keep = keep
        self._servers = Servers(base_url, peers, api_key)
        self._current_dir: Path | None = None
        # Adapters of this run each server holds, oldest first, as far as this trainer knows.
        self._loaded: dict[str, list[int]] = {}
        self._name_re = re.compile(rf"^{re.escape(run_name)}-v(\d+)$")

    def adapter_name(self, version: int) -> str:
        """The name policy ``version`` is loaded under."""
        return f"{self.run_name}-v{version}"

    def model_name(self) -> str:
        """The current adapter's name, or the base model before the first push."""
        return self.adapter_name(self.version) if self.version > 0 else self.base_model

    async def push(self, update: AdapterUpdate) -> None:
        """Load the adapter in ``update.adapter_dir`` as policy ``update.version`` everywhere."""
        version, adapter_dir = update.version, update.adapter_dir
        if version < 1:
            raise ValueError(f"policy versions pushed start at 1, got {version}")
        servers = await self._servers.resolve()
        await on_all(
            servers,
            lambda s: self._load(s, version, adapter_dir),
            what=f"loading adapter {self.adapter_name(version)}",
        )
        self.version = version
        self._current_dir = adapter_dir
        logger.info(
            "policy version %d loaded as adapter %s on %d server(s)",
            version,
            self.adapter_name(version),
            len(servers),
        )
        await asyncio.gather(*(self._prune(s) for s in servers))

    async def ensure_loaded(self) -> bool:
        """Reload the current adapter on every server that no longer lists it."""
        servers = await self._servers.resolve()
        results = await on_all(servers, self._ensure_one, what="checking loaded adapters")
        return any(results)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._servers.aclose()

    async def _ensure_one(self, server: str) -> bool:
        response = await self._servers.call(
            "GET", f"{server}/models", what="listing the served models"
        )
        served = {str(card.get("id")) for card in response.json().get("data", [])}
        held = sorted(v for v in map(self._version_of, served) if v is not None)
        # Adopt what the server holds (a trainer that restarted forgets its list); versions
        # newer than the current one come from steps lost with the last checkpoint and must go.
        self._loaded[server] = [v for v in held if v <= self.version]
        for stale in (v for v in held if v > self.version):
            await self._unload(server, stale)
        if self.version == 0 or self.version in held:
            await self._prune(server)
            return False
        assert self._current_dir is not None
        logger.warning(
            "inference server %s lost adapter %s (restarted?): loading it again",
            server,
            self.adapter_name(self.version),
        )
        await self._load(server, self.version, self._current_dir)
        await self._prune(server)
        return True

    def _version_of(self, name: str) -> int | None:
        match = self._name_re.match(name)
        return int(match.group(1)) if match else None

    async def _load(self, server: str, version: int, adapter_dir: Path) -> None:
        name = self.adapter_name(version)
        body = {"lora_name": name, "lora_path": str(adapter_dir)}
        url = f"{server}/load_lora_adapter"
        what = f"loading adapter {name} from {adapter_dir}"
        try:
            await self._servers.call("POST", url, what=what, json=body, timeout=TRANSFER_TIMEOUT)
        except WeightSyncError as exc:
            if exc.status == 404 and exc.server_message == "Not Found":
                # FastAPI's answer for a route that does not exist, not vLLM's adapter 404.
                raise WeightSyncError(
                    f"{exc} — the server has no runtime LoRA API: start vLLM with "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora",
                    status=exc.status,
                    server_message=exc.server_message,
                ) from exc
            if not (exc.status == 400 and _ALREADY_LOADED in exc.server_message):
                raise
            # The name is taken: a retry whose first answer was lost, or a version this run
            # published before it lost steps to a restart. The name may hold other weights:
            # replace it rather than trust it.
            logger.info("adapter %s already loaded on %s: reloading it", name, server)
            await self._unload(server, version)
            await self._servers.call("POST", url, what=what, json=body, timeout=TRANSFER_TIMEOUT)
        loaded = self._loaded.setdefault(server, [])
        if version in loaded:
            loaded.remove(version)
        loaded.append(version)

    async def _unload(self, server: str, version: int) -> None:
        name = self.adapter_name(version)
        try:
            await self._servers.call(
                "POST",
                f"{server}/unload_lora_adapter",
                what=f"unloading adapter {name}",
                json={"lora_name": name},
            )
        except WeightSyncError as exc:
            if exc.status != 404:  # 404: not loaded, which is what we wanted
                raise
        loaded = self._loaded.get(server, [])
        if version in loaded:
            loaded.remove(version)

    async def _prune(self, server: str) -> None:
        """Unload this run's adapters beyond the ``keep`` newest (never the current one)."""
        loaded = sorted(self._loaded.get(server, []))
        for version in loaded[: max(0, len(loaded) - self.keep)]:
            if version == self.version:
                continue
            try:
                await self._unload(server, version)
            except WeightSyncError as exc:
                # The new version is live; a leftover adapter only takes a CPU slot. Try later.
                logger.warning("could not unload adapter %s: %s", self.adapter_name(version), exc)
