"""Writes the seed corpus of the fuzz targets: small valid qwen3moe files of every quant family
strata computes with, a tied head, the smallest declared alignment, a gpt-oss file (biases, sinks,
YaRN keys), a qwen35moe file (DeltaNet and full-attention layers, the shared expert, an MTP block), a
gemma4 file (sliding and global layers, K = V, rope_freqs, the gemma4 tokenizer) and a deepseek2 file (the
latent attention's keys and tensors, grouped routing, YaRN, a leading dense layer, a shared expert).
Deterministic.

    python3 tests/fuzz/make_seeds.py OUT_DIR
"""

from __future__ import annotations

import os
import sys

from strata.testing import make_gemma4, make_gpt_oss, make_qwen3moe, make_qwen35moe
from strata.testing.deepseek2 import make_deepseek2
from strata.testing.gguf_edit import U32, Gguf

TINY = dict(layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, experts=4, top_k=2, expert_ffn=32, vocab=280)
WIDE = dict(layers=1, hidden=256, heads=2, kv_heads=1, head_dim=32, experts=2, top_k=1, expert_ffn=256, vocab=262)
SEEDS = {
    "f32": (dict(TINY, layers=2), {}),
    "q8_0": (TINY, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q8_0", "output": "Q8_0"}),
    "f16_bf16": (TINY, {"embed": "F16", "attn": "BF16", "router": "F16", "experts": "BF16", "output": "F16"}),
    "q4_k": (WIDE, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q4_K", "output": "Q8_0"}),
    "q6_k": (WIDE, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q6_K", "output": "Q8_0"}),
    "iq2_xs": (WIDE, {"embed": "Q8_0", "attn": "Q8_0", "experts": "IQ2_XS", "output": "Q8_0"}),
}


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    for name, (shape, quant) in SEEDS.items():
        make_qwen3moe(os.path.join(out, f"{name}.gguf"), **shape, quant=quant, seed=1)
    make_gpt_oss(os.path.join(out, "gpt_oss.gguf"), layers=2, hidden=32, heads=2, kv_heads=1, head_dim=16, experts=4,
                 top_k=2, expert_ffn=32, vocab=280, ctx=4096, yarn_orig_ctx=512, quant={"experts": "MXFP4"}, seed=1)
    make_qwen35moe(os.path.join(out, "qwen35moe.gguf"), layers=2, hidden=32, heads=2, kv_heads=1, head_dim=16,
                   rope_dims=8, interval=2, conv_kernel=3, k_heads=1, v_heads=2, k_head_dim=8, v_head_dim=16,
                   experts=4, top_k=2, expert_ffn=32, shared_ffn=32, vocab=280, ctx=4096,
                   quant={"experts": "Q8_0"}, seed=1)
    make_gemma4(os.path.join(out, "gemma4.gguf"), layers=2, hidden=32, heads=2, kv_heads=1, global_kv_heads=1,
                head_dim=16, global_head_dim=32, experts=4, top_k=2, expert_ffn=32, ffn=32, vocab=600, ctx=4096,
                quant={"experts": "Q8_0"}, seed=1)
    make_deepseek2(os.path.join(out, "deepseek2.gguf"), layers=2, hidden=32, heads=2, q_lora=32, kv_lora=32,
                   key_nope=16, key_rope=8, value_dim=16, experts=4, top_k=2, expert_ffn=32, shared_experts=1,
                   dense_layers=1, dense_ffn=32, groups=2, groups_used=1, vocab=280, ctx=4096, yarn_orig_ctx=512,
                   quant={"experts": "Q8_0"}, seed=1)
    raw = open(os.path.join(out, "q8_0.gguf"), "rb").read()
    g = Gguf.parse(raw)
    g.tensors = [t for t in g.tensors if t.name != b"output.weight"]  # the head reads the embedding
    open(os.path.join(out, "tied.gguf"), "wb").write(g.serialize())
    g = Gguf.parse(raw)
    g.set("general.alignment", U32, 8)
    open(os.path.join(out, "align8.gguf"), "wb").write(g.serialize())


if __name__ == "__main__":
    main(sys.argv[1])
