"""What the parity judge needs to size its error model (spec only): ``<name>_intermediates``,
the unreduced loss and gradient plus the terms the strict tolerance uses.

The top of the spec: may import every other module of ``dualloss.spec``; none imports it.
"""

from __future__ import annotations

import numpy as np

from .. import _checks
from ._inputs import ArrayLike, _as_array, _sigmoid_inputs
from .sigmoid import SigmoidIntermediates, _sigmoid_focal_terms, _sigmoid_terms
from .softmax import SoftmaxIntermediates, _softmax_elements


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
    z_loss: float = 0.0,
    softcap: float | None = None,
) -> SoftmaxIntermediates:
    """``softmax_cross_entropy`` before its reduction: a ``SoftmaxIntermediates`` (float64)."""
    _checks.reduction(reduction)
    return _softmax_elements(
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
        z_loss,
        softcap,
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
    z_loss: float = 0.0,
    softcap: float | None = None,
) -> SoftmaxIntermediates:
    """``softmax_focal_loss`` before its reduction: a ``SoftmaxIntermediates`` (float64)."""
    _checks.reduction(reduction)
    gamma = _checks.gamma(gamma)
    return _softmax_elements(
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
        z_loss,
        softcap,
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
