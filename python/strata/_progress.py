"""A byte progress bar on stderr that appears only when a load takes over a second."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """Callable (done, total) -> None; silent for loads that finish within `delay` seconds."""

    def __init__(self, label: str, delay: float = 1.0, stream=None) -> None:
        self.label = label
        self.delay = delay
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self.shown = False
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        elapsed = now - self.t0
        if elapsed < self.delay and done < total:
            return
        if not self.shown and done >= total and elapsed < self.delay:
            return
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        self.shown = True
        frac = done / total if total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = done / elapsed / 2**30 if elapsed > 0 else 0.0
        eta = (total - done) / (done / elapsed) if done and elapsed > 0 else 0.0
        self.stream.write(
            f"\r{self.label} [{bar}] {frac * 100:5.1f}% {done / 2**30:6.2f}/{total / 2**30:.2f} GiB "
            f"{rate:5.2f} GiB/s ETA {eta:4.0f}s"
        )
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()
