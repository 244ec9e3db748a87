"""The spec's gradients w.r.t. targets and options within 4 float64 ULPs of mpmath.

The same standard as tests/test_spec_accuracy.py (the logit gradients): a spec entry passes when

    |spec - exact| <= 4 ulp(exact) + allowance,

the allowance being what rounding the inputs by one ULP already moves the exact derivative
(``mp_oracle``: every finite logit, soft target and real option given). The exact derivatives
are the oracle's closed forms (softmax; checked against ``mpmath.diff`` below) and
``mpmath.diff`` of the textbook losses (sigmoid), at 50 digits. An exact +inf (probability
mass moved onto a class of probability 0) must be +inf.

Per element (reduction 'none', one row): the adversarial grid of test_spec_accuracy (margins to
700, gamma in {0, 0.5, 2, 3.3}, hard and soft targets with zeros, label smoothing, masked
classes, sigmoid logits to +-700). Reductions: 'sum' and 'mean' of small batches (ignored rows,
torch's weighted mean with its quotient rule for `weight`), where the result is a sum over rows
and classes and so is judged at 4 ULPs of the sum of the magnitudes of its terms (the accuracy
of any float64 sum), plus the summed allowances.

Run ``python tests/test_spec_grad_accuracy.py`` for the table of the worst errors per (loss, wrt).
"""

from __future__ import annotations

import math

import mp_oracle
import numpy as np
import pytest
from test_spec_accuracy import GAMMAS, MARGINS, SIGMOID_LOGITS, _rows, _targets

from dualloss import losses, spec

ULPS = 4
SIGMOID_TARGETS = [0.0, 1.0, 0.3, 0.7]
ALPHAS = [0.25, [0.25, 0.5, 0.75, 1.0]]

# (loss, wrt) -> [worst ULPs beyond the allowance, worst raw ULPs, where]
WORST: dict[tuple[str, str], list] = {}


def _record(key, beyond, raw, where):
    worst = WORST.setdefault(key, [0.0, 0.0, ""])
    if beyond > worst[0] or (beyond == worst[0] and raw > worst[1] and worst[0] == 0.0):
        worst[2] = where
    worst[0] = max(worst[0], beyond)
    worst[1] = max(worst[1], raw)


def _compare(key, call, got, exact_values, allowances, scales=None):
    """Failure messages for every entry of `got` against the exact derivatives."""
    failures = []
    got = np.ravel(np.asarray(got, dtype=np.float64))
    assert got.size == len(exact_values), f"{call}: {got.size} entries, oracle {len(exact_values)}"
    for index, (g, want, allowance) in enumerate(zip(got, exact_values, allowances)):
        if scales is None:
            beyond, raw = mp_oracle.ulp_error(float(g), want, allowance)
        else:
            # a reduction: ULPs of the sum of the magnitudes of its terms
            beyond, raw = _sum_ulp_error(float(g), want, allowance, scales[index])
        _record(key, beyond, raw, f"{call} [{index}]")
        if beyond > ULPS:
            failures.append(
                f"{call} [{index}] {g!r} vs mpmath {mp_oracle.mpmath.nstr(want, 20)}: "
                f"{beyond:.3g} ULP beyond the allowance ({raw:.3g} ULP raw)"
            )
    return failures


def _sum_ulp_error(got, exact, allowance, scale):
    if mp_oracle.mpmath.isinf(exact) and got == exact:
        return 0.0, 0.0
    if math.isnan(got) or math.isinf(got):
        return math.inf, math.inf
    with mp_oracle.mpmath.workdps(mp_oracle.DIGITS):
        err = abs(mp_oracle.mpf(got) - exact)
        unit = math.ulp(float(scale))
        return float(max(err - allowance, 0) / unit), float(err / unit)


# ----------------------------------------------------------------------------------------------
# Softmax, per element
# ----------------------------------------------------------------------------------------------


def _softmax_grad(fn, logits, target, where, wrt, **kwargs):
    z = np.array(logits)
    t = np.array(target, dtype=np.int64 if isinstance(target, int) else np.float64)
    mask = None if where is None else np.array(where)
    return getattr(spec, fn + "_grad")(z, t, where=mask, reduction="none", wrt=wrt, **kwargs)


def _softmax_cases(margin, label_smoothing, wrt):
    """(name, logits, where, target) of the grid; probability targets only for 'targets'."""
    for name, logits, where, soft in _rows(margin, label_smoothing):
        for target in _targets(logits, where, soft):
            if wrt == "targets" and isinstance(target, int):
                continue
            yield name, logits, where, target


def _compare_softmax(oracle, loss, call, got, exact, kwargs, logits, target, wrt):
    """Per-row comparison. d/d label_smoothing = sum_c w_c (u_c - t_c) g_c is a sum of terms
    of both signs that cancel exactly for a one-hot target at equal logits (and nearly at
    near-ties): it is judged at 4 ULPs of sum_c |terms| (the 'reduced' standard); its strict
    ULPs are recorded under 'label_smoothing (strict)' for the table, not asserted."""
    if wrt != "label_smoothing":
        return _compare((loss, wrt), call, got, exact.wrt_grad, exact.wrt_allowance)
    terms = oracle(logits, target, wrt="label_smoothing_terms", **kwargs).wrt_grad
    scale = mp_oracle.mpmath.fsum(abs(term) for term in terms)
    for g, want, allowance in zip(np.ravel(got), exact.wrt_grad, exact.wrt_allowance):
        beyond, raw = mp_oracle.ulp_error(float(g), want, allowance)
        _record((loss, "label_smoothing (strict)"), beyond, raw, call)
    return _compare(
        (loss, "label_smoothing"), call, got, exact.wrt_grad, exact.wrt_allowance, [scale]
    )


@pytest.mark.exhaustive
@pytest.mark.parametrize("wrt", ["targets", "weight", "label_smoothing"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("margin", MARGINS)
def test_softmax_cross_entropy_input_grads_within_4_ulp_of_mpmath(margin, label_smoothing, wrt):
    failures = []
    for weighted in [False, True] if wrt != "weight" else [True]:
        for name, logits, where, target in _softmax_cases(margin, label_smoothing, wrt):
            weight = [0.3, 2.0, 1.0, 0.7][: len(logits)] if weighted else None
            kwargs = dict(weight=weight, label_smoothing=label_smoothing)
            call = (
                f"spec.softmax_cross_entropy_grad({name}, margin={margin}, target={target}, "
                f"{kwargs}, wrt={wrt!r})"
            )
            got = _softmax_grad("softmax_cross_entropy", logits, target, where, wrt, **kwargs)
            exact = mp_oracle.softmax_cross_entropy(logits, target, where=where, wrt=wrt, **kwargs)
            failures += _compare_softmax(
                mp_oracle.softmax_cross_entropy,
                "softmax_cross_entropy",
                call,
                got,
                exact,
                dict(kwargs, where=where),
                logits,
                target,
                wrt,
            )
    assert not failures, "\n".join(failures)


@pytest.mark.exhaustive
@pytest.mark.parametrize("wrt", ["targets", "gamma", "alpha", "label_smoothing"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("margin", MARGINS)
def test_softmax_focal_loss_input_grads_within_4_ulp_of_mpmath(margin, gamma, label_smoothing, wrt):
    failures = []
    for row, (name, logits, where, target) in enumerate(
        _softmax_cases(margin, label_smoothing, wrt)
    ):
        # alternate the balancing: every wrt meets a scalar and a vector alpha (and None)
        choices = ALPHAS if wrt == "alpha" else [None, *ALPHAS]
        alpha = choices[(row + GAMMAS.index(gamma)) % len(choices)]
        if isinstance(alpha, list):
            alpha = alpha[: len(logits)]
        kwargs = dict(gamma=gamma, alpha=alpha, label_smoothing=label_smoothing)
        call = (
            f"spec.softmax_focal_loss_grad({name}, margin={margin}, target={target}, {kwargs}, "
            f"wrt={wrt!r})"
        )
        got = _softmax_grad("softmax_focal_loss", logits, target, where, wrt, **kwargs)
        exact = mp_oracle.softmax_focal(logits, target, where=where, wrt=wrt, **kwargs)
        failures += _compare_softmax(
            mp_oracle.softmax_focal,
            "softmax_focal_loss",
            call,
            got,
            exact,
            dict(kwargs, where=where),
            logits,
            target,
            wrt,
        )
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------------------------
# Sigmoid, per element
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "weight, pos_weight, wrt",
    [
        (None, None, "targets"),
        (0.5, 3.0, "targets"),
        (None, 0.3, "targets"),
        (0.5, None, "weight"),
        (0.5, 3.0, "weight"),
        (None, 3.0, "pos_weight"),
        (0.5, 0.3, "pos_weight"),
    ],
)
@pytest.mark.parametrize("target", SIGMOID_TARGETS)
def test_sigmoid_cross_entropy_input_grads_within_4_ulp_of_mpmath(target, weight, pos_weight, wrt):
    failures = []
    for logit in SIGMOID_LOGITS:
        kwargs = dict(weight=weight, pos_weight=pos_weight)
        got = spec.sigmoid_cross_entropy_grad(
            np.array([logit]), np.array([target]), reduction="none", wrt=wrt, **kwargs
        )
        call = f"spec.sigmoid_cross_entropy_grad(x={logit}, t={target}, {kwargs}, wrt={wrt!r})"
        exact = mp_oracle.sigmoid_cross_entropy(logit, target, wrt=wrt, **kwargs)
        failures += _compare(
            ("sigmoid_cross_entropy", wrt), call, got, exact.wrt_grad, exact.wrt_allowance
        )
    assert not failures, "\n".join(failures)


@pytest.mark.exhaustive
# alpha=None has no gradient w.r.t. alpha (test_spec_grad_properties): no such parameter set
@pytest.mark.parametrize(
    ("alpha", "wrt"),
    [(None, "targets"), (None, "gamma"), (0.25, "targets"), (0.25, "gamma"), (0.25, "alpha")],
)
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("target", SIGMOID_TARGETS)
def test_sigmoid_focal_loss_input_grads_within_4_ulp_of_mpmath(target, gamma, alpha, wrt):
    failures = []
    for logit in SIGMOID_LOGITS:
        kwargs = dict(gamma=gamma, alpha=alpha)
        got = spec.sigmoid_focal_loss_grad(
            np.array([logit]), np.array([target]), reduction="none", wrt=wrt, **kwargs
        )
        call = f"spec.sigmoid_focal_loss_grad(x={logit}, t={target}, {kwargs}, wrt={wrt!r})"
        exact = mp_oracle.sigmoid_focal(logit, target, wrt=wrt, **kwargs)
        failures += _compare(
            ("sigmoid_focal_loss", wrt), call, got, exact.wrt_grad, exact.wrt_allowance
        )
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------------------------
# Reductions: small batches
# ----------------------------------------------------------------------------------------------

BATCH_LOGITS = [
    [2.0, -1.0, 0.5, -3.0],
    [0.0, -700.0, -350.0, -40.0],
    [1e-8, 0.0, -1e-8, 0.3],
    [300.0, 263.0, 299.0, 250.0],
]
BATCH_SOFT = [
    [0.7, 0.1, 0.2, 0.0],
    [0.0, 0.25, 0.25, 0.5],
    [0.1, 0.2, 0.3, 0.4],
    [1.0, 0.0, 0.0, 0.0],
]
BATCH_INDEX = [0, 1, -100, 3]


def _softmax_batch_exact(loss, targets, wrt, kwargs):
    """Per-row exact derivatives and values (reduction 'none' of each row)."""
    oracle = (
        mp_oracle.softmax_focal if losses.get(loss).is_focal else mp_oracle.softmax_cross_entropy
    )
    rows = []
    for logits, target in zip(BATCH_LOGITS, targets):
        if target == -100:
            rows.append(None)  # ignored: no loss, no gradient
            continue
        rows.append(oracle(logits, target, wrt=wrt, **kwargs))
    return rows


REDUCED_GRAD_CASES = [
    ("softmax_cross_entropy", "targets", dict(weight=[0.3, 2.0, 1.0, 0.7])),
    ("softmax_cross_entropy", "weight", dict(weight=[0.3, 2.0, 1.0, 0.7])),
    ("softmax_cross_entropy", "weight", dict(weight=[0.3, 2.0, 1.0, 0.7], label_smoothing=0.1)),
    ("softmax_cross_entropy", "label_smoothing", dict(label_smoothing=0.1)),
    ("softmax_focal_loss", "targets", dict(gamma=0.5, alpha=0.25)),
    ("softmax_focal_loss", "gamma", dict(gamma=3.3, label_smoothing=0.1)),
    ("softmax_focal_loss", "alpha", dict(gamma=2.0, alpha=[0.25, 0.5, 0.75, 1.0])),
    ("softmax_focal_loss", "alpha", dict(gamma=0.5, alpha=0.25, label_smoothing=0.1)),
    ("softmax_focal_loss", "label_smoothing", dict(gamma=2.0, label_smoothing=0.1)),
]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize(
    "loss, wrt, kwargs, kind",
    [
        pytest.param(loss, wrt, kwargs, kind, id=f"{loss}-{wrt}-{n}-{kind}")
        for n, (loss, wrt, kwargs) in enumerate(REDUCED_GRAD_CASES)
        for kind in ("index", "soft")
        if not (wrt == "targets" and kind == "index")  # class indices have no gradient
    ],
)
def test_softmax_reduced_input_grads_within_4_ulp_of_their_terms(
    loss, wrt, kwargs, kind, reduction
):
    mpf = mp_oracle.mpf
    targets = BATCH_INDEX if kind == "index" else BATCH_SOFT
    rows = _softmax_batch_exact(loss, targets, wrt, kwargs)
    kept = [row for row in rows if row is not None]
    t = np.array(targets, dtype=np.int64 if kind == "index" else np.float64)
    got = getattr(spec, loss + "_grad")(
        np.array(BATCH_LOGITS), t, reduction=reduction, wrt=wrt, **kwargs
    )
    call = f"spec.{loss}_grad({kind} targets, {kwargs}, reduction={reduction!r}, wrt={wrt!r})"
    with mp_oracle.mpmath.workdps(mp_oracle.DIGITS + mp_oracle._GUARD):
        weight = kwargs.get("weight")
        quotient = (
            kind == "index" and losses.get(loss).index_mean == "weights" and reduction == "mean"
        )
        if reduction == "sum":
            divisor = mpf(1)
        elif quotient:
            divisor = mp_oracle.mpmath.fsum(
                mpf(1 if weight is None else weight[y]) for y in targets if y != -100
            )
        elif kind == "index":
            divisor = mpf(len(kept))
        else:
            divisor = mpf(len(rows))
        if wrt == "targets":
            exact = [g / divisor for row in rows for g in row.wrt_grad]
            allowance = [a / divisor for row in rows for a in row.wrt_allowance]
            scales = [abs(e) for e in exact]
        else:
            size = len(kept[0].wrt_grad)
            exact = [
                mp_oracle.mpmath.fsum(r.wrt_grad[c] for r in kept) / divisor for c in range(size)
            ]
            allowance = [
                mp_oracle.mpmath.fsum(r.wrt_allowance[c] for r in kept) / divisor
                for c in range(size)
            ]
            scales = [
                mp_oracle.mpmath.fsum(abs(r.wrt_grad[c]) for r in kept) / divisor
                for c in range(size)
            ]
            if quotient and wrt == "weight":
                # L = sum_i l_i / D, D = sum_i w_{y_i}: dL/dw_c = (S_c - n_c L) / D
                mean = mp_oracle.mpmath.fsum(r.value for r in kept) / divisor
                for c in range(size):
                    count = sum(1 for y in targets if y == c)
                    exact[c] -= count * mean / divisor
                    scales[c] += count * abs(mean) / divisor
                    value_allowance = mp_oracle.mpmath.fsum(r.value_allowance for r in kept)
                    allowance[c] += count * value_allowance / divisor**2
    failures = _compare((loss, wrt + " (reduced)"), call, got, exact, allowance, scales)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize(
    "loss, wrt, kwargs",
    [
        ("sigmoid_cross_entropy", "targets", dict(weight=0.5, pos_weight=3.0)),
        ("sigmoid_cross_entropy", "weight", dict(weight=0.5, pos_weight=3.0)),
        ("sigmoid_cross_entropy", "pos_weight", dict(weight=0.5, pos_weight=3.0)),
        ("sigmoid_focal_loss", "targets", dict(gamma=0.5, alpha=0.25)),
        ("sigmoid_focal_loss", "gamma", dict(gamma=2.0, alpha=0.25)),
        ("sigmoid_focal_loss", "alpha", dict(gamma=3.3, alpha=0.25)),
    ],
)
def test_sigmoid_reduced_input_grads_within_4_ulp_of_their_terms(loss, wrt, kwargs, reduction):
    x = [-700.0, -20.0, -1.0, 1e-8, 3.0, 37.0]
    t = [0.3, 0.0, 1.0, 0.7, 0.0, 1.0]
    oracle = (
        mp_oracle.sigmoid_focal if losses.get(loss).is_focal else mp_oracle.sigmoid_cross_entropy
    )
    rows = [oracle(xi, ti, wrt=wrt, **kwargs) for xi, ti in zip(x, t)]
    got = getattr(spec, loss + "_grad")(
        np.array(x), np.array(t), reduction=reduction, wrt=wrt, **kwargs
    )
    call = f"spec.{loss}_grad({kwargs}, reduction={reduction!r}, wrt={wrt!r})"
    divisor = 1 if reduction == "sum" else len(x)
    if wrt == "targets":
        exact = [r.wrt_grad[0] / divisor for r in rows]
        allowance = [r.wrt_allowance[0] / divisor for r in rows]
        scales = [abs(e) for e in exact]
    else:
        exact = [mp_oracle.mpmath.fsum(r.wrt_grad[0] for r in rows) / divisor]
        allowance = [mp_oracle.mpmath.fsum(r.wrt_allowance[0] for r in rows) / divisor]
        scales = [mp_oracle.mpmath.fsum(abs(r.wrt_grad[0]) for r in rows) / divisor]
    failures = _compare((loss, wrt + " (reduced)"), call, got, exact, allowance, scales)
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------------------------
# The oracle's closed forms against mpmath.diff
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loss, kwargs",
    [
        ("softmax_focal", dict(gamma=3.3, alpha=[0.25, 0.5, 0.75], label_smoothing=0.1)),
        ("softmax_focal", dict(gamma=0.5, alpha=0.25, label_smoothing=0.0)),
        ("softmax_cross_entropy", dict(weight=[0.3, 2.0, 1.0], label_smoothing=0.1)),
    ],
)
def test_oracle_closed_form_derivatives_match_differences(loss, kwargs):
    """The oracle's softmax closed forms are the derivatives of its own textbook loss.

    The loss is linear in t, w, alpha and eps, so a central difference over a float step is
    exact there (to the working precision); for gamma it is accurate to h^2 = 1e-12.
    """
    logits, target = [0.5, -2.0, 1.5], [0.2, 0.0, 0.8]
    fn = getattr(mp_oracle, loss)
    mpf = mp_oracle.mpf
    h = 2.0**-20
    for wrt in ["targets", "label_smoothing", "gamma", "alpha", "weight"]:
        if wrt != "targets" and wrt not in kwargs:
            continue
        closed = fn(logits, target, wrt=wrt, **kwargs).wrt_grad
        base = target if wrt == "targets" else kwargs[wrt]
        vector = isinstance(base, list)
        numeric = []
        for index in range(len(base) if vector else 1):
            values = []
            for step in (h, -h):
                moved = list(base) if vector else base
                if vector:
                    moved[index] = base[index] + step
                else:
                    moved = base + step
                if wrt == "targets":
                    values.append(fn(logits, moved, **kwargs))
                else:
                    values.append(fn(logits, target, **dict(kwargs, **{wrt: moved})))
                values[-1] = (values[-1].value, moved[index] if vector else moved)
            (up, x_up), (down, x_down) = values
            with mp_oracle.mpmath.workdps(mp_oracle.DIGITS + mp_oracle._GUARD):
                numeric.append((up - down) / (mpf(x_up) - mpf(x_down)))
        tolerance = mpf(10) ** (-9 if wrt == "gamma" else -30)
        for got, want in zip(closed, numeric):
            assert abs(got - want) <= tolerance * (1 + abs(want)), (
                f"mp_oracle.{loss}({kwargs}, wrt={wrt!r}): closed form {got} vs differences {want}"
            )


def worst_table() -> str:
    lines = [f"{'loss':<24}{'wrt':<28}{'ULP beyond allowance':>22}{'raw ULP':>12}  worst case"]
    for (loss, wrt), (beyond, raw, where) in sorted(WORST.items()):
        lines.append(f"{loss:<24}{wrt:<28}{beyond:>22.3g}{raw:>12.3g}  {where}")
    return "\n".join(lines)


def test_worst_ulp_summary(capsys):
    """Prints the worst measured errors per (loss, wrt) (run last in this file)."""
    if not WORST:
        pytest.skip("no accuracy test ran before this one")
    with capsys.disabled():
        print("\n" + worst_table())
    assert all(beyond <= ULPS for (_, wrt), (beyond, _, _) in WORST.items() if "strict" not in wrt)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
