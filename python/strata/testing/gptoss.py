"""Synthetic gpt-oss GGUF files (random weights, llama.cpp's tensor and key names) and their transformers
reference (`hf_model`: GptOssForCausalLM built from the file's dequantized tensors)."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from strata.testing import tokenizer as tok
from strata.testing.models import _FILE_TYPES, _resolve_quant, _Tensor, _write_tensors
from strata.testing.quant import block_size, random_blocks

ARCH = "gpt-oss"

GPT_OSS_PRESETS: dict[str, dict[str, Any]] = {
    # openai/gpt-oss-20b and -120b's config.json: 24 / 36 layers, 32 / 128 experts, the rest alike
    "gpt-oss-20b": {"layers": 24, "hidden": 2880, "heads": 64, "kv_heads": 8, "head_dim": 64, "experts": 32,
                    "top_k": 4, "expert_ffn": 2880, "vocab": 201088, "ctx": 131072, "sliding_window": 128,
                    "rope_theta": 150000.0, "yarn_factor": 32.0, "yarn_orig_ctx": 4096, "yarn_beta_fast": 32.0,
                    "yarn_beta_slow": 1.0, "rms_eps": 1e-5},
}
GPT_OSS_PRESETS["gpt-oss-120b"] = {**GPT_OSS_PRESETS["gpt-oss-20b"], "layers": 36, "experts": 128}
"""Model shapes for `make_gpt_oss_preset` (dims multiples of 32: MXFP4 and Q8_0 rows)."""

GPT_OSS_QUANT = {"embed": "Q8_0", "attn": "Q8_0", "router": "F32", "experts": "MXFP4", "output": "Q8_0"}
"""`make_gpt_oss_preset`'s mix: the MXFP4 experts the released weights carry, Q8_0 dense weights."""


def make_gpt_oss(
    path: str | os.PathLike[str],
    *,
    layers: int = 3,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 24,
    experts: int = 8,
    top_k: int = 3,
    expert_ffn: int = 32,
    vocab: int = 512,
    ctx: int = 8192,
    sliding_window: int = 6,
    rope_theta: float = 1e4,
    yarn_factor: float = 4.0,
    yarn_orig_ctx: int = 2048,
    yarn_beta_fast: float = 16.0,
    yarn_beta_slow: float = 2.0,
    rms_eps: float = 3e-5,
    norm_std: float = 0.05,
    bias_std: float = 0.3,
    sink_std: float = 1.0,
    expert_gain: float = 3.0,
    quant: dict[str, str] | None = None,
    seed: int = 0,
    workers: int = 1,
) -> Path:
    """Write a `gpt-oss` GGUF with llama.cpp's names and random weights; every hyperparameter differs from
    strata's fallbacks (head_dim is not hidden / heads; the window is small enough that prompts of a
    few dozen tokens slide it; YaRN with its own factor, context and betas). `yarn_factor` 0 writes no
    rope scaling. The experts' gate/up weights are `expert_gain` times the usual 1/sqrt(D) scale, so the
    SwiGLU's clamp at 7 is reached. Biases and sinks are N(0, bias_std / sink_std) in F32. `quant` maps
    roles (strata.testing.models.ROLES) to types; unnamed roles are F32. `workers` > 1 writes the tensors
    from that many processes (the same bytes). Returns the path."""
    dims = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "experts": experts, "top_k": top_k, "expert_ffn": expert_ffn, "vocab": vocab, "ctx": ctx,
            "sliding_window": sliding_window}
    if any(v <= 0 for v in dims.values()):
        raise ValueError(f"model dimensions must be positive: {dims}")
    if heads % kv_heads or head_dim % 2 or top_k > experts:
        raise ValueError(f"need heads % kv_heads == 0, an even head_dim and top_k <= experts: {dims}")
    types = _resolve_quant(quant)
    voc = tok.vocab(vocab)
    tensors = _plan(types, layers, hidden, heads, kv_heads, head_dim, experts, expert_ffn, vocab, norm_std, bias_std,
                    sink_std, expert_gain)

    w = gguf.GGUFWriter(path, ARCH)
    w.add_name(f"strata synthetic gpt-oss L{layers} D{hidden} E{experts}")
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(expert_ffn)
    w.add_expert_feed_forward_length(expert_ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_sliding_window(sliding_window)
    w.add_rope_freq_base(rope_theta)
    if yarn_factor:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn_factor)
        w.add_rope_scaling_orig_ctx_len(yarn_orig_ctx)
        w.add_float32(f"{ARCH}.rope.scaling.yarn_beta_fast", yarn_beta_fast)
        w.add_float32(f"{ARCH}.rope.scaling.yarn_beta_slow", yarn_beta_slow)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    w.add_file_type(_FILE_TYPES[types["experts"]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok.add_to_gguf(w, voc, "gpt-4o")  # o200k's split over the small test vocabulary
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=gguf.GGMLQuantizationType[t.qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return _write_tensors(w, path, tensors, seed, workers, gen=_chunks)


def _plan(types: dict[str, str], L: int, D: int, H: int, KV: int, hd: int, E: int, F: int, V: int, norm: float,
          bias: float, sink: float, gain: float) -> list[_Tensor]:
    def t(name: str, shape: tuple[int, ...], role: str, std: float) -> _Tensor:
        qtype = "F32" if role in ("norm", "bias") else types[role]
        if shape[-1] % block_size(qtype):
            raise ValueError(f"quant {role}={qtype} needs {name}'s row length {shape[-1]} to be a multiple of "
                             f"{block_size(qtype)}")
        return _Tensor(name, shape, role, qtype, std)

    out = [t("token_embd.weight", (V, D), "embed", 1.0)]
    for i in range(L):
        b = f"blk.{i}."
        out += [
            t(b + "attn_norm.weight", (D,), "norm", norm),
            t(b + "attn_q.weight", (H * hd, D), "attn", D**-0.5),
            t(b + "attn_q.bias", (H * hd,), "bias", bias),
            t(b + "attn_k.weight", (KV * hd, D), "attn", D**-0.5),
            t(b + "attn_k.bias", (KV * hd,), "bias", bias),
            t(b + "attn_v.weight", (KV * hd, D), "attn", D**-0.5),
            t(b + "attn_v.bias", (KV * hd,), "bias", bias),
            t(b + "attn_output.weight", (D, H * hd), "attn", (H * hd) ** -0.5),
            t(b + "attn_output.bias", (D,), "bias", bias),
            t(b + "attn_sinks.weight", (H,), "bias", sink),
            t(b + "post_attention_norm.weight", (D,), "norm", norm),
            t(b + "ffn_gate_inp.weight", (E, D), "router", D**-0.5),
            t(b + "ffn_gate_inp.bias", (E,), "bias", bias),
            t(b + "ffn_gate_exps.weight", (E, F, D), "experts", gain * D**-0.5),
            t(b + "ffn_gate_exps.bias", (E, F), "bias", bias),
            t(b + "ffn_up_exps.weight", (E, F, D), "experts", gain * D**-0.5),
            t(b + "ffn_up_exps.bias", (E, F), "bias", bias),
            t(b + "ffn_down_exps.weight", (E, D, F), "expert_down", F**-0.5),
            t(b + "ffn_down_exps.bias", (E, D), "bias", bias),
        ]
    out += [t("output_norm.weight", (D,), "norm", norm), t("output.weight", (V, D), "output", D**-0.5)]
    return out


def make_gpt_oss_preset(
    name: str,
    path: str | os.PathLike[str],
    quant: dict[str, str] | None = None,
    seed: int = 0,
    workers: int = 1,
    **overrides: Any,
) -> Path:
    """`make_gpt_oss` with the shapes of GPT_OSS_PRESETS[name] (any overridden, e.g. layers=2) and the
    GPT_OSS_QUANT mix unless `quant` is given. gpt-oss-120b is ~65 GB; `workers` processes write it."""
    if name not in GPT_OSS_PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(GPT_OSS_PRESETS)}")
    dims = {**GPT_OSS_PRESETS[name], **overrides}
    return make_gpt_oss(path, **dims, quant=GPT_OSS_QUANT if quant is None else quant, seed=seed, workers=workers)


def _chunks(t: _Tensor, seed: int) -> Iterator[np.ndarray]:
    """The tensor's bytes as the parallel writer takes them (one chunk)."""
    yield np.ascontiguousarray(_generate(t, seed)).view(np.uint8)


def _generate(t: _Tensor, seed: int) -> np.ndarray:
    """The tensor's bytes from an rng seeded by (seed, name): norms 1 + N(0, std), biases N(0, std)."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    n = int(np.prod(t.shape))
    if t.role == "norm":
        return 1.0 + t.std * rng.standard_normal(n, dtype=np.float32)
    if t.role == "bias":
        return t.std * rng.standard_normal(n, dtype=np.float32)
    rows = n // t.shape[-1]
    return random_blocks(t.qtype, (rows, t.shape[-1]), t.std, rng).reshape(-1)


def hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's hyperparameters as GptOssConfig's keyword arguments (transformers' gpt_oss reads no
    GGUF): the shapes from the tensors, the rest from the metadata, the reader's fallbacks where absent."""
    r = gguf.GGUFReader(path)

    def get(key: str, default: Any = None) -> Any:
        f = r.get_field(f"{ARCH}.{key}")
        return default if f is None else f.contents()

    tensors = {t.name: t for t in r.tensors}
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", 150000.0))}
    if get("rope.scaling.type") == "yarn":
        rope.update(rope_type="yarn", factor=float(get("rope.scaling.factor", 32.0)),
                    original_max_position_embeddings=int(get("rope.scaling.original_context_length", 4096)),
                    beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
                    beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)), truncate=False)
    H = int(get("attention.head_count"))
    D = int(get("embedding_length"))
    return {
        "vocab_size": int(tensors["token_embd.weight"].shape[1]), "hidden_size": D,
        "intermediate_size": int(get("expert_feed_forward_length")), "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": H, "num_key_value_heads": int(get("attention.head_count_kv", H)),
        "head_dim": int(get("attention.key_length", D // H)), "num_local_experts": int(get("expert_count")),
        "num_experts_per_tok": int(get("expert_used_count")),
        "sliding_window": int(get("attention.sliding_window", 128)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": int(get("context_length", 131072)), "rope_parameters": rope,
        "tie_word_embeddings": False, "attention_bias": True,
    }


def hf_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The file's tensors dequantized (gguf.quants) under GptOssForCausalLM's names: gate and up
    interleaved into gate_up_proj (gate at even columns), the experts' matrices transposed."""
    from gguf.quants import dequantize

    r = gguf.GGUFReader(path)
    t = {x.name: np.asarray(dequantize(x.data, x.tensor_type), dtype=np.float32) for x in r.tensors}
    L = sum(1 for n in t if n.endswith(".attn_norm.weight"))
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
          "lm_head.weight": t["output.weight"]}
    for i in range(L):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        for ours, theirs in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"),
                             ("attn_output", "o_proj")):
            sd[p + f"self_attn.{theirs}.weight"] = t[b + ours + ".weight"]
            sd[p + f"self_attn.{theirs}.bias"] = t[b + ours + ".bias"]
        sd[p + "self_attn.sinks"] = t[b + "attn_sinks.weight"]
        sd[p + "input_layernorm.weight"] = t[b + "attn_norm.weight"]
        sd[p + "post_attention_layernorm.weight"] = t[b + "post_attention_norm.weight"]
        sd[p + "mlp.router.weight"] = t[b + "ffn_gate_inp.weight"]
        sd[p + "mlp.router.bias"] = t[b + "ffn_gate_inp.bias"]
        gate, up = t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]  # [E, F, D]
        E, F, D = gate.shape
        gu = np.empty((E, D, 2 * F), dtype=np.float32)
        gu[..., 0::2], gu[..., 1::2] = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
        gub = np.empty((E, 2 * F), dtype=np.float32)
        gub[:, 0::2], gub[:, 1::2] = t[b + "ffn_gate_exps.bias"], t[b + "ffn_up_exps.bias"]
        sd[p + "mlp.experts.gate_up_proj"] = gu
        sd[p + "mlp.experts.gate_up_proj_bias"] = gub
        sd[p + "mlp.experts.down_proj"] = t[b + "ffn_down_exps.weight"].transpose(0, 2, 1)  # [E, F, D]
        sd[p + "mlp.experts.down_proj_bias"] = t[b + "ffn_down_exps.bias"]
    return sd


def hf_model(path: str | os.PathLike[str], dtype: Any = None) -> Any:
    """transformers' GptOssForCausalLM of the file (eager attention and experts), in float32 or `dtype`."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(**hf_config(path))
    cfg._attn_implementation = "eager"
    dtype = dtype or torch.float32
    m = GptOssForCausalLM(cfg).to(dtype).eval()
    sd = {k: torch.from_numpy(np.array(v)).to(dtype) for k, v in hf_state_dict(path).items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"gpt-oss state dict mismatch: missing {missing}, unexpected {unexpected}")
    return m
