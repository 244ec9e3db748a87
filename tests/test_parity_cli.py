"""The command line and the pytest fixture."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from dualloss import spec
from dualloss.parity import peers as parity_peers
from dualloss.parity.__main__ import main
from dualloss.parity.backends import Implementation

pytest.importorskip("torch")


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--dtypes", "float8"])
    assert info.value.code == 2
    assert "--dtypes must be among" in capsys.readouterr().err


def test_check_needs_module_function(capsys):
    with pytest.raises(SystemExit) as info:
        main(["check", "nocolon", "--reference", "sigmoid_cross_entropy", "--backend", "torch"])
    assert info.value.code == 2
    assert "MODULE:FUNCTION" in capsys.readouterr().err


def test_check_sound_loss_exits_0(capsys):
    code = main(["check", "torch.nn.functional:binary_cross_entropy_with_logits",
                 "--reference", "sigmoid_cross_entropy", "--backend", "torch",
                 "--dtypes", "float32", "--max-examples", "5"])  # fmt: skip
    assert code == 0, capsys.readouterr().out


def test_check_buggy_loss_exits_1(tmp_path, monkeypatch, capsys):
    (tmp_path / "buggy_loss.py").write_text(
        textwrap.dedent("""
        import torch
        def loss(x, t, gamma=0.5):
            p = torch.sigmoid(x)
            p_t = p * t + (1 - p) * (1 - t)
            ce = torch.nn.functional.binary_cross_entropy_with_logits(x, t, reduction="none")
            return (ce * (1 - p_t) ** gamma).mean()
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["check", "buggy_loss:loss", "--reference", "sigmoid_focal_loss",
                 "--backend", "torch", "--option", "gamma=0.5", "--dtypes", "float32",
                 "--max-examples", "0"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1
    assert "from buggy_loss import loss" in out


def _spec_sigmoid_cross_entropy(scale):
    """A torch candidate computing spec.sigmoid_cross_entropy (mean) in float64 and rounding it
    once: meets every standard when `scale` is 1; off by `scale` (a planted bug) otherwise."""
    import torch

    class SpecLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, t):
            ctx.save_for_backward(x, t)
            value = spec.sigmoid_cross_entropy(x.double().numpy(), t.double().numpy())
            return torch.tensor(value * scale, dtype=x.dtype)

        @staticmethod
        def backward(ctx, g):
            x, t = ctx.saved_tensors
            grad = spec.sigmoid_cross_entropy_grad(x.double().numpy(), t.double().numpy())
            return g * torch.from_numpy(grad * scale).to(x.dtype), None

    def defaults_only(options, array):
        # the candidate implements the default options only: other cases are skipped
        if set(options) - {"reduction"} or options.get("reduction", "mean") != "mean":
            return None
        return {}

    return Implementation(f"spec x {scale}", "torch", "sigmoid_cross_entropy", SpecLoss.apply,
                          defaults_only, "", lambda kw: "candidate(x, t)")  # fmt: skip


@pytest.mark.parametrize(("scale", "expected"), [(1.0, 0), (1.0 + 2.0**-10, 1)])
def test_run_exit_status_and_report_follow_the_verdict(scale, expected, tmp_path, monkeypatch,
                                                       capsys):  # fmt: skip
    # the only candidate: the spec rounded once (must pass), or 1 + 2^-10 times it (must fail:
    # a relative error of 2^-10, 8192 ULP of float32, in every value and gradient entry)
    monkeypatch.setattr(parity_peers, "available_peers",
                        lambda backends: [_spec_sigmoid_cross_entropy(scale)])  # fmt: skip
    code = main(["run", "--only-peers", "--backends", "torch", "--dtypes", "float32", "--losses",
                 "sigmoid_cross_entropy", "--report", str(tmp_path), "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == expected, out[-3000:]
    assert "worst err/tol" in out
    data = json.loads((tmp_path / "parity.json").read_text())
    assert data["records"] and data["ok"] == (expected == 0)
    assert {r["impl"] for r in data["records"]} == {f"spec x {scale}"}
    assert (tmp_path / "report.md").exists()
    assert any(name.endswith(".png") for name in os.listdir(tmp_path))


@pytest.mark.parametrize(("scale", "expected"), [(1.0, 0), (1.0 + 2.0**-10, 1)])
def test_run_judges_the_fused_linear_losses(scale, expected, tmp_path, monkeypatch, capsys):
    # `run` includes the fused linear losses (parity.linear); a loss off by a relative 2^-10
    # (8192 ULP of float32) must fail there too
    from dualloss.parity import linear

    ours = linear.ours

    def scaled(*args):
        fn = ours(*args)
        return lambda *inputs: fn(*inputs) * scale

    monkeypatch.setattr(linear, "ours", scaled)
    code = main(["run", "--backends", "torch", "--dtypes", "float32", "--losses",
                 "linear_softmax_cross_entropy", "--regions", "typical,all_ignored",
                 "--report", str(tmp_path), "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == expected, out[-3000:]
    data = json.loads((tmp_path / "parity.json").read_text())
    records = data["records"]
    assert {(r["loss"], r["region"]) for r in records} == {
        ("linear_softmax_cross_entropy", "typical"),
        ("linear_softmax_cross_entropy", "all_ignored"),
    }
    assert len(records) == 4  # two regions x (plain, mean) and (weights + smoothing, none)
    assert data["ok"] == (expected == 0)


@pytest.mark.slow
def test_python_dash_m_runs():
    out = subprocess.run([sys.executable, "-m", "dualloss.parity", "--help"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "run" in out.stdout and "check" in out.stdout


def test_loss_oracle_fixture(loss_oracle):
    import torch.nn.functional as F

    report = loss_oracle(F.binary_cross_entropy_with_logits, "sigmoid_cross_entropy",
                         backend="torch", dtypes=["float32"], max_examples=5)  # fmt: skip
    assert report.ok, report


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: one space each


def test_smoke_help_lists_every_step(capsys):
    from dualloss.parity import smoke

    text = _help(["smoke", "--help"], capsys)
    missing = [step for step in smoke.STEPS if step not in text]
    assert not missing, f"`smoke --help` does not name {missing}: {text}"


def test_run_help_lists_every_region_and_loss(capsys):
    from dualloss import losses

    text = _help(["run", "--help"], capsys)
    names = [*losses.REGIONS, *losses.LINEAR_REGIONS, *losses.NAMES, *losses.LINEAR_NAMES]
    missing = [name for name in names if name not in text]
    assert not missing, f"`run --help` does not name {missing}: {text}"


def test_quick_run_time_is_one_figure_in_help_readme_and_docs(capsys):
    from dualloss.parity.__main__ import QUICK_RUN_TIME

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert QUICK_RUN_TIME in _help(["run", "--help"], capsys)
    for name in ("README.md", os.path.join("docs", "parity.md")):
        with open(os.path.join(root, name), encoding="utf-8") as f:
            lines = f.read().splitlines()
        text = " ".join(" ".join(lines).split())
        assert QUICK_RUN_TIME in text, f"{name} does not give the quick run's time as the CLI does"
        # no other figure beside a quick run's command ('# ~2 min on 2 CPU cores')
        stale = [line for line in lines if "run --quick" in line
                 and re.search(r"\d\s*min", line) and QUICK_RUN_TIME not in line]  # fmt: skip
        assert not stale, f"{name}: {stale}"
