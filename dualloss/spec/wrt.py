"""What ``<name>_grad(..., wrt=...)`` may differentiate, and the rules shared by the gradients
w.r.t. the targets and the options (spec only; the backends derive theirs by autodiff).

The ``*Wrt`` Literal types are the order of ``losses.LossInfo``'s `differentiable` (a test keeps
them equal). Imports NumPy only: no other module of ``dualloss.spec``.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

# ----------------------------------------------------------------------------------------------
# wrt
# ----------------------------------------------------------------------------------------------


# what each ``<name>_grad(..., wrt=...)`` differentiates: the order of ``losses.LossInfo``'s
# `differentiable`, which a test keeps equal to these
SoftmaxCrossEntropyWrt = Literal["logits", "targets", "weight", "label_smoothing"]


SoftmaxFocalLossWrt = Literal["logits", "targets", "gamma", "alpha", "label_smoothing"]


SigmoidCrossEntropyWrt = Literal["logits", "targets", "weight", "pos_weight"]


SigmoidFocalLossWrt = Literal["logits", "targets", "gamma", "alpha"]


# the fused linear losses: the gradients w.r.t. the linear layer's inputs
LinearSoftmaxWrt = Literal["hidden", "linear_weight", "bias"]


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
