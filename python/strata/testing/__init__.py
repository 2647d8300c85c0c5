"""Synthetic GGUF models for tests and benchmarks: random weights, a real tokenizer, llama.cpp layout."""

from strata.testing.models import PRESETS, make_preset, make_qwen3moe

__all__ = ["PRESETS", "make_preset", "make_qwen3moe"]
