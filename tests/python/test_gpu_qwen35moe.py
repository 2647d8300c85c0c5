"""qwen35moe on the CUDA backend (pytest -m gpu; skipped without a GPU): logits against the CPU backend
(streamed experts: the fused layout; every expert resident: the MMQ layout), greedy tokens, decode op
by op (each step picks its recurrent state's copies on the host, so no graph is recorded), and the
logits' independence of the prompt chunking on the GPU. Bounds: gpu_common's, which say why; the CPU's
logits are checked against transformers in test_qwen35moe.py."""

from __future__ import annotations

import numpy as np
import pytest

import strata
from gpu_common import F16_KV_VS_CPU, F32_KV_VS_CPU, MMQ_VS_CPU, has_gpu, rel
from strata.testing import make_qwen35moe

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)

MIXES = {
    "f32": None,
    "mxfp4": {"embed": "Q8_0", "attn": "Q8_0", "experts": "MXFP4", "output": "Q8_0"},
}
# 150 tokens: past two ends of the DeltaNet's 64-position chunks.
PROMPT = [(i * 37 + 11) % 500 + 3 for i in range(150)]


@pytest.fixture(scope="module")
def q35(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-qwen35moe")
    made: dict[str, str] = {}

    def get(mix: str) -> str:
        if mix not in made:
            made[mix] = str(make_qwen35moe(d / f"{mix}.gguf", quant=MIXES[mix], seed=5))
        return made[mix]

    return get


def gpu(path: str, **kw) -> strata.Model:
    kw.setdefault("ctx", 256)
    return strata.Model(path, device="cuda", progress=False, **kw)


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_gpu_qwen35moe_logits_match_cpu(q35, mix, kv):
    path = q35(mix)
    cpu = strata.Model(path, device="cpu", ctx=256, expert_cache=64, progress=False).logits(PROMPT)
    m = gpu(path, kv_type=kv, expert_cache=64)
    e = rel(m.logits(PROMPT), cpu)
    print(f"qwen35moe {mix} kv={kv}: vs cpu {e:.2e}")
    assert e <= (F32_KV_VS_CPU if kv == "f32" else F16_KV_VS_CPU)


def test_gpu_qwen35moe_mmq_layout_matches_cpu_mmq(q35):
    path = q35("mxfp4")
    cpu = strata.Model(path, device="cpu", ctx=256, expert_cache="all", progress=False).logits(PROMPT)
    e = rel(gpu(path, kv_type="f32", expert_cache="all").logits(PROMPT), cpu)
    print(f"qwen35moe mxfp4 MMQ: vs cpu {e:.2e}")
    assert e <= MMQ_VS_CPU


def test_gpu_qwen35moe_greedy_tokens_match_cpu(q35):
    path = q35("f32")
    want = strata.Model(path, device="cpu", ctx=256, progress=False).generate(PROMPT[:70], max_tokens=24,
                                                                              temperature=0)
    m = gpu(path, kv_type="f32")
    got = m.generate(PROMPT[:70], max_tokens=24, temperature=0)
    assert got.tokens == want.tokens
    assert not m._m.decode_graph_active  # the recurrent state's copies are picked per step


def test_gpu_qwen35moe_logits_independent_of_chunking(q35):
    path = q35("mxfp4")
    whole = gpu(path, expert_cache=64, prefill=150).logits(PROMPT)
    for chunk in (1, 37, 64):
        np.testing.assert_array_equal(gpu(path, expert_cache=64, prefill=chunk).logits(PROMPT), whole)
