"""deepseek2 (DeepSeek V2/V3/R1, Kimi-K2) on the CPU against transformers' DeepseekV3ForCausalLM built from
the same dequantized weights (strata.testing.deepseek2.hf_model): logits and greedy tokens; the latent KV
cache's size; every hyperparameter read from metadata; the logits' independence of the expert cache, the
prompt chunking and batching; the errors of bad files.

transformers expands the latent into per-head keys and values; strata attends in the absorbed form (the
query times k_b, attention over the latent rows, the output times v_b): the same products summed in
another order, float32 both sides. Bound: gpt-oss's and qwen35moe's 3e-6 of max |logit| (float32 rounding
through a few layers of O(1) activations, ~2^-23 per op times the depth's growth); measured below.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import strata
from strata.testing.deepseek2 import make_deepseek2
from strata.testing.gguf_edit import STRING, U32, Gguf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from strata.testing.deepseek2 import hf_model  # noqa: E402

torch.set_num_threads(1)

TOLERANCE = 3e-6
SEED = 7
MIXES = {
    "f32": None,
    "q8_0": {"embed": "Q8_0", "attn": "Q8_0", "router": "Q8_0", "experts": "Q8_0", "output": "Q8_0"},
}
# Q8_0 rows are whole 32-blocks: the f32 file keeps the odd default head sizes, this one rounds them up.
MIX_SHAPES = {"f32": {}, "q8_0": {"q_lora": 64, "key_nope": 32, "value_dim": 32}}
PROMPT = "The quick brown fox jumps over the lazy dog. 1234567890 <|im_start|>user\nhello<|im_end|>"


@pytest.fixture(scope="module")
def ds2_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("deepseek2")


@pytest.fixture(scope="module")
def ds2_model(ds2_dir):
    made: dict[str, str] = {}

    def make(mix: str, **kw) -> str:
        name = mix + "".join(f"-{k}={v}" for k, v in sorted(kw.items()))
        if name not in made:
            made[name] = str(make_deepseek2(ds2_dir / f"{name}.gguf", quant=MIXES[mix], seed=SEED, **kw))
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
def test_logits_match_transformers(ds2_model, mix):
    path = ds2_model(mix, **MIX_SHAPES[mix])
    # Streamed through a cache a third the size of the experts, in chunks of 8, under moe_layout="fused": the
    # fused layout's float products of exactly dequantized weights, which the float32 bound holds.
    m = strata.Model(path, expert_cache=_third_of_experts(path), prefill=8, progress=False, moe_layout="fused")
    assert m.layout(8)["kind"] == "fused"
    ids = m.tokenize(PROMPT)
    assert len(ids) > 16
    ours = m.logits(ids)
    ref = _hf_logits(path, tuple(ids))
    err = _rel_err(ours, ref)
    print(f"deepseek2 {mix}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE


@pytest.mark.parametrize(
    "kw",
    [
        {"q_lora": 0},  # one query projection (V2-Lite)
        {"groups": 0, "norm_weights": False},  # no group keys, unnormalized weights
        {"yarn_factor": 0.0, "shared_experts": 1, "dense_layers": 2, "layers": 4},
        {"key_nope": 16, "key_rope": 16, "value_dim": 32, "kv_lora": 64, "heads": 2},
    ],
    ids=["no-q-lora", "no-groups", "no-yarn", "head-dims"],
)
def test_hyperparameter_variants_match_transformers(ds2_model, kw):
    path = ds2_model("f32", **kw)
    m = strata.Model(path, prefill=8, progress=False)
    ids = m.tokenize(PROMPT)
    err = _rel_err(m.logits(ids), _hf_logits(path, tuple(ids)))
    print(f"deepseek2 {kw}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE


@pytest.mark.parametrize("cache", ["all", "third"])
def test_greedy_tokens_match_transformers(ds2_model, cache):
    """One prompt chunk, then greedy decoding token for token against transformers' argmax, with every
    expert resident or streamed through a third of them."""
    path = ds2_model("f32")
    streamed = {} if cache == "all" else {"expert_cache": _third_of_experts(path), "prefill": 8}
    m = strata.Model(path, progress=False, **streamed)
    assert m.cache["all_resident"] == (cache == "all")
    prompt = m.tokenize("Once upon a time")
    out = m.generate(prompt, max_tokens=20, temperature=0.0, ignore_eos=True)
    seq = list(prompt) + out.tokens
    assert len(out.tokens) == 20
    with torch.no_grad():
        nxt = hf_model(path)(torch.tensor([seq])).logits[0, len(prompt) - 1 :].argmax(-1).tolist()
    for i, tok in enumerate(out.tokens):
        assert nxt[i] == tok, f"token {i} differs: strata {tok}, transformers {nxt[i]}"


def test_logits_do_not_depend_on_cache_chunking_or_batching(ds2_model):
    """The same tokens give bit-identical logits whatever the expert cache, the prompt chunk, and whether
    a decode step runs alone or batched with another sequence. (The default runs the MMQ layout, its
    expert inputs through q8_0, whether a cache holds every expert or streams them: one layout, one set
    of logits; moe_layout="fused" streams the fused float layout, compared within its layout.)"""
    path = ds2_model("q8_0", **MIX_SHAPES["q8_0"])
    ids = strata.Model(path, progress=False).tokenize(PROMPT)
    half = f"{strata.ModelInfo(path).spec['expert_bytes'] // 2}b"
    streamed = [{"expert_cache": half, "prefill": 6}, {"expert_cache": _third_of_experts(path), "prefill": 5},
                {"expert_cache": half, "prefill": 1}]
    for runs in ([{}, {"prefill": 8}, {"prefill": 5}, *streamed],
                 [{**kw, "moe_layout": "fused"} for kw in streamed]):
        ref = strata.Model(path, progress=False, **runs[0]).logits(ids)
        for kw in runs[1:]:
            got = strata.Model(path, progress=False, **kw).logits(ids)
            assert np.array_equal(got, ref), kw
    alone = strata.Model(path, progress=False).generate(ids[:9], max_tokens=6, temperature=0.0, ignore_eos=True)
    m = strata.Model(path, progress=False, seqs=2)
    both = m.generate_batch([ids[:9], ids[:12]], max_tokens=6, temperature=0.0, ignore_eos=True)
    assert both[0].tokens == alone.tokens


def test_spec_info_and_kv_cache_hold_the_latent(ds2_model):
    path = ds2_model("f32")
    s = strata.ModelInfo(path).spec
    got = {k: s[k] for k in ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "experts", "top_k",
                              "expert_ffn", "vocab", "ctx_train")}
    # The KV cache holds one row a position: the kv latent (32) and the rope key (8).
    assert got == {"arch": "deepseek2", "layers": 3, "hidden": 64, "heads": 4, "kv_heads": 1, "head_dim": 40,
                   "experts": 12, "top_k": 3, "expert_ffn": 32, "vocab": 512, "ctx_train": 8192}
    assert s["rope_base"] == pytest.approx(5000.0) and s["rms_eps"] == pytest.approx(3e-6)
    details = dict(s["details"])
    assert details["attention"] == ("latent (MLA): q LoRA 48, kv LoRA 32, key 24 + rope 8, value 20; "
                                    "KV cache rows of 40 (latent + rope key)")
    assert details["routing"] == ("sigmoid + selection bias, top 2 of 4 groups, normalized, scale 1.7; "
                                  "2 shared expert(s)")
    assert details["layers"] == "1 dense (FFN 96), 2 MoE"
    assert details["rope"] == "interleaved pairs; YaRN factor 6, original context 512, mscale_all_dim 0.7"
    # Two MoE layers of 12 experts (f32 gate, up, down of 32 x 64): the expert cache's layers are the MoE
    # layers only.
    assert s["expert_bytes"] == 2 * 12 * 3 * 32 * 64 * 4
    # Keys only (the values are the keys): 3 layers x 256 positions x 40 floats.
    assert strata.ModelInfo(path).load_plan(ctx=256, device="cpu")["kv_bytes"] == 3 * 256 * 40 * 4


def _edited(src: str, dst, edit) -> str:
    with open(src, "rb") as f:
        g = Gguf.parse(f.read())
    edit(g)
    with open(dst, "wb") as f:
        f.write(g.serialize())
    return str(dst)


@pytest.mark.parametrize("edit,error,message", [
    (lambda g: g.remove("deepseek2.attention.key_length_mla"), strata.UnsupportedError,
     r"no deepseek2.attention.key_length_mla: it was converted before llama.cpp split attn_kv_b.*Re-convert"),
    (lambda g: setattr(g.tensor("blk.1.attn_k_b.weight"), "name", b"blk.1.attn_kv_b.weight"),
     strata.UnsupportedError, r"'blk.1.attn_kv_b.weight' is the unsplit form of older converters"),
    (lambda g: g.set("deepseek2.expert_group_count", U32, 5), strata.FormatError,
     r"expert_group_count 5 must divide expert_count 12"),
    (lambda g: (g.set("deepseek2.expert_group_count", U32, 6), g.set("deepseek2.expert_group_used_count", U32, 1)),
     strata.FormatError, r"expert_group_used_count 1 groups of 2 experts cannot hold expert_used_count 3"),
    (lambda g: g.set("deepseek2.expert_gating_func", U32, 4), strata.UnsupportedError,
     r"expert_gating_func 4 is not supported"),
    (lambda g: g.set("deepseek2.rope.dimension_count", U32, 7), strata.FormatError,
     r"rope.dimension_count 7 must be even"),
    (lambda g: g.set("deepseek2.attention.key_length", U32, 64), strata.FormatError,
     r"do not describe the absorbed latent attention \(1 / 40 / 32"),
    (lambda g: g.set("deepseek2.leading_dense_block_count", U32, 3), strata.FormatError,
     r"'deepseek2.leading_dense_block_count' = 3 is out of range \[0, 2\]"),
    (lambda g: setattr(g.tensor("blk.2.attn_v_b.weight"), "ne", [32, 20, 2]), strata.FormatError,
     r"tensor 'blk.2.attn_v_b.weight' has shape \[32, 20, 2\], expected \[32, 20, 4\]"),
    (lambda g: g.set("deepseek2.rope.scaling.type", STRING, b"linear"), strata.UnsupportedError,
     r"rope.scaling.type 'linear' is not supported"),
])
def test_bad_metadata_and_tensors_give_clear_errors(ds2_model, tmp_path, edit, error, message):
    path = _edited(ds2_model("f32"), tmp_path / "bad.gguf", edit)
    with pytest.raises(error, match=message) as e:
        strata.ModelInfo(path)
    assert "bad.gguf" in str(e.value)
