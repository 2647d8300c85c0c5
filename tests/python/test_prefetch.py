"""--prefetch (issue 18 item 2): while a decode layer resolved on the device runs, the next layer's
router picks experts from this layer's post-attention state and they are filled ahead of their layer.
Only residency changes: the tokens and the logits are the same with it on and off, on every source and
cache size; the counters show fills, fills a later resolution used, and fills evicted unused. On the CPU
the fill is the sequential reference (the GPU's kernels: the op harness's ResolveExpertsMatchesReference,
end to end test_gpu.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import strata

CTX = 160
PREFILL = 16


def _cache(path, extra_frac: float) -> str:
    info = strata.ModelInfo(path)
    lay = info.layout(PREFILL, True)
    spec = info.spec
    slots = lay["slots"] + spec["top_k"] + 1 + int(extra_frac * spec["layers"] * spec["experts"])
    return f"{slots * lay['slot_bytes']}b"


@pytest.mark.parametrize("source", ["host", "mmap"])
@pytest.mark.parametrize("extra", [0.0, 0.3])
def test_prefetch_changes_residency_not_results(make_mix, source, extra):
    path = make_mix("q4_k")
    prompt = [int(x) for x in np.random.default_rng(5).integers(1, 500, size=20)]
    runs = {}
    for on in (False, True):
        m = strata.Model(path, device="cpu", expert_cache=_cache(path, extra), prefill=PREFILL, ctx=CTX,
                         source=source, decode_resolve="device", prefetch=on, progress=False)
        out = m.generate(prompt, max_tokens=24, temperature=0.0)
        logits = m.logits(prompt + out.tokens[:8], seq=0)
        runs[on] = (out.tokens, logits, m.cache)
    (t0, l0, c0), (t1, l1, c1) = runs[False], runs[True]
    assert t0 == t1
    np.testing.assert_array_equal(l0, l1)
    assert c0["prefetch_fills"] == c0["prefetch_used"] == c0["prefetch_bytes"] == 0
    assert c1["prefetch_fills"] > 0
    assert 0 < c1["prefetch_used"] <= c1["prefetch_fills"]
    assert c1["prefetch_used"] + c1["prefetch_wasted"] <= c1["prefetch_fills"]
    assert c1["prefetch_bytes"] > 0 and c1["bytes_streamed"] >= c1["prefetch_bytes"]


def test_prefetch_needs_device_resolution_and_lru(make_mix):
    path = make_mix("q4_k")
    with pytest.raises(strata.ConfigError, match="--prefetch on"):
        strata.Model(path, device="cpu", expert_cache=64, cache_policy="lfu", prefetch=True, progress=False)
    with pytest.raises(strata.ConfigError, match="--prefetch on"):
        strata.Model(path, device="cpu", expert_cache=64, decode_resolve="host", prefetch=True, progress=False)
    with pytest.raises(strata.ConfigError, match="prefetch"):
        strata.Model(path, device="cpu", expert_cache=64, prefetch="on", progress=False)


def test_prefetch_flag_in_cli_help():
    from click.testing import CliRunner

    from strata.cli import main

    r = CliRunner().invoke(main, ["generate", "--help"])
    assert r.exit_code == 0 and "--prefetch [on|off]" in r.output


def test_prefetch_is_qwen3moe_only(tmp_path):
    from strata.testing import make_gpt_oss

    path = str(make_gpt_oss(tmp_path / "oss.gguf", seed=5))
    with pytest.raises(strata.UnsupportedError, match="does not predict its next layer's experts"):
        strata.Model(path, device="cpu", expert_cache=64, prefetch=True, progress=False)
