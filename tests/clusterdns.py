"""Cluster DNS for the real node: Service names resolve in its pods, as on any cluster.

The test cluster runs no kube-proxy and no CoreDNS, yet the project's children find each other
by Service name (a benchmark runner reaches its pool's gateway at ``http://<pool>-gateway:8080``,
the operator logs in at ``kubernetes.default.svc``). :class:`ClusterDNS` is a small UDP server
on the node's bridge address, named in the kubelet's ``clusterDNS``, so pods with the default
``dnsPolicy: ClusterFirst`` get it, with the usual search path, in their ``resolv.conf``:

- ``kubernetes.default.svc.<domain>``: the Service's ClusterIP, 10.96.0.1 (the node DNATs that
  one address to the API server, tests/node.py);
- ``<service>.<namespace>.svc.<domain>`` of any other Service: the addresses of its ready
  endpoints (EndpointSlices), as for a headless Service, because without kube-proxy a ClusterIP
  leads nowhere. So a client reaches the Service only on ports its pods listen on themselves
  (``port`` equal to ``targetPort``, true of every Service the operator makes); Service load
  balancing is the client's resolver picking among the addresses;
- any other name: the host's own resolver (what ``dnsPolicy: Default`` would give); ``AAAA``
  and other types get an empty answer.

A and nothing else, UDP only, one query per datagram: enough for glibc's and Python's resolvers.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import struct
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Linux's IP_FREEBIND: bind to the bridge's address before the CNI plugin assigns it.
IP_FREEBIND = 15
TYPE_A = 1
CLASS_IN = 1
NOERROR, FORMERR, NXDOMAIN = 0, 1, 3
TTL = 5

#: (method, path) -> (status, body): the admin's raw API access (``Cluster.request``).
Requester = Callable[[str, str], tuple[int, str]]


def parse_query(packet: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end of the question) of a DNS query; ValueError when malformed."""
    if len(packet) < 12:
        raise ValueError("shorter than a DNS header")
    ident, flags, questions = struct.unpack("!HHH", packet[:6])
    if questions != 1:
        raise ValueError(f"{questions} questions")
    labels, offset = [], 12
    while True:
        if offset >= len(packet):
            raise ValueError("name runs past the packet")
        length = packet[offset]
        offset += 1
        if length == 0:
            break
        if length > 63:
            raise ValueError("compressed or oversized label in a question")
        labels.append(packet[offset : offset + length].decode("ascii", "replace"))
        offset += length
    if offset + 4 > len(packet):
        raise ValueError("question without type and class")
    qtype, _qclass = struct.unpack("!HH", packet[offset : offset + 4])
    return ident, flags, ".".join(labels).lower(), qtype, offset + 4


def build_answer(query: bytes, addresses: list[str], rcode: int = NOERROR) -> bytes:
    """The response to ``query``: its question, then one A record per address."""
    ident, flags, _name, _qtype, end = parse_query(query)
    # QR, the query's opcode and RD, authoritative, recursion available.
    reply_flags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080 | rcode
    header = struct.pack("!HHHHHH", ident, reply_flags, 1, len(addresses), 0, 0)
    records = b"".join(
        struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL, 4)
        + ipaddress.IPv4Address(address).packed
        for address in addresses
    )
    return header + query[12:end] + records


class ClusterDNS:
    """Serves the cluster's Service names on ``address``:53 (UDP) from a daemon thread."""

    def __init__(
        self, address: str, api: Requester, *, domain: str = "cluster.local",
        kubernetes_ip: str = "10.96.0.1", port: int = 53,
    ) -> None:  # fmt: skip
        self.address = address
        self.port = port
        self.domain = domain.strip(".")
        self.kubernetes_ip = kubernetes_ip
        self._api = api
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ClusterDNS:
        """Bind and serve; raises OSError when the port is taken."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
        sock.bind((self.address, self.port))
        self._socket = sock
        self._thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the socket; the thread ends with it."""
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
            self._socket.close()
            self._socket = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def resolve(self, name: str) -> list[str] | None:
        """IPv4 addresses of ``name``; None when no such name exists."""
        suffix = f".svc.{self.domain}"
        if not name.endswith(suffix):
            if name == self.domain or name.endswith("." + self.domain):
                return None
            try:
                return socket.gethostbyname_ex(name)[2]
            except OSError:
                return None
        parts = name[: -len(suffix)].split(".")
        if len(parts) != 2:
            return None
        service, namespace = parts
        if (service, namespace) == ("kubernetes", "default"):
            return [self.kubernetes_ip]
        status, _ = self._api("GET", f"/api/v1/namespaces/{namespace}/services/{service}")
        if status != 200:
            return None
        status, body = self._api(
            "GET",
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
            f"?labelSelector=kubernetes.io/service-name%3D{service}",
        )
        if status != 200:
            return []
        addresses: list[str] = []
        for slice_ in json.loads(body)["items"]:
            if slice_.get("addressType") != "IPv4":
                continue
            for endpoint in slice_.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready", True):
                    addresses += endpoint.get("addresses") or []
        return sorted(set(addresses))

    def _serve(self) -> None:
        sock = self._socket
        while sock is not None and sock.fileno() >= 0:
            try:
                packet, client = sock.recvfrom(4096)
            except OSError:
                return
            if not packet:
                return
            try:
                sock.sendto(self._answer(packet), client)
            except Exception:  # one bad query must not stop the server
                log.exception("cluster DNS: cannot answer a query from %s", client)

    def _answer(self, packet: bytes) -> bytes:
        try:
            _ident, _flags, name, qtype, _end = parse_query(packet)
        except ValueError as error:
            log.debug("cluster DNS: malformed query: %s", error)
            header = packet[:2] + struct.pack("!HHHHH", 0x8000 | FORMERR, 0, 0, 0, 0)
            return header if len(packet) >= 2 else b""
        addresses = self.resolve(name)
        if addresses is None:
            return build_answer(packet, [], NXDOMAIN)
        return build_answer(packet, addresses if qtype == TYPE_A else [])
