"""The JAX backend of dualloss: the losses of ``dualloss.spec``, ``jit``/``vmap``/``grad``-ready.

The math, the arguments and the docstrings with formulas live in ``spec.py``; this module follows
it function by function with the same local names, so that ``diff spec.py jax_impl.py`` shows
mostly ``np.`` against ``jnp.``. What differs:

* Class axis: ``-1`` by default, as in spec (JAX layout ``(..., C)``).
* dtypes: float32 and float64 (with ``jax_enable_x64``) are computed in themselves; float16 and
  bfloat16 are computed in float32 and the result is returned in the input dtype.
* Gradients: the closed-form gradients of the spec, attached with ``jax.custom_jvp`` (not
  ``jax.custom_vjp``). A ``custom_vjp`` function cannot be forward-differentiated
  (``jax.hessian`` = ``jacfwd(jacrev(f))`` raises "can't apply forward-mode autodiff (jvp) to a
  custom_vjp function"), while a ``custom_jvp`` rule whose tangent is linear in the input tangents,
  ``tangent_out = sum(grad * tangent_in)``, serves both modes: reverse mode transposes it, and
  forward mode over it differentiates the gradient code, which is written to be differentiable
  itself (every ``where`` double-guarded), so Hessians are finite too. The gradient w.r.t. the
  logits never goes through autodiff of the forward formula (whose intermediates are non-finite
  at large margins, e.g. ``0 * log 0``). Tangents of the other array arguments (probability
  targets, ``weight``, ``alpha``, ``pos_weight``) are exact closed forms or autodiff of the
  forward formula where that is finite; for the softmax losses a zero target entry has a zero
  derivative (the ``0 log 0 = 0`` convention extended, so masked classes never give inf).
* Index targets without label smoothing take a gather path: the class sums of the spec collapse
  to the target class, so no N x C one-hot is formed (same formulas, same accuracy).
* Bad input: eager calls raise the ``_checks`` errors of the spec, except that class indices
  already on an accelerator are not copied to the host to be checked (they are handled as under
  ``jit``; ``DUALLOSS_VALIDATE_INDICES=sync`` checks them exactly) and a vector ``alpha`` on an
  accelerator is copied once per array, not per call. Inside ``jit`` the class
  indices are not concrete: an index outside [0, C) (other than ``ignore_index``) gives a NaN loss
  and NaN gradient for its element, and ``checkify.checkify(f, errors=checkify.user_checks)``
  turns it into an error with the spec's message.
* Mean over zero elements: 0 with zero gradient, as in spec (torch gives NaN).

* Options: `gamma`, `alpha`, `label_smoothing`, `weight` and `pos_weight` may be traced values
  (``jit`` arguments, ``vmap`` over them, ``grad``/``jvp`` with respect to them). Concrete values
  are validated as in spec; a traced invalid value gives NaN (and a ``checkify`` error), as an
  out-of-range class index does. A Python gamma = 0 takes an exact branch; a traced gamma = 0
  gives exactly (1 - p)^0 = 1 too.
* `where`: optax semantics (see ``spec.softmax_cross_entropy``): a class mask, or a per-element
  mask of the batch shape; elements left with no class, or whose class-index target is masked,
  count as ignored.
* Wrong framework: a torch tensor raises one TypeError naming the argument (never converted).

Drop-ins with optax's signatures and per-example outputs:
``softmax_cross_entropy_with_integer_labels`` and ``sigmoid_binary_cross_entropy``, the same
functions as in ``dualloss.optax`` (which also has ``softmax_cross_entropy`` and
``sigmoid_focal_loss`` with optax's signatures).
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.experimental import checkify

from . import _checks

__all__ = [
    "softmax_cross_entropy",
    "softmax_focal_loss",
    "sigmoid_cross_entropy",
    "sigmoid_focal_loss",
    "linear_softmax_cross_entropy",
    "linear_softmax_focal_loss",
    "softmax_cross_entropy_with_integer_labels",
    "sigmoid_binary_cross_entropy",
]

ArrayLike = Any


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Closed-form derivative rules
# ----------------------------------------------------------------------------------------------


def _is_zero(tangent) -> bool:
    return tangent is None or isinstance(tangent, SymbolicZero)


def _forward_tangent(value, primals, tangents):
    """Tangent of value(*primals) along the non-zero `tangents`, by autodiff of the forward formula.

    Used for the arguments after the logits only (targets, weights), where the forward formula
    is linear or smooth; the logits' tangent always goes through the closed-form gradient.
    """
    moving = [i for i, tangent in enumerate(tangents) if not _is_zero(tangent)]

    def restricted(*args):
        full = list(primals)
        for i, arg in zip(moving, args, strict=True):
            full[i] = arg
        return value(*full)

    args = tuple(primals[i] for i in moving)
    return jax.jvp(restricted, args, tuple(tangents[i] for i in moving))[1]


def _closed_form_jvp(terms, class_sum, other_tangent=None):
    """custom_jvp rule: loss, grad = terms(z, *rest); tangent = sum(grad * dz) + d(rest) term.

    Linear in the tangents, so reverse mode transposes it; `class_sum` sums over the class axis
    (softmax losses, one loss per row) or not (sigmoid losses, one loss per entry).
    """

    def rule(static, primals, tangents):
        z, *rest = primals
        dz, *drest = tangents
        loss, grad = terms(z, *rest, *static)
        tangent = jnp.zeros_like(loss)
        if not _is_zero(dz):
            product = grad * dz
            tangent = tangent + (jnp.sum(product, axis=-1) if class_sum else product)
        if not all(_is_zero(d) for d in drest):
            if other_tangent is None:
                tangent = tangent + _forward_tangent(
                    lambda *args: terms(z, *args, *static)[0], rest, drest
                )
            else:
                tangent = tangent + other_tangent(z, rest, drest, *static)
        return loss, tangent

    return rule


def _with_closed_form_grad(terms, num_static, class_sum, other_tangent=None):
    """`terms(z, *rest, *static)[0]` as a custom_jvp function with the closed-form gradient."""
    num_args = terms.__code__.co_argcount
    static_argnums = tuple(range(num_args - num_static, num_args))

    def value(*args):
        return terms(*args)[0]

    value = jax.custom_jvp(value, nondiff_argnums=static_argnums)
    rule = _closed_form_jvp(terms, class_sum, other_tangent)
    value.defjvp(
        lambda *args: rule(args[:num_static], args[num_static], args[num_static + 1]),
        symbolic_zeros=True,
    )
    return value


# ----------------------------------------------------------------------------------------------
# Softmax core
# ----------------------------------------------------------------------------------------------


def _log1m(x):
    """log(1 - x) for x in [0, 1]: log1p(-x) for small x, log(1 - x) above 1/4.

    XLA:CPU's float64 log1p is ~100 ULP off for arguments below about -0.3; 1 - x is exact
    there (x >= 1/4), so log(1 - x) is accurate.
    """
    return jnp.where(x > 0.25, jnp.log(1.0 - x), jnp.log1p(-jnp.minimum(x, 0.25)))


def _power(log_base, gamma):
    """base^gamma from log(base): exp(gamma log base), for a Python or a traced gamma.

    x^0 = 1 exactly, also for base 0: exp(0 * log base) = 1 for a finite log base, and a `where`
    on gamma == 0 where base = 0. For a traced gamma both branches stay finite (double where),
    so d/dgamma = base^gamma log base is finite too (0 at base 0: see spec's 'gamma' gradient).
    """
    if _is_static(gamma):
        return jnp.ones_like(log_base) if gamma == 0.0 else jnp.exp(gamma * log_base)
    no_base = log_base == -jnp.inf
    safe = jnp.where(no_base, 0.0, log_base)
    return jnp.where(no_base, jnp.where(gamma == 0.0, 1.0, 0.0), jnp.exp(gamma * safe))


def _unflush_exponent(dtype) -> float:
    """K with exp(-K) = sqrt(tiny) of `dtype` (44 in float32, 354 in float64): below exp(-K) a
    row's other classes may all be subnormals that XLA flushes to 0; exp(z + K) of each stays
    normal and <= 1 there, and the sum times exp(-K) keeps every digit."""
    return -0.5 * math.log(float(jnp.finfo(dtype).tiny))


def _log_softmax(z):
    """log p, log(1 - p), p and 1 - p along the last axis, as in spec (see its docstring).

    Every `where` keeps its unselected branch finite, so that this function's own derivative
    (forward mode over the gradient: Hessians) is finite too.
    """
    num_classes = z.shape[-1]
    top = jnp.argmax(z, axis=-1)[..., None]
    is_top = jnp.arange(num_classes) == top
    z_top = jnp.take_along_axis(z, top, axis=-1)
    # a +inf logit makes the whole row NaN (DESIGN 5), like a NaN logit does (argmax picks it)
    z_top = jnp.where(z_top == jnp.inf, jnp.nan, z_top)
    # shift so that the largest logit is 0: exp cannot overflow (a row of -inf gives NaN)
    shifted = z - z_top
    others = jnp.where(is_top, -jnp.inf, shifted)
    s = jnp.sum(jnp.exp(others), axis=-1, keepdims=True)
    # log s = m + log(sum_{j != top} exp(z_j - z_top - m)), m the runner-up: exact when s underflows
    runner_up = jnp.max(others, axis=-1, keepdims=True)
    runner_up = jnp.where(jnp.isfinite(runner_up), runner_up, 0.0)
    others_sum = jnp.sum(jnp.exp(others - runner_up), axis=-1, keepdims=True)
    # XLA flushes subnormal numbers to 0 (on the CPU too): where every other class is below the
    # smallest normal, s (up to C times it) would be lost; below sqrt(tiny) (those terms at most
    # C sqrt(tiny) of s) it is the runner-up's scaled sum times exp(m), formed as
    # exp(m + K) exp(-K) (``_unflush_exponent``; m < -K there: exp(m + K) <= 1 stays normal)
    scale = _unflush_exponent(s.dtype)
    from_runner_up = others_sum * jnp.exp(jnp.minimum(runner_up + scale, 0.0)) * math.exp(-scale)
    s = jnp.where(s < math.exp(-scale), from_runner_up, s)
    log1p_s = jnp.log1p(s)
    has_others = others_sum > 0.0
    log_s = jnp.where(
        has_others, runner_up + jnp.log(jnp.where(has_others, others_sum, 1.0)), -jnp.inf
    )
    log_p = shifted - log1p_s
    # p = exp(z - z_top) / (1 + s): within ~1 ULP, where exp(log p) would multiply the absolute
    # error of log p by |log p| (as spec)
    p = jnp.exp(shifted) / (1.0 + s)
    # 1 - p_top = s / (1 + s), never formed as 1 - p
    not_p = jnp.where(is_top, s / (1.0 + s), 1.0 - p)
    # log s - log1p(s) at a top with s < 1 (two numbers of opposite sign); log(1 - p) elsewhere,
    # also at a top with s >= 1 (p <= 1/2), where the two logarithms would cancel (as spec)
    from_s = is_top & (s < 1.0)
    log_not_p = jnp.where(from_s, log_s - log1p_s, _log1m(jnp.where(from_s, 0.0, p)))
    return log_p, log_not_p, p, not_p, is_top, s, log1p_s


def _focal_phi(log_p, p, not_p, is_top, s, log1p_s):
    """phi(p) = p log p / (1 - p), in [-1, 0]: phi(0) = 0, phi -> -1 as p -> 1.

    For the top class p = 1 / (1 + s) and 1 - p = s / (1 + s), so phi = -log1p(s) / s.
    """
    phi_top = jnp.where(s > 0.0, -log1p_s / jnp.where(s > 0.0, s, 1.0), -1.0)
    rest = (p > 0.0) & ~is_top
    phi_rest = jnp.where(rest, jnp.where(rest, p * log_p, 0.0) / jnp.where(rest, not_p, 1.0), 0.0)
    return jnp.where(is_top, phi_top, phi_rest)


def _sum_except_self(v):
    """sum_{c != j} v_c for each j, for v >= 0, without cancellation (see spec)."""
    num_classes = v.shape[-1]
    total = jnp.sum(v, axis=-1, keepdims=True)
    is_big = jnp.arange(num_classes) == jnp.argmax(v, axis=-1)[..., None]
    rest_of_big = jnp.sum(jnp.where(is_big, 0.0, v), axis=-1, keepdims=True)
    return jnp.where(is_big, rest_of_big, total - v)


def _softmax_focal_terms(z, a, gamma):
    """Per-element loss -sum_c a_c (1 - p_c)^gamma log p_c and its gradient (class axis last).

    With gamma = 0 this is the (weighted) softmax cross entropy -sum_c a_c log p_c.
    The gradient is p_j sum_{c != j} v_c - (1 - p_j) v_j, the same as p * sum(v) - v but free of
    the cancellation p_j - 1 when p_j is close to 1.
    """
    log_p, log_not_p, p, not_p, is_top, s, log1p_s = _log_softmax(z)
    if _is_static(gamma) and gamma == 0.0:
        # (1 - p)^0 = 1, also at p = 1
        focal_weight = jnp.ones_like(log_p)
        v = a
    else:
        # (1 - p)^gamma = exp(gamma log(1 - p)); a traced gamma = 0 gives exactly 1 too
        focal_weight = _power(log_not_p, gamma)
        phi = _focal_phi(log_p, p, not_p, is_top, s, log1p_s)
        v = a * focal_weight * (1.0 - gamma * phi)
    # 0 log 0 = 0: a class with no target mass contributes nothing, also when its logit is -inf
    # (NaN when a NaN or +inf logit made the row NaN: never hidden). The loss is linear in a:
    # d/da_c = -(1 - p_c)^gamma log p_c also at a_c = 0 (0 where p_c = 0, not 0 * inf)
    no_p = log_p == -jnp.inf
    loss = -jnp.sum(
        a * focal_weight * jnp.where(no_p, 0.0, log_p)
        + jnp.where(no_p & (a != 0.0), -jnp.inf, 0.0),
        axis=-1,
    )
    grad = p * _sum_except_self(v) - not_p * v
    return loss, grad


def _at(x, y):
    """x[..., y] for one class index per row."""
    return jnp.take_along_axis(x, y[..., None], axis=-1, mode="clip")[..., 0]


def _unflushed(z, z_top, y, s, at_top):
    """s = sum_{j != top} exp(z_j - z_top) of ``_shifted_sums``, where the rows `at_top` (target
    on top) may have lost it to flushed subnormals.

    XLA flushes subnormal numbers to 0 (on the CPU too): where every other class is below the
    smallest normal, their sum (up to C times it, a normal number) is lost with them. Below
    sqrt(tiny), where those terms are at most C sqrt(tiny) of s, such a row sums the others
    scaled by 1 / sqrt(tiny) (``_unflush_exponent``), only when some row needs it (``lax.cond``,
    from the logits: an N x C operand formed for it would cost every call a pass over memory,
    measured).
    """
    scale = _unflush_exponent(s.dtype)
    tiny = (s < math.exp(-scale)) & at_top

    def rescaled(z, z_top, s, tiny):
        shifted = z - z_top
        scaled = jnp.sum(
            jnp.where(shifted < 0.0, jnp.exp(shifted + scale), 0.0), axis=-1, keepdims=True
        )
        # + (e_y - 1): 0, with the derivative of the top's e (as in sum(e - floor(e)))
        e_y = jnp.exp(_at(shifted, y)[..., None])
        return jnp.where(tiny, scaled * math.exp(-scale) + (e_y - 1.0), s)

    return jax.lax.cond(jnp.any(tiny), rescaled, lambda z, z_top, s, tiny: s, z, z_top, s, tiny)


def _shifted_sums(z, y):
    """e = exp(z - z_top), s = sum_{j != top} e_j, log1p(s) and 1 / (1 + s), for the class-index
    fast paths with targets y (class axis last; s, log1p(s) and 1 / (1 + s) of shape [..., 1]).

    Neither the argmax nor a masked class sum: s = sum_c e_c - 1 is formed as sum_c (e_c -
    floor(e_c)) when s < 1, where only the top has e = 1 (another would make sum(e) >= 2): it
    contributes e - 1 = 0 exactly, and e's derivative, so s keeps full relative accuracy when it
    is tiny; at s >= 1 the plain sum(e) - 1 keeps a few ULP (sum(e) >= 2: the subtraction is
    exact). floor, not a select on z == z_top: XLA:CPU keeps that reduction as fast as the plain
    sum (measured). The shift is a constant (stop_gradient: every result is invariant to it); the
    derivatives of e, also at the top, carry everything, so the Hessians (forward mode over the
    closed-form gradient) are right.

    Rows of at most 32 classes take both sums in one pass, as the real and imaginary parts of
    one complex sum (sum(e - floor(e)) + i sum(floor(e)): s = the first plus the count of tops
    less 1, exact): XLA:CPU reduces complex numbers in a loop of its own that is faster on short
    rows than its two float reductions (1.1x optax against 1.5x at 65536 x 10), and slower from
    64 classes on. Skipping the second sum with a ``lax.cond`` where no row has its target on top
    measured no gain at 4096 x 1000 and a loss on confident rows (1.8x optax against 1.4x: the
    cond makes XLA form e in memory), so longer rows take both float sums always (2026-12-04).
    Rows whose other classes are all flushed subnormals are summed again (``_unflushed``).
    """
    # shift by the largest logit (a constant: the shift cancels in log p); a row of -inf gives NaN
    z_top = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    # a +inf logit makes the whole row NaN (DESIGN 5), like a NaN logit does
    z_top = jnp.where(z_top == jnp.inf, jnp.nan, z_top)
    shifted = z - z_top
    e = jnp.exp(shifted)
    # (complex numbers exist in float32 and float64 only: a half dtype, where the test
    # suite computes in it on purpose, takes the two sums)
    if z.shape[-1] <= 32 and e.dtype in (jnp.float32, jnp.float64):
        tops = jnp.floor(e)
        both = jnp.sum(jax.lax.complex(e - tops, tops), axis=-1, keepdims=True)
        s = jnp.real(both) + (jnp.imag(both) - 1.0)
    else:
        s_all = jnp.sum(e, axis=-1, keepdims=True) - 1.0
        s_others = jnp.sum(e - jnp.floor(e), axis=-1, keepdims=True)
        s = jnp.where(s_all < 1.0, s_others, s_all)
    s = _unflushed(z, z_top, y, s, _at(shifted, y)[..., None] == 0.0)
    log1p_s = jnp.log1p(s)
    return shifted, e, s, log1p_s, 1.0 / (1.0 + s)


def _softmax_focal_terms_at(z, y, a_y, keep, gamma):
    """`_softmax_focal_terms` for one-hot targets a = a_y onehot(y), without forming them.

    The class sums collapse to class y: loss = -a_y (1 - p_y)^gamma log p_y; v is 0 except v_y,
    so the gradient is p_j v_y for j != y and -(1 - p_y) v_y at y; 0 where not `keep`, whatever
    the logits. Only the row sums of ``_shifted_sums`` are N x C work; everything about the
    target class is one value per row. With y at the top (z_y = z_top), 1 - p_y = s_y / (1 + s),
    s_y = s - (e_y - 1) (= s, with the derivative of the true 1 - p_y), and
      log(1 - p_y) = log s_y - log1p(s) where s < 1 (log1p(-p_y) at s >= 1, where they cancel),
      phi_y = e_y log p_y / s_y  (-log1p(s) / s: -> -1),
    where s_y < the smallest normal gives log(1 - p_y) = -inf: every term it enters is then
    O(s^(1 + gamma)), below the dtype's smallest normal, as in torch_impl.
    """
    shifted, e, s, log1p_s, inverse = _shifted_sums(z, y)
    s, log1p_s, inverse = s[..., 0], log1p_s[..., 0], inverse[..., 0]
    is_y = jnp.arange(z.shape[-1]) == y[..., None]
    shifted_y = _at(shifted, y)
    e_y = _at(e, y)
    log_p_y = shifted_y - log1p_s
    p_y = e_y * inverse
    at_top = shifted_y == 0.0
    s_y = s - (e_y - 1.0)
    # 1 - p_y, free of cancellation where p_y is close to 1 (only at the top)
    not_p_y = jnp.where(at_top, s_y * inverse, 1.0 - p_y)
    if gamma == 0.0:
        # (1 - p)^0 = 1, also at p = 1
        focal_weight = jnp.ones_like(log_p_y)
        v = a_y
    else:
        # double wheres: log s_y at s_y = 0, phi's 0 log 0 and 0 / 0 stay out of the derivatives
        normal = s_y >= jnp.finfo(s.dtype).tiny
        log_s_y = jnp.where(normal, jnp.log(jnp.where(normal, s_y, 1.0)), -jnp.inf)
        # from s_y at a top with s < 1 only: at s >= 1 the two logarithms cancel (as spec)
        from_s = at_top & (s < 1.0)
        log_not_p = jnp.where(from_s, log_s_y - log1p_s, _log1m(jnp.where(from_s, 0.0, p_y)))
        # (1 - p)^gamma = exp(gamma log(1 - p))
        focal_weight = jnp.exp(gamma * log_not_p)
        positive = s_y > 0.0
        phi_top = jnp.where(positive, e_y * log_p_y / jnp.where(positive, s_y, 1.0), -1.0)
        rest = (p_y > 0.0) & ~at_top
        phi_rest = jnp.where(
            rest, jnp.where(rest, p_y * log_p_y, 0.0) / jnp.where(rest, not_p_y, 1.0), 0.0
        )
        phi = jnp.where(at_top, phi_top, phi_rest)
        v = a_y * focal_weight * (1.0 - gamma * phi)
    # 0 log 0 = 0: no target mass (zero weight) contributes nothing; NaN rows stay NaN;
    # d/da_y = -(1 - p_y)^gamma log p_y also at a_y = 0 (0 where p_y = 0)
    no_p = log_p_y == -jnp.inf
    loss = -(
        a_y * focal_weight * jnp.where(no_p, 0.0, log_p_y)
        + jnp.where(no_p & (a_y != 0.0), -jnp.inf, 0.0)
    )
    p = e * inverse[..., None]
    grad = jnp.where(keep[..., None], v[..., None] * jnp.where(is_y, -not_p_y[..., None], p), 0.0)
    return loss, grad


def _softmax_cross_entropy_terms_at(z, y, a_y, keep):
    """`_softmax_focal_terms_at` at gamma = 0, the hot path: two passes, as optax (the focal
    factor, phi and log(1 - p) are never formed for gamma = 0)."""
    return _softmax_focal_terms_at(z, y, a_y, keep, 0.0)


_softmax_focal_loss = _with_closed_form_grad(_softmax_focal_terms, 1, class_sum=True)
# a traced gamma is a differentiable argument (its tangent: autodiff of the forward formula)
_softmax_focal_loss_traced = _with_closed_form_grad(_softmax_focal_terms, 0, class_sum=True)
_softmax_focal_loss_at = _with_closed_form_grad(_softmax_focal_terms_at, 1, class_sum=True)
_softmax_cross_entropy_at = _with_closed_form_grad(
    _softmax_cross_entropy_terms_at, 0, class_sum=True
)


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


def _softmax(
    logits,
    targets,
    axis,
    class_weight_arg,
    gamma,
    is_focal,
    ignore_index,
    label_smoothing,
    where,
    reduction,
):
    _not_torch(gamma=gamma, label_smoothing=label_smoothing)
    reduction = _checks.reduction(reduction)
    if is_focal:
        gamma = _scalar_option("gamma", gamma)
        weight, alpha = None, class_weight_arg
    else:
        weight, alpha = class_weight_arg, None
    label_smoothing = _scalar_option("label_smoothing", label_smoothing)
    z, t, keep, valid, is_index, class_weight, axis = _softmax_inputs(
        logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where
    )
    num_classes = z.shape[-1]
    if not _is_static(gamma):
        gamma = gamma.astype(z.dtype)
    if where is not None:
        # elements left out (no class left, target outside `where`): logits 0, so that their
        # loss and gradient are 0, not NaN from a row of -inf
        z = jnp.where(keep[..., None], z, 0.0)
    if is_index:
        # an index outside [0, C) cannot raise under jit: its element's loss and gradient are NaN
        y = _as_array(targets)
        poison = jnp.where(keep & ((y < 0) | (y >= num_classes)), jnp.nan, 0.0).astype(z.dtype)
        y = jnp.clip(y, 0, num_classes - 1)
    if is_index and _is_static(label_smoothing) and label_smoothing == 0.0 and _is_static(gamma):
        # one-hot targets: gather the target class instead of forming an N x C one-hot
        a_y = jnp.where(keep, class_weight[y], 0.0) + poison
        if gamma == 0.0:
            loss = _softmax_cross_entropy_at(z, y, a_y, keep)
        else:
            loss = _softmax_focal_loss_at(z, y, a_y, keep, gamma)
    else:
        if is_index:
            # ignored elements: logits 0, so that their gradient is 0 even for NaN logits
            z = jnp.where(keep[..., None], z, 0.0) + poison[..., None]
        a = class_weight * t
        if _is_static(gamma):
            loss = _softmax_focal_loss(z, a, gamma)
        else:
            loss = _softmax_focal_loss_traced(z, a, gamma)
    # ignored elements give 0 and no gradient, whatever their logits; masked classes no gradient
    loss = jnp.where(keep, loss, 0.0)
    if is_index and not is_focal:
        # torch: the weighted mean divides by the weights of the kept targets
        targets = jnp.where(keep, _as_array(targets), 0)
        denominator = jnp.sum(jnp.where(keep, class_weight[targets], 0.0))
    else:
        # plain mean over the kept elements (for probability targets: those with a class left)
        denominator = jnp.sum(keep)
    loss = _reduce(loss, reduction, denominator)
    return loss.astype(_as_array(logits).dtype)


# ----------------------------------------------------------------------------------------------
# Public API: softmax losses
# ----------------------------------------------------------------------------------------------


def softmax_cross_entropy(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    axis: int = -1,
    weight: ArrayLike | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    where: ArrayLike | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Softmax cross entropy, torch ``F.cross_entropy`` semantics; see ``spec`` for the math.

    Class axis -1 by default. Computed in the logits dtype (float32 for float16/bfloat16) and
    returned in it. Closed-form gradient w.r.t. the logits (custom_jvp: grad, jacfwd, hessian).
    Under ``jit`` an index outside [0, C) gives NaN (an error under ``checkify``).
    """
    return _softmax(
        logits, targets, axis, weight, 0.0, False, ignore_index, label_smoothing, where, reduction
    )


def softmax_focal_loss(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    axis: int = -1,
    gamma: float = 2.0,
    alpha: ArrayLike | float | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    where: ArrayLike | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Softmax focal loss (Lin et al.); see ``spec.softmax_focal_loss`` for the math.

    Class axis -1 by default; dtypes, gradients and bad indices as ``softmax_cross_entropy``.
    `gamma`, `alpha` and `label_smoothing` may be traced (jit arguments, vmap, grad w.r.t.
    them); a Python gamma = 0 takes the exact cross-entropy branch.
    """
    return _softmax(
        logits, targets, axis, alpha, gamma, True, ignore_index, label_smoothing, where, reduction
    )


def softmax_cross_entropy_with_integer_labels(
    logits: ArrayLike, labels: ArrayLike, axis: int = -1, where: ArrayLike | None = None
) -> jax.Array:
    """Drop-in for ``optax.softmax_cross_entropy_with_integer_labels``: per-example losses.

    The same function as ``dualloss.optax.softmax_cross_entropy_with_integer_labels`` (see it
    for `axis` tuples, `where` and the differences from optax).
    """
    from . import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits, labels, axis, where)


# ----------------------------------------------------------------------------------------------
# Fused linear + softmax losses (large vocabularies)
# ----------------------------------------------------------------------------------------------


def _linear_block(z, y, a_y, kept, class_weight, gamma, label_smoothing):
    """Loss of each row of the block's logits `z` (rows, V) and its gradient w.r.t. `z`.

    The identities of torch_impl's ``_linear_block`` (see it): e = exp(z - z_top), S_y the sum
    of e without column y, r = S_y / e_y; log p_y = -log1p(r) (r <= 1) or (z_y - z_top) - log S,
    log(1 - p_y) = log r - log1p(r) (r <= 1) or log1p(-p_y), phi = -log1p(r) / r; the gradient
    p_j v_y off y and -(1 - p_y) v_y at y. Label smoothing (gamma = 0): a = (1 - eps) a_y
    onehot(y) + eps w / V, loss = sum_c a_c (log S - (z_c - z_top)), gradient p sum(a) - a.
    """
    num_classes = z.shape[-1]
    is_y = jnp.arange(num_classes) == y[:, None]
    # shift so that the largest logit is 0: exp cannot overflow; a NaN or +inf logit gives NaN
    z_top = jnp.max(z, axis=-1, keepdims=True)
    shifted = z - z_top
    shifted_y = _at(shifted, y)[:, None]
    e = jnp.where(is_y, 0.0, jnp.exp(shifted))
    e_y = jnp.exp(shifted_y)
    others = jnp.sum(e, axis=-1, keepdims=True)
    total = others + e_y
    log_total = jnp.log(total)
    a_y = a_y[:, None]
    kept = kept[:, None]
    if label_smoothing != 0.0:
        # the eps share of the mass sits on every class: no one-hot shortcut for the loss
        uniform = label_smoothing / num_classes
        spread = jnp.sum(shifted * class_weight, axis=-1, keepdims=True)
        weight_sum = jnp.sum(class_weight)
        mass = (1.0 - label_smoothing) * a_y + uniform * weight_sum * kept
        loss = (1.0 - label_smoothing) * a_y * (log_total - shifted_y)
        loss = loss + uniform * kept * (weight_sum * log_total - spread)
        a = (1.0 - label_smoothing) * a_y * is_y + uniform * kept * class_weight
        grad = jnp.where(is_y, e_y, e) / total * mass - a
        return loss[:, 0], grad
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
    loss = -jnp.where(a_y == 0.0, 0.0, weighted * log_p)
    # p_j v off y, -(1 - p_y) v_y at y: 1 - p_y = S_y / S
    grad = jnp.where(is_y, -not_p * v, e * (v / total))
    return loss[:, 0], grad


def _linear_chunks(h, w, b, y, a_y, kept, class_weight, grad_loss, static):
    """The per-row losses of logits = h w + b over blocks of rows (``lax.scan``) and, with
    `grad_loss` (per-row factors), the gradients of sum_i grad_loss_i l_i w.r.t. h, w and b.

    Each block's (rows, V) logits are formed in the compute dtype (float32 for half inputs) and
    their gradient G mapped through the layer at once: dh = G w^T, dw += h^T G, db += sum G,
    accumulated in the compute dtype. The focal loss with label smoothing takes the softmax
    losses' dense path (``_softmax_focal_terms``). The rows are padded to a whole number of
    blocks with ignored rows (a_y = kept = 0). Returns (loss, dh, dw, db), the gradients None
    without `grad_loss`, db None without `b`.
    """
    gamma, label_smoothing, rows, _ = static
    dtype = _compute_dtype(h.dtype)
    num_rows, size = h.shape
    num_classes = w.shape[1]
    w = w.astype(dtype)
    b = None if b is None else b.astype(dtype)
    weights = jnp.ones(num_classes, dtype) if class_weight is None else class_weight
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
        h_block = jnp.where(kept_block[:, None] > 0.0, h_block.astype(dtype), 0.0)
        z = h_block @ w
        if b is not None:
            z = z + b
        if gamma != 0.0 and label_smoothing != 0.0:
            # t~ = (1 - eps) onehot(y) + eps / V on the kept rows, times the class weights
            one_hot = (jnp.arange(num_classes) == y_block[:, None]).astype(dtype)
            t = (1.0 - label_smoothing) * one_hot + label_smoothing / num_classes
            loss, grad = _softmax_focal_terms(z, weights * t * kept_block[:, None], gamma)
            # a NaN-poisoned index (traced, out of range) poisons its row here too
            loss = loss + 0.0 * a_block
        else:
            loss, grad = _linear_block(
                z, y_block, a_block, kept_block, weights, gamma, label_smoothing
            )
        if not with_grad:
            return carry, (loss, None)
        grad = grad * scale_block[:, None]
        dw, db = carry
        dw = dw + h_block.T @ grad
        db = None if db is None else db + jnp.sum(grad, axis=0)
        return (dw, db), (loss, (grad @ w.T).astype(h.dtype))

    init = None
    if with_grad:
        init = (jnp.zeros((size, num_classes), dtype), None if b is None else jnp.zeros_like(b))
    carry, (loss, dh) = jax.lax.scan(step, init, xs)
    loss = loss.reshape(-1)[:num_rows]
    if not with_grad:
        return loss, None, None, None
    dw, db = carry
    return loss, dh.reshape(-1, size)[:num_rows], dw, db


def _nan_like(x):
    """The cotangent of an input the fused loss does not differentiate: NaN, never a silent 0."""
    return None if x is None else jnp.full(jnp.shape(x), jnp.nan, jnp.result_type(x))


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _linear_sum(h, w, b, y, a_y, kept, class_weight, row_scale, static):
    """sum_i row_scale l_i (reductions 'mean' and 'sum'); its VJP computes the gradients in the
    forward pass (3 matrix products per block, as the unfused loss) and scales them."""
    loss, *_ = _linear_chunks(h, w, b, y, a_y, kept, class_weight, None, static)
    return jnp.sum(loss * row_scale)


def _linear_sum_fwd(h, w, b, y, a_y, kept, class_weight, row_scale, static):
    grad_loss = jnp.broadcast_to(row_scale, y.shape)
    loss, dh, dw, db = _linear_chunks(h, w, b, y, a_y, kept, class_weight, grad_loss, static)
    residuals = (dh, dw, db, y, a_y, kept, class_weight, row_scale)
    return jnp.sum(loss * row_scale), residuals


def _linear_sum_bwd(static, residuals, g):
    dh, dw, db, y, a_y, kept, class_weight, row_scale = residuals
    # scaled in the compute dtype, then rounded once to the inputs' dtypes
    w_dtype, b_dtype = static[3]
    db = None if db is None else (g * db).astype(b_dtype)
    return (
        (g * dh).astype(dh.dtype),
        (g * dw).astype(w_dtype),
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
    loss, *_ = _linear_chunks(h, w, b, y, a_y, kept, class_weight, None, static)
    return loss


def _linear_rows_fwd(h, w, b, y, a_y, kept, class_weight, static):
    loss, *_ = _linear_chunks(h, w, b, y, a_y, kept, class_weight, None, static)
    return loss, (h, w, b, y, a_y, kept, class_weight)


def _linear_rows_bwd(static, residuals, g):
    h, w, b, y, a_y, kept, class_weight = residuals
    _, dh, dw, db = _linear_chunks(h, w, b, y, a_y, kept, class_weight, g, static)
    dw = dw.astype(w.dtype)
    db = None if db is None else db.astype(b.dtype)
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
    chunk_size,
):
    """Validates the fused loss's arguments and applies the row-block scan to the rows of
    `hidden` (``spec._linear_softmax``, without its (N, V) logits)."""
    _not_torch(hidden=hidden, linear_weight=linear_weight, targets=targets, bias=bias)
    _not_torch(weight=class_weight_arg, gamma=gamma, label_smoothing=label_smoothing)
    reduction = _checks.reduction(reduction)
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
    size, num_classes = _checks.linear_shapes(
        hidden.shape, linear_weight.shape, bias_shape, targets.shape, 1
    )
    chunk_size = _checks.chunk_size(chunk_size)
    ignore_index = _checks.ignore_index(ignore_index)
    # static here (they select the block's code path): Python numbers
    label_smoothing = _checks.unit_interval("label_smoothing", label_smoothing)
    if is_focal:
        gamma = _checks.gamma(gamma)
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
        budget = (1 << 19) if dense else (1 << 22)
        chunk_size = _checks.default_chunk_size(h.shape[0], num_classes, budget)
    rows = min(chunk_size, max(h.shape[0], 1))
    dtypes = (linear_weight.dtype, None if bias is None else bias.dtype)
    static = (gamma, label_smoothing, rows, dtypes)
    if reduction == "none":
        loss = _linear_rows(h, linear_weight, bias, y_safe, a_y, kept, class_weight, static)
        return loss.reshape(targets.shape).astype(hidden.dtype)
    if reduction == "mean":
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
    return loss.astype(hidden.dtype)


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
    chunk_size: int | None = None,
) -> jax.Array:
    """Softmax cross entropy of hidden @ linear_weight + bias without the (N, V) logits
    (``spec.linear_softmax_cross_entropy``); `linear_weight` (H, V) as the spec.

    A ``jax.custom_vjp`` over a ``lax.scan`` of row blocks (`chunk_size` rows; default: blocks
    of at most 4M logits, 512K for focal with label smoothing). Computed in the hidden dtype
    (float32 for float16/bfloat16, accumulators included), returned in it. Gradients for
    `hidden`, `linear_weight` and `bias`; `weight` gets NaN (no gradient is given for it, never a
    silent 0). `label_smoothing` (and the focal `gamma`) are Python numbers here, not traced.
    Under ``jit`` an index outside [0, V) gives NaN.
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
        chunk_size,
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
    chunk_size: int | None = None,
) -> jax.Array:
    """Softmax focal loss of hidden @ linear_weight + bias without the (N, V) logits
    (``spec.linear_softmax_focal_loss``); blocks, dtypes and gradients as
    ``linear_softmax_cross_entropy`` (a vector `alpha` gets a NaN gradient)."""
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
        chunk_size,
    )


# ----------------------------------------------------------------------------------------------
# Sigmoid core
# ----------------------------------------------------------------------------------------------


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


def _softplus(x):
    """softplus(x) = log(1 + exp(x)) = -log_sigmoid(-x), accurate for every x."""
    return jnp.logaddexp(0.0, x)


def _sigmoid(x):
    """sigmoid(x), to a few ULPs relative for every x (no 1 - sigmoid(-x))."""
    e = jnp.exp(-jnp.abs(x))
    return jnp.where(x >= 0.0, 1.0 / (1.0 + e), e / (1.0 + e))


@jax.custom_jvp
def _ratio(n, d):
    """n / d, whose derivative is formed as (dn - (n / d) dd) / d.

    JAX's quotient rule forms n d^-2, which overflows (0 * inf = NaN in a Hessian) for d below
    the square root of the smallest normal, e.g. 1 - p_t at a soft target t = 1e-30.
    """
    return n / d


@_ratio.defjvp
def _ratio_jvp(primals, tangents):
    n, d = primals
    dn, dd = tangents
    ratio = n / d
    return ratio, (dn - ratio * dd) / d


def _sigmoid_parts(x):
    """x >= 0, -|x|, e = exp(-|x|), log1p(e) and sigma(|x|) = 1 / (1 + e): one exp, one log1p and
    one divide, from which every sigmoid quantity of the losses follows without cancellation:

    softplus(x) = max(x, 0) + log1p(e),  softplus(-x) = max(-x, 0) + log1p(e),
    sigma(|x|) = 1 / (1 + e),  sigma(-|x|) = e sigma(|x|).

    JAX's derivative of abs at 0 is 1, the side that `is_positive` takes, so the second
    derivative of the losses at x = 0 is right (a `minimum(x, -x)` would give 0 there).
    """
    is_positive = x >= 0.0
    minus_abs = -jnp.abs(x)
    e = jnp.exp(minus_abs)
    log1p_e = jnp.log1p(e)
    sigma_abs = 1.0 / (1.0 + e)
    return is_positive, minus_abs, e, log1p_e, sigma_abs


def _sigmoid_terms(x, t, w, q):
    """Per-element sigmoid cross entropy and its gradient, with the weight w inside; see spec.

    l = w [(1 - t) softplus(x) + q t softplus(-x)], dl/dx = w [(1 - t) sigma(x) - q t sigma(-x)],
    all four from `_sigmoid_parts` (one exp, one log1p, one divide; the spec's form takes six).
    The weight is inside so that a mean's 1 / N folds into it: XLA then fuses the whole loss
    into one pass ending in the `where` below, where a scaling after it became a separate N x C
    pass over a broadcast 1 / N on XLA:CPU.
    """
    is_positive, minus_abs, e, log1p_e, sigma_abs = _sigmoid_parts(x)
    not_t = 1.0 - t
    q_t = q * t
    # -log(1 - sigma(x)) = softplus(x) = max(x, 0) + log1p(e), -log(sigma(x)) = softplus(-x);
    # per sign of x, max(x, 0) where x < 0 too, so the unselected side stays finite at x = -inf
    relu = jnp.where(is_positive, x, 0.0)
    loss = jnp.where(
        is_positive,
        w * (not_t * (relu + log1p_e) + q_t * log1p_e),
        w * (not_t * log1p_e + q_t * ((relu - x) + log1p_e)),
    )
    # sigma(x) and sigma(-x) are sigma(|x|) and sigma(-|x|) = e sigma(|x|), in the order of x's sign
    sigma_minus_abs = e * sigma_abs
    grad = jnp.where(
        is_positive,
        w * (not_t * sigma_abs - q_t * sigma_minus_abs),
        w * (not_t * sigma_minus_abs - q_t * sigma_abs),
    )
    return loss, grad


_sigmoid_cross_entropy_value = _with_closed_form_grad(_sigmoid_terms, 0, class_sum=False)


def _sigmoid_reduce(loss, reduction):
    return _reduce(loss, reduction, loss.size)


# ----------------------------------------------------------------------------------------------
# Public API: sigmoid losses
# ----------------------------------------------------------------------------------------------


def _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction):
    reduction = _checks.reduction(reduction)
    x, t, w, q = _sigmoid_inputs(logits, targets, weight, pos_weight)
    if reduction == "mean":
        # each term divided before summing (a mean near the top of the range cannot overflow),
        # through the weight (see _sigmoid_terms); the mean over no elements is 0
        w = w / max(x.size, 1)
        reduction = "sum"
    loss = _sigmoid_cross_entropy_value(x, t, w, q).reshape(_as_array(logits).shape)
    return _sigmoid_reduce(loss, reduction).astype(_as_array(logits).dtype)


def sigmoid_cross_entropy(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    weight: ArrayLike | None = None,
    pos_weight: ArrayLike | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Sigmoid (binary) cross entropy with logits, torch semantics; see ``spec``.

    Computed in the logits dtype (float32 for float16/bfloat16) and returned in it; closed-form
    gradient w.r.t. the logits (custom_jvp).
    """
    return _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction)


def sigmoid_binary_cross_entropy(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
    """Drop-in for ``optax.sigmoid_binary_cross_entropy``: per-entry losses, logits shape.

    The same function as ``dualloss.optax.sigmoid_binary_cross_entropy``: `labels` are cast to
    the logits dtype (integer 0/1 labels work) and broadcast, as in optax.
    """
    from . import optax

    return optax.sigmoid_binary_cross_entropy(logits, labels)


def _sigmoid_focal_terms(x, t, w, alpha, gamma):
    """Per-element sigmoid focal loss and its gradient (torchvision semantics); see spec.

    l = w alpha_t (1 - p_t)^gamma ce,
    dl/dx = w alpha_t (1 - p_t)^gamma [(p - t) + gamma ce (1 - 2t) r],  r = p (1 - p) / (1 - p_t),
    with w a mean's 1 / N (else 1), inside for the reason `_sigmoid_terms` gives.

    With e = exp(-|x|) and (a, b) = (1 - t, t) for x >= 0, (t, 1 - t) below, the spec's
    1 - p_t = p (1 - t) + (1 - p) t is sigma(|x|) (a + e b), a sum of terms >= 0, so
    log(1 - p_t) = log(a + e b) - log1p(e) and r = sigma(-|x|) / (a + e b): with
    `_sigmoid_parts`, two exp, a log, two log1p and two divides in all (the spec's form: 17).
    """
    is_positive, minus_abs, e, log1p_e, sigma_abs = _sigmoid_parts(x)
    not_t = 1.0 - t
    a = jnp.where(is_positive, not_t, t)
    b = jnp.where(is_positive, t, not_t)
    # log(a + e b), a + e b = 1 - b (1 - e) in (0, 1]: log1p(-b (1 - e)) near 1 (b (1 - e) <=
    # 1/4: rounding a + e b would lose it there, and XLA:CPU's float64 log1p is inaccurate
    # further down, see _log1m); log(a + e b) below; -|x| at a = 0 (then b = 1 and a + e b = e,
    # which may underflow). Each unselected branch stays finite (double where).
    z = b * (1.0 - e)
    near_one = z <= 0.25
    no_a = a == 0.0
    y = a + e * b
    log_y = jnp.where(
        near_one,
        jnp.log1p(-jnp.where(near_one, z, 0.0)),
        jnp.where(no_a, minus_abs, jnp.log(jnp.where(near_one | no_a, 1.0, y))),
    )
    log_not_pt = log_y - log1p_e
    # (1 - p_t)^gamma; (1 - p_t)^0 = 1, also at p_t = 1 and for a traced gamma
    focal_weight = _power(log_not_pt, gamma)
    if alpha is None:
        alpha_t = jnp.ones_like(x)
    else:
        alpha_t = alpha * t + (1.0 - alpha) * (1.0 - t)
    # r = p (1 - p) / (1 - p_t) <= 1 (sigma(|x|) at a = 0); ce * r stays O(1) where gamma * ce
    # alone overflows
    r = jnp.where(no_a, sigma_abs, _ratio(e * sigma_abs, jnp.where(no_a, 1.0, y)))
    # the cross entropy's terms with weight w alpha_t (1 - p_t)^gamma: the loss and its (p - t) part
    loss, grad = _sigmoid_terms(x, t, w * alpha_t * focal_weight, 1.0)
    grad = grad + gamma * (loss * r) * (1.0 - 2.0 * t)
    return loss, grad


def _log_softplus(y):
    """log(softplus(y)), also where softplus(y) underflows: y itself below -40 (there
    softplus(y) = e^y (1 - e^y / 2 + ...) and e^y is below every dtype's roundoff)."""
    small = y < -40.0
    return jnp.where(small, y, jnp.log(_softplus(jnp.where(small, 0.0, y))))


def _sigmoid_focal_targets_tangent(x, t, w, alpha, gamma, loss):
    """d l / d t of w times the sigmoid focal loss (`loss` is the one without w and alpha):

      d l / d t = w {alpha_t [m (-x) + gamma m (ce / (1 - p_t)) (1 - 2p)] + (2 alpha - 1) m ce},

    m = (1 - p_t)^gamma, 1 - 2p = tanh(-x / 2). Where 1 - p_t is a normal number, m and the
    quotient ce / (1 - p_t) are formed directly (1 - p_t = sigma(|x|)(a + e b), as in
    ``_sigmoid_focal_terms``); below that (a hard target on a confident logit, where m (-x) is
    still a normal number for gamma < 1) from logs: log(1 - p_t) = logaddexp(log(1 - t) + log p,
    log t + log(1 - p)), log ce = logaddexp(log(1 - t) + log softplus(x), log t +
    log softplus(-x)). w and alpha_t scale each term first, so that no intermediate overflows
    where the result does not. (torch_impl's ``_sigmoid_focal_targets_grad``.)
    """
    ce, _ = _sigmoid_terms(x, t, 1.0, 1.0)
    is_positive, _, e, _, sigma_abs = _sigmoid_parts(x)
    not_t = 1.0 - t
    not_pt = sigma_abs * (jnp.where(is_positive, not_t, t) + e * jnp.where(is_positive, t, not_t))
    normal = not_pt >= jnp.finfo(x.dtype).tiny
    safe_not_pt = jnp.where(normal, not_pt, 1.0)
    log_t = jnp.log(t)
    log_not_pt = jnp.logaddexp(_log1m(t) - _softplus(-x), log_t - _softplus(x))
    scale = w if alpha is None else w * (alpha * t + (1.0 - alpha) * not_t)
    if _is_static(gamma) and gamma == 0.0:
        return (scale * -x) + (0.0 if alpha is None else w * (2.0 * alpha - 1.0) * loss)
    focal_weight = jnp.where(normal, jnp.power(safe_not_pt, gamma), _power(log_not_pt, gamma))
    log_ce = jnp.logaddexp(_log1m(t) + _log_softplus(x), log_t + _log_softplus(-x))
    no_ce = log_ce == -jnp.inf
    ratio = jnp.where(
        normal,
        ce / safe_not_pt,
        jnp.where(no_ce, 0.0, jnp.exp(jnp.where(no_ce, 0.0, log_ce - log_not_pt))),
    )
    tangent = (scale * -x) * focal_weight
    tangent = tangent + (scale * gamma) * focal_weight * ratio * jnp.tanh(-x / 2.0)
    if alpha is not None:
        tangent = tangent + (w * (2.0 * alpha - 1.0)) * loss
    return tangent


def _sigmoid_focal_other_tangent(x, rest, tangents, *static):
    """Tangent along t, alpha and a traced gamma, closed form (log t is not differentiable at 0).

    With L = log(1 - p_t): dL/dt = (1 - 2p) / (1 - p_t), d ce/dt = -x, d alpha_t/dt = 2 alpha - 1,
    d alpha_t/d alpha = 2t - 1, dl/dgamma = alpha_t (1 - p_t)^gamma L ce (0 where p_t = 1), all
    times the weight w. gamma is `static` (a Python number) or the fourth of `rest` (traced,
    with its tangent).
    """
    t, w, alpha, *traced = rest
    dt, dw, dalpha, *dtraced = tangents
    gamma = static[0] if static else traced[0]
    loss, _ = _sigmoid_focal_terms(x, t, 1.0, None, gamma)
    tangent = jnp.zeros_like(x)
    along_t = None
    if not _is_zero(dt):
        along_t = _sigmoid_focal_targets_tangent(x, t, w, alpha, gamma, loss) * dt
    if not _is_zero(dalpha):
        tangent = tangent + (2.0 * t - 1.0) * loss * dalpha
    if dtraced and not _is_zero(dtraced[0]):
        log_not_pt = jnp.logaddexp(_log1m(t) - _softplus(-x), jnp.log(t) - _softplus(x))
        alpha_t = 1.0 if alpha is None else alpha * t + (1.0 - alpha) * (1.0 - t)
        safe = jnp.where(log_not_pt == -jnp.inf, 0.0, log_not_pt)
        tangent = tangent + alpha_t * loss * safe * dtraced[0]
    # the loss is linear in w (a constant 1 / N or 1, whose tangent is zero unless traced)
    tangent = w * tangent
    if along_t is not None:
        tangent = tangent + along_t
    if not _is_zero(dw):
        alpha_t = 1.0 if alpha is None else alpha * t + (1.0 - alpha) * (1.0 - t)
        tangent = tangent + alpha_t * loss * dw
    return tangent


_sigmoid_focal_value = _with_closed_form_grad(
    _sigmoid_focal_terms, 1, class_sum=False, other_tangent=_sigmoid_focal_other_tangent
)
# a traced gamma is a differentiable argument
_sigmoid_focal_value_traced = _with_closed_form_grad(
    _sigmoid_focal_terms, 0, class_sum=False, other_tangent=_sigmoid_focal_other_tangent
)


def _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction):
    _not_torch(gamma=gamma, alpha=alpha)
    reduction = _checks.reduction(reduction)
    gamma = _scalar_option("gamma", gamma)
    if isinstance(alpha, (jax.Array, np.ndarray)) and alpha.ndim == 0:
        alpha = _scalar_option("alpha", alpha)
    else:
        _checks.focal_alpha(alpha, None)
    x, t, _, _ = _sigmoid_inputs(logits, targets, None, None)
    t = _sigmoid_focal_targets(t, _as_array(logits).shape)
    if alpha is not None:
        alpha = _as_array(alpha).astype(x.dtype)
    # a mean's 1 / N inside the terms, as in _sigmoid_cross_entropy; no elements: 0
    w = jnp.asarray(1.0 / max(x.size, 1) if reduction == "mean" else 1.0, dtype=x.dtype)
    reduction = "sum" if reduction == "mean" else reduction
    if _is_static(gamma):
        loss = _sigmoid_focal_value(x, t, w, alpha, gamma)
    else:
        loss = _sigmoid_focal_value_traced(x, t, w, alpha, gamma.astype(x.dtype))
    loss = loss.reshape(_as_array(logits).shape)
    return _sigmoid_reduce(loss, reduction).astype(_as_array(logits).dtype)


def sigmoid_focal_loss(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Sigmoid focal loss, torchvision semantics; see ``spec.sigmoid_focal_loss`` for the math.

    Computed in the logits dtype (float32 for float16/bfloat16) and returned in it; closed-form
    gradient w.r.t. the logits (custom_jvp). `gamma` and `alpha` (None, a number, or a scalar
    array) may be traced. Note torchvision's default alpha is 0.25; here it is None.
    """
    return _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction)
