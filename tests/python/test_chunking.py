"""--prefill auto[:MAX] takes the largest chunk that fits; too small a cache names the fix."""

from __future__ import annotations

import math

import pytest

import strata


@pytest.fixture(scope="module")
def q4k(make_mix):
    path = make_mix("q4_k")
    return path, strata.Model(path, expert_cache="all", ctx=16, progress=False)


def _needs(m, T: int, layer_room: bool = True) -> int:
    s = m.spec
    slots = math.ceil(m.layout(T, source=True)["bytes_needed"] / s["slot_bytes"])
    return slots + (min(s["experts"], T * s["top_k"]) if layer_room else 1)


@pytest.mark.parametrize("slots", [40, 64, 100, 200, 400, 1000])
@pytest.mark.parametrize("max_tokens", [256, 1000, 4096])
def test_auto_takes_the_largest_chunk_that_fits(q4k, slots, max_tokens):
    path, probe = q4k
    cache = slots * probe.spec["slot_bytes"]
    plan = probe.plan_chunk(f"{cache}b", max_tokens)
    # The candidates auto may take: MAX, MAX/2, ... through 256 down to 1; first those that leave room
    # for a layer's experts, then those that fit as a fixed chunk would.
    cands, T = [], max_tokens
    while T >= 1:
        cands.append(T)
        T = max(256, T // 2) if T > 256 else T // 2
    fitting = [T for T in cands if _needs(probe, T) <= slots] + [T for T in cands if _needs(probe, T, False) <= slots]
    if not fitting:
        assert not plan["fits"] and "--expert-cache" in plan["error"]
        with pytest.raises(strata.MemoryError, match="--expert-cache"):
            strata.Model(path, expert_cache=f"{cache}b", prefill=f"auto:{max_tokens}", ctx=max_tokens,
                         source="mmap", progress=False)
        return
    assert plan["fits"] and plan["chunk"] == fitting[0]
    m = strata.Model(path, expert_cache=f"{cache}b", prefill=f"auto:{max_tokens}", ctx=max_tokens,
                     source="mmap", progress=False)
    assert m.chunk == fitting[0]
    assert plan["slots"] == m.slots_for(m.chunk)


def test_error_names_a_cache_that_works(q4k):
    _, probe = q4k
    plan = probe.plan_chunk(f"{probe.spec['slot_bytes']}b", 4096)
    assert not plan["fits"] and "too small for any prompt chunk" in plan["error"]
    # The message names the smallest cache that works (a chunk of 1 token), and one for chunks of 256,
    # each with its unit, as --expert-cache takes it.
    smallest, useful = (x.split()[0] for x in plan["error"].split("use --expert-cache ")[1].split("(", 1))
    assert smallest.endswith("MiB") and useful.endswith("MiB")
    assert probe.plan_chunk(smallest, 4096)["fits"]
    assert probe.plan_chunk(useful, 4096)["chunk"] >= 256


def test_error_names_the_fused_layout_where_it_could_run(q4k):
    # The MMQ layout's chunk buffers are the larger: a cache too small for its chunk is told about the fused
    # layout's; a load that already runs the fused layout is not.
    path, probe = q4k
    assert "--moe-layout fused" in probe.plan_chunk(f"{probe.spec['slot_bytes']}b", 4096)["error"]
    fused = strata.ModelInfo(path, moe_layout="fused")
    assert "--moe-layout fused" not in fused.plan_chunk(f"{fused.spec['slot_bytes']}b", 4096)["error"]
