"""strata.Model: the Python face of a loaded GGUF (tokenizer, chat, sampling options, generation)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from strata import _core
from strata._options import gr_unfused_from_env, parse_expert_cache, parse_prefill, threads_from_env
from strata._progress import ProgressBar
from strata.chat import DEFAULT_CHAT_TEMPLATE, render_chat
from strata.info import ModelInfo, _open
from strata.tokenizer import StreamDecoder, Tokenizer

# strata.Backend(device, threads): a compute device and its memory (describe(), threads,
# live_allocations()); strata.Model makes one unless given one.
Backend = _core.Backend


def _f32(x: float) -> float:
    """The shortest decimal that a float32 reads back as itself (0.8f -> 0.8, not 0.800000011920929)."""
    return float(str(np.float32(x)))


def _native_defaults() -> Mapping[str, Any]:
    p = _core.GenParams()
    s = p.sampler
    return MappingProxyType({
        "max_tokens": p.max_tokens,
        "temperature": _f32(s.temperature),
        "top_k": s.top_k,
        "top_p": _f32(s.top_p),
        "min_p": _f32(s.min_p),
        "repetition_penalty": _f32(s.repetition_penalty),
        "penalty_last_n": s.penalty_last_n,
    })


# The native sampler's defaults, the only ones: Model.generate and the CLI take theirs from here.
GENERATE_DEFAULTS: Mapping[str, Any] = _native_defaults()
_D = GENERATE_DEFAULTS


@dataclass
class Completion:
    """The result of a non-streaming generate() or chat()."""

    text: str
    tokens: list[int]
    stats: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


def _tap(pieces: Iterator[str], callback: Callable[[str], None]) -> Iterator[str]:
    for p in pieces:
        callback(p)
        yield p


class Model:
    """A Mixture-of-Experts GGUF loaded on `device`, experts streamed through the expert cache.

    expert_cache: MiB (14900), a size with units ('14.5GiB', '900MiB'), 'all' (every expert
    resident, nothing streams) or 'auto' (CPU: all). prefill: tokens per prompt chunk, or
    'auto[:MAX]' for the largest chunk <= MAX the cache leaves room for. source: 'host' (a
    copy of the experts in RAM), 'mmap' (read from the file) or 'auto'. threads: CPU threads
    (0: STRATA_THREADS, else every core). gr_unfused: carve the normalized input xn, a debug/A-B
    switch with byte-identical logits (None: from STRATA_GR_UNFUSED). backend: run on this
    strata.Backend instead of one made from device and threads.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        device: str = "auto",
        expert_cache: str | float | None = "auto",
        prefill: str | int | None = 8192,
        source: str = "auto",
        ctx: int = 4096,
        threads: int = 0,
        progress: bool = True,
        gr_unfused: bool | None = None,
        backend: Backend | None = None,
        kv_type: str = "auto",
    ) -> None:
        self.path = os.fspath(path)
        file = _open(self.path)  # mapped and validated once; the native model shares it
        if backend is not None:
            device = backend.name
        cache = parse_expert_cache(expert_cache)
        mode, chunk = parse_prefill(prefill)
        if source not in ("auto", "host", "mmap"):
            raise _core.ConfigError(f"--source must be host, mmap or auto, got '{source}'")
        threads = threads_from_env(threads)
        self.backend: Backend = backend if backend is not None else Backend(device, threads)
        self.expert_cache = cache
        bar = ProgressBar(f"loading experts ({os.path.basename(self.path)})") if progress else None
        self._m = _core.Model(
            file, self.backend, device=self.backend.name, threads=threads, ctx=ctx, all_resident=(cache == "all"),
            cache_bytes=0 if cache in ("all", "auto") else int(cache), cache_auto=(cache == "auto"),
            kv_type=kv_type, source=source, prefill=chunk,
            prefill_auto=(mode == "auto"), gr_unfused=gr_unfused_from_env(gr_unfused), progress=bar,
        )
        if cache == "auto":  # as resolved at load
            c = self._m.cache_stats()
            self.expert_cache = "all" if c["all_resident"] else int(c["cache_bytes"])
        self.info = ModelInfo._of(file, self._m.plan)
        self.spec: dict[str, Any] = self.info.spec
        # After the native load, so an unknown architecture is reported before the tokenizer.
        md = self.info.metadata
        self.tokenizer = Tokenizer.from_metadata(md)
        self.chat_template: str | None = md.get("tokenizer.chat_template")
        self.device = self.backend.name  # "cpu" or "cuda", as resolved from "auto"
        self.ctx = ctx
        self._last_stats: dict[str, Any] = {}

    # ---- tokens ----
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special=skip_special)

    # ---- raw model ----
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits at every position of one prompt: float32 [len(ids), V]."""
        arr = np.asarray(ids, dtype=np.int32)
        if arr.ndim != 1 or arr.size < 1:
            raise _core.ConfigError("logits() takes a 1-D list of token ids")
        return self._m.logits(arr)

    def layout(self, tokens: int = 8192, source: bool = True) -> dict[str, Any]:
        """The prompt scratch plan for a chunk of `tokens`: bytes_needed, kind, buffers, slots."""
        return self.info.layout(tokens, source)

    def plan_chunk(self, expert_cache: str | float, max_tokens: int, auto: bool = True) -> dict[str, Any]:
        """The chunk --prefill auto:MAX (or a fixed MAX) would take with a cache of `expert_cache`."""
        return self.info.plan_chunk(expert_cache, max_tokens, auto)

    def slots_for(self, tokens: int) -> int:
        """Slots a prompt chunk of `tokens` borrows from this model's cache (0 when all resident)."""
        return self._m.slots_for(int(tokens))

    @property
    def threads(self) -> int:
        """CPU threads the backend runs on."""
        return self.backend.threads

    @property
    def chunk(self) -> int:
        """Tokens per prompt chunk, as resolved at load."""
        return self._m.chunk

    @property
    def cache(self) -> dict[str, Any]:
        """Expert cache configuration and live stats."""
        d = self._m.cache_stats()
        d["expert_cache"] = self.expert_cache
        d["chunk"] = self._m.chunk
        return d

    def reset_stats(self) -> None:
        self._m.reset_stats()

    def pin(self, layer: int, expert: int) -> None:
        """Keeps expert `expert` of `layer` resident: never evicted, never lent over."""
        L, E = self.spec["layers"], self.spec["experts"]
        if not (0 <= layer < L and 0 <= expert < E):
            raise _core.ConfigError(f"pin: layer {layer} expert {expert} out of range ({L} layers, {E} experts)")
        self._m.pin(int(layer), int(expert))

    # ---- generation ----
    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = _D["max_tokens"],
        temperature: float = _D["temperature"],
        top_k: int = _D["top_k"],
        top_p: float = _D["top_p"],
        min_p: float = _D["min_p"],
        repetition_penalty: float = _D["repetition_penalty"],
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
        add_special: bool = True,
        callback: Callable[[str], None] | None = None,
    ) -> Completion | Iterator[str]:
        """Completes `prompt` (text or token ids).

        stream=True returns an iterator of text pieces as they decode; `callback`, if given, is
        called with each piece either way. Stop strings end the text before they appear. Each call
        owns its state: iterators of several calls on one Model may be consumed interleaved.
        """
        ids = list(prompt) if not isinstance(prompt, str) else self.tokenize(prompt, add_special=add_special)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s for s in stops):
            raise _core.ConfigError("stop strings must be non-empty")
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % 2**63)
        p = _core.GenParams()
        p.max_tokens = int(max_tokens)
        p.sampler.temperature = float(temperature)
        p.sampler.top_k = int(top_k)
        p.sampler.top_p = float(top_p)
        p.sampler.min_p = float(min_p)
        p.sampler.repetition_penalty = float(repetition_penalty)
        p.sampler.seed = int(seed)
        p.stop_ids = sorted(self.tokenizer.stop_ids)
        gen = _core.Generator(self._m)
        gen.begin(ids, p)
        tokens: list[int] = []
        stats: dict[str, Any] = {}
        pieces = self._run(gen, stops, tokens, stats)
        if callback is not None:
            pieces = _tap(pieces, callback)
        if stream:
            return pieces
        text = "".join(pieces)
        return Completion(text=text, tokens=tokens, stats=stats)

    def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> Completion | Iterator[str]:
        """Renders `messages` with the model's chat template, then generate()s the reply."""
        prompt = render_chat(
            self.chat_template or DEFAULT_CHAT_TEMPLATE, messages, add_generation_prompt=True,
            bos_token=self.tokenizer.bos_token, eos_token=self.tokenizer.eos_token,
        )
        return self.generate(prompt, add_special=False, **kwargs)

    def _run(self, gen: _core.Generator, stops: list[str], tokens: list[int],
             stats: dict[str, Any]) -> Iterator[str]:
        """Decodes `gen` into text pieces, appending its tokens to `tokens` and, at the end, its
        stats to `stats` (both the caller's, one pair per generate() call)."""
        dec = StreamDecoder(self.tokenizer, skip_special=True)
        text, emitted = "", 0
        hold = max((len(s) for s in stops), default=1) - 1
        while True:
            tok = gen.next()
            if tok < 0:
                text += dec.flush()
                break
            tokens.append(tok)
            text += dec.feed(tok)
            hit = min((i for i in (text.find(s, max(0, emitted - hold)) for s in stops) if i >= 0), default=-1)
            if hit >= 0:
                text = text[:hit]
                gen.finish("stop_string")
                break
            safe = len(text) - hold if stops else len(text)
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
        if len(text) > emitted:
            yield text[emitted:]
        stats.update(gen.stats())
        stats.update({f"cache_{k}": v for k, v in self.cache.items()})
        self._last_stats = stats

    @property
    def last_stats(self) -> dict[str, Any]:
        """Stats of the last generation that finished (for stream=True callers)."""
        return self._last_stats
