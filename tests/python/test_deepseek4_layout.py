"""Invariants 1 and 2 of DESIGN.md for DeepSeek V4's prompt scratch: over random V4-style shapes (HC 4,
low-rank Q, grouped output, compressors of one or two lanes, an indexer), bytes_needed is exactly what
carve hands out, every buffer aligned and sized by its shape; the unfused GR mode adds only xn; a V4
file's plan is the shape plan."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import strata
from strata.testing import make_deepseek4
from test_prefill_layout import SUPPORTED_TYPES, align_up, check_plan, chunk_tokens
from test_prefill_layout import prefill_layout as plain_layout


def v4_scratch(shape: dict) -> list[tuple[str, str, list[int]]]:
    """DeepSeek V4's scratch list as model/deepseek4_spec.cpp's ds4_scratch declares it."""
    v, HC, hd, H = shape["v4"], shape["HC"], shape["head_dim"], shape["heads"]
    out = [("hc.mix", "f32", [(2 + HC) * HC]), ("hc.post", "f32", [HC]), ("hc.comb", "f32", [HC, HC]),
           ("tokens", "i32", []), ("attn.qa", "f32", [v["q_lora"]]), ("attn.q", "f32", [H, hd]),
           ("attn.kv", "f32", [hd]), ("attn.out", "f32", [H, hd]), ("attn.oa", "f32", [v["o_groups"] * v["o_lora"]])]
    if v["comp_lanes"]:
        out += [("comp.kv", "f32", [v["comp_lanes"] * hd]), ("comp.score", "f32", [v["comp_lanes"] * hd])]
    if v["idx_heads"]:
        out += [("index.kv", "f32", [2 * v["idx_dim"]]), ("index.score", "f32", [2 * v["idx_dim"]]),
                ("index.q", "f32", [v["idx_heads"], v["idx_dim"]]), ("index.w", "f32", [v["idx_heads"]]),
                ("index.sel", "i32", [v["idx_topk"]])]
    out += [("shexp.gate", "f32", [v["shared_ffn"]]), ("shexp.up", "f32", [v["shared_ffn"]]),
            ("shexp.out", "f32", [shape["D"]])]
    return out


def prefill_layout(shape: dict, T: int, src: bool) -> dict:
    return plain_layout({**shape, "scratch": v4_scratch(shape)}, T, src)


def with_scratch(shape: dict) -> dict:
    return {**shape, "scratch": v4_scratch(shape)}


@st.composite
def v4_shapes(draw):
    groups = draw(st.integers(1, 8))
    heads = groups * draw(st.integers(1, 8))
    lanes = draw(st.sampled_from([0, 1, 2]))
    indexer = lanes == 2
    types = [draw(st.sampled_from(SUPPORTED_TYPES)) for _ in range(3 * draw(st.integers(1, 2)))]
    return dict(
        D=32 * draw(st.integers(1, 128)), HC=4, E=(E := draw(st.integers(1, 256))), K=draw(st.integers(1, min(E, 8))),
        F=32 * draw(st.integers(1, 64)), heads=heads, kv_heads=1, head_dim=2 * draw(st.integers(8, 256)),
        expert_types=types, unfused=draw(st.booleans()), streamed_fused=draw(st.booleans()),
        v4=dict(q_lora=draw(st.integers(1, 1536)), o_groups=groups, o_lora=draw(st.integers(1, 1024)),
                comp_lanes=lanes, idx_heads=draw(st.integers(1, 64)) if indexer else 0,
                idx_dim=draw(st.integers(16, 256)) if indexer else 0,
                idx_topk=draw(st.integers(1, 1024)) if indexer else 0, shared_ffn=32 * draw(st.integers(1, 64))),
    )


def check_v4(shape: dict, T: int, plan: dict) -> None:
    by = {b["name"]: b for b in plan["buffers"]}
    v, HC, hd, H = shape["v4"], shape["HC"], shape["head_dim"], shape["heads"]
    want = {
        "hc.mix": [T, (2 + HC) * HC], "hc.post": [T, HC], "hc.comb": [T, HC, HC], "tokens": [T],
        "attn.qa": [T, v["q_lora"]], "attn.q": [T, H, hd], "attn.kv": [T, hd], "attn.out": [T, H, hd],
        "attn.oa": [T, v["o_groups"] * v["o_lora"]], "shexp.gate": [T, v["shared_ffn"]],
        "shexp.up": [T, v["shared_ffn"]], "shexp.out": [T, shape["D"]],
    }
    if v["comp_lanes"]:
        want["comp.kv"] = want["comp.score"] = [T, v["comp_lanes"] * hd]
    if v["idx_heads"]:
        want["index.kv"] = want["index.score"] = [T, 2 * v["idx_dim"]]
        want["index.q"] = [T, v["idx_heads"], v["idx_dim"]]
        want["index.w"] = [T, v["idx_heads"]]
        want["index.sel"] = [T, v["idx_topk"]]
    for name, shp in want.items():
        assert name in by, f"{name} missing from {list(by)}"
        assert list(by[name]["shape"]) == shp, f"{name}: {by[name]['shape']} != {shp}"
    extra = {"attn.k", "attn.v"} & set(by)
    assert not extra, f"a V4 plan carves {extra}"
    assert ("comp.kv" in by) == bool(v["comp_lanes"]) and ("index.sel" in by) == bool(v["idx_heads"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=v4_shapes(), T=chunk_tokens(), src=st.booleans())
def test_v4_plan_exact(shape, T, src):
    plan = prefill_layout(shape, T, src)
    check_plan(with_scratch(shape), T, src, plan)
    check_v4(shape, T, plan)
    if T < 65536:
        assert plan["bytes_needed"] <= prefill_layout(shape, T + 1, src)["bytes_needed"]


@settings(max_examples=50, deadline=None)
@given(shape=v4_shapes(), T=chunk_tokens())
def test_v4_unfused_adds_only_xn(shape, T):
    for src in (True, False):
        fused = prefill_layout({**shape, "unfused": False}, T, src)
        unf = prefill_layout({**shape, "unfused": True}, T, src)
        assert unf["bytes_needed"] - fused["bytes_needed"] == align_up(T * shape["D"] * 4)
        assert [b["name"] for b in unf["buffers"] if b["name"] != "xn"] == [b["name"] for b in fused["buffers"]]


@pytest.mark.parametrize("ratios, lanes", [((0, 4, 128, 4), 2), ((128, 0, 128, 0), 1), ((0, 0, 0, 0), 0)])
def test_v4_model_layout_matches_shape_plan(tmp_path, ratios, lanes):
    """A V4 file's plan is the shape plan of its hyperparameters: the compressor buffers as wide as its
    widest compressor, the indexer's only with a ratio-4 layer; under either MoE layout a load runs."""
    path = str(make_deepseek4(os.path.join(tmp_path, "t.gguf"), seed=1, compress_ratios=ratios))
    s = strata.ModelInfo(path).spec
    by_name = {t["name"]: t["type"] for t in strata.inspect(path)["tensors"]}
    types = [by_name[f"blk.{i}.ffn_{w}_exps.weight"] for i in range(s["layers"]) for w in ("gate", "up", "down")]
    md = strata.inspect(path)["metadata"]
    indexer = 4 in ratios
    shape = dict(D=s["hidden"], HC=4, E=s["experts"], K=s["top_k"], F=s["expert_ffn"], heads=s["heads"], kv_heads=1,
                 head_dim=s["head_dim"], expert_types=types, unfused=False,
                 v4=dict(q_lora=md["deepseek4.attention.q_lora_rank"],
                         o_groups=md["deepseek4.attention.output_group_count"],
                         o_lora=md["deepseek4.attention.output_lora_rank"], comp_lanes=lanes,
                         idx_heads=md["deepseek4.attention.indexer.head_count"] if indexer else 0,
                         idx_dim=md["deepseek4.attention.indexer.key_length"] if indexer else 0,
                         idx_topk=md["deepseek4.attention.indexer.top_k"] if indexer else 0,
                         shared_ffn=s["expert_ffn"]))
    for moe_layout in ("auto", "fused"):
        m = strata.Model(path, expert_cache="all", prefill=64, ctx=256, progress=False, moe_layout=moe_layout)
        shape["streamed_fused"] = moe_layout == "fused"
        for T in (1, 2, 17, 64, 257, 4096):
            for src in (True, False):
                got = m.layout(T, src)
                want = prefill_layout(shape, T, src)
                check_plan(with_scratch(shape), T, src, got)
                check_v4(shape, T, got)
                assert got["buffers"] == want["buffers"] and got["bytes_needed"] == want["bytes_needed"]
                assert got["slots"] == math.ceil(got["bytes_needed"] / got["slot_bytes"])
