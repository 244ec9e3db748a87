"""The strict standard (``dualloss.parity.tolerance``, "strict"): what it lets through and what not,
and both backends meeting it where the issue "Strict accuracy for our own backends" measured them
failing (a confident row's tiny loss and gradient returned as 0).

References are independent of the code under test: the float64 spec (itself within 3.25 ULP of
a 50-digit mpmath oracle, ``test_spec_accuracy.py``) and, for the spread, the spec moved by one
ULP of each input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dualloss import jax_impl, losses, spec, torch_impl
from dualloss.parity import backends as B
from dualloss.parity import cases
from dualloss.parity import tolerance as tolerance_module
from dualloss.parity.tolerance import judge, ulp

DTYPES = ("float64", "float32", "float16", "bfloat16")
EXACT = {"float64": np.float64, "float32": np.float32}


def _run(backend: str, name: str, logits: np.ndarray, targets: np.ndarray, dtype: str, **opts):
    """Value and logits gradient of one backend (class axis last), as float64 NumPy."""
    if backend == "torch":
        # softmax: class dim 1 in torch (index targets keep their shape); sigmoid: as it is
        softmax = losses.get(name).is_softmax
        index = np.issubdtype(targets.dtype, np.integer)
        x = B.torch_array(B.to_torch_layout(logits) if softmax else logits, dtype, "cpu")
        x.requires_grad_(True)
        t = B.torch_array(targets if index or not softmax else B.to_torch_layout(targets), dtype,
                          "cpu")  # fmt: skip
        value = getattr(torch_impl, name)(x, t, **opts)
        value.sum().backward()
        grad = x.grad.double().numpy()
        return value.detach().double().numpy(), np.moveaxis(grad, 1, -1) if softmax else grad
    with jax.enable_x64(dtype == "float64"):
        x = B.jax_array(logits, dtype, jax.devices("cpu")[0])
        t = B.jax_array(targets, dtype, jax.devices("cpu")[0])
        assert x.dtype == B.numpy_dtype(dtype)
        fn = getattr(jax_impl, name)

        def total(x):
            return jnp.sum(fn(x, t, **opts))

        value = fn(x, t, **opts)
        grad = jax.grad(total)(x)
        return np.asarray(value, np.float64), np.asarray(grad, np.float64)


# ----------------------------------------------------------------------------------------------
# 1. The measurements, now within the strict standard in both backends
# ----------------------------------------------------------------------------------------------

CONFIDENT = [
    # (loss, logits, targets, dtype): the rows the issue measured off by 8.4e6 / 4.5e15 ULP
    ("softmax_cross_entropy", [[20.0, 0.0]], [0], "float32"),
    ("softmax_cross_entropy", [[40.0, 0.0]], [0], "float64"),
    ("softmax_cross_entropy", [[30.0, 5.0, -3.0, 10.0]], [0], "float32"),
    ("sigmoid_cross_entropy", [[17.0]], [[1.0]], "float32"),
    ("sigmoid_cross_entropy", [[40.0]], [[1.0]], "float64"),
    ("sigmoid_cross_entropy", [[-17.0]], [[0.0]], "float32"),
    ("sigmoid_focal_loss", [[17.0]], [[1.0]], "float32"),
    ("sigmoid_focal_loss", [[40.0]], [[1.0]], "float64"),
    ("softmax_focal_loss", [[20.0, 0.0]], [0], "float32"),
]


@pytest.mark.parametrize("backend", B.BACKENDS)
@pytest.mark.parametrize(("name", "logits", "targets", "dtype"), CONFIDENT)
def test_confident_rows_keep_their_tiny_loss_and_gradient(backend, name, logits, targets, dtype):
    logits = np.asarray(logits, EXACT[dtype])
    targets = np.asarray(targets, np.int64 if isinstance(targets[0], int) else EXACT[dtype])
    value, grad = _run(backend, name, logits, targets, dtype, reduction="sum")
    truth = float(getattr(spec, name)(logits, targets, reduction="sum"))
    assert 0.0 < truth < 1e-7
    assert value > 0.0, f"{backend} {name} {dtype}: the loss {truth:.3g} came back as {value}"
    judgement = judge(name, logits, targets, {"reduction": "sum"}, dtype, value, grad)
    assert judgement.ok, judgement.nonfinite + judgement.inaccurate


def _margin_rows(name: str, dtype: str):
    """One row per margin from 10 to the dtype's range, correct and wrong, softmax or sigmoid."""
    rows, targets = [], []
    for m in [10.0, *cases.margins(dtype, "full")]:
        for correct in (True, False):
            if losses.get(name).is_softmax:
                rows.append([0.0, -m, -m - 1.0] if correct else [-m, 0.0, -1.0])
                targets.append(0)
            else:
                rows.append([m if correct else -m, -m if correct else m])
                targets.append([1.0, 0.0])
    return np.asarray(rows), np.asarray(targets)


# every backend, loss and dtype, not every pair (--full: all): CI's parity command (README)
# judges both backends at the margins of regions confident_correct and confident_wrong, up to half
# the dtype's largest number, for every loss in every dtype under the strict standard
@pytest.mark.exhaustive(strength=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", losses.NAMES)
@pytest.mark.parametrize("backend", B.BACKENDS)
def test_every_margin_to_the_dtypes_range_meets_the_strict_standard(backend, name, dtype):
    logits, targets = _margin_rows(name, dtype)
    logits = B.round_to(logits, dtype)
    if not losses.get(name).is_softmax:
        targets = B.round_to(targets, dtype)
    options = {"reduction": "none"}
    value, grad = _run(backend, name, logits, targets, dtype, **options)
    ref_logits = logits.astype(np.float64)
    ref_targets = targets if targets.dtype == np.int64 else targets.astype(np.float64)
    judgement = judge(name, ref_logits, ref_targets, options, dtype, value, grad)
    assert judgement.ok, judgement.nonfinite + judgement.inaccurate


def _mixed_confidence_rows(n_classes: int, dtype: str):
    """Rows at every margin whose target is the top class (the loss is ~exp(-margin)), beside rows
    whose target is not the top and rows whose top is shared: one batch, so that an
    implementation taking an accurate sum for some rows only must take it for the right ones."""
    rows, targets = [], []
    rng = np.random.default_rng(n_classes)
    for m in [2.0, 10.0, 17.0, 30.0, *cases.margins(dtype, "full")]:
        row = -m - rng.random(n_classes) * 3.0
        top = int(rng.integers(n_classes))
        row[top] = 0.0
        rows.append(row)
        targets.append(top)  # confident and right: the tiny loss must survive
        rows.append(row)
        targets.append((top + 1) % n_classes)  # confident and wrong
    rows.append(np.zeros(n_classes))  # a tie between every class
    targets.append(0)
    return B.round_to(np.asarray(rows), dtype), np.asarray(targets)


# every backend at every class count, every pair of the other values (--full: all)
@pytest.mark.exhaustive(cover=("backend", "n_classes"))
@pytest.mark.parametrize("n_classes", [3, 32, 33, 1000])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    ("name", "gamma", "one_hot"),
    [
        ("softmax_cross_entropy", 0.0, False),
        ("softmax_cross_entropy", 0.0, True),
        ("softmax_focal_loss", 3.3, False),
        ("softmax_focal_loss", 3.3, True),
    ],
)
@pytest.mark.parametrize("backend", B.BACKENDS)
def test_confident_rows_among_others_meet_the_strict_standard_at_any_class_count(
    backend, name, gamma, one_hot, dtype, n_classes
):
    # the JAX fast path sums the other classes apart in one complex sum up to 32 classes and in
    # a second float sum from 33 on, and again rescaled where all of them are flushed subnormals
    # (only when some row needs it); torch's on the dominant rows only. The flat row at 1000
    # classes: log(1 - p_top) must not be log s - log1p(s) (they cancel)
    logits, targets = _mixed_confidence_rows(n_classes, dtype)
    if one_hot:
        # probability targets take the general path of each backend
        targets = np.eye(n_classes)[targets]
    options = {"reduction": "none"} | ({"gamma": gamma} if name == "softmax_focal_loss" else {})
    value, grad = _run(backend, name, logits, targets, dtype, **options)
    judgement = judge(name, logits.astype(np.float64), targets, options, dtype, value, grad)
    assert judgement.ok, judgement.nonfinite + judgement.inaccurate


def _span_rows(dtype: str, index: bool):
    """Rows whose logits span 1.8 times the dtype's largest number (0.9 max and -0.9 max), the
    target mass on the far negative classes (z - z_top overflows, the loss does not), beside an
    ordinary row; index targets at -0.9 max carry a class weight (alpha) of 0.25."""
    big = 0.9 * cases.DTYPE_MAX[dtype]
    logits = B.round_to(np.array([[big, -big, 0.0], [0.0, big, -big], [1.0, 2.0, 0.5]]), dtype)
    if index:
        return logits, np.array([1, 2, 0]), np.array([1.0, 0.25, 0.25])
    return logits, np.array([[0.5, 0.25, 0.25], [0.5, 0.375, 0.125], [0.5, 0.5, 0.0]]), None


def _with_backend_arrays(backend: str, options: dict, dtype: str) -> dict:
    """`options` with NumPy class vectors as the backend's arrays of `dtype`."""
    device = "cpu" if backend == "torch" else jax.devices("cpu")[0]
    to_array = B.torch_array if backend == "torch" else B.jax_array
    return {
        k: to_array(v, dtype, device) if isinstance(v, np.ndarray) else v
        for k, v in options.items()
    }


@pytest.mark.parametrize("index", (False, True), ids=("probabilities", "weighted index"))
@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "float16"))
@pytest.mark.parametrize("name", ("softmax_cross_entropy", "softmax_focal_loss"))
@pytest.mark.parametrize("backend", B.BACKENDS)
def test_logits_spanning_beyond_the_largest_number_give_a_finite_loss(backend, name, dtype, index):
    # z - z_top overflows to -inf in float32 (bfloat16 is computed in float32; float16 too, where
    # it does not overflow), though -a log p = a z_top - a z + a log1p(s) is below the largest
    # number: every backend returned inf
    logits, targets, vector = _span_rows(dtype, index)
    focal = name == "softmax_focal_loss"
    options = {"reduction": "none"} | ({"gamma": 2.0} if focal else {})
    if vector is not None:
        options["alpha" if focal else "weight"] = vector
    value, grad = _run(backend, name, logits, targets, dtype,
                       **_with_backend_arrays(backend, options, dtype))  # fmt: skip
    truth = getattr(spec, name)(logits.astype(np.float64), targets, **options)
    assert np.all(np.isfinite(truth[:2])) and np.all(truth[:2] > 0.4 * cases.DTYPE_MAX[dtype])
    assert np.all(np.isfinite(value)), f"loss={value}, but spec gives {truth} [{backend} {name}]"
    judgement = judge(name, logits.astype(np.float64), targets, options, dtype, value, grad)
    assert judgement.ok, judgement.nonfinite + judgement.inaccurate


@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
@pytest.mark.parametrize("name", ("softmax_cross_entropy", "softmax_focal_loss"))
@pytest.mark.parametrize("backend", B.BACKENDS)
def test_logits_spanning_beyond_the_largest_number_keep_inf_and_nan_where_they_belong(
    backend, name, dtype
):
    # a loss truly beyond the largest number (weight 3: 4.9 times it) stays inf; a -inf logit
    # with target mass gives inf, without it 0 (0 log 0 = 0) beside its other terms; a NaN
    # logit gives NaN
    big = 0.9 * cases.DTYPE_MAX[dtype]
    if name == "softmax_cross_entropy":
        weighted = {"weight": np.array([1.0, 3.0, 1.0])}
        value, _ = _run(backend, name, B.round_to(np.array([[big, -big, 0.0]]), dtype),
                        np.array([1]), dtype, reduction="none",
                        **_with_backend_arrays(backend, weighted, dtype))  # fmt: skip
        assert value[0] == np.inf
    logits = B.round_to(np.array([[big, -np.inf, 0.0], [big, -np.inf, 0.0], [big, -big, np.nan]]),
                        dtype)  # fmt: skip
    targets = np.array([[0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.0, 1.0, 0.0]])
    options = {"reduction": "none"} | ({"gamma": 2.0} if name == "softmax_focal_loss" else {})
    value, _ = _run(backend, name, logits, targets, dtype, **options)
    assert value[0] == np.inf and np.isnan(value[2])
    assert value[1] == float(B.round_to(np.array(0.5 * float(logits[1, 0])), dtype))


_SPAN_VECTOR = np.array([1.0, 0.25, 0.5, 0.5, 0.5])


@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
@pytest.mark.parametrize(
    "name, options",
    [
        ("linear_softmax_cross_entropy", {"weight": _SPAN_VECTOR}),
        ("linear_softmax_focal_loss", {"gamma": 2.0, "alpha": _SPAN_VECTOR}),
        ("linear_softmax_cross_entropy", {"weight": _SPAN_VECTOR, "label_smoothing": 0.1}),
    ],
    ids=("ce-weight", "focal-alpha", "ce-weight-smoothing"),
)
@pytest.mark.parametrize("backend", B.BACKENDS)
def test_fused_linear_logits_spanning_beyond_the_largest_number_give_the_finite_loss(
    backend, name, options, dtype
):
    # the fused losses' blocks form z - z_top and sum_c w_c (z_c - z_top) themselves: a bias of
    # 0.9 max and -0.9 max made both overflow to -inf, and the loss inf, where the spec's (a
    # weight of 0.25 at the far target, smoothing's eps / V at the far class) is finite
    from dualloss.parity import linear as L

    big = 0.9 * cases.DTYPE_MAX[dtype]
    hidden = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, -0.5, 1.0]])
    kernel = np.zeros((3, 5))
    kernel[:, 3] = [0.3, -0.2, 0.1]
    bias = np.array([big, -big, 0.0, 1.0, -1.0])
    case = L.LinearCase(name, "wide_span", "3x3x5", hidden, kernel, bias, np.array([1, 1, 0]),
                        dict(options, chunk_size=2))  # fmt: skip
    prep = L.prepare(case, dtype)
    prep.options["reduction"] = "none"
    outcome = L.run(L.ours(backend, name, prep.options, "none"), backend, prep)
    assert outcome.error is None, outcome.error
    want = L.expected(name, prep)
    assert np.all(np.isfinite(want["value"])) and np.all(want["value"][:2] > 0.4 * big)
    judgement = L.judge(name, prep, outcome, "strict")
    assert judgement.kind == "ok", f"[{backend}.{name} {dtype}]: " + "; ".join(judgement.problems)


# ----------------------------------------------------------------------------------------------
# 2. What the standard lets through and what not
# ----------------------------------------------------------------------------------------------
# 2. What the standard lets through and what not
# ----------------------------------------------------------------------------------------------


def _typical(name: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((16, 7)) * 3.0
    if losses.get(name).is_softmax:
        return z, rng.integers(0, 7, 16)
    return z, (rng.random((16, 7)) < 0.5).astype(float)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", losses.NAMES)
def test_the_correctly_rounded_result_passes(name, dtype):
    # the spec's own result rounded once to the dtype: the best any implementation can return
    z, t = _typical(name)
    z = B.round_to(z, dtype).astype(np.float64)
    t = t if np.issubdtype(t.dtype, np.integer) else B.round_to(t, dtype).astype(np.float64)
    for reduction in ("none", "mean"):
        options = {"reduction": reduction}
        value = B.round_to(getattr(spec, name)(z, t, **options), dtype).astype(np.float64)
        grad = B.round_to(losses.get(name).grad(z, t, **options), dtype).astype(np.float64)
        judgement = judge(name, z, t, options, dtype, value, grad)
        assert judgement.ok, judgement.inaccurate


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_log_of_one_plus_s_fails_where_log1p_passes(dtype):
    # log(1 + s) for log1p(s): the mutation the old bound forgave below float64
    z = np.array([[25.0, 0.0, -1.0]]) if dtype == "float32" else np.array([[45.0, 0.0, -1.0]])
    t = np.array([0])
    s = np.sum(np.exp(z[0, 1:] - z[0, 0]))
    exact = EXACT[dtype]
    good = exact(np.log1p(exact(s)))
    bad = exact(np.log(exact(1.0) + exact(s)))
    assert bad == 0.0 and good > 0.0
    options = {"reduction": "sum"}
    assert judge("softmax_cross_entropy", z, t, options, dtype, good).ok
    assert not judge("softmax_cross_entropy", z, t, options, dtype, bad).ok
    # the practical standard (users' code) accepts 0 at this scale: it is below u x the row's size
    assert judge("softmax_cross_entropy", z, t, options, dtype, bad, standard="practical").ok


@pytest.mark.parametrize("name", losses.NAMES)
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_half_precision_allows_one_rounding_of_the_float32_result_not_two(dtype, name):
    # computed in float32 and rounded once: within one ULP of the half dtype; two ULPs off (what
    # a computation in the half dtype throughout easily loses, or a dropped term) fails
    z, t = _typical(name, seed=3)
    # a row that is not confident: every result well inside the half dtype's normal range
    z = B.round_to(0.3 * z, dtype).astype(np.float64)[:1]
    t = t[:1] if np.issubdtype(t.dtype, np.integer) else B.round_to(t, dtype)[:1].astype(float)
    options = {"reduction": "sum"}
    truth = float(getattr(spec, name)(z, t, **options))
    assert truth > 100 * tolerance_module.SMALLEST_NORMAL[dtype]
    once = float(B.round_to(np.float32(truth), dtype))
    assert judge(name, z, t, options, dtype, once).ok
    for off in (-2.0, 2.0):
        assert not judge(name, z, t, options, dtype, once + off * float(ulp(truth, dtype))).ok


# ----------------------------------------------------------------------------------------------
# 3. The spread is a bound on what moving the inputs by one ULP does
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", (0.0, 0.5, 2.0))
@pytest.mark.parametrize("scale", (4.0, 40.0))
def test_softmax_spread_bounds_one_ulp_moves_of_the_logits(scale, gamma):
    from dualloss.parity.tolerance import _softmax_spreads

    name = "softmax_focal_loss"
    info = losses.get(name)
    rng = np.random.default_rng(1)
    dtype = "float32"
    z = B.round_to(rng.standard_normal((32, 6)) * scale, dtype).astype(np.float64)
    z[:4, 0] += 12.0  # confident rows: the top's p near 1
    t = rng.integers(0, 6, 32)
    options = {"gamma": gamma, "reduction": "none"}
    elements = info.intermediates(z, t, **options)
    value_spread, grad_spread = _softmax_spreads(info, elements, options, dtype)
    base_value = spec.softmax_focal_loss(z, t, **options)
    base_grad = spec.softmax_focal_loss_grad(z, t, **options)
    delta = ulp(z, dtype)
    for _ in range(64):
        moved = z + delta * rng.choice([-1.0, 1.0], size=z.shape)
        change = np.abs(spec.softmax_focal_loss(moved, t, **options) - base_value)
        grad_change = np.abs(spec.softmax_focal_loss_grad(moved, t, **options) - base_grad)
        # first order, so second-order terms (relative delta ~ u) may add a hair; and the two
        # float64 evaluations of the spec carry up to 2 ULP (of float64) each
        noise = 4.0 * ulp(base_value, "float64")
        assert np.all(change <= value_spread * (1 + 1e-3) + noise)
        noise = 4.0 * ulp(base_grad, "float64")
        assert np.all(grad_change <= grad_spread * (1 + 1e-3) + noise)
