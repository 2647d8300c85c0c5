"""The `strata` command line: generate, chat, serve, info, layout, bench, demo.

Every bad flag value ends in one line naming the flag and what it takes (exit 2), Ctrl-C in a
note and the stats asked for (exit 130), and a traceback never reaches the user."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any, NoReturn

import click

import strata
from strata import GENERATE_DEFAULTS as DEFAULTS
from strata._llama_flags import Command
from strata._options import LOAD_DEFAULTS as LOAD
from strata._options import StrataWarning, log_level_error, parse_expert_cache, parse_prefetch, parse_prefill
from strata.model import sampling_params, stop_stream

GiB = 2**30
MiB = 2**20
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a job stopped by Ctrl-C

_EXPERT_CACHE_HELP = ("Expert cache size: MiB (14900), a size with units (14.5GiB, 900MiB), 'all' (every expert "
                      "resident, nothing streams) or 'auto' (on the CPU: all; on a GPU: what is free).")
_PREFILL_HELP = (f"Prompt tokens per chunk: N, or auto[:MAX] for the largest chunk <= MAX (default "
                 f"{strata._core.PREFILL_AUTO_MAX}) that the expert cache leaves room for, stepping down to 1 token.  "
                 f"[default: {LOAD['prefill']}, stepping down as auto does when the expert cache is too small for it]")


# ---- errors, warnings, interrupts: one line each ----

def _fail(e: Exception | str) -> NoReturn:
    click.echo(f"strata: error: {e}", err=True)
    sys.exit(EXIT_USAGE)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, StrataWarning):
        click.echo(f"strata: warning: {message}", err=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


class _Strata(click.Group):
    """The command group: commands listed in the order they are defined, and click's usage errors,
    Ctrl-C and unexpected exceptions each turned into one line on stderr. Its commands answer
    llama.cpp's flags first (strata._llama_flags)."""

    command_class = Command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as e:
            where = e.ctx.command_path if isinstance(e, click.UsageError) and e.ctx else "strata"
            msg = " ".join(e.format_message().split())
            click.echo(f"strata: error: {msg} (see '{where} --help')", err=True)
            sys.exit(EXIT_USAGE)
        except (click.Abort, KeyboardInterrupt):
            click.echo("\nstrata: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as e:
            if os.environ.get("STRATA_LOG", "").strip().lower() == "debug":
                raise
            click.echo(f"strata: internal error: {type(e).__name__}: {e} (please report it; STRATA_LOG=debug "
                       "shows the traceback)", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Strata, name="strata", invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(version=strata.__version__, prog_name="strata")
@click.pass_context
def main(ctx: click.Context) -> None:
    """strata: run Mixture-of-Experts GGUF models with experts streamed through a device cache.

    Run 'strata COMMAND --help' for a command's flags."""
    warnings.showwarning = _show_warning
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
        ctx.exit(0)
    err = log_level_error()
    if err:
        raise click.UsageError(err)


# ---- options shared by commands ----

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _apply(*decorators: Decorator) -> Decorator:
    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        for d in reversed(decorators):
            f = d(f)
        return f
    return wrap


_model_args = _apply(
    click.argument("model", type=click.Path(dir_okay=False), required=False),
    click.option("-m", "--model", "model_opt", type=click.Path(dir_okay=False), default=None, metavar="PATH",
                 help="The GGUF model file, instead of the MODEL argument."),
)


def _model_path(model: str | None, model_opt: str | None) -> str:
    if model is None and model_opt is None:
        raise click.UsageError("no model given: name a GGUF file as MODEL or with -m/--model")
    if model is not None and model_opt is not None and model != model_opt:
        raise click.UsageError(f"two models given ('{model}' and -m '{model_opt}'): name one")
    return model if model is not None else model_opt  # type: ignore[return-value]


_device_option = click.option(
    "--device", default=LOAD["device"], show_default=True, metavar="NAME",
    help="Compute device: auto (cuda when strata was built with it and a GPU is present, else cpu), cuda or cpu.")


_POLICY_HELP = ("Expert cache eviction: lru (least recently used), lfu (least frequently used, counts halving as "
                "they age) or scan (LRU until one pass needs more experts than the cache holds, e.g. a large batch; "
                "then it keeps part of them). lfu resolves decode on the host. Logits are the same.")


_MOE_LAYOUT_HELP = ("How a bounded cache runs the experts it streams: auto or mmq (q8_0 products as with every expert "
                    "resident: the same logits whatever the cache; faster on a GPU wherever a fifth or more of the "
                    "experts are cached; larger prompt buffers) or fused (float products of exactly dequantized "
                    "weights: smaller prompt buffers; faster with a cache of a few percent of the experts).")


def _load_options(ctx_default: int | None = LOAD["ctx"], serving: bool = False) -> Decorator:
    policy = (click.option("--cache-policy", type=click.Choice(["auto", "lru", "lfu", "scan"]), default="auto",
                           show_default=True,
                           help=_POLICY_HELP + " auto: scan with --parallel > 1 (a batched step's experts outgrow a "
                                "bounded cache, which scan keeps part of; --prefetch on takes lru), else lru.")
              if serving else
              click.option("--cache-policy", type=click.Choice(["lru", "lfu", "scan"]), default=LOAD["cache_policy"],
                           show_default=True, help=_POLICY_HELP))
    opts = [
        _device_option,
        click.option("--kv-type", type=click.Choice(["auto", "f16", "f32"]), default=LOAD["kv_type"],
                     show_default=True,
                     help="KV cache element type: auto (f16 on a GPU, f32 on the CPU), f16, or f32 (for checking a "
                          "GPU against the CPU)."),
        click.option("--expert-cache", default=LOAD["expert_cache"], show_default=True, metavar="SIZE",
                     help=_EXPERT_CACHE_HELP),
        click.option("--prefill", default=None, metavar="N|auto[:MAX]", help=_PREFILL_HELP),
        click.option("--source", type=click.Choice(["auto", "host", "mmap"]), default=LOAD["source"],
                     show_default=True,
                     help="Where streamed experts live: host (a copy in RAM), mmap (read from the file), auto "
                          "(host when it fits in the free RAM)."),
        policy,
        click.option("--prefetch", default=LOAD["prefetch"] if LOAD["prefetch"] == "auto"
                     else ("on" if LOAD["prefetch"] else "off"), show_default=True,
                     metavar="auto|on|off|N",
                     help="Decode on a GPU with a bounded cache: fill the experts the next layer's router predicts "
                          "while this layer runs (qwen3moe, deepseek2, deepseek4; --cache-policy lru); N: at most "
                          "N of each token's guesses a layer, the surest first; auto: 2 for deepseek4 (measured "
                          "faster), off elsewhere. Logits are the same."),
        click.option("--moe-layout", type=click.Choice(["auto", "mmq", "fused"]), default=LOAD["moe_layout"],
                     show_default=True, help=_MOE_LAYOUT_HELP),
        click.option("--cpu-experts", type=click.IntRange(0, 64), default=LOAD["cpu_experts"], show_default=True,
                     metavar="N",
                     help="Decode with a bounded cache: compute up to N of each token's missed experts a layer on "
                          "the CPU from host memory while the link brings the others (llama.cpp's CPU experts beside "
                          "strata's streaming; qwen3moe, deepseek2, qwen35moe; not with --moe-layout fused). 0: off. "
                          "Logits are the same."),
        click.option("-t", "--threads", type=click.IntRange(min=0), default=LOAD["threads"], show_default=True,
                     help="CPU threads; 0: STRATA_THREADS, else every core."),
        click.option("-q", "--quiet", is_flag=True,
                     help="No progress lines on stderr (they show only on a terminal, for steps over a second)."),
    ]
    if ctx_default is not None:
        opts.insert(4, click.option("-c", "--ctx", type=click.IntRange(min=1), default=ctx_default, show_default=True,
                                    help="Context length in tokens: the KV cache holds the prompt and the reply."))
    return _apply(*opts)


_sampling_options = _apply(
    click.option("--temp", "temperature", type=float, default=DEFAULTS["temperature"], show_default=True,
                 help="Temperature, >= 0; 0 is greedy."),
    click.option("--top-k", type=int, default=DEFAULTS["top_k"], show_default=True,
                 help="Keep the K most likely tokens, >= 0; 0: off."),
    click.option("--top-p", type=float, default=DEFAULTS["top_p"], show_default=True,
                 help="Nucleus: keep the most likely tokens up to this probability mass, in (0, 1]; 1: off."),
    click.option("--min-p", type=float, default=DEFAULTS["min_p"], show_default=True,
                 help="Drop tokens less likely than this fraction of the best, in [0, 1]; 0: off."),
    click.option("--repeat-penalty", type=float, default=DEFAULTS["repetition_penalty"], show_default=True,
                 help="Divide the logits of recent tokens by this, > 0; 1: off."),
    click.option("--repeat-last-n", type=int, default=DEFAULTS["repeat_last_n"], show_default=True,
                 help="Recent tokens the repeat penalty looks back on; -1: all, 0: none."),
    click.option("--seed", type=int, default=None, help="Sampling seed, 0 to 2^64-1; -1 or unset: random."),
    click.option("--stop", multiple=True, metavar="TEXT",
                 help="Stop before this text (repeatable); the model's end-of-turn tokens always stop."),
    click.option("--stats", is_flag=True, help="Print prompt and decode speed and expert-cache stats to stderr."),
)


def _sampling(temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
              repeat_last_n: int, seed: int | None, max_tokens: int) -> dict[str, Any]:
    """generate()'s keywords from the flags, checked before anything is loaded."""
    kw = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
              repetition_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed)
    try:
        sampling_params(**kw)
    except strata.Error as e:
        _fail(e)
    return kw


def _load(model: str, quiet: bool = False, **kw: Any) -> strata.Model:
    try:
        return strata.Model(model, progress=not quiet, **kw)
    except (strata.Error, OSError) as e:
        _fail(e)


def _info(model: str, **kw: Any) -> strata.ModelInfo:
    try:
        return strata.ModelInfo(model, **kw)
    except (strata.Error, OSError) as e:
        _fail(e)


# ---- stats ----

def _fmt_bytes(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def _n(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _fmt_ms(ms: float) -> str:
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _decode_stream(stats: dict[str, Any]) -> str:
    """The expert traffic of the decode passes: per token misses and bytes, the hit rate, and the link
    rate the streamed bytes average over the decode's wall time (a lower bound of what the link did)."""
    passes = stats.get("decode_passes", 0)
    looked = stats.get("decode_hits", 0) + stats.get("decode_misses", 0)
    if not passes or not looked:
        return "no expert lookups in decode passes"
    if not stats["decode_misses"]:
        return f"no misses in {_n(passes, 'pass', 'passes')} (hit rate 1.000)"
    secs = stats["decode_ms"] / 1000
    text = (f"{stats['decode_misses'] / passes:.1f} misses and {_fmt_bytes(stats['decode_bytes'] / passes)} a token "
            f"(hit rate {stats['decode_hits'] / looked:.3f}), "
            f"{stats['decode_bytes'] / 1e9 / secs if secs > 0 else 0:.2f} GB/s over the decode's time")
    fills = stats.get("cache_prefetch_fills", 0)
    if fills:  # over the model's life (the cache's counters), as the experts line
        text += (f"; prefetch: {fills} filled ({_fmt_bytes(stats['cache_prefetch_bytes'])}), "
                 f"{stats['cache_prefetch_used']} used, {stats['cache_prefetch_wasted']} evicted unused")
    cpu = stats.get("cache_cpu_experts", 0)
    if cpu:  # the CPU share (cpu_experts), over the model's life
        text += f"; {cpu} missed experts computed on the CPU ({_fmt_bytes(stats['cache_cpu_bytes'])} read there)"
    return text


def _print_stats(stats: dict[str, Any], err: bool = True) -> None:
    c = {k[len("cache_"):]: v for k, v in stats.items() if k.startswith("cache_")}
    done, total = stats["prompt_tokens"], stats.get("prompt_total", stats["prompt_tokens"])
    prompt = f"{done} tokens" if done == total else f"{done} of {total} tokens"
    if stats.get("prompt_reused"):
        prompt += f" ({stats['prompt_reused']} kept in the KV cache from the last turn)"
    lines = [
        f"device   {stats.get('device', '?')}",
        f"prompt   {prompt} in {_fmt_ms(stats['prompt_ms'])} ({stats['prompt_tps']:.1f} tok/s), "
        f"{_n(stats['prompt_chunks'], 'chunk')} of up to {_n(stats['prompt_chunk'], 'token')}",
        f"decode   {_n(stats['generated'], 'token')}, "
        + (f"{_n(stats['decode_passes'], 'pass', 'passes')} in {_fmt_ms(stats['decode_ms'])} "
           f"({stats['decode_tps']:.2f} tok/s)" if stats["decode_passes"] else "no pass after the prompt's")
        + f", stop: {stats['stop_reason'] or 'none'}"
        + (f"; {stats['decode_path']}" if stats.get("decode_passes") and stats.get("decode_path") else ""),
        f"experts  source {c.get('source')}, cache "
        + ("all resident" if c.get("all_resident") else
           f"{c.get('slots')} slots x {_fmt_bytes(c.get('slot_bytes', 0))}"),
        f"cache    hits {c.get('hits')}, misses {c.get('misses')}, streamed {_fmt_bytes(c.get('bytes_streamed', 0))}, "
        f"evictions {c.get('evictions')}, refills {c.get('refills')}",
        f"stream   decode: {_decode_stream(stats)}",
        f"prompt   slots borrowed {c.get('slots_borrowed')} ({_fmt_bytes(c.get('region_bytes', 0))})",
    ]
    for line in lines:
        click.echo(line, err=err)


def _interrupted_note(stats: dict[str, Any]) -> str:
    if not stats:
        return "strata: interrupted"
    total = stats.get("prompt_total", stats["prompt_tokens"])
    if stats["prompt_tokens"] < total:
        return f"strata: interrupted during the prompt, after {stats['prompt_tokens']} of its {total} tokens"
    return f"strata: interrupted after {stats['generated']} generated tokens"


def _ctx_full_note(m: strata.Model, stats: dict[str, Any]) -> str | None:
    if stats.get("stop_reason") != "ctx_full":
        return None
    return (f"strata: stopped after {_n(stats['generated'], 'token')}: the context of {m.ctx} tokens (-c/--ctx) "
            f"is full with the prompt's {stats['prompt_tokens']} and the reply; raise -c/--ctx to generate more")


# ---- commands ----

@main.command(short_help="Generate text from a prompt, streamed to stdout.")
@_model_args
@click.option("-p", "--prompt", default=None, help="Prompt text (with --chat: the user's message).")
@click.option("-f", "--file", "prompt_file", type=click.File("r", encoding="utf-8"), default=None, metavar="PATH",
              help="Read the prompt from this file ('-' for stdin).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template, as a user message.")
@click.option("--system", default=None, help="With --chat: a system message before the user's.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=0), default=DEFAULTS["max_tokens"], show_default=True,
              help="Tokens to generate at most (the context may end it sooner).")
@click.option("--ignore-eos", is_flag=True,
              help="Do not stop at the model's end-of-turn tokens (a fixed length, for benchmarks).")
@_load_options()
@_sampling_options
def generate(model: str | None, model_opt: str | None, prompt: str | None, prompt_file: Any, chat: bool,
             system: str | None, max_tokens: int, ignore_eos: bool, device: str, kv_type: str, expert_cache: str,
             prefill: str,
             source: str, cache_policy: str, prefetch: str, moe_layout: str, cpu_experts: int,
             ctx: int, threads: int, quiet: bool, temperature: float, top_k: int, top_p: float, min_p: float,
             repeat_penalty: float, repeat_last_n: int, seed: int | None, stop: tuple[str, ...],
             stats: bool) -> None:
    """Generate text from MODEL (a GGUF file) and stream it to stdout.

    Ctrl-C stops it, prints the --stats asked for and exits with 130. Stopping on a full context
    says so on stderr."""
    path = _model_path(model, model_opt)
    if (prompt is None) == (prompt_file is None):
        _fail("give the prompt with exactly one of -p/--prompt TEXT and -f/--file PATH")
    if system is not None and not chat:
        _fail("--system needs --chat (it is a chat message)")
    if any(not s for s in stop):
        _fail("--stop takes a non-empty text")
    kw = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, max_tokens)
    kw["ignore_eos"] = ignore_eos
    if prompt_file is not None:
        prompt = prompt_file.read()
    m = _load(path, quiet, device=device, kv_type=kv_type, expert_cache=expert_cache, prefill=prefill, source=source,
              cache_policy=cache_policy, prefetch=parse_prefetch(prefetch), moe_layout=moe_layout,
              cpu_experts=cpu_experts,
              ctx=ctx, threads=threads)
    it = None
    try:
        msgs = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": prompt}]
        it = m.chat(msgs, stop=list(stop), stream=True, **kw) if chat else m.generate(
            prompt, stop=list(stop), stream=True, **kw)
        for piece in it:
            click.echo(piece, nl=False)
            sys.stdout.flush()
        click.echo()
    except KeyboardInterrupt:
        if it is not None:
            stop_stream(it)
        click.echo()
        click.echo(_interrupted_note(m.last_stats), err=True)
        if stats and m.last_stats:
            _print_stats(m.last_stats)
        sys.exit(EXIT_INTERRUPTED)
    except strata.Error as e:
        _fail(e)
    note = _ctx_full_note(m, m.last_stats)
    if note:
        click.echo(note, err=True)
    if stats:
        _print_stats(m.last_stats)


@main.command(short_help="Chat with a model in the terminal, turn by turn.")
@_model_args
@click.option("--system", default=None, help="A system message that opens the conversation.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=0), default=None,
              help="Tokens per answer at most  [default: until the end of the turn or a full context]")
@_load_options()
@_sampling_options
def chat(model: str | None, model_opt: str | None, system: str | None, max_tokens: int | None, device: str,
         kv_type: str,
         expert_cache: str, prefill: str, source: str, cache_policy: str, prefetch: str, moe_layout: str,
         cpu_experts: int, ctx: int,
         threads: int, quiet: bool,
         temperature: float,
         top_k: int, top_p: float, min_p: float, repeat_penalty: float, repeat_last_n: int, seed: int | None,
         stop: tuple[str, ...], stats: bool) -> None:
    """Chat with MODEL (a GGUF file) in the terminal, with its chat template and the whole history.

    Answers stream as they decode. Ctrl-C stops the current answer only; /exit or Ctrl-D leaves;
    /reset forgets the history; /help lists these. With --stats, each turn's stats go to stderr."""
    from strata._interactive import ChatSession

    path = _model_path(model, model_opt)
    if any(not s for s in stop):
        _fail("--stop takes a non-empty text")
    kw = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
                   ctx if max_tokens is None else max_tokens)
    m = _load(path, quiet, device=device, kv_type=kv_type, expert_cache=expert_cache, prefill=prefill, source=source,
              cache_policy=cache_policy, prefetch=parse_prefetch(prefetch), moe_layout=moe_layout,
              cpu_experts=cpu_experts,
              ctx=ctx, threads=threads)
    session = ChatSession(m, system=system, stop=list(stop), stats=stats, print_stats=_print_stats,
                          ctx_full_note=_ctx_full_note, **kw)
    session.run()


def _serve_policy(policy: str, parallel: int, prefetch: bool) -> str:
    """serve's --cache-policy auto: scan when several slots decode together (their step's experts can outgrow
    a bounded cache: bench/serve_load.py on an H200, 8 requests at once 1.67x faster than in a row under scan,
    1.33x under lru) unless --prefetch on or N (LRU's; auto turns prefetch off under scan), else lru."""
    if policy != "auto":
        return policy
    return "scan" if parallel > 1 and not prefetch else "lru"


@main.command(short_help="Serve the model over an OpenAI-compatible HTTP API.")
@_model_args
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback without --api-key warns.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="TCP port; 0 picks a free one (the startup line names it).")
@click.option("-np", "--parallel", type=click.IntRange(1, strata._core.MAX_SEQS), default=LOAD["seqs"],
              show_default=True,
              help="Slots: requests in flight at once, each in its own KV region of -c/--ctx divided by "
                   "--parallel (llama.cpp's -np), all decoding together in one pass per token (a batch's experts "
                   "are fetched once per layer for all of them).")
@click.option("--queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests that may wait for a slot; beyond them a request gets 429 with Retry-After.")
@click.option("--turn", type=click.IntRange(min=1), default=16, show_default=True,
              help="When requests share a KV region (a model loaded with fewer regions than --parallel, from "
                   "Python): tokens one makes before the next takes its turn (a long prompt keeps it until it is in).")
@click.option("--api-key", envvar="STRATA_API_KEY", default=None, metavar="KEY",
              help="Require 'Authorization: Bearer KEY' on every route but /health (also from STRATA_API_KEY).")
@click.option("--name", "model_id", default=None, metavar="ID",
              help="The model's id in /v1/models and responses  [default: the file's name]")
@_load_options(serving=True)
def serve(model: str | None, model_opt: str | None, host: str, port: int, parallel: int, queue: int, turn: int,
          api_key: str | None, model_id: str | None, device: str, kv_type: str, expert_cache: str, prefill: str,
          source: str, cache_policy: str, prefetch: str, moe_layout: str, cpu_experts: int, ctx: int, threads: int,
          quiet: bool) -> None:
    """Serve MODEL (a GGUF file) over OpenAI's HTTP API: POST /v1/chat/completions (the model's chat
    template) and /v1/completions, streamed (SSE) or not; GET /v1/models, /health and /metrics
    (Prometheus).

    Up to --parallel requests decode together, one token each per pass, in KV regions of
    ctx / --parallel tokens; more wait in a queue of --queue, then get 429. A follow-up turn of a
    conversation runs only its new tokens when its slot's region still holds the earlier ones. Ctrl-C or
    SIGTERM stops the server within a second; requests in flight get an error, not silence."""
    path = _model_path(model, model_opt)
    cache_policy = _serve_policy(cache_policy, parallel, parse_prefetch(prefetch) not in (False, "auto"))
    try:
        from strata.serve import Server, is_loopback, listen
    except ImportError as e:
        _fail(f"strata serve needs starlette and uvicorn ({e}): pip install starlette uvicorn")
    if api_key is not None and not api_key.strip():
        _fail("--api-key is empty: give a key, or leave the flag out to serve without one")
    try:  # before the load, which may take minutes: a taken port is said at once
        sock = listen(host, port)
    except OSError as e:
        _fail(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port or --host")
    if not is_loopback(host) and not api_key:
        click.echo(f"strata: warning: listening on {host} without --api-key: anyone who can reach this address "
                   "can use the model; give --api-key KEY (or STRATA_API_KEY)", err=True)
    try:
        m = _load(path, quiet, device=device, kv_type=kv_type, expert_cache=expert_cache, prefill=prefill,
                  source=source, cache_policy=cache_policy, prefetch=parse_prefetch(prefetch), moe_layout=moe_layout,
                  cpu_experts=cpu_experts,
                  ctx=ctx, threads=threads, seqs=parallel)
    except BaseException:
        sock.close()
        raise
    try:
        server = Server(m, host=host, parallel=parallel, queue=queue, turn=turn, api_key=api_key,
                        model_id=model_id, sock=sock)
    except strata.Error as e:
        _fail(e)
    click.echo(f"strata serve: {server.model_id} on {server.url}/v1 ({_n(parallel, 'slot')}, queue {queue}, "
               f"ctx {m.ctx}{f' ({m.seq_ctx} a slot)' if parallel > 1 else ''}, "
               f"{'API key required' if api_key else 'no API key'}); Ctrl-C stops", err=True)
    sig = server.run()
    c = server.engine.counters
    click.echo(f"strata serve: stopped{f' ({signal.Signals(sig).name})' if sig else ''}: {c.finished} requests "
               f"finished, {c.cancelled} cancelled by their clients, {c.failed} failed or ended by the stop with an "
               "error", err=True)
    if not server.engine_stopped:
        # A prompt chunk runs inside the native model, which no other thread can stop: leave without it.
        click.echo("strata serve: a prompt chunk was still running; exiting without waiting for it", err=True)
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED if sig == signal.SIGINT else 0)
    if sig == signal.SIGINT:
        sys.exit(EXIT_INTERRUPTED)


@main.command(short_help="Architecture, sizes, quant mix and cache plan of a model.")
@_model_args
@click.option("--expert-cache", default=None, metavar="SIZE",
              help="Also show the slots of this expert cache and the prompt chunk a load with it takes "
                   "(as --expert-cache of generate).")
@click.option("--prefill", default=None, metavar="N|auto[:MAX]",
              help=f"With --expert-cache: the --prefill of that load.  [default: {LOAD['prefill']}, stepping down "
                   "when the cache is too small for it]")
@click.option("-c", "--ctx", type=click.IntRange(min=1), default=LOAD["ctx"], show_default=True,
              help="With --expert-cache: the --ctx of that load (a chunk is at most ctx tokens).")
@click.option("--moe-layout", type=click.Choice(["auto", "mmq", "fused"]), default=LOAD["moe_layout"],
              show_default=True, help="With --expert-cache: the --moe-layout of that load (its chunk's buffers).")
@_device_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def info(model: str | None, model_opt: str | None, expert_cache: str | None, prefill: str | None, ctx: int,
         moe_layout: str, device: str, as_json: bool) -> None:
    """Architecture, shapes, parameters, quant mix and memory of MODEL (a GGUF file), from its header
    alone: nothing is loaded. With --expert-cache, the slots and the prompt chunk that a load with the
    same --expert-cache, --prefill, --ctx and --moe-layout takes, or the error it stops with."""
    path = _model_path(model, model_opt)
    if expert_cache is not None:
        try:
            parse_expert_cache(expert_cache)
            parse_prefill(prefill)
        except strata.Error as e:
            _fail(e)
    m = _info(path, moe_layout=moe_layout)
    s = m.spec
    mix: Counter[tuple[str, str]] = Counter()
    mix_bytes: Counter[tuple[str, str]] = Counter()
    for t in m.tensors:
        role = "experts" if "_exps.weight" in t["name"] else "dense"  # gpt-oss's expert biases are resident
        mix[(role, t["type_name"])] += 1
        mix_bytes[(role, t["type_name"])] += t["nbytes"]
    out: dict[str, Any] = dict(s)
    out["file"] = path
    out["file_bytes"] = m.file_size
    out["bytes_per_expert"] = s["expert_bytes"] // (s["layers"] * s["experts"])
    out["quant_mix"] = [{"role": r, "type": ty, "tensors": n, "bytes": mix_bytes[(r, ty)]}
                        for (r, ty), n in sorted(mix.items())]
    if expert_cache is not None:
        try:
            out["cache"] = m.load_plan(expert_cache=expert_cache, prefill=prefill, ctx=ctx, device=device)
        except strata.Error as e:
            _fail(e)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    rows = [
        ("architecture", f"{s['arch']} ({s['name']})" if s["name"] else s["arch"]),
        ("layers / hidden / vocab", f"{s['layers']} / {s['hidden']} / {s['vocab']}"),
        ("attention", f"{s['heads']} heads, {s['kv_heads']} kv heads, head_dim {s['head_dim']}"),
        *[(k, v) for k, v in s.get("details", [])],
        ("experts", f"{s['experts']} per layer, top-{s['top_k']}, ffn {s['expert_ffn']}"),
        ("trained context", f"{s['ctx_train']} tokens"),
        ("parameters", f"{s['params_total'] / 1e9:.3f} B total, {s['params_active'] / 1e9:.3f} B active per token"),
        ("dense weights", _fmt_bytes(s["dense_bytes"])),
        ("experts", f"{_fmt_bytes(s['expert_bytes'])} ({out['bytes_per_expert'] / MiB:.2f} MiB per expert, "
                    f"slot {s['slot_bytes'] / MiB:.2f} MiB)"),
    ]
    for q in out["quant_mix"]:
        rows.append((f"quant {q['role']}", f"{q['type']}: {q['tensors']} tensors, {_fmt_bytes(q['bytes'])}"))
    if "cache" in out:
        c = out["cache"]
        load = f"--prefill {prefill or str(LOAD['prefill']) + ' (default)'} --ctx {ctx}"
        rows.append((f"KV cache (--ctx {ctx})", f"{_fmt_bytes(c['kv_bytes'])} ({c['kv_type']})"))
        if c["all_resident"]:
            rows.append(("expert cache", f"all experts resident (nothing streams) on {c['device']}"))
            rows.append((load, f"chunks of {c['chunk']} tokens, on their own scratch"))
        else:
            rows.append(("expert cache", f"{c['cache_bytes'] / MiB:.2f} MiB = {c['slots']} slots of "
                                         f"{c['slot_bytes']} bytes"))
            rows.append((load, f"chunks of {c['chunk']} tokens, each borrowing {c['borrows']} slots"
                         if c["fits"] else f"the load stops: {c['error']}"))
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        click.echo(f"{k:<{w}}  {v}")


@main.command(short_help="The scratch buffers of one prompt chunk and the slots it borrows.")
@_model_args
@click.option("--tokens", type=click.IntRange(min=1), default=LOAD["prefill"], show_default=True,
              help="Tokens in the chunk (T).")
@click.option("--no-source", is_flag=True, help="Plan for an all-resident cache (no ExpertSource streams experts).")
@click.option("--unfused", is_flag=True, help="Plan with the GR read unfused (xn carved), as STRATA_GR_UNFUSED=1.")
@click.option("--moe-layout", type=click.Choice(["auto", "mmq", "fused"]), default=LOAD["moe_layout"],
              show_default=True, help="Plan a streamed chunk as generate's --moe-layout runs it (fused: the fused "
                                      "layout's buffers; auto, mmq: the MMQ layout's, as with no source).")
@click.option("--expert-cache", default=None, metavar="SIZE",
              help="Also show how many slots of a cache this size (MiB or units, as generate's) the chunk borrows.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON instead of a table.")
def layout(model: str | None, model_opt: str | None, tokens: int, no_source: bool, unfused: bool, moe_layout: str,
           expert_cache: str | None, as_json: bool) -> None:
    """Every buffer of one prompt chunk's scratch in MODEL (a GGUF file): name, dtype, shape, offset
    and bytes; bytes_needed, and the slots of the expert cache the chunk borrows."""
    path = _model_path(model, model_opt)
    m = _info(path, gr_unfused=True if unfused else None, moe_layout=moe_layout)
    try:
        lay = m.layout(tokens=tokens, source=not no_source)
        n = m.cache_slots(expert_cache) if expert_cache is not None else None
    except strata.Error as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(lay, indent=2))
        return
    click.echo(f"T={lay['tokens']}  layout={lay['kind']}  source={'yes' if lay['source'] else 'no'}  "
               f"GR={'unfused' if any(b['name'] == 'xn' for b in lay['buffers']) else 'fused'}")
    click.echo(f"{'buffer':<16} {'dtype':<6} {'shape':<24} {'offset':>14} {'bytes':>14}")
    for b in lay["buffers"]:
        shape = "x".join(str(d) for d in b["shape"])
        click.echo(f"{b['name']:<16} {b['dtype']:<6} {shape:<24} {b['offset']:>14} {b['bytes']:>14}")
    click.echo(f"bytes_needed {lay['bytes_needed']} ({_fmt_bytes(lay['bytes_needed'])}); slot {lay['slot_bytes']} "
               f"bytes; the chunk borrows {lay['slots']} slots")
    if n is not None:
        left = n - lay["slots"]
        click.echo(f"--expert-cache {expert_cache}: {n} slots; the chunk borrows {lay['slots']}, "
                   + (f"leaving {left} for experts" if left > 0 else "more than the cache has"))


def _check_out_file(path: str, flag: str) -> None:
    """A file we will write after a long run: its folder must exist and be writable now."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        _fail(f"{flag} '{path}' is a folder: give a file name")
    if not os.path.isdir(folder):
        _fail(f"{flag} '{path}': the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        _fail(f"{flag} '{path}': the folder {folder} is not writable")


@main.command(short_help="Time a prompt and a greedy decode; print a table.")
@_model_args
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Prompt length in tokens (random token ids).")
@click.option("--gen-tokens", type=click.IntRange(min=0), default=32, show_default=True,
              help="Tokens to decode (greedy).")
@_load_options(ctx_default=None)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the random prompt's token ids.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Also write the results to this JSON file.")
def bench(model: str | None, model_opt: str | None, prompt_tokens: int, gen_tokens: int, device: str,
          kv_type: str,
          expert_cache: str, prefill: str, source: str, cache_policy: str, prefetch: str, moe_layout: str,
          cpu_experts: int,
          threads: int, quiet: bool, seed: int,
          json_out: str | None) -> None:
    """Time a prompt of random tokens and a greedy decode with MODEL (a GGUF file); print a table
    (and JSON with --json). The context is the prompt plus the decode."""
    import numpy as np

    path = _model_path(model, model_opt)
    if json_out:
        _check_out_file(json_out, "--json")
    t0 = time.monotonic()
    m = _load(path, quiet, device=device, kv_type=kv_type, expert_cache=expert_cache, prefill=prefill, source=source,
              cache_policy=cache_policy, prefetch=parse_prefetch(prefetch), moe_layout=moe_layout,
              cpu_experts=cpu_experts,
              ctx=prompt_tokens + gen_tokens + 1, threads=threads)
    load_s = time.monotonic() - t0
    specials = sorted(m.tokenizer.special_ids)
    hi = specials[0] if specials and specials[0] > 0 else m.spec["vocab"]
    ids = np.random.default_rng(seed).integers(0, hi, size=prompt_tokens).tolist()
    m.reset_stats()
    try:
        out = m.generate(ids, max_tokens=gen_tokens, temperature=0.0)
    except KeyboardInterrupt:
        click.echo(_interrupted_note(m.last_stats) + "; no results", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except strata.Error as e:
        _fail(e)
    st = out.stats
    res = {
        "model": path, "device": m.device, "device_describe": st["device"], "threads": m.threads, "load_s": load_s,
        "prompt_tokens": st["prompt_tokens"], "prompt_tps": st["prompt_tps"], "generated": st["generated"],
        "decode_tps": st["decode_tps"], "stop_reason": st["stop_reason"], "decode_path": st["decode_path"],
        "decode_hits": st["decode_hits"], "decode_misses": st["decode_misses"], "decode_bytes": st["decode_bytes"],
        "decode_link_gbps": st["decode_bytes"] / 1e6 / st["decode_ms"] if st["decode_ms"] > 0 else 0.0,
        **{k: v for k, v in st.items() if k.startswith("cache_")},
    }
    rows = [
        ("model", f"{os.path.basename(path)}: {m.spec['arch']}, {m.spec['params_total'] / 1e9:.2f} B total, "
                  f"{m.spec['params_active'] / 1e9:.2f} B active"),
        ("device", st["device"]),
        ("load", f"{load_s:.2f} s"),
        ("prompt", f"{st['prompt_tokens']} tokens, {st['prompt_tps']:.1f} tok/s ({st['prompt_chunks']} chunks of up "
                   f"to {st['prompt_chunk']})"),
        ("decode", f"{st['generated']} tokens, {st['decode_tps']:.2f} tok/s (stop: {st['stop_reason']}; "
                   f"{st['decode_path']})"),
        ("experts", f"source {st['cache_source']}, hits {st['cache_hits']}, misses {st['cache_misses']}, "
                    f"streamed {_fmt_bytes(st['cache_bytes_streamed'])}"),
        ("stream", f"decode: {_decode_stream(st)}"),
    ]
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        click.echo(f"{k:<{w}}  {v}")
    if json_out:
        try:
            with open(json_out, "w") as f:
                json.dump(res, f, indent=2)
        except OSError as e:
            _fail(f"--json '{json_out}': {e.strerror}; the results are in the table above")


@main.command(short_help="Build a small synthetic model and generate with it.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=0), default=48, show_default=True,
              help="Tokens to generate.")
@click.option("--prompt", default="Experts stream into a cache of slots; the prompt borrows some of them.",
              show_default=True, help="The prompt text.")
@click.option("--keep", type=click.Path(file_okay=False), default=None, metavar="FOLDER",
              help="Write the model into this folder (made if missing) and keep it; else a temp folder, removed.")
def demo(max_tokens: int, prompt: str, keep: str | None) -> None:
    """Build a synthetic Qwen3-MoE GGUF and generate with a small expert cache.

    The model has random weights and a real tokenizer; its experts are streamed through a cache
    smaller than they are, so the stats show hits, misses and bytes streamed."""
    if keep:
        try:
            os.makedirs(keep, exist_ok=True)
        except OSError as e:
            _fail(f"--keep '{keep}': cannot make the folder: {e.strerror}")
        _check_out_file(os.path.join(keep, "demo-qwen3moe.gguf"), "--keep")
        _demo(keep, max_tokens, prompt)
        return
    d = tempfile.mkdtemp(prefix="strata-demo-")
    try:
        _demo(d, max_tokens, prompt)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _demo(d: str, max_tokens: int, prompt: str) -> None:
    from strata.testing import make_qwen3moe

    path = os.path.join(d, "demo-qwen3moe.gguf")
    t0 = time.monotonic()
    make_qwen3moe(path, layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=16, top_k=4,
                  expert_ffn=256, vocab=1024, quant={"experts": "Q4_K", "attn": "Q8_0", "embed": "Q8_0",
                                                     "output": "Q8_0"}, seed=1)
    click.echo(f"built {path} ({os.path.getsize(path) / MiB:.1f} MiB) in {time.monotonic() - t0:.1f} s")
    probe = strata.ModelInfo(path)
    experts = probe.spec["expert_bytes"]
    slot = probe.slot_bytes
    cache = max(experts * 2 // 5, slot * 24)
    click.echo(f"experts {experts / MiB:.2f} MiB in {probe.spec['layers'] * probe.spec['experts']} experts; "
               f"expert cache {cache / MiB:.2f} MiB ({cache // slot} slots)")
    # Chunks of 8 tokens: every chunk after the first lends slots that hold experts, so the stats
    # show evictions by the lend and the refills when the chunk gives its slots back.
    m = strata.Model(path, expert_cache=f"{cache}b", prefill=8, source="host", ctx=512)
    click.echo(f"prompt: {prompt!r} (random weights: expect noise, not prose)")
    try:
        for piece in m.generate(prompt, max_tokens=max_tokens, temperature=0.7, seed=7, stream=True):
            click.echo(piece, nl=False)
    except KeyboardInterrupt:
        click.echo()
        click.echo(_interrupted_note(m.last_stats), err=True)
        sys.exit(EXIT_INTERRUPTED)
    except strata.Error as e:
        _fail(e)
    click.echo()
    _print_stats(m.last_stats, err=False)


if __name__ == "__main__":
    main()
