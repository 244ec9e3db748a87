"""The verdicts of ``tolerance.judge`` sit where ``tolerance.py``'s docstring derives them
(issue 31, item 12): an error planted just inside the documented tolerance passes, one just
beyond it fails, for the value and the gradient, in each standard and dtype.

The tolerances are recomputed here from the docstring's formulas for sigmoid cross entropy with
hard targets and reduction 'none' (the one configuration where every term is a closed form),
with this file's own ULP function and the spec's value and gradient (the reference, whose spread
the strict standard measures), never with ``tolerance.py``'s helpers: scaling both tolerances of
``judge`` by 100 (or by 1/100) fails these tests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dualloss import spec
from dualloss.parity import judge

LOSS = "sigmoid_cross_entropy"
DTYPES = ("float32", "float64", "float16", "bfloat16")
# exact in every dtype, away from 0 (where an ULP is defined by convention only)
LOGITS = (-3.5, -0.75, 1.25, 6.0)
TARGETS = (1.0, 0.0, 1.0, 0.0)
PRECISION = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}
SMALLEST_NORMAL = {"float64": 2.0**-1022, "float32": 2.0**-126, "float16": 2.0**-14,
                   "bfloat16": 2.0**-126}  # fmt: skip
K = 8.0  # practical: a handful of correctly rounded operations, times ~2 for library functions
STRICT_ULPS = 8.0  # strict: the backend's 4 ULP plus the float64 reference's 4
STRICT_FORGIVEN = 2.0  # strict: differences below twice the smallest normal


def _ulp(x: float, dtype: str) -> float:
    """The spacing of `dtype`'s numbers at |x| (x normal in `dtype`)."""
    _, exponent = math.frexp(abs(x))  # |x| = m 2**exponent, 0.5 <= m < 1
    return math.ldexp(1.0, exponent - PRECISION[dtype])


def _loss(x: float, t: float) -> float:
    return float(spec.sigmoid_cross_entropy(np.array([x]), np.array([t]), reduction="none")[0])


def _grad(x: float, t: float) -> float:
    return float(spec.sigmoid_cross_entropy_grad(np.array([x]), np.array([t]), reduction="none")[0])


def _practical(x: float, t: float, dtype: str) -> tuple[float, float]:
    """tolerance.py, "Practical", sigmoid cross entropy, one element, reduction 'none':
    value K u (|l| + (1 + |x|)) + K u |dl/dx| |x| + K u max|l| + K TINY, gradient K u (|g| +
    2 (1 + |x|)) + K u max|g| + K TINY (weights 1, targets hard)."""
    u = 2.0 ** -PRECISION[dtype]
    tiny = SMALLEST_NORMAL[dtype]
    loss, grad = _loss(x, t), _grad(x, t)
    value = K * u * (abs(loss) + 1.0 + abs(x)) + K * u * abs(grad) * abs(x) + K * u * abs(loss)
    gradient = K * u * (abs(grad) + 2.0 * (1.0 + abs(x))) + K * u * abs(grad)
    return value + K * tiny, gradient + K * tiny


def _strict(x: float, t: float, dtype: str) -> tuple[float, float]:
    """tolerance.py, "Strict": STRICT_ULPS ulp(r) + the spread of r when x moves one ULP either
    way (hard targets are not moved) + STRICT_FORGIVEN TINY, all in the working precision
    (float32 for the half dtypes), plus one rounding to a half dtype. The spread is "evaluated by
    the spec itself" (in float64 a difference at the level of the spec's own rounding)."""
    work = "float32" if dtype in ("float16", "bfloat16") else dtype
    dx = _ulp(x, work)
    tolerances = []
    for f in (_loss, _grad):
        r = f(x, t)
        spread = max(abs(f(x + dx, t) - r), abs(f(x - dx, t) - r))
        tolerance = STRICT_ULPS * _ulp(r, work) + spread + STRICT_FORGIVEN * SMALLEST_NORMAL[work]
        if work != dtype:
            tolerance += _ulp(r, dtype)  # |r| is above the half dtype's smallest normal here
        tolerances.append(tolerance)
    return tolerances[0], tolerances[1]


TOLERANCES = {"practical": _practical, "strict": _strict}
INSIDE, BEYOND = 0.95, 1.05


def _judge(standard, dtype, x, t, value_error, grad_error, inside):
    """judge() on the spec's value and gradient plus the planted errors: the sums rounded
    towards the reference when the errors are meant to be inside the tolerance, away from it
    beyond (in float64 an error is a whole number of ULPs, and the tolerance only a few)."""

    def plant(reference, error):
        received = reference + error
        towards = reference if inside else math.copysign(math.inf, error)
        while (abs(received - reference) > abs(error)) if inside else (
                abs(received - reference) < abs(error)):  # fmt: skip
            received = math.nextafter(received, towards)
        return received

    value = np.array([[plant(_loss(x, t), value_error)]])
    grad = np.array([[plant(_grad(x, t), grad_error)]])
    return judge(LOSS, np.array([[x]]), np.array([[t]]), {"reduction": "none"}, dtype, value, grad,
                 standard=standard)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("standard", ["practical", "strict"])
def test_an_error_just_inside_the_documented_tolerance_passes(standard, dtype):
    for x, t in zip(LOGITS, TARGETS, strict=True):
        value_tol, grad_tol = TOLERANCES[standard](x, t, dtype)
        for sign in (1.0, -1.0):
            judgement = _judge(standard, dtype, x, t, sign * INSIDE * value_tol,
                               sign * INSIDE * grad_tol, inside=True)  # fmt: skip
            assert judgement.ok, (x, t, judgement.inaccurate)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("standard", ["practical", "strict"])
@pytest.mark.parametrize("what", ["value", "gradient"])
def test_an_error_just_beyond_the_documented_tolerance_fails(standard, dtype, what):
    for x, t in zip(LOGITS, TARGETS, strict=True):
        value_tol, grad_tol = TOLERANCES[standard](x, t, dtype)
        for sign in (1.0, -1.0):
            errors = (sign * BEYOND * value_tol, 0.0) if what == "value" else (
                0.0, sign * BEYOND * grad_tol)  # fmt: skip
            judgement = _judge(standard, dtype, x, t, *errors, inside=False)
            assert judgement.kind == "accuracy", (x, t, sign)
            assert len(judgement.inaccurate) == 1 and judgement.inaccurate[0].startswith(what)
