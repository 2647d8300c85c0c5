"""The Python edge: the environment read at the edge only, the header read without a load,
sampling defaults in one place, and loads (failed or not) that give back all they allocated."""

from __future__ import annotations

import gc
import inspect

import pytest
from click.testing import CliRunner

import strata
from strata.cli import generate as generate_command
from strata.cli import main


@pytest.fixture(scope="module")
def f16(make_mix) -> str:
    return make_mix("f16")


def has_xn(layout: dict) -> bool:
    return any(b["name"] == "xn" for b in layout["buffers"])


def test_model_info_is_the_loaded_models_plan(f16):
    info = strata.ModelInfo(f16)
    m = strata.Model(f16, expert_cache="all", prefill=64, ctx=128, progress=False)
    assert info.spec == m.spec == m.info.spec
    assert info.path == m.info.path == f16
    for T, src in ((1, True), (17, True), (64, False), (300, True)):
        assert info.layout(T, src) == m.layout(T, src)
    assert info.plan_chunk("2MiB", 512) == m.plan_chunk("2MiB", 512)
    assert info.cache_slots("2MiB") == (2 << 20) // info.slot_bytes
    assert {t["name"] for t in info.tensors} == {t["name"] for t in strata.inspect(f16)["tensors"]}
    assert info.metadata["general.architecture"] == "qwen3moe"
    with pytest.raises(strata.ConfigError, match="not a size"):
        info.cache_slots("all")
    with pytest.raises(FileNotFoundError):
        strata.ModelInfo(f16 + ".missing")


def test_info_and_layout_load_nothing(f16, monkeypatch):
    """`strata info` and `strata layout` read the header: no Model, so no backend, no weight, no copy."""
    def no_load(*args, **kwargs):
        raise AssertionError("a Model was constructed")

    monkeypatch.setattr(strata, "Model", no_load)
    monkeypatch.setattr(strata, "Backend", no_load)
    for args in (["info", f16, "--expert-cache", "2MiB"], ["layout", f16, "--tokens", "64", "--expert-cache", "2MiB"],
                 ["layout", f16, "--no-source", "--unfused"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, (args, r.output, r.exception)


def test_gr_unfused_is_a_parameter(f16, monkeypatch):
    monkeypatch.delenv("STRATA_GR_UNFUSED", raising=False)
    assert not has_xn(strata.ModelInfo(f16).layout(16))
    assert has_xn(strata.ModelInfo(f16, gr_unfused=True).layout(16))
    m = strata.Model(f16, gr_unfused=True, prefill=16, progress=False)
    assert m.info.gr_unfused and has_xn(m.layout(16))


def test_gr_unfused_from_the_environment(f16, monkeypatch):
    """STRATA_GR_UNFUSED still works through strata.Model, strata.ModelInfo and the CLI; an explicit
    gr_unfused= wins over it."""
    monkeypatch.setenv("STRATA_GR_UNFUSED", "1")
    assert has_xn(strata.Model(f16, prefill=16, progress=False).layout(16))
    assert has_xn(strata.ModelInfo(f16).layout(16))
    assert not has_xn(strata.ModelInfo(f16, gr_unfused=False).layout(16))
    r = CliRunner().invoke(main, ["layout", f16, "--tokens", "16"])
    assert r.exit_code == 0 and "GR=unfused" in r.output
    monkeypatch.setenv("STRATA_GR_UNFUSED", "0")
    r = CliRunner().invoke(main, ["layout", f16, "--tokens", "16"])
    assert r.exit_code == 0 and "GR=fused" in r.output
    r = CliRunner().invoke(main, ["layout", f16, "--tokens", "16", "--unfused"])
    assert r.exit_code == 0 and "GR=unfused" in r.output


def test_threads(f16, monkeypatch):
    monkeypatch.setenv("STRATA_THREADS", "1")
    assert strata.Model(f16, progress=False).threads == 1
    assert strata.Model(f16, threads=2, progress=False).threads == 2
    monkeypatch.setenv("STRATA_THREADS", "many")
    with pytest.raises(strata.ConfigError, match="STRATA_THREADS"):
        strata.Model(f16, progress=False)
    monkeypatch.delenv("STRATA_THREADS")
    m = strata.Model(f16, progress=False)
    assert m.threads >= 1 and m.backend.describe()


def test_sampling_defaults_in_one_place():
    d = strata.GENERATE_DEFAULTS
    assert d["max_tokens"] == 256 and d["temperature"] == 0.8 and d["top_k"] == 40
    sig = inspect.signature(strata.Model.generate).parameters
    cli = {p.name: p.default for p in generate_command.params}
    for name in ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty"):
        assert sig[name].default == d[name], name
        assert cli["repeat_penalty" if name == "repetition_penalty" else name] == d[name], name


# ---- a load gives back everything it allocated on the backend, also when it fails ----

@pytest.mark.parametrize("source", ["host", "mmap"])
def test_failed_load_leaks_nothing(f16, source):
    be = strata.Backend("cpu", 1)
    base = be.live_allocations()
    # A 3-slot cache is too small for a 4096-token chunk: the load fails at its plan, before anything
    # is allocated.
    slot = strata.ModelInfo(f16).slot_bytes
    with pytest.raises(strata.MemoryError, match="--expert-cache"):
        strata.Model(f16, expert_cache=f"{3 * slot}b", prefill=4096, ctx=4096, source=source, backend=be,
                     progress=False)
    assert be.live_allocations() == base
    # A KV cache of half a TiB fails after the source and the cache's slots were allocated.
    with pytest.raises(strata.MemoryError, match="KV cache"):
        strata.Model(f16, expert_cache=f"{100 * slot}b", prefill=1, ctx=2**31 - 1, source=source, backend=be,
                     progress=False)
    assert be.live_allocations() == base
    # the same configuration with a chunk that fits loads, allocates, and gives it all back when dropped
    m = strata.Model(f16, expert_cache=f"{3 * slot}b", prefill=1, ctx=4096, source=source, backend=be,
                     progress=False)
    assert m.backend is be and be.live_allocations() > base
    m.generate("hello", max_tokens=2, temperature=0)
    del m
    gc.collect()
    assert be.live_allocations() == base


def test_dropped_stream_and_model_leak_nothing(f16):
    be = strata.Backend("cpu", 1)
    base = be.live_allocations()
    m = strata.Model(f16, expert_cache="all", backend=be, progress=False)
    it = m.generate("hello", max_tokens=8, stream=True)
    next(it)
    del m  # the suspended iterator keeps the model alive, then goes with it
    assert be.live_allocations() > base
    del it
    gc.collect()
    assert be.live_allocations() == base
