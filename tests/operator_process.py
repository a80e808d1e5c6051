"""Run `python -m crl_operator` as a real subprocess against a test control plane.

Shared by the end-to-end tests and perf/operator_scale.py: start it on free ports, wait for
its health endpoint, read its Prometheus metrics, stop it politely or kill it (SIGKILL).
:class:`Operator` is the session's operator (the ``operator`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

from .cluster import Cluster, free_port
from .paths import ROOT

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text format as {(name, labels): value}."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels: set[tuple[str, str]] = set()
        if m.group(2):
            for part in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)):
                labels.add((part[0], part[1]))
        try:
            out[(m.group(1), frozenset(labels))] = float(m.group(3))
        except ValueError:
            continue
    return out


def metric_sum(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


class OperatorProcess:
    """One operator subprocess."""

    def __init__(
        self,
        kubeconfig: Path | str,
        *,
        namespaces: Sequence[str] = (),
        log_path: Path,
        extra_args: Sequence[str] = (),
        resync_seconds: float = 60,
        python_args: Sequence[str] = ("-m", "crl_operator"),
    ) -> None:
        self.kubeconfig = str(kubeconfig)
        self.namespaces = list(namespaces)
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.resync_seconds = resync_seconds
        # What follows the interpreter: perf/operator_scale.py --profile runs the module under
        # perf/sampling_profiler.py.
        self.python_args = list(python_args)
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> OperatorProcess:
        """Start and wait until the health endpoint answers."""
        args = [
            sys.executable,
            *self.python_args,
            "--kubeconfig",
            self.kubeconfig,
            "--metrics-port",
            str(self.metrics_port),
            "--health-port",
            str(self.health_port),
            "--log-format",
            "json",
            "--resync-seconds",
            str(self.resync_seconds),
            *[a for ns in self.namespaces for a in ("--namespace", ns)],
            *self.extra_args,
        ]
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the operator exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.health_port}/healthz", timeout=2
                ) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(
            f"the operator's /healthz did not answer in {timeout}s:\n{self.log_tail()}"
        )

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """The operator's current metrics."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return parse_metrics(r.read().decode())

    def rss_bytes(self) -> tuple[int, int]:
        """(current RSS, peak RSS) of the process, from /proc."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)

        def kib(key: str) -> int:
            return int(fields[key].split()[0]) * 1024

        return kib("VmRSS"), kib("VmHWM")

    def kill(self) -> None:
        """SIGKILL, as a node failure or an OOM kill would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, n: int = 60) -> str:
        """The last lines of the operator's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


#: The session operator's --image-registry (children name images there).
OTHER_REGISTRY = "registry.example.com/crl"


class Operator:
    """An operator subprocess watching every namespace; restartable (a killed one is replaced)."""

    #: The session's operator while it runs (set by the ``operator`` fixture), so that a test
    #: that installs another operator can pause it (:func:`session_operator_paused`).
    running: ClassVar[Operator | None] = None

    def __init__(self, cluster: Cluster, log_path: Path) -> None:
        self.cluster = cluster
        self.log_path = log_path
        self.proc = self._new()

    def _new(self) -> OperatorProcess:
        # Another registry than the default one, as a user who pushed the images elsewhere runs it.
        return OperatorProcess(
            self.cluster.kubeconfig,
            log_path=self.log_path,
            resync_seconds=20,
            extra_args=("--image-registry", OTHER_REGISTRY),
        )

    def restart(self) -> None:
        """A fresh process (new ports), as Kubernetes would restart the pod."""
        self.proc.stop()
        self.proc = self._new().start()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Stopped for the block, started again (new ports) after it."""
        self.proc.stop()
        try:
            yield
        finally:
            self.proc = self._new().start()

    def reconciles(self, kind: str, result: str | None = None) -> float:
        """crl_operator_reconciles_total for `kind` (and `result`)."""
        labels = {"kind": kind, **({"result": result} if result else {})}
        return metric_sum(self.proc.metrics(), "crl_operator_reconciles_total", **labels)


@contextlib.contextmanager
def session_operator_paused() -> Iterator[None]:
    """The session's operator, if one runs, stopped for the block.

    It watches every namespace: beside another operator (the chart's, installed in the cluster)
    both reconcile the same objects, each writing its own children (its images named under
    another registry), so a pool's gateway Deployment rolls back and forth and never serves.
    """
    running = Operator.running
    if running is None:
        yield
        return
    with running.paused():
        yield
