"""torch_impl in the idioms torch users write: gradients for every differentiable input,
torch.autocast, torch.compile(fullgraph=True), torch.func, wrong-framework input, optax `where`.

Every check compares with an independent reference: torch's own autograd of ``F.cross_entropy`` /
``F.binary_cross_entropy_with_logits`` / torchvision's sigmoid focal formula, the spec's
closed-form ``<name>_grad(..., wrt=...)``, finite differences (``gradcheck``, float64), or values
computed by hand.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dualloss import losses, spec
from dualloss import torch_impl as ti

SOFTMAX = [info.name for info in losses.of_family("softmax")]
SIGMOID = [info.name for info in losses.of_family("sigmoid")]
# float64 against float64 references computed another way: a few ULPs of O(1) values
CLOSE = {"rtol": 1e-12, "atol": 1e-14}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _softmax_inputs(seed=0, shape=(5, 4, 3)):
    g = _gen(seed)
    logits = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    soft = torch.softmax(torch.randn(shape, generator=g, dtype=torch.float64), dim=1)
    index = torch.randint(0, shape[1], shape[:1] + shape[2:], generator=g)
    index.view(-1)[0] = -100
    vector = torch.rand(shape[1], generator=g, dtype=torch.float64) * 0.8 + 0.1
    return logits, soft, index, vector


def _sigmoid_inputs(seed=0, shape=(5, 4)):
    g = _gen(seed)
    logits = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    targets = torch.rand(shape, generator=g, dtype=torch.float64)
    weight = torch.rand(shape[0], 1, generator=g, dtype=torch.float64) + 0.5
    pos_weight = torch.rand(shape[1], generator=g, dtype=torch.float64) * 3
    return logits, targets, weight, pos_weight


def _grads(fn, *inputs):
    """fn(*inputs) and its gradient w.r.t. every input (fresh leaves), of the sum for 'none'."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    value = fn(*leaves)
    grads = torch.autograd.grad(value.sum(), leaves)
    return value.detach(), grads


def _torchvision_sigmoid_focal(x, t, gamma, alpha, reduction):
    """torchvision.ops.sigmoid_focal_loss, verbatim (the formula, with alpha None = no alpha_t)."""
    p = torch.sigmoid(x)
    ce_loss = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce_loss * ((1 - p_t) ** gamma)
    if alpha is not None:
        alpha_t = alpha * t + (1 - alpha) * (1 - t)
        loss = alpha_t * loss
    return {"none": loss, "mean": loss.mean(), "sum": loss.sum()}[reduction]


# ----------------------------------------------------------------------------------------------
# Gradients w.r.t. targets and options: against torch's own autograd
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_probability_target_gradient_matches_torch_cross_entropy(label_smoothing, reduction):
    logits, soft, _, weight = _softmax_inputs()
    for extra in ({}, {"weight": weight}):
        kwargs = dict(extra, label_smoothing=label_smoothing, reduction=reduction)
        ours, our_grads = _grads(lambda z, t: ti.cross_entropy(z, t, **kwargs), logits, soft)
        theirs, their_grads = _grads(lambda z, t: F.cross_entropy(z, t, **kwargs), logits, soft)
        torch.testing.assert_close(ours, theirs, **CLOSE)
        for name, a, b in zip(("logits", "targets"), our_grads, their_grads):
            torch.testing.assert_close(a, b, **CLOSE, msg=f"d/d{name} {kwargs}")


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_sigmoid_target_gradient_matches_torch_bce(reduction):
    logits, targets, weight, pos_weight = _sigmoid_inputs()
    for extra in ({}, {"weight": weight}, {"pos_weight": pos_weight}):
        kwargs = dict(extra, reduction=reduction)

        def ours(z, t, kwargs=kwargs):
            return ti.binary_cross_entropy_with_logits(z, t, **kwargs)

        def theirs(z, t, kwargs=kwargs):
            return F.binary_cross_entropy_with_logits(z, t, **kwargs)

        a, a_grads = _grads(ours, logits, targets)
        b, b_grads = _grads(theirs, logits, targets)
        torch.testing.assert_close(a, b, **CLOSE)
        for name, x, y in zip(("logits", "targets"), a_grads, b_grads):
            torch.testing.assert_close(x, y, **CLOSE, msg=f"d/d{name} {kwargs}")


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("alpha", [None, 0.25])
def test_sigmoid_focal_target_gradient_matches_torchvision(alpha, gamma, reduction):
    logits, targets, _, _ = _sigmoid_inputs(seed=1)
    kwargs = dict(gamma=gamma, alpha=alpha, reduction=reduction)
    a, a_grads = _grads(lambda z, t: ti.sigmoid_focal_loss(z, t, **kwargs), logits, targets)
    b, b_grads = _grads(
        lambda z, t: _torchvision_sigmoid_focal(z, t, gamma, alpha, reduction), logits, targets
    )
    torch.testing.assert_close(a, b, **CLOSE)
    for name, x, y in zip(("logits", "targets"), a_grads, b_grads):
        torch.testing.assert_close(x, y, **CLOSE, msg=f"d/d{name} {kwargs}")


def _textbook_softmax_focal(z, t, gamma, alpha, label_smoothing, reduction):
    """-sum_c alpha_c t~_c (1 - p_c)^gamma log p_c with torch autograd (typical inputs only)."""
    num_classes = z.shape[1]
    t = (1 - label_smoothing) * t + label_smoothing / num_classes
    log_p = torch.log_softmax(z, dim=1)
    a = t if alpha is None else alpha.view(1, -1, 1) * t
    loss = -(a * (1 - log_p.exp()) ** gamma * log_p).sum(dim=1)
    return {"none": loss, "mean": loss.mean(), "sum": loss.sum()}[reduction]


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_softmax_focal_target_and_alpha_gradients_match_autograd_of_the_formula(
    label_smoothing, reduction
):
    logits, soft, _, alpha = _softmax_inputs(seed=2)
    for gamma in (0.0, 0.5, 2.0):
        kwargs = dict(gamma=gamma, label_smoothing=label_smoothing, reduction=reduction)

        def ours(z, t, a, kwargs=kwargs):
            return ti.softmax_focal_loss(z, t, alpha=a, **kwargs)

        def theirs(z, t, a, gamma=gamma):
            return _textbook_softmax_focal(z, t, gamma, a, label_smoothing, reduction)

        a, a_grads = _grads(ours, logits, soft, alpha)
        b, b_grads = _grads(theirs, logits, soft, alpha)
        torch.testing.assert_close(a, b, **CLOSE)
        for name, x, y in zip(("logits", "targets", "alpha"), a_grads, b_grads):
            torch.testing.assert_close(x, y, **CLOSE, msg=f"d/d{name} {kwargs}")


# ----------------------------------------------------------------------------------------------
# ... against the spec's closed forms, where torch itself has none (weight, pos_weight)
# ----------------------------------------------------------------------------------------------


def _np(x):
    return x.detach().cpu().numpy()


def _spec_grad(loss, wrt, logits, targets, **options):
    grad_fn = getattr(spec, f"{loss}_grad")
    if loss in SOFTMAX:
        options["axis"] = 1
    options = {k: _np(v) if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    # the spec takes `wrt=` for every case of SPEC_WRT_CASES: a TypeError here is a failure
    return grad_fn(_np(logits), _np(targets), wrt=wrt, **options)


SPEC_WRT_CASES = [
    ("softmax_cross_entropy", "index", "weight", {}),
    ("softmax_cross_entropy", "index", "weight", {"label_smoothing": 0.2}),
    ("softmax_cross_entropy", "prob", "targets", {"weight": "vector"}),
    ("softmax_cross_entropy", "prob", "weight", {"label_smoothing": 0.1}),
    ("softmax_focal_loss", "index", "alpha", {"gamma": 0.5}),
    ("softmax_focal_loss", "prob", "targets", {"gamma": 2.0, "alpha": "vector"}),
    ("softmax_focal_loss", "prob", "alpha", {"gamma": 0.25, "label_smoothing": 0.1}),
    ("sigmoid_cross_entropy", "prob", "targets", {"pos_weight": "pos_weight"}),
    ("sigmoid_cross_entropy", "prob", "weight", {"pos_weight": "pos_weight"}),
    ("sigmoid_cross_entropy", "prob", "pos_weight", {"weight": "weight"}),
    ("sigmoid_focal_loss", "prob", "targets", {"gamma": 0.5, "alpha": 0.25}),
]


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(("loss", "kind", "wrt", "options"), SPEC_WRT_CASES)
def test_option_and_target_gradients_match_the_spec(loss, kind, wrt, options, reduction):
    if loss in SOFTMAX:
        logits, soft, index, vector = _softmax_inputs(seed=3)
        targets = soft if kind == "prob" else index
        values = {"vector": vector}
        vector_name = "alpha" if losses.get(loss).is_focal else "weight"
    else:
        logits, targets, weight, pos_weight = _sigmoid_inputs(seed=3)
        values = {"weight": weight, "pos_weight": pos_weight}
        vector_name = None
    options = {k: values.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    if wrt == vector_name:
        options[wrt] = vector
    elif wrt in ("weight", "pos_weight"):
        options[wrt] = values[wrt]
    options["reduction"] = reduction
    inputs = {"targets": targets, **options}
    leaf = inputs[wrt].detach().clone().requires_grad_(True)
    inputs[wrt] = leaf
    call_options = {k: v for k, v in inputs.items() if k != "targets"}
    value = getattr(ti, loss)(logits, inputs["targets"], **call_options)
    (grad,) = torch.autograd.grad(value.sum(), leaf)
    expected = _spec_grad(loss, wrt, logits, targets, **options)
    np.testing.assert_allclose(_np(grad), expected, rtol=1e-12, atol=1e-14, err_msg=f"d/d{wrt}")


# ----------------------------------------------------------------------------------------------
# gradcheck / gradgradcheck, every differentiable input, float64
# ----------------------------------------------------------------------------------------------


def _differentiable_calls():
    logits, soft, index, vector = _softmax_inputs(seed=4, shape=(3, 4, 2))
    s_logits, s_targets, weight, pos_weight = _sigmoid_inputs(seed=4, shape=(3, 4))
    return {
        "softmax_cross_entropy/prob": (
            lambda z, t, w: ti.softmax_cross_entropy(z, t, weight=w, label_smoothing=0.1),
            (logits, soft, vector),
        ),
        "softmax_cross_entropy/index": (
            lambda z, w: ti.softmax_cross_entropy(z, index, weight=w),
            (logits, vector),
        ),
        "softmax_focal_loss/prob": (
            lambda z, t, a: ti.softmax_focal_loss(z, t, alpha=a, gamma=0.5, label_smoothing=0.1),
            (logits, soft, vector),
        ),
        "softmax_focal_loss/index-scalar-alpha": (
            lambda z, a: ti.softmax_focal_loss(z, index, alpha=a, gamma=2.0),
            (logits, torch.tensor(0.3, dtype=torch.float64)),
        ),
        "sigmoid_cross_entropy": (
            lambda z, t, w, q: ti.sigmoid_cross_entropy(z, t, weight=w, pos_weight=q),
            (s_logits, s_targets, weight, pos_weight),
        ),
        "sigmoid_focal_loss": (
            lambda z, t: ti.sigmoid_focal_loss(z, t, gamma=0.5, alpha=0.25),
            (s_logits, s_targets),
        ),
    }


@pytest.mark.parametrize("case", list(_differentiable_calls()))
def test_gradcheck_and_gradgradcheck_every_differentiable_input(case):
    fn, inputs = _differentiable_calls()[case]
    leaves = tuple(x.detach().clone().requires_grad_(True) for x in inputs)
    assert torch.autograd.gradcheck(fn, leaves)
    assert torch.autograd.gradgradcheck(fn, leaves)


def test_gradient_reaches_a_weight_that_torch_refuses():
    logits, _, index, weight = _softmax_inputs()
    leaf = weight.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        F.cross_entropy(logits, index, weight=leaf)
    ti.cross_entropy(logits, index, weight=leaf).backward()
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda z, t: ti.softmax_focal_loss(z, t, gamma=torch.tensor(2.0, requires_grad=True)),
            r"`gamma` must be a real number",
        ),
        (
            lambda z, t: ti.sigmoid_focal_loss(
                z, t.float(), alpha=torch.tensor(0.25, requires_grad=True)
            ),
            r"`alpha` must be None or a number in \[0, 1\]",
        ),
        (
            lambda z, t: ti.softmax_cross_entropy(
                z, t, label_smoothing=torch.tensor(0.1, requires_grad=True)
            ),
            r"`label_smoothing` must be a real number",
        ),
    ],
)
def test_scalar_options_as_tensors_raise_rather_than_drop_the_gradient(call, match):
    logits = torch.randn(4, 4, requires_grad=True)
    targets = torch.tensor([0, 1, 2, 3])
    if "sigmoid" in match or "alpha" in match:
        targets = torch.rand(4, 4)
    with pytest.raises(TypeError, match=match):
        call(logits, targets)


@pytest.mark.parametrize("loss", SOFTMAX + SIGMOID)
def test_saved_tensors_grow_only_when_a_target_requires_grad(loss):
    """Logits-only: exactly the inputs are saved (test_torch_impl's memory test); targets that
    require grad still save only the inputs (the target gradient is recomputed in backward)."""
    logits = torch.randn(16, 5, requires_grad=True)
    targets = torch.rand(16, 5)
    if loss in SOFTMAX:
        targets = torch.softmax(targets, dim=1)
    targets.requires_grad_(True)
    saved = []

    def pack(x):
        saved.append(x.untyped_storage().data_ptr())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        value = getattr(ti, loss)(logits, targets)
    own = {logits.untyped_storage().data_ptr(), targets.untyped_storage().data_ptr()}
    assert set(saved) <= own, loss
    value.backward()
    assert logits.grad is not None and targets.grad is not None


# ----------------------------------------------------------------------------------------------
# torch.func
# ----------------------------------------------------------------------------------------------


def test_torch_func_grad_vmap_and_jacrev_wrt_targets():
    logits, soft, _, _ = _softmax_inputs(seed=5, shape=(4, 5))
    expected = torch.func.grad(lambda t: F.cross_entropy(logits, t), argnums=0)(soft)
    got = torch.func.grad(lambda t: ti.cross_entropy(logits, t))(soft)
    torch.testing.assert_close(got, expected, **CLOSE)
    batched = torch.func.vmap(torch.func.grad(lambda z, t: ti.cross_entropy(z, t), argnums=1))(
        torch.stack([logits, 2 * logits]), torch.stack([soft, soft])
    )
    torch.testing.assert_close(batched[0], expected, **CLOSE)
    x, t, _, _ = _sigmoid_inputs(seed=5)
    ours = torch.func.jacrev(lambda t: ti.sigmoid_focal_loss(x, t, reduction="none"))(t)
    theirs = torch.func.jacrev(lambda t: _torchvision_sigmoid_focal(x, t, 2.0, None, "none"))(t)
    torch.testing.assert_close(ours, theirs, **CLOSE)


# ----------------------------------------------------------------------------------------------
# torch.autocast: float32 in, float32 out, as torch's own losses
# ----------------------------------------------------------------------------------------------


def _autocast_cases():
    g = _gen(6)
    logits = torch.randn(6, 5, generator=g).bfloat16()
    index = torch.randint(0, 5, (6,), generator=g)
    soft = torch.softmax(torch.randn(6, 5, generator=g), dim=1).bfloat16()
    binary = torch.rand(6, 5, generator=g).bfloat16()
    weight = torch.rand(5, generator=g).bfloat16()
    return logits, index, soft, binary, weight


@pytest.mark.parametrize("targets_kind", ["index", "prob"])
def test_autocast_cross_entropy_matches_torch(targets_kind):
    logits, index, soft, _, weight = _autocast_cases()
    targets = index if targets_kind == "index" else soft
    for kwargs in ({}, {"weight": weight}, {"label_smoothing": 0.1}):
        z_ours = logits.clone().requires_grad_(True)
        z_theirs = logits.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = ti.cross_entropy(z_ours, targets, **kwargs)
            theirs = F.cross_entropy(z_theirs, targets, **kwargs)
            module = ti.CrossEntropyLoss(**kwargs)(logits, targets)
        assert ours.dtype == theirs.dtype == module.dtype == torch.float32, kwargs
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(module, theirs, rtol=1e-6, atol=1e-6)
        ours.backward()
        theirs.backward()
        assert z_ours.grad.dtype == z_theirs.grad.dtype == torch.bfloat16
        torch.testing.assert_close(z_ours.grad, z_theirs.grad)


def test_autocast_bce_with_logits_matches_torch():
    logits, _, _, binary, _ = _autocast_cases()
    pos_weight = torch.full((5,), 2.0).bfloat16()
    for kwargs in ({}, {"pos_weight": pos_weight}):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = ti.binary_cross_entropy_with_logits(logits, binary, **kwargs)
            theirs = F.binary_cross_entropy_with_logits(logits, binary, **kwargs)
            module = ti.BCEWithLogitsLoss(**kwargs)(logits, binary)
        assert ours.dtype == theirs.dtype == module.dtype == torch.float32
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(module, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("loss", SOFTMAX + SIGMOID)
def test_autocast_canonical_losses_compute_and_return_float32(loss):
    logits, index, soft, binary, _ = _autocast_cases()
    targets = index if loss in SOFTMAX else binary
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = getattr(ti, loss)(logits, targets, reduction="none")
    # float32 throughout: the same as the float32 call on the float32 inputs
    expected = getattr(ti, loss)(
        logits.float(), targets if loss in SOFTMAX else targets.float(), reduction="none"
    )
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, expected, rtol=0, atol=0)
    # outside autocast: computed in float32, returned in bfloat16 (unchanged)
    assert getattr(ti, loss)(logits, targets).dtype == torch.bfloat16
    # float64 is not an autocast input: left as it is
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert getattr(ti, loss)(logits.double(), targets).dtype == torch.float64
    del soft


def test_autocast_modules_return_float32():
    logits, index, _, binary, _ = _autocast_cases()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ti.FocalLoss(gamma=0.5)(logits, index).dtype == torch.float32
        assert ti.SigmoidFocalLoss(alpha=0.25)(logits, binary).dtype == torch.float32


# ----------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True): forward + backward, no graph break
# ----------------------------------------------------------------------------------------------


def _compile_cases():
    g = _gen(7)
    logits = torch.randn(8, 5, generator=g)
    index = torch.randint(0, 5, (8,), generator=g)
    index[0] = -100
    binary = torch.rand(8, 5, generator=g)
    mask = torch.ones(5, dtype=torch.bool)
    mask[3] = False
    index = torch.where(index == 3, 1, index)
    return logits, {
        "softmax_cross_entropy": lambda z: ti.softmax_cross_entropy(
            z, index, weight=torch.linspace(0.5, 1.5, 5), label_smoothing=0.1
        ),
        "softmax_focal_loss": lambda z: ti.softmax_focal_loss(z, index, gamma=0.5, where=mask),
        "sigmoid_cross_entropy": lambda z: ti.sigmoid_cross_entropy(
            z, binary, pos_weight=torch.full((5,), 2.0)
        ),
        "sigmoid_focal_loss": lambda z: ti.sigmoid_focal_loss(z, binary, gamma=2.0, alpha=0.25),
        # the cross entropy's own terms (no pos_weight), per element: the +inf mask runs there
        "sigmoid_cross_entropy/none": lambda z: ti.sigmoid_cross_entropy(
            z, binary, weight=torch.linspace(0.5, 1.5, 5), reduction="none"
        ).sum(),
        "CrossEntropyLoss": lambda z: ti.CrossEntropyLoss(label_smoothing=0.1)(z, index),
        "FocalLoss": lambda z: ti.FocalLoss(gamma=2.0, alpha=0.5)(z, index),
    }


COMPILE_CASES = [
    *[(name, "aot_eager") for name in SOFTMAX + SIGMOID + ["CrossEntropyLoss", "FocalLoss"]],
    ("sigmoid_cross_entropy/none", "aot_eager"),
    ("softmax_focal_loss", "inductor"),
    ("sigmoid_focal_loss", "inductor"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "backend"), COMPILE_CASES)
def test_torch_compile_fullgraph_forward_and_backward(name, backend):
    logits, cases = _compile_cases()
    fn = cases[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    z_compiled = logits.clone().requires_grad_(True)
    z_eager = logits.clone().requires_grad_(True)
    value = compiled(z_compiled)
    expected = fn(z_eager)
    value.backward()
    expected.backward()
    torch.testing.assert_close(value, expected)
    torch.testing.assert_close(z_compiled.grad, z_eager.grad)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*SOFTMAX, *SIGMOID, "sigmoid_cross_entropy/none", "FocalLoss"])
def test_torch_compile_fullgraph_without_gradients(name):
    """Evaluation: no input requires grad (issue 31: the options' autograd function did not
    trace there); the value equals the eager one."""
    logits, cases = _compile_cases()
    fn = cases[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(logits), fn(logits), rtol=0, atol=0)
    # and under no_grad, with logits that do require grad
    z = logits.clone().requires_grad_(True)
    with torch.no_grad():
        value = compiled(z)
    assert not value.requires_grad
    torch.testing.assert_close(value, fn(logits), rtol=0, atol=0)


def _dynamic_option_cases():
    g = _gen(11)
    logits = torch.randn(6, 5, generator=g)
    index = torch.randint(0, 5, (6,), generator=g)
    binary = torch.rand(6, 5, generator=g)
    hidden, vocab = torch.randn(6, 3, generator=g), torch.randn(5, 3, generator=g)
    return {
        "softmax_focal_loss/gamma": (
            lambda z, v: ti.softmax_focal_loss(z, index, gamma=v),
            logits,
            (2.0, 0.5, 3.0),
            -1.0,
        ),
        "softmax_focal_loss/alpha": (
            lambda z, v: ti.softmax_focal_loss(z, index, alpha=v),
            logits,
            (0.25, 0.5, 0.75),
            1.5,
        ),
        "cross_entropy/label_smoothing": (
            lambda z, v: ti.cross_entropy(z, index, label_smoothing=v),
            logits,
            (0.1, 0.2, 0.3),
            -0.5,
        ),
        "sigmoid_focal_loss/gamma": (
            lambda z, v: ti.sigmoid_focal_loss(z, binary, gamma=v),
            logits,
            (2.0, 0.5, 3.0),
            -1.0,
        ),
        "sigmoid_focal_loss/alpha": (
            lambda z, v: ti.sigmoid_focal_loss(z, binary, alpha=v),
            logits,
            (0.25, 0.5, 0.75),
            2.0,
        ),
        "linear_softmax_focal_loss/gamma": (
            lambda h, v: ti.linear_softmax_focal_loss(h, vocab, index, gamma=v),
            hidden,
            (2.0, 0.5, 3.0),
            -1.0,
        ),
    }


_RULES = {
    "gamma": "`gamma` must be a finite number >= 0",
    "alpha": "`alpha` must be in",
    "label_smoothing": "`label_smoothing` must be in",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_dynamic_option_cases()))
def test_torch_compile_fullgraph_with_a_float_option_that_changes(name):
    """dynamo traces a float argument that changes between calls as a symbol (issue 31: the
    validation called math.isfinite on it); each value gives the eager value and gradient, and a
    value outside the option's domain still fails with the option's rule."""
    fn, first, values, bad = _dynamic_option_cases()[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for value in values:
        z_compiled = first.clone().requires_grad_(True)
        z_eager = first.clone().requires_grad_(True)
        result, expected = compiled(z_compiled, value), fn(z_eager, value)
        torch.testing.assert_close(result, expected)
        result.backward()
        expected.backward()
        torch.testing.assert_close(z_compiled.grad, z_eager.grad)
    with pytest.raises(Exception, match=re.escape(_RULES[name.split("/")[1]])):
        compiled(first, bad)


@pytest.mark.slow
@pytest.mark.parametrize("module", ["FocalLoss", "SigmoidFocalLoss"])
def test_torch_compile_dynamic_modules(module):
    g = _gen(12)
    logits = torch.randn(6, 5, generator=g)
    targets = torch.randint(0, 5, (6,), generator=g) if module == "FocalLoss" else torch.rand(6, 5)
    loss = getattr(ti, module)(gamma=2.0)
    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")
    torch.testing.assert_close(compiled(logits, targets), loss(logits, targets), rtol=0, atol=0)


def test_eager_validation_is_unchanged_outside_compile():
    with pytest.raises(ValueError, match=r"`targets` has class index 9 at position \(0,\)"):
        ti.softmax_cross_entropy(torch.randn(2, 5), torch.tensor([9, 0]))


# ----------------------------------------------------------------------------------------------
# Wrong-framework input and integer target dtypes
# ----------------------------------------------------------------------------------------------


def _foreign_arrays():
    arrays = [("numpy", lambda x: x.numpy())]
    try:
        import jax.numpy as jnp
    except ImportError:
        return arrays
    return arrays + [("jax", lambda x: jnp.asarray(x.numpy()))]


@pytest.mark.parametrize(("framework", "convert"), _foreign_arrays(), ids=lambda v: str(v)[:5])
@pytest.mark.parametrize("argument", ["logits", "targets", "weight", "where", "alpha"])
def test_foreign_arrays_raise_one_sentence_naming_the_argument(argument, framework, convert):
    logits = torch.randn(4, 5)
    targets = torch.tensor([0, 1, 2, 3])
    kwargs = {
        "weight": torch.rand(5),
        "where": torch.ones(5, dtype=torch.bool),
        "alpha": torch.rand(5),
    }
    loss = ti.softmax_focal_loss if argument == "alpha" else ti.softmax_cross_entropy
    call = {"logits": logits, "targets": targets}
    if argument in kwargs:
        call[argument] = kwargs[argument]
    call[argument] = convert(call[argument])
    module = type(call[argument]).__module__
    with pytest.raises(TypeError, match=rf"^`{argument}` must be a torch.Tensor\. Received: "):
        loss(**call)
    with pytest.raises(TypeError, match=rf"of type {module}\."):
        loss(**call)


@pytest.mark.parametrize(("framework", "convert"), _foreign_arrays(), ids=lambda v: str(v)[:5])
def test_foreign_arrays_raise_in_the_sigmoid_losses_and_modules(framework, convert):
    logits, targets = torch.randn(4, 5), torch.rand(4, 5)
    for argument in ("targets", "weight", "pos_weight"):
        call = {"logits": logits, "targets": targets, argument: convert(torch.rand(4, 5))}
        if argument == "targets":
            call.pop(argument)
            call["targets"] = convert(targets)
        with pytest.raises(TypeError, match=rf"^`{argument}` must be a torch.Tensor\."):
            ti.sigmoid_cross_entropy(**call)
    with pytest.raises(TypeError, match=r"^`weight` must be a torch.Tensor\."):
        ti.CrossEntropyLoss(weight=convert(torch.rand(5)))
    with pytest.raises(TypeError, match=r"^`pos_weight` must be a torch.Tensor\."):
        ti.BCEWithLogitsLoss(pos_weight=convert(torch.rand(5)))
    # Python numbers stay allowed for the scalar options
    ti.softmax_focal_loss(logits, torch.tensor([0, 1, 2, 3]), gamma=1, alpha=0.5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.int32, torch.int16])
def test_cross_entropy_integer_target_dtypes_like_torch(dtype):
    logits = torch.randn(4, 5, dtype=torch.float64)
    targets = torch.tensor([0, 1, 2, 4], dtype=dtype)
    try:
        expected = F.cross_entropy(logits, targets)
    except RuntimeError:
        with pytest.raises(RuntimeError, match=r"`target` of class indices must be int64 or uint8"):
            ti.cross_entropy(logits, targets)
    else:
        torch.testing.assert_close(ti.cross_entropy(logits, targets), expected, **CLOSE)
    # the canonical function, like the spec, takes any integer dtype
    reference = F.cross_entropy(logits, targets.long())
    torch.testing.assert_close(ti.softmax_cross_entropy(logits, targets), reference, **CLOSE)


# ----------------------------------------------------------------------------------------------
# `where`, optax semantics: class mask of the logits' shape, per-example mask of the batch shape
# ----------------------------------------------------------------------------------------------


def _hand_ce(z, t):
    """-sum_c t_c log softmax(z)_c over a list of logits (Python floats, by hand)."""
    lse = math.log(sum(math.exp(v) for v in z))
    return -sum(tc * (zc - lse) for zc, tc in zip(z, t) if tc)


def test_where_class_mask_drops_the_target_mass_on_masked_classes():
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], dtype=torch.float64)
    targets = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.4, 0.0]], dtype=torch.float64)
    where = torch.tensor([[True, True, False], [True, True, True]])
    z = logits.clone().requires_grad_(True)
    value = ti.softmax_cross_entropy(z, targets, where=where, reduction="none")
    # the masked class leaves the normaliser and the target sum (not +inf)
    expected = [_hand_ce([1.0, 2.0], [0.2, 0.5]), _hand_ce([0.0, -1.0, 3.0], [0.6, 0.4, 0.0])]
    torch.testing.assert_close(value, torch.tensor(expected, dtype=torch.float64), **CLOSE)
    (grad,) = torch.autograd.grad(value.sum(), z)
    assert grad[0, 2] == 0.0 and torch.isfinite(grad).all()
    # d/dz = p * sum(t) - t over the unmasked classes
    p = torch.softmax(torch.tensor([1.0, 2.0], dtype=torch.float64), 0)
    torch.testing.assert_close(
        grad[0, :2], p * 0.7 - torch.tensor([0.2, 0.5], dtype=torch.float64), **CLOSE
    )


def test_where_of_batch_shape_masks_whole_examples_and_leaves_the_mean():
    # 3 examples of 4 classes: a mask of shape (3,) cannot be a class mask
    rows = [[1.0, 2.0, 0.5, 0.0], [0.0, -1.0, 3.0, 1.0], [2.0, 2.0, 2.0, -1.0]]
    logits = torch.tensor(rows, dtype=torch.float64)
    index = torch.tensor([1, 2, 0])
    kept = torch.tensor([True, False, True])
    for loss in SOFTMAX:
        options = {"gamma": 0.0} if losses.get(loss).is_focal else {}
        fn = getattr(ti, loss)
        z = logits.clone().requires_grad_(True)
        value = fn(z, index, where=kept, **options)
        expected = (_hand_ce(rows[0], [0, 1, 0, 0]) + _hand_ce(rows[2], [1, 0, 0, 0])) / 2
        torch.testing.assert_close(value, torch.tensor(expected, dtype=torch.float64), **CLOSE)
        (grad,) = torch.autograd.grad(value, z)
        assert not grad[1].any(), loss
        # the same as the class mask of the logits' shape, broadcast by hand
        class_mask = kept[:, None].expand(3, 4)
        torch.testing.assert_close(value, fn(logits, index, where=class_mask, **options), **CLOSE)


@pytest.mark.parametrize("kind", ["index", "prob"])
@pytest.mark.parametrize("loss", SOFTMAX)
def test_fully_masked_row_gives_zero_loss_zero_gradient_and_leaves_the_mean(loss, kind):
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], dtype=torch.float64)
    if kind == "index":
        targets = torch.tensor([1, 0])
    else:
        targets = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    targets_leaf = targets.clone().requires_grad_(kind == "prob")
    where = torch.tensor([[True, True, True], [False, False, False]])
    fn = getattr(ti, loss)
    z = logits.clone().requires_grad_(True)
    per_row = fn(z, targets_leaf, where=where, reduction="none")
    assert per_row[1].item() == 0.0
    mean = fn(z, targets_leaf, where=where)
    torch.testing.assert_close(mean, per_row[0], **CLOSE)  # denominator 1, not 2
    inputs = (z, targets_leaf) if kind == "prob" else (z,)
    grads = torch.autograd.grad(mean, inputs)
    for grad in grads:
        assert torch.isfinite(grad).all() and not grad[1].any(), (loss, kind)
    # a class-index target on a masked class: that element is ignored too
    if kind == "index":
        on_masked = torch.tensor([[True, True, True], [True, False, True]])
        value = fn(logits, torch.tensor([1, 1]), where=on_masked, reduction="none")
        assert value[1].item() == 0.0


def test_where_prob_target_gradient_is_zero_on_masked_classes():
    logits, soft, _, _ = _softmax_inputs(seed=8, shape=(3, 4))
    where = torch.tensor([True, False, True, True])
    t = soft.clone().requires_grad_(True)
    value = ti.softmax_cross_entropy(logits, t, where=where, reduction="sum")
    (grad,) = torch.autograd.grad(value, t)
    assert not grad[:, 1].any()
    # elsewhere -log p over the unmasked classes
    log_p = torch.log_softmax(logits[:, [0, 2, 3]], dim=1)
    torch.testing.assert_close(grad[:, [0, 2, 3]], -log_p, **CLOSE)
