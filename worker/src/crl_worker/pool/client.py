"""Client of the pool gateway, and :class:`RemoteSandbox`: the Sandbox protocol over a pool.

Agent and evaluation code take a :class:`~crl_worker.sandbox.base.Sandbox`; handing them a
``RemoteSandbox`` runs them unchanged against a pool in a cluster::

    async with GatewayClient("http://pool-gateway:8080") as gateway:
        async with RemoteSandbox(gateway, "sympy__sympy-20590") as sandbox:
            result = await sandbox.run("pytest -x")

Every failure of the gateway or of the sandbox behind it surfaces as
:class:`~crl_worker.errors.SandboxError` (an infrastructure failure), except a missing file
(:class:`FileNotFoundError`) or a path that names a directory (:class:`IsADirectoryError`), as
for a local sandbox.
"""

from __future__ import annotations

import logging
import os
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from crl_worker.api.contract import Env
from crl_worker.errors import SandboxError
from crl_worker.pool.models import (
    DiffResponse,
    ErrorBody,
    Health,
    Lease,
    LeaseRequest,
    PrefetchRequest,
    PrefetchResponse,
    ReleaseRequest,
    ReleaseResponse,
    RunRequest,
    TaskSet,
)
from crl_worker.sandbox.base import DEFAULT_MAX_OUTPUT, CommandResult, Sandbox
from crl_worker.sandbox.files import FileTooLarge, PathOutsideSandbox

logger = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)
_JSON = {"Content-Type": "application/json"}

#: Seconds added to a command's own timeout before the HTTP request gives up: the gateway
#: needs a moment to interrupt the command and answer.
TIMEOUT_MARGIN = 60.0


class GatewayError(SandboxError):
    """The gateway answered with an error (or not at all)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class PoolBusyError(GatewayError):
    """The pool stayed full until the lease request's timeout; ``retry_after`` says when to retry."""


class _Bearer(httpx.Auth):
    """Adds the pool's token to each request; its repr names no token."""

    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx.Request) -> Any:
        """Set ``Authorization`` on the request."""
        request.headers["Authorization"] = self._header
        yield request

    def __repr__(self) -> str:
        return "_Bearer(<token>)"


class GatewayClient:
    """Typed calls to one pool gateway over a shared connection pool.

    ``token`` is the gateway's bearer token; ``$CRL_POOL_TOKEN`` when not given.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        client: httpx.AsyncClient | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._own = client is None
        token = token if token is not None else os.environ.get(Env.POOL_TOKEN, "").strip()
        self._auth = _Bearer(token) if token else None
        self._client = client or httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(None, connect=connect_timeout),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
        )

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections (only when this client created them)."""
        if self._own:
            await self._client.aclose()

    async def _request(
        self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        try:
            response = await self._client.request(
                method,
                path,
                timeout=httpx.Timeout(timeout, connect=10.0),
                auth=self._auth or httpx.USE_CLIENT_DEFAULT,
                **kwargs,
            )
        except httpx.HTTPError as exc:
            raise GatewayError(
                f"the pool gateway at {self.base_url} did not answer {method} {path}: {exc!r}"
            ) from exc
        if response.status_code >= 400:
            raise _error(response, method, path)
        return response

    async def _model(self, response: httpx.Response, model: type[_M]) -> _M:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise GatewayError(f"the pool gateway sent an unexpected body: {exc}") from exc

    async def health(self) -> Health:
        """GET /healthz."""
        return await self._model(await self._request("GET", "/healthz", timeout=30), Health)

    async def metrics(self) -> str:
        """GET /metrics (Prometheus text)."""
        return (await self._request("GET", "/metrics", timeout=30)).text

    async def tasks(self, *, wait: float = 0.0) -> TaskSet:
        """GET /v1/tasks: which tasks the pool serves and which it quarantined; while the pool
        validates, the gateway waits up to ``wait`` seconds (it caps them) for the verdicts."""
        response = await self._request(
            "GET", "/v1/tasks", params={"wait": wait}, timeout=wait + TIMEOUT_MARGIN
        )
        return await self._model(response, TaskSet)

    async def lease(self, instance_id: str, *, timeout: float | None = None) -> Lease:
        """POST /v1/leases; waits while the pool is full, up to ``timeout`` (gateway default)."""
        body = LeaseRequest(instance_id=instance_id, timeout=timeout)
        response = await self._request(
            "POST", "/v1/leases", content=body.model_dump_json(), headers=_JSON, timeout=None
        )
        return await self._model(response, Lease)

    async def release(
        self, lease_id: str, *, dirty: bool = False, broken: bool = False
    ) -> ReleaseResponse:
        """DELETE /v1/leases/{id}."""
        body = ReleaseRequest(dirty=dirty, broken=broken)
        response = await self._request(
            "DELETE",
            f"/v1/leases/{lease_id}",
            content=body.model_dump_json(),
            headers=_JSON,
            timeout=300,
        )
        return await self._model(response, ReleaseResponse)

    async def run(
        self,
        lease_id: str,
        command: str,
        *,
        timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> CommandResult:
        """POST /v1/leases/{id}/run."""
        body = RunRequest(command=command, timeout=timeout, max_output=max_output)
        response = await self._request(
            "POST",
            f"/v1/leases/{lease_id}/run",
            content=body.model_dump_json(),
            headers=_JSON,
            timeout=None if timeout is None else timeout + TIMEOUT_MARGIN,
        )
        return await self._model(response, CommandResult)

    async def read_file(self, lease_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """GET /v1/leases/{id}/files?path=P (at most ``max_bytes``: the gateway answers 413,
        raised as :class:`~crl_worker.sandbox.files.FileTooLarge`, for a larger file)."""
        params: dict[str, str | int] = {"path": path}
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        response = await self._request(
            "GET", f"/v1/leases/{lease_id}/files", params=params, timeout=600
        )
        return response.content

    async def write_file(self, lease_id: str, path: str, data: bytes) -> None:
        """PUT /v1/leases/{id}/files?path=P."""
        await self._request(
            "PUT",
            f"/v1/leases/{lease_id}/files",
            params={"path": path},
            content=data,
            headers={"Content-Type": "application/octet-stream"},
            timeout=600,
        )

    async def reset(self, lease_id: str) -> None:
        """POST /v1/leases/{id}/reset."""
        await self._request("POST", f"/v1/leases/{lease_id}/reset", timeout=600)

    async def diff(self, lease_id: str) -> str:
        """GET /v1/leases/{id}/diff."""
        response = await self._request("GET", f"/v1/leases/{lease_id}/diff", timeout=300)
        return (await self._model(response, DiffResponse)).diff

    async def prefetch(self, instance_ids: list[str]) -> PrefetchResponse:
        """POST /v1/prefetch."""
        body = PrefetchRequest(instance_ids=instance_ids)
        response = await self._request(
            "POST", "/v1/prefetch", content=body.model_dump_json(), headers=_JSON, timeout=60
        )
        return await self._model(response, PrefetchResponse)


class RemoteSandbox(Sandbox):
    """A sandbox leased from a pool gateway; ``start`` leases, ``close`` releases.

    Call :meth:`mark_dirty` when the rollout changed the sandbox beyond what a reset undoes; a
    sandbox failure seen through this object marks it broken. Either way the gateway replaces
    the sandbox instead of reusing it.
    """

    def __init__(
        self, gateway: GatewayClient | str, instance_id: str, *, lease_timeout: float | None = None
    ) -> None:
        self._gateway = gateway if isinstance(gateway, GatewayClient) else GatewayClient(gateway)
        self._own_gateway = not isinstance(gateway, GatewayClient)
        self.instance_id = instance_id
        self.lease_timeout = lease_timeout
        self.lease: Lease | None = None
        self.workdir = ""
        self.dirty = False
        self._broken = False
        self._closed = False

    @property
    def alive(self) -> bool:
        """Leased, and no sandbox failure seen."""
        return self.lease is not None and not self._broken and not self._closed

    async def start(self) -> None:
        """Lease a sandbox of the instance."""
        if self.lease is not None:
            return
        self.lease = await self._gateway.lease(self.instance_id, timeout=self.lease_timeout)
        self.workdir = self.lease.workdir
        self._closed = False

    def _id(self) -> str:
        if self.lease is None or self._closed:
            raise SandboxError(
                f"the sandbox of {self.instance_id} is not leased: call start() first"
            )
        return self.lease.lease_id

    async def _guard(self, coro: Any) -> Any:
        try:
            return await coro
        except GatewayError as exc:
            # A failed sandbox, a lost lease or a gateway that does not answer: the rollout
            # cannot go on in this sandbox. A rejected request (4xx) leaves it usable.
            if exc.status is None or exc.status >= 500 or exc.code == "unknown-lease":
                self._broken = True
            raise

    async def run(
        self, command: str, *, timeout: float | None = None, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> CommandResult:
        """Run ``command`` in the leased sandbox's persistent session."""
        result: CommandResult = await self._guard(
            self._gateway.run(self._id(), command, timeout=timeout, max_output=max_output)
        )
        return result

    async def read_file(self, path: str) -> bytes:
        """Return the bytes of ``path`` in the sandbox."""
        data: bytes = await self._guard(self._gateway.read_file(self._id(), path))
        return data

    async def read_file_limited(self, path: str, limit: int) -> bytes:
        """At most ``limit`` bytes of ``path``; the gateway refuses a larger file."""
        data: bytes = await self._guard(self._gateway.read_file(self._id(), path, max_bytes=limit))
        return data

    async def read_confined(self, path: str, limit: int) -> bytes:
        """The gateway confines every read to the working tree: :meth:`read_file_limited`."""
        return await self.read_file_limited(path, limit)

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in the sandbox."""
        await self._guard(self._gateway.write_file(self._id(), path, data))

    async def write_confined(self, path: str, data: bytes) -> None:
        """The gateway confines every write to the working tree: :meth:`write_file`."""
        await self.write_file(path, data)

    async def reset(self) -> None:
        """Reset the leased sandbox to its base state (the lease is kept)."""
        await self._guard(self._gateway.reset(self._id()))

    async def diff(self) -> str:
        """The repository's changes against the base state."""
        text: str = await self._guard(self._gateway.diff(self._id()))
        return text

    async def close(self) -> None:
        """Release the lease (dirty or broken when so marked). Safe to call twice."""
        if self._closed or self.lease is None:
            self._closed = True
            if self._own_gateway:
                await self._gateway.aclose()
            return
        self._closed = True
        try:
            await self._gateway.release(self.lease.lease_id, dirty=self.dirty, broken=self._broken)
        except GatewayError as exc:
            # The lease is gone either way (the gateway takes back idle leases); nothing to undo.
            logger.warning("releasing %s failed: %s", self.lease.lease_id, exc)
        finally:
            if self._own_gateway:
                await self._gateway.aclose()


def _error(response: httpx.Response, method: str, path: str) -> Exception:
    try:
        body = ErrorBody.model_validate_json(response.content)
        code, message = body.error, body.message
    except ValidationError:
        code, message = None, response.text[:2000]
    if code == "file-not-found":
        return FileNotFoundError(message)
    if code == "is-a-directory":
        return IsADirectoryError(message)
    if response.status_code == 413 and path.endswith("/files"):
        return FileTooLarge(path, -1, message=f"pool gateway: {message}")
    if code == "bad-path":
        return PathOutsideSandbox(message)
    retry = response.headers.get("Retry-After")
    retry_after = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
    text = f"pool gateway: {method} {path} answered {response.status_code} ({code}): {message}"
    if code == "pool-busy":
        return PoolBusyError(text, status=response.status_code, code=code, retry_after=retry_after)
    return GatewayError(text, status=response.status_code, code=code, retry_after=retry_after)
