"""The expert cache's eviction policies (--cache-policy lru | lfu): a policy changes which experts
stay, never a logit; an unknown name, or LFU with the device's resolution, is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import strata
from strata.cli import main

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
    for policy in ("lru", "lfu"):
        m = build(path, cache, cache_policy=policy)
        assert not m.cache["all_resident"]
        logits = m.logits(prompt)
        assert m.cache["evictions"] > 0, "the cache never evicted: the policy was not exercised"
        m.reset_stats()
        tokens = m.generate(prompt, max_tokens=12, temperature=0, ignore_eos=True).tokens
        runs[policy] = (logits, tokens, m.cache["hits"], m.cache["misses"])
    # The streamed runs agree bit for bit, whatever stays in the cache.
    assert np.array_equal(runs["lru"][0], runs["lfu"][0])
    assert runs["lru"][1] == runs["lfu"][1] and len(runs["lru"][1]) == 12
    print(f"{mix}: decode hits/misses lru {runs['lru'][2:]}, lfu {runs['lfu'][2:]}")


def test_bad_policies_are_refused(make_mix):
    path = make_mix("q8_0")
    with pytest.raises(strata.ConfigError, match="lru, lfu"):
        build(path, "all", cache_policy="mru")
    with pytest.raises(strata.ConfigError, match="decode_resolve 'device'.*lfu"):
        build(path, small_cache(path), cache_policy="lfu", decode_resolve="device")
    r = CliRunner().invoke(main, ["generate", path, "-p", "hi", "-n", "2", "--cache-policy", "mru"])
    assert r.exit_code == 2 and "lru" in r.output and "Traceback" not in r.output


def test_cli_takes_the_policy(make_mix):
    path = make_mix("q8_0")
    r = CliRunner().invoke(main, ["generate", path, "-p", "hi", "-n", "3", "--temp", "0", "-q",
                                  "--expert-cache", small_cache(path), "--prefill", "8", "--cache-policy", "lfu"])
    assert r.exit_code == 0, r.output
