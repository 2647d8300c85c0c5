"""gpt-oss on the CPU against transformers' GptOssForCausalLM built from the same dequantized weights
(strata.testing.gptoss.hf_model): logits, greedy tokens, every hyperparameter read from metadata, the
logits' independence of the expert cache and the prompt chunking, and the errors of bad files.

Bounds are test_vs_transformers.py's: 3e-6 of max |logit| on the exact path (float32 weights both
sides). Measured max |a - b| / max |b|: f32 1.5e-6, q8_0 1.6e-6, mxfp4 experts 1.2e-6, the
hyperparameter variants 1.0e-6 to 2.0e-6; with an expert gain of 1 instead of 3 (the SwiGLU's clamp
unreached) 4.7e-7: the larger activations the clamp needs carry the larger float32 noise.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import strata
from strata.testing import make_gpt_oss
from strata.testing.gguf_edit import F32, STRING, U32, Gguf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from strata.testing.gptoss import hf_model  # noqa: E402

torch.set_num_threads(1)

TOLERANCE = 3e-6
SEED = 5
MIXES = {
    "f32": None,
    "q8_0": {"embed": "Q8_0", "attn": "Q8_0", "router": "Q8_0", "experts": "Q8_0", "output": "Q8_0"},
    "mxfp4": {"embed": "Q8_0", "attn": "Q8_0", "experts": "MXFP4", "output": "Q8_0"},
}
PROMPT = "The quick brown fox jumps over the lazy dog. 1234567890 <|im_start|>user\nhello<|im_end|>"


@pytest.fixture(scope="module")
def oss_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gpt-oss")


@pytest.fixture(scope="module")
def oss_model(oss_dir):
    made: dict[str, str] = {}

    def make(mix: str, **kw) -> str:
        name = mix + "".join(f"-{k}={v}" for k, v in sorted(kw.items()))
        if name not in made:
            made[name] = str(make_gpt_oss(oss_dir / f"{name}.gguf", quant=MIXES[mix], seed=SEED, **kw))
        return made[name]

    return make


@functools.cache
def _hf_logits(path: str, ids: tuple[int, ...]) -> np.ndarray:
    with torch.no_grad():
        return hf_model(path)(torch.tensor([list(ids)])).logits[0].numpy()


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _third_of_experts(path: str) -> str:
    spec = strata.ModelInfo(path).spec
    return f"{max(spec['expert_bytes'] // 3, 8 * spec['slot_bytes'])}b"


@pytest.mark.parametrize("mix", list(MIXES))
def test_logits_match_transformers(oss_model, mix):
    path = oss_model(mix)
    # Streamed through a cache a third the size of the experts, in chunks of 8, under moe_layout="fused": the
    # fused layout.
    m = strata.Model(path, expert_cache=_third_of_experts(path), prefill=8, progress=False, moe_layout="fused")
    assert m.layout(8)["kind"] == "fused"
    ids = m.tokenize(PROMPT)
    assert len(ids) > 3 * 6  # past the sliding window several times over
    ours = m.logits(ids)
    ref = _hf_logits(path, tuple(ids))
    err = _rel_err(ours, ref)
    print(f"gpt-oss {mix}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE


@pytest.mark.parametrize("cache", ["all", "third"])
def test_greedy_tokens_match_transformers(oss_model, cache):
    """Every expert resident (the default: the MMQ layout, float experts never quantized) or streamed
    through a third of them (the fused layout, moe_layout="fused"): one prompt chunk, then greedy decoding (the gathered
    decode MoE) token for token against transformers' argmax."""
    path = oss_model("f32")
    streamed = {} if cache == "all" else {"expert_cache": _third_of_experts(path), "prefill": 8, "moe_layout": "fused"}
    m = strata.Model(path, progress=False, **streamed)
    assert m.cache["all_resident"] == (cache == "all")
    assert m.layout(m.chunk, source=cache != "all")["kind"] == ("mmq" if cache == "all" else "fused")
    ids = m.tokenize(PROMPT)
    err = _rel_err(m.logits(ids), _hf_logits(path, tuple(ids)))
    print(f"gpt-oss f32, cache {cache}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE
    prompt = m.tokenize("Once upon a time")
    out = m.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True)
    seq = list(prompt) + out.tokens
    assert len(out.tokens) == 24
    with torch.no_grad():
        nxt = hf_model(path)(torch.tensor([seq])).logits[0, len(prompt) - 1 :].argmax(-1).tolist()
    for i, tok in enumerate(out.tokens):
        assert nxt[i] == tok, f"token {i} differs: strata {tok}, transformers {nxt[i]}"


def test_spec_and_info_hold_the_files_hyperparameters(oss_model):
    s = strata.ModelInfo(oss_model("f32")).spec
    got = {k: s[k] for k in ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "experts", "top_k",
                              "expert_ffn", "vocab", "ctx_train")}
    assert got == {"arch": "gpt-oss", "layers": 3, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 24,
                   "experts": 8, "top_k": 3, "expert_ffn": 32, "vocab": 512, "ctx_train": 8192}
    assert s["rope_base"] == pytest.approx(1e4) and s["rms_eps"] == pytest.approx(3e-5)
    details = dict(s["details"])
    assert details["attention"] == "sinks; sliding window 6 on even layers, full on odd"
    assert details["rope"] == "YaRN factor 4, original context 2048, beta 16/2"


# One hyperparameter changed, same tensors where the shapes allow (they depend only on the seed and
# their names); kv_heads changes the k/v tensors' shapes too, yarn_factor 0 drops the scaling keys.
VARIANTS = {"rope_theta": 4e4, "rms_eps": 3e-4, "top_k": 2, "kv_heads": 4, "sliding_window": 11,
            "yarn_factor": 0.0, "yarn_orig_ctx": 256, "yarn_beta_fast": 40.0, "yarn_beta_slow": 0.5}


@pytest.mark.parametrize("key", list(VARIANTS))
def test_each_hyperparameter_from_metadata_moves_the_logits(oss_model, key):
    """A file that changes one hyperparameter changes strata's logits, and transformers agrees on the
    new ones: the key is read, and read as transformers reads it."""
    base_path, path = oss_model("f32"), oss_model("f32", **{key: VARIANTS[key]})
    m = strata.Model(path, expert_cache=64, prefill=16, progress=False)
    ids = m.tokenize(PROMPT)
    ours = m.logits(ids)
    base = strata.Model(base_path, expert_cache=64, prefill=16, progress=False).logits(ids)
    moved = _rel_err(ours, base)
    err = _rel_err(ours, _hf_logits(path, tuple(ids)))
    print(f"{key} -> {VARIANTS[key]}: logits moved {moved:.2e}, error vs transformers {err:.2e}")
    assert moved > 10 * TOLERANCE
    assert err <= TOLERANCE


def _slot_bytes(path: str, prefill: int, unfused: bool, moe_layout: str) -> tuple[int, int]:
    plan = strata.ModelInfo(path, gr_unfused=unfused, moe_layout=moe_layout).layout(prefill, True)
    assert plan["kind"] == ("fused" if moe_layout == "fused" else "mmq")
    return plan["slots"], plan["slot_bytes"]


@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
@pytest.mark.parametrize("mix", ["q8_0", "mxfp4"])
def test_logits_do_not_depend_on_cache_or_chunk_size(oss_model, mix, moe_layout):
    """Streamed, in either MoE layout: byte-identical logits across cache sizes from thrashing to all, chunk
    sizes that cut the prompt unevenly, both sources and both GR modes; the one-token decode scratch
    equals the first row of a prompt; with every expert resident (MMQ) identical across chunk sizes, and
    (the default, MMQ streamed too) identical to the streamed logits."""
    path = oss_model(mix)
    rng = np.random.default_rng(99)
    prompt = [int(x) for x in rng.integers(1, 500, size=37)]
    spec = strata.ModelInfo(path).spec
    n = spec["layers"] * spec["experts"]
    ref = None
    for prefill, source, unfused in ((5, "host", False), (13, "mmap", True), (37, "host", False)):
        region, slot = _slot_bytes(path, prefill, unfused, moe_layout)
        for slots in (region + 1, region + spec["top_k"] + 2, region + n):
            m = strata.Model(path, ctx=64, expert_cache=f"{slots * slot}b", prefill=prefill, source=source,
                             gr_unfused=unfused, progress=False, moe_layout=moe_layout)
            assert not m.cache["all_resident"]
            out = m.logits(prompt)
            if ref is None:
                ref = out
            assert np.array_equal(out, ref), f"prefill {prefill}, {slots} slots: {np.abs(out - ref).max()}"
    one = strata.Model(path, ctx=64, expert_cache=64, prefill=16, progress=False,
                       moe_layout=moe_layout).logits(prompt[:1])
    assert np.array_equal(one[0], ref[0])
    mmq = [strata.Model(path, ctx=64, expert_cache="all", prefill=p, progress=False).logits(prompt) for p in (7, 37)]
    assert np.array_equal(mmq[0], mmq[1])
    if moe_layout != "fused":
        assert np.array_equal(mmq[0], ref), f"streamed MMQ vs all resident: {np.abs(mmq[0] - ref).max()}"
        return
    rel = _rel_err(mmq[0], ref)
    print(f"{mix}: MMQ (q8_0 activations) vs fused logits {rel:.2e}")
    assert rel <= 6e-2  # as test_determinism's q8_0 bound: the MMQ layout quantizes the experts' inputs


def _edited(src: str, dst, edit) -> str:
    with open(src, "rb") as f:
        g = Gguf.parse(f.read())
    edit(g)
    with open(dst, "wb") as f:
        f.write(g.serialize())
    return str(dst)


@pytest.mark.parametrize("edit,message", [
    (lambda g: g.set("gpt-oss.attention.sliding_window", U32, 0),
     r"'gpt-oss.attention.sliding_window' = 0 is out of range"),
    (lambda g: g.set("gpt-oss.rope.scaling.type", STRING, b"linear"),
     r"rope.scaling.type 'linear' is not supported"),
    (lambda g: g.set("gpt-oss.rope.scaling.yarn_beta_fast", F32, 0.25),
     r"yarn_beta_fast 0.25 must exceed yarn_beta_slow 2"),
    (lambda g: g.set("gpt-oss.attention.key_length", U32, 16).set("gpt-oss.attention.value_length", U32, 16),
     r"tensor 'blk.0.attn_q.weight' has shape \[64, 96\], expected \[64, 64\]"),
    (lambda g: setattr(g.tensor("blk.1.attn_sinks.weight"), "name", b"blk.1.attn_sink.weight"),
     r"gpt-oss tensor 'blk.1.attn_sinks.weight' is missing"),
    (lambda g: setattr(g.tensor("blk.2.ffn_gate_exps.bias"), "ne", [32, 4]),
     r"tensor 'blk.2.ffn_gate_exps.bias' has shape \[32, 4\], expected \[32, 8\]"),
])
def test_bad_metadata_and_tensors_give_clear_errors(oss_model, tmp_path, edit, message):
    path = _edited(oss_model("f32"), tmp_path / "bad.gguf", edit)
    with pytest.raises(strata.FormatError if "not supported" not in message else strata.UnsupportedError,
                       match=message) as e:
        strata.ModelInfo(path)
    assert "bad.gguf" in str(e.value)
