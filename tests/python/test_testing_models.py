"""strata.testing: synthetic Qwen3-MoE GGUFs load in gguf and transformers, with a working tokenizer."""

import gguf
import numpy as np
import pytest

from strata.testing import PRESETS, make_preset, make_qwen3moe
from strata.testing import models as synth

MIX = {"experts": "Q4_K", "attn": "Q8_0", "embed": "Q8_0", "output": "Q8_0"}
MIX_DIMS = {"hidden": 256, "head_dim": 64, "expert_ffn": 256}  # K-quant rows need multiples of 256


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    make_qwen3moe(d / "f32.gguf", layers=3, vocab=640, rope_theta=5e5, rms_eps=1e-5)
    make_qwen3moe(d / "mix.gguf", **MIX_DIMS, quant=MIX)
    return d


def test_config_matches_arguments(files):
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(files, gguf_file="f32.gguf", moe_intermediate_size=32)
    assert c.model_type == "qwen3_moe"
    got = (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
           c.num_experts, c.num_experts_per_tok, c.vocab_size, c.max_position_embeddings)
    assert got == (3, 64, 4, 2, 16, 8, 2, 640, 4096)
    assert c.rope_parameters["rope_theta"] == 5e5
    assert c.rms_norm_eps == pytest.approx(1e-5)
    assert c.norm_topk_prob and not c.tie_word_embeddings


def test_quantized_model_runs_in_transformers(files):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(
        files, gguf_file="mix.gguf", moe_intermediate_size=256, norm_topk_prob=True, dtype=torch.float32
    )
    assert m.config.hidden_size == 256 and m.config.moe_intermediate_size == 256
    with torch.no_grad():
        logits = m(torch.arange(1, 17)[None]).logits[0]
    assert logits.shape == (16, 512)
    assert torch.isfinite(logits).all()
    assert 0.3 < logits.std().item() < 3  # activations stay O(1) through the layers


@pytest.mark.parametrize("text", [
    "Hello, world! It's 2024-05-17.",
    "def f(x):\n    return x * 42\n",
    "Grüße aus Köln, ¿dónde está? 你好，世界 こんにちは 🙂🚀 \t  spaces",
])
def test_tokenizer_round_trips(files, text):
    from transformers import AutoTokenizer

    tk = AutoTokenizer.from_pretrained(files, gguf_file="f32.gguf")
    ids = tk(text)["input_ids"]
    assert len(ids) < len(text.encode())  # the merges apply
    assert tk.decode(ids) == text


def test_tokenizer_specials_and_chat_template(files):
    from transformers import AutoTokenizer

    tk = AutoTokenizer.from_pretrained(files, gguf_file="f32.gguf")
    vocab = tk.get_vocab()
    assert len(vocab) == 640
    assert tk.eos_token == "<|im_end|>" and tk.bos_token == "<|endoftext|>"
    prompt = tk.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tk(prompt)["input_ids"]
    assert ids[0] == vocab["<|im_start|>"] and vocab["<|im_end|>"] in ids


@pytest.mark.parametrize("quant, match", [
    ({"mlp": "Q8_0"}, "unknown quant role 'mlp'"),
    ({"experts": "TQ1_0"}, "unsupported quant type 'TQ1_0' for role 'experts'"),
    ({"norm": "F16"}, "norm weights must be F32"),
    ({"experts": "Q4_K"}, "quant experts=Q4_K needs .* 64 to be a multiple of 256"),
    ({"attn": "Q8_0"}, None),
])
def test_quant_validation(tmp_path, quant, match):
    path = tmp_path / "m.gguf"
    if match is None:
        make_qwen3moe(path, quant=quant)
        assert {t.tensor_type.name for t in gguf.GGUFReader(path).tensors} == {"F32", "Q8_0"}
    else:
        with pytest.raises(ValueError, match=match):
            make_qwen3moe(path, quant=quant)
        assert not path.exists()


def test_preset_streams_valid_file(tmp_path, monkeypatch):
    monkeypatch.setattr(synth, "_CHUNK_ELEMS", 5000)  # many chunks per tensor, as for the 30B preset
    seen = []
    path = make_preset("small", tmp_path / "small.gguf", layers=2,
                       progress=lambda done, total: seen.append((done, total)))
    p = PRESETS["small"]
    D, F, E, V = p["hidden"], p["expert_ffn"], p["experts"], p["vocab"]
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    assert len(t) == 2 * 12 + 3
    assert t["blk.1.ffn_down_exps.weight"].shape.tolist() == [F, D, E]
    assert t["blk.1.ffn_gate_exps.weight"].tensor_type.name == "Q4_K"
    assert t["blk.0.attn_q.weight"].shape.tolist() == [D, p["heads"] * p["head_dim"]]
    assert t["blk.0.attn_q.weight"].tensor_type.name == "Q8_0"
    assert t["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert t["token_embd.weight"].shape.tolist() == [D, V]
    experts = gguf.quants.dequantize(t["blk.0.ffn_up_exps.weight"].data, t["blk.0.ffn_up_exps.weight"].tensor_type)
    assert np.isfinite(experts).all() and experts.std() == pytest.approx(D**-0.5, rel=0.15)
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == seen[-1][1] == sum(int(x.n_bytes) for x in r.tensors)
    assert len(seen) > len(r.tensors)  # progress per chunk, not per tensor


def test_one_writer_path_and_determinism(tmp_path, monkeypatch):
    a = make_preset("tiny", tmp_path / "a.gguf")
    monkeypatch.setattr(synth, "_CHUNK_ELEMS", 3000)
    b = make_qwen3moe(tmp_path / "b.gguf", **PRESETS["tiny"], quant=synth.PRESET_QUANT)
    c = make_preset("tiny", tmp_path / "c.gguf", seed=1)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_parallel_writer_writes_the_same_bytes(tmp_path):
    seen = []
    serial = make_preset("small", tmp_path / "serial.gguf", layers=3)
    parallel = make_preset("small", tmp_path / "parallel.gguf", layers=3, workers=3,
                           progress=lambda done, total: seen.append((done, total)))
    assert serial.read_bytes() == parallel.read_bytes()
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == seen[-1][1]


def test_norm_spread_and_chat_template(tmp_path):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
    make_qwen3moe(tmp_path / "a.gguf", norm_std=0.3, chat_template=template)
    make_qwen3moe(tmp_path / "b.gguf")
    a, b = gguf.GGUFReader(tmp_path / "a.gguf"), gguf.GGUFReader(tmp_path / "b.gguf")
    assert a.fields["tokenizer.chat_template"].contents() == template
    assert b.fields["tokenizer.chat_template"].contents().startswith("{%- for message in messages %}")
    norm = {t.name: np.asarray(t.data) for t in a.tensors}["blk.0.attn_norm.weight"]
    assert norm.std() == pytest.approx(0.3, rel=0.3) and norm.mean() == pytest.approx(1.0, abs=0.15)
    with pytest.raises(ValueError, match="norm_std"):
        make_qwen3moe(tmp_path / "c.gguf", norm_std=1.5)


def _tensors(path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


def _routing_maker(arch: str):
    if arch == "qwen3moe":
        return make_qwen3moe, dict(layers=2, hidden=64, experts=16, top_k=4, expert_ffn=32, seed=3)
    if arch == "deepseek4":
        from strata.testing.deepseek4 import make_deepseek4

        return make_deepseek4, dict(layers=4, hash_layers=1, experts=16, top_k=4, seed=3)
    from strata.testing.deepseek2 import make_deepseek2

    return make_deepseek2, dict(layers=3, dense_layers=1, experts=16, top_k=4, groups=4, groups_used=2, seed=3)


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2", "deepseek4"])
def test_routing_knobs_touch_only_their_tensors(tmp_path, arch):
    """route_skew scales each router row by its own factor (rows of one layer differ in norm, every
    other tensor is the uniform file's); route_locality scales only the token embeddings, by
    1 - route_locality; both off write the uniform file's bytes."""
    make, kw = _routing_maker(arch)
    base = _tensors(make(tmp_path / "u.gguf", **kw))
    off = _tensors(make(tmp_path / "o.gguf", **kw, route_skew=0.0, route_locality=0.0))
    assert all(np.array_equal(off[k], base[k]) for k in base)
    skew = _tensors(make(tmp_path / "s.gguf", **kw, route_skew=0.8))
    loc = _tensors(make(tmp_path / "l.gguf", **kw, route_locality=0.75))
    for name, a in base.items():
        if "ffn_gate_inp" in name:
            norms = np.linalg.norm(skew[name], axis=1)
            assert norms.max() / norms.min() > 2, name  # exp(0.8 z) over 16 rows: spread ~e^2
            assert not np.array_equal(skew[name], a)
        else:
            assert np.array_equal(skew[name], a), name
        if name == "token_embd.weight":
            np.testing.assert_allclose(loc[name], a * 0.25, rtol=1e-6)
        else:
            assert np.array_equal(loc[name], a), name


@pytest.mark.parametrize(("kw", "match"), [(dict(route_skew=-0.1), "route_skew"),
                                           (dict(route_skew=float("nan")), "route_skew"),
                                           (dict(route_locality=1.0), "route_locality"),
                                           (dict(route_locality=-0.5), "route_locality")])
@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2", "deepseek4"])
def test_routing_knobs_validated(tmp_path, kw, match, arch):
    with pytest.raises(ValueError, match=match):
        _routing_maker(arch)[0](tmp_path / "x.gguf", **kw)


def test_gpt_oss_preset_parallel_writer_same_bytes(tmp_path):
    """make_gpt_oss_preset: the preset's keys with any dimension overridden; workers > 1 writes the bytes one
    process writes."""
    from strata.testing import GPT_OSS_PRESETS, make_gpt_oss_preset

    kw = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_ffn=64, vocab=512,
              ctx=4096, sliding_window=8)
    one = make_gpt_oss_preset("gpt-oss-120b", tmp_path / "a.gguf", **kw)
    many = make_gpt_oss_preset("gpt-oss-120b", tmp_path / "b.gguf", workers=3, **kw)
    assert one.read_bytes() == many.read_bytes()
    r = gguf.GGUFReader(one)
    assert r.get_field("gpt-oss.rope.freq_base").contents() == GPT_OSS_PRESETS["gpt-oss-120b"]["rope_theta"]
    assert {t.tensor_type.name for t in r.tensors if "exps.weight" in t.name} == {"MXFP4"}
    with pytest.raises(ValueError, match="unknown preset"):
        make_gpt_oss_preset("gpt-oss-7b", tmp_path / "c.gguf")


def test_qwen35moe_preset_parallel_writer_same_bytes(tmp_path):
    """make_qwen35moe_preset: workers > 1 writes the bytes one process writes (the bench's Qwen3.6 file)."""
    from strata.testing import make_qwen35moe_preset

    kw = dict(layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, rope_dims=16, k_heads=2, v_heads=4,
              k_head_dim=32, v_head_dim=32, experts=8, top_k=2, expert_ffn=256, shared_ffn=256, vocab=512, ctx=4096)
    one = make_qwen35moe_preset("qwen3.6-35b-a3b", tmp_path / "a.gguf", **kw)
    many = make_qwen35moe_preset("qwen3.6-35b-a3b", tmp_path / "b.gguf", workers=3, **kw)
    assert one.read_bytes() == many.read_bytes()
    r = gguf.GGUFReader(one)
    assert {t.tensor_type.name for t in r.tensors if "ffn_down_exps" in t.name} == {"Q6_K"}
