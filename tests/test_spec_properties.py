"""Properties of the spec that hold for every input: hypothesis, deterministic CI profile.

Tolerances. Central finite differences with step h = 1e-6 (logits in [-20, 20], see
strategies.LOGIT_BOUND) have a truncation error h^2 |f'''| / 6 < 1e-10 and a rounding error
about 1e-16 |f| / h = 1e-10 |f|, so they are compared with the closed-form gradient to
FD_RTOL * (1 + |f|). Identities that only reorder float64 operations (shift, axis moves) are
compared to a few ULPs, IDENTITY_RTOL; identities that run the very same operations are exact.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import strategies
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dualloss import losses, spec

FD_STEP = 1e-6
FD_RTOL = 1e-7
IDENTITY_RTOL = 1e-12
SOFTMAX_LOSSES = [info.name for info in losses.of_family("softmax")]
SIGMOID_LOSSES = [info.name for info in losses.of_family("sigmoid")]


def _value_and_grad(name, logits, targets, **kwargs):
    value = getattr(spec, name)(logits, targets, **kwargs)
    grad = getattr(spec, name + "_grad")(logits, targets, **kwargs)
    return value, grad


def _central_differences(f, x):
    """d sum(f(x)) / dx by central differences of step FD_STEP, entry by entry."""
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += FD_STEP
        down[index] -= FD_STEP
        grad[index] = (np.sum(f(up)) - np.sum(f(down))) / (up[index] - down[index])
    return grad


def _call(name, kwargs):
    options = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"spec.{name}({options})"


# ----------------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------------


@given(strategies.softmax_calls())
def test_softmax_gradients_match_central_differences(call):
    name, z, targets, kwargs = call
    value, grad = _value_and_grad(name, z, targets, **kwargs)
    numeric = _central_differences(lambda x: getattr(spec, name)(x, targets, **kwargs), z)
    tolerance = FD_RTOL * (1.0 + np.sum(np.abs(value)))
    np.testing.assert_allclose(
        grad, numeric, rtol=0, atol=tolerance, err_msg=f"{_call(name, kwargs)} vs differences"
    )


@given(strategies.sigmoid_calls())
def test_sigmoid_gradients_match_central_differences(call):
    name, z, t, kwargs = call
    value, grad = _value_and_grad(name, z, t, **kwargs)
    numeric = _central_differences(lambda x: getattr(spec, name)(x, t, **kwargs), z)
    tolerance = FD_RTOL * (1.0 + np.sum(np.abs(value)))
    np.testing.assert_allclose(
        grad, numeric, rtol=0, atol=tolerance, err_msg=f"{_call(name, kwargs)} vs differences"
    )


@given(strategies.softmax_calls())
def test_softmax_gradient_rows_sum_to_zero_over_classes(call):
    name, z, targets, kwargs = call
    kwargs = dict(kwargs, reduction="none")
    grad = getattr(spec, name + "_grad")(z, targets, **kwargs)
    row_sums = np.sum(grad, axis=-1)
    # grad_j = p_j sum(v) - v_j with 0 <= v_c <= a_c (1 + gamma): each entry rounds to a few
    # ULPs of p_j sum(v) + v_j, whose sum over j is at most 2 max(a) (1 + gamma)
    a = kwargs.get("weight", kwargs.get("alpha"))
    terms = 2.0 * np.max(1.0 if a is None else a) * (1.0 + kwargs.get("gamma", 0.0))
    scale = np.sum(np.abs(grad), axis=-1) + terms
    assert np.all(np.abs(row_sums) <= 8 * np.finfo(np.float64).eps * scale), (
        f"{_call(name, kwargs)} gradient rows sum to {row_sums}"
    )


# ----------------------------------------------------------------------------------------------
# Identities between the losses
# ----------------------------------------------------------------------------------------------


@given(strategies.softmax_problems(), strategies.label_smoothings, strategies.reductions)
def test_focal_gamma_zero_equals_cross_entropy(problem, label_smoothing, reduction):
    z, targets = problem
    kwargs = dict(label_smoothing=label_smoothing, reduction=reduction)
    focal = _value_and_grad("softmax_focal_loss", z, targets, gamma=0.0, **kwargs)
    ce = _value_and_grad("softmax_cross_entropy", z, targets, **kwargs)
    for what, got, want in zip(["value", "grad"], focal, ce):
        np.testing.assert_array_equal(
            got, want, err_msg=f"spec.softmax_focal_loss(gamma=0, {kwargs}) {what} vs CE"
        )


@given(st.data(), strategies.softmax_problems(), strategies.label_smoothings)
def test_focal_gamma_zero_alpha_vector_equals_weighted_cross_entropy(data, problem, eps):
    z, targets = problem
    num_classes = z.shape[-1]
    alpha = data.draw(strategies.class_vectors(num_classes, 0.1, 1.0))
    for reduction in ["none", "sum"]:
        kwargs = dict(label_smoothing=eps, reduction=reduction)
        focal = _value_and_grad("softmax_focal_loss", z, targets, gamma=0.0, alpha=alpha, **kwargs)
        ce = _value_and_grad("softmax_cross_entropy", z, targets, weight=alpha, **kwargs)
        for what, got, want in zip(["value", "grad"], focal, ce):
            np.testing.assert_array_equal(
                got, want, err_msg=f"spec.softmax_focal_loss(gamma=0, alpha={alpha}, {kwargs})"
            )
    # 'mean': focal divides by the count, cross entropy (index targets) by the kept weights
    focal = spec.softmax_focal_loss(z, targets, gamma=0.0, alpha=alpha, label_smoothing=eps)
    ce = spec.softmax_cross_entropy(z, targets, weight=alpha, label_smoothing=eps)
    denominator = np.sum(alpha[targets]) / targets.size if targets.ndim == 1 else 1.0
    np.testing.assert_allclose(focal, ce * denominator, rtol=IDENTITY_RTOL)


@given(strategies.sigmoid_problems(), strategies.reductions)
def test_sigmoid_focal_gamma_zero_equals_sigmoid_cross_entropy(problem, reduction):
    z, t = problem
    focal = _value_and_grad("sigmoid_focal_loss", z, t, gamma=0.0, reduction=reduction)
    ce = _value_and_grad("sigmoid_cross_entropy", z, t, reduction=reduction)
    for what, got, want in zip(["value", "grad"], focal, ce):
        np.testing.assert_allclose(
            got, want, rtol=IDENTITY_RTOL, err_msg=f"spec.sigmoid_focal_loss(gamma=0) {what}"
        )


@given(st.data(), strategies.softmax_problems(), strategies.gammas, strategies.reductions)
def test_focal_alpha_scaling_is_linear(data, problem, gamma, reduction):
    z, targets = problem
    num_classes = z.shape[-1]
    alpha = data.draw(strategies.class_vectors(num_classes))
    k = data.draw(st.floats(0.0, 1.0))
    kwargs = dict(gamma=gamma, reduction=reduction)
    base = _value_and_grad("softmax_focal_loss", z, targets, alpha=alpha, **kwargs)
    scaled = _value_and_grad("softmax_focal_loss", z, targets, alpha=k * alpha, **kwargs)
    unbalanced = _value_and_grad("softmax_focal_loss", z, targets, alpha=None, **kwargs)
    scalar = _value_and_grad("softmax_focal_loss", z, targets, alpha=k, **kwargs)
    for what, b, s, u, c in zip(["value", "grad"], base, scaled, unbalanced, scalar):
        atol = 1e-300
        np.testing.assert_allclose(
            s, k * b, rtol=IDENTITY_RTOL, atol=atol, err_msg=f"alpha={k} * {alpha} {what}"
        )
        np.testing.assert_allclose(
            c, k * u, rtol=IDENTITY_RTOL, atol=atol, err_msg=f"alpha={k} {what}"
        )


@given(strategies.sigmoid_problems(), strategies.gammas, st.floats(0.0, 1.0))
def test_sigmoid_focal_alpha_weighs_positives_and_negatives(problem, gamma, alpha):
    z, t = problem
    t = np.round(t)  # hard targets: alpha_t is alpha on positives, 1 - alpha on negatives
    unbalanced = spec.sigmoid_focal_loss(z, t, gamma=gamma, reduction="none")
    balanced = spec.sigmoid_focal_loss(z, t, gamma=gamma, alpha=alpha, reduction="none")
    alpha_t = np.where(t == 1.0, alpha, 1.0 - alpha)
    np.testing.assert_allclose(balanced, alpha_t * unbalanced, rtol=IDENTITY_RTOL, atol=1e-300)


# ----------------------------------------------------------------------------------------------
# Invariances
# ----------------------------------------------------------------------------------------------


@given(strategies.softmax_calls(), st.floats(-100.0, 100.0))
def test_softmax_losses_are_shift_invariant(call, shift):
    name, z, targets, kwargs = call
    base = _value_and_grad(name, z, targets, **kwargs)
    moved = _value_and_grad(name, z + shift, targets, **kwargs)
    # z + shift moves every logit difference by up to ulp(|z| + |shift|)
    atol = 4 * np.spacing(np.max(np.abs(z)) + abs(shift)) * (1.0 + strategies.LOGIT_BOUND)
    for what, got, want in zip(["value", "grad"], moved, base):
        scale = atol * (1.0 + np.max(np.abs(want)))
        np.testing.assert_allclose(
            got, want, rtol=IDENTITY_RTOL, atol=scale, err_msg=f"{_call(name, kwargs)} {what}"
        )


@st.composite
def _class_axis_problems(draw):
    """Logits with extra dimensions and the class axis anywhere, with matching targets."""
    batch = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    num_classes = draw(st.integers(2, 4))
    position = draw(st.integers(0, len(batch)))
    shape = tuple(batch[:position]) + (num_classes,) + tuple(batch[position:])
    z = draw(strategies.logits(shape))
    if draw(st.booleans()):
        targets = draw(hnp.arrays(np.int64, tuple(batch), elements=st.integers(0, num_classes - 1)))
    else:
        raw = draw(hnp.arrays(np.float64, shape, elements=st.floats(0.0, 1.0))) + 1e-3
        targets = raw / raw.sum(axis=position, keepdims=True)
    axis = draw(st.sampled_from([position, position - len(shape)]))
    return z, targets, axis


@given(_class_axis_problems(), st.sampled_from(SOFTMAX_LOSSES), strategies.reductions)
def test_any_class_axis_equals_the_moved_axis_version(problem, name, reduction):
    z, targets, axis = problem
    value, grad = _value_and_grad(name, z, targets, axis=axis, reduction=reduction)
    moved_targets = targets if targets.dtype == np.int64 else np.moveaxis(targets, axis, -1)
    moved = _value_and_grad(name, np.moveaxis(z, axis, -1), moved_targets, reduction=reduction)
    np.testing.assert_allclose(value, moved[0], rtol=IDENTITY_RTOL, err_msg=f"{name}(axis={axis})")
    np.testing.assert_allclose(
        grad, np.moveaxis(moved[1], -1, axis), rtol=IDENTITY_RTOL, atol=1e-300
    )


# ----------------------------------------------------------------------------------------------
# Masks, ignored targets, non-finite logits
# ----------------------------------------------------------------------------------------------


@given(st.data(), strategies.softmax_calls())
def test_masked_classes_give_finite_values_and_zero_gradient(data, call):
    name, z, targets, kwargs = call
    num_classes = z.shape[-1]
    keep = data.draw(hnp.arrays(np.bool_, (num_classes,)).filter(lambda m: m.sum() >= 1))
    if targets.dtype == np.int64:
        assume(np.all(keep[targets]))
        compact_targets = np.cumsum(keep)[targets] - 1
    else:
        targets = targets * keep
        assume(np.all(targets.sum(axis=-1) > 0))
        targets = targets / targets.sum(axis=-1, keepdims=True)
        compact_targets = targets[:, keep]
    compact_kwargs = dict(kwargs)
    for option in ["weight", "alpha"]:
        if isinstance(kwargs.get(option), np.ndarray):
            compact_kwargs[option] = kwargs[option][keep]
    where = _value_and_grad(name, z, targets, where=keep, **kwargs)
    compact = _value_and_grad(name, z[:, keep], compact_targets, **compact_kwargs)
    for what, got in zip(["value", "grad"], where):
        assert np.all(np.isfinite(got)), f"{_call(name, kwargs)}, where={keep}: {what} {got}"
    assert np.all(where[1][:, ~keep] == 0.0), f"{_call(name, kwargs)}, where={keep}: {where[1]}"
    np.testing.assert_allclose(where[0], compact[0], rtol=IDENTITY_RTOL, atol=1e-300)
    np.testing.assert_allclose(where[1][:, keep], compact[1], rtol=IDENTITY_RTOL, atol=1e-300)
    if kwargs["label_smoothing"] == 0.0:
        # without label smoothing, a -inf logit is the same mask as `where`
        minus_inf = _value_and_grad(name, np.where(keep, z, -np.inf), targets, **kwargs)
        for what, got, want in zip(["value", "grad"], minus_inf, where):
            np.testing.assert_array_equal(got, want, err_msg=f"-inf logits vs where, {what}")


@pytest.mark.parametrize("name", SOFTMAX_LOSSES)
def test_label_smoothing_onto_a_minus_inf_logit_gives_inf_like_torch(name):
    z = np.array([[0.0, -1.0, -np.inf]])
    loss = getattr(spec, name)(z, np.array([0]), label_smoothing=0.1)
    assert loss == np.inf, f"spec.{name}(label_smoothing=0.1) with a -inf logit gives {loss}"


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("ignore_index", [-100, 2])
@pytest.mark.parametrize("name", SOFTMAX_LOSSES)
def test_all_ignored_mean_is_zero_with_zero_gradient(name, ignore_index, reduction):
    z = np.random.default_rng(0).normal(size=(3, 4))
    targets = np.full(3, ignore_index)
    kwargs = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=0.1)
    if not losses.get(name).is_focal:
        kwargs["weight"] = np.array([0.5, 1.0, 2.0, 3.0])
    value, grad = _value_and_grad(name, z, targets, **kwargs)
    assert np.all(value == 0.0) and np.all(grad == 0.0), f"{_call(name, kwargs)}: {value}, {grad}"
    assert np.shape(value) == ((3,) if reduction == "none" else ())


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", SOFTMAX_LOSSES + SIGMOID_LOSSES)
def test_no_elements_give_zero_not_nan(name, reduction):
    z = np.zeros((0, 3))
    targets = np.zeros(0, dtype=np.int64) if losses.get(name).is_softmax else np.zeros((0, 3))
    value, grad = _value_and_grad(name, z, targets, reduction=reduction)
    assert np.all(value == 0.0) and grad.shape == (0, 3), f"spec.{name}: {value}"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@given(call=strategies.softmax_calls(), data=st.data())
def test_nan_or_inf_logit_gives_nan_in_that_element(bad, call, data):
    name, z, targets, kwargs = call
    kwargs = dict(kwargs, reduction="none")
    row = data.draw(st.integers(0, z.shape[0] - 1))
    column = data.draw(st.integers(0, z.shape[1] - 1))
    broken = z.copy()
    broken[row, column] = bad
    clean = getattr(spec, name)(z, targets, **kwargs)
    loss = getattr(spec, name)(broken, targets, **kwargs)
    others = np.arange(z.shape[0]) != row
    assert np.isnan(loss[row]), f"{_call(name, kwargs)} with logit {bad}: {loss[row]}"
    np.testing.assert_array_equal(loss[others], clean[others])


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@given(call=strategies.sigmoid_calls(), data=st.data())
def test_nan_or_inf_sigmoid_logit_gives_nan_in_that_element(bad, call, data):
    name, z, t, kwargs = call
    kwargs = dict(kwargs, reduction="none")
    index = data.draw(st.sampled_from(list(np.ndindex(z.shape))))
    broken = z.copy()
    broken[index] = bad
    loss = getattr(spec, name)(broken, t, **kwargs)
    clean = getattr(spec, name)(z, t, **kwargs)
    others = np.ones(z.shape, dtype=bool)
    others[index] = False
    assert np.isnan(loss[index]), f"{_call(name, kwargs)} with logit {bad}: {loss[index]}"
    np.testing.assert_array_equal(loss[others], clean[others])
