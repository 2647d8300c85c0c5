"""atheris target: one input through the whole Python load path (load_path.run: inspect, Model,
logits, tokenizer, generate, chat), with structure-aware mutation (gguf_mutate). Run by scripts/fuzz:

    python3 tests/fuzz/fuzz_python.py -max_total_time=60 CORPUS_DIR SEED_DIR
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["strata", "load_path"]):
    import load_path

    import strata

from gguf_mutate import mutate_bytes

_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_PATH = os.path.join(_DIR, f"strata-fuzz-{os.getpid()}.gguf")


def test_one_input(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
    load_path.run(_PATH, data)


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    # Mostly structural; a quarter of the time (and for bytes that do not parse) libFuzzer's own.
    if seed % 4:
        out = mutate_bytes(data, seed, max_size)
        if out is not None:
            return out
    return atheris.Mutate(data, max_size)


def main() -> None:
    strata._core.set_log_level("error")
    # A huge allocation fails (and what escapes is reported with its input) instead of swapping.
    resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))
    try:
        atheris.Setup(sys.argv, test_one_input, custom_mutator=custom_mutator)
        atheris.Fuzz()
    finally:
        if os.path.exists(_PATH):
            os.remove(_PATH)


if __name__ == "__main__":
    main()
