"""Every input the fuzzers ever failed on (tests/fuzz/regressions/) takes the whole Python load path
(inspect, Model, logits, tokenizer, generate, chat) and ends in a strata.Error or a working model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))

import load_path  # noqa: E402  (tests/fuzz/load_path.py, shared with the atheris target)

INPUTS = sorted(p for p in (FUZZ / "regressions").iterdir() if p.is_file() and p.suffix != ".md")


def test_there_are_regressions_to_replay() -> None:
    assert INPUTS, f"no inputs in {FUZZ / 'regressions'}"


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_replay(path: Path) -> None:
    load_path.run(str(path), path.read_bytes())
