"""What every rollout needs, for the benchmark runner and the trainer alike: the model endpoint
and the policy of each attempt, and the sandbox of each attempt (leased from a pool gateway, or
made on this machine).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from crl_worker.errors import CrlError
from crl_worker.tasks.model import Task

if TYPE_CHECKING:
    from crl_worker.agent.client import ChatClient, Policy
    from crl_worker.pool.client import GatewayClient
    from crl_worker.sandbox.base import Sandbox

logger = logging.getLogger(__name__)

AgentKind = Literal["gold", "openai"]
"""``gold`` replays each task's gold patch; ``openai`` asks the model endpoint."""


class RolloutSetupError(CrlError):
    """The rollouts cannot be set up (no model endpoint, or one that does not answer)."""


@dataclass(frozen=True)
class Endpoint:
    """Where the OpenAI-compatible model is."""

    url: str
    model: str
    api_key: str | None = None


@dataclass
class Policies:
    """The policy of each attempt, and what to close when the run ends."""

    factory: Callable[[Task], Policy]
    model: str
    client: ChatClient | None = None

    @classmethod
    def make(cls, kind: AgentKind, endpoint: Endpoint | None) -> Policies:
        """Gold replays (one per task), or one chat client shared by every attempt."""
        if kind == "gold":
            from crl_worker.agent.gold import GoldPolicy

            return cls(factory=GoldPolicy, model="gold")
        if endpoint is None:
            raise RolloutSetupError("the openai agent needs a model endpoint")
        from crl_worker.agent.client import ChatClient

        client = ChatClient(endpoint.url, endpoint.model, api_key=endpoint.api_key)
        return cls(factory=lambda task: client, model=endpoint.model, client=client)

    async def aclose(self) -> None:
        """Close the chat client's connections."""
        if self.client is not None:
            await self.client.aclose()


@dataclass
class Sandboxes:
    """The sandbox of each attempt, and what to close when the run ends."""

    factory: Callable[[Task], Sandbox]
    gateway: GatewayClient | None = None

    @classmethod
    def make(
        cls,
        pool_url: str | None,
        config: Mapping[str, Any] | None = None,
        *,
        token: str | None = None,
    ) -> Sandboxes:
        """Leases from the pool gateway at ``pool_url`` (with its bearer ``token``, default
        ``$CRL_POOL_TOKEN``), else sandboxes made from ``config`` (default: local)."""
        if pool_url:
            from crl_worker.pool.client import GatewayClient, RemoteSandbox

            gateway = GatewayClient(pool_url, token=token)
            return cls(
                factory=lambda task: RemoteSandbox(gateway, task.instance_id), gateway=gateway
            )
        from crl_worker.sandbox.registry import create_sandbox, parse_config

        parsed = parse_config(config or {"type": "local"})
        return cls(factory=lambda task: create_sandbox(parsed, task))

    async def aclose(self) -> None:
        """Close the gateway client's connections."""
        if self.gateway is not None:
            await self.gateway.aclose()


async def wait_for_gateway(url: str, *, timeout: float = 600.0) -> None:
    """Wait until the pool gateway at ``url`` answers ``GET /healthz`` with 200.

    In a cluster the operator starts a benchmark's runner together with its pool, so the
    gateway may still be starting (its Service has no ready endpoint yet); without this wait
    the first attempts fail at once as infrastructure failures. Raises RolloutSetupError when
    it does not answer within ``timeout`` seconds.
    """
    import httpx

    deadline = time.monotonic() + timeout
    delay, last, said = 0.5, "", False
    async with httpx.AsyncClient(timeout=10.0) as client:
        while True:
            try:
                response = await client.get(url.rstrip("/") + "/healthz")
                if response.status_code == 200:
                    if said:
                        logger.info("the pool gateway at %s is up", url)
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            if time.monotonic() + delay > deadline:
                raise RolloutSetupError(
                    f"the pool gateway at {url} did not come up in {timeout:.0f} s (last: {last});"
                    " check its pod and the pool's status"
                )
            if not said:
                logger.info("waiting for the pool gateway at %s (%s)", url, last)
                said = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def check_endpoint(endpoint: Endpoint, *, timeout: float = 10.0) -> None:
    """Fail fast when nothing answers at the endpoint (``GET {url}/models``).

    Without this, a server that is not up costs every attempt the client's whole retry budget
    before it is written off as an infrastructure failure. Any HTTP answer counts as up (some
    servers have no ``/models``); only a connection that fails or times out is refused.
    """
    import httpx

    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    url = endpoint.url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise RolloutSetupError(
            f"the model server at {endpoint.url} does not answer ({exc!r}); start it, or check "
            "the URL (an OpenAI-compatible API root such as http://localhost:8000/v1)"
        ) from exc
