"""The edge: the user-facing options (--expert-cache, --prefill, numbers and seeds checked with
strata's own errors) and the only reads of the environment (STRATA_THREADS, STRATA_GR_UNFUSED,
STRATA_LOG); nothing below this reads it."""

from __future__ import annotations

import math
import operator
import os
import re
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from strata import _core
from strata._core import ConfigError


class StrataWarning(UserWarning):
    """A value strata takes but doubts: a ctx past the model's training length, more threads than
    cores, an unknown STRATA_LOG. The CLI prints each as one line."""


def warn(message: str) -> None:
    warnings.warn(message, StrataWarning, stacklevel=3)


def as_int(value: object, name: str, lo: int | None = None, hi: int | None = None, hint: str = "") -> int:
    """`value` as an int in [lo, hi], else ConfigError naming `name` (e.g. 'ctx (--ctx)') and `hint`."""
    what = f"{name} must be an integer" + (f" >= {lo}" if lo is not None and hi is None else "")
    if lo is not None and hi is not None:
        what += f" in [{lo}, {hi}]"
    what += f" ({hint})" if hint else ""
    if isinstance(value, bool):
        raise ConfigError(f"{what}, got {value!r}")
    try:
        n = operator.index(value)  # ints and numpy integers, never floats or strings
    except TypeError:
        raise ConfigError(f"{what}, got {value!r}") from None
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise ConfigError(f"{what}, got {n}")
    return int(n)


def as_float(value: object, name: str, hint: str = "") -> float:
    """`value` as a finite float, else ConfigError naming `name`; ranges are the native check's."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x):
        raise ConfigError(f"{name} must be a number{f' ({hint})' if hint else ''}, got {value!r}")
    return x


def parse_seed(seed: object) -> int:
    """A sampling seed: None or -1 draw a random one (-1 as in llama.cpp); else 0 <= seed < 2**64."""
    if seed is None or (not isinstance(seed, bool) and isinstance(seed, (int, np.integer)) and seed == -1):
        return int(np.random.SeedSequence().entropy % 2**64)
    return as_int(seed, "seed (--seed)", 0, 2**64 - 1, "-1: random")

_UNITS = {"": 2**20, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_expert_cache(value: str | float | None) -> str | int:
    """'all', 'auto', or a byte count from MiB ('14900') or units ('14.5GiB', '900MiB')."""
    if value is None:
        return LOAD_DEFAULTS["expert_cache"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError(f"--expert-cache must be positive, got {value}")
        return int(value * 2**20)
    text = str(value).strip().lower()
    if text in ("all", "auto"):
        return text
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", text)
    if not m or m.group(2) not in _UNITS:
        raise ConfigError(
            f"--expert-cache '{value}' is not a size: use MiB ('14900'), units ('14.5GiB', '900MiB'), "
            "'all' or 'auto'"
        )
    n = int(float(m.group(1)) * _UNITS[m.group(2)])
    if n <= 0:
        raise ConfigError(f"--expert-cache must be positive, got '{value}'")
    return n


def _load_defaults() -> Mapping[str, Any]:
    c = _core.ModelConfig()
    return MappingProxyType({
        "device": c.device, "expert_cache": c.expert_cache, "prefill": c.prefill, "source": c.source,
        "ctx": c.ctx, "seqs": c.seqs, "threads": c.threads, "kv_type": c.kv_type, "decode_graph": c.decode_graph,
        "decode_resolve": c.decode_resolve, "cache_policy": c.cache_policy, "moe_layout": c.moe_layout,
        "prefetch": "auto" if c.prefetch_auto else c.prefetch, "cpu_experts": c.cpu_experts,
    })


# The native load defaults (model/model.h ModelConfig), the only ones: strata.Model, ModelInfo and
# the CLI take theirs from here. prefill: the default chunk, which steps down when the cache is too
# small for it (a --prefill N given by the user does not: it is an error naming what fits).
LOAD_DEFAULTS: Mapping[str, Any] = _load_defaults()


def parse_prefill(value: str | int | None) -> tuple[str, int]:
    """('fixed', N) for 'N', ('auto', MAX) for 'auto' or 'auto:MAX', ('default', 8192) for None:
    the native ModelConfig's prefill_mode and prefill."""
    if value is None:
        return ("default", LOAD_DEFAULTS["prefill"])
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    else:
        text = str(value).strip().lower()
    m = re.fullmatch(r"auto(?::([0-9]+))?", text)
    if m:
        mx = int(m.group(1)) if m.group(1) else _core.PREFILL_AUTO_MAX
        if mx < 1:
            raise ConfigError(f"--prefill auto:MAX needs MAX >= 1, got '{value}'")
        return ("auto", mx)
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--prefill '{value}' must be a token count >= 1 ('8192') or 'auto[:MAX]'")
    return ("fixed", int(text))


def _as_str(value: object, name: str, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be {what}, got {value!r}")
    return value


def _as_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return value


def parse_prefetch(value: str) -> bool | int | str:
    """The CLI's --prefetch: auto, on, off, or N >= 1 (strata.Model's prefetch 'auto', True, False or N)."""
    text = value.strip().lower()
    if text == "auto":
        return "auto"
    if text in ("on", "off"):
        return text == "on"
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ConfigError(f"--prefetch must be auto, on, off or a number N >= 1 (at most N of each token's guessed "
                      f"experts filled a layer, the surest first), got '{value}'")


def _prefetch(value: object) -> tuple[bool, int, bool]:
    """(prefetch, prefetch_max, prefetch_auto) of strata.Model's prefetch: 'auto', True, False, or N >= 1."""
    if value == "auto":
        return (False, 0, True)
    if isinstance(value, bool):
        return (value, 0, False)
    if isinstance(value, int) and value >= 1:
        return (True, value, False)
    raise ConfigError(f"prefetch (--prefetch) must be 'auto', True, False or a number N >= 1 (at most N of each "
                      f"token's guessed experts filled a layer, the surest first), got {value!r}")


def load_config(device: object = LOAD_DEFAULTS["device"], expert_cache: object = LOAD_DEFAULTS["expert_cache"],
                prefill: object = None, source: object = LOAD_DEFAULTS["source"], ctx: object = LOAD_DEFAULTS["ctx"],
                threads: object = LOAD_DEFAULTS["threads"], kv_type: object = LOAD_DEFAULTS["kv_type"],
                decode_graph: object = LOAD_DEFAULTS["decode_graph"],
                decode_resolve: object = LOAD_DEFAULTS["decode_resolve"],
                cache_policy: object = LOAD_DEFAULTS["cache_policy"],
                gr_unfused: bool | None = None, seqs: object = LOAD_DEFAULTS["seqs"],
                prefetch: object = LOAD_DEFAULTS["prefetch"],
                moe_layout: object = LOAD_DEFAULTS["moe_layout"],
                cpu_experts: object = LOAD_DEFAULTS["cpu_experts"]) -> _core.ModelConfig:
    """The native ModelConfig of strata.Model's keywords: user text parsed and types checked here
    (strata.ConfigError naming the argument), ranges and names checked natively (ModelConfig.check)."""
    c = _core.ModelConfig()
    c.device = _as_str(device, "device (--device)", "a name such as 'cpu' or 'cuda'")
    c.threads = threads_from_env(threads)
    c.ctx = as_int(ctx, "ctx (-c/--ctx)", None, 2**62, "KV cache length in tokens")
    c.seqs = as_int(seqs, "seqs (--parallel)", 1, 2**31 - 1,
                    "sequences decoding together, each in ctx / seqs positions")
    c.expert_cache = parse_expert_cache(expert_cache)  # type: ignore[arg-type]
    c.prefill_mode, c.prefill = parse_prefill(prefill)  # type: ignore[arg-type]
    c.source = _as_str(source, "source (--source)", "host, mmap or auto")
    c.kv_type = _as_str(kv_type, "kv_type (--kv-type)", "auto, f16 or f32")
    c.decode_graph = _as_bool(decode_graph, "decode_graph")
    c.decode_resolve = _as_str(decode_resolve, "decode_resolve", "auto, device or host")
    c.cache_policy = _as_str(cache_policy, "cache_policy (--cache-policy)", "lru, lfu or scan")
    c.moe_layout = _as_str(moe_layout, "moe_layout", "auto, mmq or fused")
    c.prefetch, c.prefetch_max, c.prefetch_auto = _prefetch(prefetch)
    c.cpu_experts = as_int(cpu_experts, "cpu_experts (--cpu-experts)", 0, 64,
                           "missed experts a layer computed on the CPU, 0: off")
    if gr_unfused is not None and not isinstance(gr_unfused, bool):
        raise ConfigError(f"gr_unfused must be True, False or None, got {gr_unfused!r}")
    c.gr_unfused = gr_unfused_from_env(gr_unfused)
    c.check()
    return c


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_from_env(threads: object) -> int:
    """`threads`, or when 0 STRATA_THREADS, or 0 (every core); warns when above the cores."""
    n = as_int(threads, "threads (-t/--threads)", 0, 2**31 - 1, "0: every core")
    source = "threads (-t/--threads)"
    if not n:
        text = os.environ.get("STRATA_THREADS", "").strip()
        if not text:
            return 0
        if not text.isdigit():
            raise ConfigError(f"STRATA_THREADS='{text}' must be a thread count (0: every core)")
        n, source = int(text), "STRATA_THREADS"
    if n > cores():
        warn(f"{source} {n} is more than the {cores()} cores this process may use: that runs slower, not "
             "faster; 0 takes every core")
    return n


def gr_unfused_from_env(gr_unfused: bool | None) -> bool:
    """`gr_unfused`, or when None whether STRATA_GR_UNFUSED is set to anything but '' or '0'."""
    if gr_unfused is not None:
        return bool(gr_unfused)
    return os.environ.get("STRATA_GR_UNFUSED", "") not in ("", "0")


LOG_LEVELS = ("error", "warn", "info", "debug")


def log_level_error() -> str | None:
    """Why STRATA_LOG is not a level, or None when it is one (or unset)."""
    text = os.environ.get("STRATA_LOG", "warn")
    if text.strip().lower() in LOG_LEVELS:
        return None
    return f"STRATA_LOG='{text}' is not a log level: use one of {', '.join(LOG_LEVELS)} (default warn)"


def log_level_from_env() -> str:
    """STRATA_LOG: error, warn (the default), info or debug; an unknown value counts as warn
    (strata.Model warns about it, the CLI refuses it)."""
    if log_level_error():
        return "warn"
    return os.environ.get("STRATA_LOG", "warn").strip().lower()
