"""Per-kernel time of strata's decode step, for ncu: a prompt, then decode steps op by op (no graph, so
each kernel is its own launch) between cudaProfilerStart and cudaProfilerStop. Run it under ncu and
summarize the CSV:

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \\
        --log-file /tmp/k.csv python3 bench/decode_profile.py MODEL.gguf --tokens 2
    python3 bench/decode_profile.py --summarize /tmp/k.csv --tokens 2

The summary lists each kernel's calls and microseconds per decoded token, largest first.
"""
from __future__ import annotations

import argparse
import collections
import csv
import ctypes
import io
import sys


def profile(path: str, tokens: int, prompt: int, cache: str, phase: str = "decode", moe_layout: str = "auto") -> None:
    import numpy as np

    import strata
    from strata import _core
    from strata.model import sampling_params

    m = strata.Model(path, device="cuda", ctx=prompt + tokens + 64, progress=False, expert_cache=cache,
                     decode_graph=False, moe_layout=moe_layout)
    # strata links the CUDA runtime statically: the driver's profiler calls act on the context its
    # runtime made current on this thread.
    drv = ctypes.CDLL("libcuda.so.1")
    ids = np.random.default_rng(0).integers(0, 1000, size=prompt).tolist()
    p = sampling_params(max_tokens=tokens + 2, temperature=0)
    p.stop_ids = []
    g = _core.Generator(m._m)
    if phase == "prompt":
        # One warm-up prompt outside the profile (first launches), then the profiled one; the warm-up's
        # tokens differ from the first, so none of the profiled prompt is reused from the cache.
        m.logits([(t + 1) % 1000 for t in ids[:64]])
        drv.cuProfilerStart()
        g.begin(ids, p)
        g.next()  # the prompt's chunks, then the first token
        drv.cuProfilerStop()
        return
    g.begin(ids, p)
    g.next()  # the first token: sampled from the prompt's logits
    g.next()  # one decode step outside the profile (first launches)
    drv.cuProfilerStart()
    for _ in range(tokens):
        g.next()
    drv.cuProfilerStop()


def summarize(csv_path: str, tokens: int) -> None:
    text = open(csv_path).read()
    start = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    per = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0][:90]
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        us = v / 1e3 if unit.startswith("n") else v if unit.startswith("u") else v * 1e3
        per[name][0] += 1
        per[name][1] += us
    total = sum(v[1] for v in per.values()) / tokens
    print(f"{'kernel':90s} {'calls/tok':>9s} {'us/tok':>9s} {'us/call':>8s}")
    for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:90s} {n / tokens:9.1f} {us / tokens:9.1f} {us / n:8.2f}")
    print(f"{'total kernel time per token':90s} {'':9s} {total:9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--tokens", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--expert-cache", default="all")
    ap.add_argument("--phase", choices=("decode", "prompt"), default="decode",
                    help="profile decode steps, or one prompt (summarize with --tokens 1: per prompt)")
    ap.add_argument("--moe-layout", default="auto", choices=("auto", "mmq", "fused"),
                    help="strata.Model(moe_layout=...): auto (the MMQ layout), mmq or fused")
    ap.add_argument("--summarize", default=None, help="an ncu CSV log to summarize")
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize, a.tokens)
    elif a.model:
        profile(a.model, a.tokens, a.prompt, a.expert_cache, a.phase, a.moe_layout)
    else:
        sys.exit("give a model file or --summarize CSV")


if __name__ == "__main__":
    main()
