"""The `strata` command's entry point. Importing strata (numpy, the native module) takes ~0.2 s, before
strata.cli can catch anything: a Ctrl-C then would end in Python's KeyboardInterrupt traceback. This
module imports nothing heavy; it answers SIGINT during those imports as the command does later (one line,
status 130), then hands SIGINT back and runs strata.cli."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

EXIT_INTERRUPTED = 130  # as strata.cli's


def _interrupted(signum: int, frame: Any) -> None:
    sys.stderr.write("\nstrata: interrupted\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def main() -> None:
    # A command started with SIGINT ignored (a background job) keeps it ignored.
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupted)
    from strata.cli import main as cli_main

    signal.signal(signal.SIGINT, previous)
    cli_main()
