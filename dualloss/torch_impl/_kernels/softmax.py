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

`where` (``spec._softmax_inputs``): the boolean class mask is read through its own strides (a
broadcast dim has stride 0: no expanded copy); a class outside it is a logit of -inf whatever
its value, and a target outside it or a row with no class left gives 0 and no gradient, like an
ignored target. Label smoothing, the cross entropy (gamma 0): the target mass
a_j = w_j ((1 - eps) [j == y] + eps / K [j inside `where`]), K the classes inside it (C without),
A = sum_j a_j from pass 1's sums of the weights; the loss
-sum_j a_j log p_j = A log1p(s) + (1 - eps) w_y (c_top - c_y) + eps / K sum_j w_j (c_top - c_j)
(``spec._softmax_focal_terms`` with gamma 0; every term >= 0, 0 log 0 = 0), its last sum read in
pass 2 (or a pass of its own when no gradient is asked), which writes A p_j - a_j, and at the top
p_top sum_{j != top} a_j - (1 - p_top) a_top (no p - 1 there). The focal loss with smoothing
(gamma > 0) has a focal term at every class (``spec._softmax_focal_terms`` with the dense mass
a): it is the probability-target kernel's (below), its mass formed from y; still one launch.

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
def _times_gap(a, top, c):
    """a (c_top - c) for a mass a >= 0: where the difference overflows though both logits are
    finite (a row spanning more than the dtype's largest number, c_top > 0 > c), a c_top - a c,
    two terms of one sign, finite wherever the product is."""
    gap = top - c
    far = (gap == float("inf")) & (c != -float("inf"))
    return tl.where(far, a * top - a * c, a * gap)


@triton.jit
def _focal_terms(c, is_top, z_top, s, log_s, log1p_s, a, gamma, eps, EXACT: tl.constexpr):
    """The focal terms of a block of classes with target mass `a` (``spec._softmax_focal_terms``):
    log p, (1 - p)^gamma and v = a (1 - p)^gamma (1 - gamma phi(p)), from the row's c_top, s,
    log s and log1p(s) (``spec._log_softmax``, ``spec._focal_phi``)."""
    log_p = (c - z_top) - log1p_s
    p = _exp(c - z_top, EXACT) / (1.0 + s)
    not_p = tl.where(is_top, s / (1.0 + s), 1.0 - p)
    # log(1 - p): log s - log1p(s) at a top with s < 1, log1p(-p) elsewhere
    # s as a block: the interpreter cannot `&` a block of booleans with a scalar one
    s_block = tl.zeros_like(c) + s
    from_s = is_top & (s_block < 1.0)
    log_not_p = tl.where(from_s, log_s - log1p_s, _log1p(-tl.where(from_s, 0.0, p), EXACT))
    # (1 - p)^gamma = exp(gamma log(1 - p))
    focal_weight = _exp(gamma * log_not_p, EXACT)
    # phi(p) = p log p / (1 - p): -log1p(s) / s at the top (-1 + s / 2 below s = eps)
    is_big = s_block > eps
    phi_top = tl.where(is_big, -log1p_s / tl.where(is_big, s_block, 1.0), s_block / 2.0 - 1.0)
    has_p = (p > 0.0) & (is_top == 0)
    safe_log_p = tl.where(has_p, log_p, 0.0)
    phi_rest = tl.where(has_p, p * safe_log_p / tl.where(has_p, not_p, 1.0), 0.0)
    phi = tl.where(is_top, phi_top, phi_rest)
    v = a * focal_weight * (1.0 - gamma * phi)
    return log_p, p, not_p, focal_weight, v


@triton.jit
def _softmax_index_kernel(
    z_ptr, y_ptr, w_ptr, m_ptr, loss_ptr, count_at, grad_ptr, scale_ptr, scale_stride, divisor_ptr,
    C, D, stride_n, stride_c, stride_d, stride_mn, stride_mc, stride_md,
    gamma, ignore_index, tiny, eps, z_loss, softcap, smoothing,
    HAS_W: tl.constexpr, WEIGHTED_COUNT: tl.constexpr, COUNT: tl.constexpr,
    NEEDS_GRAD: tl.constexpr,
    FOCAL: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DIVISOR: tl.constexpr,
    STORE_LOSS: tl.constexpr, Z_LOSS: tl.constexpr, CAP: tl.constexpr,
    HAS_WHERE: tl.constexpr, SMOOTH: tl.constexpr,
    SECOND_PASS: tl.constexpr,
    ACC: tl.constexpr, BLOCK: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    n = row // D
    d = row - n * D
    base = n * stride_n + d * stride_d
    if HAS_WHERE:
        mbase = n * stride_mn + d * stride_md
    cols = tl.arange(0, BLOCK)
    inf = float("inf")
    y = tl.load(y_ptr + row)
    keep = y != ignore_index
    y = tl.where(keep, y, 0)

    # pass 1: z_top, top (first on ties) and s = sum_{j != top} exp(z_j - z_top), online; with
    # `where` the classes left (K), with smoothing the class weights inside it (all, and all but y)
    z_top = tl.full((), -inf, ACC)
    top = tl.full((), 0, tl.int64)
    s = tl.full((), 0.0, ACC)
    has_nan = tl.full((), 0, tl.int32)
    if SMOOTH:
        num_valid = tl.full((), 0, tl.int32)
        w_valid = tl.full((), 0.0, ACC)
        w_valid_not_y = tl.full((), 0.0, ACC)
    for start in range(0, C, BLOCK):
        j = start + cols
        inside = j < C
        z = tl.load(z_ptr + base + j.to(tl.int64) * stride_c, mask=inside, other=-inf).to(ACC)
        if HAS_WHERE:
            # the class mask through its own strides: a class outside it leaves the row (a
            # logit of -inf), whatever its value, NaN and +inf too
            at = mbase + j.to(tl.int64) * stride_mc
            valid = inside & (tl.load(m_ptr + at, mask=inside, other=0) != 0)
            z = tl.where(valid, z, -inf)
        else:
            valid = inside
        if CAP:
            # soft-capping: the row is that of c = softcap tanh(z / softcap)
            z = _softcap(z, softcap, EXACT)
        if SMOOTH:
            num_valid += tl.sum(valid.to(tl.int32), 0)
            if HAS_W:
                w_j = tl.load(w_ptr + j, mask=valid, other=0.0).to(ACC)
            else:
                w_j = valid.to(ACC)
            w_valid += tl.sum(w_j, 0)
            w_valid_not_y += tl.sum(tl.where(j == y, 0.0, w_j), 0)
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
    if HAS_WHERE:
        # a target outside `where` (or a row with no class left) is left out like an ignored one
        keep = keep & (tl.load(m_ptr + mbase + y * stride_mc) != 0)
    if HAS_W:
        w_y = tl.load(w_ptr + y).to(ACC)
    else:
        w_y = tl.full((), 1.0, ACC)
    w_y = tl.where(keep, w_y, 0.0)
    z_y = tl.load(z_ptr + base + y * stride_c).to(ACC)
    if CAP:
        z_y = _softcap(z_y, softcap, EXACT)
    is_top = y == top
    log_p = (z_y - z_top) - log1p_s
    p = _exp(log_p, EXACT)
    # 1 - p_top = s / (1 + s), never formed as 1 - p
    not_p = tl.where(is_top, s / (1.0 + s), 1.0 - p)
    if SMOOTH:
        # the target mass a_j = w_j ((1 - eps) [j == y] + eps / K [j inside `where`]): `hot` at
        # y, eps_k w_j at every class left; A = sum_j a_j, and the others' share at y and top
        eps_k = tl.where(keep, smoothing / tl.maximum(num_valid, 1).to(ACC), 0.0)
        hot = (1.0 - smoothing) * w_y
        a_y = hot + eps_k * w_y
        mass = hot + eps_k * w_valid
        if HAS_W:
            w_top = tl.load(w_ptr + top).to(ACC)
        else:
            w_top = tl.full((), 1.0, ACC)
        # sum_{j != top} a_j, summed apart where the top is the target (no cancellation)
        rest_top = tl.where(
            is_top, eps_k * w_valid_not_y, hot + eps_k * tl.maximum(w_valid - w_top, 0.0)
        )
        a_top = tl.where(is_top, a_y, eps_k * w_top)
        weighted = a_y
        v = a_y
    elif FOCAL:
        a_y = w_y
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
        a_y = w_y
        weighted = a_y
        v = a_y
    # 0 log 0 = 0: no target mass contributes nothing, also when its logit is -inf
    loss = -(weighted * tl.where((a_y == 0.0) & (log_p == -inf), 0.0, log_p))
    # z_y - z_top overflowed though both are finite: weighted (z_top - z_y) + weighted log1p(s)
    far = (log_p == -inf) & (z_y != -inf)
    loss = tl.where(far, _times_gap(weighted, z_top, z_y) + weighted * log1p_s, loss)
    if Z_LOSS:
        # z-loss: z_loss lse^2, logsumexp(c) = c_top + log1p(s)
        lse = z_top + log1p_s
        z_coefficient = 2.0 * z_loss * lse
    else:
        z_coefficient = 0.0

    if NEEDS_GRAD:
        # pass 2: p_j v off the target, -(1 - p_y) v at it; an ignored row gets 0
        if HAS_SCALE:
            # backward's recomputation: the incoming gradient folded in, one rounding
            scale = tl.load(scale_ptr + row * scale_stride).to(ACC)
            if HAS_DIVISOR:
                # the mean's backward: the incoming gradient over the forward's denominator
                scale = scale / tl.load(divisor_ptr).to(ACC)
        if SMOOTH:
            # A p_j - a_j (+ the z-loss's 2 z_loss lse p_j): p_j (A + z) / (1 + s) - a_j off the
            # top; at it p_top (sum_{j != top} a_j + z) - (1 - p_top) a_top (no p - 1 there);
            # NaN where the row's loss is NaN
            is_nan = log1p_s != log1p_s
            at_top = (rest_top + z_coefficient) / (1.0 + s) - s / (1.0 + s) * a_top
            at_top = tl.where(is_nan, float("nan"), at_top)
            v_over = tl.where(is_nan, float("nan"), (mass + z_coefficient) / (1.0 + s))
        else:
            if HAS_SCALE:
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
    # smoothing: sum_j eps_k w_j (c_top - c_j) over the classes with mass, read with the
    # gradient's pass (or in a pass of its own when no gradient is asked for); each term times
    # its mass before the sum, which (like the loss) stays finite where sum_j w_j (c_top - c_j)
    # would not (a margin near the dtype's largest number)
    if SMOOTH:
        spread = tl.full((), 0.0, ACC)
    if SECOND_PASS:
        for start in range(0, C, BLOCK):
            j = start + cols
            inside = j < C
            offsets = base + j.to(tl.int64) * stride_c
            z = tl.load(z_ptr + offsets, mask=inside, other=-inf).to(ACC)
            if HAS_WHERE:
                at = mbase + j.to(tl.int64) * stride_mc
                valid = inside & (tl.load(m_ptr + at, mask=inside, other=0) != 0)
                z = tl.where(valid, z, -inf)
            else:
                valid = inside
            if CAP:
                c = _softcap(z, softcap, EXACT)
            else:
                c = z
            if SMOOTH:
                if HAS_W:
                    w_j = tl.load(w_ptr + j, mask=valid, other=0.0).to(ACC)
                else:
                    w_j = valid.to(ACC)
                m_j = eps_k * w_j
                # 0 log 0 = 0: a class without mass adds nothing, also at a logit of -inf
                has_mass = m_j != 0.0
                shifted = _times_gap(m_j, z_top, tl.where(has_mass, c, 0.0))
                spread += tl.sum(tl.where(has_mass, shifted, 0.0), 0)
            if NEEDS_GRAD:
                if SMOOTH:
                    grad = _exp(c - z_top, EXACT) * v_over - m_j
                    grad = tl.where(j == y, grad - hot, grad)
                    grad = tl.where(j == top, at_top, grad)
                    if HAS_SCALE:
                        grad = grad * scale
                else:
                    grad = tl.where(j == y, at_y, _exp(c - z_top, EXACT) * v_over)
                if CAP:
                    # the chain rule through the cap: dl/dz = dl/dc sech^2(z / softcap)
                    grad = grad * _dcap(z, softcap, EXACT)
                # ignored elements and classes outside `where` get 0
                if HAS_WHERE:
                    grad = tl.where(keep & valid, grad, 0.0)
                else:
                    grad = tl.where(keep, grad, 0.0)
                tl.store(grad_ptr + offsets, grad.to(grad_ptr.dtype.element_ty), mask=inside)

    if SMOOTH:
        # -sum_j a_j log p_j = A log1p(s) + (1 - eps) w_y (c_top - c_y) + sum_j eps_k w_j
        # (c_top - c_j): every term >= 0; 0 log 0 = 0 where y has no mass of its own
        hot_term = tl.where(hot == 0.0, 0.0, _times_gap(hot, z_top, z_y))
        loss = mass * log1p_s + hot_term + spread
    if Z_LOSS:
        loss = loss + z_loss * lse * lse
    # ignored elements give 0, whatever their logits
    if STORE_LOSS:
        tl.store(loss_ptr + row, tl.where(keep, loss, 0.0).to(loss_ptr.dtype.element_ty))
    if COUNT:
        # the mean's count, `count_at` entries on in the same buffer: torch's weighted mean
        # divides by the kept targets' class weights (with smoothing too), else their number
        if WEIGHTED_COUNT:
            tl.store(loss_ptr + count_at + row, w_y)
        else:
            tl.store(loss_ptr + count_at + row, keep.to(ACC))


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
    where: Tensor | None,
    label_smoothing: float,
) -> None:
    """z contiguous logits with the class axis `axis`, y contiguous int64 targets (z's shape
    without it), w (C,) the class weight (compute dtype) or None; the results written into
    buffers the caller allocates (the loss and gradient in z's dtype, one rounding each).
    `z_loss` (0: none) and `softcap` (None: none): the LLM head options (DESIGN 13). `where`:
    the boolean class mask broadcastable to z (None: every class), read through its strides;
    `label_smoothing` (cross entropy only, gamma 0): the eps of the smoothed target mass.

    `loss`: y's shape for the per-element loss; 0-dim for their sum, or with a 0-dim
    `denominator` (compute dtype) for their mean over the count (a_y with `weighted_count`,
    torch's weighted mean, else 1; 0 where ignored; none kept: a mean of 0). `grad`: the
    gradient of the per-element loss, where one is needed."""
    if loss.dim() > 0:
        _launch(
            z, y, w, axis, gamma, ignore_index, weighted_count, loss, 0, grad,
            z_loss=z_loss, softcap=softcap, where=where, label_smoothing=label_smoothing,
        )  # fmt: skip
        return
    acc = torch.float64 if z.dtype == torch.float64 else torch.float32
    mean = denominator is not None
    rows = torch.empty((2 if mean else 1) * y.numel(), dtype=acc, device=z.device)
    count_at = y.numel() if mean else 0
    _launch(
        z, y, w, axis, gamma, ignore_index, weighted_count, rows, count_at, grad,
        z_loss=z_loss, softcap=softcap, where=where, label_smoothing=label_smoothing,
    )  # fmt: skip
    _reduce_kernel[(1,)](
        rows, loss, denominator if mean else loss, y.numel(), torch.finfo(acc).tiny, 0.0,
        MEAN=int(mean), ACC=_acc(z.dtype), BLOCK=1024, num_warps=4,
    )  # fmt: skip


def _launch(
    z, y, w, axis, gamma, ignore_index, weighted_count, loss, count_at, grad,
    scale=None, divisor=None, z_loss=0.0, softcap=None, where=None, label_smoothing=0.0,
):  # fmt: skip
    """The row kernel: per-element losses into `loss` (None: not stored), their counts into
    `loss` from `count_at` on (0: none), the gradient (times `scale` / `divisor` where given)
    into `grad` (None: not computed); with the z-loss `z_loss`, the cap `softcap`, the class
    mask `where` and the smoothing `label_smoothing` (with gamma > 0: the dense-mass kernel)."""
    smoothed, focal = label_smoothing != 0.0, gamma != 0.0
    if smoothed and focal:
        # the focal loss with smoothing has a focal term at every class: the dense-mass kernel,
        # its mass a_j = w_j ((1 - eps) [j == y] + eps / K) formed from y
        _dense_launch(
            z, y, w, where, axis, gamma, label_smoothing, loss, count_at, grad, scale, divisor,
            z_loss, softcap, ignore_index, weighted_count,
        )  # fmt: skip
        return
    rows, c, d, stride_n, stride_c, stride_d = _rows(z, axis)
    if rows == 0:
        return
    mask, mask_strides = _mask_rows(where, z.shape, axis)
    block, warps = _block(c)
    # the kernel reads w[y] at w + y: an expanded class weight (a 0-dim `alpha` tensor
    # broadcast to (C,), stride 0) laid out as C numbers first
    w = None if w is None else w.contiguous()
    acc = torch.float64 if z.dtype == torch.float64 else torch.float32
    info = torch.finfo(acc)
    scale, scale_stride = _row_scale(scale)
    anything = z  # a pointer the kernel never reads (constexpr flags say so)
    _softmax_index_kernel[(rows,)](
        z, y, w if w is not None else anything, mask if mask is not None else anything,
        loss if loss is not None else anything, count_at, grad if grad is not None else anything,
        scale if scale is not None else anything, scale_stride,
        divisor if divisor is not None else anything,
        c, d, stride_n, stride_c, stride_d, *mask_strides,
        float(gamma), int(ignore_index), info.tiny, info.eps,
        float(z_loss), 1.0 if softcap is None else float(softcap), float(label_smoothing),
        HAS_W=w is not None, WEIGHTED_COUNT=weighted_count, COUNT=count_at > 0,
        NEEDS_GRAD=grad is not None, FOCAL=focal, HAS_SCALE=scale is not None,
        HAS_DIVISOR=divisor is not None, STORE_LOSS=loss is not None,
        Z_LOSS=z_loss != 0.0, CAP=softcap is not None,
        HAS_WHERE=mask is not None, SMOOTH=smoothed, SECOND_PASS=grad is not None or smoothed,
        ACC=_acc(z.dtype), BLOCK=block, EXACT=_EXACT, num_warps=warps,
    )  # fmt: skip


def _merged_stride(sizes, strides):
    """The one stride that walks the dims `sizes` (their `strides`) as a flat index, or None
    where none does (a broadcast dim, stride 0, outside a dim of its own)."""
    dims = [(size, stride) for size, stride in zip(sizes, strides, strict=True) if size != 1]
    for (_, outer), (size, inner) in zip(dims, dims[1:], strict=False):
        if outer != inner * size:
            return None
    return dims[-1][1] if dims else 0


def _mask_rows(where, shape, axis):
    """`where` (broadcastable to the logits `shape`) and its strides (n, c, d) around the class
    axis, as ``_rows`` reads the logits: a broadcast dim has stride 0, so a class mask shared by
    the rows is read in place. Where a broadcast cannot be walked with one stride per side (a
    broadcast dim between two kept ones), the mask is made contiguous, once per call."""
    if where is None:
        return None, (0, 0, 0)
    pad = len(shape) - where.dim()
    strides = [0] * pad + [
        0 if size == 1 else stride for size, stride in zip(where.shape, where.stride(), strict=True)
    ]
    stride_n = _merged_stride(shape[:axis], strides[:axis])
    stride_d = _merged_stride(shape[axis + 1 :], strides[axis + 1 :])
    if stride_n is None or stride_d is None:
        where = where.expand(shape).contiguous()
        return _mask_rows(where, shape, axis)
    return where, (stride_n, strides[axis], stride_d)


def linear_block_(
    z, y, w, gamma, ignore_index, loss, scale, z_loss=0.0, softcap=None, label_smoothing=0.0
):
    """A fused linear loss's block in one launch: the per-row loss of logits `z` (rows, V; a
    contiguous buffer the caller owns, compute dtype) into `loss` (rows,), and, with `scale`
    (one factor per row, or None for the loss alone), the gradient of sum_i scale_i l_i
    written over `z` itself (pass 2 reads each logit before it writes its gradient: with
    `softcap` it recomputes the cap and its derivative from that logit); with the LLM head
    options `z_loss` and `softcap` (DESIGN 13) and `label_smoothing` in the kernel's own passes
    (each reads a logit before the last one writes its gradient). Not a custom op: the eager
    fused linear loop calls it (under torch.compile that loop keeps the eager block)."""
    grad = None if scale is None else z
    _launch(
        z, y, w, 1, gamma, ignore_index, False, loss, 0, grad, scale, None, z_loss, softcap,
        None, label_smoothing,
    )  # fmt: skip


def _row_scale(scale):
    """`scale` and its row stride: 0 for one number (the sum's or the mean's backward), read
    once per row without materialising it."""
    if scale is None:
        return None, 0
    if scale.numel() == 1:
        return scale, 0
    return scale.contiguous(), 1


@softmax_index_fwd_.register_fake
def _(
    z, y, w, axis, gamma, ignore_index, weighted_count, loss, denominator, grad, z_loss, softcap,
    where, label_smoothing,
):  # fmt: skip
    return None


@torch.library.custom_op("dualloss::softmax_index_bwd", mutates_args=())
def softmax_index_bwd(
    z: Tensor, y: Tensor, w: Tensor | None, axis: int, gamma: float, ignore_index: int,
    scale: Tensor, divisor: Tensor | None, z_loss: float, softcap: float | None,
    where: Tensor | None, label_smoothing: float,
) -> Tensor:  # fmt: skip
    """The gradient of ``softmax_index_fwd_``'s per-element loss times `scale` (one number or
    y's shape) over `divisor` (the mean's denominator, or None), recomputed from the logits in
    one launch and rounded once to their dtype (half precision, where a gradient kept from
    forward in the logits' dtype and then scaled would be rounded twice)."""
    grad = torch.empty_like(z)
    _launch(
        z, y, w, axis, gamma, ignore_index, False, None, 0, grad, scale, divisor, z_loss, softcap,
        where, label_smoothing,
    )  # fmt: skip
    return grad


@softmax_index_bwd.register_fake
def _(z, y, w, axis, gamma, ignore_index, scale, divisor, z_loss, softcap, where, label_smoothing):
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
def _dense_mass(t_ptr, w_ptr, offsets, j, y, inside, valid, smoothing, uniform,
                HAS_W: tl.constexpr, SMOOTH: tl.constexpr, INDEX: tl.constexpr,
                ACC: tl.constexpr):  # fmt: skip
    """a_c = w_c t~_c of a block of classes: the target on the classes inside `where` (with
    class-index targets the one-hot [c == y]), smoothed as (1 - eps) t + eps / K."""
    if INDEX:
        a = (j == y).to(ACC)
    else:
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
    """A block of classes' p, 1 - p, v (``_focal_terms``; a at gamma 0) and loss term
    a (1 - p)^gamma log p (0 where a is 0)."""
    if FOCAL:
        log_p, p, not_p, focal_weight, v = _focal_terms(
            c, is_top, z_top, s, log_s, log1p_s, a, gamma, eps, EXACT
        )
        weighted = a * focal_weight
    else:
        log_p = (c - z_top) - log1p_s
        # p = exp(c - c_top) / (1 + s): one rounded difference in the exponent
        p = _exp(c - z_top, EXACT) / (1.0 + s)
        # 1 - p_top = s / (1 + s), never formed as 1 - p
        not_p = tl.where(is_top, s / (1.0 + s), 1.0 - p)
        weighted = a
        v = a
    # 0 log 0 = 0: a class with no mass adds nothing, also at a logit of -inf (0 log1p(s): NaN
    # where the row is NaN)
    term = tl.where(a == 0.0, 0.0 * log1p_s, weighted * log_p)
    # c - c_top overflowed though both are finite: -(weighted (c_top - c) + weighted log1p(s))
    far = (log_p == -float("inf")) & (c != -float("inf"))
    term = tl.where(far, -(_times_gap(weighted, z_top, c) + weighted * log1p_s), term)
    return p, not_p, v, term


@triton.jit
def _softmax_dense_kernel(
    z_ptr, t_ptr, w_ptr, m_ptr, loss_ptr, count_at, grad_ptr, scale_ptr, scale_stride,
    divisor_ptr, C, D, stride_n, stride_c, stride_d, m_stride_n, m_stride_c, m_stride_d,
    gamma, smoothing, tiny, eps, z_loss, softcap, ignore_index,
    HAS_W: tl.constexpr, HAS_M: tl.constexpr, SMOOTH: tl.constexpr, FOCAL: tl.constexpr,
    INDEX: tl.constexpr, WEIGHTED_COUNT: tl.constexpr,
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
    gradient). With `INDEX` the targets are class indices (t_ptr: one per row): the mass is
    w_c ((1 - eps) [c == y] + eps / K) (the focal loss with label smoothing), and an ignored
    target or one outside `where` leaves its row out; the count of the mean is then w_y with
    `WEIGHTED_COUNT` (torch's weighted mean)."""
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
    y = 0
    if INDEX:
        # an ignored target, or one outside `where`, leaves its row out (no mass, no gradient)
        y = tl.load(t_ptr + row)
        keep = keep & (y != ignore_index)
        y = tl.where(keep, y, 0)
        if HAS_M:
            keep = keep & (tl.load(m_ptr + m_base + y * m_stride_c) != 0)
        if WEIGHTED_COUNT:
            w_y = tl.load(w_ptr + y).to(ACC)
        y = tl.where(keep, y, -1)
    # a NaN or +inf logit (or a row of -inf) gives NaN, never a number
    log1p_s = _log1p(s, EXACT) + 0.0 * z_top
    log1p_s = tl.where(has_nan != 0, float("nan"), log1p_s)
    is_normal = s >= tiny
    log_s = tl.where(is_normal, _log(tl.where(is_normal, s, 1.0), EXACT), -inf)
    uniform = tl.where(keep, smoothing / tl.maximum(num_valid, 1).to(ACC), 0.0)

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
        a = _dense_mass(t_ptr, w_ptr, offsets, j, y, inside, valid, smoothing, uniform,
                        HAS_W, SMOOTH, INDEX, ACC)  # fmt: skip
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
        if WEIGHTED_COUNT:
            tl.store(loss_ptr + count_at + row, tl.where(keep, w_y, 0.0))
        else:
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
            a = _dense_mass(t_ptr, w_ptr, offsets, j, y, inside, valid, smoothing, uniform,
                            HAS_W, SMOOTH, INDEX, ACC)  # fmt: skip
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


def _dense_launch(
    z, t, w, where, axis, gamma, label_smoothing, loss, count_at, grad, scale=None,
    divisor=None, z_loss=0.0, softcap=None, ignore_index=-100, weighted_count=False,
):  # fmt: skip
    """The dense-mass row kernel: the per-element losses into `loss` (None: not stored), the
    kept rows' counts from `count_at` on (0: none; their class weights with
    `weighted_count`), the gradient (times `scale` / `divisor`) into `grad` (None: not
    computed). `t`: probability targets of z's shape, or int64 class indices (z's shape without
    the class axis; `ignore_index` left out), whose one-hot mass is smoothed."""
    rows, c, d, stride_n, stride_c, stride_d = _rows(z, axis)
    if rows == 0:
        return
    block, warps = _block(c)
    scale, scale_stride = _row_scale(scale)
    # the kernel reads w at w + j (an expanded 0-dim `alpha` laid out as C numbers first)
    w = None if w is None else w.contiguous()
    m, (m_stride_n, m_stride_c, m_stride_d) = _mask_rows(where, z.shape, axis)
    info = torch.finfo(torch.float64 if z.dtype == torch.float64 else torch.float32)
    anything = z  # a pointer the kernel never reads (constexpr flags say so)
    _softmax_dense_kernel[(rows,)](
        z, t, w if w is not None else anything, m if m is not None else anything,
        loss if loss is not None else anything, count_at, grad if grad is not None else anything,
        scale if scale is not None else anything, scale_stride,
        divisor if divisor is not None else anything,
        c, d, stride_n, stride_c, stride_d, m_stride_n, m_stride_c, m_stride_d,
        float(gamma), float(label_smoothing), info.tiny, info.eps, float(z_loss),
        1.0 if softcap is None else float(softcap), int(ignore_index),
        HAS_W=w is not None, HAS_M=m is not None, SMOOTH=label_smoothing != 0.0,
        FOCAL=gamma != 0.0, INDEX=not t.is_floating_point(), WEIGHTED_COUNT=weighted_count,
        COUNT=count_at > 0, NEEDS_GRAD=grad is not None,
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
