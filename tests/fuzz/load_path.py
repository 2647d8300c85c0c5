"""The Python load path one fuzz input takes, shared by the atheris target and the regression replay.

A file strata cannot use must end in a strata.Error (FormatError, UnsupportedError, MemoryError,
ConfigError); a file it can use loads, tokenizes, computes logits and generates. Anything else that
escapes (a foreign exception, a crash) is a bug.
"""

from __future__ import annotations

import zlib

import strata


def run(path: str, data: bytes) -> None:
    """Inspect, load (the cache kind picked by a hash of the bytes), logits, tokenizer, generate, chat."""
    h = zlib.crc32(data)
    try:
        strata.inspect(path)
        cache = ("all", "1MiB", "64KiB")[h % 3]
        m = strata.Model(path, ctx=64, threads=1, expert_cache=cache, prefill=1 + (h >> 4) % 8, progress=False)
        m.logits([1, 2, 3])
        ids = m.tokenize("Hello world, <|im_end|> \u00e9\u4e16 1234")
        m.detokenize(ids)
        m.generate("Hi", max_tokens=2, temperature=0)
        m.chat([{"role": "user", "content": "hi"}], max_tokens=1, temperature=0)
    except strata.Error:
        pass
