"""The CUDA backend end to end (pytest -m gpu; skipped without a GPU): logits against the CPU backend
and against transformers on every test mix, greedy tokens, and invariant 4 on the GPU.
Bounds: gpu_common's, which say why.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import reference_logits as ref
import strata
from gpu_common import F16_KV_VS_CPU, F32_KV_VS_CPU, MMQ_VS_CPU, has_gpu, rel
from hf_reference import OUT as HF_OUT
from hf_reference import file_sha
from strata.testing import make_qwen3moe

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)

HF = np.load(HF_OUT)
PROMPT = [int(x) for x in HF["prompt"]]


@pytest.fixture(scope="module")
def mix_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-mixes")
    made: dict[str, str] = {}

    def get(mix: str) -> str:
        if mix not in made:
            shape, quant = ref.MIXES[mix]
            made[mix] = str(d / f"{mix}.gguf")
            make_qwen3moe(made[mix], **shape, quant=quant, seed=ref.SEED)
            # The transformers reference was computed on a file with exactly these bytes.
            assert file_sha(made[mix]) == bytes(HF[f"{mix}/sha256"]).hex()
        return made[mix]

    return get


def gpu(path: str, **kw) -> strata.Model:
    kw.setdefault("ctx", 64)
    return strata.Model(path, device="cuda", progress=False, **kw)


@pytest.mark.parametrize("mix", list(ref.MIXES))
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_gpu_logits_match_cpu_and_transformers(mix_path, mix, kv):
    """The fused layout (a bounded cache under moe_layout="fused": float products of exactly dequantized
    weights) against the CPU's and transformers' float logits."""
    path = mix_path(mix)
    fused = dict(expert_cache=64, prefill=16, moe_layout="fused")
    cpu = strata.Model(path, device="cpu", ctx=64, progress=False, **fused).logits(PROMPT)
    m = gpu(path, kv_type=kv, **fused)
    assert m.device == "cuda" and m.layout(16)["kind"] == "fused"
    out = m.logits(PROMPT)
    e_cpu, e_hf = rel(out, cpu), rel(out, HF[f"{mix}/logits"])
    print(f"{mix} kv={kv}: vs cpu {e_cpu:.2e}, vs transformers {e_hf:.2e}")
    assert e_cpu <= (F32_KV_VS_CPU if kv == "f32" else F16_KV_VS_CPU)
    assert e_hf <= (F32_KV_VS_CPU if kv == "f32" else F16_KV_VS_CPU) + rel(cpu, HF[f"{mix}/logits"])


@pytest.mark.parametrize("mix", list(ref.MIXES))
def test_gpu_mmq_layout_matches_cpu_mmq(mix_path, mix):
    path = mix_path(mix)
    cpu = strata.Model(path, device="cpu", expert_cache="all", prefill=16, ctx=64, progress=False).logits(PROMPT)
    out = gpu(path, expert_cache="all", prefill=16, kv_type="f32").logits(PROMPT)
    e = rel(out, cpu)
    print(f"{mix} MMQ: vs cpu {e:.2e}")
    assert e <= (MMQ_VS_CPU if mix not in ("f32", "f16") else F32_KV_VS_CPU)


@pytest.mark.parametrize("mix", ["f32", "f16"])
def test_gpu_greedy_tokens_match_cpu_with_f32_kv(mix_path, mix):
    path = mix_path(mix)
    want = strata.Model(path, device="cpu", ctx=128, progress=False).generate(PROMPT[:8], max_tokens=32, temperature=0)
    got = gpu(path, ctx=128, kv_type="f32").generate(PROMPT[:8], max_tokens=32, temperature=0)
    assert got.tokens == want.tokens


@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
def test_gpu_logits_do_not_depend_on_memory(mix_path, moe_layout):
    """Invariant 4 on the GPU, in either MoE layout: cache size, source, chunk size and GR mode leave the
    logits' bytes. A prompt runs its matmuls on tensor cores whatever the chunk's token count (decode on
    GEMV), and a row's result does not depend on the chunk it sat in (the op harness checks each kernel)."""
    path = mix_path("q4_k")
    probe = gpu(path, expert_cache="all")
    slot = probe.spec["slot_bytes"]
    ref_out = None
    for unfused, prefill, source in itertools.product((False, True), (7, 64, 40), ("host", "mmap")):
        info = strata.ModelInfo(path, gr_unfused=unfused, moe_layout=moe_layout)
        region = info.layout(min(prefill, 64), True)["slots"]
        for cache in (f"{(region + 1) * slot}b", 64):
            m = gpu(path, expert_cache=cache, prefill=prefill, source=source, gr_unfused=unfused, kv_type="f16",
                    moe_layout=moe_layout)
            out = m.logits(PROMPT)
            if ref_out is None:
                ref_out = out
            assert np.array_equal(out, ref_out), (unfused, prefill, source, cache)


def test_gpu_streams_each_expert_once_per_layer_per_chunk(mix_path):
    path = mix_path("q4_k")
    probe = gpu(path, expert_cache="all")
    slot = probe.spec["slot_bytes"]
    n = probe.info.layout(16, True)["slots"] + 3
    m = gpu(path, expert_cache=f"{n * slot}b", prefill=16, source="host")
    m._m.set_trace(True)
    m.logits(PROMPT)
    streams = [(i, ly, e) for i, ly, e, r in m._m.trace() if not r]
    assert len(streams) == len(set(streams))
    assert m.cache["misses"] == len(streams) > 0


def test_gpu_expert_cache_auto_and_describe(mix_path):
    m = gpu(mix_path("q8_0"))
    assert "free" in m.backend.describe()
    assert m.cache["all_resident"]  # a tiny model fits: every expert resident
    st = m.generate("hello", max_tokens=2, temperature=0).stats
    assert st["device"].startswith("cuda: ") and "free of" in st["device"], st["device"]
    assert "on the CPU" not in st["decode_path"]
    # strata info answers from the load's own plan on the GPU too (auto against its free memory)
    plan = strata.ModelInfo(mix_path("q8_0")).load_plan(expert_cache="auto", device="cuda", backend=m.backend)
    assert plan["device"] == "cuda" and plan["fits"] and plan["all_resident"] == m.cache["all_resident"]


@pytest.mark.parametrize("source", ["host", "mmap"])
def test_gpu_streamed_mmq_matches_all_resident(mix_path, source):
    """The default MoE layout (auto, as moe_layout='mmq') on the GPU: a bounded cache (thrashing, and some
    experts resident) runs the q8_0 expert products of a load with every expert resident, so its prompt logits,
    its greedy tokens (decode resolved on the device from the host source, its misses written through, on the
    host from mmap) and the logits after them are that load's bit for bit."""
    path = mix_path("q4_k")
    full = gpu(path, expert_cache="all", ctx=128, kv_type="f16")
    want = full.logits(PROMPT)
    want_tokens = full.generate(PROMPT[:8], max_tokens=24, temperature=0).tokens
    want_after = full.logits(PROMPT[:8] + want_tokens[:8])
    info = strata.ModelInfo(path)
    plan = info.layout(16, True)
    assert plan["kind"] == "mmq"
    for extra in (1, info.spec["top_k"] + 2):
        m = gpu(path, expert_cache=f"{(plan['slots'] + extra) * plan['slot_bytes']}b", prefill=16, ctx=128,
                source=source, kv_type="f16")
        assert m.layout(m.chunk, True)["kind"] == "mmq" and not m.cache["all_resident"]
        out = m.logits(PROMPT)
        assert m.cache["misses"] > 0
        assert np.array_equal(out, want), (source, extra, rel(out, want))
        got = m.generate(PROMPT[:8], max_tokens=24, temperature=0).tokens
        if extra > 1:  # room for a token's experts: resolved on the device from the host source, misses written
            # through by the q8_0 products; the mmap source (no device view) on the host
            assert m._m.decode_resolution == ("device" if source == "host" else "host")
            assert m._m.decode_write_through == (source == "host")
        assert got == want_tokens, (source, extra)
        assert np.array_equal(m.logits(PROMPT[:8] + got[:8]), want_after), (source, extra)


@pytest.mark.parametrize("mix", ["q4_k", "f16"])
def test_gpu_decode_graph_matches_op_by_op(mix_path, mix):
    """A decode step replayed from one recorded CUDA graph (every expert resident) computes what the
    same step queued op by op does: sampled tokens (temperature 1, seeded: any change of the
    probabilities shows) are identical, over positions the recording never saw."""
    path = mix_path(mix)
    kw = dict(max_tokens=40, temperature=1.0, seed=7)
    g = gpu(path, expert_cache="all", ctx=128)
    with_graph = g.generate(PROMPT[:8], **kw)
    assert g._m.decode_graph_active
    plain = gpu(path, expert_cache="all", ctx=128, decode_graph=False)
    without = plain.generate(PROMPT[:8], **kw)
    assert not plain._m.decode_graph_active
    assert with_graph.tokens == without.tokens
    assert g.cache["hits"] > 0 and g.cache["misses"] == 0


@pytest.mark.parametrize("source", ["host", "mmap"])
@pytest.mark.parametrize("policy", ["lru", "scan"])
def test_gpu_bounded_cache_decode_device_and_host_resolution_match(mix_path, source, policy):
    """A bounded cache's decode resolved on the GPU (design (b): resolve_experts and the zero-copy
    fill, replayed as one graph) and on the host (design (a)) choose the same slots under either policy
    that runs on the device: the same tokens, stats and slot table, as a cache holding every expert gives
    the same tokens. The mmap source cannot be read by kernels, so there both run design (a)."""
    path = mix_path("q4_k")
    probe = gpu(path, expert_cache="all")
    slot = probe.spec["slot_bytes"]
    region = probe.info.layout(16, True)["slots"]
    kw = dict(max_tokens=24, temperature=1.0, seed=3)
    big = gpu(path, expert_cache=64, prefill=16, source=source).generate(PROMPT[:8], **kw)
    runs = {}
    for how in ("device", "host"):
        m = gpu(path, expert_cache=f"{(region + probe.spec['top_k'] + 1) * slot}b", prefill=16, source=source,
                decode_resolve="auto" if how == "device" else "host", cache_policy=policy)
        want = "device" if how == "device" and source == "host" else "host"
        assert m._m.decode_resolution == want
        out = m.generate(PROMPT[:8], **kw)
        assert m._m.decode_graph_active == (want == "device")
        c = m.cache
        runs[how] = (out.tokens, c["hits"], c["misses"], c["bytes_streamed"], m._m.slot_index())
        assert out.tokens == big.tokens
        assert c["misses"] > 0
    assert runs["device"] == runs["host"]


@pytest.mark.parametrize("cache", ["all", "host", "device", "device-scan", "per-expert"])
def test_gpu_batched_decode_rows_equal_alone(mix_path, cache):
    """A batched decode step on the GPU (Phase::Decode keeps every matmul on GEMV, whose rows do not
    depend on the token count; each row's attention runs alone) gives each row the bits of its
    sequence decoded alone (whose step replays the region's recorded graph where it can), with the
    f16 KV cache, every expert resident or a bounded cache resolved on the device (LRU or scan), on the
    host or expert by expert. Where the experts are found on the device (all resident, or resolved there)
    the batch's steps from the second on replay one recorded graph (the same four regions, named in
    two orders), whose rows read their positions on the device: still each row's bits alone."""
    path = mix_path("q4_k")
    probe = gpu(path, expert_cache="all")
    slot, E = probe.spec["slot_bytes"], probe.spec["experts"]
    region = probe.info.layout(16, True)["slots"]
    kw = dict(expert_cache="all") if cache == "all" else dict(
        expert_cache=f"{(region + (E if cache != 'per-expert' else 2) + 1) * slot}b", prefill=16, source="host",
        decode_resolve="host" if cache == "host" else "auto", cache_policy="scan" if cache == "device-scan" else "lru")
    m = gpu(path, ctx=4 * 64, seqs=4, **kw)
    prompts = [PROMPT[: 5 + 3 * i] for i in range(4)]
    conts = [[int(x) for x in np.random.default_rng(i).integers(0, m.spec["vocab"], 6)] for i in range(4)]
    alone = []
    for i, (p, c) in enumerate(zip(prompts, conts, strict=True)):
        m.logits(p, seq=i)
        alone.append(np.concatenate([m.decode_batch([t], [len(p) + j], [i]) for j, t in enumerate(c)]))
    for i, p in enumerate(prompts):
        m.logits(p, seq=3 - i)
    together: list[list[np.ndarray]] = [[] for _ in prompts]
    for j in range(6):
        order = [2, 0, 3, 1] if j % 2 else [0, 1, 2, 3]
        lg = m.decode_batch([conts[i][j] for i in order], [len(prompts[i]) + j for i in order], [3 - i for i in order])
        for r, i in enumerate(order):
            together[i].append(lg[r])
    for i in range(4):
        assert np.array_equal(np.array(together[i]).view(np.uint32), alone[i].view(np.uint32)), i
    steps = m._m.batch_steps
    replays = cache in ("all", "device", "device-scan")
    assert steps == ({"replayed": 5, "op_by_op": 1} if replays else {"replayed": 0, "op_by_op": 6})


def test_gpu_batched_decode_graph_regions_change(mix_path):
    """The recorded batched steps across changing sets of regions (rows leaving and joining, as a
    server's clients do): every step's rows equal decode_graph=False's bits, each set recorded the
    second step in a row it decodes."""
    path = mix_path("q4_k")
    logs = {}
    for graph in (True, False):
        m = gpu(path, ctx=4 * 64, seqs=4, expert_cache="all", decode_graph=graph)
        for i in range(4):
            m.logits(PROMPT[: 4 + i], seq=i)
        pos = [4 + i for i in range(4)]
        sets = [[0, 1, 2, 3]] * 3 + [[1, 3]] * 3 + [[0, 1, 2, 3]] * 2 + [[3, 2, 0]] * 3
        out = []
        for j, seqs in enumerate(sets):
            lg = m.decode_batch([(7 * j + r) % 50 + 1 for r in seqs], [pos[r] for r in seqs], seqs)
            for r in seqs:
                pos[r] += 1
            out.append(lg)
        logs[graph] = (out, m._m.batch_steps)
    for a, b in zip(logs[True][0], logs[False][0], strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    # Recorded at the second step of each set (the set of four once: it comes back recorded).
    assert logs[True][1] == {"replayed": 8, "op_by_op": 3}
    assert logs[False][1] == {"replayed": 0, "op_by_op": 11}


@pytest.mark.parametrize("cache", ["all", "host"])
def test_gpu_prompts_in_one_pass_equal_alone(mix_path, cache):
    """Several prompts in one pass on the GPU (Model.forward_rows: rows of four regions, split across
    passes of 16 rows) give each prompt the bits it gets alone, and leave the KV it leaves alone (the
    next decode step's bits), every expert resident or a bounded cache that streams."""
    path = mix_path("q4_k")
    probe = gpu(path, expert_cache="all")
    slot, E = probe.spec["slot_bytes"], probe.spec["experts"]
    region = probe.info.layout(16, True)["slots"]
    kw = dict(expert_cache="all", prefill=16) if cache == "all" else dict(
        expert_cache=f"{(region + E + 1) * slot}b", prefill=16, source="host")
    m = gpu(path, ctx=4 * 64, seqs=4, **kw)
    prompts = [PROMPT[: 5 + 4 * i] for i in range(4)]  # 38 rows: three passes
    nxt = [5, 6, 7, 8]
    alone = [m.logits(p, seq=0)[-1] for p in prompts]
    step_alone = []  # the decode step after each prompt alone: decode rows are bit-equal alone or batched
    for p, t in zip(prompts, nxt, strict=True):
        m.logits(p, seq=0)
        step_alone.append(m.decode_batch([t], [len(p)], [0])[0])
    ids, pos, seqs, pick = [], [], [], []
    for i, p in enumerate(prompts):
        ids += p
        pos += list(range(len(p)))
        seqs += [3 - i] * len(p)
        pick.append(len(ids) - 1)
    got = m._m.prompt_rows(ids, pos, seqs, pick)
    step = m.decode_batch(nxt, [len(p) for p in prompts], [3 - i for i in range(4)])
    for i in range(4):
        assert np.array_equal(got[i].view(np.uint32), alone[i].view(np.uint32)), i
        assert np.array_equal(step[i].view(np.uint32), step_alone[i].view(np.uint32)), i
    # generate_batch runs the four prompts in one pass: the tokens of generate() alone.
    kw_gen = dict(max_tokens=5, temperature=0, ignore_eos=True)
    assert [g.tokens for g in m.generate_batch(prompts, **kw_gen)] == [m.generate(p, **kw_gen).tokens for p in prompts]


# Issue 19's mixes: the types real files put together (conftest.MIXES; their CPU logits are checked against
# transformers in test_vs_transformers.py, with float and q8_0 activations).
REAL_MIXES = ["ud-q4_k_xl", "gpt-oss", "q3_k_m", "iq4_xs", "legacy", "q2_k", "ud-iq1_s", "ud-iq3_xxs"]


@pytest.mark.parametrize("mix", REAL_MIXES)
def test_gpu_real_file_mixes_match_cpu(tmp_path_factory, mix):
    """Each mix on the GPU against the CPU: streamed experts under moe_layout="fused" (the fused layout: the
    device decoders feed the float tiles and GEMVs) with the f32 and the f16 KV cache, and every expert
    resident (the MMQ layout: q8_0 activations, the integer tiles). The files route every token to all of
    their experts: with top-k of them, random weights have routing near-ties that the GPU's fp16 tiles can
    flip, a discontinuity no rounding bound covers (test_gpu_archs.py measured it); what is left is
    gpu_common's rounding."""
    import conftest

    shape, quant = conftest.MIXES[mix]
    path = str(tmp_path_factory.mktemp("gpu-real-mixes") / f"{mix}.gguf")
    make_qwen3moe(path, **{**shape, "top_k": shape["experts"]}, quant=quant, seed=conftest.SEED)
    prompt = PROMPT[:40]
    fused = dict(expert_cache=64, prefill=16, moe_layout="fused")
    want = strata.Model(path, device="cpu", ctx=64, progress=False, **fused).logits(prompt)
    for kv, bound in (("f32", F32_KV_VS_CPU), ("f16", F16_KV_VS_CPU)):
        m = gpu(path, kv_type=kv, **fused)
        assert m.layout(16)["kind"] == "fused"
        e = rel(m.logits(prompt), want)
        print(f"{mix} kv={kv}: vs cpu {e:.2e}")
        assert e <= bound
    want = strata.Model(path, device="cpu", expert_cache="all", prefill=16, ctx=64, progress=False).logits(prompt)
    e = rel(gpu(path, expert_cache="all", prefill=16, kv_type="f32").logits(prompt), want)
    print(f"{mix} MMQ: vs cpu {e:.2e}")
    assert e <= MMQ_VS_CPU
