"""`where` semantics of the spec (optax's, DESIGN 2), and jax_impl agreeing with it."""

from __future__ import annotations

import numpy as np
import pytest

from dualloss import losses, spec

SOFTMAX = [info.name for info in losses.of_family("softmax")]
Z = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 2.0], [3.0, 1.0, 0.0], [0.5, -1.0, 2.0]])
INDEX = np.array([2, 0, 1, 0])
PROB = np.array([[0.5, 0.0, 0.5], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])


def _call(name, targets, reduction="none", grad=False, **kwargs):
    fn = getattr(spec, name + ("_grad" if grad else ""))
    return fn(Z, targets, reduction=reduction, **kwargs)


@pytest.mark.parametrize("name", SOFTMAX)
@pytest.mark.parametrize("targets", [INDEX, PROB], ids=["index", "prob"])
def test_batch_shape_mask_equals_dropping_the_rows(name, targets):
    keep = np.array([True, False, True, False])
    for reduction in ["none", "mean", "sum"]:
        masked = _call(name, targets, reduction, where=keep)
        masked_grad = _call(name, targets, reduction, grad=True, where=keep)
        kept = getattr(spec, name)(Z[keep], targets[keep], reduction=reduction)
        kept_grad = getattr(spec, name + "_grad")(Z[keep], targets[keep], reduction=reduction)
        if reduction == "none":
            np.testing.assert_array_equal(masked[~keep], 0.0)
            masked = masked[keep]
        np.testing.assert_allclose(masked, kept, rtol=1e-15)
        np.testing.assert_array_equal(masked_grad[~keep], 0.0)
        np.testing.assert_allclose(masked_grad[keep], kept_grad, rtol=1e-15)
    # the same as a logits-shaped mask that is constant along the class axis
    np.testing.assert_array_equal(
        _call(name, targets, "mean", where=keep), _call(name, targets, "mean", where=keep[:, None])
    )


@pytest.mark.parametrize("name", SOFTMAX)
def test_row_with_no_class_left_is_ignored_also_with_label_smoothing(name):
    where = np.ones((4, 3), bool)
    where[1] = False
    for targets in [INDEX, PROB]:
        for eps in [0.0, 0.2]:
            loss = _call(name, targets, "none", where=where, label_smoothing=eps)
            grad = _call(name, targets, "mean", grad=True, where=where, label_smoothing=eps)
            assert loss[1] == 0.0 and np.all(grad[1] == 0.0) and np.all(np.isfinite(grad))
            mean = _call(name, targets, "mean", where=where, label_smoothing=eps)
            others = np.delete(np.arange(4), 1)
            expected = getattr(spec, name)(
                Z[others], targets[others], label_smoothing=eps, reduction="mean"
            )
            np.testing.assert_allclose(mean, expected, rtol=1e-15)


@pytest.mark.parametrize("name", SOFTMAX)
def test_index_target_on_a_masked_class_is_ignored(name):
    where = np.array([True, True, False])  # class 2: row 0's target
    loss = _call(name, INDEX, "none", where=where)
    assert loss[0] == 0.0 and np.all(np.isfinite(loss))
    grad = _call(name, INDEX, "mean", grad=True, where=where)
    assert np.all(grad[0] == 0.0) and np.all(grad[:, 2] == 0.0)
    np.testing.assert_allclose(
        _call(name, INDEX, "mean", where=where),
        getattr(spec, name)(Z[1:, :2], INDEX[1:], reduction="mean"),
        rtol=1e-15,
    )


@pytest.mark.parametrize("name", SOFTMAX)
def test_probability_mass_on_a_masked_class_leaves_the_sum(name):
    where = np.array([True, True, False])
    loss = _call(name, PROB, "none", where=where)
    compact = getattr(spec, name)(Z[:, :2], PROB[:, :2], reduction="none")
    np.testing.assert_allclose(loss, compact, rtol=1e-15)  # not renormalised, not +inf


def test_class_mask_wins_when_a_mask_fits_both_shapes():
    # square logits: a (C,) mask broadcasts to the logits, so it masks classes
    z = Z[:3]
    where = np.array([True, False, True])
    as_classes = spec.softmax_cross_entropy(z, INDEX[:3], where=where[None, :], reduction="none")
    np.testing.assert_array_equal(
        spec.softmax_cross_entropy(z, INDEX[:3], where=where, reduction="none"), as_classes
    )


@pytest.mark.parametrize("name", SOFTMAX)
def test_batch_mask_with_the_class_axis_in_the_middle(name):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2, 4, 3))
    targets = rng.integers(0, 4, size=(2, 3))
    keep = rng.uniform(size=(2, 3)) > 0.4
    got = getattr(spec, name)(z, targets, axis=1, where=keep, reduction="none")
    moved = getattr(spec, name)(
        np.moveaxis(z, 1, -1), targets, where=keep[..., None], reduction="none"
    )
    np.testing.assert_array_equal(got, moved)
    assert np.all(got[~keep] == 0.0)


def test_jax_impl_agrees_with_the_spec_on_every_where_case():
    jax = pytest.importorskip("jax")
    from dualloss import jax_impl

    masks = [
        np.array([True, False, True, False]),
        np.array([True, True, False]),
        np.array([[True, True, False], [False] * 3, [True] * 3, [False, False, True]]),
    ]
    with jax.enable_x64(True):
        for name in SOFTMAX:
            for targets in [INDEX, PROB]:
                for where in masks:
                    for eps in [0.0, 0.1]:
                        for reduction in ["none", "mean"]:
                            kwargs = dict(where=where, label_smoothing=eps, reduction=reduction)
                            want = getattr(spec, name)(Z, targets, **kwargs)
                            got = getattr(jax_impl, name)(Z, targets, **kwargs)
                            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
                            want = getattr(spec, name + "_grad")(Z, targets, **kwargs)
                            got = jax.grad(
                                lambda z, f=getattr(jax_impl, name), t=targets, k=kwargs: f(
                                    z, t, **k
                                ).sum()
                            )(Z)
                            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
