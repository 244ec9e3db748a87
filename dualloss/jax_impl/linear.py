"""The fused linear + softmax losses of the JAX backend: ``linear_softmax_cross_entropy`` and
``linear_softmax_focal_loss`` (``linear_weight`` (H, V) as flax's Dense kernel).

A scan over blocks of rows with ``jax.custom_vjp``, never holding the (N, V) logits or their
gradient (docs/linear.md); with ``axis_name=`` the weight's classes split over a mesh axis
(docs/scaling.md). May import ``_inputs``, ``_autodiff``, ``parallel`` and ``softmax``; never
``sigmoid`` or ``dualloss.optax``.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks
from ._inputs import (
    ArrayLike,
    _as_array,
    _check_traced_indices,
    _compute_dtype,
    _is_concrete,
    _normalizer,
    _not_torch,
)
from .parallel import _class_shard, _sum_to_type_of
from .softmax import (
    _at,
    _log1m,
    _minus_log_p_times,
    _sharded_top,
    _softcap,
    _softmax_focal_terms,
    _softmax_head_terms,
)


def _linear_parallel_refuses(label_smoothing, gamma):
    """What the class-sharded fused loss does not take: label smoothing with the focal loss's
    gamma != 0 (each class's own focal term, summed over the slices after the row's statistics,
    would need a third round of collectives per block); one sentence."""
    if label_smoothing != 0.0 and gamma != 0.0:
        raise ValueError(
            "`label_smoothing` is not supported with `axis_name` for the focal loss with "
            f"gamma != 0 (yet): pass 0.0. Received: label_smoothing={label_smoothing!r} "
            f"with gamma={gamma!r}."
        )


def _linear_block(
    z, y, a_y, kept, class_weight, gamma, label_smoothing, axis_name=None, head=(0.0, None)
):  # fmt: skip
    """Loss of each row of the block's logits `z` (rows, V) and its gradient w.r.t. `z`.

    The identities of torch_impl's ``_linear_block`` (see it): e = exp(z - z_top), S_y the sum
    of e without column y, r = S_y / e_y; log p_y = -log1p(r) (r <= 1) or (z_y - z_top) - log S,
    log(1 - p_y) = log r - log1p(r) (r <= 1) or log1p(-p_y), phi = -log1p(r) / r; the gradient
    p_j v_y off y and -(1 - p_y) v_y at y. Label smoothing (gamma = 0): a = (1 - eps) a_y
    onehot(y) + eps w / V, loss = sum_c a_c (log S - (z_c - z_top)), gradient p sum(a) - a.
    `class_weight` is the global vector of the V classes (ones without one).

    The LLM head options `head` = (z_loss, softcap) (DESIGN 13), taken here on the sharded path
    (one device takes the dense block path): the cap is elementwise, c = softcap tanh(z /
    softcap) (``softmax._softcap``), every term above is of c and the gradient comes back times
    dc/dz = sech^2(z / softcap); the z-term z_loss lse^2 needs only the row's lse = z_top +
    log S, its gradient 2 z_loss lse p_j adds 2 z_loss lse to each kept row's coefficient of p_j.

    With `axis_name` (inside ``shard_map``) `z` holds this device's contiguous slice of the
    classes along that mesh axis (y stays the global index); the row's numbers are reduced over
    the slices, four per row, as torch_impl's: z_top (pmax), then z_y - z_top and z_y from the
    slice that holds y (0 elsewhere) and S_y (psum). The closed forms above are functions of
    those: the loss is the same on every device, the gradient's slice local. Label smoothing
    needs two numbers more per row, sum_c w_c (z_c - z_top) over every class and its far form,
    in the same psum. Logits spanning more than the largest number: as torch_impl's.
    """
    z_loss, softcap = head
    # soft-capping: the block's own logits, elementwise (inside shard_map, its slice)
    z, dcap = _softcap(z, softcap)
    num_local = z.shape[-1]
    num_classes = class_weight.shape[0]
    offset = 0 if axis_name is None else jax.lax.axis_index(axis_name) * num_local
    is_y = offset + jnp.arange(num_local) == y[:, None]
    # this slice's classes' weights (the vector is the global one)
    weights = jax.lax.dynamic_slice_in_dim(class_weight, offset, num_local)
    # shift so that the largest logit is 0: exp cannot overflow; a NaN or +inf logit gives NaN
    z_top = jnp.max(z, axis=-1, keepdims=True)
    if axis_name is not None:
        # the row's largest logit over every slice: exp(z - z_top) cannot overflow
        z_top = jax.lax.pmax(z_top, axis_name)
    shifted = z - z_top
    # z_y too, for a row whose logits span more than the largest number (z_y - z_top overflows,
    # the loss may not: ``softmax._minus_log_p_times``)
    if axis_name is None:
        shifted_y = _at(shifted, y)[:, None]
        z_y = _at(z, y)[:, None]
    else:
        shifted_y = jnp.sum(jnp.where(is_y, shifted, 0.0), axis=-1, keepdims=True)
        z_y = jnp.sum(jnp.where(is_y, z, 0.0), axis=-1, keepdims=True)
    e = jnp.where(is_y, 0.0, jnp.exp(shifted))
    others = jnp.sum(e, axis=-1, keepdims=True)
    spread = far_spread = None
    if label_smoothing != 0.0:
        spread = jnp.sum(shifted * weights, axis=-1, keepdims=True)
        # sum_c u w_c (z_top - z_c) as u W z_top - sum_c (u w_c) z_c: each product finite, for
        # the rows where sum_c w_c (z_c - z_top) overflows
        share = (label_smoothing / num_classes) * weights
        far_spread = z_top * jnp.sum(share) - jnp.sum(z * share, axis=-1, keepdims=True)
    if axis_name is not None:
        # z_y - z_top and z_y from the slice that holds y (the others add 0), S_y, the sum of
        # the other classes' exponentials over every slice and, with label smoothing, sum_c w_c
        # (z_c - z_top) over every slice's classes and its far form (one psum per row)
        shifted_y, z_y, others, spread, far_spread = jax.lax.psum(
            (shifted_y, z_y, others, spread, far_spread), axis_name
        )
    e_y = jnp.exp(shifted_y)
    total = others + e_y
    log_total = jnp.log(total)
    a_y = a_y[:, None]
    kept = kept[:, None]
    z_mass = 0.0
    if z_loss != 0.0:
        # the row's log-sum-exp (over every slice): z_top + log S; kept rows only
        lse = z_top + log_total
        z_term = jnp.where(kept != 0.0, z_loss * lse * lse, 0.0)
        # d/dc_j z_loss lse^2 = 2 z_loss lse p_j: one more share of every p_j
        z_mass = jnp.where(kept != 0.0, 2.0 * z_loss * lse, 0.0)
    if label_smoothing != 0.0:
        # the eps share of the mass sits on every class: no one-hot shortcut for the loss
        uniform = label_smoothing / num_classes
        weight_sum = jnp.sum(class_weight)
        mass = (1.0 - label_smoothing) * a_y + uniform * weight_sum * kept
        # -(1 - eps) a_y log p_y, also where z_y - z_top overflowed
        hot = (1.0 - label_smoothing) * a_y
        loss = _minus_log_p_times(hot, shifted_y - log_total, z_y, z_top, log_total, a_y)
        spread_loss = uniform * kept * (weight_sum * log_total - spread)
        # a class's z_c - z_top overflowed (z_c finite): the products of ``far_spread``
        far = jnp.isneginf(spread) & jnp.isfinite(far_spread) & (kept != 0.0)
        far_loss = kept * (uniform * weight_sum * log_total + jnp.where(far, far_spread, 0.0))
        loss = loss + jnp.where(far, far_loss, spread_loss)
        a = (1.0 - label_smoothing) * a_y * is_y + uniform * kept * weights
        grad = jnp.where(is_y, e_y, e) / total * (mass + z_mass) - a
    else:
        has_y = e_y > 0.0
        r = others / jnp.where(has_y, e_y, 1.0)
        small = has_y & (r <= 1.0)
        log1p_r = jnp.log1p(jnp.where(small, r, 0.0))
        log_p = jnp.where(small, -log1p_r, shifted_y - log_total)
        p = e_y / total
        not_p = others / total
        if gamma == 0.0:
            # (1 - p)^0 = 1, also at p = 1
            focal_weight = None
            v = a_y
        else:
            safe_r = jnp.where(small & (r > 0.0), r, 1.0)
            log_not_p = jnp.where(
                small,
                jnp.where(r > 0.0, jnp.log(safe_r), -jnp.inf) - log1p_r,
                _log1m(jnp.where(small, 0.0, p)),
            )
            # (1 - p)^gamma = exp(gamma log(1 - p))
            focal_weight = jnp.exp(gamma * log_not_p)
            eps = jnp.finfo(z.dtype).eps
            is_big = r > eps
            phi = jnp.where(is_big, -log1p_r / jnp.where(is_big, r, 1.0), r / 2.0 - 1.0)
            rest = jnp.where(has_y & ~small, p * log_p / jnp.where(small, 1.0, not_p), 0.0)
            phi = jnp.where(small, phi, rest)
            v = a_y * focal_weight * (1.0 - gamma * phi)
        # 0 log 0 = 0: no target mass (ignored row, zero weight) contributes nothing
        weighted = a_y if focal_weight is None else a_y * focal_weight
        # also where z_y - z_top overflowed though the loss does not
        loss = _minus_log_p_times(weighted, log_p, z_y, z_top, log_total, a_y)
        # p_j v off y, -(1 - p_y) v_y at y: 1 - p_y = S_y / S; the z-term's 2 z_loss lse p_j
        grad = jnp.where(is_y, -not_p * v + z_mass * p, e * ((v + z_mass) / total))
    if z_loss != 0.0:
        loss = loss + z_term
    if dcap is not None:
        # the chain rule through the cap: dl/dz = dl/dc sech^2(z / softcap)
        grad = grad * dcap
    return loss[:, 0], grad


def _block_budget() -> int:
    """Logit entries per row block, from the default device: 4M (16 MB in float32) on a CPU,
    where a block fits the caches; 16M on an accelerator, where a block of at most 1/16 of
    its memory (``memory_stats``' bytes_limit) buys taller matmuls (128 rows of a 128k
    vocabulary: 64 MB per float32 block, under 0.1x the (8192, 128256) bfloat16 logits)."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return 1 << 22
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit", 1 << 34)
    return int(min(1 << 24, max(1 << 22, limit // 16 // 4)))


def _dot(a, b, dtype):
    """a @ b accumulated in `dtype` (float32 products and sums for bfloat16 operands)."""
    return jnp.matmul(a, b, preferred_element_type=dtype)


def _split(x, narrow):
    """x (float32) as two parts of the `narrow` dtype whose sum is x to 2^-17 (bfloat16)."""
    hi = x.astype(narrow)
    return hi, (x - hi.astype(x.dtype)).astype(narrow)


def _block_aux(z, c, y, axis_name):
    """``return_aux``'s numbers of a block's rows: the lse of the capped logits `c` and whether
    the largest logit of `z` (the first on ties) is the target `y`. With `axis_name` the block
    holds this device's slice of the classes: the largest capped logit (pmax) and the sum of
    exponentials (psum), then the first top class over the slices (``softmax._sharded_top``: a
    pmax and a pmin) and whether the slice that holds it holds the target (psum): per-row
    scalars only, only when asked."""
    if axis_name is None:
        return jax.nn.logsumexp(c, axis=-1), jnp.argmax(z, axis=-1) == y
    offset, _ = _class_shard(axis_name, z.shape[-1])
    c_top = jax.lax.pmax(jnp.max(c, axis=-1, keepdims=True), axis_name)
    # an infinite top (a row of -inf, or +inf) shifts by 0: lse is then -inf or +inf (NaN stays)
    c_top = jnp.where(jnp.isinf(c_top), 0.0, c_top)
    total = jax.lax.psum(jnp.sum(jnp.exp(c - c_top), axis=-1), axis_name)
    _, is_top = _sharded_top(z, offset, axis_name)
    is_target = offset + jnp.arange(z.shape[-1]) == y[:, None]
    hits = jax.lax.psum(jnp.sum(is_top & is_target, axis=-1, dtype=jnp.int32), axis_name)
    return c_top[:, 0] + jnp.log(total), hits > 0


def _linear_chunks(h, w, b, y, a_y, kept, class_weight, grad_loss, static):
    """The per-row losses of logits = h w + b over blocks of rows (``lax.scan``) and, with
    `grad_loss` (per-row factors), the gradients of sum_i grad_loss_i l_i w.r.t. h, w and b.

    Each block's (rows, V) logits are formed in the compute dtype (float32 for half inputs) and
    their gradient G mapped through the layer at once: dh = G w^T, dw += h^T G, db += sum G,
    accumulated in the compute dtype. The focal loss with label smoothing takes the softmax
    losses' dense path (``_softmax_focal_terms``), and so do, on one device, the LLM head
    options (z_loss, softcap: ``_softmax_head_terms``, DESIGN 13; over a mesh axis
    ``_linear_block`` takes them), applied to each block's logits, never to an (N, V) array.
    The rows are padded to a whole number of blocks with ignored rows (a_y = kept = 0). With
    `axis_name` (static, inside ``shard_map``) `w` and `b` are this device's slice of the
    classes: each block's row numbers are reduced over the slices (``_linear_block``, the class
    vector the global one), dw and db stay local, and dh = G w^T is this slice's part of the
    hidden gradient, added over the slices with one psum of the (N, H) dh after the scan
    (Megatron's column-parallel linear does the same in its backward). With `aux`
    (static), ``return_aux``'s per-row numbers come out of the same scan, from each block's
    logits: logsumexp of the capped logits and whether the largest logit (the first on ties) is
    the target (1.0 / 0.0). Returns (loss, dh, dw, db, stats), the gradients None without
    `grad_loss`, db None without `b`, stats (lse, correct) or None.
    """
    gamma, label_smoothing, rows, _, z_loss, softcap, axis_name, aux = static
    head = z_loss != 0.0 or softcap is not None
    dtype = _compute_dtype(h.dtype)
    num_rows, size = h.shape
    num_classes = w.shape[1]
    # bfloat16 hidden and weight: the matmuls take them as they are, products accumulated in
    # float32 (preferred_element_type: the tensor cores' path, and no float32 copy of the (H, V)
    # weight); the float32 gradient G enters as two bfloat16 parts, G = hi + lo (hi + lo carries
    # 16 bits: 2^-17 of G, far below bfloat16's rounding of dh and dw). float16 keeps the
    # float32 path (its range would flush G).
    narrow = h.dtype == w.dtype == jnp.bfloat16
    if not narrow:
        w = w.astype(dtype)
    b = None if b is None else b.astype(dtype)
    num_total = num_classes
    if axis_name is not None:
        # V over every slice of the mesh axis: the class vector is the global one
        _, num_total = _class_shard(axis_name, num_classes)
    weights = jnp.ones(num_total, dtype) if class_weight is None else class_weight
    num_blocks = -(-num_rows // rows)
    pad = num_blocks * rows - num_rows

    def blocks(x):
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
        return x.reshape(num_blocks, rows, *x.shape[1:])

    with_grad = grad_loss is not None
    scale = grad_loss if with_grad else jnp.zeros(num_rows, dtype)
    xs = tuple(blocks(x) for x in (h, y, a_y, kept, scale))

    def step(carry, x):
        h_block, y_block, a_block, kept_block, scale_block = x
        # ignored rows enter with hidden 0: their loss and gradient are 0, NaN features included
        h_block = jnp.where(kept_block[:, None] > 0.0, h_block.astype(w.dtype), 0.0)
        z = _dot(h_block, w, dtype)
        if b is not None:
            z = z + b
        # one device: the LLM head options take the dense path; over a mesh axis, the block's own
        stats = None
        if aux:
            # return_aux (DESIGN 13): the row's lse of c and whether its top logit is the target
            c = z if softcap is None else _softcap(z, softcap)[0]
            lse, correct = _block_aux(z, c, y_block, axis_name)
            stats = (lse, correct.astype(dtype))
        if (gamma != 0.0 and label_smoothing != 0.0) or (head and axis_name is None):
            # t~ = (1 - eps) onehot(y) + eps / V on the kept rows, times the class weights
            one_hot = (jnp.arange(num_classes) == y_block[:, None]).astype(dtype)
            t = (1.0 - label_smoothing) * one_hot + label_smoothing / num_classes
            a = weights * t * kept_block[:, None]
            if head:
                loss, grad = _softmax_head_terms(z, a, gamma, z_loss, softcap)
                # ignored rows (hidden 0) have logits b: their z-term and gradient are left out
                loss = loss * kept_block
                grad = grad * kept_block[:, None]
            else:
                loss, grad = _softmax_focal_terms(z, a, gamma)
            # a NaN-poisoned index (traced, out of range) poisons its row here too
            loss = loss + 0.0 * a_block
        else:
            loss, grad = _linear_block(
                z, y_block, a_block, kept_block, weights, gamma, label_smoothing, axis_name,
                (z_loss, softcap),
            )  # fmt: skip
        if not with_grad:
            return carry, (loss, None, stats)
        grad = grad * scale_block[:, None]
        dw, db = carry
        parts = _split(grad, w.dtype) if narrow else (grad,)
        dw = dw + sum(_dot(h_block.T, part, dtype) for part in parts)
        db = None if db is None else db + jnp.sum(grad, axis=0)
        dh = sum(_dot(part, w.T, dtype) for part in parts)
        # over a mesh axis the slices' parts are summed first, in the compute dtype
        return (dw, db), (loss, dh.astype(h.dtype if axis_name is None else dtype), stats)

    init = None
    if with_grad:
        # under shard_map the accumulators vary along every mesh axis their updates do (w's
        # classes, h's and the targets' rows): the sum of an empty slice of each is an exact 0
        # of that type (outside shard_map, a plain 0)
        zero = sum(jnp.sum(x.reshape(-1)[:0]).astype(dtype) for x in (h, w, y, a_y, kept, scale))
        init = (
            jnp.zeros_like(w, dtype=dtype) + zero,
            None if b is None else jnp.zeros_like(b) + zero,
        )
    carry, (loss, dh, stats) = jax.lax.scan(step, init, xs)
    loss = loss.reshape(-1)[:num_rows]
    if stats is not None:
        stats = tuple(jax.lax.stop_gradient(x.reshape(-1)[:num_rows]) for x in stats)
    if not with_grad:
        return loss, None, None, None, stats
    dw, db = carry
    if axis_name is not None:
        # dh = sum over the slices of G_r w_r^T: one psum of (N, H) per call
        dh = jax.lax.psum(dh, axis_name).astype(h.dtype)
    return loss, dh.reshape(-1, size)[:num_rows], dw, db, stats


def _nan_like(x):
    """The cotangent of an input the fused loss does not differentiate: NaN, never a silent 0
    (of x's type: under ``shard_map`` it varies along the mesh axes x does)."""
    return None if x is None else jnp.full_like(x, jnp.nan)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _linear_sum(h, w, b, y, a_y, kept, class_weight, row_scale, static):
    """sum_i row_scale l_i (reductions 'mean' and 'sum'); its VJP computes the gradients in the
    forward pass (3 matrix products per block, as the unfused loss) and scales them."""
    loss, _, _, _, stats = _linear_chunks(h, w, b, y, a_y, kept, class_weight, None, static)
    total = jnp.sum(loss * row_scale)
    return total if stats is None else (total, stats)


def _linear_sum_fwd(h, w, b, y, a_y, kept, class_weight, row_scale, static):
    grad_loss = jnp.broadcast_to(row_scale, y.shape)
    loss, dh, dw, db, stats = _linear_chunks(h, w, b, y, a_y, kept, class_weight, grad_loss, static)
    # empty slices of the inputs: their types (under shard_map, the axes they vary along)
    types = tuple(None if x is None else x.reshape(-1)[:0] for x in (h, w, b))
    residuals = (dh, dw, db, y, a_y, kept, class_weight, row_scale, types)
    total = jnp.sum(loss * row_scale)
    return (total if stats is None else (total, stats)), residuals


def _linear_sum_bwd(static, residuals, g):
    dh, dw, db, y, a_y, kept, class_weight, row_scale, (h, w, b) = residuals
    # return_aux's statistics take no gradient: their cotangent is dropped
    g = g[0] if static[7] else g
    # scaled in the compute dtype, then rounded once to the inputs' dtypes; summed over the mesh
    # axes an input is replicated along (the weight over a data axis; nothing outside shard_map)
    w_dtype, b_dtype = static[3]
    db = None if db is None else _sum_to_type_of(g * db, b).astype(b_dtype)
    return (
        _sum_to_type_of(g * dh, h).astype(dh.dtype),
        _sum_to_type_of(g * dw, w).astype(w_dtype),
        db,
        None,
        _nan_like(a_y),
        None,
        _nan_like(class_weight),
        _nan_like(row_scale),
    )


_linear_sum.defvjp(_linear_sum_fwd, _linear_sum_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _linear_rows(h, w, b, y, a_y, kept, class_weight, static):
    """The per-row losses (reduction 'none'); its VJP recomputes the blocks with the row factors."""
    loss, _, _, _, stats = _linear_chunks(h, w, b, y, a_y, kept, class_weight, None, static)
    return loss if stats is None else (loss, stats)


def _linear_rows_fwd(h, w, b, y, a_y, kept, class_weight, static):
    loss, _, _, _, stats = _linear_chunks(h, w, b, y, a_y, kept, class_weight, None, static)
    out = loss if stats is None else (loss, stats)
    return out, (h, w, b, y, a_y, kept, class_weight)


def _linear_rows_bwd(static, residuals, g):
    h, w, b, y, a_y, kept, class_weight = residuals
    # return_aux's statistics take no gradient: their cotangent is dropped
    g = g[0] if static[7] else g
    # the blocks recomputed without the statistics
    static = (*static[:7], False)
    _, dh, dw, db, _ = _linear_chunks(h, w, b, y, a_y, kept, class_weight, g, static)
    # summed over the mesh axes an input is replicated along (nothing outside shard_map)
    dh = _sum_to_type_of(dh, h)
    dw = _sum_to_type_of(dw, w).astype(w.dtype)
    db = None if db is None else _sum_to_type_of(db, b).astype(b.dtype)
    return dh, dw, db, None, _nan_like(a_y), None, _nan_like(class_weight)


_linear_rows.defvjp(_linear_rows_fwd, _linear_rows_bwd)


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
    axis_name=None,
    return_aux=False,
):
    """Validates the fused loss's arguments and applies the row-block scan to the rows of
    `hidden` (``spec._linear_softmax``, without its (N, V) logits); with `axis_name`,
    `linear_weight` and `bias` are this device's slice of the classes along that mesh axis
    (``_class_shard``) and the class vector and targets are global."""
    _not_torch(hidden=hidden, linear_weight=linear_weight, targets=targets, bias=bias)
    _not_torch(weight=class_weight_arg, gamma=gamma, label_smoothing=label_smoothing)
    reduction, normalizer = _normalizer(reduction, normalizer)
    hidden = _as_array(hidden)
    linear_weight = _as_array(linear_weight)
    targets = _as_array(targets)
    _checks.float_logits("hidden", jnp.issubdtype(hidden.dtype, jnp.floating), hidden.dtype)
    _checks.float_logits(
        "linear_weight",
        jnp.issubdtype(linear_weight.dtype, jnp.floating),
        linear_weight.dtype,
    )
    _checks.index_targets(jnp.issubdtype(targets.dtype, jnp.integer), targets.dtype)
    if bias is not None:
        bias = _as_array(bias)
    bias_shape = None if bias is None else bias.shape
    size, num_local = _checks.linear_shapes(
        hidden.shape, linear_weight.shape, bias_shape, targets.shape, 1
    )
    num_classes = num_local
    chunk_size = _checks.chunk_size(chunk_size)
    ignore_index = _checks.ignore_index(ignore_index)
    # static here (they select the block's code path): Python numbers
    label_smoothing = _checks.unit_interval("label_smoothing", label_smoothing)
    if is_focal:
        gamma = _checks.gamma(gamma)
    return_aux = _checks.return_aux(return_aux)
    if axis_name is not None:
        _linear_parallel_refuses(label_smoothing, gamma)
        # V over every slice of the mesh axis (an unbound name raises here)
        _, num_classes = _class_shard(axis_name, num_local)
    z_loss = _checks.z_loss(z_loss)
    softcap = _checks.softcap(softcap)
    dtype = _compute_dtype(hidden.dtype)
    vector = class_weight_arg
    if vector is not None and not np.isscalar(vector):
        vector = _as_array(vector)
    if is_focal:
        _checks.focal_alpha(vector, num_classes)
        if vector is not None and _is_concrete(vector):
            _checks.unit_interval_values("alpha", np.atleast_1d(vector))
    elif vector is not None:
        _checks.class_vector("weight", vector.shape, num_classes)
    if vector is None:
        class_weight = None
    else:
        class_weight = jnp.broadcast_to(_as_array(vector).astype(dtype), (num_classes,))
    y = targets.reshape(-1)
    if _is_concrete(y):
        _checks.class_indices(np.asarray(y), num_classes, ignore_index)
    else:
        _check_traced_indices(y, num_classes, ignore_index)
    keep = y != ignore_index
    # an index outside [0, C) cannot raise under jit: its row's loss and gradient are NaN
    poison = jnp.where(keep & ((y < 0) | (y >= num_classes)), jnp.nan, 0.0).astype(dtype)
    y_safe = jnp.where(keep, jnp.clip(y, 0, num_classes - 1), 0)
    weights = jnp.ones(num_classes, dtype) if class_weight is None else class_weight
    a_y = jnp.where(keep, weights[y_safe], 0.0) + poison
    kept = keep.astype(dtype)
    h = hidden.reshape(-1, size)
    if chunk_size is None:
        # the dense path (focal with label smoothing) holds ~8 temporaries per block
        dense = is_focal and gamma != 0.0 and label_smoothing != 0.0
        dense = dense or z_loss != 0.0 or softcap is not None
        # (over a mesh axis the options take the block path, whose budget this keeps too)
        budget = (1 << 19) if dense else _block_budget()
        chunk_size = _checks.default_chunk_size(h.shape[0], num_local, budget)
    rows = min(chunk_size, max(h.shape[0], 1))
    dtypes = (linear_weight.dtype, None if bias is None else bias.dtype)
    static = (gamma, label_smoothing, rows, dtypes, z_loss, softcap, axis_name, return_aux)
    if reduction == "none":
        loss = _linear_rows(h, linear_weight, bias, y_safe, a_y, kept, class_weight, static)
        if return_aux:
            loss, stats = loss
            aux = _linear_aux(*stats, keep, z_loss, reduction, None, targets.shape)
            aux = {key: value.astype(hidden.dtype) for key, value in aux.items()}
            return loss.reshape(targets.shape).astype(hidden.dtype), aux
        return loss.reshape(targets.shape).astype(hidden.dtype)
    if normalizer is not None:
        # the given divisor of the mean (a constant)
        denominator = jnp.asarray(normalizer, dtype)
        nonzero = denominator != 0
        row_scale = jnp.where(nonzero, 1.0 / jnp.where(nonzero, denominator, 1.0), 0.0)
    elif reduction == "mean":
        if is_focal or class_weight is None:
            # plain mean over the kept rows
            denominator = jnp.sum(kept)
        else:
            # torch: the weighted mean divides by the weights of the kept targets
            denominator = jnp.sum(jnp.where(keep, weights[y_safe], 0.0))
        nonzero = denominator != 0
        row_scale = jnp.where(nonzero, 1.0 / jnp.where(nonzero, denominator, 1.0), 0.0)
    else:
        row_scale = jnp.ones((), dtype)
    row_scale = row_scale.astype(dtype)
    loss = _linear_sum(h, linear_weight, bias, y_safe, a_y, kept, class_weight, row_scale, static)
    if return_aux:
        loss, stats = loss
        aux = _linear_aux(*stats, keep, z_loss, reduction, normalizer, targets.shape)
        aux = {key: value.astype(hidden.dtype) for key, value in aux.items()}
        return loss.astype(hidden.dtype), aux
    return loss.astype(hidden.dtype)


def _linear_aux(lse, correct, keep, z_loss, reduction, normalizer, shape):
    """``return_aux``'s statistics (``spec._linear_aux``) from the per-row lse and correct of
    the block scan: 0 where not kept, z_term = z_loss lse^2, reduced as the spec says (the kept
    rows' mean, or over `normalizer`)."""
    lse = jnp.where(keep, lse, 0.0)
    stats = {"lse": lse, "z_term": z_loss * lse * lse, "correct": jnp.where(keep, correct, 0.0)}
    if reduction == "none":
        return {key: value.reshape(shape) for key, value in stats.items()}
    sums = {key: jnp.sum(value) for key, value in stats.items()}
    if reduction == "sum" and normalizer is None:
        return sums
    divisor = jnp.sum(keep) if normalizer is None else jnp.asarray(normalizer, lse.dtype)
    nonzero = divisor != 0
    scale = jnp.where(nonzero, 1.0 / jnp.where(nonzero, divisor, 1.0), 0.0)
    return {key: value * scale for key, value in sums.items()}


def linear_softmax_cross_entropy(
    hidden: ArrayLike,
    linear_weight: ArrayLike,
    targets: ArrayLike,
    *,
    bias: ArrayLike | None = None,
    weight: ArrayLike | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    return_aux: bool = False,
    axis_name: Hashable | None = None,
) -> jax.Array | tuple[jax.Array, dict]:
    """Softmax cross entropy of hidden @ linear_weight + bias without the (N, V) logits
    (``spec.linear_softmax_cross_entropy``); `linear_weight` (H, V) as the spec.

    A ``jax.custom_vjp`` over a ``lax.scan`` of row blocks (`chunk_size` rows; default: blocks
    of at most 4M logits, 512K for focal with label smoothing). Computed in the hidden dtype
    (float32 for float16/bfloat16, accumulators included), returned in it. Gradients for
    `hidden`, `linear_weight` and `bias`; `weight` gets NaN (no gradient is given for it, never a
    silent 0). `label_smoothing` (and the focal `gamma`) are Python numbers here, not traced.
    Under ``jit`` an index outside [0, V) gives NaN. `z_loss`, `softcap` (DESIGN 13, Python
    numbers): applied to each block's logits (the dense block path, 512K-entry blocks).

    `axis_name` (inside ``jax.shard_map``, DESIGN 12, docs/scaling.md): the mesh axis the
    classes are split over; `linear_weight` (H, V_r) and `bias` (V_r,) are this device's slice
    (shard_map's even slices, in axis order), `hidden`, `targets` (GLOBAL class indices),
    `weight` (the global length-V vector) and `normalizer` the same on every device of the
    axis. Each block crosses the axis with four numbers per row (pmax of the largest logit,
    psum of the target's logit, shifted and not, and of the other classes' sum of exponentials;
    with `label_smoothing` the same psum carries the row's class-weighted sum of logits, shifted
    and scaled); `softcap` is applied to each device's logits, `z_loss` takes the row's
    log-sum-exp from those numbers. The loss is the same on every device, the gradients of
    `linear_weight` and `bias` the local slice of the full ones, and the gradient of `hidden`
    the full one: one psum of the (N, H) gradient per call (as Megatron's column-parallel
    linear in its backward).
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
        axis_name,
        return_aux,
    )


def linear_softmax_focal_loss(
    hidden: ArrayLike,
    linear_weight: ArrayLike,
    targets: ArrayLike,
    *,
    bias: ArrayLike | None = None,
    gamma: float = 2.0,
    alpha: ArrayLike | float | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    return_aux: bool = False,
    axis_name: Hashable | None = None,
) -> jax.Array | tuple[jax.Array, dict]:
    """Softmax focal loss of hidden @ linear_weight + bias without the (N, V) logits
    (``spec.linear_softmax_focal_loss``); blocks, dtypes and gradients as
    ``linear_softmax_cross_entropy`` (a vector `alpha` gets a NaN gradient). `axis_name`: the
    classes split over a mesh axis as ``linear_softmax_cross_entropy``'s (`alpha` global;
    `label_smoothing` with gamma != 0 raises there)."""
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
        axis_name,
        return_aux,
    )
