"""Synthetic Qwen3-MoE GGUF files (random weights, real tokenizer), written tensor by tensor."""

from __future__ import annotations

import multiprocessing
import os
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from strata.testing import tokenizer as tok
from strata.testing.quant import QTYPES, block_size, random_blocks, row_bytes

ROLES = ("embed", "attn", "router", "experts", "expert_down", "output", "norm")
"""Keys of the `quant` dict: which tensors get which type (experts: the routed gate/up projections, and
down unless expert_down is given)."""

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "experts": 8, "top_k": 2,
             "expert_ffn": 256, "vocab": 512, "ctx": 4096},
    "small": {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 2, "head_dim": 64, "experts": 16, "top_k": 4,
              "expert_ffn": 256, "vocab": 2048, "ctx": 8192},
    "qwen3-30b-a3b": {"layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "experts": 128,
                      "top_k": 8, "expert_ffn": 768, "vocab": 151936, "ctx": 40960},
    "qwen3-235b-a22b": {"layers": 94, "hidden": 4096, "heads": 64, "kv_heads": 4, "head_dim": 128, "experts": 128,
                        "top_k": 8, "expert_ffn": 1536, "vocab": 151936, "ctx": 40960},
}
"""Model shapes for `make_preset`; every preset takes the K-quants (dims are multiples of 256)."""

PRESET_QUANT = {"embed": "Q8_0", "attn": "Q8_0", "router": "F32", "experts": "Q4_K", "output": "Q8_0"}
"""`make_preset`'s default quant mix, like a Q4_K_M file: Q4_K experts, Q8_0 dense weights."""

QUANT_MIXES: dict[str, dict[str, str]] = {
    "Q4_K_M": PRESET_QUANT,
    # unsloth's UD-Q4_K_XL Qwen MoE files: gate/up Q4_K, down Q5_K, attention Q8_0
    "UD-Q4_K_XL": {"embed": "Q8_0", "attn": "Q8_0", "router": "F32", "experts": "Q4_K", "expert_down": "Q5_K",
                   "output": "Q6_K"},
    # gpt-oss files: MXFP4 experts; widths that are no multiple of 256 make the K types fall back to Q5_0
    "gpt-oss": {"embed": "Q8_0", "attn": "Q5_0", "router": "F32", "experts": "MXFP4", "output": "Q5_0"},
    # Q3_K_M files: Q3_K gate/up, Q4_K down, Q5_K attention
    "Q3_K_M": {"embed": "Q8_0", "attn": "Q5_K", "router": "F32", "experts": "Q3_K", "expert_down": "Q4_K",
               "output": "Q6_K"},
    # bartowski-style IQ4_XS files, with IQ4_NL where rows are no multiple of 256
    "IQ4_XS": {"embed": "Q8_0", "attn": "IQ4_NL", "router": "F32", "experts": "IQ4_XS", "output": "Q6_K"},
    # Q2_K files: Q2_K gate/up, Q3_K down and attention
    "Q2_K": {"embed": "Q4_K", "attn": "Q3_K", "router": "F32", "experts": "Q2_K", "expert_down": "Q3_K",
             "output": "Q6_K"},
    # unsloth's UD-IQ1_S files of 200B-1T models: IQ1_S gate/up, IQ1_M down, IQ4_XS attention
    "UD-IQ1_S": {"embed": "Q4_K", "attn": "IQ4_XS", "router": "F32", "experts": "IQ1_S", "expert_down": "IQ1_M",
                 "output": "Q6_K"},
    # the UD-IQ2/IQ3 files: IQ3_XXS gate/up, IQ3_S down, IQ2_S attention, IQ2_XXS embeddings
    "UD-IQ3_XXS": {"embed": "IQ2_XXS", "attn": "IQ2_S", "router": "F32", "experts": "IQ3_XXS",
                   "expert_down": "IQ3_S", "output": "Q5_K"},
    # legacy files: Q4_0 / Q4_1 / Q5_1
    "legacy": {"embed": "Q8_0", "attn": "Q5_1", "router": "F32", "experts": "Q4_0", "expert_down": "Q4_1",
               "output": "Q8_0"},
}
"""Quant mixes as real files carry them, by name: `make_preset(..., quant=QUANT_MIXES[name])`."""

PRESET_QUANTS: dict[str, dict[str, str]] = {"qwen3-235b-a22b": {**PRESET_QUANT, "experts": "IQ2_XS"}}
"""Presets whose default mix differs from PRESET_QUANT: the 235B shape as the IQ2_XS files people run
on one GPU (69 GiB, experts 62.8 GB)."""

Progress = Callable[[int, int], None]

_FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
    "IQ2_XS": gguf.LlamaFileType.MOSTLY_IQ2_XS,
    "IQ2_XXS": gguf.LlamaFileType.MOSTLY_IQ2_XXS,
    "Q2_K": gguf.LlamaFileType.MOSTLY_Q2_K,
    "Q3_K": gguf.LlamaFileType.MOSTLY_Q3_K_M,
    "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_M,
    "IQ4_XS": gguf.LlamaFileType.MOSTLY_IQ4_XS,
    "IQ4_NL": gguf.LlamaFileType.MOSTLY_IQ4_NL,
    "MXFP4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "Q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
    "IQ3_XXS": gguf.LlamaFileType.MOSTLY_IQ3_XXS,
    "IQ3_S": gguf.LlamaFileType.MOSTLY_IQ3_S,
    "IQ2_S": gguf.LlamaFileType.MOSTLY_IQ2_S,
    "IQ1_S": gguf.LlamaFileType.MOSTLY_IQ1_S,
    "IQ1_M": gguf.LlamaFileType.MOSTLY_IQ1_M,
}
_CHUNK_ELEMS = 1 << 23  # elements generated at a time: bounds memory to ~100 MB whatever the tensor


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy (row-major) order: the reverse of ggml's ne
    role: str
    qtype: str
    std: float  # of the weights; norms are 1 + N(0, std)
    row_skew: float = 0.0  # rows scaled by exp(row_skew * N(0, 1)), one draw per row (route_skew)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) * row_bytes(self.qtype, self.shape[-1])


def make_qwen3moe(
    path: str | os.PathLike[str],
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    experts: int = 8,
    top_k: int = 2,
    expert_ffn: int = 32,
    vocab: int = 512,
    ctx: int = 4096,
    rope_theta: float = 1e6,
    rms_eps: float = 1e-6,
    norm_std: float = 0.05,
    chat_template: str | None = None,
    quant: dict[str, str] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    workers: int = 1,
    route_skew: float = 0.0,
    route_locality: float = 0.0,
) -> Path:
    """Write a `qwen3moe` GGUF with llama.cpp's tensor names, random weights and a real BPE tokenizer.

    Weights are normal (std 1/sqrt(fan_in), embeddings std 1, norms 1 + N(0, norm_std)), so activations
    stay O(1) through the layers; quantized tensors are random valid blocks of the same scale
    (`quant.random_blocks`). `quant` maps roles (ROLES) to types (quant.QTYPES); unnamed roles are F32.
    `chat_template` is stored as tokenizer.chat_template (default: ChatML, `tokenizer.CHAT_TEMPLATE`).
    Each tensor depends only on `seed` and its name. Written streaming, in bounded memory;
    `progress(done, total)` is called with tensor-data bytes. `workers` > 1 writes the tensors from
    that many processes into their places in the file (the same bytes as one process: a 17 GB preset
    in seconds on a many-core machine). Returns the path.

    Routing like real models (0 and 0, the defaults: the near-uniform routing of random weights):
    - `route_skew` s >= 0: expert popularity. Router row e of every layer is scaled by
      exp(s * z_e), z_e ~ N(0, 1) per (layer, expert): a row of larger norm gives logits of larger spread,
      so its expert lands in the top-k more often. bench/NOTES.md measures what s gives (s = 0.5: about
      published Qwen3-30B-A3B's 90% of the routing mass on about half the experts).
    - `route_locality` in [0, 1): consecutive tokens routing alike. The token embeddings' scale becomes
      1 - route_locality, so after the first attention the residual stream is mostly attention's
      output, a mix over the context that moves little from one token to the next (RMSNorm removes the
      scale from every layer's input, so only the residual's mix changes).
    """
    if not (route_skew >= 0 and np.isfinite(route_skew)):
        raise ValueError(f"route_skew ({route_skew}) must be a finite number >= 0")
    if not 0 <= route_locality < 1:
        raise ValueError(f"route_locality ({route_locality}) must be in [0, 1)")
    dims = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "experts": experts, "top_k": top_k, "expert_ffn": expert_ffn, "vocab": vocab, "ctx": ctx}
    if any(v <= 0 for v in dims.values()):
        raise ValueError(f"model dimensions must be positive: {dims}")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) must not exceed experts ({experts})")
    if not 0 <= norm_std < 1:
        raise ValueError(f"norm_std ({norm_std}) must be in [0, 1): norm weights are 1 + N(0, norm_std)")
    types = _resolve_quant(quant)
    voc = tok.vocab(vocab)
    tensors = _plan(types, layers, hidden, heads, kv_heads, head_dim, experts, expert_ffn, vocab, norm_std,
                    route_skew, 1.0 - route_locality)

    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_name(f"strata synthetic qwen3moe L{layers} D{hidden} E{experts}")
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(3 * hidden)  # dense FFN width, unused by the model; transformers reads it
    w.add_expert_feed_forward_length(expert_ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope_theta)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    w.add_file_type(_FILE_TYPES[types["experts"]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok.add_to_gguf(w, voc, "qwen2", chat_template)
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=gguf.GGMLQuantizationType[t.qtype])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return _write_tensors(w, path, tensors, seed, workers, progress)


def make_preset(
    name: str,
    path: str | os.PathLike[str],
    quant: dict[str, str] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    workers: int = 1,
    **overrides: float,
) -> Path:
    """`make_qwen3moe` with the shapes of PRESETS[name] (any of them overridden, e.g. layers=2) and the
    preset's mix (PRESET_QUANTS, else PRESET_QUANT) unless `quant` is given. The 30B preset is ~17 GB,
    the 235B one ~69 GiB; `workers` processes write them in parallel."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    dims = {**PRESETS[name], **overrides}
    if quant is None:
        quant = PRESET_QUANTS.get(name, PRESET_QUANT)
    return make_qwen3moe(path, **dims, quant=quant, seed=seed, progress=progress, workers=workers)


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
    if types["norm"] != "F32":
        raise ValueError(f"norm weights must be F32 (llama.cpp multiplies by them in F32), got {types['norm']!r}")
    return types


def _plan(types: dict[str, str], layers: int, D: int, H: int, KV: int, hd: int, E: int, F: int,
          V: int, norm: float, skew: float = 0.0, embed_std: float = 1.0) -> list[_Tensor]:
    """Every tensor of the file in writing order, checked against its type's block size."""

    def t(name: str, shape: tuple[int, ...], role: str, std: float, row_skew: float = 0.0) -> _Tensor:
        qtype = types[role]
        bs = block_size(qtype)
        if shape[-1] % bs:
            raise ValueError(
                f"quant {role}={qtype} needs {name}'s row length {shape[-1]} to be a multiple of {bs}; "
                f"choose another type or a dimension that is a multiple of {bs}")
        return _Tensor(name, shape, role, qtype, std, row_skew)

    out = [t("token_embd.weight", (V, D), "embed", embed_std)]
    for i in range(layers):
        b = f"blk.{i}."
        out += [
            t(b + "attn_norm.weight", (D,), "norm", norm),
            t(b + "attn_q.weight", (H * hd, D), "attn", D**-0.5),
            t(b + "attn_k.weight", (KV * hd, D), "attn", D**-0.5),
            t(b + "attn_v.weight", (KV * hd, D), "attn", D**-0.5),
            t(b + "attn_output.weight", (D, H * hd), "attn", (H * hd) ** -0.5),
            t(b + "attn_q_norm.weight", (hd,), "norm", norm),
            t(b + "attn_k_norm.weight", (hd,), "norm", norm),
            t(b + "ffn_norm.weight", (D,), "norm", norm),
            t(b + "ffn_gate_inp.weight", (E, D), "router", D**-0.5, skew),
            t(b + "ffn_gate_exps.weight", (E, F, D), "experts", D**-0.5),
            t(b + "ffn_up_exps.weight", (E, F, D), "experts", D**-0.5),
            t(b + "ffn_down_exps.weight", (E, D, F), "expert_down", F**-0.5),
        ]
    out += [t("output_norm.weight", (D,), "norm", norm), t("output.weight", (V, D), "output", D**-0.5)]
    return out


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _write_tensors(w: gguf.GGUFWriter, path: str | os.PathLike[str], tensors: list[_Tensor], seed: int,
                   workers: int = 1, progress: Progress | None = None,
                   gen: Callable[[_Tensor, int], Iterator[np.ndarray]] | None = None) -> Path:
    """After the header and tensor infos: every tensor's data from `gen` (uint8 chunks of whole rows; the
    default `_generate`), in order with the alignment's padding, or with `workers` > 1 each tensor by one
    of `workers` processes at its offset (the same bytes). Closes `w`; returns the path."""
    gen = gen or _generate
    fout = w.fout[0]
    total, done = sum(t.nbytes for t in tensors), 0
    if workers > 1:
        start = _pad(fout.tell(), w.data_alignment)
        w.close()
        _write_parallel(path, tensors, start, w.data_alignment, seed, workers, progress, total, gen)
        return Path(path)
    for t in tensors:
        w.write_padding(fout, fout.tell())
        wrote = 0
        for chunk in gen(t, seed):
            chunk.tofile(fout)
            wrote += chunk.nbytes
            if progress is not None:
                progress(done + wrote, total)
        assert wrote == t.nbytes, t.name
        done += wrote
        w.write_padding(fout, t.nbytes)
    w.close()
    return Path(path)


def _write_parallel(path: str | os.PathLike[str], tensors: list[_Tensor], start: int, align: int, seed: int,
                    workers: int, progress: Progress | None, total: int,
                    gen: Callable[[_Tensor, int], Iterator[np.ndarray]] | None = None) -> None:
    """Each tensor written by one of `workers` processes at its offset (the gaps stay zero, as the
    serial writer's padding); the file is sized first, so the writers never extend it."""
    offsets, off = [], start
    for t in tensors:
        offsets.append(off)
        off += _pad(t.nbytes, align)
    os.truncate(path, off)
    # Largest first, so the pool is not left waiting on one big tensor at the end.
    jobs = sorted(zip(tensors, offsets, strict=True), key=lambda j: -j[0].nbytes)
    done = 0
    # fork: works from any caller (a script read from stdin, a notebook), where spawn must re-import
    # __main__; the children only generate numpy arrays and pwrite them.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(_write_at, os.fspath(path), t, o, seed, gen or _generate) for t, o in jobs]
        for f in as_completed(futures):
            done += f.result()
            if progress is not None:
                progress(done, total)


def _write_at(path: str, t: _Tensor, offset: int, seed: int,
              gen: Callable[[_Tensor, int], Iterator[np.ndarray]]) -> int:
    fd = os.open(path, os.O_WRONLY)
    try:
        for chunk in gen(t, seed):
            view = memoryview(chunk)
            while view:
                n = os.pwrite(fd, view, offset)
                offset += n
                view = view[n:]
    finally:
        os.close(fd)
    return t.nbytes


def skewed_rows(name: str, qtype: str, rows: int, n: int, std: float, skew: float, seed: int,
                rng: np.random.Generator) -> Iterator[np.ndarray]:
    """route_skew's rows (every writer's router): row r of std * exp(skew * z_r), z_r ~ N(0, 1) drawn from
    (seed, name, 1), its blocks from rng, one row a chunk."""
    gains = np.exp(skew * np.random.default_rng([seed, zlib.crc32(name.encode()), 1]).standard_normal(rows))
    for r in range(rows):
        yield random_blocks(qtype, (1, n), float(std * gains[r]), rng).reshape(-1)


def _generate(t: _Tensor, seed: int) -> Iterator[np.ndarray]:
    """The tensor's data as uint8 chunks of whole rows, from an rng seeded by (seed, name)."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    n = t.shape[-1]
    if t.role == "norm":
        yield (1.0 + t.std * rng.standard_normal(n, dtype=np.float32)).view(np.uint8)
        return
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    if t.row_skew:  # a row at a time, each at its own scale (the router: rows of E experts)
        yield from skewed_rows(t.name, t.qtype, rows, n, t.std, t.row_skew, seed, rng)
        return
    step = max(1, _CHUNK_ELEMS // n)
    for r in range(0, rows, step):
        yield random_blocks(t.qtype, (min(step, rows - r), n), t.std, rng).reshape(-1)
