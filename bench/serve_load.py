"""strata serve under load: N concurrent clients (1, 4, 16 by default) against one server with
--parallel N and a bounded expert cache; per N: requests, aggregate tok/s, latency p50/p99, expert-
cache hit rate, tokens re-run by switching sequences; and 8 concurrent requests against the same 8
in a row. Prints a table and writes bench/out/serve_load.json.

    PYTHONPATH=python python3 bench/serve_load.py [--clients 1,4,16] [--requests 2] [--tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import openai

import strata
from strata.serve import Server
from strata.testing import make_qwen3moe


def _model(d: str) -> str:
    path = os.path.join(d, "serve-bench.gguf")
    make_qwen3moe(path, layers=8, hidden=512, heads=8, kv_heads=2, head_dim=64, experts=32, top_k=4,
                  expert_ffn=512, vocab=2048, ctx=4096,
                  quant={"experts": "Q4_K", "attn": "Q8_0", "embed": "Q8_0", "output": "Q8_0"}, seed=3)
    return path


def _run(path: str, cache: str, clients: int, requests: int, tokens: int, turn: int) -> dict:
    if cache == "half":  # half the experts' bytes: a cache that streams
        cache = f"{strata.ModelInfo(path).spec['expert_bytes'] // 2}b"
    m = strata.Model(path, progress=False, ctx=2048, expert_cache=cache, prefill="auto:256", source="host")
    s = Server(m, port=0, parallel=clients, queue=clients * requests, turn=turn).start()
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=600)

    def ask(i: int) -> float:
        t0 = time.monotonic()
        c.completions.create(model="x", prompt=f"Request {i}: the experts of layer {i % 8} are", max_tokens=tokens,
                             temperature=0, extra_body={"ignore_eos": True})
        return time.monotonic() - t0

    try:
        m0 = s.engine.call(lambda: dict(m.cache)).result()
        t0 = time.monotonic()
        with ThreadPoolExecutor(clients) as pool:
            lat = sorted(pool.map(ask, range(clients * requests)))
        wall = time.monotonic() - t0
        m1 = s.engine.call(lambda: dict(m.cache)).result()
        counters = s.engine.counters
    finally:
        s.stop()
    hits, misses = m1["hits"] - m0["hits"], m1["misses"] - m0["misses"]
    return {"clients": clients, "requests": len(lat), "wall_s": wall, "tok_s": len(lat) * tokens / wall,
            "p50_s": statistics.median(lat), "p99_s": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))],
            "hit_rate": hits / max(1, hits + misses), "recomputed": counters.recomputed,
            "generated": counters.generated,
            # the engine's own time in prompts and decode passes: the work, less the HTTP side's
            "engine_s": counters.prompt_seconds + counters.decode_seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per request")
    ap.add_argument("--turn", type=int, default=16)
    ap.add_argument("--cache", default="half", help="--expert-cache; half: half the experts' bytes, so they stream")
    ap.add_argument("--out", default="bench/out/serve_load.json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = _model(d)
        for n in (int(x) for x in a.clients.split(",")):
            rows.append(_run(path, a.cache, n, a.requests, a.tokens, a.turn))
        one = _run(path, a.cache, 1, 8, a.tokens, a.turn)  # 8 in a row
        eight = _run(path, a.cache, 8, 1, a.tokens, a.turn)  # 8 at once
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (wall-clock numbers need an idle machine)")
    print(f"{'clients':>7} {'requests':>8} {'tok/s':>8} {'p50 s':>7} {'p99 s':>7} {'hit rate':>8} {'re-run tok':>10} "
          f"{'engine s':>8}")
    for r in rows:
        print(f"{r['clients']:>7} {r['requests']:>8} {r['tok_s']:>8.1f} {r['p50_s']:>7.2f} {r['p99_s']:>7.2f} "
              f"{r['hit_rate']:>8.3f} {r['recomputed']:>10} {r['engine_s']:>8.2f}")
    speedup = one["wall_s"] / eight["wall_s"]
    print(f"8 requests in a row {one['wall_s']:.2f} s (engine {one['engine_s']:.2f} s), 8 at once "
          f"{eight['wall_s']:.2f} s (engine {eight['engine_s']:.2f} s): {speedup:.2f}x "
          "(nothing is batched yet: sequences take turns on one KV cache)")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"rows": rows, "in_a_row": one, "at_once": eight, "speedup_8": speedup,
                   "loadavg": os.getloadavg(), "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
