"""A small real byte-level BPE vocabulary (Qwen2 pre-tokenization, ChatML specials) for synthetic GGUF models."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# llama.cpp token types
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

SPECIALS = (
    ("<|endoftext|>", CONTROL),
    ("<|im_start|>", CONTROL),
    ("<|im_end|>", CONTROL),
    ("<think>", USER_DEFINED),
    ("</think>", USER_DEFINED),
)
BOS, EOS, PAD = "<|endoftext|>", "<|im_end|>", "<|endoftext|>"

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog. A mixture of experts routes every token to a few
of its many feed-forward networks; the router picks the top k experts and mixes their outputs.
Large language models read text as tokens, predict the next one, and repeat. When the weights do
not fit in the memory of the graphics card, the experts that are used most often stay there and
the others are streamed in from the host when a token needs them. It's simple, isn't it? We'll see.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 65536 3.14159 2.71828 -17 +23 1e-6 0x7f.
Dates and times: 2024-05-17 12:34:56, 1999-12-31T23:59:59Z. Prices: $19.99, 5 EUR, 100%.

def softmax(x: list[float]) -> list[float]:
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]

for (int i = 0; i < n; ++i) {
    y[i] = x[i] * w[i] / sqrtf(sum / n + eps);
}

class ExpertCache:
    \"\"\"Slots on the device, an index, and an eviction policy.\"\"\"
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.index = {}

{"role": "user", "content": "Hello, who are you?"}
<html><body><p>Hello &amp; welcome!</p></body></html>

Français : le cœur de l'été, où les élèves déjà très fatigués mangent des crêpes à Noël.
Deutsch: Die Straße über den Fluß führt zur Bäckerei; Grüße aus München und Köln!
Español: ¿Dónde está la estación? El niño comió piña y jamón en el año pasado. ¡Olé!
Português: Não há ação sem coração; a informação está disponível em São Paulo.
Русский: Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир!
Ελληνικά: Γειά σου κόσμε, η γρήγορη καφέ αλεπού.
中文：敏捷的棕色狐狸跳过了懒狗。专家混合模型把每个词元路由到少数几个专家。你好，世界！
日本語：素早い茶色の狐がのろまな犬を飛び越える。こんにちは、世界。カタカナとひらがな。
한국어: 빠른 갈색 여우가 게으른 개를 뛰어넘습니다. 안녕하세요, 세계!
العربية: مرحبا بالعالم. हिन्दी: नमस्ते दुनिया।
Emoji: 🙂 😀 🚀 🔥 ❤️ 👍🏽 🧪 🤖 🌍 — “quotes”, ‘single’, … ellipsis, « guillemets », ½ ¼ ∑ ∫ √ π ∞ ≤ ≥ ≠.
Tabs\tand  double  spaces,   triple spaces
and new lines\r\nwith carriage returns.
"""


@dataclass(frozen=True)
class Vocab:
    """What a GGUF's tokenizer.ggml.* keys hold: tokens in id order, their types, merges, special ids."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int
    eos_id: int
    pad_id: int


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=False)}


@lru_cache(maxsize=8)
def vocab(size: int) -> Vocab:
    """A vocabulary of exactly `size` tokens: the 256 bytes, merges learned from CORPUS, SPECIALS,
    then "[PAD{i}]" (UNUSED) if the corpus runs out of merges. Deterministic."""
    n_merges = size - 256 - len(SPECIALS)
    if n_merges < 0:
        raise ValueError(f"vocab size {size} is too small: the byte alphabet and specials need {256 + len(SPECIALS)}")
    byte_tokens = list(bytes_to_unicode().values())
    merges = _train_merges(n_merges)
    tokens = byte_tokens + ["".join(m.split(" ")) for m in merges] + [t for t, _ in SPECIALS]
    types = [NORMAL] * (256 + len(merges)) + [ty for _, ty in SPECIALS]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), size)]
    types += [UNUSED] * (size - len(types))
    ids = {t: i for i, t in enumerate(tokens)}
    if len(ids) != size:
        raise AssertionError("duplicate tokens in the synthetic vocabulary")
    return Vocab(tuple(tokens), tuple(types), tuple(merges), ids[BOS], ids[EOS], ids[PAD])


def add_to_gguf(w: Any, voc: Vocab, pre: str, chat_template: str | None = None) -> None:
    """Writes `voc` into the GGUFWriter `w` as llama.cpp's BPE ('gpt2') tokenizer metadata: the
    pre-tokenizer name `pre` (its split rule), tokens, types, merges, BOS/EOS/PAD, no BOS added, and
    `chat_template` (default: CHAT_TEMPLATE)."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(list(voc.tokens))
    w.add_token_types(list(voc.token_types))
    w.add_token_merges(list(voc.merges))
    w.add_bos_token_id(voc.bos_id)
    w.add_eos_token_id(voc.eos_id)
    w.add_pad_token_id(voc.pad_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE if chat_template is None else chat_template)


@lru_cache(maxsize=8)
def _train_merges(limit: int) -> tuple[str, ...]:
    """Up to `limit` BPE merges ("a b", byte-level spelling) learned from CORPUS, best first."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=256 + limit,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return tuple(m if isinstance(m, str) else " ".join(m) for m in merges[:limit])


# ---- gemma4's vocabulary: SentencePiece-style BPE (spaces as "▁", raw UTF-8, <0xXX> byte fallback) ----

UNKNOWN, BYTE = 2, 6  # llama.cpp token types

GEMMA4_SPECIALS = (
    ("<pad>", CONTROL),
    ("<eos>", CONTROL),
    ("<bos>", CONTROL),
    ("<unk>", UNKNOWN),
    ("<mask>", CONTROL),
    ("<|turn>", CONTROL),
    ("<turn|>", CONTROL),
)
GEMMA4_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|turn>' + message['role'] + '\\n' + message['content'] + '<turn|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|turn>model\\n' }}{%- endif %}"
)


@lru_cache(maxsize=8)
def spm_vocab(size: int) -> Vocab:
    """A gemma4-style vocabulary of exactly `size` tokens: GEMMA4_SPECIALS (ids 0..6: pad, eos, bos, unk,
    ...), the 256 byte-fallback tokens <0x00>..<0xFF>, the characters and merges learned from CORPUS
    with spaces written "▁" (no merge crosses a newline), then "[PAD{i}]" (UNUSED). Deterministic."""
    head = len(GEMMA4_SPECIALS) + 256
    if size <= head:
        raise ValueError(f"vocab size {size} is too small: the specials and byte tokens need {head + 1}")
    pieces, merges = _train_spm(size - head)
    if not merges:
        raise ValueError(f"vocab size {size} is too small: the corpus's characters leave no room for a merge")
    tokens = [t for t, _ in GEMMA4_SPECIALS] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    types = [ty for _, ty in GEMMA4_SPECIALS] + [BYTE] * 256 + [NORMAL] * len(pieces)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), size)]
    types += [UNUSED] * (size - len(types))
    if len(set(tokens)) != size:
        raise AssertionError("duplicate tokens in the synthetic vocabulary")
    return Vocab(tuple(tokens), tuple(types), tuple(merges), 2, 1, 0)


def add_spm_to_gguf(w: Any, voc: Vocab, chat_template: str | None = None) -> None:
    """Writes `voc` (spm_vocab) as llama.cpp's gemma4 tokenizer metadata: model and pre 'gemma4', tokens,
    types, merges, BOS/EOS/PAD/UNK, BOS added, and `chat_template` (default GEMMA4_CHAT_TEMPLATE)."""
    w.add_tokenizer_model("gemma4")
    w.add_tokenizer_pre("gemma4")
    w.add_token_list(list(voc.tokens))
    w.add_token_types(list(voc.token_types))
    w.add_token_merges(list(voc.merges))
    w.add_bos_token_id(voc.bos_id)
    w.add_eos_token_id(voc.eos_id)
    w.add_pad_token_id(voc.pad_id)
    w.add_unk_token_id(voc.tokens.index("<unk>"))
    w.add_add_bos_token(True)
    w.add_chat_template(GEMMA4_CHAT_TEMPLATE if chat_template is None else chat_template)


def gemma_reference(voc: Vocab) -> Any:
    """transformers' GemmaTokenizer (the tokenizer gemma4 checkpoints name) over `voc`: the reference
    strata's gemma4 tokenizer is checked against."""
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    vocab = {t: i for i, t in enumerate(voc.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in voc.merges]
    tok = GemmaTokenizer(vocab=vocab, merges=merges)
    tok.add_special_tokens({"additional_special_tokens": [t for t, ty in GEMMA4_SPECIALS if ty == CONTROL]})
    return tok


@lru_cache(maxsize=8)
def _train_spm(limit: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Up to `limit` pieces (the corpus's characters, then merged pieces in merge order) and their
    merges ("a b"), learned from CORPUS with spaces written "▁", split at newlines."""
    from tokenizers import normalizers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=limit, show_progress=False)
    tok.train_from_iterator([CORPUS], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    pieces = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])][:limit]
    kept = set(pieces)
    merges = []
    for m in model["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a + b not in kept:
            break
        merges.append(f"{a} {b}")
    return tuple(pieces), tuple(merges)
