"""Properties of ``<name>_grad(..., wrt=...)`` for targets and options: finite differences,
identities, conventions and errors (hypothesis, deterministic CI profile).

Tolerances as in test_spec_properties.py: central differences of step 1e-6 against the closed
form to FD_RTOL * (1 + |loss|). At an end of an option's domain (gamma = 0, alpha or eps at 0 or
1, a target at 0 or 1 for the sigmoid focal loss, whose log t is undefined below 0) the
one-sided second-order stencil (-3 f(x) + 4 f(x + h) - f(x + 2h)) / 2h, of the same order.
"""

from __future__ import annotations

import typing

import numpy as np
import pytest
import strategies
from hypothesis import given
from hypothesis import strategies as st

from dualloss import losses, spec

FD_STEP = 1e-6
FD_RTOL = 1e-7
OPTION_WRT = {
    "softmax_cross_entropy": ["targets", "weight", "label_smoothing"],
    "softmax_focal_loss": ["targets", "gamma", "alpha", "label_smoothing"],
    "sigmoid_cross_entropy": ["targets", "weight", "pos_weight"],
    "sigmoid_focal_loss": ["targets", "gamma", "alpha"],
}
# the domain of each argument, for the one-sided stencil at its ends
DOMAIN = {"gamma": (0.0, np.inf), "alpha": (0.0, 1.0), "label_smoothing": (0.0, 1.0)}


def _differences(f, x, low=-np.inf, high=np.inf):
    """d f / dx entry by entry; one-sided (second order) within FD_STEP of [low, high]'s ends."""
    scalar = np.ndim(x) == 0
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    grad = np.zeros_like(x)

    def at(index, step):
        moved = x.copy()
        moved[index] += step
        return float(np.sum(f(float(moved[0]) if scalar else moved)))

    for index in np.ndindex(x.shape):
        h = FD_STEP
        if x[index] - h < low:
            grad[index] = (-3 * at(index, 0.0) + 4 * at(index, h) - at(index, 2 * h)) / (2 * h)
        elif x[index] + h > high:
            grad[index] = (3 * at(index, 0.0) - 4 * at(index, -h) + at(index, -2 * h)) / (2 * h)
        else:
            grad[index] = (at(index, h) - at(index, -h)) / (2 * h)
    return grad[0] if scalar else grad


def _check(name, z, targets, kwargs, wrt):
    loss = getattr(spec, name)
    closed = getattr(spec, name + "_grad")(z, targets, wrt=wrt, **kwargs)
    if wrt == "targets":
        focal_sigmoid = losses.get(name).is_focal and not losses.get(name).is_softmax
        low, high = (0.0, 1.0) if focal_sigmoid else (-np.inf, np.inf)
        numeric = _differences(lambda t: loss(z, t, **kwargs), targets, low, high)
    else:
        numeric = _differences(
            lambda v: loss(z, targets, **dict(kwargs, **{wrt: v})),
            kwargs[wrt],
            *DOMAIN.get(wrt, (-np.inf, np.inf)),
        )
    assert np.shape(closed) == np.shape(kwargs.get(wrt, targets)), f"{name}(wrt={wrt!r}) shape"
    tolerance = FD_RTOL * (1.0 + np.sum(np.abs(loss(z, targets, **kwargs))))
    np.testing.assert_allclose(
        closed, numeric, rtol=0, atol=tolerance, err_msg=f"spec.{name}_grad({kwargs}, wrt={wrt!r})"
    )


@given(st.data(), strategies.softmax_calls(soft=True))
def test_softmax_target_and_option_gradients_match_central_differences(data, call):
    name, z, targets, kwargs = call
    for wrt in OPTION_WRT[name]:
        if wrt in ("weight", "alpha") and kwargs.get(wrt) is None:
            continue
        _check(name, z, targets, kwargs, wrt)


@given(strategies.softmax_calls(soft=False))
def test_softmax_option_gradients_with_class_indices_match_central_differences(call):
    """Class indices: torch's weighted mean divides by the kept targets' weights (quotient
    rule); an ignored target leaves every sum."""
    name, z, targets, kwargs = call
    targets = targets.copy()
    targets[0] = -100
    for wrt in OPTION_WRT[name][1:]:
        if wrt in ("weight", "alpha") and kwargs.get(wrt) is None:
            continue
        _check(name, z, targets, kwargs, wrt)


@given(strategies.sigmoid_calls())
def test_sigmoid_target_and_option_gradients_match_central_differences(call):
    name, z, t, kwargs = call
    if losses.get(name).is_focal:
        # (1 - p_t)^gamma with gamma < 1 bends within a step of t = 0 or 1 when p is near t:
        # differences lose their accuracy there (test_spec_grad_accuracy covers the ends)
        t = np.clip(t, 0.05, 0.95)
    for wrt in OPTION_WRT[name]:
        if wrt in ("weight", "pos_weight", "alpha") and kwargs.get(wrt) is None:
            continue
        _check(name, z, t, kwargs, wrt)


@given(strategies.sigmoid_problems(), strategies.reductions, st.floats(0.1, 3.0))
def test_broadcast_weights_get_gradients_summed_to_their_shape(problem, reduction, scalar):
    """weight / pos_weight given as a scalar, a row or a column: the gradient of each entry is
    the sum over the elements it was broadcast to (differences of the scalar / vector)."""
    z, t = problem
    for shape in [(), z.shape[-1:], (1,) * (z.ndim - 1) + (z.shape[-1],)]:
        value = np.float64(scalar) if shape == () else np.full(shape, scalar)
        for wrt in ["weight", "pos_weight"]:
            _check("sigmoid_cross_entropy", z, t, {"reduction": reduction, wrt: value}, wrt)


@given(st.data(), strategies.softmax_problems(), strategies.reductions)
def test_weight_gradient_obeys_euler_identity(data, problem, reduction):
    """l is linear in w: sum_c w_c dL/dw_c = L, except torch's weighted mean over class
    indices, which does not change when w is scaled: there it is 0."""
    z, targets = problem
    w = data.draw(strategies.class_vectors(z.shape[-1], 0.1, 3.0))
    kwargs = dict(weight=w, reduction=reduction, label_smoothing=0.1)
    loss = spec.softmax_cross_entropy(z, targets, **kwargs)
    grad = spec.softmax_cross_entropy_grad(z, targets, wrt="weight", **kwargs)
    scale = np.sum(np.abs(w * grad)) + np.sum(np.abs(loss))
    expected = 0.0 if (targets.ndim == 1 and reduction == "mean") else np.sum(loss)
    assert abs(np.sum(w * grad) - expected) <= 1e-13 * scale, f"{kwargs}: {grad}"


@given(strategies.softmax_problems(soft=True), strategies.label_smoothings, strategies.reductions)
def test_focal_gamma_zero_target_gradient_equals_cross_entropy(problem, eps, reduction):
    z, targets = problem
    kwargs = dict(label_smoothing=eps, reduction=reduction)
    for wrt in ["targets", "label_smoothing"]:
        focal = spec.softmax_focal_loss_grad(z, targets, gamma=0.0, wrt=wrt, **kwargs)
        ce = spec.softmax_cross_entropy_grad(z, targets, wrt=wrt, **kwargs)
        np.testing.assert_allclose(focal, ce, rtol=1e-13, atol=1e-300, err_msg=wrt)


# ----------------------------------------------------------------------------------------------
# Conventions at the edges
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["softmax_cross_entropy", "softmax_focal_loss"])
def test_mass_moved_onto_a_class_of_probability_zero_has_gradient_plus_inf(name):
    """-t log 0 is 0 at t = 0 and +inf for t > 0: the derivative at a -inf logit is +inf (the
    math); a class outside `where` drops its target mass (optax), so its derivative is 0. Every
    other entry stays finite."""
    z = np.array([[0.0, -1.0, -np.inf, 2.0]])
    t = np.array([[0.5, 0.5, 0.0, 0.0]])
    grad = getattr(spec, name + "_grad")(z, t, wrt="targets")
    assert grad[0, 2] == np.inf and np.all(np.isfinite(grad[0, [0, 1, 3]])), grad
    where = np.array([True, True, False, True])
    grad = getattr(spec, name + "_grad")(np.where(where, z, 0.0), t, where=where, wrt="targets")
    assert grad[0, 2] == 0.0 and np.all(np.isfinite(grad)), grad
    # a class weight of 0 removes the class: no dependence on its target, gradient 0
    weight = {losses.get(name).class_vector: np.array([1, 1, 0, 1.0])}
    grad = getattr(spec, name + "_grad")(z, t, wrt="targets", **weight)
    assert grad[0, 2] == 0.0, grad


def test_gamma_gradient_of_a_certain_class_is_zero_also_at_gamma_zero():
    """p = 1 (every other class masked): log p = 0 for every gamma, so dl/dgamma = 0, not
    0 * log(0) = NaN."""
    z = np.array([[1.0, -np.inf, -np.inf]])
    for gamma in [0.0, 0.5, 2.0]:
        grad = spec.softmax_focal_loss_grad(z, np.array([0]), gamma=gamma, wrt="gamma")
        assert grad == 0.0, f"gamma={gamma}: {grad}"


@pytest.mark.parametrize("x", [-800.0, -700.0, -40.0, 40.0, 700.0, 800.0])
@pytest.mark.parametrize("t", [0.0, 1.0, 0.3])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 3.3])
def test_extreme_sigmoid_focal_target_and_gamma_gradients_are_finite(x, t, gamma):
    for wrt in ["targets", "gamma", "alpha"]:
        grad = spec.sigmoid_focal_loss_grad(
            np.array([x]), np.array([t]), gamma=gamma, alpha=0.25, wrt=wrt
        )
        assert np.all(np.isfinite(grad)), f"x={x}, t={t}, gamma={gamma}, wrt={wrt}: {grad}"


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", ["softmax_cross_entropy", "softmax_focal_loss"])
def test_all_ignored_rows_give_zero_option_gradients(name, reduction):
    z = np.random.default_rng(0).normal(size=(3, 4))
    z[1, 2] = np.nan  # an ignored row's logits do not matter
    options = {"label_smoothing": 0.1}
    options[losses.get(name).class_vector] = np.full(4, 0.5)
    for wrt in OPTION_WRT[name][1:]:
        grad = getattr(spec, name + "_grad")(
            z, np.full(3, -100), reduction=reduction, wrt=wrt, **options
        )
        assert np.all(grad == 0.0), f"{name}(wrt={wrt!r}): {grad}"


def test_logit_gradient_default_is_unchanged():
    """wrt='logits' is the default and the very same computation."""
    rng = np.random.default_rng(1)
    z, t = rng.normal(size=(3, 5)), rng.integers(0, 5, size=3)
    for name in ["softmax_cross_entropy", "softmax_focal_loss"]:
        fn = getattr(spec, name + "_grad")
        np.testing.assert_array_equal(fn(z, t), fn(z, t, wrt="logits"))


# ----------------------------------------------------------------------------------------------
# The allowed `wrt` values: the function's annotation, the registry, and the errors
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("info", losses.LOSSES, ids=lambda info: info.name)
def test_grad_wrt_values_are_the_registry_differentiable_inputs(info):
    allowed = typing.get_args(typing.get_type_hints(info.grad)["wrt"])
    assert allowed == info.differentiable, f"{info.name}_grad wrt {allowed}"
    assert set(info.differentiable) - {"logits", "targets"} == {
        option.name for option in info.options if option.differentiable
    }


@pytest.mark.parametrize("info", losses.LOSSES, ids=lambda info: info.name)
def test_unknown_wrt_raises_naming_it_and_the_allowed_values(info):
    logits, targets = info.sample_inputs()
    allowed = ", ".join(repr(name) for name in info.differentiable)
    for wrt in ["ignore_index", "pos_weight" if info.is_softmax else "label_smoothing", "x"]:
        message = f"`wrt` must be one of {allowed} for {info.name}_grad. Received: wrt={wrt!r}."
        with pytest.raises(ValueError, match=f"^{_escape(message)}$"):
            info.grad(logits, targets, wrt=wrt)


def test_class_index_targets_have_no_target_gradient():
    for name in ["softmax_cross_entropy", "softmax_focal_loss"]:
        with pytest.raises(
            ValueError,
            match=_escape(
                "`wrt`='targets' needs floating class-probability targets: class indices have "
                "no gradient. Received: targets.dtype=int64."
            ),
        ):
            getattr(spec, name + "_grad")(np.zeros((2, 3)), np.array([0, 1]), wrt="targets")


@pytest.mark.parametrize(
    "name, wrt",
    [
        ("softmax_cross_entropy", "weight"),
        ("softmax_focal_loss", "alpha"),
        ("sigmoid_cross_entropy", "weight"),
        ("sigmoid_cross_entropy", "pos_weight"),
        ("sigmoid_focal_loss", "alpha"),
    ],
)
def test_gradient_of_an_option_left_at_none_raises(name, wrt):
    info = losses.get(name)
    logits, targets = info.sample_inputs()
    message = (
        f"`wrt`={wrt!r} needs `{wrt}` to be given: an option left at None has no gradient. "
        f"Received: {wrt}=None."
    )
    with pytest.raises(ValueError, match=f"^{_escape(message)}$"):
        info.grad(logits, targets, wrt=wrt)


def _escape(text):
    import re

    return re.escape(text)
