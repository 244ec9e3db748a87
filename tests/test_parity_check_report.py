"""What a user of ``parity.check`` reads (issue 31): a failing test shows the whole report, the
reproducers run where the user's function lives, the decisive finding comes first, and a JAX check
takes seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dualloss.parity import check
from dualloss.parity._check import CHECK_REGIONS

torch = pytest.importorskip("torch")
F = torch.nn.functional
QUICK = {"dtypes": ["float32"], "max_examples": 0}


def nll_of_log_softmax(logits, targets):
    return F.nll_loss(F.log_softmax(logits, dim=1), targets)


def clamped_logits(logits, targets):
    return F.cross_entropy(logits.clamp(-1e3, 1e3), targets)


# ----------------------------------------------------------------------------------------------
# Item 4: a failing test shows the whole report
# ----------------------------------------------------------------------------------------------


def test_assert_ok_fails_a_pytest_test_with_every_line_of_the_report(tmp_path):
    written = tmp_path / "report.txt"
    test_file = tmp_path / "test_user_loss.py"
    test_file.write_text(
        textwrap.dedent(
            f"""
            import torch.nn.functional as F
            from dualloss.parity import check

            def my_clamped(logits, targets):
                return F.cross_entropy(logits.clamp(-1e3, 1e3), targets)

            def test_my_loss():
                report = check(my_clamped, "softmax_cross_entropy", backend="torch",
                               dtypes=["float32"], max_examples=0)
                open({str(written)!r}, "w").write(str(report))
                report.assert_ok()
            """
        )
    )
    # this checkout's dualloss, not an installed one
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    report = written.read_text()
    assert len(report) > 1000 and "reproduce: " in report
    shown = run.stdout
    for line in report.splitlines():
        assert line.strip() in shown, f"pytest's output lacks {line!r}:\n{shown}"


def test_assert_ok_returns_the_report_when_it_holds_and_raises_with_it_otherwise():
    sound = check(nll_of_log_softmax, "softmax_cross_entropy", backend="torch",
                  skip=("all_ignored_nan",), **QUICK)  # fmt: skip
    assert sound.assert_ok() is sound
    broken = check(clamped_logits, "softmax_cross_entropy", backend="torch", **QUICK)
    with pytest.raises(AssertionError) as raised:
        broken.assert_ok()
    assert str(raised.value).strip() == str(broken).strip()


def test_assert_passes_checks_and_raises_with_the_whole_report():
    from dualloss.parity import assert_passes

    with pytest.raises(AssertionError, match=r"(?s)FAILS.*reproduce: .*clamped_logits\(x, t\)"):
        assert_passes(clamped_logits, "softmax_cross_entropy", backend="torch", **QUICK)
    report = assert_passes(nll_of_log_softmax, "softmax_cross_entropy", backend="torch",
                           skip=("all_ignored_nan",), **QUICK)  # fmt: skip
    assert report.ok


# ----------------------------------------------------------------------------------------------
# Item 5: reproducers call the function the user passed, by its name
# ----------------------------------------------------------------------------------------------

MAIN_SOURCE = """
import torch
import torch.nn.functional as F

def my_focal(logits, targets):
    return F.cross_entropy(logits.clamp(-1e3, 1e3), targets)
"""


def test_reproducer_of_a_function_defined_in_main_runs_next_to_its_definition():
    namespace = {"__name__": "__main__"}
    exec(compile(MAIN_SOURCE, "<user's script>", "exec"), namespace)
    my_focal = namespace["my_focal"]
    assert my_focal.__module__ == "__main__"
    report = check(my_focal, "softmax_cross_entropy", backend="torch", **QUICK)
    assert not report.ok
    line = report.failures[0].reproducer
    assert "my_focal(x, t)" in line and "candidate" not in line, line
    # pasted into the user's script: only its own names are there
    exec(compile(line, "<reproducer>", "exec"), dict(namespace))


def test_reproducer_of_a_local_function_calls_it_by_its_name():
    def local_clamped(logits, targets):
        return F.cross_entropy(logits.clamp(-1e3, 1e3), targets)

    report = check(local_clamped, "softmax_cross_entropy", backend="torch", **QUICK)
    line = report.failures[0].reproducer
    assert "local_clamped(x, t)" in line, line
    exec(compile(line, "<reproducer>", "exec"), {"local_clamped": local_clamped})


def test_a_lambda_is_called_candidate_and_the_report_says_so():
    report = check(lambda x, t: F.cross_entropy(x.clamp(-1e3, 1e3), t), "softmax_cross_entropy",
                   backend="torch", **QUICK)  # fmt: skip
    assert "candidate(x, t)" in report.failures[0].reproducer
    assert "`candidate = <your function>`" in str(report)
    sound = check(nll_of_log_softmax, "softmax_cross_entropy", backend="torch",
                  skip=("all_ignored_nan",), **QUICK)  # fmt: skip
    assert "`candidate`" not in str(sound) and "candidate(x, t)" not in str(sound)


# ----------------------------------------------------------------------------------------------
# Item 7: a JAX check runs under jax.jit by default, and says what ran
# ----------------------------------------------------------------------------------------------


def _jax_focal(logits, targets):
    jax = pytest.importorskip("jax")
    log_pt = jax.numpy.take_along_axis(
        jax.nn.log_softmax(logits, axis=-1), targets[:, None], axis=-1
    )[:, 0]
    return (-((1 - jax.numpy.exp(log_pt)) ** 2) * log_pt).mean()


def _no_ignored_labels(logits, targets):
    """Eager-only: Python control flow on the (integer) targets, concrete eagerly, traced by jit."""
    jax = pytest.importorskip("jax")
    if bool(jax.numpy.any(targets < 0)):
        raise ValueError("no ignored labels")
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jax.numpy.take_along_axis(log_p, targets[..., None], axis=-1).mean()


def _float_of_logits(logits, targets):
    """float() on a value computed from the logits: autodiff traces them in either mode."""
    jax = pytest.importorskip("jax")
    if float(jax.numpy.max(logits)) > 1e30:
        return jax.numpy.nan
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jax.numpy.take_along_axis(log_p, targets[..., None], axis=-1).mean()


def test_a_jax_check_runs_under_jit_by_default_and_the_report_says_so():
    pytest.importorskip("jax")
    # the mode is the subject: the typical cases and a few Hypothesis examples suffice (JAX's
    # eager mode compiles every primitive for every shape)
    skip = tuple(r for r in CHECK_REGIONS if r != "typical")
    report = check(_jax_focal, "softmax_focal_loss", backend="jax", options={"gamma": 2.0},
                   dtypes=["float32"], max_examples=5, skip=skip)  # fmt: skip
    assert report.mode == "jit" and report.cases_judged > 0
    assert "ran: under jax.jit" in str(report)
    eager = check(_jax_focal, "softmax_focal_loss", backend="jax", options={"gamma": 2.0},
                  dtypes=["float32"], max_examples=0, skip=skip, jit=False)  # fmt: skip
    assert eager.mode == "eager" and "ran: eagerly, op by op (jit=False)" in str(eager)
    assert eager.cases_judged > 0


def test_an_eager_only_jax_candidate_runs_eagerly_and_the_report_says_why():
    pytest.importorskip("jax")
    report = check(_no_ignored_labels, "softmax_cross_entropy", backend="jax",
                   dtypes=["float32"], max_examples=0)  # fmt: skip
    assert report.mode == "eager"
    assert "jax.jit cannot trace the candidate (TracerBoolConversionError" in str(report)
    assert report.cases_judged > 0
    assert "ignored" in report.unsupported  # its ValueError, raised eagerly, is its own


def test_float_of_the_logits_fails_with_a_message_that_says_why():
    pytest.importorskip("jax")
    report = check(_float_of_logits, "softmax_cross_entropy", backend="jax",
                   dtypes=["float32"], max_examples=0)  # fmt: skip
    assert not report.ok
    (problem,) = report.failures[0].problems
    assert "ConcretizationTypeError" in problem and "it raises eagerly too" in problem, problem
    assert "jnp.where" in problem


# ----------------------------------------------------------------------------------------------
# Item 6: the decisive finding first, one entry per cause, no sub-ULP "ULP", scoped regions named
# ----------------------------------------------------------------------------------------------


def eps_focal(logits, targets):
    """-(1 - p)^2 log(softmax + 1e-8) at the target: 18.3 where the truth is 20.9 at margin 20,
    a gradient of -0.075 where it is -1, and a relative bias of ~1e-8 everywhere else."""
    p = F.softmax(logits, dim=1)
    log_pt = torch.log(p + 1e-8).gather(1, targets[:, None])[:, 0]
    pt = p.gather(1, targets[:, None])[:, 0]
    return (-((1 - pt) ** 2) * log_pt).mean()


def test_the_finding_at_the_results_scale_comes_first_and_one_cause_is_one_entry():
    report = check(eps_focal, "softmax_focal_loss", backend="torch", options={"gamma": 2.0},
                   max_examples=20)  # fmt: skip
    first = report.hazards[0]
    assert first.consequence == "wrong at the result's scale"
    assert first.region in ("confident_wrong", "confident_correct", "classes")
    assert first.failure.scaled_error > 0.05
    text = str(report)
    entries = [line for line in text.splitlines() if line[:1].isdigit()]
    assert entries[0].startswith("1. [wrong at the result's scale]"), text
    # the ~1e-8 bias in every other region is one entry, below the decisive one
    assert len(entries) == 2 and entries[1].startswith("2. [accuracy]"), text
    assert len(text.splitlines()) <= 40, text
    assert len(report.hazards) > len(entries)  # every region's reproducer is still kept


def test_a_failure_where_the_spec_gives_zero_is_not_counted_in_ulps_of_one():
    from dualloss.parity import judge

    logits = np.array([[0.5, -np.inf, -np.inf]])  # one finite class: p = 1, loss 0, gradient 0
    grad = np.array([[1e-24, 0.0, 0.0]])
    judgement = judge("softmax_focal_loss", logits, np.array([0]),
                      {"gamma": 2.0, "reduction": "none"}, "float64", np.array([0.0]), grad,
                      standard="practical")  # fmt: skip
    (problem,) = judgement.inaccurate
    assert "ULP" not in problem and "the spec gives exactly 0 here" in problem, problem


def one_hot_times_log_softmax(logits, targets):
    """NaN where a logit is -inf: 0 * -inf, the classic of masked logits."""
    one_hot = F.one_hot(targets, logits.shape[1]).movedim(-1, 1).to(logits.dtype)
    return -(one_hot * F.log_softmax(logits, dim=1)).sum(1).mean()


def rounded_targets_bce(logits, targets):
    """Right for targets 0 and 1 (value and gradients), wrong for soft targets."""
    hard = (targets == 0.0) | (targets == 1.0)
    return F.binary_cross_entropy_with_logits(logits, torch.where(hard, targets, targets.round()))


def test_a_failure_only_with_masked_logits_names_the_skip_that_scopes_it():
    report = check(one_hot_times_log_softmax, "softmax_cross_entropy", backend="torch", **QUICK)
    assert not report.ok and {h.region for h in report.hazards} == {"masked"}
    text = " ".join(str(report).split())
    assert "only with -inf logits (class masks)" in text, text
    assert "skip=('masked', 'masked_soft')" in text and "torch.finfo(dtype).min" in text


def test_a_failure_only_with_soft_targets_names_binary_targets():
    report = check(rounded_targets_bce, "sigmoid_cross_entropy", backend="torch", **QUICK)
    assert not report.ok
    text = " ".join(str(report).split())
    assert "only with soft targets" in text and "binary_targets=True" in text, text
    assert check(rounded_targets_bce, "sigmoid_cross_entropy", backend="torch",
                 binary_targets=True, **QUICK).ok  # fmt: skip
