"""`normalizer=` (DESIGN 12): reduction 'mean' with a given divisor, the reduction='sum' loss
divided by it. The spec defines it; both backends are judged against the spec with the shared strict
standard (``dualloss.parity.tolerance``, which divides its error model by the normalizer), the spec
against torch itself, and the refusals are tested message by message.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dualloss import jax_impl, losses, spec
from dualloss import torch_impl as ti
from dualloss.parity.tolerance import judge

N, C = 6, 5
SOFTMAX = [info.name for info in losses.of_family("softmax")]
SIGMOID = [info.name for info in losses.of_family("sigmoid")]
LOSSES = SOFTMAX + SIGMOID
# a count, the same as a 0-d integer array (a psum/all_reduce of counts), a weight sum, and 0
NORMALIZERS = [("number", 7), ("int_array", 7), ("float_array", 2.5), ("zero", 0)]
DTYPES = ["float64", "float32", "bfloat16"]
OPTIONS = {
    "softmax_cross_entropy": [{}, {"weight": "vector", "label_smoothing": 0.1}],
    "softmax_focal_loss": [{"gamma": 2.0}, {"gamma": 0.5, "alpha": "vector"}],
    "sigmoid_cross_entropy": [{}, {"pos_weight": "vector"}],
    "sigmoid_focal_loss": [{"gamma": 2.0}, {"gamma": 0.5, "alpha": 0.25}],
}


def _inputs(loss, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(N, C)) * 3.0
    if loss in SOFTMAX:
        targets = rng.integers(0, C, size=N)
        targets[1] = -100
    else:
        targets = rng.uniform(size=(N, C))
    return logits, targets


def _numpy_options(options):
    out = dict(options)
    for key, value in options.items():
        if value == "vector":
            out[key] = np.linspace(0.2, 1.0, C)
    return out


def _torch_value(value, dtype, kind):
    if kind == "number" or kind == "zero":
        return value
    return torch.tensor(value, dtype=torch.int64 if kind == "int_array" else getattr(torch, dtype))


def _jax_value(value, kind):
    if kind == "number" or kind == "zero":
        return value
    return jnp.asarray(value, dtype=jnp.int32 if kind == "int_array" else jnp.float32)


def _assert_ok(judgement, context):
    problems = judgement.nonfinite + judgement.inaccurate
    assert judgement.ok, f"{context} [{judgement.dtype}]: {'; '.join(problems)}"


# ----------------------------------------------------------------------------------------------
# The spec: a normalizer is the mean's divisor
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_spec_normalizer_divides_torch_sum_and_its_own_count_gives_torch_mean(reduction, weighted):
    logits, targets = _inputs("softmax_cross_entropy", seed=3)
    weight = np.linspace(0.2, 1.0, C) if weighted else None
    kept = targets != -100
    count = float(np.sum(weight[targets[kept]]) if weighted else np.sum(kept))
    normalizer = 11.0 if reduction == "sum" else count
    got = spec.softmax_cross_entropy(logits, targets, weight=weight, normalizer=normalizer)
    grad = spec.softmax_cross_entropy_grad(logits, targets, weight=weight, normalizer=normalizer)
    x = torch.tensor(logits, requires_grad=True)
    w = None if weight is None else torch.tensor(weight)
    expected = F.cross_entropy(x, torch.tensor(targets), weight=w, reduction=reduction)
    if reduction == "sum":
        expected = expected / normalizer
    expected.backward()
    np.testing.assert_allclose(got, expected.item(), rtol=1e-15)
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-14, atol=1e-17)


@pytest.mark.parametrize("loss", LOSSES)
def test_spec_normalizer_divides_every_gradient_of_the_sum(loss):
    info = losses.get(loss)
    logits, targets = _inputs(loss, seed=4)
    if loss in SOFTMAX:
        targets = np.random.default_rng(4).dirichlet(np.ones(C), size=N)
    options = _numpy_options(OPTIONS[loss][1])
    for wrt in ("logits", *(n for n in info.differentiable if n != "logits")):
        if wrt not in ("logits", "targets") and options.get(wrt) is None:
            continue
        summed = info.grad(logits, targets, reduction="sum", wrt=wrt, **options)
        divided = info.grad(logits, targets, normalizer=np.float64(4.0), wrt=wrt, **options)
        np.testing.assert_array_equal(divided, np.asarray(summed) / 4.0, err_msg=wrt)
        zero = info.grad(logits, targets, normalizer=0, wrt=wrt, **options)
        np.testing.assert_array_equal(zero, np.zeros_like(summed), err_msg=wrt)


# ----------------------------------------------------------------------------------------------
# Both backends against the spec
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("kind", "value"), NORMALIZERS)
@pytest.mark.parametrize("option_set", [0, 1])
@pytest.mark.parametrize("loss", LOSSES)
def test_torch_normalizer_matches_spec(loss, option_set, kind, value, dtype):
    logits, targets = _inputs(loss)
    options = _numpy_options(OPTIONS[loss][option_set])
    t_dtype = getattr(torch, dtype)
    x = torch.tensor(logits).to(t_dtype).requires_grad_(True)
    if loss in SOFTMAX:
        t = torch.tensor(targets)
        spec_targets = targets
    else:
        t = torch.tensor(targets).to(t_dtype)
        spec_targets = t.double().numpy()
    t_options = {k: torch.tensor(v).to(t_dtype) if isinstance(v, np.ndarray) else v
                 for k, v in options.items()}  # fmt: skip
    normalizer = _torch_value(value, dtype, kind)
    out = getattr(ti, loss)(x, t, **t_options, normalizer=normalizer)
    assert out.dtype == x.dtype
    out.backward()
    seen = {
        k: v.double().numpy() if isinstance(v, torch.Tensor) else v for k, v in t_options.items()
    }
    spec_normalizer = float(normalizer) if kind != "number" and kind != "zero" else value
    judgement = judge(loss, x.detach().double().numpy(), spec_targets,
                      {**seen, "normalizer": spec_normalizer}, dtype,
                      out.detach().double().numpy(), x.grad.double().numpy())  # fmt: skip
    _assert_ok(judgement, f"torch_impl.{loss}({options}, normalizer={normalizer!r})")
    if kind == "zero":
        assert out.item() == 0.0 and not torch.any(x.grad)


# every option set of every loss, every pair of the other values (a JAX compilation each; the
# torch test above runs all of them; --full: all)
@pytest.mark.exhaustive(cover=("loss", "option_set"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("kind", "value"), NORMALIZERS)
@pytest.mark.parametrize("option_set", [0, 1])
@pytest.mark.parametrize("loss", LOSSES)
def test_jax_normalizer_matches_spec(loss, option_set, kind, value, dtype):
    logits, targets = _inputs(loss)
    options = _numpy_options(OPTIONS[loss][option_set])
    j_dtype = jnp.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    with jax.enable_x64(dtype == "float64"):
        x = jnp.asarray(logits, j_dtype)
        t = jnp.asarray(targets) if loss in SOFTMAX else jnp.asarray(targets, j_dtype)
        j_options = {k: jnp.asarray(v, j_dtype) if isinstance(v, np.ndarray) else v
                     for k, v in options.items()}  # fmt: skip
        normalizer = _jax_value(value, kind)
        fn = getattr(jax_impl, loss)
        # under jit: the normalizer array is traced
        value_and_grad = jax.jit(
            jax.value_and_grad(lambda x, n: fn(x, t, **j_options, normalizer=n))
        )
        out, grad = value_and_grad(x, normalizer)
        assert out.dtype == x.dtype and grad.dtype == x.dtype

        def as64(a):
            return np.asarray(jnp.asarray(a, jnp.float32 if dtype != "float64" else a.dtype))

        seen = {k: as64(v) if isinstance(v, jax.Array) else v for k, v in j_options.items()}
        spec_targets = targets if loss in SOFTMAX else as64(t)
        spec_normalizer = float(np.asarray(normalizer))
        judgement = judge(loss, as64(x), spec_targets, {**seen, "normalizer": spec_normalizer},
                          dtype, as64(out), as64(grad))  # fmt: skip
    _assert_ok(judgement, f"jax_impl.{loss}({options}, normalizer={normalizer!r})")
    if kind == "zero":
        assert float(out) == 0.0 and not np.any(np.asarray(grad, np.float64))


@pytest.mark.parametrize("loss", ["linear_softmax_cross_entropy", "linear_softmax_focal_loss"])
@pytest.mark.parametrize("kind", ["number", "array", "zero"])
def test_linear_normalizer_matches_spec_in_float64(loss, kind):
    rng = np.random.default_rng(5)
    hidden, kernel, bias = rng.normal(size=(9, 4)), rng.normal(size=(4, 11)), rng.normal(size=11)
    targets = rng.integers(0, 11, size=9)
    targets[2] = -100
    value = {"number": 13, "array": 6.5, "zero": 0}[kind]
    wrts = ("hidden", "linear_weight", "bias")
    expected = [getattr(spec, loss)(hidden, kernel, targets, bias=bias, normalizer=value)]
    expected += [getattr(spec, loss + "_grad")(hidden, kernel, targets, bias=bias,
                                               normalizer=value, wrt=w) for w in wrts]  # fmt: skip
    leaves = [torch.tensor(a, requires_grad=True) for a in (hidden, kernel.T, bias)]
    normalizer = torch.tensor(value, dtype=torch.float64) if kind == "array" else value
    out = getattr(ti, loss)(leaves[0], leaves[1], torch.tensor(targets), bias=leaves[2],
                            normalizer=normalizer, chunk_size=4)  # fmt: skip
    out.backward()
    got_torch = [out.detach().numpy(), leaves[0].grad.numpy(), leaves[1].grad.numpy().T,
                 leaves[2].grad.numpy()]  # fmt: skip
    with jax.enable_x64(True):
        n = jnp.asarray(value, jnp.float64) if kind == "array" else value
        fn = getattr(jax_impl, loss)
        out, grads = jax.value_and_grad(
            lambda h, w, b: fn(h, w, jnp.asarray(targets), bias=b, normalizer=n, chunk_size=4),
            argnums=(0, 1, 2),
        )(jnp.asarray(hidden), jnp.asarray(kernel), jnp.asarray(bias))
        got_jax = [np.asarray(out), *(np.asarray(g) for g in grads)]
    for backend, got in (("torch_impl", got_torch), ("jax_impl", got_jax)):
        for name, g, e in zip(("value", *wrts), got, expected, strict=True):
            e = np.asarray(e)
            scale = np.abs(e).max() if e.size and np.abs(e).max() > 0 else 1.0
            context = f"{backend}.{loss} {name} normalizer={value}"
            np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-13 * scale, err_msg=context)


# ----------------------------------------------------------------------------------------------
# Refusals: one sentence naming the argument and the value, identical in all three modules
# ----------------------------------------------------------------------------------------------

REFUSALS = [
    ({"reduction": "none", "normalizer": 3}, ValueError,
     r"`normalizer` replaces the divisor of reduction='mean' .* Received: reduction='none'\."),
    ({"reduction": "sum", "normalizer": 3}, ValueError, r"Received: reduction='sum'\."),
    ({"normalizer": float("inf")}, ValueError,
     r"`normalizer` must be a finite number >= 0 .* Received: normalizer=inf\."),
    ({"normalizer": True}, TypeError, r"`normalizer` must be a number or a scalar array"),
    ({"normalizer": "4"}, TypeError, r"Received: normalizer='4'\."),
    ({"normalizer": "array_2"}, ValueError,
     r"`normalizer` must be a scalar \(a number or a 0-d array\)\. "
     r"Received: normalizer.shape=\(2,\)\."),
    ({"normalizer": "bool_array"}, TypeError,
     r"`normalizer` must have a floating or integer dtype\. Received: normalizer.dtype=bool\."),
]  # fmt: skip


def _array(module, marker):
    values = {"array_2": [1.0, 2.0], "bool_array": True}[marker]
    dtype = {"array_2": None, "bool_array": bool}[marker]
    if module == "torch_impl":
        return torch.tensor(values, dtype=None if dtype is None else torch.bool)
    if module == "jax_impl":
        return jnp.asarray(values, dtype=dtype)
    return np.asarray(values, dtype=dtype)


@pytest.mark.parametrize(("kwargs", "error", "match"), REFUSALS)
@pytest.mark.parametrize("module", ["spec", "torch_impl", "jax_impl"])
@pytest.mark.parametrize("loss", LOSSES)
def test_bad_normalizer_raises_one_sentence(loss, module, kwargs, error, match):
    logits, targets = _inputs(loss)
    kwargs = dict(kwargs)
    if isinstance(kwargs["normalizer"], str) and kwargs["normalizer"] in ("array_2", "bool_array"):
        kwargs["normalizer"] = _array(module, kwargs["normalizer"])
    if module == "torch_impl":
        logits, targets = torch.tensor(logits), torch.tensor(targets)
    fn = getattr({"spec": spec, "torch_impl": ti, "jax_impl": jax_impl}[module], loss)
    with pytest.raises(error, match=match):
        fn(logits, targets, **kwargs)


def test_torch_normalizer_that_requires_grad_raises_instead_of_a_silent_none():
    logits, targets = _inputs("softmax_cross_entropy")
    normalizer = torch.tensor(4.0, requires_grad=True)
    with pytest.raises(
        ValueError, match=r"pass normalizer.detach\(\)\)\. Received: normalizer with"
    ):
        ti.softmax_cross_entropy(torch.tensor(logits), torch.tensor(targets), normalizer=normalizer)


def test_jax_normalizer_is_a_constant():
    logits, targets = _inputs("softmax_focal_loss")
    x, t = jnp.asarray(logits, jnp.float32), jnp.asarray(targets)
    grad_n = jax.grad(lambda n: jax_impl.softmax_focal_loss(x, t, normalizer=n))(jnp.float32(3.0))
    assert float(grad_n) == 0.0
