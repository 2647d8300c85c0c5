"""What the GPU tests share: whether a CUDA backend and a GPU are here, the relative error they bound,
and the bounds of GPU logits against the CPU's.

Tolerances follow from what the GPU path rounds differently from the CPU:
- f32 KV cache: the summation order of the float32 reductions differs (warp trees instead of the CPU's
  eight-lane order), and a prompt's float matmuls run on tensor cores with fp16 tiles (weights and
  activations rounded to 2^-11 relative, fp32 sums), decode's on GEMV in fp32. Measured on the H200
  (every qwen3moe mix, 40-token prompt, 2026-12-03): 4.3e-4 .. 6.2e-4 from the CPU and from
  transformers alike; gpt-oss's test models 1.1e-3 .. 1.6e-3 (2026-12-04). Bounds ~10x / ~4x.
- f16 KV cache (the default on a GPU): keys and values rounded to fp16 (relative 2^-11 each) move
  attention outputs by ~1e-3 relative at most: measured 4.4e-4 .. 6.9e-4.
- The MMQ layout quantizes the experts' activations to q8_0 on both backends by the same rule, but its
  inputs carry the fp16 tiles' error from attention, and an activation moved across a q8_0 rounding
  boundary moves by one quantum: measured 4.4e-3 .. 5.9e-3 on the integer mixes, gpt-oss's MXFP4 1.65e-2.
"""

from __future__ import annotations

import os
import shutil

import gguf
import numpy as np

import strata

F32_KV_VS_CPU = 6e-3
F16_KV_VS_CPU = 7e-3
MMQ_VS_CPU = 5e-2


def has_gpu() -> bool:
    try:
        strata.Backend("cuda", 0)
        return True
    except strata.Error:
        return False


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def fp16_movement(path: str, tmp_dir, prompt: list[int], ctx: int, **kw) -> float:
    """How far the CPU's logits of `path` over `prompt` move when every float matrix of the file is rounded
    to fp16 (as the GPU's prompt tiles round weights and activations alike)."""
    rounded = tmp_dir / (os.path.basename(path) + ".fp16")
    shutil.copy(path, rounded)
    r = gguf.GGUFReader(rounded, "r+")
    for t in r.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32 and len(t.shape) >= 2:
            t.data[...] = t.data.astype(np.float16).astype(np.float32)
    del r

    def cpu(p) -> np.ndarray:
        return strata.Model(str(p), device="cpu", ctx=ctx, progress=False, **kw).logits(prompt)

    return rel(cpu(rounded), cpu(path))


def streamed_cache(path: str, prefill: int, moe_layout: str = "auto") -> str:
    """A bounded cache that streams: a third of the experts' bytes, or the chunk's region (in the layout
    moe_layout streams) and 8 slots if that is more (test_deepseek4's)."""
    info = strata.ModelInfo(path, moe_layout=moe_layout)
    spec = info.spec
    return f"{max(spec['expert_bytes'] // 3, (info.layout(prefill)['slots'] + 8) * spec['slot_bytes'])}b"
