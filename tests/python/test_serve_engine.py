"""The serving engine without HTTP: sequences taking turns on the one KV cache give each the tokens
it gets alone (every cache size), cancelled and queued jobs free their slots, shutdown ends every
job with an error."""

from __future__ import annotations

import threading

import pytest

import strata
from strata.model import sampling_params
from strata.serve.engine import Done, Engine, Failed, Job, Piece, QueueFull, Stopped

PROMPTS = ["The expert cache holds", "Slots are lent to the prompt", "A", "Mixture of experts, one by one"]


class Sink:
    """A job's events, and an Event set when it ends."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.end: Done | Failed | None = None
        self.ended = threading.Event()

    def __call__(self, ev) -> None:
        if isinstance(ev, Piece):
            self.pieces.append(ev.text)
        else:
            self.end = ev
            self.ended.set()


def _job(m: strata.Model, prompt: str, max_tokens: int = 12, stops: list[str] | None = None,
         ignore_eos: bool = False) -> tuple[Job, Sink]:
    p = sampling_params(max_tokens=max_tokens, temperature=0)
    p.stop_ids = [] if ignore_eos else sorted(m.tokenizer.stop_ids)
    sink = Sink()
    return Job(m.tokenize(prompt), p, stops or [], sink), sink


@pytest.mark.parametrize("cache", ["all", "bounded"])
def test_interleaved_greedy_equals_alone(make_mix, cache):
    path = make_mix("q4_k")
    kw = dict(progress=False, ctx=512)
    if cache == "bounded":  # a cache that streams: every switch re-runs tokens through it
        probe = strata.ModelInfo(path)
        kw.update(expert_cache=f"{probe.slot_bytes * 12}b", prefill=16, source="host")
    m = strata.Model(path, **kw)
    alone = [m.generate(p, max_tokens=12, temperature=0).text for p in PROMPTS]
    eng = Engine(m, parallel=len(PROMPTS), turn=1)
    jobs = [_job(m, p) for p in PROMPTS]
    for j, _ in jobs:
        eng.submit(j)
    eng.start()  # all are in flight from the first step: they switch after every token
    try:
        for _, s in jobs:
            assert s.ended.wait(30)
    finally:
        eng.shutdown()
    assert ["".join(s.pieces) for _, s in jobs] == alone
    assert all(isinstance(s.end, Done) for _, s in jobs)
    assert eng.counters.recomputed > 0 and eng.counters.finished == len(PROMPTS)


def test_queue_bound_cancel_and_shutdown(make_mix):
    m = strata.Model(make_mix("f32"), progress=False, ctx=256)
    eng = Engine(m, parallel=1, max_queue=1)
    a, sa = _job(m, "long", max_tokens=10**6, ignore_eos=True)
    b, sb = _job(m, "queued")
    eng.submit(a)
    eng.submit(b)
    with pytest.raises(QueueFull) as e:
        eng.submit(_job(m, "one too many")[0])
    assert e.value.retry_after >= 1 and eng.counters.rejected == 1
    eng.cancel(b)  # cancelled while waiting: never runs
    eng.start()
    c, sc = _job(m, "after", max_tokens=3)
    eng.submit(c)
    assert eng.state()["slots_busy"] <= 1
    eng.cancel(a)  # in flight: its slot goes to c
    assert sc.ended.wait(10) and isinstance(sc.end, Done)
    assert sa.end is None and sb.end is None and not sb.pieces
    assert eng.counters.cancelled == 2 and eng.counters.finished == 1
    d, sd = _job(m, "cut short", max_tokens=10**6, ignore_eos=True)
    eng.submit(d)
    assert eng.shutdown("stopping for the test")
    assert isinstance(sd.end, Failed) and sd.end.status == 503 and "stopping for the test" in sd.end.message
    with pytest.raises(Stopped):
        eng.submit(_job(m, "late")[0])


def test_stop_strings_end_the_sequence(make_mix):
    m = strata.Model(make_mix("f32"), progress=False, ctx=256)
    full = m.generate(PROMPTS[0], max_tokens=24, temperature=0).text
    stop = full[5:8]
    eng = Engine(m)
    eng.start()
    try:
        j, s = _job(m, PROMPTS[0], max_tokens=24, stops=[stop])
        eng.submit(j)
        assert s.ended.wait(10)
    finally:
        eng.shutdown()
    assert "".join(s.pieces) == full[: full.find(stop)]
    assert s.end.finish_reason == "stop" and s.end.stats["stop_reason"] == "stop_string"



def test_a_failing_job_does_not_stop_the_engine(make_mix):
    m = strata.Model(make_mix("f32"), progress=False, ctx=256)
    eng = Engine(m)
    eng.start()
    try:
        def explode(ev) -> None:
            raise RuntimeError("the client's callback broke")

        bad, _ = _job(m, "first", max_tokens=4)
        bad.emit = explode
        eng.submit(bad)
        good, sink = _job(m, "second", max_tokens=4)
        eng.submit(good)
        assert sink.ended.wait(10) and isinstance(sink.end, Done)
        assert eng.alive and eng.state()["slots_busy"] == 0
    finally:
        eng.shutdown()
    assert not eng.alive
