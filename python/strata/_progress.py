"""Progress on stderr for loads and prompts that take over a second, on a terminal only."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def _duration(s: float) -> str:
    s = int(s + 0.5)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class ProgressBar:
    """Callable (done, total) -> None; silent for loads that finish within `delay` seconds."""

    def __init__(self, label: str, delay: float = 1.0, stream: TextIO | None = None) -> None:
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


class PromptProgress:
    """Callable (tokens done, tokens in all): one line, `prompt 12288/72305 tokens, 45.2 tok/s, ETA 9m38s`,
    shown once the prompt has run `delay` seconds, at most ten times a second; close() erases it."""

    def __init__(self, delay: float = 1.0, stream: TextIO | None = None) -> None:
        self.delay = delay
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self.last = 0.0
        self.shown = False
        self.first: float | None = None  # tokens done at the first report (a reused beginning)

    def __call__(self, done: float, total: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = done
        elapsed = now - self.t0
        if elapsed < self.delay or now - self.last < 0.1:
            return
        self.last = now
        rate = (done - self.first) / elapsed
        eta = _duration((total - done) / rate) if rate > 0 else "?"
        self.stream.write(f"\rprompt {int(done)}/{total} tokens, {rate:.1f} tok/s, ETA {eta}\x1b[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
