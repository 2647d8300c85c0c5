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


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek4"])
def test_prefetch_auto_is_off_on_the_cpu(tmp_path, make_mix, arch):
    """--prefetch auto (the default) turns prefetch on only for deepseek4 on a GPU (test_gpu_prefetch.py): on the
    CPU it loads off, and --prefetch auto cannot be given with on or N (one value: the CLI and strata.Model
    take a single prefetch)."""
    path = make_mix("q4_k") if arch == "qwen3moe" else _arch_file(tmp_path, arch)
    m = strata.Model(path, device="cpu", expert_cache=_cache(path, 0.3), prefill=PREFILL, ctx=CTX,
                     decode_resolve="device", progress=False)
    assert m.prefetch is False
    assert strata.Model(path, device="cpu", expert_cache=_cache(path, 0.3), prefill=PREFILL, ctx=CTX,
                        decode_resolve="device", prefetch=3, progress=False).prefetch == 3
    from strata._options import parse_prefetch
    assert parse_prefetch("auto") == "auto" and parse_prefetch("off") is False and parse_prefetch("2") == 2
    with pytest.raises(strata.ConfigError, match="auto, on, off"):
        parse_prefetch("sometimes")


def test_prefetch_flag_in_cli_help():
    from click.testing import CliRunner

    from strata.cli import main

    r = CliRunner().invoke(main, ["generate", "--help"])
    assert r.exit_code == 0 and "--prefetch auto|on|off|N" in r.output


def test_prefetch_budget_changes_residency_not_results(make_mix):
    """--prefetch N fills at most N of each token's guesses a layer, the surest first: the same tokens and
    logits as without prefetch, and no more fills than the budget allows (fewer than the unbounded
    prefetch makes on the same run)."""
    path = make_mix("q4_k")
    prompt = [int(x) for x in np.random.default_rng(6).integers(1, 500, size=20)]
    runs = []
    for pf in (False, 1, True):  # off, a budget of one, every guess
        m = strata.Model(path, device="cpu", expert_cache=_cache(path, 0.3), prefill=PREFILL, ctx=CTX,
                         decode_resolve="device", prefetch=pf, progress=False)
        out = m.generate(prompt, max_tokens=24, temperature=0.0)
        runs.append((out.tokens, m.logits(prompt + out.tokens[:8], seq=0), m.cache))
    (t0, l0, c0), (t1, l1, c1), (_, _, ca) = runs
    layers = strata.ModelInfo(path).spec["layers"]
    assert t0 == t1
    np.testing.assert_array_equal(l0, l1)
    assert c0["prefetch_fills"] == 0
    steps = 24 - 1  # decode steps after the prompt's first token (each prefetches layers 1 .. L - 1)
    assert 0 < c1["prefetch_fills"] <= steps * (layers - 1)
    assert c1["prefetch_fills"] < ca["prefetch_fills"]
    assert 0 < c1["prefetch_used"] <= c1["prefetch_fills"]


@pytest.mark.parametrize("bad", [0, -2, 1.5, "on", None])
def test_prefetch_value_checked(make_mix, bad):
    with pytest.raises(strata.ConfigError, match="prefetch"):
        strata.Model(make_mix("q4_k"), device="cpu", expert_cache=64, prefetch=bad, progress=False)


def test_prefetch_cli_value_checked(make_mix):
    from click.testing import CliRunner

    from strata.cli import main

    r = CliRunner().invoke(main, ["generate", make_mix("q4_k"), "-p", "hi", "--prefetch", "some"])
    assert r.exit_code != 0 and "--prefetch must be auto, on, off or a number N >= 1" in r.output
    assert "Traceback" not in r.output


def test_prefetch_refused_where_the_next_layer_is_not_predicted(tmp_path):
    from strata.testing import make_gpt_oss

    path = str(make_gpt_oss(tmp_path / "oss.gguf", seed=5))
    with pytest.raises(strata.UnsupportedError, match="does not predict its next layer's experts"):
        strata.Model(path, device="cpu", expert_cache=64, prefetch=True, progress=False)


# ---- a prompt pass's look ahead (ExpertCache::prefetch_layer) ----
# A qwen3moe prompt chunk that routes many rows (T * K >= 8 E) with a bounded cache guesses layer l + 1's
# experts (its router on layer l's post-attention residual) and queues their copies right behind layer
# l's, under LRU, when the cache has room for two layers beside the one computing. On by default
# (STRATA_PROMPT_PREFETCH=0 turns it off).

def _prompt_prefetch_file(tmp_path, quant):
    from strata.testing import make_qwen3moe

    path = str(tmp_path / f"pp-{quant}.gguf")
    make_qwen3moe(path, layers=6, hidden=256, heads=4, kv_heads=2, head_dim=32, experts=8, top_k=2,
                  expert_ffn=256, vocab=512, ctx=512, norm_std=0.2, seed=11,
                  quant={"experts": "Q4_K"} if quant == "q4_k" else {})
    return path


@pytest.mark.parametrize("quant", ["q4_k", "f32"])
@pytest.mark.parametrize("source", ["host", "mmap"])
def test_prompt_prefetch_changes_residency_not_results(tmp_path, quant, source):
    path = _prompt_prefetch_file(tmp_path, quant)
    info = strata.ModelInfo(path)
    spec = info.spec
    E, K = spec["experts"], spec["top_k"]
    T = 8 * E // K + 5  # 37 tokens: past the threshold
    lay = info.layout(64, True)
    prompt = [int(x) for x in np.random.default_rng(3).integers(1, 500, size=T)]

    def model(extra_slots):
        cache = f"{(lay['slots'] + extra_slots) * lay['slot_bytes']}b"
        return strata.Model(path, device="cpu", expert_cache=cache, prefill=64, ctx=CTX, source=source,
                            progress=False)

    # The reference: a cache with room for one layer and a half beside the chunk's lent slots, too
    # little to look ahead (the same layout: a streamed prompt's logits do not depend on the cache).
    ref = model(E + E // 2)
    want = ref.logits(prompt, seq=0)
    assert ref.cache["prefetch_fills"] == 0 and ref.cache["misses"] > 0
    # Room for three layers' experts of six: every pass streams, and looks ahead.
    m = model(3 * E)
    for _ in range(2):  # a cold cache, then one holding the previous pass's last layers
        np.testing.assert_array_equal(m.logits(prompt, seq=0), want)
    c = m.cache
    # Layers 1..5 are looked ahead each pass (layer 0 has no layer before it); a fill is used unless the
    # guess named an expert no token of the chunk chose.
    assert c["prefetch_fills"] >= 5 and c["prefetch_used"] > 0
    assert c["prefetch_used"] + c["prefetch_wasted"] <= c["prefetch_fills"]
    assert c["prefetch_bytes"] > 0 and c["bytes_streamed"] >= c["prefetch_bytes"]
    # A short prompt (T * K < 8 E) prefetches nothing.
    m2 = model(3 * E)
    np.testing.assert_array_equal(m2.logits(prompt[:20], seq=0), ref.logits(prompt[:20], seq=0))
    assert m2.cache["prefetch_fills"] == 0


def test_prompt_prefetch_switch(tmp_path):
    import subprocess
    import sys

    path = _prompt_prefetch_file(tmp_path, "q4_k")
    code = (
        "import strata, numpy as np, sys\n"
        "info = strata.ModelInfo(sys.argv[1]); lay = info.layout(64, True)\n"
        "cache = f\"{(lay['slots'] + 24) * lay['slot_bytes']}b\"\n"
        "m = strata.Model(sys.argv[1], device='cpu', expert_cache=cache, prefill=64, ctx=160, progress=False)\n"
        "try:\n"
        "    m.logits(list(range(1, 41)), seq=0)\n"
        "except strata.ConfigError as e:\n"
        "    print('error:', e); sys.exit(3)\n"
        "print(m.cache['prefetch_fills'])\n"
    )
    def run(v):
        import os
        env = {**os.environ, "STRATA_PROMPT_PREFETCH": v}
        return subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, env=env)

    on, off, bad = run("1"), run("0"), run("yes")
    assert on.returncode == 0 and int(on.stdout.split()[-1]) > 0, on.stderr
    assert off.returncode == 0 and int(off.stdout.split()[-1]) == 0, off.stderr
    assert bad.returncode == 3 and "STRATA_PROMPT_PREFETCH=yes is not 0 or 1" in bad.stdout, bad.stdout + bad.stderr


# ---- deepseek2 and deepseek4: the architecture's own guess ----
# deepseek2's selection (sigmoid scores plus exp_probs_b, the best groups, top-K within them) and V4's
# (router_v4: biased sqrt-softplus, its hash layers' table exact) are the architectures' own
# (NextRouter::select); V4's router input collapses this layer's HC streams with this site's weights under
# the next layer's FFN norm (NextRouter::input, apply_norm_hc). The guess is used as qwen3moe's is, in a decode
# step resolved on the device and in a prompt chunk's look ahead. Only residency changes.

def _arch_file(tmp_path, arch):
    path = str(tmp_path / f"{arch}-prefetch.gguf")
    if arch == "deepseek2":
        from strata.testing.deepseek2 import make_deepseek2

        make_deepseek2(path, layers=5, dense_layers=1, experts=16, top_k=4, groups=4, groups_used=2,
                       quant={"experts": "Q4_0"}, seed=13)
    else:
        from strata.testing.deepseek4 import make_deepseek4

        make_deepseek4(path, layers=6, compress_ratios=(0, 4, 128, 4, 0, 4), hash_layers=2, experts=16, top_k=4,
                       seed=17)
    return path


ARCHS = ["deepseek2", "deepseek4"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", ["host", "mmap"])
def test_arch_prefetch_changes_residency_not_results(tmp_path, arch, source):
    path = _arch_file(tmp_path, arch)
    prompt = [int(x) for x in np.random.default_rng(9).integers(1, 500, size=20)]
    runs = {}
    for on in (False, True):
        m = strata.Model(path, device="cpu", expert_cache=_cache(path, 0.3), prefill=PREFILL, ctx=CTX, source=source,
                         decode_resolve="device", prefetch=on, progress=False)
        out = m.generate(prompt, max_tokens=24, temperature=0.0)
        runs[on] = (out.tokens, m.logits(prompt + out.tokens[:8], seq=0), m.cache)
    (t0, l0, c0), (t1, l1, c1) = runs[False], runs[True]
    assert t0 == t1
    np.testing.assert_array_equal(l0, l1)
    assert c0["prefetch_fills"] == 0
    assert c1["prefetch_fills"] > 0 and 0 < c1["prefetch_used"] <= c1["prefetch_fills"]
    assert c1["prefetch_used"] + c1["prefetch_wasted"] <= c1["prefetch_fills"]


@pytest.mark.parametrize("arch", ARCHS)
def test_arch_prompt_look_ahead_changes_residency_not_results(tmp_path, arch):
    path = _arch_file(tmp_path, arch)
    info = strata.ModelInfo(path)
    E, K = info.spec["experts"], info.spec["top_k"]
    T = 8 * E // K + 3  # 35 tokens: T * K >= 8 E
    lay = info.layout(T, True)  # the chunk's own lent slots (these files' slots are small beside their scratch)
    prompt = [int(x) for x in np.random.default_rng(4).integers(1, 500, size=T)]

    def model(extra_slots):
        cache = f"{(lay['slots'] + extra_slots) * lay['slot_bytes']}b"
        return strata.Model(path, device="cpu", expert_cache=cache, prefill=T, ctx=CTX, progress=False)

    ref = model(E + E // 2)  # room for a layer and a half beside the chunk: no look ahead
    want = ref.logits(prompt, seq=0)
    assert ref.cache["prefetch_fills"] == 0 and ref.cache["misses"] > 0
    m = model(3 * E)  # three layers' experts: every pass streams, and looks ahead
    for _ in range(2):
        np.testing.assert_array_equal(m.logits(prompt, seq=0), want)
    c = m.cache
    # Every MoE layer after the first is looked ahead each pass (deepseek2's four MoE layers: 3 a pass).
    assert c["prefetch_fills"] >= 3 and c["prefetch_used"] > 0
    assert c["prefetch_used"] + c["prefetch_wasted"] <= c["prefetch_fills"]
