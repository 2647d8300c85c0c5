"""Every flag of every command: a bad value ends in one line naming the flag and the fix (exit 2,
no traceback); the Python API checks its arguments with strata's own errors; the answers are honest
(refused sampling values, warnings, a full context said so, info agreeing with a load); the help is
complete and the flags a llama.cpp user types work."""

from __future__ import annotations

import glob
import json
import os
import re
import tempfile

import click
import pytest
from click.testing import CliRunner

import strata
from strata.cli import main


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=env)


@pytest.fixture(scope="module")
def f16(make_mix) -> str:
    return make_mix("f16")


# ---- every bad value: exit 2, one line, the flag named, the fix given ----

FIX_WORDS = ("must", "not in the range", "is not", "use ", "give", "one of", "not a valid", "needs", "does not exist",
             "No such", "not available", "cannot", "too small", "takes", "Missing", "requires", "give the",
             "is a directory", "is a file")

M = "MODEL"  # stands for the model path in the table

LOAD_FLAGS = [
    (["--expert-cache", "banana"], "--expert-cache"),
    (["--expert-cache", "-5"], "--expert-cache"),
    (["--expert-cache", "0"], "--expert-cache"),
    (["--expert-cache", ""], "--expert-cache"),
    (["--expert-cache", "2KiB", "--source", "mmap"], "--expert-cache"),  # too small: names the size that works
    (["--prefill", "0"], "--prefill"),
    (["--prefill", "-3"], "--prefill"),
    (["--prefill", "auto:x"], "--prefill"),
    (["--prefill", "lots"], "--prefill"),
    (["--source", "disk"], "--source"),
    (["--moe-layout", "fast"], "--moe-layout"),
    (["-t", "-1"], "--threads"),
    (["--threads", "many"], "--threads"),
    (["--device", "tpu"], "device"),
    (["--device", ""], "device"),
    (["--bogus"], "--bogus"),
]
CTX_FLAGS = [
    (["-c", "0"], "--ctx"),
    (["--ctx", "-1"], "--ctx"),
    (["--ctx", "big"], "--ctx"),
]
SAMPLING_FLAGS = [
    (["--temp", "-1"], "--temp"),
    (["--temp", "hot"], "--temp"),
    (["--temp", "nan"], "--temp"),
    (["--temp", "inf"], "--temp"),
    (["--top-k", "-1"], "--top-k"),
    (["--top-k", "1.5"], "--top-k"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "2"], "--top-p"),
    (["--top-p", "-1"], "--top-p"),
    (["--min-p", "-0.1"], "--min-p"),
    (["--min-p", "1.5"], "--min-p"),
    (["--repeat-penalty", "0"], "--repeat-penalty"),
    (["--repeat-penalty", "-1"], "--repeat-penalty"),
    (["--repeat-last-n", "-2"], "--repeat-last-n"),
    (["--repeat-last-n", "x"], "--repeat-last-n"),
    (["--seed", str(2**64)], "--seed"),
    (["--seed", "-2"], "--seed"),
    (["--seed", "x"], "--seed"),
    (["--stop", ""], "--stop"),
    (["-n", "-1"], "--max-tokens"),
    (["--max-tokens", "ten"], "--max-tokens"),
]

CASES: list[tuple[list[str], str]] = []
for flags, needle in LOAD_FLAGS + CTX_FLAGS + SAMPLING_FLAGS:
    CASES.append((["generate", M, "-p", "hi", "-n", "2", *flags], needle))
    CASES.append((["chat", M, *flags], needle))
for flags, needle in LOAD_FLAGS:
    CASES.append((["bench", M, "--prompt-tokens", "8", "--gen-tokens", "2", *flags], needle))
CASES += [
    (["generate", M], "-p/--prompt"),
    (["generate", M, "-p", "x", "-f", "/nonexistent/p.txt"], "--file"),
    (["generate", M, "-p", "x", "--system", "s"], "--system"),
    (["generate", "-p", "x"], "-m/--model"),
    (["generate", "/nonexistent/model.gguf", "-p", "x"], "/nonexistent/model.gguf"),
    (["generate", "-m", "/nonexistent/model.gguf", "-p", "x"], "/nonexistent/model.gguf"),
    (["generate", M, "-m", "/other.gguf", "-p", "x"], "-m"),
    (["info", M, "--expert-cache", "banana"], "--expert-cache"),
    (["info", M, "--expert-cache", "2MiB", "--prefill", "0"], "--prefill"),
    (["info", M, "-c", "0"], "--ctx"),
    (["info", M, "--bogus"], "--bogus"),
    (["info"], "-m/--model"),
    (["layout", M, "--tokens", "0"], "--tokens"),
    (["layout", M, "--tokens", "-4"], "--tokens"),
    (["layout", M, "--tokens", "many"], "--tokens"),
    (["layout", M, "--expert-cache", "abc"], "--expert-cache"),
    (["layout", M, "--expert-cache", "all"], "--expert-cache"),
    (["layout", M, "--moe-layout", "MMQ"], "--moe-layout"),
    (["info", M, "--moe-layout", "float"], "--moe-layout"),
    (["bench", M, "--prompt-tokens", "-5"], "--prompt-tokens"),
    (["bench", M, "--prompt-tokens", "0"], "--prompt-tokens"),
    (["bench", M, "--gen-tokens", "-1"], "--gen-tokens"),
    (["bench", M, "--seed", "-1"], "--seed"),
    (["bench", M, "--json", "/nonexistent-folder/b.json"], "--json"),
    (["bench", M, "--json", "/"], "--json"),
    (["demo", "-n", "-1"], "--max-tokens"),
    (["demo", "-n", "x"], "--max-tokens"),
    (["demo", "--keep", "/proc/nope"], "--keep"),
    (["demo", "--keep", "/etc/hostname"], "--keep"),
    (["nonsense"], "nonsense"),
]


@pytest.mark.parametrize("args, needle", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_value_is_one_line_naming_the_flag(f16, args, needle):
    args = [f16 if a == M else a for a in args]
    r = run(*args)
    assert r.exit_code == 2, (r.output, r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("strata: error: "), line
    assert needle in line, line
    assert any(w in line for w in FIX_WORDS), line
    assert "Traceback" not in r.output
    if args[0] in ("layout", "info", "bench"):
        assert r.stdout == "", r.stdout  # refused before any table


def test_bench_json_is_checked_before_the_run(f16, tmp_path):
    r = run("bench", f16, "--prompt-tokens", "8", "--gen-tokens", "2", "--json", str(tmp_path / "no" / "b.json"))
    assert r.exit_code == 2 and "does not exist" in r.stderr and "prompt" not in r.stdout


def _demo_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "strata-demo-*")))


def test_demo_leaves_no_temp_folder(tmp_path):
    before = _demo_dirs()
    assert run("demo", "-n", "-1").exit_code == 2
    assert run("demo", "-n", "2").exit_code == 0
    assert _demo_dirs() == before
    r = run("demo", "-n", "2", "--keep", str(tmp_path / "kept"))
    assert r.exit_code == 0 and os.path.exists(tmp_path / "kept" / "demo-qwen3moe.gguf")


# ---- the Python API: strata's own errors, never a pybind TypeError ----

@pytest.mark.parametrize("kw, needle", [
    (dict(ctx="big"), "ctx"), (dict(ctx=0), "ctx"), (dict(ctx=1.5), "ctx"), (dict(threads=-1), "threads"),
    (dict(threads="all"), "threads"), (dict(device=3), "device"), (dict(source="disk"), "source"),
    (dict(expert_cache=[1]), "expert-cache"), (dict(prefill="lots"), "prefill"), (dict(gr_unfused="yes"), "gr_unfused"),
    (dict(backend="cpu"), "backend"),
])
def test_model_arguments_are_checked(f16, kw, needle):
    with pytest.raises(strata.ConfigError, match=needle):
        strata.Model(f16, progress=False, **kw)


@pytest.mark.parametrize("kw, needle", [
    (dict(seed=2**64), "seed"), (dict(seed=-2), "seed"), (dict(seed="x"), "seed"), (dict(seed=1.5), "seed"),
    (dict(temperature=-1), "temperature"), (dict(temperature="hot"), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_k=-1), "top_k"), (dict(top_k=1.5), "top_k"),
    (dict(top_p=2), "top_p"), (dict(top_p=0), "top_p"), (dict(min_p=1.5), "min_p"),
    (dict(repetition_penalty=0), "repetition_penalty"), (dict(repeat_last_n=-2), "repeat_last_n"),
    (dict(max_tokens=-1), "max_tokens"), (dict(max_tokens="many"), "max_tokens"), (dict(stop=5), "stop"),
    (dict(stop=[""]), "stop"), (dict(prompt=[1, "a"]), "token ids"), (dict(prompt=[99999]), "out of range"),
    (dict(prompt=[2**70]), "out of range"),
    (dict(prompt=[]), "token ids"), (dict(prompt=[[1, 2]]), "token ids"), (dict(callback=3), "callback"),
])
def test_generate_arguments_are_checked(f16, kw, needle):
    m = strata.Model(f16, progress=False)
    prompt = kw.pop("prompt", "hello")
    with pytest.raises(strata.ConfigError, match=needle):
        m.generate(prompt, max_tokens=kw.pop("max_tokens", 2), **kw)


def test_logits_arguments_are_checked(f16):
    m = strata.Model(f16, progress=False)
    for bad in ([], [1, "a"], [-1], "hello"):
        with pytest.raises(strata.ConfigError):
            m.logits(bad)


def test_seed_minus_one_is_random(f16):
    m = strata.Model(f16, progress=False)
    outs = {tuple(m.generate("hi", max_tokens=16, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=-1).tokens)
            for _ in range(3)}
    assert len(outs) > 1
    a = m.generate("hi", max_tokens=8, temperature=1.0, seed=2**64 - 1).tokens
    assert a == m.generate("hi", max_tokens=8, temperature=1.0, seed=2**64 - 1).tokens
    r1, r2 = (run("generate", f16, "-p", "hi", "-n", "16", "--top-k", "0", "--seed", "-1") for _ in range(2))
    assert r1.exit_code == r2.exit_code == 0 and r1.stdout != r2.stdout


# ---- honest answers ----

def test_ctx_past_training_length_warns_once(f16):
    ctx_train = strata.ModelInfo(f16).spec["ctx_train"]
    with pytest.warns(strata.StrataWarning, match=f"more than the {ctx_train} tokens"):
        strata.Model(f16, ctx=ctx_train + 1, progress=False)
    r = run("generate", f16, "-p", "hi", "-n", "2", "-c", str(10_000_000))
    assert r.exit_code == 0
    assert r.stderr.count("strata: warning: ctx (-c/--ctx) 10000000 is more than") == 1
    r = run("generate", f16, "-p", "hi", "-n", "2", "-c", str(ctx_train))
    assert "warning" not in r.stderr


def test_a_full_context_says_so(f16):
    r = run("generate", f16, "-p", "hi", "-n", "100", "-c", "8", "--temp", "0")
    assert r.exit_code == 0
    assert "the context of 8 tokens (-c/--ctx) is full" in r.stderr and "raise -c/--ctx" in r.stderr
    r = run("generate", f16, "-p", "hi", "-n", "3", "-c", "64", "--temp", "0")
    assert "context" not in r.stderr


def test_strata_log_and_threads_are_checked(f16, monkeypatch):
    r = run("generate", f16, "-p", "hi", "-n", "1", env={"STRATA_LOG": "bogus"})
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "STRATA_LOG='bogus'" in r.stderr
    r = run("info", f16, env={"STRATA_LOG": "DEBUG"})
    assert r.exit_code == 0
    monkeypatch.setenv("STRATA_LOG", "bogus")
    with pytest.warns(strata.StrataWarning, match="STRATA_LOG"):
        strata.Model(f16, progress=False)
    monkeypatch.delenv("STRATA_LOG")
    r = run("generate", f16, "-p", "hi", "-n", "1", "-t", "1000")
    assert r.exit_code == 0 and "strata: warning: threads (-t/--threads) 1000 is more than the" in r.stderr
    with pytest.warns(strata.StrataWarning, match="STRATA_THREADS 1000"):
        monkeypatch.setenv("STRATA_THREADS", "1000")
        strata.Model(f16, progress=False)


def test_stats_are_possible(f16):
    """A 1-token prompt runs as one chunk of one token; a decode with no pass shows no rate."""
    m = strata.Model(f16, progress=False, prefill=4)
    ids = [m.tokenize("hi")[0]]
    st = m.generate(ids, max_tokens=1, temperature=0).stats
    assert (st["prompt_chunk"], st["prompt_chunks"], st["prompt_tokens"]) == (1, 1, 1)
    assert st["decode_passes"] == 0 and st["decode_tps"] == 0
    st = m.generate(list(range(1, 11)), max_tokens=3, temperature=0).stats
    assert (st["prompt_chunk"], st["prompt_chunks"]) == (4, 3)
    r = run("generate", f16, "-p", "hi", "-n", "1", "--stats", "-c", "3")
    assert "chunk 4096" not in r.stderr and "x 0" not in r.stderr
    r = run("generate", f16, "-p", "hi there", "-n", "3", "--stats", "--prefill", "1")
    n = len(m.tokenize("hi there"))
    assert f"{n} chunks of up to 1 token" in r.stderr


@pytest.mark.skipif(strata._core.has_cuda, reason="the build has a CUDA backend")
def test_device_errors_name_the_device(f16):
    r = run("generate", f16, "-p", "hi", "--device", "cuda")
    assert r.exit_code == 2 and "device 'cuda'" in r.stderr and "expert-cache" not in r.stderr


@pytest.mark.parametrize("ctx", [4096, 300])
@pytest.mark.parametrize("prefill", [None, "8192", "auto", "auto:512", "64", "1"])
def test_info_expert_cache_agrees_with_a_load(f16, prefill, ctx):
    """strata info --expert-cache answers from the load's own plan (the default --prefill and auto too)."""
    slot = strata.ModelInfo(f16).slot_bytes
    for cache in ("0.001", "0.02", "0.05", "0.1", "0.3", "1", "3", "12", f"{3 * slot}b", "all", "auto"):
        flags = ["--prefill", prefill] if prefill is not None else []
        r = run("info", f16, "--expert-cache", cache, *flags, "-c", str(ctx), "--json")
        assert r.exit_code == 0, r.output
        plan = json.loads(r.stdout)["cache"]
        try:
            m = strata.Model(f16, expert_cache=cache, prefill=prefill, ctx=ctx, source="mmap", progress=False)
        except strata.MemoryError as e:
            assert not plan["fits"] and plan["error"] == str(e), (cache, plan)
            continue
        assert plan["fits"], (cache, plan)
        assert plan["chunk"] == m.chunk, (cache, plan)
        assert plan["borrows"] == m.slots_for(m.chunk)
        assert plan["all_resident"] == m.cache["all_resident"] and plan["device"] == m.device
        if not plan["all_resident"]:
            assert plan["slots"] == m.cache["slots"]


def test_moe_layout_flag_reaches_the_load_and_the_plans(f16):
    """--moe-layout fused carves the fused layout's smaller chunk buffers: a cache with room for them and one
    expert loads with it and not under the default (the MMQ layout); strata info --expert-cache and
    strata layout plan the same chunk."""
    fused = strata.ModelInfo(f16, moe_layout="fused").layout(64, True)
    assert fused["slots"] < strata.ModelInfo(f16).layout(64, True)["slots"]
    cache = f"{(fused['slots'] + 1) * fused['slot_bytes']}b"
    load = ["--expert-cache", cache, "--prefill", "64", "--source", "mmap"]
    r = run("generate", f16, "-p", "Once upon", "-n", "2", "--temp", "0", "--moe-layout", "fused", *load)
    assert r.exit_code == 0, r.output
    r = run("generate", f16, "-p", "Once upon", "-n", "2", "--temp", "0", *load)
    assert r.exit_code == 2 and "--expert-cache" in r.stderr, r.output
    for name, kind in (("auto", "mmq"), ("mmq", "mmq"), ("fused", "fused")):
        r = run("layout", f16, "--tokens", "64", "--moe-layout", name, "--json")
        assert r.exit_code == 0 and json.loads(r.stdout)["kind"] == kind, r.output
        r = run("info", f16, "--expert-cache", cache, "--prefill", "64", "--moe-layout", name, "--json")
        assert r.exit_code == 0 and json.loads(r.stdout)["cache"]["fits"] == (name == "fused"), r.output


def test_auto_steps_down_below_256(f16):
    """Where some fixed --prefill loads, auto loads too (stepping down below 256 tokens if need be);
    where none does, both name the same smallest cache."""
    info = strata.ModelInfo(f16)
    took = set()
    for slots in range(1, 80, 3):
        cache = f"{slots * info.slot_bytes}b"
        if not info.plan_chunk(cache, 1, auto=False)["fits"]:
            with pytest.raises(strata.MemoryError, match="too small for any prompt chunk"):
                strata.Model(f16, expert_cache=cache, prefill="auto", source="mmap", progress=False)
            continue
        m = strata.Model(f16, expert_cache=cache, prefill="auto", source="mmap", progress=False)
        took.add(m.chunk)
        assert m.generate("hello there", max_tokens=2, temperature=0).stats["generated"] == 2
    assert min(took) < 256


# ---- help, and the flags of a llama.cpp user ----

def test_bare_strata_lists_the_commands():
    r = run()
    assert r.exit_code == 0
    for name in ("generate", "chat", "info", "layout", "bench", "demo"):
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(f"  {name} "))
        assert line.endswith(".") and not line.endswith("..."), line  # summaries are whole sentences


@pytest.mark.parametrize("name", ["generate", "chat", "info", "layout", "bench", "demo"])
def test_help_is_complete(name):
    cmd = main.commands[name]
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden:
            assert p.help, (name, p.name)
            shows = p.show_default or "[default:" in p.help or p.is_flag or p.default is None or p.multiple
            assert shows, (name, p.name)
    r = run(name, "--help")
    assert r.exit_code == 0 and "..." not in r.stdout.split("\n", 1)[1]
    assert r.stdout.count("[default:") >= sum(1 for p in cmd.params if isinstance(p, click.Option) and p.show_default)


def test_llama_cpp_flags(f16):
    a = run("generate", f16, "-p", "Once upon", "-n", "6", "--temp", "0", "-c", "64")
    b = run("generate", "-m", f16, "-p", "Once upon", "-n", "6", "--temp", "0", "--ctx", "64")
    c = run("generate", f16, "-m", f16, "-p", "Once upon", "-n", "6", "--temp", "0")
    assert a.exit_code == b.exit_code == c.exit_code == 0 and a.stdout == b.stdout == c.stdout
    for cmd in (["info", "-m", f16], ["layout", "-m", f16, "--tokens", "4"]):
        assert run(*cmd).exit_code == 0
    off = run("generate", f16, "-p", "Once upon", "-n", "12", "--temp", "0")
    none = run("generate", f16, "-p", "Once upon", "-n", "12", "--temp", "0", "--repeat-penalty", "5",
               "--repeat-last-n", "0")
    assert off.stdout == none.stdout  # a window of 0 tokens penalizes nothing
    m = strata.Model(f16, progress=False)
    ids = m.tokenize("Once upon")
    plain = m.generate(ids, max_tokens=12, temperature=0).tokens
    window = m.generate(ids, max_tokens=12, temperature=0, repetition_penalty=5.0, repeat_last_n=-1).tokens
    assert len(set(window)) >= len(set(plain))  # with every token penalized, no fewer distinct ones


# llama.cpp's flags that mean nothing here: refused with what strata does instead (exit 2), or
# ignored with a warning where strata always does what they ask (-fa, --mlock).
LLAMA_REFUSED = [
    (["-ngl", "99"], "--device"), (["--n-gpu-layers", "0"], "--device"), (["--gpu-layers=99"], "--device"),
    (["-ncmoe", "20"], "--expert-cache"), (["--n-cpu-moe", "20"], "--expert-cache"), (["-cmoe"], "--expert-cache"),
    (["--cpu-moe"], "--expert-cache"), (["-ot", "exps=CPU"], "--expert-cache"),
    (["--override-tensor", "exps=CPU"], "--expert-cache"), (["-b", "512"], "--prefill"),
    (["-ub", "512"], "--prefill"), (["--batch-size", "512"], "--prefill"), (["-ctk", "q8_0"], "--kv-type"),
    (["--cache-type-v", "f16"], "--kv-type"), (["--no-mmap"], "--source"), (["-cnv"], "strata chat"),
]
LLAMA_IGNORED = [["-fa"], ["-fa", "on"], ["--flash-attn", "off"], ["--flash-attn=auto"], ["--mlock"]]


@pytest.mark.parametrize("cmd", ["generate", "chat", "bench", "info"])
@pytest.mark.parametrize("flags, needle", LLAMA_REFUSED, ids=[" ".join(f) for f, _ in LLAMA_REFUSED])
def test_llama_cpp_flags_are_refused_with_what_strata_does(f16, cmd, flags, needle):
    r = run(cmd, f16, *flags, "-p", "hi") if cmd == "generate" else run(cmd, f16, *flags)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"strata: error: {' '.join(flags)} is a llama.cpp flag: "), lines
    assert needle in lines[0] and "not a valid integer" not in lines[0]


@pytest.mark.parametrize("flags", LLAMA_IGNORED, ids=[" ".join(f) for f in LLAMA_IGNORED])
def test_harmless_llama_cpp_flags_warn_and_run(f16, flags):
    plain = run("generate", f16, "-p", "Once upon", "-n", "4", "--temp", "0")
    r = run("generate", f16, *flags, "-p", "Once upon", "-n", "4", "--temp", "0")
    assert r.exit_code == 0 and r.stdout == plain.stdout, r.output
    assert r.stderr.startswith(f"strata: warning: ignoring the llama.cpp flag {' '.join(flags)}: ")
    assert r.stderr.count("\n") == 1


def test_a_llama_flag_as_a_value_is_a_value(f16):
    """-p -ngl is the prompt '-ngl'; -fa followed by a word that is not on/off is a bare -fa."""
    r = run("generate", f16, "-p", "-ngl", "-n", "2", "--temp", "0")
    assert r.exit_code == 0 and "llama.cpp" not in r.stderr
    r = run("generate", "-fa", f16, "-p", "hi", "-n", "2")
    assert r.exit_code == 0 and "ignoring the llama.cpp flag -fa:" in r.stderr


def test_load_defaults_are_the_native_ones(f16):
    """One source of load defaults: the native ModelConfig; strata.Model's keywords, ModelInfo.load_plan
    and every CLI flag take theirs from it, and a loaded model's config reads them back."""
    import inspect

    native = strata._core.ModelConfig()
    assert dict(strata.LOAD_DEFAULTS) == {
        "device": native.device, "expert_cache": native.expert_cache, "prefill": native.prefill,
        "source": native.source, "ctx": native.ctx, "threads": native.threads, "kv_type": native.kv_type,
        "decode_graph": native.decode_graph, "decode_resolve": native.decode_resolve,
        "cache_policy": native.cache_policy, "seqs": native.seqs, "moe_layout": native.moe_layout,
        "prefetch": "auto" if native.prefetch_auto else native.prefetch, "cpu_experts": native.cpu_experts}
    assert native.prefill_mode == "default"
    sig = inspect.signature(strata.Model).parameters
    for k, v in strata.LOAD_DEFAULTS.items():
        assert sig[k].default == (None if k == "prefill" else v), k
    flags = {"device": "device", "expert_cache": "expert_cache", "source": "source", "ctx": "ctx",
             "threads": "threads", "kv_type": "kv_type", "cache_policy": "cache_policy", "moe_layout": "moe_layout"}
    for name in ("generate", "chat", "bench"):
        params = {p.name: p for p in main.commands[name].params}
        for k, p in flags.items():
            if p in params:
                assert params[p].default == strata.LOAD_DEFAULTS[k], (name, k)
        assert params["prefetch"].default == strata.LOAD_DEFAULTS["prefetch"] == "auto", name
        assert params["prefill"].default is None  # the default chunk, stepping down
    assert {p.name: p.default for p in main.commands["info"].params}["ctx"] == strata.LOAD_DEFAULTS["ctx"]
    # strata serve loads --parallel KV regions (seqs).
    assert {p.name: p.default for p in main.commands["serve"].params}["parallel"] == strata.LOAD_DEFAULTS["seqs"]
    m = strata.Model(f16, progress=False, ctx=64)
    c = m._m.config
    assert (c.ctx, c.source, c.kv_type, c.prefill, c.prefill_mode) == (64, "auto", "auto", 8192, "default")
    assert c.expert_cache == "all" == m.expert_cache  # auto, as resolved on the CPU


@pytest.mark.parametrize("field, value, needle", [
    ("source", "disk", "source (--source)"), ("kv_type", "f8", "kv_type (--kv-type)"),
    ("decode_resolve", "gpu", "decode_resolve"), ("device", "tpu", "device (--device)"), ("ctx", 0, "ctx (-c/--ctx)"),
    ("prefill", 0, "--prefill"), ("threads", -1, "threads (-t/--threads)"),
])
def test_load_options_are_checked_natively_once(field, value, needle):
    """ModelConfig.check is the one check of a load's names and ranges (strata.Model calls it)."""
    c = strata._core.ModelConfig()
    setattr(c, field, value)
    with pytest.raises(strata.ConfigError, match=re.escape(needle)):
        c.check()


@pytest.mark.parametrize("decode_resolve", ["auto", "host"])
def test_stats_name_the_device_and_say_truly_how_decode_ran(f16, decode_resolve):
    """--stats and bench say which device ran (its kernels and threads on the CPU), and on the CPU
    never that experts were resolved 'on the device' or 'on the GPU'."""
    r = run("generate", f16, "-p", "hi", "-n", "3", "--stats", "-t", "1", "--expert-cache", "1MiB")
    assert r.exit_code == 0, r.output
    assert any(f"device   cpu ({isa}, 1 thread)" in r.stderr for isa in ("AVX-512 VNNI", "AVX2", "scalar"))
    m = strata.Model(f16, expert_cache="1MiB", threads=2, decode_resolve=decode_resolve, progress=False)
    st = m.generate("hi there", max_tokens=3, temperature=0).stats
    assert st["device"] == m.backend.describe() and st["device"].startswith("cpu (") and st["device"].endswith(
        ", 2 threads)")
    path = st["decode_path"]
    assert "on the device" not in path and "on the GPU" not in path and path.endswith("on the CPU)"), path
    r = run("bench", f16, "--prompt-tokens", "8", "--gen-tokens", "2", "-t", "1")
    assert r.exit_code == 0 and any(ln.split()[:2] == ["device", "cpu"] for ln in r.stdout.splitlines()), r.stdout
