"""Tests of dualloss.torch_impl against the float64 spec, against torch itself, and for NaN-safety.

Tolerances: one per dtype, in one place, ``dualloss.parity.tolerance`` (its docstring derives
them: K * u * (|reference| + conditioning scale), u the dtype's unit roundoff). Nothing here is
loosened per test.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dualloss import losses, spec
from dualloss import torch_impl as ti
from dualloss.parity import assert_matches_spec, judge

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
SOFTMAX = [info.name for info in losses.of_family("softmax")]
SIGMOID = [info.name for info in losses.of_family("sigmoid")]
REDUCTIONS = ["none", "mean", "sum"]
# the largest logit magnitude per dtype used by the adversarial cases
BIG = {torch.float64: 1e300, torch.float32: 1e38, torch.float16: 6e4, torch.bfloat16: 1e38}


def _np(x):
    return None if x is None else x.detach().to(torch.float64).cpu().numpy()


def _spec_options(options):
    """The same options for the spec: tensors as NumPy, `where` as bool."""
    out = {}
    for key, value in options.items():
        if isinstance(value, torch.Tensor):
            value = value.cpu().numpy() if value.dtype == torch.bool else _np(value)
        out[key] = value
    return out


def _run(loss, logits, targets, options):
    """Value and gradient (of the sum, for 'none') of torch_impl.<loss>, as NumPy float64."""
    logits = logits.detach().clone().requires_grad_(True)
    value = getattr(ti, loss)(logits, targets, **options)
    assert value.dtype == logits.dtype
    value.sum().backward()
    assert logits.grad.dtype == logits.dtype
    return _np(value), _np(logits.grad)


def _check(loss, logits, targets, options):
    """Runs the candidate and judges it with the shared per-dtype tolerance."""
    value, grad = _run(loss, logits, targets, options)
    spec_options = _spec_options(options)
    if loss in SOFTMAX:
        spec_options.setdefault("axis", 1)
    spec_targets = targets.cpu().numpy() if not targets.is_floating_point() else _np(targets)
    context = f"torch_impl.{loss}({options})"
    return assert_matches_spec(
        loss, _np(logits), spec_targets, spec_options, logits.dtype, value, grad, context=context
    )


def _softmax_case(kind, dtype, shape=(6, 5, 3), scale=4.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=g) * scale).to(dtype)
    num_classes = shape[1]
    if kind == "prob":
        targets = torch.softmax(torch.randn(shape, generator=g) * 2, dim=1).to(dtype)
    else:
        targets = torch.randint(0, num_classes, shape[:1] + shape[2:], generator=g)
        targets.view(-1)[0] = -100
    return logits, targets


# ----------------------------------------------------------------------------------------------
# Against the spec: every option, every dtype
# ----------------------------------------------------------------------------------------------


SOFTMAX_OPTIONS = [
    {},
    {"label_smoothing": 0.2},
    {"weight": "vector"},
    {"weight": "vector", "label_smoothing": 0.1},
    {"where": "mask"},
    {"where": "mask", "label_smoothing": 0.3},
    {"ignore_index": 2},
]


def _materialise(options, loss, dtype, num_classes=5):
    options = dict(options)
    g = torch.Generator().manual_seed(1)
    if options.get("weight") == "vector":
        vector = torch.rand(num_classes, generator=g, dtype=torch.float64).to(dtype)
        if losses.get(loss).is_focal:
            del options["weight"]
            options["alpha"] = vector
        else:
            options["weight"] = vector
    if options.get("where") == "mask":
        mask = torch.ones(1, num_classes, 1, dtype=torch.bool)
        mask[0, 3, 0] = False
        options["where"] = mask
    return options


@pytest.mark.exhaustive
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", ["index", "prob"])
@pytest.mark.parametrize("options", SOFTMAX_OPTIONS, ids=repr)
@pytest.mark.parametrize("loss", SOFTMAX)
def test_softmax_matches_spec(loss, options, kind, reduction, dtype):
    logits, targets = _softmax_case(kind, dtype)
    options = _materialise(options, loss, dtype)
    if "where" in options and kind == "index":
        targets = torch.where(targets == 3, 1, targets)  # no target on the masked class
    if "where" in options and kind == "prob":
        targets = targets * options["where"]
    if "ignore_index" in options and kind == "index":
        targets = torch.where(targets == -100, options["ignore_index"], targets)
    options["reduction"] = reduction
    if losses.get(loss).is_focal:
        for gamma in (0.0, 0.25, 2.0):
            _check(loss, logits, targets, dict(options, gamma=gamma))
    else:
        _check(loss, logits, targets, options)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("loss", SIGMOID)
def test_sigmoid_matches_spec(loss, reduction, dtype):
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(6, 5, generator=g) * 6).to(dtype)
    soft = torch.rand(6, 5, generator=g).to(dtype)
    hard = (torch.rand(6, 5, generator=g) < 0.3).to(dtype)
    for targets in (soft, hard):
        if not losses.get(loss).is_focal:
            weight = torch.rand(6, 1, generator=g).to(dtype)
            pos_weight = (torch.rand(5, generator=g) * 3).to(dtype)
            for extra in ({}, {"weight": weight}, {"pos_weight": pos_weight}):
                _check(loss, logits, targets, dict(extra, reduction=reduction))
        else:
            for gamma in (0.0, 0.25, 0.5, 2.0):
                for alpha in (None, 0.25):
                    options = dict(gamma=gamma, alpha=alpha, reduction=reduction)
                    _check(loss, logits, targets, options)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", ["index", "prob"])
def test_focal_gamma_zero_equals_cross_entropy(kind, reduction, label_smoothing):
    # torch_impl.softmax_cross_entropy is the focal code at gamma = 0, so the two are not
    # compared with each other: each is compared with torch's own F.cross_entropy (float64)
    logits, targets = _softmax_case(kind, torch.float64)
    options = dict(reduction=reduction, label_smoothing=label_smoothing)
    x = logits.clone().requires_grad_(True)
    expected = F.cross_entropy(x, targets, **options)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    for name, call in [("softmax_focal_loss(gamma=0)", partial(ti.softmax_focal_loss, gamma=0.0)),
                       ("softmax_cross_entropy", ti.softmax_cross_entropy)]:  # fmt: skip
        x = logits.clone().requires_grad_(True)
        value = call(x, targets, **options)
        (grad,) = torch.autograd.grad(value.sum(), x)
        context = f"torch_impl.{name}, {kind} targets, {options} vs F.cross_entropy"
        torch.testing.assert_close(value, expected, rtol=1e-13, atol=1e-15, msg=context)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-13, atol=1e-15, msg=context)


# ----------------------------------------------------------------------------------------------
# Adversarial regimes: finite everywhere the math is, and within the spec's tolerance
# ----------------------------------------------------------------------------------------------


def _adversarial_softmax(dtype):
    """Large margins up to the dtype's range, ties, underflowing probabilities, -inf classes."""
    big = BIG[dtype]
    rows = [
        [big, -big, 0.0, 1.0],
        [-big, big, big / 2, -big / 2],
        [0.0, 0.0, 0.0, 0.0],
        [30.0, 0.0, -30.0, 1.0],
        [100.0, -100.0, 100.0, 0.0],
        [-math.inf, 2.0, 1.0, -math.inf],
        [1e-3, 0.0, -1e-3, 5.0],
        [big, big, -big, -big],
    ]
    return torch.tensor(rows, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gamma", [0.0, 0.25, 0.5, 2.0])
def test_extreme_logits_give_finite_gradients_softmax(dtype, gamma):
    logits = _adversarial_softmax(dtype)
    # targets on the top class (tiny losses) and on finite classes only
    index_targets = torch.tensor([0, 1, 3, 0, 2, 1, 3, 1])
    prob_targets = torch.zeros(8, 4, dtype=torch.float64)
    prob_targets[torch.arange(8), index_targets] = 0.75
    prob_targets[torch.arange(8), (index_targets + 1) % 4] = 0.25
    prob_targets[5] = torch.tensor([0.0, 0.5, 0.5, 0.0])
    prob_targets = prob_targets.to(dtype)
    for targets in (index_targets, prob_targets):
        for loss in SOFTMAX:
            options = {"gamma": gamma} if losses.get(loss).is_focal else {}
            if not losses.get(loss).is_focal and gamma:
                continue
            for reduction in ("none", "mean"):
                value, grad = _run(loss, logits, targets, dict(options, reduction=reduction))
                assert np.isfinite(value).all(), (loss, dtype, value)
                assert np.isfinite(grad).all(), (loss, dtype, grad)
                _check(loss, logits, targets, dict(options, reduction=reduction))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gamma", [0.0, 0.25, 0.5, 2.0])
def test_extreme_logits_give_finite_gradients_sigmoid(dtype, gamma):
    big = BIG[dtype]
    x = torch.tensor(
        [big, -big, 100.0, -100.0, 30.0, -30.0, 0.0, 1e-3, 17.0, -17.0], dtype=torch.float64
    )
    x = x.repeat(4).to(dtype)
    t = torch.tensor([0.0] * 10 + [1.0] * 10 + [0.5] * 10 + [1e-6] * 10).to(dtype)
    for loss, options in (
        ("sigmoid_focal_loss", {"gamma": gamma, "alpha": 0.25}),
        ("sigmoid_focal_loss", {"gamma": gamma}),
        # pos_weight < 1: q t |x| stays inside the range (float16 6e4 * 3 would overflow, as
        # the exact loss does)
        ("sigmoid_cross_entropy", {"pos_weight": torch.tensor(0.5).to(dtype)}),
    ):
        value, grad = _run(loss, x, t, dict(options, reduction="none"))
        assert np.isfinite(value).all(), (loss, options, value)
        assert np.isfinite(grad).all(), (loss, options, grad)
        _check(loss, x, t, dict(options, reduction="none"))


def test_overflowing_margin_is_inf_never_nan():
    logits = torch.tensor([[3e38, -3e38]], requires_grad=True)
    lost = ti.softmax_cross_entropy(logits, torch.tensor([1]))
    lost.backward()
    assert lost.item() == math.inf
    assert torch.isfinite(logits.grad).all()
    won = ti.softmax_focal_loss(logits, torch.tensor([0]), gamma=0.5)
    assert won.item() == 0.0


def test_minus_inf_masked_classes_with_zero_target_mass():
    logits = torch.tensor([[-math.inf, 1.0, 2.0, -math.inf]], requires_grad=True)
    targets = torch.tensor([[0.0, 0.3, 0.7, 0.0]])
    for loss in (ti.softmax_cross_entropy, ti.softmax_focal_loss):
        value = loss(logits, targets)
        (grad,) = torch.autograd.grad(value, logits)
        assert torch.isfinite(value)
        assert torch.isfinite(grad).all() and grad[0, 0] == 0 and grad[0, 3] == 0


def test_where_mask_equals_minus_inf_logits():
    logits, targets = _softmax_case("index", torch.float64, shape=(4, 5))
    targets = torch.where(targets == 4, 0, targets)
    mask = torch.tensor([True, True, True, True, False])
    a = ti.softmax_focal_loss(logits, targets, where=mask, gamma=0.5, reduction="none")
    b = ti.softmax_focal_loss(
        logits.masked_fill(~mask, -math.inf), targets, gamma=0.5, reduction="none"
    )
    assert torch.allclose(a, b, rtol=1e-14, atol=0)


@pytest.mark.parametrize("loss", SOFTMAX)
def test_all_ignored_mean_is_zero_with_zero_gradient(loss):
    logits = torch.randn(3, 4, requires_grad=True)
    value = getattr(ti, loss)(logits, torch.full((3,), -100))
    (grad,) = torch.autograd.grad(value, logits)
    assert value.item() == 0.0 and not grad.any()
    empty = torch.zeros(0, 4, requires_grad=True)
    assert getattr(ti, loss)(empty, torch.zeros(0, dtype=torch.long)).item() == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("loss", SOFTMAX + SIGMOID)
def test_nan_or_inf_logits_give_nan_in_that_element(loss, bad):
    if loss in SOFTMAX:
        logits = torch.zeros(3, 4)
        logits[1, 2] = bad
        targets = torch.tensor([0, 1, 2])
    else:
        logits = torch.zeros(3)
        logits[1] = bad
        targets = torch.tensor([0.0, 1.0, 0.5])
    logits.requires_grad_(True)
    value = getattr(ti, loss)(logits, targets, reduction="none")
    assert torch.isnan(value[1]) and torch.isfinite(value[[0, 2]]).all()
    (grad,) = torch.autograd.grad(value.sum(), logits)
    assert torch.isnan(grad[1]).all() and torch.isfinite(grad[[0, 2]]).all()


# the sigmoid losses' special logits (+-inf, NaN) next to finite ones, with hard and soft targets
_SPECIAL_X = [math.inf, -math.inf, math.nan, 40.0, -40.0, 0.0, 3.0, -3.0]
_SPECIAL_T = [0.0, 1.0, 0.5, 0.9]
_SIGMOID_OPTIONS = [
    ("sigmoid_cross_entropy", {}),
    ("sigmoid_cross_entropy", {"weight": "vector"}),
    ("sigmoid_cross_entropy", {"pos_weight": "vector"}),
    ("sigmoid_focal_loss", {"gamma": 0.0, "alpha": 0.25}),
    ("sigmoid_focal_loss", {"gamma": 0.5}),
    ("sigmoid_focal_loss", {"gamma": 1.0, "alpha": 0.75}),
    ("sigmoid_focal_loss", {"gamma": 2.0, "alpha": 0.25}),
    ("sigmoid_focal_loss", {"gamma": 3.0}),
]


def _special_sigmoid_case(options, dtype):
    x = torch.tensor(_SPECIAL_X, dtype=torch.float64)[:, None].expand(-1, len(_SPECIAL_T))
    t = torch.tensor(_SPECIAL_T, dtype=torch.float64).expand(len(_SPECIAL_X), -1)
    vector = torch.linspace(0.5, 2.0, len(_SPECIAL_T), dtype=dtype)
    options = {k: vector if v == "vector" else v for k, v in options.items()}
    return x.to(dtype).contiguous(), t.to(dtype).contiguous(), options


@pytest.mark.parametrize("path", ["backward", "create_graph", "torch.func.grad"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(("loss", "options"), _SIGMOID_OPTIONS, ids=str)
def test_sigmoid_special_logits_give_the_spec_nan_pattern(loss, options, dtype, reduction, path):
    """NaN exactly where the spec has NaN (+inf and NaN logits; -inf where the math is 0 * inf),
    in the value and in the logits' and the targets' gradients, by every path: the fast backward
    (the sum's finiteness decides whether a +inf logit is looked for), the differentiable one
    (create_graph) and torch.func; the finite entries finite."""
    x, t, options = _special_sigmoid_case(options, dtype)
    weights = torch.linspace(0.5, 1.5, x.numel(), dtype=dtype).reshape(x.shape)
    fn = getattr(ti, loss)

    def total(z, u):
        value = fn(z, u, reduction=reduction, **options)
        return value if reduction != "none" else (value * weights).sum()

    z = x.clone().requires_grad_(True)
    u = t.clone().requires_grad_(True)
    if path == "torch.func.grad":
        grad_x, grad_t = torch.func.grad(total, argnums=(0, 1))(x, t)
    else:
        create_graph = path == "create_graph"
        grad_x, grad_t = torch.autograd.grad(total(z, u), (z, u), create_graph=create_graph)
    value = fn(x, t, reduction="none", **options)
    spec_options = _spec_options(options)
    spec_loss = getattr(spec, loss)
    spec_grad = getattr(spec, f"{loss}_grad")
    scale = _np(weights) if reduction == "none" else 1.0
    expected_value = spec_loss(_np(x), _np(t), reduction="none", **spec_options)
    expected = {
        wrt: spec_grad(_np(x), _np(t), reduction="none", wrt=wrt, **spec_options) * scale
        for wrt in ("logits", "targets")
    }
    # a reduced gradient is the per-element one scaled (the same NaN pattern)
    for name, got, want in (
        ("value", value, expected_value),
        ("grad logits", grad_x, expected["logits"]),
        ("grad targets", grad_t, expected["targets"]),
    ):
        got = _np(got)
        if name == "grad logits" and options.get("gamma") == 0.0:
            # the spec's focal gradient at gamma = 0 is NaN at a -inf logit (gamma ce r is
            # 0 * NaN there), torch_impl's the cross entropy's (as before the fast path)
            keep = _np(x)[:, 0] != -math.inf
            got, want = got[keep], want[keep]
        if name == "grad targets":
            # at a -inf logit the spec's targets gradient is NaN, torch_impl's mostly +inf (the
            # limit of -x; so before the sigmoid fast path too): that row is not judged here
            keep = _np(x)[:, 0] != -math.inf
            got, want = got[keep], want[keep]
        assert np.array_equal(np.isnan(got), np.isnan(want)), (name, got, want)
        finite = np.isfinite(want)
        assert np.isfinite(got[finite]).all(), (name, got, want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(("loss", "options"), _SIGMOID_OPTIONS, ids=str)
def test_sigmoid_fast_and_create_graph_backward_both_meet_the_spec(loss, options, dtype):
    """The in-place backward (one kernel per sigmoid, torch's lerp) and the differentiable one
    that create_graph differentiates (torch.sigmoid, out-of-place) each meet the strict
    standard, on random and extreme finite logits (both sides of the kernels' thresholds 20
    and 37), hard and soft targets, every reduction."""
    g = torch.Generator().manual_seed(11)
    extreme = [0.0, -0.0, 1e-8, -1e-8, 19.9, 20.1, -19.9, -20.1, 36.9, 37.1, -36.9, -37.1, 80.0]
    x = torch.cat([torch.randn(64, generator=g, dtype=torch.float64) * 6, torch.tensor(extreme)])
    t = torch.rand(x.shape, generator=g, dtype=torch.float64)
    t[::2] = t[::2].round()
    x, t = x.to(dtype), t.to(dtype)
    vector = torch.linspace(0.5, 2.0, x.numel(), dtype=dtype)
    options = {k: vector if v == "vector" else v for k, v in options.items()}
    for reduction in REDUCTIONS:
        for create_graph in (False, True):
            z = x.clone().requires_grad_(True)
            value = getattr(ti, loss)(z, t, reduction=reduction, **options)
            (grad,) = torch.autograd.grad(value.sum(), z, create_graph=create_graph)
            assert_matches_spec(
                loss, _np(x), _np(t), _spec_options(dict(options, reduction=reduction)), dtype,
                _np(value), _np(grad),
                context=f"torch_impl.{loss}({options}, {reduction}, create_graph={create_graph})",
            )  # fmt: skip


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize(("loss", "options"), _SIGMOID_OPTIONS, ids=str)
def test_sigmoid_gradgradcheck_logits_and_soft_targets(loss, options, reduction):
    """Second order through the sigmoid losses' Function for the summed ('mean') and the
    per-element ('none') outputs, logits and soft targets both differentiated."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 4, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    t = torch.rand(3, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    options = {
        k: torch.linspace(0.5, 2.0, 4, dtype=torch.float64) if v == "vector" else v
        for k, v in options.items()
    }
    fn = getattr(ti, loss)

    def f(z, u):
        return fn(z, u, reduction=reduction, **options)

    assert torch.autograd.gradcheck(f, (x, t))
    assert torch.autograd.gradgradcheck(f, (x, t))


# ----------------------------------------------------------------------------------------------
# Second order, gradcheck, torch.func, torch.compile, memory
# ----------------------------------------------------------------------------------------------


def _double_inputs(loss):
    g = torch.Generator().manual_seed(3)
    if loss in SOFTMAX:
        logits = torch.randn(3, 4, 2, generator=g, dtype=torch.float64)
        targets = torch.randint(0, 4, (3, 2), generator=g)
        soft = torch.softmax(torch.randn(3, 4, 2, generator=g, dtype=torch.float64), dim=1)
        return logits, [targets, soft]
    logits = torch.randn(3, 4, generator=g, dtype=torch.float64) * 3
    return logits, [torch.rand(3, 4, generator=g, dtype=torch.float64)]


@pytest.mark.parametrize("loss", SOFTMAX + SIGMOID)
def test_gradcheck_and_gradgradcheck_float64(loss):
    logits, target_list = _double_inputs(loss)
    options = {"gamma": 0.5} if losses.get(loss).is_focal else {}
    if losses.get(loss).is_focal and losses.get(loss).has("label_smoothing"):
        options["label_smoothing"] = 0.1
    for targets in target_list:
        fn = getattr(ti, loss)

        def f(z, targets=targets):
            return fn(z, targets, reduction="sum", **options)

        z = logits.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(f, (z,))
        assert torch.autograd.gradgradcheck(f, (z,))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("loss", SOFTMAX + SIGMOID)
def test_second_order_finite_at_large_logits(loss, dtype):
    if loss in SOFTMAX:
        logits = torch.tensor([[100.0, -100.0, 0.0], [-100.0, 100.0, 100.0]], dtype=dtype)
        target_list = [torch.tensor([0, 1]), torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])]
    else:
        logits = torch.tensor([100.0, -100.0, 100.0, -100.0, 3.0], dtype=dtype)
        target_list = [torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5], dtype=dtype)]
    options = {"gamma": 0.5} if losses.get(loss).is_focal else {}
    for targets in target_list:
        z = logits.clone().requires_grad_(True)
        value = getattr(ti, loss)(
            z, targets.to(dtype) if targets.is_floating_point() else targets, **options
        )
        (grad,) = torch.autograd.grad(value, z, create_graph=True)
        (hessian_row,) = torch.autograd.grad(grad.square().sum(), z)
        assert torch.isfinite(grad).all() and torch.isfinite(hessian_row).all(), (loss, targets)


def test_torch_func_grad_and_vmap():
    logits, targets = _softmax_case("index", torch.float64, shape=(4, 5))
    targets = targets.clamp_min(0)

    def f(z):
        return ti.softmax_focal_loss(z, targets, gamma=0.5)

    z = logits.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(f(z), z)
    assert torch.allclose(torch.func.grad(f)(logits), expected)
    batch = torch.stack([logits, 2 * logits])
    per_sample = torch.func.vmap(torch.func.grad(f))(batch)
    assert torch.allclose(per_sample[0], expected)
    x = torch.randn(3, 4, dtype=torch.float64)
    t = torch.rand(3, 4, dtype=torch.float64)
    grads = torch.func.vmap(torch.func.grad(lambda a, b: ti.sigmoid_focal_loss(a, b)))(x, t)
    assert torch.allclose(grads[0], torch.func.grad(ti.sigmoid_focal_loss)(x[0], t[0]))


@pytest.mark.on_demand("test_torch_idioms.py compiles both losses, fullgraph")
@pytest.mark.slow
def test_torch_compile_small_case():
    logits, targets = _softmax_case("index", torch.float32, shape=(4, 5))
    targets = targets.clamp_min(0)

    def f(z):
        return ti.softmax_focal_loss(z, targets, gamma=0.5) + ti.sigmoid_focal_loss(z, z.sigmoid())

    compiled = torch.compile(f, backend="aot_eager")
    z1 = logits.clone().requires_grad_(True)
    z2 = logits.clone().requires_grad_(True)
    with ti.set_validate_indices(False):
        a = compiled(z1)
    b = f(z2)
    a.backward()
    b.backward()
    assert torch.allclose(a, b) and torch.allclose(z1.grad, z2.grad)


def _saved_bytes(fn, logits, *inputs):
    """Bytes the loss keeps for backward that are not storage of its own inputs."""
    own = {x.untyped_storage().data_ptr() for x in (logits, *inputs) if x is not None}
    extra = [0]

    def pack(x):
        if x.untyped_storage().data_ptr() not in own:
            extra[0] += x.numel() * x.element_size()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        fn()
    return extra[0]


@pytest.mark.parametrize("loss", SOFTMAX + SIGMOID)
def test_saves_nothing_beyond_its_inputs(loss):
    logits = torch.randn(64, 10, requires_grad=True)
    if loss in SOFTMAX:
        targets = torch.randint(0, 10, (64,))
        soft = torch.softmax(torch.randn(64, 10), 1)
        for t in (targets, soft):
            extra = _saved_bytes(
                lambda t=t: getattr(ti, loss)(logits, t, label_smoothing=0.1), logits, t
            )
            assert extra <= 64 * 8, extra  # at most O(N) (the mean's denominator path)
    else:
        targets = torch.rand(64, 10)
        assert _saved_bytes(lambda: getattr(ti, loss)(logits, targets), logits, targets) <= 8


@pytest.mark.parametrize("loss", SOFTMAX)
def test_class_index_path_keeps_the_probabilities_once_and_not_the_logits(loss):
    """Class indices without smoothing (the fast path): what backward keeps is one tensor the
    size of the logits (the probabilities) plus O(N), never the logits themselves, and a second
    backward (retain_graph) gives the same gradient: the gradient is written over the saved
    probabilities only in the graph's last backward, and it never carries a graph of its own."""
    logits = torch.randn(64, 10, requires_grad=True)
    targets = torch.randint(0, 10, (64,))
    targets[5] = -100
    saved = []

    def pack(x):
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        value = getattr(ti, loss)(logits, targets)
    storages = {x.untyped_storage().data_ptr(): x for x in saved}
    assert logits.untyped_storage().data_ptr() not in storages
    big = [x for x in storages.values() if x.numel() > 64]
    assert [tuple(x.shape) for x in big] == [(64, 10)], [x.shape for x in saved]
    # p, then r, y, a_y (one value per row each) and the mean's scalars
    assert sum(x.numel() for x in storages.values()) <= 64 * 10 + 4 * 64 + 8
    # what a pack hook kept is left as it was saved, also by the graph's last backward
    (through_hooks,) = torch.autograd.grad(value, logits)
    torch.testing.assert_close(big[0], torch.softmax(logits, 1), rtol=0.0, atol=0.0)
    value = getattr(ti, loss)(logits, targets)
    (first,) = torch.autograd.grad(value, logits, retain_graph=True)
    (second,) = torch.autograd.grad(value, logits, retain_graph=True)
    value.backward()
    assert torch.equal(first, second) and torch.equal(first, logits.grad)
    assert torch.equal(first, through_hooks)
    assert not logits.grad.requires_grad and logits.grad.grad_fn is None
    assert torch.equal(first[5], torch.zeros(10)) and first.abs().sum() > 0
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        value.backward()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("loss", SOFTMAX)
def test_ignored_element_with_nan_logits_gives_zero_loss_and_gradient(loss, bad):
    """Ignored elements give 0 whatever their logits, gradient included: eagerly (where the row
    is found on the host) and under torch.func.vmap (where it is masked on the device)."""
    logits = torch.zeros(3, 4, dtype=torch.float64)
    logits[1, 2] = bad
    targets = torch.tensor([0, -100, 2])
    options = {"gamma": 0.5} if losses.get(loss).is_focal else {}

    def f(z):
        return getattr(ti, loss)(z, targets, reduction="sum", **options)

    z = logits.clone().requires_grad_(True)
    value = getattr(ti, loss)(z, targets, reduction="none", **options)
    assert value[1] == 0.0 and torch.isfinite(value).all()
    (grad,) = torch.autograd.grad(value.sum(), z)
    assert torch.equal(grad[1], torch.zeros(4, dtype=torch.float64))
    assert torch.isfinite(grad).all() and grad[0].abs().sum() > 0
    batched = torch.func.vmap(torch.func.grad(f))(torch.stack([logits, logits]))
    torch.testing.assert_close(batched[0], grad, rtol=1e-12, atol=0.0)


def _fast_path_rows(dtype):
    """Rows for each branch of the fast path, class axis last, float64 NumPy, with targets."""
    big = 200.0 if dtype == torch.float32 else 1000.0
    logits = np.array(
        [
            [0.3, -1.2, 2.0, 0.5, -0.7],  # target not the top, p_y normal
            [30.0, 5.0, -3.0, 10.0, 0.0],  # dominant target, s ~ 2e-9: loss -log1p(s)
            [big, 0.0, -1.0, 2.0, 0.5],  # dominant target, the others underflow
            [0.0, big, -1.0, 2.0, 0.5],  # target's p underflows: log p_y from the logits
            [1.0, 1.0, 1.0, -np.inf, 0.0],  # a tie for the top (target among it), a masked class
            [0.0, 0.0, -np.inf, -np.inf, -np.inf],  # a two-way tie at 1/2: not dominant
            [-np.inf, 3.0, 0.0, 1.0, 2.0],  # target at -inf: loss inf (0 with no weight)
            [2.0, 2.5, np.nan, 0.0, 1.0],  # NaN logit on an ignored row: loss and gradient 0
        ]
    )
    targets = np.array([1, 0, 0, 0, 1, 0, 0, -100])
    return logits, targets


@pytest.mark.parametrize("on_host", [True, False], ids=["host", "masked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("loss", SOFTMAX)
def test_fast_path_branches_on_host_and_masked_meet_the_spec(loss, dtype, on_host, monkeypatch):
    """The fast path treats some rows apart: a dominant target (-log1p(s)), a target whose p is
    below the smallest normal (log p_y from the logits), an ignored row with a NaN. On the CPU
    only those rows are read back; elsewhere (accelerators, torch.compile, vmap) masked passes
    over every row do it. Both meet the spec under the strict standard, value and gradient."""
    if not on_host:
        monkeypatch.setattr(ti._inputs, "_reads_on_host", lambda x: False)
    logits, targets = _fast_path_rows(dtype)
    options = {"gamma": 0.5} if losses.get(loss).is_focal else {}
    weight = np.array([1.0, 0.5, 2.0, 1.0, 1.0])
    for extra in ({}, {"alpha": weight / 2.0} if options else {"weight": weight}):
        x = torch.tensor(logits, dtype=dtype, requires_grad=True)
        kwargs = dict(options, **{k: torch.tensor(v, dtype=dtype) for k, v in extra.items()})
        value = getattr(ti, loss)(x, torch.tensor(targets), reduction="none", **kwargs)
        # the row with its target at -inf has an infinite loss: the gradient of the others
        finite = torch.isfinite(value).numpy()
        assert finite.tolist() == [True] * 6 + [False, True]
        (grad,) = torch.autograd.grad(value[finite].sum(), x)
        spec_options = dict(options, **extra)
        by_row = judge(loss, logits, targets, dict(spec_options, reduction="none"), dtype,
                       value.detach().double().numpy())  # fmt: skip
        assert by_row.ok, by_row
        summed = judge(
            loss, logits[finite], targets[finite], dict(spec_options, reduction="sum"), dtype,
            value.detach()[finite].sum().double().numpy(), grad.double().numpy()[finite],
        )  # fmt: skip
        assert summed.ok, summed
        assert torch.isfinite(grad).all() and torch.equal(grad[6], torch.zeros_like(grad[6]))
        assert torch.equal(grad[7], torch.zeros_like(grad[7]))


@pytest.mark.parametrize("share", [0.0, 0.125, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("loss", SOFTMAX)
def test_fast_path_sums_the_others_apart_where_the_target_dominates(loss, dtype, share):
    """On the CPU the fast path forms r = 1 - p_y as the row sum less p_y where the target does
    not dominate its row (r >= p_y), and sums the other classes apart where it does: on those
    rows alone when they are under a quarter of the batch, on every row otherwise. Rows at the
    boundary (p_y within 1e-4 of 1/2, on either side) and far beyond it (loss ~ 1e-17) meet the
    spec under the strict standard with every share of dominant rows, value and gradient."""
    rng = np.random.default_rng(7)
    n, c = 64, 33
    logits = rng.standard_normal((n, c))
    targets = rng.integers(0, c, n)
    rows = np.arange(n)
    others = logits.copy()
    others[rows, targets] = -np.inf
    log_others = np.log(np.exp(others).sum(axis=1))
    # margin of z_y over log sum_{j != y} exp(z_j): p_y = 1 / (1 + exp(-margin))
    margin = np.where(rng.random(n) < share, rng.uniform(1e-3, 40.0, n), rng.uniform(-6.0, 0.0, n))
    margin[:8] = rng.uniform(-4e-4, 4e-4, 8)
    logits[rows, targets] = log_others + margin
    options = {"gamma": 0.5} if losses.get(loss).is_focal else {}
    x = torch.tensor(logits, dtype=dtype, requires_grad=True)
    value = getattr(ti, loss)(x, torch.tensor(targets), reduction="none", **options)
    (grad,) = torch.autograd.grad(value.sum(), x)
    result = judge(loss, logits, targets, dict(options, reduction="none"), dtype,
                   value.detach().double().numpy())  # fmt: skip
    assert result.ok, result
    summed = judge(loss, logits, targets, dict(options, reduction="sum"), dtype,
                   value.detach().sum().double().numpy(), grad.double().numpy())  # fmt: skip
    assert summed.ok, summed


@pytest.mark.parametrize("loss", SOFTMAX)
def test_fast_path_renormalises_softmax_by_its_own_row_sum_at_many_classes(loss):
    """torch's float32 softmax kernel rounds its row sum by up to ~200 ULP at 32000 classes
    (logits of scale 4): p does not sum to 1. The fast path divides by the sum of p's own terms
    (p_y + r), so value and gradient meet the strict standard; r = 1 - p_y (no row sum) is up to
    14x the tolerance off in the gradient (measured 2026-12-03)."""
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((32, 32000)) * 4.0
    targets = rng.integers(0, 32000, 32)
    x = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    value = getattr(ti, loss)(x, torch.tensor(targets), reduction="none")
    (grad,) = torch.autograd.grad(value.sum(), x)
    result = judge(loss, logits, targets, {"reduction": "sum"}, torch.float32,
                   value.detach().sum().double().numpy(), grad.double().numpy())  # fmt: skip
    assert result.ok, result


# ----------------------------------------------------------------------------------------------
# Drop-ins against torch itself
# ----------------------------------------------------------------------------------------------


def _same_as_torch(ours, theirs, logits, *args, **kwargs):
    a_in = logits.clone().requires_grad_(True)
    b_in = logits.clone().requires_grad_(True)
    a = ours(a_in, *args, **kwargs)
    b = theirs(b_in, *args, **kwargs)
    a.sum().backward()
    b.sum().backward()
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(a_in.grad, b_in.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_matches_torch(reduction):
    logits, targets = _softmax_case("index", torch.float64, shape=(6, 5, 3))
    prob = torch.softmax(torch.randn(6, 5, 3, dtype=torch.float64), 1)
    weight = torch.rand(5, dtype=torch.float64)
    for kwargs in (
        {},
        {"weight": weight},
        {"label_smoothing": 0.2},
        {"weight": weight, "label_smoothing": 0.2},
        {"ignore_index": 1},
    ):
        if "ignore_index" in kwargs:
            targets = torch.where(targets == -100, 1, targets)
        _same_as_torch(
            ti.cross_entropy, F.cross_entropy, logits, targets, reduction=reduction, **kwargs
        )
        if "ignore_index" not in kwargs:
            _same_as_torch(
                ti.cross_entropy, F.cross_entropy, logits, prob, reduction=reduction, **kwargs
            )
    # unbatched (C,) input
    _same_as_torch(ti.cross_entropy, F.cross_entropy, logits[0, :, 0], targets[0, 0].clamp_min(0))


def test_cross_entropy_legacy_arguments_like_torch():
    logits, targets = _softmax_case("index", torch.float64, shape=(4, 5))
    with pytest.warns(UserWarning):
        a = ti.cross_entropy(logits, targets, size_average=False)
    b = F.cross_entropy(logits, targets, reduction="sum")
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits_matches_torch(reduction):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 5, generator=g, dtype=torch.float64) * 5
    t = torch.rand(6, 5, generator=g, dtype=torch.float64)
    weight = torch.rand(6, 1, generator=g, dtype=torch.float64)
    pos_weight = torch.rand(5, generator=g, dtype=torch.float64) * 3
    for kwargs in ({}, {"weight": weight}, {"pos_weight": pos_weight}):
        _same_as_torch(
            ti.binary_cross_entropy_with_logits,
            F.binary_cross_entropy_with_logits,
            x,
            t,
            reduction=reduction,
            **kwargs,
        )


def test_modules_hold_buffers_and_call_the_functional():
    weight = torch.rand(5, dtype=torch.float64)
    module = ti.CrossEntropyLoss(weight=weight, label_smoothing=0.1)
    assert "weight" in dict(module.named_buffers())
    logits, targets = _softmax_case("index", torch.float64, shape=(4, 5))
    torch.testing.assert_close(
        module(logits, targets),
        F.cross_entropy(logits, targets, weight=weight, label_smoothing=0.1),
    )
    bce = ti.BCEWithLogitsLoss(pos_weight=torch.full((5,), 2.0, dtype=torch.float64))
    t = torch.rand(4, 5, dtype=torch.float64)
    torch.testing.assert_close(
        bce(logits, t), F.binary_cross_entropy_with_logits(logits, t, pos_weight=bce.pos_weight)
    )
    focal = ti.FocalLoss(gamma=0.5, alpha=torch.full((5,), 0.5))
    assert "alpha" in dict(focal.named_buffers())
    torch.testing.assert_close(
        focal(logits, targets),
        ti.softmax_focal_loss(logits, targets, gamma=0.5, alpha=torch.full((5,), 0.5)),
    )
    sfocal = ti.SigmoidFocalLoss(gamma=2.0, alpha=0.25)
    torch.testing.assert_close(
        sfocal(logits, t), ti.sigmoid_focal_loss(logits, t, gamma=2.0, alpha=0.25)
    )


# ----------------------------------------------------------------------------------------------
# Bad input: the shared _checks messages
# ----------------------------------------------------------------------------------------------


def test_out_of_range_index_raises_and_can_be_skipped():
    logits = torch.randn(4, 5)
    targets = torch.tensor([0, 7, 1, -100])
    with pytest.raises(ValueError, match=r"`targets` has class index 7 at position \(1,\)"):
        ti.softmax_cross_entropy(logits, targets)
    with ti.set_validate_indices(False):
        ti.softmax_cross_entropy(logits, torch.tensor([0, 4, 1, -100]))
    assert ti._inputs._VALIDATE_INDICES


def test_set_validate_indices_reaches_every_module():
    # the switch is one variable, torch_impl._inputs._VALIDATE_INDICES (no copy in the package or
    # another module): the sigmoid and the fused linear modules read it there
    assert not hasattr(ti, "_VALIDATE_INDICES")
    logits, targets = torch.zeros(2), torch.tensor([0.5, 1.5])
    hidden, kernel = torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    alpha = torch.full((4,), 2.0, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`targets` of the sigmoid focal loss"):
        ti.sigmoid_focal_loss(logits, targets)
    with pytest.raises(ValueError, match=r"`alpha` must have every entry in \[0, 1\]"):
        ti.linear_softmax_focal_loss(hidden, kernel, torch.tensor([0, 1]), alpha=alpha)
    with ti.set_validate_indices(False):
        assert ti._inputs._VALIDATE_INDICES is False
        ti.sigmoid_focal_loss(logits, targets)
        ti.linear_softmax_focal_loss(hidden, kernel, torch.tensor([0, 1]), alpha=alpha)
    assert ti._inputs._VALIDATE_INDICES is True


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: ti.softmax_cross_entropy(torch.randn(4, 5), torch.zeros(5).long()),
            ValueError,
            "`targets` of class indices must have shape",
        ),
        (
            lambda: ti.softmax_cross_entropy(torch.randn(4, 5), torch.zeros(4, 4)),
            ValueError,
            "`targets` of class probabilities must have the logits shape",
        ),
        (
            lambda: ti.softmax_cross_entropy(torch.zeros(4, 5).long(), torch.zeros(4).long()),
            TypeError,
            "`logits` must have a floating dtype. Received: logits.dtype=int64.",
        ),
        (
            lambda: ti.softmax_cross_entropy(
                torch.randn(4, 5), torch.zeros(4).long(), reduction="avg"
            ),
            ValueError,
            "`reduction` must be",
        ),
        (
            lambda: ti.softmax_focal_loss(torch.randn(4, 5), torch.zeros(4).long(), gamma=-1.0),
            ValueError,
            "`gamma` must be a finite number >= 0",
        ),
        (
            lambda: ti.softmax_focal_loss(torch.randn(4, 5), torch.zeros(4).long(), alpha=1.5),
            ValueError,
            "`alpha` must be in",
        ),
        (
            lambda: ti.softmax_focal_loss(
                torch.randn(4, 5), torch.zeros(4).long(), alpha=torch.tensor([0.5, 2.0, 0, 0, 0])
            ),
            ValueError,
            r"`alpha` must have every entry in \[0, 1\]",
        ),
        (
            lambda: ti.softmax_cross_entropy(
                torch.randn(4, 5), torch.zeros(4).long(), label_smoothing=2.0
            ),
            ValueError,
            "`label_smoothing` must be in",
        ),
        (
            lambda: ti.softmax_cross_entropy(
                torch.randn(4, 5), torch.zeros(4).long(), weight=torch.ones(3)
            ),
            ValueError,
            "`weight` must be a vector of length 5",
        ),
        (
            lambda: ti.softmax_cross_entropy(
                torch.randn(4, 5), torch.zeros(4).long(), where=torch.ones(5)
            ),
            TypeError,
            "`where` must be a boolean mask",
        ),
        (
            lambda: ti.sigmoid_cross_entropy(torch.randn(4, 5), torch.zeros(4, 5).long()),
            TypeError,
            "`targets` must have a floating dtype",
        ),
        (
            lambda: ti.sigmoid_focal_loss(torch.randn(4, 5), torch.zeros(4, 4)),
            ValueError,
            "`targets` must have the logits shape",
        ),
        (
            lambda: ti.sigmoid_cross_entropy(
                torch.randn(4, 5), torch.zeros(4, 5), pos_weight=torch.ones(3)
            ),
            ValueError,
            "`pos_weight` must broadcast",
        ),
        (
            lambda: ti.softmax_cross_entropy(torch.randn(4, 5), torch.zeros(4).long(), axis=3),
            ValueError,
            "`axis` must be in",
        ),
    ],
)
def test_bad_arguments_raise_the_shared_messages(call, error, match):
    with pytest.raises(error, match=match):
        call()
