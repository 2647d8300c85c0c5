"""Batched decode on the CPU backend (test_gpu.py holds the same on a GPU): several sequences, each in
its own KV region, advance one token each in one pass (Model.decode_batch, _core.next_tokens). A
row's logits and a request's greedy tokens are byte-identical alone and in a batch, whatever the
batch's size, order and company, and whichever way the step finds its experts (resident, resolved on
the host, resolved in the step, expert by expert); the regions divide ctx; bad steps are clear errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

import strata
from strata import _core
from strata.model import sampling_params
from strata.testing import make_deepseek4, make_gpt_oss

PROMPTS = ["The expert cache holds", "Slots are lent to the prompt", "A", "Mixture of experts, one by one"]
STEPS = 6


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _bounded(path: str, slots: int, resolve: str) -> dict:
    """A cache of `slots` slots that streams from a host copy; decode steps resolve as `resolve` says."""
    return dict(expert_cache=f"{strata.ModelInfo(path).slot_bytes * slots}b", source="host", prefill=16,
                decode_resolve=resolve)


# (cache kwargs) -> the path a 4-row step of the top-4, 8-expert q4_k model takes: at most 8 distinct
# experts a layer, so 12 slots gather them (host or in the step) and 5 leave too few: expert by expert.
CACHES = {
    "resident": lambda p: {},
    "host": lambda p: _bounded(p, 12, "host"),
    "in-step": lambda p: _bounded(p, 12, "device"),
    "per-expert": lambda p: _bounded(p, 5, "host"),
}


def _teacher_forced(m: strata.Model, prompts: list[list[int]], conts: list[list[int]], order_of_step,
                    region_of) -> list[np.ndarray]:
    """Runs each prompt into its region, then feeds conts step by step, the rows of step j in the
    order order_of_step(j) (a subset: the others wait); the logits of each sequence's steps."""
    for i, p in enumerate(prompts):
        m.logits(p, seq=region_of(i))
    out: list[list[np.ndarray]] = [[] for _ in prompts]
    done = [0] * len(prompts)
    j = 0
    while min(done) < STEPS:
        rows = [i for i in order_of_step(j) if done[i] < STEPS]
        j += 1
        if not rows:
            continue
        lg = m.decode_batch([conts[i][done[i]] for i in rows], [len(prompts[i]) + done[i] for i in rows],
                            [region_of(i) for i in rows])
        for r, i in enumerate(rows):
            out[i].append(lg[r])
            done[i] += 1
    return [np.array(o) for o in out]


@pytest.mark.parametrize("mix", ["f32", "q4_k"])
@pytest.mark.parametrize("cache", list(CACHES))
def test_rows_are_byte_identical_alone_and_in_any_batch(make_mix, mix, cache):
    path = make_mix(mix)
    m = strata.Model(path, device="cpu", progress=False, ctx=1024, seqs=4, **CACHES[cache](path))
    assert m.seqs == 4 and m.seq_ctx == 256 and m.batch_supported
    prompts = [m.tokenize(p) for p in PROMPTS]
    rng = np.random.default_rng(3)
    conts = [rng.integers(0, m.spec["vocab"], STEPS).tolist() for _ in prompts]
    alone = [_teacher_forced(m, [p], [c], lambda j: [0], lambda i: 0)[0] for p, c in zip(prompts, conts, strict=True)]
    # All four at once in rotating orders, regions reversed; then a ragged mix of 1, 2 and 3 rows.
    orders = [[0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0], [1, 3, 0, 2]]
    together = _teacher_forced(m, prompts, conts, lambda j: orders[j % 4], lambda i: 3 - i)
    ragged = _teacher_forced(m, prompts, conts, lambda j: [[0], [1, 2], [3, 0, 1], [2, 3]][j % 4], lambda i: i)
    for i in range(len(prompts)):
        assert np.array_equal(_bits(together[i]), _bits(alone[i])), (cache, i)
        assert np.array_equal(_bits(ragged[i]), _bits(alone[i])), (cache, i)
    # And the decode rows are the prompt path's logits of the same positions (invariant 4).
    full = m.logits(prompts[1] + conts[1])
    assert np.array_equal(_bits(full[len(prompts[1]):]), _bits(alone[1]))


def test_batched_steps_fetch_each_expert_once_a_layer(make_mix):
    """A bounded cache that holds nothing between steps (5 slots, a layer's 8 experts): a batch of 4
    streams each routed expert once a layer, 4 sequences alone stream each of theirs."""
    path = make_mix("q4_k")
    m = strata.Model(path, device="cpu", progress=False, ctx=1024, seqs=4, **_bounded(path, 5, "host"))
    prompts = [m.tokenize(p) for p in PROMPTS]
    for i, p in enumerate(prompts):
        m.logits(p, seq=i)
    ids = [p[-1] for p in prompts]
    m.reset_stats()
    m.decode_batch(ids, [len(p) for p in prompts], [0, 1, 2, 3])
    batched = m.cache
    for i, p in enumerate(prompts):
        m.logits(p, seq=i)
    m.reset_stats()
    for i, p in enumerate(prompts):
        m.decode_batch([ids[i]], [len(p)], [i])
    alone = m.cache
    L, K, E = m.spec["layers"], m.spec["top_k"], m.spec["experts"]
    assert alone["hits"] + alone["misses"] == 4 * L * K  # K distinct experts a token a layer
    assert L * K <= batched["hits"] + batched["misses"] <= L * E  # the union of the rows' experts
    assert batched["misses"] < alone["misses"]


def test_greedy_tokens_alone_equal_next_tokens_in_a_batch(make_mix):
    path = make_mix("q4_k")
    m = strata.Model(path, device="cpu", progress=False, ctx=1024, seqs=4, **_bounded(path, 12, "host"))
    alone = [m.generate(p, max_tokens=10, temperature=0, ignore_eos=True).tokens for p in PROMPTS]
    gens = []
    for i, p in enumerate(PROMPTS):
        g = _core.Generator(m._m, i)
        g.begin(m.tokenize(p), sampling_params(max_tokens=10, temperature=0))
        gens.append(g)
    out: list[list[int]] = [[] for _ in PROMPTS]
    while True:
        toks = _core.next_tokens(m._m, gens)
        if all(t < 0 for t in toks):
            break
        for i, t in enumerate(toks):
            if t >= 0:
                out[i].append(t)
    assert out == alone
    assert all(g.stats()["decode_passes"] == 9 and g.stats()["recomputed"] == 0 for g in gens)


def test_gpt_oss_batches_too(tmp_path):
    path = str(make_gpt_oss(tmp_path / "oss.gguf", seed=5))
    m = strata.Model(path, device="cpu", progress=False, ctx=512, seqs=3)
    assert m.batch_supported
    prompts = [[1, 5, 9, 200, 3, 7, 11, 13, 2, 8], [4, 4], [300, 12, 44, 9, 81]]  # past the sliding window
    conts = [[int(x) for x in np.random.default_rng(i).integers(0, 512, STEPS)] for i in range(3)]
    alone = [_teacher_forced(m, [p], [c], lambda j: [0], lambda i: 0)[0] for p, c in zip(prompts, conts, strict=True)]
    together = _teacher_forced(m, prompts, conts, lambda j: [2, 0, 1] if j % 2 else [0, 1, 2], lambda i: i)
    for i in range(3):
        assert np.array_equal(_bits(together[i]), _bits(alone[i])), i


def test_deepseek4_regions_hold_their_own_state_and_refuse_a_batch(tmp_path):
    """An architecture's own KV layout (V4's rings) gets one copy a region; a V4 step is one sequence."""
    path = str(make_deepseek4(os.path.join(tmp_path, "tiny.gguf"), seed=5))
    m = strata.Model(path, device="cpu", progress=False, ctx=512, seqs=2)
    assert not m.batch_supported
    a = [int(x) for x in np.random.default_rng(0).integers(1, 500, 40)]
    b = [int(x) for x in np.random.default_rng(1).integers(1, 500, 30)]
    ref = m.logits(a, seq=0)
    m.logits(b, seq=1)  # region 1's rings do not touch region 0's
    step0 = m.decode_batch([7], [len(a)], [0])
    m.logits(a, seq=0)
    assert np.array_equal(_bits(m.logits(a, seq=1)), _bits(ref))
    assert np.array_equal(_bits(m.decode_batch([7], [len(a)], [1])), _bits(step0))
    with pytest.raises(strata.UnsupportedError, match="one sequence a pass"):
        m.decode_batch([7, 7], [len(a), len(a)], [0, 1])


def test_regions_divide_ctx_and_bad_steps_are_clear_errors(make_mix):
    path = make_mix("f32")
    with pytest.raises(strata.ConfigError, match="--parallel"):
        strata.Model(path, device="cpu", progress=False, ctx=3, seqs=4)
    with pytest.raises(strata.ConfigError, match=r"seqs \(--parallel\)"):
        strata.Model(path, device="cpu", progress=False, seqs=0)
    m = strata.Model(path, device="cpu", progress=False, ctx=101, seqs=4)
    assert m.seq_ctx == 25
    with pytest.raises(strata.ConfigError, match="25 positions"):
        m.logits(list(range(1, 27)), seq=2)
    gen = _core.Generator(m._m, 3)
    with pytest.raises(strata.ConfigError, match="a sequence's context is 25"):
        gen.begin(list(range(1, 27)), sampling_params(max_tokens=1))
    with pytest.raises(strata.ConfigError, match="not one of the model's 4 KV regions"):
        _core.Generator(m._m, 4)
    m.logits([1, 2, 3], seq=0)
    m.logits([1, 2, 3], seq=1)
    with pytest.raises(strata.ConfigError, match="appears twice"):
        m.decode_batch([5, 6], [3, 3], [1, 1])
    with pytest.raises(strata.ConfigError, match="5 sequences"):
        m._m.decode_batch([5] * 5, [3] * 5, [0, 1, 2, 3, 0])
    with pytest.raises(strata.ConfigError, match="position"):
        m.decode_batch([5], [25], [0])
    g0, g1 = _core.Generator(m._m, 1), _core.Generator(m._m, 1)
    for g in (g0, g1):
        g.begin([1, 2, 3], sampling_params(max_tokens=4, temperature=0))
    with pytest.raises(strata.ConfigError, match="share KV region 1"):
        _core.next_tokens(m._m, [g0, g1])
    # A single region keeps the old message and the whole ctx.
    one = strata.Model(path, device="cpu", progress=False, ctx=101)
    assert one.seqs == 1 and one.seq_ctx == 101
    with pytest.raises(strata.ConfigError, match="ctx is 101"):
        _core.Generator(one._m).begin(list(range(1, 103)), sampling_params(max_tokens=1))


def test_generate_batch_equals_generate_alone(make_mix):
    """Model.generate_batch: six prompts on 4 regions (two wait for a region to free up), greedy and
    seeded sampling, a stop string: each result is generate()'s on its prompt alone."""
    path = make_mix("q4_k")
    m = strata.Model(path, device="cpu", progress=False, ctx=1024, seqs=4)
    prompts = [*PROMPTS, "Two more", m.tokenize("and token ids")]
    for kw in (dict(temperature=0), dict(temperature=0.9, seed=11, top_k=20)):
        full = m.generate(prompts[1], max_tokens=9, **kw).text
        stop = full[3:6]
        alone = [m.generate(p, max_tokens=9, stop=stop, **kw) for p in prompts]
        got = m.generate_batch(prompts, max_tokens=9, stop=stop, **kw)
        assert [g.tokens for g in got] == [a.tokens for a in alone]
        assert [g.text for g in got] == [a.text for a in alone]
        assert got[1].text == full[: full.find(stop)] and got[1].stats["stop_reason"] == "stop_string"
        assert [g.stats["stop_reason"] for g in got] == [a.stats["stop_reason"] for a in alone]
    with pytest.raises(strata.ConfigError, match="prompt 1 has 300 tokens"):
        m.generate_batch(["short", [5] * 300])
