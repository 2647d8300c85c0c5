"""Prompts of several sequences in one pass on the CPU backend (test_gpu.py holds the same on a GPU):
Model.forward_rows through `_core.Model.prompt_rows`, Generator.prepare + `_core.run_prompts`, and
generate_batch and the server, which use them. Each prompt's logits and the KV it leaves are
byte-identical to the prompt run alone, for every architecture that batches, whatever the chunk
(a pass may split a prompt), the cache (resident, bounded: gathered or expert by expert) and the
reuse of a region's earlier tokens; the pass fetches each expert of a layer once for all its rows;
bad calls are clear errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

import strata
from strata import _core
from strata.model import sampling_params
from strata.testing import make_deepseek4, make_gemma4, make_gpt_oss, make_qwen35moe
from strata.testing.deepseek2 import make_deepseek2

PROMPTS = ["The expert cache holds", "A", "Slots are lent to the prompt, chunk by chunk", "Mixture of experts"]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _rows(prompts: list[list[int]], regions: list[int], starts: list[int] | None = None):
    """The rows of the prompts (each from starts[i]) in their regions, and each one's last row."""
    ids, pos, seqs, pick = [], [], [], []
    for i, (p, r) in enumerate(zip(prompts, regions, strict=True)):
        s = starts[i] if starts else 0
        ids += p[s:]
        pos += list(range(s, len(p)))
        seqs += [r] * (len(p) - s)
        pick.append(len(ids) - 1)
    return ids, pos, seqs, pick


def _check_rows_equal_alone(m: strata.Model, prompts: list[list[int]]) -> None:
    """prompt_rows of every prompt (regions reversed) against each prompt alone in region 0, then one
    decode step of all of them against the same step alone: the KV each left is the one it leaves alone."""
    n = len(prompts)
    regions = list(range(n))[::-1]
    alone = [m.logits(p, seq=0)[-1] for p in prompts]
    nxt = [5 + i for i in range(n)]
    step_alone = [m.logits([*p, t], seq=0)[-1] for p, t in zip(prompts, nxt, strict=True)]
    got = m._m.prompt_rows(*_rows(prompts, regions))
    step = m.decode_batch(nxt, [len(p) for p in prompts], regions)
    for i in range(n):
        assert np.array_equal(_bits(got[i]), _bits(alone[i])), i
        assert np.array_equal(_bits(step[i]), _bits(step_alone[i])), i


def _bounded(path: str, slots: int, resolve: str = "host") -> dict:
    return dict(expert_cache=f"{strata.ModelInfo(path).slot_bytes * slots}b", source="host",
                decode_resolve=resolve)


@pytest.mark.parametrize("mix", ["f32", "q4_k"])
@pytest.mark.parametrize("cache", ["resident", "bounded", "per-expert"])
@pytest.mark.parametrize("prefill", [16, 5])
def test_qwen3moe_prompt_rows_equal_each_prompt_alone(make_mix, mix, cache, prefill):
    """prefill 5: the 4 prompts' 46 rows (12, 1, 27 and 6 tokens) run as 10 passes of 5 rows, which cut
    every prompt but the one-token one. The decode step after them gathers its experts (bounded: the
    chunk's slots and 12 more, at least the 8 a step of 4 rows may name) or takes them expert by expert
    (per-expert: the chunk's and 2 more)."""
    path = make_mix(mix)
    if cache == "resident":
        kw = dict(prefill=prefill)
    else:
        # The pass borrows its scratch from the cache: the slots the chunk needs, and room for the step.
        region = strata.ModelInfo(path).layout(prefill, True)["slots"]
        kw = _bounded(path, region + (12 if cache == "bounded" else 2)) | dict(prefill=prefill)
    m = strata.Model(path, device="cpu", progress=False, ctx=1024, seqs=4, **kw)
    _check_rows_equal_alone(m, [m.tokenize(p) for p in PROMPTS])


@pytest.mark.parametrize("arch", ["gpt-oss", "gemma4", "qwen35moe", "deepseek2"])
def test_every_batching_architecture_runs_prompts_together(tmp_path, arch):
    """Sliding windows and sinks (gpt-oss, gemma4), a recurrent state a region (qwen35moe: a span of
    rows a region, continued across passes), latent attention (deepseek2); passes of 4 rows split the
    prompts."""
    make = {"gpt-oss": make_gpt_oss, "gemma4": make_gemma4, "qwen35moe": make_qwen35moe,
            "deepseek2": make_deepseek2}[arch]
    path = str(make(os.path.join(tmp_path, f"{arch}.gguf"), seed=5))
    rng = np.random.default_rng(1)
    for prefill in (64, 4):
        m = strata.Model(path, device="cpu", progress=False, ctx=768, seqs=3, prefill=prefill)
        assert m.batch_supported
        V = m.spec["vocab"]
        _check_rows_equal_alone(m, [rng.integers(0, V, n).tolist() for n in (7, 1, 11)])


def test_run_prompts_equals_begin_alone_with_reuse(make_mix):
    """Generators prepared in three regions, two of them reusing the beginning their region holds
    (a chat's next turn): run_prompts runs only the new tokens, in one pass, and every generator then
    decodes the tokens it decodes alone; next_tokens after it finds each region's KV intact."""
    path = make_mix("q4_k")
    m = strata.Model(path, device="cpu", progress=False, ctx=1024, seqs=3, prefill=8,
                     **_bounded(path, strata.ModelInfo(path).layout(8, True)["slots"] + 12))
    first = [m.tokenize(p) for p in PROMPTS[:3]]
    turn = [first[0] + m.tokenize(" and then some"), m.tokenize("Another"), first[2] + [7, 8, 9]]
    sp = sampling_params(max_tokens=8, temperature=0)
    alone = [m.generate(t, max_tokens=8, temperature=0, ignore_eos=True, add_special=False).tokens for t in turn]
    sp.stop_ids = []
    olds = []
    for i, p in enumerate(first):
        g = _core.Generator(m._m, i)
        g.begin(p, sp)
        olds.append(g)
    gens = [_core.Generator(m._m, i) for i in range(3)]
    for g, t, old in zip(gens, turn, olds, strict=True):
        g.prepare(t, sp, reuse=old)
    m.reset_stats()
    _core.run_prompts(m._m, gens)
    st = [g.stats() for g in gens]
    common = [next((k for k, (a, b) in enumerate(zip(f, t, strict=False)) if a != b), min(len(f), len(t)))
              for f, t in zip(first, turn, strict=True)]
    assert common[0] == len(first[0]) and common[2] == len(first[2])
    assert [s["prompt_reused"] for s in st] == common
    assert all(s["prompt_tokens"] == len(t) for s, t in zip(st, turn, strict=True))
    out: list[list[int]] = [[g.next()] for g in gens]
    while True:
        toks = _core.next_tokens(m._m, gens)
        if all(t < 0 for t in toks):
            break
        for i, t in enumerate(toks):
            if t >= 0:
                out[i].append(t)
    assert out == alone
    assert all(g.stats()["recomputed"] == 0 for g in gens)


def test_prompts_together_fetch_each_expert_once_a_layer(make_mix):
    """A bounded cache streaming from a host copy: the four prompts in one pass stream fewer expert
    bytes than the four alone (each pass streams every expert its rows route to once a layer)."""
    path = make_mix("q4_k")
    region = strata.ModelInfo(path).layout(64, True)["slots"]
    m = strata.Model(path, device="cpu", progress=False, ctx=1024, seqs=4, prefill=64,
                     **_bounded(path, region + 4))
    prompts = [m.tokenize(p) for p in PROMPTS]
    m.reset_stats()
    for i, p in enumerate(prompts):
        m.logits(p, seq=i)
    alone = m.cache["bytes_streamed"]
    m.reset_stats()
    m._m.prompt_rows(*_rows(prompts, [0, 1, 2, 3]))
    together = m.cache["bytes_streamed"]
    assert 0 < together < alone


def test_generate_batch_runs_new_prompts_together(make_mix):
    path = make_mix("q4_k")
    m = strata.Model(path, device="cpu", progress=False, ctx=1024, seqs=4)
    alone = [m.generate(p, max_tokens=6, temperature=0) for p in PROMPTS]
    got = m.generate_batch(PROMPTS, max_tokens=6, temperature=0)
    assert [g.tokens for g in got] == [a.tokens for a in alone]
    # One pass for the four prompts: each one's chunk is the pass's rows.
    rows = sum(len(m.tokenize(p)) for p in PROMPTS)
    assert [(g.stats["prompt_chunk"], g.stats["prompt_chunks"]) for g in got] == [(rows, 1)] * 4
    assert [a.stats["prompt_chunk"] for a in alone] == [len(m.tokenize(p)) for p in PROMPTS]


def test_bad_prompt_rows_and_run_prompts_are_clear_errors(make_mix, tmp_path):
    m = strata.Model(make_mix("f32"), device="cpu", progress=False, ctx=100, seqs=4)
    with pytest.raises(strata.ConfigError, match="contiguous, at consecutive positions"):
        m._m.prompt_rows([1, 2, 3], [0, 1, 0], [0, 0, 0], [2])
    with pytest.raises(strata.ConfigError, match="contiguous, at consecutive positions"):
        m._m.prompt_rows([1, 2, 3], [0, 0, 1], [0, 1, 0], [2])
    with pytest.raises(strata.ConfigError, match="ascending row indices"):
        m._m.prompt_rows([1, 2, 3], [0, 0, 1], [0, 1, 1], [2, 1])
    with pytest.raises(strata.ConfigError, match="not one of the model's 4 KV regions"):
        m._m.prompt_rows([1, 2], [0, 0], [0, 4], [1])
    with pytest.raises(strata.ConfigError, match="context full"):
        m._m.prompt_rows([1, 2], [0, 25], [0, 1], [1])
    with pytest.raises(strata.ConfigError, match="out of range"):
        m._m.prompt_rows([1, 10**6], [0, 0], [0, 1], [1])
    sp = sampling_params(max_tokens=2, temperature=0)
    g0, g1 = _core.Generator(m._m, 1), _core.Generator(m._m, 1)
    with pytest.raises(strata.ConfigError, match="no prompt waiting"):
        _core.run_prompts(m._m, [g0])
    g0.prepare([1, 2, 3], sp)
    g1.prepare([4, 5], sp)
    with pytest.raises(strata.ConfigError, match="share KV region 1"):
        _core.run_prompts(m._m, [g0, g1])
    with pytest.raises(strata.ConfigError, match="a sequence's context is 25"):
        _core.Generator(m._m, 2).prepare(list(range(1, 30)), sp)
    # A prepared generator that never ran has ended: no token, no crash.
    assert _core.Generator(m._m, 3).next() == -1
    v4 = strata.Model(str(make_deepseek4(os.path.join(tmp_path, "v4.gguf"), seed=5)), device="cpu", progress=False,
                      ctx=256, seqs=2)
    with pytest.raises(strata.UnsupportedError, match="one sequence a pass"):
        v4._m.prompt_rows([1, 2, 3], [0, 1, 0], [0, 0, 1], [1, 2])
