"""The q8_0-activation references of the MMQ layout, computed in float64 so that they do not depend on
the CPU that runs them.

strata's MMQ layout rounds each routed expert's input row (and the down projection's input) to q8_0.
A reference that rounds torch's float32 activations at the same places flips an element that sits
within float32 noise of a rounding half wherever torch happens to sum in another order (MKL's and
ATen's kernels differ with the CPU, the ISA and the thread count), and one flip moves a position's
logits by up to ~1e-3 (test_vs_transformers). In float64 the reference's activations are exact to
~1e-16, so its roundings are the same on every machine; what is left is strata's own float32 noise,
which does not depend on the machine (its kernels are bit-identical across ISAs and thread counts).
flip_allowance derives from the reference how far the roundings that noise may flip can move the logits.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map


class Float64(TorchFunctionMode):
    """Every float32 tensor or dtype that reaches a torch function inside is float64, transformers'
    explicit float32 steps (RMSNorm, RoPE, softmax, DeepSeek V4's hyper-connections) included."""

    def __enter__(self):
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.endswith("__") and args and _is_f32(args[0]):
            # upcasting would write into a copy: a float32 tensor built outside the mode
            raise TypeError(f"{name} on a float32 tensor inside Float64")
        out = func(*tree_map(_up, args), **tree_map(_up, kwargs or {}))
        return tree_map(lambda t: t.double() if _is_f32(t) else t, out)


def _is_f32(a) -> bool:
    return isinstance(a, torch.Tensor) and a.dtype == torch.float32


def _up(a):
    if a is torch.float32:
        return torch.float64
    return a.double() if _is_f32(a) else a


# How far a float32 forward's copy of an activation may sit from the exact one, in q8_0 steps (block
# max / 127): transformers in float32 against this float64 reference, at the first layer's expert
# inputs (before any q8_0 rounding can differ), measured up to 9.9e-5 of a step on the qwen3moe mixes
# (median 6.5e-6; the float32 rounding of the value alone is up to 127 * 2^-24 = 7.6e-6). An element
# whose exact scaled value is nearer a half than 3x that may round the other way in strata.
TIE_MARGIN = 3e-4

# The near-ties of the round trips of one reference forward, or the flips to apply in one (see
# flip_allowance), keyed by (id of the experts module, expert, site 0 = gate/up input, 1 = down input).
_record: list | None = None
_flips: dict | None = None


def q8_0_round_trip(x: torch.Tensor, site: tuple | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """x (rows of whole 32-blocks) rounded to float32, as strata holds it, then through gguf's Q8_0
    quantize and dequantize (an independent implementation of ggml's rule, in float32 as strata's);
    returned in x's dtype. The casts are numpy's, outside any torch mode. site and rows (x's row
    indices in the flattened batch) name the elements for flip_allowance."""
    Q8 = gguf.GGMLQuantizationType.Q8_0
    a = x.detach().numpy().astype(np.float32)
    back = gguf.quants.dequantize(gguf.quants.quantize(a, Q8), Q8).reshape(a.shape).astype(np.float64)
    if site is not None and (_record is not None or _flips is not None):
        blocks = a.reshape(a.shape[0], -1, 32)
        d = np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)  # gguf's (and strata's) float32 rule
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.abs(blocks * np.where(d == 0, 0, np.float32(1) / d)).reshape(a.shape)
        step = np.repeat(d.astype(np.float16).astype(np.float64), 32, axis=2).reshape(a.shape)
        frac = scaled - np.floor(scaled)
        # the other rounding: one step further from zero if this one went down, nearer if it went up
        other = np.where(frac < 0.5, 1.0, -1.0) * np.sign(a) * step
        row_ids = rows.numpy()
        if _record is not None:
            for r, c in zip(*np.nonzero(np.abs(frac - 0.5) < TIE_MARGIN), strict=True):
                _record.append((site, int(row_ids[r]), int(c), float(other[r, c])))
        if _flips is not None:
            where = {int(t): i for i, t in enumerate(row_ids)}
            for (fsite, row, col), delta in _flips.items():
                if fsite == site and row in where:
                    back[where[row], col] += delta
    return torch.from_numpy(back.astype(x.detach().numpy().dtype))


def flip_allowance(model: torch.nn.Module, ids: list[int], batch: int = 64) -> tuple[np.ndarray, np.ndarray, int]:
    """The reference's logits for ids, and per position how far the q8_0 roundings that strata may take
    the other way can move them: each element within TIE_MARGIN of a rounding half is flipped alone
    (a batch of copies of the prompt, one flip each) and |its logits - the reference's| summed per
    position, relative to max |logit|. A flip reaches its position and the later ones, by attention or
    by a router or indexer choice it tips, and the sum bounds any set of them to first order. Returns
    (logits, allowance per position, number of near-ties)."""
    global _record, _flips
    _record = []
    try:
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].double().numpy()
        ties = _record
    finally:
        _record = None
    T, scale = len(ids), np.abs(ref).max()
    allowance = np.zeros(T)
    try:
        for i in range(0, len(ties), batch):
            chunk = ties[i : i + batch]
            _flips = {(site, b * T + row, col): delta for b, (site, row, col, delta) in enumerate(chunk)}
            with torch.no_grad():
                out = model(torch.tensor([ids] * len(chunk))).logits.double().numpy()
            allowance += (np.abs(out - ref).max(axis=2) / scale).sum(axis=0)
    finally:
        _flips = None
    return ref.astype(np.float32), allowance, len(ties)


def run_in_float64(model: torch.nn.Module) -> torch.nn.Module:
    """model (built under Float64, so buffers such as RoPE's inverse frequencies are float64 from the
    start) with its forward run under Float64; its logits come back as float64."""
    forward = model.forward

    def forward_f64(*args, **kwargs):
        with Float64():
            return forward(*args, **kwargs)

    model.forward = forward_f64
    return model
