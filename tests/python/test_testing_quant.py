"""strata.testing.quant: GGUF blocks that gguf's reference dequantizer reads back at the intended scale."""

import gguf
import numpy as np
import pytest

from strata.testing.quant import QTYPES, encode, qtype_of, random_blocks


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("scale", [0.02, 1.5])
def test_encode_scale(qtype, scale):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 4, 512)) * scale).astype(np.float32)
    data = encode(x, qtype, rng)
    assert data.dtype == np.uint8
    y = gguf.quants.dequantize(data, qtype_of(qtype))
    assert y.shape == x.shape and np.isfinite(y).all()
    assert y.std() == pytest.approx(scale, rel=0.1)
    assert abs(y.mean()) < 0.1 * scale
    if qtype in ("F32", "F16", "BF16", "Q8_0"):  # real encodings
        assert np.abs(y - x).max() <= 0.02 * np.abs(x).max()
    if qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4"):  # real 4- and 5-bit encodings: a step of a block's range
        assert np.abs(y - x).max() <= 0.25 * np.abs(x).max()


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "IQ2_XS", "Q8_0", "Q5_K", "Q3_K", "IQ4_XS", "MXFP4", "Q5_0",
                                   "Q4_0", "Q4_1", "Q5_1", "IQ4_NL", "IQ3_XXS", "IQ3_S", "IQ2_S", "IQ1_S", "IQ1_M"])
def test_random_blocks_are_random(qtype):
    a = random_blocks(qtype, (2, 256), 0.1, np.random.default_rng(1))
    b = random_blocks(qtype, (2, 256), 0.1, np.random.default_rng(2))
    assert a.shape == b.shape and (a != b).any()


def test_rejects_partial_blocks_and_unknown_types():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="multiple of 256"):
        encode(np.zeros((2, 128), np.float32), "Q4_K", rng)
    with pytest.raises(ValueError, match="unsupported quant type 'TQ1_0'"):
        random_blocks("TQ1_0", (1, 256), 1.0, rng)
