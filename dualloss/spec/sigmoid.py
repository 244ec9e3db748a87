"""The sigmoid losses of the spec: ``sigmoid_cross_entropy``, ``sigmoid_focal_loss`` and their
``_grad`` (w.r.t. the logits, the targets and the options).

Sections as in ``torch_impl.sigmoid`` and ``jax_impl.sigmoid``: the core (softplus, sigmoid, the
terms), the public functions, the gradients w.r.t. targets and options. May import ``_inputs``
and ``wrt``; never ``softmax``, ``linear`` or ``intermediates``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _checks
from ._inputs import ArrayLike, _as_array, _normalize, _normalizer, _reduce, _sigmoid_inputs
from .wrt import (
    SigmoidCrossEntropyWrt,
    SigmoidFocalLossWrt,
    _check_wrt,
    _needs_option,
    _scale_by_reduction,
    _sum_to_shape,
)

# ----------------------------------------------------------------------------------------------
# Sigmoid core
# ----------------------------------------------------------------------------------------------


class SigmoidFocalTerms(NamedTuple):
    """What ``_sigmoid_focal_terms`` computes per element: the loss, its gradient, and the
    intermediates the parity judge sizes its error model with: the focal weight (1 - p_t)^gamma,
    log(1 - p_t), and alpha_t (ones for alpha None)."""

    loss: np.ndarray
    grad: np.ndarray
    focal_weight: np.ndarray
    log_not_pt: np.ndarray
    alpha_t: np.ndarray


class SigmoidIntermediates(NamedTuple):
    """``sigmoid_*_intermediates``: a sigmoid loss before its reduction, logits shape.

    `loss` and `grad` per element (weights applied); `x`, `t`, `w`, `q` the logits, targets,
    weight and pos_weight in float64 (ones where not given); `focal` the ``SigmoidFocalTerms``
    of the focal loss (None for cross entropy); `denominator` the divisor of reduction 'mean'.
    """

    loss: np.ndarray
    grad: np.ndarray
    x: np.ndarray
    t: np.ndarray
    w: np.ndarray
    q: np.ndarray
    focal: SigmoidFocalTerms | None
    denominator: float


def _softplus(x):
    """softplus(x) = log(1 + exp(x)) = -log_sigmoid(-x), accurate for every x."""
    return np.logaddexp(0.0, x)


def _sigmoid(x):
    """sigmoid(x), to a few ULPs relative for every x (no 1 - sigmoid(-x))."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0.0, 1.0 / (1.0 + e), e / (1.0 + e))


def _sigmoid_terms(x, t, q):
    """Per-element sigmoid cross entropy (w = 1) and its gradient.

    l = (1 - t) softplus(x) + q t softplus(-x), the same as torch's
    (1 - t) x + (1 + (q - 1) t) softplus(-x) but a sum of two terms >= 0, so no cancellation.
    dl/dx = (1 - t) sigma(x) - q t sigma(-x), the same as (q t + 1 - t) sigma(x) - q t.
    """
    # -log(1 - sigma(x)) = softplus(x), -log(sigma(x)) = softplus(-x)
    loss = (1.0 - t) * _softplus(x) + q * t * _softplus(-x)
    grad = (1.0 - t) * _sigmoid(x) - q * t * _sigmoid(-x)
    return loss, grad


def _sigmoid_reduce(loss, grad, reduction):
    return _reduce(loss, grad, reduction, loss.size)


# ----------------------------------------------------------------------------------------------
# Public API: sigmoid losses
# ----------------------------------------------------------------------------------------------


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction):
    reduction = _checks.reduction(reduction)
    x, t, w, q = _sigmoid_inputs(logits, targets, weight, pos_weight)
    loss, grad = _sigmoid_terms(x, t, q)
    return _sigmoid_reduce(w * loss, w * grad, reduction)


def sigmoid_cross_entropy(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    weight: ArrayLike | None = None,
    pos_weight: ArrayLike | None = None,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
) -> np.ndarray:
    """Sigmoid (binary) cross entropy with logits, torch semantics, computed in float64.

    l = w [(1 - t) x + (1 + (q - 1) t) softplus(-x)] = w [(1 - t) softplus(x) + q t softplus(-x)]

    Args:
      logits: floating array.
      targets: floating array of the logits shape, probabilities in [0, 1].
      weight: optional element-wise weight w, broadcastable to the logits.
      pos_weight: optional weight q of the positive term, broadcastable to the logits (torch:
        one entry per class along the last axis).
      reduction: 'none', 'sum', or 'mean' (over all elements; 0 for no elements).
      normalizer: as ``softmax_cross_entropy``: 'mean' divides the sum by it instead.

    Returns:
      float64 array of the logits shape for 'none', a float64 scalar otherwise.

    Example:
      >>> round(float(sigmoid_cross_entropy(np.array([3.0, -1.0]), np.array([1.0, 0.0]))), 6)
      0.180925

    References:
      torch.nn.functional.binary_cross_entropy_with_logits
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    loss, _ = _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction)
    return _normalize(loss, normalizer)


def sigmoid_cross_entropy_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    weight: ArrayLike | None = None,
    pos_weight: ArrayLike | None = None,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
    wrt: SigmoidCrossEntropyWrt = "logits",
) -> np.ndarray:
    """Gradient of ``sigmoid_cross_entropy`` (reduced as `reduction` says) w.r.t. `wrt`.

    The gradient of the reduced loss; for reduction 'none', of the sum of the per-element
    losses ('mean' divides by the number of elements, which no argument changes):

    * 'logits': dl/dx = w [(q t + 1 - t) sigma(x) - q t] = w [(1 - t) sigma(x) - q t sigma(-x)].
    * 'targets': dl/dt = w [q softplus(-x) - softplus(x)] = w [(q - 1) softplus(-x) - x].
    * 'weight' (needs `weight`): dl/dw = (1 - t) softplus(x) + q t softplus(-x).
    * 'pos_weight' (needs `pos_weight`): dl/dq = w t softplus(-x).

    Float64. 'logits' and 'targets' are shaped like the logits; 'weight' and 'pos_weight' like
    the argument as given, i.e. summed over the dimensions it was broadcast along (a NumPy
    float64 scalar for a scalar weight).

    Raises:
      ValueError: `wrt` is not one of the names above; 'weight' or 'pos_weight' left None.
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    _check_wrt(wrt, SigmoidCrossEntropyWrt, "sigmoid_cross_entropy_grad")
    if wrt != "logits":
        return _normalize(
            _sigmoid_cross_entropy_input_grad(logits, targets, weight, pos_weight, reduction, wrt),
            normalizer,
        )
    _, grad = _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction)
    return _normalize(grad, normalizer)


def _sigmoid_focal_terms(x, t, alpha, gamma):
    """Per-element sigmoid focal loss and its gradient (torchvision semantics).

    p_t = p t + (1 - p)(1 - t), so 1 - p_t = p (1 - t) + (1 - p) t, formed in log space;
    l = alpha_t (1 - p_t)^gamma ce,
    dl/dx = alpha_t (1 - p_t)^gamma [(p - t) + gamma ce (1 - 2t) r],  r = p (1 - p) / (1 - p_t).
    """
    ce, p_minus_t = _sigmoid_terms(x, t, 1.0)
    # log p = -softplus(-x), log(1 - p) = -softplus(x)
    log_p = -_softplus(-x)
    log_not_p = -_softplus(x)
    # log(1 - p_t) = logaddexp(log(1 - t) + log p, log t + log(1 - p)); log 0 = -inf drops a term
    log_not_pt = np.logaddexp(np.log1p(-t) + log_p, np.log(t) + log_not_p)
    if gamma == 0.0:
        # (1 - p_t)^0 = 1, also at p_t = 1
        focal_weight = np.ones_like(x)
    else:
        focal_weight = np.exp(gamma * log_not_pt)
    if alpha is None:
        alpha_t = np.ones_like(x)
    else:
        alpha_t = alpha * t + (1.0 - alpha) * (1.0 - t)
    # r = p (1 - p) / (1 - p_t) <= 1; ce * r stays O(1) where gamma * ce alone overflows
    r = np.exp(log_p + log_not_p - log_not_pt)
    loss = alpha_t * focal_weight * ce
    grad = alpha_t * focal_weight * (p_minus_t + gamma * (ce * r) * (1.0 - 2.0 * t))
    return SigmoidFocalTerms(loss, grad, focal_weight, log_not_pt, alpha_t)


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction):
    reduction = _checks.reduction(reduction)
    gamma = _checks.gamma(gamma)
    _checks.focal_alpha(alpha, None)
    x, t, _, _ = _sigmoid_inputs(logits, targets, None, None)
    _checks.sigmoid_focal_targets(_as_array(targets))
    terms = _sigmoid_focal_terms(x, t, alpha, gamma)
    return _sigmoid_reduce(terms.loss, terms.grad, reduction)


def sigmoid_focal_loss(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
) -> np.ndarray:
    """Sigmoid focal loss, torchvision ``sigmoid_focal_loss`` semantics, computed in float64.

    p = sigmoid(x), p_t = p t + (1 - p)(1 - t), alpha_t = alpha t + (1 - alpha)(1 - t) (1 for
    alpha None), ce = sigmoid cross entropy;  l = alpha_t (1 - p_t)^gamma ce.

    Args:
      logits: floating array.
      targets: floating array of the logits shape, in [0, 1] (soft targets allowed; an entry
        outside raises ValueError: the weight (1 - p_t)^gamma needs a probability 1 - p_t).
      gamma: focusing parameter, a number >= 0.
      alpha: None (no balancing) or torchvision's alpha, a number in [0, 1]. Note torchvision's
        default is 0.25; here it is None.
      reduction: 'none', 'sum', or 'mean' (over all elements; 0 for no elements).
      normalizer: as ``softmax_cross_entropy``: 'mean' divides the sum by it instead.

    Returns:
      float64 array of the logits shape for 'none', a float64 scalar otherwise.

    Example:
      >>> round(float(sigmoid_focal_loss(np.array([3.0, -1.0]), np.array([1.0, 0.0]))), 6)
      0.011384

    References:
      Lin et al., "Focal Loss for Dense Object Detection", https://arxiv.org/abs/1708.02002;
      torchvision.ops.sigmoid_focal_loss
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    loss, _ = _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction)
    return _normalize(loss, normalizer)


def sigmoid_focal_loss_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
    wrt: SigmoidFocalLossWrt = "logits",
) -> np.ndarray:
    """Gradient of ``sigmoid_focal_loss`` (reduced as `reduction` says) w.r.t. `wrt`.

    The gradient of the reduced loss; for reduction 'none', of the sum of the per-element
    losses ('mean' divides by the number of elements). With m = (1 - p_t)^gamma,
    ce = (1 - t) softplus(x) + t softplus(-x):

    * 'logits': dl/dx = alpha_t m [(p - t) + gamma ce (1 - 2t) r],
      log r = log sigma(x) + log sigma(-x) - log(1 - p_t): bounded for every t in [0, 1].
    * 'targets': dl/dt = m [(2 alpha - 1) ce + alpha_t (gamma (1 - 2p) rho - x)] (the first term
      only with alpha given), rho = ce / (1 - p_t) in [1, 1 + |x|], formed from |x| and
      e = exp(-|x|) without underflow; 1 - 2p = -tanh(x / 2).
    * 'gamma': dl/dgamma = alpha_t m log(1 - p_t) ce <= 0 (a scalar).
    * 'alpha' (needs `alpha`): dl/dalpha = (2t - 1) m ce (a scalar).

    Float64, 'logits' and 'targets' shaped like the logits, NumPy float64 scalars otherwise.

    Raises:
      ValueError: `wrt` is not one of the names above; 'alpha' with `alpha` None.
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    _check_wrt(wrt, SigmoidFocalLossWrt, "sigmoid_focal_loss_grad")
    if wrt != "logits":
        return _normalize(
            _sigmoid_focal_input_grad(logits, targets, gamma, alpha, reduction, wrt), normalizer
        )
    _, grad = _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction)
    return _normalize(grad, normalizer)


# ----------------------------------------------------------------------------------------------
# Gradients w.r.t. the targets and the options
# ----------------------------------------------------------------------------------------------


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _sigmoid_cross_entropy_input_grad(logits, targets, weight, pos_weight, reduction, wrt):
    """Gradient of reduced sigmoid cross entropy w.r.t. 'targets', 'weight' or 'pos_weight'."""
    reduction = _checks.reduction(reduction)
    if wrt in ("weight", "pos_weight"):
        _needs_option(wrt, weight if wrt == "weight" else pos_weight)
    x, t, w, q = _sigmoid_inputs(logits, targets, weight, pos_weight)
    if wrt == "targets":
        # dl/dt = w [q softplus(-x) - softplus(x)] = w [(q - 1) softplus(-x) - x], as
        # softplus(x) - softplus(-x) = x: the second form is exact at q = 1 (no cancellation
        # near x = 0), the first has none for small q
        # the mean's division first, each term scaled on its own: the per-element sum
        # overflows at |x| near the float64 range (x = -max/2, q = 2) where the gradient of
        # the mean is finite
        w = _scale_by_reduction(w, reduction, x.size)
        return np.where(
            q >= 0.5,
            w * (q - 1.0) * _softplus(-x) - w * x,
            w * q * _softplus(-x) - w * _softplus(x),
        )
    if wrt == "weight":
        # dl/dw = (1 - t) softplus(x) + q t softplus(-x), the loss at w = 1
        grad, _ = _sigmoid_terms(x, t, q)
        shape = np.shape(weight)
    else:
        # dl/dq = w t softplus(-x)
        grad = w * t * _softplus(-x)
        shape = np.shape(pos_weight)
    return _sum_to_shape(_scale_by_reduction(grad, reduction, x.size), shape)


def _focal_ce_ratio(x, t):
    """rho = ce / (1 - p_t) in [1, 1 + |x|], ce = (1 - t) softplus(x) + t softplus(-x).

    With a = |x|, e = exp(-a) and tau the target of the losing side (1 - t for x >= 0, t for
    x < 0): ce = tau a + log1p(e), 1 - p_t = (tau + (1 - tau) e) / (1 + e), all terms >= 0.
    Where tau = 0 and e underflows both vanish: rho = (1 + e) log1p(e) / e -> 1.
    """
    a = np.abs(x)
    e = np.exp(-a)
    tau = np.where(x >= 0.0, 1.0 - t, t)
    numerator = tau * a + np.log1p(e)
    denominator = tau + (1.0 - tau) * e
    return np.where(denominator > 0.0, numerator * (1.0 + e) / denominator, 1.0)


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _sigmoid_focal_input_grad(logits, targets, gamma, alpha, reduction, wrt):
    """Gradient of the reduced sigmoid focal loss w.r.t. 'targets', 'gamma' or 'alpha'."""
    reduction = _checks.reduction(reduction)
    gamma = _checks.gamma(gamma)
    _checks.focal_alpha(alpha, None)
    if wrt == "alpha":
        _needs_option(wrt, alpha)
    x, t, _, _ = _sigmoid_inputs(logits, targets, None, None)
    _checks.sigmoid_focal_targets(_as_array(targets))
    terms = _sigmoid_focal_terms(x, t, alpha, gamma)
    ce, _ = _sigmoid_terms(x, t, 1.0)
    if wrt == "targets":
        # d alpha_t / dt = 2 alpha - 1, d ce / dt = softplus(-x) - softplus(x) = -x,
        # d (1 - p_t)^gamma / dt = gamma (1 - p_t)^gamma (1 - 2p) / (1 - p_t), 1 - 2p = -tanh(x/2)
        alpha_slope = 0.0 if alpha is None else 2.0 * alpha - 1.0
        # the mean's division first and each term scaled on its own (left to right): at
        # x = -max/2 the focusing term alone is max, the sum overflows, the mean does not
        weight = _scale_by_reduction(terms.focal_weight, reduction, x.size)
        focusing = weight * terms.alpha_t * gamma * -np.tanh(0.5 * x) * _focal_ce_ratio(x, t)
        return weight * alpha_slope * ce + focusing - weight * terms.alpha_t * x
    if wrt == "gamma":
        # d/dgamma (1 - p_t)^gamma = (1 - p_t)^gamma log(1 - p_t)
        grad = terms.alpha_t * terms.focal_weight * terms.log_not_pt * ce
    else:
        # d alpha_t / d alpha = t - (1 - t)
        grad = (2.0 * t - 1.0) * terms.focal_weight * ce
    return np.float64(_scale_by_reduction(np.sum(grad), reduction, x.size))
