"""The GPU's timeline of strata's decode steps or of one prompt: what ran on which stream, when, and how much
of the link's work overlapped the compute. It stands in for an Nsight Systems summary (nsys is not on the GPU
machines): the activity records come from CUPTI through PyTorch's profiler, which traces every kernel, copy
and memset of the process, strata's included (torch is a profiling tool here, never a strata dependency).

    python3 bench/timeline.py MODEL.gguf --expert-cache 14900MiB --phase decode --tokens 16 --json t.json
    python3 bench/timeline.py MODEL.gguf --expert-cache 14900MiB --phase prompt --prompt 2048
    python3 bench/timeline.py --summarize TRACE.json --tokens 16      # a trace written before (--trace)

Each activity falls in one class:
  copy     the copy engine's host-to-device copies (a prompt's expert fills, the prefetch's);
  fill     kernels that read expert bytes from the host: the zero-copy `fill_kernel`;
  experts  the experts' matmul kernels (a bounded decode's write-through ones read their misses from the host
           themselves, so there the link's time is inside this class);
  compute  every other kernel and memset.
A kernel launched early (programmatic dependent launch: it starts while the one before it on its stream still
runs, and waits inside for it) counts from the end of the activities before it on its stream: its own time. The
classes' busy times and the table of activities use those own intervals, so a small kernel queued behind a
long one is not charged the long one's time (the table also gives each one's start-to-end time).
The summary gives, per token (decode) or per prompt: the span from the first activity's start to the last
one's end, each class's busy time (the union of its intervals), the time the copy engine and the kernels ran
at once, the GPU's idle time inside the span (waits on the host: downloads, syncs, launches), and the two
bounds a schedule is judged by: sum (copies then kernels, nothing overlapped) and max (perfect overlap).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
import time
from collections.abc import Iterable
from typing import Any

CLASSES = ("copy", "fill", "experts", "compute")


def base_name(name: str) -> str:
    """A kernel's name without its argument list; "(anonymous namespace)::" is dropped first, so the kernels of
    an anonymous namespace keep their own names (a plain cut at the first "(" left "strata::cuda::" for all)."""
    return name.replace("(anonymous namespace)::", "").split("(")[0]


def classify(cat: str, name: str) -> str | None:
    """The class of one trace event, or None for what is not GPU work (CPU ops, flows, counters)."""
    if cat == "gpu_memcpy":
        return "copy" if "HtoD" in name or "Host to Device" in name else "compute"
    if cat == "gpu_memset":
        return "compute"
    if cat != "kernel":
        return None
    base = base_name(name)
    if "fill_kernel" in base:
        return "fill"
    if "experts" in base:
        return "experts"
    return "compute"


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same points as `intervals` (empty ones dropped)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def length(ivs: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in ivs)


def intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intersection of two unions (each sorted and disjoint)."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPU activities of a Chrome trace (PyTorch's export): class, name, stream, start and end in us, bytes."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        cls = classify(str(e.get("cat", "")), str(e.get("name", "")))
        if cls is None:
            continue
        args = e.get("args", {}) or {}
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        out.append({"class": cls, "name": str(e["name"]), "stream": args.get("stream", -1), "start": ts,
                    "end": ts + dur, "bytes": int(args.get("bytes", 0) or 0)})
    return out


def own_intervals(ev: list[dict[str, Any]]) -> None:
    """Sets each activity's "own" start: its start, or the latest end of the activities before it on its stream
    where that is later (a kernel launched early waits inside for those; from then on the time is its own)."""
    last: dict[Any, float] = {}
    for e in sorted(ev, key=lambda e: (str(e["stream"]), e["start"], e["end"])):
        prev = last.get(e["stream"], float("-inf"))
        e["own_start"] = min(max(e["start"], prev), e["end"])
        last[e["stream"]] = max(prev, e["end"])


def summarize_events(ev: list[dict[str, Any]], units: int) -> dict[str, Any]:
    """Busy times, overlaps and idle time of a list of activities, in us per unit (a token or a prompt)."""
    if not ev:
        raise ValueError("the trace holds no GPU activity: was the profiler's CUDA tracing on?")
    units = max(units, 1)
    own_intervals(ev)
    t0, t1 = min(e["start"] for e in ev), max(e["end"] for e in ev)
    by_class = {c: union((e["own_start"], e["end"]) for e in ev if e["class"] == c) for c in CLASSES}
    kernels = union(iv for c in ("fill", "experts", "compute") for iv in by_class[c])
    copies = by_class["copy"]
    everything = union(kernels + copies)
    both = intersect(copies, kernels)
    copy_bytes = sum(e["bytes"] for e in ev if e["class"] == "copy")
    span = t1 - t0
    busy = {c: length(by_class[c]) for c in CLASSES}
    k, c = length(kernels), length(copies)
    streams: dict[Any, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in ev:
        streams[e["stream"]][0] += 1
    for s in streams:
        streams[s][1] = length(union((e["start"], e["end"]) for e in ev if e["stream"] == s))
    top: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for e in ev:
        key = base_name(e["name"])[:100]
        top[key][0] += 1
        top[key][1] += e["end"] - e["start"]
        top[key][2] += e["end"] - e["own_start"]
    return {
        "units": units,
        "span_us": span / units,
        "busy_us": {cl: v / units for cl, v in busy.items()},
        "kernels_us": k / units,
        "copies_us": c / units,
        "copy_and_kernels_us": length(both) / units,
        "gpu_busy_us": length(everything) / units,
        "idle_us": (span - length(everything)) / units,
        "bound_sum_us": (k + c) / units,
        "bound_max_us": max(k, c) / units,
        # of the shorter of the two, how much ran beside the other (1: all of it)
        "overlap": length(both) / min(k, c) if min(k, c) > 0 else None,
        "copy_bytes": copy_bytes / units,
        "copy_gbps_busy": copy_bytes / c / 1e3 if c > 0 else None,
        "streams": {str(s): {"events": n / units, "busy_us": b / units} for s, (n, b) in streams.items()},
        "top": sorted(({"name": n, "calls": cnt / units, "us": us / units, "own_us": own / units}
                       for n, (cnt, us, own) in top.items()), key=lambda r: -r["own_us"])[:20],
    }


def print_summary(s: dict[str, Any], what: str) -> None:
    per = f"a {what}"
    print(f"| {per} | us |")
    print("| --- | --- |")
    print(f"| span (first start to last end) | {s['span_us']:,.1f} |")
    for cl in CLASSES:
        print(f"| busy: {cl} | {s['busy_us'][cl]:,.1f} |")
    print(f"| kernels (any class) | {s['kernels_us']:,.1f} |")
    print(f"| copies and kernels at once | {s['copy_and_kernels_us']:,.1f} |")
    print(f"| GPU idle inside the span | {s['idle_us']:,.1f} |")
    print(f"| bound if nothing overlapped (copies + kernels) | {s['bound_sum_us']:,.1f} |")
    print(f"| bound if all overlapped (max) | {s['bound_max_us']:,.1f} |")
    if s["overlap"] is not None:
        print(f"| overlap (of the shorter, the share beside the other) | {s['overlap']:.2f} |")
    if s["copy_gbps_busy"] is not None:
        print(f"| copy-engine bytes {s['copy_bytes'] / 1e9:,.3f} GB at {s['copy_gbps_busy']:.1f} GB/s while busy | |")
    print()
    print(f"{'stream':>8s} {'events':>9s} {'busy us':>10s}")
    for st, v in sorted(s["streams"].items(), key=lambda kv: -kv[1]["busy_us"]):
        print(f"{st:>8s} {v['events']:9.1f} {v['busy_us']:10.1f}")
    print()
    print(f"{'activity':100s} {'calls':>7s} {'own us':>9s} {'us':>9s}")
    for r in s["top"]:
        print(f"{r['name']:100s} {r['calls']:7.1f} {r['own_us']:9.1f} {r['us']:9.1f}")


def load_trace(path: str) -> dict[str, Any]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def profile(a: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    import strata
    from strata import _core
    from strata.model import sampling_params

    m = strata.Model(a.model, device="cuda", ctx=a.prompt + a.tokens + 64, progress=False,
                     expert_cache=a.expert_cache, source=a.source, prefetch=a.prefetch, prefill=a.prefill,
                     moe_layout=a.moe_layout)
    ids = np.random.default_rng(0).integers(0, 1000, size=a.prompt).tolist()
    p = sampling_params(max_tokens=a.tokens + 4, temperature=0)
    p.stop_ids = []
    g = _core.Generator(m._m)
    torch.cuda.init()  # the profiler's CUDA tracing attaches to the process's primary context
    run: dict[str, Any] = {"phase": a.phase, "expert_cache": a.expert_cache, "source": a.source,
                           "prompt": a.prompt, "moe_layout": a.moe_layout}
    if a.phase == "prompt":
        m.logits([(t + 1) % 1000 for t in ids[:64]])  # first launches outside the trace; other tokens
        m.reset_stats()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            g.begin(ids, p)
            g.next()  # the prompt's chunks, then the first token
            run["wall_ms"] = (time.perf_counter() - t) * 1e3
        units = 1
    else:
        g.begin(ids, p)
        g.next()  # the first token, from the prompt's logits
        for _ in range(a.warmup):
            g.next()  # graph recording and first launches outside the trace
        m.reset_stats()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            for _ in range(a.tokens):
                g.next()
            run["wall_ms"] = (time.perf_counter() - t) * 1e3 / a.tokens
        units = a.tokens
    st = m.cache
    run["bytes_streamed"] = st["bytes_streamed"] / units
    looked_up = st["hits"] + st["misses"]
    run["hit_rate"] = st["hits"] / looked_up if looked_up else None
    trace_path = a.trace or "/tmp/strata-timeline-trace.json"
    prof.export_chrome_trace(trace_path)
    run["trace"] = trace_path
    return run, summarize_events(events(load_trace(trace_path)), units)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--phase", choices=("decode", "prompt"), default="decode")
    ap.add_argument("--tokens", type=int, default=16, help="decode steps traced (decode), or units of a trace")
    ap.add_argument("--warmup", type=int, default=4, help="decode steps before the trace")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (the traced prompt, or before decode)")
    ap.add_argument("--expert-cache", default="all")
    ap.add_argument("--source", default="auto")
    ap.add_argument("--prefetch", default="auto")
    ap.add_argument("--prefill", default=None)
    ap.add_argument("--moe-layout", default="auto", choices=("auto", "mmq", "fused"),
                    help="strata.Model(moe_layout=...): auto (the MMQ layout), mmq or fused")
    ap.add_argument("--trace", default=None, help="where the Chrome trace goes (default /tmp)")
    ap.add_argument("--json", default=None, help="write the run and its summary here")
    ap.add_argument("--summarize", default=None, help="a Chrome trace (.json or .json.gz) to summarize instead")
    a = ap.parse_args()
    if a.summarize:
        run: dict[str, Any] = {"trace": a.summarize}
        summary = summarize_events(events(load_trace(a.summarize)), a.tokens)
        what = "unit"
    elif a.model:
        if a.tokens < 1 or a.prompt < 1:
            sys.exit("--tokens and --prompt must be at least 1")
        run, summary = profile(a)
        what = "token" if a.phase == "decode" else "prompt"
        extra = f", {run['bytes_streamed'] / 1e9:.3f} GB streamed a {what}"
        print(f"wall {run['wall_ms']:.2f} ms a {what}{extra}, hit rate {run['hit_rate']}")
    else:
        sys.exit("give a model file or --summarize TRACE")
    print_summary(summary, what)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"run": run, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
