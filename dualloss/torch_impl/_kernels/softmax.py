"""Triton kernels of the softmax losses (``spec.softmax`` closed forms): class-index targets, and
probability targets (a dense target mass) at the end.

One program per row (a row: the C logits of one element, read with the class stride, so
``(N, C, d1, ...)`` needs no copy). Pass 1 is an online pass over the row: the largest logit
z_top, its index (the first on ties) and s = sum_{j != top} exp(z_j - z_top), formed without the
top's 1 (``spec._log_softmax``), so log1p(s) keeps a confident row's tiny loss. The loss of the
row follows from z_y, z_top and s alone (``spec._softmax_focal_terms`` with a one-hot target
mass a_y at y). When a gradient is asked for, pass 2 writes it into a buffer of the logits' shape
and dtype: p_j v off the target, -(1 - p_y) v at it (``_softmax_focal_terms_sparse``). Backward
scales that buffer by the incoming gradient, row by row (``scale_rows``): two launches in all,
and nothing written into the caller's tensors.

The LLM head options (DESIGN 13) in the same program: with `softcap` every logit is read as
c = softcap tanh(z / softcap) (pass 1 and pass 2 recompute it from z: nothing of the logits'
size is written but the gradient), and the gradient is times dc/dz = 4 e / (1 + e)^2,
e = exp(-2 |z / softcap|); with `z_loss` the loss adds z_loss lse^2, lse = c_top + log1p(s) from
pass 1's numbers, and pass 2 adds 2 z_loss lse to every p_j's coefficient.

Arithmetic in float32 for half inputs, float64 for float64. On CUDA ``exp``/``log``/``log1p`` are
libdevice's (correctly rounded to within an ULP) rather than the fast approximations; under the
interpreter NumPy's, with log1p from log by Kahan's formula.

May import torch, triton and ``_triton``; never the family modules.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import _EXACT, _acc, _dcap, _exp, _log, _log1p, _reduce_kernel, _softcap


@triton.jit
def _softmax_index_kernel(
    z_ptr, y_ptr, w_ptr, loss_ptr, count_at, grad_ptr, scale_ptr, scale_stride, divisor_ptr,
    C, D, stride_n, stride_c, stride_d,
    gamma, ignore_index, tiny, eps, z_loss, softcap,
    HAS_W: tl.constexpr, WEIGHTED_COUNT: tl.constexpr, COUNT: tl.constexpr,
    NEEDS_GRAD: tl.constexpr,
    FOCAL: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DIVISOR: tl.constexpr,
    STORE_LOSS: tl.constexpr, Z_LOSS: tl.constexpr, CAP: tl.constexpr,
    ACC: tl.constexpr, BLOCK: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    n = row // D
    d = row - n * D
    base = n * stride_n + d * stride_d
    cols = tl.arange(0, BLOCK)
    inf = float("inf")

    # pass 1: z_top, top (first on ties) and s = sum_{j != top} exp(z_j - z_top), online
    z_top = tl.full((), -inf, ACC)
    top = tl.full((), 0, tl.int64)
    s = tl.full((), 0.0, ACC)
    has_nan = tl.full((), 0, tl.int32)
    for start in range(0, C, BLOCK):
        j = start + cols
        inside = j < C
        z = tl.load(z_ptr + base + j.to(tl.int64) * stride_c, mask=inside, other=-inf).to(ACC)
        if CAP:
            # soft-capping: the row is that of c = softcap tanh(z / softcap)
            z = _softcap(z, softcap, EXACT)
        has_nan = has_nan | tl.max((z != z).to(tl.int32), 0)
        block_top = tl.max(z, 0)
        # the first index of the block's largest logit
        block_at = tl.min(tl.where(z == block_top, j, C), 0)
        new_top = block_top > z_top
        m = tl.where(new_top, block_top, z_top)
        # -inf logits (and the padding) add exactly 0, also where m is still -inf
        terms = tl.where(z == -inf, 0.0, _exp(z - m, EXACT))
        terms = tl.where(j == block_at, tl.where(new_top, 0.0, terms), terms)
        # the old top joins the others, rescaled: (s + 1) exp(z_top - m)
        old = tl.where(z_top == -inf, 0.0, (s + 1.0) * _exp(z_top - m, EXACT))
        s = tl.where(new_top, old, s) + tl.sum(terms, 0)
        top = tl.where(new_top, block_at.to(tl.int64), top)
        z_top = m

    # a NaN or +inf logit (or a row of -inf) gives NaN, never a number
    log1p_s = _log1p(s, EXACT) + 0.0 * z_top
    log1p_s = tl.where(has_nan != 0, float("nan"), log1p_s)
    y = tl.load(y_ptr + row)
    keep = y != ignore_index
    y = tl.where(keep, y, 0)
    if HAS_W:
        a_y = tl.load(w_ptr + y).to(ACC)
    else:
        a_y = tl.full((), 1.0, ACC)
    a_y = tl.where(keep, a_y, 0.0)
    z_y = tl.load(z_ptr + base + y * stride_c).to(ACC)
    if CAP:
        z_y = _softcap(z_y, softcap, EXACT)
    is_top = y == top
    log_p = (z_y - z_top) - log1p_s
    p = _exp(log_p, EXACT)
    # 1 - p_top = s / (1 + s), never formed as 1 - p
    not_p = tl.where(is_top, s / (1.0 + s), 1.0 - p)
    if FOCAL:
        # log(1 - p): log s - log1p(s) at a top with s < 1, log1p(-p) elsewhere
        is_normal = s >= tiny
        log_s = tl.where(is_normal, _log(tl.where(is_normal, s, 1.0), EXACT), -inf)
        from_s = is_top & (s < 1.0)
        log_not_p = tl.where(from_s, log_s - log1p_s, _log1p(-tl.where(from_s, 0.0, p), EXACT))
        # (1 - p)^gamma = exp(gamma log(1 - p))
        focal_weight = _exp(gamma * log_not_p, EXACT)
        # phi(p) = p log p / (1 - p): -log1p(s) / s at the top (-1 + s / 2 below s = eps)
        is_big = s > eps
        phi_top = tl.where(is_big, -log1p_s / tl.where(is_big, s, 1.0), s / 2.0 - 1.0)
        has_p = (p > 0.0) & (is_top == 0)
        phi_rest = tl.where(
            has_p, p * tl.where(has_p, log_p, 0.0) / tl.where(has_p, not_p, 1.0), 0.0
        )
        phi = tl.where(is_top, phi_top, phi_rest)
        weighted = a_y * focal_weight
        v = weighted * (1.0 - gamma * phi)
    else:
        weighted = a_y
        v = a_y
    # 0 log 0 = 0: no target mass contributes nothing, also when its logit is -inf
    loss = -(weighted * tl.where((a_y == 0.0) & (log_p == -inf), 0.0, log_p))
    if Z_LOSS:
        # z-loss: z_loss lse^2, logsumexp(c) = c_top + log1p(s)
        lse = z_top + log1p_s
        loss = loss + z_loss * lse * lse
        z_coefficient = 2.0 * z_loss * lse
    else:
        z_coefficient = 0.0
    # ignored elements give 0, whatever their logits
    if STORE_LOSS:
        tl.store(loss_ptr + row, tl.where(keep, loss, 0.0).to(loss_ptr.dtype.element_ty))
    if COUNT:
        # the mean's count, `count_at` entries on in the same buffer
        if WEIGHTED_COUNT:
            tl.store(loss_ptr + count_at + row, a_y)
        else:
            tl.store(loss_ptr + count_at + row, keep.to(ACC))

    if NEEDS_GRAD:
        # pass 2: p_j v off the target, -(1 - p_y) v at it; an ignored row gets 0
        if HAS_SCALE:
            # backward's recomputation: the incoming gradient folded in, one rounding
            scale = tl.load(scale_ptr + row * scale_stride).to(ACC)
            if HAS_DIVISOR:
                # the mean's backward: the incoming gradient over the forward's denominator
                scale = scale / tl.load(divisor_ptr).to(ACC)
            v = v * scale
            z_coefficient = z_coefficient * scale
        at_y = -not_p * v
        if Z_LOSS:
            # the z-loss's 2 z_loss lse p_j in every p_j's coefficient
            at_y = at_y + z_coefficient * p
            v = v + z_coefficient
        # p_j v = exp(z_j - z_top) v / (1 + s): one rounded difference in the exponent (its
        # error grows with |z_j - z_top|), where exp(z_j - z_top - log1p(s)) would have two;
        # NaN where the row's loss is NaN
        v_over = tl.where(log1p_s != log1p_s, float("nan"), v / (1.0 + s))
        for start in range(0, C, BLOCK):
            j = start + cols
            inside = j < C
            offsets = base + j.to(tl.int64) * stride_c
            z = tl.load(z_ptr + offsets, mask=inside, other=-inf).to(ACC)
            if CAP:
                c = _softcap(z, softcap, EXACT)
            else:
                c = z
            grad = tl.where(j == y, at_y, _exp(c - z_top, EXACT) * v_over)
            if CAP:
                # the chain rule through the cap: dl/dz = dl/dc sech^2(z / softcap)
                grad = grad * _dcap(z, softcap, EXACT)
            grad = tl.where(keep, grad, 0.0)
            tl.store(grad_ptr + offsets, grad.to(grad_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _scale_rows_kernel(
    g_ptr, scale_ptr, divisor_ptr, out_ptr, C, D, stride_n, stride_c, stride_d, scale_stride,
    HAS_DIVISOR: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    n = row // D
    d = row - n * D
    base = n * stride_n + d * stride_d
    scale = tl.load(scale_ptr + row * scale_stride).to(ACC)
    if HAS_DIVISOR:
        # the mean's backward: the incoming gradient over the kernel's denominator
        scale = scale / tl.load(divisor_ptr).to(ACC)
    cols = tl.arange(0, BLOCK)
    for start in range(0, C, BLOCK):
        j = start + cols
        inside = j < C
        offsets = base + j.to(tl.int64) * stride_c
        g = tl.load(g_ptr + offsets, mask=inside, other=0.0).to(ACC)
        tl.store(out_ptr + offsets, (g * scale).to(out_ptr.dtype.element_ty), mask=inside)


def _block(num_classes: int) -> tuple[int, int]:
    """Block over the class axis (a power of two, at most 4096) and the number of warps."""
    block = min(triton.next_power_of_2(max(num_classes, 16)), 4096)
    return block, (4 if block <= 1024 else 8 if block <= 2048 else 16)


def _rows(z: Tensor, axis: int) -> tuple[int, int, int, int, int, int]:
    """(rows, C, D, stride_n, stride_c, stride_d) of contiguous logits `z` read as
    (N, C, D) around the class axis, without a view."""
    c = z.shape[axis]
    d = math.prod(z.shape[axis + 1 :])
    return z.numel() // max(c, 1), c, d, c * d, d, 1


@torch.library.custom_op(
    "dualloss::softmax_index_fwd_", mutates_args=("loss", "denominator", "grad")
)
def softmax_index_fwd_(
    z: Tensor,
    y: Tensor,
    w: Tensor | None,
    axis: int,
    gamma: float,
    ignore_index: int,
    weighted_count: bool,
    loss: Tensor,
    denominator: Tensor | None,
    grad: Tensor | None,
    z_loss: float,
    softcap: float | None,
) -> None:
    """z contiguous logits with the class axis `axis`, y contiguous int64 targets (z's shape
    without it), w (C,) the class weight (compute dtype) or None; the results written into
    buffers the caller allocates (the loss and gradient in z's dtype, one rounding each).
    `z_loss` (0: none) and `softcap` (None: none): the LLM head options (DESIGN 13).

    `loss`: y's shape for the per-element loss; 0-dim for their sum, or with a 0-dim
    `denominator` (compute dtype) for their mean over the count (a_y with `weighted_count`,
    torch's weighted mean, else 1; 0 where ignored; none kept: a mean of 0). `grad`: the
    gradient of the per-element loss, where one is needed."""
    if loss.dim() > 0:
        _launch(
            z, y, w, axis, gamma, ignore_index, weighted_count, loss, 0, grad,
            z_loss=z_loss, softcap=softcap,
        )  # fmt: skip
        return
    acc = torch.float64 if z.dtype == torch.float64 else torch.float32
    mean = denominator is not None
    rows = torch.empty((2 if mean else 1) * y.numel(), dtype=acc, device=z.device)
    count_at = y.numel() if mean else 0
    _launch(
        z, y, w, axis, gamma, ignore_index, weighted_count, rows, count_at, grad,
        z_loss=z_loss, softcap=softcap,
    )  # fmt: skip
    _reduce_kernel[(1,)](
        rows, loss, denominator if mean else loss, y.numel(), torch.finfo(acc).tiny, 0.0,
        MEAN=int(mean), ACC=_acc(z.dtype), BLOCK=1024, num_warps=4,
    )  # fmt: skip


def _launch(
    z, y, w, axis, gamma, ignore_index, weighted_count, loss, count_at, grad,
    scale=None, divisor=None, z_loss=0.0, softcap=None,
):  # fmt: skip
    """The row kernel: per-element losses into `loss` (None: not stored), their counts into
    `loss` from `count_at` on (0: none), the gradient (times `scale` / `divisor` where given)
    into `grad` (None: not computed); with the z-loss `z_loss` and the cap `softcap`."""
    rows, c, d, stride_n, stride_c, stride_d = _rows(z, axis)
    if rows == 0:
        return
    block, warps = _block(c)
    # the kernel reads w[y] at w + y: an expanded class weight (a 0-dim `alpha` tensor
    # broadcast to (C,), stride 0) laid out as C numbers first
    w = None if w is None else w.contiguous()
    acc = torch.float64 if z.dtype == torch.float64 else torch.float32
    info = torch.finfo(acc)
    scale, scale_stride = _row_scale(scale)
    anything = z  # a pointer the kernel never reads (constexpr flags say so)
    _softmax_index_kernel[(rows,)](
        z, y, w if w is not None else anything, loss if loss is not None else anything,
        count_at, grad if grad is not None else anything,
        scale if scale is not None else anything, scale_stride,
        divisor if divisor is not None else anything,
        c, d, stride_n, stride_c, stride_d,
        float(gamma), int(ignore_index), info.tiny, info.eps,
        float(z_loss), 1.0 if softcap is None else float(softcap),
        HAS_W=w is not None, WEIGHTED_COUNT=weighted_count, COUNT=count_at > 0,
        NEEDS_GRAD=grad is not None, FOCAL=gamma != 0.0, HAS_SCALE=scale is not None,
        HAS_DIVISOR=divisor is not None, STORE_LOSS=loss is not None,
        Z_LOSS=z_loss != 0.0, CAP=softcap is not None,
        ACC=_acc(z.dtype), BLOCK=block, EXACT=_EXACT, num_warps=warps,
    )  # fmt: skip


def linear_block_(z, y, w, gamma, ignore_index, loss, scale, z_loss=0.0, softcap=None):
    """A fused linear loss's block in one launch: the per-row loss of logits `z` (rows, V; a
    contiguous buffer the caller owns, compute dtype) into `loss` (rows,), and, with `scale`
    (one factor per row, or None for the loss alone), the gradient of sum_i scale_i l_i
    written over `z` itself (pass 2 reads each logit before it writes its gradient: with
    `softcap` it recomputes the cap and its derivative from that logit); with the LLM head
    options `z_loss` and `softcap` (DESIGN 13) in the same two passes. Not a custom op: the
    eager fused linear loop calls it (under torch.compile that loop keeps the eager block)."""
    grad = None if scale is None else z
    _launch(z, y, w, 1, gamma, ignore_index, False, loss, 0, grad, scale, None, z_loss, softcap)


def _row_scale(scale):
    """`scale` and its row stride: 0 for one number (the sum's or the mean's backward), read
    once per row without materialising it."""
    if scale is None:
        return None, 0
    if scale.numel() == 1:
        return scale, 0
    return scale.contiguous(), 1


@softmax_index_fwd_.register_fake
def _(z, y, w, axis, gamma, ignore_index, weighted_count, loss, denominator, grad, z_loss, softcap):
    return None


@torch.library.custom_op("dualloss::softmax_index_bwd", mutates_args=())
def softmax_index_bwd(
    z: Tensor, y: Tensor, w: Tensor | None, axis: int, gamma: float, ignore_index: int,
    scale: Tensor, divisor: Tensor | None, z_loss: float, softcap: float | None,
) -> Tensor:  # fmt: skip
    """The gradient of ``softmax_index_fwd_``'s per-element loss times `scale` (one number or
    y's shape) over `divisor` (the mean's denominator, or None), recomputed from the logits in
    one launch and rounded once to their dtype (half precision, where a gradient kept from
    forward in the logits' dtype and then scaled would be rounded twice)."""
    grad = torch.empty_like(z)
    _launch(
        z, y, w, axis, gamma, ignore_index, False, None, 0, grad, scale, divisor, z_loss, softcap
    )
    return grad


@softmax_index_bwd.register_fake
def _(z, y, w, axis, gamma, ignore_index, scale, divisor, z_loss, softcap):
    return torch.empty_like(z)


@torch.library.custom_op("dualloss::scale_rows", mutates_args=())
def scale_rows(g: Tensor, axis: int, scale: Tensor, divisor: Tensor | None) -> Tensor:
    """Contiguous g times `scale` (one number or g's shape without the class axis `axis`), over
    `divisor` (one number, or None), along that axis, in g's dtype (float32 arithmetic for half
    precision, one rounding)."""
    return _scale_rows_into(g, axis, scale, divisor, torch.empty_like(g))


@torch.library.custom_op("dualloss::scale_rows_", mutates_args=("g",))
def scale_rows_(g: Tensor, axis: int, scale: Tensor, divisor: Tensor | None) -> None:
    """``scale_rows`` in place: for a buffer the caller owns and nothing reads again (the
    graph's last backward scales the forward's gradient without a second N x C)."""
    _scale_rows_into(g, axis, scale, divisor, g)


def _scale_rows_into(g, axis, scale, divisor, out):
    rows, c, d, stride_n, stride_c, stride_d = _rows(g, axis)
    if rows == 0 or c == 0:
        return out
    scale, scale_stride = _row_scale(scale)
    block, warps = _block(c)
    _scale_rows_kernel[(rows,)](
        g, scale, divisor if divisor is not None else scale, out,
        c, d, stride_n, stride_c, stride_d, scale_stride,
        HAS_DIVISOR=divisor is not None, ACC=_acc(g.dtype), BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return out


@scale_rows_.register_fake
def _(g, axis, scale, divisor):
    return None


@scale_rows.register_fake
def _(g, axis, scale, divisor):
    return torch.empty_like(g)


# ----------------------------------------------------------------------------------------------
# Probability targets (the cross entropy and the focal loss): a dense target mass
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dense_mass(t_ptr, w_ptr, offsets, j, inside, valid, smoothing, uniform,
                HAS_W: tl.constexpr, SMOOTH: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """a_c = w_c t~_c of a block of classes: the target on the classes inside `where`, smoothed
    as (1 - eps) t + eps / K."""
    a = tl.load(t_ptr + offsets, mask=inside, other=0.0).to(ACC)
    if SMOOTH:
        a = (1.0 - smoothing) * a + uniform
    a = tl.where(valid, a, 0.0)
    if HAS_W:
        a = a * tl.load(w_ptr + j, mask=inside, other=0.0).to(ACC)
    return a


@triton.jit
def _dense_terms(c, a, is_top, z_top, s, log1p_s, log_s, gamma, eps,
                 FOCAL: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """A block of classes' p, 1 - p, v (``spec._softmax_focal_terms``: a (1 - p)^gamma
    (1 - gamma phi), a at gamma 0) and loss term a (1 - p)^gamma log p (0 where a is 0)."""
    log_p = (c - z_top) - log1p_s
    # p = exp(c - c_top) / (1 + s): one rounded difference in the exponent
    p = tl.where(c == -float("inf"), 0.0, _exp(c - z_top, EXACT)) / (1.0 + s)
    # 1 - p_top = s / (1 + s), never formed as 1 - p
    not_p = tl.where(is_top, s / (1.0 + s), 1.0 - p)
    if FOCAL:
        # log(1 - p): log s - log1p(s) at a top with s < 1, log1p(-p) elsewhere
        from_s = tl.where(is_top, s < 1.0, False)
        log_not_p = tl.where(from_s, log_s - log1p_s, _log1p(-tl.where(from_s, 0.0, p), EXACT))
        focal_weight = _exp(gamma * log_not_p, EXACT)
        # phi(p) = p log p / (1 - p): -log1p(s) / s at the top (-1 + s / 2 below s = eps)
        is_big = s > eps
        phi_top = tl.where(is_big, -log1p_s / tl.where(is_big, s, 1.0), s / 2.0 - 1.0)
        has_p = tl.where(is_top, False, p > 0.0)
        phi_rest = tl.where(
            has_p, p * tl.where(has_p, log_p, 0.0) / tl.where(has_p, not_p, 1.0), 0.0
        )
        weighted = a * focal_weight
        v = weighted * (1.0 - gamma * tl.where(is_top, phi_top, phi_rest))
    else:
        weighted = a
        v = a
    # 0 log 0 = 0: a class with no mass adds nothing, also at a logit of -inf (0 log1p(s): NaN
    # where the row is NaN)
    term = tl.where(a == 0.0, 0.0 * log1p_s, weighted * log_p)
    return p, not_p, v, term


@triton.jit
def _softmax_dense_kernel(
    z_ptr, t_ptr, w_ptr, m_ptr, loss_ptr, count_at, grad_ptr, scale_ptr, scale_stride,
    divisor_ptr, C, D, stride_n, stride_c, stride_d, m_stride_n, m_stride_c, m_stride_d,
    gamma, smoothing, tiny, eps, z_loss, softcap,
    HAS_W: tl.constexpr, HAS_M: tl.constexpr, SMOOTH: tl.constexpr, FOCAL: tl.constexpr,
    COUNT: tl.constexpr, NEEDS_GRAD: tl.constexpr, HAS_SCALE: tl.constexpr,
    HAS_DIVISOR: tl.constexpr, STORE_LOSS: tl.constexpr, Z_LOSS: tl.constexpr,
    CAP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """``spec._softmax_focal_terms`` for a target mass a_c = w_c t~_c per class: t~ the target
    distribution t on the classes inside `where` (m; classes outside it are a logit of -inf and
    lose their mass), smoothed as (1 - eps) t + eps / K over the K classes inside it. Pass 1 as
    the index kernel's (z_top, the first top, s without the top's 1) and K; pass 2 each class's
    v (``_dense_terms``; a at gamma 0): V = sum v, the class of the largest v (the first) and
    the sum of the others' (``spec._sum_except_self``), and the loss -sum a (1 - p)^gamma log p,
    terms of one sign. Pass 3 writes the gradient p_j sum_{c != j} v_c - (1 - p_j) v_j, plus
    2 z_loss lse p_j, through the cap. A row with no class inside `where` is left out (0, no
    gradient)."""
    row = tl.program_id(0).to(tl.int64)
    n = row // D
    d = row - n * D
    base = n * stride_n + d * stride_d
    m_base = n * m_stride_n + d * m_stride_d
    cols = tl.arange(0, BLOCK)
    inf = float("inf")

    # pass 1: z_top, top (first on ties), s = sum_{j != top} exp(c_j - c_top) and K, online
    z_top = tl.full((), -inf, ACC)
    top = tl.full((), 0, tl.int64)
    s = tl.full((), 0.0, ACC)
    has_nan = tl.full((), 0, tl.int32)
    num_valid = tl.full((), 0, tl.int32)
    for start in range(0, C, BLOCK):
        j = start + cols
        inside = j < C
        z = tl.load(z_ptr + base + j.to(tl.int64) * stride_c, mask=inside, other=-inf).to(ACC)
        if CAP:
            z = _softcap(z, softcap, EXACT)
        if HAS_M:
            # classes outside `where` leave the softmax: a logit of -inf, whatever it was
            valid = tl.load(m_ptr + m_base + j.to(tl.int64) * m_stride_c, mask=inside, other=0)
            valid = (valid != 0) & inside
            z = tl.where(valid, z, -inf)
            num_valid += tl.sum(valid.to(tl.int32), 0)
        has_nan = has_nan | tl.max((z != z).to(tl.int32), 0)
        block_top = tl.max(z, 0)
        block_at = tl.min(tl.where(z == block_top, j, C), 0)
        new_top = block_top > z_top
        m = tl.where(new_top, block_top, z_top)
        terms = tl.where(z == -inf, 0.0, _exp(z - m, EXACT))
        terms = tl.where(j == block_at, tl.where(new_top, 0.0, terms), terms)
        old = tl.where(z_top == -inf, 0.0, (s + 1.0) * _exp(z_top - m, EXACT))
        s = tl.where(new_top, old, s) + tl.sum(terms, 0)
        top = tl.where(new_top, block_at.to(tl.int64), top)
        z_top = m
    if HAS_M:
        keep = num_valid > 0
    else:
        keep = C > 0
        num_valid = C
    # a NaN or +inf logit (or a row of -inf) gives NaN, never a number
    log1p_s = _log1p(s, EXACT) + 0.0 * z_top
    log1p_s = tl.where(has_nan != 0, float("nan"), log1p_s)
    is_normal = s >= tiny
    log_s = tl.where(is_normal, _log(tl.where(is_normal, s, 1.0), EXACT), -inf)
    uniform = smoothing / tl.maximum(num_valid, 1).to(ACC)

    # pass 2: V = sum v, the largest v and the others' sum, and the loss
    total = tl.full((), 0.0, ACC)
    big = tl.full((), -1.0, ACC)
    big_at = tl.full((), 0, tl.int64)
    rest = tl.full((), 0.0, ACC)
    loss = tl.full((), 0.0, ACC)
    for start in range(0, C, BLOCK):
        j = start + cols
        inside = j < C
        offsets = base + j.to(tl.int64) * stride_c
        c = tl.load(z_ptr + offsets, mask=inside, other=-inf).to(ACC)
        if CAP:
            c = _softcap(c, softcap, EXACT)
        if HAS_M:
            valid = tl.load(m_ptr + m_base + j.to(tl.int64) * m_stride_c, mask=inside, other=0)
            valid = (valid != 0) & inside
            c = tl.where(valid, c, -inf)
        else:
            valid = inside
        a = _dense_mass(t_ptr, w_ptr, offsets, j, inside, valid, smoothing, uniform,
                        HAS_W, SMOOTH, ACC)  # fmt: skip
        _, _, v, term = _dense_terms(c, a, j == top, z_top, s, log1p_s, log_s, gamma, eps,
                                     FOCAL, EXACT)  # fmt: skip
        block_big = tl.max(v, 0)
        block_at = tl.min(tl.where(v == block_big, j, C), 0)
        # the block's others summed without its largest (no sum - largest cancellation)
        block_rest = tl.sum(tl.where(j == block_at, 0.0, v), 0)
        total += block_rest + block_big
        new_big = block_big > big
        # a new largest: the old one (none at first) joins the others, the block's stays out
        rest = rest + block_rest + tl.where(new_big, tl.maximum(big, 0.0), block_big)
        big_at = tl.where(new_big, block_at.to(tl.int64), big_at)
        big = tl.where(new_big, block_big, big)
        loss -= tl.sum(term, 0)
    if Z_LOSS:
        lse = z_top + log1p_s
        loss = loss + z_loss * lse * lse
        z_coefficient = 2.0 * z_loss * lse
    else:
        z_coefficient = 0.0
    if STORE_LOSS:
        tl.store(loss_ptr + row, tl.where(keep, loss, 0.0).to(loss_ptr.dtype.element_ty))
    if COUNT:
        tl.store(loss_ptr + count_at + row, keep.to(ACC))

    if NEEDS_GRAD:
        # pass 3: p_j sum_{c != j} v_c - (1 - p_j) v_j (+ 2 z_loss lse p_j); masked classes and
        # rows not kept get 0
        scale = 1.0
        if HAS_SCALE:
            scale = tl.load(scale_ptr + row * scale_stride).to(ACC)
            if HAS_DIVISOR:
                scale = scale / tl.load(divisor_ptr).to(ACC)
        for start in range(0, C, BLOCK):
            j = start + cols
            inside = j < C
            offsets = base + j.to(tl.int64) * stride_c
            z = tl.load(z_ptr + offsets, mask=inside, other=-inf).to(ACC)
            if CAP:
                c = _softcap(z, softcap, EXACT)
            else:
                c = z
            if HAS_M:
                valid = tl.load(m_ptr + m_base + j.to(tl.int64) * m_stride_c, mask=inside, other=0)
                valid = (valid != 0) & inside
                c = tl.where(valid, c, -inf)
            else:
                valid = inside
            a = _dense_mass(t_ptr, w_ptr, offsets, j, inside, valid, smoothing, uniform,
                            HAS_W, SMOOTH, ACC)  # fmt: skip
            p, not_p, v, _ = _dense_terms(c, a, j == top, z_top, s, log1p_s, log_s, gamma, eps,
                                          FOCAL, EXACT)  # fmt: skip
            others = tl.where(j == big_at, rest, total - v)
            grad = p * others - not_p * v
            if Z_LOSS:
                grad = grad + z_coefficient * p
            # NaN where the row's loss is NaN
            grad = tl.where(log1p_s != log1p_s, float("nan"), grad) * scale
            if CAP:
                grad = grad * _dcap(z, softcap, EXACT)
            grad = tl.where(keep & valid, grad, 0.0)
            tl.store(grad_ptr + offsets, grad.to(grad_ptr.dtype.element_ty), mask=inside)


def _flat_stride(sizes, strides) -> int | None:
    """One stride that walks dimensions `sizes` (with `strides`) in row-major order, or None
    where no single stride does (0 for a walk over broadcast or no dimensions)."""
    stride, inner = None, 1
    for size, step in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:
            continue
        if stride is None:
            stride = step
        elif step != stride * inner:
            return None
        inner *= size
    return 0 if stride is None else stride


def _mask_rows(where: Tensor | None, shape, axis: int) -> tuple[Tensor | None, int, int, int]:
    """`where` (broadcastable to `shape`) read as (N, C, D) around the class axis, through its
    own strides (0 along broadcast dimensions; no torch op, so no expanded copy), and its three
    strides; a copy only where the rows or the trailing dimensions cannot be walked with one
    stride."""
    if where is None:
        return None, 0, 0, 0
    lead = len(shape) - where.dim()
    strides = [0] * lead + [
        0 if size == 1 else step for size, step in zip(where.shape, where.stride(), strict=True)
    ]
    row = _flat_stride(shape[:axis], strides[:axis])
    trailing = _flat_stride(shape[axis + 1 :], strides[axis + 1 :])
    if row is None or trailing is None:
        where = where.expand(shape).contiguous()
        return _mask_rows(where, shape, axis)
    return where, row, strides[axis], trailing


def _dense_launch(
    z, t, w, where, axis, gamma, label_smoothing, loss, count_at, grad, scale=None,
    divisor=None, z_loss=0.0, softcap=None,
):  # fmt: skip
    """The dense-mass row kernel: the per-element losses into `loss` (None: not stored), the
    kept rows' counts from `count_at` on (0: none), the gradient (times `scale` / `divisor`)
    into `grad` (None: not computed)."""
    rows, c, d, stride_n, stride_c, stride_d = _rows(z, axis)
    if rows == 0:
        return
    block, warps = _block(c)
    scale, scale_stride = _row_scale(scale)
    # the kernel reads w at w + j (an expanded 0-dim `alpha` laid out as C numbers first)
    w = None if w is None else w.contiguous()
    m, m_stride_n, m_stride_c, m_stride_d = _mask_rows(where, z.shape, axis)
    info = torch.finfo(torch.float64 if z.dtype == torch.float64 else torch.float32)
    anything = z  # a pointer the kernel never reads (constexpr flags say so)
    _softmax_dense_kernel[(rows,)](
        z, t, w if w is not None else anything, m if m is not None else anything,
        loss if loss is not None else anything, count_at, grad if grad is not None else anything,
        scale if scale is not None else anything, scale_stride,
        divisor if divisor is not None else anything,
        c, d, stride_n, stride_c, stride_d, m_stride_n, m_stride_c, m_stride_d,
        float(gamma), float(label_smoothing), info.tiny, info.eps, float(z_loss),
        1.0 if softcap is None else float(softcap),
        HAS_W=w is not None, HAS_M=m is not None, SMOOTH=label_smoothing != 0.0,
        FOCAL=gamma != 0.0, COUNT=count_at > 0, NEEDS_GRAD=grad is not None,
        HAS_SCALE=scale is not None,
        HAS_DIVISOR=divisor is not None, STORE_LOSS=loss is not None,
        Z_LOSS=z_loss != 0.0, CAP=softcap is not None,
        ACC=_acc(z.dtype), BLOCK=block, EXACT=_EXACT, num_warps=warps,
    )  # fmt: skip


@torch.library.custom_op(
    "dualloss::softmax_dense_fwd_", mutates_args=("loss", "denominator", "grad")
)
def softmax_dense_fwd_(
    z: Tensor,
    t: Tensor,
    w: Tensor | None,
    where: Tensor | None,
    axis: int,
    gamma: float,
    label_smoothing: float,
    loss: Tensor,
    denominator: Tensor | None,
    grad: Tensor | None,
    z_loss: float,
    softcap: float | None,
) -> None:
    """The softmax losses with probability targets: z contiguous logits with the class axis
    `axis`, t contiguous targets of z's shape, w (C,) the class weight or None, `where` a class
    mask broadcastable to z or None; the results written into buffers the caller allocates
    (``softmax_index_fwd_``'s: `loss` y's shape, or 0-dim for the sum, or with a 0-dim
    `denominator` the mean over the rows with a class inside `where`)."""
    if loss.dim() > 0:
        _dense_launch(
            z, t, w, where, axis, gamma, label_smoothing, loss, 0, grad, None, None, z_loss,
            softcap,
        )  # fmt: skip
        return
    acc = torch.float64 if z.dtype == torch.float64 else torch.float32
    mean = denominator is not None
    num_rows = z.numel() // max(z.shape[axis], 1)
    rows = torch.empty((2 if mean else 1) * num_rows, dtype=acc, device=z.device)
    count_at = num_rows if mean else 0
    _dense_launch(z, t, w, where, axis, gamma, label_smoothing, rows, count_at, grad, None, None,
                  z_loss,
                  softcap)  # fmt: skip
    _reduce_kernel[(1,)](
        rows, loss, denominator if mean else loss, num_rows, torch.finfo(acc).tiny, 0.0,
        MEAN=int(mean), ACC=_acc(z.dtype), BLOCK=1024, num_warps=4,
    )  # fmt: skip


@softmax_dense_fwd_.register_fake
def _(z, t, w, where, axis, gamma, label_smoothing, loss, denominator, grad, z_loss, softcap):
    return None


@torch.library.custom_op("dualloss::softmax_dense_bwd", mutates_args=())
def softmax_dense_bwd(
    z: Tensor, t: Tensor, w: Tensor | None, where: Tensor | None, axis: int, gamma: float,
    label_smoothing: float, scale: Tensor, divisor: Tensor | None, z_loss: float,
    softcap: float | None,
) -> Tensor:  # fmt: skip
    """The gradient of ``softmax_dense_fwd_``'s per-element loss times `scale` over `divisor`,
    recomputed from the logits in one launch and rounded once (half precision)."""
    grad = torch.empty_like(z)
    _dense_launch(z, t, w, where, axis, gamma, label_smoothing, None, 0, grad, scale, divisor,
                  z_loss,
                  softcap)  # fmt: skip
    return grad


@softmax_dense_bwd.register_fake
def _(z, t, w, where, axis, gamma, label_smoothing, scale, divisor, z_loss, softcap):
    return torch.empty_like(z)
