"""DeepSeek V4 and DESIGN.md's invariants 4-6: logits byte-identical across cache sizes, sources, chunk
sizes and GR modes, in either MoE layout (the default MMQ one, streamed or resident, gives one set of
logits; moe_layout="fused" its own); each routed expert crosses the link at most once per layer per chunk while the
shared expert and the hash tables stay resident; a malformed or unsupported file gives a one-line error."""

from __future__ import annotations

import itertools
import os
import re
from collections import Counter

import gguf
import numpy as np
import pytest

import strata
from strata.testing import make_deepseek4

N_PROMPT = 150  # crosses a ratio-128 block
CTX = 192


@pytest.fixture(scope="module")
def ds4_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("ds4det"))


@pytest.fixture(scope="module")
def q8(ds4_dir) -> str:
    # Q8_0 experts: the integer kernels in the MMQ layout, float matmuls in the fused one.
    return str(make_deepseek4(os.path.join(ds4_dir, "q8.gguf"), quant={"experts": "Q8_0", "attn": "Q8_0"}, seed=9))


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return [int(x) for x in np.random.default_rng(21).integers(1, 500, N_PROMPT)]


def build(path: str, **kw) -> strata.Model:
    return strata.Model(path, ctx=CTX, progress=False, **kw)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
def test_streamed_logits_identical(q8, prompt, moe_layout):
    ref = None
    for unfused, prefill in itertools.product((False, True), (1, 7, 64, N_PROMPT)):
        probe = build(q8, expert_cache="all", prefill=prefill, gr_unfused=unfused, moe_layout=moe_layout)
        plan = probe.layout(probe.chunk, True)
        assert plan["kind"] == ("fused" if moe_layout == "fused" else "mmq")
        assert any(b["name"] == "xn" for b in plan["buffers"]) == unfused
        smallest = f"{(plan['slots'] + 1) * plan['slot_bytes']}b"
        for cache, source in itertools.product((smallest, "64"), ("host", "mmap")):
            m = build(q8, expert_cache=cache, prefill=prefill, source=source, gr_unfused=unfused,
                      moe_layout=moe_layout)
            out = m.logits(prompt)
            assert np.isfinite(out).all()
            if ref is None:
                ref = out
            assert same(out, ref), f"prefill={prefill} cache={cache} source={source} unfused={unfused}"
    if moe_layout == "auto":  # the MMQ layout streamed: the all-resident load's logits, bit for bit
        assert same(ref, build(q8, expert_cache="all", prefill=64).logits(prompt))


def test_resident_logits_identical_and_close_to_streamed(q8, prompt):
    streamed = build(q8, expert_cache="64", prefill=32, moe_layout="fused").logits(prompt)
    ref = None
    for unfused, prefill in itertools.product((False, True), (1, 9, N_PROMPT)):
        m = build(q8, expert_cache="all", prefill=prefill, gr_unfused=unfused)
        assert m.layout(m.chunk, False)["kind"] == "mmq"
        out = m.logits(prompt)
        ref = out if ref is None else ref
        assert same(out, ref), f"prefill={prefill} unfused={unfused}"
    # Against the fused layout's float products, q8_0 activations into the experts: close, not equal (near-ties
    # may flip a routing choice).
    per_pos = np.abs(ref - streamed).max(axis=1) / np.abs(streamed).max()
    assert 0 < per_pos.max() and np.median(per_pos) < 1.5e-2
    # Streamed under the default (MMQ) layout: equal.
    assert same(build(q8, expert_cache="64", prefill=32).logits(prompt), ref)


@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
def test_each_expert_crosses_the_link_once_per_layer_per_chunk(q8, prompt, moe_layout):
    probe = build(q8, expert_cache="all", prefill=16, moe_layout=moe_layout)
    spec = probe.spec
    n_slots = probe.layout(16, True)["slots"] + 3
    assert n_slots < spec["layers"] * spec["experts"]
    m = build(q8, expert_cache=f"{n_slots * spec['slot_bytes']}b", prefill=16, source="host", moe_layout=moe_layout)
    m._m.set_trace(True)
    assert np.isfinite(m.logits(prompt)).all()
    trace = [(int(i), int(ly), int(e), bool(r)) for i, ly, e, r in m._m.trace()]
    streams = [(i, ly, e) for i, ly, e, r in trace if not r]
    assert streams, "nothing streamed"
    dup = [k for k, n in Counter(streams).items() if n > 1]
    assert not dup, f"experts streamed more than once in a chunk (lend, layer, expert): {dup}"
    # hash-routed layers (0, 1) stream their experts too; the tables and the shared expert do not
    # stream: the expert cache holds exactly the routed experts' bytes.
    assert {ly for _, ly, _ in streams} == set(range(spec["layers"]))
    info = strata.inspect(q8)
    routed = sum(t["nbytes"] for t in info["tensors"] if re.search(r"ffn_(gate|up|down)_exps", t["name"]))
    assert spec["expert_bytes"] == routed
    resident = {t["name"] for t in info["tensors"] if "_exps" not in t["name"]}
    assert {"blk.0.ffn_gate_tid2eid.weight", "blk.0.ffn_gate_shexp.weight"} <= resident


class _Patched:
    """Writes a file through make_deepseek4 with one metadata value replaced or one tensor left out."""

    def __init__(self, monkeypatch, key: str | None = None, value=None, drop: str | None = None):
        writer = gguf.GGUFWriter
        for name in ("add_uint32", "add_array", "add_float32", "add_string"):
            orig = getattr(writer, name)

            def wrap(self, k, v, *a, _orig=orig, **kw):
                return _orig(self, k, value if k == key else v, *a, **kw)

            monkeypatch.setattr(writer, name, wrap)
        if drop:
            import strata.testing.deepseek4 as ds4

            plan = ds4._plan
            monkeypatch.setattr(ds4, "_plan", lambda *a, **kw: [t for t in plan(*a, **kw) if t.name != drop])


@pytest.mark.parametrize(
    "key,value,drop,exc,match",
    [
        ("deepseek4.attention.compress_ratios", [0, 4, 64, 4], None, strata.UnsupportedError,
         r"compress_ratios\[2\] = 64; llama.cpp and strata run 0, 4 and 128"),
        ("deepseek4.expert_gating_func", 1, None, strata.UnsupportedError, "expert_gating_func 1 is not supported"),
        ("deepseek4.attention.head_count_kv", 2, None, strata.FormatError, "one shared KV head"),
        ("deepseek4.attention.compress_ratios", [0, 4], None, strata.FormatError, "fewer than the 4 blocks"),
        ("deepseek4.rope.scaling.type", "linear", None, strata.UnsupportedError, "rope.scaling.type 'linear'"),
        (None, None, "blk.2.attn_compressor_ape.weight", strata.FormatError,
         "tensor 'blk.2.attn_compressor_ape.weight' is missing"),
        (None, None, "blk.1.ffn_gate_tid2eid.weight", strata.FormatError, "ffn_gate_tid2eid.weight' is missing"),
        # Every number is bounded before anything is derived from it (model/spec.h, limits).
        ("deepseek4.block_count", 2**31, None, strata.FormatError, "block_count' = 2147483648 is out of range"),
        ("deepseek4.embedding_length", 2**30, None, strata.FormatError,
         "embedding_length' = 1073741824 is out of range"),
        ("deepseek4.hyper_connection.count", 1000, None, strata.FormatError,
         "hyper_connection.count' = 1000 is out of range"),
        ("deepseek4.attention.indexer.top_k", 2**31, None, strata.FormatError, "top_k' = 2147483648 is out of range"),
        ("deepseek4.expert_feed_forward_length", 2**31, None, strata.FormatError,
         r"expert_feed_forward_length'\[0\] = .* is out of range"),
        ("deepseek4.swiglu_clamp_exp", [float("nan")] * 4, None, strata.FormatError,
         r"swiglu_clamp_exp'\[0\] = nan is out of range"),
        ("deepseek4.hyper_connection.epsilon", float("inf"), None, strata.FormatError,
         "hyper_connection.epsilon' = inf is out of range"),
    ],
)
def test_bad_files_give_one_line_errors(ds4_dir, monkeypatch, key, value, drop, exc, match):
    _Patched(monkeypatch, key, value, drop)
    path = os.path.join(ds4_dir, "bad.gguf")
    make_deepseek4(path)
    monkeypatch.undo()
    with pytest.raises(exc, match=match) as e:
        strata.ModelInfo(path)
    assert "\n" not in str(e.value)


def test_hash_table_naming_a_missing_expert_fails_the_load(ds4_dir, monkeypatch):
    """The hash table's ids index the router's scores and the expert cache: one past expert_count is a
    one-line FormatError at load, before any pass reads it."""
    import strata.testing.deepseek4 as ds4

    generate = ds4._generate

    def bad(t, seed, n_experts):
        for chunk in generate(t, seed, n_experts):
            if t.name == "blk.1.ffn_gate_tid2eid.weight":
                ids = chunk.view(np.int32).copy()
                ids[7 * t.shape[-1] + 1] = n_experts  # token 7, k = 1
                chunk = ids.view(np.uint8)
            yield chunk

    monkeypatch.setattr(ds4, "_generate", bad)
    path = os.path.join(ds4_dir, "bad_hash.gguf")
    make_deepseek4(path)
    monkeypatch.undo()
    strata.ModelInfo(path)  # the header is sound
    with pytest.raises(strata.FormatError, match=r"'blk.1.ffn_gate_tid2eid.weight' routes token 7 to expert 8, "
                       r"outside \[0, 8\)") as e:
        build(path)
    assert "\n" not in str(e.value)


def test_reused_kv_cache_only_when_it_holds_the_whole_beginning(ds4_dir):
    """The window and compressor rings hold the state after the cache's last position only: a prompt that
    shares a shorter beginning with the last generation runs in full, one that extends it keeps it, and
    both give a fresh model's tokens."""
    path = os.path.join(ds4_dir, "reuse.gguf")
    make_deepseek4(path, seed=5)
    m, fresh = build(path), build(path)
    rng = np.random.default_rng(8)
    a = [int(x) for x in rng.integers(1, 500, 40)]
    first = m.generate(a, max_tokens=1, temperature=0, reuse_kv=True)
    assert first.stats["prompt_reused"] == 0
    # The same 30 tokens, then others: past the 8-position window the ring holds positions 32-39.
    b = a[:30] + [int(x) for x in rng.integers(1, 500, 12)]
    out = m.generate(b, max_tokens=8, temperature=0, reuse_kv=True)
    assert out.stats["prompt_reused"] == 0
    assert out.tokens == fresh.generate(b, max_tokens=8, temperature=0).tokens
    # Extending everything the cache holds (b and the tokens fed since) keeps all of it.
    c = b + out.tokens + [int(x) for x in rng.integers(1, 500, 5)]
    held = len(b) + len(out.tokens) - 1  # the last sampled token was never fed
    ext = m.generate(c, max_tokens=8, temperature=0, reuse_kv=True)
    assert ext.stats["prompt_reused"] == held
    assert ext.tokens == fresh.generate(c, max_tokens=8, temperature=0).tokens


def test_decode_paths_give_the_prompt_paths_tokens(ds4_dir):
    """A decode step runs its experts gathered (matmul_experts), resident or resolved on the host or on
    the device when the cache is bounded; a prompt runs them one by one. The HC = 4 read and the
    clamped SwiGLU (limit 0.3: it bites) are the same in every path: greedy decoding gives the same
    tokens in every configuration, each the argmax of the prompt path's logits at its position. F32
    experts: the fused and MMQ layouts compute alike, so the all-resident run joins the comparison."""
    path = os.path.join(ds4_dir, "decode.gguf")
    make_deepseek4(path, seed=5, swiglu_limit=0.3)
    info = strata.ModelInfo(path)
    spec, region = info.spec, info.layout(16, True)["slots"]
    bounded = f"{(region + spec['top_k'] + 1) * spec['slot_bytes']}b"
    ids = [int(x) for x in np.random.default_rng(4).integers(1, 500, 110)]  # + 24: past position 128
    runs = {}
    configs = {"resident": dict(expert_cache="all"), "bounded-host": dict(expert_cache=bounded, decode_resolve="host"),
               "bounded-device": dict(expert_cache=bounded, decode_resolve="device")}
    for name, kw in configs.items():
        m = build(path, prefill=16, **kw)
        out = m.generate(ids, max_tokens=24, temperature=0.0)
        assert out.stats["stop_reason"] == "max_tokens"
        runs[name] = out.tokens
        if name == "bounded-device":
            assert m._m.decode_resolution == "device" and m.cache["misses"] > 0
    want = runs["resident"]
    assert all(got == want for got in runs.values()), runs
    prompt_logits = build(path, prefill=16, expert_cache=bounded).logits(ids + want[:-1])
    assert prompt_logits[len(ids) - 1:].argmax(axis=1).tolist() == want
