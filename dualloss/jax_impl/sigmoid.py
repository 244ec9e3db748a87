"""The sigmoid losses of the JAX backend: ``sigmoid_cross_entropy``, ``sigmoid_focal_loss`` and
optax's ``sigmoid_binary_cross_entropy`` (the same function as in ``dualloss.optax``).

Sections as in ``spec.sigmoid``: the core (one exp(-|x|) for every sigmoid quantity, the terms),
the public functions. The math lives in ``dualloss.spec.sigmoid``. May import ``_inputs``,
``_autodiff`` and ``softmax`` (its ``_log1m`` and ``_power``); never ``linear`` or
``dualloss.optax``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks
from ._autodiff import _is_zero, _with_closed_form_grad
from ._inputs import (
    ArrayLike,
    _as_array,
    _is_static,
    _mean_divisor,
    _normalizer,
    _not_torch,
    _reduce,
    _scalar_option,
    _sigmoid_focal_targets,
    _sigmoid_inputs,
)
from .softmax import _log1m, _power

# ----------------------------------------------------------------------------------------------
# Sigmoid core
# ----------------------------------------------------------------------------------------------


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


def _sigmoid_divide(w, divisor):
    """The weights `w` divided by the mean's divisor (a number or a normalizer array); 0 for 0."""
    if isinstance(divisor, (int, float)):
        return w / divisor if divisor != 0 else w * 0.0
    nonzero = divisor != 0
    return jnp.where(nonzero, w / jnp.where(nonzero, divisor, 1).astype(w.dtype), 0.0)


# ----------------------------------------------------------------------------------------------
# Public API: sigmoid losses
# ----------------------------------------------------------------------------------------------


def _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction, normalizer):
    reduction, normalizer = _normalizer(reduction, normalizer)
    x, t, w, q = _sigmoid_inputs(logits, targets, weight, pos_weight)
    if reduction == "mean":
        # each term divided before summing (a mean near the top of the range cannot overflow),
        # through the weight (see _sigmoid_terms); the mean over no elements is 0
        w = _sigmoid_divide(w, _mean_divisor(x.size, normalizer))
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
    normalizer: ArrayLike | float | None = None,
) -> jax.Array:
    """Sigmoid (binary) cross entropy with logits, torch semantics; see ``spec``.

    Computed in the logits dtype (float32 for float16/bfloat16) and returned in it; closed-form
    gradient w.r.t. the logits (custom_jvp).
    """
    return _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction, normalizer)


def sigmoid_binary_cross_entropy(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
    """``optax.losses.sigmoid_binary_cross_entropy``: element-wise, the logits shape.

    `labels` (probabilities, or integer 0/1) are cast to the logits dtype and broadcast.
    """
    _not_torch(logits=logits, labels=labels)
    logits = jnp.asarray(logits)
    _checks.float_logits("logits", jnp.issubdtype(logits.dtype, jnp.floating), logits.dtype)
    labels = jnp.broadcast_to(jnp.asarray(labels).astype(logits.dtype), logits.shape)
    return sigmoid_cross_entropy(logits, labels, reduction="none")


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


def _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction, normalizer):
    _not_torch(gamma=gamma, alpha=alpha)
    reduction, normalizer = _normalizer(reduction, normalizer)
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
    w = jnp.ones((), dtype=x.dtype)
    if reduction == "mean":
        w = _sigmoid_divide(w, _mean_divisor(x.size, normalizer))
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
    normalizer: ArrayLike | float | None = None,
) -> jax.Array:
    """Sigmoid focal loss, torchvision semantics; see ``spec.sigmoid_focal_loss`` for the math.

    Computed in the logits dtype (float32 for float16/bfloat16) and returned in it; closed-form
    gradient w.r.t. the logits (custom_jvp). `gamma` and `alpha` (None, a number, or a scalar
    array) may be traced. Note torchvision's default alpha is 0.25; here it is None.
    """
    return _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction, normalizer)
