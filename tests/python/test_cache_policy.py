"""The expert cache's eviction policies (--cache-policy lru | lfu | scan): a policy changes which
experts stay, never a logit; an unknown name, LFU with the device's resolution, or scan with the
prefetch, is a clear error (scan resolves on the device as LRU does: test_decode_resolve.py)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import strata
from strata.cli import main
from strata.model import sampling_params

CTX = 128


@pytest.fixture(scope="module")
def prompt():
    return [int(x) for x in np.random.default_rng(7).integers(1, 500, size=40)]


def build(path, cache: str, **kw) -> strata.Model:
    return strata.Model(path, ctx=CTX, progress=False, expert_cache=cache, prefill=8, **kw)


def small_cache(path) -> str:
    """A cache of a third of the experts past the chunk's slots: experts are evicted every layer."""
    plan = strata.ModelInfo(path).layout(8, True)
    spec = strata.ModelInfo(path).spec
    return f"{(plan['slots'] + spec['layers'] * spec['experts'] // 3) * plan['slot_bytes']}b"


@pytest.mark.parametrize("mix", ["q4_k", "q8_0"])
def test_logits_and_tokens_identical_under_every_policy(make_mix, mix, prompt):
    path = make_mix(mix)
    cache = small_cache(path)
    runs = {}
    for policy in ("lru", "lfu", "scan"):
        m = build(path, cache, cache_policy=policy)
        assert not m.cache["all_resident"]
        logits = m.logits(prompt)
        assert m.cache["evictions"] > 0, "the cache never evicted: the policy was not exercised"
        m.reset_stats()
        tokens = m.generate(prompt, max_tokens=12, temperature=0, ignore_eos=True).tokens
        runs[policy] = (logits, tokens, m.cache["hits"], m.cache["misses"])
    # The streamed runs agree bit for bit, whatever stays in the cache.
    for policy in ("lfu", "scan"):
        assert np.array_equal(runs["lru"][0], runs[policy][0]), policy
        assert runs["lru"][1] == runs[policy][1] and len(runs["lru"][1]) == 12, policy
    print(f"{mix}: decode hits/misses " + ", ".join(f"{p} {r[2:]}" for p, r in runs.items()))


def test_batched_steps_identical_under_every_policy_and_scan_keeps_experts(make_mix):
    """Four sequences decoded together, their step's experts more than the cache holds: every policy
    gives the same tokens; LRU evicts each expert before the next step needs it, scan keeps some."""
    path = make_mix("q4_k")
    info = strata.ModelInfo(path)
    spec, plan = info.spec, info.layout(8, True)
    # One layer's experts and two more, past the chunk's: a step of four rows (top-4 of 8) names about
    # all the experts of each of the 2 layers, more than the cache holds, so it resolves on the host.
    assert spec["layers"] == 2 and spec["experts"] == 8
    cache = f"{(plan['slots'] + spec['experts'] + 2) * plan['slot_bytes']}b"
    prompts = [[int(x) for x in np.random.default_rng(s).integers(1, 500, size=12)] for s in range(4)]
    toks, hits = {}, {}
    for policy in ("lru", "lfu", "scan"):
        m = strata.Model(path, ctx=4 * CTX, seqs=4, progress=False, expert_cache=cache, prefill=8,
                         cache_policy=policy)
        gens = []
        for i, p in enumerate(prompts):
            g = strata._core.Generator(m._m, i)
            g.begin(p, sampling_params(max_tokens=10, temperature=0))
            gens.append(g)
        m.reset_stats()
        out: list[list[int]] = [[] for _ in prompts]
        while True:
            step = strata._core.next_tokens(m._m, gens)
            if all(t < 0 for t in step):
                break
            for row, t in zip(out, step, strict=True):
                if t >= 0:
                    row.append(t)
        toks[policy], hits[policy] = out, m.cache["hits"]
        assert m.cache["misses"] > 0
    assert toks["lru"] == toks["lfu"] == toks["scan"]
    assert sum(len(r) for r in toks["lru"]) > 20
    assert hits["scan"] > hits["lru"], hits


def test_bad_policies_are_refused(make_mix):
    path = make_mix("q8_0")
    with pytest.raises(strata.ConfigError, match="lru, lfu, scan"):
        build(path, "all", cache_policy="mru")
    with pytest.raises(strata.ConfigError, match="decode_resolve 'device'.*lfu"):
        build(path, small_cache(path), cache_policy="lfu", decode_resolve="device")
    # scan with the prefetch: the conflict and the fix, before any load.
    with pytest.raises(strata.ConfigError, match="--prefetch on.*scan.*--prefetch off with scan"):
        build(path, small_cache(path), cache_policy="scan", prefetch=True)
    r = CliRunner().invoke(main, ["generate", path, "-p", "hi", "-n", "2", "--cache-policy", "scan",
                                  "--prefetch", "on"])
    assert r.exit_code != 0 and "--prefetch off with scan" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["generate", path, "-p", "hi", "-n", "2", "--cache-policy", "mru"])
    assert r.exit_code == 2 and "lru" in r.output and "Traceback" not in r.output


def test_cli_takes_the_policy(make_mix):
    path = make_mix("q8_0")
    r = CliRunner().invoke(main, ["generate", path, "-p", "hi", "-n", "3", "--temp", "0", "-q",
                                  "--expert-cache", small_cache(path), "--prefill", "8", "--cache-policy", "lfu"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["generate", path, "-p", "hi", "-n", "3", "--temp", "0", "-q",
                                  "--expert-cache", small_cache(path), "--prefill", "8", "--cache-policy", "scan"])
    assert r.exit_code == 0, r.output
