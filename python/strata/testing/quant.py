"""GGUF tensor data for synthetic models: real quantization where gguf can, random valid blocks elsewhere."""

from __future__ import annotations

from functools import cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq

QTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_K", "Q6_K", "IQ2_XS", "Q2_K", "IQ2_XXS", "Q5_K", "Q3_K", "IQ4_XS",
          "MXFP4", "Q5_0", "Q4_0", "Q4_1", "Q5_1", "IQ4_NL", "IQ3_XXS", "IQ3_S", "IQ2_S", "IQ1_S", "IQ1_M")
"""Type names `encode` and `random_blocks` accept."""

# gguf.quants.quantize supports these
_QUANTIZABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4")


def qtype_of(name: str) -> GGMLQuantizationType:
    """The GGML type for a name in QTYPES; ValueError for any other."""
    if name not in QTYPES:
        raise ValueError(f"unsupported quant type {name!r}; supported: {', '.join(QTYPES)}")
    return GGMLQuantizationType[name]


def block_size(name: str) -> int:
    """Elements per block of type `name` (1 for float types)."""
    return GGML_QUANT_SIZES[qtype_of(name)][0]


def row_bytes(name: str, n: int) -> int:
    """Bytes of one row of `n` elements of type `name`; ValueError if `n` is not a whole number of blocks."""
    bs, ts = GGML_QUANT_SIZES[qtype_of(name)]
    if n % bs:
        raise ValueError(f"{name} needs rows that are a multiple of {bs} elements, got {n}")
    return n // bs * ts


def encode(array: np.ndarray, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """`array` [..., n] as GGUF data of `qtype`: uint8 [..., row_bytes(qtype, n)].

    F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and MXFP4 are real encodings of `array`
    (gguf.quants.quantize). gguf cannot quantize the K and IQ types: for those the blocks are random
    (`random_blocks`), only their scale follows the input's standard deviation.
    """
    array = np.asarray(array, dtype=np.float32)
    row_bytes(qtype, array.shape[-1])  # rejects unknown types and partial blocks
    if qtype in _QUANTIZABLE:
        return np.ascontiguousarray(gq.quantize(array, qtype_of(qtype))).view(np.uint8)
    return random_blocks(qtype, array.shape, float(array.std()), rng)


def random_blocks(qtype: str, shape: tuple[int, ...], scale: float, rng: np.random.Generator) -> np.ndarray:
    """Random valid data of `qtype` for a tensor of `shape` [..., n] whose dequantized values have
    standard deviation about `scale` and mean about 0: uint8 [..., row_bytes(qtype, n)].

    Float types are normal samples. Quantized blocks have uniformly random quants (and sub-block
    scales, for the K and IQ types) under one f16 super-scale per call chosen for `scale` (of random
    sign per block where the quants' mean is not zero; MXFP4: one of the two powers of two around it,
    drawn per block so the mean square is right), so `scale` must be nonzero. Vectorized: several
    hundred MB/s per core.
    """
    shape = tuple(int(s) for s in shape)
    rb = row_bytes(qtype, shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if qtype in ("F32", "F16", "BF16"):
        x = rng.standard_normal((rows, shape[-1]), dtype=np.float32)
        x *= np.float32(scale)
        out = gq.quantize(x, qtype_of(qtype)).view(np.uint8)
    else:
        n_blocks = rows * shape[-1] // block_size(qtype)
        out = _blocks(qtype, n_blocks, scale / _unit_std(qtype), rng)
    return out.reshape(*shape[:-1], rb)


def _raw_bytes(n: int, rng: np.random.Generator) -> np.ndarray:
    # random_raw is ~10x faster than Generator.bytes or integers(dtype=uint8)
    return rng.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n]


def _field(b: np.ndarray, offset: int, fmt: str) -> np.ndarray:
    """Writable view of one field at byte `offset` of every block (row) of `b`."""
    dt = np.dtype({"names": ["f"], "formats": [fmt], "offsets": [offset], "itemsize": b.shape[1]})
    return b.view(dt)[:, 0]["f"]


def _f16(value: float) -> np.float16:
    d = np.float16(value)
    if not np.isfinite(d) or d == 0:
        raise ValueError(f"scale {value!r} is not representable as a nonzero f16 block scale")
    return d


@cache
def _q4_k_scales() -> np.ndarray:
    """65536 random packed Q4_K scale fields (12 B each, as V12), with min == scale in every sub-block."""
    sc = np.random.default_rng(0).integers(0, 64, (1 << 16, 8), dtype=np.uint8)
    lo, hi = sc[:, :4], sc[:, 4:]
    packed = lo | ((hi >> 4) << 6)  # low 6 bits of sub-blocks 0-3, top 2 bits of sub-blocks 4-7
    low4 = hi & 0x0F
    return np.concatenate([packed, packed, low4 | (low4 << 4)], axis=1).view("V12")[:, 0]


def _blocks(qtype: str, n_blocks: int, d: float, rng: np.random.Generator) -> np.ndarray:
    """`n_blocks` random blocks of `qtype` with super-scale `d`, as uint8 [n_blocks, type_size]."""
    ts = GGML_QUANT_SIZES[qtype_of(qtype)][1]
    b = _raw_bytes(n_blocks * ts, rng).reshape(n_blocks, ts)
    if qtype in ("Q8_0", "IQ2_XS", "IQ2_XXS"):
        # Q8_0: f16 d, 32 x int8. IQ2_XS: f16 d, 32 x uint16 (9-bit grid, 7-bit sign index), 8 B 4-bit scales.
        # IQ2_XXS: f16 d, per 32 elements a word of four grid indices and one of signs and a 4-bit scale.
        _field(b, 0, "<f2")[:] = _f16(d)
    elif qtype == "Q2_K":
        # 16 B of 4-bit scales | mins, 64 B of 2-bit quants, f16 d, f16 dmin. dmin = 1.5 d makes the
        # mean d*sc*1.5 - 1.5*d*m zero in expectation (scales and mins are independent and alike).
        _field(b, 80, "<f2")[:] = _f16(d)
        _field(b, 82, "<f2")[:] = _f16(1.5 * d)
    elif qtype == "Q4_K":
        # f16 d, f16 dmin, 12 B of 6-bit scales and mins, 128 B of 4-bit quants. min == scale and
        # dmin = 7.5 d make every value d*sc*(q - 7.5): mean 0. 16 random bits pick the scale field.
        _field(b, 0, "<f2")[:] = _f16(d)
        _field(b, 2, "<f2")[:] = _f16(7.5 * d)
        _field(b, 4, "V12")[:] = _q4_k_scales()[_field(b, 4, "<u2")]
    elif qtype == "Q6_K":  # 128 B ql, 64 B qh, 16 x int8 scales, f16 d
        _field(b, 208, "<f2")[:] = _f16(d)
    elif qtype == "Q5_K":
        # As Q4_K, with 32 B of fifth bits before the quants: q in [0, 31], so dmin = 15.5 d.
        _field(b, 0, "<f2")[:] = _f16(d)
        _field(b, 2, "<f2")[:] = _f16(15.5 * d)
        _field(b, 4, "V12")[:] = _q4_k_scales()[_field(b, 4, "<u2")]
    elif qtype == "Q3_K":  # 32 B high bits, 64 B 2-bit quants, 12 B 6-bit scales (minus 32), f16 d
        _field(b, 108, "<f2")[:] = _f16(d)
    elif qtype in ("IQ4_XS", "Q5_0", "Q4_0", "IQ4_NL"):
        # f16 d first. Q4_0, Q5_0 (q - 8, q - 16) and IQ4_NL's codebook have a nonzero mean: d's sign
        # is random per block. IQ4_XS's 6-bit scales minus 32 are already of either sign.
        sign = np.where(_raw_bytes(n_blocks, rng) & 1, 1.0, -1.0) if qtype != "IQ4_XS" else 1.0
        _field(b, 0, "<f2")[:] = (_f16(d) * sign).astype(np.float16)
    elif qtype in ("IQ3_XXS", "IQ3_S", "IQ2_S", "IQ1_S"):  # f16 d first; grid values with random signs
        _field(b, 0, "<f2")[:] = _f16(d)
    elif qtype == "IQ1_M":  # the f16 d in the top nibbles of the four 16-bit words at bytes 48-55
        bits = int(np.array(_f16(d)).view(np.uint16))
        w = b[:, 48:56].copy().view("<u2")
        for i in range(4):
            w[:, i] = (w[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
        b[:, 48:56] = w.view(np.uint8)
    elif qtype in ("Q4_1", "Q5_1"):  # f16 d, f16 m, (4 B fifth bits,) 16 B quants: m = -(mean q) d
        _field(b, 0, "<f2")[:] = _f16(d)
        _field(b, 2, "<f2")[:] = _f16(-(7.5 if qtype == "Q4_1" else 15.5) * d)
    elif qtype == "MXFP4":  # E8M0 byte e (the scale is 2^(e - 128)), 16 B of e2m1 codes
        t = np.log2(d)
        lo = np.floor(t)
        if not 1 <= 128 + lo <= 253:
            raise ValueError(f"scale {d!r} is out of MXFP4's E8M0 range")
        p_lo = (4.0 ** (lo + 1) - 4.0**t) / (4.0 ** (lo + 1) - 4.0**lo)  # mean square 4^t over the blocks
        up = rng.random(n_blocks) >= p_lo
        b[:, 0] = (128 + lo + up).astype(np.uint8)
    else:
        raise ValueError(f"no random block generator for {qtype}")
    return b


@cache
def _unit_std(qtype: str) -> float:
    """Standard deviation of `_blocks(qtype, ..., d=1)` dequantized by gguf's reference code."""
    n_blocks = (1 << 16) // block_size(qtype)  # 64K values
    blocks = _blocks(qtype, n_blocks, 1.0, np.random.default_rng(0))
    return float(gq.dequantize(blocks, qtype_of(qtype)).std())
