"""The softmax losses of the spec: ``softmax_cross_entropy``, ``softmax_focal_loss`` and their
``_grad`` (w.r.t. the logits in the core, w.r.t. targets and options in ``_softmax_input_grad``).

Sections as in ``torch_impl.softmax`` and ``jax_impl.softmax``: the core (log-softmax with the
runner-up rescaling, the focal phi, the terms), the reductions, the public functions. May import
``_inputs`` and ``wrt``; never ``sigmoid``, ``linear`` or ``intermediates``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _checks
from ._inputs import ArrayLike, _as_array, _normalize, _normalizer, _reduce, _softmax_inputs
from .wrt import (
    SoftmaxCrossEntropyWrt,
    SoftmaxFocalLossWrt,
    _check_wrt,
    _needs_option,
    _scale_by_reduction,
    _times_mass,
)

# ----------------------------------------------------------------------------------------------
# Softmax core
# ----------------------------------------------------------------------------------------------


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
    # the log-partition logsumexp(c) per element and the z-loss term z_loss * lse**2 (0 without)
    lse: np.ndarray | None = None
    z_term: np.ndarray | None = None


class SoftmaxIntermediates(NamedTuple):
    """``softmax_intermediates``: a softmax loss before its reduction (class axis last).

    `terms` as ``SoftmaxTerms`` with ignored elements and masked classes already zeroed in
    `terms.loss` / `terms.grad`; `z` the logits with masked classes at -inf, `a` the target mass
    class_weight * t~, `keep` the non-ignored elements, `valid` the classes inside `where`,
    `denominator` the divisor of reduction 'mean' (torch semantics, 0 when nothing is kept),
    `axis` the class axis of the input layout. With `softcap`, `z` holds the capped logits
    c = softcap tanh(logits / softcap), `logits` the logits before the cap, `dcap` dc/dz =
    sech^2(logits / softcap) and `capped_grad` the gradient w.r.t. c (`terms.grad` is w.r.t. the
    logits); `z_loss` the z-loss weight.
    """

    terms: SoftmaxTerms
    z: np.ndarray
    a: np.ndarray
    keep: np.ndarray
    valid: np.ndarray
    denominator: float
    axis: int
    logits: np.ndarray | None = None
    dcap: np.ndarray | None = None
    capped_grad: np.ndarray | None = None
    z_loss: float = 0.0
    softcap: float | None = None
    # whether the largest logit is the target class (``return_aux``), False where not kept
    correct: np.ndarray | None = None


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


def _softcap(z, softcap):
    """The soft-capped logits, for the class axis last: (c, shifted, c_top, dcap) with
    c = softcap tanh(z / softcap), shifted = c - c_top (c_top the row's largest c) and
    dc/dz = sech^2(z / softcap), each rounded once to float64 from extended precision.

    The softmax of the capped logits needs c_k - c_top to the absolute accuracy of an exact
    input's difference: p of a far class is exp(c_k - c_top), and one float64 ULP of c ~ 700
    is 250 ULPs of it. A float64 tanh times the cap carries 1-2 ULPs of c, which no input
    rounding explains when the cap is large (c ~ z); so the quotient, tanh, product and
    difference are formed in np.longdouble (64 significant bits on x86-64, 113 where it is
    quad) and the difference rounded once. sech^2 x = 4 e / (1 + e)^2, e = exp(-2 |x|): no
    overflow, no 1 - tanh^2 cancellation, and the quotient's rounding (which sech^2 ~ 4 e^-2|x|
    would amplify 2 |x| times) is 2^11 times smaller than in float64.
    Infinite logits keep their meaning: -inf a masked class, +inf a NaN row (DESIGN 5).
    """
    finite = np.isfinite(z)
    x = np.where(finite, z, 0.0).astype(np.longdouble) / np.longdouble(softcap)
    c = np.where(finite, np.longdouble(softcap) * np.tanh(x), z.astype(np.longdouble))
    c_top = np.max(c, axis=-1, keepdims=True)
    shifted = (c - c_top).astype(np.float64)
    e = np.exp(-2.0 * np.abs(x))
    dcap = (4.0 * e / ((1.0 + e) * (1.0 + e))).astype(np.float64)
    return c.astype(np.float64), shifted, c_top.astype(np.float64), np.where(finite, dcap, 0.0)


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


def _softmax_focal_terms(z, a, gamma, z_loss=0.0, z_offset=None):
    """Per-element loss -sum_c a_c (1 - p_c)^gamma log p_c + z_loss lse**2 and its gradient
    (class axis last), lse = logsumexp(z) = z_top + log1p(s).

    With gamma = 0 this is the (weighted) softmax cross entropy -sum_c a_c log p_c.
    The gradient is p_j sum_{c != j} v_c - (1 - p_j) v_j, the same as p * sum(v) - v but free of
    the cancellation p_j - 1 when p_j is close to 1, plus the z-loss's 2 z_loss lse p_j.
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
    # logsumexp(z) = z_top + log1p(s): the top's 1 apart, so a confident row keeps its digits
    lse = np.max(z, axis=-1) + log1p_s[..., 0]
    if z_offset is not None:
        # `z` was shifted by z_offset (the capped logits' c - c_top): lse = c_top + log1p(s)
        lse = z_offset[..., 0] + log1p_s[..., 0]
    z_term = np.zeros_like(loss)
    if z_loss != 0.0:
        # z-loss: z_loss lse^2, d/dz_j = 2 z_loss lse p_j
        z_term = z_loss * lse * lse
        loss = loss + z_term
        grad = grad + (2.0 * z_loss) * lse[..., None] * p
    return SoftmaxTerms(loss, grad, log_p, log_not_p, p, focal_weight, v, lse, z_term)


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------


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
    z_loss=0.0,
    softcap=None,
):
    reduction = _checks.reduction(reduction)
    if is_focal:
        gamma = _checks.gamma(gamma)
        weight, alpha = None, class_weight_arg
    else:
        weight, alpha = class_weight_arg, None
    elements = _softmax_elements(
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
        z_loss,
        softcap,
    )
    loss, grad = _reduce(elements.terms.loss, elements.terms.grad, reduction, elements.denominator)
    return loss, np.moveaxis(grad, -1, elements.axis)


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _softmax_elements(
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
    z_loss=0.0,
    softcap=None,
):
    """The per-element half of ``_softmax``: a ``SoftmaxIntermediates``."""
    z_loss = _checks.z_loss(z_loss)
    softcap = _checks.softcap(softcap)
    raw, t, keep, valid, is_index, class_weight, axis = _softmax_inputs(
        logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where
    )
    # soft-capping: c = softcap tanh(z / softcap), dc/dz = sech^2(z / softcap) (chain rule below)
    a = class_weight * t
    if softcap is None:
        z, dcap = raw, None
        terms = _softmax_focal_terms(z, a, gamma, z_loss)
    else:
        # the terms of c - c_top (rounded once from extended precision); `z` keeps c itself
        z, shifted, c_top, dcap = _softcap(raw, softcap)
        terms = _softmax_focal_terms(shifted, a, gamma, z_loss, c_top)
    capped_grad = terms.grad
    if dcap is not None:
        terms = terms._replace(grad=terms.grad * dcap)
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
    terms = terms._replace(
        loss=loss,
        grad=grad,
        lse=np.where(keep, terms.lse, 0.0),
        z_term=np.where(keep, terms.z_term, 0.0),
    )
    capped_grad = np.where(keep[..., None] & valid, capped_grad, 0.0)
    # ``return_aux``: the largest logit (the first on ties) on the target class; for probability
    # targets the class of the largest target mass (smoothing keeps it)
    top_class = np.argmax(raw, axis=-1)
    if is_index:
        target_class = np.where(keep, _as_array(targets), 0)
    else:
        target_class = np.argmax(t, axis=-1)
    correct = keep & (top_class == target_class)
    return SoftmaxIntermediates(
        terms,
        z,
        a,
        keep,
        valid,
        float(denominator),
        axis,
        raw if dcap is not None else None,
        dcap,
        capped_grad,
        z_loss,
        softcap,
        correct,
    )


def _softmax_aux(elements, reduction, normalizer):
    """``return_aux``'s statistics: {'lse', 'z_term', 'correct'} per element for reduction 'none'
    (0 where not kept), summed over the kept elements for 'sum', and for 'mean' that sum over
    the number of kept elements (so 'correct' is the token accuracy; 0 when none is kept) or
    over `normalizer` when given."""
    terms = elements.terms
    stats = {
        "lse": terms.lse,
        "z_term": terms.z_term,
        "correct": elements.correct.astype(np.float64),
    }
    if reduction == "none":
        return stats
    sums = {key: np.sum(value) for key, value in stats.items()}
    if normalizer is not None:
        return {key: _normalize(value, normalizer) for key, value in sums.items()}
    if reduction == "sum":
        return sums
    count = np.sum(elements.keep)
    return {key: value / count if count else np.float64(0.0) for key, value in sums.items()}


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
) -> np.ndarray | tuple[np.ndarray, dict]:
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
      normalizer: optional divisor that replaces the mean's: a number or a 0-d array >= 0,
        typically the count of kept targets (or the sum of their weights) over the whole global
        batch, every micro-batch and rank (``jax_impl.global_count``, ``torch_impl.global_count``).
        The loss is then the reduction='sum' loss divided by it (0 for a normalizer of 0), so that
        micro-batch losses summed give the one-batch mean exactly. A constant: it takes no
        gradient. It needs reduction='mean' (the default); 'none' and 'sum' with a normalizer
        raise.
      z_loss: weight >= 0 of the z-loss (PaLM; t5x's ``z_loss``): each kept element adds
        z_loss * logsumexp(c)**2, unweighted by `weight`, which keeps the log-partition near 0.
        Its gradient is 2 z_loss lse p_j.
      softcap: None, or a number > 0: the logits are soft-capped first (Gemma 2),
        c = softcap * tanh(logits / softcap), and the loss (with its z-term) is taken of c; the
        gradient carries dc/dz = sech^2(logits / softcap). Infinite logits keep their meaning
        (-inf a masked class, +inf a NaN element), as without the cap.
      return_aux: also return the per-element statistics trainers log, from the same pass:
        (loss, {'lse': logsumexp(c), 'z_term': z_loss lse**2, 'correct': 1.0 where the largest
        logit (the first on ties) is the target class, for probability targets the class of the
        largest target}), 0 where not kept; reduced as `reduction` says: per element for
        'none', summed over the kept elements for 'sum', that sum over their number for 'mean'
        (so 'correct' is the token accuracy, whatever the weights) or over `normalizer`.
        No gradient flows through them.

    Returns:
      float64 array of the logits shape without `axis` for 'none', a float64 scalar otherwise;
      with `return_aux`, (loss, aux).

    Example:
      >>> round(float(softmax_cross_entropy(np.array([[2.0, 0.0, -1.0]]), np.array([0]))), 6)
      0.169846

    References:
      torch.nn.functional.cross_entropy; Szegedy et al., "Rethinking the Inception Architecture"
      (label smoothing), https://arxiv.org/abs/1512.00567
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    loss, _ = _softmax(
        logits,
        targets,
        axis,
        weight,
        0.0,
        False,
        ignore_index,
        label_smoothing,
        where,
        reduction,
        z_loss,
        softcap,
    )
    if _checks.return_aux(return_aux):
        elements = _softmax_elements(
            logits, targets, axis, weight, None, 0.0, False, ignore_index, label_smoothing,
            where, z_loss, softcap,
        )  # fmt: skip
        return _normalize(loss, normalizer), _softmax_aux(elements, reduction, normalizer)
    return _normalize(loss, normalizer)


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
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    wrt: SoftmaxCrossEntropyWrt = "logits",
) -> np.ndarray:
    """Gradient of ``softmax_cross_entropy`` (reduced as `reduction` says) w.r.t. `wrt`.

    The gradient of the reduced loss; for reduction 'none', of the sum of the per-element
    losses. With g_c = -log p_c (+inf on a masked class) and t~ = (1 - eps) t + eps u, u the
    uniform distribution over the classes inside `where`:

    * 'logits': dl/dz = p * sum_c v_c - v, v = w * t~; masked classes and ignored elements get 0.
      With `z_loss` plus 2 z_loss lse p; with `softcap` the whole times sech^2(z / softcap) (and
      p, g_c below are those of the capped logits).
    * 'targets' (probability targets only): dl/dt_c = (1 - eps) w_c g_c. A class with no
      probability (a -inf logit or outside `where`) gets +inf: its loss term -t_c log 0 is 0 at
      t_c = 0 and +inf for any t_c > 0 (the one-sided derivative is +inf, the true value);
      0 where (1 - eps) w_c = 0, as the loss does not depend on t_c there.
    * 'weight' (needs `weight`): dL/dw_c = sum_i t~_ic g_ic (divided by N for 'mean' with
      probability targets). 'mean' with class indices divides by D = sum_i w_{y_i} over the kept
      targets, which depends on w (quotient rule): with S_c = sum_i t~_ic g_ic, n_c the kept
      targets of class c, dL/dw_c = (S_c D_{-c} - n_c (T_{-c} + Z)) / D^2, D_{-c} = sum_{k != c}
      w_k n_k, T_{-c} = sum_{k != c} w_k S_k (the k = c terms cancel exactly and are left out),
      Z = sum_i z_loss lse_i^2 the z-terms of the kept targets (unweighted, divided by D too).
    * 'label_smoothing': dl/deps = sum_c w_c (u_c - t_c) g_c (a scalar).

    Terms whose coefficient is 0 are 0 (0 log 0 = 0); a NaN or +inf logit gives NaN in its
    element's terms, an ignored element gives 0. Float64, shaped like the argument `wrt` names
    (a NumPy float64 scalar for 'label_smoothing').

    Raises:
      ValueError: `wrt` is not one of the names above; 'targets' with class-index targets;
        'weight' with `weight` None.
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    _check_wrt(wrt, SoftmaxCrossEntropyWrt, "softmax_cross_entropy_grad")
    if wrt != "logits":
        return _normalize(
            _softmax_input_grad(
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
                z_loss,
                softcap,
            ),
            normalizer,
        )
    _, grad = _softmax(
        logits,
        targets,
        axis,
        weight,
        0.0,
        False,
        ignore_index,
        label_smoothing,
        where,
        reduction,
        z_loss,
        softcap,
    )
    return _normalize(grad, normalizer)


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
) -> np.ndarray | tuple[np.ndarray, dict]:
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
      normalizer: as ``softmax_cross_entropy``: 'mean' divides the sum by it instead.
      z_loss, softcap: as ``softmax_cross_entropy``: l = focal(c) + z_loss logsumexp(c)**2 with
        c = softcap tanh(logits / softcap) (c = logits without a cap).
      return_aux: as ``softmax_cross_entropy``: (loss, {'lse', 'z_term', 'correct'}).

    Returns:
      float64 array of the logits shape without `axis` for 'none', a float64 scalar otherwise.

    Example:
      >>> round(float(softmax_focal_loss(np.array([[2.0, 0.0, -1.0]]), np.array([0]))), 6)
      0.004144

    References:
      Lin et al., "Focal Loss for Dense Object Detection", https://arxiv.org/abs/1708.02002
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    loss, _ = _softmax(
        logits,
        targets,
        axis,
        alpha,
        gamma,
        True,
        ignore_index,
        label_smoothing,
        where,
        reduction,
        z_loss,
        softcap,
    )
    if _checks.return_aux(return_aux):
        elements = _softmax_elements(
            logits, targets, axis, None, alpha, gamma, True, ignore_index, label_smoothing,
            where, z_loss, softcap,
        )  # fmt: skip
        return _normalize(loss, normalizer), _softmax_aux(elements, reduction, normalizer)
    return _normalize(loss, normalizer)


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
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
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
    reduction, normalizer = _normalizer(reduction, normalizer)
    _check_wrt(wrt, SoftmaxFocalLossWrt, "softmax_focal_loss_grad")
    if wrt != "logits":
        return _normalize(
            _softmax_input_grad(
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
                z_loss,
                softcap,
            ),
            normalizer,
        )
    _, grad = _softmax(
        logits,
        targets,
        axis,
        alpha,
        gamma,
        True,
        ignore_index,
        label_smoothing,
        where,
        reduction,
        z_loss,
        softcap,
    )
    return _normalize(grad, normalizer)


# ----------------------------------------------------------------------------------------------
# Gradients w.r.t. the targets and the options
# ----------------------------------------------------------------------------------------------


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
    z_loss=0.0,
    softcap=None,
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
        z_loss,
        softcap,
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
        # L = T / D with T = sum_k w_k S_k + Z, D = sum_k w_k n_k, Z = sum_i z_loss lse_i^2 over
        # the kept elements (unweighted, yet divided by D); dL/dw_c = (S_c D - n_c T) / D^2,
        # where the k = c terms cancel exactly: (S_c D_{-c} - n_c (T_{-c} + Z)) / D^2
        if denominator == 0:
            return per_class * 0.0
        counts = np.sum(t.reshape(-1, t.shape[-1]), axis=0)
        other_weights = _sum_except_self(class_weight * counts)
        other_losses = _sum_except_self(class_weight * per_class)
        if terms.z_term is not None:
            other_losses = other_losses + np.sum(np.where(keep, terms.z_term, 0.0))
        # each product divided by D first: S_c D_{-c} alone overflows at losses near the
        # float64 range (confident rows at margin 1e305) where dL/dw_c is finite
        return (
            per_class * (other_weights / denominator) - counts * (other_losses / denominator)
        ) / denominator
    per_class = _scale_by_reduction(per_class, reduction, denominator)
    if wrt == "weight" or (wrt == "alpha" and np.ndim(alpha) == 1):
        return per_class
    return np.float64(np.sum(per_class))
