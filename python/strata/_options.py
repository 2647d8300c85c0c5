"""The edge: the user-facing size and chunk options (--expert-cache, --prefill) and the only reads
of the environment (STRATA_THREADS, STRATA_GR_UNFUSED, STRATA_LOG); nothing below this reads it."""

from __future__ import annotations

import os
import re

from strata._core import ConfigError

_UNITS = {"": 2**20, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_expert_cache(value: str | float | None) -> str | int:
    """'all', 'auto', or a byte count from MiB ('14900') or units ('14.5GiB', '900MiB')."""
    if value is None:
        return "auto"
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


def parse_prefill(value: str | int | None) -> tuple[str, int]:
    """('fixed', N) for 'N', ('auto', MAX) for 'auto' or 'auto:MAX'."""
    if value is None:
        return ("fixed", 8192)
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    else:
        text = str(value).strip().lower()
    m = re.fullmatch(r"auto(?::([0-9]+))?", text)
    if m:
        mx = int(m.group(1)) if m.group(1) else 32768
        if mx < 1:
            raise ConfigError(f"--prefill auto:MAX needs MAX >= 1, got '{value}'")
        return ("auto", mx)
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--prefill '{value}' must be a token count >= 1 ('8192') or 'auto[:MAX]'")
    return ("fixed", int(text))


def threads_from_env(threads: int) -> int:
    """`threads`, or when 0 STRATA_THREADS, or 0 (every core)."""
    if threads:
        return int(threads)
    text = os.environ.get("STRATA_THREADS", "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ConfigError(f"STRATA_THREADS='{text}' must be a thread count (0: every core)")
    return int(text)


def gr_unfused_from_env(gr_unfused: bool | None) -> bool:
    """`gr_unfused`, or when None whether STRATA_GR_UNFUSED is set to anything but '' or '0'."""
    if gr_unfused is not None:
        return bool(gr_unfused)
    return os.environ.get("STRATA_GR_UNFUSED", "") not in ("", "0")


def log_level_from_env() -> str:
    """STRATA_LOG: error, warn (the default), info or debug."""
    return os.environ.get("STRATA_LOG", "warn")
