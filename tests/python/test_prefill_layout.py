"""Invariant 1 (exact sizing) and 2 (one plan, one choice) of DESIGN.md, over random shapes.

Prefill::layout is the one ordered list of buffer specs that both bytes_needed and carve derive
from; _core.prefill_layout exposes it for an arbitrary shape with no model, so it is swept here
over thousands of shapes and chunk sizes (T from 1 to 65536, log-uniform).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import strata
from strata import _core

ALIGN = 256
DTYPE_BYTES = {"f32": 4, "i32": 4}
# ggml type ids of the expert quant types strata computes with: the full list.
SUPPORTED_TYPES = sorted(tid for tid, _, _, _ in _core.quant_types())
Q8_TYPES = {t for t in SUPPORTED_TYPES if _core.has_matmul_q8(t)}  # weight types with an integer kernel


def attention_scratch(heads: int, kv_heads: int, head_dim: int) -> list[tuple[str, str, list[int]]]:
    """The attention block's buffers (model/blocks.cpp declare_attention), qwen3moe's scratch list."""
    return [("attn.q", "f32", [heads, head_dim]), ("attn.k", "f32", [kv_heads, head_dim]),
            ("attn.v", "f32", [kv_heads, head_dim]), ("attn.out", "f32", [heads * head_dim])]


def scratch_of(shape: dict) -> list:
    """The architecture's scratch list of a shape: given, or the attention block's of its heads."""
    if "scratch" in shape:
        return shape["scratch"]
    return attention_scratch(shape["heads"], shape["kv_heads"], shape["head_dim"])


def prefill_layout(shape: dict, T: int, src: bool) -> dict:
    """_core.prefill_layout with the shape's optional keys filled: one stream, Q4_K experts, GR fused,
    the attention block's scratch for the shape's heads, the default MoE layout (MMQ with a source too;
    streamed_fused=True: fused there, as strata.Model(moe_layout='fused'))."""
    full = {"HC": 1, "expert_types": [12, 12, 12], "unfused": False, **shape, "scratch": scratch_of(shape)}
    return _core.prefill_layout(full, T, src)


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def q8_0_bytes(shape: list[int], D: int) -> int:
    """q8_0: 34 bytes (fp16 scale + 32 int8) per 32 values. The plan writes the last dimension either
    in values (== D) or already in bytes per row (== D / 32 * 34); both must give the same bytes."""
    rows = math.prod(shape[:-1])
    last = shape[-1]
    if last == D:
        return rows * D // 32 * 34
    assert last == D // 32 * 34, f"q8_0 last dim {last} is neither D={D} values nor {D // 32 * 34} bytes"
    return rows * last


@st.composite
def shapes(draw):
    HC = draw(st.sampled_from([1, 4]))
    D = 32 * draw(st.integers(1, 256))  # 32 .. 8192
    E = draw(st.integers(1, 256))
    K = draw(st.integers(1, min(E, 16)))
    F = 32 * draw(st.integers(1, 256))
    kv_heads = draw(st.integers(1, 16))
    heads = kv_heads * draw(st.integers(1, 8))
    head_dim = 2 * draw(st.integers(8, 128))  # even, 16 .. 256
    # (gate, up, down) per layer, drawn independently: a mix of integer and float kernels
    types = [draw(st.sampled_from(SUPPORTED_TYPES)) for _ in range(3 * draw(st.integers(1, 2)))]
    return dict(
        D=D,
        HC=HC,
        E=E,
        K=K,
        F=F,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        expert_types=types,
        unfused=draw(st.booleans()),
        streamed_fused=draw(st.booleans()),
    )


@st.composite
def chunk_tokens(draw):
    # log-uniform in [1, 65536], plus the alignment edges
    if draw(st.booleans()):
        return draw(st.sampled_from([1, 2, 3, 7, 8, 63, 64, 65, 255, 256, 257, 4095, 4096, 4097, 65535, 65536]))
    x = draw(st.floats(0.0, 16.0, allow_nan=False))
    return max(1, min(65536, round(2.0**x)))


def check_plan(shape: dict, T: int, src: bool, plan: dict) -> None:
    D, HC, E, K, F = shape["D"], shape["HC"], shape["E"], shape["K"], shape["F"]
    assert plan["tokens"] == T
    assert plan["source"] == src
    # kind: fused iff an ExpertSource streams the experts and the shape asks for fused there (every type
    # here supports fused); MMQ otherwise, the default with a source too
    assert plan["kind"] == ("fused" if src and shape.get("streamed_fused", False) else "mmq"), plan["kind"]
    bufs = plan["buffers"]
    names = [b["name"] for b in bufs]
    assert len(set(names)) == len(names), f"duplicate buffer names {names}"

    total = 0
    prev_end = 0
    for b in bufs:
        off, n = b["offset"], b["bytes"]
        assert off % ALIGN == 0, f"{b['name']} offset {off} not {ALIGN}-aligned"
        # carve order == offset order, disjoint, each buffer at the aligned end of the previous one
        assert off == prev_end, f"{b['name']} at {off}, previous buffer ends (aligned) at {prev_end}"
        assert n > 0, f"{b['name']} is empty"
        # bytes == product(shape) * dtype size
        if b["dtype"] == "q8_0":
            # q8_0 rows hold the gate/up input (D) and later the down input (F): max(D, F) wide
            # (only the widths of the matrices that use the integer kernel).
            want = math.prod(b["shape"])
        else:
            assert b["dtype"] in DTYPE_BYTES, f"unknown dtype {b['dtype']}"
            want = math.prod(b["shape"]) * DTYPE_BYTES[b["dtype"]]
        assert n == want, f"{b['name']}: bytes {n} != shape {b['shape']} x {b['dtype']} = {want}"
        assert 0 <= off and off + n <= plan["bytes_needed"], f"{b['name']} [{off}, {off + n}) outside the region"
        prev_end = off + align_up(n)
        total += align_up(n)
    # bytes_needed == sum of aligned sizes == end of the last (aligned) buffer: nothing counted and unused
    assert plan["bytes_needed"] == total
    assert plan["bytes_needed"] == prev_end
    assert plan["bytes_needed"] % ALIGN == 0

    by = {b["name"]: b for b in bufs}
    # grs always carved, T x HC; xn only in the unfused GR mode, T x D
    assert "grs" in by
    assert list(by["grs"]["shape"]) == [T, HC]
    assert ("xn" in by) == bool(shape["unfused"]), names
    if shape["unfused"]:
        assert list(by["xn"]["shape"]) == [T, D]
    assert list(by["R"]["shape"]) == [T, HC, D]
    assert list(by["router.logits"]["shape"]) == [T, E]
    assert list(by["router.ids"]["shape"]) == [T, K]
    assert list(by["moe.offsets"]["shape"]) == [E + 1]
    assert math.prod(by["moe.rows"]["shape"]) == T * K
    # the MoE buffers of the layout that was chosen, and only those
    if plan["kind"] == "fused":
        assert "moe.x" in by and "moe.xq" not in by
        # one expert at a time: at most T tokens route to it; a decode step runs its K experts at once
        rows = max(T, K)
    else:
        # Weights with an integer kernel read q8_0 rows; float weights read float rows (never quantized).
        types = shape["expert_types"]
        q8_gu = any(t in Q8_TYPES for i, t in enumerate(types) if i % 3 != 2)
        float_gu = any(t not in Q8_TYPES for i, t in enumerate(types) if i % 3 != 2)
        q8_down = any(t in Q8_TYPES for i, t in enumerate(types) if i % 3 == 2)
        assert ("moe.xq" in by) == (q8_gu or q8_down), names
        assert ("moe.x" in by) == float_gu, names
        if q8_gu or q8_down:
            width = max(D if q8_gu else 0, F if q8_down else 0)
            assert by["moe.xq"]["bytes"] == T * K * width // 32 * 34
        if float_gu:
            assert list(by["moe.x"]["shape"]) == [T * K, D]
        rows = T * K
    assert list(by["moe.gate"]["shape"]) == [rows, F]
    assert list(by["moe.up"]["shape"]) == [rows, F]
    assert list(by["moe.down"]["shape"]) == [rows, D]
    # the architecture's buffers: T rows of their dims each, in the order of its list, after R, grs, xn
    scratch = scratch_of(shape)
    first = 3 if shape["unfused"] else 2
    assert names[first:first + len(scratch)] == [n for n, _, _ in scratch], names
    for name, dtype, row in scratch:
        assert list(by[name]["shape"]) == [T, *row] and by[name]["dtype"] == dtype, by[name]
    # slots, where a slot size is given (a model's layout; prefill_layout has none)
    if plan.get("slot_bytes"):
        assert plan["slots"] == -(-plan["bytes_needed"] // plan["slot_bytes"])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes(), T=chunk_tokens(), src=st.booleans())
@example(
    shape=dict(D=32, HC=1, E=1, K=1, F=32, heads=1, kv_heads=1, head_dim=16, expert_types=[12, 12, 12], unfused=False,
               streamed_fused=True),
    T=1,
    src=True,
)
@example(
    shape=dict(D=32, HC=1, E=1, K=1, F=32, heads=1, kv_heads=1, head_dim=16, expert_types=[12, 12, 12], unfused=False,
               streamed_fused=False),
    T=1,
    src=True,
)
@example(
    shape=dict(
        D=8192, HC=4, E=256, K=16, F=8192, heads=128, kv_heads=16, head_dim=256, expert_types=[12, 12, 12], unfused=True
    ),
    T=65536,
    src=False,
)
def test_plan_exact(shape, T, src):
    plan = prefill_layout(shape, T, src)
    check_plan(shape, T, src, plan)
    # monotone in T: a chunk one token longer never needs less
    if T < 65536:
        nxt = prefill_layout(shape, T + 1, src)
        assert plan["bytes_needed"] <= nxt["bytes_needed"]


@settings(max_examples=50, deadline=None)
@given(shape=shapes(), T=chunk_tokens())
def test_unfused_and_hc_only_add(shape, T):
    """The unfused GR mode carves exactly one extra T x D f32 buffer (xn, aligned) and nothing else."""
    for src in (True, False):
        fused = prefill_layout({**shape, "unfused": False}, T, src)
        unf = prefill_layout({**shape, "unfused": True}, T, src)
        assert unf["bytes_needed"] - fused["bytes_needed"] == align_up(T * shape["D"] * 4)
        assert [b["name"] for b in unf["buffers"] if b["name"] != "xn"] == [b["name"] for b in fused["buffers"]]


@st.composite
def scratch_lists(draw):
    n = draw(st.integers(0, 12))
    names = draw(st.lists(st.text("abcdefgh.", min_size=1, max_size=8), min_size=n, max_size=n, unique=True))
    return [(f"x.{name}", draw(st.sampled_from(["f32", "i32"])),
             draw(st.lists(st.integers(1, 300), min_size=0, max_size=3))) for name in names]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes(), scratch=scratch_lists(), T=chunk_tokens(), src=st.booleans())
def test_any_scratch_list_exact(shape, scratch, T, src):
    """Any list an architecture declares is sized and carved with the rest, exactly."""
    shape = {**shape, "scratch": scratch}
    check_plan(shape, T, src, prefill_layout(shape, T, src))


@pytest.mark.parametrize("bad", [[("x", "f32", [0])], [("", "f32", [4])], [("x", "f16", [4])],
                                 [("proj", "f32", [4])], [("x", "f32", [4]), ("x", "i32", [2])]])
def test_bad_scratch_rejected(bad):
    shape = dict(D=256, E=8, K=2, F=256, scratch=bad)
    with pytest.raises(strata.ConfigError):
        prefill_layout(shape, 16, True)


def test_layout_kind_needs_supported_types():
    """With no expert type the fused path supports, even a streamed run asking for fused uses the MMQ
    layout (and says so)."""
    shape = dict(D=256, E=8, K=2, F=256, heads=4, kv_heads=2, head_dim=32, expert_types=[], streamed_fused=True)
    assert prefill_layout(shape, 16, True)["kind"] == "mmq"
    assert prefill_layout(shape, 16, False)["kind"] == "mmq"


@pytest.mark.parametrize(
    "bad", [dict(D=0), dict(E=0), dict(K=9), dict(F=0), dict(heads=0), dict(head_dim=0), dict(HC=0)]
)
def test_shape_out_of_range(bad):
    shape = dict(D=256, E=8, K=2, F=256, heads=4, kv_heads=2, head_dim=32, **{})
    shape.update(bad)
    with pytest.raises(strata.ConfigError):
        prefill_layout(shape, 16, True)


def test_zero_tokens_rejected():
    shape = dict(D=256, E=8, K=2, F=256, heads=4, kv_heads=2, head_dim=32)
    with pytest.raises(strata.ConfigError):
        prefill_layout(shape, 0, True)


@pytest.mark.parametrize("mix", ["f32", "q4_k"])
@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
def test_model_layout_matches_shape_plan(make_mix, mix, moe_layout):
    """m.layout is the same plan as prefill_layout on the model's shape and MoE layout, with
    slots = ceil(bytes / slot)."""
    path = make_mix(mix)
    m = strata.Model(path, expert_cache="all", prefill=64, ctx=256, progress=False, moe_layout=moe_layout)
    s = m.spec
    by_name = {t["name"]: t["type"] for t in strata.inspect(path)["tensors"]}
    types = [by_name[f"blk.{i}.ffn_{w}_exps.weight"] for i in range(s["layers"]) for w in ("gate", "up", "down")]
    shape = dict(
        D=s["hidden"],
        HC=1,
        E=s["experts"],
        K=s["top_k"],
        F=s["expert_ffn"],
        heads=s["heads"],
        kv_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        expert_types=types,
        unfused=False,
        streamed_fused=moe_layout == "fused",
    )
    for T in (1, 2, 17, 64, 255, 256, 257, 4096):
        for src in (True, False):
            got = m.layout(T, src)
            want = prefill_layout(shape, T, src)
            check_plan(shape, T, src, got)
            assert got["bytes_needed"] == want["bytes_needed"]
            assert got["buffers"] == want["buffers"]
            assert got["slot_bytes"] == s["slot_bytes"] > 0
            assert got["slot_bytes"] % ALIGN == 0
            assert got["slots"] == -(-got["bytes_needed"] // got["slot_bytes"])
