"""--prefetch and a prompt chunk's look ahead on the CUDA backend (pytest -m gpu; skipped without a GPU), for
every architecture that predicts its next layer's experts: qwen3moe, deepseek2 (V3's 576-dim latent rows
too) and deepseek4. A guess changes which experts are resident when, never a result: the tokens and the
logits are the same bits with it on and off, and the counters show fills made and used. test_prefetch.py
holds the same checks on the CPU (its files and cache sizes are reused here).
"""

from __future__ import annotations

import numpy as np
import pytest

import strata
from gpu_common import has_gpu
from test_prefetch import CTX, PREFILL, _arch_file, _cache

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)

ARCHS = ["qwen3moe", "deepseek2", "deepseek2-576", "deepseek4"]


def _file(tmp_path, make_mix, arch: str) -> str:
    if arch == "qwen3moe":
        return make_mix("q4_k")
    if arch == "deepseek2-576":  # V3's latent width: the decode takes the MLA kernels
        from strata.testing.deepseek2 import make_deepseek2

        path = str(tmp_path / "deepseek2-576-prefetch.gguf")
        make_deepseek2(path, layers=5, dense_layers=1, experts=16, top_k=4, groups=4, groups_used=2, kv_lora=512,
                       key_rope=64, heads=20, q_lora=64, key_nope=32, value_dim=32,
                       quant={"experts": "Q4_0", "attn": "Q8_0"}, seed=13)
        return path
    return _arch_file(tmp_path, arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("budget", [True, 2])  # every guess; at most two of each token's (--prefetch 2)
def test_gpu_prefetch_changes_residency_not_results(tmp_path, make_mix, arch, budget):
    path = _file(tmp_path, make_mix, arch)
    prompt = [int(x) for x in np.random.default_rng(9).integers(1, 500, size=20)]
    runs = []
    for pf in (False, budget):
        m = strata.Model(path, device="cuda", expert_cache=_cache(path, 0.3), prefill=PREFILL, ctx=CTX,
                         decode_resolve="device", prefetch=pf, progress=False)
        out = m.generate(prompt, max_tokens=24, temperature=0.0)
        assert m._m.decode_graph_active
        runs.append((out.tokens, m.logits(prompt + out.tokens[:8], seq=0), m.cache))
    (t0, l0, c0), (t1, l1, c1) = runs
    if budget is not True:
        assert c1["prefetch_fills"] <= budget * (24 - 1) * (strata.ModelInfo(path).spec["layers"] - 1)
    assert t0 == t1
    np.testing.assert_array_equal(l0.view(np.uint32), l1.view(np.uint32))
    assert c0["prefetch_fills"] == 0
    assert c1["prefetch_fills"] > 0 and 0 < c1["prefetch_used"] <= c1["prefetch_fills"]
    assert c1["prefetch_used"] + c1["prefetch_wasted"] <= c1["prefetch_fills"]
    assert c1["prefetch_bytes"] > 0 and c1["bytes_streamed"] >= c1["prefetch_bytes"]
    print(f"{arch}: misses {c0['misses']} -> {c1['misses']}, fills {c1['prefetch_fills']}, "
          f"used {c1['prefetch_used']}, wasted {c1['prefetch_wasted']}")


@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_prefetch_auto_is_two_for_deepseek4_only(tmp_path, make_mix, arch):
    """--prefetch auto (the default): 2 for deepseek4 decoding from a bounded cache on the GPU (where it was
    measured faster), off for the other architectures and for a cache that holds every expert."""
    path = _file(tmp_path, make_mix, arch)
    m = strata.Model(path, device="cuda", expert_cache=_cache(path, 0.3), prefill=PREFILL, ctx=CTX, progress=False)
    assert m.prefetch == (2 if arch == "deepseek4" else False)
    assert strata.Model(path, device="cuda", expert_cache="all", ctx=CTX, progress=False).prefetch is False
    assert strata.Model(path, device="cuda", expert_cache=_cache(path, 0.3), prefill=PREFILL, ctx=CTX,
                        prefetch=False, progress=False).prefetch is False


@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_prompt_look_ahead_changes_residency_not_results(tmp_path, make_mix, monkeypatch, arch):
    """A prompt chunk that routes many rows (T * K >= 8 E) looks ahead when the cache has room for two layers
    beside the one computing; STRATA_PROMPT_PREFETCH (read at each layer) switches it."""
    path = _file(tmp_path, make_mix, arch)
    info = strata.ModelInfo(path)
    spec = info.spec
    E, K = spec["experts"], spec["top_k"]
    T = 8 * E // K + 5
    lay = info.layout(64, True)
    prompt = [int(x) for x in np.random.default_rng(3).integers(1, 500, size=T)]
    cache = f"{(lay['slots'] + 3 * E) * lay['slot_bytes']}b"
    got = {}
    for v in ("0", "1"):
        monkeypatch.setenv("STRATA_PROMPT_PREFETCH", v)
        m = strata.Model(path, device="cuda", expert_cache=cache, prefill=64, ctx=CTX, progress=False)
        got[v] = ([m.logits(prompt, seq=0) for _ in range(2)], m.cache)
    (off, c0), (on, c1) = got["0"], got["1"]
    for a, b in zip(off, on, strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert c0["prefetch_fills"] == 0 and c0["misses"] > 0
    assert c1["prefetch_fills"] > 0 and c1["prefetch_used"] > 0
    assert c1["prefetch_used"] + c1["prefetch_wasted"] <= c1["prefetch_fills"]
