"""An mpmath oracle for the four losses, written from the textbook definitions.

Nothing here reuses the spec's formulas: the softmax is exp(z_c) / sum_j exp(z_j), the losses are
the sums of -t log p (and (1 - p)^gamma factors) exactly as the papers and the torch /
torchvision documentation write them, and the gradients are numerical derivatives
(``mpmath.diff``) of those losses. Everything is per element (one row of logits); reductions are
checked in float64 by the other test files.

The working precision is raised with the spread of the logits, so that 1 - p is resolved when p is
within exp(-700) of 1: the results carry about 50 correct significant digits (``DIGITS``), which
``test_oracle_is_stable_under_more_precision`` checks.

Each evaluation also returns the *input-rounding allowance*: for every real input x_i that a
float64 caller can only give to one ULP, |f(x + ulp(x_i) e_i) - f(x)|, summed over i, evaluated
with mpmath, for the value and for every gradient entry. The inputs counted are every finite
logit, every soft target strictly inside (0, 1) (hard 0 / 1 targets are exact labels), and every
real option the caller gave: gamma, alpha, weight, pos_weight, label_smoothing (an option at 0
moves nothing). An implementation cannot be asked to be closer to the exact result than what
rounding its inputs already moves it: e.g. (1 - p)^3.3 computed as exp(3.3 log(1 - p)) carries
the rounding of log(1 - p) amplified by 3.3, exactly as much as rounding gamma moves it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mpmath

DIGITS = 50
# extra digits for the numerical derivatives and the allowance differences
_GUARD = 25

mpf = mpmath.mpf


@dataclass(frozen=True)
class Exact:
    """The exact value and gradient (w.r.t. the logits) of one element, with their allowances."""

    value: mpmath.mpf
    grad: list
    value_allowance: mpmath.mpf
    grad_allowance: list


def _digits_for(values: Sequence[float]) -> int:
    """Working digits: DIGITS beyond the smallest probability exp(-spread) that can show up."""
    finite = [v for v in values if math.isfinite(v)]
    spread = max(finite, default=0.0) - min(finite, default=0.0)
    return DIGITS + _GUARD + int(spread / math.log(10.0)) + 1


def _evaluate(
    loss: Callable[[list, list], mpmath.mpf],
    logits: Sequence[float],
    params: Sequence[float],
    rounded: Sequence[bool],
    digits: int,
) -> Exact:
    """Value, gradient by mpmath.diff, and input-rounding allowances of loss(logits, params).

    `params` are the other real-valued inputs (targets, gamma, alpha, weights, ...); those with
    `rounded` True count as inputs given to one ULP for the allowance, like every finite logit.
    """
    n = len(logits)
    free = [i for i, v in enumerate(logits) if math.isfinite(v)]
    with mpmath.workdps(digits):
        z = [mpf(v) for v in logits]
        q = [mpf(v) for v in params]

        def grad_at(z, q):
            grad = [mpf(0)] * n
            for j in free:

                def along(u, j=j):
                    return loss(z[:j] + [u] + z[j + 1 :], q)

                grad[j] = mpmath.diff(along, z[j])
            return grad

        value = loss(z, q)
        grad = grad_at(z, q)
        value_allowance = mpf(0)
        grad_allowance = [mpf(0)] * n
        perturbed = [(z[:i] + [z[i] + mpf(math.ulp(logits[i]))] + z[i + 1 :], q) for i in free]
        perturbed += [
            (z, q[:i] + [q[i] + mpf(math.ulp(params[i]))] + q[i + 1 :])
            for i in range(len(params))
            if rounded[i]
        ]
        for z_moved, q_moved in perturbed:
            value_allowance += abs(loss(z_moved, q_moved) - value)
            grad_moved = grad_at(z_moved, q_moved)
            grad_allowance = [a + abs(g - h) for a, g, h in zip(grad_allowance, grad_moved, grad)]
    return Exact(value, grad, value_allowance, grad_allowance)


def _target_is_rounded(t: float) -> bool:
    """Soft targets are real inputs given to one ULP; hard 0 / 1 targets are exact labels."""
    return 0.0 < t < 1.0


def _param_is_rounded(x: float | None) -> bool:
    """A real option the caller gave (None: not given); at 0 a one-ULP step moves nothing."""
    return x is not None and x != 0.0


# ----------------------------------------------------------------------------------------------
# Softmax losses: p_c = exp(z_c) / sum_j exp(z_j) over the classes inside `where`
# ----------------------------------------------------------------------------------------------


def _softmax_setup(logits, target, where, label_smoothing, gamma, class_weight):
    """Float inputs of one softmax row: (logits, params, rounded, valid).

    params = targets (C) + [label_smoothing, gamma] + class weights (C: weight or alpha).
    """
    num_classes = len(logits)
    # `where` takes classes out of the softmax and out of the label smoothing; a -inf logit only
    # has p = 0 (with label smoothing its eps / K share of the target makes the loss +inf, as torch)
    valid = [True] * num_classes if where is None else [bool(w) for w in where]
    logits = [float(v) if ok else -math.inf for v, ok in zip(logits, valid)]
    if isinstance(target, int):
        targets = [1.0 if c == target else 0.0 for c in range(num_classes)]
    else:
        targets = [float(tc) for tc in target]
    if class_weight is None:
        weights, weights_rounded = [1.0] * num_classes, False
    elif isinstance(class_weight, (int, float)):
        weights, weights_rounded = [float(class_weight)] * num_classes, True
    else:
        weights, weights_rounded = [float(wc) for wc in class_weight], True
    params = targets + [float(label_smoothing), float(gamma)] + weights
    rounded = [_target_is_rounded(tc) for tc in targets]
    rounded += [_param_is_rounded(label_smoothing), _param_is_rounded(gamma)]
    if weights_rounded and not isinstance(class_weight, (int, float)):
        rounded += [_param_is_rounded(wc) for wc in weights]
    else:
        # a scalar alpha is one input: perturb it once, through the first entry's slot
        rounded += [weights_rounded and _param_is_rounded(weights[0])] + [False] * (num_classes - 1)
    return logits, params, rounded, valid


def _softmax_terms(z, params, valid):
    """p, t~, eps, gamma, class weights of one row, from the textbook definitions."""
    num_classes = len(z)
    t = params[:num_classes]
    eps, gamma = params[num_classes], params[num_classes + 1]
    weights = params[num_classes + 2 :]
    # softmax: p_c = exp(z_c) / sum_j exp(z_j) over the valid classes
    e = [mpmath.exp(zc) if ok else mpf(0) for zc, ok in zip(z, valid)]
    total = mpmath.fsum(e)
    p = [ec / total for ec in e]
    # label smoothing: t~ = (1 - eps) t + eps / K over the K valid classes
    k = sum(valid)
    t = [(1 - eps) * tc + (eps / k if ok else 0) for tc, ok in zip(t, valid)]
    return p, t, gamma, weights


def softmax_focal(
    logits: Sequence[float],
    target: int | Sequence[float],
    *,
    gamma: float,
    alpha: float | Sequence[float] | None = None,
    label_smoothing: float = 0.0,
    where: Sequence[bool] | None = None,
) -> Exact:
    """Focal loss of one row: -sum_c alpha_c t~_c (1 - p_c)^gamma log p_c (Lin et al., eq. 5).

    `target` is a class index or a probability vector. Terms with t~_c alpha_c = 0 are 0
    (0 log 0 = 0), and (1 - p)^0 = 1 also at p = 1. gamma = 0, alpha = None is cross entropy.
    """
    logits, params, rounded, valid = _softmax_setup(
        logits, target, where, label_smoothing, gamma, alpha
    )
    scalar_alpha = isinstance(alpha, (int, float))

    def loss(z, params):
        p, t, g, a = _softmax_terms(z, params, valid)
        if scalar_alpha:
            a = [a[0]] * len(a)
        terms = []
        for ac, tc, pc in zip(a, t, p):
            if ac * tc == 0:
                continue
            modulator = mpf(1) if g == 0 else (1 - pc) ** g
            terms.append(-ac * tc * modulator * mpmath.log(pc))
        return mpmath.fsum(terms)

    return _evaluate(loss, logits, params, rounded, _digits_for(logits))


def softmax_cross_entropy(
    logits: Sequence[float],
    target: int | Sequence[float],
    *,
    weight: Sequence[float] | None = None,
    label_smoothing: float = 0.0,
    where: Sequence[bool] | None = None,
) -> Exact:
    """Cross entropy of one row: -sum_c w_c t~_c log p_c (torch ``F.cross_entropy``, per element).

    The same per-element loss as the focal loss with gamma = 0, alpha = w, but written out on its
    own here so that the two can be checked against each other.
    """
    logits, params, rounded, valid = _softmax_setup(
        logits, target, where, label_smoothing, 0.0, weight
    )

    def loss(z, params):
        p, t, _, w = _softmax_terms(z, params, valid)
        return -mpmath.fsum(wc * tc * mpmath.log(pc) for wc, tc, pc in zip(w, t, p) if tc != 0)

    return _evaluate(loss, logits, params, rounded, _digits_for(logits))


# ----------------------------------------------------------------------------------------------
# Sigmoid losses: p = 1 / (1 + exp(-x))
# ----------------------------------------------------------------------------------------------


def _sigmoid_ce(x, t):
    """-[t log p + (1 - t) log(1 - p)] as its two terms (0 log 0 = 0), p = 1 / (1 + exp(-x))."""
    p = 1 / (1 + mpmath.exp(-x))
    positive = t * mpmath.log(p) if t != 0 else mpf(0)
    negative = (1 - t) * mpmath.log(1 - p) if t != 1 else mpf(0)
    return p, -positive, -negative


def sigmoid_cross_entropy(
    logit: float,
    target: float,
    *,
    weight: float | None = None,
    pos_weight: float | None = None,
) -> Exact:
    """torch ``binary_cross_entropy_with_logits``: -w [q t log p + (1 - t) log(1 - p)]."""
    params = [target, 1.0 if weight is None else weight, 1.0 if pos_weight is None else pos_weight]
    rounded = [_target_is_rounded(target), _param_is_rounded(weight), _param_is_rounded(pos_weight)]

    def loss(x, params):
        t, w, q = params
        _, positive, negative = _sigmoid_ce(x[0], t)
        return w * (q * positive + negative)

    return _evaluate(loss, [logit], params, rounded, _digits_for([logit, 0.0]))


def sigmoid_focal(
    logit: float, target: float, *, gamma: float, alpha: float | None = None
) -> Exact:
    """torchvision ``sigmoid_focal_loss``: alpha_t (1 - p_t)^gamma ce, per element.

    p_t = p t + (1 - p)(1 - t), alpha_t = alpha t + (1 - alpha)(1 - t) (1 when alpha is None),
    ce = -[t log p + (1 - t) log(1 - p)].
    """
    params = [target, gamma, 1.0 if alpha is None else alpha]
    rounded = [_target_is_rounded(target), _param_is_rounded(gamma), _param_is_rounded(alpha)]

    def loss(x, params):
        t, g, a = params
        p, positive, negative = _sigmoid_ce(x[0], t)
        ce = positive + negative
        p_t = p * t + (1 - p) * (1 - t)
        modulator = mpf(1) if g == 0 else (1 - p_t) ** g
        alpha_t = mpf(1) if alpha is None else a * t + (1 - a) * (1 - t)
        return alpha_t * modulator * ce

    return _evaluate(loss, [logit], params, rounded, _digits_for([logit, 0.0]))


# ----------------------------------------------------------------------------------------------
# Comparing float64 results with the oracle
# ----------------------------------------------------------------------------------------------


def ulp_of(exact: mpmath.mpf) -> float:
    """The float64 ULP at the exact value (the spacing of the float64 numbers around it)."""
    return math.ulp(float(exact))


def ulp_error(got: float, exact: mpmath.mpf, allowance: mpmath.mpf = 0) -> tuple[float, float]:
    """(ULPs beyond the allowance, raw ULPs) of a float64 result against the exact value."""
    with mpmath.workdps(DIGITS):
        if math.isnan(got) or math.isinf(got):
            return math.inf, math.inf
        err = abs(mpf(got) - exact)
        unit = ulp_of(exact)
        raw = float(err / unit)
        beyond = float(max(err - allowance, 0) / unit)
    return beyond, raw
