"""The runner's progress report, and how it reaches the Benchmark's status in a cluster.

The runner publishes a small JSON report after each finished attempt and once at the end
(:class:`ProgressReport`: counts, resolve rate, pass@k, whether it finished). In a cluster the
operator gives the runner a ConfigMap of its own (`CRL_PROGRESS_CONFIGMAP`) and a
ServiceAccount allowed to `get` and `patch` that one ConfigMap; :class:`ConfigMapReporter`
merge-patches the report into its key `progress.json`, and the operator copies it into the
Benchmark's `status.progress`, `status.resolveRate` and `status.passAtK`. On one machine there is
no reporter (:func:`reporter_from_env` returns None); the results folder has the summary.

The trainer reports the same way (crl_worker.train.report): :class:`ConfigMapReporter` takes the
report model, the field manager and the key as arguments, and :class:`WireReport` gives every
report the same size limit and error messages on both ends.

Publishing never fails the benchmark: a refused or unreachable API server is logged and the
newest report is sent with the next publish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from crl_worker.api.benchmark import BaselineComparison, PassAtK

log = logging.getLogger(__name__)

#: The ConfigMap key the runner writes and the operator reads.
PROGRESS_KEY = "progress.json"
#: Environment variable naming the runner's progress ConfigMap (set by the operator).
PROGRESS_CONFIGMAP_ENV = "CRL_PROGRESS_CONFIGMAP"
#: The runner's field manager on that ConfigMap (the operator's own never sends `data`).
FIELD_MANAGER = "crl-bench-runner"
#: Where a pod finds its own namespace when POD_NAMESPACE is not set.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: The largest count a report may hold: JSON's safe integers, which every client reads exactly
#: and which fit the status schema's int64. A larger one would make the operator's status patch
#: fail (the API server refuses it), so it is refused with the report instead.
MAX_COUNT = 2**53 - 1
#: The longest `progress.json` read: a real report is well under a kilobyte (at most 16 pass@k
#: values); anything bigger is refused unread rather than parsed at every reconcile.
MAX_REPORT_CHARS = 64 * 1024


class WireReport(BaseModel):
    """Base of a report a worker publishes into a ConfigMap key for the operator to read:
    camelCase JSON, unknown keys ignored (a newer worker may say more than this operator
    reads), at most :data:`MAX_REPORT_CHARS` characters. Subclasses have a `finished` field
    (the last report, which the reporter retries) and may have `updated_at`, which the
    reporter fills in."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )

    @classmethod
    def parse(cls, text: str) -> Self:
        """Read a report's JSON; ValueError (with what is wrong) for anything malformed."""
        if len(text) > MAX_REPORT_CHARS:
            raise ValueError(
                f"malformed progress report: {len(text)} characters, more than the"
                f" {MAX_REPORT_CHARS} a report may have"
            )
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'report'}: {e['msg']}"
                for e in err.errors()[:5]
            )
            raise ValueError(f"malformed progress report: {problems}") from None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object as written to the ConfigMap (camelCase, nulls left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ProgressReport(WireReport):
    """What the runner publishes: `progress.json`, camelCase on the wire.

    Unknown keys are ignored (a newer runner may say more than this operator reads), and so is
    a malformed `comparison` (logged); the counts must add up, or the whole report is refused.
    """

    total: int = Field(ge=0, le=MAX_COUNT)
    """Attempts to run (instances x attempts)."""
    done: int = Field(ge=0, le=MAX_COUNT)
    """Attempts finished: resolved, unresolved or errored."""
    resolved: int = Field(ge=0, le=MAX_COUNT)
    """Attempts that resolved their instance."""
    errored: int = Field(default=0, ge=0, le=MAX_COUNT)
    """Attempts lost to infrastructure failures (not counted as unresolved)."""
    resolve_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    """resolved / (done - errored); None before any attempt finished without an error."""
    pass_at_k: list[PassAtK] = Field(default_factory=list, max_length=16)
    """Unbiased pass@k for each requested k, over the instances finished so far."""
    finished: bool = False
    """The runner is done (the last report)."""
    updated_at: datetime | None = None
    """When the runner wrote this report."""
    comparison: BaselineComparison | None = None
    """The paired comparison with the baseline, when the runner computed one."""

    @field_validator("comparison", mode="wrap")
    @classmethod
    def _comparison_or_none(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The comparison is an extra: a malformed one is dropped, the progress still counts.
        try:
            comparison = handler(value)
        except ValidationError as err:
            log.warning("ignoring a malformed baseline comparison in a progress report: %s", err)
            return None
        if comparison is not None and comparison.shared_instances > MAX_COUNT:
            log.warning(
                "ignoring a baseline comparison over %d shared instances in a progress report",
                comparison.shared_instances,
            )
            return None
        return comparison

    @model_validator(mode="after")
    def _counts_add_up(self) -> ProgressReport:
        if self.resolved + self.errored > self.done:
            raise ValueError(
                f"resolved ({self.resolved}) + errored ({self.errored}) exceed done ({self.done})"
            )
        if self.done > self.total:
            raise ValueError(f"done ({self.done}) exceeds total ({self.total})")
        if any(p.k > MAX_COUNT for p in self.pass_at_k):
            raise ValueError(f"passAtK: k above {MAX_COUNT}")
        return self

    @field_validator("pass_at_k", mode="after")
    @classmethod
    def _each_k_once(cls, values: list[PassAtK]) -> list[PassAtK]:
        # One value per k in the status. A k listed twice (a one-machine spec may say
        # `passAtK: [1, 1]`; the API server refuses that) is dropped after its first value
        # rather than losing the whole report.
        seen: set[int] = set()
        out = []
        for value in values:
            if value.k not in seen:
                seen.add(value.k)
                out.append(value)
        return out


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
        field_manager: str = FIELD_MANAGER,
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
            from kubernetes import client, config

            conf = client.Configuration()
            in_cluster = False
            if self.kubeconfig is None:
                try:
                    config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
                    in_cluster = True
                except config.ConfigException:
                    pass  # not in a pod: $KUBECONFIG or ~/.kube/config
            if not in_cluster:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=self.kubeconfig, client_configuration=conf
                )
            self._api = client.CoreV1Api(client.ApiClient(conf))
        return self._api


def reporter_from_env(
    env: Mapping[str, str] | None = None,
    *,
    field_manager: str = FIELD_MANAGER,
    model: type[WireReport] = ProgressReport,
) -> ConfigMapReporter | None:
    """The ConfigMap reporter the operator configured (`CRL_PROGRESS_CONFIGMAP`, `POD_NAMESPACE`);
    None outside a cluster, where nothing reads progress.

    `KUBECONFIG`, when set, is used instead of the pod's ServiceAccount (as kubectl does): a
    worker started by hand, or a test acting as the pod.
    """
    env = os.environ if env is None else env
    name = env.get(PROGRESS_CONFIGMAP_ENV)
    if not name:
        return None
    namespace = env.get("POD_NAMESPACE")
    if not namespace:
        try:
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        except OSError:
            namespace = ""
    if not namespace:
        log.warning(
            "%s is set but the namespace is unknown (set POD_NAMESPACE); progress is not published",
            PROGRESS_CONFIGMAP_ENV,
        )
        return None
    return ConfigMapReporter(
        namespace,
        name,
        kubeconfig=env.get("KUBECONFIG") or None,
        field_manager=field_manager,
        model=model,
    )
