"""The decode passes' expert traffic in a generation's stats (issue 18 item 6): every pass looks up K
experts a layer, each a hit or a miss; each miss streams one expert's bytes; `--stats` and `strata bench`
show it per token."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import strata
from strata.cli import main
from strata.testing import make_qwen3moe

SHAPE = dict(layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=32, top_k=4, expert_ffn=256,
             vocab=1024)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("decode-stats") / "m.gguf"
    make_qwen3moe(p, **SHAPE, quant={"experts": "Q4_K"}, seed=4)
    return str(p)


def bounded(path: str, extra_slots: int = 40) -> str:
    lay = strata.ModelInfo(path).layout(16, True)
    return f"{(lay['slots'] + extra_slots) * lay['slot_bytes']}b"


@pytest.mark.parametrize("cache", ["all", "bounded"])
def test_decode_lookups_and_bytes_add_up(model_path, cache):
    m = strata.Model(model_path, expert_cache=bounded(model_path) if cache == "bounded" else "all", prefill=16,
                     ctx=256, progress=False)
    st = m.generate("hello world, " * 4, max_tokens=24, temperature=0, ignore_eos=True).stats
    assert st["decode_passes"] == 23
    assert st["decode_hits"] + st["decode_misses"] == st["decode_passes"] * SHAPE["layers"] * SHAPE["top_k"]
    expert = m.spec["expert_bytes"] // (SHAPE["layers"] * SHAPE["experts"])
    assert st["decode_bytes"] == st["decode_misses"] * expert
    if cache == "all":
        assert st["decode_misses"] == 0
    else:
        assert 0 < st["decode_misses"] < st["decode_hits"] + st["decode_misses"]
        assert st["decode_misses"] <= st["cache_misses"]  # the prompt's misses are not the decode's
    again = m.generate("another prompt", max_tokens=4, temperature=0, ignore_eos=True).stats
    assert again["decode_hits"] + again["decode_misses"] == 3 * SHAPE["layers"] * SHAPE["top_k"]  # per generation


def test_stats_and_bench_print_the_stream(model_path, tmp_path):
    r = CliRunner()
    out = r.invoke(main, ["generate", model_path, "-p", "hello world", "-n", "12", "--stats", "--expert-cache",
                          bounded(model_path), "--prefill", "16"])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.startswith("stream"))
    assert "misses and" in line and "a token (hit rate 0." in line and "GB/s over the decode's time" in line, line
    j = tmp_path / "b.json"
    out = r.invoke(main, ["bench", model_path, "--expert-cache", bounded(model_path), "--json", str(j)])
    assert out.exit_code == 0, out.output
    assert any(ln.startswith("stream") and "misses and" in ln for ln in out.output.splitlines()), out.output
    res = json.loads(j.read_text())
    assert res["decode_misses"] > 0 and res["decode_bytes"] > 0 and res["decode_link_gbps"] > 0
