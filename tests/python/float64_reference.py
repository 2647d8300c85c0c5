"""The q8_0-activation references of the MMQ layout, computed in float64 so that they do not depend on
the CPU that runs them.

strata's MMQ layout rounds each routed expert's input row (and the down projection's input) to q8_0.
A reference that rounds torch's float32 activations at the same places flips an element that sits
within float32 noise of a rounding half wherever torch happens to sum in another order (MKL's and
ATen's kernels differ with the CPU, the ISA and the thread count), and one flip moves a position's
logits by up to ~1e-3 (test_vs_transformers). In float64 the reference's activations are exact to
~1e-16, so its roundings are the same on every machine; what is left is strata's own float32 noise,
which does not depend on the machine (its kernels are bit-identical across ISAs and thread counts).
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


def q8_0_round_trip(x: torch.Tensor) -> torch.Tensor:
    """x (rows of whole 32-blocks) rounded to float32, as strata holds it, then through gguf's Q8_0
    quantize and dequantize (an independent implementation of ggml's rule, in float32 as strata's);
    returned in x's dtype. The casts are numpy's, outside any torch mode."""
    Q8 = gguf.GGMLQuantizationType.Q8_0
    a = x.detach().numpy().astype(np.float32)
    back = gguf.quants.dequantize(gguf.quants.quantize(a, Q8), Q8).reshape(a.shape)
    return torch.from_numpy(back.astype(x.detach().numpy().dtype))


def run_in_float64(model: torch.nn.Module) -> torch.nn.Module:
    """model (built under Float64, so buffers such as RoPE's inverse frequencies are float64 from the
    start) with its forward run under Float64; its logits come back as float64."""
    forward = model.forward

    def forward_f64(*args, **kwargs):
        with Float64():
            return forward(*args, **kwargs)

    model.forward = forward_f64
    return model
