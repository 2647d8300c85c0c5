"""A GGUF file as an editable structure, for hostile-file tests and fuzzing.

`Gguf.parse` reads any well-formed file (v2/v3) into header counts, metadata, tensor infos and the
data section; every field can then be set to any value (a count that lies, a key that is not UTF-8,
an integer of the wrong type or out of range, a dimension past 2^61) and `serialize` writes the
bytes exactly as told, checking nothing.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
INT_TYPES = (U8, I8, U16, I16, U32, I32, U64, I64)
SIGNED = (I8, I16, I32, I64)
WIDTH = {U8: 1, I8: 1, U16: 2, I16: 2, U32: 4, I32: 4, F32: 4, BOOL: 1, U64: 8, I64: 8, F64: 8}


@dataclass
class Value:
    """A metadata value: `value` is an int, float, bytes (STRING) or, for ARRAY, a list of element values."""

    type: int
    value: Any
    elem_type: int = U8

    def encode(self) -> bytes:
        out = struct.pack("<I", self.type & 0xFFFFFFFF)
        if self.type == ARRAY:
            out += struct.pack("<IQ", self.elem_type & 0xFFFFFFFF, len(self.value))
            return out + b"".join(_scalar(self.elem_type, v) for v in self.value)
        return out + _scalar(self.type, self.value)


@dataclass
class TensorInfo:
    name: bytes
    ne: list[int]  # ggml order; written as u64 bit patterns
    type: int
    offset: int  # relative to the data section


@dataclass
class Gguf:
    version: int = 3
    metadata: list[tuple[bytes, Value]] = field(default_factory=list)
    tensors: list[TensorInfo] = field(default_factory=list)
    data: bytes = b""  # the data section: from the aligned end of the header to the end of the file
    n_kv: int | None = None  # header counts to write instead of the real ones (None: the real ones)
    n_tensors: int | None = None
    padding: int | None = None  # alignment of the data section when written (None: general.alignment or 32)

    @classmethod
    def parse(cls, raw: bytes) -> Gguf:
        """The structure of a well-formed GGUF; ValueError for anything else."""
        r = _Reader(raw)
        if r.take(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        g = cls(version=r.u(4))
        n_tensors, n_kv = r.u(8), r.u(8)
        if n_kv > len(raw) or n_tensors > len(raw):
            raise ValueError("impossible counts")
        for _ in range(n_kv):
            key = r.string()
            t = r.u(4)
            if t == ARRAY:
                et, n = r.u(4), r.u(8)
                if et in (ARRAY,) or et > F64 or n > len(raw):
                    raise ValueError("bad array")
                g.metadata.append((key, Value(ARRAY, [r.scalar(et) for _ in range(n)], et)))
            elif t <= F64:
                g.metadata.append((key, Value(t, r.scalar(t))))
            else:
                raise ValueError("bad value type")
        for _ in range(n_tensors):
            name = r.string()
            nd = r.u(4)
            if nd > 8:
                raise ValueError("bad n_dims")
            ne = [r.u(8) for _ in range(nd)]
            g.tensors.append(TensorInfo(name, ne, r.u(4), r.u(8)))
        align = g.alignment()
        start = (r.pos + align - 1) // align * align
        g.data = raw[start:]
        return g

    def alignment(self) -> int:
        """The padding the data section gets: `padding`, else a valid general.alignment, else 32."""
        if self.padding:
            return self.padding
        v = self.get(b"general.alignment")
        ok = v is not None and v.type == U32 and isinstance(v.value, int) and 0 < v.value < 2**32
        return v.value if ok and v.value & (v.value - 1) == 0 else 32

    def serialize(self) -> bytes:
        out = bytearray(b"GGUF")
        n_kv = len(self.metadata) if self.n_kv is None else self.n_kv
        n_t = len(self.tensors) if self.n_tensors is None else self.n_tensors
        out += struct.pack("<IQQ", self.version & 0xFFFFFFFF, n_t & _U64, n_kv & _U64)
        for key, v in self.metadata:
            out += _string(key) + v.encode()
        for t in self.tensors:
            out += _string(t.name) + struct.pack("<I", len(t.ne))
            out += b"".join(struct.pack("<Q", d & _U64) for d in t.ne)
            out += struct.pack("<IQ", t.type & 0xFFFFFFFF, t.offset & _U64)
        align = self.alignment()
        out += b"\0" * (-len(out) % align)
        return bytes(out) + self.data

    # ---- editing ----
    def get(self, key: str | bytes) -> Value | None:
        k = _key(key)
        return next((v for kk, v in self.metadata if kk == k), None)

    def set(self, key: str | bytes, type: int, value: Any, elem_type: int = U8) -> Gguf:
        """Sets (or appends) `key` to a value of `type`; ints are written as their bit pattern."""
        k, v = _key(key), Value(type, value, elem_type)
        for i, (kk, _) in enumerate(self.metadata):
            if kk == k:
                self.metadata[i] = (k, v)
                return self
        self.metadata.append((k, v))
        return self

    def remove(self, key: str | bytes) -> Gguf:
        k = _key(key)
        self.metadata = [(kk, v) for kk, v in self.metadata if kk != k]
        return self

    def tensor(self, name: str | bytes) -> TensorInfo:
        n = _key(name)
        return next(t for t in self.tensors if t.name == n)


_U64 = (1 << 64) - 1


def _key(k: str | bytes) -> bytes:
    return k.encode() if isinstance(k, str) else k


def _string(b: bytes | str) -> bytes:
    b = _key(b)
    return struct.pack("<Q", len(b)) + b


def _scalar(t: int, v: Any) -> bytes:
    if t == STRING:
        return _string(v if isinstance(v, bytes | str) else str(v))
    if t in (F32, F64):
        try:
            f = float(v)
        except OverflowError:  # an int past the float range
            f = math.copysign(math.inf, v)
        with np.errstate(over="ignore"):
            return np.float32(f).tobytes() if t == F32 else struct.pack("<d", f)
    w = WIDTH.get(t)
    if w is None:  # an unknown type: its payload is whatever the caller gave as bytes
        return bytes(v) if isinstance(v, bytes | bytearray) else b""
    return (int(v) & ((1 << (8 * w)) - 1)).to_bytes(w, "little")


class _Reader:
    def __init__(self, raw: bytes) -> None:
        self.raw, self.pos = raw, 0

    def take(self, n: int) -> bytes:
        if n > len(self.raw) - self.pos:
            raise ValueError("truncated")
        b = self.raw[self.pos : self.pos + n]
        self.pos += n
        return b

    def u(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def string(self) -> bytes:
        return self.take(self.u(8))

    def scalar(self, t: int) -> Any:
        if t == STRING:
            return self.string()
        if t == F32:
            return float(np.frombuffer(self.take(4), np.float32)[0])
        if t == F64:
            return struct.unpack("<d", self.take(8))[0]
        w = WIDTH[t]
        v = self.u(w)
        return v - (1 << (8 * w)) if t in SIGNED and v >> (8 * w - 1) else v
