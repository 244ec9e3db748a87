"""dualloss.jax_impl under JAX transformations, against optax, and on bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import checkify
from jax.test_util import check_grads

from dualloss import jax_impl, losses, spec

LOSSES = list(losses.NAMES)


def _targets(loss, rng, shape, index=True):
    if losses.get(loss).is_softmax and index:
        return jnp.asarray(rng.integers(0, shape[-1], size=shape[:-1]))
    if losses.get(loss).is_softmax:
        return jnp.asarray(rng.dirichlet(np.ones(shape[-1]), size=shape[:-1]), jnp.float32)
    return jnp.asarray(rng.uniform(size=shape), jnp.float32)


def _options(loss):
    return {"gamma": 0.5} if losses.get(loss).is_focal else {}


# ----------------------------------------------------------------------------------------------
# jit, vmap, grad, value_and_grad; x64 on and off
# ----------------------------------------------------------------------------------------------


# every loss and both x64 settings, not every pair (--full: all)
@pytest.mark.exhaustive(strength=1)
@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("loss", LOSSES)
def test_jit_vmap_grad_agree_with_eager(loss, x64):
    rng = np.random.default_rng(0)
    fn = getattr(jax_impl, loss)
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        logits = jnp.asarray(rng.normal(size=(3, 4, 5)) * 3, dtype)
        targets = _targets(loss, rng, logits.shape)
        if not jnp.issubdtype(targets.dtype, jnp.integer):
            targets = targets.astype(dtype)

        def f(x, t):
            return fn(x, t, **_options(loss))

        eager_value, eager_grad = jax.value_and_grad(f)(logits, targets)
        value, grad = jax.jit(jax.value_and_grad(f))(logits, targets)
        rtol = 1e-12 if x64 else 1e-5
        np.testing.assert_allclose(value, eager_value, rtol=rtol)
        np.testing.assert_allclose(grad, eager_grad, rtol=rtol, atol=rtol)
        assert value.dtype == dtype and grad.dtype == dtype
        # vmap over the leading axis: per-slice means (the slices' loop jitted too: eager
        # calls are compared above)
        per_slice = jax.jit(jax.vmap(f))(logits, targets)
        one, one_grad = jax.jit(f), jax.jit(jax.grad(f))
        expected = jnp.stack([one(logits[i], targets[i]) for i in range(3)])
        np.testing.assert_allclose(per_slice, expected, rtol=rtol)
        per_slice_grad = jax.jit(jax.vmap(jax.grad(f)))(logits, targets)
        expected_grad = jnp.stack([one_grad(logits[i], targets[i]) for i in range(3)])
        np.testing.assert_allclose(per_slice_grad, expected_grad, rtol=rtol, atol=rtol)


def test_class_axis_other_than_last():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(2, 5, 3)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 5, size=(2, 3)))
    moved = jax_impl.softmax_focal_loss(jnp.moveaxis(logits, 1, -1), targets, reduction="none")
    on_axis = jax_impl.softmax_focal_loss(logits, targets, axis=1, reduction="none")
    np.testing.assert_allclose(on_axis, moved, rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# Derivatives: check_grads (float64), Hessians, derivative rule choice
# ----------------------------------------------------------------------------------------------


# test_jax_traced_options' check_grads of order 2 differentiates every loss w.r.t. logits and
# probability targets together (both mode pairs): here the class-index targets, which it lacks
_WITH_TARGETS = "test_jax_traced_options::test_check_grads_order_2_wrt_logits_and_targets"


@pytest.mark.parametrize(
    "loss",
    [
        pytest.param(
            loss,
            marks=()
            if losses.get(loss).is_softmax
            else pytest.mark.on_demand(
                _WITH_TARGETS + " differentiates it w.r.t. the logits and its targets"
            ),
        )
        for loss in LOSSES
    ],
)
def test_check_grads_float64_orders_1_and_2(loss, full_tests):
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        logits = jnp.asarray(rng.normal(size=(3, 4)) * 2)
        for index in (True, False) if full_tests else (losses.get(loss).is_softmax,):
            if not losses.get(loss).is_softmax and index:
                continue
            targets = _targets(loss, rng, logits.shape, index)
            if not jnp.issubdtype(targets.dtype, jnp.integer):
                targets = targets.astype(jnp.float64)

            @jax.jit
            def f(x, targets=targets):
                return getattr(jax_impl, loss)(x, targets, **_options(loss))

            check_grads(f, (logits,), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("loss", LOSSES)
def test_check_grads_float64_wrt_probability_targets(loss):
    # tangents of the other arguments (targets) are part of the custom_jvp rule
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        logits = jnp.asarray(rng.normal(size=(3, 4)) * 2)
        targets = _targets(loss, rng, logits.shape, index=False).astype(jnp.float64)
        targets = jnp.clip(targets, 0.05, 0.95)  # off the kinks at 0 and 1

        @jax.jit
        def f(x, t):
            return getattr(jax_impl, loss)(x, t, **_options(loss))

        check_grads(f, (logits, targets), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


# every loss and both dtypes, not every pair (--full: all)
@pytest.mark.exhaustive(strength=1)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("loss", LOSSES)
def test_hessian_is_finite_at_large_logits(loss, dtype):
    with jax.enable_x64(dtype == "float64"):
        logits = jnp.asarray([[100.0, -100.0, 0.0], [-100.0, 100.0, -100.0]], dtype)
        if losses.get(loss).is_softmax:
            targets = jnp.asarray([0, 2])
        else:
            targets = jnp.asarray([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype)
        options = {"gamma": 0.5} if losses.get(loss).is_focal else {}
        hessian = jax.hessian(lambda x: getattr(jax_impl, loss)(x, targets, **options))(logits)
        assert hessian.shape == logits.shape * 2
        assert bool(jnp.all(jnp.isfinite(hessian))), hessian


@pytest.mark.parametrize("loss", LOSSES)
def test_hessian_matches_differences_of_the_spec_gradient(loss):
    # jax_impl attaches its closed-form gradients with custom_jvp, not custom_vjp, so that
    # forward-over-reverse (jax.hessian) works; the result is compared with central differences
    # of the spec's closed-form gradient (truncation h^2 ~ 1e-10, rounding eps / h ~ 1e-11)
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(2, 4)) * 2
    targets = np.asarray(_targets(loss, rng, logits.shape), np.float64)
    if losses.get(loss).is_softmax:
        targets = targets.astype(np.int64)
    options = _options(loss)
    spec_grad = getattr(spec, loss + "_grad")
    h = 1e-5
    expected = np.empty(logits.shape * 2)
    for index in np.ndindex(logits.shape):
        step = np.zeros_like(logits)
        step[index] = h
        up = spec_grad(logits + step, targets, **options)
        down = spec_grad(logits - step, targets, **options)
        expected[(...,) + index] = (up - down) / (2 * h)
    with jax.enable_x64(True):
        fn = getattr(jax_impl, loss)
        hessian = jax.hessian(lambda x: fn(x, jnp.asarray(targets), **options))(jnp.asarray(logits))
    np.testing.assert_allclose(
        np.asarray(hessian), expected, rtol=1e-6, atol=1e-8, err_msg=f"jax_impl.{loss} Hessian"
    )


SIGMOID_HESSIAN_CALLS = [
    ("sigmoid_cross_entropy", {}),
    ("sigmoid_cross_entropy", {"pos_weight": 2.5}),
    ("sigmoid_focal_loss", {"gamma": 0.5}),
    ("sigmoid_focal_loss", {"gamma": 2.0, "alpha": 0.25}),
]


@pytest.mark.parametrize(("loss", "options"), SIGMOID_HESSIAN_CALLS)
def test_sigmoid_hessian_at_and_near_zero_logits_matches_the_spec(loss, options):
    # jax_impl's sigmoid parts come from exp(-|x|): the derivative of -|x| at x = 0 must be the
    # one of the side the sign test takes (a symmetric one, 0, drops a term from the second
    # derivative there); the sigmoid losses' Hessian is diagonal, compared with central
    # differences of the spec's gradient
    logits = np.array([[0.0, -0.0, 0.0, -0.0, 1e-3, -1e-3], [0.0, 2.0, -3.0, 0.0, 40.0, -40.0]])
    targets = np.array([[1.0, 0.0, 0.3, 0.75, 1.0, 0.0], [0.5, 1.0, 0.0, 0.0625, 0.0, 1.0]])
    spec_grad = getattr(spec, loss + "_grad")
    h = 1e-5
    up = spec_grad(logits + h, targets, reduction="none", **options)
    down = spec_grad(logits - h, targets, reduction="none", **options)
    expected = (up - down) / (2 * h)
    with jax.enable_x64(True):
        fn = getattr(jax_impl, loss)
        hessian = jax.hessian(lambda x: fn(x, jnp.asarray(targets), reduction="sum", **options))(
            jnp.asarray(logits)
        )
        diagonal = np.asarray(hessian).reshape(logits.size, logits.size).diagonal()
    np.testing.assert_allclose(
        diagonal.reshape(logits.shape), expected, rtol=1e-6, atol=1e-10,
        err_msg=f"jax_impl.{loss}({options}) Hessian",
    )  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
def test_sigmoid_focal_hessian_is_finite_at_tiny_soft_targets(gamma, dtype):
    # 1 - p_t ~ t = 1e-30 there: JAX's quotient rule for r = p (1 - p) / (1 - p_t) would form
    # (1 - p_t)^-2, which overflows float32 (jax_impl's _ratio does not)
    with jax.enable_x64(dtype == "float64"):
        logits = jnp.asarray(
            [[-90.0, -200.0, -1e30, 90.0, 0.0], [-30.0, -100.0, 5.0, 200.0, -1.0]], dtype
        )
        targets = jnp.asarray(
            [[1e-30, 1e-30, 1e-30, 1.0, 1e-30], [1e-30, 1e-38, 1e-30, 1.0, 0.0]], dtype
        )
        hessian = jax.hessian(
            lambda x: jax_impl.sigmoid_focal_loss(x, targets, gamma=gamma, reduction="sum")
        )(logits)
        assert bool(jnp.all(jnp.isfinite(hessian))), hessian


# every shape and both losses, not every pair (--full: all)
@pytest.mark.exhaustive(strength=1)
@pytest.mark.parametrize("shape", [(4, 10), (4, 16), (2, 3, 5), (6, 1)])
@pytest.mark.parametrize("loss", ["sigmoid_cross_entropy", "sigmoid_focal_loss"])
def test_nan_or_inf_sigmoid_logit_gives_nan_in_that_element_only(loss, shape):
    # DESIGN 5, in both layouts of jax_impl (a short last axis that is no multiple of 8 is
    # flattened, see _sigmoid_inputs)
    rng = np.random.default_rng(3)
    logits = rng.normal(size=shape) * 3
    targets = (rng.random(shape) < 0.5).astype(float)
    fn = getattr(jax_impl, loss)
    clean = np.asarray(fn(logits, targets, reduction="none"))
    for bad in (np.nan, np.inf):
        broken = logits.copy()
        index = (0,) * (len(shape) - 1) + (shape[-1] - 1,)
        broken[index] = bad
        loss_ = np.asarray(fn(broken, targets, reduction="none"))
        grad = np.asarray(jax.grad(lambda x: fn(x, targets, reduction="sum"))(jnp.asarray(broken)))
        assert loss_.shape == shape
        assert np.isnan(loss_[index]) and np.isnan(grad[index]), (bad, loss_[index], grad[index])
        others = np.ones(shape, dtype=bool)
        others[index] = False
        np.testing.assert_array_equal(loss_[others], clean[others])
        assert np.all(np.isfinite(grad[others]))


# every shape and both losses, not every pair (--full: all)
@pytest.mark.exhaustive(strength=1)
@pytest.mark.parametrize("loss", ["sigmoid_cross_entropy", "sigmoid_focal_loss"])
@pytest.mark.parametrize("shape", [(64, 10), (16, 1), (3, 4, 20), (16, 40)])
def test_flattened_sigmoid_layout_gives_the_values_of_the_plain_one(loss, shape):
    # shapes whose last axis is short and no multiple of 8 are computed flattened; the same
    # elements with a last axis of 8 are not: the per-element losses and gradients agree
    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.normal(size=shape) * 4, jnp.float32)
    targets = jnp.asarray(rng.random(shape), jnp.float32)
    fn = getattr(jax_impl, loss)
    value, grad = jax.value_and_grad(lambda x: fn(x, targets, reduction="sum"))(logits)
    plain = (-1, 8)
    value_8, grad_8 = jax.value_and_grad(lambda x: fn(x, targets.reshape(plain), reduction="sum"))(
        logits.reshape(plain)
    )
    np.testing.assert_allclose(
        np.asarray(fn(logits, targets, reduction="none")).reshape(plain),
        np.asarray(fn(logits.reshape(plain), targets.reshape(plain), reduction="none")),
        rtol=2e-7,
    )
    np.testing.assert_allclose(np.asarray(grad).reshape(plain), np.asarray(grad_8), rtol=2e-7)
    np.testing.assert_allclose(float(value), float(value_8), rtol=1e-6)


def test_gradient_of_ignored_rows_is_zero_even_for_nan_logits():
    logits = jnp.asarray([[jnp.nan, 0.0, 1.0], [0.0, 1.0, 2.0]])
    targets = jnp.asarray([-100, 2])
    for fn in (jax_impl.softmax_cross_entropy, jax_impl.softmax_focal_loss):
        for smoothing in (0.0, 0.1):
            value, grad = jax.value_and_grad(
                lambda x, fn=fn, smoothing=smoothing: fn(x, targets, label_smoothing=smoothing)
            )(logits)
            assert bool(jnp.isfinite(value)) and bool(jnp.all(grad[0] == 0.0))
            assert bool(jnp.all(jnp.isfinite(grad)))


def test_mean_over_nothing_is_zero_with_zero_gradient():
    logits = jnp.ones((2, 3))
    value, grad = jax.value_and_grad(
        lambda x: jax_impl.softmax_cross_entropy(x, jnp.asarray([-100, -100]))
    )(logits)
    assert float(value) == 0.0 and bool(jnp.all(grad == 0.0))


# ----------------------------------------------------------------------------------------------
# optax drop-ins
# ----------------------------------------------------------------------------------------------


def test_softmax_cross_entropy_with_integer_labels_matches_optax():
    rng = np.random.default_rng(4)
    logits = jnp.asarray(rng.normal(size=(4, 3, 6)) * 4, jnp.float32)
    labels = jnp.asarray(rng.integers(0, 6, size=(4, 3)))
    where = jnp.asarray(rng.uniform(size=(4, 3, 6)) > 0.3).at[..., 0].set(True)
    labels_where = jnp.where(jnp.take_along_axis(where, labels[..., None], -1)[..., 0], labels, 0)
    for args, kwargs in [((logits, labels), {}), ((logits, labels_where), {"where": where})]:
        ours = jax_impl.softmax_cross_entropy_with_integer_labels(*args, **kwargs)
        theirs = optax.softmax_cross_entropy_with_integer_labels(*args, **kwargs)
        assert ours.shape == theirs.shape == (4, 3)
        np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=2e-6)
        ours_grad = jax.grad(
            lambda x: jax_impl.softmax_cross_entropy_with_integer_labels(
                x, *args[1:], **kwargs
            ).sum()
        )(logits)
        theirs_grad = jax.grad(
            lambda x: optax.softmax_cross_entropy_with_integer_labels(x, *args[1:], **kwargs).sum()
        )(logits)
        np.testing.assert_allclose(ours_grad, theirs_grad, rtol=2e-6, atol=2e-6)
    ours = jax_impl.softmax_cross_entropy_with_integer_labels(
        jnp.moveaxis(logits, -1, 0), labels, 0
    )
    np.testing.assert_allclose(
        ours, optax.softmax_cross_entropy_with_integer_labels(logits, labels), rtol=2e-6
    )


def test_sigmoid_binary_cross_entropy_matches_optax():
    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.normal(size=(4, 5)) * 4, jnp.float32)
    for labels in (
        jnp.asarray(rng.uniform(size=(4, 5)), jnp.float32),
        jnp.asarray(rng.integers(0, 2, size=(4, 5))),  # optax casts integer labels
        jnp.asarray(rng.uniform(size=(5,)), jnp.float32),  # and broadcasts
    ):
        ours = jax_impl.sigmoid_binary_cross_entropy(logits, labels)
        theirs = optax.sigmoid_binary_cross_entropy(logits, labels)
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=2e-6)
        grads = [
            jax.grad(lambda x, f=f: f(x, labels).sum())(logits)
            for f in (jax_impl.sigmoid_binary_cross_entropy, optax.sigmoid_binary_cross_entropy)
        ]
        np.testing.assert_allclose(grads[0], grads[1], rtol=2e-6, atol=2e-6)


def test_sigmoid_focal_loss_matches_optax_on_finite_inputs():
    rng = np.random.default_rng(6)
    logits = jnp.asarray(rng.normal(size=(4, 5)) * 4, jnp.float32)
    labels = jnp.asarray(rng.integers(0, 2, size=(4, 5)), jnp.float32)
    for gamma, alpha in [(2.0, None), (0.5, 0.25)]:
        ours = jax_impl.sigmoid_focal_loss(
            logits, labels, gamma=gamma, alpha=alpha, reduction="none"
        )
        theirs = optax.sigmoid_focal_loss(logits, labels, gamma=gamma, alpha=alpha)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_optax_signatures():
    import inspect

    for name in ("softmax_cross_entropy_with_integer_labels", "sigmoid_binary_cross_entropy"):
        ours = inspect.signature(getattr(jax_impl, name)).parameters
        theirs = inspect.signature(getattr(optax, name)).parameters
        assert [(p.name, p.default, p.kind) for p in ours.values()] == [
            (p.name, p.default, p.kind) for p in theirs.values()
        ]


# ----------------------------------------------------------------------------------------------
# Bad input: eager raises, jit gives NaN, checkify reports
# ----------------------------------------------------------------------------------------------

INDEX_MESSAGE = (
    r"`targets` has class index 7 at position \(1,\), outside \[0, 3\) and not ignore_index=-100\."
)


def test_eager_out_of_range_index_raises_the_checks_message():
    with pytest.raises(ValueError, match=INDEX_MESSAGE):
        jax_impl.softmax_cross_entropy(jnp.zeros((2, 3)), jnp.asarray([0, 7]))


def test_out_of_range_index_under_jit_gives_nan_for_that_element():
    logits = jnp.zeros((3, 3))
    for fn in (jax_impl.softmax_cross_entropy, jax_impl.softmax_focal_loss):
        for smoothing in (0.0, 0.1):
            f = jax.jit(
                lambda x, y, fn=fn, s=smoothing: fn(x, y, label_smoothing=s, reduction="none")
            )
            value = f(logits, jnp.asarray([0, 7, -1]))
            assert bool(jnp.isfinite(value[0])) and bool(jnp.all(jnp.isnan(value[1:])))
            grad = jax.jit(jax.grad(lambda x, y, f=f: f(x, y).sum()))(
                logits, jnp.asarray([0, 7, 1])
            )
            assert bool(jnp.all(jnp.isnan(grad[1]))) and bool(jnp.all(jnp.isfinite(grad[0])))


def test_checkify_reports_out_of_range_index_with_the_checks_message():
    def f(x, y):
        return jax_impl.softmax_cross_entropy(x, y)

    checked = jax.jit(checkify.checkify(f, errors=checkify.user_checks))
    error, _ = checked(jnp.zeros((2, 3)), jnp.asarray([0, 7]))
    with pytest.raises(checkify.JaxRuntimeError, match=INDEX_MESSAGE):
        error.throw()
    error, value = checked(jnp.zeros((2, 3)), jnp.asarray([0, 2]))
    error.throw()  # no error for good indices
    assert bool(jnp.isfinite(value))
    # without checkify the same jitted function still runs, giving NaN
    assert bool(jnp.isnan(jax.jit(f)(jnp.zeros((2, 3)), jnp.asarray([0, 7]))))


_Z = jnp.zeros((2, 3))
_Y = jnp.zeros(2, int)
_softmax_ce = jax_impl.softmax_cross_entropy
_softmax_focal = jax_impl.softmax_focal_loss
_sigmoid_ce = jax_impl.sigmoid_cross_entropy
BAD_CALLS = [
    (lambda: _softmax_ce(_Z, _Y, reduction="avg"), ValueError, "`reduction` must be one of"),
    (lambda: _softmax_focal(_Z, _Y, gamma=-1.0), ValueError, "`gamma` must be a finite number"),
    (lambda: _softmax_ce(_Z.astype(int), _Y), TypeError, "`logits` must have a floating dtype"),
    (lambda: _softmax_ce(_Z, jnp.zeros(3, int)), ValueError, "`targets` of class indices must"),
    (lambda: _softmax_ce(_Z, _Y, weight=jnp.ones(4)), ValueError, "`weight` must be a vector"),
    (
        lambda: _softmax_focal(_Z, _Y, alpha=jnp.asarray([0.5, 2.0, 0.1])),
        ValueError,
        r"`alpha` must have every entry in \[0, 1\]. Received: alpha\[1\]=2.0.",
    ),
    (lambda: _softmax_ce(_Z, _Y, label_smoothing=1.5), ValueError, "`label_smoothing` must be in"),
    (lambda: _softmax_ce(_Z, _Y, where=jnp.ones(3)), TypeError, "`where` must be a boolean mask"),
    (lambda: _sigmoid_ce(_Z, _Z.astype(int)), TypeError, "`targets` must have a floating dtype"),
    (
        lambda: _sigmoid_ce(_Z, _Z, pos_weight=jnp.ones(2)),
        ValueError,
        "`pos_weight` must broadcast",
    ),
    (
        lambda: jax_impl.sigmoid_focal_loss(_Z, _Z, alpha=1.5),
        ValueError,
        r"`alpha` must be in \[0, 1\]",
    ),
]


@pytest.mark.parametrize("call, error, match", BAD_CALLS)
def test_bad_arguments_raise_the_checks_messages(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_shape_and_option_errors_also_raise_under_jit():
    with pytest.raises(ValueError, match="`targets` of class indices must have shape"):
        jax.jit(jax_impl.softmax_cross_entropy)(jnp.zeros((2, 3)), jnp.zeros(3, int))


# ----------------------------------------------------------------------------------------------
# Batch axis sharded over 8 host devices (subprocess: the device count is fixed at start-up)
# ----------------------------------------------------------------------------------------------

SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from dualloss import jax_impl
    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    rows = NamedSharding(mesh, P("batch"))
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(16, 5)) * 3, jnp.float32)
    index = jnp.asarray(rng.integers(0, 5, 16))
    prob = jnp.asarray(rng.uniform(size=(16, 5)), jnp.float32)
    cases = [
        (jax_impl.softmax_cross_entropy, index, {}),
        (jax_impl.softmax_focal_loss, index, {"gamma": 0.5, "label_smoothing": 0.1}),
        (jax_impl.sigmoid_cross_entropy, prob, {}),
        (jax_impl.sigmoid_focal_loss, prob, {"gamma": 0.5, "alpha": 0.25}),
    ]
    for fn, targets, options in cases:
        f = jax.jit(jax.value_and_grad(lambda x, t: fn(x, t, **options)))
        value, grad = f(logits, targets)
        s_value, s_grad = f(jax.device_put(logits, rows), jax.device_put(targets, rows))
        assert len(s_grad.sharding.device_set) == 8, s_grad.sharding
        np.testing.assert_allclose(s_value, value, rtol=1e-6)
        np.testing.assert_allclose(s_grad, grad, rtol=1e-6, atol=1e-7)
        per_row = jax.jit(lambda x, t: fn(x, t, reduction="none", **options))
        np.testing.assert_allclose(
            per_row(jax.device_put(logits, rows), jax.device_put(targets, rows)),
            per_row(logits, targets), rtol=1e-6)
    print("sharded ok")
    """
)


@pytest.mark.slow
def test_batch_axis_sharded_over_8_devices_matches_unsharded():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", SHARDED], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sharded ok" in result.stdout
