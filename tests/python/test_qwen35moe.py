"""qwen35moe (Qwen3.5 / 3.6 MoE) on the CPU against transformers' Qwen3_5MoeForCausalLM built from the same
dequantized weights (strata.testing.qwen35.hf_model, run in float64 so the reference is the same on every
CPU): logits, greedy tokens, every hyperparameter read from metadata, the logits' independence of the
expert cache and the prompt chunking, chat turns that keep the recurrent state, and the errors of bad files.

The bound, 2e-5 of max |logit|, is float32 rounding (u = 6e-8) carried through the pass: each of the 12
sublayers is a chain of a few float32 reductions of length <= 192 (~sqrt(192) u = 8e-7 relative each), the
DeltaNet's outputs add up to 64 decayed terms of their chunk, and independent roundings over the sublayers
add as a random walk (sqrt(12) x 8e-7 = 3e-6) with a few-fold amplification by the norms; the bound is ~4x
the worst measured. Measured max |a - b| / max |b| over a 150-token prompt (past two ends of the DeltaNet's
64-position chunks): f32 1.8e-6, q8_0 2.0e-6, MXFP4 experts 3.3e-6, the hyperparameter variants 1.3e-6 to
5.3e-6.
"""

from __future__ import annotations

import functools
import os
import signal
import threading

import numpy as np
import pytest

import strata
import strata.model
from strata.testing import make_qwen35moe
from strata.testing.gguf_edit import ARRAY, U32, Gguf
from test_prefill_layout import check_plan, prefill_layout

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from strata.testing.qwen35 import hf_model  # noqa: E402

torch.set_num_threads(1)

TOLERANCE = 2e-5
SEED = 5
MIXES = {
    "f32": None,
    "q8_0": {"embed": "Q8_0", "attn": "Q8_0", "router": "Q8_0", "experts": "Q8_0", "output": "Q8_0"},
    "mxfp4": {"embed": "Q8_0", "attn": "Q8_0", "experts": "MXFP4", "output": "Q8_0"},
}
# Past two ends of the DeltaNet's 64-position chunks.
PROMPT = ("The quick brown fox jumps over the lazy dog. 1234567890 <|im_start|>user\nhello<|im_end|> " * 3
          + "Pack my box with five dozen liquor jugs.")


@pytest.fixture(scope="module")
def q35_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen35moe")


@pytest.fixture(scope="module")
def q35_model(q35_dir):
    made: dict[str, str] = {}

    def make(mix: str, **kw) -> str:
        name = mix + "".join(f"-{k}={v}" for k, v in sorted(kw.items()))
        if name not in made:
            made[name] = str(make_qwen35moe(q35_dir / f"{name}.gguf", quant=MIXES[mix], seed=SEED, **kw))
        return made[name]

    return make


@functools.cache
def _hf_logits(path: str, ids: tuple[int, ...]) -> np.ndarray:
    with torch.no_grad():
        return hf_model(path, dtype=torch.float64)(torch.tensor([list(ids)])).logits[0].numpy()


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _third_of_experts(path: str, prefill: int = 8) -> str:
    """A cache of the chunk's region and a third of all experts (the slots' count after the region)."""
    info = strata.ModelInfo(path)
    spec, region = info.spec, info.layout(prefill, True)["slots"]
    return f"{(region + spec['layers'] * spec['experts'] // 3) * spec['slot_bytes']}b"


@pytest.mark.parametrize("mix", list(MIXES))
def test_logits_match_transformers(q35_model, mix):
    path = q35_model(mix)
    # Streamed through a cache a third the size of the experts, in chunks of 8, under moe_layout="fused": the
    # fused layout, and the recurrent state carried across six chunks.
    m = strata.Model(path, expert_cache=_third_of_experts(path), prefill=8, progress=False, moe_layout="fused")
    assert m.layout(8)["kind"] == "fused"
    ids = m.tokenize(PROMPT)
    assert len(ids) > 2 * 64
    ours = m.logits(ids)
    err = _rel_err(ours, _hf_logits(path, tuple(ids)))
    print(f"qwen35moe {mix}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE


@pytest.mark.parametrize("cache", ["all", "third"])
def test_greedy_tokens_match_transformers(q35_model, cache):
    """Every expert resident (the MMQ layout; float experts are never quantized) or streamed through a
    third of them (the fused layout, moe_layout="fused"): the prompt, then greedy decoding (one token a
    pass, the gathered decode MoE, the recurrent state advanced a token at a time) token for token against
    transformers' argmax over the whole sequence."""
    path = q35_model("f32")
    streamed = {} if cache == "all" else {"expert_cache": _third_of_experts(path), "prefill": 8, "moe_layout": "fused"}
    m = strata.Model(path, progress=False, **streamed)
    assert m.cache["all_resident"] == (cache == "all")
    ids = m.tokenize(PROMPT)
    err = _rel_err(m.logits(ids), _hf_logits(path, tuple(ids)))
    print(f"qwen35moe f32, cache {cache}: max relative logit error {err:.3e}")
    assert err <= TOLERANCE
    prompt = m.tokenize(PROMPT)[:50]  # decoding crosses the chunk end at 64
    out = m.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True)
    seq = list(prompt) + out.tokens
    assert len(out.tokens) == 24
    nxt = _hf_logits(path, tuple(seq))[len(prompt) - 1:].argmax(-1).tolist()
    for i, tok in enumerate(out.tokens):
        assert nxt[i] == tok, f"token {i} differs: strata {tok}, transformers {nxt[i]}"


def test_decode_paths_give_the_prompt_paths_tokens(q35_model):
    """A decode step runs its experts gathered (resident, or a bounded cache resolved on the host or on the
    device) and advances the DeltaNet state one position; a prompt runs them expert by expert over chunks.
    Greedy decoding past a 64-position chunk end gives the same tokens in every configuration, each the
    argmax of the prompt path's logits at its position."""
    path = q35_model("f32")
    info = strata.ModelInfo(path)
    spec, region = info.spec, info.layout(16, True)["slots"]
    bounded = f"{(region + spec['top_k'] + 1) * spec['slot_bytes']}b"
    ids = [int(x) for x in np.random.default_rng(4).integers(1, 500, 50)]
    runs = {}
    for name, kw in {"resident": dict(expert_cache="all"),
                     "bounded-host": dict(expert_cache=bounded, decode_resolve="host"),
                     "bounded-device": dict(expert_cache=bounded, decode_resolve="device")}.items():
        m = strata.Model(path, prefill=16, progress=False, **kw)
        out = m.generate(ids, max_tokens=24, temperature=0.0, ignore_eos=True)
        assert m._m.decode_resolution == name.split("-")[-1]
        runs[name] = out.tokens
    want = runs["resident"]
    assert all(got == want for got in runs.values()), runs
    logits = strata.Model(path, prefill=16, expert_cache=bounded, progress=False).logits(ids + want[:-1])
    assert logits[len(ids) - 1:].argmax(axis=1).tolist() == want


@pytest.mark.parametrize("seqs", [1, 2])
def test_the_serving_engine_interleaves_sequences_as_alone(q35_model, seqs):
    """`strata serve`'s engine: two sequences in flight after every step, one of them a long prompt run a
    chunk a step (each piece continues the recurrent state). With one KV region they take turns on it (a
    sequence that lost it re-runs its tokens from position 0); with two each keeps its own region's state
    and the decoding ones advance together in one pass. Each gets the tokens it gets alone."""
    from strata.model import sampling_params
    from strata.serve.engine import Done, Engine, Job, Piece

    path = q35_model("f32")
    m = strata.Model(path, progress=False, ctx=512 * seqs, prefill=16, seqs=seqs)
    rng = np.random.default_rng(21)
    prompts = [[int(x) for x in rng.integers(1, 500, n)] for n in (100, 7)]
    alone = [m.generate(p, max_tokens=10, temperature=0, ignore_eos=True).text for p in prompts]
    got: list[list[str]] = [[], []]
    ended = [threading.Event(), threading.Event()]
    ends: list = [None, None]

    def sink(i: int):
        def f(ev) -> None:
            if isinstance(ev, Piece):
                got[i].append(ev.text)
            else:
                ends[i] = ev
                ended[i].set()
        return f

    if seqs == 1:
        with pytest.warns(strata.StrataWarning, match="1 KV region for 2 slots"):
            eng = Engine(m, parallel=2, turn=1)
    else:
        eng = Engine(m, parallel=2, turn=1)
    assert eng.batched == (seqs == 2)
    for i, p in enumerate(prompts):
        sp = sampling_params(max_tokens=10, temperature=0)
        sp.stop_ids = []
        eng.submit(Job(p, sp, [], sink(i)))
    eng.start()
    try:
        assert all(e.wait(60) for e in ended)
    finally:
        eng.shutdown()
    assert all(isinstance(e, Done) for e in ends)
    assert all(alone) and ["".join(g) for g in got] == alone
    assert (eng.counters.recomputed > 0) == (seqs == 1)
    assert (eng.counters.batched_steps > 0) == (seqs == 2)


def test_kv_regions_hold_their_own_recurrent_state_and_batch(q35_model):
    """With several KV sequence regions (seqs=, --parallel) each region has its own recurrent state (and its
    own committed copy): two sequences decoded in turns, or together in one pass (decode_batch: the dense
    and expert matmuls over both rows, each row's conv, delta rule and attention in its own region), give
    each the logits it gets alone, bit for bit, past a 64-position chunk end."""
    path = q35_model("f32")
    rng = np.random.default_rng(31)
    a = [int(x) for x in rng.integers(1, 500, 124)]  # its steps cross the chunk end at 128
    b = [int(x) for x in rng.integers(1, 500, 70)]
    xs, ys = [int(x) for x in rng.integers(1, 500, 6)], [int(x) for x in rng.integers(1, 500, 6)]

    def alone(prompt: list[int], steps: list[int]) -> list[np.ndarray]:
        one = strata.Model(path, ctx=256, progress=False)
        one.logits(prompt)
        return [one.decode_batch([t], [len(prompt) + i], [0]) for i, t in enumerate(steps)]

    m = strata.Model(path, ctx=512, seqs=2, progress=False)
    assert m.batch_supported
    ref_a = m.logits(a, seq=0)
    m.logits(b, seq=1)  # region 1's state does not touch region 0's
    got_a, got_b = [], []
    for i in range(len(xs)):  # in turns, one sequence a pass
        got_a.append(m.decode_batch([xs[i]], [len(a) + i], [0]))
        got_b.append(m.decode_batch([ys[i]], [len(b) + i], [1]))
    for got, want in ((got_a, alone(a, xs)), (got_b, alone(b, ys))):
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert np.array_equal(m.logits(a, seq=1), ref_a)  # the same tokens in the other region
    # Together: region 0 holds a, region 1 holds b again; each step advances both in one pass.
    m.logits(a, seq=0)
    m.logits(b, seq=1)
    both = [m.decode_batch([xs[i], ys[i]], [len(a) + i, len(b) + i], [0, 1]) for i in range(len(xs))]
    assert all(np.array_equal(r[0], g[0]) and np.array_equal(r[1], h[0])
               for r, g, h in zip(both, got_a, got_b, strict=True))


def test_spec_and_info_hold_the_files_hyperparameters(q35_model):
    s = strata.ModelInfo(q35_model("f32")).spec
    got = {k: s[k] for k in ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "experts", "top_k",
                              "expert_ffn", "vocab", "ctx_train")}
    # block_count is 7: six layers and the MTP block, which is not loaded.
    assert got == {"arch": "qwen35moe", "layers": 6, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32,
                   "experts": 8, "top_k": 3, "expert_ffn": 32, "vocab": 512, "ctx_train": 8192}
    assert s["rope_base"] == pytest.approx(3e4) and s["rms_eps"] == pytest.approx(3e-5)
    details = dict(s["details"])
    assert details["layer kinds"] == "4 gated DeltaNet, 2 gated full attention (full_attention_interval 3)"
    assert details["linear attention"] == "conv 3, 2 key heads of 16, 6 value heads of 32"
    assert details["rope"] == "NEOX over 16 of 32 dims"
    assert details["shared expert"] == "FFN 64, sigmoid gate"
    assert details["ignored"] == "1 MTP block(s)"


def test_mtp_blocks_are_skipped(q35_model):
    """The MTP block after the trunk is neither run nor needed: a file without it gives the same logits."""
    ids = [int(x) for x in np.random.default_rng(3).integers(1, 500, 19)]
    with_mtp = strata.Model(q35_model("f32"), progress=False).logits(ids)
    without = strata.Model(q35_model("f32", mtp=0), progress=False).logits(ids)
    assert np.array_equal(with_mtp, without)


def test_per_layer_kinds_from_recurrent_layers(q35_model):
    """llama.cpp's attention.recurrent_layers in place of full_attention_interval: the interval's pattern
    written as a list gives the same logits bit for bit; another pattern moves them, and transformers
    agrees on the new ones."""
    ids = [int(x) for x in np.random.default_rng(5).integers(1, 500, 80)]
    base = strata.Model(q35_model("f32"), progress=False).logits(ids)
    as_list = q35_model("f32", recurrent=(True, True, False, True, True, False))
    assert dict(strata.ModelInfo(as_list).spec["details"])["layer kinds"] == "4 gated DeltaNet, 2 gated full attention"
    assert np.array_equal(strata.Model(as_list, progress=False).logits(ids), base)
    other = q35_model("f32", recurrent=(False, True, True, False, False, True))
    ours = strata.Model(other, progress=False).logits(ids)
    assert _rel_err(ours, base) > 10 * TOLERANCE
    assert _rel_err(ours, _hf_logits(other, tuple(ids))) <= TOLERANCE


# One hyperparameter changed, same tensors where the shapes allow (they depend only on the seed and
# their names); the head counts and dims change the shapes of the layers' tensors too.
VARIANTS = {"rope_theta": 4e5, "rms_eps": 3e-4, "top_k": 2, "kv_heads": 4, "heads": 8, "head_dim": 48,
            "experts": 12, "expert_ffn": 48, "rope_dims": 32, "interval": 2,
            "conv_kernel": 5, "k_heads": 3, "v_heads": 2, "k_head_dim": 24, "v_head_dim": 16, "shared_ffn": 32,
            "decay_max": 6.0}


@pytest.mark.parametrize("key", list(VARIANTS))
def test_each_hyperparameter_from_metadata_moves_the_logits(q35_model, key):
    """A file that changes one hyperparameter changes strata's logits, and transformers agrees on the
    new ones: the key is read, and read as transformers reads it (decay_max changes ssm_a's values, the
    decay strength)."""
    base_path, path = q35_model("f32"), q35_model("f32", **{key: VARIANTS[key]})
    m = strata.Model(path, expert_cache=64, prefill=16, progress=False)
    ids = m.tokenize(PROMPT)
    ours = m.logits(ids)
    base = strata.Model(base_path, expert_cache=64, prefill=16, progress=False).logits(ids)
    moved = _rel_err(ours, base)
    err = _rel_err(ours, _hf_logits(path, tuple(ids)))
    print(f"{key} -> {VARIANTS[key]}: logits moved {moved:.2e}, error vs transformers {err:.2e}")
    assert moved > 10 * TOLERANCE
    assert err <= TOLERANCE


def _slot_bytes(path: str, prefill: int, unfused: bool, moe_layout: str) -> tuple[int, int]:
    plan = strata.ModelInfo(path, gr_unfused=unfused, moe_layout=moe_layout).layout(prefill, True)
    assert plan["kind"] == ("fused" if moe_layout == "fused" else "mmq")
    return plan["slots"], plan["slot_bytes"]


@pytest.mark.parametrize("moe_layout", ["auto", "fused"])
@pytest.mark.parametrize("mix", ["q8_0", "mxfp4"])
def test_logits_do_not_depend_on_cache_or_chunk_size(q35_model, mix, moe_layout):
    """Streamed, in either MoE layout: byte-identical logits across cache sizes from thrashing to all, chunk
    sizes that cut the prompt unevenly (the recurrent state crossing each cut, the cuts falling inside
    and across the DeltaNet's 64-position chunks), both sources and both GR modes; the one-token decode
    scratch equals the first row of a prompt; with every expert resident (MMQ) identical across chunk
    sizes, and (the default, MMQ streamed too) identical to the streamed logits."""
    path = q35_model(mix)
    rng = np.random.default_rng(99)
    prompt = [int(x) for x in rng.integers(1, 500, size=150)]
    spec = strata.ModelInfo(path).spec
    n = spec["layers"] * spec["experts"]
    ref = None
    for prefill, source, unfused in ((5, "host", False), (13, "mmap", True), (150, "host", False)):
        region, slot = _slot_bytes(path, prefill, unfused, moe_layout)
        for slots in (region + 1, region + spec["top_k"] + 2, region + n):
            m = strata.Model(path, ctx=160, expert_cache=f"{slots * slot}b", prefill=prefill, source=source,
                             gr_unfused=unfused, progress=False, moe_layout=moe_layout)
            assert not m.cache["all_resident"]
            out = m.logits(prompt)
            if ref is None:
                ref = out
            assert np.array_equal(out, ref), f"prefill {prefill}, {slots} slots: {np.abs(out - ref).max()}"
    one = strata.Model(path, ctx=160, expert_cache=64, prefill=16, progress=False,
                       moe_layout=moe_layout).logits(prompt[:1])
    assert np.array_equal(one[0], ref[0])
    mmq = [strata.Model(path, ctx=160, expert_cache="all", prefill=p, progress=False).logits(prompt)
           for p in (7, 150)]
    assert np.array_equal(mmq[0], mmq[1])
    if moe_layout != "fused":
        assert np.array_equal(mmq[0], ref), f"streamed MMQ vs all resident: {np.abs(mmq[0] - ref).max()}"
    # Against the fused layout, the MMQ layout's q8_0 activations move these logits by 9e-2 (q8_0) and 2.5e-1
    # (MXFP4) of max |logit|: the random DeltaNet outputs are small next to rms_eps (the rms_eps variant above
    # moves the logits by 0.6), so the rounding of the experts' inputs is amplified. No closeness bound here
    # would be derived; the MMQ block itself is checked against float64 with the same q8_0 activations on
    # qwen3moe (test_vs_transformers.py), and on this model with float experts
    # (test_greedy_tokens_match_transformers).


def test_chat_turns_keep_the_recurrent_state_only_when_extended(q35_model):
    """The state is a snapshot after the last token fed, not a slice: a prompt that extends everything the
    cache holds runs only its new tokens; one that shares only a beginning runs from position 0. Either
    way the tokens are a fresh model's."""
    path = q35_model("f32")
    m = strata.Model(path, prefill=8, progress=False)
    fresh = strata.Model(path, prefill=8, progress=False)
    rng = np.random.default_rng(8)
    a = [int(x) for x in rng.integers(1, 500, 60)]  # the first turn's decoding crosses the chunk end at 64
    first = m.generate(a, max_tokens=6, temperature=0, reuse_kv=True, ignore_eos=True)
    assert first.stats["prompt_reused"] == 0
    # The next turn: everything before, the reply, new tokens.
    b = a + first.tokens + [int(x) for x in rng.integers(1, 500, 9)]
    held = len(a) + len(first.tokens) - 1  # the last sampled token was never fed
    ext = m.generate(b, max_tokens=8, temperature=0, reuse_kv=True, ignore_eos=True)
    assert ext.stats["prompt_reused"] == held
    assert ext.tokens == fresh.generate(b, max_tokens=8, temperature=0, ignore_eos=True).tokens
    assert np.array_equal(m.logits(b), fresh.logits(b))
    # An edited history: only the first 70 tokens agree, and the state cannot be cut back to them.
    c = b[:70] + [int(x) for x in rng.integers(1, 500, 7)]
    m.generate(b, max_tokens=2, temperature=0, reuse_kv=True, ignore_eos=True)  # the cache holds b again
    cut = m.generate(c, max_tokens=8, temperature=0, reuse_kv=True, ignore_eos=True)
    assert cut.stats["prompt_reused"] == 0
    assert cut.tokens == fresh.generate(c, max_tokens=8, temperature=0, ignore_eos=True).tokens


class _SigintAt:
    """Stands in for the prompt's progress line: sends SIGINT (synchronously, to this process) once the
    prompt's progress passes `at` tokens, so the pass stops at the next layer, its state half advanced."""

    def __init__(self, at: float) -> None:
        self.at, self.sent = at, False

    def __call__(self, done: float, total: int) -> None:
        if not self.sent and done >= self.at:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)

    def close(self) -> None:
        pass


def test_an_interrupted_turn_leaves_a_fresh_models_tokens(q35_model, monkeypatch):
    """Ctrl-C inside a chat turn's prompt that continues the cached state (the pass stopped between two
    DeltaNet layers, inside the second 64-position chunk): the state is no one's, so the next turn runs
    from position 0, and its tokens and logits are a fresh model's."""
    path = q35_model("f32")
    m = strata.Model(path, prefill=16, progress=False)
    fresh = strata.Model(path, prefill=16, progress=False)
    rng = np.random.default_rng(12)
    a = [int(x) for x in rng.integers(1, 500, 30)]
    first = m.generate(a, max_tokens=4, temperature=0, reuse_kv=True, ignore_eos=True)
    b = a + first.tokens + [int(x) for x in rng.integers(1, 500, 90)]
    bar = _SigintAt(len(a) + 50.5)
    monkeypatch.setattr(strata.model, "PromptProgress", lambda: bar)
    monkeypatch.setattr(strata.Model, "_shows_progress", lambda self: True)
    with pytest.raises(KeyboardInterrupt):
        m.generate(b, max_tokens=4, temperature=0, reuse_kv=True, ignore_eos=True)
    assert bar.sent and m.last_stats["stop_reason"] == "interrupted"
    assert m.last_stats["prompt_reused"] == len(a) + len(first.tokens) - 1
    monkeypatch.undo()
    again = m.generate(b, max_tokens=8, temperature=0, reuse_kv=True, ignore_eos=True)
    assert again.stats["prompt_reused"] == 0
    assert again.tokens == fresh.generate(b, max_tokens=8, temperature=0, ignore_eos=True).tokens
    assert np.array_equal(m.logits(b), fresh.logits(b))


def q35_scratch(md: dict, spec: dict) -> list[tuple[str, str, list[int]]]:
    """qwen35moe's scratch list as model/qwen35moe.cpp's declare_q35_scratch declares it, from the metadata."""
    H, KV, hd, D = spec["heads"], spec["kv_heads"], spec["head_dim"], spec["hidden"]
    Hk, Hv, dk = md["qwen35moe.ssm.group_count"], md["qwen35moe.ssm.time_step_rank"], md["qwen35moe.ssm.state_size"]
    dv = md["qwen35moe.ssm.inner_size"] // Hv
    C, Fs = 2 * Hk * dk + Hv * dv, md["qwen35moe.expert_shared_feed_forward_length"]
    Hd, Vd = H * hd, Hv * dv
    return [("mix.in", "f32", [max(2 * Hd, C)]), ("mix.mid", "f32", [max(Hd, C)]), ("mix.gate", "f32", [max(Hd, Vd)]),
            ("mix.out", "f32", [max(Hd, Vd)]), ("attn.k", "f32", [KV, hd]), ("attn.v", "f32", [KV, hd]),
            ("gdn.a", "f32", [Hv]), ("gdn.b", "f32", [Hv]), ("shexp.gate", "f32", [Fs]), ("shexp.up", "f32", [Fs]),
            ("shexp.out", "f32", [D]), ("shexp.scale", "f32", [])]


@pytest.mark.parametrize("mix", ["f32", "mxfp4"])
def test_model_layout_matches_shape_plan(q35_model, mix):
    """Invariants 1 and 2: the model's chunk plan is the shape plan of its scratch list (the two layer kinds'
    shared mixer buffers, each as wide as its wider use, and the shared expert's), exact and 256-aligned, for
    every T and both layouts (a source under moe_layout 'fused': fused; else MMQ)."""
    path = q35_model(mix)
    info = strata.inspect(path)
    for moe_layout in ("auto", "fused"):
        m = strata.Model(path, expert_cache="all", prefill=64, ctx=256, progress=False, moe_layout=moe_layout)
        s = m.spec
        by_name = {t["name"]: t["type"] for t in info["tensors"]}
        types = [by_name[f"blk.{i}.ffn_{w}_exps.weight"] for i in range(s["layers"]) for w in ("gate", "up", "down")]
        shape = dict(D=s["hidden"], HC=1, E=s["experts"], K=s["top_k"], F=s["expert_ffn"], heads=s["heads"],
                     kv_heads=s["kv_heads"], head_dim=s["head_dim"], expert_types=types, unfused=False,
                     scratch=q35_scratch(info["metadata"], s), streamed_fused=moe_layout == "fused")
        for T in (1, 2, 17, 64, 257, 4096):
            for src in (True, False):
                got = m.layout(T, src)
                check_plan(shape, T, src, got)
                want = prefill_layout(shape, T, src)
                assert got["buffers"] == want["buffers"] and got["bytes_needed"] == want["bytes_needed"]


def _edited(src: str, dst, edit) -> str:
    with open(src, "rb") as f:
        g = Gguf.parse(f.read())
    edit(g)
    with open(dst, "wb") as f:
        f.write(g.serialize())
    return str(dst)


@pytest.mark.parametrize("edit,message", [
    (lambda g: g.set("qwen35moe.ssm.time_step_rank", U32, 5),
     r"qwen35moe.ssm.time_step_rank 5 \(value heads\) is not a multiple of qwen35moe.ssm.group_count 2"),
    (lambda g: g.set("qwen35moe.ssm.conv_kernel", U32, 0), r"'qwen35moe.ssm.conv_kernel' = 0 is out of range"),
    (lambda g: g.set("qwen35moe.ssm.inner_size", U32, 190),
     r"qwen35moe.ssm.inner_size 190 is not a multiple of qwen35moe.ssm.time_step_rank 6"),
    (lambda g: g.set("qwen35moe.nextn_predict_layers", U32, 7),
     r"'qwen35moe.nextn_predict_layers' = 7 is out of range \[0, 6\]"),
    (lambda g: g.set("qwen35moe.rope.dimension_count", U32, 15), r"rope.dimension_count 15 must be even"),
    (lambda g: g.set("qwen35moe.rope.dimension_count", U32, 34), r"'qwen35moe.rope.dimension_count' = 34 is out"),
    (lambda g: g.set("qwen35moe.full_attention_interval", U32, 0),
     r"'qwen35moe.full_attention_interval' = 0 is out of range"),
    (lambda g: g.set("qwen35moe.attention.recurrent_layers", ARRAY, [1, 2, 1, 1, 1, 1], U32),
     r"qwen35moe.attention.recurrent_layers\[1\] = 2 is not a flag"),
    (lambda g: g.set("qwen35moe.attention.recurrent_layers", ARRAY, [1, 1], U32),
     r"qwen35moe.attention.recurrent_layers must be an array of at least 6 flags"),
    (lambda g: setattr(g.tensor("blk.1.ssm_a"), "name", b"blk.1.ssm_a.weight"),
     r"qwen35moe tensor 'blk.1.ssm_a' is missing"),
    (lambda g: setattr(g.tensor("blk.0.ssm_conv1d.weight"), "ne", [2, 256]),
     r"tensor 'blk.0.ssm_conv1d.weight' has shape \[2, 256\], expected \[3, 256\]"),
    (lambda g: setattr(g.tensor("blk.2.attn_q.weight"), "ne", [64, 128]),
     r"tensor 'blk.2.attn_q.weight' has shape \[64, 128\], expected \[64, 256\]"),
])
def test_bad_metadata_and_tensors_give_clear_errors(q35_model, tmp_path, edit, message):
    path = _edited(q35_model("f32"), tmp_path / "bad.gguf", edit)
    with pytest.raises(strata.FormatError, match=message) as e:
        strata.ModelInfo(path)
    assert "bad.gguf" in str(e.value)


def test_fused_gate_up_experts_are_refused_by_name(q35_model, tmp_path):
    path = _edited(q35_model("f32"), tmp_path / "fused.gguf",
                   lambda g: setattr(g.tensor("blk.0.ffn_gate_exps.weight"), "name", b"blk.0.ffn_gate_up_exps.weight"))
    with pytest.raises(strata.UnsupportedError, match=r"fused.gguf: tensor 'blk.0.ffn_gate_up_exps.weight' holds the "
                       r"experts' gate and up fused, which strata does not read yet"):
        strata.ModelInfo(path)
