"""Reports of a parity run: a terminal summary, a JSON file, a Markdown page with plots."""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict

import numpy as np

from .. import losses
from .runner import JUDGED, RunResult

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
        judged = [r for r in records if r.kind in JUDGED]
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
    """err/tol leads: it is the verdict (> 1 fails). Raw ULP counts are left to parity.json:
    near a zero reference they run to 1e15 inside the tolerance and alarm readers for nothing."""
    headers = [*keys, "worst err/tol", "cases", "non-finite", "accuracy", "errors", "worst case"]
    body = [
        [str(r[k]) for k in keys]
        + [
            _fmt(r["worst_ratio"]),
            str(r["cases"]),
            str(r["non_finite"]),
            str(r["accuracy"]),
            str(r["errors"]),
            r["worst_case"] if r["worst_ratio"] > 0.01 else "",
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


def verdict(result: RunResult) -> str:
    """HOLDS only when everything asked for was judged; NOT VERIFIED when something (an
    implementation, a device, a mode) was not, or compiling failed; FAILS on a failing call."""
    if result.ok:
        return "PARITY HOLDS"
    errors = any(r.kind == "error" for r in result.records)
    if result.judged and (result.failures or errors):
        return "PARITY FAILS"
    return "PARITY NOT VERIFIED"


def terminal_summary(result: RunResult, max_failures: int = 10) -> str:
    keys = ("loss", "impl", "dtype", "device", "mode")
    out = [
        "worst err/tol: the largest error / tolerance of any judged call in the row (> 1 fails;"
        " dualloss/parity/tolerance.py derives the tolerance)",
        _table(summary_rows(result, keys), keys),
    ]
    nonfinite = [f for f in result.failures if f.kind == "non-finite"]
    accuracy = [f for f in result.failures if f.kind == "accuracy"]
    errors = [f for f in result.failures if f.kind == "error"]
    for title, group in (("Non-finite failures", nonfinite), ("Accuracy failures", accuracy),
                         ("Errors", errors)):  # fmt: skip
        if group:
            out.append(f"\n{title} ({len(group)}; first {min(len(group), max_failures)}):")
            out += [f.describe() for f in group[:max_failures]]
    if result.diagnostics:
        out.append(
            "\nLargest differences between implementations / devices / modes (diagnostic only:"
            " each side is judged on its own; ULPs at the array's largest entry, so arrays that"
            " are ~0, e.g. 1e-87 at margin 200, give huge counts for harmless differences):"
        )
        for d in result.diagnostics[:5]:
            out.append(f"  {d['loss']} {d['dtype']}: {d['pair']}: {_fmt(d['max_ulp'])} ULP "
                       f"({d['case']})")  # fmt: skip
    for note in result.notes:
        out.append(f"note: {note}")
    for name in result.unavailable:
        out.append(f"NOT JUDGED: {name} could not be loaded (see the notes)")
    for entry in result.compile_failures:
        out.append(f"COMPILE FAILURE (torch.compile, not the loss; eager works): {entry}")
    for entry in result.untested:
        out.append(f"NOT TESTED: {entry}")
    for line in result.unsupported_lines():
        out.append(f"UNSUPPORTED (not judged): {line}")
    config = result.config
    if config.get("devices"):
        out.append(f"devices: {', '.join(config['devices'])}")
    if config.get("precision"):
        out.append("precision: " + ", ".join(f"{k}={v}" for k, v in config["precision"].items()))
    out.append(
        f"\n{verdict(result)}: {result.judged} judged calls, {len(nonfinite)} non-finite, "
        f"{len(accuracy)} accuracy, {len(errors)} errors, {result.seconds:.0f}s"
    )
    return "\n".join(out)


def write_json(result: RunResult, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result.to_json(), f, indent=1)


# ----------------------------------------------------------------------------------------------
# Plots and Markdown
# ----------------------------------------------------------------------------------------------


_NOMINAL_MARGIN = re.compile(r"margin=([^ \]]+)")


def _nominal_margin(record) -> float | None:
    """The margin the case was generated for ('margin=800' in its name), signed: negative when
    confidently wrong; None for cases without one (hidden batches, other regions)."""
    found = _NOMINAL_MARGIN.search(record.case)
    if not found or "[row" in record.case:
        return None
    margin = float(found.group(1))
    return -margin if record.region == "confident_wrong" else margin


REPORT_EXTRA = "pip install 'dualloss[report]'"
OVERVIEW_TITLE = "overview: worst error / tolerance per implementation and region"


def _pyplot():
    """(matplotlib.pyplot on the Agg backend (files only), None), or (None, why) when
    matplotlib cannot be imported."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        return None, str(error)
    return plt, None


def _margin_records(result: RunResult) -> list:
    """The judged records of the confident regions that carry a nominal margin."""
    return [r for r in result.records if r.region.startswith("confident")
            and _nominal_margin(r) is not None and r.kind != "error"]  # fmt: skip


def margin_figure(loss: str, records, plt):
    """Error / tolerance against the target margin, one panel per confident region (the margins
    in order, evenly spaced), one marker per implementation x dtype, non-finite calls as red x
    at the top, the failure line at 1 drawn. Returns the matplotlib Figure."""
    floor = 1e-4
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    groups = sorted(_group(records, ("impl", "dtype")).items())
    order = sorted({abs(_nominal_margin(r)) for r in records})
    markers = "osD^v<>ph*"
    for ax, region in zip(axes, ("confident_correct", "confident_wrong"), strict=True):
        for n, ((impl, dtype), rs) in enumerate(groups):
            rs = [r for r in rs if r.region == region]
            finite = [r for r in rs if r.kind != "non-finite"]
            xs = [order.index(abs(_nominal_margin(r))) for r in finite]
            ys = [max(r.ratio, floor) for r in finite]
            ax.scatter(xs, ys, s=18, alpha=0.7, marker=markers[n % len(markers)],
                       label=f"{impl} {dtype}")  # fmt: skip
            bad = [order.index(abs(_nominal_margin(r))) for r in rs if r.kind == "non-finite"]
            if bad:
                ax.scatter(bad, [3e2] * len(bad), marker="x", color="red", s=40,
                           label=f"{impl} {dtype}: non-finite")  # fmt: skip
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.text(1.02, 1.0, " fails above", transform=ax.get_yaxis_transform(), fontsize=7,
                va="center")  # fmt: skip
        # the margins in order, evenly spaced: they run from 20 to 1e307 (a log axis would
        # squash the interesting 20 .. 800, and matplotlib's overflow near 1e308)
        names = [f"{m:g}" if m < 1e4 else f"{m:.2g}" for m in order]
        ax.set_xticks(range(len(order)), names, rotation=45, fontsize=7)
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, 1e3)
        ax.set_xlabel("target logit margin (increasing difficulty)")
        what = "target leads" if region == "confident_correct" else "target trails"
        ax.set_title(f"{region}: {what} by the margin", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel(f"worst error / tolerance (floor {floor:g})")
    handles, labels = axes[0].get_legend_handles_labels()
    # the right panel may hold entries the left lacks (non-finite only there)
    for handle, label in zip(*axes[1].get_legend_handles_labels(), strict=True):
        if label not in labels:
            handles.append(handle)
            labels.append(label)
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, frameon=False)
    fig.suptitle(f"{loss}: error / tolerance vs margin (x at the top: non-finite)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.1 + 0.03 * (len(labels) // 4), 1, 1))
    return fig


def _focal_margin_groups(margin_records) -> dict:
    focal = [r for r in margin_records if losses.get(r.loss).is_focal]
    return dict(sorted(_group(focal, ("loss", "impl")).items()))


def planned_plots(result: RunResult) -> list[tuple[str, str]]:
    """(title, file) of each plot the report of `result` draws when matplotlib is installed."""
    planned = []
    if any(r.kind != "skipped" for r in result.records):
        planned.append((OVERVIEW_TITLE, "overview.png"))
    margin_records = _margin_records(result)
    for (loss,) in sorted(_group(margin_records, ("loss",))):
        planned.append((f"{loss}: error / tolerance vs margin", f"margin_{loss}.png"))
    for loss, impl in _focal_margin_groups(margin_records):
        planned.append((f"non-finite map {impl} {loss}", _nonfinite_name(loss, impl)))
    return planned


def plots_not_drawn(result: RunResult) -> str | None:
    """One sentence naming the plots of `result` that cannot be drawn, and why (matplotlib is
    missing); None when they can all be drawn."""
    plt, why = _pyplot()
    planned = planned_plots(result)
    if plt is not None or not planned:
        return None
    names = ", ".join(name for _, name in planned)
    return (
        f"{len(planned)} plots not drawn ({names}): matplotlib cannot be imported ({why});"
        f" {REPORT_EXTRA} installs it"
    )


def _plots(result: RunResult, directory: str) -> list[tuple[str, str]]:
    """(title, file) of each plot written; none when matplotlib is missing (plots_not_drawn
    says so)."""
    plt, _ = _pyplot()
    if plt is None:
        return []
    written = []
    overview = _overview_plot(result, directory, plt)
    if overview:
        written.append(overview)
    margin_records = _margin_records(result)
    for (loss,), records in sorted(_group(margin_records, ("loss",)).items()):
        fig = margin_figure(loss, records, plt)
        name = f"margin_{loss}.png"
        fig.savefig(os.path.join(directory, name), dpi=90, bbox_inches="tight")
        plt.close(fig)
        written.append((f"{loss}: error / tolerance vs margin", name))
    for (loss, impl), records in _focal_margin_groups(margin_records).items():
        written.append(_nonfinite_map(loss, impl, records, directory, plt))
    return written


def nonfinite_figure(loss, impl, records, plt):
    """Signed margin x gamma: the fraction of dtypes (and modes) whose call was non-finite, grey
    where nothing ran, with a colour bar. Returns the matplotlib Figure."""
    margins = sorted({_nominal_margin(r) for r in records})
    gammas = sorted({r.gamma for r in records})
    bad = np.zeros((len(gammas), len(margins)))
    count = np.zeros_like(bad)
    for r in records:
        i, j = gammas.index(r.gamma), margins.index(_nominal_margin(r))
        bad[i, j] += r.kind == "non-finite"
        count[i, j] += 1
    with np.errstate(invalid="ignore"):
        fraction = np.where(count > 0, bad / np.maximum(count, 1), np.nan)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.35 * len(gammas)))
    cmap = plt.get_cmap("Reds").with_extremes(bad="lightgrey")
    image = ax.imshow(np.ma.masked_invalid(fraction), aspect="auto", cmap=cmap, vmin=0, vmax=1)
    names = [f"{m:g}" if abs(m) < 1e4 else f"{m:.2g}" for m in margins]
    ax.set_xticks(range(len(margins)), names, rotation=60, fontsize=6)
    ax.set_yticks(range(len(gammas)), [f"{g:g}" for g in gammas], fontsize=7)
    ax.set_xlabel("target margin (negative: confidently wrong)", fontsize=8)
    ax.set_ylabel("gamma", fontsize=8)
    total = int(bad.sum())
    ax.set_title(f"non-finite map: {impl} {loss}: {total} of {int(count.sum())} calls "
                 "non-finite (grey: not run)", fontsize=8)  # fmt: skip
    bar = fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    bar.set_label("fraction of dtypes/modes\nnon-finite", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    fig.tight_layout()
    return fig


def _nonfinite_name(loss: str, impl: str) -> str:
    return f"nonfinite_{loss}_{impl}.png".replace(" ", "_").replace("(", "").replace(")", "")


def _nonfinite_map(loss, impl, records, directory, plt) -> tuple[str, str]:
    fig = nonfinite_figure(loss, impl, records, plt)
    name = _nonfinite_name(loss, impl)
    fig.savefig(os.path.join(directory, name), dpi=90, bbox_inches="tight")
    plt.close(fig)
    return (f"non-finite map {impl} {loss}", name)


def overview_figure(result: RunResult, plt):
    """One cell per (loss x implementation, region): the worst err/tol over dtypes, devices and
    modes, colour on a log scale with the value written in; red text beyond 1, 'NaN' where a
    call was non-finite, 'ERR' where one raised. Returns the Figure, or None with no records."""
    records = [r for r in result.records if r.kind != "skipped"]
    if not records:
        return None
    rows = sorted({(r.loss, r.impl) for r in records})
    regions = [g for g in losses.REGIONS if any(r.region == g for r in records)]
    regions += sorted({r.region for r in records} - set(regions))
    worst = np.full((len(rows), len(regions)), np.nan)
    label = np.full(worst.shape, "", dtype=object)
    for (loss, impl, region), rs in _group(records, ("loss", "impl", "region")).items():
        i, j = rows.index((loss, impl)), regions.index(region)
        worst[i, j] = max((r.ratio for r in rs), default=0.0)
        if any(r.kind == "non-finite" for r in rs):
            label[i, j] = "NaN"
        elif any(r.kind == "error" for r in rs):
            label[i, j] = "ERR"
        else:
            label[i, j] = _fmt(worst[i, j])
    # wide enough for the title and the colour bar's label also when few regions ran
    fig, ax = plt.subplots(figsize=(max(6.5, 2.5 + 0.75 * len(regions)), 1.6 + 0.4 * len(rows)))
    shown = np.log10(np.clip(worst, 1e-4, 1e2))
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
    image = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", cmap=cmap, vmin=-4, vmax=2)
    for i in range(len(rows)):
        for j in range(len(regions)):
            bad = label[i, j] in ("NaN", "ERR") or (worst[i, j] > 1.0)
            ax.text(
                j,
                i,
                label[i, j],
                ha="center",
                va="center",
                fontsize=6,
                color="red" if bad else "white",
                fontweight="bold" if bad else None,
            )
    ax.set_xticks(range(len(regions)), regions, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{impl}  {loss}" for loss, impl in rows], fontsize=7)
    bar = fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    bar.set_label("log10 worst error / tolerance\n(> 0 fails; grey: not run)", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    ax.set_title("overview: worst error / tolerance per implementation and region\n"
                 "(over dtypes, devices, modes)", fontsize=8)  # fmt: skip
    fig.tight_layout()
    return fig


def _overview_plot(result: RunResult, directory: str, plt) -> tuple[str, str] | None:
    fig = overview_figure(result, plt)
    if fig is None:
        return None
    name = "overview.png"
    fig.savefig(os.path.join(directory, name), dpi=90, bbox_inches="tight")
    plt.close(fig)
    return (OVERVIEW_TITLE, name)


def write_markdown(result: RunResult, directory: str) -> str:
    """report.md (+ PNG plots) in `directory`; returns the path."""
    os.makedirs(directory, exist_ok=True)
    plots = _plots(result, directory)
    keys = ("loss", "impl", "dtype", "device", "mode")
    lines = ["# dualloss parity report", ""]
    lines.append(f"Verdict: **{verdict(result)}** - "
                 f"{len(result.records)} judged calls in {result.seconds:.0f}s.")  # fmt: skip
    lines.append("")
    lines.append(f"Configuration: `{json.dumps(result.config)}`")
    lines.append("")
    lines.append(
        "Tolerance: `dualloss/parity/tolerance.py` (docstring: the derivation). err/tol is the "
        "worst error divided by the tolerance of any call in the row; > 1 is a failure. Raw ULP "
        "counts are in parity.json only: near a zero reference they are huge inside the "
        "tolerance."
    )
    lines += ["", "## Summary", "", _table(summary_rows(result, keys), keys, markdown=True)]
    region_keys = ("loss", "impl", "dtype", "region")
    lines += ["", "## By region", "",
              _table(summary_rows(result, region_keys), region_keys, markdown=True)]  # fmt: skip
    lines += ["", "## Failures", ""]
    if not result.failures:
        lines.append("None.")
    for kind in ("non-finite", "writes input", "accuracy", "error"):
        group = [f for f in result.failures if f.kind == kind]
        if group:
            lines += [f"### {kind} ({len(group)})", ""]
            for f in group:
                lines += ["```", f.describe(), "```", ""]
    if result.unsupported:
        lines += ["", "## Unsupported options", ""]
        lines.append(
            "Options an implementation does not take, or refuses with an exception where the "
            "same call without them works: those calls are not judged (a peer's is not a "
            "failure; dualloss's own backends take every option, so theirs leaves the run not "
            "holding)."
        )
        lines += [""] + [f"- {line}" for line in result.unsupported_lines()]
    lines += ["", "## Diagnostics: differences between implementations, devices, modes", ""]
    lines.append(
        "Largest difference per pair on identical inputs, in ULPs of the dtype "
        "(inf: one side non-finite). Informative only: each side is judged on its own."
    )
    lines += ["", "| loss | dtype | pair | max ULP | case |", "|---|---|---|---|---|"]
    for d in result.diagnostics[:40]:
        lines.append(f"| {d['loss']} | {d['dtype']} | {d['pair']} | {_fmt(d['max_ulp'])} | "
                     f"{d['case']} |")  # fmt: skip
    not_drawn = plots_not_drawn(result)
    if plots or not_drawn:
        lines += ["", "## Plots", ""]
        for title, name in plots:
            lines += [f"### {title}", "", f"![{title}]({name})", ""]
        if not_drawn:
            lines.append(f"**Not drawn**: {not_drawn}.")
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
