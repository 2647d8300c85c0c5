"""Synthetic DeepSeek V4 GGUF files (GGUF arch `deepseek4`, llama.cpp's tensor names and metadata keys):
random weights, a real tokenizer, written tensor by tensor in bounded memory."""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from strata.testing import tokenizer as tok
from strata.testing.models import _write_tensors, skewed_rows
from strata.testing.quant import QTYPES, block_size, random_blocks, row_bytes

ROLES = ("embed", "attn", "compressor", "router", "experts", "expert_down", "shared", "output", "hc")
"""Keys of the `quant` dict. attn: q_a, q_b, kv, output_a/b and the indexer's q_b and weights; compressor:
the compressors' kv and gate projections; experts: routed gate/up (and down unless expert_down is given);
shared: the shared expert; hc: the hyper-connection mixing matrices. Norms, sinks, biases, position
biases and the hash tables keep their llama.cpp types (F32, I32)."""

DEEPSEEK4_PRESETS: dict[str, dict] = {
    # Every path on short prompts: a window of a few tokens, ratios 0, 4 and 128 (prompts of > 128
    # tokens fill a heavily compressed block), a small indexer top-k, two hash-routed layers.
    "tiny": dict(layers=4, hidden=64, heads=4, head_dim=64, rope_dim=16, q_lora=32, o_groups=2, o_lora=16,
                 window=8, compress_ratios=(0, 4, 128, 4), hash_layers=2, experts=8, top_k=2, expert_ffn=32,
                 index_heads=16, index_dim=64, index_topk=3, vocab=512),
    # DeepSeek V4 Flash's shapes (43 layers, 256 experts, HC 4); override layers= for a smaller file.
    "v4-flash": dict(layers=43, hidden=4096, heads=64, head_dim=512, rope_dim=64, q_lora=1024, o_groups=8,
                     o_lora=1024, window=128, compress_ratios=(0, 0) + (4, 128) * 20 + (4,), hash_layers=3,
                     experts=256, top_k=6, expert_ffn=2048, index_heads=64, index_dim=128, index_topk=512,
                     vocab=129280, ctx=1048576, rope_theta=10000.0, rms_eps=1e-6, yarn_beta_fast=32.0,
                     yarn_beta_slow=1.0, swiglu_limit_shared=10.0),
}
"""Model shapes for `make_deepseek4_preset`."""

FLASH_QUANT = {"embed": "Q8_0", "attn": "Q8_0", "compressor": "Q8_0", "router": "F32", "experts": "IQ2_XXS",
               "expert_down": "Q2_K", "shared": "Q8_0", "output": "Q8_0", "hc": "F32"}
"""The V4 Flash packs' mix: IQ2_XXS gate/up and Q2_K down experts, Q8_0 projections."""

Progress = Callable[[int, int], None]
_CHUNK_ELEMS = 1 << 23  # elements generated at a time


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy (row-major) order: the reverse of ggml's ne
    qtype: str  # a QTYPES name, or "I32" (hash tables)
    kind: str  # "weight", "norm" (1 + N(0, std)), "normal" (N(0, std)), "hash"
    std: float
    row_skew: float = 0.0  # rows scaled by exp(row_skew * N(0, 1)), one draw per row (route_skew)

    @property
    def nbytes(self) -> int:
        rows = int(np.prod(self.shape[:-1], dtype=np.int64))
        if self.qtype == "I32":
            return rows * self.shape[-1] * 4
        return rows * row_bytes(self.qtype, self.shape[-1])


def make_deepseek4(
    path: str | os.PathLike[str],
    *,
    layers: int = 4,
    hidden: int = 64,
    heads: int = 4,
    head_dim: int = 64,
    rope_dim: int = 16,
    q_lora: int = 32,
    o_groups: int = 2,
    o_lora: int = 16,
    window: int = 8,
    compress_ratios: Sequence[int] = (0, 4, 128, 4),
    hash_layers: int = 2,
    experts: int = 8,
    top_k: int = 2,
    expert_ffn: int = 32,
    shared_experts: int = 1,
    index_heads: int = 16,
    index_dim: int = 64,
    index_topk: int = 3,
    hc: int = 4,
    sinkhorn_iters: int = 20,
    vocab: int = 512,
    ctx: int = 8192,
    rope_theta: float = 30000.0,
    compress_rope_theta: float = 160000.0,
    rope_scaling: str = "yarn",
    yarn_factor: float = 16.0,
    yarn_orig_ctx: int = 65536,
    yarn_beta_fast: float = 24.0,
    yarn_beta_slow: float = 2.0,
    swiglu_limit: float = 10.0,
    swiglu_limit_shared: float | None = None,
    routed_scale: float = 1.5,
    expert_weights_norm: bool = True,
    rms_eps: float = 1e-3,
    hc_eps: float = 1e-6,
    mtp: bool = False,
    quant: dict[str, str] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    workers: int = 1,
    route_skew: float = 0.0,
    route_locality: float = 0.0,
) -> Path:
    """Write a `deepseek4` GGUF as llama.cpp's converter lays it out, with random weights and a real BPE
    tokenizer (deepseek-v3 pre-tokenization).

    Weights are normal with std 1/sqrt(fan_in) (embeddings std 1, norms 1 + N(0, 0.05)); the
    hyper-connection mixes, sinks, position biases and routing biases get O(1) spreads so every
    nonlinearity is exercised. Hash tables route each token to `top_k` distinct experts. mtp: append one
    MTP block as llama.cpp's converter numbers it (block_count + 1, nextn_predict_layers = 1), which
    readers must ignore. Each tensor depends only on `seed` and its name. Returns the path.

    Every hyperparameter a reader has a fallback for differs from it by default, so that a key read
    wrongly (or not at all) moves the logits: context_length 8192 (fallback 4096), RoPE base 30000
    (10000), RMS epsilon 1e-3 (1e-6; large enough that 1e-5 or 1e-6 instead moves the logits), YaRN
    (none) with beta 24 / 2 (32 / 1) and an original context unlike context_length, normalized routing
    weights (not), key_length and rope.dimension_count unlike hidden / heads, and a shared experts' SwiGLU
    limit (swiglu_limit_shared; None: 0.75 x swiglu_limit) unlike the routed one (the fallback).
    rope_scaling: "yarn" or "none" (no YaRN keys written). `workers` > 1 writes the tensors from that many
    processes (the same bytes; a V4-Flash-shaped file is tens of GB). `route_skew` and `route_locality` shape
    the learned routers' choices as make_qwen3moe's do (each router row scaled by exp(s z), z ~ N(0, 1) per
    (layer, expert); token embeddings at 1 - locality; V4's sqrt-softplus scores are monotone in the logit);
    the hash layers route by their tables whatever they are.
    """
    if not (route_skew >= 0 and np.isfinite(route_skew)):
        raise ValueError(f"route_skew ({route_skew}) must be a finite number >= 0")
    if not 0 <= route_locality < 1:
        raise ValueError(f"route_locality ({route_locality}) must be in [0, 1)")
    ratios = [int(r) for r in compress_ratios]
    dims = dict(layers=layers, hidden=hidden, heads=heads, head_dim=head_dim, rope_dim=rope_dim, q_lora=q_lora,
                o_groups=o_groups, o_lora=o_lora, window=window, experts=experts, top_k=top_k,
                expert_ffn=expert_ffn, shared_experts=shared_experts, index_heads=index_heads,
                index_dim=index_dim, index_topk=index_topk, hc=hc, vocab=vocab, ctx=ctx)
    if any(v <= 0 for v in dims.values()):
        raise ValueError(f"model dimensions must be positive: {dims}")
    if len(ratios) != layers or any(r not in (0, 4, 128) for r in ratios):
        raise ValueError(f"compress_ratios must give 0, 4 or 128 for each of the {layers} layers, got {ratios}")
    if heads % o_groups or top_k > experts or rope_dim > min(head_dim, index_dim) or rope_dim % 2:
        raise ValueError("need heads % o_groups == 0, top_k <= experts, an even rope_dim <= head_dim, index_dim")
    if not 0 <= hash_layers <= layers:
        raise ValueError(f"hash_layers must be in [0, {layers}], got {hash_layers}")
    if rope_scaling not in ("yarn", "none"):
        raise ValueError(f"rope_scaling must be 'yarn' or 'none', got {rope_scaling!r}")
    shared_limit = 0.75 * swiglu_limit if swiglu_limit_shared is None else swiglu_limit_shared
    types = _resolve_quant(quant)
    voc = tok.vocab(vocab)
    n_blocks = layers + (1 if mtp else 0)
    all_ratios = ratios + ([0] if mtp else [])
    shape = _Shape(hidden, heads, head_dim, q_lora, o_groups, o_lora, experts, top_k, expert_ffn * shared_experts,
                   expert_ffn, index_heads, index_dim, hc, vocab)
    tensors = _plan(types, shape, all_ratios, hash_layers, layers if mtp else None, route_skew,
                    1.0 - route_locality)

    a = "deepseek4."
    w = gguf.GGUFWriter(path, "deepseek4")
    w.add_name(f"strata synthetic deepseek4 L{layers} D{hidden} E{experts}")
    w.add_block_count(n_blocks)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(expert_ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(1)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(rope_dim)
    w.add_rope_freq_base(rope_theta)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    w.add_uint32(a + "attention.q_lora_rank", q_lora)
    w.add_uint32(a + "attention.sliding_window", window)
    w.add_uint32(a + "expert_feed_forward_length", expert_ffn)
    w.add_uint32(a + "expert_shared_count", shared_experts)
    w.add_float32(a + "expert_weights_scale", routed_scale)
    w.add_bool(a + "expert_weights_norm", expert_weights_norm)
    w.add_uint32(a + "expert_gating_func", 4)  # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS
    w.add_array(a + "swiglu_clamp_exp", [float(swiglu_limit)] * n_blocks)
    w.add_array(a + "swiglu_clamp_shexp", [float(shared_limit)] * n_blocks)
    w.add_uint32(a + "attention.indexer.head_count", index_heads)
    w.add_uint32(a + "attention.indexer.key_length", index_dim)
    w.add_uint32(a + "attention.indexer.top_k", index_topk)
    w.add_uint32(a + "attention.output_group_count", o_groups)
    w.add_uint32(a + "attention.output_lora_rank", o_lora)
    w.add_array(a + "attention.compress_ratios", all_ratios)
    w.add_float32(a + "attention.compress_rope_freq_base", compress_rope_theta)
    w.add_uint32(a + "hyper_connection.count", hc)
    w.add_uint32(a + "hyper_connection.sinkhorn_iterations", sinkhorn_iters)
    w.add_float32(a + "hyper_connection.epsilon", hc_eps)
    w.add_uint32(a + "hash_layer_count", hash_layers)
    w.add_uint32(a + "embedding_length_out", hidden * hc)
    w.add_string(a + "rope.scaling.type", rope_scaling)
    if rope_scaling == "yarn":
        w.add_float32(a + "rope.scaling.factor", yarn_factor)
        w.add_uint32(a + "rope.scaling.original_context_length", yarn_orig_ctx)
        w.add_float32(a + "rope.scaling.yarn_beta_fast", yarn_beta_fast)
        w.add_float32(a + "rope.scaling.yarn_beta_slow", yarn_beta_slow)
    if mtp:
        w.add_uint32(a + "nextn_predict_layers", 1)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if types["experts"] == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok.add_to_gguf(w, voc, "deepseek-v3")
    for t in tensors:
        raw = gguf.GGMLQuantizationType[t.qtype]
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=raw)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return _write_tensors(w, path, tensors, seed, workers, progress,
                          gen=functools.partial(_generate, n_experts=experts))


def make_deepseek4_preset(
    name: str,
    path: str | os.PathLike[str],
    quant: dict[str, str] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    workers: int = 1,
    **overrides,
) -> Path:
    """`make_deepseek4` with the shapes of DEEPSEEK4_PRESETS[name] (any overridden, e.g. layers=4 with
    compress_ratios) and, for v4-flash, the FLASH_QUANT mix unless `quant` is given."""
    if name not in DEEPSEEK4_PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(DEEPSEEK4_PRESETS)}")
    dims = {**DEEPSEEK4_PRESETS[name], **overrides}
    if "layers" in overrides and "compress_ratios" not in overrides:
        dims["compress_ratios"] = tuple(dims["compress_ratios"][: dims["layers"]])
    if quant is None and name == "v4-flash":
        quant = FLASH_QUANT
    return make_deepseek4(path, **dims, quant=quant, seed=seed, progress=progress, workers=workers)


@dataclass(frozen=True)
class _Shape:
    D: int
    H: int
    hd: int
    q_lora: int
    G: int
    o_lora: int
    E: int
    K: int
    Fs: int
    F: int
    ih: int
    ihd: int
    HC: int
    V: int


def _resolve_quant(quant: dict[str, str] | None) -> dict[str, str]:
    types = dict.fromkeys(ROLES, "F32")
    for role, qtype in (quant or {}).items():
        if role not in ROLES:
            raise ValueError(f"unknown quant role {role!r}; roles: {', '.join(ROLES)}")
        if qtype not in QTYPES:
            raise ValueError(f"unsupported quant type {qtype!r} for role {role!r}; supported: {', '.join(QTYPES)}")
        types[role] = qtype
    if "expert_down" not in (quant or {}):
        types["expert_down"] = types["experts"]
    return types


def _plan(types: dict[str, str], s: _Shape, ratios: list[int], hash_layers: int,
          mtp_block: int | None, skew: float = 0.0, embed_std: float = 1.0) -> list[_Tensor]:
    """Every tensor of the file in writing order, checked against its type's block size."""

    def t(name: str, shape: tuple[int, ...], role: str, std: float, row_skew: float = 0.0) -> _Tensor:
        qtype = types[role]
        if shape[-1] % block_size(qtype):
            raise ValueError(
                f"quant {role}={qtype} needs {name}'s row length {shape[-1]} to be a multiple of "
                f"{block_size(qtype)}; choose another type or dimension")
        return _Tensor(name, shape, qtype, "weight", std, row_skew)

    def f32(name: str, shape: tuple[int, ...], kind: str, std: float) -> _Tensor:
        return _Tensor(name, shape, "F32", kind, std)

    norm = 0.05
    M = (2 + s.HC) * s.HC
    out = [t("token_embd.weight", (s.V, s.D), "embed", embed_std)]
    for i, ratio in enumerate(ratios):
        b = f"blk.{i}."
        out += [
            f32(b + "attn_norm.weight", (s.D,), "norm", norm),
            f32(b + "attn_sinks.weight", (s.H,), "normal", 1.0),
            t(b + "attn_q_a.weight", (s.q_lora, s.D), "attn", s.D**-0.5),
            f32(b + "attn_q_a_norm.weight", (s.q_lora,), "norm", norm),
            t(b + "attn_q_b.weight", (s.H * s.hd, s.q_lora), "attn", s.q_lora**-0.5),
            t(b + "attn_kv.weight", (s.hd, s.D), "attn", s.D**-0.5),
            f32(b + "attn_kv_a_norm.weight", (s.hd,), "norm", norm),
            t(b + "attn_output_a.weight", (s.G * s.o_lora, s.H * s.hd // s.G), "attn", (s.H * s.hd // s.G) ** -0.5),
            t(b + "attn_output_b.weight", (s.D, s.G * s.o_lora), "attn", (s.G * s.o_lora) ** -0.5),
            t(b + "hc_attn_fn.weight", (M, s.HC * s.D), "hc", (s.HC * s.D) ** -0.5),
            f32(b + "hc_attn_base.weight", (M,), "normal", 0.5),
            f32(b + "hc_attn_scale.weight", (3,), "norm", 0.1),
            t(b + "hc_ffn_fn.weight", (M, s.HC * s.D), "hc", (s.HC * s.D) ** -0.5),
            f32(b + "hc_ffn_base.weight", (M,), "normal", 0.5),
            f32(b + "hc_ffn_scale.weight", (3,), "norm", 0.1),
        ]
        if ratio:
            lanes = 2 if ratio == 4 else 1
            out += [
                t(b + "attn_compressor_kv.weight", (lanes * s.hd, s.D), "compressor", s.D**-0.5),
                t(b + "attn_compressor_gate.weight", (lanes * s.hd, s.D), "compressor", s.D**-0.5),
                f32(b + "attn_compressor_ape.weight", (ratio, lanes * s.hd), "normal", 0.5),
                f32(b + "attn_compressor_norm.weight", (s.hd,), "norm", norm),
            ]
        if ratio == 4:
            out += [
                t(b + "indexer.proj.weight", (s.ih, s.D), "attn", s.D**-0.5),
                t(b + "indexer.attn_q_b.weight", (s.ih * s.ihd, s.q_lora), "attn", s.q_lora**-0.5),
                t(b + "indexer_compressor_kv.weight", (2 * s.ihd, s.D), "compressor", s.D**-0.5),
                t(b + "indexer_compressor_gate.weight", (2 * s.ihd, s.D), "compressor", s.D**-0.5),
                f32(b + "indexer_compressor_ape.weight", (ratio, 2 * s.ihd), "normal", 0.5),
                f32(b + "indexer_compressor_norm.weight", (s.ihd,), "norm", norm),
            ]
        out.append(t(b + "ffn_gate_inp.weight", (s.E, s.D), "router", s.D**-0.5, skew))
        if i < hash_layers:
            out.append(_Tensor(b + "ffn_gate_tid2eid.weight", (s.V, s.K), "I32", "hash", 0.0))
        else:
            out.append(f32(b + "exp_probs_b.bias", (s.E,), "normal", 0.1))
        out += [
            f32(b + "ffn_norm.weight", (s.D,), "norm", norm),
            t(b + "ffn_gate_exps.weight", (s.E, s.F, s.D), "experts", s.D**-0.5),
            t(b + "ffn_down_exps.weight", (s.E, s.D, s.F), "expert_down", s.F**-0.5),
            t(b + "ffn_up_exps.weight", (s.E, s.F, s.D), "experts", s.D**-0.5),
            t(b + "ffn_gate_shexp.weight", (s.Fs, s.D), "shared", s.D**-0.5),
            t(b + "ffn_down_shexp.weight", (s.D, s.Fs), "shared", s.Fs**-0.5),
            t(b + "ffn_up_shexp.weight", (s.Fs, s.D), "shared", s.D**-0.5),
        ]
        if i == mtp_block:
            out += [
                t(b + "nextn.eh_proj.weight", (s.D, 2 * s.D), "attn", (2 * s.D) ** -0.5),
                f32(b + "nextn.enorm.weight", (s.D,), "norm", norm),
                f32(b + "nextn.hnorm.weight", (s.D,), "norm", norm),
                f32(b + "nextn.shared_head_norm.weight", (s.D,), "norm", norm),
            ]
    out += [
        t("output_hc_fn.weight", (s.HC, s.HC * s.D), "hc", (s.HC * s.D) ** -0.5),
        f32("output_hc_base.weight", (s.HC,), "normal", 0.5),
        f32("output_hc_scale.weight", (1,), "norm", 0.1),
        f32("output_norm.weight", (s.D,), "norm", norm),
        t("output.weight", (s.V, s.D), "output", s.D**-0.5),
    ]
    return out


def _generate(t: _Tensor, seed: int, n_experts: int) -> Iterator[np.ndarray]:
    """The tensor's data as uint8 chunks of whole rows, from an rng seeded by (seed, name)."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    n = t.shape[-1]
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    if t.kind == "hash":  # each token's top_k distinct experts
        ids = np.argsort(rng.random((rows, n_experts)), axis=1)[:, :n].astype(np.int32)
        yield ids.reshape(-1).view(np.uint8)
        return
    if t.kind in ("norm", "normal"):
        x = t.std * rng.standard_normal(rows * n, dtype=np.float32)
        yield ((1.0 + x) if t.kind == "norm" else x).astype(np.float32).view(np.uint8)
        return
    if t.row_skew:  # a row at a time, each at its own scale (the router: rows of E experts)
        yield from skewed_rows(t.name, t.qtype, rows, n, t.std, t.row_skew, seed, rng)
        return
    step = max(1, _CHUNK_ELEMS // n)
    for r in range(0, rows, step):
        yield random_blocks(t.qtype, (min(step, rows - r), n), t.std, rng).reshape(-1)
