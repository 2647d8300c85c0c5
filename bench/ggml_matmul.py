#!/usr/bin/env python3
"""strata's CPU matmul beside llama.cpp's (ggml's mul_mat) per quant type, on this machine, in one run:
T = 1 (decode, bound by memory: weight GB/s) and T = 8, on the shapes of bench/quant_matmul.cpp
(2048 x 768 and 768 x 2048, the 30B-A3B experts). Prints a table, writes JSON.

    PYTHONPATH=python python3 bench/ggml_matmul.py --llama /tmp/llama.cpp --build /tmp/llama.cpp/build

--llama is a llama.cpp source tree (../shared/peers/llama.cpp-trim.tar.xz unpacked), --build a CPU build
of its ggml there (`cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DBUILD_SHARED_LIBS=ON ... && cmake
--build build --target ggml`; ~10 minutes on 2 cores). The peer side is bench/peer/ggml_matmul.cpp, compiled
here against that build; strata's side is build/dev/strata_bench_quant_matmul (scripts/dev-build).
strata reports its float path (float activations) and its q8 path (q8_0 activations, the MMQ layout);
ggml quantizes the activations inside mul_mat, as llama.cpp does. ggml's weights are plain tensors:
llama.cpp's own runs may repack some types (Q4_0, IQ4_NL, Q4_K on AVX2) into interleaved layouts that
this call does not use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_strata(binary: str, threads: int, seconds: float, types: list[str]) -> dict:
    out = subprocess.run([binary, str(threads), str(seconds), ",".join(types)], capture_output=True, text=True,
                         check=True).stdout
    cells = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 8 and f[2].isdigit() and f[3].isdigit():
            name, rows, cols, T, path, us = f[0], int(f[1]), int(f[2]), int(f[3]), f[4], float(f[5])
            cells[(name, rows, cols, T, path)] = us
    return cells


def cell(us: float | None, wbytes: float, T: int) -> str:
    """us per call, and at T = 1 the weight GB/s in parentheses."""
    if us is None:
        return "-"
    return f"{us:.1f}" + (f" ({wbytes / us * 1e-3:.1f})" if T == 1 else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama", required=True, help="llama.cpp source tree (ggml/include)")
    ap.add_argument("--build", required=True, help="its build directory (bin/libggml*.so)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of both (1: robust on a shared machine, where spinning pools stall)")
    ap.add_argument("--seconds", type=float, default=0.3, help="per cell")
    ap.add_argument("--types", default="F32,F16,BF16,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,"
                    "IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,IQ1_S,IQ1_M,IQ4_NL,IQ4_XS,MXFP4")
    ap.add_argument("--strata-bench", default=os.path.join(ROOT, "build/dev/strata_bench_quant_matmul"))
    ap.add_argument("--json", default=os.path.join(ROOT, "bench/out/ggml_matmul.json"))
    a = ap.parse_args()
    import gguf

    types = a.types.split(",")
    ids = {t: int(gguf.GGMLQuantizationType[t]) for t in types}
    libdir = os.path.join(a.build, "bin")
    exe = os.path.join(a.build, "strata_ggml_matmul")
    subprocess.run(["g++", "-O2", "-std=c++17", os.path.join(HERE, "peer", "ggml_matmul.cpp"), "-I",
                    os.path.join(a.llama, "ggml/include"), "-L", libdir, "-lggml", "-lggml-base", "-lggml-cpu",
                    f"-Wl,-rpath,{libdir}", "-o", exe], check=True)
    peer = {}
    out = subprocess.run([exe, str(a.threads), str(a.seconds), *map(str, ids.values())], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        tid, rows, cols, T, us, gbs = int(f[0]), int(f[2]), int(f[3]), int(f[4]), float(f[5]), float(f[6])
        peer[(tid, rows, cols, T)] = (us, gbs * us * 1e3)  # (us per call, weight bytes)
    mine = run_strata(a.strata_bench, a.threads, a.seconds, types)
    print(f"threads={a.threads}; GB/s = weight bytes / time per call (T=1); ratio = strata's faster path / ggml")
    print(f"{'type':8s} {'rows':>5s} {'cols':>5s} {'T':>2s} {'strata float':>13s} {'strata q8':>10s} "
          f"{'ggml':>9s} {'ratio':>6s}  (us per call; GB/s at T=1)")
    rows_out = []
    for t in types:
        for rows, cols in ((2048, 768), (768, 2048)):
            for T in (1, 8):
                key = (ids[t], rows, cols, T)
                if key not in peer:
                    continue
                p_us, wbytes = peer[key]
                f_us = mine.get((t, rows, cols, T, "float"))
                q_us = mine.get((t, rows, cols, T, "q8"))
                found = [u for u in (f_us, q_us) if u is not None]
                ratio = p_us / min(found) if found else None
                cells = [cell(us, wbytes, T) for us in (f_us, q_us, p_us)]
                print(f"{t:8s} {rows:5d} {cols:5d} {T:2d} {cells[0]:>13s} {cells[1]:>10s} {cells[2]:>9s} "
                      f"{ratio:6.2f}" if ratio is not None else f"{t:8s} {rows:5d} {cols:5d} {T:2d}  no strata cell")
                rows_out.append({"type": t, "rows": rows, "cols": cols, "T": T, "strata_float_us": f_us,
                                 "strata_q8_us": q_us, "ggml_us": p_us, "weight_bytes": wbytes,
                                 "ratio": ratio})
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"threads": a.threads, "cells": rows_out}, f, indent=1)
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
