"""The pool gateway's HTTP server (aiohttp): leases, commands and files over a small JSON API.

Bodies are the models of :mod:`crl_worker.pool.models`; file contents are raw bytes. Errors are
:class:`~crl_worker.pool.models.ErrorBody` with a status that says who should act: 4xx the caller,
502 the sandbox failed (an infrastructure failure, never a wrong answer), 503 the pool is full
(``Retry-After`` says when to try again).

Security (see docs/security.md): every route but ``/healthz`` and ``/metrics`` needs
``Authorization: Bearer <token>`` (401 otherwise); the file API reaches only the sandbox's
working tree (400 ``bad-path`` otherwise) and only regular files; reads, bodies and command
output are bounded by :class:`Limits` (413 ``too-large``, or output cut and marked
``truncated``); a malformed request is a 400, never a 5xx.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from crl_worker.api.contract import Env
from crl_worker.errors import SandboxError
from crl_worker.pool.leases import (
    LeaseRecord,
    PoolBusy,
    PoolClosed,
    SandboxPool,
    UnknownInstance,
    UnknownLease,
)
from crl_worker.pool.models import (
    DiffResponse,
    ErrorBody,
    ErrorCode,
    Health,
    LeaseRequest,
    PrefetchRequest,
    ReleaseRequest,
    RunRequest,
)
from crl_worker.pool.serving import TaskGate
from crl_worker.sandbox.base import CommandResult, Sandbox
from crl_worker.sandbox.files import FileTooLarge, NotARegularFile, PathOutsideSandbox, check_path

logger = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)
_T = TypeVar("_T")

#: Routes open without a token: liveness probes and metrics scrapers carry none.
OPEN_PATHS = frozenset({"/healthz", "/metrics"})


@dataclass(frozen=True)
class Limits:
    """What one request may make the gateway hold (bytes)."""

    max_read: int = 64 << 20
    """Largest file a read returns (larger: 413)."""
    max_body: int = 64 << 20
    """Largest request body, a written file included (larger: 413)."""
    max_output: int = 16 << 20
    """Most output a command keeps, whatever the request asks (beyond: cut, ``truncated``)."""


POOL_KEY = web.AppKey("pool", SandboxPool)
BACKEND_KEY = web.AppKey("backend", str)
LIMITS_KEY = web.AppKey("limits", Limits)
TOKEN_KEY = web.AppKey("token", bytes)
GATE_KEY = web.AppKey("gate", TaskGate)

#: Longest a ``GET /v1/tasks`` waits for the pool's verdicts (seconds): well under the idle
#: timeout of the proxies between a client and the gateway; the client asks again.
MAX_TASKS_WAIT = 60.0


def _error(status: int, code: ErrorCode, message: str, **headers: str) -> web.Response:
    body = ErrorBody(error=code, message=message).model_dump_json()
    return web.Response(status=status, text=body, content_type="application/json", headers=headers)


def _json(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        status=status, text=model.model_dump_json(), content_type="application/json"
    )


@web.middleware
async def _auth(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Admit a request to the API only with the pool's bearer token (compared in constant
    time); the token is never logged or echoed."""
    if request.path in OPEN_PATHS:
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, offered = header.partition(" ")
    expected = request.app[TOKEN_KEY]
    given = offered.strip().encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given, expected):
        logger.warning(
            "%s %s from %s: refused, %s",
            request.method,
            request.path,
            request.remote,
            "wrong token" if header else "no token",
        )
        return _error(
            401,
            "unauthorized",
            "the pool gateway needs 'Authorization: Bearer <token>' (the pool's token: "
            f"${Env.POOL_TOKEN.value} in its clients)",
            **{"WWW-Authenticate": 'Bearer realm="crl-pool"'},
        )
    return await handler(request)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn the pool's exceptions into the API's error bodies, in one place."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except ValidationError as exc:
        return _error(400, "bad-request", f"invalid request body: {exc}")
    except UnknownLease as exc:
        return _error(404, "unknown-lease", str(exc))
    except UnknownInstance as exc:
        return _error(404, "unknown-instance", str(exc))
    except FileNotFoundError as exc:
        return _error(404, "file-not-found", str(exc))
    except IsADirectoryError as exc:
        # The caller's mistake (a path that names a directory), not the sandbox's failure.
        return _error(400, "is-a-directory", str(exc))
    except (PathOutsideSandbox, NotARegularFile) as exc:
        return _error(400, "bad-path", str(exc))
    except FileTooLarge as exc:
        return _error(413, "too-large", str(exc))
    except OSError as exc:
        # Permission denied, a name too long, a file where a directory was expected: the path
        # the caller gave cannot be used.
        return _error(400, "bad-path", f"{exc.strerror or exc}: {request.query.get('path', '')}")
    except PoolBusy as exc:
        return _error(
            503, "pool-busy", str(exc), **{"Retry-After": str(math.ceil(exc.retry_after))}
        )
    except PoolClosed as exc:
        return _error(503, "shutting-down", str(exc), **{"Retry-After": "1"})
    except SandboxError as exc:
        logger.warning("%s %s: sandbox failure: %s", request.method, request.path, exc)
        return _error(502, "sandbox-error", str(exc))


async def _body(request: web.Request, model: type[_M]) -> _M:
    raw = await request.read()
    if not raw.strip():
        return model.model_validate({})
    return model.model_validate_json(raw)


def _pool(request: web.Request) -> SandboxPool:
    return request.app[POOL_KEY]


def _record(request: web.Request) -> LeaseRecord:
    return _pool(request).lease(request.match_info["lease_id"])


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=ErrorBody(error="bad-request", message=message).model_dump_json(),
        content_type="application/json",
    )


def _path(request: web.Request) -> str:
    path = request.query.get("path", "")
    if not path:
        raise _bad_request("query parameter 'path' is required")
    check_path(path)
    return path


def _read_limit(request: web.Request) -> int:
    """The gateway's read bound, or the smaller one the request asks for (``max_bytes``)."""
    limit = request.app[LIMITS_KEY].max_read
    asked = request.query.get("max_bytes")
    if asked is None:
        return limit
    if not asked.isascii() or not asked.isdigit() or len(asked) > 19:
        raise _bad_request("query parameter 'max_bytes' must be a non-negative integer")
    return min(limit, int(asked))


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in {"1", "true", "yes", "on"}


async def healthz(request: web.Request) -> web.Response:
    """Liveness and a one-line summary of the pool."""
    pool = _pool(request)
    counts = pool.counts()
    return _json(
        Health(
            backend=request.app[BACKEND_KEY],
            tasks=len(pool.tasks),
            ready=counts["ready"],
            leased=counts["leased"],
            starting=counts["starting"] + counts["resetting"],
            max_sandboxes=pool.max_sandboxes,
        )
    )


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition."""
    return web.Response(
        body=_pool(request).metrics.render(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


async def task_set(request: web.Request) -> web.Response:
    """GET /v1/tasks[?wait=S]: which tasks the pool serves and which it quarantined; waits up
    to ``S`` seconds (at most :data:`MAX_TASKS_WAIT`) while the pool still validates."""
    asked = request.query.get("wait", "0")
    try:
        wait = float(asked)
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait) or wait < 0:
        raise _bad_request("query parameter 'wait' must be a number of seconds (0 or more)")
    return _json(await request.app[GATE_KEY].answer(min(wait, MAX_TASKS_WAIT)))


async def create_lease(request: web.Request) -> web.Response:
    """POST /v1/leases: lease a sandbox of one instance (waits while the pool is full)."""
    body = await _body(request, LeaseRequest)
    lease = await _pool(request).acquire(body.instance_id, body.timeout)
    return _json(lease, status=201)


async def release_lease(request: web.Request) -> web.Response:
    """DELETE /v1/leases/{id}: release; the body or the query says dirty/broken."""
    body = await _body(request, ReleaseRequest)
    dirty = body.dirty or _flag(request.query.get("dirty"))
    broken = body.broken or _flag(request.query.get("broken"))
    response = await _pool(request).release(
        request.match_info["lease_id"], dirty=dirty, broken=broken
    )
    return _json(response)


async def run_command(request: web.Request) -> web.Response:
    """POST /v1/leases/{id}/run: one command in the persistent session."""
    body = await _body(request, RunRequest)
    max_output = min(body.max_output, request.app[LIMITS_KEY].max_output)

    async def run(sandbox: Sandbox) -> CommandResult:
        return await sandbox.run(body.command, timeout=body.timeout, max_output=max_output)

    return _json(await _record(request).call(run))


async def read_file(request: web.Request) -> web.Response:
    """GET /v1/leases/{id}/files?path=P[&max_bytes=N]: the bytes of a regular file inside the
    working tree (413 beyond the read limit)."""
    path = _path(request)
    limit = _read_limit(request)

    async def read(sandbox: Sandbox) -> bytes:
        return await sandbox.read_confined(path, limit)

    data = await _record(request).call(read)
    return web.Response(body=data, content_type="application/octet-stream")


async def write_file(request: web.Request) -> web.Response:
    """PUT /v1/leases/{id}/files?path=P: write the body's bytes to a file inside the working
    tree (parents created; 413 beyond the body limit)."""
    path = _path(request)
    data = await request.read()

    async def write(sandbox: Sandbox) -> None:
        await sandbox.write_confined(path, data)

    await _record(request).call(write)
    return web.Response(status=204)


async def reset(request: web.Request) -> web.Response:
    """POST /v1/leases/{id}/reset: back to the base state, keeping the lease."""

    async def do_reset(sandbox: Sandbox) -> None:
        await sandbox.reset()

    await _record(request).call(do_reset)
    return web.Response(status=204)


async def diff(request: web.Request) -> web.Response:
    """GET /v1/leases/{id}/diff: the repository's changes against the base state (413 beyond
    the read limit)."""

    limit = request.app[LIMITS_KEY].max_read

    async def do_diff(sandbox: Sandbox) -> str:
        return await sandbox.diff_limited(limit)

    return _json(DiffResponse(diff=await _record(request).call(do_diff)))


async def prefetch(request: web.Request) -> web.Response:
    """POST /v1/prefetch: start sandboxes ahead for the announced instances."""
    body = await _body(request, PrefetchRequest)
    return _json(await _pool(request).prefetch(body.instance_ids))


def make_app(
    pool: SandboxPool,
    backend: str,
    *,
    token: str,
    limits: Limits | None = None,
    gate: TaskGate | None = None,
) -> web.Application:
    """The gateway's aiohttp application around a started pool, admitting requests that
    carry ``token``; ``gate`` says which tasks it serves (default: all of the pool's)."""
    if not token:
        raise ValueError("the pool gateway needs a non-empty token")
    limits = limits or Limits()
    app = web.Application(middlewares=[_auth, _errors], client_max_size=limits.max_body)
    app[POOL_KEY] = pool
    app[BACKEND_KEY] = backend
    app[LIMITS_KEY] = limits
    app[TOKEN_KEY] = token.encode("utf-8")
    app[GATE_KEY] = gate or TaskGate(pool)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/tasks", task_set)
    app.router.add_post("/v1/leases", create_lease)
    app.router.add_delete("/v1/leases/{lease_id}", release_lease)
    app.router.add_post("/v1/leases/{lease_id}/run", run_command)
    app.router.add_get("/v1/leases/{lease_id}/files", read_file)
    app.router.add_put("/v1/leases/{lease_id}/files", write_file)
    app.router.add_post("/v1/leases/{lease_id}/reset", reset)
    app.router.add_get("/v1/leases/{lease_id}/diff", diff)
    app.router.add_post("/v1/prefetch", prefetch)
    return app


def make_metrics_app(pool: SandboxPool, backend: str) -> web.Application:
    """``/metrics`` and ``/healthz`` alone (no token), for a port of their own."""
    app = web.Application(client_max_size=1 << 10)
    app[POOL_KEY] = pool
    app[BACKEND_KEY] = backend
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app
