"""The spec's reductions and weighted means against torch itself, in float64.

torch's ``cross_entropy`` and ``binary_cross_entropy_with_logits`` are the semantics the spec
pins down (DESIGN 6): values and autograd gradients must agree to RTOL (both sides are float64,
a handful of roundings apart) in every reduction. The one deliberate difference: a mean over no
kept element is 0 in the spec, NaN in torch.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from dualloss import spec  # noqa: E402

RTOL = 1e-12
ATOL = 1e-15
REDUCTIONS = ["none", "mean", "sum"]


def _torch_value_and_grad(fn, logits, *args, **kwargs):
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    args = [torch.as_tensor(a) if isinstance(a, np.ndarray) else a for a in args]
    kwargs = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    loss = fn(z, *args, **kwargs)
    loss.sum().backward()
    return loss.detach().numpy(), z.grad.numpy()


def _assert_close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def _problem(shape, seed=0):
    """Logits (N, C, d...) in torch layout, index targets with one ignored, soft targets."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=3.0, size=shape)
    index = rng.integers(0, shape[1], size=(shape[0],) + shape[2:])
    index.flat[1] = -100
    soft = rng.random(shape)
    soft /= soft.sum(axis=1, keepdims=True)
    return z, index, soft


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("targets_kind", ["index", "prob"])
@pytest.mark.parametrize("shape", [(6, 4), (3, 5, 2), (2, 3, 2, 3)])
def test_softmax_cross_entropy_matches_torch_cross_entropy(
    shape, targets_kind, weighted, label_smoothing, reduction
):
    z, index, soft = _problem(shape)
    targets = index if targets_kind == "index" else soft
    weight = np.linspace(0.5, 2.0, shape[1]) if weighted else None
    kwargs = dict(weight=weight, label_smoothing=label_smoothing, reduction=reduction)
    call = f"spec.softmax_cross_entropy(axis=1, {targets_kind} targets, shape={shape}, {kwargs})"
    want_value, want_grad = _torch_value_and_grad(F.cross_entropy, z, targets, **kwargs)
    value = spec.softmax_cross_entropy(z, targets, axis=1, **kwargs)
    grad = spec.softmax_cross_entropy_grad(z, targets, axis=1, **kwargs)
    _assert_close(value, want_value, f"{call} value vs torch")
    _assert_close(grad, want_grad, f"{call} grad vs torch")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ignore_index", [-100, 1])
def test_softmax_cross_entropy_ignore_index_matches_torch(ignore_index, reduction):
    z, index, _ = _problem((8, 3), seed=1)
    index[index == -100] = ignore_index
    index[:3] = ignore_index
    weight = np.array([0.2, 1.5, 3.0])
    kwargs = dict(weight=weight, ignore_index=ignore_index, reduction=reduction)
    want_value, want_grad = _torch_value_and_grad(F.cross_entropy, z, index, **kwargs)
    call = f"spec.softmax_cross_entropy({kwargs})"
    _assert_close(spec.softmax_cross_entropy(z, index, **kwargs), want_value, call)
    _assert_close(spec.softmax_cross_entropy_grad(z, index, **kwargs), want_grad, call)


@pytest.mark.parametrize("weighted", [False, True])
def test_all_ignored_mean_is_zero_in_spec_where_torch_gives_nan(weighted):
    z, _, _ = _problem((4, 3), seed=2)
    index = np.full(4, -100)
    weight = np.array([0.2, 1.5, 3.0]) if weighted else None
    torch_value, torch_grad = _torch_value_and_grad(F.cross_entropy, z, index, weight=weight)
    # the documented deviation (DESIGN 5): torch divides 0 by 0
    assert np.isnan(torch_value), f"torch now gives {torch_value}: revisit DESIGN 5"
    value = spec.softmax_cross_entropy(z, index, weight=weight)
    grad = spec.softmax_cross_entropy_grad(z, index, weight=weight)
    assert value == 0.0 and np.all(grad == 0.0), f"spec.softmax_cross_entropy: {value}, {grad}"
    # 'sum' agrees with torch: nothing to add up
    torch_sum, _ = _torch_value_and_grad(F.cross_entropy, z, index, weight=weight, reduction="sum")
    assert spec.softmax_cross_entropy(z, index, weight=weight, reduction="sum") == torch_sum == 0.0


@pytest.mark.parametrize("targets_kind", ["index", "prob"])
def test_class_axis_1_equals_spec_default_axis_on_moved_logits(targets_kind):
    z, index, soft = _problem((2, 4, 3, 2), seed=3)
    targets = index if targets_kind == "index" else soft
    moved_targets = index if targets_kind == "index" else np.moveaxis(soft, 1, -1)
    for reduction in REDUCTIONS:
        value = spec.softmax_cross_entropy(z, targets, axis=1, reduction=reduction)
        moved = spec.softmax_cross_entropy(
            np.moveaxis(z, 1, -1), moved_targets, reduction=reduction
        )
        _assert_close(value, moved, f"spec.softmax_cross_entropy(axis=1, {reduction}) vs axis=-1")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("pos_weight", [False, True])
@pytest.mark.parametrize("weight", [None, "element", "row"])
@pytest.mark.parametrize("shape", [(7,), (4, 3), (2, 3, 4)])
def test_sigmoid_cross_entropy_matches_torch_bce_with_logits(shape, weight, pos_weight, reduction):
    rng = np.random.default_rng(4)
    z = rng.normal(scale=4.0, size=shape)
    z.flat[0] = 40.0
    t = rng.random(shape)
    t.flat[1] = 1.0
    t.flat[-1] = 0.0
    kwargs = dict(reduction=reduction)
    if weight == "element":
        kwargs["weight"] = rng.random(shape) * 2
    elif weight == "row":
        kwargs["weight"] = rng.random(shape[-1:]) * 2
    if pos_weight:
        kwargs["pos_weight"] = rng.random(shape[-1:]) * 3
    call = f"spec.sigmoid_cross_entropy(shape={shape}, {sorted(kwargs)}, {reduction})"
    want_value, want_grad = _torch_value_and_grad(
        F.binary_cross_entropy_with_logits, z, t, **kwargs
    )
    _assert_close(spec.sigmoid_cross_entropy(z, t, **kwargs), want_value, f"{call} value")
    _assert_close(spec.sigmoid_cross_entropy_grad(z, t, **kwargs), want_grad, f"{call} grad")
