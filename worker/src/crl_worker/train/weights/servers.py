"""The inference servers a sync pushes to: resolution of replicas and the shared HTTP client.

Every server is addressed by its OpenAI ``/v1`` root (``http://host:8000/v1``); vLLM's weight
transfer routes live at the server root, beside ``/v1``. A ``peers`` list names each server
replica: every entry is resolved through DNS to all of its addresses each time the set of
servers is looked at, so one entry naming a headless Service reaches every ready pod.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from crl_worker.train.weights.protocol import CONTROL_TIMEOUT, WeightSyncError


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


class Servers:
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
        """Close the HTTP client."""
        await self.client.aclose()


async def on_all(
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
