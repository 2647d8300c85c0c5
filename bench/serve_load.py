"""strata serve under load: N concurrent clients (1, 4, 16 by default) against one server with
--parallel N and a bounded expert cache; per N and mode: requests, aggregate tok/s, latency p50/p99,
expert-cache hit rate, sequences a decode pass advanced, tokens re-run by switching sequences; and 8
concurrent requests against the same 8 in a row (--repeat times, interleaved: the median ratio).
Modes: batched (the model loaded with N KV regions, as `strata serve --parallel N` does: every
decoding sequence advances in one pass a step) and turns (one KV region: the sequences take turns of
--turn tokens, the engine before batching). Prints a table and writes bench/out/serve_load.json.

    PYTHONPATH=python python3 bench/serve_load.py [--clients 1,4,16] [--requests 2] [--tokens 32] \
        [--cache-policy auto|lru|lfu|scan] [--repeat 3]

--cache-policy auto (the default) is `strata serve`'s: scan where several slots decode together, else lru.
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
from strata.cli import _serve_policy
from strata.serve import Server
from strata.testing import make_qwen3moe


def _model(d: str) -> str:
    path = os.path.join(d, "serve-bench.gguf")
    make_qwen3moe(path, layers=8, hidden=512, heads=8, kv_heads=2, head_dim=64, experts=32, top_k=4,
                  expert_ffn=512, vocab=2048, ctx=4096,
                  quant={"experts": "Q4_K", "attn": "Q8_0", "embed": "Q8_0", "output": "Q8_0"}, seed=3)
    return path


def _run(path: str, cache: str, clients: int, requests: int, tokens: int, turn: int, mode: str,
         policy: str = "auto") -> dict:
    if cache == "half":  # half the experts' bytes: a cache that streams
        cache = f"{strata.ModelInfo(path).spec['expert_bytes'] // 2}b"
    seqs = clients if mode == "batched" else 1
    m = strata.Model(path, progress=False, ctx=256 * clients, seqs=seqs, expert_cache=cache, prefill="auto:256",
                     source="host", cache_policy=_serve_policy(policy, seqs, False))
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
    streamed = m1["bytes_streamed"] - m0["bytes_streamed"]
    return {"mode": mode, "device": m.device, "clients": clients, "requests": len(lat), "wall_s": wall,
            "tok_s": len(lat) * tokens / wall,
            "p50_s": statistics.median(lat), "p99_s": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))],
            "hit_rate": hits / max(1, hits + misses), "recomputed": counters.recomputed,
            "rows_per_pass": counters.batched_rows / counters.batched_steps if counters.batched_steps else 1.0,
            "generated": counters.generated,
            # a hit or miss is one expert of one layer of one pass: a batched pass looks each expert up once
            # for all its rows, so the bytes streamed per token say more than the rate
            "lookups": hits + misses, "streamed_bytes": streamed,
            "mib_per_token": streamed / 2**20 / (len(lat) * tokens),
            # the requests' own time in prompts and decode passes, summed (a batched pass counts for every row)
            "engine_s": counters.prompt_seconds + counters.decode_seconds,
            # the engine thread's steps: their wall clock, and the part in the decode passes' native calls
            "steps": counters.steps, "step_ms": 1e3 * counters.step_seconds / max(1, counters.steps),
            "pass_ms": 1e3 * counters.pass_seconds / max(1, counters.steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per request")
    ap.add_argument("--turn", type=int, default=16)
    ap.add_argument("--cache", default="half", help="--expert-cache; half: half the experts' bytes, so they stream")
    ap.add_argument("--cache-policy", default="auto", choices=["auto", "lru", "lfu", "scan"])
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of 8 in a row against 8 at once, interleaved (on a shared machine one pair is noise)")
    ap.add_argument("--modes", default="batched,turns", help="batched (N KV regions) and/or turns (one)")
    ap.add_argument("--out", default="bench/out/serve_load.json")
    a = ap.parse_args()
    modes = a.modes.split(",")
    if not set(modes) <= {"batched", "turns"}:
        ap.error(f"--modes takes batched and/or turns, got {a.modes!r}")
    rows = []
    t_cpu = time.process_time()
    with tempfile.TemporaryDirectory() as d:
        path = _model(d)
        for n in (int(x) for x in a.clients.split(",")):
            for mode in modes:
                if n == 1 and mode != modes[0]:
                    continue  # one client: one region either way
                rows.append(_run(path, a.cache, n, a.requests, a.tokens, a.turn, mode, a.cache_policy))
        pairs = [(_run(path, a.cache, 1, 8, a.tokens, a.turn, "batched", a.cache_policy),  # 8 in a row
                  _run(path, a.cache, 8, 1, a.tokens, a.turn, modes[0], a.cache_policy))  # 8 at once
                 for _ in range(max(1, a.repeat))]
    print(f"device {pairs[0][0]['device']}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          f"(wall-clock numbers need an idle machine); --cache-policy {a.cache_policy}")
    print(f"{'mode':>7} {'clients':>7} {'requests':>8} {'tok/s':>8} {'p50 s':>7} {'p99 s':>7} {'hit rate':>8} "
          f"{'lookups':>8} {'MiB/tok':>8} {'rows/pass':>9} {'re-run tok':>10}")
    for r in rows:
        print(f"{r['mode']:>7} {r['clients']:>7} {r['requests']:>8} {r['tok_s']:>8.1f} {r['p50_s']:>7.2f} "
              f"{r['p99_s']:>7.2f} {r['hit_rate']:>8.3f} {r['lookups']:>8} {r['mib_per_token']:>8.2f} "
              f"{r['rows_per_pass']:>9.2f} {r['recomputed']:>10}")
    print("hit rate: of expert lookups (an expert of a layer of a pass; a batched pass looks each up once for all its "
          "rows); MiB/tok: expert bytes streamed per generated token")
    ratios = [o["wall_s"] / e["wall_s"] for o, e in pairs]
    one, eight = pairs[sorted(range(len(pairs)), key=lambda i: ratios[i])[len(pairs) // 2]]  # the median pair
    speedup = one["wall_s"] / eight["wall_s"]
    print(f"8 requests in a row {one['wall_s']:.2f} s (engine {one['engine_s']:.2f} s, hit rate "
          f"{one['hit_rate']:.3f}), "
          f"8 at once ({modes[0]}) {eight['wall_s']:.2f} s (engine {eight['engine_s']:.2f} s, hit rate "
          f"{eight['hit_rate']:.3f}): {speedup:.2f}x, the median of {len(ratios)} "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")
    for what, r in (("in a row", one), ("at once", eight)):
        print(f"  {what}: {r['steps']} engine steps of {r['step_ms']:.3f} ms, {r['pass_ms']:.3f} ms of it in the "
              f"decode passes; {r['wall_s'] * 1e3 / max(1, r['steps']):.3f} ms of wall clock a step")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"rows": rows, "in_a_row": one, "at_once": eight, "speedup_8": speedup, "speedups_8": ratios,
                   "loadavg": os.getloadavg(), "cpu_s": time.process_time() - t_cpu, "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
