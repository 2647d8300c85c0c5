"""Logits and greedy tokens of strata's CPU engine against transformers on the same GGUF."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import strata
from conftest import MIXES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# F32 weights: only float32 summation order and libm differ -> 1e-4 relative (the bound).
# Quantized mixes: both sides dequantize bit-identically (test_quant), so the weights are the same
# float32 values and only the same rounding noise remains; 1e-4 holds there too, measured ~1e-6.
TOLERANCE = {mix: 1e-4 for mix in MIXES}

PROMPT = "The quick brown fox jumps over the lazy dog. 1234567890 <|im_start|>user\nhello<|im_end|>"


@functools.cache
def _hf_logits(path: str, ids: tuple[int, ...]) -> np.ndarray:
    with torch.no_grad():
        return _hf(path)(torch.tensor([list(ids)])).logits[0].float().numpy()


def _hf(path: str):
    F = MIXES[os.path.basename(path)[:-5]][0]["expert_ffn"]
    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), moe_intermediate_size=F, norm_topk_prob=True,
        dtype=torch.float32,
    )
    return m.eval()


def _third_of_experts(path: str) -> str:
    spec = strata.Model(path, expert_cache="all", ctx=16, progress=False).spec
    return f"{max(spec['expert_bytes'] // 3, 8 * spec['slot_bytes'])}b"


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("mix", list(MIXES))
def test_logits_match_transformers(make_mix, mix):
    path = make_mix(mix)
    # Streamed through a cache a third the size of the experts: the fused layout.
    m = strata.Model(path, expert_cache=_third_of_experts(path), prefill=8, progress=False)
    assert m.layout(8)["kind"] == "fused"
    ids = m.tokenize(PROMPT)
    assert len(ids) > 10
    ours = m.logits(ids)
    ref = _hf_logits(path, tuple(ids))
    assert ours.shape == ref.shape
    err = _rel_err(ours, ref)
    print(f"{mix}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE[mix], f"{mix}: relative error {err:.3e} > {TOLERANCE[mix]}"


@pytest.mark.parametrize("mix", ["f32", "q4_k", "iq2_xs"])
def test_greedy_tokens_match_transformers(make_mix, mix):
    path = make_mix(mix)
    m = strata.Model(path, expert_cache="all", progress=False)
    prompt = m.tokenize("Once upon a time")
    out = m.generate(prompt, max_tokens=32, temperature=0.0)
    hf = _hf(path)
    ids = list(prompt)
    with torch.no_grad():
        for tok in out.tokens:
            nxt = int(hf(torch.tensor([ids])).logits[0, -1].argmax())
            assert nxt == tok, f"{mix}: token {len(ids) - len(prompt)} differs: strata {tok}, transformers {nxt}"
            ids.append(nxt)
        if out.stats["stop_reason"] == "stop_token":
            nxt = int(hf(torch.tensor([ids])).logits[0, -1].argmax())
            assert nxt in m.tokenizer.stop_ids
        else:
            assert len(out.tokens) == 32


# The MMQ layout (no ExpertSource) quantizes each expert's input activations to q8_0, and again the
# down projection's input, then runs integer dot products: each quantization adds up to 1/254 of a
# 32-block's maximum per element, which averages down in the dot products; the logits land around
# 6e-3 relative (printed). 3e-2 bounds it with margin for other seeds while still catching any real
# error (a wrong expert, weight, row or token moves logits by O(1)).
MMQ_TOLERANCE = 3e-2


@pytest.mark.parametrize("unfused", [False, True], ids=["gr-fused", "gr-unfused"])
@pytest.mark.parametrize("layout", ["fused", "mmq"])
def test_layouts_and_gr_modes_match_transformers(make_mix, layout, unfused):
    path = make_mix("q4_k")
    streamed = layout == "fused"
    m = strata.Model(path, expert_cache=_third_of_experts(path) if streamed else "all", prefill=8, progress=False,
                     gr_unfused=unfused)
    lay = m.layout(8, source=streamed)
    assert lay["kind"] == layout
    assert any(b["name"] == "xn" for b in lay["buffers"]) == unfused
    ids = m.tokenize(PROMPT)
    err = _rel_err(m.logits(ids), _hf_logits(path, tuple(ids)))
    print(f"{layout} {'unfused' if unfused else 'fused'} GR: max relative logit error {err:.3e}")
    assert err <= (TOLERANCE["q4_k"] if streamed else MMQ_TOLERANCE)


@pytest.mark.parametrize("mix", list(MIXES))
def test_mmq_layout_close_to_transformers_but_for_router_near_ties(make_mix, mix):
    """Every mix with no ExpertSource (the MMQ layout, q8_0 activations into the experts).

    q8_0 noise can flip a near-tie in the router (K-th vs K+1-th expert) for a token; that token's
    logits then move by O(0.1) (seen: 2 of 46 positions on the q6_k mix). The exact (fused) path is
    held to 1e-4 everywhere above; here all but a few positions must be within MMQ_TOLERANCE.
    """
    path = make_mix(mix)
    m = strata.Model(path, expert_cache="all", progress=False)
    ids = m.tokenize(PROMPT)
    ref = _hf_logits(path, tuple(ids))
    per_pos = np.abs(m.logits(ids) - ref).max(axis=1) / np.abs(ref).max()
    off = int((per_pos > MMQ_TOLERANCE).sum())
    print(f"MMQ {mix}: median {np.median(per_pos):.2e}, max {per_pos.max():.2e}, {off} positions over")
    assert np.median(per_pos) <= MMQ_TOLERANCE / 3
    assert off <= max(1, len(ids) // 10)


# Float experts are never quantized: the default configuration (on the CPU every expert resident,
# the MMQ layout) runs F32/F16/BF16 experts with the float matmul. Release 0.1 quantized their
# activations to q8_0 and landed 1.3e-2 away on F32. Measured now: F32 ~5e-7, F16 ~4e-7.
@pytest.mark.parametrize("mix,bound", [("f32", 1e-4), ("f16", 1e-3)])
def test_default_configuration_keeps_float_experts_exact(make_mix, mix, bound):
    path = make_mix(mix)
    m = strata.Model(path, progress=False)
    assert m.cache["all_resident"] and m.layout(m.chunk, source=False)["kind"] == "mmq"
    assert not any(b["dtype"] == "q8_0" for b in m.layout(m.chunk, source=False)["buffers"])
    ids = m.tokenize(PROMPT)
    err = _rel_err(m.logits(ids), _hf_logits(path, tuple(ids)))
    print(f"default {mix}: max relative logit error {err:.3e}")
    assert err <= bound
    # and greedy decoding follows transformers token for token
    prompt = m.tokenize("Once upon a time")
    out = m.generate(prompt, max_tokens=16, temperature=0.0)
    hf = _hf(path)
    ids = list(prompt)
    with torch.no_grad():
        for tok in out.tokens:
            nxt = int(hf(torch.tensor([ids])).logits[0, -1].argmax())
            assert nxt == tok
            ids.append(nxt)
