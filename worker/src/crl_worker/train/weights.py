"""Policy weights into the inference server: LoRA adapters, NCCL broadcast, or nothing.

The trainer owns a :class:`WeightSync` and, after each optimizer step that publishes a new
policy, calls :meth:`WeightSync.push` with the new policy version; the agents then send
:meth:`WeightSync.model_name` as the ``model`` of their chat requests. ``version`` is the policy
version the server really holds (0 = the base weights it started with): a push that fails
raises :class:`~crl_worker.train.weights.WeightSyncError` (an
:class:`~crl_worker.errors.InfrastructureError`) and leaves ``version`` where it was.
:meth:`WeightSync.ensure_loaded` notices an inference pod that restarted (and so lost what it
was given) and re-pushes the current version.

Three implementations (docs/weight-sync.md has the wire details and what was checked):

- :class:`LoraAdapterSync`: vLLM's runtime LoRA API (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``):
  ``POST /v1/load_lora_adapter`` with the adapter directory the trainer saved, one new name
  per version (``<run>-v<N>``), older versions unloaded once more than ``keep`` are loaded.
- :class:`NcclWeightSync`: vLLM's native weight-transfer API (``VLLM_SERVER_DEV_MODE=1`` and
  ``--weight-transfer-config '{"backend": "nccl"}'``): HTTP drives the server (pause, start,
  update, finish, resume) while the tensors travel over a collective group in which the
  trainer is rank 0. The tensor transport is pluggable (:class:`WeightTransport`); torch is
  imported only there.
- :class:`NoSync`: generation in the trainer's own process, nothing to move.

Every server is addressed by its OpenAI ``/v1`` root (``http://host:8000/v1``); the weight
transfer routes live at the server root, beside ``/v1``. A ``peers`` list names each server
replica: every entry is resolved through DNS to all of its addresses each time the set of
servers is looked at, so one entry naming a headless Service reaches every ready pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import re
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

import httpx

from crl_worker.errors import InfrastructureError
from crl_worker.train.errors import TrainConfigError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

WeightSyncMode = Literal["nccl", "lora-adapter", "none"]
#: Seconds allowed for requests that do not move weights (pause, resume, list, unload).
CONTROL_TIMEOUT = 300.0
#: Seconds allowed for requests that scale with the model (group setup, transfer, adapter load).
TRANSFER_TIMEOUT = 1800.0
#: vLLM's packed-broadcast chunk size: both ends must cut the stream at the same places.
PACKED_BUFFER_SIZE_BYTES = 1024 * 1024 * 1024
#: First vLLM release whose NCCL init info carries `packed` (and its update info does not).
PACKED_IN_INIT_INFO_SINCE = (0, 28, 0)


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


# --------------------------------------------------------------------------------------------
# HTTP plumbing shared by both server-side implementations


def server_root(base_url: str) -> str:
    """The server root of an OpenAI ``/v1`` base URL (where vLLM's dev routes live)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _error_text(response: httpx.Response) -> str:
    """What the server said, from vLLM's and FastAPI's error shapes or the raw body."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:2000]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:  # vLLM >= 0.9: nested ErrorInfo
            return str(error["message"])
        if isinstance(error, str):  # the dev routes' {"error": "..."}
            return error
        if "message" in body:  # older vLLM: flat ErrorResponse
            return str(body["message"])
        if "detail" in body:  # FastAPI: HTTPException or request validation
            return str(body["detail"])
    return str(body)[:2000]


def peers_url(base_url: str, host: str) -> str:
    """``base_url`` with its host replaced, e.g. by the peers Service (``CRL_INFERENCE_PEERS``)."""
    parts = urlsplit(base_url)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


async def resolve_servers(urls: Sequence[str]) -> list[str]:
    """Every server behind ``urls``: each host resolved to all of its addresses.

    A headless Service name resolves to the address of every ready pod, so the trainer reaches
    each replica rather than whichever one a ClusterIP Service would pick. IPv4 addresses are
    used when there are any (a cluster's pod addresses); a literal address stays as it is.
    """
    loop = asyncio.get_running_loop()
    out: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        if host is None:
            raise ValueError(f"server URL {url!r} has no host")
        infos: list[Any] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
            except socket.gaierror:
                continue
            if infos:
                break
        if not infos:
            raise WeightSyncError(
                f"cannot resolve inference server {host!r} ({url}): no address; check that the "
                "inference Deployment has ready pods"
            )
        addresses = sorted({str(info[4][0]) for info in infos})
        for address in addresses:
            netloc = f"[{address}]" if ":" in address else address
            if port is not None:
                netloc += f":{port}"
            out.append(urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")))
    return sorted(set(out), key=out.index)


class _Servers:
    """One HTTP client for a set of vLLM servers, turning every failure into WeightSyncError."""

    def __init__(self, base_url: str, peers: Sequence[str] | None, api_key: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.peers = list(peers) if peers else None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=CONTROL_TIMEOUT)

    async def resolve(self) -> list[str]:
        """The ``/v1`` base URL of every server to push to, right now."""
        if self.peers is None:
            return [self.base_url]
        return [url.rstrip("/") for url in await resolve_servers(self.peers)]

    async def call(
        self,
        method: str,
        url: str,
        *,
        what: str,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout: float = CONTROL_TIMEOUT,
    ) -> httpx.Response:
        """One request; an unreachable server or a non-2xx answer raises WeightSyncError."""
        try:
            response = await self.client.request(
                method, url, json=json, params=params, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise WeightSyncError(
                f"{what}: the inference server at {url} did not answer ({type(exc).__name__}: "
                f"{exc}); check that it is running and reachable from the trainer",
            ) from exc
        if response.is_success:
            return response
        message = _error_text(response)
        raise WeightSyncError(
            f"{what}: the inference server answered {response.status_code} to {method} {url}: "
            f"{message}",
            status=response.status_code,
            server_message=message,
        )

    async def aclose(self) -> None:
        await self.client.aclose()


async def _on_all(
    servers: Sequence[str], action: Callable[[str], Awaitable[Any]], *, what: str
) -> list[Any]:
    """Run ``action`` on every server at once; raise one error naming every server that failed."""
    results = await asyncio.gather(*(action(s) for s in servers), return_exceptions=True)
    failures = [
        (s, r) for s, r in zip(servers, results, strict=True) if isinstance(r, BaseException)
    ]
    if not failures:
        return list(results)
    for _, exc in failures:
        if not isinstance(exc, Exception):
            raise exc  # cancellation and the like are not server failures
    if len(failures) == 1:
        raise failures[0][1]
    first = failures[0][1]
    raise WeightSyncError(
        f"{what} failed on {len(failures)} of {len(servers)} servers: "
        + "; ".join(f"{s}: {exc}" for s, exc in failures),
        status=getattr(first, "status", None),
        server_message=getattr(first, "server_message", ""),
    ) from first


# --------------------------------------------------------------------------------------------
# LoRA adapters


_ALREADY_LOADED = "already been loaded"


class LoraAdapterSync:
    """New policy versions as LoRA adapters loaded into vLLM at runtime.

    Each version gets its own name (``<run>-v<N>``): vLLM keys its prefix cache on the adapter
    name, so reusing one name for new weights could serve the old policy's cached blocks. The
    adapter directory must be readable by the server under the same path (the operator mounts
    the checkpoint volume at the same place in both pods).
    """

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
        self._servers = _Servers(base_url, peers, api_key)
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

    async def push(
        self,
        version: int,
        *,
        adapter_dir: Path | None = None,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """Load the adapter in ``adapter_dir`` as policy ``version`` on every server."""
        if adapter_dir is None or named_tensors is not None:
            raise ValueError("LoraAdapterSync pushes a saved adapter: pass adapter_dir only")
        if version < 1:
            raise ValueError(f"policy versions pushed start at 1, got {version}")
        servers = await self._servers.resolve()
        await _on_all(
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
        results = await _on_all(servers, self._ensure_one, what="checking loaded adapters")
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


# --------------------------------------------------------------------------------------------
# Full weights over a collective group (vLLM's native weight-transfer API)


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


def _version_tuple(text: str) -> tuple[int, ...]:
    numbers: list[int] = []
    for part in text.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


def _reachable_address(server: str) -> str:
    """The trainer's address on the route to ``server`` (no packet is sent: UDP connect)."""
    host = urlsplit(server).hostname or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((host, 9))
        return str(sock.getsockname()[0])


def _free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class _Member:
    """One server in the current group."""

    url: str  # its /v1 base URL
    rank_offset: int
    world_size: int
    packed_in_init: bool
    started: float | None  # process start time from /metrics, to notice a restart


_START_TIME_RE = re.compile(r"^process_start_time_seconds(?:\{[^}]*\})?\s+([0-9.eE+]+)\s*$", re.M)


class NcclWeightSync:
    """Full weights broadcast into vLLM's workers through its native weight-transfer API.

    Order of one push (every server at once, each step waiting for all of them):
    ``POST /pause?mode=keep`` (in-flight requests freeze, KV kept) → ``POST
    /start_weight_update`` → ``POST /update_weights`` with the tensor manifest while the
    transport broadcasts the tensors → ``POST /finish_weight_update`` → ``POST /resume``.
    The group (``GET /get_world_size`` of each server, then ``POST
    /init_weight_transfer_engine`` to every server while the transport hosts the rendezvous)
    is built on the first push and again after the set of servers changed or one restarted.

    A transfer that fails part-way leaves the server with mixed weights: it stays paused (no
    rollout is generated from them), ``version`` keeps the last complete version, and the next
    push rebuilds the group and re-sends everything. ``ensure_loaded`` needs the tensors to
    re-push, which only the trainer's ranks together can gather: with ``reload`` (a callable
    returning the current named tensors) it re-pushes itself; without it, it sets ``version``
    to 0 and answers True, so the trainer pushes again from all ranks.
    """

    def __init__(
        self,
        base_url: str,
        base_model: str,
        *,
        peers: Sequence[str] | None = None,
        api_key: str | None = None,
        transport: WeightTransport | None = None,
        trainer_address: str | None = None,
        manifest: Sequence[TensorSpec] | None = None,
        reload: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None,
        transfer_timeout: float = TRANSFER_TIMEOUT,
    ) -> None:
        self.version = 0
        self.base_model = base_model
        self._servers = _Servers(base_url, peers, api_key)
        self._transport = transport if transport is not None else VllmNcclTransport()
        self._trainer_address = trainer_address
        self._manifest = list(manifest) if manifest is not None else None
        self._reload = reload
        self._transfer_timeout = transfer_timeout
        self._members: list[_Member] = []

    def model_name(self) -> str:
        """The served model name: full weights replace the base model's in place."""
        return self.base_model

    async def push(
        self,
        version: int,
        *,
        adapter_dir: Path | None = None,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """Broadcast ``named_tensors`` as policy ``version`` into every server."""
        if named_tensors is None or adapter_dir is not None:
            raise ValueError("NcclWeightSync pushes full weights: pass named_tensors only")
        if version < 1:
            raise ValueError(f"policy versions pushed start at 1, got {version}")
        if self._manifest is None:
            # Without a manifest the stream has to be held in full to describe it first.
            held = list(named_tensors)
            manifest, stream = tensor_specs(held), iter(held)
        else:
            manifest, stream = self._manifest, iter(named_tensors)
        servers = await self._servers.resolve()
        if not self._members or [m.url for m in self._members] != servers:
            await self._init_group(servers)
        await self._transfer(manifest, stream)
        self.version = version
        logger.info("policy version %d broadcast to %d server(s)", version, len(servers))

    async def ensure_loaded(self) -> bool:
        """Notice a restarted or replaced server; True when it had lost the current version.

        With ``reload`` the version is pushed again here; without it ``version`` drops to 0 and
        the caller pushes (the trainer's ranks gather the weights together).
        """
        servers = await self._servers.resolve()
        # No group: never pushed (nothing to lose), or a transfer failed part-way (lost).
        members = [m.url for m in self._members]
        lost = members != servers if members else self.version > 0
        if self._members and not lost:
            starts = await _on_all(servers, self._start_time, what="checking server restarts")
            lost = any(
                m.started is not None and s is not None and s != m.started
                for m, s in zip(self._members, starts, strict=True)
            )
        if not lost:
            return False
        logger.warning("an inference server restarted or was replaced: its weights are the base")
        self._drop_group()
        behind = self.version
        self.version = 0
        if self._reload is not None and behind > 0:
            await self.push(behind, named_tensors=self._reload())
        # True either way: re-pushed, or the caller must push (all ranks gather the weights).
        return behind > 0

    async def aclose(self) -> None:
        """Leave the group and close the HTTP client."""
        self._drop_group()
        await self._servers.aclose()

    def _drop_group(self) -> None:
        self._members = []
        self._transport.close()

    async def _start_time(self, url: str) -> float | None:
        """The server process's start time from its Prometheus metrics, when it exports it."""
        try:
            response = await self._servers.call(
                "GET", f"{server_root(url)}/metrics", what="reading server metrics"
            )
        except WeightSyncError:
            return None
        match = _START_TIME_RE.search(response.text)
        return float(match.group(1)) if match else None

    async def _init_group(self, servers: list[str]) -> None:
        if self._members:
            self._drop_group()

        async def describe(url: str) -> tuple[int, bool, float | None]:
            root = server_root(url)
            size = await self._servers.call(
                "GET", f"{root}/get_world_size", what="asking the server's world size"
            )
            version = await self._servers.call(
                "GET", f"{root}/version", what="asking vLLM's version"
            )
            packed_in_init = _version_tuple(str(version.json().get("version", ""))) >= (
                PACKED_IN_INIT_INFO_SINCE
            )
            return int(size.json()["world_size"]), packed_in_init, await self._start_time(url)

        described = await _on_all(servers, describe, what="describing the inference servers")
        members: list[_Member] = []
        offset = 1  # the trainer is rank 0
        for url, (size, packed_in_init, started) in zip(servers, described, strict=True):
            members.append(_Member(url, offset, size, packed_in_init, started))
            offset += size
        world_size = offset
        address = self._trainer_address
        if address is None:
            address = await asyncio.to_thread(_reachable_address, servers[0])
        port = await asyncio.to_thread(_free_port, address)

        async def init(member: _Member) -> None:
            info: dict[str, Any] = {
                "master_address": address,
                "master_port": port,
                "rank_offset": member.rank_offset,
                "world_size": world_size,
            }
            if member.packed_in_init:
                info["packed"] = True
            await self._servers.call(
                "POST",
                f"{server_root(member.url)}/init_weight_transfer_engine",
                what="opening the weight-transfer group",
                json={"init_info": info},
                timeout=self._transfer_timeout,
            )

        logger.info(
            "opening the weight-transfer group at %s:%d: %d server(s), world size %d",
            address,
            port,
            len(members),
            world_size,
        )
        by_url = {m.url: m for m in members}
        await self._with_transport(
            lambda: self._transport.open(address, port, world_size),
            _on_all(
                servers, lambda url: init(by_url[url]), what="opening the weight-transfer group"
            ),
            what="opening the weight-transfer group",
        )
        self._members = members

    async def _transfer(self, manifest: Sequence[TensorSpec], stream: Iterator[Any]) -> None:
        by_url = {m.url: m for m in self._members}
        urls = list(by_url)

        async def post(url: str, path: str, what: str, **kwargs: Any) -> None:
            await self._servers.call("POST", f"{server_root(url)}{path}", what=what, **kwargs)

        async def each(path: str, what: str, **kwargs: Any) -> None:
            await _on_all(urls, lambda url: post(url, path, what, **kwargs), what=what)

        await each("/pause", "pausing generation", params={"mode": "keep"})
        await each(
            "/start_weight_update",
            "starting the weight update",
            json={"is_checkpoint_format": True},
        )

        async def update(url: str) -> None:
            info: dict[str, Any] = {
                "names": [s.name for s in manifest],
                "dtype_names": [s.dtype for s in manifest],
                "shapes": [list(s.shape) for s in manifest],
                "is_checkpoint_format": True,
            }
            if not by_url[url].packed_in_init:
                info["packed"] = True
            await post(
                url,
                "/update_weights",
                "updating the weights",
                json={"update_info": info},
                timeout=self._transfer_timeout,
            )

        checked = _checked_stream(stream, manifest)
        try:
            await self._with_transport(
                lambda: self._transport.send(checked),
                _on_all(urls, update, what="updating the weights"),
                what="broadcasting the weights",
            )
        except BaseException:
            # The workers may hold a mix of old and new tensors: leave them paused so nothing
            # generates from the mix, rebuild the group next time (its collective state is
            # unknown), keep `version` at the last complete push. Closing the update is best
            # effort, so that the next start is not refused as a second update in progress.
            self._drop_group()
            with contextlib.suppress(Exception):
                await each("/finish_weight_update", "closing the failed update", timeout=60)
            raise
        await each(
            "/finish_weight_update", "finishing the weight update", timeout=self._transfer_timeout
        )
        await each("/resume", "resuming generation")

    async def _with_transport(
        self, blocking: Callable[[], None], requests: Awaitable[Any], *, what: str
    ) -> None:
        """Run the transport's blocking side in a thread while HTTP drives the servers.

        Neither side can finish without the other (both join the same collective). If the
        trainer's side fails first, the group is dropped, which makes the receivers' collective
        fail instead of waiting for bytes that will not come, and the requests are abandoned.
        """
        failure: list[BaseException] = []
        done = threading.Event()

        def run() -> None:
            try:
                blocking()
            except BaseException as exc:  # handed to the event loop below
                failure.append(exc)
            finally:
                done.set()

        # A daemon thread: a collective that never completes must not keep the process alive.
        thread = threading.Thread(target=run, name="crl-weight-transport", daemon=True)
        thread.start()
        pending = asyncio.ensure_future(requests)
        try:
            while not pending.done():
                if failure:
                    self._transport.close()
                    pending.cancel()
                    await asyncio.gather(pending, return_exceptions=True)
                    raise WeightSyncError(
                        f"{what}: the trainer's side failed: {failure[0]}"
                    ) from failure[0]
                await asyncio.wait({pending}, timeout=0.05)
            pending.result()  # the servers' error, if any, wins: it says more
            while not done.is_set():
                await asyncio.sleep(0.01)
        except BaseException:
            self._transport.close()
            if not pending.done():
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            raise
        if failure:
            raise WeightSyncError(f"{what}: the trainer's side failed: {failure[0]}") from failure[
                0
            ]


def _checked_stream(
    stream: Iterator[tuple[str, torch.Tensor]], manifest: Sequence[TensorSpec]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream, checked item by item against the manifest the servers were told."""
    count = 0
    for (name, tensor), spec in zip(stream, manifest, strict=False):
        actual = (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        if actual != (spec.name, spec.dtype, spec.shape):
            raise ValueError(f"tensor #{count} is {actual}, the manifest announced {spec}")
        count += 1
        yield name, tensor
    if count != len(manifest):
        raise ValueError(
            f"the stream ended after {count} tensors; the manifest has {len(manifest)}"
        )


# --------------------------------------------------------------------------------------------
# In-process generation


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
) -> WeightSync:
    """The weight sync for ``mode`` (``launch.weight_sync_mode``, or ``none`` in-process).

    ``peers``: every replica (see :func:`peers_url`); ``manifest``: the full-weight stream's
    tensors (NCCL only; without it each push holds the whole stream to describe it first).
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
        return NcclWeightSync(base_url, base_model, peers=peers, api_key=api_key, manifest=manifest)
    raise ValueError(f"unknown weight sync mode {mode!r}")
