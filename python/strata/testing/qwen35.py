"""Synthetic qwen35moe (Qwen3.5 / 3.6 MoE) GGUF files (random weights, llama.cpp's tensor and key names and
its converter's conventions) and their transformers reference (`hf_model`: Qwen3_5MoeForCausalLM built from
the file's dequantized tensors, the conventions undone)."""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from strata.testing import tokenizer as tok
from strata.testing.models import _FILE_TYPES, _resolve_quant, _Tensor, _write_tensors
from strata.testing.quant import block_size, random_blocks

ARCH = "qwen35moe"


QWEN35MOE_PRESETS: dict[str, dict] = {
    # Qwen3.6-35B-A3B's shapes (40 layers, 256 experts of 512, 16 key and 32 value heads of 128 in the
    # DeltaNet, 16 query heads of 256 with 64 rotated dims, one MTP block); override layers= or experts= for
    # a smaller file.
    "qwen3.6-35b-a3b": dict(layers=40, hidden=2048, heads=16, kv_heads=2, head_dim=256, rope_dims=64, interval=4,
                            conv_kernel=4, k_heads=16, v_heads=32, k_head_dim=128, v_head_dim=128, experts=256,
                            top_k=8, expert_ffn=512, shared_ffn=512, vocab=248320, ctx=262144, rope_theta=1e7,
                            rms_eps=1e-6, mtp=1),
}
# The experts as the common Q4_K_M files carry them, the router F32 (llama.cpp's quantizer leaves ffn_gate_inp
# alone), the rest Q8_0.
PRESET_QUANT = {"embed": "Q8_0", "attn": "Q8_0", "router": "F32", "experts": "Q4_K", "expert_down": "Q6_K",
                "output": "Q8_0"}


def make_qwen35moe_preset(name: str, path: str | os.PathLike[str], quant: dict[str, str] | None = None, seed: int = 0,
                          workers: int = 1, **overrides) -> Path:
    """`make_qwen35moe` with the shapes of QWEN35MOE_PRESETS[name] (any overridden) and PRESET_QUANT unless
    `quant` is given."""
    if name not in QWEN35MOE_PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(QWEN35MOE_PRESETS)}")
    dims = {**QWEN35MOE_PRESETS[name], **overrides}
    return make_qwen35moe(path, **dims, quant=PRESET_QUANT if quant is None else quant, seed=seed, workers=workers)


def layer_is_linear(layer: int, interval: int) -> bool:
    """transformers' and llama.cpp's layer kinds: every `interval`-th layer is full attention."""
    return (layer + 1) % interval != 0


def make_qwen35moe(
    path: str | os.PathLike[str],
    *,
    layers: int = 6,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    rope_dims: int = 16,
    interval: int = 3,
    conv_kernel: int = 3,
    k_heads: int = 2,
    v_heads: int = 6,
    k_head_dim: int = 16,
    v_head_dim: int = 32,
    experts: int = 8,
    top_k: int = 3,
    expert_ffn: int = 32,
    shared_ffn: int = 64,
    vocab: int = 512,
    ctx: int = 8192,
    rope_theta: float = 3e4,
    rms_eps: float = 3e-5,
    mtp: int = 1,
    recurrent: Sequence[bool] | None = None,
    norm_std: float = 0.1,
    decay_max: float = 1.0,
    quant: dict[str, str] | None = None,
    seed: int = 0,
    workers: int = 1,
) -> Path:
    """Write a `qwen35moe` GGUF with llama.cpp's names and random weights; every hyperparameter differs from
    strata's fallbacks (partial RoPE over `rope_dims` of head_dim, a full-attention layer every `interval`,
    a `conv_kernel`-tap conv, `v_heads` value heads over `k_heads` key heads of other dims, a shared expert
    wider than the routed ones), with `mtp` MTP blocks after the trunk that a reader must skip. As
    llama.cpp's converter writes them: norms as 1 + w (transformers' zero-centred RMSNorm; not the gated
    norm), ssm_a = -exp(A_log), the value heads in tiled order (value head j reads key head j % k_heads).
    A = exp(A_log) is uniform in [0.02, decay_max]. `recurrent` (one flag a layer) writes llama.cpp's
    attention.recurrent_layers instead of full_attention_interval. `quant` maps roles (strata.testing.models.ROLES) to
    types; unnamed roles are F32. `workers` > 1 writes the tensors from that many processes (the same
    bytes). Returns the path."""
    dims = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "rope_dims": rope_dims, "interval": interval, "conv_kernel": conv_kernel, "k_heads": k_heads,
            "v_heads": v_heads, "k_head_dim": k_head_dim, "v_head_dim": v_head_dim, "experts": experts,
            "top_k": top_k, "expert_ffn": expert_ffn, "shared_ffn": shared_ffn, "vocab": vocab, "ctx": ctx}
    if any(v <= 0 for v in dims.values()) or mtp < 0:
        raise ValueError(f"model dimensions must be positive: {dims}, mtp {mtp}")
    if heads % kv_heads or rope_dims % 2 or rope_dims > head_dim or v_heads % k_heads or top_k > experts:
        raise ValueError(f"need heads % kv_heads == 0, an even rope_dims <= head_dim, v_heads % k_heads == 0 and "
                         f"top_k <= experts: {dims}")
    if recurrent is not None and len(recurrent) != layers:
        raise ValueError(f"recurrent needs one flag a layer ({layers}), got {len(recurrent)}")
    linear = list(recurrent) if recurrent is not None else [layer_is_linear(i, interval) for i in range(layers)]
    types = _resolve_quant(quant)
    voc = tok.vocab(vocab)
    tensors = _plan(types, dims, linear, mtp, norm_std)

    w = gguf.GGUFWriter(path, ARCH)
    w.add_name(f"strata synthetic qwen35moe L{layers} D{hidden} E{experts}")
    w.add_block_count(layers + mtp)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(expert_ffn)
    w.add_expert_feed_forward_length(expert_ffn)
    w.add_expert_shared_feed_forward_length(shared_ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope_theta)
    w.add_rope_dimension_count(rope_dims)
    # M-RoPE's sections as the converter writes Qwen3.6's [11, 11, 10] (+ 0): llama.cpp's interleaved M-RoPE
    # gives pair i the section i % 3 while i < 3 x that section's count, so these cover every rotated pair
    # (text positions are equal in all sections: one plain rotation, as transformers computes it).
    half = rope_dims // 2
    w.add_rope_dimension_sections([(half + 2) // 3, (half + 1) // 3, half // 3, 0])
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    w.add_uint32(f"{ARCH}.ssm.conv_kernel", conv_kernel)
    w.add_uint32(f"{ARCH}.ssm.state_size", k_head_dim)
    w.add_uint32(f"{ARCH}.ssm.group_count", k_heads)
    w.add_uint32(f"{ARCH}.ssm.time_step_rank", v_heads)
    w.add_uint32(f"{ARCH}.ssm.inner_size", v_heads * v_head_dim)
    if recurrent is None:
        w.add_uint32(f"{ARCH}.full_attention_interval", interval)
    else:
        w.add_array(f"{ARCH}.attention.recurrent_layers", [bool(x) for x in recurrent] + [False] * mtp)
    if mtp:
        w.add_uint32(f"{ARCH}.nextn_predict_layers", mtp)
    w.add_file_type(_FILE_TYPES[types["experts"]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok.add_to_gguf(w, voc, "qwen35")
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=gguf.GGMLQuantizationType[t.qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return _write_tensors(w, path, tensors, seed, workers, gen=functools.partial(_chunks, decay_max=decay_max))


def _chunks(t: _Tensor, seed: int, decay_max: float) -> Iterator[np.ndarray]:
    """The tensor's bytes as the parallel writer takes them (one chunk)."""
    yield np.ascontiguousarray(_generate(t, seed, decay_max)).view(np.uint8)


def _plan(types: dict[str, str], d: dict[str, int], linear: list[bool], mtp: int, norm: float) -> list[_Tensor]:
    def t(name: str, shape: tuple[int, ...], role: str, std: float) -> _Tensor:
        qtype = "F32" if role in ("norm", "vec", "conv", "decay") else types[role]
        if shape[-1] % block_size(qtype):
            raise ValueError(f"quant {role}={qtype} needs {name}'s row length {shape[-1]} to be a multiple of "
                             f"{block_size(qtype)}")
        return _Tensor(name, shape, role, qtype, std)

    L, D, H, KV, hd = d["layers"], d["hidden"], d["heads"], d["kv_heads"], d["head_dim"]
    E, F, Fs, V = d["experts"], d["expert_ffn"], d["shared_ffn"], d["vocab"]
    Hk, Hv, dk, dv, Kc = d["k_heads"], d["v_heads"], d["k_head_dim"], d["v_head_dim"], d["conv_kernel"]
    C = 2 * Hk * dk + Hv * dv
    out = [t("token_embd.weight", (V, D), "embed", 1.0)]
    for i in range(L + mtp):
        b = f"blk.{i}."
        out += [t(b + "attn_norm.weight", (D,), "norm", norm)]
        if i < L and linear[i]:
            out += [
                t(b + "attn_qkv.weight", (C, D), "attn", D**-0.5),
                t(b + "attn_gate.weight", (Hv * dv, D), "attn", D**-0.5),
                t(b + "ssm_conv1d.weight", (C, Kc), "conv", Kc**-0.5),
                t(b + "ssm_dt.bias", (Hv,), "vec", 0.5),
                t(b + "ssm_a", (Hv,), "decay", 0.0),
                t(b + "ssm_beta.weight", (Hv, D), "attn", D**-0.5),
                t(b + "ssm_alpha.weight", (Hv, D), "attn", D**-0.5),
                t(b + "ssm_norm.weight", (dv,), "norm", norm),
                t(b + "ssm_out.weight", (D, Hv * dv), "attn", (Hv * dv) ** -0.5),
            ]
        else:
            out += [
                t(b + "attn_q.weight", (2 * H * hd, D), "attn", D**-0.5),
                t(b + "attn_k.weight", (KV * hd, D), "attn", D**-0.5),
                t(b + "attn_v.weight", (KV * hd, D), "attn", D**-0.5),
                t(b + "attn_output.weight", (D, H * hd), "attn", (H * hd) ** -0.5),
                t(b + "attn_q_norm.weight", (hd,), "norm", norm),
                t(b + "attn_k_norm.weight", (hd,), "norm", norm),
            ]
        out += [
            t(b + "post_attention_norm.weight", (D,), "norm", norm),
            t(b + "ffn_gate_inp.weight", (E, D), "router", D**-0.5),
            t(b + "ffn_gate_exps.weight", (E, F, D), "experts", D**-0.5),
            t(b + "ffn_up_exps.weight", (E, F, D), "experts", D**-0.5),
            t(b + "ffn_down_exps.weight", (E, D, F), "expert_down", F**-0.5),
            t(b + "ffn_gate_inp_shexp.weight", (D,), "vec", D**-0.5),  # 1-D: F32, as llama.cpp quantizes none
            t(b + "ffn_gate_shexp.weight", (Fs, D), "attn", D**-0.5),
            t(b + "ffn_up_shexp.weight", (Fs, D), "attn", D**-0.5),
            t(b + "ffn_down_shexp.weight", (D, Fs), "attn", Fs**-0.5),
        ]
        if i >= L:  # an MTP block's own tensors (llama.cpp's nextn names): present, never read
            out += [t(b + "nextn.eh_proj.weight", (D, 2 * D), "attn", D**-0.5),
                    t(b + "nextn.enorm.weight", (D,), "norm", norm),
                    t(b + "nextn.hnorm.weight", (D,), "norm", norm)]
    out += [t("output_norm.weight", (D,), "norm", norm), t("output.weight", (V, D), "output", D**-0.5)]
    return out


def _generate(t: _Tensor, seed: int, decay_max: float) -> np.ndarray:
    """The tensor's bytes from an rng seeded by (seed, name): norms 1 + N(0, std), vectors N(0, std),
    ssm_a = -A with A uniform in [0.02, decay_max]."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    n = int(np.prod(t.shape))
    if t.role == "norm":
        return 1.0 + t.std * rng.standard_normal(n, dtype=np.float32)
    if t.role in ("vec", "conv"):
        return t.std * rng.standard_normal(n, dtype=np.float32)
    if t.role == "decay":
        return -rng.uniform(0.02, decay_max, n).astype(np.float32)
    rows = n // t.shape[-1]
    return random_blocks(t.qtype, (rows, t.shape[-1]), t.std, rng).reshape(-1)


def _meta(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    r = gguf.GGUFReader(path)
    md = {f.name[len(ARCH) + 1:]: f.contents() for f in r.fields.values() if f.name.startswith(ARCH + ".")}
    return r, md


def hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's hyperparameters as Qwen3_5MoeTextConfig's keyword arguments (transformers reads no
    qwen35moe GGUF): the shapes from the tensors, the rest from the metadata, the reader's fallbacks where
    absent."""
    r, md = _meta(path)
    tensors = {t.name: t for t in r.tensors}
    H = int(md["attention.head_count"])
    D = int(md["embedding_length"])
    hd = int(md.get("attention.key_length", D // H))
    L = int(md["block_count"]) - int(md.get("nextn_predict_layers", 0))
    interval = int(md.get("full_attention_interval", 4))
    flags = md.get("attention.recurrent_layers")
    linear = [bool(flags[i]) if flags is not None else layer_is_linear(i, interval) for i in range(L)]
    Hv = int(md["ssm.time_step_rank"])
    rope = {"rope_type": "default", "rope_theta": float(md.get("rope.freq_base", 10000.0)),
            "partial_rotary_factor": int(md.get("rope.dimension_count", hd)) / hd, "mrope_interleaved": True}
    return {
        "vocab_size": int(tensors["token_embd.weight"].shape[1]), "hidden_size": D, "num_hidden_layers": L,
        "num_attention_heads": H, "num_key_value_heads": int(md.get("attention.head_count_kv", H)), "head_dim": hd,
        "rms_norm_eps": float(md.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(md.get("context_length", 32768)), "rope_parameters": rope,
        "linear_conv_kernel_dim": int(md["ssm.conv_kernel"]), "linear_key_head_dim": int(md["ssm.state_size"]),
        "linear_value_head_dim": int(md["ssm.inner_size"]) // Hv, "linear_num_key_heads": int(md["ssm.group_count"]),
        "linear_num_value_heads": Hv, "moe_intermediate_size": int(md["expert_feed_forward_length"]),
        "shared_expert_intermediate_size": int(md.get("expert_shared_feed_forward_length",
                                                      md.get("feed_forward_length", 0))),
        "num_experts": int(md["expert_count"]), "num_experts_per_tok": int(md["expert_used_count"]),
        "layer_types": ["linear_attention" if x else "full_attention" for x in linear],
        "tie_word_embeddings": False,
    }


def _untile(x: np.ndarray, axis: int, k_heads: int, v_heads: int) -> np.ndarray:
    """The converter's tiled value-head order back to transformers' grouped one along `axis` (v_heads
    equal blocks): tiled block r * k_heads + g is grouped block g * (v_heads / k_heads) + r."""
    x = np.moveaxis(x, axis, 0)
    r = v_heads // k_heads
    y = x.reshape(r, k_heads, -1, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
    return np.moveaxis(y, 0, axis)


def hf_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The file's tensors dequantized (gguf.quants) under Qwen3_5MoeForCausalLM's names, the converter's
    conventions undone (norms minus 1, A_log = log(-ssm_a), the value heads back in grouped order);
    gate and up joined into gate_up_proj (gate first)."""
    from gguf.quants import dequantize

    r, _ = _meta(path)
    cfg = hf_config(path)
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    qk = 2 * Hk * cfg["linear_key_head_dim"]
    t = {x.name: np.asarray(dequantize(x.data, x.tensor_type), dtype=np.float32) for x in r.tensors}

    def v(x: np.ndarray, axis: int = 0) -> np.ndarray:
        return _untile(x, axis, Hk, Hv)

    def norm(name: str) -> np.ndarray:
        return t[name] - np.float32(1)

    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": norm("output_norm.weight"),
          "lm_head.weight": t["output.weight"]}
    for i in range(cfg["num_hidden_layers"]):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(b + "attn_norm.weight")
        sd[p + "post_attention_layernorm.weight"] = norm(b + "post_attention_norm.weight")
        if cfg["layer_types"][i] == "linear_attention":
            la = p + "linear_attn."
            qkv, conv = t[b + "attn_qkv.weight"], t[b + "ssm_conv1d.weight"]
            sd[la + "in_proj_qkv.weight"] = np.concatenate([qkv[:qk], v(qkv[qk:])])
            sd[la + "conv1d.weight"] = np.concatenate([conv[:qk], v(conv[qk:])])[:, None, :]
            sd[la + "in_proj_z.weight"] = v(t[b + "attn_gate.weight"])
            sd[la + "in_proj_b.weight"] = v(t[b + "ssm_beta.weight"])
            sd[la + "in_proj_a.weight"] = v(t[b + "ssm_alpha.weight"])
            sd[la + "dt_bias"] = v(t[b + "ssm_dt.bias"])
            sd[la + "A_log"] = v(np.log(-t[b + "ssm_a"].astype(np.float64)).astype(np.float32))
            sd[la + "norm.weight"] = t[b + "ssm_norm.weight"]
            sd[la + "out_proj.weight"] = v(t[b + "ssm_out.weight"], 1)
        else:
            for ours, theirs in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"),
                                 ("attn_output", "o_proj")):
                sd[p + f"self_attn.{theirs}.weight"] = t[b + ours + ".weight"]
            sd[p + "self_attn.q_norm.weight"] = norm(b + "attn_q_norm.weight")
            sd[p + "self_attn.k_norm.weight"] = norm(b + "attn_k_norm.weight")
        sd[p + "mlp.gate.weight"] = t[b + "ffn_gate_inp.weight"]
        sd[p + "mlp.experts.gate_up_proj"] = np.concatenate([t[b + "ffn_gate_exps.weight"],
                                                             t[b + "ffn_up_exps.weight"]], axis=1)  # [E, 2F, D]
        sd[p + "mlp.experts.down_proj"] = t[b + "ffn_down_exps.weight"]  # [E, D, F]
        sd[p + "mlp.shared_expert.gate_proj.weight"] = t[b + "ffn_gate_shexp.weight"]
        sd[p + "mlp.shared_expert.up_proj.weight"] = t[b + "ffn_up_shexp.weight"]
        sd[p + "mlp.shared_expert.down_proj.weight"] = t[b + "ffn_down_shexp.weight"]
        sd[p + "mlp.shared_expert_gate.weight"] = t[b + "ffn_gate_inp_shexp.weight"].reshape(1, -1)
    return sd


def hf_model(path: str | os.PathLike[str], dtype: Any = None) -> Any:
    """transformers' Qwen3_5MoeForCausalLM of the file (eager attention, the torch DeltaNet), in float32 or
    `dtype`."""
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(**hf_config(path))
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the per-expert loop: grouped_mm has no float64
    dtype = dtype or torch.float32
    m = Qwen3_5MoeForCausalLM(cfg).to(dtype).eval()
    sd = {k: torch.from_numpy(np.array(v)).to(dtype) for k, v in hf_state_dict(path).items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"qwen35moe state dict mismatch: missing {missing}, unexpected {unexpected}")
    return m
