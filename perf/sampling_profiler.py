"""A small sampling profiler for a whole Python process, every thread included.

    python perf/sampling_profiler.py REPORT -m crl_operator [ARGS...]

Runs the module as ``python -m`` would, while a daemon thread samples every thread's stack
(``sys._current_frames``) every 5 ms. At exit it writes REPORT: per thread group (the thread
name without its number), the functions that were on the stack most often (inclusive) and at
the top (self). cProfile sees only the main thread and slows every call; this costs one short
GIL hold per sample. ``perf/operator_scale.py --profile`` uses it for the operator.
"""

from __future__ import annotations

import atexit
import re
import runpy
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType

INTERVAL = 0.005
TOP = 40


def _where(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{code.co_firstlineno} {code.co_name}"


class Sampler:
    """Samples every thread but its own; counts inclusive and self hits per thread group."""

    def __init__(self) -> None:
        self.inclusive: dict[str, Counter[str]] = {}
        self.self_: dict[str, Counter[str]] = {}
        self.samples: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def _loop(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(INTERVAL):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                group = re.sub(r"[-_]?\d+(_\d+)?$", "", names.get(ident, "?"))
                self.samples[group] += 1
                seen: set[str] = set()
                top = _where(frame)
                f: FrameType | None = frame
                while f is not None:
                    seen.add(_where(f))
                    f = f.f_back
                self.inclusive.setdefault(group, Counter()).update(seen)
                self.self_.setdefault(group, Counter())[top] += 1

    def report(self, path: Path) -> None:
        """Stop and write the report."""
        self._stop.set()
        self._thread.join()  # its last sample may still be counting
        lines = [f"sampled every {INTERVAL * 1000:.0f} ms"]
        for group, n in self.samples.most_common():
            lines.append(f"\n=== thread group {group!r}: {n} samples ===")
            lines.append("-- self (top of stack) --")
            for where, hits in self.self_[group].most_common(TOP):
                lines.append(f"{hits:>8} {100 * hits / n:5.1f}%  {where}")
            lines.append("-- inclusive --")
            for where, hits in self.inclusive[group].most_common(TOP):
                lines.append(f"{hits:>8} {100 * hits / n:5.1f}%  {where}")
        path.write_text("\n".join(lines) + "\n")


def main() -> None:
    """Profile ``-m module args...`` into the report path given first."""
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit(__doc__)
    report, module = Path(sys.argv[1]), sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    sampler = Sampler()
    atexit.register(sampler.report, report)
    sampler.start()
    started = time.perf_counter()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        print(f"profiled {time.perf_counter() - started:.1f}s into {report}", file=sys.stderr)


if __name__ == "__main__":
    main()
