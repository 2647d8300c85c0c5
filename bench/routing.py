#!/usr/bin/env python3
"""How strata.testing's routing knobs (make_qwen3moe's route_skew and route_locality) route: per
setting, the experts that take 90% of the routing mass, how many of a token's top-k the previous token
also picked, and the hit rate of a per-layer LRU cache of 10%, 25% and 50% of the experts. The routing
is transformers' (Qwen3MoeForCausalLM on the same GGUF, output_router_logits), so nothing of strata's
decides it; the cache is simulated here per layer. Prints a table, writes JSON.

    PYTHONPATH=python python3 bench/routing.py [--tokens 384] [--settings '0,0;0.1,0.3'] [--json FILE]

Published figures to set the knobs against (bench/NOTES.md): Qwen3-30B-A3B puts ~90% of its routing
mass on ~51% of its experts, and an LRU cache of its experts hits ~89% with a small cache.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import OrderedDict

import numpy as np

from strata.testing import make_qwen3moe

SHAPE = dict(layers=8, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=128, top_k=8, expert_ffn=256,
             vocab=1024)
# (route_skew, route_locality): uniform, each knob alone, the mass concentration of the published figure,
# and strong locality.
SETTINGS = "0,0;0.25,0;0,0.4;0.1,0.3;0.5,0.9"


def routing(path: str, tokens: int) -> np.ndarray:
    """[layers, tokens, top_k] expert ids, in transformers' order."""
    import torch
    import transformers

    d, name = os.path.split(path)
    m = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, moe_intermediate_size=SHAPE["expert_ffn"], norm_topk_prob=True, dtype=torch.float32
    ).eval()
    ids = np.random.default_rng(0).integers(0, SHAPE["vocab"] - 16, size=tokens)
    with torch.no_grad():
        out = m(torch.tensor([ids.tolist()]), output_router_logits=True)
    return np.stack([lg.float().numpy().argsort(axis=-1)[:, ::-1][:, : SHAPE["top_k"]] for lg in out.router_logits])


def lru_hits(seq: np.ndarray, slots: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for picks in seq:
        for e in picks:
            total += 1
            if e in cache:
                hits += 1
                cache.move_to_end(e)
            else:
                cache[e] = None
                if len(cache) > slots:
                    cache.popitem(last=False)
    return hits / total


def stats(r: np.ndarray) -> dict[str, float]:
    _, T, K = r.shape
    E = SHAPE["experts"]
    mass, overlap = [], []
    for layer in r:
        counts = np.sort(np.bincount(layer.reshape(-1), minlength=E))[::-1]
        mass.append(int(np.searchsorted(np.cumsum(counts), 0.9 * counts.sum()) + 1) / E)
        overlap.append(np.mean([len(set(layer[t]) & set(layer[t - 1])) / K for t in range(1, T)]))
    out = {"experts_for_90pct_mass": float(np.mean(mass)), "consecutive_overlap": float(np.mean(overlap))}
    for frac in (0.10, 0.25, 0.50):
        out[f"lru_hit_{int(frac * 100)}pct"] = float(np.mean([lru_hits(layer, int(frac * E)) for layer in r]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--settings", default=SETTINGS, help="skew,locality pairs separated by ';'")
    ap.add_argument("--json", default="bench/out/routing.json")
    a = ap.parse_args()
    settings = [tuple(float(v) for v in pair.split(",")) for pair in a.settings.split(";")]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for skew, loc in settings:
            path = os.path.join(d, f"s{skew}-l{loc}.gguf")
            make_qwen3moe(path, **SHAPE, seed=1, route_skew=skew, route_locality=loc)
            rows.append({"route_skew": skew, "route_locality": loc, **stats(routing(path, a.tokens))})
            os.remove(path)
    hdr = f"{'skew':>5} {'locality':>8} {'90% mass on':>11} {'overlap':>7} {'LRU 10%':>7} {'LRU 25%':>7} {'LRU 50%':>7}"
    print(f"{SHAPE['layers']} layers x {SHAPE['experts']} experts, top-{SHAPE['top_k']}, {a.tokens} tokens")
    print(hdr)
    for r in rows:
        print(f"{r['route_skew']:>5} {r['route_locality']:>8} {r['experts_for_90pct_mass']:>11.2f} "
              f"{r['consecutive_overlap']:>7.2f} {r['lru_hit_10pct']:>7.3f} {r['lru_hit_25pct']:>7.3f} "
              f"{r['lru_hit_50pct']:>7.3f}")
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"shape": SHAPE, "tokens": a.tokens, "rows": rows}, f, indent=1)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
