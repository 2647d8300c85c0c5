"""The same measurement as e2e_cpu.py, run by llama.cpp (through llama-cpp-python) on the same GGUF:
prompt tok/s for a prompt of random ordinary token ids and greedy decode tok/s, on the CPU.

    python3 bench/llamacpp_cpu.py --model bench/out/models/qwen3-30b-a3b-L48-s0.gguf --threads 2

Needs `pip install llama-cpp-python` (not a strata dependency). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=512, help="llama.cpp n_batch/n_ubatch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="bench/out/llamacpp_cpu.json")
    a = ap.parse_args()
    import llama_cpp
    from llama_cpp import Llama

    t0 = time.perf_counter()
    ll = Llama(model_path=a.model, n_ctx=a.prompt_tokens + a.gen_tokens + 8, n_batch=a.batch, n_ubatch=a.batch,
               n_threads=a.threads, n_threads_batch=a.threads, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0
    # Random ordinary tokens below the first control token, as e2e_cpu.py draws them (below the first
    # of strata's special_ids, the CONTROL tokens). llama_token_attr is a bit set: bit 0 is UNKNOWN,
    # CONTROL is LLAMA_TOKEN_ATTR_CONTROL (bit 3).
    # (The Llama object has no token_get_attr; its model, LlamaModel, has.)
    n_vocab = ll.n_vocab()
    control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    first_special = min((i for i in range(n_vocab) if ll._model.token_get_attr(i) & control), default=n_vocab)
    rng = np.random.default_rng(a.seed)
    ids = [int(x) for x in rng.integers(0, min(first_special, n_vocab), size=a.prompt_tokens)]
    ll.reset()
    ll.eval(ids[:8])  # warm-up: pages the weights in
    ll.reset()
    t0 = time.perf_counter()
    ll.eval(ids)
    prompt_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(a.gen_tokens):
        # The last position's logits straight from the context (scores holds n_batch rows only).
        last = llama_cpp.llama_get_logits_ith(ll._ctx.ctx, -1)
        tok = int(np.argmax(np.ctypeslib.as_array(last, shape=(n_vocab,))))
        ll.eval([tok])
    decode_s = time.perf_counter() - t0
    res = {"model": a.model, "threads": a.threads, "llama_cpp_python": llama_cpp.__version__, "load_s": load_s,
           "prompt_tokens": a.prompt_tokens, "prompt_tps": a.prompt_tokens / prompt_s,
           "gen_tokens": a.gen_tokens, "decode_tps": a.gen_tokens / decode_s}
    print(f"llama.cpp {llama_cpp.__version__}, {a.threads} threads, {os.path.basename(a.model)}")
    print(f"  load    {load_s:.2f} s")
    print(f"  prompt  {res['prompt_tps']:.1f} tok/s ({a.prompt_tokens} tokens)")
    print(f"  decode  {res['decode_tps']:.2f} tok/s ({a.gen_tokens} tokens)")
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
