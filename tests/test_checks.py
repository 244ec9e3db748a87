"""Every error path of ``dualloss._checks``, reached through the spec's public functions.

Each message is matched in full (``re.escape``), so the text the three backends share is pinned.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from dualloss import spec

Z = np.zeros((4, 5))
INDEX = np.array([0, 1, 2, 3])
PROB = np.full((4, 5), 0.2)
X = np.zeros((2, 3))
T = np.full((2, 3), 0.5)
SOFTMAX = [spec.softmax_cross_entropy, spec.softmax_focal_loss]
SIGMOID = [spec.sigmoid_cross_entropy, spec.sigmoid_focal_loss]
SOFTMAX_ALL = SOFTMAX + [spec.softmax_cross_entropy_grad, spec.softmax_focal_loss_grad]
SIGMOID_ALL = SIGMOID + [spec.sigmoid_cross_entropy_grad, spec.sigmoid_focal_loss_grad]
FOCAL = [spec.softmax_focal_loss, spec.sigmoid_focal_loss]


def _raises(error, message):
    return pytest.raises(error, match="^" + re.escape(message) + "$")


@pytest.mark.parametrize("fn", SOFTMAX_ALL + SIGMOID_ALL)
@pytest.mark.parametrize("reduction", ["average", "Mean", None])
def test_unknown_reduction_raises(fn, reduction):
    logits, targets = (Z, INDEX) if fn in SOFTMAX_ALL else (X, T)
    message = (
        f"`reduction` must be one of 'none', 'mean', 'sum'. Received: reduction={reduction!r}."
    )
    with _raises(ValueError, message):
        fn(logits, targets, reduction=reduction)


@pytest.mark.parametrize("fn", FOCAL)
@pytest.mark.parametrize("gamma", [-0.5, float("nan"), float("inf")])
def test_negative_or_nan_gamma_raises(fn, gamma):
    logits, targets = (Z, INDEX) if fn is spec.softmax_focal_loss else (X, T)
    with _raises(ValueError, f"`gamma` must be a finite number >= 0. Received: gamma={gamma!r}."):
        fn(logits, targets, gamma=gamma)


@pytest.mark.parametrize("fn", FOCAL)
@pytest.mark.parametrize("gamma", ["2", True])
def test_non_number_gamma_raises(fn, gamma):
    logits, targets = (Z, INDEX) if fn is spec.softmax_focal_loss else (X, T)
    with _raises(TypeError, f"`gamma` must be a real number. Received: gamma={gamma!r}."):
        fn(logits, targets, gamma=gamma)


@pytest.mark.parametrize("fn", FOCAL)
@pytest.mark.parametrize("alpha", [-0.25, 1.5])
def test_scalar_alpha_outside_unit_interval_raises(fn, alpha):
    logits, targets = (Z, INDEX) if fn is spec.softmax_focal_loss else (X, T)
    with _raises(ValueError, f"`alpha` must be in [0, 1]. Received: alpha={alpha!r}."):
        fn(logits, targets, alpha=alpha)


@pytest.mark.parametrize("entry", [-0.1, 1.25, float("nan")])
def test_alpha_vector_entry_outside_unit_interval_raises(entry):
    alpha = np.array([0.1, 0.2, entry, 0.4, 0.5])
    message = f"`alpha` must have every entry in [0, 1]. Received: alpha[2]={entry!r}."
    with _raises(ValueError, message):
        spec.softmax_focal_loss(Z, INDEX, alpha=alpha)


def test_alpha_vector_of_wrong_length_raises():
    message = (
        "`alpha` must be a vector of length 5 (one entry per class). Received: alpha.shape=(3,)."
    )
    with _raises(ValueError, message):
        spec.softmax_focal_loss(Z, INDEX, alpha=np.ones(3) / 2)


def test_sigmoid_focal_vector_alpha_raises():
    message = "`alpha` must be None or a number in [0, 1]. Received: alpha=[0.25, 0.75]."
    with _raises(TypeError, message):
        spec.sigmoid_focal_loss(X, T, alpha=[0.25, 0.75])


@pytest.mark.parametrize("fn", SOFTMAX)
@pytest.mark.parametrize("label_smoothing", [-0.1, 1.1, float("nan")])
def test_label_smoothing_outside_unit_interval_raises(fn, label_smoothing):
    message = f"`label_smoothing` must be in [0, 1]. Received: label_smoothing={label_smoothing!r}."
    with _raises(ValueError, message):
        fn(Z, INDEX, label_smoothing=label_smoothing)


@pytest.mark.parametrize("fn", SOFTMAX)
def test_non_integer_ignore_index_raises(fn):
    with _raises(TypeError, "`ignore_index` must be an integer. Received: ignore_index=-1.5."):
        fn(Z, INDEX, ignore_index=-1.5)


@pytest.mark.parametrize("fn", SOFTMAX_ALL + SIGMOID_ALL)
@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_non_float_logits_raise(fn, dtype):
    logits, targets = (Z, INDEX) if fn in SOFTMAX_ALL else (X, T)
    message = f"`logits` must have a floating dtype. Received: logits.dtype={np.dtype(dtype)}."
    with _raises(TypeError, message):
        fn(logits.astype(dtype), targets)


@pytest.mark.parametrize("fn", SOFTMAX_ALL)
@pytest.mark.parametrize("axis", [2, -3])
def test_axis_out_of_range_raises(fn, axis):
    message = f"`axis` must be in [-2, 2) for logits with 2 dimensions. Received: axis={axis}."
    with _raises(ValueError, message):
        fn(Z, INDEX, axis=axis)


@pytest.mark.parametrize("fn", SOFTMAX)
def test_non_integer_axis_raises(fn):
    with _raises(TypeError, "`axis` must be an integer. Received: axis=1.0."):
        fn(Z, INDEX, axis=1.0)


@pytest.mark.parametrize("fn", SOFTMAX)
def test_zero_dimensional_logits_raise(fn):
    message = (
        "`logits` must have at least one dimension (the class axis). Received: logits.shape=()."
    )
    with _raises(ValueError, message):
        fn(np.float64(1.0), np.int64(0))


@pytest.mark.parametrize("fn", SOFTMAX_ALL)
def test_index_targets_of_wrong_shape_raise(fn):
    message = (
        "`targets` of class indices must have shape (4,), the logits shape (4, 5) without "
        "axis 1. Received: targets.shape=(5,)."
    )
    with _raises(ValueError, message):
        fn(Z, np.arange(5))


@pytest.mark.parametrize("fn", SOFTMAX_ALL)
def test_probability_targets_of_wrong_shape_raise(fn):
    message = (
        "`targets` of class probabilities must have the logits shape (4, 5). "
        "Received: targets.shape=(4, 4)."
    )
    with _raises(ValueError, message):
        fn(Z, np.full((4, 4), 0.25))


@pytest.mark.parametrize("fn", SOFTMAX_ALL)
def test_bool_targets_raise(fn):
    message = (
        "`targets` must hold integer class indices or floating class probabilities. "
        "Received: targets.dtype=bool."
    )
    with _raises(TypeError, message):
        fn(Z, np.ones(4, dtype=bool))


@pytest.mark.parametrize("fn", SOFTMAX_ALL)
def test_out_of_range_class_index_raises(fn):
    message = (
        "`targets` has class index 7 at position (3,), outside [0, 5) and not ignore_index=-100."
    )
    with _raises(ValueError, message):
        fn(Z, np.array([0, 1, -100, 7]))


@pytest.mark.parametrize("fn", SOFTMAX)
def test_negative_class_index_other_than_ignore_index_raises(fn):
    message = (
        "`targets` has class index -100 at position (1, 0), outside [0, 5) and not ignore_index=-1."
    )
    with _raises(ValueError, message):
        fn(np.zeros((2, 1, 5)), np.array([[-1], [-100]]), ignore_index=-1)


@pytest.mark.parametrize("length", [4, 6])
def test_weight_of_wrong_length_raises(length):
    message = (
        f"`weight` must be a vector of length 5 (one entry per class). "
        f"Received: weight.shape=({length},)."
    )
    with _raises(ValueError, message):
        spec.softmax_cross_entropy(Z, INDEX, weight=np.ones(length))


@pytest.mark.parametrize("fn", SOFTMAX)
def test_non_bool_where_raises(fn):
    with _raises(TypeError, "`where` must be a boolean mask. Received: where.dtype=int64."):
        fn(Z, INDEX, where=np.ones(5, dtype=np.int64))


@pytest.mark.parametrize("fn", SOFTMAX)
@pytest.mark.parametrize("shape", [(3,), (3, 5), (2, 4, 5)])
def test_where_not_broadcastable_to_logits_raises(fn, shape):
    message = f"`where` must broadcast to the logits shape (4, 5). Received: where.shape={shape}."
    with _raises(ValueError, message):
        fn(Z, INDEX, where=np.ones(shape, dtype=bool))


@pytest.mark.parametrize("fn", SIGMOID_ALL)
@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_sigmoid_non_float_targets_raise(fn, dtype):
    message = (
        "`targets` must have a floating dtype (probabilities in [0, 1]). "
        f"Received: targets.dtype={np.dtype(dtype)}."
    )
    with _raises(TypeError, message):
        fn(X, T.astype(dtype))


@pytest.mark.parametrize("fn", SIGMOID_ALL)
@pytest.mark.parametrize("shape", [(3,), (2, 1), (1, 2, 3)])
def test_sigmoid_targets_of_wrong_shape_raise(fn, shape):
    message = f"`targets` must have the logits shape (2, 3). Received: targets.shape={shape}."
    with _raises(ValueError, message):
        fn(X, np.full(shape, 0.5))


@pytest.mark.parametrize("name", ["weight", "pos_weight"])
@pytest.mark.parametrize("shape", [(2,), (3, 3), (1, 2, 3)])
def test_sigmoid_weights_not_broadcastable_raise(name, shape):
    message = f"`{name}` must broadcast to the logits shape (2, 3). Received: {name}.shape={shape}."
    with _raises(ValueError, message):
        spec.sigmoid_cross_entropy(X, T, **{name: np.ones(shape)})
    with _raises(ValueError, message):
        spec.sigmoid_cross_entropy_grad(X, T, **{name: np.ones(shape)})


@pytest.mark.parametrize("fn", SOFTMAX)
def test_valid_edge_values_do_not_raise(fn):
    """The boundaries are inside: gamma 0, alpha/eps 0 and 1, ignore_index inside [0, C)."""
    kwargs = dict(label_smoothing=1.0, ignore_index=3)
    if fn is spec.softmax_focal_loss:
        kwargs.update(gamma=0.0, alpha=np.array([0.0, 1.0, 0.5, 0.5, 0.5]))
    assert np.isfinite(fn(Z, INDEX, **kwargs))
    assert np.isfinite(spec.sigmoid_focal_loss(X, T, gamma=0.0, alpha=1.0))
