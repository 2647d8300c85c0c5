"""Shared fixtures: synthetic GGUF models built once per session by strata.testing.

Every test model differs from the reader's fallbacks and from each other, so that a key read wrongly
(or not at all) moves the logits: RoPE base (fallback 1e6, struct default 1e4), RMS epsilon (fallback
1e-6; the values here are >= 5e-5, so 0, 1e-6 or 1e-5 instead change the logits by > 1e-5 relative),
head_dim != hidden / heads (the key_length fallback), kv_heads != heads, top_k 2, 4 and 8, norm weights
1 + N(0, 0.2), context_length 2048 (fallback 4096) and a chat template unlike the default ChatML.
"""

from __future__ import annotations

import os
import signal

import pytest

from strata.testing import QUANT_MIXES, make_qwen3moe

# Not ChatML (strata.chat.DEFAULT_CHAT_TEMPLATE): chat() must render the file's own template. It uses
# bos_token, so the tokenizer's BOS must reach the template too.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] | upper + ': ' + message['content'] | trim + '<|im_end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>ASSISTANT: ' }}{%- endif %}"
)

_COMMON = dict(layers=2, vocab=512, ctx=2048, norm_std=0.2, chat_template=CHAT_TEMPLATE)
# Small shapes; K-quant and IQ types need 256-element rows, so those mixes use D = F = 256.
SHAPES = {
    # head_dim 24 (hidden / heads = 16), top_k 4
    "f32": dict(hidden=64, heads=4, kv_heads=2, head_dim=24, experts=8, top_k=4, expert_ffn=32,
                rope_theta=2.5e4, rms_eps=1e-4),
    # one kv head, head_dim 32 (hidden / heads = 16), top_k 2
    "f16": dict(hidden=64, heads=4, kv_heads=1, head_dim=32, experts=8, top_k=2, expert_ffn=32,
                rope_theta=5e5, rms_eps=5e-5),
    # no GQA, head_dim 48 (hidden / heads = 32), 16 experts top_k 8
    "q8_0": dict(hidden=64, heads=2, kv_heads=2, head_dim=48, experts=16, top_k=8, expert_ffn=32,
                 rope_theta=1e5, rms_eps=2e-4),
    # head_dim 32 (hidden / heads = 64), top_k 4
    "q4_k": dict(hidden=256, heads=4, kv_heads=2, head_dim=32, experts=8, top_k=4, expert_ffn=256,
                 rope_theta=2.5e4, rms_eps=5e-5),
    # 8 heads of 16 (hidden / heads = 32), 12 experts top_k 8
    "q6_k": dict(hidden=256, heads=8, kv_heads=2, head_dim=16, experts=12, top_k=8, expert_ffn=256,
                 rope_theta=5e5, rms_eps=1e-4),
    # head_dim 48 (hidden / heads = 64), top_k 2
    "iq2_xs": dict(hidden=256, heads=4, kv_heads=2, head_dim=48, experts=8, top_k=2, expert_ffn=256,
                   rope_theta=1e5, rms_eps=2e-4),
    # the real-file mixes (strata.testing.QUANT_MIXES):
    # head_dim 56 (hidden / heads = 64), top_k 4
    "ud-q4_k_xl": dict(hidden=256, heads=4, kv_heads=2, head_dim=56, experts=8, top_k=4, expert_ffn=256,
                       rope_theta=4e4, rms_eps=1.5e-4),
    # hidden 160 and expert_ffn 96: rows of 32-element blocks only (gpt-oss's 2880 = 90 x 32), top_k 4
    "gpt-oss": dict(hidden=160, heads=4, kv_heads=2, head_dim=40, experts=8, top_k=4, expert_ffn=96,
                    rope_theta=1.5e5, rms_eps=6e-5),
    # 8 heads of 32 (attention Q5_K needs H * head_dim = 256), 10 experts top_k 6
    "q3_k_m": dict(hidden=256, heads=8, kv_heads=4, head_dim=32, experts=10, top_k=6, expert_ffn=256,
                   rope_theta=7e4, rms_eps=8e-5),
    # one kv head, head_dim 40 (IQ4_NL attention output rows of 160), top_k 3
    "iq4_xs": dict(hidden=256, heads=4, kv_heads=1, head_dim=40, experts=8, top_k=3, expert_ffn=256,
                   rope_theta=2e5, rms_eps=2.5e-4),
    # 4 heads of 64, top_k 5
    "q2_k": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=5, expert_ffn=256,
                 rope_theta=3e4, rms_eps=7e-5),
    # 2 heads of 128, one kv head, 16 experts top_k 6
    "ud-iq1_s": dict(hidden=256, heads=2, kv_heads=1, head_dim=128, experts=16, top_k=6, expert_ffn=256,
                     rope_theta=6e4, rms_eps=1.2e-4),
    # 16 heads of 16, 6 experts top_k 2
    "ud-iq3_xxs": dict(hidden=256, heads=16, kv_heads=4, head_dim=16, experts=6, top_k=2, expert_ffn=256,
                       rope_theta=9e4, rms_eps=3e-4),
    # hidden 224, head_dim 56, 6 experts top_k 3: 32-element rows
    "legacy": dict(hidden=224, heads=4, kv_heads=1, head_dim=56, experts=6, top_k=3, expert_ffn=64,
                   rope_theta=3e5, rms_eps=1e-4),
}
_DENSE_Q8 = {"embed": "Q8_0", "attn": "Q8_0", "output": "Q8_0"}
MIXES = {
    "f32": ({**_COMMON, **SHAPES["f32"]}, {}),
    "f16": ({**_COMMON, **SHAPES["f16"]},
            {"embed": "F16", "attn": "F16", "router": "F16", "experts": "F16", "output": "F16"}),
    "q8_0": ({**_COMMON, **SHAPES["q8_0"]}, {**_DENSE_Q8, "experts": "Q8_0"}),
    "q4_k": ({**_COMMON, **SHAPES["q4_k"]}, {**_DENSE_Q8, "experts": "Q4_K"}),
    "q6_k": ({**_COMMON, **SHAPES["q6_k"]}, {**_DENSE_Q8, "experts": "Q6_K"}),
    "iq2_xs": ({**_COMMON, **SHAPES["iq2_xs"]}, {**_DENSE_Q8, "experts": "IQ2_XS"}),
    "ud-q4_k_xl": ({**_COMMON, **SHAPES["ud-q4_k_xl"]}, QUANT_MIXES["UD-Q4_K_XL"]),
    "gpt-oss": ({**_COMMON, **SHAPES["gpt-oss"]}, QUANT_MIXES["gpt-oss"]),
    "q3_k_m": ({**_COMMON, **SHAPES["q3_k_m"]}, QUANT_MIXES["Q3_K_M"]),
    "iq4_xs": ({**_COMMON, **SHAPES["iq4_xs"]}, QUANT_MIXES["IQ4_XS"]),
    "legacy": ({**_COMMON, **SHAPES["legacy"]}, QUANT_MIXES["legacy"]),
    "q2_k": ({**_COMMON, **SHAPES["q2_k"]}, QUANT_MIXES["Q2_K"]),
    "ud-iq1_s": ({**_COMMON, **SHAPES["ud-iq1_s"]}, QUANT_MIXES["UD-IQ1_S"]),
    "ud-iq3_xxs": ({**_COMMON, **SHAPES["ud-iq3_xxs"]}, QUANT_MIXES["UD-IQ3_XXS"]),
}
SEED = 11

# A shell that starts a command in the background (`cmd &`, nohup, scripts/mutants run that way) starts
# it with SIGINT ignored, and every process it spawns inherits that: Python then installs no
# KeyboardInterrupt handler, and the tests that press Ctrl-C (test_interrupt, test_chat_repl) would
# fail for want of a terminal's default. Restored here, so children start with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def make_mix(model_dir):
    cache: dict[str, str] = {}

    def make(mix: str) -> str:
        if mix not in cache:
            shape, quant = MIXES[mix]
            path = os.path.join(model_dir, f"{mix}.gguf")
            make_qwen3moe(path, **shape, quant=quant, seed=SEED)
            cache[mix] = path
        return cache[mix]

    return make
