"""A real node for the test cluster: a kubelet, containerd and CNI, so pods really run.

The kwok nodes of `tests.cluster.Cluster` only pretend (pods are marked Running; ``kubectl
exec`` runs on the host). `RealNode` joins a running `Cluster` with a node whose pods are real
containers:

- **containerd** from Debian's ``containerd`` package with a configuration of its own (root,
  state, socket, CNI directories under the node's folder), started under ``tini -s`` as a child
  subreaper: this machine's PID 1 does not reap orphans, and every container's shim is orphaned
  by design. Its CRI plugin needs ``restrict_oom_score_adj = true`` here: without it runc fails
  every sandbox with "can't get final child's PID from pipe: EOF" (``oom_score_adj`` EPERM).
- **CNI** from Debian's ``containernetworking-plugins``: a bridge of its own (``crl`` + a hex
  id), host-local addresses from a /24 of its own, loopback.
- **the kubelet** (``crl-kubelet``, built from the control plane's own Kubernetes module by
  ``tests/controlplane/kubelet/build.sh``) with a client certificate of the cluster CA as
  ``system:node:<name>`` (bound to the ``system:node`` ClusterRole), a serving certificate of the
  same CA, x509 authentication of its clients against the cluster CA (no anonymous access) and
  webhook authorization, so ``kubectl exec``/``logs`` reach it as the API server's kubelet
  client. cgroup v1 settings for this host (``failCgroupV1: false``, ``cgroupfs``).
- the node is labelled ``coderepair.io/node=real`` and tainted
  ``coderepair.io/node=real:NoSchedule``: only pods that ask for it land there
  (:attr:`RealNode.placement`), so the kwok-based tests sharing the cluster never do.
- **images**: no registry is reachable, so the pause image is made from ``crl-pause`` and
  imported as ``registry.k8s.io/pause:3.10``; test images are imported from the Docker engine
  of the image builds (``docker save`` into ``ctr import``, :meth:`RealNode.load_image`). Pods use
  ``imagePullPolicy: Never`` or ``IfNotPresent``.

`RealNode.stop` deletes what still runs on the node, stops the kubelet, kills and reaps what is
left of the containers and shims, stops containerd, unmounts every mount under the node's
folder, removes the bridge and checks that nothing is left (`RealNode.leftovers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .cluster import Cluster, ClusterError, free_port
from .clusterdns import ClusterDNS
from .fixtures.processes import processes_using
from .paths import ROOT

log = logging.getLogger(__name__)

BUILD_SCRIPT = ROOT / "tests" / "controlplane" / "kubelet" / "build.sh"
#: The sandbox image containerd's CRI plugin uses for every pod (made from crl-pause).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
#: Label and taint key of the real node; the value is always "real".
NODE_KEY = "coderepair.io/node"
#: Debian packages and the files that show they are installed.
REQUIRED_FILES = {
    "containerd": Path("/usr/bin/containerd"),
    "containerd (ctr)": Path("/usr/bin/ctr"),
    "runc": Path("/usr/sbin/runc"),
    "containernetworking-plugins": Path("/usr/lib/cni/bridge"),
    "tini": Path("/usr/bin/tini"),
    "iptables": Path("/usr/sbin/iptables"),
}
CNI_BIN_DIR = Path("/usr/lib/cni")
#: The ``kubernetes`` Service's ClusterIP (the first address of the cluster's service range).
KUBERNETES_SERVICE_IP = "10.96.0.1"
STOP_GRACE_SECONDS = 10.0
UNIX_PATH_MAX = 100  # sun_path is 108 bytes; containerd appends ".ttrpc" to its socket's path


class NodeError(ClusterError):
    """The real node could not be built, started, used or cleaned up; the message says why."""


def missing() -> str | None:
    """Why this machine cannot run a real node (a sentence), or None when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, mounts, network interfaces)"
    absent = [name for name, path in REQUIRED_FILES.items() if not path.exists()]
    if absent:
        return (
            f"not installed: {', '.join(absent)} "
            "(apt-get install containerd containernetworking-plugins tini)"
        )
    if shutil.which("go") is None:
        return "Go is not installed: the kubelet is built from Go modules"
    if not Path("/sys/fs/cgroup").is_dir():
        return "no /sys/fs/cgroup: the kubelet needs cgroups"
    return None


def build(timeout: float = 3600) -> Path:
    """Build (or reuse) crl-kubelet and crl-pause; return their directory."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise NodeError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-6000:]}")
    if result.stderr.strip():
        log.info("kubelet/build.sh: %s", result.stderr.strip())
    return Path(result.stdout.strip().splitlines()[-1])


def host_ip() -> str:
    """The address of this machine's default route (the node's InternalIP; never loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("198.51.100.1", 9))  # TEST-NET-2; no packet is sent, this picks the route
        address = str(sock.getsockname()[0])
    if address.startswith("127."):
        raise NodeError("no non-loopback IPv4 address: the kubelet refuses a loopback node IP")
    return address


def image_reference(tag: str) -> str:
    """``tag`` as containerd names it: the registry and ``library/`` made explicit."""
    name, _, digest = tag.partition("@")
    first, _, rest = name.partition("/")
    if not rest:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    if not digest and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return f"{name}@{digest}" if digest else name


def image_archive(
    tag: str, files: dict[str, tuple[bytes, int]], entrypoint: Sequence[str]
) -> bytes:
    """A one-layer image in ``docker save`` format (what ``ctr images import`` reads).

    ``files`` maps a path in the image to (content, mode).
    """
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w") as layer:
        for name, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(content), mode, 0
            layer.addfile(info, io.BytesIO(content))
    layer_bytes = layer_buffer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint)},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()  # fmt: skip
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}])
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in [
            (layer_name, layer_bytes), (config_name, config), ("manifest.json", manifest.encode()),
        ]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory`` (from /proc/self/mountinfo), deepest first."""
    prefix = str(directory.resolve())
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(points, key=lambda p: (p.count("/"), len(p)), reverse=True)


def _cgroup_hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies (one per controller set), or the v2 root."""
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2"):
                points.append(Path(fields[4]))
    return sorted(set(points))


def _cgroup_dirs(root: str) -> list[Path]:
    return [hierarchy / root.lstrip("/") for hierarchy in _cgroup_hierarchies()]


def _netns() -> set[str]:
    with contextlib.suppress(OSError):
        return {entry.name for entry in Path("/run/netns").iterdir()}
    return set()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "(gone)"


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


@dataclass
class Leftovers:
    """What a stopped node left behind (all empty when clean): processes, mounts, the bridge,
    its cgroups and network namespaces (containerd 1.6 keeps those in /run/netns)."""

    processes: list[tuple[int, str]] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.processes or self.mounts or self.links or self.cgroups or self.netns)


class RealNode:
    """A kubelet + containerd + CNI node joined to a running `Cluster`.

    Everything lives in ``workdir`` (a short directory of its own when ``workdir``'s path is too
    long for the kubelet's unix sockets; containerd's sockets in a shorter one when its path is
    still too long for them). Use as a context manager, or `start()` and `stop()`.
    """

    def __init__(
        self,
        cluster: Cluster,
        workdir: Path,
        *,
        name: str = "real-node",
        label: str = "real",
        bin_dir: Path | None = None,
        startup_timeout: float = 120,
    ) -> None:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise NodeError(f"node name {name!r}: lowercase letters, digits and '-', at most 63")
        if not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", label):
            raise NodeError(f"node label value {label!r} is not a valid label value")
        self.cluster = cluster
        self.workdir = workdir.resolve()
        # The kubelet binds unix sockets below its root dir (pod-resources/ plus a 10-digit temp
        # name is the longest), and a socket's path holds at most 107 bytes: a deep workdir (a
        # pytest-xdist worker's temporary folder) is swapped for a short one of its own.
        if len(str(self.kubelet_dir / "root" / "pod-resources" / "0123456789")) > UNIX_PATH_MAX:
            self.workdir = Path(tempfile.mkdtemp(prefix="crl-node-"))
        self.name = name
        self.label = label
        self._bin_dir = bin_dir
        self.startup_timeout = startup_timeout
        self.id = uuid.uuid4().hex[:8]
        self.bridge = f"crl{self.id[:8]}"
        # A /24 of its own from 10.240.0.0/12, so two nodes on one machine do not collide.
        seed = int(self.id, 16)
        self.subnet = f"10.{240 + seed % 16}.{(seed >> 4) % 256}.0/24"
        self.node_ip = ""
        self.kubelet_port = 0
        self._processes: list[_Process] = []
        self._run_dir = self.workdir / "run"
        self._own_run_dir = False
        # The kubelet's cgroup root, its own: two kubelets sharing /kubepods would each remove
        # the other's pod cgroups as orphans.
        self.cgroup_root = f"/crl-node-{self.id}"
        self._netns_before: set[str] | None = None
        self._netns_paths: set[str] = set()
        self._dns: ClusterDNS | None = None

    @property
    def dns_ip(self) -> str:
        """The bridge's address (the pods' gateway), where the node's cluster DNS answers."""
        return self.subnet.rsplit(".", 1)[0] + ".1"

    @property
    def placement(self) -> dict[str, Any]:
        """What a pod spec needs to run on this node (merge into ``spec``)."""
        return {
            "nodeSelector": {NODE_KEY: self.label, "kubernetes.io/hostname": self.name},
            "tolerations": [{"key": NODE_KEY, "operator": "Equal", "value": self.label,
                             "effect": "NoSchedule"}],
        }  # fmt: skip

    # -- paths --------------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        """Directory holding crl-kubelet and crl-pause (built on first use)."""
        if self._bin_dir is None:
            self._bin_dir = build()
        return self._bin_dir

    @property
    def containerd_socket(self) -> Path:
        """containerd's gRPC socket (CRI and ctr)."""
        return self._run_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's --root-dir (pods' volumes are mounted below it)."""
        return self.workdir / "kubelet"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> RealNode:
        """Start containerd and the kubelet and wait until the Node is Ready; on failure stop."""
        reason = missing()
        if reason:
            raise NodeError(reason)
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        log.info("real node %s Ready in %.1fs (%s)", self.name, time.monotonic() - started,
                 self.workdir)  # fmt: skip
        return self

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()

    def stop(self) -> None:
        """Stop everything and clean up; raise NodeError if something is left (listed)."""
        if any(p.name == "kubelet" and p.popen.poll() is None for p in self._processes):
            self._drain()
        self._stop_process("kubelet")
        self._remove_containers()
        self._kill_cgroup_processes()
        self._kill_shims()
        self._stop_process("containerd")
        for proc in self._processes:
            proc.log_file.close()
        self._processes.clear()
        self._unmount_all()
        self._remove_netns()
        self._remove_cgroup_root()
        self._remove_cni_rules()
        self._unroute_api()
        if self._dns is not None:
            self._dns.stop()
            self._dns = None
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        with contextlib.suppress(Exception):
            self.cluster.kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false",
                                 check=False, timeout=30)  # fmt: skip
            self.cluster.kubectl("delete", "clusterrolebinding", f"crl-node-{self.name}",
                                 "--ignore-not-found", check=False, timeout=30)  # fmt: skip
        left = self.leftovers()
        if self._own_run_dir and not left:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        if left:
            raise NodeError(f"the real node left things behind: {left}")

    def leftovers(self) -> Leftovers:
        """Processes, mounts and network links of this node that still exist."""
        processes = processes_using(str(self._run_dir))
        processes += [p for p in processes_using(str(self.workdir)) if p not in processes]
        processes += [(pid, _cmdline(pid)) for pid in self._cgroup_pids()
                      if pid not in {p for p, _ in processes}]  # fmt: skip
        mounts = mounts_under(self.workdir)
        if self._own_run_dir:
            mounts += mounts_under(self._run_dir)
        link = subprocess.run(["ip", "link", "show", self.bridge], capture_output=True, check=False)
        cgroups = [str(d) for d in _cgroup_dirs(self.cgroup_root) if d.exists()]
        netns = sorted(_netns() - self._netns_before) if self._netns_before is not None else []
        links = [self.bridge] if link.returncode == 0 else []
        links += [f"iptables nat rule: {rule}" for rule in self._api_rules()]
        links += [f"iptables nat rule: {rule}" for rule in self._cni_rules()]
        return Leftovers(processes, mounts, links,
                         cgroups, netns)  # fmt: skip

    # -- images -------------------------------------------------------------------------------

    def ctr(self, *args: str, input: bytes | None = None, timeout: float = 300) -> str:
        """Run ``ctr`` against this node's containerd in the CRI namespace; return stdout."""
        result = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            input=input, capture_output=True, timeout=timeout, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise NodeError(
                f"ctr {' '.join(args)} failed: {result.stderr.decode(errors='replace')}"
            )
        return result.stdout.decode(errors="replace")

    def import_archive(self, archive: bytes | Path) -> None:
        """Import an image archive (``docker save`` or OCI layout tar) into the CRI namespace."""
        if isinstance(archive, Path):
            self.ctr("images", "import", "--no-unpack=false", str(archive))
        else:
            self.ctr("images", "import", "-", input=archive)

    def load_image(self, docker_env: dict[str, str], *tags: str) -> None:
        """Copy images from a Docker engine into the node's containerd: one ``docker save`` of
        every tag (shared layers once), then ``ctr images import``."""
        if not tags:
            raise NodeError("load_image: no image named")
        with tempfile.NamedTemporaryFile(dir=self.workdir, suffix=".tar") as archive:
            saved = subprocess.run(
                ["docker", "save", "-o", archive.name, *tags], env=docker_env,
                capture_output=True, text=True, timeout=900, check=False,
            )  # fmt: skip
            if saved.returncode != 0:
                raise NodeError(f"docker save {' '.join(tags)} failed: {saved.stderr}")
            self.import_archive(Path(archive.name))

    def has_image(self, tag: str) -> bool:
        """Whether the node's containerd holds ``tag``."""
        return image_reference(tag) in self.ctr("images", "list", "-q").split()

    # -- startup ------------------------------------------------------------------------------

    def _start(self) -> None:
        bin_dir = self.bin_dir
        self.workdir.mkdir(parents=True, exist_ok=True)
        if len(str(self.workdir / "run" / "containerd.sock.ttrpc")) > UNIX_PATH_MAX:
            self._run_dir = Path(tempfile.mkdtemp(prefix="crl-node-"))
            self._own_run_dir = True
        self._run_dir.mkdir(parents=True, exist_ok=True)
        self.node_ip = host_ip()
        self.kubelet_port = free_port()
        self._netns_before = _netns()
        self._make_cgroup_root()
        self._write_cni()
        self._route_api()
        self._dns = ClusterDNS(self.dns_ip, lambda method, path: self.cluster.request(method, path),
                               kubernetes_ip=KUBERNETES_SERVICE_IP).start()  # fmt: skip
        self._write_containerd_config()
        self._spawn("containerd", [
            "tini", "-s", "-g", "--", "containerd", "--config", str(self.workdir / "containerd.toml"),
        ])  # fmt: skip
        self._wait("containerd", lambda: self._ctr_ok())
        self.import_archive(image_archive(
            PAUSE_IMAGE, {"pause": ((bin_dir / "crl-pause").read_bytes(), 0o755)}, ["/pause"],
        ))  # fmt: skip
        self._write_kubelet_files()
        self._spawn("kubelet", [
            str(bin_dir / "crl-kubelet"),
            f"--config={self.kubelet_dir / 'config.yaml'}",
            f"--kubeconfig={self.kubelet_dir / 'kubeconfig'}",
            f"--root-dir={self.kubelet_dir / 'root'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            f"--node-labels={NODE_KEY}={self.label},type=real",
            f"--register-with-taints={NODE_KEY}={self.label}:NoSchedule",
            "--v=1",
        ])  # fmt: skip
        self._wait(f"Node {self.name} to be Ready", self._ready)

    def _dnat_rule(self) -> list[str]:
        port = self.cluster.server.rsplit(":", 1)[1]
        return [
            "PREROUTING", "-i", self.bridge, "-d", KUBERNETES_SERVICE_IP, "-p", "tcp",
            "--dport", "443", "-m", "comment", "--comment", f"crl-node-{self.id}",
            "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}",
        ]  # fmt: skip

    def _route_api(self) -> None:
        """Let pods reach the API server at the ``kubernetes`` Service's address.

        The API server listens on 127.0.0.1 and no kube-proxy runs, so the node does the one
        translation in-cluster clients need: TCP from its bridge to 10.96.0.1:443 goes to the
        API server (DNAT to loopback, which ``route_localnet`` permits on that bridge only).
        """
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], capture_output=True,
                       check=False)  # fmt: skip
        subprocess.run(["ip", "link", "set", self.bridge, "up"], capture_output=True, check=False)
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/route_localnet").write_text("1\n")
        result = subprocess.run(["iptables", "-w", "-t", "nat", "-A", *self._dnat_rule()],
                                capture_output=True, text=True, check=False)  # fmt: skip
        if result.returncode != 0:
            raise NodeError(f"iptables: cannot route the API server to pods: {result.stderr}")

    def _api_rules(self) -> list[str]:
        listed = subprocess.run(["iptables", "-w", "-t", "nat", "-S", "PREROUTING"],
                                capture_output=True, text=True, check=False)  # fmt: skip
        return [line for line in listed.stdout.splitlines() if f"crl-node-{self.id}" in line]

    def _unroute_api(self) -> None:
        for _ in self._api_rules():
            subprocess.run(["iptables", "-w", "-t", "nat", "-D", *self._dnat_rule()],
                           capture_output=True, check=False)  # fmt: skip

    def _ctr_ok(self) -> bool:
        try:
            self.ctr("version", timeout=5)
        except (NodeError, subprocess.TimeoutExpired):
            return False
        return True

    def _write_cni(self) -> None:
        conf_dir = self.workdir / "cni"
        conf_dir.mkdir(exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": f"crl-{self.id}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni-ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }
        (conf_dir / "10-crl.conflist").write_text(json.dumps(conflist, indent=2) + "\n")

    def _write_containerd_config(self) -> None:
        w = self.workdir
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        text = f"""\
# Written by tests/node.py: a containerd of the real test node, sharing nothing with others.
version = 2
root = "{w / "containerd-root"}"
state = "{self._run_dir / "state"}"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self._run_dir / "containerd-ttrpc.sock"}"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{w / "containerd-opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # This VM refuses writes to /proc/self/oom_score_adj below the current value: without this,
  # runc fails every sandbox ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{w / "cni"}"
  max_conf_num = 1
"""
        (w / "containerd.toml").write_text(text)

    def _write_kubelet_files(self) -> None:
        directory = self.kubelet_dir
        (directory / "root").mkdir(parents=True, exist_ok=True)
        (directory / "pod-logs").mkdir(exist_ok=True)
        client = self.cluster.issue_certificate(
            f"node-{self.name}", f"/O=system:nodes/CN=system:node:{self.name}"
        )
        serving = self.cluster.issue_certificate(
            f"node-{self.name}-serving", f"/CN={self.name}",
            server_names=[self.node_ip, "127.0.0.1", self.name],
        )  # fmt: skip
        # RBAC only (no Node authorizer here): the kubelet's identity gets the system:node role.
        binding = self.cluster.kubectl(
            "create", "clusterrolebinding", f"crl-node-{self.name}", "--clusterrole=system:node",
            f"--user=system:node:{self.name}", "--dry-run=client", "-o", "json",
        ).stdout  # fmt: skip
        self.cluster.kubectl("apply", "-f", "-", input=binding)
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "crl-test", "cluster": {
                "server": self.cluster.server, "certificate-authority": str(self.cluster.ca_file)}}],
            "users": [{"name": "kubelet", "user": {
                "client-certificate": str(client[0]), "client-key": str(client[1])}}],
            "contexts": [{"name": "crl-test", "context": {"cluster": "crl-test", "user": "kubelet"}}],
            "current-context": "crl-test",
        }  # fmt: skip
        (directory / "kubeconfig").write_text(json.dumps(kubeconfig, indent=2) + "\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "tlsCertFile": str(serving[0]),
            "tlsPrivateKeyFile": str(serving[1]),
            # Who may call the kubelet's API (exec, logs): clients with a certificate of the
            # cluster CA (the API server's kubelet client) or a token the API server accepts,
            # each authorized by the API server (SubjectAccessReview). Never anonymous.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cluster.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "imageServiceEndpoint": f"unix://{self.containerd_socket}",
            # This host has cgroup v1 and no systemd as PID 1.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failSwapOn": False,
            "podLogsDir": str(directory / "pod-logs"),
            "staticPodPath": "",
            "syncFrequency": "10s",
            "fileCheckFrequency": "60s",
            "nodeStatusUpdateFrequency": "5s",
            "nodeStatusReportFrequency": "30s",
            "serializeImagePulls": False,
            # Images are imported, never pulled: never collect them, never evict for disk.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "protectKernelDefaults": False,
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            # Service names resolve (tests/clusterdns.py): ClusterFirst pods get this server
            # and the usual search path.
            "clusterDNS": [self.dns_ip],
            "clusterDomain": "cluster.local",
            "maxPods": 110,
            "shutdownGracePeriod": "0s",
            "localStorageCapacityIsolation": True,
        }  # fmt: skip
        (directory / "config.yaml").write_text(json.dumps(config, indent=2) + "\n")

    def _spawn(self, name: str, command: list[str]) -> None:
        log_path = self.workdir / f"{name}.log"
        log_file = log_path.open("ab")
        log.debug("starting %s: %s", name, " ".join(command))
        popen = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            cwd=self.workdir, start_new_session=True,
        )  # fmt: skip
        self._processes.append(_Process(name, popen, log_path, log_file))

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of containerd's and the kubelet's logs, for error messages."""
        parts = []
        for proc in self._processes:
            try:
                text = proc.log_path.read_text(errors="replace")
            except OSError:
                text = "(no log)"
            parts.append(f"--- {proc.name} ({proc.log_path}) ---\n"
                         + "\n".join(text.splitlines()[-lines:]))  # fmt: skip
        return "\n".join(parts)

    def _wait(self, what: str, condition: Any, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        delay = 0.1
        while True:
            for proc in self._processes:
                if proc.popen.poll() is not None:
                    raise NodeError(
                        f"{proc.name} exited with {proc.popen.returncode} while waiting for "
                        f"{what}.\n{self.log_tails()}"
                    )
            if condition():
                return
            if time.monotonic() > deadline:
                raise NodeError(f"timed out waiting for {what}.\n{self.log_tails()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _ready(self) -> bool:
        result = self.cluster.kubectl("get", "node", self.name, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # -- teardown -----------------------------------------------------------------------------

    def _drain(self) -> None:
        """Delete every pod bound to this node and wait (bounded) for the kubelet to stop them."""
        selector = f"spec.nodeName={self.name}"
        result = self.cluster.kubectl(
            "delete", "pods", "--all-namespaces", f"--field-selector={selector}",
            "--grace-period=1", "--wait=false", check=False, timeout=60,
        )  # fmt: skip
        if result.returncode != 0:
            log.warning("deleting the real node's pods failed: %s", result.stderr)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listed = self.cluster.kubectl(
                "get", "pods", "--all-namespaces", f"--field-selector={selector}", "-o", "name",
                check=False,
            )  # fmt: skip
            if listed.returncode == 0 and not listed.stdout.strip():
                return
            time.sleep(0.5)
        log.warning("pods of %s were not gone after 60s; removing their containers", self.name)

    def _stop_process(self, name: str) -> None:
        for proc in self._processes:
            if proc.name != name or proc.popen.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop on SIGTERM; killing it", name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)

    def _containerd_running(self) -> bool:
        return any(p.name == "containerd" and p.popen.poll() is None for p in self._processes)

    def _remove_containers(self) -> None:
        """Kill and delete every task and container containerd still has (the kubelet is gone)."""
        if not self._containerd_running():
            return
        try:
            tasks = self.ctr("tasks", "list", "-q", timeout=30).split()
            for task in tasks:
                with contextlib.suppress(NodeError, subprocess.TimeoutExpired):
                    self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", task, timeout=30)
            for task in tasks:
                with contextlib.suppress(NodeError, subprocess.TimeoutExpired):
                    self.ctr("tasks", "delete", "-f", task, timeout=30)
            for container in self.ctr("containers", "list", "-q", timeout=30).split():
                with contextlib.suppress(NodeError, subprocess.TimeoutExpired, ValueError):
                    info = json.loads(self.ctr("containers", "info", container, timeout=30))
                    for namespace in info.get("Spec", {}).get("linux", {}).get("namespaces", []):
                        if namespace.get("type") == "network" and namespace.get("path"):
                            self._netns_paths.add(namespace["path"])
                with contextlib.suppress(NodeError, subprocess.TimeoutExpired):
                    self.ctr("containers", "delete", container, timeout=30)
        except (NodeError, subprocess.TimeoutExpired) as error:
            log.warning("removing the real node's containers: %s", error)

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for directory in _cgroup_dirs(self.cgroup_root):
            if not directory.is_dir():
                continue
            for procs in directory.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(line) for line in procs.read_text().split())
        return pids

    def _kill_cgroup_processes(self) -> None:
        """SIGKILL every process still in the node's cgroups (containers whose shim is gone)."""
        deadline = time.monotonic() + 10
        while (pids := self._cgroup_pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _remove_netns(self) -> None:
        """Remove the pod network namespaces of containers that were not torn down by the
        kubelet (containerd 1.6 keeps them as bind mounts in /run/netns)."""
        for path in sorted(self._netns_paths):
            subprocess.run(["umount", "-l", path], capture_output=True, check=False)
            with contextlib.suppress(OSError):
                Path(path).unlink()
        self._netns_paths.clear()

    def _cni_rules(self) -> list[str]:
        listed = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True,
                                text=True, check=False)  # fmt: skip
        marker = f'name: \\"crl-{self.id}\\"'
        return [line for line in listed.stdout.splitlines() if marker in line]

    def _remove_cni_rules(self) -> None:
        """Remove the bridge plugin's masquerading rules of pods whose CNI DEL never ran."""
        chains = set()
        for rule in self._cni_rules():
            parts = shlex.split(rule)
            if parts[:2] == ["-A", "POSTROUTING"]:
                subprocess.run(["iptables", "-w", "-t", "nat", "-D", *parts[1:]],
                               capture_output=True, check=False)  # fmt: skip
                if "-j" in parts:
                    chains.add(parts[parts.index("-j") + 1])
        for chain in chains:
            for action in ("-F", "-X"):
                subprocess.run(["iptables", "-w", "-t", "nat", action, chain],
                               capture_output=True, check=False)  # fmt: skip

    def _kill_shims(self) -> None:
        """SIGKILL shims still serving this containerd; tini (their subreaper) reaps them."""
        for pid, _ in processes_using(str(self.containerd_socket)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while processes_using(str(self.containerd_socket)) and time.monotonic() < deadline:
            time.sleep(0.1)

    def _make_cgroup_root(self) -> None:
        """Create the kubelet's cgroup root in every hierarchy (the kubelet requires it)."""
        for directory in _cgroup_dirs(self.cgroup_root):
            directory.mkdir(exist_ok=True)
            # A new cpuset cgroup has no CPUs or memory nodes until given its parent's.
            for name in ("cpuset.cpus", "cpuset.mems"):
                own = directory / name
                if own.exists() and not own.read_text().strip():
                    own.write_text((directory.parent / name).read_text())

    def _remove_cgroup_root(self) -> None:
        """Remove the cgroup root and everything below it (bottom-up; they hold no process)."""
        for directory in _cgroup_dirs(self.cgroup_root):
            if not directory.exists():
                continue
            children = sorted((d for d in directory.rglob("*") if d.is_dir()),
                              key=lambda d: len(d.parts), reverse=True)  # fmt: skip
            for child in [*children, directory]:
                try:
                    child.rmdir()
                except OSError as error:
                    log.warning("cannot remove cgroup %s: %s", child, error)

    def _unmount_all(self) -> None:
        """Lazily unmount everything under the node's folders (volumes, rootfs, shm, netns)."""
        for directory in [self.workdir, *([self._run_dir] if self._own_run_dir else [])]:
            for _ in range(3):
                points = mounts_under(directory)
                if not points:
                    break
                for point in points:
                    result = subprocess.run(["umount", "-l", point], capture_output=True,
                                            text=True, check=False)  # fmt: skip
                    if result.returncode != 0:
                        log.debug("umount %s: %s", point, result.stderr.strip())


__all__ = [
    "NODE_KEY",
    "PAUSE_IMAGE",
    "Leftovers",
    "NodeError",
    "RealNode",
    "build",
    "image_archive",
    "missing",
]
