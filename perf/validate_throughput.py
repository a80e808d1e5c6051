"""How fast offline validation is: cold start of `crl validate`, and documents per second.

    python perf/validate_throughput.py [--documents N]

Prints figures; asserts nothing. Validation runs on every `crl validate`, in `crl render`, and
when a worker loads its config, so its cost should stay well under a second for real files.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from crl_worker.api.validation import validate_text

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Run the measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=300)
    args = parser.parse_args()

    example = (ROOT / "examples" / "trainingrun-qwen3-8b-swe-gym.yaml").read_text()
    stream = "---\n".join([example] * args.documents)
    validate_text(example)  # warm the schema and CEL caches
    start = time.perf_counter()
    results = validate_text(stream)
    elapsed = time.perf_counter() - start
    assert all(r.ok for r in results)
    print(
        f"in-process: {args.documents} TrainingRun documents in {elapsed:.2f} s "
        f"= {args.documents / elapsed:.0f} documents/s"
    )

    runs = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "crl_cli",
                "validate",
                *map(str, sorted((ROOT / "examples").glob("*.yaml"))),
            ],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        runs.append(time.perf_counter() - start)
    print(
        f"crl validate examples/*.yaml (a new process each time): median {statistics.median(runs):.2f} s, "
        f"min {min(runs):.2f} s over {len(runs)} runs"
    )


if __name__ == "__main__":
    main()
