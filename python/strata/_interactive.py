"""`strata chat`: a multi-turn chat in the terminal, with the model's chat template and the history."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

import strata
from strata._progress import is_terminal
from strata.model import stop_stream

HELP = ("/exit or Ctrl-D leaves, Ctrl-C stops an answer, /reset forgets the conversation, "
        "/help shows this")
COMMANDS = ("/exit", "/quit", "/reset", "/help")


class ChatSession:
    """One conversation with `model`: read a line, answer it as the next user turn, keep both.

    Answers stream to `out`; notes and --stats go to `err`. Ctrl-C while an answer streams stops
    that answer only (the part shown stays in the history); at the input line it only says how to
    leave. `sampling` are generate()'s keywords, checked by the caller."""

    def __init__(self, model: strata.Model, system: str | None = None, stop: list[str] | None = None,
                 stats: bool = False, print_stats: Callable[[dict[str, Any]], None] | None = None,
                 ctx_full_note: Callable[[strata.Model, dict[str, Any]], str | None] | None = None,
                 out: TextIO | None = None, err: TextIO | None = None, **sampling: Any) -> None:
        self.model = model
        self.system = system
        self.stop = list(stop or [])
        self.stats = stats
        self.print_stats = print_stats
        self.ctx_full_note = ctx_full_note
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.sampling = sampling
        self.history: list[dict[str, str]] = []
        self.reset()

    def reset(self) -> None:
        self.history = [{"role": "system", "content": self.system}] if self.system else []

    def _note(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()

    def run(self) -> None:
        """Turns until /exit or end of input."""
        interactive = is_terminal(sys.stdin)
        if interactive:
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:
                pass
        name = self.model.spec.get("name") or self.model.spec["arch"]
        self._note(f"strata chat with {name}: {HELP}")
        while True:
            try:
                if not self._step("> " if interactive else ""):
                    return
            except KeyboardInterrupt:  # at the input line (an answer catches its own)
                self.out.write("\n")
                self._note(f"({HELP})")

    def _step(self, prompt: str) -> bool:
        """Reads and handles one line; False when the user leaves."""
        try:
            line = input(prompt)
        except EOFError:
            self.out.write("\n")
            return False
        text = line.strip()
        word = text.split()[0].lower() if text else ""
        if word in ("/exit", "/quit"):
            return False
        if word == "/reset":
            self.reset()
            self._note("(the conversation is forgotten)")
        elif word == "/help":
            self._note(HELP)
        elif word.startswith("/") and word not in COMMANDS and len(text.split()) == 1:
            self._note(f"unknown command {word}: {HELP}")
        elif text:
            self.turn(line)
        return True

    def turn(self, text: str) -> str:
        """Answers `text` as the user's next message, streaming it; returns the answer."""
        messages = [*self.history, {"role": "user", "content": text}]
        pieces: list[str] = []
        it = None
        stopped = False
        self.model.reset_stats()
        try:
            it = self.model.chat(messages, stream=True, stop=self.stop, reuse_kv=True, **self.sampling)
            for piece in it:
                pieces.append(piece)
                self.out.write(piece)
                self.out.flush()
        except KeyboardInterrupt:
            if it is not None:
                stop_stream(it)
            stopped = True
        except strata.Error as e:
            self.out.write("\n")
            self._note(f"strata: error: {e}; the message was not added (/reset starts over)")
            return ""
        self.out.write("\n")
        self.out.flush()
        if stopped:
            self._note("[stopped]")
        answer = "".join(pieces)
        self.history = [*messages, {"role": "assistant", "content": answer}]
        st = self.model.last_stats
        if self.stats and st and self.print_stats:
            self.print_stats(st)
        note = self.ctx_full_note(self.model, st) if self.ctx_full_note and st else None
        if note:
            self._note(note + ", or /reset to start over")
        return answer
