"""Byte-level BPE tokenizer (and gemma4's SentencePiece-style BPE) built from GGUF metadata, splitting text the
way llama.cpp does."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_BYTE = 6
_SPACE = "\u2581"  # SentencePiece's space

# Split regexes per tokenizer.ggml.pre, from llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp), written
# in the original tokenizer.json form (`(?i:...)`), which llama.cpp only rewrites because std::regex lacks it.
# Each list is applied in order, every regex splitting the pieces the previous one left.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    (
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
# o200k (gpt-oss), as llama.cpp splits it: its lookahead rewrite of tokenizer.json's case-splitting regex
# (runs of letters other than a-z, then of letters other than A-Z), which it runs for "gpt-4o".
_O200K_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _O200K_CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _O200K_CONTRACTIONS
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "default": _DEFAULT,
    "gpt-2": (_GPT2,),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "llama-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "deepseek-v3": _DEEPSEEK_V3,
    "gpt-4o": (_GPT4O,),
}
# llama.cpp turns on ignore_merges and a default BOS for the llama3 family only.
_LLAMA3_FAMILY = frozenset({"llama3", "llama-v3", "llama-bpe"})

# Tokens that end a turn besides EOS, by text, as llama.cpp's end-of-generation list has them.
_STOP_TEXTS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<turn|>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)


def _core_error(name: str, message: str) -> Exception:
    """strata's exception `name` from the compiled extension, or ValueError where it is not built."""
    try:
        import strata._core as core
    except ImportError:
        return ValueError(message)
    return getattr(core, name)(message)


def _unsupported(message: str) -> Exception:
    return _core_error("UnsupportedError", message)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Tokenizer:
    """Encode and decode text for one GGUF model; build it with `Tokenizer.from_metadata`."""

    def __init__(
        self,
        backend: _HFTokenizer,
        tokens: list[str],
        token_bytes: list[bytes],
        special_ids: frozenset[int],
        *,
        bos_id: int | None,
        eos_id: int | None,
        pad_id: int | None,
        add_bos: bool,
        add_eos: bool,
        stop_ids: frozenset[int],
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self._tokens = tokens
        self._bytes = token_bytes
        self.special_ids = special_ids
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.stop_ids = stop_ids
        self.chat_template = chat_template

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (key -> Python value), as llama.cpp reads the tokenizer.* keys.

        The metadata comes from a file someone else wrote: every key's type and range is checked, and
        any failure of the tokenizers library (a Rust panic included) becomes a FormatError.
        """
        model = md.get("tokenizer.ggml.model")
        if model not in ("gpt2", "gemma4"):
            raise _unsupported(
                f"tokenizer.ggml.model = {_show(model)} is not supported; strata reads byte-level BPE "
                f"vocabularies (tokenizer.ggml.model = 'gpt2') and gemma4's SentencePiece-style BPE ('gemma4')"
            )
        spm = model == "gemma4"
        # llama.cpp takes gemma4's pre-tokenizer whatever tokenizer.ggml.pre says.
        pre = "gemma4" if spm else md.get("tokenizer.ggml.pre", "default")
        if not spm and (not isinstance(pre, str) or pre not in PRE_TOKENIZER_SPLITS):
            raise _unsupported(
                f"tokenizer.ggml.pre = {_show(pre)} is not supported; supported: {', '.join(PRE_TOKENIZER_SPLITS)}"
            )
        tokens = _strings(md, "tokenizer.ggml.tokens")
        if not tokens:
            raise _format_error("tokenizer.ggml.tokens is empty")
        merges = _strings(md, "tokenizer.ggml.merges")
        types = [TOKEN_NORMAL] * len(tokens)
        if "tokenizer.ggml.token_type" in md:
            types = _ints(md, "tokenizer.ggml.token_type", 0, _TOKEN_TYPE_MAX)
        if len(types) != len(tokens):
            raise _format_error(
                f"tokenizer.ggml.token_type has {len(types)} entries but tokenizer.ggml.tokens has {len(tokens)}"
            )
        bos_id = _token_id(md, "tokenizer.ggml.bos_token_id", len(tokens))
        eos_id = _token_id(md, "tokenizer.ggml.eos_token_id", len(tokens))
        pad_id = _token_id(md, "tokenizer.ggml.padding_token_id", len(tokens))
        add_bos = _flag(md, "tokenizer.ggml.add_bos_token", pre in _LLAMA3_FAMILY)
        add_bos |= spm  # llama.cpp adds BOS for gemma4 even where the file says not to
        add_eos = _flag(md, "tokenizer.ggml.add_eos_token", False)
        for flag, key, tid in ((add_bos, "bos", bos_id), (add_eos, "eos", eos_id)):
            if flag and tid is None:
                raise _format_error(
                    f"tokenizer.ggml.add_{key}_token is true but tokenizer.ggml.{key}_token_id is missing"
                )
        stop = {eos_id} if eos_id is not None else set()
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            tid = _token_id(md, key, len(tokens))
            if tid is not None:
                stop.add(tid)
        chat_template = md.get("tokenizer.chat_template")
        if chat_template is not None and not (isinstance(chat_template, str) and _is_utf8(chat_template)):
            raise _format_error(f"tokenizer.chat_template must be UTF-8 text, got {_show(chat_template)}")

        if spm:
            backend, token_bytes, control = _spm_backend(md, tokens, types, merges)
            return cls._finish(backend, tokens, token_bytes, control, bos_id, eos_id, pad_id, add_bos, add_eos, stop,
                               chat_template)
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        decode_byte = {c: b for b, c in spelling.items()}
        added = {TOKEN_CONTROL, TOKEN_USER_DEFINED}
        vocab: dict[str, int] = {}
        token_bytes: list[bytes] = []
        for i, (tok, kind) in enumerate(zip(tokens, types, strict=True)):
            # The reader hands bytes that are not UTF-8 over as lone surrogates (surrogateescape).
            raw = tok.encode("utf-8", "surrogateescape")
            if kind in added:
                if not _is_utf8(tok):
                    raise _format_error(f"tokenizer.ggml.tokens[{i}] = {_show(tok)} is a special token, not UTF-8")
                # Added tokens keep their text so they map back to this id when matched in the text.
                vocab[tok] = i
            elif set(tok) <= alphabet:
                raw = bytes(decode_byte[c] for c in tok)
                vocab[tok] = i
            else:
                # A normal token outside the byte alphabet is respelled from its bytes, as transformers does.
                vocab["".join(spelling[b] for b in raw)] = i
            token_bytes.append(raw)

        pairs = []
        for j, m in enumerate(merges):
            cut = m.find(" ", 1)  # llama.cpp splits at the first space after the first character
            if cut < 0:
                raise _format_error(f"tokenizer.ggml.merges[{j}] = {_show(m)} has no space")
            if not _is_utf8(m):
                raise _format_error(f"tokenizer.ggml.merges[{j}] = {_show(m)} is not UTF-8")
            pairs.append((m[:cut], m[cut + 1 :]))
        control = [i for i, k in enumerate(types) if k == TOKEN_CONTROL and tokens[i]]
        user = [i for i, k in enumerate(types) if k == TOKEN_USER_DEFINED and tokens[i]]
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, byte_fallback=False, ignore_merges=pre in _LLAMA3_FAMILY)
            backend = _HFTokenizer(bpe)
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZER_SPLITS[pre]]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            backend.decoder = decoders.ByteLevel()
            backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in control])
            backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
        except BaseException as e:
            if isinstance(e, _NEVER_CAUGHT):
                raise
            # PanicException, tokenizers' Rust panics, derives from BaseException.
            raise _format_error(
                f"the tokenizer.ggml.* vocabulary and merges do not form a BPE tokenizer: {type(e).__name__}: {e}"
            ) from e

        return cls._finish(backend, tokens, token_bytes, control, bos_id, eos_id, pad_id, add_bos, add_eos, stop,
                           chat_template)

    @classmethod
    def _finish(cls, backend: _HFTokenizer, tokens: list[str], token_bytes: list[bytes], control: list[int],
                bos_id: int | None, eos_id: int | None, pad_id: int | None, add_bos: bool, add_eos: bool,
                stop: set[int], chat_template: str | None) -> Tokenizer:
        by_text = {t: i for i, t in enumerate(tokens) if t in _STOP_TEXTS}
        stop.update(by_text.values())
        # o200k_harmony (gpt-oss): <|end|> closes a message inside a turn, which <|return|> or <|call|>
        # ends; llama.cpp drops <|end|> from its end-of-generation list when all three are present.
        if {"<|return|>", "<|call|>", "<|end|>"} <= by_text.keys():
            stop.discard(by_text["<|end|>"])
        return cls(
            backend,
            tokens,
            token_bytes,
            frozenset(control),
            bos_id=bos_id,
            eos_id=eos_id,
            pad_id=pad_id,
            add_bos=add_bos,
            add_eos=add_eos,
            stop_ids=frozenset(stop),
            chat_template=chat_template,
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def bos_token(self) -> str:
        """BOS as text, for chat templates; empty when the model has none."""
        return self._tokens[self.bos_id] if self.bos_id is not None else ""

    @property
    def eos_token(self) -> str:
        return self._tokens[self.eos_id] if self.eos_id is not None else ""

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text are matched whole (llama.cpp's
        parse_special). With `add_special`, BOS/EOS are added as the GGUF's add_bos/add_eos flags say."""
        if not isinstance(text, str):
            raise _core_error("ConfigError", f"encode takes a str, got {type(text).__name__}")
        try:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        except BaseException as e:
            if isinstance(e, _NEVER_CAUGHT):
                raise
            # The vocabulary came from the file; a tokenizer that fails on text is a bad file.
            raise _format_error(f"the tokenizer from this file fails on the text: {type(e).__name__}: {e}") from e
        if add_special and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD. `skip_special` drops control tokens."""
        return b"".join(self._piece_bytes(ids, skip_special)).decode("utf-8", errors="replace")

    def token_to_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a control or user-defined token: its UTF-8 text)."""
        return self._bytes[self._check(token_id)]

    def id_to_piece(self, token_id: int) -> str:
        """The token as the GGUF vocabulary spells it (byte-level characters, e.g. 'Ġthe')."""
        return self._tokens[self._check(token_id)]

    def _piece_bytes(self, ids: Iterable[int], skip_special: bool) -> Iterable[bytes]:
        for i in ids:
            if not (skip_special and i in self.special_ids):
                yield self._bytes[self._check(i)]

    def _check(self, token_id: int) -> int:
        if not 0 <= token_id < len(self._tokens):
            raise _core_error(
                "ConfigError", f"token id {token_id} is outside the vocabulary (0..{len(self._tokens) - 1})"
            )
        return token_id


def _spm_backend(
    md: Mapping[str, Any], tokens: list[str], types: list[int], merges: list[str]
) -> tuple[_HFTokenizer, list[bytes], list[int]]:
    """gemma4's tokenizer as transformers' GemmaTokenizer builds it: BPE over raw UTF-8 with "<0xXX>" byte
    fallback, spaces normalized to "▁" and no pre-splitting; the bytes of every token and the control ids.
    (llama.cpp also cuts the text at newlines first; the two agree wherever no merge joins a newline to
    another character.)"""
    vocab: dict[str, int] = {}
    token_bytes: list[bytes] = []
    for i, (tok, kind) in enumerate(zip(tokens, types, strict=True)):
        if not _is_utf8(tok):
            raise _format_error(f"tokenizer.ggml.tokens[{i}] = {_show(tok)} is not UTF-8")
        if kind == TOKEN_BYTE:
            if len(tok) != 6 or not tok.startswith("<0x") or tok[-1] != ">" or not _is_hex(tok[3:5]):
                raise _format_error(f"tokenizer.ggml.tokens[{i}] = {_show(tok)} is a byte token but not <0xXX>")
            raw = bytes([int(tok[3:5], 16)])
        elif kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            raw = tok.encode("utf-8")
        else:
            raw = tok.replace(_SPACE, " ").encode("utf-8")
        vocab.setdefault(tok, i)
        token_bytes.append(raw)
    pairs = []
    for j, m in enumerate(merges):
        cut = m.find(" ", 1)
        if cut < 0:
            raise _format_error(f"tokenizer.ggml.merges[{j}] = {_show(m)} has no space")
        if not _is_utf8(m):
            raise _format_error(f"tokenizer.ggml.merges[{j}] = {_show(m)} is not UTF-8")
        pairs.append((m[:cut], m[cut + 1 :]))
    unk_id = _token_id(md, "tokenizer.ggml.unknown_token_id", len(tokens))
    control = [i for i, k in enumerate(types) if k == TOKEN_CONTROL and tokens[i]]
    user = [i for i, k in enumerate(types) if k == TOKEN_USER_DEFINED and tokens[i]]
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, byte_fallback=True, fuse_unk=True,
                         unk_token=tokens[unk_id] if unk_id is not None else None)
        backend = _HFTokenizer(bpe)
        backend.normalizer = normalizers.Replace(" ", _SPACE)
        backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in control])
        backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
    except BaseException as e:
        if isinstance(e, _NEVER_CAUGHT):
            raise
        raise _format_error(
            f"the tokenizer.ggml.* vocabulary and merges do not form a BPE tokenizer: {type(e).__name__}: {e}"
        ) from e
    return backend, token_bytes, control


def _is_hex(s: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in s)


class StreamDecoder:
    """Turns token ids fed one at a time into text, holding back a UTF-8 sequence split across tokens.

    The concatenation of every `feed` result and `flush()` equals `Tokenizer.decode` of all the ids.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Text completed by this token (maybe empty, while a multibyte character is still open)."""
        if self._skip_special and token_id in self._tokenizer.special_ids:
            return ""
        return self._utf8.decode(self._tokenizer.token_to_bytes(token_id))

    def flush(self) -> str:
        """Whatever is held back, an unfinished sequence as U+FFFD; the decoder can then be reused."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


# Exceptions that mean "stop", never "this file is bad".
_NEVER_CAUGHT = (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)
_TOKEN_TYPE_MAX = 6  # llama.cpp's llama_token_type: UNDEFINED 0 .. BYTE 6


def _format_error(message: str) -> Exception:
    return _core_error("FormatError", message)


def _show(value: Any) -> str:
    """A value from the file for a message: its repr (escapes every odd byte), cut short, with its type."""
    r = repr(value)
    r = r if len(r) <= 60 else r[:57] + "..."
    return r if isinstance(value, str) else f"{r} ({type(value).__name__})"


def _is_utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _required(md: Mapping[str, Any], key: str) -> Any:
    if key not in md:
        raise _format_error(f"GGUF metadata has no {key}, which a BPE tokenizer needs")
    return md[key]


def _strings(md: Mapping[str, Any], key: str) -> list[str]:
    v = _required(md, key)
    if not isinstance(v, list):
        raise _format_error(f"{key} must be an array of strings, got {_show(v)}")
    for i, x in enumerate(v):
        if not isinstance(x, str):
            raise _format_error(f"{key}[{i}] must be a string, got {_show(x)}")
    return v


def _ints(md: Mapping[str, Any], key: str, lo: int, hi: int) -> list[int]:
    v = md[key]
    if not isinstance(v, list):
        raise _format_error(f"{key} must be an array of integers, got {_show(v)}")
    for i, x in enumerate(v):
        if not _is_int(x) or not lo <= x <= hi:
            raise _format_error(f"{key}[{i}] = {_show(x)} is not an integer in {lo}..{hi}")
    return v


def _flag(md: Mapping[str, Any], key: str, default: bool) -> bool:
    v = md.get(key, default)
    if not isinstance(v, bool):
        raise _format_error(f"{key} must be a bool, got {_show(v)}")
    return v


def _token_id(md: Mapping[str, Any], key: str, n_vocab: int) -> int | None:
    if key not in md:
        return None
    tid = md[key]
    if not _is_int(tid):
        raise _format_error(f"{key} must be an integer token id, got {_show(tid)}")
    if not 0 <= tid < n_vocab:
        raise _format_error(f"{key} = {tid} is outside the vocabulary (0..{n_vocab - 1})")
    return tid
