"""Full weights into vLLM's workers through its native weight-transfer API (``weightSync: nccl``).

``VLLM_SERVER_DEV_MODE=1`` and ``--weight-transfer-config '{"backend": "nccl"}'``: HTTP drives
the server (pause, start, update, finish, resume) while the tensors travel over a collective
group in which the trainer is rank 0, through a pluggable :class:`WeightTransport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from crl_worker.train.weights.protocol import (
    TRANSFER_TIMEOUT,
    TensorUpdate,
    WeightSyncError,
    WeightUpdate,
)
from crl_worker.train.weights.servers import Servers, on_all, server_root
from crl_worker.train.weights.transports import (
    TensorSpec,
    VllmNcclTransport,
    WeightTransport,
    tensor_specs,
)
from crl_worker.train.weights.verify import ServedWeightsCheck, tensor_digest

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: First vLLM release whose NCCL init info carries `packed` (and its update info does not).
PACKED_IN_INIT_INFO_SINCE = (0, 28, 0)


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
    transport broadcasts the tensors → ``POST /finish_weight_update`` → ``POST
    /reset_prefix_cache?reset_running_requests=true`` (no KV of the old weights survives) →
    ``POST /resume``.
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

    update_type: ClassVar[type[WeightUpdate]] = TensorUpdate
    """Pushes take the full tensor stream."""

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
        verify_every: int = 0,
    ) -> None:
        """``verify_every``: check the served weights with vLLM's ``/weight_checker`` on the
        first push and every ``verify_every``-th after it (0: never); see
        :mod:`crl_worker.train.weights.verify`."""
        self.version = 0
        self.base_model = base_model
        self._servers = Servers(base_url, peers, api_key)
        self._transport = transport if transport is not None else VllmNcclTransport()
        self._trainer_address = trainer_address
        self._manifest = list(manifest) if manifest is not None else None
        self._reload = reload
        self._transfer_timeout = transfer_timeout
        self._members: list[_Member] = []
        self._verify_every = verify_every
        self._pushes = 0
        self.verified = ServedWeightsCheck()
        """The served-weights check: its digests at the last check that passed."""

    def model_name(self) -> str:
        """The served model name: full weights replace the base model's in place."""
        return self.base_model

    async def push(self, update: TensorUpdate) -> None:
        """Broadcast ``update.named_tensors`` as policy ``update.version`` into every server."""
        version, named_tensors = update.version, update.named_tensors
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
        self._pushes += 1
        verify = self._verify_every > 0 and (self._pushes - 1) % self._verify_every == 0
        await self._transfer(version, manifest, stream, verify=verify)
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
            starts = await on_all(servers, self._start_time, what="checking server restarts")
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
            await self.push(TensorUpdate(behind, self._reload()))
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

        described = await on_all(servers, describe, what="describing the inference servers")
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
            on_all(
                servers, lambda url: init(by_url[url]), what="opening the weight-transfer group"
            ),
            what="opening the weight-transfer group",
        )
        self._members = members

    async def _transfer(
        self,
        version: int,
        manifest: Sequence[TensorSpec],
        stream: Iterator[Any],
        *,
        verify: bool = False,
    ) -> None:
        by_url = {m.url: m for m in self._members}
        urls = list(by_url)

        async def post(url: str, path: str, what: str, **kwargs: Any) -> None:
            await self._servers.call("POST", f"{server_root(url)}{path}", what=what, **kwargs)

        async def each(path: str, what: str, **kwargs: Any) -> None:
            await on_all(urls, lambda url: post(url, path, what, **kwargs), what=what)

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
        digests: dict[str, str] = {}
        if verify:
            checked = _digested(checked, digests)
        try:
            await self._with_transport(
                lambda: self._transport.send(checked),
                on_all(urls, update, what="updating the weights"),
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
        # The version names the weights on the server (vLLM >= 0.32: GET /weight_info; older
        # servers ignore the body).
        await each(
            "/finish_weight_update",
            "finishing the weight update",
            json={"weight_version": str(version)},
            timeout=self._transfer_timeout,
        )
        # Still paused: drop every KV block computed under the old weights before anything is
        # scheduled again (see :func:`_reset_prefix_cache`). A server that cannot is left
        # paused, like a failed transfer, and the push fails.
        await on_all(urls, self._reset_prefix_cache, what="resetting the prefix cache")
        if verify:
            # Still paused: weights that are not the trainer's generate nothing.
            await self._verify(version, urls, digests)
        await each("/resume", "resuming generation")

    async def _verify(self, version: int, urls: list[str], digests: dict[str, str]) -> None:
        """Compare the servers' ``/weight_checker`` digests with what was sent (raises
        :class:`~crl_worker.train.weights.verify.WeightsMismatch`)."""

        async def served(url: str) -> tuple[dict[str, str], str | None]:
            root = server_root(url)
            sums = await self._servers.call(
                "POST",
                f"{root}/weight_checker",
                what="reading the served weights' checksums",
                json={"action": "checksum"},
                timeout=self._transfer_timeout,
            )
            try:
                info = await self._servers.call(
                    "GET", f"{root}/weight_info", what="reading the served weight version"
                )
                reported = info.json().get("weight_version")
            except WeightSyncError:
                reported = None  # a vLLM without /weight_info
            return dict(sums.json()["checksums"]), None if reported is None else str(reported)

        answers = await on_all(urls, served, what="checking the served weights")
        self.verified.check(
            version,
            digests,
            {u: a[0] for u, a in zip(urls, answers, strict=True)},
            {u: a[1] for u, a in zip(urls, answers, strict=True)},
        )
        logger.info(
            "version %d: the served weights are the trainer's (%d tensors compared, %d not "
            "comparable)",
            version,
            self.verified.checked,
            len(self.verified.skipped),
        )

    async def _reset_prefix_cache(self, url: str) -> None:
        """``POST /reset_prefix_cache?reset_running_requests=true`` on a paused server.

        vLLM keys its prefix cache on token ids (and ``cache_salt``), not on weights, so after
        a full-weight update every GRPO group's shared prompt would otherwise be served from KV
        computed under the previous version. With ``reset_running_requests`` the scheduler
        first preempts the requests that ``/pause?mode=keep`` froze (their blocks freed; they
        recompute prompt and generated tokens under the new weights once resumed), then drops
        every block hash; without it the reset refuses while any request holds blocks, which
        with overlapped rollouts is always. Doing it before ``/resume`` leaves no window in
        which a request can meet an old block. vLLM answers ``{"success": bool}``.
        """
        response = await self._servers.call(
            "POST",
            f"{server_root(url)}/reset_prefix_cache",
            what="resetting the prefix cache",
            params={"reset_running_requests": "true"},
            timeout=self._transfer_timeout,
        )
        try:
            body = response.json()
        except ValueError:  # older vLLMs answer a bare 200
            body = {}
        success = body.get("success", True) if isinstance(body, dict) else True
        if success is not True:
            raise WeightSyncError(
                f"resetting the prefix cache: the inference server at {url} answered "
                f"{response.text[:200]}: KV computed under the old weights could still be "
                "served, so generation stays paused"
            )

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


def _digested(
    stream: Iterator[tuple[str, torch.Tensor]], digests: dict[str, str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream, recording each tensor's digest in ``digests`` as it passes."""
    for name, tensor in stream:
        digests[name] = tensor_digest(tensor)
        yield name, tensor


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
