"""The `strata` command line: generate, info, layout, demo."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import click

import strata
from strata import GENERATE_DEFAULTS as DEFAULTS

GiB = 2**30
MiB = 2**20

_EXPERT_CACHE_HELP = ("Expert cache: MiB (14900), a size with units (14.5GiB, 900MiB), 'all' (every expert "
                      "resident) or 'auto'. On the CPU, auto means all.")
_PREFILL_HELP = "Prompt tokens per chunk: N, or auto[:MAX] for the largest chunk <= MAX (32768) that fits."


def _fail(e: Exception) -> None:
    click.echo(f"strata: error: {e}", err=True)
    sys.exit(2)


def _load(model: str, **kw: Any) -> strata.Model:
    try:
        return strata.Model(model, **kw)
    except (strata.Error, FileNotFoundError, ValueError) as e:
        _fail(e)


def _info(model: str, **kw: Any) -> strata.ModelInfo:
    try:
        return strata.ModelInfo(model, **kw)
    except (strata.Error, FileNotFoundError, ValueError) as e:
        _fail(e)


def _fmt_bytes(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def _print_stats(stats: dict[str, Any], err: bool = True) -> None:
    c = {k[len("cache_"):]: v for k, v in stats.items() if k.startswith("cache_")}
    lines = [
        f"prompt   {stats['prompt_tokens']} tokens in {stats['prompt_ms']:.0f} ms "
        f"({stats['prompt_tps']:.1f} tok/s), chunk {c.get('chunk')} x {c.get('chunks')}",
        f"decode   {stats['generated']} tokens in {stats['decode_ms']:.0f} ms ({stats['decode_tps']:.2f} tok/s), "
        f"stop: {stats['stop_reason']}",
        f"experts  source {c.get('source')}, cache "
        + ("all resident" if c.get("all_resident") else
           f"{c.get('slots')} slots x {_fmt_bytes(c.get('slot_bytes', 0))}"),
        f"cache    hits {c.get('hits')}, misses {c.get('misses')}, streamed {_fmt_bytes(c.get('bytes_streamed', 0))}, "
        f"evictions {c.get('evictions')}, refills {c.get('refills')}",
        f"prompt   slots borrowed {c.get('slots_borrowed')} ({_fmt_bytes(c.get('region_bytes', 0))})",
    ]
    for line in lines:
        click.echo(line, err=err)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="strata")
def main() -> None:
    """strata: run Mixture-of-Experts GGUF models with experts streamed through a device cache."""


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-p", "--prompt", default=None, help="Prompt text (with --chat: the user message).")
@click.option("-f", "--file", "prompt_file", type=click.File("r", encoding="utf-8"), default=None,
              help="Read the prompt from this file ('-' for stdin).")
@click.option("--system", default=None, help="With --chat: a system message before the user's.")
@click.option("-n", "--max-tokens", default=DEFAULTS["max_tokens"], show_default=True,
              help="Tokens to generate at most.")
@click.option("--device", default="auto", show_default=True,
              help="Compute device: auto (cuda when strata was built with it and a GPU is present, else cpu), "
                   "cuda or cpu.")
@click.option("--expert-cache", default="auto", show_default=True, help=_EXPERT_CACHE_HELP)
@click.option("--prefill", default="8192", show_default=True, help=_PREFILL_HELP)
@click.option("--source", type=click.Choice(["auto", "host", "mmap"]), default="auto", show_default=True,
              help="Where streamed experts live: a host copy or the mapped file.")
@click.option("--ctx", default=4096, show_default=True, help="KV cache length in tokens.")
@click.option("-t", "--threads", default=0, help="CPU threads (0: STRATA_THREADS or all cores).")
@click.option("--temp", "temperature", default=DEFAULTS["temperature"], show_default=True,
              help="Temperature; 0 is greedy.")
@click.option("--top-k", default=DEFAULTS["top_k"], show_default=True, help="Keep the K most likely tokens (0: off).")
@click.option("--top-p", default=DEFAULTS["top_p"], show_default=True,
              help="Nucleus: keep tokens up to this mass (1: off).")
@click.option("--min-p", default=DEFAULTS["min_p"], show_default=True,
              help="Drop tokens below this fraction of the best (0: off).")
@click.option("--repeat-penalty", default=DEFAULTS["repetition_penalty"], show_default=True,
              help=f"Penalize the last {DEFAULTS['penalty_last_n']} tokens (1: off).")
@click.option("--seed", type=int, default=None, help="Sampling seed (random if unset).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--stats", is_flag=True, help="Print timings and expert-cache stats to stderr.")
def generate(model: str, prompt: str | None, prompt_file: Any, system: str | None, max_tokens: int, device: str,
             expert_cache: str, prefill: str, source: str, ctx: int, threads: int, temperature: float, top_k: int,
             top_p: float, min_p: float, repeat_penalty: float, seed: int | None, stop: tuple[str, ...], chat: bool,
             stats: bool) -> None:
    """Generate text from MODEL (a GGUF file), streaming it to stdout."""
    if (prompt is None) == (prompt_file is None):
        _fail(strata.ConfigError("give the prompt with exactly one of -p/--prompt TEXT and -f/--file PATH"))
    if prompt_file is not None:
        prompt = prompt_file.read()
    if system is not None and not chat:
        _fail(strata.ConfigError("--system needs --chat (it is a chat message)"))
    m = _load(model, device=device, expert_cache=expert_cache, prefill=prefill, source=source, ctx=ctx,
              threads=threads)
    kw = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
              repetition_penalty=repeat_penalty, seed=seed, stop=list(stop), stream=True)
    try:
        msgs = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": prompt}]
        it = m.chat(msgs, **kw) if chat else m.generate(prompt, **kw)
        for piece in it:
            click.echo(piece, nl=False)
            sys.stdout.flush()
        click.echo()
    except strata.Error as e:
        _fail(e)
    if stats:
        _print_stats(m.last_stats)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--expert-cache", default=None, help="Also show slots and auto chunks for this cache size.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def info(model: str, expert_cache: str | None, as_json: bool) -> None:
    """Architecture, shapes, parameters, quant mix and memory of MODEL."""
    m = _info(model)
    s = m.spec
    mix: Counter[str] = Counter()
    mix_bytes: Counter[str] = Counter()
    for t in m.tensors:
        role = "experts" if "_exps." in t["name"] else "dense"
        mix[(role, t["type_name"])] += 1
        mix_bytes[(role, t["type_name"])] += t["nbytes"]
    out: dict[str, Any] = dict(s)
    out["file"] = model
    out["file_bytes"] = m.file_size
    out["bytes_per_expert"] = s["expert_bytes"] // (s["layers"] * s["experts"])
    out["quant_mix"] = [{"role": r, "type": ty, "tensors": n, "bytes": mix_bytes[(r, ty)]}
                        for (r, ty), n in sorted(mix.items())]
    if expert_cache is not None:
        out["cache"] = _cache_plan(m, expert_cache)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    rows = [
        ("architecture", f"{s['arch']} ({s['name']})" if s["name"] else s["arch"]),
        ("layers / hidden / vocab", f"{s['layers']} / {s['hidden']} / {s['vocab']}"),
        ("attention", f"{s['heads']} heads, {s['kv_heads']} kv heads, head_dim {s['head_dim']}"),
        *[(k, v) for k, v in s.get("details", [])],
        ("experts", f"{s['experts']} per layer, top-{s['top_k']}, ffn {s['expert_ffn']}"),
        ("parameters", f"{s['params_total'] / 1e9:.3f} B total, {s['params_active'] / 1e9:.3f} B active per token"),
        ("dense weights", _fmt_bytes(s["dense_bytes"])),
        ("experts", f"{_fmt_bytes(s['expert_bytes'])} ({out['bytes_per_expert'] / MiB:.2f} MiB per expert, "
                    f"slot {s['slot_bytes'] / MiB:.2f} MiB)"),
    ]
    for q in out["quant_mix"]:
        rows.append((f"quant {q['role']}", f"{q['type']}: {q['tensors']} tensors, {_fmt_bytes(q['bytes'])}"))
    if "cache" in out:
        c = out["cache"]
        rows.append(("expert cache", f"{c['cache_mib']:.0f} MiB = {c['slots']} slots of {c['slot_bytes']} bytes"))
        for T, chunk in c["auto_chunks"].items():
            rows.append((f"--prefill auto:{T} takes", str(chunk)))
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        click.echo(f"{k:<{w}}  {v}")


def _cache_plan(m: strata.ModelInfo, expert_cache: str) -> dict[str, Any]:
    try:
        plans = {T: m.plan_chunk(expert_cache, T) for T in (2048, 8192, 32768)}
    except strata.Error as e:
        _fail(e)
    cache = plans[2048]
    return {"cache_mib": cache["cache_bytes"] / MiB, "slot_bytes": m.slot_bytes, "slots": cache["cache_slots"],
            "auto_chunks": {T: p["chunk"] if p["fits"] else f"none fits: {p['error']}" for T, p in plans.items()}}


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--tokens", default=8192, show_default=True, help="Chunk size T.")
@click.option("--no-source", is_flag=True, help="Plan for an all-resident cache (no ExpertSource).")
@click.option("--unfused", is_flag=True, help="Plan with the GR read unfused (xn carved), as STRATA_GR_UNFUSED=1.")
@click.option("--expert-cache", default=None, help="Also show how many slots of this cache the chunk borrows.")
@click.option("--json", "as_json", is_flag=True)
def layout(model: str, tokens: int, no_source: bool, unfused: bool, expert_cache: str | None,
           as_json: bool) -> None:
    """Show the scratch buffers of one prompt chunk and the slots it borrows."""
    m = _info(model, gr_unfused=True if unfused else None)
    try:
        lay = m.layout(tokens=tokens, source=not no_source)
    except strata.Error as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(lay, indent=2))
        return
    click.echo(f"T={lay['tokens']}  layout={lay['kind']}  source={'yes' if lay['source'] else 'no'}  "
               f"GR={'unfused' if any(b['name'] == 'xn' for b in lay['buffers']) else 'fused'}")
    click.echo(f"{'buffer':<16} {'dtype':<6} {'shape':<24} {'offset':>14} {'bytes':>14}")
    for b in lay["buffers"]:
        shape = "x".join(str(d) for d in b["shape"])
        click.echo(f"{b['name']:<16} {b['dtype']:<6} {shape:<24} {b['offset']:>14} {b['bytes']:>14}")
    click.echo(f"bytes_needed {lay['bytes_needed']} ({_fmt_bytes(lay['bytes_needed'])}); slot {lay['slot_bytes']} "
               f"bytes; the chunk borrows {lay['slots']} slots")
    if expert_cache is not None:
        try:
            n = m.cache_slots(expert_cache)
        except strata.Error as e:
            _fail(e)
        left = n - lay["slots"]
        click.echo(f"--expert-cache {expert_cache}: {n} slots; the chunk borrows {lay['slots']}, "
                   + (f"leaving {left} for experts" if left > 0 else "more than the cache has"))


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--prompt-tokens", default=512, show_default=True, help="Prompt length (random token ids).")
@click.option("--gen-tokens", default=32, show_default=True, help="Tokens to decode (greedy).")
@click.option("--device", default="auto", show_default=True, help="Compute device: auto, cuda or cpu.")
@click.option("--expert-cache", default="auto", show_default=True, help=_EXPERT_CACHE_HELP)
@click.option("--prefill", default="8192", show_default=True, help=_PREFILL_HELP)
@click.option("--source", type=click.Choice(["auto", "host", "mmap"]), default="auto", show_default=True)
@click.option("-t", "--threads", default=0, help="CPU threads (0: STRATA_THREADS or all cores).")
@click.option("--seed", default=0, show_default=True, help="Seed of the random prompt.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Also write the results here.")
def bench(model: str, prompt_tokens: int, gen_tokens: int, device: str, expert_cache: str, prefill: str,
          source: str, threads: int, seed: int, json_out: str | None) -> None:
    """Time a prompt of random tokens and a greedy decode; print a table."""
    import numpy as np

    t0 = time.monotonic()
    m = _load(model, device=device, expert_cache=expert_cache, prefill=prefill, source=source,
              ctx=prompt_tokens + gen_tokens + 1, threads=threads)
    load_s = time.monotonic() - t0
    specials = sorted(m.tokenizer.special_ids)
    hi = specials[0] if specials and specials[0] > 0 else m.spec["vocab"]
    ids = np.random.default_rng(seed).integers(0, hi, size=prompt_tokens).tolist()
    m.reset_stats()
    try:
        out = m.generate(ids, max_tokens=gen_tokens, temperature=0.0)
    except strata.Error as e:
        _fail(e)
    st = out.stats
    res = {
        "model": model, "device": device, "threads": m.threads, "load_s": load_s,
        "prompt_tokens": st["prompt_tokens"], "prompt_tps": st["prompt_tps"], "generated": st["generated"],
        "decode_tps": st["decode_tps"], "stop_reason": st["stop_reason"],
        **{k: v for k, v in st.items() if k.startswith("cache_")},
    }
    rows = [
        ("model", f"{os.path.basename(model)}: {m.spec['arch']}, {m.spec['params_total'] / 1e9:.2f} B total, "
                  f"{m.spec['params_active'] / 1e9:.2f} B active"),
        ("device / threads", f"{device} / {res['threads']}"),
        ("load", f"{load_s:.2f} s"),
        ("prompt", f"{st['prompt_tokens']} tokens, {st['prompt_tps']:.1f} tok/s (chunk {st['cache_chunk']})"),
        ("decode", f"{st['generated']} tokens, {st['decode_tps']:.2f} tok/s (stop: {st['stop_reason']})"),
        ("experts", f"source {st['cache_source']}, hits {st['cache_hits']}, misses {st['cache_misses']}, "
                    f"streamed {_fmt_bytes(st['cache_bytes_streamed'])}"),
    ]
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        click.echo(f"{k:<{w}}  {v}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(res, f, indent=2)


@main.command()
@click.option("-n", "--max-tokens", default=48, show_default=True)
@click.option("--prompt", default="Experts stream into a cache of slots; the prompt borrows some of them.",
              show_default=True)
@click.option("--keep", type=click.Path(file_okay=False), default=None, help="Write the model here and keep it.")
def demo(max_tokens: int, prompt: str, keep: str | None) -> None:
    """Build a synthetic Qwen3-MoE GGUF and generate with a small expert cache.

    The model has random weights and a real tokenizer; its experts are streamed through a cache
    smaller than they are, so the stats show hits, misses and bytes streamed."""
    from strata.testing import make_qwen3moe

    d = keep or tempfile.mkdtemp(prefix="strata-demo-")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "demo-qwen3moe.gguf")
    t0 = time.monotonic()
    make_qwen3moe(path, layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=16, top_k=4,
                  expert_ffn=256, vocab=1024, quant={"experts": "Q4_K", "attn": "Q8_0", "embed": "Q8_0",
                                                     "output": "Q8_0"}, seed=1)
    click.echo(f"built {path} ({os.path.getsize(path) / MiB:.1f} MiB) in {time.monotonic() - t0:.1f} s")
    probe = strata.ModelInfo(path)
    experts = probe.spec["expert_bytes"]
    slot = probe.slot_bytes
    cache = max(experts * 2 // 5, slot * 24)
    click.echo(f"experts {experts / MiB:.2f} MiB in {probe.spec['layers'] * probe.spec['experts']} experts; "
               f"expert cache {cache / MiB:.2f} MiB ({cache // slot} slots)")
    # Chunks of 8 tokens: every chunk after the first lends slots that hold experts, so the stats
    # show evictions by the lend and the refills when the chunk gives its slots back.
    m = strata.Model(path, expert_cache=f"{cache}b", prefill=8, source="host", ctx=512)
    click.echo(f"prompt: {prompt!r} (random weights: expect noise, not prose)")
    for piece in m.generate(prompt, max_tokens=max_tokens, temperature=0.7, seed=7, stream=True):
        click.echo(piece, nl=False)
    click.echo()
    _print_stats(m.last_stats, err=False)
    if not keep:
        os.remove(path)
        os.rmdir(d)


if __name__ == "__main__":
    main()
