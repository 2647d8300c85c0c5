"""strata.ModelInfo and strata.inspect: what a GGUF file's header tells, with no weight loaded."""

from __future__ import annotations

import os
from typing import Any

from strata import _core
from strata._options import LOAD_DEFAULTS, gr_unfused_from_env, load_config, parse_expert_cache


def _open(path: str | os.PathLike) -> _core.GGUFFile:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path} (give the path of a GGUF file)")
    return _core.GGUFFile(path)


def inspect(path: str | os.PathLike) -> dict[str, Any]:
    """Metadata and tensor table of a GGUF file (validated; raises strata.FormatError)."""
    f = _core.GGUFFile(os.fspath(path))
    return {
        "path": f.path,
        "version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "file_size": f.file_size,
        "metadata": f.metadata,
        "tensors": f.tensors,
    }


class ModelInfo:
    """The spec, tensor table and prompt-chunk plan of a GGUF model, read from its header alone.

    Nothing is loaded: no weight is read and no expert copied, so this is cheap for any model size.
    gr_unfused: plan with the normalized input xn carved (None: from STRATA_GR_UNFUSED). moe_layout: plan a
    streamed prompt as strata.Model(moe_layout=...) runs it ('auto' and 'mmq': MMQ, 'fused': fused).
    `strata.Model(...).info` is the same object for a loaded model.
    """

    def __init__(self, path: str | os.PathLike, gr_unfused: bool | None = None, moe_layout: str = "auto") -> None:
        if moe_layout not in ("auto", "mmq", "fused"):
            raise _core.ConfigError(f"moe_layout must be 'auto', 'mmq' or 'fused', got {moe_layout!r}")
        f = _open(path)
        self._init(f, _core.ModelPlan(f, gr_unfused_from_env(gr_unfused), moe_layout == "fused"))

    @classmethod
    def _of(cls, file: _core.GGUFFile, plan: _core.ModelPlan) -> ModelInfo:
        info = cls.__new__(cls)
        info._init(file, plan)
        return info

    def _init(self, file: _core.GGUFFile, plan: _core.ModelPlan) -> None:
        self._file = file
        self._plan = plan
        self.spec: dict[str, Any] = plan.spec
        self._metadata: dict[str, Any] | None = None
        self._tensors: list[dict[str, Any]] | None = None

    @property
    def path(self) -> str:
        return self._file.path

    @property
    def file_size(self) -> int:
        return self._file.file_size

    @property
    def metadata(self) -> dict[str, Any]:
        """GGUF metadata, key -> int/float/bool/str/list."""
        if self._metadata is None:
            self._metadata = self._file.metadata
        return self._metadata

    @property
    def tensors(self) -> list[dict[str, Any]]:
        """The tensor table: name, type, type_name, shape (ggml order), offset, nbytes."""
        if self._tensors is None:
            self._tensors = self._file.tensors
        return self._tensors

    @property
    def slot_bytes(self) -> int:
        """Bytes of one expert-cache slot: the largest expert of the model, aligned."""
        return self._plan.slot_bytes

    @property
    def gr_unfused(self) -> bool:
        return self._plan.gr_unfused

    def layout(self, tokens: int = LOAD_DEFAULTS["prefill"], source: bool = True) -> dict[str, Any]:
        """The prompt scratch plan for a chunk of `tokens`: bytes_needed, kind, buffers, slots.

        source: plan for experts streamed from an ExpertSource (False: every expert resident).
        """
        d = self._plan.layout(int(tokens), bool(source))
        d["slot_bytes"] = self.slot_bytes
        d["slots"] = -(-d["bytes_needed"] // self.slot_bytes)  # the region rounded up to whole slots
        return d

    def cache_slots(self, expert_cache: str | float) -> int:
        """Slots an expert cache of this size holds (a size as --expert-cache takes it, not all/auto)."""
        size = parse_expert_cache(expert_cache)
        if not isinstance(size, int):
            raise _core.ConfigError(
                f"--expert-cache '{expert_cache}' is not a size here: give one (e.g. 14900 or 14.5GiB)"
            )
        return size // self.slot_bytes  # as the cache sizes its pool

    def plan_chunk(self, expert_cache: str | float, max_tokens: int, auto: bool = True) -> dict[str, Any]:
        """The chunk --prefill auto:MAX (or a fixed MAX when not auto) takes with a cache of that size:
        chunk, slots (borrowed), needs, fits, error (the cause and a cache that works), cache_bytes,
        cache_slots."""
        n = self.cache_slots(expert_cache)
        size = parse_expert_cache(expert_cache)
        d = self._plan.plan_chunk(n, size, int(max_tokens), bool(auto))
        d["cache_bytes"] = size
        d["cache_slots"] = n
        return d

    def load_plan(self, expert_cache: str | float | None = LOAD_DEFAULTS["expert_cache"],
                  prefill: str | int | None = None, ctx: int = LOAD_DEFAULTS["ctx"],
                  device: str = LOAD_DEFAULTS["device"], kv_type: str = LOAD_DEFAULTS["kv_type"],
                  backend: _core.Backend | None = None) -> dict[str, Any]:
        """What strata.Model(path, expert_cache=, prefill=, ctx=, device=, kv_type=) takes, as the native
        load decides it (auto against the device's free memory): all_resident, cache_bytes, slots,
        slot_bytes, chunk, borrows (slots the chunk borrows), needs, fits, kv_type, kv_bytes (the KV cache),
        and error (the
        MemoryError the load stops with, '' when it fits)."""
        cfg = load_config(device=device, expert_cache=expert_cache, prefill=prefill, ctx=ctx, kv_type=kv_type,
                          gr_unfused=self.gr_unfused)
        be = backend if backend is not None else _core.Backend(cfg.device, cfg.threads)
        p = self._plan.plan_load(cfg, be)
        return {"device": be.name, "kv_type": p["kv_type"], "kv_bytes": p["kv_bytes"],
                "all_resident": p["all_resident"],
                "cache_bytes": p["cache_bytes"], "slot_bytes": self.slot_bytes, "slots": p["cache_slots"],
                "chunk": p["chunk"], "borrows": p["slots"], "needs": p["needs"], "fits": p["fits"],
                "error": p["error"]}
