"""What the kernels of every family share: exact ``exp``/``log``/``log1p``/``tanh`` (libdevice on
CUDA, NumPy's under the interpreter), the soft cap and its derivative, the compute dtype, the
fixed-order reduction of per-element losses and the element-wise scale of a gradient buffer.

May import torch, triton and ``_triton``; never the family modules.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._triton import interpreted

_EXACT = not interpreted()


@triton.jit
def _exp(x, EXACT: tl.constexpr):
    if EXACT:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _log(x, EXACT: tl.constexpr):
    if EXACT:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _log1p(x, EXACT: tl.constexpr):
    if EXACT:
        return libdevice.log1p(x)
    else:
        # Kahan: log(u) x / (u - 1) with u = 1 + x rounded, within a few ULP (x where u is 1)
        u = 1.0 + x
        d = u - 1.0
        return tl.where(d == 0.0, x, _log(u, EXACT) * (x / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def _tanh(x, EXACT: tl.constexpr):
    if EXACT:
        return libdevice.tanh(x)
    else:
        # tanh |x| = -m / (2 + m), m = expm1(-2 |x|) by Kahan's formula from u = exp(t) rounded:
        # (u - 1) t / log(u), within a few ULP (t where u is 1, -1 where u underflows to 0)
        t = -2.0 * tl.abs(x)
        u = _exp(t, EXACT)
        safe = (u != 1.0) & (u != 0.0)
        log_u = _log(tl.where(safe, u, 0.5), EXACT)
        m = tl.where(u == 1.0, t, tl.where(u == 0.0, -1.0, (u - 1.0) * (t / log_u)))
        magnitude = -m / (2.0 + m)
        return tl.where(x < 0.0, -magnitude, magnitude)


@triton.jit
def _softcap(z, softcap, EXACT: tl.constexpr):
    """c = softcap tanh(z / softcap) (``spec._softcap``); infinite logits keep their meaning (-inf a
    masked class, +inf a NaN row), where tanh would make them finite."""
    c = softcap * _tanh(z / softcap, EXACT)
    return tl.where((z == float("inf")) | (z == -float("inf")), z, c)


@triton.jit
def _dcap(z, softcap, EXACT: tl.constexpr):
    """dc/dz = sech^2(z / softcap) = 4 e / (1 + e)^2, e = exp(-2 |z / softcap|) (``spec._softcap``:
    no 1 - tanh^2 cancellation, no overflow); 0 at infinite logits."""
    e = _exp(-2.0 * tl.abs(z / softcap), EXACT)
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


@triton.jit
def _reduce_kernel(
    rows_ptr, out_ptr, denominator_ptr, R, tiny, count,
    MEAN: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program: the sum of R per-element losses; for the mean (MEAN 1) divided by the sum
    of their counts (the R entries after them; at least the smallest normal: none kept, a mean
    of 0), stored in `denominator_ptr`, or (MEAN 2) by `count`, a number (0: a mean of 0). In
    a fixed order, so the same inputs give the same bits on every run."""
    cols = tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), ACC)
    counts = tl.zeros((BLOCK,), ACC)
    for start in range(0, R, BLOCK):
        inside = start + cols < R
        total += tl.load(rows_ptr + start + cols, mask=inside, other=0.0)
        if MEAN == 1:
            counts += tl.load(rows_ptr + R + start + cols, mask=inside, other=0.0)
    total_sum = tl.sum(total, 0)
    if MEAN == 1:
        denominator = tl.maximum(tl.sum(counts, 0), tiny)
        tl.store(denominator_ptr, denominator)
        total_sum = total_sum / denominator
    if MEAN == 2:
        total_sum = total_sum / tl.maximum(count, 1.0)
    tl.store(out_ptr, total_sum.to(out_ptr.dtype.element_ty))


@triton.jit
def _scale_kernel(
    g_ptr, scale_ptr, scale_stride, divisor_ptr, out_ptr, n, divisor_value,
    HAS_DIVISOR: tl.constexpr, HAS_DIVISOR_VALUE: tl.constexpr,
    ACC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """out = g * scale (one number, or one per element: `scale_stride` 0 or 1), over a divisor
    (a 0-dim tensor, or a number), in g's dtype: the element-wise losses' backward."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    scale = tl.load(scale_ptr + i * scale_stride, mask=inside, other=0.0).to(ACC)
    if HAS_DIVISOR:
        scale = scale / tl.load(divisor_ptr).to(ACC)
    if HAS_DIVISOR_VALUE:
        scale = scale / divisor_value
    g = tl.load(g_ptr + i, mask=inside, other=0.0).to(ACC)
    tl.store(out_ptr + i, (g * scale).to(out_ptr.dtype.element_ty), mask=inside)
