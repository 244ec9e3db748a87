"""dualloss.optax against optax itself: signatures, values and gradients, and where they differ."""

from __future__ import annotations

import inspect
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dualloss import jax_impl
from dualloss import optax as doptax

NAMES = doptax.__all__
RTOL = 2e-6


def _both(name, *args, **kwargs):
    """(ours, optax's) values and gradients of the summed loss w.r.t. the logits, under jit as
    in training (eager JAX dispatches each op on its own: seconds per call; eager calls agree
    with jitted ones in tests/test_jax_transforms.py)."""
    out = []
    for module in (doptax, optax):
        fn = getattr(module, name)

        def value(x, fn=fn):
            return fn(x, *args[1:], **kwargs)

        def total(x, fn=fn):
            return fn(x, *args[1:], **kwargs).sum()

        out.append((jax.jit(value)(args[0]), jax.jit(jax.grad(total))(args[0])))
    return out


def _assert_same(name, *args, **kwargs):
    (ours, ours_grad), (theirs, theirs_grad) = _both(name, *args, **kwargs)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(ours_grad, theirs_grad, rtol=RTOL, atol=RTOL)


def test_signatures_and_defaults_are_optax_s():
    for name in NAMES:
        ours = inspect.signature(getattr(doptax, name)).parameters.values()
        theirs = inspect.signature(getattr(optax.losses, name)).parameters.values()
        assert [(p.name, p.default, p.kind) for p in ours] == [
            (p.name, p.default, p.kind) for p in theirs
        ], name


def test_jax_impl_aliases_are_the_same_functions():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 2, 5)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, size=(3,)))
    np.testing.assert_array_equal(
        jax_impl.softmax_cross_entropy_with_integer_labels(logits, labels, axis=(1, 2)),
        doptax.softmax_cross_entropy_with_integer_labels(logits, labels, axis=(1, 2)),
    )
    targets = jnp.asarray(rng.integers(0, 2, size=(3, 2, 5)))
    np.testing.assert_array_equal(
        jax_impl.sigmoid_binary_cross_entropy(logits, targets),
        doptax.sigmoid_binary_cross_entropy(logits, targets),
    )


# ----------------------------------------------------------------------------------------------
# Typical inputs: values and gradients equal optax's
# ----------------------------------------------------------------------------------------------

RNG = np.random.default_rng(1)
LOGITS = jnp.asarray(RNG.normal(size=(4, 3, 6)) * 3, jnp.float32)
LABELS = jnp.asarray(RNG.integers(0, 6, size=(4, 3)))
PROBS = jnp.asarray(RNG.dirichlet(np.ones(6), size=(4, 3)), jnp.float32)
CLASS_WHERE = jnp.asarray(RNG.uniform(size=(4, 3, 6)) > 0.3).at[..., 0].set(True)
BATCH_WHERE = jnp.asarray([[True, False, True], [False, False, False], [True] * 3, [False] * 3])
# labels moved onto a class inside CLASS_WHERE (where the two agree; see the differences below)
LABELS_IN = jnp.where(jnp.take_along_axis(CLASS_WHERE, LABELS[..., None], -1)[..., 0], LABELS, 0)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"axis": 1}, {"axis": 0}, {"where": BATCH_WHERE}, {"where": CLASS_WHERE}],
    ids=["default", "axis=1", "axis=0", "where-batch", "where-logits"],
)
def test_integer_labels_match_optax(kwargs):
    axis = kwargs.get("axis", -1)
    logits = jnp.moveaxis(LOGITS, -1, axis)
    labels = LABELS_IN if "where" in kwargs else LABELS
    _assert_same("softmax_cross_entropy_with_integer_labels", logits, labels, **kwargs)


@pytest.mark.parametrize("axis", [(2, 3), (1, 3), (3, 1), (0, 2, 3)])
def test_integer_labels_with_a_tuple_of_axes_match_optax(axis):
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(2, 3, 4, 5)) * 3, jnp.float32)
    batch = tuple(n for i, n in enumerate(logits.shape) if i not in axis)
    size = int(np.prod([logits.shape[i] for i in axis]))
    labels = jnp.asarray(rng.integers(0, size, size=batch))
    _assert_same("softmax_cross_entropy_with_integer_labels", logits, labels, axis=axis)
    where = jnp.asarray(rng.uniform(size=batch) > 0.4)
    _assert_same(
        "softmax_cross_entropy_with_integer_labels", logits, labels, axis=axis, where=where
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"axis": 0},
        {"axis": (1, 2)},
        {"axis": None},
        {"where": BATCH_WHERE},
        {"where": CLASS_WHERE},
    ],
    ids=["default", "axis=0", "axis=(1,2)", "axis=None", "where-batch", "where-logits"],
)
def test_probability_labels_match_optax(kwargs):
    axis = kwargs.get("axis", -1)
    logits, labels = LOGITS, PROBS
    if axis == 0:
        logits, labels = jnp.moveaxis(LOGITS, -1, 0), jnp.moveaxis(PROBS, -1, 0)
    _assert_same("softmax_cross_entropy", logits, labels, **kwargs)


def test_probability_labels_on_masked_classes_leave_the_sum_as_in_optax():
    # mass on classes outside `where` is dropped (not renormalised, not +inf)
    _assert_same("softmax_cross_entropy", LOGITS, PROBS, where=~CLASS_WHERE.at[..., 0].set(False))


def test_integer_one_hot_labels_are_cast_as_in_optax():
    one_hot = jax.nn.one_hot(LABELS, 6, dtype=jnp.int32)
    _assert_same("softmax_cross_entropy", LOGITS, one_hot)


def test_fully_masked_rows_give_zero_and_zero_gradient_as_in_optax():
    where = jnp.zeros((4, 3), bool).at[0, 0].set(True)
    for name, labels in [
        ("softmax_cross_entropy_with_integer_labels", LABELS),
        ("softmax_cross_entropy", PROBS),
    ]:
        (ours, ours_grad), _ = _both(name, LOGITS, labels, where=where)
        assert bool(jnp.all(ours.ravel()[1:] == 0.0)) and float(ours[0, 0]) > 0.0
        assert bool(jnp.all(ours_grad[1:] == 0.0)) and bool(jnp.all(ours_grad[0, 1:] == 0.0))
        _assert_same(name, LOGITS, labels, where=where)


@pytest.mark.parametrize(
    "labels",
    [
        jnp.asarray(RNG.uniform(size=(4, 5)), jnp.float32),
        jnp.asarray(RNG.integers(0, 2, size=(4, 5))),  # integer 0/1 labels are cast
        jnp.asarray(RNG.uniform(size=(5,)), jnp.float32),  # and broadcast
    ],
    ids=["soft", "int01", "broadcast"],
)
def test_sigmoid_losses_match_optax(labels):
    logits = jnp.asarray(RNG.normal(size=(4, 5)) * 4, jnp.float32)
    _assert_same("sigmoid_binary_cross_entropy", logits, labels)
    for kwargs in [{}, {"gamma": 0.5, "alpha": 0.25}, {"gamma": 0.0}, {"gamma": 3.3}]:
        (ours, ours_grad), (theirs, theirs_grad) = _both(
            "sigmoid_focal_loss", logits, labels, **kwargs
        )
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours_grad, theirs_grad, rtol=1e-5, atol=1e-6)


def test_sigmoid_focal_loss_takes_traced_gamma_and_alpha_as_optax():
    logits = jnp.asarray(RNG.normal(size=(6,)) * 3, jnp.float32)
    labels = jnp.asarray(RNG.integers(0, 2, size=(6,)), jnp.float32)
    # both take alpha and gamma as jit arguments and differentiate w.r.t. them
    results = [
        jax.jit(
            jax.grad(
                lambda a, g, m=m: m.sigmoid_focal_loss(logits, labels, alpha=a, gamma=g).sum(),
                argnums=(0, 1),
            )
        )(0.25, 1.5)
        for m in (doptax, optax)
    ]
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# Where dualloss and optax differ (documented in dualloss.optax)
# ----------------------------------------------------------------------------------------------


def test_minus_inf_logit_with_label_zero_is_finite_where_optax_gives_nan():
    logits = jnp.asarray([[0.0, -jnp.inf, 1.0]])
    labels = jnp.asarray([[1.0, 0.0, 0.0]])
    (ours, ours_grad), (theirs, _) = _both("softmax_cross_entropy", logits, labels)
    assert bool(jnp.isnan(theirs[0]))  # optax: 0 * log 0 = NaN
    np.testing.assert_allclose(ours, [np.log1p(np.e)], rtol=RTOL)
    assert bool(jnp.all(jnp.isfinite(ours_grad))) and float(ours_grad[0, 1]) == 0.0


def test_label_on_a_masked_class_is_ignored_where_optax_gives_a_meaningless_number():
    logits = jnp.asarray([[3.0, 0.0, 0.0]])
    where = jnp.asarray([[False, True, True]])
    (ours, ours_grad), (theirs, _) = _both(
        "softmax_cross_entropy_with_integer_labels", logits, jnp.asarray([0]), where=where
    )
    # optax: logsumexp over the unmasked classes minus the masked label's logit, negative here
    np.testing.assert_allclose(theirs, [np.log(2.0) - 3.0], rtol=RTOL)
    assert float(ours[0]) == 0.0 and bool(jnp.all(ours_grad == 0.0))


def test_importing_dualloss_optax_does_not_import_torch_or_optax():
    code = (
        "import sys, dualloss.optax; "
        "print(sorted(m for m in ('torch', 'optax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_torch_tensor_raises_one_sentence_naming_the_argument():
    torch = pytest.importorskip("torch")
    message = (
        "`labels` must be a JAX array, a NumPy array or a Python number, not a torch tensor "
        "(convert it with `labels.numpy()` first). Received: type(labels)=torch.Tensor."
    )
    with pytest.raises(TypeError) as info:
        doptax.sigmoid_binary_cross_entropy(jnp.zeros(3), torch.zeros(3))
    assert str(info.value) == message
