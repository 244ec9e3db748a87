"""The fused linear + softmax losses of the torch backend: ``linear_softmax_cross_entropy`` and
``linear_softmax_focal_loss`` (``linear_weight`` (V, H) as ``nn.Linear``).

Streams over blocks of rows, never holding the (N, V) logits or their gradient (docs/linear.md);
with ``process_group=`` the weight's classes split over ranks (docs/scaling.md). May import
``_inputs``, ``_autodiff``, ``_kernels``, ``parallel`` and ``softmax``; never ``sigmoid`` or
``dropins``.
"""

from __future__ import annotations

import numbers

import torch
import torch.distributed as dist
from torch import Tensor

from .. import _checks
from . import _inputs, _kernels
from ._inputs import (
    _as_array,
    _compute_dtype,
    _dtype_name,
    _gamma,
    _is_index,
    _mean_divisor,
    _normalizer,
    _reduce,
    _unit_interval,
    _values_are_concrete,
)
from .parallel import _class_slice, _process_group
from .softmax import _first_top, _minus_log_p_times, _softcap, _softmax_loss_or_grad


def _linear_parallel_refuses(label_smoothing, gamma):
    """What the class-sharded fused loss does not take: label smoothing with the focal loss's
    gamma != 0 (each class's own focal term, summed over ranks after the row's statistics, would
    need a third round of collectives per block); raised alike on every rank."""
    if label_smoothing != 0.0 and gamma != 0.0:
        raise ValueError(
            "`label_smoothing` is not supported with `process_group` for the focal loss with "
            f"gamma != 0 (yet): pass 0.0. Received: label_smoothing={label_smoothing!r} "
            f"with gamma={gamma!r}."
        )


def _linear_block(
    z, y, a_y, kept, class_weight, gamma, label_smoothing, grad_loss, shard=None, head=(0.0, None)
):  # fmt: skip
    """Loss of each row of the block's logits `z` (rows, V) and, with `grad_loss`, the gradient
    w.r.t. `z` times grad_loss, written over `z` itself (the block's only (rows, V) tensor).

    Index targets y with mass a_y = class_weight_y (0 for ignored rows), `kept` 1 or 0 per row.
    With e = exp(z - z_top), S_y = sum_{j != y} e_j (column y left out of the sum, so no
    cancellation) and r = S_y / e_y:
      log p_y = -log1p(r) (r <= 1) or (z_y - z_top) - log(S) (r > 1, p_y < 1/2),
      log(1 - p_y) = log r - log1p(r) (r <= 1) or log1p(-p_y),  1 - p_y = S_y / S,
      phi(p_y) = p log p / (1 - p) = -log1p(r) / r (-1 + r / 2 below eps),
    the identities of ``spec._log_softmax`` / ``_focal_phi`` with y in place of the top class:
    exact for every y, also p_y within 1e-30 of 1. The gradient is p_j v_y off y and
    -(1 - p_y) v_y at y (``_softmax_focal_terms_sparse``). Label smoothing (cross entropy only,
    gamma = 0): a = (1 - eps) a_y onehot(y) + eps w / V, loss = sum_c a_c (log S - (z_c - z_top)),
    gradient p sum(a) - a.

    The LLM head options `head` = (z_loss, softcap) (DESIGN 13), taken here on the sharded path
    (one device takes the Triton kernel or the dense block path): the cap is elementwise,
    c = softcap tanh(z / softcap) (``softmax._softcap``, a fresh tensor), every term above is
    of c and the gradient comes back times dc/dz = sech^2(z / softcap); the z-term z_loss lse^2
    needs only the row's lse = z_top + log S, its gradient 2 z_loss lse p_j adds 2 z_loss lse
    to each kept row's coefficient of p_j.

    With `shard` = (start, group, V) the block holds this rank's contiguous slice of the
    classes, whose first global class is `start` (y stays the global index, V the number of
    classes over every rank); the row's numbers are put together over `group` as
    ``softmax._VocabParallel`` does, four per row: z_top (all-reduce MAX), then z_y - z_top and
    z_y from the rank that owns y (0 elsewhere) and S_y (all-reduce SUM). Every closed form above
    is a function of those, so the loss is the same on every rank and the gradient's slice is
    local (p_j v_y off y; -(1 - p_y) v_y on the rank that owns y). Label smoothing needs two
    numbers more per row, sum_c w_c (z_c - z_top) over every class and its far form, which ride
    in the same SUM; the class weights are the global vector (this rank's part of it is sliced
    here).

    Logits that span more than the dtype's largest number (z_top > 0 > z_c, both finite) make
    z_c - z_top overflow to -inf though the loss may be finite: the target's term is then
    a_y z_top - a_y z_y + a_y log S (``softmax._minus_log_p_times``) and label smoothing's
    sum_c u w_c (z_top - z_c) is u W z_top - sum_c (u w_c) z_c, each product finite.
    """
    z_loss, softcap = head
    # soft-capping: the block's own logits, elementwise (on a rank, its slice of the classes)
    z, dcap = _softcap(z, softcap)
    num_local = z.shape[-1]
    num_classes = num_local
    weights = class_weight
    # shift so that the largest logit is 0: exp cannot overflow; a NaN or +inf logit gives NaN
    z_top = torch.amax(z, dim=-1, keepdim=True)
    if shard is not None:
        start, group, num_classes = shard
        # the row's largest logit over every rank: exp(z - z_top) cannot overflow
        dist.all_reduce(z_top, op=dist.ReduceOp.MAX, group=group)
        local_y = y - start
        owns = (local_y >= 0) & (local_y < num_local)
        y = torch.where(owns, local_y, 0)
        if class_weight is not None:
            # this rank's classes' weights (the vector is the global one)
            weights = class_weight[start : start + num_local]
    # the target's logit, for a row whose logits span more than the largest number (z_y - z_top
    # overflows, the loss may not: ``softmax._minus_log_p_times``); the shift below overwrites z
    z_y = z.gather(-1, y)
    far_spread = None
    if label_smoothing != 0.0:
        uniform = label_smoothing / num_classes
        # sum_c u w_c (z_top - z_c) as u W z_top - sum_c (u w_c) z_c: each product finite, for
        # the rows where sum_c w_c (z_c - z_top) overflows (one matrix-vector product)
        share = weights if class_weight is not None else z.new_ones(num_local)
        share = uniform * share
        far_spread = z_top * share.sum() - (z @ share).unsqueeze(-1)
    shifted = z.sub_(z_top)
    shifted_y = shifted.gather(-1, y)
    if label_smoothing != 0.0:
        if class_weight is None:
            spread = shifted.sum(dim=-1, keepdim=True)
            weight_sum = float(num_classes)
        else:
            spread = (shifted @ weights).unsqueeze(-1)
            weight_sum = class_weight.sum()
    e = shifted.exp_()
    if shard is None:
        e_y = e.gather(-1, y)
        others = e.scatter_(-1, y, 0.0).sum(dim=-1, keepdim=True)
    else:
        # column y left out of S_y on the rank that owns it (no 1 + S - 1 rounding); the others
        # keep their column y (a class of theirs like any other)
        e_kept = torch.where(owns, 0.0, e.gather(-1, y))
        others = e.scatter_(-1, y, e_kept).sum(dim=-1, keepdim=True)
        parts = [torch.where(owns, shifted_y, 0.0), others, torch.where(owns, z_y, 0.0)]
        if label_smoothing != 0.0:
            parts += [spread, far_spread]
        stats = torch.cat(parts, dim=-1)
        # z_y - z_top from the rank that owns y (the others add 0), S_y, the sum of the other
        # classes' exponentials over every rank (a NaN logit anywhere makes S_y NaN), z_y and,
        # with label smoothing, sum_c w_c (z_c - z_top) over every rank's classes (and its form
        # for logits spanning more than the largest number)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
        shifted_y, others, z_y = stats[:, :1], stats[:, 1:2], stats[:, 2:3]
        if label_smoothing != 0.0:
            spread, far_spread = stats[:, 3:4], stats[:, 4:]
        e_y = torch.exp(shifted_y)
    total = others + e_y
    log_total = torch.log(total)
    if label_smoothing != 0.0:
        # the eps share of the mass sits on every class: no one-hot shortcut for the loss
        mass = (1.0 - label_smoothing) * a_y + uniform * weight_sum * kept
        # -(1 - eps) a_y log p_y, also where z_y - z_top overflowed
        hot = (1.0 - label_smoothing) * a_y
        loss = _minus_log_p_times(hot, shifted_y - log_total, z_y, z_top, log_total, a_y == 0.0)
        spread_loss = uniform * kept * (weight_sum * log_total - spread)
        # a class's z_c - z_top overflowed (z_c finite): the products of ``far_spread``
        far = torch.isneginf(spread) & torch.isfinite(far_spread) & (kept != 0.0)
        far_loss = kept * (uniform * weight_sum * log_total + torch.where(far, far_spread, 0.0))
        loss = loss + torch.where(far, far_loss, spread_loss)
        focal_weight = None
        v = (1.0 - label_smoothing) * a_y
    else:
        has_y = e_y > 0.0
        r = others / torch.where(has_y, e_y, 1.0)
        small = has_y & (r <= 1.0)
        log1p_r = torch.log1p(torch.where(small, r, 0.0))
        log_p = torch.where(small, -log1p_r, shifted_y - log_total)
        p = e_y / total
        if gamma == 0.0:
            # (1 - p)^0 = 1, also at p = 1
            focal_weight = None
            v = a_y
        else:
            log_not_p = torch.where(
                small, torch.log(r) - log1p_r, torch.log1p(-torch.where(small, 0.0, p))
            )
            # (1 - p)^gamma = exp(gamma log(1 - p))
            focal_weight = torch.exp(gamma * log_not_p)
            eps = torch.finfo(z.dtype).eps
            is_big = r > eps
            phi = torch.where(is_big, -log1p_r / torch.where(is_big, r, 1.0), r / 2.0 - 1.0)
            phi = torch.where(small, phi, torch.where(has_y, p * log_p / (others / total), 0.0))
            v = a_y * focal_weight * (1.0 - gamma * phi)
        # 0 log 0 = 0: no target mass (ignored row, zero weight) contributes nothing
        weighted = a_y if focal_weight is None else a_y * focal_weight
        # also where z_y - z_top overflowed though the loss does not
        loss = _minus_log_p_times(weighted, log_p, z_y, z_top, log_total, a_y == 0.0)
        mass = v
    z_mass = None
    if z_loss != 0.0:
        # the row's log-sum-exp (over every rank): z_top + log S; kept rows only
        lse = z_top + log_total
        is_kept = kept != 0.0
        loss = loss + torch.where(is_kept, z_loss * lse * lse, 0.0)
        # d/dc_j z_loss lse^2 = 2 z_loss lse p_j: one more share of every p_j
        z_mass = torch.where(is_kept, 2.0 * z_loss * lse, 0.0)
        mass = mass + z_mass
    if grad_loss is None:
        return loss.squeeze(-1), None
    coefficient = grad_loss.unsqueeze(-1) * mass / total
    # p_j v off y (column y of e is 0 now), -(1 - p_y) v_y at y: 1 - p_y = S_y / S
    grad = e.mul_(coefficient)
    if label_smoothing != 0.0:
        # minus the eps share eps w_c / V of every class; column y: p_y sum(a) - a_y
        uniform_mass = uniform * grad_loss.unsqueeze(-1) * kept
        if class_weight is None:
            grad.sub_(uniform_mass)
            uniform_y = uniform_mass
        else:
            grad.addcmul_(uniform_mass, weights, value=-1.0)
            uniform_y = uniform_mass * weights[y]
        at_y = grad_loss.unsqueeze(-1) * (e_y / total * mass - (1.0 - label_smoothing) * a_y)
        at_y = at_y - uniform_y
    else:
        at_y = -(others / total) * grad_loss.unsqueeze(-1) * v
        if z_mass is not None:
            # the z-term's share at y: 2 z_loss lse p_y
            at_y = at_y + grad_loss.unsqueeze(-1) * z_mass * (e_y / total)
    if shard is not None:
        # column y is the target only on the rank that owns it; elsewhere it keeps p_j v_y
        at_y = torch.where(owns, at_y, grad.gather(-1, y))
    grad = grad.scatter_(-1, y, at_y)
    if dcap is not None:
        # the chain rule through the cap: dl/dz = dl/dc sech^2(z / softcap)
        grad = grad.mul_(dcap)
    return loss.squeeze(-1), grad


def _linear_chunks(
    h, w, b, y, class_weight, gamma, ignore_index, label_smoothing, head, rows, grad_loss,
    kernel=False, shard=None, stats=None,
):  # fmt: skip
    """The per-row losses of logits = h w^T + b, one block of `rows` rows at a time, and (with
    `grad_loss`, per-row factors) the gradients of sum_i grad_loss_i l_i w.r.t. h, w and b.

    Each block's (rows, V) logits are formed in the compute dtype (float32 for half inputs);
    ``_linear_block`` turns them in place into the block's gradient G, mapped through the linear
    layer at once: dh = G w, dw += G^T h, db += sum_rows G. The focal loss with label smoothing
    takes the softmax losses' dense path (``_softmax_loss_or_grad``) instead, and so do, on one
    device, the LLM head options `head` = (z_loss, softcap) (DESIGN 13; over ranks
    ``_linear_block`` takes them): the cap and the z-term are applied to each block's logits,
    never to an (N, V) tensor. The accumulators
    are in the compute dtype: float32 for half inputs (a bfloat16 running sum loses every small
    update). Ignored rows enter with hidden 0 (their loss and gradient are 0 whatever their
    features, NaN included). With `kernel` (``_linear_takes_triton``, decided once in forward,
    so a backward's recomputation takes the same path) each block's loss and gradient are one
    Triton launch. With `shard` = (start, group, V), `w` and `b` are this rank's slice of the
    classes (``_linear_block``'s row numbers cross ranks, four per row, six with label
    smoothing) and dh = G w is this
    slice's part of the hidden gradient: the parts are added with one all-reduce SUM of the
    (N, H) dh after the last block, in the compute dtype (Megatron's column-parallel linear
    does the same in its backward); dw and db stay local. With `stats` = (lse, correct), (N,)
    buffers, ``return_aux``'s per-row numbers are written there from each block's logits
    before they turn into its gradient: logsumexp of the capped logits, and whether the largest
    logit (the first on ties) is the target. Returns (loss, dh, dw, db); the gradients None
    without `grad_loss`, db None without `b`.
    """
    dtype = _compute_dtype(h.dtype)
    num_rows = h.shape[0]
    w = w.to(dtype)
    b = None if b is None else b.to(dtype)
    loss = torch.empty(num_rows, dtype=dtype, device=h.device)
    dh = dw = db = None
    if grad_loss is not None:
        # the slices' parts of dh are summed over ranks: each part kept in the compute dtype
        dh_dtype = h.dtype if shard is None else dtype
        dh = torch.empty(h.shape, dtype=dh_dtype, device=h.device)
        dw = torch.zeros(w.shape, dtype=dtype, device=h.device)
        db = None if b is None else torch.zeros(b.shape, dtype=dtype, device=h.device)
    z_loss, softcap = head
    # one device: the LLM head options take the kernel or the dense path; over ranks, the
    # block's own
    dense = (gamma != 0.0 and label_smoothing != 0.0) or (
        shard is None and (z_loss != 0.0 or softcap is not None)
    )
    # the Triton kernel (DESIGN 11): each block's loss and gradient in one launch, over the
    # block's own buffer; the matrix products stay torch's (cuBLAS)
    kernel = _kernels.softmax_ops().linear_block_ if kernel else None
    # one (rows, V) buffer for every block: the allocator hands no block back and forth (glibc
    # keeps freed blocks resident once its mmap threshold has risen to their size)
    buffer = torch.empty((min(rows, num_rows), w.shape[0]), dtype=dtype, device=h.device)
    for start in range(0, num_rows, rows):
        y_block = y[start : start + rows]
        keep = (y_block != ignore_index).unsqueeze(-1)
        h_block = torch.where(keep, h[start : start + rows].to(dtype), 0.0)
        z = buffer[: h_block.shape[0]]
        if b is None:
            torch.mm(h_block, w.T, out=z)
        else:
            torch.addmm(b, h_block, w.T, out=z)
        block_grad = None if grad_loss is None else grad_loss[start : start + rows]
        if stats is not None:
            # return_aux (DESIGN 13): the row's lse of c and whether its top logit is the target
            c = z if softcap is None else _softcap(z, softcap)[0]
            lse, correct = _block_aux(z, c, y_block, shard)
            stats[0][start : start + rows] = lse
            stats[1][start : start + rows] = correct
        if kernel is not None:
            block_grad = None if block_grad is None else block_grad.to(dtype)
            kernel(z, y_block, class_weight, gamma, ignore_index, loss[start : start + rows],
                   block_grad, z_loss, softcap, label_smoothing)  # fmt: skip
            if block_grad is None:
                continue
            grad = z
        elif dense:
            options = (1, gamma, ignore_index, label_smoothing, z_loss, softcap)
            block_loss = _softmax_loss_or_grad(z, y_block, None, class_weight, *options, None)
            grad = None
            if block_grad is not None:
                grad = _softmax_loss_or_grad(z, y_block, None, class_weight, *options, block_grad)
        else:
            y_safe = torch.where(keep, y_block.unsqueeze(-1), 0)
            ones = torch.ones((), dtype=dtype, device=h.device)
            a_y = torch.where(keep, ones if class_weight is None else class_weight[y_safe], 0.0)
            kept = keep.to(dtype)
            block_loss, grad = _linear_block(
                z, y_safe, a_y, kept, class_weight, gamma, label_smoothing, block_grad, shard, head
            )
        if kernel is None:
            loss[start : start + rows] = block_loss
        if grad is None:
            continue
        dh[start : start + rows] = grad @ w
        dw.addmm_(grad.T, h_block)
        if db is not None:
            db += grad.sum(dim=0)
    if shard is not None and dh is not None:
        # dh = sum over ranks of G_r W_r: each rank's classes' part, one all-reduce of (N, H)
        dist.all_reduce(dh, op=dist.ReduceOp.SUM, group=shard[1])
    return loss, dh, dw, db


def _block_aux(z, c, y, shard):
    """``return_aux``'s numbers of a block's rows: the lse of the capped logits `c` and whether
    the largest logit of `z` (the first on ties) is the target `y`. With `shard` the block holds
    this rank's slice of the classes: the largest capped logit (MAX) and the sum of exponentials
    (SUM), then the first top class over every rank (``softmax._first_top``: a MAX and a MIN),
    four all-reduces of one number per row, only when asked."""
    if shard is None:
        return torch.logsumexp(c, dim=-1), torch.argmax(z, dim=-1) == y
    start, group, _ = shard
    c_top = torch.amax(c, dim=-1, keepdim=True)
    dist.all_reduce(c_top, op=dist.ReduceOp.MAX, group=group)
    # an infinite top (a row of -inf, or +inf) shifts by 0: lse is then -inf or +inf (NaN stays)
    c_top = torch.where(torch.isinf(c_top), 0.0, c_top)
    total = torch.exp(c - c_top).sum(dim=-1, keepdim=True)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    _, first = _first_top(z, start, group)
    return (c_top + torch.log(total)).squeeze(-1), first.squeeze(-1) == y


def _linear_takes_triton(h, class_weight) -> bool:
    """Whether the blocks take the Triton kernel (``torch_impl.kernels`` decides where; label
    smoothing and the LLM head options it takes in its own passes): no gradient asked of the
    class weight, not while torch.compile traces the loop (it keeps the eager block)."""
    return (
        (class_weight is None or not class_weight.requires_grad)
        and not torch.compiler.is_compiling()
        and _kernels.use_triton(h)
    )


class _LinearSoftmax(torch.autograd.Function):
    """The fused loss as one autograd node: nothing of size (N, V) outlives a block.

    Reductions 'mean' and 'sum': when a gradient is wanted, the forward computes it along with
    the loss (one pass: 3 matrix products per block, as the unfused loss), for an output gradient
    of 1, and the backward scales it (a second backward, retain_graph, recomputes it from the saved
    inputs). Reduction 'none': the backward recomputes the blocks with the per-row output gradient.
    The backward itself is not differentiable (create_graph raises, never a silent None).
    With `shard` (the class slice's start and process group, ``_linear_chunks``) every pass
    issues its per-row collectives and, with a gradient, the one all-reduce of dh: on every
    rank alike, as the loss's value and every rank's backward are.
    """

    @staticmethod
    def forward(ctx, h, w, b, y, class_weight, row_scale, options):
        gamma, ignore_index, label_smoothing, head, rows, per_row, shard, aux = options
        needs = any(ctx.needs_input_grad[:3])
        grad_loss = None
        if needs and not per_row:
            grad_loss = row_scale.expand(h.shape[0])
        ctx.kernel = shard is None and _linear_takes_triton(h, class_weight)
        stats = None
        if aux:
            # return_aux's per-row lse and correct, from the same pass (no gradient)
            lse = torch.empty(h.shape[0], dtype=_compute_dtype(h.dtype), device=h.device)
            stats = (lse, torch.empty(h.shape[0], dtype=torch.bool, device=h.device))
        loss, dh, dw, db = _linear_chunks(
            h, w, b, y, class_weight, gamma, ignore_index, label_smoothing, head, rows, grad_loss,
            ctx.kernel, shard, stats,
        )  # fmt: skip
        ctx.save_for_backward(h, w, b, y, class_weight, row_scale)
        ctx.options = options
        ctx.precomputed = None if grad_loss is None else (dh, dw, db)
        # each term divided before summing: 0 when nothing is kept (row_scale 0)
        out = loss if per_row else (loss * row_scale).sum()
        if stats is None:
            return out
        ctx.mark_non_differentiable(*stats)
        return (out, *stats)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output, *_):
        h, w, b, y, class_weight, row_scale = ctx.saved_tensors
        gamma, ignore_index, label_smoothing, head, rows, per_row, shard, _ = ctx.options
        if ctx.precomputed is not None:
            dh, dw, db = ctx.precomputed
            ctx.precomputed = None
            scale = grad_output.to(dw.dtype)
        else:
            grad_loss = grad_output if per_row else (row_scale * grad_output).expand(h.shape[0])
            _, dh, dw, db = _linear_chunks(
                h, w, b, y, class_weight, gamma, ignore_index, label_smoothing, head, rows,
                grad_loss, ctx.kernel, shard,
            )  # fmt: skip
            dh = dh.to(h.dtype)
            scale = None
        if scale is not None:
            dh = (dh * scale).to(h.dtype)
            dw = dw.mul_(scale)
            db = None if db is None else db.mul_(scale)
        dw = dw.to(w.dtype)
        db = None if db is None else db.to(b.dtype)
        return dh, dw, db, None, None, None, None


def _linear_softmax(
    hidden,
    linear_weight,
    targets,
    bias,
    class_weight_arg,
    gamma,
    is_focal,
    ignore_index,
    label_smoothing,
    reduction,
    normalizer,
    z_loss,
    softcap,
    chunk_size,
    process_group=None,
    return_aux=False,
):
    """Validates the fused loss's arguments and applies ``_LinearSoftmax`` to the rows of
    `hidden` (``spec._linear_softmax``, without its (N, V) logits); with `process_group`,
    `linear_weight` and `bias` are this rank's slice of the classes (``_class_slice``: one
    all-reduce of the slice sizes) and the class vector and targets are global."""
    reduction, normalizer = _normalizer(reduction, normalizer)
    hidden = _as_array("hidden", hidden)
    linear_weight = _as_array("linear_weight", linear_weight, hidden.device)
    targets = _as_array("targets", targets, hidden.device)
    _checks.float_logits("hidden", hidden.is_floating_point(), _dtype_name(hidden.dtype))
    _checks.float_logits(
        "linear_weight", linear_weight.is_floating_point(), _dtype_name(linear_weight.dtype)
    )
    _checks.index_targets(_is_index(targets), _dtype_name(targets.dtype))
    if bias is not None:
        bias = _as_array("bias", bias, hidden.device)
    bias_shape = None if bias is None else bias.shape
    size, num_local = _checks.linear_shapes(
        hidden.shape, linear_weight.shape, bias_shape, targets.shape, 0
    )
    chunk_size = _checks.chunk_size(chunk_size)
    ignore_index = _checks.ignore_index(ignore_index)
    label_smoothing = _unit_interval("label_smoothing", label_smoothing)
    head = (_checks.z_loss(z_loss), _checks.softcap(softcap))
    return_aux = _checks.return_aux(return_aux)
    if is_focal:
        gamma = _gamma(gamma)
        name = "alpha"
    else:
        name = "weight"
    shard = None
    num_classes = num_local
    if process_group is not None:
        process_group = _process_group(process_group)
        _linear_parallel_refuses(label_smoothing, gamma)
        # where this rank's rows of the weight start among the classes, and V over every rank
        start, num_classes = _class_slice(
            num_local, process_group, hidden.device, name="linear_weight"
        )
        shard = (start, process_group, num_classes)
    vector = class_weight_arg
    dtype = _compute_dtype(hidden.dtype)
    if vector is not None and not isinstance(vector, numbers.Real):
        vector = _as_array(name, vector, hidden.device)
        if vector.requires_grad:
            raise ValueError(
                f"`{name}` must not require grad: the fused linear losses give no gradient "
                f"w.r.t. it (pass {name}.detach()). Received: {name}.requires_grad=True."
            )
    if is_focal:
        _checks.focal_alpha(vector, num_classes)
        if (
            isinstance(vector, Tensor)
            and _inputs._VALIDATE_INDICES
            and _values_are_concrete(vector)
        ):
            _checks.unit_interval_values("alpha", vector.double().cpu().numpy().ravel())
    elif vector is not None:
        _checks.class_vector("weight", vector.shape, num_classes)
    if vector is None:
        class_weight = None
    elif isinstance(vector, numbers.Real):
        class_weight = torch.full((num_classes,), float(vector), dtype=dtype, device=hidden.device)
    else:
        class_weight = vector.to(dtype).expand(num_classes)
    y = targets.reshape(-1)
    if _inputs._VALIDATE_INDICES and _values_are_concrete(y):
        # one device synchronisation; see the module docstring to skip it
        bad = ((y < 0) | (y >= num_classes)) & (y != ignore_index)
        if bool(bad.any()):
            _checks.class_indices(targets.cpu().numpy(), num_classes, ignore_index)
    y = y.long()
    h = hidden.reshape(-1, size)
    keep = y != ignore_index
    if normalizer is not None:
        # the given divisor of the mean (a constant), in the working precision
        denominator = torch.as_tensor(normalizer, device=hidden.device).to(dtype)
        is_zero = denominator == 0.0
        row_scale = torch.where(is_zero, 0.0, 1.0 / torch.where(is_zero, 1.0, denominator))
    elif reduction == "mean":
        if is_focal or class_weight is None:
            # plain mean over the kept rows
            denominator = keep.sum().to(dtype)
        else:
            # torch: the weighted mean divides by the weights of the kept targets
            denominator = torch.where(keep, class_weight[torch.where(keep, y, 0)], 0.0).sum()
        is_zero = denominator == 0.0
        row_scale = torch.where(is_zero, 0.0, 1.0 / torch.where(is_zero, 1.0, denominator))
    else:
        row_scale = torch.ones((), dtype=dtype, device=hidden.device)
    if chunk_size is None:
        # the dense path (label smoothing or the LLM head options off the kernel) holds ~8
        # temporaries per block, the gather path ~3, the Triton kernel none
        in_kernel = shard is None and _linear_takes_triton(h, class_weight)
        plain = in_kernel or (label_smoothing == 0.0 and head == (0.0, None))
        budget = (1 << 22) if plain else (1 << 19)
        # up to 1/16 of the logits (64 MiB blocks at most): at (4096, 256, 32000) 256 rows, 1.3x
        # faster than 128 rows on CPU, the block 0.0625x the logits
        chunk_size = _checks.default_chunk_size(h.shape[0], num_local, budget, fraction=16)
    per_row = reduction == "none"
    options = (gamma, ignore_index, label_smoothing, head, chunk_size, per_row, shard, return_aux)
    loss = _LinearSoftmax.apply(h, linear_weight, bias, y, class_weight, row_scale, options)
    aux = None
    if return_aux:
        loss, lse, correct = loss
        aux = _linear_aux(lse, correct, keep, head[0], reduction, normalizer, targets.shape)
        aux = {key: value.to(hidden.dtype) for key, value in aux.items()}
    if reduction == "none":
        loss = loss.reshape(targets.shape)
    loss = loss.to(hidden.dtype)
    return loss if aux is None else (loss, aux)


def _linear_aux(lse, correct, keep, z_loss, reduction, normalizer, shape):
    """``return_aux``'s statistics (``spec._linear_aux``) from the per-row lse and correct of
    the block pass: 0 where not kept, z_term = z_loss lse^2, reduced as the spec says (the
    kept rows' mean, or over `normalizer`)."""
    lse = torch.where(keep, lse, 0.0)
    stats = {"lse": lse, "z_term": z_loss * lse * lse, "correct": (correct & keep).to(lse.dtype)}
    if reduction == "none":
        return {key: value.reshape(shape) for key, value in stats.items()}
    divisor = _mean_divisor(keep.sum(), normalizer)
    return {key: _reduce(value, reduction, divisor) for key, value in stats.items()}


def linear_softmax_cross_entropy(
    hidden: Tensor,
    linear_weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: Tensor | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    return_aux: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> Tensor | tuple[Tensor, dict]:
    """Softmax cross entropy of ``F.linear(hidden, linear_weight, bias)`` without the (N, V)
    logits (``spec.linear_softmax_cross_entropy``).

    Differs from the spec: `linear_weight` is (V, H) as ``nn.Linear``; rows are processed in
    blocks of `chunk_size` (default: (rows, V) blocks of 4M entries; 512K with label smoothing
    or the LLM head options off the Triton kernel,
    grown up to 1/16 of the logits and 16M entries), so the extra memory is one block plus, for
    half inputs, float32 copies of `linear_weight` and its gradient accumulator. Result in the
    hidden dtype (half precision computed in float32). Gradients for `hidden`, `linear_weight`
    and `bias`; a class `weight` that requires grad raises (no gradient is given for it). A
    mean over no kept row is 0. `z_loss`, `softcap` (DESIGN 13): applied to each block's
    logits (in the Triton kernel's launch where it runs; elsewhere the dense block path).

    Vocab-parallel (DESIGN 12, docs/scaling.md): with `process_group`, `linear_weight` (V_r, H)
    and `bias` (V_r,) are this rank's contiguous slice of the classes (slices in rank order,
    sizes may differ, none empty); `hidden`, `targets` (GLOBAL class indices), `weight` (the
    global length-V vector) and `normalizer` the same on every rank. Each block of rows forms
    its local logits and crosses ranks with four numbers per row (all-reduce MAX of the
    largest logit, all-reduce SUM of the target's logit, shifted and not, and the other classes'
    sum of exponentials; with `label_smoothing` the same SUM carries two more, the row's
    class-weighted sum of logits, shifted and scaled); no row is gathered. `softcap` is applied
    to each rank's logits, `z_loss` takes the row's log-sum-exp from those numbers. Every rank
    gets the same loss. Backward: the gradients of `linear_weight` and `bias` are the rank's
    slice of the full ones,
    computed locally; the gradient of `hidden` is sum_r G_r W_r, one all-reduce SUM of the
    (N, H) gradient per call (as Megatron's column-parallel linear does in its backward), so
    every rank gets the full one; the focal loss with `label_smoothing` and gamma != 0 raises.
    """
    return _linear_softmax(
        hidden,
        linear_weight,
        targets,
        bias,
        weight,
        0.0,
        False,
        ignore_index,
        label_smoothing,
        reduction,
        normalizer,
        z_loss,
        softcap,
        chunk_size,
        process_group,
        return_aux,
    )


def linear_softmax_focal_loss(
    hidden: Tensor,
    linear_weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    gamma: float = 2.0,
    alpha: Tensor | float | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: Tensor | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    return_aux: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> Tensor | tuple[Tensor, dict]:
    """Softmax focal loss of ``F.linear(hidden, linear_weight, bias)`` without the (N, V) logits
    (``spec.linear_softmax_focal_loss``); layout, blocks and dtypes as
    ``linear_softmax_cross_entropy``. A vector `alpha` that requires grad raises.
    `process_group`: the classes split over ranks as ``linear_softmax_cross_entropy``'s (the
    focal terms are functions of the same four numbers per row; `alpha` the global vector);
    `label_smoothing` with gamma != 0 raises there."""
    return _linear_softmax(
        hidden,
        linear_weight,
        targets,
        bias,
        alpha,
        gamma,
        True,
        ignore_index,
        label_smoothing,
        reduction,
        normalizer,
        z_loss,
        softcap,
        chunk_size,
        process_group,
        return_aux,
    )
