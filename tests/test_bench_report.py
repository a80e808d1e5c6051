"""The runner's progress reporter against a real API server (the `cluster` fixture).

The ConfigMap and the runner's ServiceAccount, Role and RoleBinding are the builders' own
children, applied as the operator applies them (server-side, its field manager); the reporter
then acts with a TokenRequest token of that ServiceAccount, as the runner pod would.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from crl_operator.builders import RenderState, progress_name, render, runner_name
from crl_worker.api import Benchmark
from crl_worker.api.contract import PROGRESS_KEY
from crl_worker.api.contract import RUNNER_FIELD_MANAGER as FIELD_MANAGER
from crl_worker.api.progress import ProgressReport
from crl_worker.api.validation import load_resources
from crl_worker.rollout.report import ConfigMapReporter, reporter_from_env

from .fixtures.cluster import Cluster
from .fixtures.paths import ROOT
from .fixtures.ports import free_port

REPORT = {
    "total": 300,
    "done": 10,
    "resolved": 4,
    "errored": 2,
    "resolveRate": 0.5,
    "passAtK": [{"k": 1, "value": 0.5}],
    "finished": False,
}


def bench() -> Benchmark:
    [resource] = load_resources(str(ROOT / "examples" / "benchmark-hosted-endpoint.yaml"))
    assert isinstance(resource, Benchmark)
    return resource


def operator_apply(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    """Server-side apply as the operator does (its field manager, forced)."""
    for obj in objects:
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts",
            "--field-manager=coderepairrl-operator", "-f", "-", input=json.dumps(obj),
        )  # fmt: skip


def runner_children(namespace: str) -> list[dict[str, Any]]:
    """The progress ConfigMap and the runner's ServiceAccount, Role and RoleBinding."""
    wanted = {"ConfigMap", "ServiceAccount", "Role", "RoleBinding"}
    return [
        c
        for c in render(bench(), namespace, RenderState(inference_ready=True))
        if c["kind"] in wanted and not c["metadata"]["name"].endswith("-config")
    ]


def config_map(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl(
        "get", "configmap", name, "-n", namespace, "-o", "json", "--show-managed-fields"
    )
    return dict(json.loads(out.stdout))


@pytest.fixture
def runner(cluster: Cluster, namespace: str) -> Path:
    """The runner's identity in `namespace`; returns a kubeconfig acting as it."""
    operator_apply(cluster, runner_children(namespace))
    return cluster.service_account_kubeconfig(runner_name(bench()), namespace)


async def test_the_runner_patches_its_progress_and_nothing_else(
    cluster: Cluster, namespace: str, runner: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = progress_name(bench())
    reporter = ConfigMapReporter(namespace, name, kubeconfig=str(runner))
    await reporter.publish(REPORT)
    assert (reporter.sent, reporter.failures) == (1, 0)
    live = config_map(cluster, namespace, name)
    written = ProgressReport.parse(live["data"][PROGRESS_KEY])
    assert written.done == 10 and written.pass_at_k[0].value == 0.5
    assert written.updated_at is not None  # filled in when the runner did not say
    # The key is the runner's; the labels stay the operator's.
    managers = {m["manager"]: json.dumps(m["fieldsV1"]) for m in live["metadata"]["managedFields"]}
    assert f"f:{PROGRESS_KEY}" in managers[FIELD_MANAGER]
    assert "f:data" not in managers["coderepairrl-operator"]
    assert live["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "coderepairrl-operator"

    # The operator applying its children again (forced) leaves the runner's key alone.
    operator_apply(cluster, runner_children(namespace))
    again = config_map(cluster, namespace, name)
    assert again["data"][PROGRESS_KEY] == live["data"][PROGRESS_KEY]

    # Another ConfigMap is refused (403), logged, and never raises into the benchmark.
    cluster.kubectl("create", "configmap", "other", "-n", namespace, "--from-literal=a=b")
    elsewhere = ConfigMapReporter(namespace, "other", kubeconfig=str(runner))
    with caplog.at_level(logging.WARNING, logger="crl_worker.rollout.report"):
        await elsewhere.publish(REPORT)
    assert (elsewhere.sent, elsewhere.failures) == (0, 1)
    assert "403" in caplog.text and "other" in caplog.text
    assert config_map(cluster, namespace, "other")["data"] == {"a": "b"}
    # And so is anything but get/patch on its own ConfigMap.
    can = cluster.kubectl(
        "auth", "can-i", "delete", f"configmap/{name}", "-n", namespace,
        kubeconfig=runner, check=False,
    )  # fmt: skip
    assert can.stdout.strip() == "no"
    can = cluster.kubectl(
        "auth", "can-i", "get", "secrets", "-n", namespace, kubeconfig=runner, check=False
    )
    assert can.stdout.strip() == "no"


async def test_a_burst_of_reports_is_coalesced_in_order(
    cluster: Cluster, namespace: str, runner: Path
) -> None:
    name = progress_name(bench())
    reporter = ConfigMapReporter(namespace, name, kubeconfig=str(runner))
    reports = [
        {"total": 50, "done": i, "resolved": i // 2, "errored": 0, "finished": i == 50}
        for i in range(1, 51)
    ]
    await asyncio.gather(*(reporter.publish(r) for r in reports))
    # The first goes at once; the 49 that waited behind it are sent as the newest one.
    assert (reporter.sent, reporter.failures) == (2, 0)
    written = ProgressReport.parse(config_map(cluster, namespace, name)["data"][PROGRESS_KEY])
    assert (written.done, written.finished) == (50, True)


async def test_an_unreachable_server_is_logged_and_the_last_report_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A kubeconfig pointing at a port nobody listens on.
    kubeconfig = tmp_path / "nowhere.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    reporter = ConfigMapReporter(
        "ns", "p", kubeconfig=str(kubeconfig), request_timeout=2, final_retries=2, retry_delay=0.01
    )
    with caplog.at_level(logging.WARNING, logger="crl_worker.rollout.report"):
        await reporter.publish(REPORT)  # an ordinary report: tried once
        assert reporter.failures == 1
        await reporter.publish({**REPORT, "done": 300, "resolved": 200, "finished": True})
    assert (reporter.sent, reporter.failures) == (0, 4)  # the last one: once plus 2 retries
    assert "the next report retries" in caplog.text


async def test_an_invalid_report_is_not_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reporter = ConfigMapReporter("ns", "p", kubeconfig=str(tmp_path / "unused"))
    with caplog.at_level(logging.ERROR, logger="crl_worker.rollout.report"):
        await reporter.publish({"total": 1, "done": 2, "resolved": 0})
    assert (reporter.sent, reporter.failures) == (0, 0)
    assert "exceeds total" in caplog.text


def test_reporter_from_env() -> None:
    assert reporter_from_env({}) is None
    reporter = reporter_from_env({"CRL_PROGRESS_CONFIGMAP": "b-progress", "POD_NAMESPACE": "ns"})
    assert isinstance(reporter, ConfigMapReporter)
    assert (reporter.namespace, reporter.name) == ("ns", "b-progress")


def test_the_runner_pod_is_admitted_under_the_restricted_pod_security_standard(
    cluster: Cluster, namespace: str, runner: Path
) -> None:
    """The runner mounts a token now; its pod must still pass `restricted` admission."""
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    job = next(
        c
        for c in render(bench(), namespace, RenderState(inference_ready=True))
        if c["kind"] == "Job"
    )
    template = job["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "runner-admission", "namespace": namespace},
        "spec": template["spec"],
    }
    done = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    assert done.returncode == 0, done.stderr
    assert "violate" not in done.stderr, done.stderr
    # The check bites: the same pod allowed to escalate privileges is refused.
    container = pod["spec"]["containers"][0]
    container["securityContext"] = {
        **container["securityContext"],
        "allowPrivilegeEscalation": True,
    }
    refused = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    assert refused.returncode != 0 and "restricted" in refused.stderr, refused.stderr
