"""Both backends' fused linear losses against the spec over adversarial regions, every dtype.

Regions: typical, huge hidden norms (logits ~1e4: one-hot softmax, exp underflow everywhere),
exact ties (duplicated vocabulary columns), ignored rows, all rows ignored, one class dominant
(p_y within ~1e-13 of 1: the loss and gradient are ~1e-13, judged at their own scale). Options:
plain cross entropy, class weights with label smoothing, focal (gamma 2), focal with a vector
alpha, gamma 0.5 and label smoothing. dtypes: float64, float32, bfloat16 (hidden, weight and bias
in bfloat16; the backends compute and accumulate in float32 and round the results once).

The tolerance (``_bound``), derived rather than tuned. The spec is evaluated at the inputs the
backend saw (rounded to the dtype), so only the backend's own arithmetic is judged. With u the
unit roundoff of the compute dtype (2^-53 float64, 2^-24 float32 and bfloat16), A_ic =
sum_k |h_ik W_kc| + |b_c| and gamma_n = (n + 1) u:

* logits: a dot product of length H in the compute dtype is off by at most
  |dz_ic| <= gamma_H A_ic; D_i = gamma_H max_c A_ic bounds the row.
* loss of row i: |dl_i| <= D_i sum_c |G_ic| (first order in dz; G the spec's gradient w.r.t.
  the logits) plus the row's own arithmetic, 8 u (|l_i| + log2(V) m_i) (the normaliser is a sum
  of V terms, its log is off by log2(V) u; m_i = (1 + gamma) sum_c a_ic bounds the gradient).
* logits' gradient: p moves by a factor exp(+-2 D_i) under dz, the focal factors by (1 + gamma)
  more: |dG_ic| <= E_ic = (2 D_i (1 + gamma)^2 + 8 u log2 V) (p_ic m_i + a_ic).
* through the linear layer: dh_ik = sum_c G_ic W_ck is off by sum_c E_ic |W_ck| +
  gamma_V sum_c |G_ic W_ck|; dW and db likewise with the sum over rows (gamma_N).
* reductions: summing N rows adds gamma_N sum_i |l_i|; 'mean' scales every bound as the loss.
* bfloat16 results are float32 results rounded once: + 2^-8 |x| on every entry.

NaN-free: every value and gradient must be finite (all these regions have finite math).
"""

from __future__ import annotations

import inspect
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dualloss import jax_impl as J
from dualloss import spec
from dualloss import torch_impl as T

BACKENDS = ("torch", "jax")
DTYPES = ("float64", "float32", "bfloat16")
REGIONS = ("typical", "huge_norms", "ties", "ignored", "all_ignored", "one_class_dominant")
OPTIONS = {
    "ce": ("linear_softmax_cross_entropy", {}),
    "ce_weight_smoothing": (
        "linear_softmax_cross_entropy",
        {"weight": "vector", "label_smoothing": 0.1},
    ),
    "focal": ("linear_softmax_focal_loss", {"gamma": 2.0}),
    "focal_alpha_smoothing": (
        "linear_softmax_focal_loss",
        {"gamma": 0.5, "alpha": "vector", "label_smoothing": 0.1},
    ),
}
WRT = ("hidden", "linear_weight", "bias")
UNIT = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-24}


def _region(name, seed=0, n=45, h=16, v=97):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(n, h))
    kernel = rng.normal(size=(h, v)) / math.sqrt(h)
    bias = rng.normal(size=v) * 0.1
    targets = rng.integers(0, v, size=n)
    if name == "huge_norms":
        hidden *= 3e3
    elif name == "ties":
        kernel[:, 1] = kernel[:, 2] = kernel[:, 0]
        bias[1] = bias[2] = bias[0]
        targets[: n // 2] = rng.integers(0, 3, size=n // 2)
    elif name == "ignored":
        targets[::3] = -100
    elif name == "all_ignored":
        targets[:] = -100
    elif name == "one_class_dominant":
        bias[5] = 40.0
        targets[: 2 * n // 3] = 5
    return hidden, kernel, bias, targets


def _options(options, v):
    ramp = np.linspace(0.2, 0.9, v)
    return {k: (ramp if value == "vector" else value) for k, value in options.items()}


def _rounded(x, dtype):
    """`x` as the backend sees it, back in float64."""
    return torch.tensor(x).to(getattr(torch, dtype)).double().numpy()


def _run(backend, name, dtype, hidden, kernel, bias, targets, reduction, options):
    """The backend's value and gradients (of the summed loss), float64 NumPy, spec layout."""
    if backend == "torch":
        tdtype = getattr(torch, dtype)
        leaves = [
            torch.tensor(hidden).to(tdtype).requires_grad_(),
            torch.tensor(kernel.T.copy()).to(tdtype).requires_grad_(),
            torch.tensor(bias).to(tdtype).requires_grad_(),
        ]
        kw = {k: (torch.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in options.items()}
        loss = getattr(T, name)(
            leaves[0], leaves[1], torch.tensor(targets), bias=leaves[2], reduction=reduction, **kw
        )
        loss.sum().backward()
        out = [loss.detach(), leaves[0].grad, leaves[1].grad.T, leaves[2].grad]
        assert all(x.dtype == tdtype for x in out)
        return [x.double().numpy() for x in out]
    with jax.enable_x64(dtype == "float64"):
        jdtype = getattr(jnp, dtype)
        args = [jnp.asarray(x, jdtype) for x in (hidden, kernel, bias)]
        kw = {k: (jnp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in options.items()}

        def f(h, w, b):
            return getattr(J, name)(
                h, w, jnp.asarray(targets, jnp.int32), bias=b, reduction=reduction, **kw
            )

        value, pull = jax.vjp(f, *args)
        grads = pull(jnp.ones_like(value))
        out = [value, *grads]
        assert all(x.dtype == jdtype for x in out)
        return [
            np.asarray(
                jnp.asarray(x, jnp.float64 if dtype == "float64" else jnp.float32), np.float64
            )
            for x in out
        ]


def _bound(name, dtype, hidden, kernel, bias, targets, reduction, options):
    """The error bound of the module docstring, per entry of (value, dh, dW, db)."""
    u = UNIT[dtype]
    n, size = hidden.shape
    v = kernel.shape[1]
    gamma = options.get("gamma", 0.0)
    is_focal = name == "linear_softmax_focal_loss"
    logits = hidden @ kernel + bias
    a_matrix = np.abs(hidden) @ np.abs(kernel) + np.abs(bias)
    delta = (size + 1) * u * a_matrix.max(axis=1, keepdims=True)
    intermediates = (
        spec.softmax_focal_loss_intermediates
        if is_focal
        else spec.softmax_cross_entropy_intermediates
    )
    kw = {k: val for k, val in options.items()}
    elements = intermediates(logits, targets, **kw)
    terms = elements.terms
    scale = 1.0
    if reduction == "mean":
        scale = 0.0 if elements.denominator == 0 else 1.0 / elements.denominator
    g_abs = np.abs(terms.grad) * scale
    mass = (1.0 + gamma) * np.sum(elements.a, axis=1, keepdims=True)
    log_v = math.log2(v)
    e = (2 * delta * (1 + gamma) ** 2 + 8 * u * log_v) * (terms.p * mass + elements.a) * scale
    e = np.where(elements.keep[:, None], e, 0.0)
    loss_rows = np.abs(terms.loss)
    row_bound = (
        delta[:, 0] * np.sum(g_abs, axis=1) + 8 * u * (loss_rows + log_v * mass[:, 0]) * scale
    )
    row_bound = np.where(elements.keep, row_bound, 0.0)
    gamma_v, gamma_n = (v + 1) * u, (n + 1) * u
    if reduction == "none":
        value = row_bound
    else:
        value = np.sum(row_bound) + gamma_n * np.sum(loss_rows) * scale
    dh = e @ np.abs(kernel).T + gamma_v * g_abs @ np.abs(kernel).T
    dw = np.abs(hidden).T @ e + gamma_n * np.abs(hidden).T @ g_abs
    db = e.sum(axis=0) + gamma_n * g_abs.sum(axis=0)
    return [value, dh, dw, db]


def _matrix():
    """float32 with reduction 'mean' in the quick loop; float64, bfloat16 and 'none' under slow."""
    for backend in BACKENDS:
        for dtype in DTYPES:
            for region in REGIONS:
                for option in OPTIONS:
                    for reduction in ("mean", "none"):
                        quick = dtype == "float32" and reduction == "mean"
                        marks = () if quick else (pytest.mark.slow,)
                        params = (backend, dtype, region, option, reduction)
                        yield pytest.param(*params, marks=marks, id="-".join(params))


@pytest.mark.exhaustive
@pytest.mark.parametrize(("backend", "dtype", "region", "option", "reduction"), list(_matrix()))
def test_backend_matches_spec_within_the_derived_bound(backend, dtype, region, option, reduction):
    name, options = OPTIONS[option]
    hidden, kernel, bias, targets = _region(region)
    options = _options(options, kernel.shape[1])
    hidden, kernel, bias = (_rounded(x, dtype) for x in (hidden, kernel, bias))
    got = _run(backend, name, dtype, hidden, kernel, bias, targets, reduction, options)
    expected = [
        getattr(spec, name)(hidden, kernel, targets, bias=bias, reduction=reduction, **options)
    ]
    expected += [
        getattr(spec, name + "_grad")(
            hidden, kernel, targets, bias=bias, reduction=reduction, wrt=wrt, **options
        )
        for wrt in WRT
    ]
    bounds = _bound(name, dtype, hidden, kernel, bias, targets, reduction, options)
    for what, g, e, bound in zip(("value", *WRT), got, expected, bounds, strict=True):
        e = np.asarray(e)
        assert np.all(np.isfinite(g)), f"non-finite {what} [{backend}.{name}, {dtype}, {region}]"
        if dtype == "bfloat16":
            bound = bound + 2.0**-8 * np.abs(e)
        # below the smallest normal number of the dtype: flushed, forgiven (parity's rule)
        tiny = np.finfo(np.float32 if dtype != "float64" else np.float64).tiny
        err = np.abs(g - e)
        bad = err > bound + tiny
        assert not bad.any(), (
            f"{what}: worst excess {np.max(err - bound):.3g} at {np.argwhere(bad)[0]}, got "
            f"{g[bad].ravel()[0] if np.ndim(g) else g!r}, spec gives "
            f"{e[bad].ravel()[0] if np.ndim(e) else e!r} "
            f"[{backend}.{name}({options}), {dtype}, {region}, {reduction}]"
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_class_dominant_loss_keeps_its_relative_accuracy(backend):
    # p_y = 1 - ~1e-13: lse - z_y computed as a difference would be 0 or off by 100%
    hidden, kernel, bias, targets = _region("one_class_dominant")
    rows = slice(0, 30)
    h, k, b = (_rounded(x, "float32") for x in (hidden[rows], kernel, bias))
    got = _run(
        backend,
        "linear_softmax_focal_loss",
        "float32",
        h,
        k,
        b,
        targets[rows],
        "none",
        {"gamma": 0.5},
    )[0]
    expected = spec.linear_softmax_focal_loss(
        h, k, targets[rows], bias=b, gamma=0.5, reduction="none"
    )
    assert np.all(expected > 0) and np.all(expected < 1e-10)
    np.testing.assert_allclose(got, expected, rtol=1e-4)


# ----------------------------------------------------------------------------------------------
# The three modules agree on the API and refuse bad input with the same sentence
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["linear_softmax_cross_entropy", "linear_softmax_focal_loss"])
def test_three_modules_share_names_and_keywords(name):
    signatures = [inspect.signature(getattr(m, name)).parameters for m in (spec, T, J)]
    for parameters in signatures:
        assert [p.name for p in parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD] == [
            "hidden",
            "linear_weight",
            "targets",
        ]
    keywords = [
        {p.name: p.default for p in parameters.values() if p.kind is p.KEYWORD_ONLY}
        for parameters in signatures
    ]
    assert keywords[0] == keywords[1] == keywords[2]


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (dict(bias=np.zeros(3)), ValueError,
         "`bias` must be a vector of length 7 (one entry per class). Received: bias.shape=(3,)."),
        (dict(targets=np.array([0, 1, 9, 2])), ValueError,
         "`targets` has class index 9 at position (2,), outside [0, 7) and not ignore_index=-100."),
        (dict(targets=np.zeros(4, dtype=np.float32)), TypeError,
         "`targets` must hold integer class indices. Received: targets.dtype=float32."),
        (dict(chunk_size=-1), ValueError, "`chunk_size` must be >= 1. Received: chunk_size=-1."),
        (dict(reduction="avg"), ValueError,
         "`reduction` must be one of 'none', 'mean', 'sum'. Received: reduction='avg'."),
        (dict(gamma=-1.0), ValueError,
         "`gamma` must be a finite number >= 0. Received: gamma=-1.0."),
    ],
)  # fmt: skip
@pytest.mark.parametrize("module", ["spec", "torch", "jax"])
def test_bad_input_gives_the_same_sentence_in_all_three(module, change, error, message):
    hidden = np.zeros((4, 3), np.float32)
    kernel = np.zeros((3, 7), np.float32)
    args = dict(targets=np.array([0, 1, 2, 3]), bias=None)
    kwargs = {}
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    convert = {"spec": np.asarray, "torch": torch.tensor, "jax": jnp.asarray}[module]
    if module == "torch":
        kernel = kernel.T.copy()
    impl = {"spec": spec, "torch": T, "jax": J}[module]
    bias = None if args["bias"] is None else convert(args["bias"])
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        impl.linear_softmax_focal_loss(
            convert(hidden), convert(kernel), convert(args["targets"]), bias=bias, **kwargs
        )


# ----------------------------------------------------------------------------------------------
# JAX transformations
# ----------------------------------------------------------------------------------------------


def test_jax_jit_vmap_and_grad_agree_with_eager_calls():
    hidden, kernel, bias, targets = _region("ignored", n=12, v=20)
    h, k, b = (jnp.asarray(x, jnp.float32) for x in (hidden, kernel, bias))
    y = jnp.asarray(targets, jnp.int32)

    def f(h, k, b, y):
        return J.linear_softmax_focal_loss(h, k, y, bias=b, chunk_size=5)

    eager = f(h, k, b, y)
    np.testing.assert_allclose(jax.jit(f)(h, k, b, y), eager, rtol=1e-6)
    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(h, k, b, y)
    eager_grads = jax.grad(f, argnums=(0, 1, 2))(h, k, b, y)
    for g, e in zip(grads, eager_grads, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
    # vmap over a batch of 3 problems: each equals its own call
    hs = jnp.stack([h, 2 * h, -h])
    batched = jax.vmap(f, in_axes=(0, None, None, None))(hs, k, b, y)
    for i in range(3):
        np.testing.assert_allclose(batched[i], f(hs[i], k, b, y), rtol=1e-6)


def test_jax_out_of_range_index_under_jit_gives_nan_not_a_number():
    hidden, kernel, bias, targets = _region("typical", n=6, v=9)
    targets[2] = 11
    f = jax.jit(lambda y: J.linear_softmax_cross_entropy(hidden, kernel, y, reduction="none"))
    loss = np.asarray(f(jnp.asarray(targets)))
    assert np.isnan(loss[2]) and np.all(np.isfinite(np.delete(loss, 2)))


def test_jax_class_weight_gradient_is_nan_never_a_silent_zero():
    hidden, kernel, bias, targets = _region("typical", n=6, v=9)
    g = jax.grad(lambda w: J.linear_softmax_cross_entropy(hidden, kernel, targets, weight=w))(
        jnp.ones(9)
    )
    assert np.all(np.isnan(g))
