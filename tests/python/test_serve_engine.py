"""The serving engine without HTTP: sequences batched in their own KV regions, or taking turns on a
shared one (a Model of fewer regions than slots), give each the tokens it gets alone (every cache
size); a follow-up turn finds its conversation's slot; cancelled and queued jobs free their slots,
shutdown ends every job with an error."""

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
    """A Model of one KV region and 4 slots: the sequences share it, switching after every token."""
    path = make_mix("q4_k")
    kw = dict(progress=False, ctx=512)
    if cache == "bounded":  # a cache that streams: every switch re-runs tokens through it
        probe = strata.ModelInfo(path)
        kw.update(expert_cache=f"{probe.slot_bytes * 12}b", prefill=16, source="host")
    m = strata.Model(path, **kw)
    alone = [m.generate(p, max_tokens=12, temperature=0).text for p in PROMPTS]
    with pytest.warns(strata.StrataWarning, match="seqs=4"):  # the slower way is said
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


LONG_PROMPT = " ".join(f"expert {i} of layer {i % 3} streams into slot {i % 5};" for i in range(12))


@pytest.fixture(scope="module")
def chunked(make_mix) -> strata.Model:
    """Prompt chunks of 8 tokens and a cache that streams: a long prompt runs as many steps."""
    path = make_mix("q4_k")
    return strata.Model(path, progress=False, ctx=512, prefill=8, source="host",
                        expert_cache=f"{strata.ModelInfo(path).slot_bytes * 12}b")


def test_a_long_prompt_runs_a_chunk_a_step_and_gives_one_calls_tokens(chunked):
    m = chunked
    ids = m.tokenize(LONG_PROMPT)
    assert len(ids) > 8 * 10
    alone = m.generate(ids, max_tokens=10, temperature=0).text
    other = m.generate(PROMPTS[0], max_tokens=10, temperature=0).text
    eng = Engine(m, parallel=2, turn=1)
    (a, sa), (b, sb) = _job(m, LONG_PROMPT, max_tokens=10), _job(m, PROMPTS[0], max_tokens=10)
    eng.submit(a)
    eng.submit(b)
    eng.start()
    try:
        assert sa.ended.wait(30) and sb.ended.wait(30)
    finally:
        eng.shutdown()
    assert "".join(sa.pieces) == alone and "".join(sb.pieces) == other
    assert eng.counters.steps >= len(ids) // 8 + 2 * 10  # the prompt's chunks were steps of their own
    assert sa.end.stats["prompt_reused"] == 0 and sa.end.stats["prompt_tokens"] == len(ids)


def test_a_cancel_stops_a_long_prompt_after_one_chunk(chunked):
    m = chunked
    eng = Engine(m)
    j, sink = _job(m, LONG_PROMPT, max_tokens=4)
    eng.submit(j)
    eng.call(lambda: eng.cancel(j))  # runs before the first step; the cancel lands after it
    eng.start()
    try:
        t, s2 = _job(m, "then this", max_tokens=2)
        eng.submit(t)
        assert s2.ended.wait(10)
    finally:
        eng.shutdown()
    assert sink.end is None and eng.counters.cancelled == 1
    # The cancelled prompt ran its first chunk only; the next request ran its own prompt.
    assert eng.counters.prompt_tokens == 8 + len(m.tokenize("then this"))


def test_a_follow_up_with_a_long_new_part_keeps_the_history(chunked):
    m = chunked
    first = LONG_PROMPT[: len(LONG_PROMPT) // 2]
    eng = Engine(m)
    eng.start()
    try:
        j1, s1 = _job(m, first, max_tokens=3)
        eng.submit(j1)
        assert s1.ended.wait(10)
        follow = first + "".join(s1.pieces) + LONG_PROMPT
        j2, s2 = _job(m, follow, max_tokens=6)
        eng.submit(j2)
        assert s2.ended.wait(10)
    finally:
        eng.shutdown()
    ids1 = m.tokenize(first)
    assert s2.end.stats["prompt_reused"] >= len(ids1) - 1
    assert "".join(s2.pieces) == m.generate(follow, max_tokens=6, temperature=0).text


@pytest.mark.parametrize("cache", ["all", "bounded", "bounded-scan"])
def test_batched_greedy_equals_alone(make_mix, cache):
    """A model of 4 KV regions: 4 requests decode together, one pass a token for all (two join while
    the first two decode), and each greedy answer is the one it gets alone; nothing is re-run. Under
    the scan policy too, and alone the answers are LRU's (a policy changes the speed only)."""
    path = make_mix("q4_k")
    kw = dict(progress=False, ctx=2048, seqs=4)
    if cache != "all":  # a cache that streams: the batch's experts are fetched once a layer for all
        kw.update(expert_cache=f"{strata.ModelInfo(path).slot_bytes * 12}b", prefill=16, source="host")
    if cache == "bounded-scan":
        lru = strata.Model(path, **kw)
        kw.update(cache_policy="scan")
    m = strata.Model(path, **kw)
    alone = [m.generate(p, max_tokens=12, temperature=0, ignore_eos=True).text for p in PROMPTS]
    if cache == "bounded-scan":
        assert alone == [lru.generate(p, max_tokens=12, temperature=0, ignore_eos=True).text for p in PROMPTS]
        del lru
    eng = Engine(m, parallel=4)
    assert eng.batched
    jobs = [_job(m, p, ignore_eos=True) for p in PROMPTS]
    first_piece = threading.Event()
    sink0 = jobs[0][1]

    def watch(ev, inner=sink0) -> None:
        inner(ev)
        first_piece.set()

    jobs[0][0].emit = watch
    eng.submit(jobs[0][0])
    eng.submit(jobs[1][0])
    eng.start()
    try:
        assert first_piece.wait(30)
        for j, _ in jobs[2:]:  # they join between two steps
            eng.submit(j)
        for _, s in jobs:
            assert s.ended.wait(30)
    finally:
        eng.shutdown()
    assert ["".join(s.pieces) for _, s in jobs] == alone
    assert all(isinstance(s.end, Done) for _, s in jobs)
    c = eng.counters
    assert c.recomputed == 0 and c.finished == len(PROMPTS)
    # 4 x 11 decode passes went in batches: most steps carried several sequences.
    assert c.batched_rows >= 2 * c.batched_steps and c.batched_rows > 4 * 11 // 2
    assert {j.slot.seq for j, _ in jobs} == {0, 1, 2, 3}


def test_a_slot_keeps_its_conversation_for_the_next_turn(make_mix):
    """Two conversations on two slots, then each one's follow-up: it lands in the slot its history
    is in and runs only its new tokens; the answers are a fresh run's."""
    m = strata.Model(make_mix("q4_k"), progress=False, ctx=1024, seqs=2)
    eng = Engine(m, parallel=2)
    eng.start()
    try:
        firsts = [_job(m, PROMPTS[1]), _job(m, PROMPTS[3])]
        for j, _ in firsts:
            eng.submit(j)
        for _, s in firsts:
            assert s.ended.wait(30)
        regions = [j.slot.seq for j, _ in firsts]
        assert sorted(regions) == [0, 1]
        # The follow-ups arrive in the other order, each re-sending its whole history.
        texts = [PROMPTS[i] + "".join(s.pieces) + " and then?" for i, (_, s) in zip((1, 3), firsts, strict=True)]
        follow = [_job(m, texts[1]), _job(m, texts[0])]
        for j, _ in follow:
            eng.submit(j)
        for _, s in follow:
            assert s.ended.wait(30)
    finally:
        eng.shutdown()
    for (j, s), (first, _), text in zip(follow, reversed(firsts), reversed(texts), strict=True):
        assert j.slot.seq == first.slot.seq
        assert s.end.stats["prompt_reused"] >= len(first.ids) and s.end.stats["recomputed"] == 0
        assert "".join(s.pieces) == m.generate(text, max_tokens=12, temperature=0).text


def test_an_architecture_that_does_not_batch_still_gets_a_region_a_slot(tmp_path):
    """DeepSeek V4 decodes one sequence a pass: with 2 regions the engine advances its sequences one
    pass each within a step, in their own regions, and nothing is re-run; answers equal alone."""
    from strata.testing import make_deepseek4

    m = strata.Model(str(make_deepseek4(tmp_path / "tiny.gguf", seed=5)), progress=False, ctx=512, seqs=2)
    assert not m.batch_supported
    alone = [m.generate(p, max_tokens=8, temperature=0, ignore_eos=True).text for p in PROMPTS[:2]]
    eng = Engine(m, parallel=2)
    assert not eng.batched
    jobs = [_job(m, p, max_tokens=8, ignore_eos=True) for p in PROMPTS[:2]]
    for j, _ in jobs:
        eng.submit(j)
    eng.start()
    try:
        for _, s in jobs:
            assert s.ended.wait(30)
    finally:
        eng.shutdown()
    assert ["".join(s.pieces) for _, s in jobs] == alone
    assert eng.counters.recomputed == 0 and eng.counters.batched_steps == 0
