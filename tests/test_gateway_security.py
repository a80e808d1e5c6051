"""The pool gateway against hostile clients (issue 17): authentication, a file API confined to
the sandbox's working tree, bounded reads, writes and outputs, and a 400 (never a 5xx) for a
malformed request, fuzzed.

A real gateway (local backend, a real repository) listens on loopback; requests go over real
HTTP, raw sockets included where the wire itself is malformed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import resource
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from crl_worker.api.common import PoolSettings
from crl_worker.pool.client import GatewayClient, GatewayError, RemoteSandbox
from crl_worker.pool.config import GatewayConfig
from crl_worker.pool.gateway import Gateway
from crl_worker.sandbox.files import FileTooLarge, PathOutsideSandbox
from crl_worker.tasks.model import Task

from .fixtures.repos import python_task

logger = logging.getLogger(__name__)

TOKEN = "security-test-token-6b1f0c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 1 << 20
SECRET = "canary-7f3e9a-outside-the-sandbox"


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return python_task(tmp_path / "repos")


@pytest.fixture
async def gateway(tmp_path: Path, task: Task) -> AsyncIterator[Gateway]:
    """A local gateway with 1 MiB limits and one sandbox at most."""
    config = GatewayConfig(
        pool="security",
        backend="local",
        host="127.0.0.1",
        port=0,
        local_root=tmp_path / "sandboxes",
        token=SecretStr(TOKEN),
        max_read_bytes=LIMIT,
        max_write_bytes=LIMIT,
        max_output_bytes=LIMIT,
        settings=PoolSettings.model_validate({"maxSandboxes": 1, "replicas": 0}),
    )
    gw = Gateway(config, [task])
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder next to the sandboxes holding a secret no gateway request may reveal."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret").write_text(SECRET)
    return folder


def _url(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.port}"


async def _lease(gw: Gateway, task: Task) -> tuple[str, str]:
    async with GatewayClient(_url(gw), token=TOKEN) as client:
        lease = await client.lease(task.instance_id, timeout=120)
    return lease.lease_id, lease.workdir


# --- authentication -------------------------------------------------------------------------


async def test_the_api_refuses_requests_without_the_token(gateway: Gateway, task: Task) -> None:
    url = _url(gateway)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        body = {"instance_id": task.instance_id}
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": TOKEN},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": f"Bearer {TOKEN}x"},
        ):
            refused = await http.post("/v1/leases", json=body, headers=headers)
            assert refused.status_code == 401, headers
            assert refused.json()["error"] == "unauthorized"
            assert TOKEN not in refused.text
            assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        for route in ("/v1/leases/x/files?path=a", "/v1/leases/x/run", "/v1/prefetch"):
            assert (await http.request("GET", route)).status_code in (401, 405)
        # Probes and scrapers carry no token.
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
    # The shared client refuses to go on without the token, with a message that says why.
    async with GatewayClient(url, token="") as anonymous:
        with pytest.raises(GatewayError, match=r"401.*Bearer"):
            await anonymous.lease(task.instance_id, timeout=5)
    lease_id, _ = await _lease(gateway, task)
    async with GatewayClient(url, token=TOKEN) as client:
        await client.release(lease_id)


async def test_the_client_reads_the_token_from_the_environment(
    gateway: Gateway, task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crl_worker.api.contract import Env

    monkeypatch.setenv(Env.POOL_TOKEN, TOKEN)
    async with RemoteSandbox(_url(gateway), task.instance_id) as sandbox:
        assert (await sandbox.run("echo ok")).output == "ok\n"
        # The token does not reach the sandbox's shell.
        env = (await sandbox.run("env")).output
        assert TOKEN not in env


# --- confinement ----------------------------------------------------------------------------


async def test_the_file_api_reaches_only_the_working_tree(
    gateway: Gateway, task: Task, outside: Path
) -> None:
    lease_id, workdir = await _lease(gateway, task)
    files = f"/v1/leases/{lease_id}/files"
    async with httpx.AsyncClient(base_url=_url(gateway), headers=AUTH, timeout=30) as http:

        async def run(command: str) -> None:
            result = await http.post(f"/v1/leases/{lease_id}/run", json={"command": command})
            assert result.status_code == 200 and result.json()["exit_code"] == 0, result.text

        await run(f"ln -s {outside}/secret leak && ln -s {outside} out && ln -s README.md readme")
        await run("mkdir -p sub && ln -s ../README.md sub/up")
        escapes = [
            "/proc/self/environ",
            "/etc/passwd",
            str(outside / "secret"),
            "../../outside/secret",
            "../" * 20 + str(outside / "secret"),
            "leak",
            "out/secret",
            "./sub/../../" + os.path.basename(workdir) + "/../../outside/secret",
            "a\x00b",
        ]
        for path in escapes:
            answer = await http.get(files, params={"path": path})
            assert answer.status_code == 400, (path, answer.status_code, answer.text[:200])
            assert answer.json()["error"] == "bad-path"
            assert SECRET not in answer.text and TOKEN not in answer.text
        # Writes: nothing lands outside, through '..', an absolute path or a linked folder.
        for path in ["../escape", str(outside / "new"), "out/new", "out/deep/er/new", "leak"]:
            answer = await http.put(files, params={"path": path}, content=b"x")
            assert answer.status_code == 400, (path, answer.status_code, answer.text[:200])
        assert sorted(p.name for p in outside.iterdir()) == ["secret"]
        assert (outside / "secret").read_text() == SECRET
        assert not (Path(workdir).parent / "escape").exists()
        # Inside the tree everything still works: relative, absolute, links that stay inside.
        readme = (Path(workdir) / "README.md").read_bytes()
        for path in ["README.md", f"{workdir}/README.md", "readme", "sub/up", "sub/../README.md"]:
            answer = await http.get(files, params={"path": path})
            assert answer.status_code == 200, (path, answer.text)
            assert answer.content == readme
        assert (
            await http.put(files, params={"path": "new/dir/f"}, content=b"hi")
        ).status_code == 204
        assert (Path(workdir) / "new" / "dir" / "f").read_bytes() == b"hi"
        assert (
            await http.put(files, params={"path": "readme"}, content=b"edited")
        ).status_code == 204
        assert (Path(workdir) / "README.md").read_bytes() == b"edited"
        assert (await http.get(files, params={"path": "new"})).json()["error"] == "is-a-directory"
        assert (await http.get(files, params={"path": "nope"})).status_code == 404
        assert (await http.delete(f"/v1/leases/{lease_id}")).status_code == 200


async def test_the_remote_sandbox_raises_what_a_local_one_would(
    gateway: Gateway, task: Task
) -> None:
    async with (
        GatewayClient(_url(gateway), token=TOKEN) as client,
        RemoteSandbox(client, task.instance_id) as sandbox,
    ):
        with pytest.raises(PathOutsideSandbox):
            await sandbox.read_file("/etc/passwd")
        with pytest.raises(FileTooLarge):
            await sandbox.read_file_limited("README.md", 3)
        await sandbox.run(f"head -c {LIMIT + 1} /dev/zero > big")
        with pytest.raises(FileTooLarge):
            await sandbox.read_file("big")
        with pytest.raises(FileTooLarge):
            await sandbox.write_file("big2", b"x" * (LIMIT + 1))
        # A refused request leaves the sandbox usable.
        assert sandbox.alive
        assert (await sandbox.run("echo still")).output == "still\n"


# --- bounds ---------------------------------------------------------------------------------


async def test_reads_writes_and_outputs_are_bounded(gateway: Gateway, task: Task) -> None:
    lease_id, workdir = await _lease(gateway, task)
    files = f"/v1/leases/{lease_id}/files"
    async with httpx.AsyncClient(base_url=_url(gateway), headers=AUTH, timeout=120) as http:
        run = f"/v1/leases/{lease_id}/run"
        setup = "ln -s /dev/zero zero && mkfifo fifo && head -c 2000000 /dev/zero > big"
        assert (await http.post(run, json={"command": setup})).json()["exit_code"] == 0
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for path in ["zero", "fifo"]:
            answer = await http.get(files, params={"path": path})
            assert answer.status_code == 400, answer.text
        answer = await http.get(files, params={"path": "big"})
        assert answer.status_code == 413 and answer.json()["error"] == "too-large"
        answer = await http.get(files, params={"path": "README.md", "max_bytes": "3"})
        assert answer.status_code == 413
        for bad in ["-1", "x", "1e9", "9" * 40]:
            answer = await http.get(files, params={"path": "README.md", "max_bytes": bad})
            assert answer.status_code == 400, bad
        answer = await http.put(files, params={"path": "w"}, content=b"x" * (LIMIT + 1))
        assert answer.status_code == 413
        assert not (Path(workdir) / "w").exists()
        # 20 MB of output asked to be kept in full: the gateway keeps its own cap.
        flood = {"command": "head -c 20000000 /dev/zero | tr '\\0' a", "max_output": 10**12}
        result = (await http.post(run, json=flood)).json()
        assert result["truncated"] is True
        assert len(result["output"].encode()) <= LIMIT + 1024
        # A diff over the limit (random bytes: git's binary diff cannot shrink them).
        noise = {"command": "rm big && head -c 2000000 /dev/urandom > noise"}
        assert (await http.post(run, json=noise)).json()["exit_code"] == 0
        answer = await http.get(f"/v1/leases/{lease_id}/diff")
        assert answer.status_code == 413 and answer.json()["error"] == "too-large"
        assert (await http.post(run, json={"command": "rm noise"})).json()["exit_code"] == 0
        assert (await http.get(f"/v1/leases/{lease_id}/diff")).status_code == 200
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert grown_mb < 200, f"the gateway grew by {grown_mb:.0f} MB"
        assert (await http.delete(f"/v1/leases/{lease_id}")).status_code == 200


# --- the fuzz -------------------------------------------------------------------------------

_WEIRD = [
    "",
    "\x00",
    "%00",
    "%ff%fe",
    "\ud800",
    "..",
    "../" * 30,
    "/",
    "//etc//passwd",
    "/proc/self/environ",
    "/dev/zero",
    "\n",
    " ",
    "a" * 5000,
    "é",
    "\u202e",
    "${HOME}",
    "$(id)",
    "`id`",
    "*",
    "~",
    "NaN",
    "-1",
    "1e309",
    "99999999999999999999999999",
]


def _junk(rng: random.Random) -> Any:
    """A random JSON value, often of the wrong type or size."""
    choice = rng.randrange(10)
    if choice == 0:
        return rng.choice(_WEIRD)
    if choice == 1:
        return rng.choice([0, -1, 1, 10**30, -(10**30), 2**63, 1e308, -0.0, 0.5])
    if choice == 2:
        return rng.choice([True, False, None])
    if choice == 3:
        return [_junk(rng) for _ in range(rng.randrange(3))]
    if choice == 4:
        return {rng.choice(_WEIRD): _junk(rng) for _ in range(rng.randrange(3))}
    if choice == 5:
        return "".join(chr(rng.randrange(0, 0x10FFFF)) for _ in range(rng.randrange(20)))
    return rng.choice(["true", "x", "instance", "echo hi", "README.md"])


_FIELDS = [
    "instance_id",
    "timeout",
    "command",
    "max_output",
    "dirty",
    "broken",
    "instance_ids",
    "extra",
]


def _body(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return b""
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if kind == 2:
        return b'{"instance_id": "' + b"\xff\xfe" + b'"}'
    if kind == 3:
        return b"{" * rng.randrange(1, 2000)
    if kind == 4:
        return b'{"timeout": 1e999, "max_output": -1, "command": "\\u0000"}'
    if kind == 5:
        return b'{"command": "\\ud800"}'
    body = {rng.choice(_FIELDS): _junk(rng) for _ in range(rng.randrange(4))}
    return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


_METHODS = {"leases": "POST", "run": "POST", "diff": "GET", "prefetch": "POST", "healthz": "GET"}


def _target(rng: random.Random, lease_id: str, outside: Path) -> str:
    lease = rng.choice([lease_id, lease_id, "nope", "..", "%2e%2e", "a" * 300, "%00", "%ff"])
    route = rng.choice(
        [
            "/v1/leases",
            f"/v1/leases/{lease}",
            f"/v1/leases/{lease}/run",
            f"/v1/leases/{lease}/files",
            f"/v1/leases/{lease}/diff",
            "/v1/prefetch",
            "/healthz",
            "/metrics",
            "/v1/../healthz",
            "/v2/x",
        ]
    )
    query: list[str] = []
    for _ in range(rng.randrange(3)):
        name = rng.choice(["path", "path", "max_bytes", "dirty", "broken", "x"])
        value = rng.choice(
            [
                *_WEIRD,
                str(outside / "secret"),
                "../../outside/secret",
                "../outside/written",
                "README.md",
                str(rng.randrange(-5, 10**6)),
            ]
        )
        if rng.random() < 0.5:
            # Percent-encode byte by byte, invalid UTF-8 sequences included.
            raw = value.encode("utf-8", "surrogatepass")
            value = "".join(f"%{b:02x}" for b in raw)
        query.append(f"{name}={value}")
    return route + ("?" + "&".join(query) if query else "")


async def test_a_fuzz_of_malformed_requests_gets_no_5xx_and_no_escape(
    gateway: Gateway, task: Task, outside: Path
) -> None:
    lease_id, workdir = await _lease(gateway, task)
    rng = random.Random(17)
    total = 3000
    statuses: dict[int, int] = {}
    server_errors: list[str] = []
    leaks: list[str] = []
    semaphore = asyncio.Semaphore(16)

    async def one(http: httpx.AsyncClient, i: int) -> None:
        target = _target(rng, lease_id, outside)
        route = target.split("?", 1)[0]
        if rng.random() < 0.25:
            method = rng.choice(["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS"])
        else:
            # Mostly the route's own methods, so the requests reach the handlers.
            method = _METHODS.get(route.rsplit("/", 1)[-1], rng.choice(["GET", "POST", "PUT"]))
            if route.endswith("/files"):
                method = rng.choice(["GET", "PUT"])
        headers = dict(AUTH) if rng.random() < 0.9 else {"Authorization": rng.choice(_WEIRD)}
        if rng.random() < 0.2:
            headers["Content-Type"] = rng.choice(["application/json", "text/plain", "\x7f"])
        body = _body(rng)
        if method == "DELETE" and route == f"/v1/leases/{lease_id}":
            method = "PATCH"  # keep the one lease for the whole fuzz
        async with semaphore:
            try:
                answer = await http.request(method, target, content=body, headers=headers)
            except (httpx.InvalidURL, httpx.LocalProtocolError, UnicodeError):
                statuses[0] = statuses.get(0, 0) + 1
                return
        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
        if answer.status_code >= 500 and answer.status_code != 503:
            server_errors.append(f"{method} {target!r} {body[:80]!r}: {answer.text[:300]}")
        if SECRET.encode() in answer.content or TOKEN.encode() in answer.content:
            leaks.append(f"{method} {target!r}")

    started = time.monotonic()
    async with httpx.AsyncClient(base_url=_url(gateway), timeout=60) as http:
        await asyncio.gather(*(one(http, i) for i in range(total)))
    raw_errors = await asyncio.to_thread(_raw_fuzz, gateway.port or 0, rng, 300)
    elapsed = time.monotonic() - started
    logger.info(
        "fuzz: %d HTTP + 300 raw requests in %.1f s; statuses %s",
        total,
        elapsed,
        sorted(statuses.items()),
    )
    assert not server_errors, "\n".join(server_errors[:20])
    assert not raw_errors, "\n".join(raw_errors[:20])
    assert not leaks, leaks[:20]
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert not (Path(workdir).parent / "outside").exists()
    # The gateway still serves the lease.
    async with GatewayClient(_url(gateway), token=TOKEN) as client:
        assert (await client.run(lease_id, "echo alive")).output == "alive\n"
        await client.release(lease_id)


def _raw_fuzz(port: int, rng: random.Random, count: int) -> list[str]:
    """Broken HTTP on the wire: request lines, headers, lengths. A 5xx is a failure."""
    pieces = [
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET /v1/leases/x/files?path=%00 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v1/leases HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/leases HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b"POST /v1/leases HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"\x00\x01\x02\r\n\r\n",
        b"GET /healthz HTTP/9.9\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nX: \x00\r\n\r\n",
        b"GET " + b"/a" * 5000 + b" HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n" + b"X-A: b\r\n" * 500 + b"\r\n",
    ]
    errors = []
    for _ in range(count):
        data = rng.choice(pieces)
        if rng.random() < 0.3:
            data = bytes(b if rng.random() > 0.05 else rng.randrange(256) for b in data)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                answer = sock.recv(200)
            except OSError:
                continue
        status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/") else b""
        if status.startswith(b"5"):
            errors.append(f"{data[:80]!r}: {answer[:120]!r}")
    return errors


# --- the sandbox layer, on both kinds of transport -------------------------------------------


@pytest.mark.parametrize("kind", ["local", "exec"])
async def test_confined_files_on_both_transports(tmp_path: Path, outside: Path, kind: str) -> None:
    """The checks the gateway relies on, in the local backend's transport and in the exec one
    a pod uses (here over local processes, exactly the commands a pod exec would run)."""
    from crl_worker.sandbox.files import NotARegularFile
    from crl_worker.sandbox.shell import ShellSandbox
    from crl_worker.sandbox.transport import LocalTransport, ProcessTransport, Transport

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_bytes(b"inside")
    (tree / "big").write_bytes(b"x" * 5000)
    (tree / "leak").symlink_to(outside / "secret")
    (tree / "out").symlink_to(outside)
    (tree / "zero").symlink_to("/dev/zero")
    (tree / "sub" / "up").symlink_to("../a.txt")
    os.mkfifo(tree / "fifo")
    transport: Transport = LocalTransport() if kind == "local" else ProcessTransport(cwd=str(tree))
    sandbox = ShellSandbox(transport, workdir=str(tree), snapshot=False)
    try:
        for path in ["a.txt", str(tree / "a.txt"), "sub/up", "sub/../a.txt"]:
            assert await sandbox.read_confined(path, 100) == b"inside", path
        for path in ["leak", "out/secret", str(outside / "secret"), "../outside/secret", "a\0"]:
            with pytest.raises(PathOutsideSandbox):
                await sandbox.read_confined(path, 100)
        for path in ["zero", "fifo", "/dev/zero"]:
            with pytest.raises((NotARegularFile, PathOutsideSandbox)):
                await asyncio.wait_for(sandbox.read_confined(path, 100), 30)
        with pytest.raises(FileTooLarge):
            await sandbox.read_confined("big", 4999)
        assert len(await sandbox.read_confined("big", 5000)) == 5000
        # Unconfined but bounded (the agent's view tool): /dev/zero is refused all the same.
        with pytest.raises(NotARegularFile):
            await asyncio.wait_for(sandbox.read_file_limited("/dev/zero", 100), 30)
        for path in ["out/new", "out/deep/new", "../escape", str(outside / "new"), "leak"]:
            with pytest.raises(PathOutsideSandbox):
                await sandbox.write_confined(path, b"x")
        assert sorted(p.name for p in outside.iterdir()) == ["secret"]
        assert (outside / "secret").read_text() == SECRET
        await sandbox.write_confined("new/dir/f", b"hi")
        assert (tree / "new" / "dir" / "f").read_bytes() == b"hi"
        await sandbox.write_confined("sub/up", b"through an inside link")
        assert (tree / "a.txt").read_bytes() == b"through an inside link"
        with pytest.raises(IsADirectoryError):
            await sandbox.write_confined("sub", b"x")
    finally:
        await transport.aclose()


# --- the command line's token -----------------------------------------------------------------


def test_a_local_gateway_makes_a_token_and_says_how_to_use_it_without_logging_it(
    tmp_path: Path, task: Task
) -> None:
    import subprocess
    import sys

    from crl_worker.api.contract import Env

    from .fixtures.ports import free_port

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(task.model_dump_json() + "\n")
    env = {k: v for k, v in os.environ.items() if k != Env.POOL_TOKEN}
    env[Env.CACHE_DIR] = str(tmp_path / "cache")
    port = free_port()
    log = tmp_path / "gateway.log"
    argv = [sys.executable, "-m", "crl_worker.pool", "--tasks", str(tasks), "--format", "task",
            "--backend", "local", "--pool", "mine", "--port", str(port),
            "--local-root", str(tmp_path / "sb")]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        token_file = tmp_path / "cache" / "pool" / "mine.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 40
        body = {"instance_id": "nope"}
        assert httpx.post(f"{url}/v1/leases", json=body, timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        answer = httpx.post(f"{url}/v1/leases", json=body, headers=auth, timeout=10)
        assert answer.status_code == 404  # admitted: the instance is unknown
    finally:
        process.terminate()
        process.wait(30)
    text = log.read_text()
    assert f"export {Env.POOL_TOKEN.value}=$(cat {token_file})" in text
    assert token not in text


def test_a_kubernetes_gateway_refuses_to_start_without_a_token(tmp_path: Path, task: Task) -> None:
    import subprocess
    import sys

    from crl_worker.api.contract import Env

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(task.model_dump_json() + "\n")
    env = {k: v for k, v in os.environ.items() if k != Env.POOL_TOKEN}
    argv = [sys.executable, "-m", "crl_worker.pool", "--tasks", str(tasks), "--format", "task",
            "--backend", "kubernetes", "--kubeconfig", str(tmp_path / "none")]  # fmt: skip
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "no token" in result.stderr and Env.POOL_TOKEN.value in result.stderr
