"""Triton kernels of the sigmoid losses (``spec.sigmoid`` closed forms, as ``torch_impl.sigmoid``
forms them).

Element-wise: one program per block of elements of the flattened logits. The forward writes each
element's loss (or, for ``sum`` / ``mean``, into a row buffer that ``_reduce_kernel`` sums in a
fixed order) and, when a gradient is needed, the gradient in the same pass into a buffer of its
own; backward scales it (``_scale_kernel``). Half precision recomputes the gradient in backward
with the incoming gradient folded in, rounded once.

The terms, each accurate for every logit (no 1 - sigma formed, no log(1 + x)):
softplus(y) = max(y, 0) + log1p(exp(-|y|)); sigma(y) from exp(-|y|); the cross entropy
softplus(-|x|) + (relu(x) - t x) (pos_weight: (1 - t) softplus(x) + q t softplus(-x)); its
gradient lerp(sigma(x), -sigma(-x), t) from the nearer end ((1 - t) sigma(x) - q t sigma(-x));
the focal loss's 1 - p_t = lerp(p, 1 - p, t), (1 - p_t)^gamma = exp(gamma log(1 - p_t)) (0 where
1 - p_t is 0), its gradient without division for gamma >= 1 and with r = p (1 - p) / (1 - p_t),
1 - p_t clamped at the smallest normal, below (``torch_impl.sigmoid._sigmoid_focal_terms``).
A NaN or +inf logit gives NaN in that element's loss and gradient (DESIGN 5).

May import torch, triton, ``_common`` and ``_triton``; never the family modules.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import _EXACT, _acc, _exp, _log, _log1p, _reduce_kernel, _scale_kernel

_BLOCK = 1024


@triton.jit
def _softplus(y, EXACT: tl.constexpr):
    # log(1 + exp(y)) = max(y, 0) + log1p(exp(-|y|))
    return tl.maximum(y, 0.0) + _log1p(_exp(-tl.abs(y), EXACT), EXACT)


@triton.jit
def _sigmoids(x, EXACT: tl.constexpr):
    # (sigma(x), sigma(-x)), each relative to a few ULP: from e = exp(-|x|) <= 1
    e = _exp(-tl.abs(x), EXACT)
    big = 1.0 / (1.0 + e)
    small = e * big
    return tl.where(x >= 0.0, big, small), tl.where(x >= 0.0, small, big)


@triton.jit
def _lerp(a, b, t):
    # torch.lerp: from the nearer end (exact b at t = 1, a at t = 0)
    return tl.where(t < 0.5, a + t * (b - a), b - (b - a) * (1.0 - t))


@triton.jit
def _sigmoid_kernel(
    x_ptr, t_ptr, w_ptr, w_stride, q_ptr, q_stride, loss_ptr, grad_ptr,
    scale_ptr, scale_stride, divisor_ptr, n, C, gamma, alpha, tiny, divisor_value,
    HAS_W: tl.constexpr, W_LAST: tl.constexpr, HAS_Q: tl.constexpr, Q_LAST: tl.constexpr,
    FOCAL: tl.constexpr, HAS_ALPHA: tl.constexpr, STORE_LOSS: tl.constexpr,
    NEEDS_GRAD: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DIVISOR: tl.constexpr,
    HAS_DIVISOR_VALUE: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
    EXACT: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    x = tl.load(x_ptr + i, mask=inside, other=0.0).to(ACC)
    t = tl.load(t_ptr + i, mask=inside, other=0.0).to(ACC)
    nan = float("nan")
    # a factor: one number (stride 0), one per element (stride 1) or per class (the last axis)
    if HAS_W:
        if W_LAST:
            w = tl.load(w_ptr + (i % C), mask=inside, other=0.0).to(ACC)
        else:
            w = tl.load(w_ptr + i * w_stride, mask=inside, other=0.0).to(ACC)
    if HAS_Q:
        if Q_LAST:
            q = tl.load(q_ptr + (i % C), mask=inside, other=0.0).to(ACC)
        else:
            q = tl.load(q_ptr + i * q_stride, mask=inside, other=0.0).to(ACC)
        # NaN or +inf logits: NaN in that element (the terms alone would give inf or 0)
        x = tl.where(x == float("inf"), nan, x)
    p, not_p = _sigmoids(x, EXACT)
    if HAS_Q:
        sp_x = _softplus(x, EXACT)
        sp_minus_x = _softplus(-x, EXACT)
        ce = (sp_x - t * sp_x) + (q * t) * sp_minus_x
    else:
        # softplus(x) - t x = softplus(-|x|) + (relu(x) - t x), two terms >= 0 at hard targets
        ce = _log1p(_exp(-tl.abs(x), EXACT), EXACT) + (tl.maximum(x, 0.0) - t * x)
    if FOCAL:
        not_pt = _lerp(p, not_p, t)
        if gamma < 1.0:
            not_pt = tl.maximum(not_pt, tiny)
        is_zero = not_pt == 0.0
        log_not_pt = _log(tl.where(is_zero, 1.0, not_pt), EXACT)
        focal_weight = tl.where(is_zero, 0.0, _exp(gamma * log_not_pt, EXACT))
        if HAS_ALPHA:
            alpha_t = (1.0 - alpha) + (2.0 * alpha - 1.0) * t
        else:
            alpha_t = tl.full(x.shape, 1.0, ACC)
        loss = ce * focal_weight * alpha_t
    else:
        loss = ce
        if HAS_W:
            loss = loss * w
    if STORE_LOSS:
        tl.store(loss_ptr + i, loss.to(loss_ptr.dtype.element_ty), mask=inside)
    if NEEDS_GRAD:
        if FOCAL:
            # p - t = (1 - p_t) - 2 t (1 - p); 1 - 2t the derivative of 1 - p_t by p
            p_minus_t = not_pt - 2.0 * t * not_p
            sign = 1.0 - 2.0 * t
            if gamma >= 1.0:
                grad = not_pt * p_minus_t + gamma * (p * not_p * ce) * sign
                if gamma != 1.0:
                    power = tl.where(is_zero, 0.0, _exp((gamma - 1.0) * log_not_pt, EXACT))
                    grad = grad * power
            else:
                r = p * not_p / not_pt
                grad = (p_minus_t + gamma * (r * ce) * sign) * focal_weight
            grad = grad * alpha_t
        else:
            if HAS_Q:
                grad = (p - t * p) - (q * t) * not_p
            else:
                grad = _lerp(p, -not_p, t)
            if HAS_W:
                grad = grad * w
        if HAS_SCALE:
            scale = tl.load(scale_ptr + i * scale_stride, mask=inside, other=0.0).to(ACC)
            if HAS_DIVISOR:
                scale = scale / tl.load(divisor_ptr).to(ACC)
            if HAS_DIVISOR_VALUE:
                scale = scale / divisor_value
            grad = grad * scale
        # the loss is NaN at a +inf logit: so is the gradient (the terms give a number there)
        grad = tl.where(x == float("inf"), nan, grad)
        tl.store(grad_ptr + i, grad.to(grad_ptr.dtype.element_ty), mask=inside)


def _factor(f: Tensor | None, shape) -> tuple[Tensor | None, int, bool]:
    """(tensor, stride, per_class) for a weight / pos_weight the kernel reads: one number,
    one per element (contiguous, the logits' shape) or one per class of the last axis."""
    if f is None:
        return None, 0, False
    if f.numel() == 1:
        return f.reshape(()), 0, False
    if tuple(f.shape) == tuple(shape):
        return f.contiguous(), 1, False
    return f.reshape(-1).contiguous(), 0, True


def _launch(x, t, w, q, gamma, alpha, focal, loss, grad, scale=None, divisor=None, count=0.0):
    n = x.numel()
    if n == 0:
        return
    c = x.shape[-1] if x.dim() else 1
    w, w_stride, w_last = _factor(w, x.shape)
    q, q_stride, q_last = _factor(q, x.shape)
    if scale is not None and scale.numel() != 1:
        scale, scale_stride = scale.contiguous(), 1
    else:
        scale_stride = 0
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    anything = x  # a pointer the kernel never reads (constexpr flags say so)
    _sigmoid_kernel[(triton.cdiv(n, _BLOCK),)](
        x, t, w if w is not None else anything, w_stride,
        q if q is not None else anything, q_stride,
        loss if loss is not None else anything, grad if grad is not None else anything,
        scale if scale is not None else anything, scale_stride,
        divisor if divisor is not None else anything,
        n, c, float(gamma), float(alpha if alpha is not None else 0.0),
        torch.finfo(acc).tiny, float(count),
        HAS_W=w is not None, W_LAST=w_last, HAS_Q=q is not None, Q_LAST=q_last,
        FOCAL=focal, HAS_ALPHA=alpha is not None, STORE_LOSS=loss is not None,
        NEEDS_GRAD=grad is not None, HAS_SCALE=scale is not None,
        HAS_DIVISOR=divisor is not None, HAS_DIVISOR_VALUE=count > 0,
        ACC=_acc(x.dtype), BLOCK=_BLOCK, EXACT=_EXACT, num_warps=4,
    )  # fmt: skip


@torch.library.custom_op("dualloss::sigmoid_fwd_", mutates_args=("loss", "grad"))
def sigmoid_fwd_(
    x: Tensor,
    t: Tensor,
    w: Tensor | None,
    q: Tensor | None,
    gamma: float,
    alpha: float | None,
    focal: bool,
    mean: bool,
    loss: Tensor,
    grad: Tensor | None,
) -> None:
    """x contiguous logits, t contiguous targets of x's shape; w (weight) and q (pos_weight)
    one number, x's shape or one per class of the last axis (compute dtype), or None; the
    focal loss (`focal`: gamma, alpha or None) or the cross entropy. Writes `loss` (x's shape:
    per element; 0-dim: the sum, or with `mean` the mean over x's elements, 0 for none) and
    `grad` (the per-element loss's gradient, x's shape and dtype) where given."""
    if loss.dim() > 0:
        _launch(x, t, w, q, gamma, alpha, focal, loss, grad)
        return
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows = torch.empty(x.numel(), dtype=acc, device=x.device)
    _launch(x, t, w, q, gamma, alpha, focal, rows, grad)
    _reduce_kernel[(1,)](
        rows, loss, loss, x.numel(), torch.finfo(acc).tiny, float(x.numel()),
        MEAN=2 if mean else 0, ACC=_acc(x.dtype), BLOCK=1024, num_warps=4,
    )  # fmt: skip


@sigmoid_fwd_.register_fake
def _(x, t, w, q, gamma, alpha, focal, mean, loss, grad):
    return None


@torch.library.custom_op("dualloss::sigmoid_bwd", mutates_args=())
def sigmoid_bwd(
    x: Tensor, t: Tensor, w: Tensor | None, q: Tensor | None, gamma: float,
    alpha: float | None, focal: bool, scale: Tensor, count: float,
) -> Tensor:  # fmt: skip
    """The per-element loss's gradient times `scale` (one number or x's shape) over `count`
    (the mean's, or 0: none), recomputed in one launch and rounded once to x's dtype."""
    grad = torch.empty_like(x)
    _launch(x, t, w, q, gamma, alpha, focal, None, grad, scale, None, count)
    return grad


@sigmoid_bwd.register_fake
def _(x, t, w, q, gamma, alpha, focal, scale, count):
    return torch.empty_like(x)


@torch.library.custom_op("dualloss::scale_elements_", mutates_args=("g",))
def scale_elements_(g: Tensor, scale: Tensor, count: float) -> None:
    """g times `scale` (one number or g's shape) over `count` (0: none), in place: the graph's
    last backward scales the forward's gradient buffer without a second one."""
    _scale(g, scale, count, g)


@scale_elements_.register_fake
def _(g, scale, count):
    return None


@torch.library.custom_op("dualloss::scale_elements", mutates_args=())
def scale_elements(g: Tensor, scale: Tensor, count: float) -> Tensor:
    """``scale_elements_`` into a new tensor (the buffer is read again: retain_graph, hooks)."""
    return _scale(g, scale, count, torch.empty_like(g))


@scale_elements.register_fake
def _(g, scale, count):
    return torch.empty_like(g)


def _scale(g, s, count, out):
    n = g.numel()
    if n == 0:
        return out
    stride = 0 if s.numel() == 1 else 1
    s = s if stride == 0 else s.contiguous()
    _scale_kernel[(triton.cdiv(n, _BLOCK),)](
        g, s, stride, s, out, n, float(count),
        HAS_DIVISOR=False, HAS_DIVISOR_VALUE=count > 0,
        ACC=_acc(g.dtype), BLOCK=_BLOCK, num_warps=4,
    )  # fmt: skip
    return out
