"""The one module that writes children: server-side apply with one field manager, and pruning.

Requests go through the Kubernetes client's authenticated connection pool, but as plain REST
calls on the paths of a small registry of kinds: no discovery round trips, one request per
write, and every request counted by verb and resource (the ``crl_operator_api_requests_total``
metric and the scale benchmark read those counts).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from crl_operator.conditions import timestamp
from crl_operator.metrics import API_REQUESTS

log = logging.getLogger(__name__)

FIELD_MANAGER = "coderepairrl-operator"


@dataclass(frozen=True)
class KindInfo:
    """Where a kind lives in the REST API."""

    kind: str
    api_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The collection path (optionally of one namespace) or one object's path."""
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
        return base


_KINDS = (
    KindInfo("ConfigMap", "v1", "configmaps"),
    KindInfo("Service", "v1", "services"),
    KindInfo("ServiceAccount", "v1", "serviceaccounts"),
    KindInfo("Secret", "v1", "secrets"),
    KindInfo("Pod", "v1", "pods"),
    KindInfo("Event", "v1", "events"),
    KindInfo("Namespace", "v1", "namespaces", namespaced=False),
    KindInfo("PersistentVolumeClaim", "v1", "persistentvolumeclaims"),
    KindInfo("Deployment", "apps/v1", "deployments"),
    KindInfo("Job", "batch/v1", "jobs"),
    KindInfo("Role", "rbac.authorization.k8s.io/v1", "roles"),
    KindInfo("RoleBinding", "rbac.authorization.k8s.io/v1", "rolebindings"),
    KindInfo("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies"),
    KindInfo("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets"),
    KindInfo("TrainingRun", "coderepair.io/v1alpha1", "trainingruns"),
    KindInfo("RolloutPool", "coderepair.io/v1alpha1", "rolloutpools"),
    KindInfo("Benchmark", "coderepair.io/v1alpha1", "benchmarks"),
    # Kueue's: may be absent from the cluster (its watch and list then find nothing).
    KindInfo("Workload", "kueue.x-k8s.io/v1beta2", "workloads"),
)
KINDS: dict[str, KindInfo] = {k.kind: k for k in _KINDS}

#: Kinds the builders may render as children; each is watched (by the managed-by label).
CHILD_KINDS: tuple[str, ...] = (
    "ConfigMap",
    "Service",
    "ServiceAccount",
    "Deployment",
    "Job",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "RolloutPool",
    "Benchmark",
    "Workload",
)


class KubeError(Exception):
    """A request the API server refused; `status` is the HTTP status (0: no response)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        """The object (or its kind) does not exist."""
        return self.status == 404

    @property
    def namespace_terminating(self) -> bool:
        """The namespace is being deleted: nothing new may be created in it."""
        return self.status == 403 and "being terminated" in self.message

    @property
    def invalid(self) -> bool:
        """The object was refused as invalid (e.g. a change to an immutable field)."""
        return self.status == 422


def kind_info(kind: str) -> KindInfo:
    """The registry entry of `kind`; a clear error for a kind the operator cannot write."""
    try:
        return KINDS[kind]
    except KeyError:
        raise KubeError(
            0,
            "UnknownKind",
            f"the operator has no REST path for kind {kind!r}; add it to crl_operator.apply.KINDS",
        ) from None


def load_api_client(kubeconfig: str | None = None, *, pool_size: int = 16) -> k8s.ApiClient:
    """An API client from the in-cluster service account, else from a kubeconfig file."""
    conf = k8s.Configuration()
    in_cluster = False
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
            in_cluster = True
        except k8s_config.ConfigException:
            pass  # not in a pod: fall back to $KUBECONFIG or ~/.kube/config
    if not in_cluster:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=conf
        )
    conf.connection_pool_maxsize = pool_size
    return k8s.ApiClient(conf)


class Kube:
    """Thin, counted REST access for the operator's writes and its few reads."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        field_manager: str = FIELD_MANAGER,
        timeout: float = 30.0,
    ) -> None:
        self.api = api
        self.field_manager = field_manager
        self.timeout = timeout
        self.requests: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def request(
        self,
        method: str,
        kind: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One REST call; returns the decoded JSON body or raises :class:`KubeError`."""
        url = path + (f"?{urlencode(dict(query))}" if query else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # The client serializes JSON bodies itself; other content types go as text.
        payload = body
        if body is not None and not isinstance(body, str) and "json" not in content_type:
            payload = json.dumps(body)
        with self._lock:
            self.requests[(method, kind)] += 1
        API_REQUESTS.labels(verb=method, kind=kind).inc()
        req = self.api.param_serialize(
            method, url, header_params=headers, body=payload, auth_settings=["BearerToken"]
        )
        try:
            resp = self.api.call_api(*req, _request_timeout=self.timeout)
            data = resp.read()  # type: ignore[no-untyped-call]
        except Exception as err:  # urllib3 errors: connection refused, timeouts
            raise KubeError(0, type(err).__name__, str(err)) from err
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        try:
            decoded: Any = json.loads(text) if text else {}
        except ValueError:
            decoded = {"message": text}
        if not 200 <= resp.status < 300:
            reason = decoded.get("reason", resp.reason) if isinstance(decoded, dict) else ""
            message = decoded.get("message", text) if isinstance(decoded, dict) else text
            raise KubeError(resp.status, str(reason or ""), str(message))
        return decoded if isinstance(decoded, dict) else {}

    # --- writes ---------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        """Server-side apply `obj` as this operator's field manager; returns the live object.

        `force` takes over fields another manager changed *among those we send*; fields we do
        not send (Kueue's `spec.suspend`, injected node selectors) are never touched.
        """
        info = kind_info(str(obj["kind"]))
        meta = obj["metadata"]
        query = {"fieldManager": self.field_manager}
        if force:
            query["force"] = "true"
        return self.request(
            "PATCH",
            info.kind,
            info.path(meta.get("namespace"), meta["name"]),
            query=query,
            body=json.dumps(obj, separators=(",", ":")),
            content_type="application/apply-patch+yaml",
        )

    def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        propagation: str = "Background",
    ) -> bool:
        """Delete one object (only that exact incarnation when `uid` is given); False if gone."""
        info = kind_info(kind)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": propagation,
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", kind, info.path(namespace, name), body=body)
        except KubeError as err:
            # 409: the uid precondition failed, i.e. this incarnation is already gone.
            if err.not_found or err.status == 409:
                return False
            raise
        return True

    def patch_status(
        self, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the status subresource with `{"status": patch}`."""
        info = kind_info(kind)
        return self.request(
            "PATCH",
            f"{kind}/status",
            info.path(namespace, name) + "/status",
            body={"status": dict(patch)},
            content_type="application/merge-patch+json",
        )

    def event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about `involved` (used for warnings: invalid spec, failures)."""
        meta = involved.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        digest = hashlib.sha256(f"{meta.get('uid')}{reason}{message}".encode()).hexdigest()[:10]
        now = timestamp(datetime.now(UTC))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{digest}", "namespace": ns},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": ns,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.field_manager},
            "reportingComponent": self.field_manager,
            "reportingInstance": self.field_manager,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.request("POST", "Event", KINDS["Event"].path(ns), body=body)
        except KubeError as err:
            if err.status != 409:  # the same event was posted already
                log.warning("could not post event %s: %s", reason, err)

    # --- reads (startup and the benchmark only; reconciles read the watch cache) ----------

    def list(
        self, kind: str, *, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """List objects of `kind` (all namespaces when `namespace` is None), kind filled in."""
        info = kind_info(kind)
        query = {"labelSelector": label_selector} if label_selector else None
        data = self.request("GET", kind, info.path(namespace), query=query)
        items = data.get("items") or []
        for item in items:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", info.api_version)
        return list(items)

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One object, or None when it does not exist."""
        info = kind_info(kind)
        try:
            obj = self.request("GET", kind, info.path(namespace, name))
        except KubeError as err:
            if err.not_found:
                return None
            raise
        obj.setdefault("kind", kind)
        return obj

    def raw(self, path: str) -> str:
        """GET a non-JSON endpoint (e.g. the API server's /metrics) as text."""
        with self._lock:
            self.requests[("GET", path)] += 1
        req = self.api.param_serialize(
            "GET", path, header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
        )
        resp = self.api.call_api(*req, _request_timeout=self.timeout)
        data = resp.read()  # type: ignore[no-untyped-call]
        if not 200 <= resp.status < 300:
            raise KubeError(resp.status, str(resp.reason), "GET " + path)
        return data.decode() if isinstance(data, bytes) else str(data)

    def counts(self) -> dict[tuple[str, str], int]:
        """Requests made so far, by (verb, kind)."""
        with self._lock:
            return dict(self.requests)


# --- deciding whether a write is needed (pure) ---------------------------------------------

_EMPTY: tuple[Any, ...] = (None, "", [], {}, False, 0)


def contains(live: Any, desired: Any) -> bool:
    """Whether every field `desired` sets has the same value in `live`.

    Lists must have the same length and match item by item (the server adds defaults inside
    items, never items). A desired empty value matches an absent one, since the API server
    drops empty values it does not keep; an integer matches its string form (quantities).
    """
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        for key, want in desired.items():
            if key not in live:
                if any(want == e and type(want) is type(e) for e in _EMPTY):
                    continue
                return False
            if not contains(live[key], want):
                return False
        return True
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return False
        return all(contains(a, b) for a, b in zip(live, desired, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return bool(desired == live)
    if isinstance(desired, int | float) and isinstance(live, str):
        return str(desired) == live
    return bool(desired == live)


def fingerprint(obj: Mapping[str, Any]) -> str:
    """A stable hash of a manifest, to remember what was applied last."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def child_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name) of an object."""
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controlling owner, if it has one."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def to_prune(
    live: Iterable[Mapping[str, Any]], owner_uid: str, wanted: set[tuple[str, str, str]]
) -> list[Mapping[str, Any]]:
    """Live children controlled by `owner_uid` that the render no longer produces."""
    out = []
    for obj in live:
        if controller_uid(obj) != owner_uid:
            continue
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if child_key(obj) not in wanted:
            out.append(obj)
    return out
