"""Shared fixtures: synthetic GGUF models built once per session by strata.testing."""

from __future__ import annotations

import os

import pytest

from strata.testing import make_qwen3moe

# Small shapes; K-quant and IQ types need 256-element rows, so those mixes use D = F = 256.
SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_ffn=32, vocab=512)
KQ = dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=32, experts=8, top_k=2, expert_ffn=256, vocab=512)

MIXES = {
    "f32": (SMALL, {}),
    "f16": (SMALL, {"embed": "F16", "attn": "F16", "router": "F16", "experts": "F16", "output": "F16"}),
    "q8_0": (SMALL, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q8_0", "output": "Q8_0"}),
    "q4_k": (KQ, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q4_K", "output": "Q8_0"}),
    "q6_k": (KQ, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q6_K", "output": "Q8_0"}),
    "iq2_xs": (KQ, {"embed": "Q8_0", "attn": "Q8_0", "experts": "IQ2_XS", "output": "Q8_0"}),
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def make_mix(model_dir):
    cache: dict[str, str] = {}

    def make(mix: str) -> str:
        if mix not in cache:
            shape, quant = MIXES[mix]
            path = os.path.join(model_dir, f"{mix}.gguf")
            make_qwen3moe(path, **shape, quant=quant, seed=11)
            cache[mix] = path
        return cache[mix]

    return make
