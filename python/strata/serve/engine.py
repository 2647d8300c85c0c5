"""The serving engine: one thread owns the Model and runs steps; each request is a Job (a sequence
with its own tokens, sampler and stop strings) that takes slots, queues and can be cancelled.

What a step is today: the native Model has one KV cache, so one step advances one sequence (its
prompt, or one token). Sequences in flight take turns of `turn` tokens; a sequence whose tokens
are not in the KV cache re-runs them (Generator::reclaim_kv) before its next token. A batched
native step (several sequences, each with its own KV region) replaces `_run_step`'s loop over the
batch and `_schedule`'s width of 1; nothing else here changes."""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from strata import _core
from strata.tokenizer import StreamDecoder

log = logging.getLogger("strata.serve")

# Sequences advanced by one native step: 1 until the native side has one KV region per sequence.
NATIVE_BATCH = 1

# finish_reason of the OpenAI schema for each native stop_reason.
FINISH_REASON = {"stop_token": "stop", "stop_string": "stop", "max_tokens": "length", "ctx_full": "length"}


@dataclass
class Piece:
    """Text the sequence made since the last piece."""

    text: str


@dataclass
class Done:
    """The sequence ended: finish_reason ('stop' or 'length') and its stats."""

    finish_reason: str
    stats: dict[str, Any]


@dataclass
class Failed:
    """The sequence could not run: an HTTP status, OpenAI's error type and code, and why."""

    status: int
    type: str
    code: str | None
    message: str


Event = Piece | Done | Failed


class QueueFull(Exception):
    """Every slot is busy and the queue is full; retry_after: seconds a client should wait."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Stopped(Exception):
    """The engine is shutting down and takes no new requests."""


@dataclass(eq=False)
class Job:
    """One request's sequence. `emit` is called on the engine thread with each Event, and must
    not block (the server hands it to its event loop)."""

    ids: list[int]
    params: _core.GenParams
    stops: list[str]
    emit: Callable[[Event], None]
    id: str = ""
    submitted: float = field(default_factory=time.monotonic)
    # Set from any thread; the engine drops the job before its next step.
    cancelled: bool = False
    # The engine's own, touched on its thread only.
    gen: _core.Generator | None = None
    started: float = 0.0
    text: str = ""
    emitted: int = 0
    decoder: StreamDecoder | None = None
    ended: bool = False


@dataclass
class Counters:
    """What /metrics reports: totals since start, updated on the engine thread."""

    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    prompt_reused: int = 0
    generated: int = 0
    recomputed: int = 0
    steps: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    cache: dict[str, Any] = field(default_factory=dict)


class Engine:
    """Runs Jobs on `model` from one thread: up to `parallel` in flight, `max_queue` more waiting.

    submit() never blocks; the thread starts with start() and ends with shutdown(), which fails
    every job still in flight or waiting with 503 (nothing ends silently)."""

    def __init__(self, model: Any, parallel: int = 1, max_queue: int = 64, turn: int = 16) -> None:
        if parallel < 1 or max_queue < 0 or turn < 1:
            raise _core.ConfigError(f"parallel must be >= 1, max_queue >= 0 and turn >= 1; got {parallel}, "
                                    f"{max_queue}, {turn}")
        self.model = model
        self.parallel = parallel
        self.max_queue = max_queue
        self.turn = turn
        self.counters = Counters()
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._active: list[Job] = []
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._current: Job | None = None  # whose turn it is
        self._turn_left = 0
        self._rr = 0  # the current job's place in _active
        self._kv_gen: _core.Generator | None = None  # the generator that last ran: it holds the KV cache
        self._service_ema = 0.0  # seconds a request holds a slot, smoothed (for Retry-After)
        self._ids = itertools.count(1)
        self.counters.cache = dict(model.cache)

    # ---- from any thread ----
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="strata-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queues `job`; QueueFull when every slot is busy and the queue is full, Stopped when
        shutting down."""
        with self._cv:
            if self._stopping:
                raise Stopped("the server is shutting down")
            if len(self._active) + len(self._waiting) >= self.parallel + self.max_queue:
                self.counters.rejected += 1
                raise QueueFull(f"all {self.parallel} slots are busy and {len(self._waiting)} requests are "
                                "waiting (the queue is full); retry later", self._retry_after())
            if not job.id:
                job.id = f"{next(self._ids)}"
            self._waiting.append(job)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        """Drops `job` before its next step (a client that went away)."""
        with self._cv:
            job.cancelled = True
            self._cv.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Runs fn() on the engine thread between two steps; its Future has the result."""
        fut: Future = Future()
        with self._cv:
            if self._stopping or self._thread is None:
                fut.set_exception(Stopped("the engine is not running"))
                return fut
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut

    def state(self) -> dict[str, int]:
        with self._cv:
            return {"slots": self.parallel, "slots_busy": len(self._active), "queue": len(self._waiting),
                    "queue_max": self.max_queue}

    def shutdown(self, reason: str = "the server is shutting down", wait: float = 0.5) -> bool:
        """Stops taking requests, fails every job in flight or waiting with 503 `reason`, and waits
        up to `wait` seconds for the step in progress; False when it is still running (a prompt
        inside the native model cannot be stopped from another thread)."""
        with self._cv:
            self._stopping = True
            jobs = list(self._active) + list(self._waiting)
            self._waiting.clear()
            calls = list(self._calls)
            self._calls.clear()
            self._cv.notify_all()
        for j in jobs:
            with self._cv:
                if j.ended:
                    continue
                j.ended = j.cancelled = True
                self.counters.failed += 1
            j.emit(Failed(503, "server_error", "server_shutting_down", reason))
        for _, fut in calls:
            fut.set_exception(Stopped(reason))
        if self._thread is None:
            return True
        self._thread.join(wait)
        return not self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        return len(self._active)

    # ---- the engine thread ----
    def _retry_after(self) -> int:
        per = self._service_ema or 1.0
        return max(1, min(60, math.ceil(per * (len(self._waiting) + 1) / self.parallel)))

    def _loop(self) -> None:
        while True:
            try:
                if not self._cycle():
                    return
            except Exception as e:  # a bug: said once; the jobs in flight fail and the engine goes on
                log.error("engine: %s: %s", type(e).__name__, e)
                for j in list(self._active):
                    try:
                        self._fail(j, Failed(500, "server_error", None, f"internal error: {type(e).__name__}: {e}"))
                    except Exception:
                        self._active.remove(j)

    def _cycle(self) -> bool:
        """Waits for work, then runs the calls and one step; False when stopping."""
        with self._cv:
            while not self._stopping and not self._calls and not self._runnable():
                self._cv.wait()
            if self._stopping:
                return False
            calls = list(self._calls)
            self._calls.clear()
            self._reap()
            self._admit()
            batch = self._schedule()
        for fn, fut in calls:
            try:
                fut.set_result(fn())
            except Exception as e:  # handed to the caller, who answers its client
                fut.set_exception(e)
        if batch:
            self._run_step(batch)
            with self._cv:
                self.counters.steps += 1
        return True

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs (False before start() and after shutdown)."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def _runnable(self) -> bool:
        return bool(self._active or self._waiting)

    def _reap(self) -> None:
        """Drops cancelled jobs (waiting or in flight): their slots are free for this step."""
        for j in [j for j in self._waiting if j.cancelled]:
            self._waiting.remove(j)
            self._end(j, None)
        for j in [j for j in self._active if j.cancelled]:
            if j.gen is not None:
                j.gen.finish("caller")
            self._end(j, None)

    def _admit(self) -> None:
        while self._waiting and len(self._active) < self.parallel:
            j = self._waiting.popleft()
            j.started = time.monotonic()
            self._active.append(j)

    def _schedule(self) -> list[Job]:
        """The jobs the next step advances: the one whose turn it is (round robin in admission
        order, `turn` steps each, so that switching, which re-runs a sequence's tokens, is seldom)."""
        if not self._active:
            self._current = None
            return []
        cur = self._current
        if cur in self._active:
            if self._turn_left <= 0:  # its turn is over: the next one's
                self._rr = (self._active.index(cur) + 1) % len(self._active)
                self._current = self._active[self._rr]
                self._turn_left = self.turn
        else:  # it ended: the one that followed it has moved into its place
            self._rr %= len(self._active)
            self._current = self._active[self._rr]
            self._turn_left = self.turn
        self._turn_left -= 1
        return [self._current][:NATIVE_BATCH]

    def _run_step(self, batch: list[Job]) -> None:
        for j in batch:
            try:
                self._advance(j)
            except _core.ConfigError as e:  # a request the native checks refuse (e.g. too long)
                self._fail(j, Failed(400, "invalid_request_error", None, str(e)))
            except Exception as e:  # strata.Error or worse: the server answers, logs and goes on
                self._fail(j, Failed(500, "server_error", None, f"{type(e).__name__}: {e}"))

    def _advance(self, j: Job) -> None:
        """One step of `j`: its prompt (and first token), or its next token."""
        if j.gen is None:
            gen = _core.Generator(self.model._m)
            j.decoder = StreamDecoder(self.model.tokenizer, skip_special=True)
            j.gen = gen
            gen.begin(j.ids, j.params, reuse=self._kv_gen)
            self._kv_gen = gen
        tok = j.gen.next()
        self._kv_gen = j.gen
        hold = max((len(s) for s in j.stops), default=1) - 1
        if tok >= 0:
            j.text += j.decoder.feed(tok)  # type: ignore[union-attr]
        else:
            j.text += j.decoder.flush()  # type: ignore[union-attr]
        hit = min((i for i in (j.text.find(s, max(0, j.emitted - hold)) for s in j.stops) if i >= 0), default=-1)
        if hit >= 0:
            j.text = j.text[:hit]
            j.gen.finish("stop_string")
        ended = hit >= 0 or tok < 0
        safe = len(j.text) if ended or not j.stops else len(j.text) - hold
        if safe > j.emitted:
            j.emit(Piece(j.text[j.emitted:safe]))
            j.emitted = safe
        if ended:
            st = j.gen.stats()
            self._end(j, Done(FINISH_REASON.get(st["stop_reason"], "stop"), self._stats(j, st)))

    def _stats(self, j: Job, st: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "prompt_tokens": st["prompt_total"], "prompt_reused": st["prompt_reused"],
            "completion_tokens": st["generated"], "recomputed": st["recomputed"],
            "stop_reason": st["stop_reason"], "prompt_ms": st["prompt_ms"], "decode_ms": st["decode_ms"],
            "queue_ms": (j.started - j.submitted) * 1000, "total_ms": (now - j.submitted) * 1000,
        }

    def _fail(self, j: Job, ev: Failed) -> None:
        if j.gen is not None:
            j.gen.finish("caller")
        self._end(j, ev)

    def _end(self, j: Job, ev: Done | Failed | None) -> None:
        """Frees `j`'s slot, counts it, and sends its last event (None: cancelled, no one listens).
        A job the shutdown already ended (and counted) only gives its tokens to the totals."""
        with self._cv:
            if j in self._active:
                self._active.remove(j)
            c = self.counters
            if j.gen is not None:
                st = j.gen.stats()
                c.prompt_tokens += st["prompt_tokens"]
                c.prompt_reused += st["prompt_reused"]
                c.generated += st["generated"]
                c.recomputed += st["recomputed"]
                c.prompt_seconds += st["prompt_ms"] / 1000
                c.decode_seconds += st["decode_ms"] / 1000
            if j.ended:
                return
            j.ended = True
            if isinstance(ev, Done):
                c.finished += 1
                held = time.monotonic() - (j.started or j.submitted)
                self._service_ema = held if not self._service_ema else 0.8 * self._service_ema + 0.2 * held
            elif isinstance(ev, Failed):
                c.failed += 1
            else:
                c.cancelled += 1
        if ev is not None:
            j.emit(ev)
        # The expert cache's counters change only in steps: read here, on this thread, for /metrics.
        self.counters.cache = dict(self.model.cache)
