#!/usr/bin/env python3
"""How strata.testing's routing knobs (make_qwen3moe's route_skew and route_locality) route: per
setting, the experts that take 90% of the routing mass, how many of a token's top-k the previous token
also picked, the hit rate of a per-layer LRU cache of 10%, 25% and 50% of the experts, and how much of
layer l + 1's top-k its router predicts from layer l's hidden state (the prefetch of issue 18). The routing
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


def topk(logits: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-logits, axis=-1, kind="stable")[:, :k]


def routing(path: str, tokens: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """[layers, tokens, top_k] expert ids, in transformers' order; and the cross-layer predictions of
    layer l + 1's experts (issue 18 item 2) as [layers - 1, tokens, 2 top_k] ids, best first:
      "attn": layer l + 1's router on layer l's residual after its attention (what the MoE block of
              layer l reads), normed with layer l + 1's FFN norm: known while layer l's experts run;
      "layer": the same on layer l's output (layer l + 1's input): known only after layer l, while
              layer l + 1's attention runs."""
    import torch
    import transformers

    d, name = os.path.split(path)
    m = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, moe_intermediate_size=SHAPE["expert_ffn"], norm_topk_prob=True, dtype=torch.float32
    ).eval()
    layers = m.model.layers
    after_attn: list[torch.Tensor] = [torch.empty(0)] * len(layers)
    layer_in: list[torch.Tensor] = [torch.empty(0)] * len(layers)
    hooks = []
    for i, layer in enumerate(layers):
        def post(_mod, args, i=i):
            after_attn[i] = args[0].detach().reshape(-1, args[0].shape[-1])

        def pre(_mod, args, i=i):
            layer_in[i] = args[0].detach().reshape(-1, args[0].shape[-1])

        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(post))
        hooks.append(layer.input_layernorm.register_forward_pre_hook(pre))
    ids = np.random.default_rng(0).integers(0, SHAPE["vocab"] - 16, size=tokens)
    with torch.no_grad():
        out = m(torch.tensor([ids.tolist()]), output_router_logits=True)
        K = SHAPE["top_k"]
        actual = np.stack([topk(lg.float().numpy(), K) for lg in out.router_logits])
        preds: dict[str, list[np.ndarray]] = {"attn": [], "layer": []}
        for i in range(len(layers) - 1):
            nxt = layers[i + 1]
            for kind, h in (("attn", after_attn[i]), ("layer", layer_in[i + 1])):
                x = nxt.post_attention_layernorm(h)
                preds[kind].append(topk((x @ nxt.mlp.gate.weight.T).float().numpy(), 2 * K))
    for h in hooks:
        h.remove()
    return actual, {k: np.stack(v) for k, v in preds.items()}


def prediction(actual: np.ndarray, preds: dict[str, np.ndarray]) -> dict[str, float]:
    """The share of layer l + 1's top-k that each prediction's top-k (and top-2k) holds."""
    K = actual.shape[2]
    out = {}
    for kind, p in preds.items():
        for n, tag in ((K, "k"), (2 * K, "2k")):
            got = [len(set(p[i, t, :n]) & set(actual[i + 1, t])) / K for i in range(p.shape[0])
                   for t in range(p.shape[1])]
            out[f"predict_{kind}_top{tag}"] = float(np.mean(got))
    return out


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
            actual, preds = routing(path, a.tokens)
            rows.append({"route_skew": skew, "route_locality": loc, **stats(actual), **prediction(actual, preds)})
            os.remove(path)
    hdr = (f"{'skew':>5} {'locality':>8} {'90% mass on':>11} {'overlap':>7} {'LRU 10%':>7} {'LRU 25%':>7} "
           f"{'LRU 50%':>7} {'pred attn k':>11} {'attn 2k':>7} {'pred layer k':>12} {'layer 2k':>8}")
    print(f"{SHAPE['layers']} layers x {SHAPE['experts']} experts, top-{SHAPE['top_k']}, {a.tokens} tokens")
    print(hdr)
    for r in rows:
        print(f"{r['route_skew']:>5} {r['route_locality']:>8} {r['experts_for_90pct_mass']:>11.2f} "
              f"{r['consecutive_overlap']:>7.2f} {r['lru_hit_10pct']:>7.3f} {r['lru_hit_25pct']:>7.3f} "
              f"{r['lru_hit_50pct']:>7.3f} {r['predict_attn_topk']:>11.3f} {r['predict_attn_top2k']:>7.3f} "
              f"{r['predict_layer_topk']:>12.3f} {r['predict_layer_top2k']:>8.3f}")
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"shape": SHAPE, "tokens": a.tokens, "rows": rows}, f, indent=1)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
