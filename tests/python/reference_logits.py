"""Fingerprints of the logits of every test mix, saved from a release and compared by the tests.

The fused layout (experts streamed from an ExpertSource, float32 from exactly dequantized
weights) must give byte-identical logits across refactorings; `python3 reference_logits.py OUT`
(run from tests/python with the release under test importable) writes the fingerprints.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

N_PROMPT = 40


def prompt() -> list[int]:
    rng = np.random.default_rng(4321)
    return [int(x) for x in rng.integers(1, 512, size=N_PROMPT)]


# The test mixes of release 0.1, kept here (not imported from conftest) so that the fingerprints
# keep naming the same files when the suite's own models change.
SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_ffn=32, vocab=512)
KQ = dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=32, experts=8, top_k=2, expert_ffn=256, vocab=512)
MIXES = {
    "f32": (SMALL, {}),
    "f16": (SMALL, {"embed": "F16", "attn": "F16", "router": "F16", "experts": "F16", "output": "F16"}),
    "q8_0": (SMALL, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q8_0", "output": "Q8_0"}),
    "q4_k": (KQ, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q4_K", "output": "Q8_0"}),
    "q6_k": (KQ, {"embed": "Q8_0", "attn": "Q8_0", "experts": "Q6_K", "output": "Q8_0"}),
    "iq2_xs": (KQ, {"embed": "Q8_0", "attn": "Q8_0", "experts": "IQ2_XS", "output": "Q8_0"}),
}
SEED = 11

# name -> Model kwargs; "fused" streams experts (the exact float path, which a streamed load ran by default
# before moe_layout="fused" named it), "mmq" keeps them resident.
CONFIGS = {
    "fused": dict(expert_cache=64, prefill=16, source="host", moe_layout="fused"),
    "mmq": dict(expert_cache="all", prefill=16),
}


def fingerprint(logits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(logits, dtype=np.float32).tobytes()).hexdigest()


def compute(path: str, config: str) -> np.ndarray:
    import strata

    m = strata.Model(path, ctx=64, progress=False, **CONFIGS[config])
    return m.logits(prompt())


def main(out: str) -> None:
    import tempfile

    from strata.testing import make_qwen3moe

    res: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as d:
        for mix, (shape, quant) in MIXES.items():
            path = os.path.join(d, f"{mix}.gguf")
            make_qwen3moe(path, **shape, quant=quant, seed=SEED)
            for config in CONFIGS:
                res[f"{mix}/{config}"] = fingerprint(compute(path, config))
                print(mix, config, res[f"{mix}/{config}"][:16])
    with open(out, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
