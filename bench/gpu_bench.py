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
    m.generate(ids[:16], max_tokens=4, temperature=0)  # warm-up: first launches, first copies, the graph
    m.reset_stats()
    # stream=True runs the prompt before it returns: the cache counters then split prompt from decode.
    pieces = m.generate(ids, max_tokens=gen_tokens, temperature=0, stream=True)
    c0 = dict(m.cache)
    for _ in pieces:
        pass
    st = m.last_stats
    c1 = m.cache

    def phase(a: dict[str, Any], b: dict[str, Any], ms: float) -> dict[str, float]:
        hits, misses = b["hits"] - a["hits"], b["misses"] - a["misses"]
        gb = (b["bytes_streamed"] - a["bytes_streamed"]) / 1e9
        return {"hit_rate": hits / (hits + misses) if hits + misses else 1.0, "gb": gb,
                "link_gbps": gb / (ms / 1000) if ms > 0 else 0.0}

    zero = {k: 0 for k in ("hits", "misses", "bytes_streamed")}
    pr, dec = phase(zero, c0, st["prompt_ms"]), phase(c0, c1, st["decode_ms"])
    lookups = c1["hits"] + c1["misses"]
    return {
        "config": label, "load_s": load_s, "prompt_tokens": st["prompt_tokens"], "prompt_tps": st["prompt_tps"],
        "generated": st["generated"], "decode_tps": st["decode_tps"],
        "decode_ms_per_token": st["decode_ms"] / st["decode_passes"] if st["decode_passes"] else 0.0,
        "stop": st["stop_reason"], "decode_graph": m._m.decode_graph_active, "decode_resolve": m._m.decode_resolution,
        "hit_rate": c1["hits"] / lookups if lookups else 1.0, "gb_streamed": c1["bytes_streamed"] / 1e9,
        "prompt_hit_rate": pr["hit_rate"], "prompt_gb": pr["gb"], "prompt_link_gbps": pr["link_gbps"],
        "decode_hit_rate": dec["hit_rate"], "decode_gb": dec["gb"], "decode_link_gbps": dec["link_gbps"],
        "slots": c1["slots"], "all_resident": c1["all_resident"], "source": c1.get("source_kind"),
        "device": m.backend.describe(),
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
        run(path, "expert-cache all, no graph", a.prompt_tokens, a.gen_tokens, expert_cache="all",
            decode_graph=False),
        run(path, f"half ({half >> 20} MiB), resolve device", a.prompt_tokens, a.gen_tokens,
            expert_cache=f"{half}b", prefill="auto:8192", decode_resolve="device"),
        run(path, "half, resolve device, no graph", a.prompt_tokens, a.gen_tokens,
            expert_cache=f"{half}b", prefill="auto:8192", decode_resolve="device", decode_graph=False),
        run(path, "half, resolve host", a.prompt_tokens, a.gen_tokens,
            expert_cache=f"{half}b", prefill="auto:8192", decode_resolve="host"),
    ]
    print(f"\n{os.path.basename(path)}: {info.spec['params_total'] / 1e9:.1f} B params, "
          f"experts {info.spec['expert_bytes'] / 2**30:.2f} GiB; {rows[0]['device']}")
    hdr = (f"{'config':<34} {'prompt tok/s':>12} {'decode tok/s':>12} {'ms/token':>8} {'hit rate':>9} "
           f"{'GB streamed':>11} {'link GB/s p/d':>13}")
    print(hdr)
    for r in rows:
        print(f"{r['config']:<34} {r['prompt_tps']:>12.1f} {r['decode_tps']:>12.2f} "
              f"{r['decode_ms_per_token']:>8.2f} {r['hit_rate']:>9.3f} {r['gb_streamed']:>11.2f} "
              f"{r['prompt_link_gbps']:>6.1f}/{r['decode_link_gbps']:<6.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": path, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
