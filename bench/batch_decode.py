"""Batched decode without the server: B sequences (1, 4, 16 by default) decode together through
Model.generate_batch (one native pass a token for all) on a bounded expert cache, against the same
B sequences one after another (generate). Per B: tokens/s, the time of the B prompts (one pass each
alone; batched, one pass for all: run_prompts), the expert cache's hit rate, lookups and MiB streamed
per token. The model is the serve bench's synthetic Qwen3-MoE (8
layers, 32 experts top-4, Q4_K). Prints a table and writes bench/out/batch_decode.json.

    PYTHONPATH=python python3 bench/batch_decode.py [--batches 1,4,16] [--tokens 32] [--cache half] \
        [--cache-policy lru|lfu|scan] [--device cuda] [--decode-graph on|off]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import strata
from strata.testing import make_qwen3moe


def _model(d: str) -> str:
    path = os.path.join(d, "batch-bench.gguf")
    make_qwen3moe(path, layers=8, hidden=512, heads=8, kv_heads=2, head_dim=64, experts=32, top_k=4,
                  expert_ffn=512, vocab=2048, ctx=4096,
                  quant={"experts": "Q4_K", "attn": "Q8_0", "embed": "Q8_0", "output": "Q8_0"}, seed=3)
    return path


def _run(path: str, cache: str, policy: str, B: int, tokens: int, batched: bool, device: str = "auto",
         graph: bool = True) -> dict:
    if cache == "half":
        cache = f"{strata.ModelInfo(path).spec['expert_bytes'] // 2}b"
    m = strata.Model(path, progress=False, ctx=256 * B, seqs=B, expert_cache=cache, prefill="auto:256",
                     source="host", cache_policy=policy, device=device, decode_graph=graph)
    prompts = [f"Sequence {i}: the experts of layer {i % 8} are" for i in range(B)]
    kw = dict(max_tokens=tokens, temperature=0, ignore_eos=True)
    m.reset_stats()
    t0 = time.monotonic()
    cpu0 = time.process_time()
    if batched:
        outs = m.generate_batch(prompts, **kw)
    else:
        outs = [m.generate(p, **kw) for p in prompts]  # type: ignore[misc]
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    c = m.cache
    n = sum(len(o.tokens) for o in outs)  # type: ignore[union-attr]
    lookups = c["hits"] + c["misses"]
    # The prompts' time: each one's pass alone, summed; batched, the one pass they share (each reports it).
    pms = [o.stats["prompt_ms"] for o in outs]  # type: ignore[union-attr]
    return {"B": B, "mode": "batched" if batched else "one by one", "tokens": n, "wall_s": wall, "cpu_s": cpu,
            "prompt_ms": max(pms) if batched else sum(pms),
            "tok_s": n / wall, "hit_rate": c["hits"] / max(1, lookups), "lookups": lookups,
            "mib_per_token": c["bytes_streamed"] / 2**20 / n,
            "texts": [o.text for o in outs]}  # type: ignore[union-attr]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per sequence")
    ap.add_argument("--cache", default="half", help="--expert-cache; half: half the experts' bytes, so they stream")
    ap.add_argument("--cache-policy", default="lru", choices=["lru", "lfu", "scan"])
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto")
    ap.add_argument("--decode-graph", default="on", choices=["on", "off"],
                    help="off: every decode step op by op (what a batched step without a graph costs)")
    ap.add_argument("--out", default="bench/out/batch_decode.json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = _model(d)
        for B in (int(x) for x in a.batches.split(",")):
            one = _run(path, a.cache, a.cache_policy, B, a.tokens, False, a.device, a.decode_graph == "on")
            rows.append(one)
            if B > 1:
                rows.append(_run(path, a.cache, a.cache_policy, B, a.tokens, True, a.device, a.decode_graph == "on"))
                # Greedy: the batch gives each sequence its tokens alone (a check, not a timing).
                if rows[-1]["texts"] != one["texts"]:
                    raise SystemExit(f"B={B}: batched texts differ from the sequences alone")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (wall-clock numbers need an idle machine); "
          f"--cache {a.cache}, --cache-policy {a.cache_policy}, --device {a.device}, --decode-graph {a.decode_graph}")
    print(f"{'B':>3} {'mode':>10} {'tokens':>6} {'tok/s':>8} {'wall s':>7} {'cpu s':>7} {'prompt ms':>9} "
          f"{'hit rate':>8} {'lookups':>8} {'MiB/tok':>8}")
    for r in rows:
        print(f"{r['B']:>3} {r['mode']:>10} {r['tokens']:>6} {r['tok_s']:>8.1f} {r['wall_s']:>7.2f} {r['cpu_s']:>7.2f} "
              f"{r['prompt_ms']:>9.1f} {r['hit_rate']:>8.3f} {r['lookups']:>8} {r['mib_per_token']:>8.2f}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    for r in rows:
        del r["texts"]
    with open(a.out, "w") as f:
        json.dump({"rows": rows, "loadavg": os.getloadavg(), "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
