"""transformers' logits for the release-0.1 test mixes (reference_logits.MIXES), saved for the GPU tests.

The GPU machine has another transformers; the reference is computed here, with the pinned one
(`python3 hf_reference.py` from tests/python writes data/hf_logits.npz), and the GPU tests check
that the file they build has the same bytes (its sha256) as the one the reference was computed on.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile

import numpy as np

import reference_logits as ref

OUT = os.path.join(os.path.dirname(__file__), "data", "hf_logits.npz")


def file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(out: str = OUT) -> None:
    import torch
    import transformers

    from strata.testing import make_qwen3moe

    arrays: dict[str, np.ndarray] = {"prompt": np.asarray(ref.prompt(), dtype=np.int32)}
    with tempfile.TemporaryDirectory() as d:
        for mix, (shape, quant) in ref.MIXES.items():
            path = os.path.join(d, f"{mix}.gguf")
            make_qwen3moe(path, **shape, quant=quant, seed=ref.SEED)
            m = transformers.AutoModelForCausalLM.from_pretrained(
                d, gguf_file=os.path.basename(path), moe_intermediate_size=shape["expert_ffn"],
                norm_topk_prob=True, dtype=torch.float32,
            ).eval()
            with torch.no_grad():
                logits = m(torch.tensor([ref.prompt()])).logits[0].float().numpy()
            arrays[f"{mix}/logits"] = logits.astype(np.float32)
            arrays[f"{mix}/sha256"] = np.frombuffer(bytes.fromhex(file_sha(path)), dtype=np.uint8)
            print(mix, logits.shape)
    np.savez_compressed(out, **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:])
