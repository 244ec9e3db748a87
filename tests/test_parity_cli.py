"""The command line and the pytest fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dualloss.parity.__main__ import main

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


def test_run_report_torch_subset(tmp_path, capsys):
    code = main(["run", "--backends", "torch", "--dtypes", "float32", "--losses",
                 "sigmoid_cross_entropy", "--peers", "--report", str(tmp_path),
                 "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert "worst err/tol" in out
    data = json.loads((tmp_path / "parity.json").read_text())
    assert data["records"] and code == (0 if data["ok"] else 1)
    assert (tmp_path / "report.md").exists()
    assert any(name.endswith(".png") for name in os.listdir(tmp_path))


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
