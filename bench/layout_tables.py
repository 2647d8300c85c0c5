"""Prefill layout tables for the issue notes: bytes per buffer at several T, with and without a source,
the slots a chunk borrows, and the chunk --prefill auto:MAX takes at several cache sizes.

    PYTHONPATH=python python3 bench/layout_tables.py [--model FILE] [--preset small] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import strata
from strata.testing import make_preset

MiB = 2**20


def tables(path: str, tokens: list[int], caches: list[int], auto_max: int) -> dict:
    m = strata.Model(path, expert_cache="all", prefill=1, ctx=1, progress=False)
    slot = m.spec["slot_bytes"]
    out = {"model": os.path.basename(path), "slot_bytes": slot, "layouts": [], "auto": []}
    for src in (True, False):
        for T in tokens:
            out["layouts"].append(m.layout(T, source=src))
    for c in caches:
        row = {"cache_mib": c, "slots": c * MiB // slot}
        for T in tokens:
            row[f"slots_borrowed_T{T}"] = -(-m.layout(T, source=True)["bytes_needed"] // slot)
        p = m.plan_chunk(c, auto_max)
        row[f"auto_{auto_max}"] = p["chunk"] if p["fits"] else None
        row["auto_needs_slots"] = p["needs"]
        out["auto"].append(row)
    return out


def show(t: dict, tokens: list[int], auto_max: int) -> None:
    print(f"\n## {t['model']}  (slot {t['slot_bytes']} bytes = {t['slot_bytes'] / MiB:.2f} MiB)")
    names = [b["name"] for b in t["layouts"][0]["buffers"]]
    for src in (True, False):
        lays = [x for x in t["layouts"] if x["source"] == src]
        names = []
        for x in lays:
            names += [b["name"] for b in x["buffers"] if b["name"] not in names]
        print(f"\nsource={'yes' if src else 'no'}  layout={lays[0]['kind']}   (MiB per buffer)")
        print(f"{'buffer':<16}" + "".join(f"{'T=' + str(T):>12}" for T in tokens))
        for n in names:
            cells = []
            for x in lays:
                b = next((b for b in x["buffers"] if b["name"] == n), None)
                cells.append(f"{b['bytes'] / MiB:12.2f}" if b else f"{'-':>12}")
            print(f"{n:<16}" + "".join(cells))
        print(f"{'bytes_needed':<16}" + "".join(f"{x['bytes_needed'] / MiB:12.2f}" for x in lays))
        if src:
            print(f"{'slots borrowed':<16}" + "".join(f"{x['slots']:>12}" for x in lays))
    print(f"\n{'cache MiB':>10} {'slots':>7}" + "".join(f"{'borrow T=' + str(T):>16}" for T in tokens)
          + f"{'auto:' + str(auto_max):>12}")
    for r in t["auto"]:
        print(f"{r['cache_mib']:>10} {r['slots']:>7}" + "".join(f"{r[f'slots_borrowed_T{T}']:>16}" for T in tokens)
              + f"{r[f'auto_{auto_max}'] or 'none fits'!s:>12}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="GGUF file (repeatable)")
    ap.add_argument("--preset", action="append", help="write this strata.testing preset to bench/out/models")
    ap.add_argument("--tokens", default="2048,8192,32768")
    ap.add_argument("--caches", default="14900,8000,4000", help="cache sizes in MiB")
    ap.add_argument("--auto-max", type=int, default=32768)
    ap.add_argument("--json", default="bench/out/layout_tables.json")
    a = ap.parse_args()
    tokens = [int(x) for x in a.tokens.split(",")]
    caches = [int(x) for x in a.caches.split(",")]
    paths = list(a.model or [])
    for name in a.preset or []:
        p = os.path.join("bench/out/models", f"{name}.gguf")
        if not os.path.exists(p):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            make_preset(name, p)
        paths.append(p)
    if not paths:
        ap.error("give --model FILE or --preset NAME")
    res = [tables(p, tokens, caches, a.auto_max) for p in paths]
    for t in res:
        show(t, tokens, a.auto_max)
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"\nwrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
