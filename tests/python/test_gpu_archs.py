"""qwen35moe and gemma4 on the CUDA backend (pytest -m gpu; skipped without a GPU): logits against the CPU
backend (streamed experts under moe_layout="fused": the fused layout; every expert resident: the MMQ layout),
greedy tokens, decode
as one recorded graph (checked against op by op: gemma4 and deepseek2, deepseek2 also at DeepSeek V3's 576-dim
latent rows, which the GPU's MLA attention kernels take; qwen35moe's one-token steps as one graph,
its recurrent state's copies picked by the position on the device), and the logits' independence of the
prompt chunking on the GPU.
Bounds: gpu_common's, which say why; the CPU's logits are checked against transformers in
test_qwen35moe.py and test_gemma4.py.

The logits comparisons use files that route every token to all experts (top_k = experts). With top-3 of 8
these random files have routing near-ties that the GPU's fp16 tiles can flip: on the CPU, rounding only the
weights to fp16 moves qwen35moe's logits by 0.116 and gemma4's by 0.163 of their largest, from position 2
on (a flip at one position reaches every later one through the DeltaNet state), while every GPU op is held
to the CPU's by the op harness. A flip is a discontinuity no rounding bound covers; with top_k = experts
there is none, and what is left is the rounding itself. Its size on each file is measured on the CPU
(`fp16_movement`: the logits when every float matrix is rounded to fp16, as the GPU's prompt tiles round
weights and activations alike), and the GPU may move them 3x that (two operands rounded, and the order of
its sums) or gpu_common's bound, whichever is larger. Top-3 routing on the GPU is covered by the greedy
tokens and the chunking tests below. DeepSeek V4 has its own file, test_gpu_deepseek4.py."""

from __future__ import annotations

import numpy as np
import pytest

import strata
from gpu_common import F16_KV_VS_CPU, F32_KV_VS_CPU, MMQ_VS_CPU, fp16_movement, has_gpu, rel, streamed_cache
from strata.testing import make_gemma4, make_qwen35moe
from strata.testing.deepseek2 import make_deepseek2

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)

# Per architecture: its writer, a float mix and a quantized one (whose experts take the integer kernels), the
# writer's arguments for every file (deepseek2's: head sizes of whole Q8_0 blocks) and those that route
# every token to all experts.
ARCHS = {
    "qwen35moe": (make_qwen35moe, {"f32": None,
                                   "quant": {"embed": "Q8_0", "attn": "Q8_0", "experts": "MXFP4", "output": "Q8_0"}},
                  {}, {"top_k": 8, "experts": 8}),
    "gemma4": (make_gemma4, {"f32": None, "quant": {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q4_0"}},
               {}, {"top_k": 8, "experts": 8}),
    "deepseek2": (make_deepseek2, {"f32": None, "quant": {"embed": "Q8_0", "attn": "Q8_0", "router": "Q8_0",
                                                          "experts": "Q4_0", "output": "Q8_0"}},
                  {"q_lora": 64, "key_nope": 32, "value_dim": 32}, {"top_k": 12, "groups_used": 4}),
    # DeepSeek V3's latent width (512 + 64: the GPU's MLA kernels on an f16 cache), 20 heads (16 a CTA, then 4).
    "deepseek2-576": (make_deepseek2, {"f32": None, "quant": {"embed": "Q8_0", "attn": "Q8_0", "router": "Q8_0",
                                                              "experts": "Q4_0", "output": "Q8_0"}},
                      {"q_lora": 64, "key_nope": 32, "value_dim": 32, "kv_lora": 512, "key_rope": 64, "heads": 20},
                      {"top_k": 12, "groups_used": 4}),
}
# 150 tokens: past two ends of qwen35moe's 64-position DeltaNet chunks, far past gemma4's 5-token window.
PROMPT = [(i * 37 + 11) % 500 + 3 for i in range(150)]
CTX = 256


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-archs")
    made: dict[tuple[str, str], str] = {}

    def get(arch: str, mix: str, all_experts: bool = False) -> str:
        key = (arch, mix, all_experts)
        if key not in made:
            make, mixes, base, every = ARCHS[arch]
            kw = {**base, **every} if all_experts else base
            made[key] = str(make(d / f"{arch}-{mix}{'-all' if all_experts else ''}.gguf", quant=mixes[mix], seed=5,
                                 **kw))
        return made[key]

    return get


def gpu(path: str, **kw) -> strata.Model:
    return strata.Model(path, device="cuda", ctx=CTX, progress=False, **kw)


def cpu(path: str, **kw) -> strata.Model:
    return strata.Model(path, device="cpu", ctx=CTX, progress=False, **kw)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("mix", ["f32", "quant"])
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_gpu_logits_match_cpu(files, tmp_path, arch, mix, kv):
    path = files(arch, mix, all_experts=True)
    fused = dict(expert_cache=64, moe_layout="fused")
    want = cpu(path, **fused).logits(PROMPT)
    moved = fp16_movement(path, tmp_path, PROMPT, CTX, **fused)
    e = rel(gpu(path, kv_type=kv, **fused).logits(PROMPT), want)
    print(f"{arch} {mix} kv={kv}: vs cpu {e:.2e} (fp16 weights on the cpu: {moved:.2e})")
    assert e <= max(F32_KV_VS_CPU if kv == "f32" else F16_KV_VS_CPU, 3 * moved)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_mmq_layout_matches_cpu_mmq(files, tmp_path, arch):
    path = files(arch, "quant", all_experts=True)
    moved = fp16_movement(path, tmp_path, PROMPT, CTX, expert_cache="all")
    e = rel(gpu(path, kv_type="f32", expert_cache="all").logits(PROMPT), cpu(path, expert_cache="all").logits(PROMPT))
    print(f"{arch} MMQ: vs cpu {e:.2e} (fp16 weights on the cpu: {moved:.2e})")
    assert e <= max(MMQ_VS_CPU, 3 * moved)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_greedy_tokens_match_cpu(files, arch):
    path = files(arch, "f32")
    want = cpu(path).generate(PROMPT[:70], max_tokens=24, temperature=0)
    m = gpu(path, kv_type="f32")
    assert m.generate(PROMPT[:70], max_tokens=24, temperature=0).tokens == want.tokens
    assert m._m.decode_graph_active


@pytest.mark.parametrize("arch", ["deepseek2", "deepseek2-576", "gemma4"])
@pytest.mark.parametrize("cache", ["all", "bounded"])
def test_gpu_decode_graph_matches_op_by_op(files, arch, cache):
    """A decode step replayed from one recorded graph (RoPE, the KV store and attention reading the position on
    the device; gemma4's window too, its softcap on the device) computes the logits the step queued op by op
    does, bit for bit, alone and as rows of a batch; every expert resident, or a bounded cache resolved on the
    device."""
    path = files(arch, "quant")
    ids = [(i * 13 + 5) % 500 + 3 for i in range(60)]
    cont = [(i * 7 + 1) % 500 + 3 for i in range(20)]
    kw = dict(expert_cache="all") if cache == "all" else dict(expert_cache=streamed_cache(path, 16), prefill=16)
    runs = {}
    for graph in (True, False):
        m = gpu(path, decode_graph=graph, seqs=2, **kw)
        m.logits(ids)
        one = [m.decode_batch([t], [len(ids) + j], [0]) for j, t in enumerate(cont)]
        two = [m.decode_batch([t, t], [len(ids) + len(cont) + j, j], [0, 1]) for j, t in enumerate(cont)]
        runs[graph] = np.concatenate(one + two)
        assert m._m.decode_graph_active == graph
        assert m.cache["all_resident"] == (cache == "all")
    assert np.array_equal(runs[True].view(np.uint32), runs[False].view(np.uint32))


@pytest.mark.parametrize("cache", ["all", "bounded"])
def test_gpu_qwen35moe_decode_graph_matches_op_by_op(files, cache):
    """qwen35moe's one-token decode step replayed from one recorded graph (the conv rows' and the delta rule's
    state copies, the chunk slot and the chunk's end decided by the position on the device) gives the tokens
    and the logits of the step op by op, across two ends of the 64-position DeltaNet chunks; the recurrent
    state the replays leave continues the next prompt pass (a chat turn) as the op-by-op steps' does."""
    path = files("qwen35moe", "quant")
    kw = dict(expert_cache="all") if cache == "all" else dict(expert_cache=streamed_cache(path, 16), prefill=16)
    runs = {}
    for graph in (True, False):
        m = gpu(path, decode_graph=graph, **kw)
        kw_gen = dict(temperature=0, ignore_eos=True, reuse_kv=True)
        first = m.generate(PROMPT[:50], max_tokens=90, **kw_gen).tokens
        assert m._m.decode_graph_active == graph
        second = m.generate(PROMPT[:50] + first + [7, 8, 9], max_tokens=20, **kw_gen).tokens  # continues
        runs[graph] = (first, second, m.logits(PROMPT[:50] + first + [7, 8, 9] + second, seq=0))
    assert runs[True][:2] == runs[False][:2]
    assert np.array_equal(runs[True][2].view(np.uint32), runs[False][2].view(np.uint32))


@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_logits_independent_of_chunking(files, arch, moe_layout):
    path = files(arch, "quant")
    whole = gpu(path, expert_cache=64, prefill=150, moe_layout=moe_layout).logits(PROMPT)
    for chunk in (1, 37, 64):
        np.testing.assert_array_equal(gpu(path, expert_cache=64, prefill=chunk, moe_layout=moe_layout).logits(PROMPT),
                                      whole)
