#!/usr/bin/env python3
"""Expert-cache hit rates of the eviction policies (--cache-policy lru | lfu | scan) at caches of 10%, 25% and
50% of a model's experts: decode after a prompt, on any device (hit rates do not depend on it; the CPU
is enough). Prints a table, writes JSON.

    PYTHONPATH=python python3 bench/cache_policy.py [--tokens 128] [--json bench/out/cache_policy.json]

The model: strata.testing's qwen3moe writer at 8 layers x 128 experts, top-8 (a token needs 64 of the
1024; Q4_K experts; the routing of random weights, which bench/NOTES.md found far from uniform).
Decode feeds each step a token not decoded before (greedy with a repetition penalty of 1e6 over the decoded tokens, as
bench/gpu.py does), so consecutive steps route like fresh tokens rather than a repeated one.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np

import strata
from strata import _core
from strata.model import sampling_params
from strata.testing import make_qwen3moe

SHAPE = dict(layers=8, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=128, top_k=8, expert_ffn=256,
             vocab=1024)


def run(path: str, cache_bytes: int, policy: str, n_prompt: int, n_gen: int, prefill: int) -> dict[str, float]:
    m = strata.Model(path, ctx=n_prompt + n_gen + 8, progress=False, expert_cache=f"{cache_bytes}b",
                     prefill=prefill, cache_policy=policy)
    hi = min(m.tokenizer.special_ids or [m.spec["vocab"]])
    ids = np.random.default_rng(0).integers(0, hi, size=n_prompt).tolist()
    p = sampling_params(max_tokens=n_gen, temperature=0, repetition_penalty=1e6, repeat_last_n=n_gen)
    p.stop_ids = []
    g = _core.Generator(m._m)
    g.begin(ids, p)
    c0 = dict(m.cache)
    for _ in range(n_gen):
        if g.next() < 0:
            break
    c1 = dict(m.cache)
    hits, misses = c1["hits"] - c0["hits"], c1["misses"] - c0["misses"]
    return {"hits": hits, "misses": misses, "hit_rate": hits / max(hits + misses, 1),
            "gb_streamed": (c1["bytes_streamed"] - c0["bytes_streamed"]) / 1e9, "slots": c1["slots"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128, help="decoded tokens per run")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3, help="models (weight seeds) per row")
    ap.add_argument("--route-skew", type=float, default=0.0,
                    help="make_qwen3moe's route_skew (expert popularity; bench/routing.py measures it)")
    ap.add_argument("--route-locality", type=float, default=0.0,
                    help="make_qwen3moe's route_locality (consecutive tokens routing alike)")
    ap.add_argument("--json", default="bench/out/cache_policy.json")
    a = ap.parse_args()
    prefill = 16
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for seed in range(a.seeds):
            path = os.path.join(d, f"m{seed}.gguf")
            make_qwen3moe(path, **SHAPE, quant={"experts": "Q4_K"}, seed=seed, route_skew=a.route_skew,
                          route_locality=a.route_locality)
            info = strata.ModelInfo(path)
            plan = info.layout(prefill, True)
            n_experts = info.spec["layers"] * info.spec["experts"]
            for frac in (0.10, 0.25, 0.50):
                # The chunk's lent slots come on top: decode keeps frac of the experts.
                cache = (plan["slots"] + max(int(frac * n_experts), info.spec["top_k"])) * plan["slot_bytes"]
                for policy in ("lru", "lfu", "scan"):
                    r = run(path, cache, policy, a.prompt, a.tokens, prefill)
                    rows.append({"seed": seed, "cache_frac": frac, "policy": policy, **r})
    print(f"routing: route_skew {a.route_skew}, route_locality {a.route_locality}")
    print(f"{'cache':>6} {'policy':>6} {'hit rate (mean of seeds)':>26} {'min':>6} {'max':>6} {'GB/token':>9}")
    summary = []
    for frac in (0.10, 0.25, 0.50):
        for policy in ("lru", "lfu", "scan"):
            rs = [r for r in rows if r["cache_frac"] == frac and r["policy"] == policy]
            hr = [r["hit_rate"] for r in rs]
            gb = float(np.mean([r["gb_streamed"] for r in rs])) / a.tokens
            summary.append({"cache_frac": frac, "policy": policy, "hit_rate": float(np.mean(hr)),
                            "min": min(hr), "max": max(hr), "gb_per_token": gb})
            print(f"{frac:>6.0%} {policy:>6} {np.mean(hr):>26.3f} {min(hr):>6.3f} {max(hr):>6.3f} {gb:>9.5f}")
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"shape": SHAPE, "tokens": a.tokens, "prompt": a.prompt, "route_skew": a.route_skew,
                   "route_locality": a.route_locality, "rows": rows, "summary": summary}, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
