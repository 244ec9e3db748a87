"""Reports of a parity run: a terminal summary, a JSON file, a Markdown page with plots."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict

import numpy as np

from .. import losses
from .runner import RunResult

COLUMNS = ("loss", "backend", "dtype", "device", "mode")


def _group(records, keys):
    groups = defaultdict(list)
    for r in records:
        groups[tuple(getattr(r, k) for k in keys)].append(r)
    return groups


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"


def summary_rows(result: RunResult, keys=("loss", "impl", "dtype", "device", "mode")):
    """One row per group: cases, worst ULP, worst err/tol, non-finite, accuracy, errors."""
    rows = []
    for key, records in sorted(_group(result.records, keys).items()):
        judged = [r for r in records if r.kind in ("ok", "non-finite", "accuracy")]
        worst = max(judged, key=lambda r: r.ratio, default=None)
        rows.append({
            **dict(zip(keys, key, strict=True)),
            "cases": len(records),
            "worst_ulp": max((max(r.value_ulp, r.grad_ulp) for r in judged), default=0.0),
            "worst_ratio": worst.ratio if worst else 0.0,
            "worst_case": worst.case if worst else "",
            "non_finite": sum(r.kind == "non-finite" for r in records),
            "accuracy": sum(r.kind == "accuracy" for r in records),
            "errors": sum(r.kind == "error" for r in records),
        })  # fmt: skip
    return rows


def _table(rows, keys, markdown=False):
    headers = [*keys, "cases", "worst ULP", "worst err/tol", "non-finite", "accuracy", "errors"]
    body = [
        [str(r[k]) for k in keys]
        + [
            str(r["cases"]),
            _fmt(r["worst_ulp"]),
            _fmt(r["worst_ratio"]),
            str(r["non_finite"]),
            str(r["accuracy"]),
            str(r["errors"]),
        ]  # fmt: skip
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h)
              for i, h in enumerate(headers)]  # fmt: skip
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def terminal_summary(result: RunResult, max_failures: int = 10) -> str:
    keys = ("loss", "impl", "dtype", "device", "mode")
    out = [_table(summary_rows(result, keys), keys)]
    nonfinite = [f for f in result.failures if f.kind == "non-finite"]
    accuracy = [f for f in result.failures if f.kind == "accuracy"]
    errors = [f for f in result.failures if f.kind == "error"]
    for title, group in (("Non-finite failures", nonfinite), ("Accuracy failures", accuracy),
                         ("Errors", errors)):  # fmt: skip
        if group:
            out.append(f"\n{title} ({len(group)}; first {min(len(group), max_failures)}):")
            out += [f.describe() for f in group[:max_failures]]
    if result.diagnostics:
        out.append("\nLargest differences between implementations / devices / modes (diagnostic):")
        for d in result.diagnostics[:5]:
            out.append(f"  {d['loss']} {d['dtype']}: {d['pair']}: {_fmt(d['max_ulp'])} ULP "
                       f"({d['case']})")  # fmt: skip
    for note in result.notes:
        out.append(f"note: {note}")
    verdict = "PARITY HOLDS" if result.ok else "PARITY FAILS"
    out.append(
        f"\n{verdict}: {len(result.records)} judged calls, {len(nonfinite)} non-finite, "
        f"{len(accuracy)} accuracy, {len(errors)} errors, {result.seconds:.0f}s"
    )
    return "\n".join(out)


def write_json(result: RunResult, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result.to_json(), f, indent=1)


# ----------------------------------------------------------------------------------------------
# Plots and Markdown
# ----------------------------------------------------------------------------------------------


def _plots(result: RunResult, directory: str) -> list[tuple[str, str]]:
    """(title, file) of each plot written; none when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    margin_records = [r for r in result.records if r.region.startswith("confident")
                      and "hidden" not in r.case and r.kind != "error"]  # fmt: skip
    for loss, records in sorted(_group(margin_records, ("loss",)).items()):
        fig, ax = plt.subplots(figsize=(7, 4))
        for (impl, dtype), rs in sorted(_group(records, ("impl", "dtype")).items()):
            xs = [r.margin for r in rs]
            ys = [r.ratio if r.kind != "non-finite" else np.nan for r in rs]
            ax.scatter(xs, np.maximum(ys, 1e-6), s=12, label=f"{impl} {dtype}", alpha=0.7)
            bad = [r.margin for r in rs if r.kind == "non-finite"]
            if bad:
                ax.scatter(bad, [1e3] * len(bad), marker="x", color="red", s=25)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xscale("symlog", linthresh=20)
        ax.set_yscale("log")
        ax.set_xlabel("target logit margin (negative: confidently wrong)")
        ax.set_ylabel("worst error / tolerance (x: non-finite)")
        ax.set_title(f"{loss[0]}: error vs margin")
        ax.legend(fontsize=6, ncol=2)
        name = f"margin_{loss[0]}.png"
        fig.tight_layout()
        fig.savefig(os.path.join(directory, name), dpi=90)
        plt.close(fig)
        written.append((f"{loss[0]}: error vs margin", name))
    focal = [r for r in margin_records if losses.get(r.loss).is_focal]
    for (loss, impl), records in sorted(_group(focal, ("loss", "impl")).items()):
        margins = sorted({r.margin for r in records})
        gammas = sorted({r.gamma for r in records})
        grid = np.zeros((len(gammas), len(margins)))
        count = np.zeros_like(grid)
        for r in records:
            i, j = gammas.index(r.gamma), margins.index(r.margin)
            grid[i, j] += r.kind == "non-finite"
            count[i, j] += 1
        with np.errstate(invalid="ignore"):
            frac = grid / count
        fig, ax = plt.subplots(figsize=(7, 2.5))
        ax.imshow(frac, aspect="auto", cmap="Reds", vmin=0, vmax=1)
        ax.set_xticks(range(len(margins)), [f"{m:.2g}" for m in margins], rotation=60, fontsize=6)
        ax.set_yticks(range(len(gammas)), [f"{g:g}" for g in gammas], fontsize=7)
        ax.set_xlabel("margin")
        ax.set_ylabel("gamma")
        ax.set_title(f"non-finite map: {impl} {loss} (fraction of dtypes)", fontsize=8)
        name = f"nonfinite_{loss}_{impl}.png".replace(" ", "_").replace("(", "").replace(")", "")
        fig.tight_layout()
        fig.savefig(os.path.join(directory, name), dpi=90)
        plt.close(fig)
        written.append((f"non-finite map {impl} {loss}", name))
    return written


def write_markdown(result: RunResult, directory: str) -> str:
    """report.md (+ PNG plots) in `directory`; returns the path."""
    os.makedirs(directory, exist_ok=True)
    plots = _plots(result, directory)
    keys = ("loss", "impl", "dtype", "device", "mode")
    lines = ["# dualloss parity report", ""]
    lines.append(f"Verdict: **{'parity holds' if result.ok else 'parity FAILS'}** - "
                 f"{len(result.records)} judged calls in {result.seconds:.0f}s.")  # fmt: skip
    lines.append("")
    lines.append(f"Configuration: `{json.dumps(result.config)}`")
    lines.append("")
    lines.append(
        "Tolerance: `dualloss/parity/tolerance.py` (docstring: the derivation). ULPs are of "
        "the candidate's dtype at the reference value; err/tol > 1 is a failure."
    )
    lines += ["", "## Summary", "", _table(summary_rows(result, keys), keys, markdown=True)]
    region_keys = ("loss", "impl", "dtype", "region")
    lines += ["", "## By region", "",
              _table(summary_rows(result, region_keys), region_keys, markdown=True)]  # fmt: skip
    lines += ["", "## Failures", ""]
    if not result.failures:
        lines.append("None.")
    for kind in ("non-finite", "accuracy", "error"):
        group = [f for f in result.failures if f.kind == kind]
        if group:
            lines += [f"### {kind} ({len(group)})", ""]
            for f in group:
                lines += ["```", f.describe(), "```", ""]
    lines += ["", "## Diagnostics: differences between implementations, devices, modes", ""]
    lines.append(
        "Largest difference per pair on identical inputs, in ULPs of the dtype "
        "(inf: one side non-finite). Informative only: each side is judged on its own."
    )
    lines += ["", "| loss | dtype | pair | max ULP | case |", "|---|---|---|---|---|"]
    for d in result.diagnostics[:40]:
        lines.append(f"| {d['loss']} | {d['dtype']} | {d['pair']} | {_fmt(d['max_ulp'])} | "
                     f"{d['case']} |")  # fmt: skip
    if plots:
        lines += ["", "## Plots", ""]
        for title, name in plots:
            lines += [f"### {title}", "", f"![{title}]({name})", ""]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
