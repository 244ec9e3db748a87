"""The softmax losses of the JAX backend: ``softmax_cross_entropy``, ``softmax_focal_loss`` and
optax's ``softmax_cross_entropy_with_integer_labels`` (the same function as in ``dualloss.optax``).

Sections as in ``spec.softmax``: the core (the spec's ``_log_softmax``, ``_focal_phi`` and terms,
and the gather path for class-index targets), the reductions, the public functions. The math
lives in ``dualloss.spec.softmax``. A last section holds the same terms for logits whose class
axis is split over a mesh axis (``axis_name=``, DESIGN 12). May import ``_inputs``, ``_autodiff``
and ``parallel`` (argument handling and the ``custom_jvp`` adapter past one device); never
``linear``, ``sigmoid`` or ``dualloss.optax``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable

import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks
from ._autodiff import _with_closed_form_grad
from ._inputs import (
    ArrayLike,
    _as_array,
    _class_axes_last,
    _expand_where,
    _is_static,
    _mean_divisor,
    _normalizer,
    _not_torch,
    _reduce,
    _scalar_option,
    _softmax_inputs,
)
from .parallel import _sharded_softmax_inputs, _with_sharded_grad

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


# k for the scaled terms 2^k exp(z_j - z_top) = (2^(k/2) exp((z_j - z_top) / 2))^2, even: the
# half-exponent exp(x / 2) stays normal down to x = -174 (float32; -1416 in float64), and the
# square 2^k exp(x) down to x = -(k ln 2 + 87.3) = -126.1 (float32; -1005 in float64), below
# which a term cannot matter to a normal row sum (at least exp(-87.3)) of up to 5e6 classes;
# C 2^k stays finite, and fl(k ln 2) is within 0.04 ULP of k ln 2 (the sharded log s subtracts
# it: 0.03 for 56 in float32, 0.04 for 428 in float64; 427 no longer qualifies, being odd).
_UNFLUSH_POWER = {"float32": 56, "float64": 428}


def _unflush_power(dtype) -> int:
    """k for ``_scaled_exp``: the terms are summed times 2^k, so that none that matters is
    flushed (an even number: 2^(k/2) is exact)."""
    return _UNFLUSH_POWER.get(jnp.dtype(dtype).name, 4)


def _scaled_exp(shifted):
    """2^k exp(x) for x = z - z_top <= 0 (k = ``_unflush_power``), as the square of
    2^(k/2) exp(x / 2): no term that matters to a normal row sum is flushed to 0 (XLA flushes
    subnormals), and no select (x / 2 and 2^(k/2) are exact: the exp's own error doubled, plus
    one rounding). The top class (x = 0) gives exactly 2^k."""
    half = jnp.exp(0.5 * shifted) * 2.0 ** (_unflush_power(shifted.dtype) // 2)
    return half * half


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


def _softcap(z, softcap):
    """c = softcap tanh(z / softcap) and dc/dz = sech^2(z / softcap) (``spec._softcap``), or
    (z, None) without a cap. Infinite logits keep their meaning: -inf a masked class, +inf a NaN
    row (DESIGN 5), where tanh would make them finite."""
    if softcap is None:
        return z, None
    x = z / softcap
    # sech^2 x = 4 e / (1 + e)^2, e = exp(-2 |x|): no 1 - tanh^2 cancellation, no overflow
    e = jnp.exp(-2.0 * jnp.abs(x))
    dcap = 4.0 * e / ((1.0 + e) * (1.0 + e))
    c = jnp.where(jnp.isinf(z), z, softcap * jnp.tanh(x))
    return c, dcap


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _capped(z, softcap):
    """c = softcap tanh(z / softcap) as a function of its own, with the closed-form tangent
    dc = sech^2(z / softcap) dz (``_softcap``; autodiff of tanh forms 1 - tanh^2, which loses
    every digit of sech^2 where the logits are far beyond the cap). The class axis split over a
    mesh axis caps each slice with it; the single-device paths fold the cap into their own
    terms."""
    return _softcap(z, softcap)[0]


@_capped.defjvp
def _capped_jvp(softcap, primals, tangents):
    (z,), (dz,) = primals, tangents
    c, dcap = _softcap(z, softcap)
    return c, dcap * dz


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


def _minus_log_p_times(weighted, log_p, z, z_top, log_norm, a):
    """-weighted log p, log p = (z - z_top) - log_norm (log_norm >= 0, log1p(s) or its like), 0
    where a = 0 and p = 0 (0 log 0 = 0: no target mass at a class whose logit is -inf).

    Logits that span more than the dtype's largest number (z_top > 0 > z, both finite) make
    z - z_top overflow to -inf though the loss may be finite: there
    -weighted log p = weighted z_top - weighted z + weighted log_norm, a sum of terms of one sign
    (no cancellation, a few ULP; inf only where the loss itself is beyond the largest number).
    Elsewhere the product as before, with its own rounding. The loss is linear in a:
    d/da = -(1 - p)^gamma log p also at a = 0 (0 where p = 0, not 0 * inf); double wheres keep
    every unselected branch finite.
    """
    no_p = log_p == -jnp.inf
    # z - z_top overflowed though z is finite (a +inf or NaN logit makes the row's log p NaN)
    far = no_p & jnp.isfinite(z)
    near = -(weighted * jnp.where(no_p, 0.0, log_p)) + jnp.where(
        no_p & ~far & (a != 0.0), jnp.inf, 0.0
    )
    z_far = jnp.where(far, z, 0.0)
    z_top_far = jnp.where(far, z_top, 0.0)
    return jnp.where(far, _far_loss(weighted, z_far, z_top_far, log_norm), near)


def _far_loss(weighted, z, z_top, log_norm):
    """-weighted log p where z - z_top overflowed (z_top > 0 > z): see ``_minus_log_p_times``."""
    # -a log p = a z_top - a z + a log_norm: z_top > 0 > z, every term >= 0
    return (weighted * z_top - weighted * z) + weighted * log_norm


def _softmax_focal_terms(z, a, gamma, z_loss=0.0):
    """Per-element loss -sum_c a_c (1 - p_c)^gamma log p_c + z_loss lse**2 and its gradient
    (class axis last), lse = logsumexp(z) = z_top + log1p(s).

    With gamma = 0 this is the (weighted) softmax cross entropy -sum_c a_c log p_c.
    The gradient is p_j sum_{c != j} v_c - (1 - p_j) v_j, the same as p * sum(v) - v but free of
    the cancellation p_j - 1 when p_j is close to 1, plus the z-loss's 2 z_loss lse p_j.
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
    z_top = jnp.max(z, axis=-1, keepdims=True)
    # 0 log 0 = 0: a class with no target mass contributes nothing, also when its logit is -inf
    # (NaN when a NaN or +inf logit made the row NaN: never hidden); logits spanning more than
    # the largest number: ``_minus_log_p_times``
    weighted = a * focal_weight
    loss = jnp.sum(_minus_log_p_times(weighted, log_p, z, z_top, log1p_s, a), axis=-1)
    grad = p * _sum_except_self(v) - not_p * v
    if z_loss != 0.0:
        # logsumexp(z) = z_top + log1p(s): the top's 1 apart, so a confident row keeps its digits
        lse = z_top[..., 0] + log1p_s[..., 0]
        # z-loss: z_loss lse^2, d/dz_j = 2 z_loss lse p_j
        loss = loss + z_loss * lse * lse
        grad = grad + (2.0 * z_loss) * lse[..., None] * p
    return loss, grad


def _softmax_head_terms(z, a, gamma, z_loss, softcap):
    """``_softmax_focal_terms`` of the capped logits c (z_loss lse(c)^2 included), with the
    gradient w.r.t. the logits: (dl/dc + 2 z_loss lse p) dc/dz (DESIGN 13, see the spec)."""
    c, dcap = _softcap(z, softcap)
    loss, grad = _softmax_focal_terms(c, a, gamma, z_loss)
    if dcap is not None:
        # the chain rule through the cap: dl/dz = dl/dc sech^2(z / softcap)
        grad = grad * dcap
    return loss, grad


def _at(x, y):
    """x[..., y] for one class index per row."""
    return jnp.take_along_axis(x, y[..., None], axis=-1, mode="clip")[..., 0]


def _class_weight_at(class_weight, vector, y):
    """class_weight[y], the target's class weight per row: a gather only for a weight vector;
    without one (ones) or for a scalar (`alpha`) the number itself, so that no pass reads y."""
    if vector is None:
        return jnp.ones(y.shape, class_weight.dtype)
    if np.ndim(vector) == 0:
        return jnp.broadcast_to(class_weight[0], y.shape)
    return class_weight[y]


def _shifted_sums(z, y, softcap=None):
    """For the class-index fast paths with targets y (class axis last): the shifted logits
    z - z_top, the target's logit z_y (``_minus_log_p_times`` reads it where z_y - z_top
    overflows), e_y = exp(z_y - z_top), s_y = sum_{j != y} exp(z_j - z_top) (the mass off the
    target), s = sum_{j != top} exp(z_j - z_top) = s_y + (e_y - 1), log1p(s) and 1 / (1 + s),
    each of shape [...] (one per row), and the scaled terms 2^k exp(z_j - z_top) (0 at the target),
    which the gradient reads back instead of forming exp again.

    One pass over N x C (after the maximum): the sum of the other classes, without the target,
    which needs neither the argmax nor a conditional. Then 1 - p_y = s_y / (1 + s) for every row,
    never formed as 1 - p_y, and s is exact where it is tiny (the target on top: e_y = 1,
    e_y - 1 = 0 exactly); where the target is not on top, s_y >= 1 (it holds the top) and the
    sum keeps a few ULP. XLA flushes subnormal numbers to 0 (on the CPU too): where every other
    class is below the smallest normal, their sum (up to C times it) would be lost with them, so
    the terms are summed scaled by exp(K) (``_unflush_exponent``: every term stays at most
    exp(K), the sum at most C exp(K), finite) and the sum scaled back: branch-free, no
    recomputation, the same pass. The shift is a constant (stop_gradient: every result is
    invariant to it); s_y and e_y are sums of the exps of the logits, so their derivatives carry
    everything and the Hessians (forward mode over the closed-form gradient) are right.
    With `softcap` all of it is of c = softcap tanh(z / softcap) (``_softcap``), shifted by the cap
    of the largest logit (tanh increases: c's largest up to its rounding, and every result is
    invariant to the shift) and c_y the cap of the gathered z_y: c is formed where the row sum
    reads it and nowhere else, so XLA fuses it into that pass instead of writing it out.
    """
    # shift by the largest logit (a constant: the shift cancels in log p); a row of -inf gives NaN
    z_top = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    z_y = _at(z, y)
    if softcap is not None:
        # soft-capping: c = softcap tanh(z / softcap), shifted by the cap of the largest logit
        z_top = _softcap(z_top, softcap)[0]
        z_y = _softcap(z_y, softcap)[0]
        z = _softcap(z, softcap)[0]
    # a +inf logit makes the whole row NaN (DESIGN 5), like a NaN logit does
    z_top = jnp.where(z_top == jnp.inf, jnp.nan, z_top)
    shifted = z - z_top
    # the others summed times 2^k (``_scaled_exp``), so that no term that matters is flushed;
    # one exp and one sum
    power = _unflush_power(z.dtype)
    is_y = jnp.arange(z.shape[-1]) == y[..., None]
    e = jnp.where(is_y, 0.0, _scaled_exp(shifted))
    s_y = jnp.sum(e, axis=-1) * 2.0**-power
    shifted_y = z_y - z_top[..., 0]
    e_y = jnp.exp(shifted_y)
    s = s_y + (e_y - 1.0)
    log1p_s = jnp.log1p(s)
    return z_top, shifted, is_y, e, z_y, shifted_y, e_y, s_y, s, log1p_s, 1.0 / (1.0 + s)


def _softmax_focal_terms_at(z, y, a_y, keep, gamma, z_loss=0.0, softcap=None):
    """`_softmax_focal_terms` for one-hot targets a = a_y onehot(y), without forming them.

    The class sums collapse to class y: loss = -a_y (1 - p_y)^gamma log p_y; v is 0 except v_y,
    so the gradient is p_j v_y for j != y and -(1 - p_y) v_y at y; 0 where not `keep`, whatever
    the logits. The LLM head options (DESIGN 13) in the same passes: with `softcap` everything is
    of c = softcap tanh(z / softcap) (formed where the row sums read it, so XLA fuses it into
    them) and the gradient is times dc/dz = sech^2(z / softcap) (formed where the gradient is
    written); `z_loss` adds z_loss lse^2, lse = z_top + log1p(s), and 2 z_loss lse p_j to every
    p_j's coefficient. Only the row sums of ``_shifted_sums`` are N x C work, and the gradient's one
    pass; everything about the target class is one value per row. 1 - p_y = s_y / (1 + s) for
    every row (s_y the mass off the target), and
      log(1 - p_y) = log s_y - log1p(s) where p_y > 1/2 (e_y > s_y: only the top, s < 1;
        log1p(-p_y) elsewhere, where the two logarithms would cancel, as spec),
      phi_y = e_y log p_y / s_y  (-> -1 as s_y -> 0),
    where s_y < the smallest normal gives log(1 - p_y) = -inf: every term it enters is then
    O(s^(1 + gamma)), below the dtype's smallest normal, as in torch_impl.
    """
    # soft-capping: the terms of c = softcap tanh(z / softcap), dc/dz = sech^2(z / softcap)
    dcap = None if softcap is None else _softcap(z, softcap)[1]
    z_top, shifted, is_y, e, z_y, shifted_y, e_y, s_y, s, log1p_s, inverse = _shifted_sums(
        z, y, softcap
    )
    log_p_y = shifted_y - log1p_s
    p_y = e_y * inverse
    # 1 - p_y, free of cancellation where p_y is close to 1
    not_p_y = s_y * inverse
    if gamma == 0.0:
        # (1 - p)^0 = 1, also at p = 1
        focal_weight = jnp.ones_like(log_p_y)
        v = a_y
    else:
        # double wheres: log s_y at s_y = 0, phi's 0 log 0 and 0 / 0 stay out of the derivatives
        normal = s_y >= jnp.finfo(s.dtype).tiny
        log_s_y = jnp.where(normal, jnp.log(jnp.where(normal, s_y, 1.0)), -jnp.inf)
        # from s_y where p_y > 1/2 only: below, the two logarithms cancel (as spec)
        from_s = e_y > s_y
        log_not_p = jnp.where(from_s, log_s_y - log1p_s, _log1m(jnp.where(from_s, 0.0, p_y)))
        # (1 - p)^gamma = exp(gamma log(1 - p))
        focal_weight = jnp.exp(gamma * log_not_p)
        positive = s_y > 0.0
        has_p = e_y > 0.0
        p_log_p = jnp.where(has_p, e_y * jnp.where(has_p, log_p_y, 0.0), 0.0)
        phi = jnp.where(positive, p_log_p / jnp.where(positive, s_y, 1.0), -1.0)
        v = a_y * focal_weight * (1.0 - gamma * phi)
    # 0 log 0 = 0: no target mass (zero weight) contributes nothing; NaN rows stay NaN;
    # d/da_y = -(1 - p_y)^gamma log p_y also at a_y = 0 (0 where p_y = 0); logits spanning more
    # than the largest number: ``_minus_log_p_times``
    weighted = a_y * focal_weight
    loss = _minus_log_p_times(weighted, log_p_y, z_y, z_top[..., 0], log1p_s, a_y)
    # p_j = e_j / (1 + s), read from the scaled terms of the sum (XLA:CPU writes them to memory
    # for its reduction anyway): no second exp over N x C; 2^-k (1 + s)^-1 stays normal
    p = e * (inverse * 2.0 ** -_unflush_power(z.dtype))[..., None]
    grad = v[..., None] * jnp.where(is_y, -not_p_y[..., None], p)
    if z_loss != 0.0:
        # z-loss: z_loss lse^2 on the kept rows, lse = z_top + log1p(s); d/dz_j = 2 z_loss lse p_j
        lse = z_top[..., 0] + log1p_s
        loss = loss + jnp.where(keep, z_loss * lse * lse, 0.0)
        grad = grad + ((2.0 * z_loss) * lse)[..., None] * jnp.where(is_y, p_y[..., None], p)
    if dcap is not None:
        # the chain rule through the cap: dl/dz = dl/dc sech^2(z / softcap)
        grad = grad * dcap
    grad = jnp.where(keep[..., None], grad, 0.0)
    return loss, grad


def _softmax_cross_entropy_terms_at(z, y, a_y, keep, z_loss, softcap):
    """`_softmax_focal_terms_at` at gamma = 0, the hot path: two passes, as optax (the focal
    factor, phi and log(1 - p) are never formed for gamma = 0)."""
    return _softmax_focal_terms_at(z, y, a_y, keep, 0.0, z_loss, softcap)


# z_loss and softcap (DESIGN 13) are static: Python numbers, the last arguments
_softmax_focal_loss = _with_closed_form_grad(_softmax_head_terms, 3, class_sum=True)


# a traced gamma is a differentiable argument (its tangent: autodiff of the forward formula)
_softmax_focal_loss_traced = _with_closed_form_grad(_softmax_head_terms, 2, class_sum=True)


_softmax_focal_loss_at = _with_closed_form_grad(_softmax_focal_terms_at, 3, class_sum=True)


_softmax_cross_entropy_at = _with_closed_form_grad(
    _softmax_cross_entropy_terms_at, 2, class_sum=True
)


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------


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
    normalizer,
    z_loss=0.0,
    softcap=None,
    return_aux=False,
):
    _not_torch(gamma=gamma, label_smoothing=label_smoothing)
    return_aux = _checks.return_aux(return_aux)
    reduction, normalizer = _normalizer(reduction, normalizer)
    z_loss = _checks.z_loss(z_loss)
    softcap = _checks.softcap(softcap)
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
    # the per-class vector as given (None, a scalar alpha or a vector): class_weight[y] gathers
    # only for a vector
    vector = weight if weight is not None else alpha
    if not _is_static(gamma):
        gamma = gamma.astype(z.dtype)
    if where is not None:
        # elements left out (no class left, target outside `where`): logits 0, so that their
        # loss and gradient are 0, not NaN from a row of -inf
        z = jnp.where(keep[..., None], z, 0.0)
    if return_aux:
        aux = _softmax_aux(z, t, targets, keep, is_index, z_loss, softcap, reduction, normalizer)
    # the LLM head options (DESIGN 13) ride in each path's own terms and closed-form gradient
    if is_index:
        # an index outside [0, C) cannot raise under jit: its element's loss and gradient are NaN
        y = _as_array(targets)
        poison = jnp.where(keep & ((y < 0) | (y >= num_classes)), jnp.nan, 0.0).astype(z.dtype)
        y = jnp.clip(y, 0, num_classes - 1)
    if is_index and _is_static(label_smoothing) and label_smoothing == 0.0 and _is_static(gamma):
        # one-hot targets: gather the target class instead of forming an N x C one-hot
        a_y = jnp.where(keep, _class_weight_at(class_weight, vector, y), 0.0) + poison
        if gamma == 0.0:
            loss = _softmax_cross_entropy_at(z, y, a_y, keep, z_loss, softcap)
        else:
            loss = _softmax_focal_loss_at(z, y, a_y, keep, gamma, z_loss, softcap)
    else:
        if is_index:
            # ignored elements: logits 0, so that their gradient is 0 even for NaN logits
            z = jnp.where(keep[..., None], z, 0.0) + poison[..., None]
        a = class_weight * t
        if _is_static(gamma):
            loss = _softmax_focal_loss(z, a, gamma, z_loss, softcap)
        else:
            loss = _softmax_focal_loss_traced(z, a, gamma, z_loss, softcap)
    # ignored elements give 0 and no gradient, whatever their logits; masked classes no gradient
    loss = jnp.where(keep, loss, 0.0)
    if is_index and not is_focal:
        # torch: the weighted mean divides by the weights of the kept targets
        targets = jnp.where(keep, _as_array(targets), 0)
        denominator = jnp.sum(jnp.where(keep, _class_weight_at(class_weight, vector, targets), 0.0))
    else:
        # plain mean over the kept elements (for probability targets: those with a class left)
        denominator = jnp.sum(keep)
    loss = _reduce(loss, reduction, _mean_divisor(denominator, normalizer))
    dtype = _as_array(logits).dtype
    if return_aux:
        return loss.astype(dtype), {key: value.astype(dtype) for key, value in aux.items()}
    return loss.astype(dtype)


def _softmax_aux(z, t, targets, keep, is_index, z_loss, softcap, reduction, normalizer):
    """``return_aux``'s statistics (``spec._aux``): per-element lse of the capped logits, the
    z-term and whether the largest logit is the target class (0 where not kept), reduced as the
    spec says; no gradient flows through them (stop_gradient)."""
    z = jax.lax.stop_gradient(z)
    c, _ = _softcap(z, softcap)
    lse = jnp.where(keep, jax.nn.logsumexp(c, axis=-1), 0.0)
    # the largest logit (the first on ties) on the target class; for probability targets the
    # class of the largest target mass (smoothing keeps it)
    target_class = _as_array(targets) if is_index else jnp.argmax(t, axis=-1)
    correct = keep & (jnp.argmax(z, axis=-1) == target_class)
    stats = {"lse": lse, "z_term": z_loss * lse * lse, "correct": correct.astype(lse.dtype)}
    divisor = _mean_divisor(jnp.sum(keep), normalizer)
    return {key: _reduce(value, reduction, divisor) for key, value in stats.items()}


# ----------------------------------------------------------------------------------------------
# The class axis split over a mesh axis (DESIGN 12, ``axis_name=``)
# ----------------------------------------------------------------------------------------------


def _sharded_top(x, offset, axis_name):
    """The row's largest entry over every slice of the classes along `axis_name`, and where it is
    (the first such class of the row, as argmax; none for a NaN row): two scalars per row.
    Without a tangent (a shift, or where the row's largest entry sits: piecewise constant), so
    that the forward-mode tangents of the other arguments (class weights, alpha, probability
    targets, a traced gamma: ``parallel._with_sharded_grad``) never meet pmax, which has no
    differentiation rule."""
    x = jax.lax.stop_gradient(x)
    local_top = jnp.max(x, axis=-1, keepdims=True)
    # the row's largest entry: the largest of the slices' (one pmax per row)
    top = jax.lax.pmax(local_top, axis_name)
    # its first class in the row: the smallest of the slices that hold it (one pmin per row)
    first = offset + jnp.argmax(x, axis=-1, keepdims=True)
    none = jnp.iinfo(first.dtype).max
    top_class = jax.lax.pmin(jnp.where(local_top == top, first, none), axis_name)
    return top, offset + jnp.arange(x.shape[-1]) == top_class


def _sharded_log_softmax(z, offset, axis_name):
    """``_log_softmax`` on this device's slice of the classes: the same seven results, for the
    local classes, and the row's largest logit z_top (lse = z_top + log1p(s)), from four scalars
    per row reduced over the slices (the largest logit, where it is, and s = the sum of
    exp(z_j - z_top) off the top with the top's own logit, for its derivative, in one psum). s
    is summed as in ``_shifted_sums``
    (times 2^k, so no term that matters is flushed), and log s is log of that sum minus k ln 2:
    exact where s itself would underflow (the single-device path takes the runner-up there)."""
    # the shift m (a constant) and the top class, over the slices
    m, is_top = _sharded_top(z, offset, axis_name)
    # a +inf logit makes the whole row NaN (DESIGN 5), like a NaN logit does
    m = jnp.where(m == jnp.inf, jnp.nan, m)
    power = _unflush_power(z.dtype)
    shift = float(np.asarray(power * math.log(2.0), jnp.dtype(z.dtype)))
    # the terms times 2^k (``_scaled_exp``): none that matters flushed
    e = _scaled_exp(z - m)
    # the sum of exponentials off the top, times 2^k, and the top's own logit (from the slice
    # that holds it): this slice's, then the row's (one psum of two numbers per row)
    scaled_s = jnp.sum(jnp.where(is_top, 0.0, e), axis=-1, keepdims=True)
    picked = jnp.sum(jnp.where(is_top, z, 0.0), axis=-1, keepdims=True)
    scaled_s, picked = jax.lax.psum((scaled_s, picked), axis_name)
    # t = z_top - m: 0 in value (the top's logit is the row's largest), the top logit's tangent
    # in derivatives (0 for a row without a finite top), so that the terms are those of
    # z - z_top, as ``_log_softmax``'s: its own derivatives (Hessians: forward mode over the
    # closed-form gradient) see the top's logit move, where a constant shift would make the
    # top's term a constant 1
    t = jnp.where(jnp.isfinite(m), picked - jax.lax.stop_gradient(picked), 0.0)
    z_top = m + t
    shifted = (z - m) - t
    # s = sum_{j != top} exp(z_j - z_top): exp(-t) is 1 in value
    scaled_s = scaled_s * jnp.exp(-t)
    s = scaled_s * 2.0**-power
    has_others = scaled_s > 0.0
    log1p_s = jnp.log1p(s)
    # log s: of s itself where it is normal; of the scaled sum less k ln 2 only where s would
    # underflow (there |log s| > k ln 2 - 1 and the subtraction's rounding is below an ulp of it;
    # elsewhere it would cost ulp(k ln 2), hundreds of ulps of log s)
    normal = s >= jnp.finfo(s.dtype).tiny
    log_scaled = jnp.log(jnp.where(has_others, scaled_s, 1.0)) - shift
    log_s = jnp.where(normal, jnp.log(jnp.where(normal, s, 1.0)), log_scaled)
    log_s = jnp.where(has_others, log_s, -jnp.inf)
    log_p = shifted - log1p_s
    # p = exp(z - z_top) / (1 + s), from the scaled terms (no second exp; 2^-k is exact;
    # exp(-t) is 1 in value)
    p = e * jnp.exp(-t) / (1.0 + s) * 2.0**-power
    # 1 - p_top = s / (1 + s), never formed as 1 - p
    not_p = jnp.where(is_top, s / (1.0 + s), 1.0 - p)
    # log s - log1p(s) at a top with s < 1; log(1 - p) elsewhere (as ``_log_softmax``)
    from_s = is_top & (s < 1.0)
    log_not_p = jnp.where(from_s, log_s - log1p_s, _log1m(jnp.where(from_s, 0.0, p)))
    return log_p, log_not_p, p, not_p, is_top, s, log1p_s, z_top


def _sharded_sum_except_self(v, offset, axis_name):
    """``_sum_except_self`` over the classes of every slice: the row's total and, at its largest
    entry, the sum of the others (no cancellation), each one psum per row."""
    # the row's total: this slice's, then every slice's (one psum per row)
    total = jax.lax.psum(jnp.sum(v, axis=-1, keepdims=True), axis_name)
    _, is_big = _sharded_top(v, offset, axis_name)
    # the row's total less its largest entry, summed without it (one psum per row)
    rest_of_big = jnp.sum(jnp.where(is_big, 0.0, v), axis=-1, keepdims=True)
    rest_of_big = jax.lax.psum(rest_of_big, axis_name)
    return jnp.where(is_big, rest_of_big, total - v)


def _sharded_focal_terms(z, a, gamma, z_loss, axis_name):
    """``_softmax_focal_terms`` on this device's slice of the classes: the row's loss (the same on
    every device of `axis_name`) and the local slice of its closed-form gradient. Every per-class
    quantity is local; the row sums are one psum each. `z_loss` adds z_loss lse^2, with
    lse = z_top + log1p(s) from the same reductions and the local gradient 2 z_loss lse p_j."""
    offset = jax.lax.axis_index(axis_name) * z.shape[-1]
    log_p, log_not_p, p, not_p, is_top, s, log1p_s, z_top = _sharded_log_softmax(
        z, offset, axis_name
    )
    if _is_static(gamma) and gamma == 0.0:
        # (1 - p)^0 = 1, also at p = 1
        focal_weight = jnp.ones_like(log_p)
        v = a
    else:
        # (1 - p)^gamma = exp(gamma log(1 - p)); a traced gamma = 0 gives exactly 1 too
        focal_weight = _power(log_not_p, gamma)
        phi = _focal_phi(log_p, p, not_p, is_top, s, log1p_s)
        v = a * focal_weight * (1.0 - gamma * phi)
    # 0 log 0 = 0: a class with no target mass contributes nothing; logits spanning more than
    # the largest number: ``_minus_log_p_times`` (as ``_softmax_focal_terms``)
    weighted = a * focal_weight
    local = jnp.sum(_minus_log_p_times(weighted, log_p, z, z_top, log1p_s, a), axis=-1)
    # the row's loss: this slice's classes, then every slice's (one psum per row)
    loss = jax.lax.psum(local, axis_name)
    grad = p * _sharded_sum_except_self(v, offset, axis_name) - not_p * v
    if z_loss != 0.0:
        lse = z_top + log1p_s
        loss = loss + ((z_loss * lse) * lse)[..., 0]
        # d/dz_j lse^2 = 2 lse p_j: local
        grad = grad + (2.0 * z_loss) * lse * p
    return loss, grad


_sharded_focal_loss = _with_sharded_grad(_sharded_focal_terms, 3)


# a traced gamma is a differentiable argument (its tangent: autodiff of the forward formula)
_sharded_focal_loss_traced = _with_sharded_grad(_sharded_focal_terms, 2)


def _sharded_aux(z, t, targets, keep, is_index, offset, z_loss, softcap, axis_name):
    """``_softmax_aux`` over the slices: the lse of the capped logits (the row's largest logit,
    one pmax, and the sum of exponentials, one psum), the z-term, and whether the first top
    logit over the slices is the target class (``_sharded_top``: a pmax and a pmin; for
    probability targets also of the target mass) on the slice that holds it (one psum); per-row
    scalars only. Before the reduction; no gradient flows through them."""
    z = jax.lax.stop_gradient(z)
    c, _ = _softcap(z, softcap)
    # the row's largest capped logit (the shift) and sum of exponentials, over the slices
    c_top = jax.lax.pmax(jnp.max(c, axis=-1, keepdims=True), axis_name)
    c_top = jnp.where(jnp.isfinite(c_top), c_top, 0.0)
    total = jax.lax.psum(jnp.sum(jnp.exp(c - c_top), axis=-1), axis_name)
    lse = jnp.where(keep, c_top[..., 0] + jnp.log(total), 0.0)
    _, is_top = _sharded_top(z, offset, axis_name)
    if is_index:
        is_target = offset + jnp.arange(z.shape[-1]) == _as_array(targets)[..., None]
    else:
        # the class of the largest target mass (smoothing keeps it), over the slices
        _, is_target = _sharded_top(jax.lax.stop_gradient(t), offset, axis_name)
    # the slice that holds the top says whether it is the target's class (one psum per row)
    hits = jax.lax.psum(jnp.sum(is_top & is_target, axis=-1, dtype=jnp.int32), axis_name)
    correct = keep & (hits > 0)
    return {"lse": lse, "z_term": z_loss * lse * lse, "correct": correct.astype(lse.dtype)}


def _sharded_softmax(
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
    normalizer,
    z_loss,
    softcap,
    return_aux,
    axis_name,
):
    """``_softmax`` for logits that hold this device's slice of the classes along the mesh axis
    `axis_name` (inside ``shard_map``); the batch reductions are over this device's rows (a
    batch split over another axis: pass ``global_count(..., axis_name=data_axis)`` as
    `normalizer` and psum the result over that axis). `softcap` caps the local slice (the cap
    is elementwise); `z_loss` takes lse from the loss's own row reductions."""
    _not_torch(gamma=gamma, label_smoothing=label_smoothing)
    return_aux = _checks.return_aux(return_aux)
    reduction, normalizer = _normalizer(reduction, normalizer)
    z_loss = _checks.z_loss(z_loss)
    softcap = _checks.softcap(softcap)
    if is_focal:
        gamma = _scalar_option("gamma", gamma)
        weight, alpha = None, class_weight_arg
    else:
        weight, alpha = class_weight_arg, None
    label_smoothing = _scalar_option("label_smoothing", label_smoothing)
    z, t, keep, is_index, class_weight, vector, offset, num_classes, axis = _sharded_softmax_inputs(
        logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where, axis_name
    )
    if not _is_static(gamma):
        gamma = gamma.astype(z.dtype)
    # elements left out (ignored, no class left): logits 0, so that their loss and gradient are
    # 0, not NaN from a row of -inf or a NaN logit
    z = jnp.where(keep[..., None], z, 0.0)
    if is_index:
        # an index outside [0, C) cannot raise under jit: its element's loss and gradient are NaN
        y = _as_array(targets)
        poison = jnp.where(keep & ((y < 0) | (y >= num_classes)), jnp.nan, 0.0).astype(z.dtype)
        z = z + poison[..., None]
    if return_aux:
        aux = _sharded_aux(z, t, targets, keep, is_index, offset, z_loss, softcap, axis_name)
    if softcap is not None:
        # the cap is elementwise: this slice capped, its closed-form tangent sech^2 (``_capped``)
        z = _capped(z, softcap)
    a = class_weight * t
    if _is_static(gamma):
        loss = _sharded_focal_loss(z, a, gamma, z_loss, axis_name)
    else:
        loss = _sharded_focal_loss_traced(z, a, gamma, z_loss, axis_name)
    loss = jnp.where(keep, loss, 0.0)
    if is_index and not is_focal:
        # torch: the weighted mean divides by the weights of the kept targets (the global vector)
        y = jnp.clip(jnp.where(keep, _as_array(targets), 0), 0, num_classes - 1)
        denominator = jnp.sum(jnp.where(keep, vector[y], 0.0))
    else:
        denominator = jnp.count_nonzero(keep)
    loss = _reduce(loss, reduction, _mean_divisor(denominator, normalizer))
    dtype = _as_array(logits).dtype
    if return_aux:
        divisor = _mean_divisor(jnp.count_nonzero(keep), normalizer)
        aux = {key: _reduce(value, reduction, divisor).astype(dtype) for key, value in aux.items()}
        return loss.astype(dtype), aux
    return loss.astype(dtype)


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
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    return_aux: bool = False,
    axis_name: Hashable | None = None,
) -> jax.Array | tuple[jax.Array, dict]:
    """Softmax cross entropy, torch ``F.cross_entropy`` semantics; see ``spec`` for the math.

    Class axis -1 by default. Computed in the logits dtype (float32 for float16/bfloat16) and
    returned in it. Closed-form gradient w.r.t. the logits (custom_jvp: grad, jacfwd, hessian).
    Under ``jit`` an index outside [0, C) gives NaN (an error under ``checkify``).
    `normalizer` (a number or a 0-d array, may be traced) replaces the mean's divisor, as in the
    spec; it is a constant (``stop_gradient``).
    `axis_name` (inside ``jax.shard_map``): the mesh axis the class dimension is split over
    (docs/scaling.md): the logits (and probability targets, a class `where`) are this device's
    contiguous slice, class-index targets stay global, `weight` is the whole vector; the row
    sums are reduced with pmax/psum of per-row scalars, never a gathered row.
    `z_loss` and `softcap` (DESIGN 13, Python numbers, see the spec) ride in the loss's own
    closed-form terms (the class-index gather path included; with `axis_name`: the local slice
    capped, lse from the row's own reductions). `return_aux=True` returns (loss, {'lse',
    'z_term', 'correct'}) as the spec, in the logits' dtype (no gradient through them; with
    `axis_name`, a few more per-row reductions).
    """
    arguments = (logits, targets, axis, weight, 0.0, False, ignore_index, label_smoothing, where)
    if axis_name is not None:
        return _sharded_softmax(
            *arguments, reduction, normalizer, z_loss, softcap, return_aux, axis_name
        )
    return _softmax(*arguments, reduction, normalizer, z_loss, softcap, return_aux)


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
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    return_aux: bool = False,
    axis_name: Hashable | None = None,
) -> jax.Array | tuple[jax.Array, dict]:
    """Softmax focal loss (Lin et al.); see ``spec.softmax_focal_loss`` for the math.

    Class axis -1 by default; dtypes, gradients and bad indices as ``softmax_cross_entropy``.
    `gamma`, `alpha` and `label_smoothing` may be traced (jit arguments, vmap, grad w.r.t.
    them); a Python gamma = 0 takes the exact cross-entropy branch. `axis_name`: the class
    dimension split over that mesh axis, as ``softmax_cross_entropy`` (`alpha` the whole vector).
    `z_loss`, `softcap`: as ``softmax_cross_entropy``.
    """
    arguments = (logits, targets, axis, alpha, gamma, True, ignore_index, label_smoothing, where)
    if axis_name is not None:
        return _sharded_softmax(
            *arguments, reduction, normalizer, z_loss, softcap, return_aux, axis_name
        )
    return _softmax(*arguments, reduction, normalizer, z_loss, softcap, return_aux)


def softmax_cross_entropy_with_integer_labels(
    logits: ArrayLike,
    labels: ArrayLike,
    axis: int | tuple[int, ...] = -1,
    where: ArrayLike | None = None,
) -> jax.Array:
    """``optax.losses.softmax_cross_entropy_with_integer_labels``: -log softmax(logits)[label].

    Args:
      logits: floating array.
      labels: integer class indices, the logits shape without the class axes; for a tuple
        `axis`, a flat index into the class axes (``jnp.ravel_multi_index``).
      axis: the class axis, or a tuple of class axes.
      where: boolean mask of the logits shape or of the batch shape (see the module docstring).

    Returns:
      The per-example losses, the logits shape without the class axes.
    """
    _not_torch(logits=logits, labels=labels, where=where)
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    _checks.float_logits("logits", jnp.issubdtype(logits.dtype, jnp.floating), logits.dtype)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(
            "`labels` must have an integer dtype (class indices). "
            f"Received: labels.dtype={labels.dtype}."
        )
    where = _expand_where(where, logits, axis)
    if not isinstance(axis, int) or isinstance(axis, bool):
        logits, (where,), axis = _class_axes_last(logits, axis, where)
    return softmax_cross_entropy(logits, labels, axis=axis, where=where, reduction="none")
