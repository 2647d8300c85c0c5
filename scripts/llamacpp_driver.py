"""What the check-llamacpp-* scripts share: a small driver on llama.cpp's public API (llama.h) that writes
every position's logits of a token list (f32 KV cache, no flash attention), built against a llama.cpp tree
whose libllama is built. Not part of CI (it needs that build and a C++ compiler)."""

from __future__ import annotations

import os
import subprocess

import numpy as np

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "llama.h"
// usage: driver MODEL OUT id...: every position's logits (n x V float32) into OUT.
int main(int argc, char** argv) {
  llama_backend_init();
  llama_model* m = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!m) return 2;
  std::vector<llama_token> ids;
  for (int i = 3; i < argc; ++i) ids.push_back(atoi(argv[i]));
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = cp.n_batch = cp.n_ubatch = 512;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* c = llama_init_from_model(m, cp);
  if (!c) return 3;
  const int n = (int)ids.size();
  llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    b.token[i] = ids[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
  }
  b.n_tokens = n;
  if (llama_decode(c, b)) return 4;
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
  FILE* f = fopen(argv[2], "wb");
  for (int i = 0; i < n; ++i) fwrite(llama_get_logits_ith(c, i), sizeof(float), V, f);
  fclose(f);
  llama_batch_free(b);
  llama_free(c);
  llama_model_free(m);
  return 0;
}
"""


def build_driver(root: str, build: str, out: str) -> str:
    src = os.path.join(out, "driver.cpp")
    with open(src, "w") as f:
        f.write(DRIVER)
    lib = os.path.join(root, build, "bin")
    exe = os.path.join(out, "driver")
    subprocess.run([os.environ.get("CXX", "c++"), "-O2", "-std=c++17", src, f"-I{root}/include",
                    f"-I{root}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}",
                    "-o", exe], check=True)
    return exe


def logits(exe: str, path: str, ids: list[int], out: str) -> np.ndarray:
    """llama.cpp's logits of every position of `ids` on the GGUF at `path` (n x V)."""
    subprocess.run([exe, path, out, *map(str, ids)], check=True, capture_output=True)
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
