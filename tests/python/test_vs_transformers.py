"""Logits and greedy tokens of strata's CPU engine against transformers on the same GGUF.

Every bound below is at most ~10x the error measured on these models (the measured value is beside
it; each test prints its own). The test models differ from every fallback of the reader (conftest),
so a hyperparameter read wrongly moves the logits well past these bounds.
"""

from __future__ import annotations

import functools
import os
import types

import numpy as np
import pytest

import strata
from conftest import MIXES, SEED
from strata.testing import make_qwen3moe

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from float64_reference import Float64, flip_allowance, q8_0_round_trip, run_in_float64  # noqa: E402

torch.set_num_threads(1)  # the models are tiny; on a loaded 2-core machine more threads only contend

# The exact path (fused layout, float32 from exactly dequantized weights): both sides hold the same
# float32 weights (test_quant), so only float32 summation order and libm differ.
# Measured max |a - b| / max |b|: f32 3.6e-7, f16 5.6e-7, q8_0 3.1e-7, q4_k 4.6e-7, q6_k 4.6e-7,
# iq2_xs 5.7e-7, ud-q4_k_xl 4.8e-7, gpt-oss 5.7e-7, q3_k_m 5.8e-7, iq4_xs 5.4e-7, legacy 5.1e-7,
# q2_k 5.7e-7, ud-iq1_s 6.0e-7, ud-iq3_xxs 7.8e-7. An RMS epsilon of 1e-6 instead of the file's 5e-5 moves it past 1e-5.
TOLERANCE = {mix: 3e-6 for mix in MIXES}

# The MMQ layout quantizes each expert's input rows (and the down projection's input) to q8_0. Its
# reference is transformers with the same q8_0 round trip (gguf.quants, an independent implementation
# of ggml's rule) at the same two places, so a router that flips on q8_0 noise flips in both. The
# reference runs in float64 (float64_reference): its activations, and so its roundings, are the same
# on every CPU, ISA and thread count (the logits are bit-identical under ATEN_CPU_CAPABILITY avx2 and
# avx512, 1 and 2 threads, MKL_CBWR AUTO and COMPATIBLE). A float32 reference was not: its roundings
# followed torch's summation order, and an Intel Xeon's MKL put a flip early where this EPYC's did not
# (q4_k median 5.7e-6 there, 3.0e-7 here).
# What is left is strata's own float32 noise, which is the same on every machine with AVX2 (its
# kernels are bit-identical across ISAs and thread counts): an element whose exact value sits within
# that noise of a rounding half lands one q8_0 step (block max / 127) from the reference's. How far
# that can go is derived from the reference itself (float64_reference.flip_allowance): every element
# within TIE_MARGIN (3e-4 of a step) of a half is flipped alone and its move summed per position.
# One flip moves its position by ~1e-3 of max |logit| and the later ones through attention by up to
# as much; all of them together reach at most 1.9e-2 (q8_0, 69 near-ties), 2.7e-2 (q4_k, 103), 4.3e-2
# (q6_k, 198), 2.9e-2 (iq2_xs, 54). _check_mmq holds every position to float32 noise plus twice that
# reach, which holds whatever order strata's float32 sums take, and to the tighter bounds below,
# measured on this build's own flips: the max bound ~5x the largest (q8_0's, with none, the exact
# path's), the median bound ~10x the float32 noise where no flip comes early, ~3x one flip's reach
# where one does (iq2_xs: an element 7.6e-6 of a step from a half at position 3 moves every later
# position by ~1.5e-3; there the max bound and the per-position one carry the test).
# (max over positions, median) measured: q8_0 (1.7e-7, 1.0e-7; no flip), q4_k (1.8e-3 at 41,
# 2.8e-7), q6_k (8.7e-4 at 21, 2.2e-6; top-8 of 12 over D = F = 256 quantizes the most elements),
# iq2_xs (3.7e-3 at 3, 1.5e-3). Against plain transformers (no q8_0) the same logits are 6e-3 to 3e-2
# away.
# The real-file mixes (strata.testing.QUANT_MIXES), measured the same way: ud-q4_k_xl (1.5e-3 at 40,
# 4.8e-7), gpt-oss (2.8e-7, 1.7e-7; no flip), q3_k_m (2.1e-3 at 2, 7.6e-4: a flip at position 2 moves the
# rest), iq4_xs (1.1e-5 at 24, 2.6e-7), legacy (2.8e-7, 1.7e-7; no flip), q2_k (4.2e-5 at 39, 2.1e-7),
# ud-iq1_s (1.7e-3 at 25, 2.9e-7), ud-iq3_xxs (1.6e-3 at 35, 2.2e-7).
MMQ_TOLERANCE = {"q8_0": (3e-6, 1e-6), "q4_k": (1e-2, 3e-6), "q6_k": (1e-2, 2.5e-5), "iq2_xs": (2e-2, 5e-3),
                 "ud-q4_k_xl": (1e-2, 5e-6), "gpt-oss": (3e-6, 1e-6), "q3_k_m": (1e-2, 2.5e-3),
                 "iq4_xs": (1e-2, 3e-6), "legacy": (3e-6, 1e-6), "q2_k": (1e-2, 3e-6), "ud-iq1_s": (1e-2, 3e-6),
                 "ud-iq3_xxs": (1e-2, 3e-6)}
QUANTIZED = list(MMQ_TOLERANCE)

PROMPT = "The quick brown fox jumps over the lazy dog. 1234567890 <|im_start|>user\nhello<|im_end|>"


def _experts_with_q8_0_inputs(self, hidden_states, top_k_index, top_k_weights):
    """Qwen3MoeExperts.forward with the expert input rows and the down input quantized to q8_0."""
    F = torch.nn.functional
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        k_pos, rows = torch.where((top_k_index == e).T)
        if rows.numel() == 0:
            continue
        x = q8_0_round_trip(hidden_states[rows], (id(self), e, 0), rows)
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        y = F.linear(q8_0_round_trip(self.act_fn(gate) * up, (id(self), e, 1), rows), self.down_proj[e])
        out.index_add_(0, rows, y * top_k_weights[rows, k_pos, None])
    return out


@functools.cache
def _hf(path: str, q8_experts: bool = False):
    """transformers' model of the file in float32; with q8_experts, in float64 (float64_reference) with
    the experts' inputs through q8_0."""
    F = strata.ModelInfo(path).spec["expert_ffn"]

    def load():
        return transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), moe_intermediate_size=F, norm_topk_prob=True,
            dtype=torch.float64 if q8_experts else torch.float32,
        ).eval()

    if not q8_experts:
        return load()
    with Float64():
        m = load()
    for layer in m.model.layers:
        layer.mlp.experts.forward = types.MethodType(_experts_with_q8_0_inputs, layer.mlp.experts)
    return run_in_float64(m)


@functools.cache
def _hf_logits(path: str, ids: tuple[int, ...], q8_experts: bool = False) -> np.ndarray:
    with torch.no_grad():
        return _hf(path, q8_experts)(torch.tensor([list(ids)])).logits[0].float().numpy()


def _third_of_experts(path: str) -> str:
    spec = strata.ModelInfo(path).spec
    return f"{max(spec['expert_bytes'] // 3, 8 * spec['slot_bytes'])}b"


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _per_position(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.abs(a - ref).max(axis=1) / np.abs(ref).max()


@functools.cache
def _q8_reference(path: str, ids: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    return flip_allowance(_hf(path, q8_experts=True), list(ids))


def _check_mmq(mix: str, ours: np.ndarray, path: str, ids: list[int]) -> None:
    ref, allowance, ties = _q8_reference(path, tuple(ids))
    pos = _per_position(ours, ref)
    worst, median = MMQ_TOLERANCE[mix]
    plain = _rel_err(ours, _hf_logits(path, tuple(ids)))
    print(f"MMQ {mix} vs q8_0-activation transformers: max {pos.max():.2e} (at {int(pos.argmax())}), "
          f"median {np.median(pos):.2e}; {ties} near-ties could move a position by up to {allowance.max():.1e} "
          f"(median {np.median(allowance):.1e}); vs plain transformers {plain:.2e}")
    # Whatever order strata's float32 sums take: every position within float32 noise of the reference, or
    # within the reach of the roundings it may take the other way (twice their summed one-flip moves).
    unexplained = np.nonzero(pos > TOLERANCE[mix] + 2 * allowance)[0]
    assert not len(unexplained), (f"{mix}: positions {unexplained.tolist()} are {pos[unexplained]} off, more than "
                                  f"float32 noise and the q8_0 flips strata may take ({allowance[unexplained]})")
    # And this build's own flips (the same on every AVX2 machine), measured.
    p = int(pos.argmax())
    assert pos.max() <= worst, f"{mix}: position {p} is {pos.max():.3e} off (bound {worst}, flips {allowance[p]:.1e})"
    assert np.median(pos) <= median, f"{mix}: median position {np.median(pos):.3e} off (bound {median})"


@pytest.mark.parametrize("mix", list(MIXES))
def test_logits_match_transformers(make_mix, mix):
    path = make_mix(mix)
    # Streamed through a cache a third the size of the experts, under moe_layout="fused": the fused layout.
    m = strata.Model(path, expert_cache=_third_of_experts(path), prefill=8, progress=False, moe_layout="fused")
    assert m.layout(8)["kind"] == "fused"
    ids = m.tokenize(PROMPT)
    assert len(ids) > 10
    ours = m.logits(ids)
    ref = _hf_logits(path, tuple(ids))
    assert ours.shape == ref.shape
    err = _rel_err(ours, ref)
    print(f"{mix}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE[mix], f"{mix}: relative error {err:.3e} > {TOLERANCE[mix]}"


def _check_greedy(m: strata.Model, path: str, n: int) -> None:
    """strata's greedy tokens are transformers' argmax at every step. One forward of the prompt and
    strata's tokens (teacher forcing) checks every step: up to the first difference both saw the same
    sequence."""
    prompt = m.tokenize("Once upon a time")
    out = m.generate(prompt, max_tokens=n, temperature=0.0)
    seq = list(prompt) + out.tokens
    with torch.no_grad():
        nxt = _hf(path)(torch.tensor([seq])).logits[0, len(prompt) - 1 :].argmax(-1).tolist()
    for i, tok in enumerate(out.tokens):
        assert nxt[i] == tok, f"token {i} differs: strata {tok}, transformers {nxt[i]}"
    if out.stats["stop_reason"] == "stop_token":
        assert nxt[len(out.tokens)] in m.tokenizer.stop_ids
    else:
        assert len(out.tokens) == n


@pytest.mark.parametrize("mix", ["f32", "q4_k", "iq2_xs"])
def test_greedy_tokens_match_transformers(make_mix, mix):
    path = make_mix(mix)
    _check_greedy(strata.Model(path, expert_cache="all", progress=False), path, 32)


@pytest.mark.parametrize("unfused", [False, True], ids=["gr-fused", "gr-unfused"])
@pytest.mark.parametrize("layout,streamed", [("fused", True), ("mmq", False), ("mmq", True)],
                         ids=["fused", "mmq", "mmq-streamed"])
def test_layouts_and_gr_modes_match_transformers(make_mix, layout, streamed, unfused):
    """The fused layout (a third of the experts cached, moe_layout="fused") against float transformers; the
    MMQ layout, every expert resident or streamed through the same cache (the default), against q8_0
    activations."""
    path = make_mix("q4_k")
    m = strata.Model(path, expert_cache=_third_of_experts(path) if streamed else "all", prefill=8, progress=False,
                     gr_unfused=unfused, moe_layout="fused" if layout == "fused" else "auto")
    lay = m.layout(8, source=streamed)
    assert lay["kind"] == layout
    assert any(b["name"] == "xn" for b in lay["buffers"]) == unfused
    ids = m.tokenize(PROMPT)
    ours = m.logits(ids)
    if layout == "fused":
        err = _rel_err(ours, _hf_logits(path, tuple(ids)))
        print(f"fused {'unfused' if unfused else 'fused'} GR: max relative logit error {err:.3e}")
        assert err <= TOLERANCE["q4_k"]
    else:
        _check_mmq("q4_k", ours, path, ids)


@pytest.mark.parametrize("mix", QUANTIZED)
def test_mmq_layout_matches_transformers_with_q8_0_activations(make_mix, mix):
    """Every quantized mix with no ExpertSource (the MMQ layout), chunked unevenly (prefill 13),
    against the reference that quantizes the same activations: no position is exempt."""
    path = make_mix(mix)
    m = strata.Model(path, expert_cache="all", prefill=13, progress=False)
    assert m.layout(13, source=False)["kind"] == "mmq"
    assert any(b["dtype"] == "q8_0" for b in m.layout(13, source=False)["buffers"])
    ids = m.tokenize(PROMPT)
    _check_mmq(mix, m.logits(ids), path, ids)


# Float experts are never quantized: the default configuration (on the CPU every expert resident,
# the MMQ layout) runs F32/F16/BF16 experts with the float matmul. Release 0.1 quantized their
# activations to q8_0 and landed 1.3e-2 away on F32. Measured now: f32 3.6e-7, f16 5.6e-7.
@pytest.mark.parametrize("mix,bound", [("f32", 3e-6), ("f16", 5e-6)])
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
    _check_greedy(m, path, 16)


@pytest.mark.parametrize("mix", list(MIXES))
def test_spec_holds_the_files_hyperparameters(make_mix, mix):
    """Every hyperparameter strata reads is the file's, none a fallback (the test models differ from all)."""
    shape, _ = MIXES[mix]
    s = strata.ModelInfo(make_mix(mix)).spec
    got = {k: s[k] for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "experts", "top_k", "expert_ffn",
                              "vocab", "ctx_train")}
    want = {k: shape[k] for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "experts", "top_k",
                                  "expert_ffn", "vocab")}
    assert got == {**want, "ctx_train": shape["ctx"]}
    assert s["rope_base"] == pytest.approx(shape["rope_theta"]) and s["rms_eps"] == pytest.approx(shape["rms_eps"])


# One metadata key changed, same tensors (they depend only on the seed and their names).
VARIANTS = {"rope_theta": 4e4, "rms_eps": 3e-4, "top_k": 3, "kv_heads": 4}


@pytest.mark.parametrize("key", list(VARIANTS))
def test_each_hyperparameter_from_metadata_moves_the_logits(make_mix, tmp_path, key):
    """A file that changes one hyperparameter changes strata's logits, and transformers agrees on the
    new ones: the key is read, and read as transformers reads it. (kv_heads changes the k/v tensors'
    shapes too; the rest are metadata only.)"""
    shape, quant = MIXES["f32"]
    assert shape[key] != VARIANTS[key]
    path = str(tmp_path / f"{key}.gguf")
    make_qwen3moe(path, **{**shape, key: VARIANTS[key]}, quant=quant, seed=SEED)
    assert strata.ModelInfo(path).spec[{"rope_theta": "rope_base", "top_k": "top_k", "rms_eps": "rms_eps",
                                        "kv_heads": "kv_heads"}[key]] == pytest.approx(VARIANTS[key])
    ids = strata.Model(path, progress=False).tokenize(PROMPT)
    base = strata.Model(make_mix("f32"), expert_cache=64, prefill=16, progress=False).logits(ids)
    ours = strata.Model(path, expert_cache=64, prefill=16, progress=False).logits(ids)
    moved = _rel_err(ours, base)
    err = _rel_err(ours, _hf_logits(path, tuple(ids)))
    print(f"{key} {shape[key]} -> {VARIANTS[key]}: logits moved {moved:.2e}, error vs transformers {err:.2e}")
    assert moved > 10 * TOLERANCE["f32"]
    assert err <= TOLERANCE["f32"]
