"""One target domain in the three readings (issue 31, item 3).

The sigmoid focal loss's weight (1 - p_t)^gamma, p_t = p t + (1 - p)(1 - t), is a power of a
probability only for t in [0, 1]: outside, the spec's value was NaN while both backends returned
a finite number. Now every eager call (spec, torch, JAX, the optax drop-in) raises the same
sentence, JAX under jit gives NaN for those elements, and NaN targets propagate. The other losses
are linear in their targets and take any real value, as torch's own do: there the three must give
one value.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from dualloss import jax_impl, spec
from dualloss import optax as dl_optax
from dualloss import torch_impl as ti

jax = pytest.importorskip("jax")
jnp = jax.numpy

LOGITS = np.array([[0.3, -0.2, 1.0], [2.0, -3.0, 0.5]])


def _targets(bad_value):
    targets = np.array([[1.0, 0.0, 0.25], [0.5, 0.75, 0.0]])
    targets[1, 2] = bad_value
    return targets


def _message(bad_value):
    return (
        "`targets` of the sigmoid focal loss must be probabilities in [0, 1] (its weight "
        f"(1 - p_t)^gamma needs them). Received: {bad_value} at position (1, 2)."
    )


def _eager_calls():
    def torch_fn(x, t):
        return ti.sigmoid_focal_loss(torch.tensor(x), torch.tensor(t), gamma=0.5)

    def torch_module(x, t):
        return ti.SigmoidFocalLoss(gamma=2.0)(torch.tensor(x), torch.tensor(t))

    def torch_float32(x, t):
        return ti.sigmoid_focal_loss(torch.tensor(x).float(), torch.tensor(t).float())

    return {
        "spec": lambda x, t: spec.sigmoid_focal_loss(x, t, gamma=0.5),
        "spec_grad": lambda x, t: spec.sigmoid_focal_loss_grad(x, t),
        "spec_grad_targets": lambda x, t: spec.sigmoid_focal_loss_grad(x, t, wrt="targets"),
        "spec_intermediates": lambda x, t: spec.sigmoid_focal_loss_intermediates(x, t),
        "torch": torch_fn,
        "torch_float32": torch_float32,
        "torch_module": torch_module,
        "jax": lambda x, t: jax_impl.sigmoid_focal_loss(jnp.asarray(x), jnp.asarray(t), gamma=0.5),
        "optax": lambda x, t: dl_optax.sigmoid_focal_loss(jnp.asarray(x), jnp.asarray(t)),
    }


@pytest.mark.parametrize("bad_value", [1.5, -0.5, 2.0, -1e-3])
@pytest.mark.parametrize("call", list(_eager_calls()))
def test_sigmoid_focal_targets_outside_unit_interval_raise_one_sentence(call, bad_value):
    message = _message(bad_value)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        _eager_calls()[call](LOGITS, _targets(bad_value))


def test_sigmoid_focal_targets_outside_unit_interval_are_nan_under_jit():
    loss = jax.jit(lambda x, t: jax_impl.sigmoid_focal_loss(x, t, gamma=0.5, reduction="none"))
    value = np.array(loss(jnp.asarray(LOGITS), jnp.asarray(_targets(1.5))))
    assert np.isnan(value[1, 2])
    value[1, 2] = 0.0
    assert np.isfinite(value).all()
    expected = spec.sigmoid_focal_loss(LOGITS, _targets(0.0), gamma=0.5, reduction="none")
    expected[1, 2] = 0.0
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    mean = jax.jit(jax_impl.sigmoid_focal_loss)(jnp.asarray(LOGITS), jnp.asarray(_targets(-0.5)))
    assert np.isnan(float(mean))


@pytest.mark.parametrize("edge", [0.0, 1.0])
def test_sigmoid_focal_targets_at_the_edges_are_in_the_domain(edge):
    targets = _targets(edge)
    expected = spec.sigmoid_focal_loss(LOGITS, targets, gamma=0.5)
    assert np.isfinite(expected)
    for call in ("torch", "jax"):
        with jax.enable_x64(True):
            value = float(_eager_calls()[call](LOGITS, targets))
        np.testing.assert_allclose(value, expected, rtol=1e-14)


def test_sigmoid_focal_nan_targets_propagate_in_all_three():
    targets = _targets(np.nan)
    assert np.isnan(spec.sigmoid_focal_loss(LOGITS, targets, gamma=0.5))
    for call in ("torch", "jax"):
        assert np.isnan(float(_eager_calls()[call](LOGITS, targets)))


# The losses linear in their targets: any real target, one value in all three.
LINEAR_IN_TARGETS = [
    ("softmax_cross_entropy", {}),
    ("softmax_cross_entropy", {"label_smoothing": 0.1}),
    ("softmax_focal_loss", {"gamma": 0.5}),
    ("softmax_focal_loss", {"gamma": 2.0, "alpha": 0.25}),
    ("sigmoid_cross_entropy", {}),
    ("sigmoid_cross_entropy", {"pos_weight": np.array([2.0, 1.0, 0.5])}),
]


@pytest.mark.parametrize(("name", "options"), LINEAR_IN_TARGETS, ids=lambda v: str(v))
def test_targets_outside_unit_interval_give_one_value_where_the_loss_is_linear_in_them(
    name, options
):
    targets = np.array([[1.5, -0.5, 0.0], [0.2, 0.3, 1.7]])
    expected = getattr(spec, name)(LOGITS, targets, reduction="none", **options)
    grad = getattr(spec, name + "_grad")(LOGITS, targets, reduction="sum", **options)
    assert np.isfinite(expected).all() and np.isfinite(grad).all()

    torch_options = {
        k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in options.items()
    }
    x = torch.tensor(LOGITS, requires_grad=True)
    value = getattr(ti, name)(x, torch.tensor(targets), reduction="none", **torch_options)
    value.sum().backward()
    np.testing.assert_allclose(value.detach().numpy(), expected, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(x.grad.numpy(), grad, rtol=1e-14, atol=1e-15)

    with jax.enable_x64(True):
        jax_options = {
            k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in options.items()
        }
        fn = getattr(jax_impl, name)
        value = fn(jnp.asarray(LOGITS), jnp.asarray(targets), reduction="none", **jax_options)
        jax_grad = jax.grad(lambda z: fn(z, jnp.asarray(targets), reduction="sum", **jax_options))(
            jnp.asarray(LOGITS)
        )
        np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(np.asarray(jax_grad), grad, rtol=1e-14, atol=1e-15)
