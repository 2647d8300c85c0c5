"""gemma4 on the CUDA backend (pytest -m gpu; skipped without a GPU): logits against the CPU backend
(streamed experts: the fused layout; every expert resident: the MMQ layout), greedy tokens, decode op
by op (its positions reach RoPE and the windowed attention from the host, so no graph is recorded), and
the logits' independence of the prompt chunking on the GPU. Bounds: gpu_common's, which say why; the CPU's
logits are checked against transformers in test_gemma4.py."""

from __future__ import annotations

import numpy as np
import pytest

import strata
from gpu_common import F16_KV_VS_CPU, F32_KV_VS_CPU, MMQ_VS_CPU, has_gpu, rel
from strata.testing import make_gemma4

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)

MIXES = {
    "f32": None,
    "q4_0": {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q4_0"},
}
# 150 tokens: far past the test model's 5-token sliding window.
PROMPT = [(i * 37 + 11) % 500 + 3 for i in range(150)]


@pytest.fixture(scope="module")
def g4(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-gemma4")
    made: dict[str, str] = {}

    def get(mix: str) -> str:
        if mix not in made:
            made[mix] = str(make_gemma4(d / f"{mix}.gguf", quant=MIXES[mix], seed=5))
        return made[mix]

    return get


def gpu(path: str, **kw) -> strata.Model:
    kw.setdefault("ctx", 256)
    return strata.Model(path, device="cuda", progress=False, **kw)


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_gpu_gemma4_logits_match_cpu(g4, mix, kv):
    path = g4(mix)
    cpu = strata.Model(path, device="cpu", ctx=256, expert_cache=64, progress=False).logits(PROMPT)
    m = gpu(path, kv_type=kv, expert_cache=64)
    e = rel(m.logits(PROMPT), cpu)
    print(f"gemma4 {mix} kv={kv}: vs cpu {e:.2e}")
    assert e <= (F32_KV_VS_CPU if kv == "f32" else F16_KV_VS_CPU)


def test_gpu_gemma4_mmq_layout_matches_cpu_mmq(g4):
    path = g4("q4_0")
    cpu = strata.Model(path, device="cpu", ctx=256, expert_cache="all", progress=False).logits(PROMPT)
    e = rel(gpu(path, kv_type="f32", expert_cache="all").logits(PROMPT), cpu)
    print(f"gemma4 q4_0 MMQ: vs cpu {e:.2e}")
    assert e <= MMQ_VS_CPU


def test_gpu_gemma4_greedy_tokens_match_cpu(g4):
    path = g4("f32")
    want = strata.Model(path, device="cpu", ctx=256, progress=False).generate(PROMPT[:70], max_tokens=24,
                                                                              temperature=0)
    m = gpu(path, kv_type="f32")
    got = m.generate(PROMPT[:70], max_tokens=24, temperature=0)
    assert got.tokens == want.tokens
    assert not m._m.decode_graph_active  # positions from the host: op by op


def test_gpu_gemma4_logits_independent_of_chunking(g4):
    path = g4("q4_0")
    whole = gpu(path, expert_cache=64, prefill=150).logits(PROMPT)
    for chunk in (1, 37, 64):
        np.testing.assert_array_equal(gpu(path, expert_cache=64, prefill=chunk).logits(PROMPT), whole)
