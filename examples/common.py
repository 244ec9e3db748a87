"""What the torch and the JAX runs share: data, initial weights, batch order, records, tables.

Both frameworks start from the same float32 weights (drawn here with NumPy, then cast to the run's
dtype) and see the same batches in the same order, so the runs differ only in the loss, the dtype
and the framework.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SIZES = (64, 256, 10)  # the MLP: 64 pixels, one hidden ReLU layer of 256, 10 digits
LR = 0.5
BATCH = 128
SEED = 0
STEPS = 2000
DTYPES = ("float32", "float16", "bfloat16")
LAYERS = ("hidden", "out")

# (key, legend label, gamma): the three losses each framework trains with
LOSSES = (
    ("classic", "classic log(softmax) + gather, γ=2", 2.0),
    ("textbook", "textbook log_softmax, γ=0.5", 0.5),
    ("dualloss", "dualloss softmax_focal_loss, γ=2", 2.0),
)


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (shipped with it, no download), pixels scaled to [0, 1].

    Returns ``x_train, y_train, x_test, y_test``: a stratified 75/25 split, float32 and int64.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, stratify=y, random_state=SEED
    )
    return x_train, y_train, x_test, y_test


def init_params(seed: int = SEED) -> dict[str, np.ndarray]:
    """He-uniform weights and zero biases, float32, named as torch names them.

    ``"hidden.weight"`` and ``"out.weight"`` are stored (in, out), JAX's layout; torch's
    ``nn.Linear`` takes their transpose.
    """
    rng = np.random.default_rng(seed)
    params = {}
    for layer, n_in, n_out in zip(LAYERS, SIZES[:-1], SIZES[1:], strict=True):
        bound = math.sqrt(6.0 / n_in)
        params[f"{layer}.weight"] = rng.uniform(-bound, bound, (n_in, n_out)).astype(np.float32)
        params[f"{layer}.bias"] = np.zeros(n_out, np.float32)
    return params


def batch_indices(n_train: int, steps: int, seed: int = SEED) -> np.ndarray:
    """(steps, BATCH) row indices: shuffled epochs, concatenated, cut into batches."""
    rng = np.random.default_rng(seed + 1)
    epochs = -(-steps * BATCH // n_train)
    order = np.concatenate([rng.permutation(n_train) for _ in range(epochs)])
    return order[: steps * BATCH].reshape(steps, BATCH)


@dataclass
class Run:
    """One training run: per-step loss and gradient norm (float64) and where it died."""

    framework: str
    loss: str
    dtype: str
    steps: int
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    died_at: int | None = None  # first step (1-based) after which a weight is non-finite
    died_in: str | None = None  # the parameter(s) that went non-finite first
    train_accuracy: float | None = None  # None: dead (non-finite weights)
    test_accuracy: float | None = None
    seconds: float = 0.0


@dataclass
class OracleVerdict:
    """What ``dualloss.parity.check`` said about one hand-written loss before training."""

    framework: str
    loss: str
    ok: bool
    reproducer: str | None
    seconds: float


def accuracy(logits: np.ndarray, y: np.ndarray) -> float | None:
    """Fraction of correct argmaxes; None when the network outputs non-finite logits."""
    logits = np.asarray(logits, np.float32)
    if not np.all(np.isfinite(logits)):
        return None
    return float(np.mean(np.argmax(logits, axis=1) == y))


def table(runs: list[Run]) -> str:
    """The README's markdown table: one row per loss, one column per dtype, for each framework."""
    dtypes = [d for d in DTYPES if any(r.dtype == d for r in runs)]
    head = "| framework | loss | " + " | ".join(dtypes) + " |"
    lines = [head, "|" + "---|" * (2 + len(dtypes))]
    frameworks = list(dict.fromkeys(r.framework for r in runs))
    for framework in frameworks:
        for key, label, _ in LOSSES:
            cells = []
            for dtype in dtypes:
                match = [
                    r for r in runs if (r.framework, r.loss, r.dtype) == (framework, key, dtype)
                ]
                cells.append(_cell(match[0]) if match else "")
            if any(cells):
                lines.append(f"| {framework} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(run: Run) -> str:
    if run.died_at is not None:
        return f"**NaN at step {run.died_at}**"
    return f"finite, test acc. {run.test_accuracy:.3f}"


def summary_line(run: Run) -> str:
    """One line per run for the console."""
    if run.died_at is not None:
        fate = f"non-finite weights after step {run.died_at} ({run.died_in})"
    else:
        fate = f"finite for {run.steps} steps"
    if run.test_accuracy is None:
        acc = "dead (non-finite outputs)"
    else:
        acc = f"accuracy: train {run.train_accuracy:.3f}, test {run.test_accuracy:.3f}"
    return f"{run.framework:5s} {run.dtype:8s} {run.loss:8s}  {fate}; {acc}  ({run.seconds:.1f} s)"


def first_reproducer(report) -> str | None:
    """The reproducer of the smallest failure, a non-finite one if there is one (an inaccurate
    value is a failure too, but NaN is what ends a training run)."""
    failures = list(report.failures)
    non_finite = [f for f in failures if "finite" in str(getattr(f, "kind", ""))]
    chosen = (non_finite or failures or [None])[0]
    return None if chosen is None else chosen.reproducer


def oracle_line(verdict: OracleVerdict) -> str:
    """The oracle's verdict on one hand-written loss, with its reproducer."""
    if verdict.ok:
        return f"oracle, {verdict.framework} {verdict.loss}: passes ({verdict.seconds:.1f} s)"
    return (
        f"oracle, {verdict.framework} {verdict.loss}: FLAGGED before training "
        f"({verdict.seconds:.1f} s); reproduce with:\n    {verdict.reproducer}"
    )


# the hand-written losses have no ignore_index: the oracle leaves those regions out
NOT_IMPLEMENTED = ("ignored", "all_ignored")


def oracle(backend: str, loss_fns: dict, full: bool = False, **check_kwargs) -> list[OracleVerdict]:
    """``dualloss.parity.check`` on the two hand-written losses of `backend`, before training.

    Quick by default (float32, adversarial cases only); ``full=True`` adds float64 and the
    Hypothesis search. `check_kwargs` go to ``check`` as they are (e.g. ``jit=True``).
    """
    from dualloss.parity import check

    kwargs = dict(check_kwargs)
    if not full:
        kwargs.update(dtypes=["float32"], max_examples=0)
    verdicts = []
    for loss, gamma in (("classic", 2.0), ("textbook", 0.5)):
        start = time.perf_counter()
        report = check(
            loss_fns[loss],
            "softmax_focal_loss",
            skip=NOT_IMPLEMENTED,
            backend=backend,
            options={"gamma": gamma},
            **kwargs,
        )
        reproducer = first_reproducer(report)
        seconds = time.perf_counter() - start
        verdicts.append(OracleVerdict(backend, loss, report.ok, reproducer, seconds))
    return verdicts


def main(
    description: str,
    train_all: Callable[[int, list[str]], list[Run]],
    oracle: Callable[..., list[OracleVerdict]],
    argv=None,
) -> list[Run]:
    """The command line of one framework's script: train, print the runs, the oracle, the table."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    parser.add_argument("--full-oracle", action="store_true", help="float64 and Hypothesis too")
    args = parser.parse_args(argv)
    runs = train_all(args.steps, args.dtypes)
    for run in runs:
        print(summary_line(run))
    for verdict in oracle(full=args.full_oracle):
        print(oracle_line(verdict))
    print(table(runs))
    return runs
