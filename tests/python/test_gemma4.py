"""gemma4 on the CPU against transformers' Gemma4ForCausalLM built from the same dequantized weights
(strata.testing.gemma4.hf_model): logits, greedy tokens, every hyperparameter read from metadata, the
logits' independence of the expert cache and the prompt chunking, batched decode rows, the errors of bad
files, and the gemma4 tokenizer against transformers' GemmaTokenizer.

Bounds are test_vs_transformers.py's: 3e-6 of max |logit| on the exact path (float32 weights both sides,
the same float32 operations up to summation order: each logit is a sum of D products whose rounding
differs by ~D * 2^-24 relative in the worst case, ~sqrt(D) * 2^-24 typically, through L layers of norms
that rescale rather than grow it). Measured max |a - b| / max |b|: f32 1.6e-6, q8_0 1.2e-6, q4_0
experts 0.9e-6, the hyperparameter variants 1.0e-6 to 1.9e-6.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

import strata
from strata.testing import make_gemma4
from strata.testing.gguf_edit import ARRAY, F32, U32, Gguf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from strata.testing.gemma4 import hf_model  # noqa: E402

torch.set_num_threads(1)

TOLERANCE = 3e-6
SEED = 7
MIXES = {
    "f32": None,
    "q8_0": {"embed": "Q8_0", "attn": "Q8_0", "router": "Q8_0", "experts": "Q8_0"},
    "q4_0": {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q4_0"},
}
PROMPT = "The quick brown fox jumps over the lazy dog. 1234567890 <|turn>user\nhello<turn|>"


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gemma4")


@pytest.fixture(scope="module")
def gemma_model(gemma_dir):
    made: dict[str, str] = {}

    def make(mix: str, **kw) -> str:
        name = mix + "".join(f"-{k}={v}" for k, v in sorted(kw.items()))
        if name not in made:
            made[name] = str(make_gemma4(gemma_dir / f"{name}.gguf", quant=MIXES[mix], seed=SEED, **kw))
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
def test_logits_match_transformers(gemma_model, mix):
    path = gemma_model(mix)
    # Streamed through a cache a third the size of the experts, in chunks of 8, under moe_layout="fused": the
    # fused layout.
    m = strata.Model(path, expert_cache=_third_of_experts(path), prefill=8, progress=False, moe_layout="fused")
    assert not m.cache["all_resident"]
    assert m.layout(8)["kind"] == "fused"
    ids = m.tokenize(PROMPT)
    assert ids[0] == 2 and len(ids) > 4 * 5  # BOS, and past the sliding window several times over
    ours = m.logits(ids)
    ref = _hf_logits(path, tuple(ids))
    err = _rel_err(ours, ref)
    print(f"gemma4 {mix}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE


@pytest.mark.parametrize("cache", ["all", "third"])
def test_greedy_tokens_match_transformers(gemma_model, cache):
    """Every expert resident (the MMQ layout, float experts never quantized) or streamed through a third
    of them (the fused layout, moe_layout="fused"): one prompt chunk, then greedy decoding (the gathered
    decode MoE) token for token against transformers' argmax."""
    path = gemma_model("f32")
    streamed = {} if cache == "all" else {"expert_cache": _third_of_experts(path), "prefill": 8, "moe_layout": "fused"}
    m = strata.Model(path, progress=False, **streamed)
    assert m.cache["all_resident"] == (cache == "all")
    ids = m.tokenize(PROMPT)
    err = _rel_err(m.logits(ids), _hf_logits(path, tuple(ids)))
    print(f"gemma4 f32, cache {cache}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE
    prompt = m.tokenize("Once upon a time")
    out = m.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True)
    seq = list(prompt) + out.tokens
    assert len(out.tokens) == 24
    with torch.no_grad():
        nxt = hf_model(path)(torch.tensor([seq])).logits[0, len(prompt) - 1 :].argmax(-1).tolist()
    for i, tok in enumerate(out.tokens):
        assert nxt[i] == tok, f"token {i} differs: strata {tok}, transformers {nxt[i]}"


def test_spec_and_info_hold_the_files_hyperparameters(gemma_model):
    s = strata.ModelInfo(gemma_model("f32")).spec
    got = {k: s[k] for k in ("arch", "layers", "hidden", "heads", "head_dim", "experts", "top_k", "expert_ffn",
                              "vocab", "ctx_train")}
    assert got == {"arch": "gemma4", "layers": 4, "hidden": 64, "heads": 4, "head_dim": 32, "experts": 8,
                   "top_k": 3, "expert_ffn": 32, "vocab": 700, "ctx_train": 8192}
    assert s["rope_base"] == pytest.approx(2e5) and s["rms_eps"] == pytest.approx(3e-5)
    details = dict(s["details"])
    assert details["attention"] == ("2 sliding layers (window 5, head 16 x 2 KV, RoPE base 30000), 2 global "
                                    "(head 32 x 1 KV, proportional RoPE base 200000)")
    assert details["dense FFN"] == "width 64 beside the routed experts in every layer"
    assert details["logit softcap"] == "12"


# One hyperparameter changed, same tensors where the shapes allow (they depend only on the seed and their
# names); the head sizes and KV heads change the attention tensors' shapes too, softcap 0 writes an explicit 0,
# partial_rotary rewrites rope_freqs, k_eq_v False adds the global layers' attn_v.
VARIANTS = {"rope_theta": 4e4, "rope_theta_swa": 5e5, "rms_eps": 3e-4, "top_k": 2, "kv_heads": 4,
            "global_kv_heads": 2, "head_dim": 8, "global_head_dim": 64, "sliding_window": 11,
            "sliding_pattern": "FSS", "partial_rotary": 0.5, "softcap": 0.0, "k_eq_v": False}


def test_absent_softcap_reads_as_llama_cpp_does(gemma_model):
    """No final_logit_softcapping key: 30, llama.cpp's default for such a file (the converter always writes
    the key); an explicit 0 is none."""
    absent, thirty = gemma_model("f32", softcap=None), gemma_model("f32", softcap=30.0)
    ids = strata.Model(absent, progress=False).tokenize(PROMPT)
    assert dict(strata.ModelInfo(absent).spec["details"])["logit softcap"] == "30"
    a = strata.Model(absent, expert_cache=64, prefill=16, progress=False)
    np.testing.assert_array_equal(a.logits(ids),
                                  strata.Model(thirty, expert_cache=64, prefill=16, progress=False).logits(ids))


@pytest.mark.parametrize("key", list(VARIANTS))
def test_each_hyperparameter_from_metadata_moves_the_logits(gemma_model, key):
    """A file that changes one hyperparameter changes strata's logits, and transformers agrees on the new
    ones: the key is read, and read as transformers reads it."""
    # transformers gives the global layers their own KV head count only with attention_k_eq_v: the k_eq_v
    # variant and its base keep the sliding layers' count.
    base_kw = {"global_kv_heads": 2} if key == "k_eq_v" else {}
    base_path, path = gemma_model("f32", **base_kw), gemma_model("f32", **base_kw, **{key: VARIANTS[key]})
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
@pytest.mark.parametrize("mix", ["q8_0", "q4_0"])
def test_logits_do_not_depend_on_cache_or_chunk_size(gemma_model, mix, moe_layout):
    """Streamed, in either MoE layout: byte-identical logits across cache sizes from thrashing to all, chunk
    sizes that cut the prompt unevenly, both sources and both GR modes; the one-token decode scratch equals
    the first row of a prompt; with every expert resident (MMQ) identical across chunk sizes, and (the
    default, MMQ streamed too) identical to the streamed logits."""
    path = gemma_model(mix)
    rng = np.random.default_rng(99)
    prompt = [int(x) for x in rng.integers(1, 690, size=37)]
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
    # The MMQ layout quantizes the experts' input rows to q8_0: each element moves by at most half a step,
    # 1/254 of its block's largest, ~0.2% RMS; through 4 layers of norms that is ~1% of a logit (measured
    # median 0.85% on q8_0, 0.66% on q4_0). Where that noise flips a near-tie of a later layer's router, the top-K
    # set changes and that position moves by the flipped expert's share: unbounded, but rare (measured 3
    # of 37 positions past 3% on q8_0, none on q4_0).
    per_pos = np.abs(mmq[0] - ref).max(axis=1) / np.abs(ref).max()
    print(f"{mix}: MMQ (q8_0 activations) vs fused logits, median {np.median(per_pos):.2e}, max {per_pos.max():.2e}")
    assert np.median(per_pos) <= 2e-2
    assert (per_pos > 3e-2).mean() <= 0.15


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_batched_decode_rows_equal_alone(gemma_model):
    """Three sequences in their own KV regions decode in one pass (RowsForwardPass: each row's RoPE, KV
    store and windowed attention at its own position): every row's logits are those of its sequence alone."""
    m = strata.Model(gemma_model("f32"), device="cpu", progress=False, ctx=128, seqs=3)
    assert m.batch_supported
    prompts = [[2, 5, 9, 200, 3, 7, 11, 13, 300, 8], [2, 4], [2, 300, 12, 44, 9, 81]]  # past the window
    alone = []
    for p in prompts:
        m.logits(p, seq=0)
        alone.append(m.decode_batch([17], [len(p)], [0])[0])
    for i, p in enumerate(prompts):
        m.logits(p, seq=i)
    rows = m.decode_batch([17, 17, 17], [len(p) for p in prompts], [0, 1, 2])
    for i in range(3):
        assert np.array_equal(_bits(rows[i]), _bits(alone[i])), i


@pytest.mark.parametrize("kw", [{}, {"global_head_dim": 64, "kv_heads": 1, "ffn": 96}])
def test_model_layout_matches_shape_plan(gemma_model, kw):
    """A gemma4 file's chunk plan is the shape plan of its scratch list (attention buffers as wide as the
    widest layer kind, the dense FFN's): bytes_needed equals what carve assigns, every buffer where the
    plan puts it, for several T, both layouts (a source under moe_layout 'fused': fused; else MMQ) and GR
    modes."""
    from test_prefill_layout import check_plan, prefill_layout

    path = gemma_model("q4_0", **kw)
    s = strata.ModelInfo(path).spec
    md = strata.inspect(path)["metadata"]
    kv = md["gemma4.attention.head_count_kv"]
    pattern = md["gemma4.attention.sliding_window_pattern"]
    hd = {True: md["gemma4.attention.key_length_swa"], False: md["gemma4.attention.key_length"]}
    hd_max, kv_width = max(hd.values()), max(k * hd[p] for k, p in zip(kv, pattern, strict=False))
    by_name = {t["name"]: t["type"] for t in strata.inspect(path)["tensors"]}
    types = [by_name[f"blk.{i}.ffn_{w}_exps.weight"] for i in range(s["layers"]) for w in ("gate", "up", "down")]
    D, H, Fd = s["hidden"], s["heads"], md["gemma4.feed_forward_length"]
    scratch = [("attn.q", "f32", [H, hd_max]), ("attn.k", "f32", [kv_width]), ("attn.v", "f32", [kv_width]),
               ("attn.out", "f32", [H * hd_max]), ("ffn.x", "f32", [D]), ("ffn.gate", "f32", [Fd]),
               ("ffn.up", "f32", [Fd]), ("ffn.out", "f32", [D]), ("ffn.grs", "f32", [1])]
    for unfused, moe_layout in itertools.product((False, True), ("auto", "fused")):
        shape = dict(D=D, HC=1, E=s["experts"], K=s["top_k"], F=s["expert_ffn"], expert_types=types, unfused=unfused,
                     scratch=scratch, streamed_fused=moe_layout == "fused")
        info = strata.ModelInfo(path, gr_unfused=unfused, moe_layout=moe_layout)
        for T in (1, 2, 17, 64, 257):
            for src in (True, False):
                got, want = info.layout(T, src), prefill_layout(shape, T, src)
                check_plan(shape, T, src, got)
                assert got["buffers"] == want["buffers"] and got["bytes_needed"] == want["bytes_needed"]


def _edited(src: str, dst, edit) -> str:
    with open(src, "rb") as f:
        g = Gguf.parse(f.read())
    edit(g)
    with open(dst, "wb") as f:
        f.write(g.serialize())
    return str(dst)


@pytest.mark.parametrize("edit,message", [
    (lambda g: g.set("gemma4.attention.sliding_window", U32, 0),
     r"'gemma4.attention.sliding_window' = 0 is out of range"),
    (lambda g: g.set("gemma4.attention.key_length_swa", U32, 15),
     r"attention.key_length_swa = 15 must be even"),
    (lambda g: g.set("gemma4.rope.dimension_count", U32, 16),
     r"rope.dimension_count 16 != attention.key_length 32 is not supported"),
    (lambda g: g.set("gemma4.attention.head_count", U32, 3),
     r"attention.head_count 3 is not a multiple of head_count_kv\[0\] = 2"),
    (lambda g: g.set("gemma4.embedding_length_per_layer_input", U32, 256),
     r"per-layer input embeddings of the small gemma4 models are not supported"),
    (lambda g: g.set("gemma4.attention.shared_kv_layers", U32, 2), r"shared_kv_layers is set"),
    (lambda g: g.set("gemma4.final_logit_softcapping", F32, -1.0),
     r"'gemma4.final_logit_softcapping' = -1 is out of range"),
    (lambda g: g.set("gemma4.attention.sliding_window_pattern", U32, 1),
     r"'gemma4.attention.sliding_window_pattern' must be an array of booleans"),
    (lambda g: g.set("gemma4.attention.head_count", ARRAY, [4, 4, 2, 4], U32),
     r"'gemma4.attention.head_count' differs between layers \(4 in layer 0, 2 in layer 2\)"),
    (lambda g: g.set("gemma4.attention.head_count_kv", ARRAY, [2, 1, 2], U32),
     r"'gemma4.attention.head_count_kv' has 3 entries, fewer than the 4 blocks"),
    (lambda g: g.set("gemma4.attention.head_count_kv", F32, 2.0),
     r"'gemma4.attention.head_count_kv'"),
    (lambda g: setattr(g.tensor("rope_freqs.weight"), "name", b"rope_freq.weight"),
     r"gemma4 tensor 'rope_freqs.weight' is missing"),
    (lambda g: setattr(g.tensor("blk.1.pre_ffw_norm_2.weight"), "name", b"blk.1.pre_ffw_norm2.weight"),
     r"gemma4 tensor 'blk.1.pre_ffw_norm_2.weight' is missing"),
    (lambda g: setattr(g.tensor("blk.3.attn_k.weight"), "ne", [32, 64]),
     r"tensor 'blk.3.attn_k.weight' has shape \[32, 64\], expected \[64, 32\]"),
    (lambda g: setattr(g.tensor("blk.0.ffn_gate_exps.weight"), "name", b"blk.0.ffn_gate_up_exps.weight"),
     r"ffn_gate_up_exps.weight' \(gate and up experts fused\) is not supported"),
])
def test_bad_metadata_and_tensors_give_clear_errors(gemma_model, tmp_path, edit, message):
    path = _edited(gemma_model("f32"), tmp_path / "bad.gguf", edit)
    with pytest.raises((strata.FormatError, strata.UnsupportedError), match=message) as e:
        strata.ModelInfo(path)
    assert "bad.gguf" in str(e.value)


def test_per_layer_arrays_of_one_value_read_as_the_scalar(gemma_model, tmp_path):
    """llama.cpp reads head counts and FFN widths as one number or one a layer: the arrays load, and give
    the same logits bit for bit."""
    src = gemma_model("f32")

    def arrays(g):
        g.set("gemma4.attention.head_count", ARRAY, [4] * 4, U32)
        g.set("gemma4.expert_feed_forward_length", ARRAY, [32] * 4, U32)
        g.set("gemma4.feed_forward_length", ARRAY, [64] * 4, U32)

    path = _edited(src, tmp_path / "arrays.gguf", arrays)
    ids = [2, 5, 9, 200, 3, 7, 11, 13, 300, 8]
    a = strata.Model(path, expert_cache="all", progress=False).logits(ids)
    b = strata.Model(src, expert_cache="all", progress=False).logits(ids)
    assert np.array_equal(a, b)


# ---- the tokenizer ----

TEXTS = [
    PROMPT,
    "Hello world, the quick brown fox\n\n  x 🙂 — ½ ∞ 中文 ünïcödé",
    "   leading spaces and trailing   ",
    "def softmax(x):\n\treturn [v / s for v in e]\r\n",
    "never seen: ꙮ 𝔘 \x00 \x7f ¿ <|turn>model\n<turn|>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_transformers_gemma_tokenizer(gemma_model, text):
    """The file's gemma4 vocabulary (SentencePiece-style BPE: '▁' for spaces, <0xXX> byte fallback) encodes
    as transformers' GemmaTokenizer over the same vocabulary and merges, BOS first (llama.cpp adds it for
    gemma4), and decodes back to the text."""
    from strata.testing.tokenizer import gemma_reference, spm_vocab

    m = strata.Model(gemma_model("f32"), expert_cache="all", progress=False)
    ref = gemma_reference(spm_vocab(700))
    ids = m.tokenize(text)
    assert ids == [2, *ref.encode(text, add_special_tokens=False)]
    assert m.tokenizer.decode(ids[1:]) == text
    assert ref.decode(ids[1:]) == text


def test_tokenizer_byte_fallback_and_specials(gemma_model):
    m = strata.Model(gemma_model("f32"), expert_cache="all", progress=False)
    tok = m.tokenizer
    ids = tok.encode("ꙮ", add_special=False)  # not in the vocabulary: its three UTF-8 bytes
    assert [tok.id_to_piece(i) for i in ids] == ["<0xEA>", "<0x99>", "<0xAE>"]
    assert tok.decode(ids) == "ꙮ"
    assert tok.encode("<turn|>", add_special=False) == [6]
    assert {1, 6} <= tok.stop_ids  # <eos> and <turn|> end a turn
    assert tok.decode(tok.encode("a <bos>b", add_special=False), skip_special=True) == "a b"


def _spm_metadata(**over):
    from strata.testing.tokenizer import spm_vocab

    voc = spm_vocab(700)
    md = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.pre": "gemma4", "tokenizer.ggml.tokens": list(voc.tokens),
          "tokenizer.ggml.token_type": list(voc.token_types), "tokenizer.ggml.merges": list(voc.merges),
          "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.unknown_token_id": 3,
          "tokenizer.ggml.add_bos_token": False}
    md.update(over)
    return md


def test_chat_renders_the_files_template_and_matches_transformers(gemma_model):
    """chat() renders the file's template (BOS from the template, not added again), and its greedy reply is
    transformers' argmax continuation of those ids."""
    path = gemma_model("f32")
    m = strata.Model(path, expert_cache="all", progress=False)
    msgs = [{"role": "user", "content": "Hello, who are you?"}]
    out = m.chat(msgs, max_tokens=6, temperature=0.0, ignore_eos=True)
    prompt = m.tokenize("<bos><|turn>user\nHello, who are you?<turn|>\n<|turn>model\n", add_special=False)
    assert prompt[:2] == [2, 5] and prompt.count(2) == 1
    assert out.stats["prompt_tokens"] == len(prompt)
    seq = prompt + out.tokens
    with torch.no_grad():
        nxt = hf_model(path)(torch.tensor([seq])).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
    assert nxt == out.tokens


def test_tokenizer_metadata_is_checked():
    """A gemma4 vocabulary from a file is checked like any other: a malformed byte token, merges of tokens
    the vocabulary lacks or an unknown-token id outside it are FormatErrors naming the key; add_bos false
    is overridden as llama.cpp does for gemma4."""
    from strata.tokenizer import Tokenizer

    assert Tokenizer.from_metadata(_spm_metadata()).add_bos
    toks = list(_spm_metadata()["tokenizer.ggml.tokens"])
    toks[7 + 0x41] = "<0xZ1>"
    with pytest.raises(strata.FormatError, match=r"tokens\[72\] = '<0xZ1>' is a byte token but not <0xXX>"):
        Tokenizer.from_metadata(_spm_metadata(**{"tokenizer.ggml.tokens": toks}))
    with pytest.raises(strata.FormatError, match="do not form a BPE tokenizer"):
        Tokenizer.from_metadata(_spm_metadata(**{"tokenizer.ggml.merges": ["qq zz"]}))
    with pytest.raises(strata.FormatError, match=r"unknown_token_id = 700 is outside the vocabulary"):
        Tokenizer.from_metadata(_spm_metadata(**{"tokenizer.ggml.unknown_token_id": 700}))
