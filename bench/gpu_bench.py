#!/usr/bin/env python3
"""GPU benchmark: decode tok/s and 2K-prompt tok/s on a strata.testing preset, every expert resident
and with a cache of half the experts (hit rate, GB streamed, achieved link GB/s). Prints a table and
writes JSON. Run by scripts/gpu-check; alone:

    PYTHONPATH=python python3 bench/gpu_bench.py --dir /tmp/strata-bench [--layers 48] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

import strata
from strata.testing import make_preset


def model_file(directory: str, preset: str, layers: int | None) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{preset}-L{layers or 'all'}.gguf")
    if not os.path.exists(path):
        t0 = time.monotonic()
        kw = {"layers": layers} if layers else {}
        make_preset(preset, path + ".tmp", seed=0, **kw)
        os.replace(path + ".tmp", path)
        print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB) in {time.monotonic() - t0:.0f} s", flush=True)
    return path


def run(path: str, label: str, prompt_tokens: int, gen_tokens: int, **kw: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    m = strata.Model(path, device="cuda", ctx=prompt_tokens + gen_tokens + 8, progress=False, **kw)
    load_s = time.monotonic() - t0
    hi = min(m.tokenizer.special_ids or [m.spec["vocab"]])
    ids = np.random.default_rng(0).integers(0, hi, size=prompt_tokens).tolist()
    m.generate(ids[:16], max_tokens=4, temperature=0)  # warm-up: first launches, first copies
    m.reset_stats()
    out = m.generate(ids, max_tokens=gen_tokens, temperature=0)
    st = out.stats
    c = m.cache
    lookups = c["hits"] + c["misses"]
    secs = (st["prompt_ms"] + st["decode_ms"]) / 1000
    return {
        "config": label, "load_s": load_s, "prompt_tokens": st["prompt_tokens"], "prompt_tps": st["prompt_tps"],
        "generated": st["generated"], "decode_tps": st["decode_tps"], "stop": st["stop_reason"],
        "hit_rate": c["hits"] / lookups if lookups else 1.0, "gb_streamed": c["bytes_streamed"] / 1e9,
        "link_gbps": c["bytes_streamed"] / 1e9 / secs if secs else 0.0, "slots": c["slots"],
        "all_resident": c["all_resident"], "source": c.get("source_kind"), "device": m.backend.describe(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the preset (a smaller file)")
    ap.add_argument("--dir", default="/tmp/strata-bench")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    path = model_file(a.dir, a.preset, a.layers)
    info = strata.ModelInfo(path)
    half = info.spec["expert_bytes"] // 2
    rows = [
        run(path, "expert-cache all", a.prompt_tokens, a.gen_tokens, expert_cache="all"),
        run(path, f"expert-cache {half >> 20} MiB (half)", a.prompt_tokens, a.gen_tokens,
            expert_cache=f"{half}b", prefill="auto:8192"),
    ]
    print(f"\n{os.path.basename(path)}: {info.spec['params_total'] / 1e9:.1f} B params, "
          f"experts {info.spec['expert_bytes'] / 2**30:.2f} GiB; {rows[0]['device']}")
    hdr = (f"{'config':<30} {'prompt tok/s':>12} {'decode tok/s':>12} {'hit rate':>9} {'GB streamed':>11} "
           f"{'link GB/s':>9}")
    print(hdr)
    for r in rows:
        print(f"{r['config']:<30} {r['prompt_tps']:>12.1f} {r['decode_tps']:>12.2f} {r['hit_rate']:>9.3f} "
              f"{r['gb_streamed']:>11.2f} {r['link_gbps']:>9.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": path, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
