"""torch_impl's fused linear losses: torch semantics against torch itself, float64 against the
spec, the streaming contract (no (N, V) tensor), autograd behaviour and bad input.

The adversarial regions in float32 / bfloat16 for both backends are in test_linear_parity.py
(through ``dualloss.parity.linear``).
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from dualloss import _checks, spec
from dualloss import torch_impl as T

REDUCTIONS = ("none", "mean", "sum")
WRT = ("hidden", "linear_weight", "bias")


def _inputs(seed=0, n=37, h=8, v=50, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g, dtype=torch.float64) * scale).to(dtype)
    kernel = torch.randn(v, h, generator=g, dtype=torch.float64).to(dtype)
    bias = torch.randn(v, generator=g, dtype=torch.float64).to(dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    targets[3] = -100
    return hidden, kernel, bias, targets


def _value_and_grads(fn, hidden, kernel, bias, targets, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in (hidden, kernel, bias)]
    loss = fn(leaves[0], leaves[1], targets, **{**kwargs, "bias": leaves[2]})
    loss.sum().backward()
    return loss.detach(), *(x.grad for x in leaves)


# ----------------------------------------------------------------------------------------------
# torch semantics against torch itself
# ----------------------------------------------------------------------------------------------


def _torch_unfused(hidden, kernel, bias, targets, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in (hidden, kernel, bias)]
    loss = F.cross_entropy(F.linear(*leaves), targets, **kwargs)
    loss.sum().backward()
    return loss.detach(), *(x.grad for x in leaves)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.25])
@pytest.mark.parametrize("class_weights", [False, True])
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_cross_entropy_matches_torch_linear_plus_cross_entropy(
    reduction, label_smoothing, class_weights, chunk_size
):
    hidden, kernel, bias, targets = _inputs()
    weight = (
        torch.linspace(0.5, 2.0, kernel.shape[0], dtype=torch.float64) if class_weights else None
    )
    kwargs = dict(weight=weight, label_smoothing=label_smoothing, reduction=reduction)
    expected = _torch_unfused(hidden, kernel, bias, targets, **kwargs)
    got = _value_and_grads(
        T.linear_softmax_cross_entropy,
        hidden,
        kernel,
        bias,
        targets,
        chunk_size=chunk_size,
        **kwargs,
    )
    for name, g, e in zip(("value", *WRT), got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-14, msg=f"{name} {kwargs}")


def test_drop_in_has_the_exact_signature_of_torch_linear_cross_entropy():
    assert inspect.signature(T.linear_cross_entropy).parameters.keys() == (
        inspect.signature(F.linear_cross_entropy).parameters.keys()
    )
    for name, parameter in inspect.signature(F.linear_cross_entropy).parameters.items():
        ours = inspect.signature(T.linear_cross_entropy).parameters[name]
        assert (ours.kind, ours.default) == (parameter.kind, parameter.default), name


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("class_weights", [False, True])
def test_drop_in_matches_torch_linear_cross_entropy(reduction, chunked, class_weights):
    hidden, kernel, bias, targets = _inputs(1)
    weight = torch.rand(kernel.shape[0], dtype=torch.float64) if class_weights else None
    options = torch.nn.LinearCrossEntropyOptions() if chunked else None
    kwargs = dict(linear_bias=bias, weight=weight, reduction=reduction, options=options)
    h1, h2 = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    k1, k2 = kernel.clone().requires_grad_(), kernel.clone().requires_grad_()
    expected = F.linear_cross_entropy(h1, k1, targets, **kwargs)
    got = T.linear_cross_entropy(h2, k2, targets, **kwargs)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    expected.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(k2.grad, k1.grad, rtol=1e-12, atol=1e-14)


def test_drop_in_label_smoothing_and_unbatched_input_match_torch():
    hidden, kernel, bias, targets = _inputs(2)
    expected = F.linear_cross_entropy(hidden, kernel, targets, label_smoothing=0.3)
    got = T.linear_cross_entropy(hidden, kernel, targets, label_smoothing=0.3)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    one = F.linear_cross_entropy(hidden[0], kernel, targets[0], reduction="none")
    torch.testing.assert_close(
        T.linear_cross_entropy(hidden[0], kernel, targets[0], reduction="none"), one
    )


def test_drop_in_probability_targets_take_the_reference_path_as_torch():
    hidden, kernel, bias, _ = _inputs(3)
    probs = torch.softmax(torch.randn(hidden.shape[0], kernel.shape[0], dtype=torch.float64), -1)
    expected = F.linear_cross_entropy(hidden, kernel, probs, linear_bias=bias)
    got = T.linear_cross_entropy(hidden, kernel, probs, linear_bias=bias)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    with pytest.raises(RuntimeError, match="ignore_index cannot be specified"):
        T.linear_cross_entropy(hidden, kernel, probs, ignore_index=-100)


def test_all_ignored_mean_is_zero_where_torch_chunked_gives_nan():
    hidden, kernel, bias, targets = _inputs(4)
    targets = torch.full_like(targets, -100)
    h = hidden.clone().requires_grad_()
    loss = T.linear_cross_entropy(h, kernel, targets, options=torch.nn.LinearCrossEntropyOptions())
    loss.backward()
    assert loss.item() == 0.0 and not h.grad.any()
    theirs = F.linear_cross_entropy(
        hidden, kernel, targets, options=torch.nn.LinearCrossEntropyOptions()
    )
    assert theirs.isnan(), "torch's chunked all-ignored mean is documented as NaN"


# ----------------------------------------------------------------------------------------------
# float64 against the spec
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(
    ("gamma", "alpha", "label_smoothing"),
    [(2.0, None, 0.0), (0.5, 0.25, 0.0), (3.3, "vector", 0.2), (1.0, None, 0.1)],
)
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_focal_matches_the_spec_in_float64(gamma, alpha, label_smoothing, reduction, scale):
    hidden, kernel, bias, targets = _inputs(5, scale=scale)
    if alpha == "vector":
        alpha = torch.linspace(0.1, 0.9, kernel.shape[0], dtype=torch.float64)
    kwargs = dict(gamma=gamma, label_smoothing=label_smoothing, reduction=reduction)
    got = _value_and_grads(
        T.linear_softmax_focal_loss,
        hidden,
        kernel,
        bias,
        targets,
        alpha=alpha,
        chunk_size=8,
        **kwargs,
    )
    args = (hidden.numpy(), kernel.numpy().T, targets.numpy())
    spec_alpha = alpha.numpy() if isinstance(alpha, torch.Tensor) else alpha
    kwargs.update(bias=bias.numpy(), alpha=spec_alpha)
    expected = [spec.linear_softmax_focal_loss(*args, **kwargs)] + [
        spec.linear_softmax_focal_loss_grad(*args, wrt=wrt, **kwargs) for wrt in WRT
    ]
    expected[2] = expected[2].T
    for name, g, e in zip(("value", *WRT), got, expected, strict=True):
        e = np.asarray(e)
        np.testing.assert_allclose(
            g.numpy(), e, rtol=1e-11, atol=1e-13 * np.abs(e).max(), err_msg=f"{name} {kwargs}"
        )


def test_focal_gamma_zero_equals_cross_entropy():
    hidden, kernel, bias, targets = _inputs(6)
    for ls in (0.0, 0.2):
        ce = _value_and_grads(
            T.linear_softmax_cross_entropy, hidden, kernel, bias, targets, label_smoothing=ls
        )
        focal = _value_and_grads(
            T.linear_softmax_focal_loss,
            hidden,
            kernel,
            bias,
            targets,
            gamma=0.0,
            label_smoothing=ls,
        )
        for a, b in zip(ce, focal, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


def test_chunk_size_changes_nothing_but_rounding():
    hidden, kernel, bias, targets = _inputs(7)
    results = [
        _value_and_grads(T.linear_softmax_focal_loss, hidden, kernel, bias, targets, chunk_size=c)
        for c in (1, 5, 37, 1000)
    ]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


# ----------------------------------------------------------------------------------------------
# Streaming: no (N, V) tensor in forward or backward
# ----------------------------------------------------------------------------------------------


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel())
        return out


@pytest.mark.parametrize("name", ["linear_softmax_cross_entropy", "linear_softmax_focal_loss"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_no_tensor_of_the_logits_size_is_created(name, label_smoothing, reduction):
    n, h, v, rows = 256, 16, 1000, 32
    hidden = torch.randn(n, h, requires_grad=True)
    kernel = torch.randn(v, h, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    with _LargestTensor() as mode:
        loss = getattr(T, name)(
            hidden,
            kernel,
            targets,
            label_smoothing=label_smoothing,
            reduction=reduction,
            chunk_size=rows,
        )
        loss.sum().backward()
    # the largest tensors: one (rows, V) block of logits and the (V, H) gradient, never (N, V)
    assert mode.largest == max(rows * v, v * h), mode.largest
    # the unfused loss does hold one (planted check that the probe sees it)
    with _LargestTensor() as mode:
        F.cross_entropy(F.linear(hidden, kernel), targets).backward()
    assert mode.largest == n * v


def test_default_chunk_size_bounds_the_block():
    assert _checks.default_chunk_size(4096, 32000) * 32000 <= 1 << 22
    assert _checks.default_chunk_size(3, 32000) == 3
    assert _checks.default_chunk_size(10, 10**8) == 1
    # torch_impl's rule: up to 1/16 of the logits, at most 16M entries
    assert _checks.default_chunk_size(4096, 32000, fraction=16) == 256
    assert _checks.default_chunk_size(8192, 128000, fraction=16) * 128000 <= 1 << 24


# ----------------------------------------------------------------------------------------------
# Autograd behaviour, dtypes, bad input
# ----------------------------------------------------------------------------------------------


def test_second_backward_with_retain_graph_gives_the_same_gradients():
    hidden, kernel, bias, targets = _inputs(8)
    h = hidden.clone().requires_grad_()
    loss = T.linear_softmax_cross_entropy(h, kernel, targets, bias=bias)
    (first,) = torch.autograd.grad(loss * 3.0, h, retain_graph=True)
    (second,) = torch.autograd.grad(loss * 3.0, h)
    # the first scales the precomputed gradient, the second recomputes it: rounding order only
    torch.testing.assert_close(first, second, rtol=1e-13, atol=1e-16)


def test_create_graph_raises_instead_of_a_silent_none():
    hidden, kernel, _, targets = _inputs(9)
    h = hidden.clone().requires_grad_()
    loss = T.linear_softmax_cross_entropy(h, kernel, targets)
    (grad,) = torch.autograd.grad(loss, h, create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_accumulate_in_float32_and_return_their_dtype(dtype):
    hidden, kernel, bias, targets = _inputs(10, n=300, v=64)
    got = _value_and_grads(
        T.linear_softmax_focal_loss,
        hidden.to(dtype),
        kernel.to(dtype),
        bias.to(dtype),
        targets,
        chunk_size=7,
    )
    assert [x.dtype for x in got] == [dtype] * 4
    # the spec at the rounded inputs; float32 logits and accumulators leave half-precision
    # rounding of the result (one ULP, 2^-8 for bfloat16) plus float32 noise
    args = (hidden.to(dtype).double().numpy(), kernel.to(dtype).double().numpy().T, targets.numpy())
    b = bias.to(dtype).double().numpy()
    unit = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    value = spec.linear_softmax_focal_loss(*args, bias=b)
    assert abs(got[0].double().item() - value) <= unit * abs(value)
    grad_w = spec.linear_softmax_focal_loss_grad(*args, bias=b, wrt="linear_weight").T
    np.testing.assert_allclose(
        got[2].double().numpy(), grad_w, rtol=unit, atol=unit * np.abs(grad_w).max() * 1e-2
    )


def _bad(**change):
    hidden, kernel, bias, targets = _inputs(11, dtype=torch.float32)
    args = dict(hidden=hidden, kernel=kernel, targets=targets)
    kwargs = {}
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    return args["hidden"], args["kernel"], args["targets"], kwargs


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (dict(kernel=torch.zeros(50, 7)), ValueError,
         "`linear_weight` must have shape (V, H) with H = 8, the last dimension of hidden. "
         "Received: linear_weight.shape=(50, 7)."),
        (dict(bias=torch.zeros(3)), ValueError,
         "`bias` must be a vector of length 50 (one entry per class). Received: bias.shape=(3,)."),
        (dict(targets=torch.zeros(37)), TypeError,
         "`targets` must hold integer class indices. Received: targets.dtype=float32."),
        (dict(targets=torch.full((37,), 50)), ValueError,
         "`targets` has class index 50 at position (0,), outside [0, 50) and not "
         "ignore_index=-100."),
        (dict(weight=torch.ones(3)), ValueError,
         "`weight` must be a vector of length 50 (one entry per class). "
         "Received: weight.shape=(3,)."),
        (dict(weight=torch.ones(50, requires_grad=True)), ValueError,
         "`weight` must not require grad: the fused linear losses give no gradient w.r.t. it (pass "
         "weight.detach()). Received: weight.requires_grad=True."),
        (dict(chunk_size=2.5), TypeError,
         "`chunk_size` must be None or an integer. Received: chunk_size=2.5."),
        (dict(label_smoothing=2.0), ValueError,
         "`label_smoothing` must be in [0, 1]. Received: label_smoothing=2.0."),
        (dict(hidden=np.zeros((37, 8))), TypeError,
         "`hidden` must be a torch.Tensor. Received: hidden of type numpy.ndarray."),
    ],
)  # fmt: skip
def test_bad_input_raises_one_sentence(change, error, message):
    hidden, kernel, targets, kwargs = _bad(**change)
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        T.linear_softmax_cross_entropy(hidden, kernel, targets, **kwargs)


def test_focal_bad_gamma_and_alpha_raise_one_sentence():
    hidden, kernel, targets, _ = _bad()
    with pytest.raises(
        ValueError, match=re.escape("`gamma` must be a finite number >= 0. Received: gamma=-1.0.")
    ):
        T.linear_softmax_focal_loss(hidden, kernel, targets, gamma=-1.0)
    with pytest.raises(
        ValueError,
        match=re.escape("`alpha` must have every entry in [0, 1]. Received: alpha[0]=2.0."),
    ):
        T.linear_softmax_focal_loss(hidden, kernel, targets, alpha=torch.full((50,), 2.0))


def test_drop_in_names_its_own_arguments_in_errors():
    hidden, kernel, bias, targets = _inputs(12)
    with pytest.raises(ValueError, match=re.escape("`linear_bias` must be a vector of length 50")):
        T.linear_cross_entropy(hidden, kernel, targets, linear_bias=bias[:3])
    message = "`target` of class indices must have shape (37,), the input shape (37, 8)"
    with pytest.raises(ValueError, match=re.escape(message)):
        T.linear_cross_entropy(hidden, kernel, targets[:5])
    with pytest.raises(TypeError, match=re.escape("`input` must have a floating dtype")):
        T.linear_cross_entropy(hidden.long(), kernel, targets)
