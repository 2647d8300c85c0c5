"""strata.Model(cpu_experts=N) on the CPU backend: the same greedy tokens as without it (cpu_experts_common),
and the loads it refuses, each with the reason and the fix. The bits of each expert computed on the host
against every backend's products: tests/native/test_host_experts.cpp."""

from __future__ import annotations

import pytest

import strata
from cpu_experts_common import MIXES, check_same_tokens, make
from strata.testing import make_gpt_oss


@pytest.mark.parametrize("mix", list(MIXES))
def test_cpu_share_gives_the_same_tokens(tmp_path, mix):
    check_same_tokens(make(str(tmp_path / f"{mix}.gguf"), mix), "cpu")


def test_cpu_experts_is_checked(tmp_path):
    path = make(str(tmp_path / "q.gguf"), "qwen3moe-q4_k")
    base = dict(expert_cache=64, prefill=8, progress=False, device="cpu")
    with pytest.raises(strata.ConfigError, match="moe_layout 'auto' or 'mmq'"):
        strata.Model(path, cpu_experts=2, moe_layout="fused", **base)
    with pytest.raises(strata.ConfigError, match="decode_resolve"):
        strata.Model(path, cpu_experts=2, decode_resolve="device", **base)
    for bad in (-1, 65, "two", 1.5):
        with pytest.raises(strata.ConfigError, match="cpu_experts"):
            strata.Model(path, cpu_experts=bad, **base)
    for layout in ("auto", "mmq"):  # the MMQ layout, the default
        m = strata.Model(path, cpu_experts=2, moe_layout=layout, **base)
        assert m._m.decode_resolution == "host"  # auto resolves on the host with a CPU share


def test_cpu_experts_refuses_other_activations_and_float_experts(tmp_path):
    oss = make_gpt_oss(tmp_path / "oss.gguf")
    with pytest.raises(strata.UnsupportedError, match="gpt-oss|activation"):
        strata.Model(oss, expert_cache=64, cpu_experts=1, progress=False, device="cpu")
    f32 = str(tmp_path / "f32.gguf")
    from strata.testing import make_qwen3moe

    make_qwen3moe(f32, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_ffn=32,
                  vocab=512, seed=1)
    with pytest.raises(strata.UnsupportedError, match="integer"):
        strata.Model(f32, expert_cache=64, cpu_experts=1, progress=False, device="cpu")


def test_stats_tell_the_cpu_share(tmp_path):
    from strata.cli import _decode_stream

    path = make(str(tmp_path / "q.gguf"), "qwen3moe-q4_k")
    slot = strata.ModelInfo(path).spec["slot_bytes"]
    m = strata.Model(path, expert_cache=f"{5 * slot}b", prefill=8, cpu_experts=2, progress=False, device="cpu")
    m.generate(list(range(1, 20)), max_tokens=8, temperature=0.0)
    stats = m.last_stats
    assert stats["cache_cpu_experts"] > 0
    assert "computed on the CPU" in _decode_stream(stats)


def test_cli_takes_cpu_experts(tmp_path):
    from click.testing import CliRunner

    from strata.cli import main

    path = make(str(tmp_path / "q.gguf"), "qwen3moe-q4_k")
    slot = strata.ModelInfo(path).spec["slot_bytes"]
    args = ["generate", path, "-p", "hello there", "-n", "6", "--temp", "0", "--device", "cpu", "--expert-cache",
            f"{5 * slot}b", "--prefill", "8", "-q"]
    plain = CliRunner().invoke(main, args)
    shared = CliRunner().invoke(main, [*args, "--cpu-experts", "2", "--stats"])
    assert plain.exit_code == 0 and shared.exit_code == 0, (plain.output, shared.output)
    assert shared.stdout == plain.stdout  # the same greedy text
    assert "computed on the CPU" in shared.output
    bad = CliRunner().invoke(main, [*args, "--cpu-experts", "65"])
    assert bad.exit_code == 2 and "--cpu-experts" in bad.output
    fused = CliRunner().invoke(main, [*args, "--cpu-experts", "1", "--moe-layout", "fused"])
    assert fused.exit_code != 0 and "moe_layout" in fused.output and "Traceback" not in fused.output
