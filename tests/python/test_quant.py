"""strata._core quant kernels against the gguf package's numpy reference: dequantization bit for
bit, matmul within float32 rounding, and the errors a caller sees."""

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as G
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

import strata
from strata import _core

# ggml type -> byte offsets of each block's fp16 fields (kept finite so no inf/nan appears).
HALF_FIELDS = {G.F16: [0], G.Q8_0: [0], G.Q4_K: [0, 2], G.Q6_K: [208], G.IQ2_XS: [0], G.Q2_K: [80, 82],
               G.IQ2_XXS: [0], G.Q5_K: [0, 2], G.Q3_K: [108], G.IQ4_XS: [0], G.MXFP4: [], G.Q5_0: [0],
               G.Q4_0: [0], G.Q4_1: [0, 2], G.Q5_1: [0, 2], G.IQ4_NL: [0], G.IQ3_XXS: [0], G.IQ3_S: [0],
               G.IQ2_S: [0], G.IQ1_S: [0], G.IQ1_M: []}
GRID_TYPES = [G.IQ3_XXS, G.IQ3_S, G.IQ2_S, G.IQ1_S, G.IQ1_M]
NEW_TYPES = [G.Q5_K, G.Q3_K, G.IQ4_XS, G.MXFP4, G.Q5_0, G.Q4_0, G.Q4_1, G.Q5_1, G.IQ4_NL, *GRID_TYPES]


def set_iq1_m_d(blocks: np.ndarray, halves: np.ndarray) -> None:
    """IQ1_M keeps its fp16 scale in the top nibbles of the four 16-bit words at bytes 48-55."""
    words = blocks[:, 48:56].copy().view("<u2")
    bits = halves.astype(np.float16).view(np.uint16).astype(np.uint16)
    for w in range(4):
        words[:, w] = (words[:, w] & 0x0FFF) | (((bits >> (4 * w)) & 0xF) << 12)
    blocks[:, 48:56] = words.view(np.uint8)


def grid_indices(qtype: G, blocks: np.ndarray) -> np.ndarray:
    """Every grid index the blocks use (ggml's layouts, independently of strata's formats.h)."""
    if qtype == G.IQ3_XXS:
        return blocks[:, 2:66].reshape(-1)
    if qtype == G.IQ3_S:
        qh = (blocks[:, 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1
        return (blocks[:, 2:66].astype(np.int64) | (qh.reshape(-1, 64).astype(np.int64) << 8)).reshape(-1)
    if qtype == G.IQ2_S:
        qh = (blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
        return (blocks[:, 2:34].astype(np.int64) | (qh.reshape(-1, 32).astype(np.int64) << 8)).reshape(-1)
    if qtype == G.IQ1_S:
        qh = blocks[:, 34:50].copy().view("<u2")
        hi = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
        return (blocks[:, 2:34].astype(np.int64) | (hi.reshape(-1, 32).astype(np.int64) << 8)).reshape(-1)
    hi = (blocks[:, 32:48, None] >> np.array([0, 4], np.uint8)) & 7  # IQ1_M
    return (blocks[:, :32].astype(np.int64) | (hi.reshape(-1, 32).astype(np.int64) << 8)).reshape(-1)
TYPES = [G.F32, G.F16, G.BF16, G.Q8_0, G.Q4_K, G.Q6_K, G.IQ2_XS, G.Q2_K, G.IQ2_XXS, *NEW_TYPES]


def random_blocks(qtype: G, n_elems: int, rng: np.random.Generator) -> np.ndarray:
    """Raw bytes of n_elems random, valid elements of qtype, as gguf would read them from a file."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = n_elems // block_size
    if qtype == G.F32:
        return rng.uniform(-1, 1, n_elems).astype(np.float32).view(np.uint8)
    if qtype == G.BF16:
        f = rng.uniform(-1, 1, n_elems).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        halves = rng.uniform(-0.05, 0.05, n_blocks).astype(np.float16)
        blocks[:, off : off + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    if qtype == G.MXFP4:  # E8M0 scales 2^-12 .. 2^-4 (the byte minus 128)
        blocks[:, 0] = rng.integers(116, 125, n_blocks)
    if qtype == G.IQ1_M:
        set_iq1_m_d(blocks, rng.uniform(-0.05, 0.05, n_blocks))
    return blocks.reshape(-1)


# Edge halves for the scale fields: zeros of both signs, the largest finite, the smallest subnormal, one.
EDGE_HALVES = np.array([0.0, -0.0, 65504.0, -65504.0, 2.0**-24, 1.0], np.float16)


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_dequantize_edges_are_bit_identical_to_gguf(qtype: G):
    """Zero and maximal scales (every fp16 field at each edge value, MXFP4 every E8M0 byte), all-zero and
    all-one bytes, and every code: random bytes over 512 blocks hold each 4-bit code and each 6-bit scale."""
    rng = np.random.default_rng(100 + int(qtype))
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = 4096 if qtype in GRID_TYPES else 512
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    blocks[0], blocks[1] = 0, 255
    for off in HALF_FIELDS[qtype] + ([-1] if qtype == G.IQ1_M else []):
        halves = EDGE_HALVES[rng.integers(0, len(EDGE_HALVES), n_blocks)]
        halves[:2] = [0.0, 65504.0]  # the all-zero block and the all-ones block at the largest scale
        if off < 0:
            set_iq1_m_d(blocks, halves)
        else:
            blocks[:, off : off + 2] = halves.view(np.uint8).reshape(-1, 2)
    if qtype == G.MXFP4:
        blocks[:256, 0] = np.arange(256)
    if qtype in GRID_TYPES:  # every grid index appears
        assert np.unique(grid_indices(qtype, blocks)).size == getattr(gguf_quants, qtype.name).grid_shape[0]
    raw = blocks.reshape(-1)
    n = n_blocks * block_size
    ours = _core.dequantize(int(qtype), raw, n)
    ref = gguf_dequantize(raw, qtype).reshape(-1).astype(np.float32, copy=False)
    assert not np.isnan(ref).any()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_quant_types_lists_the_supported_set():
    got = {name: (tid, bs, ts) for tid, name, bs, ts in _core.quant_types()}
    assert set(got) == {t.name for t in TYPES}
    for t in TYPES:
        assert got[t.name] == (int(t), *GGML_QUANT_SIZES[t])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_is_bit_identical_to_gguf(qtype: G):
    rng = np.random.default_rng(int(qtype))
    block_size, _ = GGML_QUANT_SIZES[qtype]
    n = block_size * (97 if block_size > 1 else 4099)
    raw = random_blocks(qtype, n, rng)
    ours = _core.dequantize(int(qtype), raw, n)
    ref = gguf_dequantize(raw, qtype).reshape(-1).astype(np.float32, copy=False)
    assert ours.dtype == np.float32 and ours.shape == (n,)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,cols_blocks,T", [(1, 1, 1), (7, 2, 3), (33, 3, 17), (64, 2, 64)])
def test_matmul_matches_numpy(qtype: G, rows: int, cols_blocks: int, T: int):
    rng = np.random.default_rng(rows * 1000 + T)
    block_size, _ = GGML_QUANT_SIZES[qtype]
    cols = block_size * cols_blocks if block_size > 1 else 37 * cols_blocks
    raw = random_blocks(qtype, rows * cols, rng)
    x = rng.uniform(-1, 1, (T, cols)).astype(np.float32)
    w = gguf_dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(w.T)
    for threads in (1, 2):
        y = _core.matmul(int(qtype), raw, rows, cols, x, threads=threads)
        assert y.shape == (T, rows) and y.dtype == np.float32
        # float32 sums in a fixed order: measured at most 1.1e-7 of sum |x w| (F32)
        assert np.all(np.abs(y - ref) <= 1e-6 * mag + 1e-30)


def test_matmul_rows_do_not_depend_on_token_count():
    rng = np.random.default_rng(5)
    rows, cols = 19, 512
    raw = random_blocks(G.Q4_K, rows * cols, rng)
    x = rng.uniform(-1, 1, (37, cols)).astype(np.float32)
    full = _core.matmul(int(G.Q4_K), raw, rows, cols, x, threads=2)
    for t in (0, 17, 36):
        one = _core.matmul(int(G.Q4_K), raw, rows, cols, x[t : t + 1], threads=1)
        assert np.array_equal(one[0].view(np.uint32), full[t].view(np.uint32))


def test_unsupported_type_raises():
    with pytest.raises(
        strata.UnsupportedError, match=r"TQ1_0 \(34\) is not supported by strata; supported: F32"
    ):
        _core.dequantize(int(G.TQ1_0), np.zeros(54, np.uint8), 256)
    with pytest.raises(strata.UnsupportedError, match="Re-quantize"):
        _core.matmul(int(G.TQ1_0), np.zeros(54, np.uint8), 1, 256, np.zeros((1, 256), np.float32))


def test_size_mismatches_raise_config_error():
    with pytest.raises(strata.ConfigError, match="got 33 bytes, expected 34"):
        _core.dequantize(int(G.Q8_0), np.zeros(33, np.uint8), 32)
    with pytest.raises(strata.ConfigError, match="not a whole number of 32-element blocks"):
        _core.dequantize(int(G.Q8_0), np.zeros(34, np.uint8), 31)
    with pytest.raises(strata.ConfigError, match=r"x must be \(T, 32\)"):
        _core.matmul(int(G.Q8_0), np.zeros(34, np.uint8), 1, 32, np.zeros((1, 64), np.float32))
    with pytest.raises(strata.ConfigError, match="matmul weights: got 34 bytes, expected 68"):
        _core.matmul(int(G.Q8_0), np.zeros(34, np.uint8), 2, 32, np.zeros((1, 32), np.float32))


Q8_TYPES = [G.Q8_0, G.Q4_K, G.Q6_K, G.IQ2_XS, G.Q2_K, G.IQ2_XXS, *NEW_TYPES]


def q8_0_roundtrip(x: np.ndarray) -> np.ndarray:
    """x as matmul_q8 sees it: quantized and dequantized by gguf (test_quantize_q8_0_is_gguf's: the same
    bytes as strata's quantize_row_q8_0)."""
    return gguf_dequantize(gguf_quantize(x, G.Q8_0), G.Q8_0).reshape(x.shape).astype(np.float64)


def test_quantize_q8_0_is_gguf():
    """strata's q8_0 activation quantizer gives gguf.quants.quantize's bytes: scales (fp16 of max|x| / 127)
    and rounding, halves away from zero, over magnitudes from subnormal-scale to large, zero blocks,
    blocks whose largest magnitude is negative, and values exactly at a rounding half."""
    rng = np.random.default_rng(8)
    rows = [rng.standard_normal(256) * s for s in (1e-6, 1e-3, 1.0, 7.5, 1e3, 6e4)]
    rows.append(np.zeros(256))
    neg = rng.uniform(-1, 1, 256)
    neg[::32] = -3.0  # each block's max |x| is negative
    rows.append(neg)
    halves = np.tile(np.arange(-15.5, 16.5, 1.0), 8)  # 32 values a block; max 15.5 -> d = 15.5 / 127
    halves[::32] = 127.0  # max 127 -> d = 1: the other values sit exactly on halves
    rows.append(halves)
    x = np.stack(rows).astype(np.float32)
    ours = np.asarray(_core.quantize_q8_0(x)).reshape(-1)
    ref = gguf_quantize(x, G.Q8_0).reshape(-1)
    assert ours.shape == ref.shape
    assert np.array_equal(ours, ref), f"{int((ours != ref).sum())} bytes differ"


def test_has_matmul_q8():
    assert [_core.has_matmul_q8(int(t)) for t in TYPES] == [t in Q8_TYPES for t in TYPES]


@pytest.mark.parametrize("qtype", Q8_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,cols,T", [(1, 256, 1), (7, 512, 3), (33, 2048, 17), (64, 256, 64)])
def test_matmul_q8_matches_float64_of_dequantized_operands(qtype: G, rows: int, cols: int, T: int):
    rng = np.random.default_rng(rows * 1000 + T + int(qtype))
    raw = random_blocks(qtype, rows * cols, rng)
    x = rng.uniform(-1, 1, (T, cols)).astype(np.float32)
    w = gguf_dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    xd = q8_0_roundtrip(x)
    ref = xd @ w.T
    mag = np.abs(xd) @ np.abs(w.T)
    y1 = _core.matmul_q8(int(qtype), raw, rows, cols, x, threads=1)
    y3 = _core.matmul_q8(int(qtype), raw, rows, cols, x, threads=3)
    assert y1.shape == (T, rows) and y1.dtype == np.float32
    # the per-block scale products and their float sum: measured at most 5.4e-8 of sum |x w| (IQ2_XS)
    assert np.all(np.abs(y1 - ref) <= 5e-7 * mag + 1e-30)
    assert np.array_equal(y1.view(np.uint32), y3.view(np.uint32))


@pytest.mark.parametrize("qtype", Q8_TYPES, ids=lambda t: t.name)
def test_matmul_q8_rows_do_not_depend_on_token_count(qtype: G):
    rng = np.random.default_rng(9)
    rows, cols = 19, 512
    raw = random_blocks(qtype, rows * cols, rng)
    x = rng.uniform(-1, 1, (37, cols)).astype(np.float32)
    full = _core.matmul_q8(int(qtype), raw, rows, cols, x, threads=2)
    for t in (0, 17, 36):
        one = _core.matmul_q8(int(qtype), raw, rows, cols, x[t : t + 1], threads=1)
        assert np.array_equal(one[0].view(np.uint32), full[t].view(np.uint32))


def test_matmul_q8_errors():
    with pytest.raises(strata.UnsupportedError, match="no integer kernel for F16"):
        _core.matmul_q8(int(G.F16), np.zeros(64, np.uint8), 1, 32, np.zeros((1, 32), np.float32))
    with pytest.raises(strata.ConfigError, match=r"x must be \(T, 32\)"):
        _core.matmul_q8(int(G.Q8_0), np.zeros(34, np.uint8), 1, 32, np.zeros((1, 64), np.float32))


_ISA_CHILD = """
import sys
import numpy as np
from strata import _core
d = np.load(sys.argv[1])
ys = {k: _core.matmul_q8(int(d["type_" + k]), d["w_" + k], 19, 512, d["x"], threads=2) for k in sys.argv[2:]}
np.savez(sys.argv[1] + ".out.npz", describe=_core.Backend("cpu", 1).describe(), **ys)
"""


def _matmul_q8_in_child(tmp_path, isa: str, inputs: dict) -> dict:
    path = str(tmp_path / f"in_{isa}.npz")
    np.savez(path, **inputs)
    names = [k[2:] for k in inputs if k.startswith("w_")]
    env = {**os.environ, "STRATA_CPU_ISA": isa}
    r = subprocess.run([sys.executable, "-c", _ISA_CHILD, path, *names], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return dict(np.load(path + ".out.npz"))


def test_matmul_q8_is_bit_identical_under_every_cpu_kernel_set(tmp_path):
    """STRATA_CPU_ISA=scalar|avx2 caps the CPU kernels (the AVX-512 VNNI ones, where the CPU has them, are
    the default): every integer kernel gives the same bits under each, at decode and prompt token counts."""
    rng = np.random.default_rng(41)
    x = rng.uniform(-1, 1, (20, 512)).astype(np.float32)
    inputs = {"x": x}
    for qtype in Q8_TYPES:
        inputs["w_" + qtype.name] = random_blocks(qtype, 19 * 512, rng)
        inputs["type_" + qtype.name] = np.int64(qtype)
    want = {qtype.name: _core.matmul_q8(int(qtype), inputs["w_" + qtype.name], 19, 512, x, threads=2)
            for qtype in Q8_TYPES}
    for T in (1, 3, 8):  # the small-T tiles
        for qtype in Q8_TYPES:
            y = _core.matmul_q8(int(qtype), inputs["w_" + qtype.name], 19, 512, x[:T], threads=1)
            assert np.array_equal(y.view(np.uint32), want[qtype.name][:T].view(np.uint32)), (qtype.name, T)
    for isa in ("avx2", "scalar"):
        got = _matmul_q8_in_child(tmp_path, isa, inputs)
        assert str(got["describe"]).startswith(("cpu (scalar",) if isa == "scalar" else ("cpu (AVX2", "cpu (scalar"))
        for qtype in Q8_TYPES:
            assert np.array_equal(got[qtype.name].view(np.uint32), want[qtype.name].view(np.uint32)), (isa, qtype.name)


def test_an_unknown_cpu_kernel_set_is_an_error():
    env = {**os.environ, "STRATA_CPU_ISA": "avx1024"}
    code = (
        "import numpy as np; from strata import _core; "
        "_core.matmul_q8(8, np.zeros(34, np.uint8), 1, 32, np.zeros((1, 32), np.float32))"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "STRATA_CPU_ISA=avx1024" in r.stderr and "scalar, avx2 or avx512vnni" in r.stderr

