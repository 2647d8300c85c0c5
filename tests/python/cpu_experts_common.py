"""The decode step's CPU share (strata.Model(cpu_experts=N)) on any backend: the same greedy tokens as without it,
whatever the cache and the source, with experts actually computed on the host. Shared by test_cpu_experts.py
(the CPU backend, CI) and test_gpu_cpu_experts.py (a GPU: the host's bits against the GPU's products)."""

from __future__ import annotations

import numpy as np

import strata
from strata.testing import make_qwen3moe
from strata.testing.deepseek2 import make_deepseek2

PROMPT = [int(x) for x in np.random.default_rng(91).integers(1, 500, size=24)]
QWEN = dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=32, experts=8, top_k=2, expert_ffn=256, vocab=512)
MIXES = {
    "qwen3moe-q4_k": ("qwen3moe", {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q4_K", "output": "Q8_0"}),
    "qwen3moe-q8_0": ("qwen3moe", {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q8_0", "output": "Q8_0"}),
    "deepseek2-q8_0": ("deepseek2", {"experts": "Q8_0"}),
}


def make(path: str, mix: str) -> str:
    arch, quant = MIXES[mix]
    if arch == "qwen3moe":
        make_qwen3moe(path, **QWEN, quant=quant, seed=5)
    else:
        make_deepseek2(path, hidden=256, expert_ffn=256, quant=quant, seed=5)
    return path


def check_same_tokens(path: str, device: str) -> None:
    """Greedy tokens with up to 1, 2 and every one of a step's misses on the host equal those without, over
    caches that thrash and that keep some experts, and both sources; and experts were computed there."""
    info = strata.ModelInfo(path)
    spec = info.spec
    slot, K = spec["slot_bytes"], spec["top_k"]
    for slots, source in ((K + 3, "host"), (K + 3, "mmap"), (spec["experts"] + K, "host")):
        load = dict(expert_cache=f"{slots * slot}b", prefill=8, source=source, decode_resolve="host",
                    device=device, progress=False, ctx=128)
        want = strata.Model(path, **load).generate(PROMPT, max_tokens=16, temperature=0.0).tokens
        for n in (1, 2, K):
            m = strata.Model(path, cpu_experts=n, **load)
            assert m._m.decode_resolution == "host"
            got = m.generate(PROMPT, max_tokens=16, temperature=0.0).tokens
            assert got == want, dict(slots=slots, source=source, cpu_experts=n)
            c = m.cache
            assert c["cpu_experts"] > 0 and c["cpu_bytes"] > 0, c
            assert c["cpu_experts"] <= c["misses"]
