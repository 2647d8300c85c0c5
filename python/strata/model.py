"""strata.Model: the Python face of a loaded GGUF (tokenizer, chat, sampling options, generation)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from strata import _core
from strata._options import (
    LOAD_DEFAULTS,
    as_float,
    as_int,
    load_config,
    log_level_error,
    parse_seed,
    warn,
)
from strata._progress import ProgressBar, PromptProgress, is_terminal
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
        "repeat_last_n": s.penalty_last_n,
    })


# The native sampler's defaults, the only ones: Model.generate and the CLI take theirs from here.
GENERATE_DEFAULTS: Mapping[str, Any] = _native_defaults()
_D = GENERATE_DEFAULTS
_L = LOAD_DEFAULTS


def sampling_params(max_tokens: object = _D["max_tokens"], temperature: object = _D["temperature"],
                    top_k: object = _D["top_k"], top_p: object = _D["top_p"], min_p: object = _D["min_p"],
                    repetition_penalty: object = _D["repetition_penalty"], repeat_last_n: object = _D["repeat_last_n"],
                    seed: object = None) -> _core.GenParams:
    """The native GenParams of generate()'s keywords, each checked (strata.ConfigError naming it)."""
    p = _core.GenParams()
    p.max_tokens = as_int(max_tokens, "max_tokens (-n/--max-tokens)", 0, 2**62, "tokens to generate at most")
    s = p.sampler
    s.temperature = as_float(temperature, "temperature (--temp)", ">= 0, 0: greedy")
    s.top_k = as_int(top_k, "top_k (--top-k)", 0, 2**31 - 1, "0: off")
    s.top_p = as_float(top_p, "top_p (--top-p)", "in (0, 1], 1: off")
    s.min_p = as_float(min_p, "min_p (--min-p)", "in [0, 1], 0: off")
    s.repetition_penalty = as_float(repetition_penalty, "repetition_penalty (--repeat-penalty)", "> 0, 1: off")
    s.penalty_last_n = as_int(repeat_last_n, "repeat_last_n (--repeat-last-n)", -1, 2**31 - 1, "-1: all, 0: none")
    s.seed = parse_seed(seed)
    s.check()  # the ranges, from the sampler itself
    return p


# How a decode step finds its experts, said for a GPU and for the CPU (which runs a GPU's two ways of
# resolving a bounded cache's misses in host memory: "on the device" would be a GPU that is not there).
_RESOLVED = {
    True: {"resident": "resident", "device": "resolved on the GPU{wt}", "host": "resolved on the host"},
    False: {"resident": "resident", "device": "resolved in the step{wt} (the GPU's way, on the CPU)",
            "host": "resolved a layer at a time (the host's way, on the CPU)"},
}


@dataclass
class Completion:
    """The result of a non-streaming generate() or chat()."""

    text: str
    tokens: list[int]
    stats: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


def _stop_strings(stop: object) -> list[str]:
    """generate()'s `stop` as a list of non-empty strings, else ConfigError."""
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        stops = []
    if not isinstance(stops, Sequence) or not all(isinstance(s, str) and s for s in stops):
        raise _core.ConfigError(
            f"stop strings (stop, --stop) must be non-empty: a string or a list of them, got {stop!r}")
    return list(stops)


def _tap(pieces: Iterator[str], callback: Callable[[str], None]) -> Iterator[str]:
    for p in pieces:
        callback(p)
        yield p


def stop_stream(pieces: Iterator[str]) -> None:
    """Ends a stream= generation as interrupted, with its stats in last_stats: for a Ctrl-C that
    landed in the consumer's code, between two tokens, rather than in the model."""
    try:
        pieces.throw(KeyboardInterrupt())  # type: ignore[attr-defined]
    except (KeyboardInterrupt, StopIteration, AttributeError):
        pass


def _catch_sigint() -> bool:
    """Whether a native call may take Ctrl-C for itself (stopping between layers with
    KeyboardInterrupt): on the main thread, while Python's default SIGINT handler is in place."""
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)


class Model:
    """A Mixture-of-Experts GGUF loaded on `device`, experts streamed through the expert cache.

    expert_cache: MiB (14900), a size with units ('14.5GiB', '900MiB'), 'all' (every expert
    resident, nothing streams) or 'auto' (CPU: all; GPU: what is free beside the dense weights, the KV
    cache and the scratch). prefill: tokens per prompt chunk, or 'auto[:MAX]' for the largest chunk
    <= MAX the cache leaves room for; None: 8192, stepping down as auto does when the cache is too
    small for it (a given N that does not fit is an error naming the cache and the --prefill that do).
    The defaults are the native ModelConfig's (strata.LOAD_DEFAULTS). source: 'host' (a
    copy of the experts in RAM), 'mmap' (read from the file) or 'auto'. threads: CPU threads
    (0: STRATA_THREADS, else every core). gr_unfused: carve the normalized input xn, a debug/A-B
    switch with byte-identical logits (None: from STRATA_GR_UNFUSED). backend: run on this
    strata.Backend instead of one made from device and threads. progress: show a progress line on
    stderr (when it is a terminal) for loads and prompts that take over a second. decode_graph: on a
    GPU, run each decode token as one recorded CUDA graph where the host decides nothing in it (False:
    op by op, to measure the difference). decode_resolve: how a bounded cache finds a decode token's
    experts: 'device' (the GPU resolves hits and misses and reads the misses from page-locked host
    memory itself), 'host' (one round trip per layer, copies by the copy engine) or 'auto' (device
    where the source allows it). cache_policy: the expert cache's eviction policy, 'lru' (least
    recently used), 'lfu' (least frequently used, counts halving as they age) or 'scan' (LRU until a
    pass needs more experts than the cache holds, as a large batched decode step does; then it keeps
    part of the pass's experts instead of evicting each before its next use); with lfu a decode step
    resolves its experts on the host. The logits are the same under each; the hit rate is not.
    prefetch: while a decode layer resolved on the device runs, fill the experts that the next layer's
    router picks from this layer's state (qwen3moe, deepseek2, deepseek4; needs cache_policy 'lru' and a
    source the device reads); an int N fills at most N of each token's guesses a layer, the surest
    first; 'auto' (the default) is 2 for deepseek4 decoding from a bounded cache on a GPU (measured
    faster) and off elsewhere (self.prefetch says which, as loaded). Wrong guesses cost link time only; the
    logits are the same on and off.
    moe_layout: how a bounded cache whose experts a source streams runs them. 'auto' (the default) and
    'mmq': with q8_0 activations as a load with every expert resident runs them (the integer and
    tensor-core kernels), so the logits are the same whatever the cache; faster on a GPU wherever a fifth
    or more of the experts are cached; larger prompt buffers, so a smaller chunk may fit. 'fused': float
    products of the exactly dequantized weights (the fused layout): small prompt buffers, logits a little
    closer to float but not the all-resident load's; faster with a cache of a few percent of the experts.
    cpu_experts: N > 0 computes up to N of a one-token decode step's missed experts a layer on the CPU, from
    the source in host memory, while the link brings the others (llama.cpp's CPU experts beside strata's
    streaming): the same logits, bit for bit, as with 0 (the default). It needs the MMQ layout (moe_layout
    'auto' or 'mmq', not 'fused': the q8_0 products whose bits the CPU reproduces), resolves each decode step
    on the host, and takes qwen3moe, deepseek2 and qwen35moe files whose expert types have an integer kernel.
    cache['cpu_experts'] counts them.
    seqs: KV sequence regions (llama.cpp's -np): ctx is divided among them, and up to seqs sequences
    decode together in one step (decode_batch, strata serve --parallel), each row's logits those of
    the sequence alone.

    Ctrl-C (on the main thread) stops a load, a prompt or a token between two layers and raises
    KeyboardInterrupt; the Model stays usable.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        device: str = _L["device"],
        expert_cache: str | float | None = _L["expert_cache"],
        prefill: str | int | None = None,
        source: str = _L["source"],
        ctx: int = _L["ctx"],
        threads: int = _L["threads"],
        progress: bool = True,
        gr_unfused: bool | None = None,
        backend: Backend | None = None,
        kv_type: str = _L["kv_type"],
        decode_graph: bool = _L["decode_graph"],
        decode_resolve: str = _L["decode_resolve"],
        cache_policy: str = _L["cache_policy"],
        seqs: int = _L["seqs"],
        prefetch: bool | int | str = _L["prefetch"],
        moe_layout: str = _L["moe_layout"],
        cpu_experts: int = _L["cpu_experts"],
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise _core.ConfigError(f"path must be a GGUF file's path, got {path!r}")
        self.path = os.fspath(path)
        if backend is not None and not isinstance(backend, Backend):
            raise _core.ConfigError(f"backend must be a strata.Backend, got {backend!r}")
        cfg = load_config(device=device, expert_cache=expert_cache, prefill=prefill, source=source, ctx=ctx,
                          threads=threads, kv_type=kv_type, decode_graph=decode_graph,
                          decode_resolve=decode_resolve, cache_policy=cache_policy, gr_unfused=gr_unfused,
                          seqs=seqs, prefetch=prefetch, moe_layout=moe_layout, cpu_experts=cpu_experts)
        if log_level_error():
            warn(f"{log_level_error()}; using warn")
        file = _open(self.path)  # mapped and validated once; the native model shares it
        # The device is the native side's to name and check, before the cache size that depends on it.
        self.backend: Backend = backend if backend is not None else Backend(cfg.device, cfg.threads)
        cfg.device = self.backend.name
        self._progress = bool(progress)
        bar = ProgressBar(f"loading experts ({os.path.basename(self.path)})") if self._shows_progress() else None
        self._m = _core.Model(file, self.backend, cfg, progress=bar, catch_sigint=_catch_sigint())
        # As resolved at load: 'all' or bytes (auto: all on the CPU; on a GPU what was free).
        loaded = self._m.config
        self.expert_cache: str | int = loaded.expert_cache
        # As resolved at load (auto: 2 for deepseek4 decoding from a bounded cache on a GPU, else off).
        self.prefetch: bool | int = (loaded.prefetch_max or True) if loaded.prefetch else False
        if cfg.prefill_mode == "default" and self._m.chunk < min(cfg.prefill, cfg.ctx):
            # No silent switch to a slower path (DESIGN invariant 6): a stepped-down chunk is said.
            warn(f"the expert cache ({self._m.cache_stats()['slots']} slots) has no room for the default prompt "
                 f"chunk of {min(cfg.prefill, cfg.ctx)} tokens: prompts run in chunks of {self._m.chunk}; a larger "
                 "--expert-cache keeps the default, --prefill N or auto sets the chunk")
        self.info = ModelInfo._of(file, self._m.plan)
        self.spec: dict[str, Any] = self.info.spec
        # A sequence reaches ctx // seqs positions (its KV region).
        if cfg.ctx // cfg.seqs > self.spec["ctx_train"] > 0:
            what = f"ctx (-c/--ctx) {cfg.ctx}" if cfg.seqs == 1 else \
                f"a sequence's context, ctx (-c/--ctx) {cfg.ctx} over {cfg.seqs} sequences,"
            warn(f"{what} is more than the {self.spec['ctx_train']} tokens "
                 f"{os.path.basename(self.path)} was trained for: text past that length may degrade")
        # After the native load, so an unknown architecture is reported before the tokenizer.
        md = self.info.metadata
        self.tokenizer = Tokenizer.from_metadata(md)
        self.chat_template: str | None = md.get("tokenizer.chat_template")
        self.device = self.backend.name  # "cpu" or "cuda", as resolved from "auto"
        self.ctx = loaded.ctx
        self.seqs: int = self._m.seqs  # KV sequence regions
        self.seq_ctx: int = self._m.seq_ctx  # positions of each (ctx // seqs)
        self._last_stats: dict[str, Any] = {}
        self._last_gen: _core.Generator | None = None  # the last generation that ran its prompt

    def _shows_progress(self) -> bool:
        return self._progress and is_terminal(sys.stderr)

    # ---- tokens ----
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special=skip_special)

    # ---- raw model ----
    def logits(self, ids: Sequence[int], seq: int = 0) -> np.ndarray:
        """Logits at every position of one prompt, run from position 0 in KV region `seq`:
        float32 [len(ids), V]."""
        seq = as_int(seq, "seq", 0, self.seqs - 1, "a KV region of the model (seqs)")
        return self._m.logits(self._ids(ids, "logits()"), catch_sigint=_catch_sigint(), seq=seq)

    @property
    def batch_supported(self) -> bool:
        """Whether the architecture decodes several sequences in one pass (decode_batch)."""
        return bool(self._m.batch_supported)

    def decode_batch(self, ids: Sequence[int], positions: Sequence[int], seqs: Sequence[int]) -> np.ndarray:
        """One decode step of several sequences in one pass: token ids[i] at positions[i] of KV region
        seqs[i] (distinct regions, each holding its sequence's earlier positions, e.g. from logits(...,
        seq=)); float32 logits [len(ids), V], each row those of its sequence decoded alone."""
        tok = self._ids(ids, "decode_batch()").tolist()
        pos = [as_int(p, "decode_batch() position", 0, self.seq_ctx - 1, "a position in the region") for p in positions]
        regions = [as_int(r, "decode_batch() seq", 0, self.seqs - 1, "a KV region of the model") for r in seqs]
        return self._m.decode_batch(tok, pos, regions)

    def _ids(self, ids: object, what: str) -> np.ndarray:
        """Token ids as int32, each in [0, V), else ConfigError."""
        try:
            arr = np.asarray(ids)
        except (TypeError, ValueError):
            arr = np.asarray(None)
        V = self.spec["vocab"]
        if arr.ndim != 1 or arr.size < 1 or not (arr.dtype.kind in "iu" or (arr.dtype == object and all(
                isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in arr))):
            raise _core.ConfigError(f"{what} takes a non-empty 1-D list of token ids (ints in [0, {V}))")
        try:
            arr = arr.astype(np.int64)
        except OverflowError:
            raise _core.ConfigError(f"{what}: a token id is out of range [0, {V})") from None
        bad = arr[(arr < 0) | (arr >= V)]
        if bad.size:
            raise _core.ConfigError(f"{what}: token id {int(bad[0])} is out of range [0, {V})")
        return arr.astype(np.int32)

    def layout(self, tokens: int = LOAD_DEFAULTS["prefill"], source: bool = True) -> dict[str, Any]:
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
        repeat_last_n: int = _D["repeat_last_n"],
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
        add_special: bool = True,
        callback: Callable[[str], None] | None = None,
        reuse_kv: bool = False,
        ignore_eos: bool = False,
    ) -> Completion | Iterator[str]:
        """Completes `prompt` (text or token ids).

        stream=True returns an iterator of text pieces as they decode; `callback`, if given, is
        called with each piece either way. Stop strings end the text before they appear. Each call
        owns its state: iterators of several calls on one Model may be consumed interleaved.
        repeat_last_n: the tokens the repetition penalty looks back on (-1: all, 0: none). seed:
        None or -1 for a random one. Bad values raise strata.ConfigError before any work; Ctrl-C
        raises KeyboardInterrupt, with the stats so far in `last_stats` (stop_reason "interrupted").
        reuse_kv: the prompt's tokens that begin as the last generation's did (a chat's history)
        are not run again when the KV cache still holds them (stats: prompt_reused); with DeepSeek V4,
        whose cache keeps rings of the latest positions, only when they begin with all it holds. The logits are
        those of a full run, except that with a streamed expert cache the shorter rest may take the
        other MoE layout (within its tolerance). ignore_eos: the model's end-of-turn tokens do not stop
        it (llama.cpp's --ignore-eos: a fixed length for benchmarks); stop strings still do.
        """
        p = sampling_params(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition_penalty, repeat_last_n=repeat_last_n, seed=seed)
        stops = _stop_strings(stop)
        if callback is not None and not callable(callback):
            raise _core.ConfigError(f"callback must be callable, got {callback!r}")
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special)
        else:
            ids = self._ids(prompt, "generate()").tolist()
        p.stop_ids = [] if ignore_eos else sorted(self.tokenizer.stop_ids)
        gen = _core.Generator(self._m)
        tokens: list[int] = []
        stats: dict[str, Any] = {}
        bar = PromptProgress() if self._shows_progress() else None
        try:
            gen.begin(ids, p, catch_sigint=_catch_sigint(), progress=bar,
                      reuse=self._last_gen if reuse_kv else None)
            self._last_gen = gen
        except KeyboardInterrupt:
            self._collect(gen, stats)
            raise
        finally:
            if bar is not None:
                bar.close()
        pieces = self._run(gen, stops, tokens, stats)
        if callback is not None:
            pieces = _tap(pieces, callback)
        if stream:
            return pieces
        text = "".join(pieces)
        return Completion(text=text, tokens=tokens, stats=stats)

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_tokens: int = _D["max_tokens"],
        temperature: float = _D["temperature"],
        top_k: int = _D["top_k"],
        top_p: float = _D["top_p"],
        min_p: float = _D["min_p"],
        repetition_penalty: float = _D["repetition_penalty"],
        repeat_last_n: int = _D["repeat_last_n"],
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        add_special: bool = True,
        ignore_eos: bool = False,
    ) -> list[Completion]:
        """Completes every prompt (texts or token id lists), up to `seqs` of them decoding together:
        the prompts that start together run in one pass (run_prompts), each step advances every
        sequence in flight by one token in one pass (decode_batch: a layer's experts are fetched once
        for all of them), and a sequence that ends gives its KV region to the next prompt. Each has
        its own sampler (seeded alike when `seed` is given), so every result is generate()'s on that
        prompt alone: the same tokens, text and stop. Bad values raise
        strata.ConfigError before any work; Ctrl-C raises KeyboardInterrupt."""
        p = sampling_params(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition_penalty, repeat_last_n=repeat_last_n, seed=seed)
        p.stop_ids = [] if ignore_eos else sorted(self.tokenizer.stop_ids)
        stops = _stop_strings(stop)
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise _core.ConfigError(
                f"generate_batch() takes a list of prompts (texts or token id lists), got {prompts!r}")
        ids = [self.tokenize(x, add_special=add_special) if isinstance(x, str) else
               self._ids(x, f"generate_batch() prompt {i}").tolist() for i, x in enumerate(prompts)]
        for i, x in enumerate(ids):  # before any work: a sequence's context is its region's
            if not x or len(x) >= self.seq_ctx:
                raise _core.ConfigError(
                    f"generate_batch() prompt {i} has {len(x)} tokens; a sequence's context is {self.seq_ctx} "
                    f"(ctx {self.ctx} over {self.seqs} sequences), so a prompt needs 1 to {self.seq_ctx - 1}: "
                    "shorten it, or load the model with a larger ctx or fewer seqs")
        hold = max((len(s) for s in stops), default=1) - 1
        results: list[Completion | None] = [None] * len(ids)
        waiting = list(range(len(ids)))[::-1]
        free = list(range(self.seqs))[::-1]
        active: list[dict[str, Any]] = []  # per sequence in flight: index, gen, decoder, tokens, text

        def end(a: dict[str, Any]) -> None:
            active.remove(a)
            free.append(a["gen"].seq)
            results[a["i"]] = Completion(text=a["text"], tokens=a["tokens"], stats=a["gen"].stats())

        try:
            while waiting or active:
                new = []
                while waiting and free:
                    i = waiting.pop()
                    gen = _core.Generator(self._m, free.pop())
                    new.append((i, gen))
                    active.append({"i": i, "gen": gen, "dec": StreamDecoder(self.tokenizer, skip_special=True),
                                   "tokens": [], "text": ""})
                if len(new) > 1 and self.batch_supported:  # the new prompts in one pass
                    for i, gen in new:
                        gen.prepare(ids[i], p)
                    _core.run_prompts(self._m, [gen for _, gen in new], catch_sigint=_catch_sigint())
                else:
                    for i, gen in new:
                        gen.begin(ids[i], p, catch_sigint=_catch_sigint())
                toks = _core.next_tokens(self._m, [a["gen"] for a in active], catch_sigint=_catch_sigint())
                for a, tok in zip(list(active), toks, strict=True):
                    before = len(a["text"])
                    if tok < 0:
                        a["text"] += a["dec"].flush()
                    else:
                        a["tokens"].append(tok)
                        a["text"] += a["dec"].feed(tok)
                    hit = min((k for k in (a["text"].find(s, max(0, before - hold)) for s in stops) if k >= 0),
                              default=-1)
                    if hit >= 0:
                        a["text"] = a["text"][:hit]
                        a["gen"].finish("stop_string")
                    if hit >= 0 or tok < 0:
                        end(a)
        except KeyboardInterrupt:
            for a in active:
                a["gen"].finish("interrupted")
            raise
        return [r for r in results if r is not None]

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
        try:
            while True:
                tok = gen.next(catch_sigint=_catch_sigint())
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
        except KeyboardInterrupt:  # in the native pass, or thrown in by the consumer (see stop_stream)
            gen.finish("interrupted")
            self._collect(gen, stats)
            raise
        except GeneratorExit:  # the consumer closed the stream early
            gen.finish("caller")
            self._collect(gen, stats)
            raise
        if len(text) > emitted:
            yield text[emitted:]
        self._collect(gen, stats)

    def _collect(self, gen: _core.Generator, stats: dict[str, Any]) -> None:
        """The generation's stats and the cache's into `stats`, which become last_stats."""
        stats.update(gen.stats())
        stats.update({f"cache_{k}": v for k, v in self.cache.items()})
        # Which device ran: "cpu (AVX2, 2 threads)", "cuda: NVIDIA H200, 130.2 GiB free of 139.8 GiB, sm_90".
        d = self.backend.describe()
        stats["device"] = d if d.startswith(self.device) else f"{self.device}: {d}"
        # How decode steps ran: one recorded graph or op by op; experts resident, resolved on the
        # device or on the host.
        stats["decode_path"] = (("graph" if self._m.decode_graph_active else "op by op") + ", experts "
                                + _RESOLVED[self.device != "cpu"][self._m.decode_resolution].format(
                                    wt=", misses written through" if self._m.decode_write_through else ""))
        self._last_stats = stats

    @property
    def last_stats(self) -> dict[str, Any]:
        """Stats of the last generation that finished (for stream=True callers)."""
        return self._last_stats
