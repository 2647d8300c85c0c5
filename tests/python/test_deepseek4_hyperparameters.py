"""Every DeepSeek V4 hyperparameter strata reads from a file's metadata (csrc/model/deepseek4_spec.cpp),
one at a time: a file that changes it changes strata's logits, and transformers (ds4_reference.py) agrees
on the new ones, so each key is read, and read as transformers reads it. The writer's defaults differ
from each of the reader's fallbacks, so a key not read at all moves the base file's logits too."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import strata
from strata.testing import make_deepseek4

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from ds4_reference import hf_model  # noqa: E402

SEED = 5
TOLERANCE = 1e-4  # test_deepseek4's f32 bound: float32 rounding only (measured ~1e-6)
N_PROMPT = 160  # fills a ratio-128 block and 40 ratio-4 windows: the indexer's top-k and the window bite

# make_deepseek4 arguments, each changed alone from the writer's default (its value in parentheses).
# Tensor shapes follow top_k (the hash tables) and hash_layers; the rest are metadata only. The keys that
# shape tensors (heads, key_length, q_lora_rank, ...) are checked against the tensors at load.
VARIANTS = {
    "rope_theta": dict(rope_theta=1e5),  # rope.freq_base (30000; fallback 10000)
    "compress_rope_theta": dict(compress_rope_theta=4e4),  # attention.compress_rope_freq_base (160000)
    "rope_dim": dict(rope_dim=8),  # rope.dimension_count (16; fallback key_length)
    "rope_scaling": dict(rope_scaling="none"),  # rope.scaling.type (yarn; fallback none)
    "yarn_factor": dict(yarn_factor=1.0),  # rope.scaling.factor (16; at 4, only 3.6e-4 at these positions)
    "yarn_orig_ctx": dict(yarn_orig_ctx=2048),  # rope.scaling.original_context_length (65536; fallback 8192)
    "yarn_beta_fast": dict(yarn_beta_fast=48.0),  # rope.scaling.yarn_beta_fast (24; fallback 32)
    "yarn_beta_slow": dict(yarn_beta_slow=8.0),  # rope.scaling.yarn_beta_slow (2; fallback 1)
    "rms_eps": dict(rms_eps=2e-2),  # attention.layer_norm_rms_epsilon (1e-3; fallback 1e-6)
    "hc_eps": dict(hc_eps=1e-2),  # hyper_connection.epsilon (1e-6)
    "sinkhorn_iters": dict(sinkhorn_iters=3),  # hyper_connection.sinkhorn_iterations (20)
    "routed_scale": dict(routed_scale=0.7),  # expert_weights_scale (1.5)
    "expert_weights_norm": dict(expert_weights_norm=False),  # expert_weights_norm (true; fallback false)
    # swiglu_clamp_exp (10; fallback none) with the shared limit kept; swiglu_clamp_shexp (7.5; fallback
    # the routed limit). Limits below the activations' spread, so the clamps bite.
    "swiglu_limit": dict(swiglu_limit=0.5, swiglu_limit_shared=7.5),
    "swiglu_limit_shared": dict(swiglu_limit_shared=0.4),
    "window": dict(window=5),  # attention.sliding_window (8)
    "index_topk": dict(index_topk=6),  # attention.indexer.top_k (3)
    "top_k": dict(top_k=3),  # expert_used_count (2)
    "hash_layers": dict(hash_layers=1),  # hash_layer_count (2)
}

# The reader's fallback for each key it does not require, and the writer's value (the tiny file's).
FALLBACKS = {
    "deepseek4.context_length": (4096, 8192),
    "deepseek4.rope.freq_base": (10000.0, 30000.0),
    "deepseek4.attention.layer_norm_rms_epsilon": (1e-6, 1e-3),
    "deepseek4.attention.key_length": (64 // 4, 64),  # hidden / heads
    "deepseek4.rope.dimension_count": (64, 16),  # key_length
    "deepseek4.rope.scaling.type": ("none", "yarn"),
    "deepseek4.rope.scaling.original_context_length": (8192, 65536),  # context_length
    "deepseek4.rope.scaling.yarn_beta_fast": (32.0, 24.0),
    "deepseek4.rope.scaling.yarn_beta_slow": (1.0, 2.0),
    "deepseek4.expert_weights_norm": (False, True),
    "deepseek4.swiglu_clamp_exp": (None, [10.0] * 4),  # no clamp
    "deepseek4.swiglu_clamp_shexp": ([10.0] * 4, [7.5] * 4),  # the routed limits
}


def prompt(n: int = N_PROMPT) -> list[int]:
    return [int(x) for x in np.random.default_rng(0).integers(1, 500, n)]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def ds4_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("ds4_hyper"))


@pytest.fixture(scope="module")
def tiny(ds4_dir) -> str:
    return str(make_deepseek4(os.path.join(ds4_dir, "tiny.gguf"), seed=SEED))


@functools.cache
def strata_logits(path: str) -> np.ndarray:
    return strata.Model(path, progress=False).logits(prompt())


def hf_logits(path: str) -> np.ndarray:
    with torch.no_grad():
        return hf_model(path)(torch.tensor([prompt()])).logits[0].float().numpy()


def test_the_writers_values_are_not_the_readers_fallbacks(tiny):
    """A key read wrongly falls back: in the test files, no fallback is the file's value."""
    md = strata.inspect(tiny)["metadata"]
    for key, (fallback, written) in FALLBACKS.items():
        got = md[key]
        got = [float(x) for x in got] if isinstance(got, list) else got
        assert got == pytest.approx(written), key
        assert fallback is None or got != pytest.approx(fallback), key


def test_spec_reads_the_files_values(tiny):
    """What strata info shows is what the file says, including what moves no logit (context_length)."""
    spec = strata.ModelInfo(tiny).spec
    assert (spec["ctx_train"], spec["top_k"], spec["head_dim"]) == (8192, 2, 64)
    assert spec["rms_eps"] == pytest.approx(1e-3) and spec["rope_base"] == pytest.approx(30000.0)
    details = dict(tuple(d) for d in spec["details"])
    assert details["rope"] == "base 30000 (window layers); compressed layers base 160000, YaRN x16 of 65536 (beta 24/2)"
    assert details["swiglu clamp"] == "10 routed, 7.5 shared (layer 0)"
    assert "normalized, x1.5" in details["routing"]
    assert "16 heads x 64" in details["layers: ratio 4 + indexer"] and "top-3" in details["layers: ratio 4 + indexer"]
    assert "(rope on the last 16)" in details["attention layout"] and "window 8" in details["attention layout"]
    assert details["hyper-connections"] == "HC 4, Sinkhorn 20 iterations, eps 1e-06"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_hyperparameter_from_metadata_moves_the_logits(ds4_dir, tiny, name):
    path = os.path.join(ds4_dir, f"{name}.gguf")
    make_deepseek4(path, seed=SEED, **VARIANTS[name])
    ours = strata_logits(path)
    moved = rel_err(ours, strata_logits(tiny))
    err = rel_err(ours, hf_logits(path))
    print(f"{name} {VARIANTS[name]}: logits moved {moved:.2e}, error vs transformers {err:.2e}")
    assert moved > 10 * TOLERANCE
    assert err <= TOLERANCE
