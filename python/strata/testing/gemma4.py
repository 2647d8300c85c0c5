"""Synthetic gemma4 GGUF files (random weights, llama.cpp's tensor and key names, a gemma4 tokenizer) and
their transformers reference (`hf_model`: Gemma4ForCausalLM built from the file's dequantized tensors).

transformers' gemma4 also has vision and audio towers, per-layer input embeddings and KV sharing (the small
E2B/E4B models), and dense-only variants; the MoE text model has none of them, and neither do these files."""

from __future__ import annotations

import functools
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

ARCH = "gemma4"
NOPE_FACTOR = 1e30  # rope_freqs past the rotated fraction: the pair's frequency divided to nothing


def make_gemma4(
    path: str | os.PathLike[str],
    *,
    layers: int = 4,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    global_kv_heads: int = 1,
    head_dim: int = 16,
    global_head_dim: int = 32,
    experts: int = 8,
    top_k: int = 3,
    expert_ffn: int = 32,
    ffn: int = 64,
    vocab: int = 700,
    ctx: int = 8192,
    sliding_window: int = 5,
    sliding_pattern: str = "SF",
    rope_theta: float = 2e5,
    rope_theta_swa: float = 3e4,
    partial_rotary: float = 0.25,
    rms_eps: float = 3e-5,
    softcap: float | None = 12.0,
    norm_std: float = 0.1,
    k_eq_v: bool = True,
    quant: dict[str, str] | None = None,
    seed: int = 0,
) -> Path:
    """Write a `gemma4` GGUF with llama.cpp's names and random weights; every hyperparameter differs from
    strata's fallbacks. Layer l slides when sliding_pattern[l % len] is "S" (the last layer must be global,
    as transformers forces); the global layers have their own head size, KV heads and RoPE base, and
    rope_freqs keeps `partial_rotary` of their pairs turning (proportional RoPE). With `k_eq_v` the global
    layers have no attn_v (values are the keys' projection). `softcap` 0 writes an explicit 0 (no final
    softcapping); None writes no key (a reader's default: llama.cpp's 30).
    `quant` maps roles (strata.testing.models.ROLES; the dense FFN is "attn") to types; others are F32."""
    kinds = [sliding_pattern[i % len(sliding_pattern)] for i in range(layers)]
    dims = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
            "global_kv_heads": global_kv_heads, "head_dim": head_dim, "global_head_dim": global_head_dim,
            "experts": experts, "top_k": top_k, "expert_ffn": expert_ffn, "ffn": ffn, "vocab": vocab, "ctx": ctx,
            "sliding_window": sliding_window}
    if any(v <= 0 for v in dims.values()):
        raise ValueError(f"model dimensions must be positive: {dims}")
    if set(kinds) - {"S", "F"} or kinds[-1] != "F":
        raise ValueError(f"sliding_pattern is S/F letters and the last layer is global (F): {kinds}")
    if heads % kv_heads or heads % global_kv_heads or head_dim % 2 or global_head_dim % 2 or top_k > experts:
        raise ValueError(f"need heads divisible by both KV head counts, even head sizes, top_k <= experts: {dims}")
    types = _resolve_quant(quant)
    voc = tok.spm_vocab(vocab)
    rotated = int(partial_rotary * global_head_dim // 2)
    tensors = _plan(types, kinds, hidden, heads, kv_heads, global_kv_heads, head_dim, global_head_dim, experts,
                    expert_ffn, ffn, vocab, norm_std, k_eq_v)

    w = gguf.GGUFWriter(path, ARCH)
    w.add_name(f"strata synthetic gemma4 L{layers} D{hidden} E{experts}")
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_expert_feed_forward_length(expert_ffn)
    w.add_head_count(heads)
    w.add_head_count_kv([kv_heads if k == "S" else global_kv_heads for k in kinds])
    w.add_key_length(global_head_dim)
    w.add_value_length(global_head_dim)
    w.add_key_length_swa(head_dim)
    w.add_value_length_swa(head_dim)
    w.add_rope_dimension_count(global_head_dim)
    w.add_rope_dimension_count_swa(head_dim)
    w.add_rope_freq_base(rope_theta)
    w.add_rope_freq_base_swa(rope_theta_swa)
    w.add_sliding_window(sliding_window)
    w.add_sliding_window_pattern([k == "S" for k in kinds])
    w.add_layer_norm_rms_eps(rms_eps)
    # As the converter writes it for the MoE model (llama.cpp requires the key): no per-layer input embeddings.
    w.add_uint32(f"{ARCH}.embedding_length_per_layer_input", 0)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    if softcap is not None:
        w.add_final_logit_softcapping(softcap)
    w.add_file_type(_FILE_TYPES.get(types["experts"], gguf.LlamaFileType.ALL_F32))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok.add_spm_to_gguf(w, voc)
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=gguf.GGMLQuantizationType[t.qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return _write_tensors(w, path, tensors, seed, gen=functools.partial(_chunks, rotated=rotated))


def _chunks(t: _Tensor, seed: int, rotated: int) -> Iterator[np.ndarray]:
    """The tensor's bytes as the writer takes them (one chunk)."""
    yield np.ascontiguousarray(_generate(t, seed, rotated)).view(np.uint8)


def _plan(types: dict[str, str], kinds: list[str], D: int, H: int, KV: int, KVg: int, hd: int, hdg: int, E: int,
          F: int, Fd: int, V: int, norm: float, k_eq_v: bool) -> list[_Tensor]:
    def t(name: str, shape: tuple[int, ...], role: str, std: float) -> _Tensor:
        qtype = "F32" if role in ("norm", "scale", "rope_freqs") else types[role]
        if shape[-1] % block_size(qtype):
            raise ValueError(f"quant {role}={qtype} needs {name}'s row length {shape[-1]} to be a multiple of "
                             f"{block_size(qtype)}")
        return _Tensor(name, shape, role, qtype, std)

    out = [t("token_embd.weight", (V, D), "embed", 0.3), t("rope_freqs.weight", (hdg // 2,), "rope_freqs", 0.0)]
    for i, kind in enumerate(kinds):
        b = f"blk.{i}."
        h, kv = (hd, KV) if kind == "S" else (hdg, KVg)
        out += [
            t(b + "attn_norm.weight", (D,), "norm", norm),
            t(b + "attn_q.weight", (H * h, D), "attn", D**-0.5),
            t(b + "attn_k.weight", (kv * h, D), "attn", D**-0.5),
        ]
        if kind == "S" or not k_eq_v:
            out.append(t(b + "attn_v.weight", (kv * h, D), "attn", D**-0.5))
        out += [
            t(b + "attn_output.weight", (D, H * h), "attn", (H * h) ** -0.5),
            t(b + "attn_q_norm.weight", (h,), "norm", norm),
            t(b + "attn_k_norm.weight", (h,), "norm", norm),
            t(b + "post_attention_norm.weight", (D,), "norm", norm),
            t(b + "layer_output_scale.weight", (1,), "scale", 0.3),
            t(b + "ffn_norm.weight", (D,), "norm", norm),
            t(b + "ffn_gate.weight", (Fd, D), "attn", D**-0.5),
            t(b + "ffn_up.weight", (Fd, D), "attn", D**-0.5),
            t(b + "ffn_down.weight", (D, Fd), "attn", Fd**-0.5),
            t(b + "post_ffw_norm.weight", (D,), "norm", norm),
            t(b + "ffn_gate_inp.weight", (E, D), "router", 1.0),
            t(b + "ffn_gate_inp.scale", (D,), "norm", norm),
            t(b + "pre_ffw_norm_2.weight", (D,), "norm", norm),
            t(b + "post_ffw_norm_1.weight", (D,), "norm", norm),
            t(b + "post_ffw_norm_2.weight", (D,), "norm", norm),
            t(b + "ffn_gate_exps.weight", (E, F, D), "experts", D**-0.5),
            t(b + "ffn_up_exps.weight", (E, F, D), "experts", D**-0.5),
            t(b + "ffn_down_exps.weight", (E, D, F), "expert_down", F**-0.5),
            t(b + "ffn_down_exps.scale", (E,), "scale", 0.3),
        ]
    out.append(t("output_norm.weight", (D,), "norm", norm))
    return out


def _generate(t: _Tensor, seed: int, rotated: int) -> np.ndarray:
    """The tensor's values from an rng seeded by (seed, name): norms 1 + N(0, std), scales 1 + U(-std, std)
    (positive), rope_freqs 1 for the rotated pairs and NOPE_FACTOR past them, weights random blocks."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    n = int(np.prod(t.shape))
    if t.role == "norm":
        return 1.0 + t.std * rng.standard_normal(n, dtype=np.float32)
    if t.role == "scale":
        return (1.0 + t.std * rng.uniform(-1, 1, n)).astype(np.float32)
    if t.role == "rope_freqs":
        return np.where(np.arange(n) < rotated, 1.0, NOPE_FACTOR).astype(np.float32)
    rows = n // t.shape[-1]
    return random_blocks(t.qtype, (rows, t.shape[-1]), t.std, rng).reshape(-1)


def hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's hyperparameters as Gemma4TextConfig's keyword arguments: the shapes from the tensors, the
    rest from the metadata (strata's reader's fallbacks where absent); the rotated fraction of the global
    layers from rope_freqs (its entries of 1)."""
    r = gguf.GGUFReader(path)

    def get(key: str, default: Any = None) -> Any:
        f = r.get_field(f"{ARCH}.{key}")
        return default if f is None else f.contents()

    tensors = {t.name: t for t in r.tensors}
    L = int(get("block_count"))
    pattern = list(get("attention.sliding_window_pattern"))
    kv = get("attention.head_count_kv")
    kv = list(kv) if isinstance(kv, list) else [kv] * L
    full = [i for i in range(L) if not pattern[i]]
    hdg = int(get("attention.key_length"))
    freqs = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float32)
    rotated = int((freqs == 1.0).sum())
    k_eq_v = f"blk.{full[0]}.attn_v.weight" not in tensors
    if not k_eq_v and True in pattern and kv[full[0]] != kv[pattern.index(True)]:
        raise ValueError("transformers' gemma4 gives the global layers their own KV heads only with K = V")
    E = int(get("expert_count"))
    softcap = get("final_logit_softcapping", 30.0)  # absent: llama.cpp's default
    return {
        "vocab_size": int(tensors["token_embd.weight"].shape[1]), "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": L,
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": int(kv[pattern.index(True)]) if True in pattern else int(kv[0]),
        "num_global_key_value_heads": int(kv[full[0]]), "head_dim": int(get("attention.key_length_swa")),
        "global_head_dim": hdg, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": int(get("context_length", 131072)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "sliding_window": int(get("attention.sliding_window")),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in pattern],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": float(get("rope.freq_base_swa", 1e4))},
            "full_attention": {"rope_type": "proportional", "rope_theta": float(get("rope.freq_base", 1e6)),
                               "partial_rotary_factor": 2 * rotated / hdg},
        },
        "final_logit_softcapping": float(softcap) if softcap else None,
        "attention_k_eq_v": k_eq_v,
        "enable_moe_block": True, "num_experts": E, "top_k_experts": int(get("expert_used_count")),
        "moe_intermediate_size": int(get("expert_feed_forward_length")),
        "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "tie_word_embeddings": True,
        "attention_bias": False, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    }


def hf_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The file's tensors dequantized (gguf.quants) under Gemma4ForCausalLM's names: gate and up experts
    stacked into gate_up_proj (gate first), the layer output scale as layer_scalar."""
    from gguf.quants import dequantize

    r = gguf.GGUFReader(path)
    t = {x.name: np.asarray(dequantize(x.data, x.tensor_type), dtype=np.float32) for x in r.tensors}
    L = sum(1 for n in t if n.endswith(".attn_norm.weight"))
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
          "lm_head.weight": t["token_embd.weight"]}
    names = {
        "attn_q": "self_attn.q_proj.weight", "attn_k": "self_attn.k_proj.weight", "attn_v": "self_attn.v_proj.weight",
        "attn_output": "self_attn.o_proj.weight", "attn_q_norm": "self_attn.q_norm.weight",
        "attn_k_norm": "self_attn.k_norm.weight", "attn_norm": "input_layernorm.weight",
        "post_attention_norm": "post_attention_layernorm.weight", "ffn_norm": "pre_feedforward_layernorm.weight",
        "post_ffw_norm": "post_feedforward_layernorm.weight", "ffn_gate": "mlp.gate_proj.weight",
        "ffn_up": "mlp.up_proj.weight", "ffn_down": "mlp.down_proj.weight", "ffn_gate_inp": "router.proj.weight",
        "pre_ffw_norm_2": "pre_feedforward_layernorm_2.weight",
        "post_ffw_norm_1": "post_feedforward_layernorm_1.weight",
        "post_ffw_norm_2": "post_feedforward_layernorm_2.weight",
    }
    for i in range(L):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        for ours, theirs in names.items():
            if b + ours + ".weight" in t:
                sd[p + theirs] = t[b + ours + ".weight"]
        sd[p + "router.scale"] = t[b + "ffn_gate_inp.scale"]
        sd[p + "router.per_expert_scale"] = t[b + "ffn_down_exps.scale"]
        sd[p + "layer_scalar"] = t[b + "layer_output_scale.weight"].reshape(1)
        sd[p + "experts.gate_up_proj"] = np.concatenate([t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]],
                                                        axis=1)  # [E, 2F, D]
        sd[p + "experts.down_proj"] = t[b + "ffn_down_exps.weight"]  # [E, D, F]
    return sd


def hf_model(path: str | os.PathLike[str], dtype: Any = None) -> Any:
    """transformers' Gemma4ForCausalLM of the file (eager attention and experts), in float32 or `dtype`."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = Gemma4TextConfig(**hf_config(path))
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    dtype = dtype or torch.float32
    m = Gemma4ForCausalLM(cfg).to(dtype).eval()
    sd = {k: torch.from_numpy(np.array(v)).to(dtype) for k, v in hf_state_dict(path).items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"gemma4 state dict mismatch: missing {missing}, unexpected {unexpected}")
    return m
