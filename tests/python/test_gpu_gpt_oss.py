"""gpt-oss on the CUDA backend (pytest -m gpu; skipped without a GPU): logits against the CPU backend,
greedy tokens, the decode graph against op-by-op decode, and invariant 4 (chunking and cache size leave
the logits' bytes) on the GPU. Bounds: gpu_common's, which say why; the CPU's logits are checked
against transformers in test_gpt_oss.py."""

from __future__ import annotations

import numpy as np
import pytest

import strata
from gpu_common import F16_KV_VS_CPU, F32_KV_VS_CPU, MMQ_VS_CPU, has_gpu, rel
from strata.testing import make_gpt_oss

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)

MIXES = {
    "f32": None,
    "mxfp4": {"embed": "Q8_0", "attn": "Q8_0", "experts": "MXFP4", "output": "Q8_0"},
}
# 40 tokens: past the test model's 6-token window on the sliding layers.
PROMPT = [(i * 37 + 11) % 500 + 3 for i in range(40)]


@pytest.fixture(scope="module")
def oss(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-gpt-oss")
    made: dict[str, str] = {}

    def get(mix: str) -> str:
        if mix not in made:
            made[mix] = str(make_gpt_oss(d / f"{mix}.gguf", quant=MIXES[mix], seed=5))
        return made[mix]

    return get


def gpu(path: str, **kw) -> strata.Model:
    kw.setdefault("ctx", 128)
    return strata.Model(path, device="cuda", progress=False, **kw)


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_gpu_gpt_oss_logits_match_cpu(oss, mix, kv):
    """The fused layout (a 64 MiB cache under moe_layout="fused": the experts read float activations)."""
    path = oss(mix)
    cpu = strata.Model(path, device="cpu", ctx=128, expert_cache=64, moe_layout="fused", progress=False).logits(PROMPT)
    m = gpu(path, kv_type=kv, expert_cache=64, moe_layout="fused")
    assert m.layout(16)["kind"] == "fused"
    e = rel(m.logits(PROMPT), cpu)
    print(f"gpt-oss {mix} kv={kv}: vs cpu {e:.2e}")
    assert e <= (F32_KV_VS_CPU if kv == "f32" else F16_KV_VS_CPU)


def test_gpu_gpt_oss_mmq_layout_matches_cpu_mmq(oss):
    """Every expert resident: the MMQ layout, the experts' activations quantized to q8_0 by the same rule
    on both backends; what reaches them carries the fp16 tiles' O(5e-4), and an activation moved across a
    q8_0 rounding boundary moves by a quantum (test_gpu.py's MMQ_VS_CPU and its reasons)."""
    path = oss("mxfp4")
    cpu = strata.Model(path, device="cpu", ctx=128, expert_cache="all", progress=False).logits(PROMPT)
    e = rel(gpu(path, kv_type="f32", expert_cache="all").logits(PROMPT), cpu)
    print(f"gpt-oss mxfp4 MMQ: vs cpu {e:.2e}")
    assert e <= MMQ_VS_CPU


def test_gpu_gpt_oss_greedy_tokens_match_cpu(oss):
    path = oss("f32")
    want = strata.Model(path, device="cpu", ctx=128, progress=False).generate(PROMPT[:8], max_tokens=24, temperature=0)
    got = gpu(path, kv_type="f32").generate(PROMPT[:8], max_tokens=24, temperature=0)
    assert got.tokens == want.tokens


@pytest.mark.parametrize("mix", list(MIXES))
def test_gpu_gpt_oss_decode_graph_matches_op_by_op(oss, mix):
    """A replayed decode step (the positions read from the device: RoPE, the sliding window, the KV
    rows) samples what op-by-op decode samples, over positions the recording never saw."""
    path = oss(mix)
    kw = dict(max_tokens=40, temperature=1.0, seed=7)
    g = gpu(path, expert_cache="all")
    with_graph = g.generate(PROMPT[:8], **kw)
    assert g._m.decode_graph_active
    plain = gpu(path, expert_cache="all", decode_graph=False)
    without = plain.generate(PROMPT[:8], **kw)
    assert with_graph.tokens == without.tokens


@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
def test_gpu_gpt_oss_logits_do_not_depend_on_chunks_or_cache(oss, moe_layout):
    """Invariant 4, in either MoE layout: chunk size and cache size (64 MiB, or one slot more than a chunk
    borrows) leave the logits' bytes."""
    path = oss("mxfp4")
    slot = gpu(path, expert_cache="all").spec["slot_bytes"]
    ref_out = None
    for prefill in (64, 7, 40):
        region = strata.ModelInfo(path, moe_layout=moe_layout).layout(prefill, True)["slots"]
        for cache in (64, f"{(region + 1) * slot}b"):
            out = gpu(path, prefill=prefill, expert_cache=cache, moe_layout=moe_layout).logits(PROMPT)
            if ref_out is None:
                ref_out = out
            assert np.array_equal(out, ref_out), (prefill, cache)


@pytest.mark.parametrize("cache", ["all", "device"])
def test_gpu_gpt_oss_batched_decode_rows_equal_alone(oss, cache):
    """gpt-oss's batched decode steps (its sliding and full layers, sinks; the steps from the second
    on replay one recorded graph whose rows read their positions on the device) give each row the
    bits of its sequence decoded alone, every expert resident or resolved on the device."""
    path = oss("mxfp4")
    kw = dict(expert_cache="all") if cache == "all" else dict(expert_cache=64, source="host")
    m = gpu(path, ctx=3 * 128, seqs=3, **kw)
    prompts = [PROMPT[: 8 + 9 * i] for i in range(3)]  # past the window and not
    conts = [[(31 * i + 7 * j) % 500 + 3 for j in range(5)] for i in range(3)]
    alone = []
    for i, (p, c) in enumerate(zip(prompts, conts, strict=True)):
        m.logits(p, seq=i)
        alone.append(np.concatenate([m.decode_batch([t], [len(p) + j], [i]) for j, t in enumerate(c)]))
    for i, p in enumerate(prompts):
        m.logits(p, seq=2 - i)
    together = np.stack([m.decode_batch([conts[i][j] for i in range(3)], [len(prompts[i]) + j for i in range(3)],
                                        [2 - i for i in range(3)]) for j in range(5)], axis=1)
    for i in range(3):
        assert np.array_equal(together[i].view(np.uint32), alone[i].view(np.uint32)), i
    assert m._m.batch_steps == {"replayed": 4, "op_by_op": 1}
