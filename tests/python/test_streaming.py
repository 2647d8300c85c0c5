"""Invariants 5 (each expert crosses the link at most once per layer per chunk) and 6 (no silent
fallback: a too-small cache names the smallest --expert-cache that works), and the cache's stats
against its stream trace.

The model has 2 layers x 8 experts, top-4; a 64-token prompt in chunks of 16 routes every expert
of every layer (checked), through a cache that holds fewer slots than there are experts.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

import strata

N_PROMPT = 64
PREFILL = 16
CTX = 128


@pytest.fixture(scope="module")
def q4k(make_mix):
    return make_mix("q4_k")


@pytest.fixture(scope="module")
def prompt():
    rng = np.random.default_rng(7)
    return [int(x) for x in rng.integers(1, 512, size=N_PROMPT)]


def layer_expert_bytes(path) -> dict[int, int]:
    """Bytes of one expert (gate + up + down) per layer, from the GGUF tensor table."""
    info = strata.inspect(path)
    E = int(info["metadata"]["qwen3moe.expert_count"])
    out: dict[int, int] = {}
    for t in info["tensors"]:
        m = re.fullmatch(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight", t["name"])
        if m:
            assert t["nbytes"] % E == 0
            out[int(m.group(1))] = out.get(int(m.group(1)), 0) + t["nbytes"] // E
    return out


def load(path, cache, prefill=PREFILL, **kw) -> strata.Model:
    return strata.Model(path, expert_cache=cache, prefill=prefill, ctx=CTX, source="host", progress=False, **kw)


def suggested_cache(msg: str) -> int:
    """The --expert-cache (MiB) a MemoryError message names as enough."""
    m = re.search(r"use (?:--expert-cache |at least )(\d+)", msg)
    assert m, f"no --expert-cache suggestion in: {msg}"
    return int(m.group(1))


def test_stream_trace_and_stats(q4k, prompt):
    probe = load(q4k, "all")
    spec = probe.spec
    L, E = spec["layers"], spec["experts"]
    slot_bytes = spec["slot_bytes"]
    region = probe.layout(PREFILL, True)
    # smaller than the experts (L*E slots), room for the region + a few experts
    n_slots = region["slots"] + 3
    assert n_slots < L * E
    m = load(q4k, f"{n_slots * slot_bytes}b")
    assert m.cache["slots"] == n_slots and m.chunk == PREFILL
    # warm every slot with one-token forwards (the decode scratch: no lend), so that lending the
    # first chunk's region evicts residents and give_back has something to refill
    for t in prompt[:8]:
        m.logits([t])
    c0 = m.cache  # stats of the warm-up (not reset: the eviction balance below counts its residents)
    assert c0["lends"] == 0 and c0["chunks"] == 0 and c0["misses"] >= n_slots
    m._m.set_trace(True)  # clears the trace
    out = m.logits(prompt)
    assert np.isfinite(out).all()
    trace = [(int(i), int(ly), int(e), bool(r)) for i, ly, e, r in m._m.trace()]
    c = m.cache
    n_chunks = -(-N_PROMPT // PREFILL)
    assert c["chunks"] == n_chunks and c["lends"] == n_chunks and c["chunk_tokens"] == PREFILL
    assert c["slots_lent"] == 0, "the region was not given back"

    # the prompt routes every expert of every layer (else the test proves less than it says)
    routed = {(ly, e) for _, ly, e, r in trace if not r}
    every = {(ly, e) for ly in range(L) for e in range(E)}
    assert routed == every, f"(layer, expert) never routed: {sorted(every - routed)}"

    # chunk i (1-based) streams under lend index i; its give_back refills under the same index
    streams = [(i, ly, e) for i, ly, e, r in trace if not r]
    refills = [(i, ly, e) for i, ly, e, r in trace if r]
    assert all(1 <= i <= n_chunks for i, _, _ in streams + refills)
    # invariant 5: no expert streamed twice for one layer within one chunk
    dup = [k for k, n in Counter(streams).items() if n > 1]
    assert not dup, f"experts streamed more than once in a chunk (lend, layer, expert): {dup}"

    # stats agree with the trace
    assert c["misses"] - c0["misses"] == len(streams)
    assert c["refills"] - c0["refills"] == len(refills)
    assert c["refills"] > 0, "lending evicted experts but none was refilled"
    per_layer = layer_expert_bytes(q4k)
    assert max(per_layer.values()) <= slot_bytes
    assert c["bytes_streamed"] - c0["bytes_streamed"] == sum(per_layer[ly] for _, ly, _, _ in trace)
    # everything streamed in and not evicted is still resident, and fits in the slots
    assert 0 <= c["misses"] + c["refills"] - c["evictions"] <= n_slots
    assert c["evictions"] > c0["evictions"]

    # the region borrowed is exactly the plan rounded up to slots
    assert c["slots_borrowed"] == -(-m.layout(PREFILL, True)["bytes_needed"] // slot_bytes) == region["slots"]
    assert c["region_bytes"] == c["slots_borrowed"] * slot_bytes

    # and the logits do not depend on any of it (invariant 4)
    assert np.array_equal(out, load(q4k, 64).logits(prompt))



def test_mmq_layout_resolves_each_expert_once_per_layer_per_chunk(make_mix, prompt):
    """With no source (the MMQ layout) the cache sees one lookup per routed expert per layer per chunk,
    as many as a streamed run (fused layout) of the same float model, whose routing is identical."""
    f32 = make_mix("f32")
    mmq = load(f32, "all")
    assert mmq.layout(PREFILL, False)["kind"] == "mmq"
    streamed = load(f32, 64)
    for m in (mmq, streamed):
        m.reset_stats()
    assert np.array_equal(mmq.logits(prompt), streamed.logits(prompt))
    lookups = streamed.cache["hits"] + streamed.cache["misses"]
    assert mmq.cache["hits"] == lookups and mmq.cache["misses"] == 0


def test_decode_reuses_cached_experts(q4k, prompt):
    """After a prompt, a cache that holds every expert streams nothing more for the same tokens."""
    m = load(q4k, 64)
    m.logits(prompt)
    m._m.set_trace(True)
    m.reset_stats()
    m.logits(prompt[:1])  # T=1: the decode scratch, no lend
    c = m.cache
    assert c["lends"] == 0 and c["misses"] == 0 and m._m.trace() == []


def test_too_small_cache_names_a_size_that_works(q4k):
    slot = load(q4k, "all").spec["slot_bytes"]
    with pytest.raises(strata.MemoryError) as ei:
        load(q4k, f"{slot}b")  # one slot: less than the region + one expert
    msg = str(ei.value)
    assert "--expert-cache" in msg
    mib = suggested_cache(msg)
    m = load(q4k, mib)
    assert m.chunk == PREFILL and m.cache["slots"] >= m.layout(PREFILL, True)["slots"] + 1


def test_cache_without_a_slot_names_a_size_that_works(q4k):
    with pytest.raises(strata.MemoryError) as ei:
        load(q4k, "1000b")  # less than one slot
    msg = str(ei.value)
    assert "--expert-cache" in msg
    load(q4k, suggested_cache(msg))


def test_too_small_cache_large_chunk_names_a_size_that_works(q4k):
    """Regression: a chunk whose region needs more slots than the model has experts (L*E) still loads
    with the --expert-cache the error names (slots were once capped at L*E, so it never could)."""
    # q4_k model: L*E = 16 slots; a 256-token chunk borrows more than that.
    T = 256
    probe = strata.Model(q4k, expert_cache="all", prefill=T, ctx=2 * T, progress=False)
    need = probe.layout(T, True)["slots"] + 1
    assert need > probe.spec["layers"] * probe.spec["experts"]
    with pytest.raises(strata.MemoryError) as ei:
        strata.Model(q4k, expert_cache=1, prefill=T, ctx=2 * T, source="host", progress=False)
    m = strata.Model(
        q4k, expert_cache=suggested_cache(str(ei.value)), prefill=T, ctx=2 * T, source="host", progress=False
    )
    assert m.cache["slots"] >= need and m.chunk == T
    ids = list(range(1, T + 1))
    out = m.logits(ids)
    assert m.cache["slots_borrowed"] == need - 1
    assert np.array_equal(
        out, strata.Model(q4k, expert_cache=64, prefill=T, ctx=2 * T, source="host", progress=False).logits(ids)
    )


def test_pinned_expert_is_never_evicted(make_mix):
    path = make_mix("q4_k")
    probe = strata.Model(path, expert_cache="all", progress=False)
    slot = probe.spec["slot_bytes"]
    m = strata.Model(path, expert_cache=f"{slot * 12}b", prefill=8, source="mmap", progress=False)
    m.pin(1, 5)
    m._m.set_trace(True)
    ids = m.tokenize("The quick brown fox jumps over the lazy dog, again and again and again.")
    m.logits(ids)
    assert (1, 5) not in {(layer, e) for _, layer, e, _ in m._m.trace()}
    with pytest.raises(strata.ConfigError, match="out of range"):
        m.pin(9, 0)
