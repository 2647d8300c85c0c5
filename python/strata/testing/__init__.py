"""Synthetic GGUF models for tests and benchmarks: random weights, a real tokenizer, llama.cpp layout."""

from strata.testing.deepseek4 import DEEPSEEK4_PRESETS, make_deepseek4, make_deepseek4_preset
from strata.testing.gemma4 import make_gemma4
from strata.testing.gptoss import GPT_OSS_PRESETS, make_gpt_oss, make_gpt_oss_preset
from strata.testing.models import PRESETS, QUANT_MIXES, make_preset, make_qwen3moe
from strata.testing.qwen35 import QWEN35MOE_PRESETS, make_qwen35moe, make_qwen35moe_preset

__all__ = ["DEEPSEEK4_PRESETS", "GPT_OSS_PRESETS", "PRESETS", "QUANT_MIXES", "QWEN35MOE_PRESETS", "make_deepseek4",
           "make_deepseek4_preset", "make_gemma4", "make_gpt_oss", "make_gpt_oss_preset", "make_preset",
           "make_qwen3moe", "make_qwen35moe", "make_qwen35moe_preset"]
