"""DeepSeek V4 on the CUDA backend (pytest -m gpu; skipped without a GPU): logits against the CPU backend
(F32, Q8_0 and the IQ2_XXS + Q2_K pack, streamed in the fused layout (moe_layout="fused") and with every
expert resident in the MMQ one), greedy decode across the first ratio-128 block, and the invariants the CPU
holds: logits byte-identical across cache sizes, chunk sizes, sources and the GR read fused or not (in either
MoE layout; the default MMQ one streamed gives the all-resident load's logits), and a decode step
replayed from its recorded graph equal to the step op by op; the KV cache reused across turns only for a
true prefix. The CPU's logits are checked against transformers in test_deepseek4.py.

The logits comparisons use files that route every token to all experts and whose indexer keeps every
compressed block (top_k = experts, index_topk past the prompt's blocks): with top-2 of 8 and the indexer's
top-3 these random files have near-ties that the GPU's fp16 prompt tiles can flip, and a flip is a
discontinuity no rounding bound covers (test_gpu_archs says more). What is left is rounding: bounded by
gpu_common's, or 3x how far the CPU's logits move when every float matrix is rounded to fp16, whichever is
larger. Top-2 routing and the top-3 indexer on the GPU are covered by the greedy tokens and the
determinism tests below (the same kernels at every chunk and cache size)."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import strata
from gpu_common import F32_KV_VS_CPU, MMQ_VS_CPU, fp16_movement, has_gpu, rel, streamed_cache
from strata.testing import make_deepseek4

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)

N_PROMPT = 150  # past position 127: one ratio-128 block, 37 ratio-4 windows
CTX = 192
PROMPT = [int(x) for x in np.random.default_rng(21).integers(1, 500, N_PROMPT)]
EVERY = dict(top_k=8, experts=8, index_topk=64)  # nothing left to a near-tie (the module's note)
QUANT_SHAPE = dict(hidden=256, expert_ffn=256)
PACK = {"embed": "Q8_0", "attn": "Q8_0", "compressor": "Q8_0", "shared": "Q8_0", "output": "Q8_0",
        "experts": "IQ2_XXS", "expert_down": "Q2_K"}
Q8 = {r: "Q8_0" for r in ("embed", "attn", "compressor", "router", "experts", "shared", "output")}


@pytest.fixture(scope="module")
def ds4_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("gpu-ds4"))


@pytest.fixture(scope="module")
def files(ds4_dir):
    made: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in made:
            kw = {"f32": dict(seed=5, **EVERY), "q8": dict(seed=9, quant=Q8, **EVERY),
                  "pack": dict(seed=6, quant=PACK, **QUANT_SHAPE, **EVERY), "tiny": dict(seed=5),
                  "q8-top2": dict(seed=9, quant={"experts": "Q8_0", "attn": "Q8_0"})}[name]
            made[name] = str(make_deepseek4(os.path.join(ds4_dir, f"{name}.gguf"), **kw))
        return made[name]

    return get


def build(path: str, device: str, **kw) -> strata.Model:
    return strata.Model(path, device=device, ctx=CTX, progress=False, **kw)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", ["f32", "q8", "pack"])
def test_gpu_streamed_logits_match_cpu(files, tmp_path, name):
    path = files(name)
    cache = streamed_cache(path, 32, "fused")
    fused = dict(expert_cache=cache, prefill=32, moe_layout="fused")
    want = build(path, "cpu", **fused).logits(PROMPT)
    moved = fp16_movement(path, tmp_path, PROMPT, ctx=CTX, **fused)
    m = build(path, "cuda", **fused)
    assert m.layout(32, source=True)["kind"] == "fused"
    e = rel(m.logits(PROMPT), want)
    print(f"deepseek4 {name} fused: vs cpu {e:.2e} (fp16 weights on the cpu: {moved:.2e})")
    assert e <= max(F32_KV_VS_CPU, 3 * moved)


@pytest.mark.parametrize("name", ["q8", "pack"])
def test_gpu_mmq_layout_matches_cpu_mmq(files, tmp_path, name):
    path = files(name)
    moved = fp16_movement(path, tmp_path, PROMPT, ctx=CTX, expert_cache="all", prefill=32)
    m = build(path, "cuda", expert_cache="all", prefill=32)
    assert m.layout(32, source=False)["kind"] == "mmq"
    e = rel(m.logits(PROMPT), build(path, "cpu", expert_cache="all", prefill=32).logits(PROMPT))
    print(f"deepseek4 {name} mmq: vs cpu {e:.2e} (fp16 weights on the cpu: {moved:.2e})")
    assert e <= max(MMQ_VS_CPU, 3 * moved)


def test_gpu_greedy_decode_matches_cpu_across_compressed_blocks(files):
    # 110 prompt tokens + 32 decoded: the decode crosses the first ratio-128 block (position 127) and
    # eight ratio-4 windows, one token at a time through the rings and the compressor's state.
    path = files("tiny")
    ids = [int(x) for x in np.random.default_rng(3).integers(1, 500, 110)]
    want = build(path, "cpu").generate(ids, max_tokens=32, temperature=0)
    m = build(path, "cuda")
    got = m.generate(ids, max_tokens=32, temperature=0)
    assert got.tokens == want.tokens
    assert m._m.decode_graph_active  # each step replayed one recorded graph


@pytest.mark.parametrize("cache", ["all", "streamed"])
def test_gpu_decode_graph_matches_op_by_op(files, cache):
    """A decode step replayed from one recorded graph (its positions read on the device, the compressor's
    choice made there) computes the logits the step queued op by op does, bit for bit, at every position
    from 100 to 139: across ratio-4 windows closing and not, and the first ratio-128 block (position 127);
    every expert resident, or a bounded cache resolved on the device."""
    path = files("tiny")
    ids = [int(x) for x in np.random.default_rng(4).integers(1, 500, 100)]
    cont = [int(x) for x in np.random.default_rng(5).integers(1, 500, 40)]
    kw = dict(expert_cache="all") if cache == "all" else dict(expert_cache=streamed_cache(path, 32), prefill=32)
    runs = {}
    for graph in (True, False):
        m = build(path, "cuda", decode_graph=graph, **kw)
        m.logits(ids)
        runs[graph] = np.concatenate([m.decode_batch([t], [len(ids) + j], [0]) for j, t in enumerate(cont)])
        assert m._m.decode_graph_active == graph
    assert same(runs[True], runs[False])


@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
def test_gpu_logits_identical_across_cache_chunk_source_and_gr(files, moe_layout):
    path = files("q8-top2")
    ref = None
    for unfused, prefill in itertools.product((False, True), (1, 7, 64, N_PROMPT)):
        probe = build(path, "cuda", expert_cache="all", prefill=prefill, gr_unfused=unfused, moe_layout=moe_layout)
        plan = probe.layout(probe.chunk, True)
        assert plan["kind"] == ("fused" if moe_layout == "fused" else "mmq")
        assert any(b["name"] == "xn" for b in plan["buffers"]) == unfused
        smallest = f"{(plan['slots'] + 1) * plan['slot_bytes']}b"
        del probe
        for cache, source in itertools.product((smallest, "64"), ("host", "mmap")):
            out = build(path, "cuda", expert_cache=cache, prefill=prefill, source=source, gr_unfused=unfused,
                        moe_layout=moe_layout).logits(PROMPT)
            assert np.isfinite(out).all()
            ref = out if ref is None else ref
            assert same(out, ref), f"prefill={prefill} cache={cache} source={source} unfused={unfused}"
    if moe_layout == "auto":  # the MMQ layout streamed: the all-resident load's logits, bit for bit
        assert same(build(path, "cuda", expert_cache="all", prefill=64).logits(PROMPT), ref)


def test_gpu_resident_logits_identical_across_chunks(files):
    path = files("q8-top2")
    ref = None
    for unfused, prefill in itertools.product((False, True), (1, 9, N_PROMPT)):
        out = build(path, "cuda", expert_cache="all", prefill=prefill, gr_unfused=unfused).logits(PROMPT)
        ref = out if ref is None else ref
        assert same(out, ref), f"prefill={prefill} unfused={unfused}"


def test_gpu_kv_reused_only_for_a_true_prefix(files):
    path = files("tiny")
    m, fresh = build(path, "cuda"), build(path, "cuda")
    rng = np.random.default_rng(8)
    a = [int(x) for x in rng.integers(1, 500, 40)]
    assert m.generate(a, max_tokens=1, temperature=0, reuse_kv=True).stats["prompt_reused"] == 0
    # The same 30 tokens, then others: past the 8-position window the rings hold positions 32-39 only.
    b = a[:30] + [int(x) for x in rng.integers(1, 500, 12)]
    out = m.generate(b, max_tokens=8, temperature=0, reuse_kv=True)
    assert out.stats["prompt_reused"] == 0
    assert out.tokens == fresh.generate(b, max_tokens=8, temperature=0).tokens
    c = b + out.tokens + [int(x) for x in rng.integers(1, 500, 5)]
    again = m.generate(c, max_tokens=8, temperature=0, reuse_kv=True)
    assert again.stats["prompt_reused"] == len(b) + len(out.tokens) - 1
    assert again.tokens == fresh.generate(c, max_tokens=8, temperature=0).tokens
