"""The serving engine: one thread owns the Model and runs steps; each request is a Job (a sequence
with its own tokens, sampler and stop strings) that takes a slot, queues and can be cancelled.

Slots are the Model's KV sequence regions (strata.Model(seqs=N); `strata serve --parallel N` loads
N). A step advances every sequence in flight: the pieces of new prompts (one prompt chunk of tokens
in all, each into its own region) in one native pass (_core.run_prompts), then one token of every
sequence that is decoding in another (_core.next_tokens); each pass fetches a layer's experts once for
all its rows. A new request joins between two steps, in the free slot whose region holds the longest beginning of its
prompt (a conversation's next turn runs only its new tokens). With more requests in flight than
regions (a Model of fewer seqs than `parallel`), the sequences of a region take turns of `turn`
steps, and one whose tokens are not in the region re-runs them (Generator::reclaim_kv)."""

from __future__ import annotations

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
from strata._options import warn
from strata.tokenizer import StreamDecoder

log = logging.getLogger("strata.serve")

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
    submitted: float = field(default_factory=time.monotonic)
    # Set from any thread; the engine drops the job before its next step.
    cancelled: bool = False
    # The engine's own, touched on its thread only.
    slot: Slot | None = None  # the KV region it runs in
    gen: _core.Generator | None = None
    prefilled: int = 0  # prompt tokens whose KV is in (the prompt runs a chunk a step)
    reused: int = 0  # of them, those an earlier sequence had left in the KV cache
    prompt_ms_done: float = 0.0  # time of the prompt's pieces before the current one
    out: list[int] = field(default_factory=list)  # tokens generated
    started: float = 0.0
    text: str = ""
    emitted: int = 0
    decoder: StreamDecoder | None = None
    ended: bool = False


@dataclass(eq=False)
class Slot:
    """One KV region of the Model: the jobs in flight on it (more than one only when the Model has
    fewer regions than the engine's slots: they take turns) and the generation that ran in it last,
    whose tokens its KV holds (for the next job's prompt)."""

    seq: int
    jobs: list[Job] = field(default_factory=list)
    gen: _core.Generator | None = None  # the generator that last ran in the region
    job: Job | None = None  # its job
    current: Job | None = None  # whose turn it is
    turn_left: int = 0
    used: int = 0  # the step it last ran (least recently used first)

    def kv_tokens(self) -> list[int]:
        """The tokens whose KV the last sequence that ran here left (as Generator::kv_valid counts
        them: not its last sampled token, which no pass has fed yet)."""
        j = self.job
        if j is None:
            return []
        if _mid_prompt(j) or not j.out:
            return j.ids[:j.prefilled]
        return j.ids + j.out[:-1]


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
    batched_steps: int = 0  # native decode passes of more than one sequence
    batched_rows: int = 0  # the sequences those passes advanced
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    step_seconds: float = 0.0  # the engine thread's steps, wall clock (passes, sampling, text, emitting)
    pass_seconds: float = 0.0  # of which in the decode passes' native calls
    cache: dict[str, Any] = field(default_factory=dict)


class Engine:
    """Runs Jobs on `model` from one thread: up to `parallel` in flight, `max_queue` more waiting.
    Each job in flight has a KV region of its own when the model has `parallel` of them (seqs), and
    every decoding job advances a token in each step's one native pass; else they share regions and
    take turns of `turn` steps.

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
        self._slots = [Slot(i) for i in range(min(parallel, model.seqs))]
        if model.seqs < parallel:  # no quiet switch to the slower way: said once
            warn(f"the model has {model.seqs} KV region{'s' if model.seqs > 1 else ''} for {parallel} slots: "
                 f"requests share regions and take turns, re-running their tokens; load it with seqs={parallel} "
                 "(as strata serve --parallel does) to decode them together")
        # One pass for every decoding sequence, where the architecture can (else one pass each).
        self.batched = bool(model.batch_supported) and len(self._slots) > 1
        self._service_ema = 0.0  # seconds a request holds a slot, smoothed (for Retry-After)
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
            self._waiting.append(job)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        """Drops `job` before its next step (a client that went away)."""
        with self._cv:
            job.cancelled = True
            self._cv.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Runs fn() on the engine thread between two steps (the first, when it has not started);
        its Future has the result."""
        fut: Future = Future()
        with self._cv:
            if self._stopping:
                fut.set_exception(Stopped("the engine has stopped"))
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
        chunk inside the native model cannot be stopped from another thread)."""
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
            t0 = time.perf_counter()
            self._run_step(batch)
            with self._cv:
                self.counters.steps += 1
                self.counters.step_seconds += time.perf_counter() - t0
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
            j.slot = self._slot_for(j)
            j.slot.jobs.append(j)
            self._active.append(j)

    def _slot_for(self, j: Job) -> Slot:
        """The region `j` runs in: the least busy; among those, the one holding the longest beginning
        of its prompt (a follow-up turn of the conversation that ran there), then the least recently used."""
        return min(self._slots, key=lambda sl: (len(sl.jobs), -_common_prefix(sl.kv_tokens(), j.ids), sl.used))

    def _schedule(self) -> list[Job]:
        """The jobs the next step advances: on each slot, the one whose turn it is (round robin in
        admission order, `turn` steps each, so that switching, which re-runs a sequence's tokens, is
        seldom; a prompt in progress keeps its turn: its pieces build on the region)."""
        batch = []
        for sl in self._slots:
            if not sl.jobs:
                sl.current = None
                continue
            cur = sl.current
            if cur in sl.jobs:
                if sl.turn_left <= 0 and not _mid_prompt(cur) and len(sl.jobs) > 1:
                    sl.current = sl.jobs[(sl.jobs.index(cur) + 1) % len(sl.jobs)]
                    sl.turn_left = self.turn
            else:  # it ended (or none ran yet): the oldest job of the slot
                sl.current = sl.jobs[0]
                sl.turn_left = self.turn
            batch.append(sl.current)
        return sorted(batch, key=lambda j: j.started)

    def _run_step(self, batch: list[Job]) -> None:
        """One step: prompt pieces of the batch's new sequences (one chunk of tokens in all, at least
        one piece; batched, all of them in one native pass), then one token of each of its decoding
        sequences, in one native pass."""
        decoding = [j for j in batch if j.gen is not None and not _mid_prompt(j)]
        budget = max(1, self.model.chunk)
        starting = [j for j in batch if j not in decoding]
        # Batched, the pieces are prepared (each request's checks its own) and run together.
        together = self.batched and len(starting) > 1
        pieces = []
        for j in starting:
            if budget <= 0:
                break
            before = j.prefilled
            if self._guarded(j, lambda j=j: self._prompt_piece(j, run=not together)):
                budget -= j.prefilled - max(before, j.reused)  # the tokens the piece runs
                pieces.append(j)
        if together and pieces:
            try:
                _core.run_prompts(self.model._m, [j.gen for j in pieces])
            except Exception as e:
                for j in pieces:
                    self._fail(j, _failure(e))
                pieces = []
        for j in pieces:
            self._ran(j)
            if not _mid_prompt(j):  # its first token, from the prompt's logits (no pass)
                self._guarded(j, lambda j=j: self._take(j, j.gen.next()))  # type: ignore[union-attr]
        if not decoding:
            return
        if self.batched and len(decoding) > 1:
            t0 = time.perf_counter()
            try:
                toks = _core.next_tokens(self.model._m, [j.gen for j in decoding])
            except Exception as e:
                for j in decoding:
                    self._fail(j, _failure(e))
                return
            with self._cv:
                self.counters.pass_seconds += time.perf_counter() - t0
                self.counters.batched_steps += 1
                self.counters.batched_rows += len(decoding)
            for j, tok in zip(decoding, toks, strict=True):
                self._ran(j)
                self._guarded(j, lambda j=j, tok=tok: self._take(j, tok))
        else:
            for j in decoding:
                self._ran(j)
                self._guarded(j, lambda j=j: self._take(j, self._next(j)))

    def _next(self, j: Job) -> int:
        """`j`'s next token from one native pass of its own, timed."""
        t0 = time.perf_counter()
        tok = j.gen.next()  # type: ignore[union-attr]
        with self._cv:
            self.counters.pass_seconds += time.perf_counter() - t0
        return tok

    def _guarded(self, j: Job, fn: Callable[[], None]) -> bool:
        """Runs fn for `j`; an error fails `j` alone (400 for a request the native checks refuse,
        e.g. too long; 500 for worse) and the engine goes on. False when it failed."""
        try:
            fn()
            return True
        except Exception as e:
            self._fail(j, _failure(e))
            return False

    def _ran(self, j: Job) -> None:
        sl = j.slot
        assert sl is not None
        sl.turn_left -= 1
        sl.used = self.counters.steps + 1
        sl.gen, sl.job = j.gen, j

    def _take(self, j: Job, tok: int) -> None:
        """`j`'s next token (-1: it ended): its text, stop strings, the piece to emit, its end."""
        if j.ended:
            return
        hold = max((len(s) for s in j.stops), default=1) - 1
        if tok >= 0:
            j.out.append(tok)
            j.text += j.decoder.feed(tok)  # type: ignore[union-attr]
        else:
            j.text += j.decoder.flush()  # type: ignore[union-attr]
        hit = min((i for i in (j.text.find(s, max(0, j.emitted - hold)) for s in j.stops) if i >= 0), default=-1)
        if hit >= 0:
            j.text = j.text[:hit]
            j.gen.finish("stop_string")  # type: ignore[union-attr]
        ended = hit >= 0 or tok < 0
        safe = len(j.text) if ended or not j.stops else len(j.text) - hold
        if safe > j.emitted:
            j.emit(Piece(j.text[j.emitted:safe]))
            j.emitted = safe
        if ended:
            st = j.gen.stats()  # type: ignore[union-attr]
            self._end(j, Done(FINISH_REASON.get(st["stop_reason"], "stop"), self._stats(j, st)))

    def _prompt_piece(self, j: Job, run: bool = True) -> None:
        """Runs the next piece of `j`'s prompt into its region (or, `run` False, prepares it for
        run_prompts): at most one prompt chunk (the model's) past what the region holds, so that a
        cancel or a stop waits for one chunk, not a whole long prompt. The pieces begin where the native
        chunks would, so the logits are those of one call."""
        sl = j.slot
        assert sl is not None
        n, chunk = len(j.ids), max(1, self.model.chunk)
        if j.gen is None:
            j.decoder = StreamDecoder(self.model.tokenizer, skip_special=True)
            # What Generator.begin will keep (it runs the last prompt token whatever the region holds).
            kept = min(_common_prefix(sl.kv_tokens(), j.ids), n - 1) if sl.gen is not None else 0
            end = n if n - kept <= chunk else kept + chunk
            reuse = sl.gen
        else:
            end = min(n, j.prefilled + chunk)
            reuse = j.gen
            j.prompt_ms_done += j.gen.stats()["prompt_ms"]
        gen = _core.Generator(self.model._m, sl.seq)
        j.gen = gen
        if run:
            gen.begin(j.ids if end == n else j.ids[:end], j.params, reuse=reuse)
        else:
            gen.prepare(j.ids if end == n else j.ids[:end], j.params, reuse=reuse)
        if j.prefilled == 0:
            j.reused = gen.stats()["prompt_reused"]
        j.prefilled = end

    def _stats(self, j: Job, st: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "prompt_tokens": st["prompt_total"], "prompt_reused": j.reused,
            "completion_tokens": st["generated"], "recomputed": st["recomputed"],
            "stop_reason": st["stop_reason"], "prompt_ms": j.prompt_ms_done + st["prompt_ms"],
            "decode_ms": st["decode_ms"],
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
            if j.slot is not None and j in j.slot.jobs:
                j.slot.jobs.remove(j)
            c = self.counters
            if j.gen is not None:
                st = j.gen.stats()
                c.prompt_tokens += st["prompt_tokens"]  # a prompt stopped between pieces: those run
                c.prompt_reused += j.reused
                c.generated += st["generated"]
                c.recomputed += st["recomputed"]
                c.prompt_seconds += (j.prompt_ms_done + st["prompt_ms"]) / 1000
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


def _failure(e: Exception) -> Failed:
    """A step's error as the request's answer: a request the native checks refuse (e.g. too long) is
    a 400; strata.Error or worse a 500 (the server answers, logs and goes on)."""
    if isinstance(e, _core.ConfigError):
        return Failed(400, "invalid_request_error", None, str(e))
    return Failed(500, "server_error", None, f"{type(e).__name__}: {e}")


def _mid_prompt(j: Job) -> bool:
    """Whether `j` has begun its prompt and not run all of it."""
    return j.gen is not None and j.prefilled < len(j.ids)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
