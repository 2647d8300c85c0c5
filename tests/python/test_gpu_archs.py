"""qwen35moe and gemma4 on the CUDA backend (pytest -m gpu; skipped without a GPU): logits against the CPU
backend (streamed experts: the fused layout; every expert resident: the MMQ layout), greedy tokens, decode
op by op (qwen35moe picks its recurrent state's copies on the host each step, gemma4 passes its positions
from the host: neither records a graph), and the logits' independence of the prompt chunking on the GPU.
Bounds: gpu_common's, which say why; the CPU's logits are checked against transformers in
test_qwen35moe.py and test_gemma4.py."""

from __future__ import annotations

import numpy as np
import pytest

import strata
from gpu_common import F16_KV_VS_CPU, F32_KV_VS_CPU, MMQ_VS_CPU, has_gpu, rel
from strata.testing import make_gemma4, make_qwen35moe

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)

# Per architecture: its writer, a float mix and a quantized one (whose experts take the integer kernels).
ARCHS = {
    "qwen35moe": (make_qwen35moe, {"f32": None,
                                   "quant": {"embed": "Q8_0", "attn": "Q8_0", "experts": "MXFP4", "output": "Q8_0"}}),
    "gemma4": (make_gemma4, {"f32": None, "quant": {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q4_0"}}),
}
# 150 tokens: past two ends of qwen35moe's 64-position DeltaNet chunks, far past gemma4's 5-token window.
PROMPT = [(i * 37 + 11) % 500 + 3 for i in range(150)]
CTX = 256


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-archs")
    made: dict[tuple[str, str], str] = {}

    def get(arch: str, mix: str) -> str:
        if (arch, mix) not in made:
            make, mixes = ARCHS[arch]
            made[arch, mix] = str(make(d / f"{arch}-{mix}.gguf", quant=mixes[mix], seed=5))
        return made[arch, mix]

    return get


def gpu(path: str, **kw) -> strata.Model:
    return strata.Model(path, device="cuda", ctx=CTX, progress=False, **kw)


def cpu(path: str, **kw) -> strata.Model:
    return strata.Model(path, device="cpu", ctx=CTX, progress=False, **kw)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("mix", ["f32", "quant"])
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_gpu_logits_match_cpu(files, arch, mix, kv):
    path = files(arch, mix)
    want = cpu(path, expert_cache=64).logits(PROMPT)
    e = rel(gpu(path, kv_type=kv, expert_cache=64).logits(PROMPT), want)
    print(f"{arch} {mix} kv={kv}: vs cpu {e:.2e}")
    assert e <= (F32_KV_VS_CPU if kv == "f32" else F16_KV_VS_CPU)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_mmq_layout_matches_cpu_mmq(files, arch):
    path = files(arch, "quant")
    e = rel(gpu(path, kv_type="f32", expert_cache="all").logits(PROMPT), cpu(path, expert_cache="all").logits(PROMPT))
    print(f"{arch} MMQ: vs cpu {e:.2e}")
    assert e <= MMQ_VS_CPU


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_greedy_tokens_match_cpu(files, arch):
    path = files(arch, "f32")
    want = cpu(path).generate(PROMPT[:70], max_tokens=24, temperature=0)
    m = gpu(path, kv_type="f32")
    assert m.generate(PROMPT[:70], max_tokens=24, temperature=0).tokens == want.tokens
    assert not m._m.decode_graph_active  # decode op by op (see the module's note)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_logits_independent_of_chunking(files, arch):
    path = files(arch, "quant")
    whole = gpu(path, expert_cache=64, prefill=150).logits(PROMPT)
    for chunk in (1, 37, 64):
        np.testing.assert_array_equal(gpu(path, expert_cache=64, prefill=chunk).logits(PROMPT), whole)
