"""Argument handling of the spec: arrays to float64, the softmax and sigmoid arguments checked
(one call into ``dualloss._checks`` each) and converted, and the reductions.

Holds ``_as_array``, ``_softmax_inputs``, ``_sigmoid_inputs``, ``_reduce``, ``_normalizer``,
``_normalize``. Imports NumPy and
``dualloss._checks`` only: no other module of ``dualloss.spec``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _checks

# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


ArrayLike = Any


def _as_array(x: ArrayLike) -> np.ndarray:
    """NumPy view of `x` (NumPy array, Python scalar or anything with __array__)."""
    return np.asarray(x)


def _softmax_inputs(logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where):
    """Validates the softmax arguments; returns them in float64 with the class axis last.

    Returns (z, t, keep, valid, is_index, class_weight, axis): `z` the logits with masked classes
    at -inf, `t` the smoothed target distribution (zero rows where ignored, zero on classes
    outside `where`), `keep` the non-ignored elements (not ignore_index, a class left inside
    `where`, a class-index target inside it), `valid` the classes inside `where`, `class_weight`
    the per-class vector (`weight` or `alpha`, ones if None).
    """
    logits = _as_array(logits)
    targets = _as_array(targets)
    _checks.float_logits("logits", np.issubdtype(logits.dtype, np.floating), logits.dtype)
    axis = _checks.class_axis(axis, logits.ndim)
    num_classes = logits.shape[axis]
    if np.issubdtype(targets.dtype, np.integer):
        kind = "index"
    elif np.issubdtype(targets.dtype, np.floating):
        kind = "prob"
    else:
        kind = "other"
    _checks.softmax_targets(kind, targets.shape, targets.dtype, logits.shape, axis)
    ignore_index = _checks.ignore_index(ignore_index)
    label_smoothing = _checks.unit_interval("label_smoothing", label_smoothing)
    if kind == "index":
        _checks.class_indices(targets, num_classes, ignore_index)
    if weight is not None:
        weight = _as_array(weight)
        _checks.class_vector("weight", weight.shape, num_classes)
    if alpha is not None:
        alpha = alpha if np.isscalar(alpha) else _as_array(alpha)
        _checks.focal_alpha(alpha, num_classes)
        _checks.unit_interval_values("alpha", np.atleast_1d(alpha))
    if where is not None:
        where = _as_array(where)
        # a class mask, or (optax's [batch]) a per-element mask: the class axis inserted
        is_bool = where.dtype == np.bool_
        if _checks.where_mask(where.shape, is_bool, where.dtype, logits.shape, axis):
            where = np.expand_dims(where, axis)

    z = np.moveaxis(logits.astype(np.float64), axis, -1)
    # classes outside `where` leave the softmax: exactly a logit of -inf
    if where is None:
        valid = np.ones(z.shape, dtype=bool)
    else:
        valid = np.moveaxis(np.broadcast_to(where, logits.shape), axis, -1)
        z = np.where(valid, z, -np.inf)
    classes = np.arange(num_classes)
    # an element with no class left inside `where` is left out, exactly like an ignored target
    keep = np.any(valid, axis=-1)
    if kind == "index":
        # a target on a class outside `where` has no mass left: the element is ignored too
        on_valid = np.take_along_axis(valid, np.clip(targets, 0, num_classes - 1)[..., None], -1)
        keep = keep & (targets != ignore_index) & on_valid[..., 0]
        one_hot = (classes == targets[..., None]) & keep[..., None]
        t = one_hot.astype(np.float64)
    else:
        # target mass on a class outside `where` leaves the sum (optax), it does not give +inf
        t = np.moveaxis(targets.astype(np.float64), axis, -1)
        t = np.where(valid & keep[..., None], t, 0.0)
    if label_smoothing != 0.0:
        # t~ = (1 - eps) t + eps / C, the eps mass spread over the classes inside `where` only
        num_valid = np.sum(valid, axis=-1, keepdims=True)
        uniform = np.where(valid, 1.0 / np.maximum(num_valid, 1), 0.0)
        t = (1.0 - label_smoothing) * t + label_smoothing * uniform * keep[..., None]
    vector = weight if weight is not None else alpha
    if vector is None:
        class_weight = np.ones(num_classes)
    else:
        class_weight = np.broadcast_to(_as_array(vector).astype(np.float64), (num_classes,))
    return z, t, keep, valid, kind == "index", class_weight, axis


def _sigmoid_inputs(logits, targets, weight, pos_weight):
    """Validates the sigmoid arguments; returns x, t, w, q as float64 arrays of the logits shape."""
    logits = _as_array(logits)
    targets = _as_array(targets)
    _checks.float_logits("logits", np.issubdtype(logits.dtype, np.floating), logits.dtype)
    _checks.sigmoid_targets(
        targets.shape, np.issubdtype(targets.dtype, np.floating), targets.dtype, logits.shape
    )
    x = logits.astype(np.float64)
    # NaN or +inf in the logits: NaN in that element (DESIGN 5), never a plausible inf or 0
    x = np.where(x == np.inf, np.nan, x)
    t = targets.astype(np.float64)
    factors = []
    for name, factor in (("weight", weight), ("pos_weight", pos_weight)):
        if factor is None:
            factors.append(np.ones_like(x))
            continue
        factor = _as_array(factor)
        _checks.broadcastable(name, factor.shape, logits.shape)
        factors.append(np.broadcast_to(factor.astype(np.float64), x.shape))
    return x, t, factors[0], factors[1]


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------


def _reduce(loss, grad, reduction, denominator):
    """Applies `reduction` to per-element losses and their gradients.

    A mean over a zero denominator (every target ignored, or no elements) is 0 with zero gradient.
    """
    if reduction == "none":
        return loss, grad
    total = np.sum(loss)
    if reduction == "sum":
        return total, grad
    if denominator == 0:
        return total * 0.0, grad * 0.0
    return total / denominator, grad / denominator


def _normalizer(reduction, normalizer):
    """The checked `reduction` and `normalizer` (a float, or None when not given).

    `normalizer` replaces the divisor of reduction 'mean': the loss is then the reduction='sum'
    loss divided by it, so the reduction to compute first is 'sum'. It needs reduction 'mean'
    (the default): with 'none' or 'sum' it raises, as a divisor that those do not have.
    """
    reduction = _checks.reduction(reduction)
    if normalizer is None:
        return reduction, None
    _checks.normalizer_reduction(reduction)
    if np.isscalar(normalizer):
        return "sum", _checks.normalizer_number(normalizer)
    array = _as_array(normalizer)
    is_real = np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    _checks.normalizer_array(array.shape, is_real, array.dtype)
    return "sum", _checks.normalizer_number(float(array))


def _normalize(x, normalizer):
    """`x`, a reduction='sum' loss or any of its gradients, divided by `normalizer` (a constant:
    it takes no gradient); 0 with zero gradient for a zero normalizer, as a mean over nothing."""
    if normalizer is None:
        return x
    if normalizer == 0.0:
        return x * 0.0
    return x / normalizer
