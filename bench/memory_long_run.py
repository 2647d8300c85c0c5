#!/usr/bin/env python3
"""Memory over long runs: resident and virtual memory through a 10,000-token generation on a small
synthetic model (all experts resident, and streamed through a bounded cache), and across 30 failed
loads in one process. After the load, both curves should be flat: the KV cache, the decode scratch
and the expert cache are allocated once, and a failed load frees everything it allocated.

    PYTHONPATH=python python3 bench/memory_long_run.py                 # 10,000 tokens, 30 failed loads
    PYTHONPATH=python python3 bench/memory_long_run.py --tokens 2000   # quicker

Prints a table and writes bench/out/memory_long_run.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import strata
from strata.testing import make_qwen3moe

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "bench" / "out" / "memory_long_run.json"
SHAPE = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=16, top_k=2, expert_ffn=64, vocab=512)


def vm_mib() -> tuple[float, float]:
    """(VmRSS, VmSize) of this process in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmSize"].split()[0]) / 1024


def generation_curve(path: Path, tokens: int, every: int, expert_cache: str, threads: int) -> dict[str, Any]:
    gc.collect()
    before = vm_mib()
    m = strata.Model(path, ctx=tokens + 64, expert_cache=expert_cache, source="host", prefill=16, threads=threads,
                     progress=False)
    loaded = vm_mib()
    m.tokenizer.stop_ids = frozenset()  # nothing ends the run early: exactly `tokens` new tokens
    samples: list[dict[str, float]] = []
    t0 = time.perf_counter()
    pieces = 0
    for _ in m.generate("Once upon a time", max_tokens=tokens, temperature=0.8, seed=1, stream=True):
        pieces += 1
        done = len(getattr(m, "_last_tokens", ())) or pieces
        if done // every > len(samples) - 1 or not samples:
            rss, vms = vm_mib()
            samples.append({"tokens": done, "rss_mib": rss, "vm_mib": vms, "s": time.perf_counter() - t0})
    stats = m.last_stats
    rss, vms = vm_mib()
    samples.append({"tokens": stats.get("generated", pieces), "rss_mib": rss, "vm_mib": vms,
                    "s": time.perf_counter() - t0})
    first = samples[0]
    # The KV cache is allocated at load but its pages become resident as positions are written:
    # that much growth is expected, the rest would be a leak.
    spec = m.spec
    kv_per_token = 2 * spec["layers"] * spec["kv_heads"] * spec["head_dim"] * 4
    kv_written = (samples[-1]["tokens"] - first["tokens"]) * kv_per_token / 2**20
    return {
        "expert_cache": expert_cache,
        "tokens": stats.get("generated", pieces),
        "decode_tps": stats.get("decode_tps"),
        "rss_before_load_mib": before[0],
        "rss_after_load_mib": loaded[0],
        "rss_growth_after_first_sample_mib": samples[-1]["rss_mib"] - first["rss_mib"],
        "kv_written_mib": kv_written,
        "vm_growth_after_first_sample_mib": samples[-1]["vm_mib"] - first["vm_mib"],
        "samples": samples,
    }


def failed_loads(path: Path, n: int, threads: int) -> dict[str, Any]:
    def fail() -> str:
        try:
            strata.Model(path, expert_cache="64KiB", source="host", prefill=512, threads=threads, progress=False)
        except strata.MemoryError as e:
            return str(e)
        raise RuntimeError("the load was expected to fail: the cache is too small for the chunk")

    for _ in range(10):  # warm-up: imports, thread stacks, malloc's thresholds
        fail()
    gc.collect()
    rss0, vm0 = vm_mib()
    curve = []
    for i in range(n):
        fail()
        gc.collect()
        rss, vms = vm_mib()
        curve.append({"load": i + 1, "rss_mib": rss, "vm_mib": vms})
    return {"failed_loads": n, "rss_growth_mib": curve[-1]["rss_mib"] - rss0,
            "vm_growth_mib": curve[-1]["vm_mib"] - vm0, "error": fail(), "curve": curve}


def git_commit() -> str | None:
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=10_000, help="tokens to generate per run")
    ap.add_argument("--every", type=int, default=1000, help="sample memory every N tokens")
    ap.add_argument("--failed-loads", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = make_qwen3moe(Path(tmp) / "small.gguf", **SHAPE, ctx=args.tokens + 64, quant={"experts": "Q8_0"},
                             seed=7)
        runs = [generation_curve(path, args.tokens, args.every, cache, args.threads) for cache in ("all", "256KiB")]
        fails = failed_loads(path, args.failed_loads, args.threads)

    for r in runs:
        print(f"\n{r['tokens']} tokens, --expert-cache {r['expert_cache']} "
              f"(RSS {r['rss_before_load_mib']:.1f} MiB before the load, {r['rss_after_load_mib']:.1f} after; "
              f"{r['decode_tps']:.0f} tok/s)")
        print(f"{'tokens':>8} {'RSS MiB':>9} {'VmSize MiB':>11} {'seconds':>8}")
        for s in r["samples"]:
            print(f"{s['tokens']:>8} {s['rss_mib']:>9.1f} {s['vm_mib']:>11.1f} {s['s']:>8.1f}")
        g = r["rss_growth_after_first_sample_mib"]
        print(f"growth from the first sample to the last: RSS {g:+.2f} MiB (KV cache pages written: "
              f"{r['kv_written_mib']:.2f} MiB; beyond them {g - r['kv_written_mib']:+.2f} MiB), "
              f"VmSize {r['vm_growth_after_first_sample_mib']:+.2f} MiB")
    print(f"\n{fails['failed_loads']} failed loads ({fails['error'][:70]}...): "
          f"RSS {fails['rss_growth_mib']:+.2f} MiB, VmSize {fails['vm_growth_mib']:+.2f} MiB")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"shape": SHAPE, "commit": git_commit(), "generation": runs,
                                     "failed_loads": fails}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
