"""jax_impl options as traced values: jit arguments, vmap, grad/jvp against spec's closed forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from dualloss import jax_impl, losses, spec

RNG = np.random.default_rng(0)
Z = RNG.normal(size=(4, 5)) * 2
INDEX = RNG.integers(0, 5, size=(4,))
PROB = RNG.dirichlet(np.ones(5), size=(4,))
BINARY = (RNG.uniform(size=(4, 5)) > 0.5).astype(np.float64)

# (loss, targets, fixed options, option under test, its value)
CASES = [
    ("softmax_focal_loss", INDEX, {"alpha": 0.25}, "gamma", 2.0),
    ("softmax_focal_loss", PROB, {"alpha": 0.25}, "gamma", 0.5),
    ("softmax_focal_loss", INDEX, {"alpha": 0.25}, "gamma", 0.0),
    ("softmax_focal_loss", INDEX, {"gamma": 2.0}, "alpha", 0.3),
    ("softmax_focal_loss", PROB, {"gamma": 2.0}, "alpha", RNG.uniform(size=5)),
    ("softmax_focal_loss", INDEX, {"gamma": 1.5}, "label_smoothing", 0.1),
    ("softmax_cross_entropy", INDEX, {}, "label_smoothing", 0.0),
    ("softmax_cross_entropy", PROB, {}, "label_smoothing", 0.2),
    ("softmax_cross_entropy", INDEX, {}, "weight", RNG.uniform(0.5, 2.0, size=5)),
    ("sigmoid_cross_entropy", BINARY, {}, "weight", RNG.uniform(0.5, 2.0, size=(4, 5))),
    ("sigmoid_cross_entropy", PROB, {}, "pos_weight", RNG.uniform(0.5, 2.0, size=5)),
    ("sigmoid_focal_loss", BINARY, {"alpha": 0.25}, "gamma", 2.0),
    ("sigmoid_focal_loss", PROB, {"alpha": 0.25}, "gamma", 0.0),
    ("sigmoid_focal_loss", PROB, {"gamma": 0.5}, "alpha", 0.25),
]
IDS = [f"{c[0]}-{c[3]}={np.ndim(c[4]) and 'vec' or c[4]}-{c[1].dtype}" for c in CASES]


@pytest.mark.parametrize(("name", "targets", "fixed", "option", "value"), CASES, ids=IDS)
def test_grad_wrt_option_matches_spec_closed_form_and_finite_differences(
    name, targets, fixed, option, value
):
    with jax.enable_x64(True):

        def f(v):
            return getattr(jax_impl, name)(Z, targets, **fixed, **{option: v})

        v = jnp.asarray(value, jnp.float64)
        # jit with the option as an argument = eager with a Python / NumPy value
        np.testing.assert_allclose(
            jax.jit(f)(v), getattr(spec, name)(Z, targets, **fixed, **{option: value}), rtol=1e-13
        )
        grad = jax.jit(jax.grad(f))(v)
        want = getattr(spec, name + "_grad")(Z, targets, **fixed, **{option: value}, wrt=option)
        np.testing.assert_allclose(grad, want, rtol=1e-11, atol=1e-14)
        # forward mode agrees, and a one-sided difference where the option sits on its edge (0)
        tangent = jnp.ones_like(v)
        _, jvp = jax.jvp(f, (v,), (tangent,))
        np.testing.assert_allclose(jvp, jnp.sum(grad * tangent), rtol=1e-11, atol=1e-14)
        h = 1e-6
        difference = (f(v + h * tangent) - f(v)) / h
        np.testing.assert_allclose(jvp, difference, rtol=1e-4, atol=1e-7)


def test_vmap_over_gamma_equals_a_loop():
    gammas = jnp.asarray([0.0, 0.5, 2.0, 3.3])
    for name, targets in [("softmax_focal_loss", INDEX), ("sigmoid_focal_loss", BINARY)]:
        fn = getattr(jax_impl, name)
        # jitted, as a vmap over a hyper-parameter runs in training (one compile, not an eager
        # trace of every op per call)
        got = jax.jit(jax.vmap(lambda g, fn=fn, t=targets: fn(Z, t, gamma=g, alpha=0.25)))(gammas)
        want = [fn(Z, targets, gamma=float(g), alpha=0.25) for g in gammas]
        np.testing.assert_allclose(got, want, rtol=1e-6)
        grads = jax.jit(jax.vmap(jax.grad(lambda g, fn=fn, t=targets: fn(Z, t, gamma=g))))(gammas)
        assert bool(jnp.all(jnp.isfinite(grads)))


def test_traced_gamma_zero_is_exactly_cross_entropy_also_at_p_one():
    with jax.enable_x64(True):
        z = jnp.asarray([[1.0, -jnp.inf, -jnp.inf], [800.0, 0.0, -800.0]])
        y = jnp.asarray([0, 0])
        traced = jax.jit(lambda g: jax_impl.softmax_focal_loss(z, y, gamma=g, reduction="none"))
        exact = jax_impl.softmax_cross_entropy(z, y, reduction="none")
        np.testing.assert_array_equal(traced(0.0), exact)
        grad = jax.grad(lambda g: jax_impl.softmax_focal_loss(z, y, gamma=g))(0.0)
        assert float(grad) == 0.0  # log p = 0 at p = 1: no dependence on gamma
        x = jnp.asarray([800.0, -800.0])
        t = jnp.asarray([1.0, 0.0])
        sigmoid = jax.jit(lambda g: jax_impl.sigmoid_focal_loss(x, t, gamma=g, reduction="none"))
        np.testing.assert_array_equal(
            sigmoid(0.0), jax_impl.sigmoid_cross_entropy(x, t, reduction="none")
        )


@pytest.mark.parametrize(
    ("name", "option", "bad"),
    [
        ("softmax_focal_loss", "gamma", -1.0),
        ("softmax_focal_loss", "alpha", 1.5),
        ("softmax_focal_loss", "label_smoothing", 2.0),
        ("softmax_cross_entropy", "label_smoothing", -0.1),
        ("sigmoid_focal_loss", "gamma", jnp.nan),
        ("sigmoid_focal_loss", "alpha", -0.5),
    ],
)
def test_traced_invalid_option_gives_nan_and_eager_raises(name, option, bad):
    targets = INDEX if losses.get(name).is_softmax else BINARY
    fn = getattr(jax_impl, name)
    assert bool(jnp.isnan(jax.jit(lambda v: fn(Z, targets, **{option: v}))(bad)))
    grad = jax.grad(lambda z: jax.jit(lambda z, v: fn(z, targets, **{option: v}))(z, bad))(Z)
    assert bool(jnp.any(jnp.isnan(grad)))
    with pytest.raises(ValueError, match=f"`{option}` must"):
        fn(Z, targets, **{option: jnp.asarray(bad)})  # a concrete array is validated


@pytest.mark.parametrize("name", list(losses.NAMES))
def test_check_grads_order_2_wrt_logits_and_targets(name):
    info = losses.get(name)
    options = {"gamma": 0.5, "alpha": 0.25} if info.is_focal else {}
    with jax.enable_x64(True):
        targets = jnp.clip(
            jnp.asarray(PROB if info.is_softmax else RNG.uniform(size=(4, 5))), 0.05, 0.95
        )

        # jitted: check_grads calls it (and its jvp, vjp and their transposes) many times
        @jax.jit
        def f(z, t):
            return getattr(jax_impl, name)(z, t, **options)

        check_grads(
            f, (jnp.asarray(Z), targets), order=2, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5
        )


def test_torch_tensor_raises_one_sentence_naming_the_argument():
    torch = pytest.importorskip("torch")
    with pytest.raises(
        TypeError, match=r"^`targets` must be a JAX array.*type\(targets\)=torch\.Tensor\.$"
    ):
        jax_impl.softmax_cross_entropy(Z, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"^`gamma` must be a JAX array.*torch\.Tensor\.$"):
        jax_impl.sigmoid_focal_loss(Z, BINARY, gamma=torch.tensor(2.0))
    with pytest.raises(TypeError, match=r"^`where` must be a JAX array"):
        jax_impl.softmax_focal_loss(Z, INDEX, where=torch.ones(5, dtype=torch.bool))
