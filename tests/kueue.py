"""A real Kueue manager against the test control plane, with its CRDs and webhooks.

`tests/kueue/build.sh` builds Kueue's manager (`sigs.k8s.io/kueue/cmd/kueue`, the version
tests/kueue/go.mod pins) into the cache; its CRDs and webhook manifests are read from the same
module version in the Go module cache, so binary and schema always match.

What differs from a cluster install, and why:

- **Webhooks by URL** (as envtest does): the webhook configurations and the CRDs' conversion
  webhooks point at ``https://127.0.0.1:<port>/<path>`` instead of the ``kueue-webhook-service``
  Service, since the test API server has no Service routing to a process on the host. Only the
  webhooks of Kueue's own kinds and of ``batch/job`` (the one integration enabled) are
  installed: a webhook of a disabled integration would answer 404 and block those kinds.
- **Certificates**: Kueue's own internal certificate management stays on (its default, and the
  only mode in which v0.17 does not read a fixed ``/etc/kueue/metrics/certs``), but the Secret
  it manages is created beforehand (and written to its cert dir, as a Secret volume would be) with a CA and a serving certificate that is valid for both
  ``kueue-webhook-service.kueue-system.svc`` and ``127.0.0.1``. Kueue's rotator finds them
  valid, keeps them, writes them to its cert dir and injects the CA into the configurations.
- Leader election off; metrics on a free port; the visibility API server off (it would need an
  APIService and the aggregation layer).

`Kueue.stop()` / `start()` restart the manager with the same state (the Kueue-restart test).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .cluster import Cluster, ClusterError, _tail, cache_dir, free_port
from .paths import ROOT

BUILD_SCRIPT = ROOT / "tests" / "kueue" / "build.sh"
MODULE_DIR = ROOT / "tests" / "kueue"
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
API = "kueue.x-k8s.io/v1beta2"
STOP_GRACE_SECONDS = 10.0
#: With ``pod_namespaces``: the label (value ``"true"``) of the only namespaces whose pods
#: Kueue's plain-pod integration manages (its webhooks and ``managedJobsNamespaceSelector``).
POD_NAMESPACE_LABEL = "crl-tests/kueue-pods"


def build(timeout: float = 3600) -> Path:
    """Build (or reuse) the Kueue manager; return its path. Minutes cold, a second warm."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"building Kueue failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def module_dir() -> Path:
    """Kueue's module in the Go module cache (its CRDs and webhook manifests)."""
    env = {
        **os.environ,
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=mod",
        "GOMODCACHE": os.environ.get("GOMODCACHE", str(cache_dir() / "go" / "mod")),
    }
    result = subprocess.run(
        ["go", "list", "-m", "-json", "sigs.k8s.io/kueue"],
        cwd=MODULE_DIR, capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise ClusterError(f"go list sigs.k8s.io/kueue failed:\n{result.stderr}")
    info = json.loads(result.stdout)
    return Path(info["Dir"])


def version() -> str:
    """The Kueue version tests/kueue/go.mod pins (e.g. ``v0.17.0``)."""
    return module_dir().name.rpartition("@")[2]


def _openssl(directory: Path, *args: str) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=directory, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


def _certificates(directory: Path) -> dict[str, bytes]:
    """The Secret's data: what Kueue's rotator (open-policy-agent/cert-controller) accepts.

    The CA must verify as ``kueue-ca`` (its DNS name), the serving certificate as the webhook
    Service's DNS name with the serverAuth usage; 127.0.0.1 is added for the URL webhooks.
    """
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(directory, "req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650", "-subj", "/O=kueue/CN=kueue-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,digitalSignature,keyEncipherment",
             "-addext", "subjectAltName=DNS:kueue-ca")  # fmt: skip
    # cert-controller parses the CA key as PKCS#1 when it has to renew the serving certificate.
    _openssl(directory, "rsa", "-in", "ca.key", "-out", "ca.key", "-traditional")
    dns = f"{SERVICE}.{NAMESPACE}.svc"
    _openssl(directory, "req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048",
             "-keyout", "tls.key", "-out", "tls.crt", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-days", "3650", "-subj", f"/CN={dns}",
             "-addext", "extendedKeyUsage=serverAuth",
             "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
             "-addext", f"subjectAltName=DNS:{dns},IP:127.0.0.1")  # fmt: skip
    _openssl(directory, "rsa", "-in", "tls.key", "-out", "tls.key", "-traditional")
    return {
        name: (directory / name).read_bytes() for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")
    }


def _load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


class Kueue:
    """Kueue's manager as a process next to a :class:`~tests.cluster.Cluster`."""

    def __init__(
        self,
        cluster: Cluster,
        workdir: Path,
        *,
        wait_for_pods_ready: float | None = None,
        pod_namespaces: bool = False,
    ):
        """`wait_for_pods_ready`: seconds of Kueue's ``waitForPodsReady.timeout`` (off if None).
        `pod_namespaces`: also enable the plain-pod integration (the ``pod`` framework), only
        in namespaces labelled :data:`POD_NAMESPACE_LABEL` ``=true``, so no other test's pods
        go through Kueue's pod webhook (nor fail on it while Kueue is stopped)."""
        self.cluster = cluster
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binary = build()
        self.module = module_dir()
        self.port = free_port()
        self.probe_port = free_port()
        self.metrics_port = free_port()
        self.wait_for_pods_ready = wait_for_pods_ready
        self.pod_namespaces = pod_namespaces
        self.popen: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "kueue.log"
        self._ca = b""

    # -- install --------------------------------------------------------------------------

    def install(self) -> None:
        """Namespace, certificate Secret, CRDs (with URL conversion webhooks), webhooks."""
        certs = _certificates(self.workdir / "pki")
        self._ca = certs["ca.crt"]
        # What the kubelet does with the Secret volume in a cluster: Kueue's rotator waits for
        # the files in its cert dir before it reports the certificates ready.
        mounted = self.workdir / "certs"
        mounted.mkdir(exist_ok=True)
        for name, data in certs.items():
            (mounted / name).write_bytes(data)
        import base64

        ca_b64 = base64.b64encode(self._ca).decode()
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        secret = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in certs.items()},
        }  # fmt: skip
        # The conversion webhooks Kueue's kustomization enables (not every patch file it ships).
        kustomization = yaml.safe_load(
            (self.module / "config/components/crd/kustomization.yaml").read_text()
        )
        converted = {
            Path(p["path"]).name.removeprefix("webhook_in_").removesuffix(".yaml")
            for p in kustomization.get("patches") or ()
            if Path(p["path"]).name.startswith("webhook_in_")
        }
        objects: list[dict[str, Any]] = [secret]
        for path in sorted((self.module / "config/components/crd/bases").glob("*.yaml")):
            for crd in _load_all(path):
                if crd["spec"]["names"]["plural"] in converted:
                    crd["spec"]["conversion"] = {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": {"url": self._url("/convert"), "caBundle": ca_b64},
                            "conversionReviewVersions": ["v1"],
                        },
                    }
                objects.append(crd)
        for config in _load_all(self.module / "config/components/webhook/manifests.yaml"):
            config = copy.deepcopy(config)
            kind = "mutating" if config["kind"].startswith("Mutating") else "validating"
            config["metadata"] = {"name": f"kueue-{kind}-webhook-configuration"}
            hooks = []
            for hook in config["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                if self.pod_namespaces and path.endswith("--v1-pod"):
                    hook["namespaceSelector"] = self._pod_namespace_selector()
                elif "kueue-x-k8s-io" not in path and "batch-v1-job" not in path:
                    continue  # an integration that is not enabled: its path would answer 404
                hook["clientConfig"] = {"url": self._url(path), "caBundle": ca_b64}
                hooks.append(hook)
            config["webhooks"] = hooks
            objects.append(config)
        self.cluster.kubectl(
            "apply", "--server-side", "--field-manager=crl-tests", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        )  # fmt: skip
        names = [
            f"crd/{o['metadata']['name']}"
            for o in objects
            if o["kind"] == "CustomResourceDefinition"
        ]
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)

    @staticmethod
    def _pod_namespace_selector() -> dict[str, Any]:
        return {"matchLabels": {POD_NAMESPACE_LABEL: "true"}}

    def _url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def _config(self) -> Path:
        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {
                "port": self.port,
                "host": "127.0.0.1",
                "certDir": str(self.workdir / "certs"),
            },
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": SERVICE,
                "webhookSecretName": SECRET,
            },
            "clientConnection": {"qps": 100, "burst": 200},
            "integrations": {"frameworks": ["batch/job"]},
            "fairSharing": {
                "preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
            },
            "featureGates": {"VisibilityOnDemand": False},
        }
        if self.pod_namespaces:
            config["integrations"]["frameworks"].append("pod")
            config["managedJobsNamespaceSelector"] = self._pod_namespace_selector()
        if self.wait_for_pods_ready is not None:
            config["waitForPodsReady"] = {
                "timeout": f"{self.wait_for_pods_ready:g}s",
                "blockAdmission": False,
                "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 1},
            }
        path = self.workdir / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    # -- process --------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> Kueue:
        """Start the manager and wait until it is ready (certificates and webhooks served)."""
        config = self._config()
        log_file = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            [str(self.binary), f"--config={config}", "--zap-log-level=info"],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
            cwd=self.workdir, start_new_session=True,
        )  # fmt: skip
        log_file.close()
        deadline = time.monotonic() + timeout
        delay = 0.05
        while not self._ready():
            if self.popen.poll() is not None:
                raise ClusterError(f"kueue exited with {self.popen.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"kueue not ready after {timeout}s:\n{self.tail()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        return self

    def _ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.probe_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def tail(self, lines: int = 40) -> str:
        """The last lines of the manager's log."""
        return _tail(self.log_path, lines)
