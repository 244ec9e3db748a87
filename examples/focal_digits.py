"""Focal loss on digits, torch and JAX: the README's figure and table in one command.

    python -m examples.focal_digits                # writes focal-digits-out/training-digits.png
    python -m examples.focal_digits --update-docs  # rewrites docs/training-digits.png
    python -m examples.focal_digits --steps 300 --dtypes float16 --out /tmp/quick

Runs ``examples.train_torch`` and ``examples.train_jax`` (2000 steps each of the three losses in
float32, float16 and bfloat16), asks ``dualloss.parity.check`` about the two hand-written losses,
prints one line per run, the oracle's verdicts with a reproducer each, and the markdown table;
then draws the loss curves, with the step where each run died marked.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from . import common, train_jax, train_torch
from .common import Run

FIGURE = "docs/training-digits.png"  # the README's figure: written only with --update-docs
OUT = "focal-digits-out"  # untracked (.gitignore)
COLORS = {"classic": "#d62728", "textbook": "#ff7f0e", "dualloss": "#1f77b4"}
# classic and dualloss compute the same loss (gamma 2), so their curves coincide until the
# classic one dies: dualloss is drawn first, wide, and the classic one dashed on top of it
ORDER = ("dualloss", "textbook", "classic")
STYLE = {"classic": dict(linewidth=1.6, linestyle=(0, (4, 2))), "textbook": dict(linewidth=1.8),
         "dualloss": dict(linewidth=3.0)}  # fmt: skip
SMOOTH = 25  # steps in the running mean drawn over the raw per-step loss


def _running_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` values (fewer at the start)."""
    cumsum = np.concatenate([[0.0], np.cumsum(values)])
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    ends = np.arange(1, len(values) + 1)
    return (cumsum[ends] - cumsum[ends - counts]) / counts


def plot(runs: list[Run], path: str, steps: int) -> None:
    """Loss curves, one panel per (framework, dtype), with a cross where a run died."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frameworks = list(dict.fromkeys(r.framework for r in runs))
    dtypes = [d for d in common.DTYPES if any(r.dtype == d for r in runs)]
    fig, axes = plt.subplots(
        len(frameworks), len(dtypes), figsize=(4.4 * len(dtypes), 3.5 * len(frameworks) + 1.1),
        sharex=True, sharey=True, squeeze=False,
    )  # fmt: skip
    finite = np.concatenate([np.asarray(r.losses)[np.isfinite(r.losses)] for r in runs])
    floor = max(float(np.min(finite[finite > 0])), 1e-6)
    for row, framework in enumerate(frameworks):
        for col, dtype in enumerate(dtypes):
            ax = axes[row, col]
            ax.set_title(f"{framework} · {dtype}", fontsize=12, fontweight="bold")
            for key in ORDER:
                label = dict((k, text) for k, text, _ in common.LOSSES)[key]
                match = [
                    r for r in runs if (r.framework, r.loss, r.dtype) == (framework, key, dtype)
                ]
                if not match:
                    continue
                run = match[0]
                loss = np.asarray(run.losses, np.float64)
                shown = np.clip(np.where(np.isfinite(loss), loss, np.nan), floor, None)
                x = np.arange(1, len(loss) + 1)
                ax.plot(x, shown, color=COLORS[key], alpha=0.15, linewidth=0.5)
                smooth = _running_mean(np.nan_to_num(shown, nan=floor), SMOOTH)
                ax.plot(x, smooth, color=COLORS[key], label=label, **STYLE[key])
                if run.died_at is not None:
                    y = smooth[-1]
                    ax.plot(run.died_at, y, marker="X", markersize=13, color=COLORS[key],
                            markeredgecolor="black", zorder=5)  # fmt: skip
                    ax.annotate(
                        f"NaN at step {run.died_at}", (run.died_at, y), xytext=(8, 6),
                        textcoords="offset points", fontsize=10, color=COLORS[key],
                        fontweight="bold",
                    )  # fmt: skip
            ax.set_yscale("log")
            ax.set_xlim(0, steps)
            ax.grid(True, which="major", alpha=0.3)
            if row == len(frameworks) - 1:
                ax.set_xlabel("SGD step")
            if col == 0:
                ax.set_ylabel("training loss (batch of 128)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    order = [labels.index(label) for _, label, _ in common.LOSSES if label in labels]
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=11, frameon=False)
    fig.suptitle(
        "Focal loss on scikit-learn digits, 64-256-10 MLP, SGD lr 0.5: "
        "weights in each dtype, no loss scaling",
        fontsize=13,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_path(out: str, update_docs: bool) -> str:
    """Where the figure goes: the tracked docs/training-digits.png only when asked to update the
    docs, else training-digits.png in `out` (created)."""
    if update_docs:
        return FIGURE
    os.makedirs(out, exist_ok=True)
    return os.path.join(out, "training-digits.png")


def main(argv=None) -> list[Run]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=common.STEPS)
    parser.add_argument("--dtypes", nargs="+", default=list(common.DTYPES))
    parser.add_argument(
        "--out", default=OUT, help=f"directory for the figure, training-digits.png (default {OUT})"
    )
    parser.add_argument(
        "--update-docs", action="store_true", help=f"write the README's figure, {FIGURE}, instead"
    )
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--full-oracle", action="store_true", help="float64 and Hypothesis too")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    runs = train_torch.train_all(args.steps, args.dtypes) + train_jax.train_all(
        args.steps, args.dtypes
    )
    for run in runs:
        print(common.summary_line(run))
    print("\nThe oracle, on the hand-written losses, before any training:")
    for verdict in train_torch.oracle(full=args.full_oracle) + train_jax.oracle(
        full=args.full_oracle
    ):
        print(common.oracle_line(verdict))
    print()
    print(common.table(runs))
    if not args.no_plot:
        path = figure_path(args.out, args.update_docs)
        plot(runs, path, args.steps)
        print(f"\nfigure: {path}")
    print(f"total: {time.perf_counter() - start:.0f} s")
    return runs


if __name__ == "__main__":
    main()
