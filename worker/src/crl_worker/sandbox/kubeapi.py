"""The few Kubernetes API calls the pool gateway makes for its sandbox pods (:class:`KubeApi`):
the official client, run in threads, and one aiohttp session for the exec websockets. The
client is imported lazily: the local backend needs none of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import time
from typing import TYPE_CHECKING, Any

from crl_worker.errors import SandboxError
from crl_worker.sandbox.pods import KUEUE_QUEUE_LABEL, kueue_gated, pod_failure, pod_ready

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger(__name__)


class KubeApi:
    """The few Kubernetes calls the gateway makes, over the official client (run in threads)
    and one aiohttp session for exec websockets."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        from kubernetes import client, config

        try:
            self.configuration = client_configuration(kubeconfig, context)
        except config.ConfigException as exc:
            raise SandboxError(
                f"cannot load Kubernetes credentials ({exc}); run in a pod with a service account"
                " or pass --kubeconfig"
            ) from exc
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
            raise api_error(what, exc) from exc

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
        with contextlib.suppress(NotFound):
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
        except NotFound:
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


class NotFound(SandboxError):
    """The object does not exist."""


def api_error(what: str, exc: Any) -> SandboxError:
    """The client's exception as a :class:`SandboxError` that says what failed and why."""
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", "") or ""
    try:
        message = json.loads(body).get("message", body)
    except (ValueError, AttributeError):
        message = body or str(exc)
    if status == 404:
        return NotFound(f"{what}: not found ({message})")
    if status == 403:
        return SandboxError(f"{what}: forbidden ({message}); check the gateway's Role")
    return SandboxError(f"{what} failed ({status}): {message}")


def client_configuration(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """The official client's configuration, with credentials found as kubectl finds them:
    ``kubeconfig`` (and ``context``) when given; otherwise the pod's service account, and
    outside a pod ``$KUBECONFIG`` or ``~/.kube/config``. A fresh object: the client's global
    default is left alone. Raises ``kubernetes.config.ConfigException`` when none works."""
    from kubernetes import client, config

    conf = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
            return conf
        except config.ConfigException:
            pass  # not a pod's service account after all: as kubectl, try the kubeconfig
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context, client_configuration=conf
    )
    return conf
