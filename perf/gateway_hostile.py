"""Peak memory of a local pool gateway under hostile requests (issue 17).

    python perf/gateway_hostile.py [--memory-limit-mb 4096] [--output-mb 200] [--skip-reads]
                                   [--json]

Starts ``python -m crl_worker.pool`` (local backend) over a one-file git repository, leases a
sandbox, then sends what the issue found, measuring the gateway's peak RSS (``VmHWM``) after
each:

1. ``GET files?path=/dev/zero`` (an endless device);
2. ``GET files?path=zero`` where ``zero`` is a link in the tree to ``/dev/zero``;
3. ``GET files?path=/proc/self/environ`` (does the gateway's own environment come back?);
4. a NUL byte in the path; ``PUT`` to an absolute path outside the sandbox;
5. ``POST run`` with ``max_output`` 10^12 and ``--output-mb`` of output.

The gateway runs under ``RLIMIT_AS`` = ``--memory-limit-mb`` so that an unbounded read ends in
a MemoryError instead of taking the machine. Run it against another checkout's code with
``PYTHONPATH=<checkout>/worker/src`` (a checkout before the fix needs no token; the header is
sent anyway). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

TOKEN = "perf-gateway-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _repo(root: Path) -> tuple[Path, str]:
    repo = root / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("hello\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "p", "GIT_AUTHOR_EMAIL": "p@x", "GIT_COMMITTER_NAME": "p",
           "GIT_COMMITTER_EMAIL": "p@x"}  # fmt: skip
    for argv in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "base"]):
        subprocess.run(argv, cwd=repo, check=True, env=env)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True)
    return repo, head.stdout.decode().strip()


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    """Run the measurement and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit-mb", type=int, default=4096)
    parser.add_argument("--output-mb", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--skip-reads", action="store_true", help="only the command output (its own peak)"
    )
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="crl-perf-gw-") as tmp:
        root = Path(tmp)
        repo, commit = _repo(root)
        task = {"instance_id": "perf__gw-1", "repo": "perf/gw", "base_commit": commit,
                "language": "other", "source": str(repo), "test": {"command": "true", "log_format": "pytest"}}  # fmt: skip
        tasks = root / "tasks.jsonl"
        tasks.write_text(json.dumps(task) + "\n")
        port = _free_port()
        limit = args.memory_limit_mb << 20

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        log = (root / "gateway.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "crl_worker.pool", "--tasks", str(tasks), "--format", "task",
             "--backend", "local", "--port", str(port), "--local-root", str(root / "sb"),
             "--max-sandboxes", "1", "--warm", "0"],
            env={**os.environ, "CRL_POOL_TOKEN": TOKEN, "CRL_PERF_SECRET": "perf-secret-42"},
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=cap,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit((root / "gateway.log").read_text())
                time.sleep(0.2)
            http = httpx.Client(base_url=url, headers=headers, timeout=600)
            figures["idle_mb"] = round(_hwm_mb(proc.pid), 1)
            lease = http.post("/v1/leases", json={"instance_id": "perf__gw-1"}).json()
            lease_id = lease["lease_id"]
            http.post(f"/v1/leases/{lease_id}/run", json={"command": "ln -s /dev/zero zero"})
            figures["leased_mb"] = round(_hwm_mb(proc.pid), 1)
            reads = [("dev_zero", "/dev/zero"), ("link_to_dev_zero", "zero"),
                     ("proc_self_environ", "/proc/self/environ"), ("nul_byte", "a\x00b"),
                     ("write_outside", None)]  # fmt: skip
            for name, path in [] if args.skip_reads else reads:
                started = time.monotonic()
                try:
                    files = f"/v1/leases/{lease_id}/files"
                    if path is None:
                        outside = root / "written-outside"
                        answer = http.put(files, params={"path": str(outside)}, content=b"x")
                        figures["file_written_outside"] = outside.exists()
                    else:
                        answer = http.get(files, params={"path": path})
                    status: Any = answer.status_code
                    leaked = b"perf-secret-42" in answer.content or TOKEN.encode() in answer.content
                except httpx.HTTPError as exc:
                    status, leaked = type(exc).__name__, False
                figures[name] = {
                    "status": status,
                    "seconds": round(time.monotonic() - started, 2),
                    "peak_mb": round(_hwm_mb(proc.pid), 1) if proc.poll() is None else "exited",
                    "secret_in_answer": leaked,
                }
            command = f"head -c {args.output_mb << 20} /dev/zero | tr '\\0' a"
            started = time.monotonic()
            try:
                answer = http.post(
                    f"/v1/leases/{lease_id}/run",
                    json={"command": command, "max_output": 10**12, "timeout": 600},
                )
                body = answer.json() if answer.status_code == 200 else {}
                status = answer.status_code
            except httpx.HTTPError as exc:
                body, status = {}, type(exc).__name__
            figures["run_max_output_1e12"] = {
                "status": status,
                "output_bytes": len(body.get("output", "")),
                "truncated": body.get("truncated"),
                "seconds": round(time.monotonic() - started, 2),
                "peak_mb": round(_hwm_mb(proc.pid), 1) if proc.poll() is None else "exited",
            }
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
