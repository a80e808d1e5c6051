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
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import ssl
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field

from crl_worker.api.base import API_VERSION
from crl_worker.api.common import SandboxSpec, TaskFormat
from crl_worker.api.contract import ROLE_SANDBOX, Annotation, Env, Label, SandboxState
from crl_worker.errors import SandboxError
from crl_worker.sandbox.session import ByteReader, ByteWriter
from crl_worker.sandbox.shell import ShellSandbox
from crl_worker.sandbox.transport import ExecTransport
from crl_worker.tasks.model import Task

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger(__name__)

# --- labels the operator and the gateway agree on ---------------------------------------------

MANAGED_BY = "coderepairrl-pool-gateway"
LABEL_POOL = Label.POOL
LABEL_INSTANCE = Label.INSTANCE
LABEL_STATE = Label.STATE
LABEL_GATEWAY = Label.GATEWAY
#: The operator selects sandbox pods (NetworkPolicy, status counts) by pool and this role.
LABEL_ROLE = Label.ROLE
ANNOTATION_INSTANCE_ID = Annotation.INSTANCE_ID
COMPONENT = "sandbox"
#: Kueue's labels: the LocalQueue a pod is admitted against (its plain-pod integration) and the
#: WorkloadPriorityClass; set only with the pool's ``scheduling.sandboxesUseQuota``.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: The scheduling gate Kueue's pod webhook puts on a queued pod until its Workload is admitted.
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
CONTAINER = "sandbox"

# Keeps the container up doing nothing, and exits at once on SIGTERM (PID 1 has no default
# signal handlers, so without the trap a pod deletion would wait out the grace period).
KEEPALIVE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"

STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255


# --- pure pieces -------------------------------------------------------------------------------


class KubernetesSandboxConfig(BaseModel):
    """A sandbox in a pod of its own (how the pods of one pool are made)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field(default_factory=lambda: os.environ.get("POD_NAMESPACE") or "default")
    """Namespace of the pool and its pods."""
    pool: str = "sandboxes"
    """Name of the RolloutPool (pod names and labels derive from it)."""
    pool_uid: str | None = None
    """uid of the RolloutPool (owner reference); pods are unowned when empty (tests only)."""
    gateway_id: str = Field(
        default_factory=lambda: os.environ.get(Env.POD_NAME) or socket.gethostname()
    )
    """Name of the gateway that creates the pods (its pod name in a cluster)."""
    kubeconfig: str | None = None
    """Kubeconfig file; in a pod, the service account when empty; else ``~/.kube/config``."""
    context: str | None = None
    """Context of the kubeconfig."""
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    """The RolloutPool's sandbox spec."""
    image_template: str | None = None
    """The task source's image template (the sandbox spec's one wins)."""
    task_format: TaskFormat = "swe-bench"
    """Format of the tasks (picks the default image naming)."""
    run_as_non_root: bool = False
    """Refuse to run the container as root (for images whose user is not root)."""
    run_as_user: int | None = Field(default=None, ge=0)
    """User id of the container; the image's own user when empty."""
    queue_name: str | None = None
    """Kueue LocalQueue each sandbox pod is admitted against (``kueue.x-k8s.io/queue-name``);
    set only with the pool's ``scheduling.sandboxesUseQuota``; no Kueue labels when empty."""
    workload_priority_class_name: str | None = None
    """Kueue WorkloadPriorityClass of the sandbox pods (with :attr:`queue_name` only)."""


def label_value(value: str) -> str:
    """``value`` as a valid label value: allowed characters only, at most 63, a hash if cut."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value).strip("-._")
    if len(cleaned) > 63 or cleaned != value:
        digest = hashlib.sha256(value.encode()).hexdigest()[:8]
        cleaned = f"{cleaned[: 63 - 9].rstrip('-._')}-{digest}"
    return cleaned or hashlib.sha256(value.encode()).hexdigest()[:8]


def pod_name(pool: str, sandbox_id: str) -> str:
    """The pod name of a sandbox: ``{pool}-{sandbox_id}``, cut to 63 characters."""
    suffix = sandbox_id.lower()
    return f"{pool[: 62 - len(suffix)].rstrip('-.')}-{suffix}"


def resolve_image(task: Task, config: KubernetesSandboxConfig) -> str:
    """The image of a task's sandbox: the sandbox spec's template, else the task's own image
    (the loaders set it from the task source's template or the format's usual images), else
    the task source's template."""
    template = config.sandbox.image_template or task.image or config.image_template
    if template is None:
        raise SandboxError(
            f"no image for {task.instance_id}: the task names none; set sandbox.imageTemplate"
            " or tasks.imageTemplate of the RolloutPool"
        )
    try:
        return template.format(
            instance_id=task.instance_id,
            # Docker Hub names allow no double underscore: SWE-bench's images spell it _1776_.
            instance_id_docker=task.instance_id.replace("__", "_1776_").lower(),
            repo=task.repo,
            owner=task.owner,
            name=task.name,
            version=task.version or "",
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise SandboxError(
            f"image template {template!r} is invalid ({exc}); placeholders are {{instance_id}},"
            " {repo}, {owner}, {name}, {version}"
        ) from exc


def sandbox_workdir(task: Task, spec: SandboxSpec) -> str:
    """The repository directory: the task's own unless the pool's spec sets another one."""
    default = SandboxSpec.model_fields["workdir"].default
    return spec.workdir if spec.workdir != default else task.workdir


def build_pod(task: Task, name: str, config: KubernetesSandboxConfig) -> dict[str, Any]:
    """The sandbox pod of ``task`` (pure: no client, no I/O)."""
    spec = config.sandbox
    labels = {
        "app.kubernetes.io/name": "coderepairrl",
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/part-of": "coderepairrl",
        "app.kubernetes.io/instance": config.pool,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_POOL: config.pool,
        LABEL_ROLE: ROLE_SANDBOX,
        LABEL_INSTANCE: label_value(task.instance_id),
        LABEL_STATE: SandboxState.STARTING,
        LABEL_GATEWAY: label_value(config.gateway_id),
    }
    if config.queue_name:
        # Kueue's plain-pod integration gates the pod until the queue's quota admits it.
        labels[KUEUE_QUEUE_LABEL] = config.queue_name
        if config.workload_priority_class_name:
            labels[KUEUE_PRIORITY_LABEL] = config.workload_priority_class_name
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": config.namespace,
        "labels": labels,
        "annotations": {ANNOTATION_INSTANCE_ID: task.instance_id},
    }
    if config.pool_uid:
        # controller=false: the gateway, not a controller of the pool's kind, manages the pods;
        # blockOwnerDeletion keeps a foreground deletion of the pool waiting for them.
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": "RolloutPool",
                "name": config.pool,
                "uid": config.pool_uid,
                "controller": False,
                "blockOwnerDeletion": True,
            }
        ]
    env = [{"name": key, "value": value} for key, value in task.env.items()]
    env += [{"name": var.name, "value": var.value} for var in spec.env or []]
    container_security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if config.run_as_non_root:
        pod_security["runAsNonRoot"] = True
    if config.run_as_user is not None:
        pod_security["runAsUser"] = config.run_as_user
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": resolve_image(task, config),
        "imagePullPolicy": "IfNotPresent",
        "command": [spec.shell, "-c", KEEPALIVE],
        "workingDir": sandbox_workdir(task, spec),
        "env": env,
        # Defaults for what the spec leaves unset: an unbounded sandbox could take the node.
        "resources": spec.container_resources(),
        "securityContext": container_security,
        "stdin": False,
        "tty": False,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # A sandbox that dies is replaced by the gateway; a restart would silently lose the
        # rollout's state behind a session that looks alive.
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": pod_security,
    }
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    if spec.placement is not None:
        placement = spec.placement.to_wire()
        if placement.get("nodeSelector"):
            pod_spec["nodeSelector"] = placement["nodeSelector"]
        if placement.get("tolerations"):
            pod_spec["tolerations"] = placement["tolerations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def pool_selector(pool: str) -> str:
    """Label selector of every sandbox pod of ``pool``."""
    return f"{LABEL_POOL}={pool},{LABEL_ROLE}={ROLE_SANDBOX}"


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why a pod can never become ready (image pull, crash, failed phase), or ``None``."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        return f"the pod ended in phase {phase} ({status.get('reason') or 'no reason given'})"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in {
            "ErrImagePull",
            "ImagePullBackOff",
            "InvalidImageName",
            "CreateContainerConfigError",
            "CreateContainerError",
            "CrashLoopBackOff",
        }:
            return (
                f"container {container.get('name')}: {reason}: {waiting.get('message', '')}".strip()
            )
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return f"container {container.get('name')} terminated: {terminated.get('reason')}"
    return None


def kueue_gated(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue still holds the pod back (its admission scheduling gate is on)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(gate.get("name") == KUEUE_ADMISSION_GATE for gate in gates)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running with the Ready condition true."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def exit_code_of(status: Mapping[str, Any]) -> int:
    """The exit code in the exec error channel's Status object."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", "1"))
    raise SandboxError(f"exec failed: {status.get('message') or status}")


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

    async def close(self) -> None:
        """End the session and delete the pod. Safe to call twice."""
        if self._closed:
            return
        # Each step runs whatever the one before did: a failed session close must not leave
        # the pod running, nor a failed delete the API connection open.
        try:
            await super().close()
        finally:
            if self._state_task is not None:
                self._state_task.cancel()
            try:
                if self._created:
                    await self.api.delete_pod(self.config.namespace, self.pod)
            finally:
                if self._own_api:
                    await self.api.aclose()


# --- the API ---------------------------------------------------------------------------------


class KubeApi:
    """The few Kubernetes calls the gateway makes, over the official client (run in threads)
    and one aiohttp session for exec websockets."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        from kubernetes import client, config

        try:
            if kubeconfig is None and _in_cluster():
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            else:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=kubeconfig, context=context
                )
        except config.ConfigException as exc:
            raise SandboxError(
                f"cannot load Kubernetes credentials ({exc}); run in a pod with a service account"
                " or pass --kubeconfig"
            ) from exc
        self.configuration = client.Configuration.get_default_copy()
        self._api_client = client.ApiClient(self.configuration)
        self.core = client.CoreV1Api(self._api_client)
        self.custom = client.CustomObjectsApi(self._api_client)
        host = self.configuration.host.rstrip("/")
        self.websocket_base = (
            "wss://" + host[8:]
            if host.startswith("https://")
            else "ws://" + host.removeprefix("http://")
        )
        self.tls_server_name: str | None = getattr(self.configuration, "tls_server_name", None)
        self._http: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | None = None

    async def http(self) -> aiohttp.ClientSession:
        """The shared aiohttp session for exec websockets."""
        import aiohttp

        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._http

    def ssl_context(self) -> ssl.SSLContext | bool:
        """TLS settings from the kubeconfig (CA, client certificate)."""
        if not self.websocket_base.startswith("wss://"):
            return False
        if self._ssl is None:
            cfg = self.configuration
            context = (
                ssl.create_default_context(cafile=cfg.ssl_ca_cert)
                if cfg.verify_ssl
                else ssl.create_default_context()
            )
            if not cfg.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)
            self._ssl = context
        return self._ssl

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header, refreshed (in-cluster tokens rotate)."""
        cfg = self.configuration
        if cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook(cfg)
        token = cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix(
            "BearerToken"
        )
        return {"Authorization": token} if token else {}

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            raise _api_error(what, exc) from exc

    async def create_pod(self, namespace: str, manifest: dict[str, Any]) -> None:
        """Create a pod."""
        await self._call(
            f"creating pod {namespace}/{manifest['metadata']['name']}",
            self.core.create_namespaced_pod,
            namespace,
            manifest,
        )

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """A pod as a plain dict (camelCase, as the API server sends it)."""
        response = await self._call(
            f"reading pod {namespace}/{name}",
            self.core.read_namespaced_pod,
            name,
            namespace,
            _preload_content=False,
        )
        data: dict[str, Any] = json.loads(response.data)
        return data

    async def wait_ready(self, namespace: str, name: str, timeout: float) -> None:
        """Wait until the pod runs and is ready; fail early on a pod that never will."""
        deadline = time.monotonic() + timeout
        delay = 0.2
        logged_gate = False
        while True:
            pod = await self.read_pod(namespace, name)
            if pod_ready(pod):
                return
            failure = pod_failure(pod)
            if failure:
                raise SandboxError(f"sandbox pod {namespace}/{name} cannot start: {failure}")
            gated = kueue_gated(pod)
            queue = ((pod.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
            if gated and not logged_gate:
                logger.info(
                    "sandbox pod %s/%s waits for Kueue to admit it against queue %s's quota",
                    namespace,
                    name,
                    queue,
                )
                logged_gate = True
            if time.monotonic() > deadline and gated:
                raise SandboxError(
                    f"sandbox pod {namespace}/{name} was still gated by Kueue after"
                    f" {timeout:.0f} s: queue {queue} had no free quota for it (the pool's"
                    " scheduling.sandboxesUseQuota counts sandboxes against the queue's CPU and"
                    " memory quota); raise that quota, lower maxSandboxes, or turn"
                    " sandboxesUseQuota off"
                )
            if time.monotonic() > deadline:
                phase = (pod.get("status") or {}).get("phase")
                raise SandboxError(
                    f"sandbox pod {namespace}/{name} was not ready after {timeout:.0f} s (phase"
                    f" {phase}); raise sandbox.startupTimeoutSeconds or check the image and node capacity"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        """Merge-patch labels of a pod."""
        await self._call(
            f"labelling pod {namespace}/{name}",
            self.core.patch_namespaced_pod,
            name,
            namespace,
            {"metadata": {"labels": labels}},
        )

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod; a pod already gone is fine."""
        with contextlib.suppress(_NotFound):
            await self._call(
                f"deleting pod {namespace}/{name}",
                self.core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=5,
            )

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching a label selector, as plain dicts."""
        response = await self._call(
            f"listing pods in {namespace}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=selector,
            _preload_content=False,
        )
        items: list[dict[str, Any]] = json.loads(response.data).get("items", [])
        return items

    async def pod_exists(self, namespace: str, name: str) -> bool:
        """Whether a pod of that name exists."""
        try:
            await self.read_pod(namespace, name)
        except _NotFound:
            return False
        return True

    async def pool_uid(self, namespace: str, pool: str) -> str:
        """uid of a RolloutPool."""
        from crl_worker.api.base import GROUP, VERSION

        obj = await self._call(
            f"reading RolloutPool {namespace}/{pool}",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "rolloutpools",
            pool,
        )
        uid: str = obj["metadata"]["uid"]
        return uid

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        if self._http is not None:
            await self._http.close()
        await asyncio.to_thread(self._api_client.close)


class _NotFound(SandboxError):
    """The object does not exist."""


def _api_error(what: str, exc: Any) -> SandboxError:
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", "") or ""
    try:
        message = json.loads(body).get("message", body)
    except (ValueError, AttributeError):
        message = body or str(exc)
    if status == 404:
        return _NotFound(f"{what}: not found ({message})")
    if status == 403:
        return SandboxError(f"{what}: forbidden ({message}); check the gateway's Role")
    return SandboxError(f"{what} failed ({status}): {message}")


def _in_cluster() -> bool:
    import os

    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


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
