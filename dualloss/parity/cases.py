"""Adversarial inputs for the parity oracle: named regions, each a generator with a fixed seed.

Cases are backend-neutral NumPy: logits in float64 with the class axis last (the spec's and JAX's
layout), targets as int64 class indices or float64 probabilities, options as the spec's keyword
arguments. ``to_torch_layout`` moves the class axis to dim 1 for PyTorch.

A case is generated *for a dtype*: margins run "from 20 up to near the dtype's range", so a
float16 case stops at tens of thousands and a float32 case goes to 1e38. The values are rounded
to the dtype later, by ``backends.round_to`` (the candidate and the reference see the same bits).

Regions (``REGIONS``):

* ``typical``: standard-normal logits, a few shapes.
* ``confident_correct``: the target logit leads by a margin of 20 .. ~half the dtype's maximum,
  so every other probability underflows (1 - p_target is below the dtype's smallest number).
* ``confident_wrong``: the target logit trails by that margin: its probability underflows.
* ``near_ties``: logits equal, or one ULP apart.
* ``huge_shift``: a common shift of up to ~half the dtype's maximum added to typical logits.
* ``masked``: -inf logits as class masks, down to a single finite class (p = 1 exactly).
* ``soft_targets``: probability targets with exact zeros.
* ``masked_soft``: probability targets with -inf logits under the zero-mass classes.
* ``label_smoothing``: epsilon 0, 0.1 and 1.
* ``ignored``: ignore_index targets, some rows; ``all_ignored``: every target ignored.
* ``classes``: C = 1, C = 2 and a large C (>= 32768, tiny N).
* ``spatial``: extra dims, (N, d1, d2, C) here, (N, C, d1, d2) for torch.
* ``where``: boolean class masks (optax semantics), with label smoothing.
* ``options``: the option grid (gamma 0, 0.25, 0.5, 1, 2, 5; alpha None / scalar / vector;
  weights; pos_weight) on typical and adversarial rows; for softmax (``wide span``) a class-index
  target at -0.9 max with weight (alpha) 0.25 in a row whose top is 0.9 max (reduction none).
* ``llm_head``: the LLM head options (DESIGN 13), `softcap` small (0.5, 1) and large (30, 1e4)
  with logits far beyond the cap (1e3 up to ~half the dtype's maximum, -inf masked classes among
  them), `z_loss` 1e-4 / 1e-2 / 1, and a common shift that puts z_loss * lse**2 at an eighth of
  the dtype's largest number (large, finite); with ignored rows, class weights or alpha, label
  smoothing, probability targets and `where` masks.
* ``wide_span``: logits spanning more than the dtype's largest number (0.9 max and -0.9 max in a
  row; float64 max / 32) with probability targets on the far negative classes: z - z_top
  overflows to -inf, the loss (0.34 max) does not.

Every adversarial region also comes ``hidden``: its rows inside a larger typical batch at an odd
offset (row 37 of 67), so that vectorised loops run their tails over the bad row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import losses

LOSSES = losses.NAMES

# the largest finite value of each dtype
DTYPE_MAX = {
    "float64": float(np.finfo(np.float64).max),
    "float32": float(np.finfo(np.float32).max),
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
}
GAMMAS = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0)
HIDE_AT, HIDE_IN = 37, 67
# weights and alphas exactly representable in every dtype (bfloat16 has 8 significant bits)
_WEIGHTS = (0.5, 1.0, 2.0, 0.25, 1.5, 0.75, 3.0, 1.25)

REGIONS = losses.REGIONS
# regions whose inputs are adversarial rows worth hiding in a larger batch
ADVERSARIAL = ("confident_correct", "confident_wrong", "near_ties", "masked", "soft_targets",
               "masked_soft", "wide_span")  # fmt: skip


@dataclass
class Case:
    """One input: logits (float64, class axis last), targets, the spec's options, metadata.

    `loss` may be given as the loss's record or its name; the case holds the name in `loss` and
    the record in `info` (looked up once, here, when only the name was given)."""

    loss: str
    region: str
    label: str
    logits: np.ndarray
    targets: np.ndarray
    options: dict = field(default_factory=dict)
    # the target's logit margin over the best other class (sigmoid: x (2t - 1)), for plots
    margin: float = 0.0
    # rows worth trying first when looking for a minimal failing input
    hot_rows: tuple[int, ...] = ()
    # the loss's record (``losses.LossInfo``): what the code asks about the loss
    info: losses.LossInfo = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.loss, losses.LossInfo):
            self.info = self.loss
        elif self.info is None:
            self.info = losses.get(self.loss)
        self.loss = self.info.name

    @property
    def name(self) -> str:
        return f"{self.region}/{self.label}"

    @property
    def index_targets(self) -> bool:
        return np.issubdtype(self.targets.dtype, np.integer)

    @property
    def gamma(self) -> float:
        return self.info.gamma(self.options)

    def rows(self, index: int) -> Case:
        """The case restricted to one row of the batch (the first axis)."""
        options = dict(self.options)
        for option in self.info.options:
            value = options.get(option.name)
            # masks and element-wise weights of the logits' rank follow the rows
            per_row = option.kind == "mask" or option.kind == "elementwise"
            if per_row and isinstance(value, np.ndarray) and value.ndim == self.logits.ndim:
                options[option.name] = value[index : index + 1]
        return replace(
            self,
            label=f"{self.label}[row {index}]",
            logits=self.logits[index : index + 1],
            targets=self.targets[index : index + 1],
            options=options,
            hot_rows=(0,),
        )


def to_torch_layout(array: np.ndarray) -> np.ndarray:
    """Moves the class axis from last to dim 1, (N, ..., C) -> (N, C, ...)."""
    array = np.asarray(array)
    if array.ndim <= 2:
        return array
    return np.moveaxis(array, -1, 1)


def from_torch_layout(array: np.ndarray) -> np.ndarray:
    """The inverse of ``to_torch_layout``."""
    array = np.asarray(array)
    if array.ndim <= 2:
        return array
    return np.moveaxis(array, 1, -1)


# ----------------------------------------------------------------------------------------------
# Margins
# ----------------------------------------------------------------------------------------------


def margins(dtype: str, level: str = "quick") -> list[float]:
    """Target margins from 20 to about half the dtype's maximum.

    Dense where exp(-margin) leaves the dtypes' normal and subnormal ranges (about 10 .. 745),
    then decades up to half the largest finite value."""
    # float64: the spec itself computes in float64, and gamma * ce overflows its headroom above
    # max / 16 (spec.sigmoid_focal_loss_grad is NaN at x = -9e307, gamma = 2; reported)
    top = 0.5 * DTYPE_MAX[dtype] if dtype != "float64" else DTYPE_MAX[dtype] / 16
    if level == "quick":
        grid = [20.0, 45.0, 90.0, 200.0, 800.0, 3e4, 1e15]
    else:
        grid = [20.0, 30.0, 45.0, 60.0, 90.0, 110.0, 200.0, 400.0, 800.0, 1500.0, 1e4, 3e4]
        grid += [1e6, 1e10, 1e20, 1e30, 1e100, 1e200, 1e300]
    return [m for m in grid if m < top] + [_round_nice(top)]


def _round_nice(x: float) -> float:
    """Two significant digits, so that margins print well and round identically."""
    if x <= 0:
        return x
    digits = 1 - int(math.floor(math.log10(x)))
    return round(x, digits) if digits > 0 else float(round(x / 10 ** (-digits)) * 10 ** (-digits))


# ----------------------------------------------------------------------------------------------
# Softmax rows
# ----------------------------------------------------------------------------------------------


def _typical(rng, n, c):
    return rng.standard_normal((n, c)) * 2.0, rng.integers(0, c, n)


def _confident(rng, c, margin, correct):
    """One row: the target leads (correct) or trails (wrong) the best other logit by margin."""
    noise = rng.standard_normal(c)
    target = int(rng.integers(0, c))
    z = noise.copy()
    if correct:
        # others near -margin, the target at 0: z_target - z_other = margin (+ noise)
        z = noise - margin
        z[target] = 0.0
    else:
        z[target] = -margin
    return z, target


def _softmax_margin(z, target):
    others = np.delete(z, target)
    return float(z[target] - np.max(others)) if others.size else math.inf


def _hide(rng, rows_z, rows_t, c, prob_targets=False):
    """The rows placed at HIDE_AT inside a typical batch of HIDE_IN rows."""
    z, t = _typical(rng, HIDE_IN, c)
    if prob_targets:
        t = _soft(rng, HIDE_IN, c)
    else:
        t = t.astype(np.int64)
    k = len(rows_z)
    z[HIDE_AT : HIDE_AT + k] = rows_z
    t[HIDE_AT : HIDE_AT + k] = rows_t
    return z, t, tuple(range(HIDE_AT, HIDE_AT + k))


def _soft(rng, n, c, zeros=True):
    p = rng.random((n, c)) + 0.05
    if zeros and c > 1:
        p[rng.random((n, c)) < 0.4] = 0.0
        p[np.arange(n), rng.integers(0, c, n)] += 0.5
    # power-of-two denominators keep targets exact in bfloat16 and the sum exactly 1 mostly
    p = np.round(p / p.sum(axis=-1, keepdims=True) * 64.0) / 64.0
    p[:, 0] += 1.0 - p.sum(axis=-1)
    fix = p[:, 0] < 0
    if fix.any():
        p[fix] = 0.0
        p[fix, -1] = 1.0
    return p


@dataclass
class _Plan:
    """What a region generator needs: the loss, the dtype's margins, the gamma grids, a seeded
    generator of its own, and ``case(...)`` to build a ``Case`` of this loss."""

    info: losses.LossInfo
    dtype: str
    level: str
    rng: np.random.Generator

    @property
    def full(self) -> bool:
        return self.level == "full"

    @property
    def gammas(self) -> tuple[float, ...]:
        return GAMMAS if self.full else (0.0, 0.25, 0.5, 2.0)

    @property
    def adv_gammas(self) -> tuple[float | None, ...]:
        """The gammas of the adversarial regions; (None,) for a loss without gamma."""
        if not self.info.is_focal:
            return (None,)
        return self.gammas if self.full else (0.0, 0.5, 2.0)

    def case(self, region, label, z, t, options=None, margin=0.0, hot=()) -> Case:
        target_dtype = None if self.info.is_softmax else float
        return Case(self.info, region, label, np.asarray(z, float),
                    np.asarray(t, target_dtype), options or {}, margin, tuple(hot))  # fmt: skip


def _focal_opts(gamma):
    return {} if gamma is None else {"gamma": gamma}


def _gamma_label(gamma):
    return "" if gamma is None else f" gamma={gamma}"


def _softmax_typical(plan: _Plan) -> Iterator[Case]:
    rng = plan.rng
    for n, c in [(4, 5), (67, 13)] + ([(128, 100), (3, 1000)] if plan.full else []):
        z, t = _typical(rng, n, c)
        yield plan.case("typical", f"{n}x{c}", z, t)
        yield plan.case("typical", f"{n}x{c} sum", z, t, {"reduction": "sum"})
        yield plan.case("typical", f"{n}x{c} none", z, t, {"reduction": "none"})
    z = _soft(rng, 8, 7, zeros=False)
    yield plan.case("typical", "8x7 prob", rng.standard_normal((8, 7)), z)


def _softmax_confident(region: str, correct: bool):
    """The target leads (correct) or trails (wrong) by each margin, with gamma for focal."""

    def generate(plan: _Plan) -> Iterator[Case]:
        rng = plan.rng
        for gamma in plan.adv_gammas:
            rows_z, rows_t, rows_m = [], [], []
            opts = _focal_opts(gamma)
            for m in margins(plan.dtype, plan.level):
                z, t = _confident(rng, 5, m, correct)
                rows_z.append(z)
                rows_t.append(t)
                rows_m.append(_softmax_margin(z, t))
                label = f"margin={m:g}{_gamma_label(gamma)}"
                yield plan.case(region, label, z[None], [t], opts, rows_m[-1], (0,))
            z, t, hot = _hide(rng, np.array(rows_z), np.array(rows_t), 5)
            yield plan.case(region, f"hidden{_gamma_label(gamma)}", z, t, opts, min(rows_m), hot)

    return generate


def _softmax_near_ties(plan: _Plan) -> Iterator[Case]:
    """Equal logits, and one-ULP differences (made in the dtype later by rounding)."""
    rng = plan.rng
    for gamma in plan.adv_gammas[:2] if not plan.full else plan.adv_gammas:
        opts = _focal_opts(gamma)
        g = _gamma_label(gamma)
        base = float(rng.standard_normal())
        eps = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10}.get(
            plan.dtype, 2.0**-7
        )
        rows = np.array([[base] * 4, [base, base * (1 + eps), base, base], [0.0] * 4])
        yield plan.case("near_ties", f"ties{g}", rows, [0, 1, 3], opts, 0.0)
        z, t, hot = _hide(rng, rows, np.array([0, 1, 3]), 4)
        yield plan.case("near_ties", f"hidden{g}", z, t, opts, 0.0, hot)


def _softmax_huge_shift(plan: _Plan) -> Iterator[Case]:
    """A huge common shift added to typical logits."""
    rng = plan.rng
    shifts = [1e3, 0.5 * DTYPE_MAX[plan.dtype]]
    if plan.full:
        shifts = [1e2, 1e4, 1e6, 1e15, 1e30, 0.5 * DTYPE_MAX[plan.dtype]]
    for shift in shifts:
        if shift > 0.5 * DTYPE_MAX[plan.dtype]:
            continue
        z, t = _typical(rng, 6, 5)
        yield plan.case("huge_shift", f"shift={shift:.3g}", z + shift, t)


def _softmax_masked(plan: _Plan) -> Iterator[Case]:
    """-inf logits as class masks, down to a single finite class."""
    rng = plan.rng
    for gamma in plan.adv_gammas:
        opts = _focal_opts(gamma)
        g = _gamma_label(gamma)
        z = rng.standard_normal((4, 6))
        z[0, [1, 3]] = -np.inf
        z[1, 1:] = -np.inf  # a single finite class: p = 1 exactly
        z[2, [0, 5]] = -np.inf
        z[3, :5] = -np.inf
        t = np.array([0, 0, 3, 5])
        yield plan.case("masked", f"-inf{g}", z, t, opts, math.inf, (1, 3))
        hz, ht, hot = _hide(rng, z, t, 6)
        yield plan.case("masked", f"hidden{g}", hz, ht, opts, math.inf, hot)


def _softmax_soft(region: str):
    """Soft targets with zeros; masked_soft: -inf logits under zero target mass (0 log 0 = 0)."""

    def generate(plan: _Plan) -> Iterator[Case]:
        rng = plan.rng
        for gamma in plan.adv_gammas[:3] if not plan.full else plan.adv_gammas:
            opts = _focal_opts(gamma)
            g = _gamma_label(gamma)
            t = _soft(rng, 5, 6)
            z = rng.standard_normal((5, 6)) * 3
            z[1][t[1] == 0.0] = -60.0
            if region == "masked_soft":
                z[0][t[0] == 0.0] = -np.inf
                one_hot = np.zeros(6)
                one_hot[2] = 1.0
                t[4] = one_hot
                z[4] = -np.inf
                z[4, 2] = 1.0  # p = 1 on the one class with target mass
            yield plan.case(region, f"zeros{g}", z, t, opts, 0.0, (0, 4, 1))
            hz, ht, hot = _hide(rng, z, t, 6, prob_targets=True)
            yield plan.case(region, f"hidden{g}", hz, ht, opts, 0.0, hot)

    return generate


def _softmax_label_smoothing(plan: _Plan) -> Iterator[Case]:
    rng = plan.rng
    for eps in (0.0, 0.1, 1.0):
        z, t = _typical(rng, 6, 5)
        z[0] = [40.0, -40.0, 0.0, 1.0, 2.0]
        t[0] = 0
        yield plan.case("label_smoothing", f"eps={eps}", z, t, {"label_smoothing": eps}, hot=(0,))
    if plan.info.is_focal:
        z, t = _typical(rng, 6, 5)
        yield plan.case("label_smoothing", "eps=0.1 gamma=0.5", z, t,
                        {"label_smoothing": 0.1, "gamma": 0.5})  # fmt: skip


def _softmax_ignored(plan: _Plan) -> Iterator[Case]:
    rng = plan.rng
    z, t = _typical(rng, 9, 4)
    t[[0, 4, 8]] = -100
    yield plan.case("ignored", "some", z, t)
    yield plan.case("ignored", "some sum", z, t, {"reduction": "sum"})
    z[4] = [30.0, -30.0, 0.0, 5.0]
    yield plan.case("ignored", "ignore_index=2", z, np.where(t == -100, 2, t), {"ignore_index": 2})


def _softmax_all_ignored(plan: _Plan) -> Iterator[Case]:
    z, _ = _typical(plan.rng, 5, 4)
    yield plan.case("all_ignored", "mean", z, np.full(5, -100))
    yield plan.case("all_ignored", "sum", z, np.full(5, -100), {"reduction": "sum"})


def _softmax_classes(plan: _Plan) -> Iterator[Case]:
    """C = 1, 2 and a large C."""
    rng = plan.rng
    z, t = _typical(rng, 6, 1)
    yield plan.case("classes", "C=1", z, t)
    z, t = _typical(rng, 7, 2)
    z[3] = [25.0, -25.0]
    yield plan.case("classes", "C=2", z, t, hot=(3,))
    big = 32771 if not plan.full else 65537
    z, t = _typical(rng, 2, big)
    z[1, 7] = 80.0
    t[1] = 7
    yield plan.case("classes", f"C={big}", z, t, hot=(1,))


def _softmax_spatial(plan: _Plan) -> Iterator[Case]:
    rng = plan.rng
    z = rng.standard_normal((2, 3, 5, 4)) * 2
    t = rng.integers(0, 4, (2, 3, 5))
    z[1, 2, 3] = [0.0, -50.0, -50.0, -50.0]
    t[1, 2, 3] = 0
    yield plan.case("spatial", "2x3x5 C=4", z, t)
    yield plan.case("spatial", "2x3x5 C=4 none", z, t, {"reduction": "none"})
    t[0, 1, 1] = -100
    yield plan.case("spatial", "2x3x5 ignored", z, t)


def _softmax_where(plan: _Plan) -> Iterator[Case]:
    rng = plan.rng
    z, t = _typical(rng, 6, 5)
    where = rng.random((6, 5)) < 0.7
    where[np.arange(6), t] = True
    where[2] = False
    where[2, t[2]] = True  # one class left: p = 1
    for eps in (0.0, 0.2):
        opts = {"where": where, "label_smoothing": eps}
        if plan.info.is_focal:
            opts["gamma"] = 0.5
        yield plan.case("where", f"mask eps={eps}", z, t, opts, hot=(2,))


def _softmax_options(plan: _Plan) -> Iterator[Case]:
    """The option grid: gamma x alpha for focal, the class weights for cross entropy."""
    rng = plan.rng
    z, t = _typical(rng, 11, 5)
    z[5] = [60.0, -60.0, 0.0, 0.0, 1.0]
    t[5] = 0
    vector = np.array(_WEIGHTS[:5])
    if plan.info.is_focal:
        alphas = [None, 0.25, np.array([0.25, 0.5, 0.75, 1.0, 0.125])]
        for gamma in plan.gammas:
            for alpha in alphas if (plan.full or gamma in (0.0, 0.5)) else alphas[:1]:
                label = (
                    f"gamma={gamma} alpha={'vector' if isinstance(alpha, np.ndarray) else alpha}"
                )
                yield plan.case("options", label, z, t, {"gamma": gamma, "alpha": alpha}, hot=(5,))
    else:
        yield plan.case("options", "weight", z, t, {"weight": vector}, hot=(5,))
        yield plan.case("options", "weight sum", z, t, {"weight": vector, "reduction": "sum"})
        yield plan.case("options", "weight eps=0.1", z, t,
                        {"weight": vector, "label_smoothing": 0.1})  # fmt: skip
        prob = _soft(rng, 11, 5)
        yield plan.case("options", "weight prob", z, prob, {"weight": vector})
    # logits spanning more than the dtype's largest number (``wide_span``), the target at the
    # far negative class with a weight (or alpha) of 0.25: z_y - z_top overflows, the loss
    # (0.45 max, per element) does not; here, where the weight stays with the case (``wide_span``
    # is judged with a user's own options, without which this loss is beyond the largest number)
    big = _span(plan.dtype)
    y = 0 if plan.info.is_focal else 3  # the class whose weight (alpha) is 0.25
    z, t = _typical(rng, 3, 5)
    z[1] = [2.0, 1.0, 2.0, 1.0, 2.0]
    z[1, y], z[1, (y + 1) % 5] = -big, big
    t[1] = y
    if plan.info.is_focal:
        alpha = np.array([0.25, 0.5, 0.75, 1.0, 0.125])
        for gamma in (0.0, 2.0):
            yield plan.case("options", f"wide span gamma={gamma} alpha=vector", z, t,
                            {"gamma": gamma, "alpha": alpha, "reduction": "none"},
                            hot=(1,))  # fmt: skip
    else:
        yield plan.case("options", "wide span weight", z, t,
                        {"weight": vector, "reduction": "none"}, hot=(1,))  # fmt: skip


def _span(dtype: str) -> float:
    """0.9 times the dtype's largest number: logits at it and at its negative span 1.8 times the
    largest number (float16 inputs are computed in float32, where they do not overflow). The
    spec computes in float64, so for float64 1/32 of the largest number (as ``margins``)."""
    return 0.9 * DTYPE_MAX[dtype] if dtype != "float64" else DTYPE_MAX[dtype] / 32


def _softmax_wide_span(plan: _Plan) -> Iterator[Case]:
    """Logits spanning more than the dtype's largest number (0.9 max and -0.9 max in a row), with
    probability targets on the far negative classes: z - z_top overflows, the loss (0.3375 and
    0.1125 times the max) does not, nor does the rows' sum (a mean or sum formed as a sum first).
    Alone and hidden in a typical batch."""
    rng = plan.rng
    big = _span(plan.dtype)
    z = np.array([[big, -big, 0.0, 1.0, -1.0, 2.0], [-big, 0.5, big, 0.0, -1.0, 0.0]])
    t = np.array([[0.75, 0.125, 0.125, 0.0, 0.0, 0.0], [0.0625, 0.0, 0.9375, 0.0, 0.0, 0.0]])
    for gamma in plan.adv_gammas:
        opts = _focal_opts(gamma)
        g = _gamma_label(gamma)
        yield plan.case("wide_span", f"span{g}", z, t, opts, 0.0, (0, 1))
        hz, ht, hot = _hide(rng, z, t, 6, prob_targets=True)
        yield plan.case("wide_span", f"hidden{g}", hz, ht, opts, 0.0, hot)


def _far(plan: _Plan) -> list[float]:
    """Logit sizes far beyond every cap: 1e3 up to about half the dtype's maximum."""
    top = 0.5 * DTYPE_MAX[plan.dtype] if plan.dtype != "float64" else DTYPE_MAX[plan.dtype] / 16
    grid = [1e3, 1e30] if not plan.full else [1e3, 3e4, 1e6, 1e15, 1e30, 1e100, 1e300]
    return [m for m in grid if m < top] + [_round_nice(top)]


def _beyond_cap_rows(rng, far: list[float]):
    """Rows of 6 classes with logits far beyond any cap (the target leading by, trailing by, and
    tied at the far value), -inf masked classes next to them, a single finite class, and an
    ignored row of huge logits; returns (logits, targets)."""
    rows, targets = [], []
    for m in far:
        z = rng.standard_normal(6)
        z[2] = m  # the target leads by far more than the cap
        rows.append(z)
        targets.append(2)
        z = rng.standard_normal(6)
        z[[1, 4]] = [m, -m]  # the target trails far beyond the cap; another far below
        rows.append(z)
        targets.append(0)
        z = np.full(6, -np.inf)
        z[[0, 3, 5]] = [m, 0.5 * m, -m]  # -inf masks, two capped logits nearly tied
        rows.append(z)
        targets.append(3)
    z = np.full(6, -np.inf)
    z[4] = far[-1]  # a single finite class, beyond the cap: p = 1 exactly
    rows.append(z)
    targets.append(4)
    z = rng.standard_normal(6) * far[-1] / 4
    rows.append(z)  # an ignored row: its huge logits contribute nothing, nor their z-term
    targets.append(-100)
    return np.array(rows), np.array(targets)


# the quick level's llm_head cases per dtype (JAX compiles once per case and dtype, so the quick
# run takes two per dtype, and the dtypes share the grid out): (kind, softcap, z_loss)
_LLM_HEAD_QUICK = {
    "float32": (("beyond", 0.5, 1.0), ("prob", 30.0, 1e-4)),
    "bfloat16": (("smoothed", 30.0, 1e-4), ("shift", None, 1e-2)),
    "float16": (("hidden", 1.0, 1e-2), ("shift", None, 1e-2)),
    "float64": (("beyond", 1e4, 1e-2), ("shift", None, 1.0)),
}


def _softmax_llm_head(plan: _Plan) -> Iterator[Case]:
    """The LLM head options (DESIGN 13): c = softcap tanh(z / softcap), the row loss base(c) +
    z_loss lse(c)**2; far beyond the cap, at -inf masks, and at a z-term near overflow.

    Kinds: 'beyond' (the rows of ``_beyond_cap_rows`` with class weights or alpha), 'smoothed'
    (those without -inf masks, label smoothing 0.1, reduction 'sum'), 'hidden' (them inside a
    typical batch), 'shift' (a common shift s with z_loss s**2 at an eighth of the dtype's
    largest number: the z-term and its gradient 2 z_loss lse p are large but finite; float16:
    s = 900 at z_loss = 0.01), 'prob' (probability targets with exact zeros, a `where` mask on
    the class that holds a logit far beyond the cap, label smoothing 0.2). Focal cases take
    gamma 0.5 where they add no class vector."""
    rng = plan.rng
    focal = plan.info.is_focal
    z, t = _beyond_cap_rows(rng, _far(plan))
    hot = tuple(range(len(t)))
    # the class weights (cross entropy) or alpha (focal), exact in every dtype
    vector = np.array(_WEIGHTS[:6]) / (4.0 if focal else 1.0)
    weights = {"alpha" if focal else "weight": vector}
    gamma = {"gamma": 0.5} if focal else {}
    # label smoothing puts mass on every class: the rows without -inf masks (there the true
    # loss is infinite)
    finite = np.all(np.isfinite(z), axis=-1)
    hz, ht, hidden_hot = _hide(rng, z, t, 6)
    sz, st = _typical(rng, 6, 5)
    st[4] = -100
    pt = _soft(rng, 5, 6)
    pz = rng.standard_normal((5, 6)) * 3
    where = np.ones((5, 6), dtype=bool)
    where[:, 1] = False
    pz[:, 1] = z[-2].max()  # the largest far logit, on the masked class
    pz[2, 3] = -pz[0, 1]
    if plan.full:
        # every cap with every z_loss on the rows beyond the cap; the other kinds sampled
        grid = [("beyond", cap, zl) for cap in (0.5, 1.0, 30.0, 1e4) for zl in (1e-4, 1e-2, 1.0)]
        grid += [("hidden", 1.0, 1e-2), ("smoothed", 0.5, 1e-2), ("smoothed", 30.0, 1e-2)]
        grid += [("prob", cap, zl) for cap in (1.0, 1e4) for zl in (1e-4, 1.0)]
        grid += [("shift", cap, zl) for cap in (None, 1e4) for zl in (1e-4, 1e-2, 1.0)]
    else:
        grid = _LLM_HEAD_QUICK[plan.dtype]
    for kind, cap, zl in grid:
        head = {"z_loss": zl} if cap is None else {"softcap": cap, "z_loss": zl}
        name = f"cap={cap:g} z_loss={zl:g}" if cap is not None else f"z_loss={zl:g}"
        if kind == "beyond":
            yield plan.case("llm_head", f"beyond {name}", z, t, {**head, **weights}, math.inf, hot)
        elif kind == "hidden":
            yield plan.case("llm_head", f"hidden {name}", hz, ht, {**head, **weights}, math.inf,
                            hidden_hot)  # fmt: skip
        elif kind == "smoothed":
            opts = {**head, "label_smoothing": 0.1, "reduction": "sum", **gamma}
            yield plan.case("llm_head", f"smoothed {name} eps=0.1 sum", z[finite], t[finite], opts,
                            math.inf, tuple(range(int(finite.sum()))))  # fmt: skip
        elif kind == "prob":
            opts = {**head, "where": where, "label_smoothing": 0.2, **gamma}
            yield plan.case("llm_head", f"prob where {name} eps=0.2", pz, pt, opts, 0.0, (2,))
        else:
            shift = _round_nice(math.sqrt(DTYPE_MAX[plan.dtype] / 8.0) / math.sqrt(zl))
            yield plan.case("llm_head", f"shift={shift:.3g} {name}", sz + shift, st,
                            {**head, **gamma}, 0.0, (0,))  # fmt: skip
    if plan.full:
        # a shift so large that lse rounds to the top logit in the working precision (float32
        # for the half dtypes): log C is lost in lse, so p_j = exp(c_j - lse) would be 1 for
        # every tied class; the z-gradient 2 z_loss lse p must form p from the shifted logits
        work = "float32" if plan.dtype in ("float16", "bfloat16") else plan.dtype
        bits = np.finfo(work).nmant + 8
        if 2.0**bits < 0.5 * DTYPE_MAX[plan.dtype]:
            az, at = _typical(rng, 4, 5)
            yield plan.case("llm_head", f"shift=2**{bits} z_loss=0.01", az + 2.0**bits, at,
                            {"z_loss": 1e-2, **gamma}, 0.0, (0,))  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Sigmoid elements
# ----------------------------------------------------------------------------------------------


def _sigmoid_typical(plan: _Plan) -> Iterator[Case]:
    rng = plan.rng
    for shape in [(4, 5), (67, 3)] + ([(64, 80)] if plan.full else []):
        x = rng.standard_normal(shape) * 2
        t = (rng.random(shape) < 0.5).astype(float)
        name = "x".join(map(str, shape))
        yield plan.case("typical", name, x, t)
        yield plan.case("typical", name + " sum", x, t, {"reduction": "sum"})
        yield plan.case("typical", name + " none", x, t, {"reduction": "none"})


def _sigmoid_confident(region: str, sign: float):
    def generate(plan: _Plan) -> Iterator[Case]:
        rng = plan.rng
        for gamma in plan.adv_gammas:
            g = _gamma_label(gamma)
            ms = margins(plan.dtype, plan.level)
            t = (np.arange(len(ms)) % 2).astype(float)
            x = sign * np.array(ms) * (2 * t - 1)
            for i, m in enumerate(ms):
                yield plan.case(region, f"margin={m:g}{g}", x[i : i + 1, None],
                                t[i : i + 1, None], _focal_opts(gamma), sign * m, (0,))  # fmt: skip
            bx = rng.standard_normal((HIDE_IN, 3))
            bt = (rng.random((HIDE_IN, 3)) < 0.5).astype(float)
            k = len(ms)
            bx[HIDE_AT : HIDE_AT + k, 1] = x
            bt[HIDE_AT : HIDE_AT + k, 1] = t
            yield plan.case(region, f"hidden{g}", bx, bt, _focal_opts(gamma), sign * min(ms),
                            tuple(range(HIDE_AT, HIDE_AT + k)))  # fmt: skip

    return generate


def _sigmoid_near_ties(plan: _Plan) -> Iterator[Case]:
    x = np.array([[0.0, -0.0, 2.0**-30, -(2.0**-30)], [1e-8, -1e-8, 0.0, 0.0]])
    t = np.array([[1.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.0]])
    for gamma in plan.adv_gammas[:2] if not plan.full else plan.adv_gammas:
        yield plan.case("near_ties", f"zero{_gamma_label(gamma)}", x, t, _focal_opts(gamma))


def _sigmoid_soft_targets(plan: _Plan) -> Iterator[Case]:
    rng = plan.rng
    for gamma in plan.adv_gammas[:3] if not plan.full else plan.adv_gammas:
        g = _gamma_label(gamma)
        x = rng.standard_normal((6, 4)) * 4
        t = np.round(rng.random((6, 4)) * 16) / 16
        t[0] = [0.0, 1.0, 0.5, 0.25]
        x[0] = [-40.0, 40.0, 30.0, -30.0]
        t[1] = [0.5, 0.5, 0.0, 1.0]
        x[1] = [1e3, -1e3, 0.0, 0.0]
        yield plan.case("soft_targets", f"zeros{g}", x, t, _focal_opts(gamma), 0.0, (0, 1))
        bx = rng.standard_normal((HIDE_IN, 4))
        bt = np.round(rng.random((HIDE_IN, 4)) * 16) / 16
        bx[HIDE_AT : HIDE_AT + 6] = x
        bt[HIDE_AT : HIDE_AT + 6] = t
        yield plan.case("soft_targets", f"hidden{g}", bx, bt, _focal_opts(gamma), 0.0,
                        (HIDE_AT, HIDE_AT + 1))  # fmt: skip


def _sigmoid_spatial(plan: _Plan) -> Iterator[Case]:
    rng = plan.rng
    x = rng.standard_normal((2, 3, 4, 5)) * 3
    t = (rng.random((2, 3, 4, 5)) < 0.3).astype(float)
    yield plan.case("spatial", "2x3x4x5", x, t)


def _sigmoid_options(plan: _Plan) -> Iterator[Case]:
    """The option grid: gamma x alpha for focal, weight and pos_weight for cross entropy."""
    rng = plan.rng
    x = rng.standard_normal((7, 4)) * 3
    x[3] = [50.0, -50.0, 20.0, -20.0]
    t = (rng.random((7, 4)) < 0.5).astype(float)
    t[3] = [1.0, 0.0, 0.0, 1.0]
    if plan.info.is_focal:
        for gamma in plan.gammas:
            for alpha in (None, 0.25) if (plan.full or gamma in (0.0, 0.5)) else (None,):
                yield plan.case("options", f"gamma={gamma} alpha={alpha}", x, t,
                                {"gamma": gamma, "alpha": alpha}, hot=(3,))  # fmt: skip
    else:
        w = np.array(_WEIGHTS[:4])
        yield plan.case("options", "weight", x, t, {"weight": np.tile(w, (7, 1))}, hot=(3,))
        yield plan.case("options", "pos_weight", x, t, {"pos_weight": w}, hot=(3,))
        both = {"weight": np.tile(w[::-1], (7, 1)), "pos_weight": w, "reduction": "sum"}
        yield plan.case("options", "both sum", x, t, both)


# one generator per (family, region); a loss runs the regions its record lists, in this order
GENERATORS: dict[str, dict[str, Callable[[_Plan], Iterator[Case]]]] = {
    "softmax": {
        "typical": _softmax_typical,
        "confident_correct": _softmax_confident("confident_correct", True),
        "confident_wrong": _softmax_confident("confident_wrong", False),
        "near_ties": _softmax_near_ties,
        "huge_shift": _softmax_huge_shift,
        "masked": _softmax_masked,
        "soft_targets": _softmax_soft("soft_targets"),
        "masked_soft": _softmax_soft("masked_soft"),
        "label_smoothing": _softmax_label_smoothing,
        "ignored": _softmax_ignored,
        "all_ignored": _softmax_all_ignored,
        "classes": _softmax_classes,
        "spatial": _softmax_spatial,
        "where": _softmax_where,
        "options": _softmax_options,
        "llm_head": _softmax_llm_head,
        "wide_span": _softmax_wide_span,
    },
    "sigmoid": {
        "typical": _sigmoid_typical,
        "confident_correct": _sigmoid_confident("confident_correct", 1.0),
        "confident_wrong": _sigmoid_confident("confident_wrong", -1.0),
        "near_ties": _sigmoid_near_ties,
        "soft_targets": _sigmoid_soft_targets,
        "spatial": _sigmoid_spatial,
        "options": _sigmoid_options,
    },
}


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def make_cases(
    loss: str,
    dtype: str,
    *,
    level: str = "quick",
    regions: Any = None,
    skip: Any = (),
    seed: int = 0,
) -> list[Case]:
    """Every case of `loss` for `dtype`; deterministic (each region has its own fixed seed).

    Args:
      loss: a spec loss name, or its record.
      dtype: 'float64', 'float32', 'float16' or 'bfloat16' (sets the margin range).
      level: 'quick' or 'full' (more margins, gammas, shapes).
      regions: only these region names (None: all).
      skip: region names to leave out.
      seed: base seed; region r uses seed + its index in ``REGIONS``.
    """
    info = losses.get(loss)
    if level not in ("quick", "full"):
        raise ValueError(f"`level` must be 'quick' or 'full'. Received: level={level!r}.")
    out = []
    for region in info.regions:
        if (regions is not None and region not in regions) or region in skip:
            continue
        rng = np.random.default_rng(seed + REGIONS.index(region))
        plan = _Plan(info, dtype, level, rng)
        for case in GENERATORS[info.family][region](plan):
            if case.index_targets:
                case.targets = case.targets.astype(np.int64)
            out.append(case)
    return out
