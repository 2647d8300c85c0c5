"""Structure-aware GGUF mutation for the atheris target: the same field changes as gguf_mutator.cpp
(dims, types, offsets, counts, string lengths, metadata values and types, keys, names, alignment)."""

from __future__ import annotations

import math
import random

from strata.testing.gguf_edit import ARRAY, F32, F64, INT_TYPES, STRING, U32, U64, Gguf, Value

KEYS = [
    "general.architecture", "general.alignment", "general.name",
    "qwen3moe.block_count", "qwen3moe.context_length", "qwen3moe.embedding_length",
    "qwen3moe.expert_feed_forward_length", "qwen3moe.attention.head_count", "qwen3moe.attention.head_count_kv",
    "qwen3moe.attention.key_length", "qwen3moe.attention.value_length", "qwen3moe.rope.freq_base",
    "qwen3moe.attention.layer_norm_rms_epsilon", "qwen3moe.expert_count", "qwen3moe.expert_used_count",
    "gpt-oss.block_count", "gpt-oss.context_length", "gpt-oss.embedding_length", "gpt-oss.expert_feed_forward_length",
    "gpt-oss.attention.head_count", "gpt-oss.attention.head_count_kv", "gpt-oss.attention.key_length",
    "gpt-oss.attention.value_length", "gpt-oss.attention.sliding_window", "gpt-oss.rope.freq_base",
    "gpt-oss.rope.scaling.type", "gpt-oss.rope.scaling.factor", "gpt-oss.rope.scaling.original_context_length",
    "gpt-oss.rope.scaling.yarn_beta_fast", "gpt-oss.rope.scaling.yarn_beta_slow",
    "gpt-oss.attention.layer_norm_rms_epsilon", "gpt-oss.expert_count", "gpt-oss.expert_used_count",
    "qwen35moe.block_count", "qwen35moe.context_length", "qwen35moe.embedding_length",
    "qwen35moe.expert_feed_forward_length", "qwen35moe.expert_shared_feed_forward_length",
    "qwen35moe.attention.head_count", "qwen35moe.attention.head_count_kv", "qwen35moe.attention.key_length",
    "qwen35moe.attention.value_length", "qwen35moe.rope.freq_base", "qwen35moe.rope.dimension_count",
    "qwen35moe.attention.layer_norm_rms_epsilon", "qwen35moe.expert_count", "qwen35moe.expert_used_count",
    "qwen35moe.ssm.conv_kernel", "qwen35moe.ssm.state_size", "qwen35moe.ssm.group_count",
    "qwen35moe.ssm.time_step_rank", "qwen35moe.ssm.inner_size", "qwen35moe.full_attention_interval",
    "qwen35moe.attention.recurrent_layers", "qwen35moe.nextn_predict_layers",
    "gemma4.block_count", "gemma4.context_length", "gemma4.embedding_length", "gemma4.feed_forward_length",
    "gemma4.expert_feed_forward_length", "gemma4.attention.head_count", "gemma4.attention.head_count_kv",
    "gemma4.attention.key_length", "gemma4.attention.value_length", "gemma4.attention.key_length_swa",
    "gemma4.attention.value_length_swa", "gemma4.attention.sliding_window", "gemma4.attention.sliding_window_pattern",
    "gemma4.rope.freq_base", "gemma4.rope.freq_base_swa", "gemma4.rope.dimension_count",
    "gemma4.rope.dimension_count_swa", "gemma4.final_logit_softcapping", "gemma4.attention.layer_norm_rms_epsilon",
    "gemma4.expert_count", "gemma4.expert_used_count", "gemma4.embedding_length_per_layer_input",
    "gemma4.attention.shared_kv_layers",
    "deepseek2.block_count", "deepseek2.context_length", "deepseek2.embedding_length",
    "deepseek2.feed_forward_length", "deepseek2.expert_feed_forward_length", "deepseek2.attention.head_count",
    "deepseek2.attention.head_count_kv", "deepseek2.attention.key_length", "deepseek2.attention.value_length",
    "deepseek2.attention.key_length_mla", "deepseek2.attention.value_length_mla", "deepseek2.attention.q_lora_rank",
    "deepseek2.attention.kv_lora_rank", "deepseek2.rope.dimension_count", "deepseek2.rope.freq_base",
    "deepseek2.rope.scaling.type", "deepseek2.rope.scaling.factor", "deepseek2.rope.scaling.original_context_length",
    "deepseek2.rope.scaling.yarn_log_multiplier", "deepseek2.rope.scaling.yarn_beta_fast",
    "deepseek2.rope.scaling.yarn_beta_slow", "deepseek2.attention.layer_norm_rms_epsilon",
    "deepseek2.attention.temperature_scale", "deepseek2.leading_dense_block_count", "deepseek2.expert_count",
    "deepseek2.expert_used_count", "deepseek2.expert_shared_count", "deepseek2.expert_weights_scale",
    "deepseek2.expert_weights_norm", "deepseek2.expert_gating_func", "deepseek2.expert_group_count",
    "deepseek2.expert_group_used_count",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.chat_template",
]
STRINGS = [
    b"qwen3moe", b"llama", b"gpt-oss", b"yarn", b"qwen35moe", b"qwen35", b"gemma4", b"deepseek2", b"<0x41>",
    b"gpt2", b"qwen2", b"llama-bpe", b"default", b"", b"\xff\xfe", b"a\xc3",
    b"\xed\xa0\x80", b"\xc0\xaf", b"x\n\x1b[2J", b"<|im_end|>", b"a b", b" ", b"\xc4\xa0 \xc4\xa0",
    b"{{ raise_exception('x') }}", b"{% for m in messages %}{{ m['content'] }}{% endfor %}", b"{{",
]
INTS = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 255, 256, 257, 4096, 65535, 65536, 2**31 - 1, 2**31,
        2**32 - 1, 2**32, 2**61, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -1, -(2**63)]
FLOATS = [0.0, -0.0, 1.0, -1.0, 1e-30, 1e30, 1e300, math.inf, -math.inf, math.nan, 4e-45, 3.5e38]


def interesting_int(r: random.Random, orig: int) -> int:
    k = r.randrange(6)
    return [orig + 1, orig - 1, orig * 2, orig // 2, r.getrandbits(64), r.choice(INTS)][k]


def bend(r: random.Random, s: object) -> bytes:
    k = r.randrange(6)
    if k == 0 or not s or not isinstance(s, bytes):
        return r.choice(STRINGS)
    i = r.randrange(len(s))
    if k == 1:
        return s[:i] + bytes([0x80 | r.randrange(128)]) + s[i + 1 :]
    if k == 2:
        return s[:i]
    if k == 3:
        return s[:i] + r.choice(STRINGS) + s[i:]
    if k == 4:
        return s + s
    return s[:i] + bytes([r.randrange(256)]) + s[i + 1 :]


def _encode(r: random.Random, t: int, v: object) -> object:
    """`v` as a value of type `t` (numbers converted, other values replaced)."""
    if t == STRING:
        return v if isinstance(v, bytes) else r.choice(STRINGS)
    if t in (F32, F64):
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else r.choice(FLOATS)
    if isinstance(v, float):
        return int(v) if math.isfinite(v) else r.choice(INTS)
    return v if isinstance(v, int) else r.choice(INTS)


def mutate(g: Gguf, r: random.Random) -> None:
    k = r.randrange(12)
    kv = g.metadata
    if k <= 1 and kv:  # a number
        _, v = r.choice(kv)
        t = v.elem_type if v.type == ARRAY else v.type
        if t not in INT_TYPES and t not in (F32, F64):
            return
        if v.type == ARRAY and v.value:
            i = r.randrange(len(v.value))
            v.value[i] = r.choice(FLOATS) if t in (F32, F64) else interesting_int(r, v.value[i])
        elif v.type != ARRAY:
            v.value = r.choice(FLOATS) if t in (F32, F64) else interesting_int(r, v.value)
    elif k == 2 and kv:  # a hyperparameter and every tensor dim equal to it
        _, v = r.choice(kv)
        if v.type in INT_TYPES and isinstance(v.value, int) and v.value >= 2:
            old, new = v.value, r.choice([v.value // 2, 1, 2, 3, 4, 8, 16, 17, 32, interesting_int(r, v.value)])
            v.value = new
            for t in g.tensors:
                t.ne = [new if d == old else d for d in t.ne]
    elif k == 3 and kv:  # another type
        _, v = r.choice(kv)
        nt = r.randrange(13) if r.randrange(5) else r.randrange(20)
        if v.type == ARRAY and r.randrange(2) and nt not in (ARRAY,) and nt < 13:
            v.value = [_encode(r, nt, x) for x in v.value]
            v.elem_type = nt
        elif nt == ARRAY and v.type != ARRAY:
            v.value, v.elem_type, v.type = [v.value], v.type, ARRAY
        elif v.type == ARRAY:
            v.type = nt if nt != ARRAY else U32
            v.value = _encode(r, v.type, v.value[0] if v.value else 0)
        else:
            v.value, v.type = _encode(r, nt, v.value), nt
    elif k == 4:  # a string
        strings = [(v, i) for _, v in kv for i in (range(len(v.value)) if v.type == ARRAY else [None])
                   if (v.elem_type if v.type == ARRAY else v.type) == STRING]
        if strings:
            v, i = r.choice(strings)
            if i is None:
                v.value = bend(r, v.value)
            else:
                v.value[i] = bend(r, v.value[i])
    elif k == 5:  # a key
        j = r.randrange(5)
        if j == 0 and kv:
            i = r.randrange(len(kv))
            kv[i] = (r.choice(KEYS).encode(), kv[i][1])
        elif j == 1 and kv:
            i = r.randrange(len(kv))
            kv[i] = (bend(r, kv[i][0]), kv[i][1])
        elif j == 2 and kv:
            kv.pop(r.randrange(len(kv)))
        elif j == 3 and kv:
            kv.insert(r.randrange(len(kv) + 1), r.choice(kv))
        else:
            t = r.choice([U32, U64, F32, STRING, 11])
            kv.append((r.choice(KEYS).encode(), Value(t, _encode(r, t, interesting_int(r, 1)))))
    elif k == 6:  # an array's length
        arrays = [v for _, v in kv if v.type == ARRAY]
        if arrays:
            v = r.choice(arrays)
            n = len(v.value)
            v.value = [[], v.value[: r.randrange(n + 1)], v.value[:2], v.value + v.value[:1]][r.randrange(4)]
    elif k in (7, 8) and g.tensors:  # a tensor info
        t = r.choice(g.tensors)
        j = r.randrange(7)
        if j <= 1 and t.ne:
            i = r.randrange(len(t.ne))
            t.ne[i] = interesting_int(r, t.ne[i])
        elif j == 2:
            t.ne = t.ne[:-1] if t.ne and r.randrange(2) else [*t.ne, r.choice([1, interesting_int(r, 1)])]
        elif j == 3:
            t.type = r.choice([0, 1, 8, 12, 14, 17, 30, 2, 10, 39, 4, 31, 41, 42, 1000, r.randrange(48)])
        elif j == 4:
            t.offset = r.choice([t.offset + d for d in (-1, 1, -8, 8, -32, 32, 256)] + [interesting_int(r, t.offset)])
        elif j == 5:
            t.name = r.choice(g.tensors).name if r.randrange(2) else bend(r, t.name)
        elif r.randrange(2):
            g.tensors.remove(t)
        else:
            g.tensors.append(t)
    elif k == 9:  # the header
        j = r.randrange(3)
        if j == 0:
            g.n_kv = interesting_int(r, len(kv))
        elif j == 1:
            g.n_tensors = interesting_int(r, len(g.tensors))
        else:
            g.version = r.choice([1, 2, 4, 0x03000000])
    elif k == 10:  # the alignment: declared, or only used for padding
        if r.randrange(2):
            g.set("general.alignment", U32, r.choice([1, 2, 4, 8, 16, 64, 0, 3, 2**31]))
        else:
            g.padding = r.choice([1, 2, 4, 8, 16, 64])
    elif g.data:  # the data section
        d = bytearray(g.data)
        j = r.randrange(3)
        if j == 0:
            d = d[: r.randrange(len(d))]
        else:
            at = r.randrange(len(d)) & ~3
            val = r.choice([b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x00\x00\x80\xff", b"\xff\xff\x7f\x7f"])
            for i in range(at, min(len(d) - 3, at + 64), 4):
                d[i : i + 4] = val if j == 1 else bytes(r.randrange(256) for _ in range(4))
        g.data = bytes(d)


def mutate_bytes(data: bytes, seed: int, max_size: int) -> bytes | None:
    """The bytes after one to three structural mutations, or None when they do not parse as a GGUF."""
    try:
        g = Gguf.parse(data)
    except (ValueError, OverflowError, IndexError):
        return None
    r = random.Random(seed)
    try:
        for _ in range(1 + (seed % 3 == 0) + (seed % 7 == 0)):
            mutate(g, r)
    except (TypeError, ValueError, IndexError):  # a combination the mutator did not foresee: mutate bytes instead
        return None
    if g.alignment() > 1 << 16:  # a huge declared alignment is kept, but the padding written stays small
        g.padding = 32
    try:
        out = g.serialize()
    except (ValueError, OverflowError, TypeError):
        return None
    return out[:max_size]
