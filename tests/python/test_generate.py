"""Generation: sampler options, seeds, stop tokens and strings, max tokens, streaming, chat."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import strata
from strata.chat import DEFAULT_CHAT_TEMPLATE, render_chat


@pytest.fixture(scope="module")
def model(make_mix) -> strata.Model:
    return strata.Model(make_mix("f32"), progress=False)


PROMPT = "The expert cache holds"


def test_greedy_is_argmax_of_logits(model):
    ids = model.tokenize(PROMPT)
    out = model.generate(ids, max_tokens=6, temperature=0)
    seq = list(ids)
    for tok in out.tokens:
        assert tok == int(np.argmax(model.logits(seq)[-1]))
        seq.append(tok)


def test_seed_reproducible_and_varied(model):
    kw = dict(max_tokens=12, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    a = model.generate(PROMPT, seed=1, **kw).tokens
    b = model.generate(PROMPT, seed=1, **kw).tokens
    assert a == b
    others = {tuple(model.generate(PROMPT, seed=s, **kw).tokens) for s in range(2, 6)}
    assert len(others | {tuple(a)}) > 1


def test_top_k_1_and_tiny_min_p_mass_are_greedy(model):
    greedy = model.generate(PROMPT, max_tokens=8, temperature=0).tokens
    assert model.generate(PROMPT, max_tokens=8, temperature=1.0, top_k=1, seed=3).tokens == greedy
    kw = dict(max_tokens=8, temperature=1.0, top_k=0)
    assert model.generate(PROMPT, top_p=1e-6, min_p=0, seed=4, **kw).tokens == greedy
    assert model.generate(PROMPT, top_p=1.0, min_p=0.999, seed=5, **kw).tokens == greedy


def test_top_k_limits_the_candidates(model):
    ids = model.tokenize(PROMPT)
    top3 = set(np.argsort(-model.logits(ids)[-1])[:3].tolist())
    firsts = {model.generate(ids, max_tokens=1, temperature=5.0, top_k=3, top_p=1.0, min_p=0, seed=s).tokens[0]
              for s in range(40)}
    assert firsts <= top3 and len(firsts) > 1


def test_repetition_penalty_matches_llama_cpp_rule(model):
    ids = model.tokenize(PROMPT)
    first = model.generate(ids, max_tokens=1, temperature=0).tokens[0]
    rep = ids + [first] * 4  # the prompt repeats the greedy token
    lg = model.logits(rep)[-1].astype(np.float64)
    for t in set(rep[-64:]):  # positive logits divided, negative multiplied (llama.cpp's penalty)
        lg[t] = lg[t] / 50.0 if lg[t] > 0 else lg[t] * 50.0
    pen = model.generate(rep, max_tokens=1, temperature=0, repetition_penalty=50.0).tokens[0]
    assert pen == int(np.argmax(lg))
    assert pen != first


def test_repetition_penalty_window_is_the_last_64_tokens(model):
    """The penalty covers exactly the last penalty_last_n = 64 tokens. The prompt is built so that the
    token 64 back would win if not penalized (a window of 63 shows), and the token 65 back wins only
    while it is not (a window of 65, or the whole history, shows)."""
    n = strata.GENERATE_DEFAULTS["repeat_last_n"]
    assert n == 64
    rng = np.random.default_rng(3)
    ids = [int(x) for x in rng.integers(1, 500, 80)]
    for _ in range(10):  # each change moves the logits a little: repeat to a fixed point
        before = list(ids)
        lg = model.logits(ids)[-1]
        ids[-n] = max((t for t in range(lg.size) if t not in set(ids[-n + 1 :])), key=lambda t: lg[t])
        ids[-n - 1] = max((t for t in range(lg.size) if t not in set(ids[-n:])), key=lambda t: lg[t])
        if ids == before:
            break
    assert ids == before, "no fixed point"
    inside, outside = ids[-n], ids[-n - 1]
    assert lg[inside] > lg[outside] > 0 and outside not in ids[-n:]
    assert model.generate(ids, max_tokens=1, temperature=0, repetition_penalty=50.0).tokens == [outside]
    assert model.generate(ids, max_tokens=1, temperature=0).tokens == [int(np.argmax(lg))]


# ---- the sampler against an independent numpy model of its distribution ----

def sampler_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
                  repetition_penalty: float = 1.0, history: tuple[int, ...] = ()) -> np.ndarray:
    """llama.cpp's chain (the repetition penalty over the last 64 tokens, then top-k, top-p and min-p on
    the temperature-1 distribution, then temperature), written from its documentation: the probability
    of each token id."""
    lg = logits.astype(np.float64)
    for t in set(history[-64:]):
        lg[t] = lg[t] / repetition_penalty if lg[t] > 0 else lg[t] * repetition_penalty
    order = np.argsort(-lg, kind="stable")
    keep = order[:top_k] if top_k > 0 else order
    p = np.exp(lg[keep] - lg[keep[0]])
    p /= p.sum()
    if top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(p), top_p)) + 1  # the smallest prefix holding top_p
        keep, p = keep[:cut], p[:cut]
    if min_p > 0.0:
        keep = keep[p >= min_p * p[0]]
    out = np.zeros(lg.size)
    w = np.exp((lg[keep] - lg[keep[0]]) / temperature)
    out[keep] = w / w.sum()
    return out


def chi2_critical(dof: int, z: float = 3.72) -> float:
    """The chi-square quantile of a z-sigma one-sided tail (3.72: 1e-4), Wilson-Hilferty's approximation."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * np.sqrt(a)) ** 3


SAMPLER_CASES = {
    "temperature 0.4": dict(temperature=0.4, top_k=0, top_p=1.0, min_p=0.0),
    "temperature 1.6, top-k 6": dict(temperature=1.6, top_k=6, top_p=1.0, min_p=0.0),
    "top-p 0.3": dict(temperature=0.8, top_k=0, top_p=0.3, min_p=0.0),
    "min-p 0.5": dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.5),
    "defaults": dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    # A 70-token prompt of tokens with negative logits, the last 64 penalized: multiplied out of reach
    # (divided, they would rise to ~0 and take a few percent of the draws)
    "repetition penalty 50": dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=50.0),
}


@pytest.mark.parametrize("case", list(SAMPLER_CASES))
def test_sampler_draws_the_documented_distribution(model, case):
    """1500 seeded draws of the first token: only tokens the numpy model allows, in its proportions
    (Pearson's chi-square over the tokens expected 5 times or more, the rest pooled, penalized apart)."""
    kw = SAMPLER_CASES[case]
    ids = model.tokenize("The expert cache holds")
    if "repetition_penalty" in kw:
        rng = np.random.default_rng(9)
        lg = model.logits([int(x) for x in rng.integers(1, 500, 70)])[-1]
        ids = [int(x) for x in rng.choice(np.flatnonzero(lg < -0.5), 70)]
    probs = sampler_probs(model.logits(ids)[-1], **kw, history=tuple(ids))
    penalized = np.isin(np.arange(probs.size), ids[-64:]) if "repetition_penalty" in kw else np.zeros(probs.size, bool)
    n = 1500
    counts = np.zeros(probs.size)
    stops, model.tokenizer.stop_ids = model.tokenizer.stop_ids, frozenset()  # a drawn stop token counts too
    try:
        for seed in range(n):
            counts[model.generate(ids, max_tokens=1, seed=seed, **kw).tokens[0]] += 1
    finally:
        model.tokenizer.stop_ids = stops
    assert counts[probs == 0].sum() == 0, f"drew tokens the {case} distribution excludes"
    big = probs * n >= 5
    pools = [~big & penalized, ~big & ~penalized]  # the rare tokens, penalized ones apart
    obs = np.concatenate([counts[big], [counts[q].sum() for q in pools]])
    exp = np.concatenate([probs[big] * n, [probs[q].sum() * n for q in pools]])
    obs, exp = obs[exp > 1e-3], exp[exp > 1e-3]
    assert obs.sum() == n, "drew tokens expected (almost) never"
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    print(f"{case}: {int((probs > 0).sum())} tokens allowed, chi2 {chi2:.1f} over {dof} dof "
          f"(critical {chi2_critical(dof):.1f})")
    assert dof >= 3, "too few categories for the test to mean anything"
    assert chi2 <= chi2_critical(dof), f"{case}: chi2 {chi2:.1f} > {chi2_critical(dof):.1f} at {dof} dof"
    # Each pool on its own too (a binomial count; 4.5 sigma): a shift inside one is diluted in the sum.
    for q in pools:
        e, o = probs[q].sum() * n, counts[q].sum()
        assert abs(o - e) <= 4.5 * np.sqrt(e) + 1, f"{case}: {o:.0f} draws in a pool expected {e:.1f} times"


def test_max_tokens_and_stats(model):
    out = model.generate(PROMPT, max_tokens=5, temperature=0)
    s = out.stats
    assert len(out.tokens) == s["generated"] <= 5
    if s["stop_reason"] == "max_tokens":
        assert s["generated"] == 5 and s["decode_passes"] == 4
    assert s["prompt_tokens"] == len(model.tokenize(PROMPT)) and s["prompt_ms"] > 0
    assert model.generate(PROMPT, max_tokens=0).tokens == []


def test_stop_token_ends_generation(model):
    ids = model.tokenize(PROMPT)
    greedy = model.generate(ids, max_tokens=4, temperature=0).tokens
    # Make the second greedy token a stop token by asking for it through the tokenizer's stop ids.
    model.tokenizer.stop_ids = frozenset(model.tokenizer.stop_ids | {greedy[1]})
    try:
        out = model.generate(ids, max_tokens=4, temperature=0)
    finally:
        model.tokenizer.stop_ids = frozenset(model.tokenizer.stop_ids - {greedy[1]})
    assert out.tokens == greedy[:1] and out.stats["stop_reason"] == "stop_token"


def test_ignore_eos_runs_past_a_stop_token(model):
    ids = model.tokenize(PROMPT)
    greedy = model.generate(ids, max_tokens=4, temperature=0).tokens
    model.tokenizer.stop_ids = frozenset(model.tokenizer.stop_ids | {greedy[1]})
    try:
        out = model.generate(ids, max_tokens=4, temperature=0, ignore_eos=True)
    finally:
        model.tokenizer.stop_ids = frozenset(model.tokenizer.stop_ids - {greedy[1]})
    assert len(out.tokens) == 4 and out.tokens[:2] == greedy[:2] and out.stats["stop_reason"] == "max_tokens"


def test_stop_strings_cut_text_streamed_or_not(model):
    full = model.generate(PROMPT, max_tokens=24, temperature=0).text
    assert len(full) > 6
    stop = full[3:6]
    cut = full[: full.find(stop)]
    assert model.generate(PROMPT, max_tokens=24, temperature=0, stop=[stop, "\x00never"]).text == cut
    pieces = list(model.generate(PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True))
    assert "".join(pieces) == cut
    assert model.last_stats["stop_reason"] == "stop_string"


def test_chat_stop_strings_cut_text_streamed_or_not(model):
    """chat(stop=) cuts the reply before the first stop string, streamed or not, as generate(stop=) does."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    full = model.chat(msgs, max_tokens=24, temperature=0).text
    assert len(full) > 6
    stop = full[3:6]
    cut = full[: full.find(stop)]
    out = model.chat(msgs, max_tokens=24, temperature=0, stop=[stop, "\x00never"])
    assert out.text == cut and out.stats["stop_reason"] == "stop_string"
    pieces = list(model.chat(msgs, max_tokens=24, temperature=0, stop=stop, stream=True))
    assert "".join(pieces) == cut
    assert model.last_stats["stop_reason"] == "stop_string"


def test_stop_strings_completed_by_one_token_cut_at_the_earliest(model):
    """Two stop strings that one token completes together: the text ends before the one that starts first,
    whichever order they are given in."""
    out = model.generate(PROMPT, max_tokens=24, temperature=0)
    text = out.text
    ends = [len(model.detokenize(out.tokens[: i + 1], skip_special=True)) for i in range(len(out.tokens))]
    for start, end in itertools.pairwise(ends):  # a token adding text[start:end]
        first, second = text[start - 2 : start + 1], text[start : start + 2]
        if end - start >= 2 and start >= 2 and text.find(first) == start - 2 and text.find(second) == start:
            break
    else:
        pytest.fail("no token completes two stop strings at once in this text")
    for stops in ([second, first], [first, second]):
        assert model.generate(PROMPT, max_tokens=24, temperature=0, stop=stops).text == text[: start - 2]
        assert "".join(model.generate(PROMPT, max_tokens=24, temperature=0, stop=stops, stream=True)) == text[
            : start - 2]


def test_stream_concatenates_to_text_and_callback_sees_pieces(model):
    full = model.generate(PROMPT, max_tokens=16, temperature=0).text
    seen: list[str] = []
    pieces = list(model.generate(PROMPT, max_tokens=16, temperature=0, stream=True, callback=seen.append))
    assert "".join(pieces) == full and seen == pieces


def test_chat_renders_the_files_own_template(model):
    """The test model's tokenizer.chat_template is not ChatML (conftest.CHAT_TEMPLATE): BOS first, roles in
    capitals, contents trimmed, no newlines. The prompt chat() runs is that template's, written out here."""
    msgs = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "hi"}]
    out = model.chat(msgs, max_tokens=3, temperature=0)
    own = "<|endoftext|><|im_start|>SYSTEM: Be brief.<|im_end|><|im_start|>USER: hi<|im_end|><|im_start|>ASSISTANT: "
    want = model.generate(model.tokenize(own, add_special=False), max_tokens=3, temperature=0).tokens
    assert out.tokens == want
    chatml = model.tokenize(render_chat(DEFAULT_CHAT_TEMPLATE, msgs), add_special=False)
    assert model.generate(chatml, max_tokens=3, temperature=0).tokens != want  # else the check proves nothing


def test_bad_sampling_values(model):
    with pytest.raises(strata.ConfigError, match="top_p"):
        model.generate(PROMPT, max_tokens=1, top_p=0.0)
    with pytest.raises(strata.ConfigError, match="min_p"):
        model.generate(PROMPT, max_tokens=1, min_p=1.5)
    with pytest.raises(strata.ConfigError, match="stop strings"):
        model.generate(PROMPT, max_tokens=1, stop=[""])


def test_inspect(make_mix):
    info = strata.inspect(make_mix("f32"))
    assert info["metadata"]["general.architecture"] == "qwen3moe"
    names = {t["name"] for t in info["tensors"]}
    assert "blk.0.ffn_gate_exps.weight" in names and "token_embd.weight" in names


def test_interleaved_streams_each_yield_what_they_yield_alone(model):
    """Each generate() call owns its tokens: two stream=True iterators on one Model, consumed in
    turns (with a logits() call between them), each yield exactly what they yield alone."""
    kw = dict(max_tokens=12, temperature=0, stream=True)
    prompts = [PROMPT, "Slots are lent to the prompt"]
    alone = ["".join(model.generate(p, **kw)) for p in prompts]
    assert alone[0] != alone[1]  # else a mix-up of the two could pass unseen
    its = [model.generate(p, **kw) for p in prompts]  # both prompts run before either decodes
    got = ["", ""]
    live = [True, True]
    turn = 0
    while any(live):
        for i in (0, 1):
            if live[i]:
                piece = next(its[i], None)
                if piece is None:
                    live[i] = False
                else:
                    got[i] += piece
        turn += 1
        if turn == 3:
            model.logits(model.tokenize("something else entirely"))
    assert got == alone


def test_interleaved_completions_keep_their_own_tokens_and_stats(model):
    kw = dict(max_tokens=6, temperature=0)
    a_alone = model.generate(PROMPT, **kw)
    it = model.generate("Slots are lent to the prompt", stream=True, **kw)
    first = next(it)
    a = model.generate(PROMPT, **kw)  # runs whole while `it` is suspended
    rest = "".join(it)
    assert a.tokens == a_alone.tokens and a.text == a_alone.text
    assert a.stats["generated"] == len(a.tokens)
    assert first + rest == model.generate("Slots are lent to the prompt", **kw).text
