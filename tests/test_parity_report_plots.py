"""The parity report's figures (``dualloss-parity run --report DIR``): written as real PNGs for a
tiny run, and built with the axes, labels, legends and titles that report.py promises (the
figure objects are inspected, not only the files)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from dualloss.parity import backends as B
from dualloss.parity import report, runner

torch = pytest.importorskip("torch")
matplotlib = pytest.importorskip("matplotlib")
F = torch.nn.functional
LOSS = "softmax_focal_loss"
PLOTS = {"overview.png", f"margin_{LOSS}.png", f"nonfinite_{LOSS}_torch_impl.png",
         f"nonfinite_{LOSS}_readme_focal.png"}  # fmt: skip


def readme_focal(x, t, gamma=2.0):
    """log(softmax): the classic NaN-gradient focal loss, so the figures have non-finite marks."""
    log_pt = torch.log(F.softmax(x, dim=1)).gather(1, t[:, None])[:, 0]
    return (-((1 - log_pt.exp()) ** gamma) * log_pt).mean()


def _readme_kwargs(options, array):
    plain = options.get("reduction", "mean") == "mean" and options.get("alpha") is None
    plain = plain and not options.get("label_smoothing") and options.get("where") is None
    return {"gamma": options.get("gamma", 2.0)} if plain else None


READMEISH = B.Implementation(
    "readme_focal", "torch", LOSS, lambda x, t, gamma=2.0: readme_focal(x, t, gamma),
    _readme_kwargs, "", lambda kw: "readme_focal(x, t)",
    supports=lambda prep: prep.case.index_targets and prep.logits.ndim == 2
    and not (prep.case.targets < 0).any(),
)  # fmt: skip


@pytest.fixture(scope="module")
def result():
    return runner.run_matrix(
        [B.ours("torch", LOSS), READMEISH], dtypes=["float32"],
        regions=["typical", "confident_correct", "confident_wrong"], progress=False,
    )  # fmt: skip


@pytest.fixture()
def plt():
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    yield plt
    plt.close("all")


def test_the_run_has_what_the_figures_show(result):
    kinds = {(r.impl, r.kind) for r in result.records}
    assert ("readme_focal", "non-finite") in kinds and ("torch_impl", "ok") in kinds
    assert len({r.gamma for r in result.records if r.region.startswith("confident")}) >= 2


def test_report_writes_every_figure_as_a_nonempty_png(result, tmp_path):
    from matplotlib.image import imread

    path = report.write_markdown(result, str(tmp_path))
    text = open(path).read()
    names = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert set(names) == PLOTS
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        assert len(data) > 5_000, (name, len(data))
        image = imread(tmp_path / name)
        assert image.shape[0] > 150 and image.shape[1] > 400, (name, image.shape)
        assert image[..., :3].std() > 0.05, f"{name} is blank"


def test_report_without_matplotlib_names_the_plots_it_could_not_draw_and_why(
    result, tmp_path, monkeypatch
):
    # a misspelt extra (`.[torch,jax,reprot]`) leaves matplotlib out: the report must say so
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    text = open(report.write_markdown(result, str(tmp_path))).read()
    assert not list(tmp_path.glob("*.png"))
    [line] = [line for line in text.splitlines() if "Not drawn" in line]
    assert all(name in line for name in PLOTS), line
    assert "matplotlib" in line and "pip install 'dualloss[report]'" in line, line


def test_run_without_matplotlib_says_on_stderr_which_plots_it_could_not_draw(
    tmp_path, monkeypatch, capsys
):
    from dualloss.parity.__main__ import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    main(["run", "--backends", "torch", "--dtypes", "float32", "--losses", LOSS, "--regions",
          "confident_correct", "--report", str(tmp_path), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert "plots not drawn" in err and f"margin_{LOSS}.png" in err, err
    assert "pip install 'dualloss[report]'" in err, err
    assert not list(tmp_path.glob("*.png"))


def test_report_with_matplotlib_says_nothing_is_missing(result, tmp_path):
    assert report.plots_not_drawn(result) is None
    text = open(report.write_markdown(result, str(tmp_path))).read()
    assert "Not drawn" not in text


def test_margin_figure_has_both_regions_labelled_the_failure_line_and_a_legend(result, plt):
    records = [r for r in report._margin_records(result) if r.loss == LOSS]
    fig = report.margin_figure(LOSS, records, plt)
    left, right = fig.axes
    assert left.get_title().startswith("confident_correct: target leads")
    assert right.get_title().startswith("confident_wrong: target trails")
    for ax in (left, right):
        assert ax.get_xlabel() == "target logit margin (increasing difficulty)"
        assert ax.get_yscale() == "log"
        assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines())
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks[0] == "20" and ticks[-1].endswith("e+38"), ticks
    assert left.get_ylabel().startswith("worst error / tolerance")
    [legend] = fig.legends
    labels = {t.get_text() for t in legend.get_texts()}
    assert {"torch_impl float32", "readme_focal float32", "readme_focal float32: non-finite"} <= (
        labels
    ), labels
    assert LOSS in fig._suptitle.get_text()


def test_margin_legend_names_a_non_finite_series_that_only_the_right_panel_has(plt):
    def record(region, kind):
        return runner.Record(LOSS, "late_nan", "torch", "cpu", "eager", "float32", region,
                             f"{region}/margin=800", kind, ratio=0.1)  # fmt: skip

    records = [record("confident_correct", "ok"), record("confident_wrong", "non-finite")]
    fig = report.margin_figure(LOSS, records, plt)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["late_nan float32", "late_nan float32: non-finite"], labels


def test_nonfinite_map_counts_the_calls_and_has_a_colour_bar(result, plt):
    records = [r for r in report._margin_records(result) if r.impl == "readme_focal"]
    fig = report.nonfinite_figure(LOSS, "readme_focal", records, plt)
    ax, bar = fig.axes
    bad = sum(r.kind == "non-finite" for r in records)
    assert 0 < bad < len(records)
    assert f"{bad} of {len(records)} calls non-finite" in ax.get_title()
    assert ax.get_ylabel() == "gamma"
    assert ax.get_xlabel() == "target margin (negative: confidently wrong)"
    assert "non-finite" in bar.get_ylabel()
    shown = ax.get_images()[0].get_array()
    gammas = sorted({r.gamma for r in records})
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{g:g}" for g in gammas]
    assert shown.shape == (len(gammas), len({report._nominal_margin(r) for r in records}))
    assert float(np.ma.sum(shown)) == bad  # one dtype and one mode per cell: fractions 0 or 1


def test_overview_marks_non_finite_cells_and_labels_rows_and_regions(result, plt):
    fig = report.overview_figure(result, plt)
    ax, bar = fig.axes
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == [f"readme_focal  {LOSS}", f"torch_impl  {LOSS}"], rows
    regions = [t.get_text() for t in ax.get_xticklabels()]
    assert regions == ["typical", "confident_correct", "confident_wrong"], regions
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}
    assert cells[(0, 1)].get_text() == "NaN" and cells[(0, 1)].get_color() == "red"
    assert all(cells[(1, j)].get_color() == "white" for j in range(3))  # ours: within tolerance
    assert "log10 worst error / tolerance" in bar.get_ylabel()
    assert ax.get_title().startswith("overview: worst error / tolerance")
    assert report.overview_figure(runner.RunResult(), plt) is None
