"""Tokenizer, streaming detokenizer and chat templates, checked against transformers on GGUF files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import gguf
import numpy as np
import pytest
import transformers
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

import strata
from strata.chat import DEFAULT_CHAT_TEMPLATE, render_chat
from strata.tokenizer import StreamDecoder, bytes_to_unicode
from strata.tokenizer import Tokenizer as StrataTokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = "<think>"

CORPUS = """\
The quick brown fox jumps over the lazy dog. It's a fine day, isn't it? We'll see; they've gone, I'd say.
Tokenizers split text into pieces, then merge bytes into tokens. Numbers like 1234567890 and 3.14159 appear.
Le cœur a ses raisons que la raison ne connaît point. Ça va très bien, merci! Où est la bibliothèque?
Grüße aus München: Straße, Äpfel, Öl und Übermut. Der schnelle braune Fuchs springt über den faulen Hund.
El niño comió piña en el año pasado. ¿Dónde está la estación? ¡Qué día tan bonito!
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир! Как дела?
人工智能正在改变世界。我们今天去公园散步，天气很好。你好，世界！中文分词是一个有趣的问题。
日本語のテキストも少し入れます。こんにちは、世界。東京は大きな都市です。ひらがなとカタカナ。
한국어 문장도 있습니다. 안녕하세요, 세계!
مرحبا بالعالم. هذه جملة باللغة العربية. שלום עולם, זה משפט בעברית.
Emoji: 😀 🎉 👍🏽 ❤️ 🚀 and flags 🇫🇷 🇯🇵. Combining: e\u0301 a\u0308 n\u0303.
def main(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            print(f"{i}: {arg!r}")
    return 0

    x = {"key": [1, 2, 3], "other": None}  # comment
\tindented with a tab\n\n\nthree newlines above   trailing spaces
"""


def train_vocab() -> tuple[list[str], list[str]]:
    """A byte-level BPE of about 1000 tokens trained with the qwen2 split, specials first.

    The qwen2 split keeps digits apart, so a few digit merges are added by hand: with them, splits that
    group digits (llama3 cuts numbers into threes) give other ids than qwen2's, and a wrong split regex shows.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIALS,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines() * 3, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    digits = [("1", "2"), ("12", "3"), ("4", "5"), ("45", "6"), ("1", "4")]
    return tokens + ["".join(d) for d in digits] + [USER_DEFINED], merges + [" ".join(d) for d in digits]


def write_gguf(
    path: Path,
    tokens: list[str],
    merges: list[str],
    *,
    arch: str = "qwen2",
    pre: str = "qwen2",
    add_bos: bool = False,
    bos: str = "<|endoftext|>",
    chat_template: str | None = None,
) -> Path:
    """A GGUF with a tokenizer and the few keys and tensors transformers needs to read it."""
    types = [
        gguf.TokenType.CONTROL
        if t in SPECIALS
        else gguf.TokenType.USER_DEFINED
        if t == USER_DEFINED
        else gguf.TokenType.NORMAL
        for t in tokens
    ]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(tokens.index(bos))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(add_bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def metadata_from_gguf_reader(path: Path) -> dict:
    """The metadata dict strata's C++ reader hands to Tokenizer.from_metadata, read with gguf-py."""
    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


TEXTS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Ça va très bien, où est la bibliothèque? Grüße, Straße, naïve café",
    "人工智能正在改变世界。你好，世界！",
    "こんにちは、世界。カタカナ",
    "안녕하세요",
    "😀🎉👍🏽❤️🚀 🇫🇷 family: 👨‍👩‍👧‍👦",
    "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937",
    "مرحبا بالعالم שלום עולם",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs",
    "one\ntwo\n\nthree\n\n\nfour\r\nfive",
    "\n\n\n",
    " ",
    "1234567890 3.14159 -42 1,000,000 0x1F",
    "It's I'm we'll they've you'd DON'T She'S",
    'def f(x):\n    return {"a": [1, 2]}  # ok\n\tpass',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "a<|endoftext|>b <|im_end|>  <think>why</think>",
    "<|im_start",
    "zzqx ĠĊ ÿ \x00\x01 \ufffd",
]


@pytest.fixture(scope="module")
def vocab() -> tuple[list[str], list[str]]:
    return train_vocab()


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory: pytest.TempPathFactory, vocab: tuple[list[str], list[str]]) -> Path:
    return write_gguf(tmp_path_factory.mktemp("qwen2") / "m.gguf", *vocab)


@pytest.fixture(scope="module")
def tok(qwen_gguf: Path) -> StrataTokenizer:
    return StrataTokenizer.from_metadata(metadata_from_gguf_reader(qwen_gguf))


def load_hf(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize(
    ("arch", "pre", "add_bos"),
    [
        ("qwen2", "qwen2", False),
        ("qwen2", "qwen35", False),
        ("llama", "llama-bpe", True),
        ("qwen2", "gpt-2", False),
    ],
)
def test_ids_match_transformers(tmp_path: Path, vocab, arch: str, pre: str, add_bos: bool) -> None:
    path = write_gguf(tmp_path / "m.gguf", *vocab, arch=arch, pre=pre, add_bos=add_bos)
    ours = StrataTokenizer.from_metadata(metadata_from_gguf_reader(path))
    hf = load_hf(path)
    for text in TEXTS:
        assert ours.encode(text, add_special=False) == hf.encode(text, add_special_tokens=False), text
    assert ours.encode("hi") == ([ours.bos_id] if add_bos else []) + ours.encode("hi", add_special=False)


def test_specials_are_whole_tokens(tok: StrataTokenizer, vocab) -> None:
    tokens = vocab[0]
    ids = tok.encode("<|im_start|>user\nhi<|im_end|><think>", add_special=False)
    assert ids[0] == tokens.index("<|im_start|>")
    assert ids[-2:] == [tokens.index("<|im_end|>"), tokens.index(USER_DEFINED)]
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|><think>"
    assert tok.decode(ids, skip_special=True) == "user\nhi<think>"


def test_ids_and_properties(tok: StrataTokenizer, vocab) -> None:
    tokens = vocab[0]
    assert tok.vocab_size == len(tokens)
    assert tok.eos_id == tokens.index("<|im_end|>")
    assert tok.bos_id == tok.pad_id == tokens.index("<|endoftext|>")
    assert tok.eos_token == "<|im_end|>"
    assert tok.stop_ids == {tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")}
    assert not tok.add_bos
    space_the = tokens.index("Ġthe")
    assert tok.id_to_piece(space_the) == "Ġthe"
    assert tok.token_to_bytes(space_the) == b" the"
    assert tok.token_to_bytes(tokens.index("Ċ")) == b"\n"
    assert tok.token_to_bytes(tokens.index("<|im_end|>")) == b"<|im_end|>"
    with pytest.raises(strata.Error, match="outside the vocabulary"):
        tok.token_to_bytes(len(tokens))


@pytest.mark.parametrize("text", TEXTS)
def test_decode_roundtrip(tok: StrataTokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_deepseek_v3_splits(vocab) -> None:
    """transformers has no deepseek-v3 split; check llama.cpp's regex sequence against hand-made splits."""
    tokens, merges = vocab
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "deepseek-v3",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
    }
    pre = StrataTokenizer.from_metadata(md).backend.pre_tokenizer

    def pieces(text: str) -> list[str]:
        decode = {c: b for b, c in bytes_to_unicode().items()}
        return [bytes(decode[c] for c in p).decode() for p, _ in pre.pre_tokenize_str(text)]

    assert pieces("Hello world12345!") == ["Hello", " world", "123", "45", "!"]
    assert pieces("日本語のテキスト") == ["日本語のテキスト"]
    assert pieces("你好，世界") == ["你好", "，", "世界"]
    assert pieces("x.foo(bar)") == ["x", ".foo", "(bar", ")"]
    assert pieces("a  b\n\n c") == ["a", " ", " b", "\n\n", " c"]
    assert pieces("e\u0301t\u00e9") == ["e\u0301t\u00e9"]


LLAMACPP = Path(__file__).parent / "data" / "llamacpp"  # llama.cpp's own vectors; see its README.md


def pre_pieces(pre_tokenizer, text: str) -> list[str]:
    """The pre-tokenizer's pieces of `text`, as text (not in the byte-level spelling)."""
    decode = {c: b for b, c in bytes_to_unicode().items()}
    return [bytes(decode[c] for c in p).decode() for p, _ in pre_tokenizer.pre_tokenize_str(text)]


def splits_cases() -> list[tuple[str, str, list[str]]]:
    data = json.loads((LLAMACPP / "splits.json").read_text(encoding="utf-8"))
    return [(pre, text, want) for pre, cases in data["splits"].items() for text, want in cases]


@pytest.mark.parametrize("pre", ["default", "gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-v3", "gpt-4o"])
def test_pre_tokenizer_splits_like_llama_cpp(vocab, pre: str) -> None:
    """Every supported tokenizer.ggml.pre splits text into the pieces llama.cpp's unicode_regex_split
    gives (data/llamacpp/splits.json, computed by llama.cpp itself, not from strata's regex lists)."""
    tokens, merges = vocab
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.merges": merges, "tokenizer.ggml.add_bos_token": False}
    pt = StrataTokenizer.from_metadata(md).backend.pre_tokenizer
    cases = [(text, want) for p, text, want in splits_cases() if p == pre]
    assert len(cases) > 50
    for text, want in cases:
        assert pre_pieces(pt, text) == want, text


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2", "qwen35"])
def test_ids_match_llama_cpp_test_vectors(pre: str) -> None:
    """llama.cpp's test-tokenizer-0 vectors (ggml-vocab-<pre>.gguf.inp/.out) on a reduced vocabulary
    that tokenizes those texts exactly as the full one (data/llamacpp/README.md)."""
    v = json.loads((LLAMACPP / f"vocab-{pre}.json").read_text(encoding="utf-8"))
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": v["pre"], "tokenizer.ggml.tokens": v["tokens"],
          "tokenizer.ggml.merges": v["merges"], "tokenizer.ggml.add_bos_token": False}
    tok = StrataTokenizer.from_metadata(md)
    assert len(v["cases"]) > 40
    for text, ids in v["cases"]:
        assert tok.encode(text, add_special=False) == ids, text
        assert tok.decode(ids) == text


def test_default_pre_splits_by_hand(vocab) -> None:
    """The default pre-tokenizer (no tokenizer.ggml.pre), on splits written out by hand from llama.cpp's
    rules: punctuation runs apart first (the apostrophe too), then GPT-2's split, then digits apart from
    the rest and cut in threes from the left."""
    tokens, merges = vocab
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges}
    pt = StrataTokenizer.from_metadata(md).backend.pre_tokenizer
    assert pre_pieces(pt, "x1234567") == ["x", "123", "456", "7"]
    assert pre_pieces(pt, "Hello, world!") == ["Hello", ",", " world", "!"]
    assert pre_pieces(pt, "it's") == ["it", "'", "s"]
    assert pre_pieces(pt, "a  b") == ["a", " ", " b"]
    assert pre_pieces(pt, "$100 + 5") == ["$", "100", " ", "+", " ", "5"]


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("tokenizer.ggml.model", "llama", "tokenizer.ggml.model = 'llama'"),
        ("tokenizer.ggml.pre", "chameleon", "tokenizer.ggml.pre = 'chameleon'.*qwen2"),
    ],
)
def test_unsupported_tokenizer_names_the_key(vocab, key: str, value: str, match: str) -> None:
    tokens, merges = vocab
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        key: value,
    }

    with pytest.raises(strata.UnsupportedError, match=match):
        StrataTokenizer.from_metadata(md)


@pytest.mark.parametrize(("pre", "whole"), [("llama-bpe", True), ("qwen2", False)])
def test_llama3_takes_whole_words_from_the_vocab(vocab, pre: str, whole: bool) -> None:
    """llama.cpp sets ignore_merges for llama3: a word in the vocabulary is one token even without merges."""
    tokens, merges = vocab
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": [*tokens, "Ġzzqx"],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": False,
    }
    ids = StrataTokenizer.from_metadata(md).encode(" zzqx")
    assert (ids == [len(tokens)]) == whole


def test_missing_bos_with_add_bos_is_an_error(vocab) -> None:
    tokens, merges = vocab
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
    }
    with pytest.raises(strata.Error, match="add_bos_token.*bos_token_id is missing"):
        StrataTokenizer.from_metadata(md)


def stream(tok: StrataTokenizer, ids: list[int], skip_special: bool = False) -> list[str]:
    dec = StreamDecoder(tok, skip_special=skip_special)
    return [dec.feed(i) for i in ids] + [dec.flush()]


@pytest.mark.parametrize(
    "text",
    ["😀🎉👍🏽 家族 👨‍👩‍👧‍👦", "你好，世界！人工智能", "naïve ü ß\u0301", "<|im_start|>日本<|im_end|>"],
)
def test_stream_decoder_matches_decode(tok: StrataTokenizer, text: str) -> None:
    ids = tok.encode(text)
    chunks = stream(tok, ids)
    assert "".join(chunks) == tok.decode(ids) == text
    assert all("\ufffd" not in c for c in chunks)


def test_stream_decoder_holds_split_characters(tok: StrataTokenizer) -> None:
    ids = tok.encode("🚀")
    assert len(ids) > 1, "the emoji should be split over several byte tokens for this test to mean anything"
    assert stream(tok, ids) == [""] * (len(ids) - 1) + ["🚀", ""]


def test_stream_decoder_invalid_bytes(tok: StrataTokenizer) -> None:
    byte = {b: tok.backend.token_to_id(c) for b, c in bytes_to_unicode().items()}
    # A lone continuation byte is invalid at once; an unfinished sequence only at flush.
    assert stream(tok, [byte[0x80], byte[ord("a")], byte[0xE4], byte[0xBD]]) == [
        "\ufffd",
        "a",
        "",
        "",
        "\ufffd",
    ]
    # A lead byte followed by ASCII can no longer complete.
    assert stream(tok, [byte[0xE4], byte[ord("b")]]) == ["", "\ufffdb", ""]


def test_stream_decoder_random_ids_match_decode(tok: StrataTokenizer) -> None:
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 12))]
        assert "".join(stream(tok, ids)) == tok.decode(ids)
        assert "".join(stream(tok, ids, skip_special=True)) == tok.decode(ids, skip_special=True)


QWEN_LIKE_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
  {%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
  {%- if message.role not in ['system', 'user', 'assistant'] %}
    {{- raise_exception('unknown role: ' + message.role) }}
  {%- endif %}
  {%- if message.role == 'system' %}{% continue %}{% endif %}
  {{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|im_start|>assistant\\n' }}
  {%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""

MESSAGES = [
    {"role": "system", "content": "Be brief. «ünïcödé» & <tags>"},
    {"role": "user", "content": "Hi there  "},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is 2+2?"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"a": "int", "b": "<int>"}}}]


@pytest.mark.parametrize("template", [QWEN_LIKE_TEMPLATE, DEFAULT_CHAT_TEMPLATE])
@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS, "enable_thinking": False}])
def test_render_chat_matches_transformers(qwen_gguf: Path, template: str, extra: dict) -> None:
    hf = load_hf(qwen_gguf)
    for gen in (True, False):
        expected = hf.apply_chat_template(
            MESSAGES, chat_template=template, tokenize=False, add_generation_prompt=gen, **extra
        )
        assert render_chat(template, MESSAGES, add_generation_prompt=gen, **extra) == expected


def test_default_template_is_chatml() -> None:
    out = render_chat(DEFAULT_CHAT_TEMPLATE, [{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_from_gguf_and_special_tokens(tmp_path: Path, vocab) -> None:
    template = "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
    path = write_gguf(tmp_path / "m.gguf", *vocab, chat_template=template)
    tok = StrataTokenizer.from_metadata(metadata_from_gguf_reader(path))
    assert tok.chat_template == template
    out = render_chat(
        tok.chat_template,
        [{"role": "user", "content": "x"}],
        bos_token=tok.bos_token,
        eos_token=tok.eos_token,
    )
    assert out == "<|endoftext|>x<|im_end|>"
    assert tok.encode(out)[-1] == tok.eos_id


def test_template_errors_are_clear() -> None:
    with pytest.raises(strata.Error, match="does not compile: line 2: .*"):
        render_chat("ok\n{% for m in messages %}", MESSAGES)
    with pytest.raises(strata.Error, match="rejected the messages: unknown role: tool"):
        render_chat(QWEN_LIKE_TEMPLATE, [{"role": "tool", "content": "x"}])
    # The sandbox keeps a template from changing the caller's messages.
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(strata.Error, match="chat template"):
        render_chat("{% set _ = messages.append(1) %}", messages)
    assert messages == [{"role": "user", "content": "x"}]


def test_strftime_and_generation_block() -> None:
    out = render_chat(
        "{{ strftime_now('%Y') }}|{% generation %}{{ messages[0].content }}{% endgeneration %}",
        [{"role": "assistant", "content": "ok"}],
    )
    year, body = out.split("|")
    assert year.isdigit() and len(year) == 4 and body == "ok"


@pytest.mark.parametrize("specials,stops", [
    (["<|return|>", "<|call|>", "<|end|>"], ["<|return|>", "<|call|>"]),  # o200k_harmony: <|end|> ends a message
    (["<|return|>", "<|end|>"], ["<|return|>", "<|end|>"]),  # without <|call|> it is no harmony vocabulary
])
def test_harmony_stop_tokens_as_llama_cpp(vocab, specials: list[str], stops: list[str]) -> None:
    """gpt-oss's turn ends: <|return|> and <|call|> stop generation; <|end|> does too, except in a
    vocabulary that has all three (llama.cpp's o200k_harmony rule)."""
    tokens, merges = vocab
    toks = list(tokens) + specials
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o", "tokenizer.ggml.tokens": toks,
          "tokenizer.ggml.token_type": [1] * len(tokens) + [3] * len(specials), "tokenizer.ggml.merges": merges}
    tok = StrataTokenizer.from_metadata(md)
    base = {toks.index(t) for t in ("<|im_end|>", "<|endoftext|>") if t in toks}
    assert tok.stop_ids == base | {toks.index(t) for t in stops}
