"""The independent half of the zoo's verdicts: each entry's library code run at the input its
code reading points to, next to the exact value from mpmath (50 digits), without the oracle.

``python tests/zoo/probes.py`` prints the table that docs/zoo.md quotes; tests/test_zoo.py
asserts each probe's claim. A claim is what the reading says about that input: NaN or inf where
the loss is finite, an error at the result's scale, a raise, or an error inside the practical
standard's allowance (computed here from tolerance.py's formula, not by calling it).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import mpmath as mp
import numpy as np

mp.mp.dps = 50
K = 8  # tolerance.py's K, the allowance's multiple of u
VISIBLE = 2.0**-10  # an error at the result's scale (docs/parity.md)


def _exact_softmax_terms(z, y):
    """(p_y, log p_y, log p_c for every c) in mpmath, for one row z with -inf allowed."""
    zs = [mp.mpf(float(v)) if np.isfinite(v) else None for v in z]
    top = max(v for v in zs if v is not None)
    lse = top + mp.log(mp.fsum(mp.exp(v - top) for v in zs if v is not None))
    logp = [v - lse if v is not None else -mp.inf for v in zs]
    return mp.exp(logp[y]), logp[y], logp


def exact_softmax_ce(z, q):
    """-sum_c q_c log p_c with 0 log 0 = 0 (q: a probability vector)."""
    _, _, logp = _exact_softmax_terms(z, 0)
    return -mp.fsum(mp.mpf(float(qc)) * lp for qc, lp in zip(q, logp) if qc != 0)


def exact_smoothed_ce(z, y, eps):
    """torch's label smoothing: targets (1 - eps) one_hot + eps / C."""
    c = len(z)
    q = [eps / c + (1 - eps if k == y else 0) for k in range(c)]
    _, _, logp = _exact_softmax_terms(z, y)
    if any(lp == -mp.inf for lp in logp):
        return mp.inf
    return -mp.fsum(mp.mpf(qk) * lp for qk, lp in zip(q, logp))


def exact_softmax_focal(z, y, gamma):
    p, logp, _ = _exact_softmax_terms(z, y)
    return -((1 - p) ** gamma) * logp


def exact_sigmoid_focal(x, t, gamma, alpha=None):
    """torchvision's / the spec's: (1 - p_t)^gamma * BCE, p_t = p t + (1 - p)(1 - t)."""
    x, t = mp.mpf(x), mp.mpf(t)
    p = 1 / (1 + mp.exp(-x))
    bce = -(t * mp.log(p) + (1 - t) * mp.log(1 - p))
    p_t = p * t + (1 - p) * (1 - t)
    alpha_t = 1 if alpha is None else alpha * t + (1 - alpha) * (1 - t)
    return alpha_t * (1 - p_t) ** gamma * bce


def exact_bce(x, t):
    """softplus(x) - t x, the sigmoid cross entropy, in mpmath."""
    x, t = mp.mpf(x), mp.mpf(t)
    return mp.log1p(mp.exp(x)) - t * x


def sigmoid_focal_scale(x, t, gamma, alpha_t=1.0):
    """tolerance.py's value scale for the sigmoid focal loss, alpha_t m (1 + |x|)
    (1 + g (1 + |log(1 - p_t)|)), in mpmath."""
    x, t = mp.mpf(x), mp.mpf(t)
    p = 1 / (1 + mp.exp(-x))
    p_t = p * t + (1 - p) * (1 - t)
    return alpha_t * (1 - p_t) ** gamma * (1 + abs(x)) * (1 + gamma * (1 + abs(mp.log(1 - p_t))))


def _torch(values, dtype, grad=True):
    import torch

    out = torch.tensor(values, dtype=getattr(torch, dtype))
    return out.requires_grad_() if grad else out


def _value_grad_torch(f, x, t):
    y = f(x, t)
    y.backward()
    return float(y.detach()), x.grad.detach().double().numpy()


def _value_grad_jax(f, x, t):
    import jax

    y, g = jax.value_and_grad(f)(x, t)
    return float(y), np.asarray(g, dtype=float)


def _rel(a, b):
    return abs(mp.mpf(a) - b) / abs(b)


def probes():
    """[(entry name, input, what the library returns, the exact value, the claim, holds)]."""
    import jax.numpy as jnp
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import zoo

    rows = []

    def add(name, where, got, exact, claim, holds):
        rows.append((name, where, got, exact, claim, bool(holds)))

    # MONAI sigmoid: a different factor for soft targets; binary targets within the allowance
    got, _ = _value_grad_torch(
        zoo.monai_sigmoid_focal, _torch([[1.0]], "float32"), _torch([[0.25]], "float32", False)
    )
    ex = exact_sigmoid_focal(1, 0.25, 2)
    add(
        "monai_sigmoid_focal",
        "x=1, t=0.25, float32",
        got,
        ex,
        "wrong at the result's scale (relative error > 2^-10)",
        _rel(got, ex) > VISIBLE,
    )
    got, _ = _value_grad_torch(
        zoo.monai_sigmoid_focal, _torch([[-20.0]], "float32"), _torch([[0.0]], "float32", False)
    )
    ex = exact_sigmoid_focal(-20, 0, 2)
    tol = K * 2.0**-24 * (ex + sigmoid_focal_scale(-20, 0, 2))
    add(
        "monai_sigmoid_focal",
        "x=-20, t=0, float32",
        got,
        ex,
        f"error within the allowance K u (|f| + scale) = {float(tol):.3g}",
        abs(got - ex) <= tol,
    )

    # MONAI softmax: 0 * -inf at a masked class
    z = [[0.5, -math.inf, 1.0]]
    got, g = _value_grad_torch(zoo.monai_softmax_focal, _torch(z, "float32"), torch.tensor([0]))
    ex = exact_softmax_focal(z[0], 0, 2)
    add(
        "monai_softmax_focal",
        "z=(0.5, -inf, 1), y=0, float32",
        got,
        ex,
        "NaN where the loss is finite",
        math.isnan(got) and mp.isfinite(ex),
    )

    # pytorch-toolbelt focal: float64 computed in float32 overflows
    got, _ = _value_grad_torch(
        zoo.toolbelt_focal, _torch([[-1e307]], "float64"), _torch([[1.0]], "float64", False)
    )
    ex = exact_sigmoid_focal(-1e307, 1, 2, alpha=0.25)
    add(
        "toolbelt_focal",
        "x=-1e307, t=1, float64",
        got,
        ex,
        "non-finite where the loss is finite",
        not math.isfinite(got) and mp.isfinite(ex),
    )

    # pytorch-toolbelt softmax focal: a different loss
    z = [[1.0, 0.0, -1.0]]
    got, _ = _value_grad_torch(zoo.toolbelt_softmax_focal, _torch(z, "float64"), torch.tensor([0]))
    ex = exact_softmax_focal(z[0], 0, 2)
    add(
        "toolbelt_softmax_focal",
        "z=(1, 0, -1), y=0, float64",
        got,
        ex,
        "wrong at the result's scale",
        _rel(got, ex) > VISIBLE,
    )

    # pytorch-toolbelt label_smoothed_nll_loss: the mean over all rows, ignored ones included
    z = [[1.0, 0.0, -1.0], [0.0, 1.0, 2.0]]
    got, _ = _value_grad_torch(
        zoo.toolbelt_label_smoothed_nll, _torch(z, "float64"), torch.tensor([0, -100])
    )
    ex = exact_smoothed_ce(z[0], 0, 0.1)
    add(
        "toolbelt_label_smoothed_nll",
        "rows (1, 0, -1) y=0 and (0, 1, 2) ignored, float64",
        got,
        ex,
        "wrong at the result's scale (half the kept row's loss)",
        _rel(got, ex) > VISIBLE,
    )

    # MMDetection: 1 - sigmoid(20) rounds to 0 in float32, within the focal allowance
    got, _ = _value_grad_torch(
        zoo.mmdet_sigmoid_focal, _torch([[20.0]], "float32"), _torch([[1.0]], "float32", False)
    )
    ex = exact_sigmoid_focal(20, 1, 2, alpha=0.25)
    tol = K * 2.0**-24 * (ex + sigmoid_focal_scale(20, 1, 2, 0.25))
    add(
        "mmdet_sigmoid_focal",
        "x=20, t=1, float32",
        got,
        ex,
        f"error within the allowance K u (|f| + scale) = {float(tol):.3g}",
        abs(got - ex) <= tol,
    )
    got, _ = _value_grad_torch(
        zoo.mmdet_sigmoid_focal, _torch([[-1e307]], "float64"), _torch([[1.0]], "float64", False)
    )
    ex = exact_sigmoid_focal(-1e307, 1, 2, alpha=0.25)
    add(
        "mmdet_sigmoid_focal",
        "x=-1e307, t=1, float64",
        got,
        ex,
        "accurate to a few u (no cast)",
        _rel(got, ex) < 8 * 2.0**-53,
    )

    # timm LabelSmoothingCrossEntropy: inf at a masked class, as the exact loss
    z = [[0.5, -math.inf, 1.0]]
    got, g = _value_grad_torch(zoo.timm_label_smoothing, _torch(z, "float64"), torch.tensor([0]))
    ex = exact_smoothed_ce(z[0], 0, 0.1)
    add(
        "timm_label_smoothing",
        "z=(0.5, -inf, 1), y=0, float64",
        got,
        ex,
        "inf as the exact loss, finite gradient",
        math.isinf(got) and ex == mp.inf and np.isfinite(g).all(),
    )
    z = [[3.0, -2.0, 0.25, 1.0]]
    got, _ = _value_grad_torch(zoo.timm_label_smoothing, _torch(z, "float32"), torch.tensor([2]))
    ex = exact_smoothed_ce(z[0], 2, 0.1)
    add(
        "timm_label_smoothing",
        "z=(3, -2, 0.25, 1), y=2, float32",
        got,
        ex,
        "accurate to a few u",
        _rel(got, ex) < 8 * 2.0**-24,
    )

    # timm SoftTargetCrossEntropy: 0 * -inf
    z, q = [[0.5, -math.inf, 1.0]], [[0.5, 0.0, 0.5]]
    got, _ = _value_grad_torch(
        zoo.timm_soft_target, _torch(z, "float32"), _torch(q, "float32", False)
    )
    ex = exact_softmax_ce(z[0], q[0])
    add(
        "timm_soft_target",
        "z=(0.5, -inf, 1), q=(0.5, 0, 0.5), float32",
        got,
        ex,
        "NaN where the loss is finite",
        math.isnan(got) and mp.isfinite(ex),
    )

    # transformers, torchtune: 0 / 0 on an all-ignored batch, finite gradients
    for name in ("hf_masked_lm", "torchtune_chunked_ce"):
        got, g = _value_grad_torch(
            getattr(zoo, name),
            _torch([[0.5, 1.0, -1.0]] * 2, "float32"),
            torch.tensor([-100, -100]),
        )
        add(
            name,
            "2 rows, both targets -100, float32",
            got,
            mp.mpf(0),
            "NaN value (the spec's mean over no rows is 0), finite gradient",
            math.isnan(got) and np.isfinite(g).all(),
        )

    # t5x, flax wmt: 0 * -inf in the forward, finite backward; C = 1 raises
    for name in ("t5x_weighted_ce", "flax_wmt_weighted_ce"):
        f = getattr(zoo, name)
        z = [[0.5, -math.inf, 1.0]]
        got, g = _value_grad_jax(f, jnp.asarray(z, jnp.float32), jnp.asarray([0]))
        ex = exact_softmax_ce(z[0], [1, 0, 0])
        add(
            name,
            "z=(0.5, -inf, 1), y=0, float32",
            got,
            ex,
            "NaN where the loss is finite, finite gradient",
            math.isnan(got) and mp.isfinite(ex) and np.isfinite(g).all(),
        )
        try:
            f(jnp.asarray([[0.5]], jnp.float32), jnp.asarray([0]))
            raised = ""
        except ZeroDivisionError as e:
            raised = f"ZeroDivisionError: {e}"
        add(
            name,
            "C=1: z=(0.5,), y=0",
            raised or "no exception",
            mp.mpf(0),
            "raises ZeroDivisionError (the loss is 0)",
            bool(raised),
        )

    # big_vision softmax_xent: 0 * -inf
    z, q = [[0.5, -math.inf, 1.0]], [[0.5, 0.0, 0.5]]
    got, _ = _value_grad_jax(
        zoo.big_vision_softmax_xent, jnp.asarray(z, jnp.float32), jnp.asarray(q, jnp.float32)
    )
    ex = exact_softmax_ce(z[0], q[0])
    add(
        "big_vision_softmax_xent",
        "z=(0.5, -inf, 1), q=(0.5, 0, 0.5), float32",
        got,
        ex,
        "NaN where the loss is finite",
        math.isnan(got) and mp.isfinite(ex),
    )

    # big_vision sigmoid_xent: stable at large |x|
    x, t = [[-800.0, 800.0, 30.0, -30.0]], [[0.0, 1.0, 0.25, 1.0]]
    got, _ = _value_grad_jax(
        zoo.big_vision_sigmoid_xent, jnp.asarray(x, jnp.float32), jnp.asarray(t, jnp.float32)
    )
    ex = mp.fsum(exact_bce(a, b) for a, b in zip(x[0], t[0]))
    add(
        "big_vision_sigmoid_xent",
        "x=(-800, 800, 30, -30), t=(0, 1, 0.25, 1), float32",
        got,
        ex,
        "accurate to a few u",
        _rel(got, ex) < 8 * 2.0**-24,
    )
    return rows


def probes_after():
    """Probes written after the oracle ran, one per problem it found that the reading had missed
    (docs/zoo.md, "The oracle's verdicts"): each checks, without the oracle, that the problem is
    real."""
    import jax.numpy as jnp
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import zoo

    rows = []

    def add(name, where, got, exact, claim, holds):
        rows.append((name, where, got, exact, claim, bool(holds)))

    big = 1.7014117331926443e38  # about half float32's largest value, the oracle's margin

    z = [[-0.5526, -math.inf, -math.inf, -math.inf, -math.inf, -math.inf]]
    got, g = _value_grad_torch(zoo.toolbelt_softmax_focal, _torch(z, "float32"), torch.tensor([0]))
    ex = exact_softmax_focal(z[0], 0, 2)
    add(
        "toolbelt_softmax_focal",
        "z=(-0.55, -inf x 5), y=0, float32",
        got,
        ex,
        "NaN value and gradient where the loss is 0",
        math.isnan(got) and np.isnan(g).all() and ex == 0,
    )
    z = [[0.0, -big, -big, -big, -big]]
    for name in ("toolbelt_label_smoothed_nll", "timm_label_smoothing"):
        got, _ = _value_grad_torch(getattr(zoo, name), _torch(z, "float32"), torch.tensor([0]))
        ex = exact_smoothed_ce(z[0], 0, 0.1)
        add(
            name,
            "z=(0, -1.7e38 x 4), y=0, float32",
            got,
            ex,
            "inf where the loss is finite (the class sum overflows)",
            math.isinf(got) and mp.isfinite(ex) and ex < 3.4e38,
        )
    z = [[big] * 5]
    got, g = _value_grad_jax(zoo.t5x_weighted_ce, jnp.asarray(z, jnp.float32), jnp.asarray([0]))
    ex = exact_softmax_ce(z[0], [1, 0, 0, 0, 0])
    add(
        "t5x_weighted_ce",
        "z=(1.7e38 x 5), y=0, float32",
        got,
        ex,
        "NaN (0 * square(log_z) = 0 * inf) where the loss is log 5",
        math.isnan(got) and mp.isfinite(ex),
    )
    x, t = _torch([[1.0]], "float64"), _torch([[0.0]], "float64")
    zoo.monai_sigmoid_focal(x, t).backward()
    got = float(t.grad[0, 0])
    ex = mp.diff(lambda tt: exact_sigmoid_focal(1, tt, 2), 0)
    add(
        "monai_sigmoid_focal",
        "d/dt at x=1, t=0, float64",
        got,
        ex,
        "target gradient wrong at the result's scale (binary t)",
        _rel(got, ex) > VISIBLE,
    )
    return rows


def table(rows) -> str:
    lines = ["entry | input | library gives | exact (mpmath) | claim | holds"]
    for name, where, got, ex, claim, holds in rows:
        exact = mp.nstr(ex, 8) if isinstance(ex, mp.mpf) else str(ex)
        shown = got if isinstance(got, str) else f"{got:.8g}"
        lines.append(f"{name} | {where} | {shown} | {exact} | {claim} | {holds}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(probes()))
    print()
    print("written after the oracle ran:")
    print(table(probes_after()))
