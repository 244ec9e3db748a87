"""Argument handling of the JAX backend: arrays checked and converted (a torch tensor refused),
options that may be traced, the value checks that never copy accelerator data to the host, the
arguments of optax's signatures, and the reductions.

Holds the module state of the value checks, in this module only: ``_SYNC_CHECKS``, the
``_CHECKED_ALPHA`` cache, and ``_on_host`` (tests and ``dualloss-parity smoke`` patch it here).
Imports JAX and ``dualloss._checks`` only: no other module of ``jax_impl``, and never
``dualloss.optax`` (which sits above the backend).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from .. import _checks

# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


ArrayLike = Any


def _as_array(x: ArrayLike) -> jax.Array:
    """JAX view of `x` (JAX or NumPy array, Python scalar or anything with __array__)."""
    return jnp.asarray(x)


def _is_concrete(x) -> bool:
    """True when the values of `x` are known now (eager call), False inside a transformation."""
    return not isinstance(x, jax.core.Tracer)


def _compute_dtype(dtype):
    """float16 and bfloat16 are computed in float32; float32 and float64 in themselves."""
    return jnp.promote_types(dtype, jnp.float32)


def _not_torch(**arrays):
    """A torch tensor is never converted silently: one TypeError naming the argument."""
    for name, value in arrays.items():
        kind = type(value)
        if kind.__module__.split(".")[0] == "torch":
            raise TypeError(
                f"`{name}` must be a JAX array, a NumPy array or a Python number, not a torch "
                f"tensor (convert it with `{name}.numpy()` first). "
                f"Received: type({name})={kind.__module__}.{kind.__qualname__}."
            )


def _is_static(x) -> bool:
    """True for a Python number: it can select a code path (gamma = 0, label_smoothing = 0)."""
    return isinstance(x, (int, float))


def _scalar_option(name, value):
    """A scalar option (gamma, label_smoothing, a scalar alpha) that may be a traced value.

    Concrete values (numbers, concrete 0-d arrays) are validated by ``_checks`` (gamma >= 0,
    the others in [0, 1]) and returned as Python floats, so that gamma = 0 still takes its exact
    branch. A traced value cannot raise: it is returned as it is plus NaN where the check fails
    (as for class indices: never a plausible number), and ``checkify`` reports the message.
    """
    is_gamma = name == "gamma"
    if isinstance(value, (jax.Array, np.ndarray)) and _is_concrete(value) and value.ndim == 0:
        value = value.item()
    if _is_concrete(value):
        return _checks.gamma(value) if is_gamma else _checks.unit_interval(name, value)
    if value.ndim != 0:
        raise TypeError(f"`{name}` must be a real number. Received: {name}={value!r}.")
    if is_gamma:
        ok = (value >= 0.0) & jnp.isfinite(value)
        message = f"`{name}` must be a finite number >= 0. Received: {name}={{value}}."
    else:
        ok = (value >= 0.0) & (value <= 1.0)
        message = f"`{name}` must be in [0, 1]. Received: {name}={{value}}."
    checkify.debug_check(ok, message, value=value)
    return value + jnp.where(ok, 0.0, jnp.nan).astype(value.dtype)


_SYNC_CHECKS = os.environ.get("DUALLOSS_VALIDATE_INDICES", "").strip().lower() == "sync"


def _on_host(x) -> bool:
    """True where reading the values of `x` costs no device-to-host copy: a NumPy array, a Python
    value, a JAX array on the CPU (or anything with ``DUALLOSS_VALIDATE_INDICES=sync``)."""
    if _SYNC_CHECKS or not isinstance(x, jax.Array) or not _is_concrete(x):
        return True
    return all(device.platform == "cpu" for device in x.devices())


def _sigmoid_focal_targets(t, shape):
    """The sigmoid focal loss's targets `t` (``_sigmoid_inputs``' view of the targets of `shape`)
    in [0, 1] (NaN propagates): concrete values on the host raise the ``_checks`` error;
    elsewhere (traced, or on an accelerator, where reading them would copy them to the host on
    every call) an entry outside is NaN, so is its loss, and ``checkify`` reports the message."""
    if _is_concrete(t) and _on_host(t):
        _checks.sigmoid_focal_targets(np.asarray(t).reshape(shape))
        return t
    bad = (t < 0.0) | (t > 1.0)
    checkify.debug_check(~jnp.any(bad), _checks.SIGMOID_FOCAL_TARGETS_DEVICE_MESSAGE)
    return t + jnp.where(bad, jnp.nan, 0.0).astype(t.dtype)


# concrete vector `alpha` arrays already checked (JAX arrays are immutable): id -> weak reference
_CHECKED_ALPHA: dict[int, Any] = {}


def _check_alpha_values(alpha) -> None:
    """A concrete `alpha` in [0, 1]; an accelerator array goes to the host once, not per call."""
    if _on_host(alpha):
        _checks.unit_interval_values("alpha", np.atleast_1d(alpha))
        return
    entry = _CHECKED_ALPHA.get(id(alpha))
    if entry is not None and entry() is alpha:
        return
    with jax.transfer_guard("allow"):  # the one deliberate copy
        _checks.unit_interval_values("alpha", np.atleast_1d(np.asarray(alpha)))
    if len(_CHECKED_ALPHA) > 64:
        _CHECKED_ALPHA.clear()
    _CHECKED_ALPHA[id(alpha)] = weakref.ref(alpha)


def _check_traced_indices(targets, num_classes, ignore_index):
    """The `_checks.class_indices` error for traced targets, raised by `checkify` when enabled."""
    bad = ((targets < 0) | (targets >= num_classes)) & (targets != ignore_index)
    first = jnp.argmax(bad.ravel())
    position = jnp.unravel_index(first, targets.shape)
    names = [f"p{i}" for i in range(targets.ndim)]
    position_text = "(" + ", ".join("{" + name + "}" for name in names)
    position_text += ",)" if targets.ndim == 1 else ")"
    checkify.debug_check(
        ~jnp.any(bad),
        "`targets` has class index {value} at position " + position_text + ", outside "
        f"[0, {num_classes}) and not ignore_index={ignore_index}.",
        value=targets.ravel()[first],
        **dict(zip(names, position, strict=True)),
    )


def _softmax_inputs(logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where):
    """Validates the softmax arguments; returns them in the compute dtype with the class axis last.

    Returns (z, t, keep, valid, is_index, class_weight, axis): `z` the logits with masked classes
    at -inf, `t` the smoothed target distribution (zero rows where ignored), `keep` the non-ignored
    elements, `valid` the classes inside `where`, `class_weight` the per-class vector (`weight` or
    `alpha`, ones if None).
    """
    _not_torch(logits=logits, targets=targets, weight=weight, alpha=alpha, where=where)
    # host data is checked as it came (converted, it may already sit on an accelerator)
    host_targets = targets if _on_host(targets) else None
    host_alpha = alpha if _on_host(alpha) else None
    logits = _as_array(logits)
    targets = _as_array(targets)
    _checks.float_logits("logits", jnp.issubdtype(logits.dtype, jnp.floating), logits.dtype)
    axis = _checks.class_axis(axis, logits.ndim)
    num_classes = logits.shape[axis]
    if jnp.issubdtype(targets.dtype, jnp.integer):
        kind = "index"
    elif jnp.issubdtype(targets.dtype, jnp.floating):
        kind = "prob"
    else:
        kind = "other"
    _checks.softmax_targets(kind, targets.shape, targets.dtype, logits.shape, axis)
    ignore_index = _checks.ignore_index(ignore_index)
    label_smoothing = _scalar_option("label_smoothing", label_smoothing)
    if kind == "index" and _is_concrete(targets) and host_targets is not None:
        _checks.class_indices(np.asarray(host_targets), num_classes, ignore_index)
    elif kind == "index":
        # traced, or concrete on an accelerator (no host copy): NaN, and checkify's error
        _check_traced_indices(targets, num_classes, ignore_index)
    if weight is not None:
        weight = _as_array(weight)
        _checks.class_vector("weight", weight.shape, num_classes)
    if alpha is not None:
        alpha = alpha if np.isscalar(alpha) else _as_array(alpha)
        _checks.focal_alpha(alpha, num_classes)
        if _is_concrete(alpha):
            _check_alpha_values(alpha if host_alpha is None else host_alpha)
        else:
            # traced: NaN where an entry is outside [0, 1] (checkify reports it)
            ok = (alpha >= 0.0) & (alpha <= 1.0)
            checkify.debug_check(jnp.all(ok), "`alpha` must have every entry in [0, 1].")
            alpha = alpha + jnp.where(ok, 0.0, jnp.nan).astype(alpha.dtype)
    if where is not None:
        where = _as_array(where)
        # a class mask, or (optax's [batch]) a per-element mask: the class axis inserted
        is_bool = where.dtype == jnp.bool_
        if _checks.where_mask(where.shape, is_bool, where.dtype, logits.shape, axis):
            where = jnp.expand_dims(where, axis)

    dtype = _compute_dtype(logits.dtype)
    z = jnp.moveaxis(logits.astype(dtype), axis, -1)
    # classes outside `where` leave the softmax: exactly a logit of -inf
    if where is None:
        valid = jnp.ones(z.shape, dtype=bool)
    else:
        valid = jnp.moveaxis(jnp.broadcast_to(where, logits.shape), axis, -1)
        z = jnp.where(valid, z, -jnp.inf)
    classes = jnp.arange(num_classes)
    # an element with no class left inside `where` is left out, exactly like an ignored target
    keep = jnp.ones(z.shape[:-1], dtype=bool) if where is None else jnp.any(valid, axis=-1)
    if kind == "index":
        keep = keep & (targets != ignore_index)
        if where is not None:
            # a target on a class outside `where` has no mass left: the element is ignored too
            # (an index outside [0, C) stays kept: its NaN must not be hidden under jit)
            y = jnp.clip(targets, 0, num_classes - 1)
            on_valid = jnp.take_along_axis(valid, y[..., None], -1)[..., 0]
            keep = keep & (on_valid | (targets != y))
        one_hot = (classes == targets[..., None]) & keep[..., None]
        t = one_hot.astype(dtype)
    else:
        t = jnp.moveaxis(targets.astype(dtype), axis, -1)
        if where is not None:
            # target mass on a class outside `where` leaves the sum (optax), it does not give +inf
            t = jnp.where(valid & keep[..., None], t, 0.0)
    if not _is_static(label_smoothing) or label_smoothing != 0.0:
        # t~ = (1 - eps) t + eps / C, the eps mass spread over the classes inside `where` only
        num_valid = jnp.sum(valid, axis=-1, keepdims=True)
        uniform = jnp.where(valid, 1.0 / jnp.maximum(num_valid, 1), 0.0)
        label_smoothing = jnp.asarray(label_smoothing, dtype)
        t = (1.0 - label_smoothing) * t + label_smoothing * uniform * keep[..., None]
    vector = weight if weight is not None else alpha
    if vector is None:
        class_weight = jnp.ones(num_classes, dtype=dtype)
    else:
        class_weight = jnp.broadcast_to(_as_array(vector).astype(dtype), (num_classes,))
    return z, t, keep, valid, kind == "index", class_weight, axis


def _expand_where(where, logits, axis):
    """optax: a `where` with fewer dimensions than the logits gets the class axes at `axis`."""
    if where is None:
        return None
    where = jnp.asarray(where)
    if where.ndim != logits.ndim:
        where = jnp.expand_dims(where, axis)
    _checks.class_mask(where.shape, where.dtype == jnp.bool_, where.dtype, logits.shape)
    return where


def _class_axes_last(logits, axis, *others):
    """For a tuple `axis`: the class axes moved to the end (in their order) and flattened into
    one; `others` (None or arrays of the logits shape) alike. Returns (logits, others, -1)."""
    if not isinstance(axis, tuple):
        raise ValueError(
            "Keyword argument 'axis' must be of type 'int' or 'tuple[int, ...]' but actual type "
            f"is {type(axis)}."
        )
    class_axes = tuple(_checks.class_axis(a, logits.ndim) for a in axis)
    batch_axes = tuple(a for a in range(logits.ndim) if a not in class_axes)
    order = batch_axes + class_axes
    batch_shape = tuple(logits.shape[a] for a in batch_axes)

    def flatten(x):
        x = jnp.broadcast_to(x, logits.shape).transpose(order)
        return x.reshape(batch_shape + (-1,))

    moved = tuple(None if x is None else flatten(x) for x in others)
    return flatten(logits), moved, -1


def _sigmoid_inputs(logits, targets, weight, pos_weight):
    """Validates the sigmoid arguments; returns x, t, w, q in the compute dtype, of the logits
    shape or flattened (see below)."""
    _not_torch(logits=logits, targets=targets, weight=weight, pos_weight=pos_weight)
    logits = _as_array(logits)
    targets = _as_array(targets)
    _checks.float_logits("logits", jnp.issubdtype(logits.dtype, jnp.floating), logits.dtype)
    _checks.sigmoid_targets(
        targets.shape, jnp.issubdtype(targets.dtype, jnp.floating), targets.dtype, logits.shape
    )
    dtype = _compute_dtype(logits.dtype)
    x = logits.astype(dtype)
    # NaN or +inf in the logits: NaN in that element (DESIGN 5), never a plausible inf or 0
    # (an addition, not a where, so that the gradient there is NaN too)
    x = x + jnp.where(x == jnp.inf, jnp.nan, 0.0)
    t = targets.astype(dtype)
    factors = []
    for name, factor in (("weight", weight), ("pos_weight", pos_weight)):
        if factor is None:
            factors.append(jnp.ones_like(x))
            continue
        factor = _as_array(factor)
        _checks.broadcastable(name, factor.shape, logits.shape)
        factors.append(jnp.broadcast_to(factor.astype(dtype), x.shape))
    if x.ndim > 1 and x.shape[-1] % 8 and x.shape[-1] < 64:
        # the losses are element-wise, and XLA:CPU vectorizes along the last axis: a short one
        # that is no multiple of 8 (the 10 classes of (65536, 10)) runs partly scalar, 2-5x
        # slower than the same elements as one axis (docs/benchmarks.md); the callers restore
        # the logits shape
        return x.reshape(-1), t.reshape(-1), factors[0].reshape(-1), factors[1].reshape(-1)
    return x, t, factors[0], factors[1]


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------


def _reduce(loss, reduction, denominator):
    """Applies `reduction` to per-element losses (gradients follow by autodiff).

    A mean over a zero denominator (every target ignored, or no elements) is 0 with zero gradient.
    """
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    # each term divided before summing: a mean near the top of the dtype range cannot overflow;
    # double where: no 0 / 0 in the unselected branch
    nonzero = denominator != 0
    total = jnp.sum(loss / jnp.where(nonzero, denominator, 1))
    return jnp.where(nonzero, total, 0.0)


def _normalizer(reduction, normalizer):
    """The checked `reduction` and `normalizer` (``spec._normalizer``): None, a float, or a 0-d
    array (possibly traced) behind ``stop_gradient``: the divisor is a constant, so `grad`
    w.r.t. it is 0 by construction (torch_impl refuses a tensor that requires grad). The
    reduction stays 'mean': `normalizer` is the mean's divisor (``_reduce``)."""
    reduction = _checks.reduction(reduction)
    if normalizer is None:
        return reduction, None
    _checks.normalizer_reduction(reduction)
    _not_torch(normalizer=normalizer)
    if np.isscalar(normalizer) or isinstance(normalizer, (int, float, bool)):
        return reduction, _checks.normalizer_number(normalizer)
    normalizer = jnp.asarray(normalizer)
    dtype = normalizer.dtype
    is_real = jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
    _checks.normalizer_array(normalizer.shape, is_real, dtype)
    return reduction, jax.lax.stop_gradient(normalizer)


def _mean_divisor(denominator, normalizer):
    """The divisor of reduction 'mean': `normalizer` where given, else the mean's own."""
    return denominator if normalizer is None else normalizer
