#!/usr/bin/env python3
"""End-to-end CPU benchmark of strata: load a (synthetic) MoE GGUF, then time a prompt and decode.

Writes the model from a strata.testing preset when needed (reused on later runs: a sidecar JSON
next to the file records the preset arguments and its size), loads it on the CPU, runs a short
warm-up generate (first touch of the weights), then one prompt of exactly --prompt-tokens random
token ids with max_tokens=--gen-tokens at temperature 0. Prints a table and writes a JSON report.

    PYTHONPATH=python python3 bench/e2e_cpu.py                       # Qwen3-30B-A3B shapes, ~17 GB file
    PYTHONPATH=python python3 bench/e2e_cpu.py --layers 2 --prompt-tokens 64 --gen-tokens 4 \\
        --dir /tmp/strata-bench                                      # quick check (~0.7 GB file)
    PYTHONPATH=python python3 bench/e2e_cpu.py --preset small
    PYTHONPATH=python python3 bench/e2e_cpu.py --model path/to/model.gguf

Random weights: greedy decoding may hit a stop token before --gen-tokens; the report says so
(stop_reason) and decode tok/s is then over the tokens generated.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "bench" / "out" / "e2e_cpu.json"
DEFAULT_DIR = REPO / "bench" / "out" / "models"
SIDECAR_VERSION = 1


# ---------------------------------------------------------------- machine and process info
def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine_info(threads: int) -> dict[str, Any]:
    cpuinfo = _read("/proc/cpuinfo")
    model, flags = None, set()
    for line in cpuinfo.splitlines():
        if model is None and line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        if not flags and line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    mem_total = None
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_total = int(line.split()[1]) * 1024
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu_model": model or platform.processor() or "unknown",
        "cpu_flags": sorted(f for f in ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                                        "avx_vnni", "amx_tile") if f in flags),
        "cores_logical": os.cpu_count(),
        "cores_usable": usable,
        "ram_bytes": mem_total,
        "threads": threads,
        "loadavg_start": list(os.getloadavg()),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def proc_status() -> dict[str, int]:
    """VmRSS / VmHWM / RssAnon / RssFile of this process, in bytes."""
    out = {}
    for line in _read("/proc/self/status").splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(line.split()[1]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Resets VmHWM (Linux >= 4.0), so the peak measures the load and the run, not the model writer."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def ru_maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- the model file
def preset_params(preset: str, layers: int | None, seed: int) -> dict[str, Any]:
    from strata.testing import PRESETS
    from strata.testing.models import PRESET_QUANT

    if preset not in PRESETS:
        sys.exit(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
    dims = dict(PRESETS[preset])
    if layers is not None:
        dims["layers"] = layers
    return {"version": SIDECAR_VERSION, "preset": preset, "dims": dims, "quant": dict(PRESET_QUANT), "seed": seed}


class WriteProgress:
    def __init__(self, label: str) -> None:
        self.label, self.t0, self.last = label, time.monotonic(), 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < (0.2 if self.tty else 10.0):
            return
        self.last = now
        el = max(now - self.t0, 1e-9)
        rate = done / el
        eta = (total - done) / rate if rate > 0 else 0.0
        line = (f"{self.label}: {done / 2**30:6.2f}/{total / 2**30:.2f} GiB {100 * done / max(total, 1):5.1f}% "
                f"{rate / 2**20:7.1f} MiB/s ETA {eta:5.0f}s")
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        if done >= total and self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()


def ensure_model(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """Returns (path, info): the --model file, or the preset file in --dir, written unless reusable."""
    if args.model:
        path = Path(args.model)
        if not path.exists():
            sys.exit(f"model file not found: {path}")
        return path, {"source": "given", "written": False}

    from strata.testing import make_preset

    params = preset_params(args.preset, args.layers, args.seed)
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{args.preset}-L{params['dims']['layers']}-s{args.seed}.gguf"
    sidecar = path.with_name(path.name + ".json")
    info: dict[str, Any] = {"source": "preset", "preset_params": params, "sidecar": str(sidecar)}
    if path.exists() and sidecar.exists():
        try:
            side = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            side = {}
        if side.get("params") == params and side.get("size") == path.stat().st_size:
            print(f"reusing {path} ({path.stat().st_size / 2**30:.2f} GiB; {sidecar.name} matches)", file=sys.stderr)
            return path, {**info, "written": False}
        print(f"{path} exists but does not match {sidecar.name}: rewriting", file=sys.stderr)
    part = path.with_name(path.name + ".part")
    sidecar.unlink(missing_ok=True)
    t0 = time.perf_counter()
    make_preset(args.preset, part, seed=args.seed, progress=WriteProgress(f"writing {path.name}"),
                **({"layers": args.layers} if args.layers is not None else {}))
    write_s = time.perf_counter() - t0
    os.replace(part, path)
    size = path.stat().st_size
    sidecar.write_text(json.dumps({"params": params, "size": size, "write_s": write_s}, indent=1) + "\n")
    print(f"wrote {path} ({size / 2**30:.2f} GiB) in {write_s:.1f} s", file=sys.stderr)
    return path, {**info, "written": True, "write_s": write_s}


def role_of(name: str) -> str:
    if name.startswith("token_embd"):
        return "embed"
    if name.startswith("output.") or name == "output.weight":
        return "output"
    if name.endswith("_norm.weight"):
        return "norm"
    if "_exps." in name or "_shexp." in name:
        return "experts" if "_exps." in name else "shared_expert"
    if "ffn_gate_inp" in name:
        return "router"
    if ".attn_" in name:
        return "attn"
    return "other"


def quant_mix(gguf_info: dict[str, Any]) -> dict[str, Any]:
    """{role: {type: bytes}} over the tensor table."""
    mix: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in gguf_info["tensors"]:
        mix[role_of(t["name"])][t["type_name"]] += int(t["nbytes"])
    return {r: dict(v) for r, v in sorted(mix.items())}


# ---------------------------------------------------------------- the run
def prompt_ids(tokenizer: Any, vocab: int, n: int, seed: int) -> tuple[list[int], list[int]]:
    """n ids drawn uniformly from the ordinary tokens: below the first special id, none special."""
    special = set(int(i) for i in getattr(tokenizer, "special_ids", ()) or ())
    hi = min([i for i in special if i > 0] + [vocab])
    pool = np.array([i for i in range(hi) if i not in special], dtype=np.int64)
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.choice(pool, size=n)], [0, int(hi)]


def timed_generate(m: Any, ids: list[int], max_tokens: int) -> dict[str, Any]:
    m.reset_stats()
    c0, t0 = cpu_seconds(), time.perf_counter()
    c = m.generate(ids, max_tokens=max_tokens, temperature=0.0)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    s = dict(c.stats)
    # The engine times decode passes only (the first token comes with the prompt's logits).
    forwards = int(s["decode_passes"])
    s["decode_forwards"] = forwards
    s["decode_ms_per_forward"] = s["decode_ms"] / forwards if forwards else None
    s["wall_s"] = wall
    s["cpu_s"] = cpu
    s["cpu_util"] = cpu / wall if wall > 0 else None  # cores kept busy on average; < threads on a shared box
    s["tokens_out"] = list(c.tokens)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="strata.testing preset (tiny, small, qwen3-30b-a3b)")
    ap.add_argument("--layers", type=int, default=None, help="override the preset's layer count (quick runs)")
    ap.add_argument("--model", default=None, help="use this GGUF instead of writing a preset")
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="where to write / reuse the preset file")
    ap.add_argument("--seed", type=int, default=0, help="weights seed of the preset file and the prompt ids")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--warmup-tokens", type=int, default=8, help="prompt length of the warm-up generate (2 new tokens)")
    ap.add_argument("--expert-cache", default="all", help="'all' or a size ('900MiB', '14.5GiB', MiB)")
    ap.add_argument("--prefill", default="8192", help="prompt chunk: N or auto[:MAX]")
    ap.add_argument("--source", default="auto", choices=("auto", "host", "mmap"))
    ap.add_argument("--ctx", type=int, default=None, help="context size (default: max(4096, prompt+gen+warm-up))")
    ap.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the JSON report")
    args = ap.parse_args()
    if args.prompt_tokens < 1 or args.gen_tokens < 0 or args.warmup_tokens < 1:
        ap.error("--prompt-tokens and --warmup-tokens must be >= 1, --gen-tokens >= 0")

    import strata

    report: dict[str, Any] = {"benchmark": "e2e_cpu", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "args": vars(args), "machine": machine_info(args.threads),
                              "strata": {"version": strata.__version__, "module": strata.__file__, **git_info()}}

    path, file_info = ensure_model(args)
    rss_after_write = ru_maxrss_bytes()
    hwm_reset = reset_peak_rss()
    gg = strata.inspect(path)
    report["model_file"] = {"path": str(path), "size_bytes": path.stat().st_size, **file_info,
                            "quant_mix_bytes": quant_mix(gg)}

    ctx = args.ctx or max(4096, args.prompt_tokens + args.gen_tokens + args.warmup_tokens + 8)
    t0 = time.perf_counter()
    m = strata.Model(path, device="cpu", expert_cache=args.expert_cache, prefill=args.prefill, source=args.source,
                     ctx=ctx, threads=args.threads, progress=sys.stderr.isatty())
    load_s = time.perf_counter() - t0
    spec = dict(m.spec)
    report["model"] = {"spec": spec, "ctx": ctx, "chunk": m.chunk, "load_s": load_s,
                       "rss_after_load": proc_status()}
    print(f"loaded in {load_s:.2f} s: L{spec['layers']} D{spec['hidden']} "
          f"E{spec['experts']} K{spec['top_k']} F{spec['expert_ffn']} V{spec['vocab']}", file=sys.stderr)

    ids, id_range = prompt_ids(m.tokenizer, spec["vocab"], args.prompt_tokens, args.seed)
    warm_ids, _ = prompt_ids(m.tokenizer, spec["vocab"], args.warmup_tokens, args.seed + 1)
    print(f"warm-up: {args.warmup_tokens} prompt tokens, 2 new", file=sys.stderr)
    warm = timed_generate(m, warm_ids, 2)
    print(f"run: {args.prompt_tokens} prompt tokens, {args.gen_tokens} new, temperature 0", file=sys.stderr)
    run = timed_generate(m, ids, args.gen_tokens)

    st = proc_status()
    report["prompt"] = {"tokens": args.prompt_tokens, "id_range": id_range, "seed": args.seed,
                        "first_ids": ids[:8]}
    report["warmup"] = {k: v for k, v in warm.items() if k != "tokens_out"}
    report["run"] = run
    report["memory"] = {"ru_maxrss_bytes": ru_maxrss_bytes(), "ru_maxrss_after_write_bytes": rss_after_write,
                        "peak_rss_load_and_run_bytes": st.get("VmHWM") if hwm_reset else None,
                        "rss_end": st}
    early = run["stop_reason"] != "max_tokens" and run["generated"] < args.gen_tokens
    report["notes"] = []
    if early:
        report["notes"].append(f"decode stopped early ({run['stop_reason']}) after {run['generated']} of "
                               f"{args.gen_tokens} tokens; decode tok/s is over the tokens generated")
    report["summary"] = {
        "load_s": load_s,
        "prompt_tps": run["prompt_tps"],
        "prompt_tps_first_call": warm["prompt_tps"],
        "decode_tps": run["decode_tps"],
        "generated": run["generated"],
        "stop_reason": run["stop_reason"],
        "peak_rss_bytes": report["memory"]["peak_rss_load_and_run_bytes"] or report["memory"]["ru_maxrss_bytes"],
    }

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print_table(report, out)


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n:.0f} B"


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def print_table(r: dict[str, Any], out: Path) -> None:
    mc, sp, run, warm, mem = r["machine"], r["model"]["spec"], r["run"], r["warmup"], r["memory"]
    mix = r["model_file"]["quant_mix_bytes"]
    rows = [
        ("machine", ""),
        ("cpu", f"{mc['cpu_model']} ({', '.join(mc['cpu_flags'])})"),
        ("cores usable / threads", f"{mc['cores_usable']} / {mc['threads']}  (load avg at start "
                                   f"{mc['loadavg_start'][0]:.2f})"),
        ("ram", _fmt_bytes(mc["ram_bytes"])),
        ("strata", f"{r['strata']['version']} @ {(r['strata']['commit'] or '?')[:12]}"
                   f"{' (dirty)' if r['strata']['dirty'] else ''}"),
        ("model", ""),
        ("file", f"{r['model_file']['path']} ({_fmt_bytes(r['model_file']['size_bytes'])}"
                 f"{', written now' if r['model_file'].get('written') else ''})"),
        ("shape", f"L{sp['layers']} D{sp['hidden']} E{sp['experts']} top-{sp['top_k']} F{sp['expert_ffn']} "
                  f"heads {sp['heads']}/{sp['kv_heads']}x{sp['head_dim']} V{sp['vocab']}"),
        ("params total / active", f"{sp['params_total'] / 1e9:.3f} B / {sp['params_active'] / 1e9:.3f} B"),
        ("dense / expert bytes", f"{_fmt_bytes(sp['dense_bytes'])} / {_fmt_bytes(sp['expert_bytes'])}"),
        ("quant mix", "; ".join(f"{role} {'+'.join(sorted(t))}" for role, t in mix.items())),
        ("cache", f"expert_cache={r['args']['expert_cache']} source={run.get('cache_source')} "
                  f"chunk={r['model']['chunk']} ctx={r['model']['ctx']}"),
        ("results", ""),
        ("load", f"{r['model']['load_s']:.2f} s"),
        ("first call (cold) prompt", f"{_f(warm['prompt_tps'])} tok/s  ({warm['prompt_tokens']} tokens, "
                                     f"{_f(warm['prompt_ms'])} ms)"),
        ("prompt", f"{_f(run['prompt_tps'])} tok/s  ({run['prompt_tokens']} tokens, {_f(run['prompt_ms'])} ms)"),
        ("decode", f"{_f(run['decode_tps'], 2)} tok/s  ({run['decode_forwards']} passes, "
                   f"{_f(run['decode_ms_per_forward'])} ms each, {run['generated']} tokens)"),
        ("generated / stop", f"{run['generated']} / {run['stop_reason']}"),
        ("cpu util (run)", f"{_f(run['cpu_util'], 2)} cores busy on average over {_f(run['wall_s'], 2)} s"),
        ("cache stats (run)", f"hits {run.get('cache_hits')} misses {run.get('cache_misses')} streamed "
                              f"{_fmt_bytes(run.get('cache_bytes_streamed'))} chunks {run.get('cache_chunks')}"),
        ("peak rss (load+run)", f"{_fmt_bytes(mem['peak_rss_load_and_run_bytes'])}  (process "
                                f"{_fmt_bytes(mem['ru_maxrss_bytes'])}; at end anon "
                                f"{_fmt_bytes(mem['rss_end'].get('RssAnon'))} file "
                                f"{_fmt_bytes(mem['rss_end'].get('RssFile'))})"),
    ]
    w = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"== {k} ==" if not v else f"  {k:<{w}}  {v}")
    for n in r["notes"]:
        print(f"  note: {n}")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
