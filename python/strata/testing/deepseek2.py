"""Synthetic deepseek2 GGUF files (DeepSeek V2/V3/R1, Kimi-K2: random weights, llama.cpp's tensor and key
names, the split attn_k_b / attn_v_b of its current converter) and their transformers reference (`hf_model`:
DeepseekV3ForCausalLM built from the file's dequantized tensors)."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from strata.testing import tokenizer as tok
from strata.testing.models import _FILE_TYPES, _resolve_quant, _Tensor, _write_tensors, skewed_rows
from strata.testing.quant import block_size, random_blocks

ARCH = "deepseek2"

DEEPSEEK2_PRESETS: dict[str, dict[str, Any]] = {
    # deepseek-ai/DeepSeek-V3's config.json (V3, R1 and V3.1 share it); `layers` overrides keep the per-layer
    # figures of the 61-layer model
    "deepseek-v3": {"layers": 61, "hidden": 7168, "heads": 128, "q_lora": 1536, "kv_lora": 512, "key_nope": 128,
                    "key_rope": 64, "value_dim": 128, "experts": 256, "top_k": 8, "expert_ffn": 2048,
                    "shared_experts": 1, "dense_layers": 3, "dense_ffn": 18432, "groups": 8, "groups_used": 4,
                    "routed_scale": 2.5, "vocab": 129280, "ctx": 163840, "rope_theta": 10000.0,
                    "yarn_factor": 40.0, "yarn_orig_ctx": 4096, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0,
                    "mscale_all_dim": 1.0, "rms_eps": 1e-6},
}
"""Model shapes for `make_deepseek2_preset`."""

DEEPSEEK2_QUANT = {"embed": "Q8_0", "attn": "Q8_0", "router": "F32", "experts": "IQ1_S", "expert_down": "IQ1_M",
                   "output": "Q8_0"}
"""`make_deepseek2_preset`'s mix: the experts of unsloth's UD-IQ1_S DeepSeek files (IQ1_S gate/up, IQ1_M down:
the ~1.6-bit files people run V3 and R1 from on one GPU), Q8_0 dense."""


def make_deepseek2(
    path: str | os.PathLike[str],
    *,
    layers: int = 3,
    hidden: int = 64,
    heads: int = 4,
    q_lora: int = 48,
    kv_lora: int = 32,
    key_nope: int = 24,
    key_rope: int = 8,
    value_dim: int = 20,
    experts: int = 12,
    top_k: int = 3,
    expert_ffn: int = 32,
    shared_experts: int = 2,
    dense_layers: int = 1,
    dense_ffn: int = 96,
    groups: int = 4,
    groups_used: int = 2,
    gating: str = "sigmoid",
    norm_weights: bool = True,
    routed_scale: float = 1.7,
    bias_std: float = 0.05,
    vocab: int = 512,
    ctx: int = 8192,
    rope_theta: float = 5000.0,
    yarn_factor: float = 6.0,
    yarn_orig_ctx: int = 512,
    yarn_beta_fast: float = 24.0,
    yarn_beta_slow: float = 2.0,
    mscale_all_dim: float = 0.7,
    rms_eps: float = 3e-6,
    norm_std: float = 0.05,
    quant: dict[str, str] | None = None,
    seed: int = 0,
    workers: int = 1,
    route_skew: float = 0.0,
    route_locality: float = 0.0,
) -> Path:
    """Write a `deepseek2` GGUF with llama.cpp's names and random weights; every hyperparameter differs from
    the reader's fallbacks and DeepSeek V3's (a head's nope, rope and value dims all differ; groups of
    experts, a selection bias exp_probs_b of N(0, bias_std), YaRN with its own factor, context, betas and
    mscale_all_dim). `q_lora` 0 writes one query projection (attn_q, as V2-Lite); `dense_layers` leading
    layers have a dense FFN of `dense_ffn`; `shared_experts` 0 writes none; `groups` 0 writes no group keys;
    `gating` is "sigmoid" (V3) or "softmax" (V2); `yarn_factor` 0 writes no rope scaling. `quant` maps roles
    (strata.testing.models.ROLES; the attention's and the dense and shared FFNs' matrices are "attn") to
    types; unnamed roles are F32. `route_skew` and `route_locality` shape the routing as make_qwen3moe's do
    (each router row scaled by exp(s z), z ~ N(0, 1) per (layer, expert); token embeddings at 1 - locality):
    sigmoid and softmax scores are monotone in the logit, so a row of larger norm lands in the top-k more
    often here too. Returns the path."""
    if not (route_skew >= 0 and np.isfinite(route_skew)):
        raise ValueError(f"route_skew ({route_skew}) must be a finite number >= 0")
    if not 0 <= route_locality < 1:
        raise ValueError(f"route_locality ({route_locality}) must be in [0, 1)")
    dims = {"layers": layers, "hidden": hidden, "heads": heads, "kv_lora": kv_lora, "key_nope": key_nope,
            "key_rope": key_rope, "value_dim": value_dim, "experts": experts, "top_k": top_k,
            "expert_ffn": expert_ffn, "vocab": vocab, "ctx": ctx}
    if any(v <= 0 for v in dims.values()) or min(q_lora, shared_experts, dense_layers, groups) < 0:
        raise ValueError(f"model dimensions must be positive: {dims}")
    if key_rope % 2 or top_k > experts or dense_layers >= layers or (dense_layers and dense_ffn <= 0):
        raise ValueError(f"need an even key_rope, top_k <= experts and a MoE layer: {dims}")
    if groups > 1 and (experts % groups or experts // groups < 2 or not 0 < groups_used <= groups
                       or groups_used * (experts // groups) < top_k):
        raise ValueError(f"groups ({groups}, {groups_used} used) must split {experts} experts into groups of "
                         f">= 2 that hold top_k ({top_k})")
    if gating not in ("sigmoid", "softmax"):
        raise ValueError(f"gating must be 'sigmoid' or 'softmax', got {gating!r}")
    types = _resolve_quant(quant)
    voc = tok.vocab(vocab)
    tensors = _plan(types, layers, hidden, heads, q_lora, kv_lora, key_nope, key_rope, value_dim, experts,
                    expert_ffn, shared_experts, dense_layers, dense_ffn, vocab, norm_std, bias_std, route_skew,
                    1.0 - route_locality)

    w = gguf.GGUFWriter(path, ARCH)
    w.add_name(f"strata synthetic deepseek2 L{layers} D{hidden} E{experts}")
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(dense_ffn)
    w.add_expert_feed_forward_length(expert_ffn)
    w.add_head_count(heads)
    # The absorbed (MQA) view llama.cpp's converter writes: one KV head of the latent and the rope key.
    w.add_head_count_kv(1)
    w.add_key_length(kv_lora + key_rope)
    w.add_value_length(kv_lora)
    w.add_uint32(f"{ARCH}.attention.key_length_mla", key_nope + key_rope)
    w.add_uint32(f"{ARCH}.attention.value_length_mla", value_dim)
    w.add_q_lora_rank(q_lora)  # 0 for one query projection, as the converter writes V2-Lite (llama.cpp needs it)
    w.add_kv_lora_rank(kv_lora)
    w.add_rope_dimension_count(key_rope)
    w.add_rope_freq_base(rope_theta)
    if yarn_factor:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn_factor)
        w.add_rope_scaling_orig_ctx_len(yarn_orig_ctx)
        w.add_float32(f"{ARCH}.rope.scaling.yarn_log_multiplier", 0.1 * mscale_all_dim)
        w.add_float32(f"{ARCH}.rope.scaling.yarn_beta_fast", yarn_beta_fast)
        w.add_float32(f"{ARCH}.rope.scaling.yarn_beta_slow", yarn_beta_slow)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_leading_dense_block_count(dense_layers)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    w.add_expert_shared_count(shared_experts)
    w.add_expert_weights_scale(routed_scale)
    w.add_expert_weights_norm(norm_weights)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if gating == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    if groups:
        w.add_uint32(f"{ARCH}.expert_group_count", groups)
        w.add_uint32(f"{ARCH}.expert_group_used_count", groups_used)
    w.add_file_type(_FILE_TYPES[types["experts"]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok.add_to_gguf(w, voc, "deepseek-v3")
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=gguf.GGMLQuantizationType[t.qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return _write_tensors(w, path, tensors, seed, workers, gen=_chunks)


def _plan(types: dict[str, str], L: int, D: int, H: int, Q: int, C: int, dn: int, dr: int, dv: int, E: int,
          F: int, S: int, n_dense: int, Fd: int, V: int, norm: float, bias: float, skew: float = 0.0,
          embed_std: float = 1.0) -> list[_Tensor]:
    def t(name: str, shape: tuple[int, ...], role: str, std: float, row_skew: float = 0.0) -> _Tensor:
        qtype = "F32" if role in ("norm", "bias") else types[role]
        if shape[-1] % block_size(qtype):
            raise ValueError(f"quant {role}={qtype} needs {name}'s row length {shape[-1]} to be a multiple of "
                             f"{block_size(qtype)}")
        return _Tensor(name, shape, role, qtype, std, row_skew)

    dk = dn + dr
    out = [t("token_embd.weight", (V, D), "embed", embed_std)]
    for i in range(L):
        b = f"blk.{i}."
        out += [t(b + "attn_norm.weight", (D,), "norm", norm)]
        if Q:
            out += [t(b + "attn_q_a.weight", (Q, D), "attn", D**-0.5),
                    t(b + "attn_q_a_norm.weight", (Q,), "norm", norm),
                    t(b + "attn_q_b.weight", (H * dk, Q), "attn", Q**-0.5)]
        else:
            out += [t(b + "attn_q.weight", (H * dk, D), "attn", D**-0.5)]
        out += [
            t(b + "attn_kv_a_mqa.weight", (C + dr, D), "attn", D**-0.5),
            t(b + "attn_kv_a_norm.weight", (C,), "norm", norm),
            # llama.cpp's split of kv_b: per head k_b [C, dn] (transposed) and v_b [dv, C]
            t(b + "attn_k_b.weight", (H, C, dn), "attn", C**-0.5),
            t(b + "attn_v_b.weight", (H, dv, C), "attn", C**-0.5),
            t(b + "attn_output.weight", (D, H * dv), "attn", (H * dv) ** -0.5),
            t(b + "ffn_norm.weight", (D,), "norm", norm),
        ]
        if i < n_dense:
            out += [t(b + "ffn_gate.weight", (Fd, D), "attn", D**-0.5),
                    t(b + "ffn_up.weight", (Fd, D), "attn", D**-0.5),
                    t(b + "ffn_down.weight", (D, Fd), "attn", Fd**-0.5)]
            continue
        out += [
            t(b + "ffn_gate_inp.weight", (E, D), "router", D**-0.5, skew),
            t(b + "exp_probs_b.bias", (E,), "bias", bias),
            t(b + "ffn_gate_exps.weight", (E, F, D), "experts", D**-0.5),
            t(b + "ffn_up_exps.weight", (E, F, D), "experts", D**-0.5),
            t(b + "ffn_down_exps.weight", (E, D, F), "expert_down", F**-0.5),
        ]
        if S:
            out += [t(b + "ffn_gate_shexp.weight", (S * F, D), "attn", D**-0.5),
                    t(b + "ffn_up_shexp.weight", (S * F, D), "attn", D**-0.5),
                    t(b + "ffn_down_shexp.weight", (D, S * F), "attn", (S * F) ** -0.5)]
    out += [t("output_norm.weight", (D,), "norm", norm), t("output.weight", (V, D), "output", D**-0.5)]
    return out


def make_deepseek2_preset(
    name: str,
    path: str | os.PathLike[str],
    quant: dict[str, str] | None = None,
    seed: int = 0,
    workers: int = 1,
    **overrides: Any,
) -> Path:
    """`make_deepseek2` with the shapes of DEEPSEEK2_PRESETS[name] (any overridden, e.g. layers=8) and the
    DEEPSEEK2_QUANT mix unless `quant` is given (the real model's experts are ~133 GB in that mix: `workers` processes
    write the layers asked for)."""
    if name not in DEEPSEEK2_PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(DEEPSEEK2_PRESETS)}")
    dims = {**DEEPSEEK2_PRESETS[name], **overrides}
    return make_deepseek2(path, **dims, quant=DEEPSEEK2_QUANT if quant is None else quant, seed=seed,
                          workers=workers)


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
    if t.row_skew:  # each row at its own scale (the router: rows of E experts), as make_qwen3moe's
        return np.concatenate(list(skewed_rows(t.name, t.qtype, rows, t.shape[-1], t.std, t.row_skew, seed, rng)))
    return random_blocks(t.qtype, (rows, t.shape[-1]), t.std, rng).reshape(-1)


def hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's hyperparameters as DeepseekV3Config's keyword arguments (transformers reads no deepseek2
    GGUF): the shapes from the tensors, the rest from the metadata."""
    r = gguf.GGUFReader(path)

    def get(key: str, default: Any = None) -> Any:
        f = r.get_field(f"{ARCH}.{key}")
        return default if f is None else f.contents()

    tensors = {t.name: t for t in r.tensors}
    dk = int(get("attention.key_length_mla"))
    dr = int(get("rope.dimension_count"))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", 10000.0))}
    if get("rope.scaling.type") == "yarn":
        m = float(get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        rope.update(rope_type="yarn", factor=float(get("rope.scaling.factor")),
                    original_max_position_embeddings=int(get("rope.scaling.original_context_length")),
                    beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
                    beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)), mscale=m, mscale_all_dim=m)
    E, F = int(get("expert_count")), int(get("expert_feed_forward_length"))
    if int(get("expert_gating_func", 1)) != 2:
        raise ValueError("transformers' DeepseekV3 routes by sigmoid only; this file routes by softmax")
    q_lora = get("attention.q_lora_rank")
    groups = int(get("expert_group_count", 1)) or 1
    return {
        "vocab_size": int(tensors["token_embd.weight"].shape[1]), "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length", 1)), "moe_intermediate_size": F,
        "num_hidden_layers": int(get("block_count")), "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": int(get("attention.head_count")),
        "n_shared_experts": int(get("expert_shared_count", 0)), "n_routed_experts": E,
        "routed_scaling_factor": float(get("expert_weights_scale", 1.0)),
        "kv_lora_rank": int(get("attention.kv_lora_rank")), "q_lora_rank": int(q_lora) if q_lora else None,
        "qk_rope_head_dim": dr, "qk_nope_head_dim": dk - dr,
        "v_head_dim": int(get("attention.value_length_mla")), "n_group": groups,
        "topk_group": int(get("expert_group_used_count", 1)) if groups > 1 else 1,
        "num_experts_per_tok": int(get("expert_used_count")),
        "first_k_dense_replace": int(get("leading_dense_block_count", 0)),
        "norm_topk_prob": bool(get("expert_weights_norm", False)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(get("context_length", 4096)), "rope_parameters": rope,
        "rope_interleave": True, "attention_bias": False, "tie_word_embeddings": "output.weight" not in tensors,
    }


def hf_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The file's tensors dequantized (gguf.quants) under DeepseekV3ForCausalLM's names: attn_k_b and attn_v_b
    joined back into kv_b_proj (per head the nope keys' rows, then the values'), gate and up stacked into
    the experts' gate_up_proj."""
    from gguf.quants import dequantize

    r = gguf.GGUFReader(path)
    t = {x.name: np.asarray(dequantize(x.data, x.tensor_type), dtype=np.float32) for x in r.tensors}
    L = sum(1 for n in t if n.endswith(".attn_norm.weight"))
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
          "lm_head.weight": t.get("output.weight", t["token_embd.weight"])}
    for i in range(L):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        a = p + "self_attn."
        sd[p + "input_layernorm.weight"] = t[b + "attn_norm.weight"]
        sd[p + "post_attention_layernorm.weight"] = t[b + "ffn_norm.weight"]
        if b + "attn_q_a.weight" in t:
            sd[a + "q_a_proj.weight"] = t[b + "attn_q_a.weight"]
            sd[a + "q_a_layernorm.weight"] = t[b + "attn_q_a_norm.weight"]
            sd[a + "q_b_proj.weight"] = t[b + "attn_q_b.weight"]
        else:
            sd[a + "q_proj.weight"] = t[b + "attn_q.weight"]
        sd[a + "kv_a_proj_with_mqa.weight"] = t[b + "attn_kv_a_mqa.weight"]
        sd[a + "kv_a_layernorm.weight"] = t[b + "attn_kv_a_norm.weight"]
        k_b, v_b = t[b + "attn_k_b.weight"], t[b + "attn_v_b.weight"]  # [H, C, dn], [H, dv, C]
        C = k_b.shape[1]
        sd[a + "kv_b_proj.weight"] = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(-1, C)
        sd[a + "o_proj.weight"] = t[b + "attn_output.weight"]
        if b + "ffn_gate.weight" in t:
            for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
                sd[p + f"mlp.{theirs}.weight"] = t[b + ours + ".weight"]
            continue
        sd[p + "mlp.gate.weight"] = t[b + "ffn_gate_inp.weight"]
        E = t[b + "ffn_gate_inp.weight"].shape[0]
        sd[p + "mlp.gate.e_score_correction_bias"] = t.get(b + "exp_probs_b.bias", np.zeros(E, np.float32))
        sd[p + "mlp.experts.gate_up_proj"] = np.concatenate(
            [t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]], axis=1)  # [E, 2F, D]
        sd[p + "mlp.experts.down_proj"] = t[b + "ffn_down_exps.weight"]  # [E, D, F]
        if b + "ffn_gate_shexp.weight" in t:
            for ours, theirs in (("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"),
                                 ("ffn_down_shexp", "down_proj")):
                sd[p + f"mlp.shared_experts.{theirs}.weight"] = t[b + ours + ".weight"]
    return sd


def hf_model(path: str | os.PathLike[str], dtype: Any = None) -> Any:
    """transformers' DeepseekV3ForCausalLM of the file (eager attention and experts), in float32 or `dtype`.
    Every RMSNorm takes the file's epsilon (transformers hard-codes 1e-6 for the latents' norms, llama.cpp
    reads the file's for all)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(**hf_config(path))
    cfg._attn_implementation = "eager"
    dtype = dtype or torch.float32
    m = DeepseekV3ForCausalLM(cfg).to(dtype).eval()
    sd = {k: torch.from_numpy(np.array(v)).to(dtype) for k, v in hf_state_dict(path).items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"deepseek2 state dict mismatch: missing {missing}, unexpected {unexpected}")
    for mod in m.modules():
        if hasattr(mod, "variance_epsilon"):
            mod.variance_epsilon = cfg.rms_norm_eps
    return m
