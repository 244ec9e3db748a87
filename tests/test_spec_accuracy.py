"""Every value and gradient entry of the spec within 4 float64 ULPs of the exact result.

The exact result is the mpmath oracle (tests/mp_oracle.py, textbook definitions, 50 digits).
A spec result passes when

    |spec - exact| <= 4 ulp(exact) + allowance,

where the allowance is what rounding the inputs by one ULP already moves the exact result:
sum_i |f(x + ulp(x_i) e_i) - f(x)| over the finite logits, the soft targets and the real options
given (gamma, alpha, weight, pos_weight, label_smoothing), evaluated with mpmath (see
``mp_oracle``). Nothing else is allowed for: no relative tolerance, no
absolute floor.

The grid is adversarial: logit margins from 0 to 700 (a target probability within 1e-300 of 1,
or as small as exp(-700)), gamma in {0, 0.5, 2, 3.3}, hard and soft targets, label smoothing,
masked classes, and sigmoid logits to +-700 with targets 0, 1 and 0.3.

Run ``python tests/test_spec_accuracy.py`` for the table of the worst ULP errors per loss.
"""

from __future__ import annotations

import math

import mp_oracle
import numpy as np
import pytest

from dualloss import spec

ULPS = 4
MARGINS = [0.0, 1e-8, 1.0, 20.0, 37.0, 100.0, 300.0, 700.0]
GAMMAS = [0.0, 0.5, 2.0, 3.3]
SIGMOID_LOGITS = [0.0, 1e-8, 1.0, 20.0, 37.0, 100.0, 300.0, 700.0]
SIGMOID_LOGITS = sorted({s * x for x in SIGMOID_LOGITS for s in (-1.0, 1.0)})
SIGMOID_TARGETS = [0.0, 1.0, 0.3]

# loss -> [worst ULPs beyond the allowance, worst raw ULPs, where]
WORST: dict[str, list] = {}


def _rows(margin, label_smoothing=0.0):
    """(name, logits, where, soft targets) of the rows for one margin; index targets added below.

    Class 0 is the largest logit (its probability is within exp(-margin) of 1); every other class
    is at least `margin` below, down to exp(-margin). The last rows shift everything by +300
    (large logits, large ULPs) and mask classes (a -inf logit, a `where`).
    With label smoothing, the -inf class is also outside `where` (else the loss is +inf, as in
    torch; test_spec_properties checks that case).
    """
    m = margin
    # label smoothing puts mass on a -inf logit unless `where` masks it too: +inf, as torch
    masked = [True, True, label_smoothing == 0.0, False]
    return [
        ("C=2", [0.0, -m], None, [[0.7, 0.3], [0.0, 1.0]]),
        ("C=3", [0.0, -m, -m / 2], None, [[0.5, 0.25, 0.25], [0.0, 0.9, 0.1]]),
        ("C=4+300", [300.0, 300.0 - m, 300.0 - m, 300.0 - m / 3], None, [[0.1, 0.2, 0.3, 0.4]]),
        ("C=4 masked", [0.0, -m, -math.inf, -m / 3], masked, [[0.6, 0.4, 0, 0]]),
    ]


def _targets(logits, where, soft):
    """Index targets on the largest and on the smallest valid class, then the soft targets."""
    where = [True] * len(logits) if where is None else where
    valid = [c for c, (v, ok) in enumerate(zip(logits, where)) if ok and math.isfinite(v)]
    return [0, valid[-1]] + soft


def _record(loss, beyond, raw, where):
    worst = WORST.setdefault(loss, [0.0, 0.0, ""])
    if beyond > worst[0] or (beyond == worst[0] and raw > worst[1] and worst[0] == 0.0):
        worst[2] = where
    worst[0] = max(worst[0], beyond)
    worst[1] = max(worst[1], raw)


def _compare(loss, call, value, grad, exact):
    """Failure messages for the value and every gradient entry; records the worst ULPs."""
    failures = []
    checks = [("value", float(value), exact.value, exact.value_allowance)]
    checks += [
        (f"grad[{c}]", float(g), e, a)
        for c, (g, e, a) in enumerate(zip(np.ravel(grad), exact.grad, exact.grad_allowance))
    ]
    for what, got, want, allowance in checks:
        beyond, raw = mp_oracle.ulp_error(got, want, allowance)
        _record(loss, beyond, raw, f"{call} {what}")
        if beyond > ULPS:
            failures.append(
                f"{call} {what} {got!r} vs mpmath {mp_oracle.mpmath.nstr(want, 20)}: "
                f"{beyond:.3g} ULP beyond the allowance ({raw:.3g} ULP raw)"
            )
    return failures


def _softmax_call(fn, logits, target, where, **kwargs):
    z = np.array(logits)
    t = np.array(target, dtype=np.int64 if isinstance(target, int) else np.float64)
    mask = None if where is None else np.array(where)
    value = getattr(spec, fn)(z, t, where=mask, reduction="none", **kwargs)
    grad = getattr(spec, fn + "_grad")(z, t, where=mask, reduction="none", **kwargs)
    return value, grad


@pytest.mark.exhaustive
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("margin", MARGINS)
def test_softmax_cross_entropy_within_4_ulp_of_mpmath(margin, weighted, label_smoothing):
    failures = []
    for name, logits, where, soft in _rows(margin, label_smoothing):
        weight = [0.3, 2.0, 1.0, 0.7][: len(logits)] if weighted else None
        for target in _targets(logits, where, soft):
            kwargs = dict(weight=weight, label_smoothing=label_smoothing)
            call = f"spec.softmax_cross_entropy({name}, margin={margin}, target={target}, {kwargs})"
            value, grad = _softmax_call("softmax_cross_entropy", logits, target, where, **kwargs)
            exact = mp_oracle.softmax_cross_entropy(logits, target, where=where, **kwargs)
            failures += _compare("softmax_cross_entropy", call, value, grad, exact)
    assert not failures, "\n".join(failures)


@pytest.mark.exhaustive
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("margin", MARGINS)
def test_softmax_focal_loss_within_4_ulp_of_mpmath(margin, gamma, label_smoothing):
    failures = []
    # alternate the balancing so that every gamma meets None, a scalar and a vector somewhere
    alphas = [None, 0.25, [0.25, 0.5, 0.75, 1.0]]
    for row, (name, logits, where, soft) in enumerate(_rows(margin, label_smoothing)):
        alpha = alphas[(row + GAMMAS.index(gamma)) % 3]
        if isinstance(alpha, list):
            alpha = alpha[: len(logits)]
        for target in _targets(logits, where, soft):
            kwargs = dict(gamma=gamma, alpha=alpha, label_smoothing=label_smoothing)
            call = f"spec.softmax_focal_loss({name}, margin={margin}, target={target}, {kwargs})"
            value, grad = _softmax_call("softmax_focal_loss", logits, target, where, **kwargs)
            exact = mp_oracle.softmax_focal(logits, target, where=where, **kwargs)
            failures += _compare("softmax_focal_loss", call, value, grad, exact)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("gamma", [0.5, 2.0, 3.3])
@pytest.mark.parametrize("num_classes", [100, 1000, 5000])
def test_softmax_focal_loss_of_a_flat_row_within_4_ulp_of_mpmath(num_classes, gamma):
    # every class at 1 / C, the top (class 0, first on ties) and another as the target:
    # log(1 - p_top) formed as log s - log1p(s) = log(C - 1) - log(C) ~ -1/C cancels (10 ULP in
    # the loss at C = 1000, gamma = 2, measured); the row's exact loss and gradient in closed form
    mpf = mp_oracle.mpf
    p = 1 / mpf(num_classes)
    weight = (1 - p) ** gamma
    exact_value = -weight * mp_oracle.mpmath.log(p)
    # dl/dp_y, then dp_y/dz_j = p_y (delta_jy - p_j)
    dl_dp = gamma * (1 - p) ** (gamma - 1) * mp_oracle.mpmath.log(p) - weight / p
    for target in (0, 1):
        exact_grad = [dl_dp * p * ((c == target) - p) for c in range(num_classes)]
        call = f"spec.softmax_focal_loss(C={num_classes} flat, target={target}, gamma={gamma})"
        value, grad = _softmax_call("softmax_focal_loss", [0.0] * num_classes, target, None,
                                    gamma=gamma)  # fmt: skip
        exact = mp_oracle.Exact(exact_value, exact_grad, mpf(0), [mpf(0)] * num_classes)
        failures = _compare("softmax_focal_loss", call, value, grad, exact)
        assert not failures, "\n".join(failures[:4])


@pytest.mark.parametrize("pos_weight", [None, 3.0])
@pytest.mark.parametrize("weight", [None, 0.5])
@pytest.mark.parametrize("target", SIGMOID_TARGETS)
def test_sigmoid_cross_entropy_within_4_ulp_of_mpmath(target, weight, pos_weight):
    x = np.array(SIGMOID_LOGITS)
    t = np.full_like(x, target)
    kwargs = dict(weight=weight, pos_weight=pos_weight, reduction="none")
    values = spec.sigmoid_cross_entropy(x, t, **kwargs)
    grads = spec.sigmoid_cross_entropy_grad(x, t, **kwargs)
    failures = []
    for logit, value, grad in zip(SIGMOID_LOGITS, values, grads):
        call = f"spec.sigmoid_cross_entropy(x={logit}, t={target}, w={weight}, q={pos_weight})"
        exact = mp_oracle.sigmoid_cross_entropy(logit, target, weight=weight, pos_weight=pos_weight)
        failures += _compare("sigmoid_cross_entropy", call, value, [grad], exact)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("alpha", [None, 0.25])
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("target", SIGMOID_TARGETS)
def test_sigmoid_focal_loss_within_4_ulp_of_mpmath(target, gamma, alpha):
    x = np.array(SIGMOID_LOGITS)
    t = np.full_like(x, target)
    kwargs = dict(gamma=gamma, alpha=alpha, reduction="none")
    values = spec.sigmoid_focal_loss(x, t, **kwargs)
    grads = spec.sigmoid_focal_loss_grad(x, t, **kwargs)
    failures = []
    for logit, value, grad in zip(SIGMOID_LOGITS, values, grads):
        call = f"spec.sigmoid_focal_loss(x={logit}, t={target}, gamma={gamma}, alpha={alpha})"
        exact = mp_oracle.sigmoid_focal(logit, target, gamma=gamma, alpha=alpha)
        failures += _compare("sigmoid_focal_loss", call, value, [grad], exact)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "loss, kwargs",
    [
        ("softmax_focal", dict(logits=[0.0, -700.0, -350.0], target=[0.5, 0.25, 0.25], gamma=0.5)),
        ("softmax_focal", dict(logits=[0.0, -37.0, -1e-8], target=1, gamma=3.3)),
        ("sigmoid_focal", dict(logit=-700.0, target=0.3, gamma=0.5)),
    ],
)
def test_oracle_is_stable_under_more_precision(loss, kwargs):
    """The oracle's 50 digits are real: 30 more working digits change nothing in the first 40."""
    fn = getattr(mp_oracle, loss)
    base = fn(**kwargs)
    old = mp_oracle._GUARD
    mp_oracle._GUARD = old + 30
    try:
        more = fn(**kwargs)
    finally:
        mp_oracle._GUARD = old
    for got, want in zip([base.value, *base.grad], [more.value, *more.grad]):
        tolerance = mp_oracle.mpf(10) ** -40 * abs(want)
        assert abs(got - want) <= tolerance, (
            f"mp_oracle.{loss}({kwargs}) {got} changes to {want} with 30 more digits"
        )


def worst_table() -> str:
    lines = [f"{'loss':<24}{'ULP beyond allowance':>22}{'raw ULP':>14}  worst case"]
    for loss, (beyond, raw, where) in sorted(WORST.items()):
        lines.append(f"{loss:<24}{beyond:>22.3g}{raw:>14.3g}  {where}")
    return "\n".join(lines)


def test_worst_ulp_summary(capsys):
    """Prints the worst measured errors (run last in this file; -s not needed)."""
    if not WORST:
        pytest.skip("no accuracy test ran before this one")
    with capsys.disabled():
        print("\n" + worst_table())
    assert all(beyond <= ULPS for beyond, _, _ in WORST.values())


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
