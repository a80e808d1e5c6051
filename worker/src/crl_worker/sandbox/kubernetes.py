"""Kubernetes sandboxes: one pod per sandbox, a persistent shell over the exec API.

The pool gateway creates each sandbox pod itself, owned by its RolloutPool (so deleting the pool
deletes the pods through the garbage collector), labelled so the operator can count them
(``coderepair.io/state: starting|ready|leased``), hardened (no service account token, no
privilege escalation, every capability dropped, optionally non-root), and kept up by a shell
loop that does nothing. Commands run in one shell process inside the pod, reached through a
websocket to the pod's ``exec`` subresource (the ``v5.channel.k8s.io`` protocol, which can
close stdin); files move through separate one-shot execs (``cat``), binary-safe.

Only the pod is specific to this backend: :class:`KubernetesSandbox` creates it, labels it with
the pool's view of it and deletes it, and :class:`PodExecTransport` supplies the two exec
primitives of :class:`~crl_worker.sandbox.transport.ExecTransport`. The session, files, reset
and diff are :class:`~crl_worker.sandbox.shell.ShellSandbox`'s, the same code that drives local
processes standing in for a pod (:class:`~crl_worker.sandbox.transport.ProcessTransport`).

The Kubernetes client is imported lazily: nothing here is needed by the local backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from crl_worker.api.contract import SandboxState
from crl_worker.errors import SandboxError
from crl_worker.sandbox.kubeapi import KubeApi
from crl_worker.sandbox.pods import (
    CONTAINER,
    LABEL_GATEWAY,
    LABEL_STATE,
    KubernetesSandboxConfig,
    build_pod,
    exit_code_of,
    label_value,
    pod_name,
    pool_selector,
    sandbox_workdir,
)
from crl_worker.sandbox.session import ByteReader, ByteWriter
from crl_worker.sandbox.shell import ShellSandbox
from crl_worker.sandbox.transport import ExecTransport
from crl_worker.tasks.model import Task

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger(__name__)

#: Channels of the ``v5.channel.k8s.io`` exec protocol (the first byte of every frame).
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255


# --- transports --------------------------------------------------------------------------------


class _WebSocketWriter:
    """stdin of an exec websocket: each write is one channel-0 frame."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._pending.append(data)

    async def drain(self) -> None:
        while self._pending:
            data = self._pending.pop(0)
            # Frames of at most 1 MiB: the API server relays them one by one.
            for start in range(0, len(data), 1 << 20):
                await self._ws.send_bytes(bytes([STDIN]) + data[start : start + (1 << 20)])

    def close(self) -> None:
        if not self._ws.closed:
            asyncio.get_running_loop().create_task(self._ws.close())


class PodExecTransport(ExecTransport):
    """Execs into one container of a pod through the API server (``pods/exec``, websocket)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        pod: str,
        container: str = CONTAINER,
        *,
        shell: str = "/bin/bash",
        name: str | None = None,
    ) -> None:
        super().__init__(shell=shell, name=name or f"pod {namespace}/{pod}")
        self._api = api
        self.namespace = namespace
        self.pod = pod
        self.container = container
        self._sockets: list[aiohttp.ClientWebSocketResponse] = []
        self._shell: aiohttp.ClientWebSocketResponse | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def _connect(self, argv: list[str], stdin: bool) -> aiohttp.ClientWebSocketResponse:
        import aiohttp

        query = [("command", arg) for arg in argv] + [
            ("container", self.container),
            ("stdin", "true" if stdin else "false"),
            ("stdout", "true"),
            ("stderr", "true"),
            ("tty", "false"),
        ]
        url = (
            f"{self._api.websocket_base}/api/v1/namespaces/{self.namespace}/pods/{self.pod}/exec?"
            + urlencode(query)
        )
        session = await self._api.http()
        try:
            ws = await session.ws_connect(
                url,
                protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"),
                headers=self._api.auth_headers(),
                ssl=self._api.ssl_context(),
                max_msg_size=0,
                server_hostname=self._api.tls_server_name,
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise SandboxError(
                f"exec into pod {self.namespace}/{self.pod} was refused ({exc.status}: {exc.message});"
                " the gateway's Role needs create on pods/exec, and the node's kubelet must serve exec"
            ) from exc
        except aiohttp.ClientError as exc:
            raise SandboxError(
                f"exec into pod {self.namespace}/{self.pod} failed: {exc!r}"
            ) from exc
        self._sockets = [w for w in self._sockets if not w.closed]
        self._sockets.append(ws)
        return ws

    async def open_process(self, argv: list[str]) -> tuple[ByteReader, ByteWriter]:
        """Start ``argv`` in the container; its stdout arrives on the reader (stderr, where an
        interactive shell writes prompts and job notices, is dropped)."""
        ws = await self._connect(argv, stdin=True)
        self._shell = ws
        reader = asyncio.StreamReader(limit=1 << 24)

        async def pump() -> None:
            import aiohttp

            try:
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                        continue
                    channel, payload = message.data[0], message.data[1:]
                    if channel == STDOUT and payload:
                        reader.feed_data(payload)
            finally:
                reader.feed_eof()

        task = asyncio.get_running_loop().create_task(pump())
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)
        return reader, _WebSocketWriter(ws)

    @property
    def shell_open(self) -> bool:
        """Whether the shell's websocket is still connected (an idle exec stream can be cut,
        e.g. by the kubelet's streaming idle timeout)."""
        return self._shell is not None and not self._shell.closed

    async def exec_once(
        self, argv: list[str], stdin: bytes | None = None, timeout: float = 300
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` to completion in the container, ``stdin`` sent first (and closed where
        the protocol can: ``v5.channel.k8s.io``); commands that read stdin should not rely on
        its end."""
        import aiohttp

        ws = await self._connect(argv, stdin=stdin is not None)
        out, err, status = bytearray(), bytearray(), b""

        async def converse() -> None:
            nonlocal status
            if stdin is not None:
                for start in range(0, len(stdin), 1 << 20):
                    await ws.send_bytes(bytes([STDIN]) + stdin[start : start + (1 << 20)])
                if ws.protocol == "v5.channel.k8s.io":
                    await ws.send_bytes(bytes([CLOSE, STDIN]))
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                    continue
                channel, payload = message.data[0], message.data[1:]
                if channel == STDOUT:
                    out.extend(payload)
                elif channel == STDERR:
                    err.extend(payload)
                elif channel == ERROR:
                    status += payload

        try:
            await asyncio.wait_for(converse(), timeout)
        except TimeoutError as exc:
            raise SandboxError(
                f"{argv[0]} in pod {self.namespace}/{self.pod} did not finish within {timeout:.0f} s"
            ) from exc
        finally:
            await ws.close()
            with contextlib.suppress(ValueError):
                self._sockets.remove(ws)
        if not status:
            raise SandboxError(
                f"exec of {argv[0]} in pod {self.namespace}/{self.pod} ended without an exit status"
            )
        return exit_code_of(json.loads(status)), bytes(out), bytes(err)

    async def aclose(self) -> None:
        """Close every websocket this transport opened."""
        for ws in self._sockets:
            await ws.close()
        self._sockets.clear()
        for task in list(self._pumps):
            task.cancel()


# --- the sandbox -------------------------------------------------------------------------------


class KubernetesSandbox(ShellSandbox):
    """A sandbox pod: created on start, exec'd into, deleted on close.

    Made by the registry as ``KubernetesSandbox(config, task)`` (it then opens its own API
    connection), or by the pool gateway with a shared ``api`` and the pool's ``sandbox_id``.
    """

    def __init__(
        self,
        config: KubernetesSandboxConfig,
        task: Task,
        *,
        api: KubeApi | None = None,
        sandbox_id: str | None = None,
    ) -> None:
        self._own_api = api is None
        self.api = api if api is not None else KubeApi(config.kubeconfig, config.context)
        self.task = task
        self.config = config
        self.pod = pod_name(config.pool, sandbox_id or f"sbx-{secrets.token_hex(5)}")
        self.manifest = build_pod(task, self.pod, config)
        name = f"pod {config.namespace}/{self.pod}"
        super().__init__(
            PodExecTransport(
                self.api, config.namespace, self.pod, shell=config.sandbox.shell, name=name
            ),
            workdir=sandbox_workdir(task, config.sandbox),
            name=name,
            # The Sandbox contract (docs/sandboxes.md): an agent's command without a limit of
            # its own gets the task's, never none (a hung command would hold the lease forever).
            default_timeout=task.timeouts.command,
        )
        self._state_wanted: str | None = None
        self._state_task: asyncio.Task[None] | None = None
        self._created = False

    async def start(self) -> None:
        """Create the pod, wait until it is ready, then snapshot and open the session."""
        await self.api.create_pod(self.config.namespace, self.manifest)
        self._created = True
        try:
            await self.api.wait_ready(
                self.config.namespace, self.pod, self.config.sandbox.startup_timeout_seconds
            )
            await super().start()
        except BaseException:
            await self.close()
            raise

    def report_state(self, state: SandboxState) -> None:
        """Label the pod with the pool's view of it (``starting``, ``ready``, ``leased``).

        Fire and forget, coalesced: only the latest state is written, in order.
        """
        if not self._created or self._closed:
            return
        self._state_wanted = state
        if self._state_task is None or self._state_task.done():
            self._state_task = asyncio.get_running_loop().create_task(self._write_state())

    async def _write_state(self) -> None:
        written: str | None = None
        while self._state_wanted is not None and self._state_wanted != written and not self._closed:
            state = self._state_wanted
            try:
                await self.api.label_pod(self.config.namespace, self.pod, {LABEL_STATE: state})
            except SandboxError as exc:
                logger.warning("labelling pod %s as %s failed: %s", self.pod, state, exc)
                return
            written = state

    async def _release(self) -> None:
        """Stop labelling, delete the pod, close an API connection of its own (after the
        session, on close)."""
        if self._state_task is not None:
            self._state_task.cancel()
        # A failed delete must not leave the API connection open.
        try:
            if self._created:
                await self.api.delete_pod(self.config.namespace, self.pod)
        finally:
            if self._own_api:
                await self.api.aclose()


class KubernetesBackend:
    """Makes the pool's sandboxes as pods, and collects pods no gateway tracks."""

    def __init__(self, config: KubernetesSandboxConfig, api: KubeApi) -> None:
        self.config = config
        self.api = api

    async def prepare(self) -> None:
        """Resolve the pool's uid when unknown, and delete pods left over by earlier gateways."""
        if not self.config.pool_uid:
            self.config = self.config.model_copy(
                update={
                    "pool_uid": await self.api.pool_uid(self.config.namespace, self.config.pool)
                }
            )
        await self.collect_garbage()

    async def collect_garbage(self) -> list[str]:
        """Delete the pool's pods that this gateway does not track: its own from an earlier
        life, and those of gateways whose pod no longer exists. Returns the deleted names."""
        me = label_value(self.config.gateway_id)
        deleted = []
        for pod in await self.api.list_pods(self.config.namespace, pool_selector(self.config.pool)):
            meta = pod["metadata"]
            owner = (meta.get("labels") or {}).get(LABEL_GATEWAY)
            if owner != me and owner and await self.api.pod_exists(self.config.namespace, owner):
                continue  # a live sibling gateway's sandbox
            await self.api.delete_pod(self.config.namespace, meta["name"])
            deleted.append(meta["name"])
        if deleted:
            logger.info(
                "deleted %d sandbox pods no gateway tracks: %s", len(deleted), ", ".join(deleted)
            )
        return deleted

    def sandbox(self, task: Task, sandbox_id: str) -> KubernetesSandbox:
        """The (not yet started) sandbox of ``task``."""
        return KubernetesSandbox(self.config, task, api=self.api, sandbox_id=sandbox_id)

    async def aclose(self) -> None:
        """Release the API connections."""
        await self.api.aclose()
