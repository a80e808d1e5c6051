"""The pool gateway as a real separate process with the local backend over a real git repository.

Each test starts ``python -m crl_worker.pool`` on a free port and talks HTTP to it, through the
shared client (``GatewayClient``/``RemoteSandbox``) or raw httpx where the wire itself is the
point (status codes, headers, metrics text).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from crl_worker.pool import PoolBusyError
from crl_worker.tasks.model import Task

from .fixtures.gateway import SECOND, TOKEN, GatewayProcess, gateway_client

#: Headers of a raw request the gateway admits.
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _wait_for(predicate: Callable[[], Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.1)


# --- leases, commands, files ------------------------------------------------------------------


async def test_lease_run_files_and_warm_reuse(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "2", "--warm", "1", "--max-uses", "5")
    instance = tasks[0].instance_id
    blob = bytes(range(256)) * 64 + b"\x00\r\n\xff tail without newline"
    async with gateway_client(gateway) as gw:
        lease = await gw.lease(instance)
        assert lease.source == "cold"
        assert lease.uses == 0
        result = await gw.run(lease.lease_id, "echo hello; echo oops >&2; (exit 3)")
        assert result.exit_code == 3
        assert result.output == "hello\noops\n"
        await gw.write_file(lease.lease_id, "data/blob.bin", blob)
        assert await gw.read_file(lease.lease_id, "data/blob.bin") == blob
        listed = await gw.run(lease.lease_id, "wc -c < data/blob.bin")
        assert listed.output.strip() == str(len(blob))
        await gw.run(
            lease.lease_id, "echo '# edited' >> src/romankit/__init__.py; export LEFT=over"
        )
        assert "src/romankit/__init__.py" in await gw.diff(lease.lease_id)

        released = await gw.release(lease.lease_id)
        assert released.action == "reuse"
        again = await gw.lease(instance)
        assert again.source == "warm"
        assert again.sandbox_id == lease.sandbox_id
        assert again.uses == 1
        # Back at the base state: clean tree, the written file gone, a fresh shell.
        status = await gw.run(
            again.lease_id, "git status --porcelain; ls data 2>&1; echo ${LEFT:-unset}"
        )
        assert status.output.splitlines()[-1] == "unset"
        assert "No such file" in status.output
        assert "romankit" not in status.output
        assert await gw.diff(again.lease_id) == ""
        await gw.release(again.lease_id)

    assert gateway.metric("crl_pool_warm_hits_total") == 1
    assert gateway.metric("crl_pool_cold_starts_total") == 1
    assert gateway.metric("crl_pool_leases_total", source="warm") == 1
    assert gateway.metric("crl_pool_acquire_seconds_count", source="cold") == 1
    await _wait_for(lambda: gateway.metric("crl_pool_sandboxes", state="ready") == 1)
    assert gateway.metric("crl_pool_sandboxes", state="leased") == 0


async def test_dirty_release_replaces_the_sandbox(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "2", "--warm", "1")
    instance = tasks[0].instance_id
    async with gateway_client(gateway) as gw:
        first = await gw.lease(instance)
        response = await gw.release(first.lease_id, dirty=True)
        assert (response.action, response.reason) == ("replace", "dirty")
        second = await gw.lease(instance)
        assert second.sandbox_id != first.sandbox_id
        assert second.uses == 0
        # The query string says it too (DELETE bodies are optional).
        raw = httpx.delete(
            f"{gateway.url}/v1/leases/{second.lease_id}?broken=true", headers=AUTH, timeout=30
        )
        assert raw.status_code == 200
        assert raw.json() == {"action": "replace", "reason": "broken"}
    assert gateway.metric("crl_pool_sandboxes_replaced_total", reason="dirty") == 1
    assert gateway.metric("crl_pool_sandboxes_replaced_total", reason="broken") == 1
    assert gateway.metric("crl_pool_sandboxes_started_total", reason="replace") >= 1


async def test_max_uses_recreates_the_sandbox(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "2", "--warm", "1", "--max-uses", "2")
    instance = tasks[0].instance_id
    async with gateway_client(gateway) as gw:
        first = await gw.lease(instance)
        assert (await gw.release(first.lease_id)).action == "reuse"
        second = await gw.lease(instance)
        assert second.sandbox_id == first.sandbox_id
        response = await gw.release(second.lease_id)
        assert (response.action, response.reason) == ("replace", "max-uses")
        third = await gw.lease(instance)
        assert third.sandbox_id != first.sandbox_id
        assert third.uses == 0
        await gw.release(third.lease_id)
    assert gateway.metric("crl_pool_sandboxes_replaced_total", reason="max-uses") == 1


async def test_no_reuse_closes_after_each_rollout(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "1", "--warm", "0", "--no-reuse")
    async with gateway_client(gateway) as gw:
        lease = await gw.lease(tasks[0].instance_id)
        response = await gw.release(lease.lease_id)
        assert (response.action, response.reason) == ("close", "reuse-disabled")
    await _wait_for(
        lambda: (
            sum(
                gateway.metric("crl_pool_sandboxes", state=s)
                for s in ("ready", "starting", "leased", "resetting")
            )
            == 0
        )
    )


async def test_a_warm_sandbox_whose_shell_died_is_replaced_not_leased(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "2", "--warm", "1")
    async with gateway_client(gateway) as gw:
        lease = await gw.lease(tasks[0].instance_id)
        await gw.release(lease.lease_id)
        await _wait_for(lambda: gateway.metric("crl_pool_sandboxes", state="ready") == 1)
        # Kill the warm sandbox's shell behind the gateway's back (its cwd is the checkout).
        shells = [
            int(proc.name)
            for proc in Path("/proc").iterdir()
            if proc.name.isdigit() and _cwd(proc) == lease.workdir
        ]
        assert shells
        for pid in shells:
            os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        again = await gw.lease(tasks[0].instance_id)
        assert again.sandbox_id != lease.sandbox_id
        assert (await gw.run(again.lease_id, "echo fine")).output == "fine\n"
        await gw.release(again.lease_id)
    assert gateway.metric("crl_pool_sandboxes_replaced_total", reason="broken") == 1


def _cwd(proc: Path) -> str | None:
    try:
        return os.readlink(proc / "cwd")
    except OSError:
        return None


# --- capacity -------------------------------------------------------------------------------


async def test_back_pressure_waits_then_times_out_with_503(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "1", "--warm", "1")
    instance = tasks[0].instance_id
    async with gateway_client(gateway) as gw:
        held = await gw.lease(instance)
        # A second request for another instance waits while the only slot is leased...
        waiter = asyncio.create_task(gw.lease(SECOND, timeout=60))
        await _wait_for(lambda: gateway.metric("crl_pool_waiting_requests") == 1)
        await asyncio.sleep(0.5)
        assert not waiter.done()
        # ...and a third one with a short timeout is told to come back later.
        raw = await asyncio.to_thread(
            httpx.post,
            f"{gateway.url}/v1/leases",
            json={"instance_id": instance, "timeout": 0.5},
            headers=AUTH,
            timeout=30,
        )
        assert raw.status_code == 503
        assert raw.json()["error"] == "pool-busy"
        assert int(raw.headers["Retry-After"]) >= 1
        with pytest.raises(PoolBusyError) as busy:
            await gw.lease(instance, timeout=0.3)
        assert busy.value.retry_after is not None
        # Releasing the first lease frees the slot: its warm sandbox of another instance is
        # closed to make room, and the waiter gets a fresh one.
        await gw.release(held.lease_id)
        second = await asyncio.wait_for(waiter, 60)
        assert second.instance_id == SECOND
        assert second.source == "cold"
        assert second.wait_seconds > 0.5
        await gw.release(second.lease_id)
    assert gateway.metric("crl_pool_acquire_timeouts_total") == 2


async def test_a_lease_request_abandoned_by_its_client_stops_waiting(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "1", "--warm", "1")
    async with gateway_client(gateway) as gw:
        held = await gw.lease(tasks[0].instance_id)
        with pytest.raises(httpx.ReadTimeout):
            await asyncio.to_thread(
                httpx.post,
                f"{gateway.url}/v1/leases",
                json={"instance_id": SECOND, "timeout": 120},
                headers=AUTH,
                timeout=httpx.Timeout(1.0, connect=5.0),
            )
        await _wait_for(lambda: gateway.metric("crl_pool_waiting_requests") == 0)
        await gw.release(held.lease_id)
        # Nobody holds a sandbox for the vanished client: the slot serves the next request.
        lease = await asyncio.wait_for(gw.lease(tasks[0].instance_id, timeout=30), 60)
        assert lease.sandbox_id == held.sandbox_id
        assert gateway.metric("crl_pool_sandboxes", state="leased") == 1
        await gw.release(lease.lease_id)


async def test_waiter_for_the_same_instance_gets_the_reset_sandbox(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "1", "--warm", "0")
    instance = tasks[0].instance_id
    async with gateway_client(gateway) as gw:
        held = await gw.lease(instance)
        waiter = asyncio.create_task(gw.lease(instance, timeout=60))
        await _wait_for(lambda: gateway.metric("crl_pool_waiting_requests") == 1)
        await gw.run(held.lease_id, "touch new-file")
        await gw.release(held.lease_id)
        second = await asyncio.wait_for(waiter, 60)
        assert second.sandbox_id == held.sandbox_id
        assert second.source == "warm"
        assert (await gw.run(second.lease_id, "ls new-file")).exit_code != 0
        await gw.release(second.lease_id)


async def test_prefetch_makes_the_next_lease_warm(
    start_gateway: Callable[..., GatewayProcess], tasks: list[Task]
) -> None:
    gateway = start_gateway("--max-sandboxes", "4", "--warm", "0", "--prefetch", "1")
    async with gateway_client(gateway) as gw:
        response = await gw.prefetch([tasks[0].instance_id, "unknown__instance-1", SECOND])
        assert response.started == [tasks[0].instance_id]
        # Beyond the prefetch depth (1) and unknown ids are skipped.
        assert sorted(response.skipped) == sorted(["unknown__instance-1", SECOND])
        await _wait_for(lambda: gateway.metric("crl_pool_sandboxes", state="ready") == 1)
        # Announcing it again starts nothing new.
        assert (await gw.prefetch([tasks[0].instance_id])).already == [tasks[0].instance_id]
        lease = await gw.lease(tasks[0].instance_id)
        assert lease.source == "prefetched"
        assert lease.wait_seconds < 5
        await gw.release(lease.lease_id)
    assert gateway.metric("crl_pool_prefetch_hits_total") == 1
    assert gateway.metric("crl_pool_cold_starts_total") == 0
    assert gateway.metric("crl_pool_sandboxes_started_total", reason="prefetch") == 1


# --- errors -----------------------------------------------------------------------------------


async def test_errors_say_what_is_wrong(start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway("--max-sandboxes", "1", "--warm", "0")
    unknown = httpx.post(
        f"{gateway.url}/v1/leases", json={"instance_id": "nope__nope-1"}, headers=AUTH, timeout=10
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "unknown-instance"
    lost = httpx.post(
        f"{gateway.url}/v1/leases/lease-0/run", json={"command": "true"}, headers=AUTH, timeout=10
    )
    assert lost.status_code == 404
    assert lost.json()["error"] == "unknown-lease"
    bad = httpx.post(f"{gateway.url}/v1/leases", json={"instance": "x"}, headers=AUTH, timeout=10)
    assert bad.status_code == 400
    assert bad.json()["error"] == "bad-request"
    health = httpx.get(f"{gateway.url}/healthz", timeout=10).json()
    assert health == {
        "status": "ok",
        "backend": "local",
        "tasks": 2,
        "ready": 0,
        "leased": 0,
        "starting": 0,
        "max_sandboxes": 1,
    }
