"""The spec's fused linear losses against independent references.

* torch's own float64 ``F.linear`` + ``F.cross_entropy`` with autograd (torch semantics: class
  weights, ignore_index, label smoothing, every reduction), and ``F.linear_cross_entropy``;
* a textbook focal loss written here in torch float64 autograd;
* mpmath at 40 digits: exact logits, the textbook losses, ``mpmath.diff`` for the gradients;
* the math: gamma = 0 is cross entropy, the logits' gradient sums to zero over the classes, so
  the bias gradient and the weight gradient summed over the vocabulary vanish.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dualloss import spec

REDUCTIONS = ("none", "mean", "sum")
# float64 against float64 through different formulas (BLAS order, log_softmax vs log1p forms)
RTOL, ATOL = 1e-12, 1e-13


def _problem(seed, n=7, h=5, v=11, scale=1.0, ignore=True):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(n, h)) * scale
    kernel = rng.normal(size=(h, v))
    bias = rng.normal(size=v)
    targets = rng.integers(0, v, size=n)
    if ignore:
        targets[1] = -100
    return hidden, kernel, bias, targets


def _torch_reference(hidden, kernel, bias, targets, loss_fn):
    """Value and gradients (hidden, kernel, bias) of loss_fn(F.linear(...)) by float64 autograd."""
    h = torch.tensor(hidden, requires_grad=True)
    w = torch.tensor(kernel.T.copy(), requires_grad=True)
    b = torch.tensor(bias, requires_grad=True)
    loss = loss_fn(F.linear(h, w, b), torch.tensor(targets))
    loss.sum().backward()
    return loss.detach().numpy(), h.grad.numpy(), w.grad.numpy().T, b.grad.numpy()


def _spec_all(fn, grad_fn, hidden, kernel, bias, targets, **kwargs):
    value = fn(hidden, kernel, targets, bias=bias, **kwargs)
    grads = [grad_fn(hidden, kernel, targets, bias=bias, wrt=w, **kwargs) for w in _WRT]
    return value, *grads


_WRT = ("hidden", "linear_weight", "bias")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
@pytest.mark.parametrize("class_weights", [False, True])
def test_cross_entropy_matches_torch_linear_plus_cross_entropy(
    reduction, label_smoothing, class_weights
):
    hidden, kernel, bias, targets = _problem(0)
    weight = np.linspace(0.5, 2.0, kernel.shape[1]) if class_weights else None
    kwargs = dict(weight=weight, label_smoothing=label_smoothing, reduction=reduction)

    def torch_loss(logits, y):
        w = None if weight is None else torch.tensor(weight)
        return F.cross_entropy(
            logits, y, weight=w, label_smoothing=label_smoothing, reduction=reduction
        )

    expected = _torch_reference(hidden, kernel, bias, targets, torch_loss)
    got = _spec_all(
        spec.linear_softmax_cross_entropy,
        spec.linear_softmax_cross_entropy_grad,
        hidden,
        kernel,
        bias,
        targets,
        **kwargs,
    )
    for name, g, e in zip(("value", *_WRT), got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"{name} {kwargs}")


def test_cross_entropy_matches_torch_linear_cross_entropy_on_batched_hidden():
    hidden, kernel, bias, targets = _problem(1)
    expected = F.linear_cross_entropy(
        torch.tensor(hidden),
        torch.tensor(kernel.T.copy()),
        torch.tensor(targets),
        linear_bias=torch.tensor(bias),
    )
    got = spec.linear_softmax_cross_entropy(hidden, kernel, targets, bias=bias)
    np.testing.assert_allclose(got, expected.item(), rtol=RTOL)
    # (..., H) hidden: the same loss as the flattened rows
    batched = spec.linear_softmax_cross_entropy(
        hidden[:6].reshape(2, 3, -1), kernel, targets[:6].reshape(2, 3), reduction="none"
    )
    flat = spec.linear_softmax_cross_entropy(hidden[:6], kernel, targets[:6], reduction="none")
    assert batched.shape == (2, 3)
    np.testing.assert_array_equal(batched.ravel(), flat)


def _textbook_focal(gamma, alpha, label_smoothing, reduction):
    def loss_fn(logits, y):
        num_classes = logits.shape[-1]
        keep = y != -100
        one_hot = F.one_hot(torch.where(keep, y, 0), num_classes).double()
        t = (1 - label_smoothing) * one_hot + label_smoothing / num_classes
        a = t * (1.0 if alpha is None else torch.tensor(alpha))
        log_p = torch.log_softmax(logits, -1)
        per_row = -(a * (1 - log_p.exp()) ** gamma * log_p).sum(-1)
        per_row = torch.where(keep, per_row, 0.0)
        if reduction == "none":
            return per_row
        if reduction == "sum":
            return per_row.sum()
        return per_row.sum() / keep.sum()

    return loss_fn


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(
    ("gamma", "alpha", "label_smoothing"),
    [(2.0, None, 0.0), (0.5, 0.25, 0.0), (3.3, "vector", 0.2), (1.0, None, 0.1)],
)
def test_focal_loss_matches_textbook_focal_by_autograd(gamma, alpha, label_smoothing, reduction):
    hidden, kernel, bias, targets = _problem(2)
    if alpha == "vector":
        alpha = np.linspace(0.1, 0.9, kernel.shape[1])
    kwargs = dict(gamma=gamma, alpha=alpha, label_smoothing=label_smoothing, reduction=reduction)
    expected = _torch_reference(
        hidden, kernel, bias, targets, _textbook_focal(gamma, alpha, label_smoothing, reduction)
    )
    got = _spec_all(
        spec.linear_softmax_focal_loss,
        spec.linear_softmax_focal_loss_grad,
        hidden,
        kernel,
        bias,
        targets,
        **kwargs,
    )
    for name, g, e in zip(("value", *_WRT), got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-11, atol=ATOL, err_msg=f"{name} {kwargs}")


def _mp_loss(hidden, kernel, bias, target, gamma, label_smoothing):
    """Textbook per-row focal loss (gamma = 0: cross entropy) at mpmath precision."""
    num_classes = len(bias)
    z = [mpmath.fsum(h * w for h, w in zip(hidden, column)) + b for column, b in zip(kernel, bias)]
    top = max(z)
    total = mpmath.fsum(mpmath.exp(zc - top) for zc in z)
    p = [mpmath.exp(zc - top) / total for zc in z]
    loss = 0
    for c in range(num_classes):
        t = (1 - label_smoothing) * (c == target) + mpmath.mpf(label_smoothing) / num_classes
        if t:
            loss -= t * (1 - p[c]) ** gamma * mpmath.log(p[c])
    return loss


@pytest.mark.parametrize(("gamma", "label_smoothing"), [(0.0, 0.0), (2.0, 0.0), (0.5, 0.25)])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_value_and_gradients_match_mpmath(gamma, label_smoothing, scale):
    mpmath.mp.dps = 40
    hidden, kernel, bias, targets = _problem(3, n=2, h=3, v=4, scale=scale, ignore=False)
    columns = [[mpmath.mpf(float(x)) for x in col] for col in kernel.T]
    kwargs = dict(label_smoothing=label_smoothing, reduction="sum")
    if gamma == 0.0:
        fn, grad_fn = spec.linear_softmax_cross_entropy, spec.linear_softmax_cross_entropy_grad
    else:
        fn, grad_fn = spec.linear_softmax_focal_loss, spec.linear_softmax_focal_loss_grad
        kwargs["gamma"] = gamma
    value = fn(hidden, kernel, targets, bias=bias, **kwargs)
    exact = mpmath.fsum(
        _mp_loss([mpmath.mpf(float(x)) for x in row], columns, bias, int(y), gamma, label_smoothing)
        for row, y in zip(hidden, targets)
    )
    assert abs(value - exact) <= 1e-13 * abs(exact) + 1e-300, (value, exact)
    grad_hidden = grad_fn(hidden, kernel, targets, bias=bias, wrt="hidden", **kwargs)
    grad_kernel = grad_fn(hidden, kernel, targets, bias=bias, wrt="linear_weight", **kwargs)
    row, k = 1, 2
    exact_h = mpmath.diff(
        lambda x: _mp_loss(
            [x if j == k else mpmath.mpf(float(hidden[row, j])) for j in range(3)],
            columns, bias, int(targets[row]), gamma, label_smoothing,
        ),
        mpmath.mpf(float(hidden[row, k])),
    )  # fmt: skip
    assert abs(grad_hidden[row, k] - exact_h) <= 1e-11 * (abs(exact_h) + 1e-3)
    i, c = 0, 3

    def along_kernel(x):
        moved = [list(col) for col in columns]
        moved[c][i] = x
        return mpmath.fsum(
            _mp_loss([mpmath.mpf(float(v)) for v in r], moved, bias, int(y), gamma, label_smoothing)
            for r, y in zip(hidden, targets)
        )

    exact_w = mpmath.diff(along_kernel, columns[c][i])
    assert abs(grad_kernel[i, c] - exact_w) <= 1e-11 * (abs(exact_w) + 1e-3)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_focal_gamma_zero_equals_cross_entropy(reduction):
    hidden, kernel, bias, targets = _problem(4)
    kwargs = dict(bias=bias, label_smoothing=0.1, reduction=reduction)
    for wrt in (None, *_WRT):
        if wrt is None:
            ce = spec.linear_softmax_cross_entropy(hidden, kernel, targets, **kwargs)
            focal = spec.linear_softmax_focal_loss(hidden, kernel, targets, gamma=0.0, **kwargs)
        else:
            ce = spec.linear_softmax_cross_entropy_grad(hidden, kernel, targets, wrt=wrt, **kwargs)
            focal = spec.linear_softmax_focal_loss_grad(
                hidden, kernel, targets, gamma=0.0, wrt=wrt, **kwargs
            )
        np.testing.assert_allclose(focal, ce, rtol=1e-14, atol=1e-16, err_msg=str(wrt))


@pytest.mark.parametrize("name", ["linear_softmax_cross_entropy", "linear_softmax_focal_loss"])
def test_logit_gradient_sums_to_zero_through_the_linear_layer(name):
    # sum_c dl/dz_c = 0 per row, so dL/dbias sums to 0 and dL/dW sums to 0 along the vocabulary
    hidden, kernel, bias, targets = _problem(5, scale=10.0)
    grad = getattr(spec, name + "_grad")
    kwargs = dict(bias=bias, label_smoothing=0.2, reduction="sum")
    grad_bias = grad(hidden, kernel, targets, wrt="bias", **kwargs)
    grad_kernel = grad(hidden, kernel, targets, wrt="linear_weight", **kwargs)
    assert abs(grad_bias.sum()) <= 1e-14 * np.abs(grad_bias).sum()
    np.testing.assert_allclose(grad_kernel.sum(axis=1), 0.0, atol=1e-14 * np.abs(grad_kernel).sum())


def test_all_ignored_mean_is_zero_with_zero_gradients():
    hidden, kernel, bias, _ = _problem(6)
    targets = np.full(hidden.shape[0], -100)
    for name in ("linear_softmax_cross_entropy", "linear_softmax_focal_loss"):
        assert getattr(spec, name)(hidden, kernel, targets, bias=bias) == 0.0
        for wrt in _WRT:
            g = getattr(spec, name + "_grad")(hidden, kernel, targets, bias=bias, wrt=wrt)
            assert not np.any(g), (name, wrt)


def test_huge_hidden_norms_give_finite_values_and_gradients():
    hidden, kernel, bias, targets = _problem(7, scale=1e4)
    value = spec.linear_softmax_focal_loss(hidden, kernel, targets, bias=bias, gamma=0.5)
    assert np.isfinite(value)
    for wrt in _WRT:
        g = spec.linear_softmax_focal_loss_grad(
            hidden, kernel, targets, bias=bias, gamma=0.5, wrt=wrt
        )
        assert np.all(np.isfinite(g))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (dict(kernel=np.zeros((4, 11))), ValueError,
         "`linear_weight` must have shape (H, V) with H = 5, the last dimension of hidden. "
         "Received: linear_weight.shape=(4, 11)."),
        (dict(bias=np.zeros(3)), ValueError,
         "`bias` must be a vector of length 11 (one entry per class). Received: bias.shape=(3,)."),
        (dict(targets=np.zeros(7)), TypeError,
         "`targets` must hold integer class indices. Received: targets.dtype=float64."),
        (dict(targets=np.zeros(6, dtype=int)), ValueError,
         "`targets` of class indices must have shape (7,), the hidden shape (7, 5) without its "
         "last dimension. Received: targets.shape=(6,)."),
        (dict(hidden=np.zeros((7, 5), dtype=int)), TypeError,
         "`hidden` must have a floating dtype. Received: hidden.dtype=int64."),
        (dict(chunk_size=0), ValueError, "`chunk_size` must be >= 1. Received: chunk_size=0."),
        (dict(reduction="avg"), ValueError,
         "`reduction` must be one of 'none', 'mean', 'sum'. Received: reduction='avg'."),
    ],
)  # fmt: skip
def test_bad_input_raises_one_sentence(change, error, message):
    hidden, kernel, bias, targets = _problem(8)
    args = dict(hidden=hidden, kernel=kernel, bias=bias, targets=targets)
    kwargs = {}
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(error, match="^" + __import__("re").escape(message) + "$"):
        spec.linear_softmax_cross_entropy(
            args["hidden"], args["kernel"], args["targets"], bias=args["bias"], **kwargs
        )


def test_bias_gradient_without_bias_is_refused():
    hidden, kernel, _, targets = _problem(9)
    with pytest.raises(ValueError, match="needs `bias` to be given"):
        spec.linear_softmax_cross_entropy_grad(hidden, kernel, targets, wrt="bias")
