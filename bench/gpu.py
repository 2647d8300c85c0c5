#!/usr/bin/env python3
"""strata beside llama.cpp on the GPU, same GGUF files, one run: prompt and decode tok/s and their ratio.

Scenarios (each a cache configuration of one file):
  30b      the qwen3-30b-a3b preset (Q4_K experts, Q8_0 dense; 16.75 GiB): every expert on the GPU,
           half of them (llama.cpp -ncmoe 24), 15 of 48 layers' (-ncmoe 33), none (-ncmoe 48 against a
           1 GiB strata cache); prompts of 512, 2048 and 8192 tokens; 128 decoded tokens after the
           512- and after the 8192-token prompt
  235b     the qwen3-235b-a22b preset (IQ2_XS experts, 69 GiB, written to --shm-dir): --expert-cache
           14900 against -ncmoe 76; a 2048-token prompt and 32 decoded tokens
  designs  the 30B file with half the experts cached, strata's decode designs side by side (device or
           host resolution, graph or op by op)
  oss120b  the gpt-oss-120b preset (MXFP4 experts, Q8_0 dense; ~65 GB, written to --shm-dir): a quarter of
           the experts cached against -ncmoe 27; a 2048-token prompt and decode after 512 tokens
  oss20b   the gpt-oss-20b preset (24 layers, 32 experts; MXFP4 experts, Q8_0 dense; ~12 GB): every expert on
           the GPU (prompts of 512 and 2048 tokens, decode after 512 and 8192), and half of them cached
           against -ncmoe 12 (a 2048-token prompt, decode after 512)
  q36      the qwen3.6-35b-a3b preset (qwen35moe: DeltaNet and gated attention, 256 experts, Q4_K / Q6_K
           experts, Q8_0 dense): every expert on the GPU, and a quarter of them cached against -ncmoe 30
  ds3      the deepseek-v3 preset (deepseek2: latent attention, 256 experts top-8 in 8 groups, the UD-IQ1_S
           files' IQ1_S / IQ1_M experts, Q8_0 dense; written to --shm-dir) with 31 of V3's 61 layers unless
           --layers (3 dense, 28 MoE: 69.9 GiB): the caches a 14,900 MiB and a 24 GiB cache are on the
           61-layer model, scaled to the file's MoE layers and rounded to whole layers for -ncmoe; a 2048-token
           prompt, decode after 512
  v4flash  the v4-flash preset (deepseek4: hyper-connections, compressed attention, 256 experts top-6,
           IQ2_XXS / Q2_K experts, Q8_0 dense; written to --shm-dir) with 24 of its 43 layers unless --layers
           (~48 GB): every expert on the GPU, and the cache a 14,900 MiB cache is on the 43-layer model, scaled
           as for ds3; a 2048-token prompt, decode after 512

How the caches are matched: llama.cpp's `-ncmoe N` keeps the experts of layers N..L-1 on the GPU, i.e.
(L - N) x E experts; strata gets an `--expert-cache` of exactly those bytes ((L - N) x E x the expert's
bytes), from which it also lends the prompt chunk's scratch (llama.cpp allocates that beside).

For every strata row: ms per decoded token against its floor (the weights a token reads from HBM
over --hbm-gbps plus the bytes it misses over --link-gbps), the hit rate, GB streamed and the link
GB/s achieved. llama.cpp runs as its own `llama-bench` binary (--llama-bench; build it from
../shared/peers as its README says, e.g. in the background while this writes the models: the bench
waits up to --llama-wait seconds for the binary to appear). With --link-probe (strata_bench_cuda_link, built
from bench/cuda_link.cu) the host link is measured first and again on each scenario's file once it is written
(registered, as strata's source reads it), so the JSON ("link") and the log say what link the numbers ran on.
Prints a table, writes JSON:

    PYTHONPATH=python python3 bench/gpu.py --dir /tmp/strata-bench --llama-bench /tmp/llama.cpp/build/bin/llama-bench
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import strata
from strata import _core
from strata.model import sampling_params
from strata.testing import GPT_OSS_PRESETS, QWEN35MOE_PRESETS, make_gpt_oss_preset, make_preset, make_qwen35moe_preset
from strata.testing.deepseek2 import DEEPSEEK2_PRESETS, make_deepseek2_preset
from strata.testing.deepseek4 import DEEPSEEK4_PRESETS, make_deepseek4_preset

MiB = 1 << 20


@dataclass
class Config:
    """One cache configuration of one file: llama.cpp's -ncmoe and strata's matching load options."""

    label: str
    ncmoe: int | None  # None: no llama.cpp counterpart
    load: dict[str, Any]
    prompts: tuple[int, ...]  # prompt lengths timed (pp)
    decode_after: tuple[int, ...]  # prompt lengths after which gen tokens are decoded (tg)


@dataclass
class Row:
    scenario: str
    config: str
    test: str  # ppN or tgM@N
    strata_tps: float | None = None
    llama_tps: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.strata_tps and self.llama_tps:
            return self.strata_tps / self.llama_tps
        return None


def write_model(directory: str, preset: str, layers: int | None, workers: int, skew: float = 0.0,
                locality: float = 0.0) -> str:
    os.makedirs(directory, exist_ok=True)
    routing = f"-s{skew:g}-l{locality:g}" if skew or locality else ""
    path = os.path.join(directory, f"{preset}-L{layers or 'all'}{routing}.gguf")
    if not os.path.exists(path):
        t0 = time.monotonic()
        kw: dict[str, float] = {"layers": layers} if layers else {}
        others = {**dict.fromkeys(GPT_OSS_PRESETS, make_gpt_oss_preset),
                  **dict.fromkeys(QWEN35MOE_PRESETS, make_qwen35moe_preset),
                  **dict.fromkeys(DEEPSEEK2_PRESETS, make_deepseek2_preset),
                  **dict.fromkeys(DEEPSEEK4_PRESETS, make_deepseek4_preset)}
        if preset in others:
            if routing and preset not in DEEPSEEK2_PRESETS and preset not in DEEPSEEK4_PRESETS:
                raise SystemExit("--route-skew / --route-locality shape qwen3moe, deepseek2 and deepseek4 files "
                                 "only")
            if routing:
                kw.update(route_skew=skew, route_locality=locality)
            make = others[preset]
            make(preset, path + ".tmp", seed=0, workers=workers, **kw)
        else:
            if routing:
                kw.update(route_skew=skew, route_locality=locality)
            make_preset(preset, path + ".tmp", seed=0, workers=workers, **kw)
        os.replace(path + ".tmp", path)
        dt = time.monotonic() - t0
        gb = os.path.getsize(path) / 1e9
        print(f"wrote {path}: {gb:.2f} GB in {dt:.1f} s ({gb / dt:.2f} GB/s, {workers} workers)", flush=True)
    return path


def expert_bytes_per_layer(info: strata.ModelInfo) -> int:
    return info.spec["expert_bytes"] // info.spec["layers"]


def token_read_bytes(info: strata.ModelInfo) -> int:
    """Bytes of weights one decoded token reads: every dense tensor but the embedding table (one row of
    it), plus K experts in every layer."""
    s = info.spec
    embd = next(t for t in info.tensors if t["name"] == "token_embd.weight")
    dense = s["dense_bytes"] - embd["nbytes"] + embd["nbytes"] // s["vocab"]
    return dense + s["top_k"] * s["layers"] * (s["expert_bytes"] // (s["layers"] * s["experts"]))


def strata_config(path: str, cfg: Config, gen: int, hbm: float, link: float, device: str) -> list[Row]:
    info = strata.ModelInfo(path)
    longest = max((*cfg.prompts, *cfg.decode_after))
    t0 = time.monotonic()
    m = strata.Model(path, device=device, ctx=longest + gen + 16, progress=False, **cfg.load)
    load_s = time.monotonic() - t0
    hi = min(m.tokenizer.special_ids or [m.spec["vocab"]])
    rng = np.random.default_rng(0)
    read_bytes = token_read_bytes(info)

    def run(n_prompt: int, n_gen: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        # The Generator directly, with no stop ids: like llama-bench, decode never ends early on an
        # end-of-turn token that random weights happen to pick. Greedy decoding of random weights
        # repeats a few tokens, which would route every step to the same experts (hit rates near 1
        # on any cache); llama-bench feeds a random token each step. A repetition penalty of 1e6 over
        # the last n_gen tokens makes greedy pick a token not yet decoded every step, so each step
        # routes like a fresh token (the sampler's cost stays greedy's: one argmax).
        ids = rng.integers(0, hi, size=n_prompt).tolist()
        p = sampling_params(max_tokens=max(n_gen, 1), temperature=0, repetition_penalty=1e6,
                            repeat_last_n=max(n_gen, 1))
        p.stop_ids = []
        g = _core.Generator(m._m)
        m.reset_stats()
        g.begin(ids, p)
        c0 = dict(m.cache)
        for _ in range(n_gen):
            if g.next() < 0:
                break
        return g.stats(), c0, dict(m.cache)

    run(16, 4)  # warm-up: first launches, first copies, the decode graph's recording
    rows = []
    for n in cfg.prompts:
        st, c0, _ = run(n, 0)
        rows.append(Row("", cfg.label, f"pp{n}", strata_tps=st["prompt_tps"], extra={
            "prompt_ms": st["prompt_ms"], "chunks": c0["chunks"], "chunk": m.chunk,
            "gb_streamed": c0["bytes_streamed"] / 1e9,
            "link_gbps": c0["bytes_streamed"] / 1e9 / (st["prompt_ms"] / 1e3) if st["prompt_ms"] else 0.0}))
    for n in cfg.decode_after:
        st, c0, c1 = run(n, gen)
        hits, misses = c1["hits"] - c0["hits"], c1["misses"] - c0["misses"]
        streamed = c1["bytes_streamed"] - c0["bytes_streamed"]
        passes = max(st["decode_passes"], 1)
        ms = st["decode_ms"] / passes
        miss_per_token = streamed / passes
        floor_ms = 1e3 * ((read_bytes - miss_per_token) / hbm + miss_per_token / link)
        pf = {k: c1[f"prefetch_{k}"] - c0[f"prefetch_{k}"] for k in ("fills", "used", "wasted")}
        rows.append(Row("", cfg.label, f"tg{gen}@{n}", strata_tps=st["decode_tps"], extra={
            **{f"prefetch_{k}": v for k, v in pf.items()},
            "prefetch_accuracy": pf["used"] / pf["fills"] if pf["fills"] else None,
            "ms_per_token": ms, "floor_ms": floor_ms, "over_floor": ms / floor_ms,
            "hit_rate": hits / (hits + misses) if hits + misses else 1.0, "gb_streamed": streamed / 1e9,
            "link_gbps": streamed / 1e9 / (st["decode_ms"] / 1e3) if st["decode_ms"] else 0.0,
            "generated": st["generated"], "decode_path": ("graph" if m._m.decode_graph_active else "op by op")
            + ", " + m._m.decode_resolution + (", write-through" if m._m.decode_write_through else "")}))
    for r in rows:
        r.extra.update({"load_s": load_s, "slots": m.cache["slots"], "cache_bytes": m.cache["cache_bytes"],
                        "all_resident": m.cache["all_resident"], "source": m.cache["source_kind"],
                        "device": m.backend.describe()})
    return rows  # m goes with this frame: its device memory is free before the next configuration loads


def llama_config(binary: str, path: str, cfg: Config, gen: int, reps: int, log: list[str]) -> dict[str, float]:
    """llama-bench's tok/s per test name (ppN, tgM@N) for one -ncmoe value."""
    out: dict[str, float] = {}
    base = [binary, "-m", path, "-ngl", "99", "-fa", "1", "-ncmoe", str(cfg.ncmoe), "-o", "json", "-r", str(reps)]
    calls = []
    if cfg.prompts:
        calls.append(["-p", ",".join(map(str, cfg.prompts)), "-n", "0"])
    for n in cfg.decode_after:
        calls.append(["-p", "0", "-n", str(gen), "-d", str(n)])
    for extra in calls:
        cmd = base + extra
        t0 = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True)
        log.append(f"$ {' '.join(cmd)}\n{res.stderr[-4000:]}\n{res.stdout}")
        if res.returncode != 0:
            print(f"llama-bench failed ({res.returncode}) after {time.monotonic() - t0:.0f} s: "
                  f"{res.stderr.strip().splitlines()[-1:]}", flush=True)
            continue
        for t in json.loads(res.stdout):
            if t["n_gen"] > 0:
                out[f"tg{t['n_gen']}@{t['n_depth']}"] = t["avg_ts"]
            elif t["n_prompt"] > 0:
                out[f"pp{t['n_prompt']}"] = t["avg_ts"]
    return out


def configs(scenario: str, info: strata.ModelInfo, quick: bool, long_prompts: bool = False) -> list[Config]:
    L = info.spec["layers"]
    per_layer = expert_bytes_per_layer(info)

    def layers_cached(ncmoe: int) -> dict[str, Any]:
        return {"expert_cache": f"{(L - ncmoe) * per_layer}b", "prefill": "auto:8192"}

    if scenario == "30b":
        long = () if quick else (8192,)
        return [
            Config("all on GPU", 0, {"expert_cache": "all"}, (512, 2048, *long), (512, *long)),
            Config(f"half the experts (-ncmoe {L // 2})", L // 2, layers_cached(L // 2), (512, 2048), (512, *long)),
            Config(f"15 of {L} layers (-ncmoe {L - 15})", L - 15, layers_cached(L - 15), (2048,), (512,)),
            Config(f"none (-ncmoe {L}) / 1 GiB cache", L, {"expert_cache": "1GiB", "prefill": "auto:8192"},
                   (2048,), (512,)),
        ]
    if scenario == "235b":
        load = {"expert_cache": "14900", "prefill": "auto:32768"}
        rows = [Config("14900 MiB cache (-ncmoe 76)", 76, load, (2048,), (512,))]
        if long_prompts:  # strata alone: llama.cpp's pp32768 would take ~3 minutes at its pp2048 speed
            rows.append(Config("14900 MiB cache, long prompts", None, load, (8192, 32768), ()))
        return rows
    if scenario == "q36":
        return [
            Config("all on GPU", 0, {"expert_cache": "all"}, (512, 2048), (512,)),
            Config(f"a quarter cached (-ncmoe {L - L // 4})", L - L // 4, layers_cached(L - L // 4), (2048,), (512,)),
        ]
    if scenario in ("ds3", "v4flash"):
        # llama.cpp's -ncmoe counts every block, the leading dense ones first. V3 has 58 MoE layers of 61, V4
        # Flash 43 of 43: each cache is its share of them, in whole MoE layers of this file.
        arch = info.spec["arch"]
        blocks = int(info.metadata[f"{arch}.block_count"])
        moe = blocks - int(info.metadata.get(f"{arch}.leading_dense_block_count", 0))
        per_moe = info.spec["expert_bytes"] // moe
        full_blocks, full_moe = (61, DS3_MOE_LAYERS) if scenario == "ds3" else (43, 43)

        def scaled(mib: int, label: str) -> Config:
            cached = min(moe, max(1, round(mib * 2**20 * moe / full_moe / per_moe)))
            return Config(f"{label} @{full_blocks} layers (-ncmoe {blocks - cached})", blocks - cached,
                          {"expert_cache": f"{cached * per_moe}b", "prefill": "auto:8192"}, (2048,), (512,))

        if scenario == "v4flash":
            return [Config("all on GPU", 0, {"expert_cache": "all"}, (2048,), (512,)), scaled(14900, "14,900 MiB")]
        return [scaled(14900, "14,900 MiB"), scaled(24 * 1024, "24 GiB")]
    if scenario == "oss20b":
        long = () if quick else (8192,)
        return [
            Config("all on GPU", 0, {"expert_cache": "all"}, (512, 2048), (512, *long)),
            Config(f"half the experts (-ncmoe {L // 2})", L // 2, layers_cached(L // 2), (2048,), (512,)),
        ]
    if scenario == "oss120b":
        return [Config(f"a quarter cached (-ncmoe {L - L // 4})", L - L // 4, layers_cached(L - L // 4), (2048,),
                       (512,))]
    if scenario == "designs":
        half = layers_cached(L // 2)
        return [Config(f"half, {name}", None, {**half, **kw}, (), (512,)) for name, kw in (
            ("resolve device, graph", {"decode_resolve": "device"}),
            ("resolve device, op by op", {"decode_resolve": "device", "decode_graph": False}),
            ("resolve host", {"decode_resolve": "host"}),
        )]
    raise SystemExit(f"unknown scenario {scenario!r}: {', '.join(SCENARIO_PRESETS)}")


# The file each scenario runs on, and whether it is written to --shm-dir (too large for the disk's page cache).
SCENARIO_PRESETS = {"30b": ("qwen3-30b-a3b", False), "designs": ("qwen3-30b-a3b", False),
                    "235b": ("qwen3-235b-a22b", True), "oss120b": ("gpt-oss-120b", True),
                    "oss20b": ("gpt-oss-20b", False),
                    "q36": ("qwen3.6-35b-a3b", False), "ds3": ("deepseek-v3", True),
                    "v4flash": ("v4-flash", True)}
DS3_MOE_LAYERS = 58  # DeepSeek V3: 61 blocks, the first 3 dense
DS3_LAYERS = 31  # the ds3 file's blocks unless --layers: 3 dense and 28 MoE, 69.9 GiB with IQ1_S / IQ1_M experts
V4F_LAYERS = 24  # the v4flash file's blocks unless --layers: ~48 GB with IQ2_XXS / Q2_K experts


def wait_for(binary: str, seconds: float) -> bool:
    t0 = time.monotonic()
    while not os.access(binary, os.X_OK):
        if time.monotonic() - t0 > seconds:
            return False
        time.sleep(2)
    return True


def link_probe(binary: str, file: str | None = None) -> dict[str, Any]:
    """strata_bench_cuda_link's JSON (the host link's GB/s and the GPU's NUMA node), its table under "output";
    with `file`, also that file registered and copied or read zero-copy. {"error": ...} where it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "link.json")
        cmd = [binary, "--json", out] + (["--file", file] if file else [])
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"link probe {' '.join(cmd)} failed: {e}", flush=True)
            return {"error": str(e)}
        if res.returncode != 0 or not os.path.exists(out):
            err = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
            print(f"link probe {' '.join(cmd)} failed ({res.returncode}): {err}", flush=True)
            return {"error": err, "output": res.stdout + res.stderr}
        with open(out) as f:
            got = json.load(f)
    got["output"] = res.stdout
    return got


def host_probe(gib: float = 1.0, reps: int = 3) -> dict[str, Any]:
    """The host's side of a run: CPU model, usable cores, load, available memory and RAM read GB/s on one thread
    and on every usable core (numpy sums release the GIL), the best of `reps`. llama.cpp's CPU experts run at
    the host's memory bandwidth and strata's streaming shares it, so two hosts' rows compare only with this."""
    import concurrent.futures

    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    avail = None
    try:
        with open("/proc/meminfo") as f:
            avail = next((int(ln.split()[1]) / 2**20 for ln in f if ln.startswith("MemAvailable")), None)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    buf = np.ones(int(gib * 2**30) // 8, dtype=np.float64)  # written once: every page is resident

    def rate(threads: int) -> float:
        parts = np.array_split(buf, threads)
        best = 0.0
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            for _ in range(reps):
                t = time.perf_counter()
                total = sum(ex.map(np.sum, parts))
                dt = time.perf_counter() - t
                if total != buf.size:
                    raise RuntimeError("host probe: the sum of ones is wrong")
                best = max(best, buf.nbytes / dt / 1e9)
        return best

    return {"cpu": cpu, "cores": cores, "loadavg": os.getloadavg()[0], "mem_available_gib": avail,
            "read_gbps_1": rate(1), "read_gbps_all": rate(cores), "bytes": buf.nbytes}


def host_summary(h: dict[str, Any]) -> str:
    avail = f"{h['mem_available_gib']:.0f} GiB available" if h.get("mem_available_gib") else "memory ?"
    return (f"host: {h['cpu']}, {h['cores']} cores (load {h['loadavg']:.1f}), {avail}; RAM read "
            f"{h['read_gbps_1']:.1f} GB/s on one thread, {h['read_gbps_all']:.1f} on {h['cores']}")


def link_summary(probe: dict[str, Any], file: str | None = None) -> str:
    """One line of a link_probe result: the first row of each test, and the GPU's NUMA node."""
    if "error" in probe:
        return f"link{', ' + os.path.basename(file) if file else ''}: probe failed: {probe['error']}"
    tests: dict[str, dict[str, Any]] = {}
    for t in probe["tests"]:
        tests.setdefault(t["name"], t)

    def gbps(name: str) -> str:
        t = tests.get(name)
        if t is None:
            return "-"
        return f"{t['gbps']:.1f} GB/s" if "gbps" in t else f"error ({t['error']})"

    if file:
        f = probe.get("file") or {}
        nodes = ", ".join(f"node {n}: {c}" for n, c in (f.get("page_nodes") or {}).items())
        return (f"link, {os.path.basename(file)}: registered file {gbps('file_copy')}, zero-copy "
                f"{gbps('file_zero_copy')} (registered in {f.get('register_s', 0):.1f} s; pages sampled on "
                f"{nodes or 'unknown nodes'})")
    big = tests.get("pinned", {}).get("bytes", 0) / 2**30
    node = probe["gpu_numa_node"]
    pcie = probe.get("pcie") or {}
    return (f"link: pinned {big:g} GiB {gbps('pinned')}, expert copies {gbps('pinned_experts')}, pageable "
            f"{gbps('pageable')}, zero-copy pinned {gbps('pinned_zero_copy')}; GPU on NUMA node "
            f"{node if node >= 0 else '?'} of {probe['numa_nodes'] or '?'} ({pcie.get('speed') or 'PCIe speed ?'} "
            f"x{pcie.get('width') or '?'}), the probe's thread on node {probe.get('cpu_numa_node')}")


def print_table(rows: list[Row], hbm: float, link: float) -> None:
    print(f"\nfloor: weights read / {hbm / 1e12:.1f} TB/s + missed bytes / {link / 1e9:.0f} GB/s")
    w = max([34] + [len(r.config) for r in rows])  # whole labels: ", prefetch" and the like tell rows apart
    hdr = (f"{'scenario':<8} {'config':<{w}} {'test':<10} {'llama.cpp':>9} {'strata':>9} {'ratio':>6} "
           f"{'ms/tok':>7} {'floor':>6} {'hit':>6} {'GB':>7} {'GB/s':>6} {'pf acc':>6}")
    print(hdr)
    for r in rows:
        e = r.extra

        def f(v: float | None, spec: str) -> str:
            return format(v, spec) if v is not None else "-"

        print(f"{r.scenario:<8} {r.config:<{w}} {r.test:<10} {f(r.llama_tps, '9.1f'):>9} "
              f"{f(r.strata_tps, '9.1f'):>9} {f(r.ratio, '6.2f'):>6} {f(e.get('ms_per_token'), '7.2f'):>7} "
              f"{f(e.get('floor_ms'), '6.2f'):>6} {f(e.get('hit_rate'), '6.3f'):>6} "
              f"{f(e.get('gb_streamed'), '7.2f'):>7} {f(e.get('link_gbps'), '6.1f'):>6} "
              f"{f(e.get('prefetch_accuracy'), '6.3f'):>6}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="30b",
                    help="comma-separated: 30b, 235b, designs, oss120b, oss20b, q36, ds3, v4flash (default: 30b)")
    ap.add_argument("--dir", default="/tmp/strata-bench", help="where the 30B file is written (once)")
    ap.add_argument("--shm-dir", default="/dev/shm/strata-bench",
                    help="where the 235B and gpt-oss-120b files are written (once)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the presets (smaller files)")
    ap.add_argument("--keep-files", action="store_true",
                    help="keep the --shm-dir files after their scenarios (default: each is removed once no later "
                         "scenario reads it, so the large files need not fit RAM together)")
    ap.add_argument("--route-skew", type=float, default=0.0,
                    help="the files' expert popularity (qwen3moe, deepseek2 and deepseek4 files: route_skew; 0: random "
                         "weights' routing)")
    ap.add_argument("--route-locality", type=float, default=0.0,
                    help="the files' token-to-token routing locality (qwen3moe, deepseek2, deepseek4: route_locality)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes writing a model file")
    ap.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench binary (none: strata alone)")
    ap.add_argument("--llama-wait", type=float, default=600, help="seconds to wait for --llama-bench to appear")
    ap.add_argument("--reps", type=int, default=2, help="llama-bench repetitions (-r)")
    ap.add_argument("--gen-tokens", type=int, default=128, help="decoded tokens per tg test (235b: a quarter)")
    ap.add_argument("--quick", action="store_true", help="leave out the 8192-token prompts")
    ap.add_argument("--long-prompts", action="store_true",
                    help="235b: also 8192- and 32768-token prompts with --prefill auto:32768, strata alone (its "
                         "chunks, chunk size and link GB/s in the JSON)")
    ap.add_argument("--only", default=None,
                    help="comma-separated starts of configuration labels to run (e.g. all,half,none)")
    ap.add_argument("--decode-only", action="store_true", help="leave out the prompt tests")
    ap.add_argument("--prompt-only", action="store_true",
                    help="leave out the decode tests (llama-bench's tg after an 8192-token depth is the slow part)")
    ap.add_argument("--hbm-gbps", type=float, default=None,
                    help="HBM bandwidth for the floor, GB/s (default: by the GPU's name: H200 4300, H100 3350, "
                         "else 4300)")
    ap.add_argument("--link-gbps", type=float, default=54, help="host link bandwidth for the floor, GB/s")
    ap.add_argument("--device", default="cuda", help="strata's device (cpu: a smoke test of this script)")
    ap.add_argument("--link-probe", default=None, metavar="PATH",
                    help="strata_bench_cuda_link (bench/cuda_link.cu): measure the host link before the scenarios "
                         "and on each scenario's file once written; a line in the log, \"link\" in the JSON "
                         "(default: none)")
    ap.add_argument("--mma-q8", choices=("off", "on", "both"), default="on",
                    help="the integer prompt tile on tensor cores (strata's default; off: STRATA_CUDA_MMA_Q8=0, the "
                         "dp4a tile) for the prompt rows: on, off, or both side by side")
    ap.add_argument("--source", default=None,
                    help="strata's --source for the bounded caches' rows (host, registered, mmap; default: strata's "
                         "choice); with --source-both the default's rows and this source's side by side")
    ap.add_argument("--source-both", action="store_true", help="see --source")
    ap.add_argument("--prefetch", choices=("auto", "off", "on", "both"), default="auto",
                    help="decode with --prefetch (bounded caches): auto (strata's default: 2 for deepseek4, off "
                         "elsewhere), off, on, or both (off and on) side by side")
    ap.add_argument("--prefetch-budget", type=int, default=0, metavar="N",
                    help="the prefetch rows fill at most N of each token's guesses a layer, the surest first "
                         "(strata --prefetch N; 0: every guess)")
    ap.add_argument("--cpu-experts", default="", metavar="N[,N...]",
                    help="also decode the bounded caches with up to N of each step's missed experts a layer computed "
                         "on the CPU beside the link (strata.Model(cpu_experts=N), moe_layout mmq, resolved on the "
                         "host): a row per N, decode only")
    ap.add_argument("--resolve-host", action="store_true",
                    help="also decode the bounded caches with --decode-resolve host (misses found on the host and "
                         "copied by the copy engine, op by op) beside strata's default (resolved on the device, "
                         "filled by a zero-copy kernel, one graph): the A/B of the fill's rate on a host")
    ap.add_argument("--look-ahead", choices=("off", "on", "both"), default="on",
                    help="a prompt chunk's look ahead at the next layer's experts (bounded caches; strata's default; "
                         "off: STRATA_PROMPT_PREFETCH=0) for the prompt rows: on, off, or both side by side")
    ap.add_argument("--write-through", choices=("off", "on", "both"), default="on",
                    help="a decode step's misses written through by the expert products (bounded caches resolved on "
                         "the device; strata's default; off: STRATA_WRITE_THROUGH=0, each layer's misses filled by "
                         "the fill kernel first) for the decode rows: on, off, or both side by side")
    ap.add_argument("--moe-layout", choices=("auto", "fused", "both"), default="auto",
                    help="the bounded caches' MoE layout: auto (strata's default: the MMQ layout, q8_0 expert "
                         "products as every expert resident runs them), fused (float products of exactly dequantized "
                         "weights: strata.Model(moe_layout='fused')), or both side by side; misses written through "
                         "in each")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.decode_only and a.prompt_only:
        ap.error("--decode-only and --prompt-only leave nothing to run: pick one")
    if a.hbm_gbps is None:  # the card's: H200 as measured there (~4.4 TB/s), H100 SXM's HBM3 as specified
        name = strata.Backend(a.device).describe() if a.device != "cpu" else ""
        a.hbm_gbps = 3350.0 if "H100" in name else 4300.0
    hbm, link = a.hbm_gbps * 1e9, a.link_gbps * 1e9

    scenarios = [s for s in a.scenarios.split(",") if s]
    for s in scenarios:
        if s not in SCENARIO_PRESETS:
            raise SystemExit(f"unknown scenario {s!r}: {', '.join(SCENARIO_PRESETS)}")
    # Each scenario's file is written just before its scenario runs; a file in --shm-dir goes once no later
    # scenario needs it (unless --keep-files): the 235b, ds3 and v4flash files (48-74 GB) do not fit RAM together.
    files: dict[str, str] = {}
    sizes: dict[str, float] = {}
    # The link first, on its own (no model loaded); then each file as strata will read it, once written.
    link_info: dict[str, Any] = {"probe": a.link_probe, "files": {}} if a.link_probe else {}
    host = {"before": host_probe()}
    print(host_summary(host["before"]), flush=True)
    if a.link_probe:
        link_info["machine"] = link_probe(a.link_probe)
        print(link_summary(link_info["machine"]), flush=True)

    def file_of(s: str) -> str:
        preset, shm = SCENARIO_PRESETS[s]
        if preset not in files:
            layers = a.layers or {"ds3": DS3_LAYERS, "v4flash": V4F_LAYERS}.get(s)
            files[preset] = write_model(a.shm_dir if shm else a.dir, preset, layers, a.workers, a.route_skew,
                                        a.route_locality)
            sizes[preset] = os.path.getsize(files[preset]) / 2**30
            if a.link_probe:
                link_info["files"][files[preset]] = link_probe(a.link_probe, files[preset])
                print(link_summary(link_info["files"][files[preset]], files[preset]), flush=True)
        return files[preset]

    def done_with(i: int) -> None:
        preset, shm = SCENARIO_PRESETS[scenarios[i]]
        later = {SCENARIO_PRESETS[t][0] for t in scenarios[i + 1:]}
        if shm and not a.keep_files and preset not in later and os.path.exists(files[preset]):
            os.remove(files[preset])
            print(f"removed {files[preset]} (no later scenario reads it; --keep-files keeps it)", flush=True)

    llama_state: dict[str, str | None] = {}

    def llama_binary() -> str | None:
        """llama-bench once it exists (it may still be building): waited for at its first use only."""
        if "path" not in llama_state:
            llama_state["path"] = None
            if a.llama_bench and wait_for(a.llama_bench, a.llama_wait):
                llama_state["path"] = a.llama_bench
            elif a.llama_bench:
                print(f"no llama-bench at {a.llama_bench} after {a.llama_wait:.0f} s: strata rows only", flush=True)
        return llama_state["path"]
    rows: list[Row] = []
    log: list[str] = []
    for si, s in enumerate(scenarios):
        path = file_of(s)
        info = strata.ModelInfo(path)
        gen = max(8, a.gen_tokens // 4) if s in ("235b", "ds3", "v4flash") else a.gen_tokens
        chosen = []
        for cfg in configs(s, info, a.quick, a.long_prompts):
            if a.only and not any(cfg.label.startswith(o) for o in a.only.split(",")):
                continue
            bounded = cfg.load.get("expert_cache") != "all"
            if bounded and a.prefetch in ("off", "both"):  # the A/B's base rows: prefetch off, not strata's auto
                cfg = dataclasses.replace(cfg, load={**cfg.load, "prefetch": False})
            if a.prefetch != "on" or not bounded:
                chosen.append(cfg)
            if a.prefetch in ("on", "both") and bounded:  # the prefetch's own rows: decode only, no llama.cpp again
                pf = a.prefetch_budget if a.prefetch_budget > 0 else True
                chosen.append(dataclasses.replace(cfg, label=f"{cfg.label}, prefetch" + (
                              f" {a.prefetch_budget}" if a.prefetch_budget > 0 else ""), load={**cfg.load,
                              "prefetch": pf}, prompts=(), ncmoe=None if a.prefetch == "both" else cfg.ncmoe))
        if a.resolve_host:  # decode resolved on the host: its own rows, decode only, no llama.cpp again
            chosen += [dataclasses.replace(c, label=f"{c.label}, resolve host", prompts=(), ncmoe=None,
                                           load={**c.load, "decode_resolve": "host"})
                       for c in list(chosen) if c.load.get("expert_cache") != "all" and not c.load.get("prefetch")]
        if a.cpu_experts:  # the CPU share's rows: decode only, no llama.cpp again
            shares = [int(v) for v in a.cpu_experts.split(",")]
            chosen += [dataclasses.replace(c, label=f"{c.label}, cpu {n}", prompts=(), ncmoe=None,
                                           load={**c.load, "moe_layout": "mmq", "decode_resolve": "host",
                                                 "cpu_experts": n})
                       for n in shares for c in list(chosen)
                       if c.load.get("expert_cache") != "all" and not c.load.get("prefetch") and c.decode_after]
        if a.source:  # the chosen source's rows for the bounded caches (decode and prompt, no llama.cpp again)
            sourced = [dataclasses.replace(c, label=f"{c.label}, {a.source}", load={**c.load, "source": a.source},
                                           ncmoe=None if a.source_both else c.ncmoe)
                       for c in chosen if c.load.get("expert_cache") != "all"]
            chosen = (list(chosen) if a.source_both else
                      [c for c in chosen if c.load.get("expert_cache") == "all"]) + sourced
        if a.mma_q8 != "off":
            chosen = [dataclasses.replace(c, load={**c.load, "_mma_q8": True}) for c in chosen]
        if a.mma_q8 == "both":  # the dp4a integer tile's own rows: prompts, no llama.cpp again
            chosen += [dataclasses.replace(c, label=f"{c.label}, dp4a", decode_after=(), ncmoe=None,
                                           load={**c.load, "_mma_q8": False}) for c in chosen if c.prompts]
        # The look ahead's switch (read at each layer): its rows with it off, prompts of the bounded caches.
        ahead_on = a.look_ahead != "off"
        chosen = [dataclasses.replace(c, load={**c.load, "_look_ahead": ahead_on}) for c in chosen]
        if a.look_ahead == "both":
            chosen += [dataclasses.replace(c, label=f"{c.label}, no look ahead", decode_after=(), ncmoe=None,
                                           load={**c.load, "_look_ahead": False})
                       for c in chosen if c.prompts and c.load.get("expert_cache") != "all"]
        # The write-through's switch (read at each layer when a step is recorded): its rows with it off, the
        # bounded caches' decode, after the same prompts as the rows with it on (which leave the cache as the
        # decode finds it: without them the two decodes start from different residency).
        wt_on = a.write_through != "off"
        chosen = [dataclasses.replace(c, load={**c.load, "_write_through": wt_on}) for c in chosen]
        if a.write_through == "both":
            chosen += [dataclasses.replace(c, label=f"{c.label}, fill first", ncmoe=None,
                                           load={**c.load, "_write_through": False})
                       for c in chosen if c.decode_after and c.load.get("expert_cache") != "all"]
        # The bounded caches with the fused layout (float expert products, strata.Model(moe_layout="fused")): their
        # own rows beside the default's MMQ ones (both), or instead of them (fused). The CPU share's rows need the
        # MMQ layout: they stay as they are.
        if a.moe_layout != "auto":
            fused = [dataclasses.replace(c, label=f"{c.label}, fused", load={**c.load, "moe_layout": "fused"},
                                         ncmoe=c.ncmoe if a.moe_layout == "fused" else None)
                     for c in chosen if c.load.get("expert_cache") != "all" and not c.load.get("cpu_experts")]
            chosen = (list(chosen) if a.moe_layout == "both" else
                      [c for c in chosen if c.load.get("expert_cache") == "all" or c.load.get("cpu_experts")]) + fused
        for cfg in chosen:
            if a.decode_only:
                cfg = dataclasses.replace(cfg, prompts=())
            if a.prompt_only:
                cfg = dataclasses.replace(cfg, decode_after=())
            t0 = time.monotonic()
            load = dict(cfg.load)
            os.environ["STRATA_CUDA_MMA_Q8"] = "1" if load.pop("_mma_q8", False) else "0"  # read at each launch
            os.environ["STRATA_PROMPT_PREFETCH"] = "1" if load.pop("_look_ahead", True) else "0"  # at each layer
            os.environ["STRATA_WRITE_THROUGH"] = "1" if load.pop("_write_through", True) else "0"  # at each layer
            got = strata_config(path, dataclasses.replace(cfg, load=load), gen, hbm, link, a.device)
            llama = llama_binary() if cfg.ncmoe is not None else None
            theirs = llama_config(llama, path, cfg, gen, a.reps if s != "235b" else 1, log) if llama else {}
            for r in got:
                r.scenario = s
                r.llama_tps = theirs.get(r.test)
            rows += got
            print(f"[{s}] {cfg.label}: {time.monotonic() - t0:.0f} s", flush=True)
        done_with(si)
    listed = ", ".join(f"{os.path.basename(files[p])} ({sizes[p]:.2f} GiB)" for p in files)
    print(f"\n{rows[0].extra['device'] if rows else a.device}; files: {listed}")
    print_table(rows, hbm, link)
    host["after"] = host_probe()
    print(f"{host_summary(host['before'])} (before the scenarios)")
    print(f"{host_summary(host['after'])} (after them)")
    if a.link_probe:  # again under the table (scripts/gpu-check prints the log from the table on)
        print(link_summary(link_info["machine"]))
        for path, probe in link_info["files"].items():
            print(link_summary(probe, path))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"files": files, "hbm_gbps": a.hbm_gbps, "link_gbps": a.link_gbps,
                       "llama_bench": llama_state.get("path"), "link": link_info or None, "host": host,
                       "rows": [{"scenario": r.scenario, "config": r.config, "test": r.test,
                                 "strata_tps": r.strata_tps, "llama_tps": r.llama_tps, "ratio": r.ratio, **r.extra}
                                for r in rows]}, f, indent=2)
        with open(os.path.splitext(a.json)[0] + "-llama.log", "w") as f:
            f.write("\n".join(log))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
