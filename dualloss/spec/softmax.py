"""The NumPy specification of dualloss: values and closed-form gradients, in float64.

This module is the reference that ``torch_impl``, ``jax_impl`` and any user loss are judged
against (see ``dualloss.parity``). It favours accuracy over speed: every value and every gradient
entry is meant to be within a few float64 ULPs of the exact result, also where the loss or the
gradient is tiny (a target probability within 1e-300 of 1). ``torch_impl`` and ``jax_impl``
follow the same functions in the same order with the same local names.

The math (per element; p = softmax(z) along the class axis, sigma = sigmoid), from DESIGN.md:

* softmax cross entropy  l = -sum_c w_c t_c log p_c,          dl/dz = p * sum_c v_c - v,  v = w t
* softmax focal loss     l = -sum_c a_c (1 - p_c)^g log p_c,  a = alpha t,
                         v_c = a_c (1 - p_c)^g (1 - g phi(p_c)),  phi(p) = p log p / (1 - p)
* sigmoid cross entropy  l = w [(1 - t) softplus(x) + q t softplus(-x)]
* sigmoid focal loss     l = alpha_t (1 - p_t)^g ce

where t is the (label-smoothed) target distribution. Conventions: 0 log 0 = 0, x^0 = 1.

All computations happen in float64 whatever the input dtype; results are float64 NumPy arrays
(NumPy float64 scalars for the reductions 'mean' and 'sum').
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, get_args

import numpy as np

from . import _checks

__all__ = [
    "softmax_cross_entropy",
    "softmax_cross_entropy_grad",
    "softmax_focal_loss",
    "softmax_focal_loss_grad",
    "sigmoid_cross_entropy",
    "sigmoid_cross_entropy_grad",
    "sigmoid_focal_loss",
    "sigmoid_focal_loss_grad",
    "linear_softmax_cross_entropy",
    "linear_softmax_cross_entropy_grad",
    "linear_softmax_focal_loss",
    "linear_softmax_focal_loss_grad",
    "softmax_cross_entropy_intermediates",
    "softmax_focal_loss_intermediates",
    "sigmoid_cross_entropy_intermediates",
    "sigmoid_focal_loss_intermediates",
    "SoftmaxTerms",
    "SoftmaxIntermediates",
    "SigmoidFocalTerms",
    "SigmoidIntermediates",
]

ArrayLike = Any

# what each ``<name>_grad(..., wrt=...)`` differentiates: the order of ``losses.LossInfo``'s
# `differentiable`, which a test keeps equal to these
SoftmaxCrossEntropyWrt = Literal["logits", "targets", "weight", "label_smoothing"]
SoftmaxFocalLossWrt = Literal["logits", "targets", "gamma", "alpha", "label_smoothing"]
SigmoidCrossEntropyWrt = Literal["logits", "targets", "weight", "pos_weight"]
SigmoidFocalLossWrt = Literal["logits", "targets", "gamma", "alpha"]
# the fused linear losses: the gradients w.r.t. the linear layer's inputs
LinearSoftmaxWrt = Literal["hidden", "linear_weight", "bias"]


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


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


class SoftmaxTerms(NamedTuple):
    """What ``_softmax_focal_terms`` computes per element, class axis last (float64).

    `loss` and `grad` are the loss and its gradient; the rest are the intermediates the parity
    judge sizes its error model with: log p, log(1 - p), p, the focal weight (1 - p)^gamma
    (ones for gamma = 0) and v = a (1 - p)^gamma (1 - gamma phi(p)) (v = a for gamma = 0).
    """

    loss: np.ndarray
    grad: np.ndarray
    log_p: np.ndarray
    log_not_p: np.ndarray
    p: np.ndarray
    focal_weight: np.ndarray
    v: np.ndarray


class SoftmaxIntermediates(NamedTuple):
    """``softmax_intermediates``: a softmax loss before its reduction (class axis last).

    `terms` as ``SoftmaxTerms`` with ignored elements and masked classes already zeroed in
    `terms.loss` / `terms.grad`; `z` the logits with masked classes at -inf, `a` the target mass
    class_weight * t~, `keep` the non-ignored elements, `valid` the classes inside `where`,
    `denominator` the divisor of reduction 'mean' (torch semantics, 0 when nothing is kept),
    `axis` the class axis of the input layout.
    """

    terms: SoftmaxTerms
    z: np.ndarray
    a: np.ndarray
    keep: np.ndarray
    valid: np.ndarray
    denominator: float
    axis: int


# ----------------------------------------------------------------------------------------------
# Softmax core
# ----------------------------------------------------------------------------------------------


def _log_softmax(z):
    """log p, log(1 - p), p and 1 - p along the last axis, each to float64 relative accuracy.

    Only the largest logit (the "top" class, first one on ties) can have p > 1/2. With
    s = sum_{j != top} exp(z_j - z_top), the normaliser is 1 + s exactly, so
      log p_c       = (z_c - z_top) - log1p(s)
      log(1 - p_top) = log(s) - log1p(s),  log s = logsumexp_{j != top} (z_j - z_top), when s < 1
      log(1 - p_c)  = log1p(-p_c) for every other class and a top with s >= 1 (p_c <= 1/2).
    For s < 1, log s < 0 < log1p(s): the difference adds two numbers of one sign. For s >= 1
    both are positive and cancel: at a flat row of C classes log(C - 1) - log(C) ~ -1/C carries
    the error of log C, C log C times its size (10 ULP in a focal loss at C = 1000, gamma = 2).
    """
    num_classes = z.shape[-1]
    top = np.argmax(z, axis=-1)[..., None]
    is_top = np.arange(num_classes) == top
    z_top = np.take_along_axis(z, top, axis=-1)
    # a +inf logit makes the whole row NaN (DESIGN 5), like a NaN logit does (argmax picks it)
    z_top = np.where(z_top == np.inf, np.nan, z_top)
    # shift so that the largest logit is 0: exp cannot overflow (a row of -inf gives NaN)
    shifted = z - z_top
    others = np.where(is_top, -np.inf, shifted)
    s = np.sum(np.exp(others), axis=-1, keepdims=True)
    log1p_s = np.log1p(s)
    # log s = m + log(sum_{j != top} exp(z_j - z_top - m)), m the runner-up: exact when s underflows
    runner_up = np.max(others, axis=-1, keepdims=True)
    runner_up = np.where(np.isfinite(runner_up), runner_up, 0.0)
    log_s = runner_up + np.log(np.sum(np.exp(others - runner_up), axis=-1, keepdims=True))
    log_p = shifted - log1p_s
    # p = exp(z - z_top) / (1 + s): within ~1 ULP, where exp(log p) would multiply the absolute
    # error of log p by |log p| (1.5 ULP at p = 1/3, 2.7 ULP in the focal gradient there)
    p = np.exp(shifted) / (1.0 + s)
    # 1 - p_top = s / (1 + s), never formed as 1 - p
    not_p = np.where(is_top, s / (1.0 + s), 1.0 - p)
    log_not_p = np.where(is_top & (s < 1.0), log_s - log1p_s, np.log1p(-p))
    return log_p, log_not_p, p, not_p, is_top, s, log1p_s


def _focal_phi(log_p, p, not_p, is_top, s, log1p_s):
    """phi(p) = p log p / (1 - p), in [-1, 0]: phi(0) = 0, phi -> -1 as p -> 1.

    For the top class p = 1 / (1 + s) and 1 - p = s / (1 + s), so phi = -log1p(s) / s.
    """
    phi_top = np.where(s > 0.0, -log1p_s / np.where(s > 0.0, s, 1.0), -1.0)
    phi_rest = np.where(p > 0.0, p * log_p / not_p, 0.0)
    return np.where(is_top, phi_top, phi_rest)


def _sum_except_self(v):
    """sum_{c != j} v_c for each j, for v >= 0, without cancellation.

    S - v_j is accurate when v_j <= S / 2, which holds for all but at most one class per row (the
    largest); for that one the sum of the others is formed directly.
    """
    num_classes = v.shape[-1]
    total = np.sum(v, axis=-1, keepdims=True)
    is_big = np.arange(num_classes) == np.argmax(v, axis=-1)[..., None]
    rest_of_big = np.sum(np.where(is_big, 0.0, v), axis=-1, keepdims=True)
    return np.where(is_big, rest_of_big, total - v)


def _softmax_focal_terms(z, a, gamma):
    """Per-element loss -sum_c a_c (1 - p_c)^gamma log p_c and its gradient (class axis last).

    With gamma = 0 this is the (weighted) softmax cross entropy -sum_c a_c log p_c.
    The gradient is p_j sum_{c != j} v_c - (1 - p_j) v_j, the same as p * sum(v) - v but free of
    the cancellation p_j - 1 when p_j is close to 1.
    """
    log_p, log_not_p, p, not_p, is_top, s, log1p_s = _log_softmax(z)
    if gamma == 0.0:
        # (1 - p)^0 = 1, also at p = 1
        focal_weight = np.ones_like(log_p)
        v = a
    else:
        # (1 - p)^gamma = exp(gamma log(1 - p))
        focal_weight = np.exp(gamma * log_not_p)
        phi = _focal_phi(log_p, p, not_p, is_top, s, log1p_s)
        v = a * focal_weight * (1.0 - gamma * phi)
    # 0 log 0 = 0: a class with no target mass contributes nothing, also when its logit is -inf;
    # 0 * log1p(s) is that 0, or NaN when a NaN or +inf logit made the row NaN (never hidden)
    loss = -np.sum(np.where(a == 0.0, 0.0 * log1p_s, a * focal_weight * log_p), axis=-1)
    grad = p * _sum_except_self(v) - not_p * v
    return SoftmaxTerms(loss, grad, log_p, log_not_p, p, focal_weight, v)


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


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
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
    reduction = _checks.reduction(reduction)
    if is_focal:
        gamma = _checks.gamma(gamma)
        weight, alpha = None, class_weight_arg
    else:
        weight, alpha = class_weight_arg, None
    elements = _softmax_elements(
        logits, targets, axis, weight, alpha, gamma, is_focal, ignore_index, label_smoothing, where
    )
    loss, grad = _reduce(elements.terms.loss, elements.terms.grad, reduction, elements.denominator)
    return loss, np.moveaxis(grad, -1, elements.axis)


def _softmax_elements(
    logits, targets, axis, weight, alpha, gamma, is_focal, ignore_index, label_smoothing, where
):
    """The per-element half of ``_softmax``: a ``SoftmaxIntermediates``."""
    z, t, keep, valid, is_index, class_weight, axis = _softmax_inputs(
        logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where
    )
    a = class_weight * t
    terms = _softmax_focal_terms(z, a, gamma)
    # ignored elements give 0 and no gradient, whatever their logits; masked classes no gradient
    loss = np.where(keep, terms.loss, 0.0)
    grad = np.where(keep[..., None] & valid, terms.grad, 0.0)
    if is_index and not is_focal:
        # torch: the weighted mean divides by the weights of the kept targets
        targets = np.where(keep, _as_array(targets), 0)
        denominator = np.sum(np.where(keep, class_weight[targets], 0.0))
    else:
        # plain mean over the kept elements (for probability targets: those with a class left)
        denominator = np.sum(keep)
    terms = terms._replace(loss=loss, grad=grad)
    return SoftmaxIntermediates(terms, z, a, keep, valid, float(denominator), axis)


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
) -> np.ndarray:
    """Softmax cross entropy, torch ``F.cross_entropy`` semantics, computed in float64.

    l = -sum_c w_c t~_c log p_c,  p = softmax(logits) along `axis`,
    t~ = (1 - eps) t + eps / C with t = onehot(targets) for class indices.

    Args:
      logits: floating array, the class scores; classes at -inf are masked out.
      targets: integer class indices (the logits shape without `axis`) or floating class
        probabilities (the logits shape). Dispatched on dtype, as torch does.
      axis: the class axis.
      weight: optional per-class weights, length C.
      ignore_index: class-index targets equal to this give 0 and are left out of the mean.
      label_smoothing: eps in [0, 1]; with `where`, the eps mass goes to the unmasked classes.
      where: optional boolean mask, optax semantics. A mask that broadcasts to the logits is a
        class mask: False classes leave the softmax (exactly a logit of -inf) and the target
        sum (probability mass on them is dropped, not +inf). Otherwise a mask of the batch
        shape (the logits shape without `axis`, broadcastable to it) masks whole elements. An
        element with no class left, or whose class-index target is a masked class, is treated
        as ignored: loss 0, zero gradient, left out of the mean.
      reduction: 'none' (per-element losses), 'sum', or 'mean' (torch's: divided by the summed
        weights of the kept targets for class indices, by the number of kept elements for
        probabilities, i.e. all of them unless `where` leaves one no class; 0 when nothing is
        kept).

    Returns:
      float64 array of the logits shape without `axis` for 'none', a float64 scalar otherwise.

    Example:
      >>> round(float(softmax_cross_entropy(np.array([[2.0, 0.0, -1.0]]), np.array([0]))), 6)
      0.169846

    References:
      torch.nn.functional.cross_entropy; Szegedy et al., "Rethinking the Inception Architecture"
      (label smoothing), https://arxiv.org/abs/1512.00567
    """
    loss, _ = _softmax(
        logits, targets, axis, weight, 0.0, False, ignore_index, label_smoothing, where, reduction
    )
    return loss


def softmax_cross_entropy_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    axis: int = -1,
    weight: ArrayLike | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    where: ArrayLike | None = None,
    reduction: str = "mean",
    wrt: SoftmaxCrossEntropyWrt = "logits",
) -> np.ndarray:
    """Gradient of ``softmax_cross_entropy`` (reduced as `reduction` says) w.r.t. `wrt`.

    The gradient of the reduced loss; for reduction 'none', of the sum of the per-element
    losses. With g_c = -log p_c (+inf on a masked class) and t~ = (1 - eps) t + eps u, u the
    uniform distribution over the classes inside `where`:

    * 'logits': dl/dz = p * sum_c v_c - v, v = w * t~; masked classes and ignored elements get 0.
    * 'targets' (probability targets only): dl/dt_c = (1 - eps) w_c g_c. A class with no
      probability (a -inf logit or outside `where`) gets +inf: its loss term -t_c log 0 is 0 at
      t_c = 0 and +inf for any t_c > 0 (the one-sided derivative is +inf, the true value);
      0 where (1 - eps) w_c = 0, as the loss does not depend on t_c there.
    * 'weight' (needs `weight`): dL/dw_c = sum_i t~_ic g_ic (divided by N for 'mean' with
      probability targets). 'mean' with class indices divides by D = sum_i w_{y_i} over the kept
      targets, which depends on w (quotient rule): with S_c = sum_i t~_ic g_ic, n_c the kept
      targets of class c, dL/dw_c = (S_c D_{-c} - n_c T_{-c}) / D^2, D_{-c} = sum_{k != c}
      w_k n_k, T_{-c} = sum_{k != c} w_k S_k (the k = c terms cancel exactly and are left out).
    * 'label_smoothing': dl/deps = sum_c w_c (u_c - t_c) g_c (a scalar).

    Terms whose coefficient is 0 are 0 (0 log 0 = 0); a NaN or +inf logit gives NaN in its
    element's terms, an ignored element gives 0. Float64, shaped like the argument `wrt` names
    (a NumPy float64 scalar for 'label_smoothing').

    Raises:
      ValueError: `wrt` is not one of the names above; 'targets' with class-index targets;
        'weight' with `weight` None.
    """
    _check_wrt(wrt, SoftmaxCrossEntropyWrt, "softmax_cross_entropy_grad")
    if wrt != "logits":
        return _softmax_input_grad(
            logits,
            targets,
            axis,
            weight,
            None,
            0.0,
            False,
            ignore_index,
            label_smoothing,
            where,
            reduction,
            wrt,
        )
    _, grad = _softmax(
        logits, targets, axis, weight, 0.0, False, ignore_index, label_smoothing, where, reduction
    )
    return grad


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
) -> np.ndarray:
    """Softmax focal loss (Lin et al.), computed in float64.

    l = -sum_c a_c (1 - p_c)^gamma log p_c,  a_c = alpha_c t~_c,  p = softmax(logits).

    (1 - p)^gamma is exp(gamma log(1 - p)) with log(1 - p) formed from the other classes, so
    the loss and its gradient stay accurate for gamma < 1 and p within 1e-300 of 1; gamma = 0
    with alpha None is exactly ``softmax_cross_entropy``.

    Args:
      logits, targets, axis, ignore_index, label_smoothing, where: as ``softmax_cross_entropy``.
      gamma: focusing parameter, a number >= 0 (0 and values below 1 included).
      alpha: None (no balancing), a number in [0, 1] for every class, or a length-C vector.
      reduction: 'none', 'sum', or 'mean' (over the kept elements; 0 when nothing is kept).

    Returns:
      float64 array of the logits shape without `axis` for 'none', a float64 scalar otherwise.

    Example:
      >>> round(float(softmax_focal_loss(np.array([[2.0, 0.0, -1.0]]), np.array([0]))), 6)
      0.004144

    References:
      Lin et al., "Focal Loss for Dense Object Detection", https://arxiv.org/abs/1708.02002
    """
    loss, _ = _softmax(
        logits, targets, axis, alpha, gamma, True, ignore_index, label_smoothing, where, reduction
    )
    return loss


def softmax_focal_loss_grad(
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
    wrt: SoftmaxFocalLossWrt = "logits",
) -> np.ndarray:
    """Gradient of ``softmax_focal_loss`` (reduced as `reduction` says) w.r.t. `wrt`.

    The gradient of the reduced loss; for reduction 'none', of the sum of the per-element
    losses. 'mean' divides by a count that no argument changes. With
    g_c = -(1 - p_c)^gamma log p_c (+inf on a masked class), a_c = alpha_c t~_c and
    t~ = (1 - eps) t + eps u, u uniform over the classes inside `where`:

    * 'logits': v_c = a_c (1 - p_c)^gamma (1 - gamma phi(p_c)), phi(p) = p log p / (1 - p) in
      [-1, 0]; dl/dz = p * sum_c v_c - v. |v_c| <= a_c (1 + gamma): bounded for every gamma >= 0.
    * 'targets' (probability targets only): dl/dt_c = (1 - eps) alpha_c g_c; +inf on a class
      with no probability (-inf logit or outside `where`), see ``softmax_cross_entropy_grad``.
    * 'gamma': dl/dgamma = -sum_c a_c (1 - p_c)^gamma log(1 - p_c) log p_c <= 0 (a scalar); a
      class with p_c = 1 contributes 0 (its log p_c = 0 for every gamma; x^0 = 1).
    * 'alpha' (needs `alpha`): dl/dalpha_c = t~_c g_c for a vector alpha; a scalar alpha gets
      the scalar sum_c t~_c g_c.
    * 'label_smoothing': dl/deps = sum_c alpha_c (u_c - t_c) g_c (a scalar).

    Terms whose coefficient is 0 are 0 (0 log 0 = 0). Float64, shaped like the argument `wrt`
    names (NumPy float64 scalars for 'gamma', 'label_smoothing' and a scalar 'alpha').

    Raises:
      ValueError: `wrt` is not one of the names above; 'targets' with class-index targets;
        'alpha' with `alpha` None.
    """
    _check_wrt(wrt, SoftmaxFocalLossWrt, "softmax_focal_loss_grad")
    if wrt != "logits":
        return _softmax_input_grad(
            logits,
            targets,
            axis,
            None,
            alpha,
            gamma,
            True,
            ignore_index,
            label_smoothing,
            where,
            reduction,
            wrt,
        )
    _, grad = _softmax(
        logits, targets, axis, alpha, gamma, True, ignore_index, label_smoothing, where, reduction
    )
    return grad


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


# ----------------------------------------------------------------------------------------------
# Fused linear + softmax losses (large vocabularies)
# ----------------------------------------------------------------------------------------------


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
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
    """The loss of logits = hidden @ linear_weight + bias, and its gradient w.r.t. `wrt` for each
    of 'hidden', 'linear_weight', 'bias' (a dict; 'bias' only when `bias` is given).

    The logits are formed in float64 ((..., H) flattened to (M, H)) and handed to ``_softmax``;
    with G = dL/dlogits (M, V), the chain rule through the linear map gives
    dL/dhidden = G W^T, dL/dW = hidden^T G, dL/dbias = sum_rows G.
    """
    hidden = _as_array(hidden)
    linear_weight = _as_array(linear_weight)
    targets = _as_array(targets)
    _checks.float_logits("hidden", np.issubdtype(hidden.dtype, np.floating), hidden.dtype)
    _checks.float_logits(
        "linear_weight", np.issubdtype(linear_weight.dtype, np.floating), linear_weight.dtype
    )
    _checks.index_targets(np.issubdtype(targets.dtype, np.integer), targets.dtype)
    bias_shape = None if bias is None else np.shape(bias)
    size, num_classes = _checks.linear_shapes(
        hidden.shape, linear_weight.shape, bias_shape, targets.shape, 1
    )
    # accepted for a signature shared with the backends; the spec has nothing to chunk
    _checks.chunk_size(chunk_size)
    h = hidden.astype(np.float64).reshape(-1, size)
    w = linear_weight.astype(np.float64)
    logits = h @ w
    if bias is not None:
        logits = logits + _as_array(bias).astype(np.float64)
    loss, grad = _softmax(
        logits,
        targets.reshape(-1),
        -1,
        class_weight_arg,
        gamma,
        is_focal,
        ignore_index,
        label_smoothing,
        None,
        reduction,
    )
    if reduction == "none":
        loss = loss.reshape(targets.shape)
    grads = {"hidden": (grad @ w.T).reshape(hidden.shape), "linear_weight": h.T @ grad}
    if bias is not None:
        grads["bias"] = np.sum(grad, axis=0)
    return loss, grads


def _linear_grad(grads, wrt, allowed, name):
    """The entry `wrt` of ``_linear_softmax``'s gradients (checked against the `wrt` Literal)."""
    _check_wrt(wrt, allowed, name)
    if wrt not in grads:
        _needs_option(wrt, None)
    return grads[wrt]


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
) -> np.ndarray:
    """Softmax cross entropy of a linear layer's output, ``F.linear_cross_entropy`` semantics.

    l = softmax_cross_entropy(hidden @ linear_weight + bias, targets): the loss of a language
    model's head without the (N, V) logits in the backends (they stream over chunks of rows);
    here, the reference, the logits are formed in float64 and handed to ``softmax_cross_entropy``.

    Args:
      hidden: floating array (..., H), the features.
      linear_weight: floating array (H, V) (``hidden @ linear_weight``, flax's Dense kernel;
        ``torch_impl`` takes torch's (V, H)).
      targets: integer class indices of shape (...) (the hidden shape without H).
      bias: optional (V,) added to the logits.
      weight, ignore_index, label_smoothing, reduction: as ``softmax_cross_entropy`` (class
        weights; 'mean' divides by the summed weights of the kept targets, 0 when none is kept).
      chunk_size: rows per chunk in the backends (None: chosen from the shapes); accepted and
        checked here, where nothing is chunked.

    Returns:
      float64 array of shape (...) for 'none', a float64 scalar otherwise.

    Example:
      >>> hidden, kernel = np.array([[1.0, 0.0]]), np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
      >>> round(float(linear_softmax_cross_entropy(hidden, kernel, np.array([0]))), 6)
      0.169846

    References:
      torch.nn.functional.linear_cross_entropy; Wijmans et al., "Cut Your Losses in
      Large-Vocabulary Language Models", https://arxiv.org/abs/2411.09009
    """
    loss, _ = _linear_softmax(
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
    return loss


def linear_softmax_cross_entropy_grad(
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
    wrt: LinearSoftmaxWrt = "hidden",
) -> np.ndarray:
    """Gradient of ``linear_softmax_cross_entropy`` (reduced as `reduction` says) w.r.t. `wrt`.

    With G = ``softmax_cross_entropy_grad`` at the logits (M, V), hidden flattened to (M, H):
    'hidden': G W^T (shaped like hidden), 'linear_weight': hidden^T G (H, V), 'bias' (needs
    `bias`): the column sums of G (V,). Float64.

    Raises:
      ValueError: `wrt` is not one of the names above; 'bias' with `bias` None.
    """
    _, grads = _linear_softmax(
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
    return _linear_grad(grads, wrt, LinearSoftmaxWrt, "linear_softmax_cross_entropy_grad")


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
) -> np.ndarray:
    """Softmax focal loss of a linear layer's output: ``softmax_focal_loss`` of
    hidden @ linear_weight + bias (logits in float64).

    Args:
      hidden, linear_weight, targets, bias, chunk_size: as ``linear_softmax_cross_entropy``.
      gamma, alpha, ignore_index, label_smoothing, reduction: as ``softmax_focal_loss`` ('mean'
        over the kept rows). gamma = 0 with alpha None is ``linear_softmax_cross_entropy``.

    Returns:
      float64 array of shape (...) for 'none', a float64 scalar otherwise.

    Example:
      >>> hidden, kernel = np.array([[1.0, 0.0]]), np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
      >>> round(float(linear_softmax_focal_loss(hidden, kernel, np.array([0]))), 6)
      0.004144

    References:
      Lin et al., "Focal Loss for Dense Object Detection", https://arxiv.org/abs/1708.02002
    """
    loss, _ = _linear_softmax(
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
    return loss


def linear_softmax_focal_loss_grad(
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
    wrt: LinearSoftmaxWrt = "hidden",
) -> np.ndarray:
    """Gradient of ``linear_softmax_focal_loss`` w.r.t. `wrt`: G = ``softmax_focal_loss_grad``
    at the logits mapped through the linear layer, as ``linear_softmax_cross_entropy_grad``."""
    _, grads = _linear_softmax(
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
    return _linear_grad(grads, wrt, LinearSoftmaxWrt, "linear_softmax_focal_loss_grad")


# ----------------------------------------------------------------------------------------------
# Sigmoid core
# ----------------------------------------------------------------------------------------------


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

    Returns:
      float64 array of the logits shape for 'none', a float64 scalar otherwise.

    Example:
      >>> round(float(sigmoid_cross_entropy(np.array([3.0, -1.0]), np.array([1.0, 0.0]))), 6)
      0.180925

    References:
      torch.nn.functional.binary_cross_entropy_with_logits
    """
    loss, _ = _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction)
    return loss


def sigmoid_cross_entropy_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    weight: ArrayLike | None = None,
    pos_weight: ArrayLike | None = None,
    reduction: str = "mean",
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
    _check_wrt(wrt, SigmoidCrossEntropyWrt, "sigmoid_cross_entropy_grad")
    if wrt != "logits":
        return _sigmoid_cross_entropy_input_grad(
            logits, targets, weight, pos_weight, reduction, wrt
        )
    _, grad = _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction)
    return grad


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

    Returns:
      float64 array of the logits shape for 'none', a float64 scalar otherwise.

    Example:
      >>> round(float(sigmoid_focal_loss(np.array([3.0, -1.0]), np.array([1.0, 0.0]))), 6)
      0.011384

    References:
      Lin et al., "Focal Loss for Dense Object Detection", https://arxiv.org/abs/1708.02002;
      torchvision.ops.sigmoid_focal_loss
    """
    loss, _ = _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction)
    return loss


def sigmoid_focal_loss_grad(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    reduction: str = "mean",
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
    _check_wrt(wrt, SigmoidFocalLossWrt, "sigmoid_focal_loss_grad")
    if wrt != "logits":
        return _sigmoid_focal_input_grad(logits, targets, gamma, alpha, reduction, wrt)
    _, grad = _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction)
    return grad


# ----------------------------------------------------------------------------------------------
# Gradients w.r.t. the targets and the options (spec only; ``<name>_grad(..., wrt=...)``)
# ----------------------------------------------------------------------------------------------


def _check_wrt(wrt, allowed, name):
    """`wrt` is one of the names the Literal type `allowed` lists (the `wrt` annotation)."""
    names = get_args(allowed)
    if not isinstance(wrt, str) or wrt not in names:
        raise ValueError(
            f"`wrt` must be one of {', '.join(map(repr, names))} for {name}. Received: wrt={wrt!r}."
        )


def _needs_option(wrt, value):
    """The gradient of an option left at None has no shape (and None is no point to take it at)."""
    if value is None:
        raise ValueError(
            f"`wrt`={wrt!r} needs `{wrt}` to be given: an option left at None has no gradient. "
            f"Received: {wrt}=None."
        )


def _times_mass(coefficient, term, zero):
    """coefficient * term, and `zero` where the coefficient is 0: no mass, no dependence, also
    where the term is +inf (0 log 0 = 0); `zero` is NaN in the elements whose loss is NaN."""
    return np.where(coefficient == 0.0, zero, coefficient * term)


def _scale_by_reduction(grad, reduction, denominator):
    """The per-element sum `grad` divided as reduction 'mean' divides (0 for a zero divisor)."""
    if reduction != "mean":
        return grad
    if denominator == 0:
        return grad * 0.0
    return grad / denominator


def _sum_to_shape(grad, shape):
    """Sums `grad` over the dimensions an argument of `shape` was broadcast along."""
    shape = tuple(shape)
    extra = grad.ndim - len(shape)
    grad = np.sum(grad, axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    grad = np.sum(grad, axis=stretched, keepdims=True)
    return np.float64(grad) if shape == () else grad.reshape(shape)


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _softmax_input_grad(
    logits,
    targets,
    axis,
    weight,
    alpha,
    gamma,
    is_focal,
    ignore_index,
    label_smoothing,
    where,
    reduction,
    wrt,
):
    """Gradient of a reduced softmax loss w.r.t. 'targets', 'weight', 'alpha', 'gamma' or
    'label_smoothing'. The loss is linear in t~ and in the class weights:
    l = sum_c w_c t~_c g_c with g_c = -(1 - p_c)^gamma log p_c."""
    reduction = _checks.reduction(reduction)
    if is_focal:
        gamma = _checks.gamma(gamma)
    if wrt in ("weight", "alpha"):
        _needs_option(wrt, weight if wrt == "weight" else alpha)
    elements = _softmax_elements(
        logits, targets, axis, weight, alpha, gamma, is_focal, ignore_index, label_smoothing, where
    )
    eps = _checks.unit_interval("label_smoothing", label_smoothing)
    # the unsmoothed targets t (one-hot for class indices, 0 where ignored) and the uniform
    # share u of label smoothing over the classes inside `where`: t~ = (1 - eps) t + eps u
    _, t, keep, valid, is_index, class_weight, axis = _softmax_inputs(
        logits, targets, axis, weight, alpha, ignore_index, 0.0, where
    )
    if wrt == "targets" and is_index:
        raise ValueError(
            "`wrt`='targets' needs floating class-probability targets: class indices have no "
            f"gradient. Received: targets.dtype={_as_array(targets).dtype}."
        )
    num_valid = np.sum(valid, axis=-1, keepdims=True)
    uniform = np.where(valid, 1.0 / np.maximum(num_valid, 1), 0.0) * keep[..., None]
    smoothed = (1.0 - eps) * t + eps * uniform
    terms = elements.terms
    # g_c = -(1 - p_c)^gamma log p_c >= 0, the loss per unit of mass w_c t~_c (+inf if p_c = 0)
    g = -terms.focal_weight * terms.log_p
    # 0 for a class without mass, NaN in the rows a NaN or +inf logit made NaN
    zero = np.where(np.isnan(terms.log_p), np.nan, 0.0)
    if wrt == "targets":
        # dl/dt_c = (1 - eps) w_c g_c; 0 on a class outside `where`, whose mass is dropped
        grad = _times_mass(np.broadcast_to((1.0 - eps) * class_weight, g.shape), g, zero)
        grad = np.where(valid, grad, 0.0)
    elif wrt == "label_smoothing":
        # dl/deps = sum_c w_c (u_c - t_c) g_c = sum_c w_c (v_c - K t_c) g_c / K, v_c = K u_c in
        # {0, 1}: one division by K, so the coefficients of a one-hot row sum to exactly 0
        spread = np.maximum(num_valid, 1)
        inside = (valid & keep[..., None]).astype(np.float64)
        grad = _times_mass(class_weight * (inside - spread * t), g, zero) / spread
    elif wrt == "gamma":
        # d/dgamma (1 - p)^gamma = (1 - p)^gamma log(1 - p); a class with log p = 0 (p = 1)
        # contributes 0 for every gamma, also where log(1 - p) = -inf
        mass = np.where(terms.log_p == 0.0, 0.0, elements.a)
        grad = _times_mass(mass, terms.log_not_p * g, zero)
    else:
        # dl/dw_c (or dl/dalpha_c) = t~_c g_c
        grad = _times_mass(smoothed, g, zero)
    # ignored elements: no loss, no gradient, whatever their logits
    grad = np.where(keep[..., None], grad, 0.0)
    denominator = elements.denominator
    if wrt == "targets":
        grad = _scale_by_reduction(grad, reduction, denominator)
        return np.moveaxis(grad, -1, axis)
    per_class = np.sum(grad.reshape(-1, grad.shape[-1]), axis=0)
    if wrt == "weight" and is_index and reduction == "mean":
        # L = T / D with T = sum_k w_k S_k, D = sum_k w_k n_k; dL/dw_c = (S_c D - n_c T) / D^2,
        # where the k = c terms cancel exactly: (S_c D_{-c} - n_c T_{-c}) / D^2
        if denominator == 0:
            return per_class * 0.0
        counts = np.sum(t.reshape(-1, t.shape[-1]), axis=0)
        other_weights = _sum_except_self(class_weight * counts)
        other_losses = _sum_except_self(class_weight * per_class)
        # each product divided by D first: S_c D_{-c} alone overflows at losses near the
        # float64 range (confident rows at margin 1e305) where dL/dw_c is finite
        return (
            per_class * (other_weights / denominator) - counts * (other_losses / denominator)
        ) / denominator
    per_class = _scale_by_reduction(per_class, reduction, denominator)
    if wrt == "weight" or (wrt == "alpha" and np.ndim(alpha) == 1):
        return per_class
    return np.float64(np.sum(per_class))


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


# ----------------------------------------------------------------------------------------------
# Intermediates: what the parity judge needs to size its error model (spec only)
# ----------------------------------------------------------------------------------------------


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def softmax_cross_entropy_intermediates(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    axis: int = -1,
    weight: ArrayLike | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    where: ArrayLike | None = None,
    reduction: str = "mean",
) -> SoftmaxIntermediates:
    """``softmax_cross_entropy`` before its reduction: a ``SoftmaxIntermediates`` (float64)."""
    _checks.reduction(reduction)
    return _softmax_elements(
        logits, targets, axis, weight, None, 0.0, False, ignore_index, label_smoothing, where
    )


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def softmax_focal_loss_intermediates(
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
) -> SoftmaxIntermediates:
    """``softmax_focal_loss`` before its reduction: a ``SoftmaxIntermediates`` (float64)."""
    _checks.reduction(reduction)
    gamma = _checks.gamma(gamma)
    return _softmax_elements(
        logits, targets, axis, None, alpha, gamma, True, ignore_index, label_smoothing, where
    )


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def sigmoid_cross_entropy_intermediates(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    weight: ArrayLike | None = None,
    pos_weight: ArrayLike | None = None,
    reduction: str = "mean",
) -> SigmoidIntermediates:
    """``sigmoid_cross_entropy`` before its reduction: a ``SigmoidIntermediates`` (float64)."""
    _checks.reduction(reduction)
    x, t, w, q = _sigmoid_inputs(logits, targets, weight, pos_weight)
    loss, grad = _sigmoid_terms(x, t, q)
    return SigmoidIntermediates(w * loss, w * grad, x, t, w, q, None, float(loss.size))


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def sigmoid_focal_loss_intermediates(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    reduction: str = "mean",
) -> SigmoidIntermediates:
    """``sigmoid_focal_loss`` before its reduction: a ``SigmoidIntermediates`` (float64)."""
    _checks.reduction(reduction)
    gamma = _checks.gamma(gamma)
    _checks.focal_alpha(alpha, None)
    x, t, w, q = _sigmoid_inputs(logits, targets, None, None)
    _checks.sigmoid_focal_targets(_as_array(targets))
    terms = _sigmoid_focal_terms(x, t, alpha, gamma)
    return SigmoidIntermediates(terms.loss, terms.grad, x, t, w, q, terms, float(x.size))
