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

With `wrt` (one of 'targets', 'weight', 'alpha', 'gamma', 'label_smoothing', 'pos_weight') an
evaluation also returns the derivative of the element's loss w.r.t. that input, with its
allowance (``Exact.wrt_grad``, ``Exact.wrt_allowance``, entries flattened). The softmax losses
are linear in t~ and in the class weights, so their derivatives are the textbook closed forms
(``_softmax_derivative``: the coefficient of each input times -(1 - p_c)^gamma log p_c, and
-(1 - p_c)^gamma log(1 - p_c) log p_c for gamma), written here from the definitions, at 50
digits, with +inf for mass put on a class of probability 0 (the loss jumps from 0 to +inf) and
0 for a class of zero coefficient; ``test_spec_grad_accuracy`` checks them against
``mpmath.diff``. The sigmoid derivatives are ``mpmath.diff`` of the textbook losses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
    # the derivative w.r.t. `wrt` (flattened) and its allowance, when asked for
    wrt_grad: list = field(default_factory=list)
    wrt_allowance: list = field(default_factory=list)


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
    derivative: Callable[[list, list], list] | None = None,
    logit_grad: bool = True,
) -> Exact:
    """Value, gradient by mpmath.diff, and input-rounding allowances of loss(logits, params).

    `params` are the other real-valued inputs (targets, gamma, alpha, weights, ...); those with
    `rounded` True count as inputs given to one ULP for the allowance, like every finite logit.
    `derivative(z, params)`, if given, is a list of derivatives w.r.t. some input, returned with
    its allowance as ``wrt_grad``; `logit_grad` False skips the logit gradient (left empty).
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

        if not logit_grad:

            def grad_at(z, q):
                return []

        if derivative is None:

            def derivative(z, q):
                return []

        value = loss(z, q)
        grad = grad_at(z, q)
        wrt_grad = derivative(z, q)
        value_allowance = mpf(0)
        grad_allowance = [mpf(0)] * len(grad)
        wrt_allowance = [mpf(0)] * len(wrt_grad)
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
            moved = derivative(z_moved, q_moved)
            wrt_allowance = [a + _moved_by(g, h) for a, g, h in zip(wrt_allowance, moved, wrt_grad)]
    return Exact(value, grad, value_allowance, grad_allowance, wrt_grad, wrt_allowance)


def _moved_by(moved, base):
    """|moved - base|, 0 where an infinite derivative stays the same infinity."""
    if mpmath.isinf(base) and moved == base:
        return mpf(0)
    return abs(moved - base)


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


def _softmax_derivative(wrt, valid, scalar_weight):
    """derivative(z, params): the derivative of one row's loss w.r.t. `wrt`, closed form.

    l = sum_c w_c t~_c h_c, h_c = -(1 - p_c)^gamma log p_c, t~_c = (1 - eps) t_c + eps u_c,
    u_c = 1/K on the K valid classes: linear in t, w and eps, so
      dl/dt_c = (1 - eps) w_c h_c,  dl/dw_c = t~_c h_c (summed over c for a scalar alpha),
      dl/deps = sum_c w_c (u_c - t_c) h_c,
      dl/dgamma = -sum_c w_c t~_c (1 - p_c)^gamma log(1 - p_c) log p_c.
    A zero coefficient gives 0 (0 log 0 = 0, no dependence); a nonzero one on p_c = 0 gives
    +inf (the loss jumps to +inf); p_c = 1 gives log p_c = 0, a term of 0 for every gamma.
    """

    def derivative(z, params):
        num_classes = len(z)
        p, t_smooth, g, w = _softmax_terms(z, params, valid)
        if scalar_weight:
            w = [w[0]] * num_classes
        t = params[:num_classes]
        eps = params[num_classes]
        k = sum(valid)
        u = [mpf(1) / k if ok else mpf(0) for ok in valid]

        def modulator(c):
            return mpf(1) if g == 0 else (1 - p[c]) ** g

        def term(coefficient, c):
            if coefficient == 0:
                return mpf(0)
            if p[c] == 0:
                return mpmath.inf * mpmath.sign(coefficient)
            return -coefficient * modulator(c) * mpmath.log(p[c])

        classes = range(num_classes)
        if wrt == "targets":
            return [term((1 - eps) * w[c], c) for c in classes]
        if wrt in ("weight", "alpha"):
            per_class = [term(t_smooth[c], c) for c in classes]
            return [mpmath.fsum(per_class)] if scalar_weight else per_class
        if wrt == "label_smoothing":
            return [mpmath.fsum(term(w[c] * (u[c] - t[c]), c) for c in classes)]
        if wrt == "label_smoothing_terms":
            # the terms of the sum above, one per class (their size judges a sum's rounding)
            return [term(w[c] * (u[c] - t[c]), c) for c in classes]
        if wrt == "gamma":
            return [
                -mpmath.fsum(
                    w[c] * t_smooth[c] * modulator(c) * mpmath.log(1 - p[c]) * mpmath.log(p[c])
                    for c in classes
                    if w[c] * t_smooth[c] != 0 and p[c] != 1
                )
            ]
        raise ValueError(f"no softmax derivative w.r.t. {wrt!r}")

    return derivative


def softmax_focal(
    logits: Sequence[float],
    target: int | Sequence[float],
    *,
    gamma: float,
    alpha: float | Sequence[float] | None = None,
    label_smoothing: float = 0.0,
    where: Sequence[bool] | None = None,
    wrt: str | None = None,
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

    if wrt is None:
        return _evaluate(loss, logits, params, rounded, _digits_for(logits))
    derivative = _softmax_derivative(wrt, valid, scalar_alpha)
    return _evaluate(
        loss, logits, params, rounded, _digits_for(logits), derivative, logit_grad=False
    )


def softmax_cross_entropy(
    logits: Sequence[float],
    target: int | Sequence[float],
    *,
    weight: Sequence[float] | None = None,
    label_smoothing: float = 0.0,
    where: Sequence[bool] | None = None,
    wrt: str | None = None,
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

    if wrt is None:
        return _evaluate(loss, logits, params, rounded, _digits_for(logits))
    derivative = _softmax_derivative(wrt, valid, False)
    return _evaluate(
        loss, logits, params, rounded, _digits_for(logits), derivative, logit_grad=False
    )


# ----------------------------------------------------------------------------------------------
# Sigmoid losses: p = 1 / (1 + exp(-x))
# ----------------------------------------------------------------------------------------------


def _param_diff(loss, index):
    """derivative(z, params): [d loss / d params[index]] by mpmath.diff."""

    def derivative(z, params):
        def along(v):
            return loss(z, params[:index] + [v] + params[index + 1 :])

        return [mpmath.diff(along, params[index])]

    return derivative


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
    wrt: str | None = None,
) -> Exact:
    """torch ``binary_cross_entropy_with_logits``: -w [q t log p + (1 - t) log(1 - p)].

    `wrt`: 'targets', 'weight' or 'pos_weight' adds that derivative (``mpmath.diff``).
    """
    params = [target, 1.0 if weight is None else weight, 1.0 if pos_weight is None else pos_weight]
    rounded = [_target_is_rounded(target), _param_is_rounded(weight), _param_is_rounded(pos_weight)]

    def loss(x, params):
        t, w, q = params
        _, positive, negative = _sigmoid_ce(x[0], t)
        return w * (q * positive + negative)

    digits = _digits_for([logit, 0.0])
    if wrt is None:
        return _evaluate(loss, [logit], params, rounded, digits)
    derivative = _param_diff(loss, ["targets", "weight", "pos_weight"].index(wrt))
    return _evaluate(loss, [logit], params, rounded, digits, derivative, logit_grad=False)


def sigmoid_focal(
    logit: float,
    target: float,
    *,
    gamma: float,
    alpha: float | None = None,
    wrt: str | None = None,
) -> Exact:
    """torchvision ``sigmoid_focal_loss``: alpha_t (1 - p_t)^gamma ce, per element.

    p_t = p t + (1 - p)(1 - t), alpha_t = alpha t + (1 - alpha)(1 - t) (1 when alpha is None),
    ce = -[t log p + (1 - t) log(1 - p)]. `wrt`: 'targets', 'gamma' or 'alpha' adds that
    derivative (``mpmath.diff``; the loss is smooth in t, gamma and alpha for finite logits).
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

    digits = _digits_for([logit, 0.0])
    if wrt is None:
        return _evaluate(loss, [logit], params, rounded, digits)
    derivative = _param_diff(loss, ["targets", "gamma", "alpha"].index(wrt))
    return _evaluate(loss, [logit], params, rounded, digits, derivative, logit_grad=False)


# ----------------------------------------------------------------------------------------------
# Comparing float64 results with the oracle
# ----------------------------------------------------------------------------------------------


def ulp_of(exact: mpmath.mpf) -> float:
    """The float64 ULP at the exact value (the spacing of the float64 numbers around it)."""
    return math.ulp(float(exact))


def ulp_error(got: float, exact: mpmath.mpf, allowance: mpmath.mpf = 0) -> tuple[float, float]:
    """(ULPs beyond the allowance, raw ULPs) of a float64 result against the exact value."""
    with mpmath.workdps(DIGITS):
        if mpmath.isinf(exact) and got == exact:
            # the same infinity: +inf where the math is +inf is exact
            return 0.0, 0.0
        if math.isnan(got) or math.isinf(got):
            return math.inf, math.inf
        err = abs(mpf(got) - exact)
        unit = ulp_of(exact)
        raw = float(err / unit)
        beyond = float(max(err - allowance, 0) / unit)
    return beyond, raw
