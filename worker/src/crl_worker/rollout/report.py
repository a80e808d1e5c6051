"""How a worker publishes its progress report to the operator in a cluster.

In a cluster the operator gives a worker (the benchmark runner, the trainer) a ConfigMap of its
own (:attr:`~crl_worker.api.contract.Env.PROGRESS_CONFIGMAP`) and a ServiceAccount allowed to
`get` and `patch` that one ConfigMap; :class:`ConfigMapReporter` merge-patches the report (a
model of crl_worker.api.progress) into its key `progress.json`, and the operator copies it into
the resource's status. On one machine there is no reporter (:func:`reporter_from_env` returns
None): the results folder and the logs say the same.

Publishing never fails the worker: a refused or unreachable API server is logged and the newest
report is sent with the next publish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from crl_worker.api.contract import PROGRESS_KEY, RUNNER_FIELD_MANAGER, Env
from crl_worker.api.progress import ProgressReport, WireReport
from crl_worker.sandbox.kubeapi import client_configuration

log = logging.getLogger(__name__)

#: Where a pod finds its own namespace when POD_NAMESPACE is not set.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ProgressReporter(Protocol):
    """Where the runner's progress goes."""

    async def publish(self, report: Mapping[str, Any]) -> None:
        """Make `report` (a :class:`ProgressReport` as JSON) the current progress; never raises."""
        ...


class ConfigMapReporter:
    """Merge-patches one key of one ConfigMap (`progress.json`), as the pod's ServiceAccount.

    Each report is validated with `model` (the benchmark runner's :class:`ProgressReport` by
    default) before it is sent, and sent under `field_manager`, so the key is the worker's and
    the operator's server-side applies (which never send `data`) leave it alone.

    Credentials: the in-cluster ServiceAccount, else `kubeconfig` or `$KUBECONFIG` (tests, a
    runner started by hand). The Kubernetes client is synchronous, so each patch runs in a
    thread. Publishes are coalesced: one that arrives while another is being sent waits, and
    sends the newest report once (a burst of finished attempts costs two requests, and an older
    report never overwrites a newer one). A failed send is logged and not repeated for the
    reports that waited behind it; the next publish sends the newest report. The final report
    (`finished: true`) is retried a few times, since no publish follows it. :meth:`aclose`
    waits for a send in flight and releases the client's connections.
    """

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        kubeconfig: str | None = None,
        request_timeout: float = 10.0,
        final_retries: int = 3,
        retry_delay: float = 1.0,
        field_manager: str = RUNNER_FIELD_MANAGER,
        key: str = PROGRESS_KEY,
        model: type[WireReport] = ProgressReport,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.field_manager = field_manager
        self.key = key
        self.model = model
        self.kubeconfig = kubeconfig
        self.request_timeout = request_timeout
        self.final_retries = final_retries
        self.retry_delay = retry_delay
        self._api: Any = None
        self._lock = asyncio.Lock()
        self._latest: dict[str, Any] | None = None
        self._version = 0
        self._handled_version = 0
        self.sent = 0
        """Reports the API server accepted (for tests and logs)."""
        self.failures = 0
        """Sends that failed."""

    async def publish(self, report: Mapping[str, Any]) -> None:
        """Send `report` (or a newer one published meanwhile); failures are logged, not raised."""
        try:
            wire = self.model.model_validate(
                {"updatedAt": datetime.now(UTC), **dict(report)}
            ).to_wire()
        except ValidationError as err:
            # A bug in the worker, not a reason to stop the benchmark or the training.
            log.error("not publishing an invalid progress report: %s", err)
            return
        self._version += 1
        self._latest = wire
        mine = self._version
        async with self._lock:
            if self._handled_version >= mine:
                return  # a newer report was sent (or tried) while this one waited
            version, body = self._version, self._latest
            attempts = 1 + (self.final_retries if body.get("finished") else 0)
            for attempt in range(attempts):
                if attempt:
                    await asyncio.sleep(self.retry_delay * 2 ** (attempt - 1))
                if await asyncio.to_thread(self._send, body):
                    break
            # Tried even if it failed: the reports waiting behind it are older, so they return
            # at once instead of each waiting out an unreachable API server; the next publish
            # sends the newest report again.
            self._handled_version = version

    def _send(self, body: Mapping[str, Any]) -> bool:
        """One merge patch of the ConfigMap's key (in a worker thread); False on failure."""
        from kubernetes.client.exceptions import ApiException

        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        try:
            api = self._core_api()
            api.patch_namespaced_config_map(
                self.name,
                self.namespace,
                {"data": {self.key: text}},
                field_manager=self.field_manager,
                # The client would pick JSON Patch for a dict body; a merge patch sets one key
                # and leaves the operator's labels and owner reference alone.
                _content_type="application/merge-patch+json",
                _request_timeout=self.request_timeout,
            )
        except ApiException as err:
            self.failures += 1
            log.warning(
                "could not publish progress to ConfigMap %s/%s: %s %s (the next report retries)",
                self.namespace,
                self.name,
                err.status,
                err.reason,
            )
            return False
        except Exception as err:  # no credentials, connection refused, timeouts
            self.failures += 1
            log.warning(
                "could not publish progress to ConfigMap %s/%s: %s: %s (the next report retries)",
                self.namespace,
                self.name,
                type(err).__name__,
                err,
            )
            return False
        self.sent += 1
        return True

    async def aclose(self) -> None:
        """Wait for a send in flight, then release the client (a later publish makes a new one)."""
        async with self._lock:
            api, self._api = self._api, None
            if api is not None:
                await asyncio.to_thread(api.api_client.close)

    def _core_api(self) -> Any:
        """The CoreV1 API client, made on first use (credentials may not exist until then)."""
        if self._api is None:
            from kubernetes import client

            conf = client_configuration(self.kubeconfig)
            self._api = client.CoreV1Api(client.ApiClient(conf))
        return self._api


def reporter_from_env(
    env: Mapping[str, str] | None = None,
    *,
    field_manager: str = RUNNER_FIELD_MANAGER,
    model: type[WireReport] = ProgressReport,
) -> ConfigMapReporter | None:
    """The ConfigMap reporter the operator configured (`CRL_PROGRESS_CONFIGMAP`, `POD_NAMESPACE`);
    None outside a cluster, where nothing reads progress.

    `KUBECONFIG`, when set, is used instead of the pod's ServiceAccount (as kubectl does): a
    worker started by hand, or a test acting as the pod.
    """
    env = os.environ if env is None else env
    name = env.get(Env.PROGRESS_CONFIGMAP)
    if not name:
        return None
    namespace = env.get(Env.POD_NAMESPACE)
    if not namespace:
        try:
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        except OSError:
            namespace = ""
    if not namespace:
        log.warning(
            "%s is set but the namespace is unknown (set POD_NAMESPACE); progress is not published",
            Env.PROGRESS_CONFIGMAP,
        )
        return None
    return ConfigMapReporter(
        namespace,
        name,
        kubeconfig=env.get("KUBECONFIG") or None,
        field_manager=field_manager,
        model=model,
    )
