"""A real Kubernetes control plane for the tests, started from binaries built from Go modules.

`tests/controlplane/build.sh` builds `crl-controlplane` (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kubectl from the Kubernetes modules pinned in
tests/controlplane/go.mod), kwok and helm into ``${CRL_CACHE_DIR:-~/.cache/coderepairrl}/bin``.
`Cluster` starts them as processes on free loopback ports in a temporary directory:

- a CA and client certificates per component (openssl), an admin identity in `system:masters`,
  RBAC authorization, service-account signing keys, so ServiceAccounts, TokenRequest and RBAC
  behave as in a real cluster;
- the project's CRDs (crds/*.yaml), applied server-side and waited for until Established;
- a few fake Nodes managed by kwok: Pods are scheduled, become Running and Ready, Job pods
  Succeeded; `kubectl exec` runs the command as a local process in a directory per pod
  (`crl-controlplane exec-server`, the kubelet's own streaming code).

Every component logs to a file in the directory; when startup fails the error carries the tails.
Run ``python -m tests.cluster`` to start one by hand (see docs/testing-cluster.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from .paths import ROOT

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

BUILD_SCRIPT = ROOT / "tests" / "controlplane" / "build.sh"
CRDS_DIR = ROOT / "crds"
KWOK_STAGES = "kwok-stages.yaml"  # written by build.sh next to the kwok binary
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
# Fake node capacity: enough for the project's pods, with GPUs so GPU requests schedule too.
# Ephemeral storage too: sandbox pods request it (real nodes always report it).
NODE_CAPACITY = {
    "cpu": "32",
    "memory": "256Gi",
    "ephemeral-storage": "1Ti",
    "pods": "110",
    "nvidia.com/gpu": "8",
}
STOP_GRACE_SECONDS = 5.0


class ClusterError(RuntimeError):
    """The test control plane could not be built, started or used; the message says why."""


class KubectlError(ClusterError):
    """A kubectl command exited non-zero; carries its arguments, exit code and output."""

    def __init__(self, args: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        self.args_ = list(args)
        self.result = result
        super().__init__(
            f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}"
        )


def cache_dir() -> Path:
    """Where built binaries and Go caches live (outside the checkout)."""
    return Path(os.environ.get("CRL_CACHE_DIR", Path.home() / ".cache" / "coderepairrl"))


def build(timeout: float = 3600) -> Path:
    """Build (or reuse) crl-controlplane, kubectl, kwok and helm; return their directory.

    A cold build compiles Kubernetes and takes minutes; afterwards it takes about a second.
    Raises ClusterError when Go is missing or the build fails.
    """
    if shutil.which("go") is None:
        raise ClusterError(
            "Go is not installed: the test control plane is built from Go modules "
            "(tests/controlplane/build.sh). Install Go 1.26+ and put it on PATH."
        )
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-6000:]}")
    if result.stderr.strip():
        log.info("build.sh: %s", result.stderr.strip())
    return Path(result.stdout.strip().splitlines()[-1])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    tier: int  # stop order: higher tiers stop first


@dataclass
class _Pki:
    """Certificates and keys made with the openssl CLI (EC P-256: fast to generate)."""

    directory: Path
    files: dict[str, Path] = field(default_factory=dict)

    def _openssl(self, *args: str) -> None:
        result = subprocess.run(
            ["openssl", *args], cwd=self.directory, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise ClusterError(f"openssl {' '.join(args)} failed:\n{result.stderr}")

    def ca(self) -> None:
        self._openssl(
            "req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-keyout", "ca.key", "-out", "ca.crt", "-days", "7",
            "-subj", "/CN=crl-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )  # fmt: skip
        self.files["ca.crt"] = self.directory / "ca.crt"
        self.files["ca.key"] = self.directory / "ca.key"

    def leaf(self, name: str, subject: str, *, server_names: Sequence[str] = ()) -> None:
        """A certificate signed by the CA: for clients, or a server when server_names are given."""
        usage = "serverAuth,clientAuth" if server_names else "clientAuth"
        ext = [f"extendedKeyUsage={usage}", "keyUsage=critical,digitalSignature,keyEncipherment"]
        if server_names:
            sans = [f"IP:{n}" if n[0].isdigit() else f"DNS:{n}" for n in server_names]
            ext.append("subjectAltName=" + ",".join(sans))
        args = ["req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-keyout", f"{name}.key", "-out", f"{name}.crt",
                "-CA", "ca.crt", "-CAkey", "ca.key", "-days", "7", "-subj", subject]  # fmt: skip
        for e in ext:
            args += ["-addext", e]
        self._openssl(*args)
        self.files[f"{name}.crt"] = self.directory / f"{name}.crt"
        self.files[f"{name}.key"] = self.directory / f"{name}.key"

    def service_account_keys(self) -> None:
        self._openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-out", "sa.key",
        )  # fmt: skip
        self._openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        self.files["sa.key"] = self.directory / "sa.key"
        self.files["sa.pub"] = self.directory / "sa.pub"

    def __getitem__(self, name: str) -> str:
        return str(self.files[name])


class Cluster:
    """A real control plane (etcd, kube-apiserver, controller-manager, scheduler) plus kwok.

    Use as a context manager, or call `start()` and `stop()`. Everything lives in `workdir`
    (a fresh temporary directory unless given): certificates, kubeconfigs, etcd data and one
    log file per component (`<name>.log`).
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        nodes: int = 3,
        bin_dir: Path | None = None,
        crds: Sequence[Path] | None = None,
        startup_timeout: float = 120,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="crl-cluster-"))
        self.node_count = nodes
        self._bin_dir = bin_dir
        self.crds = sorted(CRDS_DIR.glob("*.yaml")) if crds is None else list(crds)
        self.startup_timeout = startup_timeout
        self._processes: list[_Process] = []
        self._pki = _Pki(self.workdir / "pki")
        self.port = 0
        self.exec_port = 0
        self.node_names: list[str] = []

    # -- public API -------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        """Directory holding crl-controlplane, kubectl, kwok and helm (built on first use)."""
        if self._bin_dir is None:
            self._bin_dir = build()
        return self._bin_dir

    @property
    def kubectl_path(self) -> Path:
        """A kubectl of exactly the server's version."""
        return self.bin_dir / "kubectl"

    @property
    def helm_path(self) -> Path:
        """helm (v3), built by build.sh."""
        return self.bin_dir / "helm"

    @property
    def kwok_path(self) -> Path:
        """kwok, built by build.sh."""
        return self.bin_dir / "kwok"

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def pods_dir(self) -> Path:
        """`kubectl exec` into pod P of namespace N runs in pods_dir/N/P (created on first use)."""
        return self.workdir / "pods"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (a client certificate in system:masters)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        """The CA that signed the API server's serving certificate."""
        return self._pki.directory / "ca.crt"

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG (admin) and PATH starting with the bin directory.

        For subprocesses (helm, the operator, the CLI) that should talk to this cluster.
        """
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def start(self) -> Cluster:
        """Start every component and wait until the cluster is usable; on failure stop it all."""
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        log.info("cluster up at %s in %.1fs (%s)", self.server, time.monotonic() - started,
                 self.workdir)  # fmt: skip
        return self

    def stop(self) -> None:
        """Stop every component: clients first, then the API server, then etcd.

        Each tier gets SIGTERM and a grace period, then SIGKILL for whatever is left in its
        process groups. Stopping etcd together with the API server would keep the API server
        retrying its storage instead of shutting down.
        """
        for tier in sorted({p.tier for p in self._processes}, reverse=True):
            procs = [p for p in self._processes if p.tier == tier]
            for proc in procs:
                if proc.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            for proc in procs:
                try:
                    proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop on SIGTERM; killing it", proc.name)
                # The group may hold children even when its leader exited.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=5)
                proc.log_file.close()
        self._processes.clear()

    def cleanup(self) -> None:
        """Stop, then remove the working directory if this object created it."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.cleanup()

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (admin unless another kubeconfig is given).

        Raises KubectlError (with stderr) on a non-zero exit when `check` is true.
        """
        command = [
            str(self.kubectl_path),
            "--kubeconfig",
            str(kubeconfig or self.kubeconfig),
            *args,
        ]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, timeout=timeout, check=False,
            env={**os.environ, "KUBECTL_KUBERC": "false"},
        )  # fmt: skip
        if check and result.returncode != 0:
            raise KubectlError(args, result)
        return result

    def api_client(self, kubeconfig: Path | None = None) -> ApiClient:
        """A kubernetes.client.ApiClient for this cluster (admin unless another kubeconfig)."""
        from kubernetes import config

        api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig or self.kubeconfig)
        )
        return api

    def namespace(self, prefix: str = "test") -> str:
        """Create a fresh namespace and wait for its default ServiceAccount; return its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        # Pods are refused until the ServiceAccount controller has made "default".
        self._wait(f"ServiceAccount default in {name}", lambda: self._has_default_sa(name))
        return name

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace without waiting for its contents to be finalized."""
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")

    def service_account_kubeconfig(
        self,
        name: str,
        namespace: str,
        *,
        create: bool = False,
        expiration_seconds: int = 3600,
    ) -> Path:
        """A kubeconfig acting as ServiceAccount `namespace/name` (a TokenRequest API token).

        With `create`, the ServiceAccount is created first if it does not exist. The token is
        bound to the API server's audience, like a projected token in a Pod.
        """
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            if create:
                with contextlib.suppress(client.ApiException):
                    core.create_namespaced_service_account(
                        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
                    )
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(
                    audiences=[ISSUER], expiration_seconds=expiration_seconds
                )
            )
            response = core.create_namespaced_service_account_token(name, namespace, request)
        token = response.status.token if response.status else None
        if not token:
            raise ClusterError(f"TokenRequest for {namespace}/{name} returned no token")
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(path, f"system:serviceaccount:{namespace}:{name}",
                               {"token": token}, namespace=namespace)  # fmt: skip
        return path

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, str]:
        """A raw HTTPS request to the API server as admin; returns (status, response body).

        For what kubectl cannot send as is, e.g. a YAML body with a duplicate key.
        """
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(self._pki["admin.crt"], self._pki["admin.key"])
        req = urllib.request.Request(
            self.server + path, data=body, method=method, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(req, context=context, timeout=60) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()

    def issue_certificate(
        self, name: str, subject: str, *, server_names: Sequence[str] = ()
    ) -> tuple[Path, Path]:
        """A certificate and key signed by the cluster CA: (certificate, key) paths.

        A client certificate for ``subject`` (``/O=group/CN=user``), or a serving one when
        ``server_names`` (IP addresses or DNS names) are given. tests/node.py uses it for the
        real node's kubelet.
        """
        if not name.replace("-", "").isalnum():
            raise ClusterError(f"certificate name {name!r}: letters, digits and '-' only")
        self._pki.leaf(name, subject, server_names=server_names)
        return Path(self._pki[f"{name}.crt"]), Path(self._pki[f"{name}.key"])

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of every component's log, for error messages."""
        return "\n".join(
            f"--- {p.name} ({p.log_path}) ---\n{_tail(p.log_path, lines)}" for p in self._processes
        )

    # -- startup ----------------------------------------------------------------------------

    def _start(self) -> None:
        bin_dir = self.bin_dir
        binary = str(bin_dir / "crl-controlplane")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._make_pki()
        etcd_port, peer_port = free_port(), free_port()
        self.port, self.exec_port = free_port(), free_port()
        for name, subject in [
            ("admin", "/O=system:masters/CN=crl-admin"),
            ("controller-manager", "/CN=system:kube-controller-manager"),
            ("scheduler", "/CN=system:kube-scheduler"),
            # kwok writes node and pod status, leases and events for every fake node.
            ("kwok", "/O=system:masters/CN=kwok-controller"),
        ]:
            self._write_kubeconfig(
                self.workdir / f"{name}.kubeconfig", subject.rsplit("CN=", 1)[1],
                {"client-certificate": self._pki[f"{name}.crt"],
                 "client-key": self._pki[f"{name}.key"]},
            )  # fmt: skip

        self._spawn("etcd", [
            binary, "etcd", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-url", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-url", f"http://127.0.0.1:{peer_port}",
        ], tier=0)  # fmt: skip
        self._spawn("kube-apiserver", [
            binary, "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={self._pki['apiserver.crt']}",
            f"--tls-private-key-file={self._pki['apiserver.key']}",
            f"--client-ca-file={self._pki['ca.crt']}",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={self._pki['sa.pub']}",
            f"--service-account-signing-key-file={self._pki['sa.key']}",
            "--authorization-mode=RBAC",
            # A namespace may pin its pods to nodes (annotations scheduler.alpha.kubernetes.io/
            # node-selector and defaultTolerations): how a namespace is put on the real node.
            "--enable-admission-plugins=PodNodeSelector,PodTolerationRestriction",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # The default reconciler would publish 127.0.0.1 as the kubernetes Service endpoint.
            "--endpoint-reconciler-type=none",
            # kubectl exec/logs/port-forward go to kwok's kubelet API on the node's InternalIP.
            f"--kubelet-client-certificate={self._pki['apiserver-kubelet.crt']}",
            f"--kubelet-client-key={self._pki['apiserver-kubelet.key']}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--profiling=false",
        ], tier=1, ready=self._apiserver_ready)  # fmt: skip
        self._spawn("kube-controller-manager", [
            binary, "kube-controller-manager",
            f"--kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
            "--leader-elect=false", "--secure-port=0",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self._pki['sa.key']}",
            f"--root-ca-file={self._pki['ca.crt']}",
            f"--cluster-signing-cert-file={self._pki['ca.crt']}",
            f"--cluster-signing-key-file={self._pki['ca.key']}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            binary, "kube-scheduler",
            f"--kubeconfig={self.workdir / 'scheduler.kubeconfig'}",
            "--leader-elect=false", "--secure-port=0", "--profiling=false",
        ])  # fmt: skip
        self._install_crds()
        self._start_kwok()
        self._create_nodes()
        # Pods are refused until the ServiceAccount controller has made "default".
        self._wait("the default ServiceAccount", lambda: self._has_default_sa("default"))

    def _has_default_sa(self, namespace: str) -> bool:
        result = self.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False)
        return result.returncode == 0

    def _make_pki(self) -> None:
        self._pki.directory.mkdir(parents=True, exist_ok=True)
        self._pki.ca()
        self._pki.service_account_keys()
        self._pki.leaf(
            "apiserver", "/CN=kube-apiserver",
            server_names=["127.0.0.1", "10.96.0.1", "localhost", "kubernetes",
                          "kubernetes.default", "kubernetes.default.svc",
                          "kubernetes.default.svc.cluster.local"],
        )  # fmt: skip
        self._pki.leaf("kubelet", "/CN=crl-exec-server", server_names=["127.0.0.1", "localhost"])
        self._pki.leaf("apiserver-kubelet", "/O=system:masters/CN=kube-apiserver-kubelet-client")
        self._pki.leaf("admin", "/O=system:masters/CN=crl-admin")
        self._pki.leaf("controller-manager", "/CN=system:kube-controller-manager")
        self._pki.leaf("scheduler", "/CN=system:kube-scheduler")
        self._pki.leaf("kwok", "/O=system:masters/CN=kwok-controller")

    def _write_kubeconfig(
        self, path: Path, user: str, credentials: Mapping[str, str], namespace: str = "default"
    ) -> None:
        # JSON is YAML: every kubeconfig reader accepts it.
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "crl-test", "cluster": {
                "server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": dict(credentials)}],
            "contexts": [{"name": "crl-test", "context": {
                "cluster": "crl-test", "user": user, "namespace": namespace}}],
            "current-context": "crl-test",
        }  # fmt: skip
        path.write_text(json.dumps(config, indent=2) + "\n")
        path.chmod(0o600)

    def _spawn(self, name: str, command: list[str], *, tier: int = 2, ready: Any = None) -> None:
        log_path = self.workdir / f"{name}.log"
        log_file = log_path.open("ab")
        log.debug("starting %s: %s", name, " ".join(command))
        # Own session: stop() signals the whole group, and a Ctrl-C in the terminal reaches
        # only the Python process, which then stops the components in order.
        popen = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            cwd=self.workdir, start_new_session=True,
        )  # fmt: skip
        self._processes.append(_Process(name, popen, log_path, log_file, tier))
        if ready is not None:
            self._wait(f"{name} to be ready", ready)

    def _wait(self, what: str, condition: Any, timeout: float | None = None) -> None:
        """Poll `condition` until true; fail at once when a component has exited."""
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        delay = 0.05
        while True:
            for proc in self._processes:
                if proc.popen.poll() is not None:
                    raise ClusterError(
                        f"{proc.name} exited with {proc.popen.returncode} while waiting for "
                        f"{what}.\n{self.log_tails()}"
                    )
            if condition():
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}.\n{self.log_tails()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _apiserver_ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(self._pki["admin.crt"], self._pki["admin.key"])
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=5) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _install_crds(self) -> None:
        if not self.crds:
            return
        args = ["apply", "--server-side", "--field-manager=crl-tests"]
        for crd in self.crds:
            args += ["-f", str(crd)]
        self.kubectl(*args)
        files = [a for crd in self.crds for a in ("-f", str(crd))]
        names = self.kubectl("get", *files, "-o", "name").stdout.split()
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)

    def _start_kwok(self) -> None:
        stages = self.bin_dir / KWOK_STAGES
        if not stages.is_file():
            raise ClusterError(f"{stages} is missing: run {BUILD_SCRIPT} again")
        # The kubelet API for exec: the fake nodes advertise the exec server's port (kwok's
        # --node-port), so the API server sends `kubectl exec` there. kwok's own server (logs,
        # metrics) gets another port, since it would otherwise take the node port.
        self._spawn("exec-server", [
            str(self.bin_dir / "crl-controlplane"), "exec-server",
            f"--address=127.0.0.1:{self.exec_port}",
            f"--tls-cert-file={self._pki['kubelet.crt']}",
            f"--tls-private-key-file={self._pki['kubelet.key']}",
            f"--workdir={self.pods_dir}",
        ])  # fmt: skip
        self._spawn("kwok", [
            str(self.kwok_path), f"--kubeconfig={self.workdir / 'kwok.kubeconfig'}",
            # Only the fake nodes (tests/node.py may add a real one, which kwok must not touch).
            f"--config={stages}", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{free_port()}",
            "--node-ip=127.0.0.1", f"--node-port={self.exec_port}",
            f"--cidr={POD_CIDR}", "--node-lease-duration-seconds=40",
        ])  # fmt: skip

    def _create_nodes(self) -> None:
        self.node_names = [f"kwok-node-{i}" for i in range(self.node_count)]
        items = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
                "status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY},
            }
            for name in self.node_names
        ]
        if not items:
            return
        self.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": items}))  # fmt: skip
        self._wait("fake nodes to be Ready", self._nodes_ready)

    def _nodes_ready(self) -> bool:
        result = self.kubectl("get", "nodes", "-o", "json", check=False)
        if result.returncode != 0:
            return False
        ready = 0
        for node in json.loads(result.stdout)["items"]:
            for condition in node.get("status", {}).get("conditions", []):
                ready += condition["type"] == "Ready" and condition["status"] == "True"
        return ready >= self.node_count


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tests.cluster`: start a cluster, print how to reach it, wait for Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=main.__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="fake (kwok) nodes to create")
    parser.add_argument("--workdir", type=Path, help="keep everything here instead of a temp dir")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cluster = Cluster(args.workdir, nodes=args.nodes)
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster.start()
        # The one place this module talks to a person: the CLI entry point.
        print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)  # noqa: T201
        print(f"export PATH={cluster.bin_dir}:$PATH", flush=True)  # noqa: T201
        print(f"# logs: {cluster.workdir}/*.log; Ctrl-C stops the cluster", flush=True)  # noqa: T201
        while not stop:
            time.sleep(0.5)
    except ClusterError as error:
        log.error("%s", error)
        return 1
    finally:
        if args.workdir is None:
            cluster.cleanup()
        else:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
