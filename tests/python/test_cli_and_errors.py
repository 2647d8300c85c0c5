"""The CLI end to end, and every bad input ending in one clear error (never a crash)."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from click.testing import CliRunner

import strata
from strata.cli import main
from strata.testing import make_qwen3moe


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def f16_model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("cli") / "f16.gguf")
    make_qwen3moe(path, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_ffn=32,
                  vocab=512, quant={"experts": "F16"}, seed=3)
    return path


def test_generate_stats(f16_model):
    r = run("generate", f16_model, "-p", "Hello there", "-n", "8", "--temp", "0", "--stats",
            "--expert-cache", "1MiB", "--prefill", "2", "--source", "mmap")
    assert r.exit_code == 0, r.output
    err = r.stderr
    for word in ("prompt", "decode", "tok/s", "hits", "misses", "streamed", "slots borrowed", "source mmap"):
        assert word in err, (word, err)


def test_generate_ignore_eos_decodes_max_tokens(f16_model):
    r = run("generate", f16_model, "-p", "Hello there", "-n", "40", "--temp", "0", "--ignore-eos", "--stats")
    assert r.exit_code == 0, r.output
    assert "decode   40 tokens" in r.stderr, r.stderr


def test_generate_chat_and_stop(f16_model, tmp_path):
    r = run("generate", f16_model, "-p", "hi", "-n", "4", "--chat", "--seed", "1", "--system", "Be brief.")
    assert r.exit_code == 0, r.output
    (tmp_path / "p.txt").write_text("Once upon a time")
    a = run("generate", f16_model, "-f", str(tmp_path / "p.txt"), "-n", "4", "--temp", "0")
    b = run("generate", f16_model, "-p", "Once upon a time", "-n", "4", "--temp", "0")
    assert a.exit_code == 0 and a.output == b.output
    r = run("generate", f16_model, "-n", "4")
    assert r.exit_code == 2 and "exactly one of" in r.stderr
    r = run("generate", f16_model, "-p", "x", "--system", "s")
    assert r.exit_code == 2 and "--system needs --chat" in r.stderr


def _unstopped(args: list[str]):
    """The command's full output, its text, a stop string from inside it and the text before it."""
    full = run(*args)
    assert full.exit_code == 0, full.output
    text = full.output[:-1]  # the newline the command ends with
    assert len(text) > 8
    stop = text[4:7]
    return full, text, stop, text[: text.find(stop)]


def test_generate_stop_strings(f16_model):
    """--stop (repeatable) ends the streamed text before the first stop string that appears."""
    args = ["generate", f16_model, "-p", "Once upon a time", "-n", "24", "--temp", "0"]
    full, text, stop, cut = _unstopped(args)
    for extra in (["--stop", stop], ["--stop", "\x00never", "--stop", stop], ["--stop", text[6:9], "--stop", stop]):
        r = run(*args, *extra)
        assert r.exit_code == 0, r.output
        want = text[: min(text.find(s) for s in extra[1::2] if s in text)]
        assert r.output == want + "\n", (extra, r.output)
    assert run(*args, "--stop", stop).output == cut + "\n"
    r = run(*args, "--stop", "\x00never")
    assert r.output == full.output


def test_generate_chat_stop_strings(f16_model):
    """--stop with --chat ends the streamed reply before the first stop string, as Model.chat(stop=) does."""
    args = ["generate", f16_model, "-p", "Once upon a time", "--chat", "--system", "Be brief.", "-n", "24",
            "--temp", "0"]
    full, _, stop, cut = _unstopped(args)
    r = run(*args, "--stop", "\x00never", "--stop", stop)
    assert r.exit_code == 0 and r.output == cut + "\n", r.output
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Once upon a time"}]
    m = strata.Model(f16_model, progress=False)
    assert m.chat(msgs, max_tokens=24, temperature=0, stop=[stop]).text == cut
    assert run(*args, "--stop", "\x00never").output == full.output


def test_generate_flags_reach_the_model(f16_model):
    """--system goes before the user's message, and every sampling flag reaches the sampler: the CLI
    prints what Model.chat / Model.generate give for the same options (and other options give other text)."""
    m = strata.Model(f16_model, progress=False)
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}
    want = m.chat([system, user], max_tokens=8, temperature=0).text
    assert want != m.chat([user, system], max_tokens=8, temperature=0).text
    r = run("generate", f16_model, "-p", "hi", "--system", "Be brief.", "--chat", "-n", "8", "--temp", "0")
    assert r.exit_code == 0 and r.output == want + "\n", r.output
    prompt = "Once upon a time"
    cases = [
        (["--temp", "0", "--repeat-penalty", "3"], dict(temperature=0, repetition_penalty=3.0)),
        (["--temp", "1.5", "--top-k", "5", "--top-p", "0.9", "--min-p", "0.1", "--seed", "4"],
         dict(temperature=1.5, top_k=5, top_p=0.9, min_p=0.1, seed=4)),
    ]
    for args, kw in cases:
        want = m.generate(prompt, max_tokens=12, **kw).text
        r = run("generate", f16_model, "-p", prompt, "-n", "12", *args)
        assert r.exit_code == 0 and r.output == want + "\n", (args, r.output, want)
    texts = {m.generate(prompt, max_tokens=12, seed=4, **kw).text
             for kw in ({}, dict(temperature=1.5), dict(temperature=1.5, top_k=5), dict(temperature=1.5, top_p=0.5),
                        dict(temperature=1.5, min_p=0.3))}
    assert len(texts) == 5  # each option changes the text, so the comparisons above see each one
    assert m.generate(prompt, max_tokens=12, temperature=0, repetition_penalty=3.0).text != m.generate(
        prompt, max_tokens=12, temperature=0).text


def test_info_table_and_json(f16_model):
    r = run("info", f16_model)
    assert r.exit_code == 0, r.output
    assert "qwen3moe" in r.output and "active per token" in r.output and "per expert" in r.output
    r = run("info", f16_model, "--json", "--expert-cache", "2MiB")
    info = json.loads(r.output)
    assert info["layers"] == 2 and info["experts"] == 8 and info["top_k"] == 2
    per_expert = 3 * 64 * 32 * 2  # gate + up + down, F16
    assert info["bytes_per_expert"] == per_expert
    assert info["expert_bytes"] == 2 * 8 * per_expert
    assert info["params_active"] < info["params_total"]
    assert info["cache"]["slots"] == (2 << 20) // info["slot_bytes"]
    assert {q["role"] for q in info["quant_mix"]} == {"dense", "experts"}


def test_layout_table(f16_model):
    r = run("layout", f16_model, "--tokens", "64")
    assert r.exit_code == 0, r.output
    assert "bytes_needed" in r.output and "grs" in r.output and "layout=mmq" in r.output
    r = run("layout", f16_model, "--tokens", "64", "--moe-layout", "fused")
    assert r.exit_code == 0 and "layout=fused" in r.output, r.output
    r = run("layout", f16_model, "--tokens", "64", "--no-source", "--unfused", "--json")
    lay = json.loads(r.output)
    assert lay["kind"] == "mmq" and any(b["name"] == "xn" for b in lay["buffers"])
    r = run("layout", f16_model, "--tokens", "64", "--expert-cache", "2MiB")
    assert r.exit_code == 0 and "slots; the chunk borrows" in r.output


def test_demo_runs():
    r = run("demo", "-n", "6")
    assert r.exit_code == 0, r.output
    assert "expert cache" in r.output and "misses" in r.output


# ---- bad input: each a clear error naming the cause ----

def _copy(src: str, dst, mutate) -> str:
    data = bytearray(open(src, "rb").read())
    mutate(data)
    out = str(dst)
    open(out, "wb").write(bytes(data))
    return out


def test_bad_magic(f16_model, tmp_path):
    p = _copy(f16_model, tmp_path / "bad.gguf", lambda d: d.__setitem__(slice(0, 4), b"GGML"))
    with pytest.raises(strata.FormatError, match="bad.gguf.*magic"):
        strata.Model(p, progress=False)
    r = run("info", p)
    assert r.exit_code == 2 and "magic" in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize("frac", [0.01, 0.5, 0.999])
def test_truncated(f16_model, tmp_path, frac):
    n = os.path.getsize(f16_model)
    p = _copy(f16_model, tmp_path / "cut.gguf", lambda d: d.__delitem__(slice(int(n * frac), None)))
    with pytest.raises(strata.FormatError, match="cut.gguf"):
        strata.Model(p, progress=False)


def test_unknown_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    p = str(tmp_path / "llama.gguf")
    w = gguf.GGUFWriter(p, "llama")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(strata.UnsupportedError, match="architecture 'llama'.*qwen3moe"):
        strata.Model(p, progress=False)


def test_unknown_quant_type(f16_model, tmp_path):
    # Retype one expert tensor F16 -> I16 (same block size): valid GGUF, a type strata cannot compute with.
    name = b"blk.1.ffn_down_exps.weight"

    def retype(d: bytearray) -> None:
        i = d.find(name) + len(name)
        n_dims = struct.unpack_from("<I", d, i)[0]
        at = i + 4 + 8 * n_dims
        assert struct.unpack_from("<I", d, at)[0] == 1
        struct.pack_into("<I", d, at, 25)

    p = _copy(f16_model, tmp_path / "i16.gguf", retype)
    with pytest.raises(strata.UnsupportedError, match="blk.1.ffn_down_exps.weight.*I16"):
        strata.Model(p, progress=False)


def _retype(data: bytearray, name: bytes, old: int, new: int) -> None:
    i = data.find(name) + len(name)
    n_dims = struct.unpack_from("<I", data, i)[0]
    at = i + 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, at)[0] == old
    struct.pack_into("<I", data, at, new)


def test_info_lists_each_type_and_unsupported_types_fail_in_one_line(tmp_path):
    """`strata info` gives tensors and bytes per (role, type) for a mix of the new types; a tensor of a type
    strata lacks (TQ2_0, same geometry as IQ2_XXS; an id only ik_llama knows) fails load and info alike
    with one line naming the type and the tensor."""
    path = str(tmp_path / "mix.gguf")
    make_qwen3moe(path, hidden=256, heads=4, kv_heads=2, head_dim=32, experts=4, top_k=2, expert_ffn=256,
                  quant={"embed": "Q8_0", "attn": "Q5_0", "experts": "MXFP4", "expert_down": "IQ2_XXS",
                         "output": "Q5_K"})
    r = run("info", path, "--json")
    assert r.exit_code == 0, r.output
    mix = {(q["role"], q["type"]): (q["tensors"], q["bytes"]) for q in json.loads(r.output)["quant_mix"]}
    experts = 4 * 256 * 256  # elements of one layer's gate, up or down tensor
    assert mix[("experts", "MXFP4")] == (4, 4 * experts // 32 * 17)
    assert mix[("experts", "IQ2_XXS")] == (2, 2 * experts // 256 * 66)
    attn = (128 + 64 + 64) * 256 + 256 * 128  # q, k, v and output of one layer
    assert mix[("dense", "Q5_0")] == (8, 2 * attn // 32 * 22)
    assert mix[("dense", "Q5_K")] == (1, 512 * 256 // 256 * 176)
    text = run("info", path).output
    assert "quant experts" in text and "MXFP4: 4 tensors" in text and "Q5_0: 8 tensors" in text
    for tid, tname in ((35, "TQ2_0"), (140, "type 140")):
        p = _copy(path, tmp_path / f"t{tid}.gguf",
                  lambda d, tid=tid: _retype(d, b"blk.1.ffn_down_exps.weight", 16, tid))
        with pytest.raises(strata.Error, match=rf"blk.1.ffn_down_exps.weight.*{tname}"):
            strata.Model(p, progress=False)
        r = run("info", p)
        assert r.exit_code != 0
        lines = [ln for ln in r.output.strip().splitlines() if ln]
        assert len(lines) == 1 and "blk.1.ffn_down_exps.weight" in lines[0] and tname in lines[0], r.output


def test_cache_too_small_names_the_fix(f16_model):
    """A given --prefill that does not fit names, with units, the cache that fits it and the --prefill
    that fits the cache; each of them loads."""
    slot = strata.ModelInfo(f16_model).slot_bytes
    with pytest.raises(strata.MemoryError, match=r"use --expert-cache \d+MiB or more, or --prefill \d+ or fewer "
                       r"tokens, or --prefill auto") as e:
        strata.Model(f16_model, expert_cache=f"{6 * slot}b", prefill=512, progress=False)
    cache = str(e.value).split("use --expert-cache ")[1].split()[0]
    prefill = int(str(e.value).split(", or --prefill ")[1].split()[0])
    assert strata.Model(f16_model, expert_cache=cache, prefill=512, progress=False).chunk == 512
    assert strata.Model(f16_model, expert_cache=f"{6 * slot}b", prefill=prefill, progress=False).chunk == prefill
    # No chunk fits: no --prefill; the fused layout's smaller buffers are named (the default runs MMQ), and
    # not where the load asks for the fused layout already.
    with pytest.raises(strata.MemoryError,
                       match=r"use --expert-cache \d+MiB or more, or --moe-layout fused \(smaller chunk buffers\)$"):
        strata.Model(f16_model, expert_cache="20KiB", prefill=512, progress=False)
    with pytest.raises(strata.MemoryError, match=r"use --expert-cache \d+MiB or more$"):
        strata.Model(f16_model, expert_cache="20KiB", prefill=512, progress=False, moe_layout="fused")


def test_default_prefill_steps_down_for_a_small_cache(f16_model):
    """No --prefill given: a cache too small for the default chunk of 8192 takes a smaller one (as auto
    does) instead of an error; a --prefill 8192 given is an error naming both fixes with units."""
    info = strata.ModelInfo(f16_model)
    cache = f"{(info.layout(64)['slots'] + 8 * info.spec['top_k']) * info.slot_bytes}b"
    with pytest.warns(strata.StrataWarning, match="no room for the default prompt chunk of 4096 tokens") as w:
        m = strata.Model(f16_model, expert_cache=cache, progress=False)
    assert 1 <= m.chunk < 8192 and f"prompts run in chunks of {m.chunk}" in str(w[0].message)
    assert m.generate([m.tokenize("hi")[0]], max_tokens=2, temperature=0).stats["generated"] == 2
    r = run("generate", f16_model, "-p", "hi", "-n", "2", "--expert-cache", cache)
    assert r.exit_code == 0, r.output
    assert r.stderr.count("strata: warning: the expert cache") == 1, r.stderr  # said once, in one line
    r = run("generate", f16_model, "-p", "hi", "-n", "2", "--expert-cache", cache, "--prefill", str(m.chunk))
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output  # a chunk given is not a step down
    r = run("generate", f16_model, "-p", "hi", "-n", "2", "--expert-cache", cache, "--prefill", "8192")
    assert r.exit_code == 2 and "chunk of 4096 tokens" in r.stderr and "MiB or more, or --prefill" in r.stderr, r.stderr
    # info answers as the load does
    plan = json.loads(run("info", f16_model, "--expert-cache", cache, "--json").stdout)["cache"]
    assert plan["fits"] and plan["chunk"] == m.chunk


@pytest.mark.parametrize("args, needle", [
    (["--expert-cache", "banana"], "--expert-cache 'banana'"),
    (["--expert-cache", "-5"], "--expert-cache"),
    (["--prefill", "0"], "--prefill"),
    (["--prefill", "auto:x"], "--prefill"),
    (["--ctx", "0"], "ctx"),
])
def test_bad_flags(f16_model, args, needle):
    r = run("generate", f16_model, "-p", "x", "-n", "1", *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and "Traceback" not in r.output


def test_missing_file():
    r = run("info", "/nonexistent/model.gguf")
    assert r.exit_code == 2 and "not found" in r.stderr


def test_bench_table_and_json(f16_model, tmp_path):
    out = tmp_path / "b.json"
    r = run("bench", f16_model, "--prompt-tokens", "20", "--gen-tokens", "4", "--expert-cache", "1MiB",
            "--prefill", "8", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "prompt" in r.output and "tok/s" in r.output
    res = json.loads(out.read_text())
    assert res["prompt_tokens"] == 20 and res["prompt_tps"] > 0 and res["cache_chunks"] == 3
