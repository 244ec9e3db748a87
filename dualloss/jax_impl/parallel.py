"""Past one device (DESIGN 12), JAX: the global count that ``normalizer=`` divides by, and the
class axis split over a mesh axis (``axis_name=`` of the softmax losses).

``global_count`` counts the kept class-index targets (or sums their class weights) and, inside
``shard_map``/``pmap``, adds the other devices' with one ``psum`` over the named mesh axes: passed
as ``normalizer=`` to every micro-batch on every device, the summed gradients equal the gradient
of the one-big-batch mean.

``_class_shard`` and ``_sharded_softmax_inputs`` are the argument handling of the softmax losses
called inside ``shard_map`` with the class axis split over the mesh axis `axis_name` (contiguous
slices in axis order, targets global class indices); ``_with_sharded_grad`` is the closed-form
``custom_jvp`` adapter whose tangent adds the slices' contributions with one ``psum`` per row. The
sharded loss terms live in ``softmax`` (they read as the single-device ones with the reductions
swapped in), which imports this module. Imports ``_inputs`` and ``_autodiff`` only.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from .. import _checks
from ._autodiff import _forward_tangent, _is_zero
from ._inputs import (
    ArrayLike,
    _as_array,
    _check_alpha_values,
    _check_traced_indices,
    _compute_dtype,
    _is_concrete,
    _is_static,
    _not_torch,
    _on_host,
    _scalar_option,
)


def global_count(
    targets: ArrayLike | list | tuple,
    *,
    weight: ArrayLike | None = None,
    ignore_index: int = -100,
    axis_name: Hashable | Sequence[Hashable] | None = None,
) -> jax.Array:
    """The number of targets not equal to `ignore_index` (or, with `weight`, the sum of their class
    weights) over `targets` (one array, or the micro-batches of one step) and every device along
    `axis_name`, for ``normalizer=``.

    Args:
      targets: integer class indices; a list or tuple of them (the micro-batches of one step) is
        counted together, so the step needs one ``psum``.
      weight: optional per-class weights (torch's weighted mean divides by their sum over the kept
        targets); a constant: the result is behind ``stop_gradient``.
      ignore_index: targets equal to it are not counted.
      axis_name: None (this call's targets only), or the mesh axis name(s) of ``shard_map`` /
        ``pmap`` the batch is split over (a name or a tuple of names): one ``psum`` over them.

    Returns:
      a 0-d array: int32 for a count, the weights' dtype for a weight sum.
    """
    parts = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    ignore_index = _checks.ignore_index(ignore_index)
    if not parts:
        raise ValueError("`targets` must hold at least one array. Received: targets=[].")
    total = None
    for part in parts:
        _not_torch(targets=part)
        part = _as_array(part)
        _checks.index_targets(jnp.issubdtype(part.dtype, jnp.integer), part.dtype)
        keep = part != ignore_index
        if weight is None:
            count = jnp.sum(keep, dtype=jnp.int32)
        else:
            weights = jax.lax.stop_gradient(_as_array(weight))
            count = jnp.sum(jnp.where(keep, weights[jnp.where(keep, part, 0)], 0.0))
        total = count if total is None else total + count
    if axis_name is not None:
        # the kept targets of every device along the named axes: one psum of one scalar
        total = jax.lax.psum(total, axis_name)
    return total


# ----------------------------------------------------------------------------------------------
# The class axis split over a mesh axis (softmax losses, ``axis_name=``)
# ----------------------------------------------------------------------------------------------


def _class_shard(axis_name, num_local):
    """(offset, num_classes): where this device's contiguous slice of `num_local` classes starts
    in the row, and the row's length, along the mesh axis `axis_name` (slices in axis order, all
    of one size: ``shard_map`` splits evenly). One clear error where the name is not bound."""
    try:
        size = jax.lax.axis_size(axis_name)
        index = jax.lax.axis_index(axis_name)
    except (NameError, TypeError, ValueError):
        raise ValueError(
            "`axis_name` must name a mesh axis of the enclosing `jax.shard_map` (the axis the "
            f"class dimension is split over). Received: axis_name={axis_name!r}, not bound here."
        ) from None
    return index * num_local, size * num_local


def _sharded_softmax_inputs(
    logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where, axis_name
):
    """``_inputs._softmax_inputs`` for logits that hold one slice of the classes (DESIGN 12).

    `targets` are global class indices (the batch shape) or probabilities sliced like the logits;
    `where` a class mask sliced like the logits, or a per-element mask of the batch shape; `weight`
    and a vector `alpha` the GLOBAL vector (one entry per class of the whole row, replicated: each
    device reads its slice, and the weighted mean's denominator reads the targets' entries).
    Returns (z, t, keep, is_index, class_weight, vector, offset, num_classes, axis): `z` the local
    logits with masked classes at -inf, `t` the local slice of the smoothed target distribution,
    `keep` the non-ignored elements (the same on every device of the axis), `class_weight` the
    local slice of the per-class vector and `vector` the whole one (ones if None).
    """
    _not_torch(logits=logits, targets=targets, weight=weight, alpha=alpha, where=where)
    logits = _as_array(logits)
    targets = _as_array(targets)
    _checks.float_logits("logits", jnp.issubdtype(logits.dtype, jnp.floating), logits.dtype)
    axis = _checks.class_axis(axis, logits.ndim)
    num_local = logits.shape[axis]
    offset, num_classes = _class_shard(axis_name, num_local)
    if jnp.issubdtype(targets.dtype, jnp.integer):
        kind = "index"
    elif jnp.issubdtype(targets.dtype, jnp.floating):
        kind = "prob"
    else:
        kind = "other"
    _checks.softmax_targets(kind, targets.shape, targets.dtype, logits.shape, axis)
    ignore_index = _checks.ignore_index(ignore_index)
    label_smoothing = _scalar_option("label_smoothing", label_smoothing)
    if kind == "index" and _is_concrete(targets) and _on_host(targets):
        _checks.class_indices(np.asarray(targets), num_classes, ignore_index)
    elif kind == "index":
        # traced (always, for an argument of shard_map): NaN, and checkify's error
        _check_traced_indices(targets, num_classes, ignore_index)
    if weight is not None:
        weight = _as_array(weight)
        _checks.class_vector("weight", weight.shape, num_classes)
    if alpha is not None:
        alpha = alpha if np.isscalar(alpha) else _as_array(alpha)
        _checks.focal_alpha(alpha, num_classes)
        if _is_concrete(alpha):
            _check_alpha_values(alpha)
        else:
            # traced: NaN where an entry is outside [0, 1] (checkify reports it)
            ok = (alpha >= 0.0) & (alpha <= 1.0)
            checkify.debug_check(jnp.all(ok), "`alpha` must have every entry in [0, 1].")
            alpha = alpha + jnp.where(ok, 0.0, jnp.nan).astype(alpha.dtype)
    if where is not None:
        where = _as_array(where)
        is_bool = where.dtype == jnp.bool_
        if _checks.where_mask(where.shape, is_bool, where.dtype, logits.shape, axis):
            where = jnp.expand_dims(where, axis)

    dtype = _compute_dtype(logits.dtype)
    z = jnp.moveaxis(logits.astype(dtype), axis, -1)
    classes = offset + jnp.arange(num_local)
    if where is None:
        valid = jnp.ones(z.shape, dtype=bool)
        keep = jnp.ones(z.shape[:-1], dtype=bool)
    else:
        valid = jnp.moveaxis(jnp.broadcast_to(where, logits.shape), axis, -1)
        # classes outside `where` leave the softmax: exactly a logit of -inf
        z = jnp.where(valid, z, -jnp.inf)
        # the classes left in the row, over every slice: one psum of one count per row
        num_valid = jax.lax.psum(jnp.sum(valid, axis=-1, dtype=jnp.int32), axis_name)
        # an element with no class left inside `where` is left out, like an ignored target
        keep = num_valid > 0
    if kind == "index":
        keep = keep & (targets != ignore_index)
        if where is not None:
            # a target on a class outside `where` is ignored: the slice that holds it says so,
            # one psum of one count per row (an index outside [0, C) stays kept: NaN, not hidden)
            on_valid = jnp.sum(valid & (classes == targets[..., None]), axis=-1, dtype=jnp.int32)
            on_valid = jax.lax.psum(on_valid, axis_name) > 0
            y = jnp.clip(targets, 0, num_classes - 1)
            keep = keep & (on_valid | (targets != y))
        # the local slice of the one-hot targets: zero where the target is on another slice
        t = ((classes == targets[..., None]) & keep[..., None]).astype(dtype)
    else:
        t = jnp.moveaxis(targets.astype(dtype), axis, -1)
        if where is not None:
            # target mass on a class outside `where` leaves the sum (optax), it does not give +inf
            t = jnp.where(valid & keep[..., None], t, 0.0)
    if not _is_static(label_smoothing) or label_smoothing != 0.0:
        # t~ = (1 - eps) t + eps / C, the eps mass spread over the classes inside `where` only
        # (of every slice: the count of the row's valid classes, one psum per row)
        if where is None:
            num_valid = jnp.full(z.shape[:-1], num_classes)
        uniform = jnp.where(valid, 1.0 / jnp.maximum(num_valid, 1)[..., None], 0.0)
        label_smoothing = jnp.asarray(label_smoothing, dtype)
        t = (1.0 - label_smoothing) * t + label_smoothing * uniform * keep[..., None]
    vector = weight if weight is not None else alpha
    if vector is None:
        vector = jnp.ones(num_classes, dtype=dtype)
    else:
        vector = jnp.broadcast_to(_as_array(vector).astype(dtype), (num_classes,))
    # this device's slice of the global per-class vector
    class_weight = jax.lax.dynamic_slice_in_dim(vector, offset, num_local)
    return z, t, keep, kind == "index", class_weight, vector, offset, num_classes, axis


def _with_sharded_grad(terms, num_static):
    """``_autodiff._with_closed_form_grad`` for losses whose class axis is split over the mesh
    axis named by the last static argument: `terms(z, *rest, *static)` returns the row's loss
    (already summed over the slices) and the local slice of its closed-form gradient, so the
    tangent along the logits is the local sum of grad * dz plus the other slices': one psum per
    row. Reverse mode transposes that psum (shard_map's varying-axis types make it free: each
    device keeps its slice of the gradient). Tangents of the other arguments (targets, alpha, a
    traced gamma): autodiff of the forward formula, psum included."""
    num_args = terms.__code__.co_argcount
    static_argnums = tuple(range(num_args - num_static, num_args))

    def value(*args):
        return terms(*args)[0]

    value = jax.custom_jvp(value, nondiff_argnums=static_argnums)

    def rule(*args):
        static, primals, tangents = args[:num_static], args[num_static], args[num_static + 1]
        z, *rest = primals
        dz, *drest = tangents
        axis_name = static[-1]
        loss, grad = terms(z, *rest, *static)
        tangent = jnp.zeros_like(loss)
        if not _is_zero(dz):
            # the row's tangent: this slice's classes, then the other slices' (one psum per row)
            tangent = tangent + jax.lax.psum(jnp.sum(grad * dz, axis=-1), axis_name)
        if not all(_is_zero(d) for d in drest):
            tangent = tangent + _forward_tangent(
                lambda *others: terms(z, *others, *static)[0], rest, drest
            )
        return loss, tangent

    value.defjvp(rule, symbolic_zeros=True)
    return value


def _varying_axes(x) -> frozenset:
    """The mesh axes along which `x` varies inside ``shard_map`` (its type's varying manual axes;
    none outside ``shard_map``)."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", ()))


def _sum_to_type_of(cotangent, primal):
    """`cotangent` summed (one psum) over the mesh axes it varies along and `primal` does not, for
    ``custom_vjp`` rules inside ``shard_map``: an input replicated over an axis (the weight over
    the data axis, the hidden states over the vocabulary axis) gets the sum of its uses on every
    device, as autodiff's transpose of the implicit broadcast gives; elsewhere unchanged."""
    extra = _varying_axes(cotangent) - _varying_axes(primal)
    return cotangent if not extra else jax.lax.psum(cotangent, tuple(extra))
