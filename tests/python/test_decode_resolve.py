"""A bounded cache's decode step, resolved on the device (Backend::resolve_experts, design (b) of
bench/NOTES.md) or on the host (ExpertCache::prepare, design (a)): the same choice of slots under the
LRU and the scan policy, so the same tokens, the same stats and the same slot table after every call,
through prompts (which take the state back to the host) and decode steps (which move it to the device),
on both sources. On the CPU resolve_experts is the sequential reference; the GPU's kernels are checked
against it in the op harness (ResolveExpertsMatchesReference) and end to end in test_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import strata

CTX = 160
PREFILL = 16


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(99)
    return [[int(x) for x in rng.integers(1, 500, size=n)] for n in (20, 9)]


def caches(path) -> dict[str, int]:
    """Slots: a few past the chunk's (most experts of a step miss), and half of the experts."""
    info = strata.ModelInfo(path)
    region = info.layout(PREFILL, True)["slots"]
    spec = info.spec
    return {"few": region + spec["top_k"] + 1, "half": region + spec["layers"] * spec["experts"] // 2}


@pytest.mark.parametrize("mix", ["q4_k", "q8_0"])
@pytest.mark.parametrize("source", ["host", "mmap"])
@pytest.mark.parametrize("policy", ["lru", "scan"])
def test_device_resolution_equals_host_resolution(make_mix, prompts, mix, source, policy):
    path = make_mix(mix)
    slot = strata.ModelInfo(path).layout(PREFILL, True)["slot_bytes"]
    for name, n in caches(path).items():
        runs = {}
        for how in ("host", "device"):
            # The CPU's resolve_experts is the sequential reference (the GPU's: test_gpu.py).
            m = strata.Model(path, device="cpu", expert_cache=f"{n * slot}b", prefill=PREFILL, ctx=CTX,
                             source=source, decode_resolve=how, cache_policy=policy, progress=False)
            assert m._m.decode_resolution == how
            got = []
            for p in prompts:  # the second prompt runs after decode steps left the state on the device
                out = m.generate(p, max_tokens=24, temperature=1.0, seed=11)
                c = m.cache
                got.append((out.tokens, c["hits"], c["misses"], c["bytes_streamed"], c["evictions"],
                            m._m.slot_index()))
            runs[how] = got
        for (ta, *sa), (tb, *sb) in zip(runs["host"], runs["device"], strict=True):
            assert ta == tb, (name, source, policy)
            assert sa == sb, (name, source, policy)
        assert runs["device"][0][2] > 0, "the cache must miss during decode for this test to mean anything"


def test_decode_resolve_values(make_mix):
    path = make_mix("q4_k")
    with pytest.raises(strata.ConfigError, match="decode_resolve must be auto, device or host"):
        strata.Model(path, device="cpu", expert_cache=64, decode_resolve="gpu", progress=False)
    m = strata.Model(path, device="cpu", expert_cache="all", ctx=256, progress=False)
    assert m._m.decode_resolution == "resident"


def test_write_through_equals_fill_first(make_mix, prompts, monkeypatch):
    """A one-token step resolved on the device leaves its misses to the expert products (write-through,
    ExpertTable::pending), or fills them first (STRATA_WRITE_THROUGH=0): the same tokens, stats and slots;
    the stats' decode path says which."""
    path = make_mix("q4_k")
    slot = strata.ModelInfo(path).layout(PREFILL, True)["slot_bytes"]
    runs = {}
    for wt in ("1", "0"):
        monkeypatch.setenv("STRATA_WRITE_THROUGH", wt)
        m = strata.Model(path, device="cpu", expert_cache=f"{caches(path)['few'] * slot}b", prefill=PREFILL,
                         ctx=CTX, decode_resolve="device", progress=False)
        out = m.generate(prompts[0], max_tokens=24, temperature=1.0, seed=11)
        c = m.cache
        runs[wt] = (out.tokens, c["hits"], c["misses"], c["bytes_streamed"], m._m.slot_index())
        assert m._m.decode_write_through == (wt == "1")
        assert ("misses written through" in m.last_stats["decode_path"]) == (wt == "1")
    assert runs["1"] == runs["0"]
    assert runs["1"][2] > 0, "the cache must miss during decode for this test to mean anything"
    monkeypatch.setenv("STRATA_WRITE_THROUGH", "2")
    with pytest.raises(strata.ConfigError, match="STRATA_WRITE_THROUGH=2"):
        strata.Model(path, device="cpu", expert_cache=f"{caches(path)['few'] * slot}b", prefill=PREFILL, ctx=CTX,
                     decode_resolve="device", progress=False).generate(prompts[0], max_tokens=4, temperature=0)
