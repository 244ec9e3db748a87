"""``dualloss.parity.check`` as a user meets it: the practical standard, feature probes, refusals,
short reports. Each test pairs a known-sound implementation (must pass) with a known bug (must
fail), so that neither direction can drift."""

from __future__ import annotations

import numpy as np
import pytest

import dualloss.parity
from dualloss.parity import check, judge
from dualloss.parity.__main__ import main

torch = pytest.importorskip("torch")
F = torch.nn.functional
FAST = {"dtypes": ["float32"], "max_examples": 10}


def _problems(report):
    return {(h.failure.kind, h.region) for h in report.hazards}


# ----------------------------------------------------------------------------------------------
# Candidates
# ----------------------------------------------------------------------------------------------


def textbook_focal(logits, targets, gamma=2.0):
    """F.log_softmax + gather + (1 - p) ** gamma: sound for gamma >= 1, no ignore_index."""
    log_p = F.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    return (-((1 - log_p.exp()) ** gamma) * log_p).mean()


def readme_focal(logits, targets):
    """The README's example: log(softmax), the classic NaN-gradient bug."""
    p = F.softmax(logits, dim=1)
    log_pt = torch.log(p).gather(1, targets[:, None])[:, 0]
    return (-((1 - log_pt.exp()) ** 2) * log_pt).mean()


def nll_of_log_softmax(logits, targets):
    return F.nll_loss(F.log_softmax(logits, dim=1), targets)


def log_p_plus_eps(logits, targets):
    """log(p + 1e-8): 18.4 where a confidently wrong row's loss is 100, a vanishing gradient."""
    return F.nll_loss(torch.log(F.softmax(logits, dim=1) + 1e-8), targets)


def clamped_logits(logits, targets):
    return F.cross_entropy(logits.clamp(-1e3, 1e3), targets)


def always_raises(logits, targets):
    raise RuntimeError("not implemented")


def index_targets_only(logits, targets):
    if targets.is_floating_point():
        raise TypeError("class-index targets only")
    return F.cross_entropy(logits, targets)


def nan_on_ignored(logits, targets):
    """Handles ignore_index by producing NaN instead of raising: a hazard, not a missing feature."""
    loss = F.cross_entropy(logits, targets.clamp(min=0), reduction="none")
    return torch.where(targets < 0, torch.nan, loss).mean()


def capped_categorical_focal(logits, targets):
    """Keras 3 style: probability targets only, softmax clipped to [1e-7, 1 - 1e-7] (the loss
    stops at -log 1e-7 = 16.1 where the truth at margin 100 is 100, and the gradient vanishes).
    A torch emulation of the formula; the real keras.losses.categorical_focal_crossentropy is
    judged in tests/test_keras_focal.py."""
    if not targets.is_floating_point():
        raise TypeError("probability targets only")
    p = F.softmax(logits, dim=1).clamp(1e-7, 1 - 1e-7)
    return (-(targets * (1 - p) ** 2 * torch.log(p)).sum(1)).mean()


# ----------------------------------------------------------------------------------------------
# 1. check stays the function
# ----------------------------------------------------------------------------------------------


def test_check_is_the_function_on_every_call():
    for _ in range(2):
        report = dualloss.parity.check(F.binary_cross_entropy_with_logits,
                                       "sigmoid_cross_entropy", backend="torch",
                                       dtypes=["float32"], max_examples=0)  # fmt: skip
        assert report.ok, report
    from dualloss.parity import check as again

    assert callable(again) and again is dualloss.parity.check


# ----------------------------------------------------------------------------------------------
# 2. The practical standard: sound code passes, bugs fail
# ----------------------------------------------------------------------------------------------


def test_lse_minus_target_logit_at_800_float32_is_within_what_input_rounding_implies():
    # what optax computes: lse(z) - z_y, each step correctly rounded in float32: hundreds of ULPs
    # off log 2, and within the spread that moving the inputs by one ULP causes (both standards)
    z = np.array([[800.0, 800.0]], dtype=np.float32)
    lse = np.float32(800.0) + np.log1p(np.exp(np.float32(0.0), dtype=np.float32))
    value = np.float32(lse - z[0, 0])
    args = ("softmax_cross_entropy", z.astype(float), np.array([0]), {}, "float32", value)
    assert judge(*args, standard="practical").worst_value_ulp > 100
    assert judge(*args, standard="practical").ok
    assert judge(*args, standard="strict").ok


def test_a_confident_rows_loss_returned_as_zero_passes_practical_not_strict():
    # F.cross_entropy in float32 at margin 20: log(1 + s) rounds the loss 2e-9 to 0 (users' code
    # passes: below u x the row's size; dualloss's own backends must keep it)
    z = np.array([[20.0, 0.0]])
    args = ("softmax_cross_entropy", z, np.array([0]), {}, "float32", 0.0)
    assert judge(*args, standard="practical").ok
    assert not judge(*args, standard="strict").ok


def test_optax_integer_labels_at_logits_of_800_passes():
    optax = pytest.importorskip("optax")
    fn = lambda x, t: optax.softmax_cross_entropy_with_integer_labels(x, t).mean()  # noqa: E731
    # JAX cannot raise on an ignored label (it returns NaN), so the user leaves them out
    report = check(fn, "softmax_cross_entropy", backend="jax", dtypes=["float32"],
                   skip=("ignored", "all_ignored"), max_examples=10)  # fmt: skip
    assert report.ok, report
    strict = check(fn, "softmax_cross_entropy", backend="jax", dtypes=["float32"],
                   skip=("ignored", "all_ignored"), max_examples=0, standard="strict")  # fmt: skip
    # strict: the tiny losses of confident rows come back 0 (log(1 + s), not log1p(s)); the
    # huge shift is within what moving the inputs by one ULP causes
    assert ("accuracy", "confident_correct") in _problems(strict)
    assert ("accuracy", "huge_shift") not in _problems(strict)


@pytest.mark.parametrize("gamma", [1.0, 2.0])
def test_textbook_focal_passes_with_ignored_labels_unsupported(gamma):
    fn = lambda x, t: textbook_focal(x, t, gamma)  # noqa: E731
    report = check(fn, "softmax_focal_loss", backend="torch", options={"gamma": gamma}, **FAST)
    assert report.ok, report
    assert {"ignored", "all_ignored", "prob"} <= set(report.unsupported)
    assert "masked" not in report.unsupported
    assert "ignored labels" in str(report)


def test_textbook_focal_gamma_half_is_flagged():
    # d (1 - p) ** 0.5 at p = 1 is inf: a hazard, whatever the standard
    fn = lambda x, t: textbook_focal(x, t, 0.5)  # noqa: E731
    report = check(fn, "softmax_focal_loss", backend="torch", options={"gamma": 0.5}, **FAST)
    assert "non-finite" in {h.failure.kind for h in report.hazards}


def test_nll_loss_of_log_softmax_passes():
    # its mean over an all-ignored batch is torch's NaN (0 / 0): the named hazard of issue 28,
    # which the user accepts here
    report = check(nll_of_log_softmax, "softmax_cross_entropy", backend="torch",
                   dtypes=["float32", "float64"], max_examples=10,
                   skip=("all_ignored_nan",))  # fmt: skip
    assert report.ok, report
    ours = check(nll_of_log_softmax, "softmax_cross_entropy", backend="torch",
                 dtypes=["float32"], max_examples=0, standard="strict")  # fmt: skip
    assert ("non-finite", "all_ignored") in _problems(ours)


def test_log_of_p_plus_eps_fails_at_its_own_scale():
    report = check(log_p_plus_eps, "softmax_cross_entropy", backend="torch", **FAST)
    assert ("accuracy", "confident_wrong") in _problems(report), report
    [wrong] = [h.failure for h in report.hazards if h.region == "confident_wrong"]
    # the loss stops at -log(1e-8) = 18.42 where the truth is larger
    assert wrong.received_value <= 18.43 < wrong.expected_value


def test_clamping_logits_fails():
    report = check(clamped_logits, "softmax_cross_entropy", backend="torch", **FAST)
    assert ("accuracy", "confident_wrong") in _problems(report), report
    assert ("accuracy", "confident_correct") in _problems(report), report


# ----------------------------------------------------------------------------------------------
# 3. Feature probing
# ----------------------------------------------------------------------------------------------


def test_candidate_that_always_raises_is_not_ok():
    report = check(always_raises, "softmax_cross_entropy", backend="torch", **FAST)
    assert not report.ok
    assert report.failures[0].kind == "error"
    assert "raised on every input" in str(report)
    assert report.cases_judged == 0


def test_index_only_candidate_is_judged_on_the_rest():
    report = check(index_targets_only, "softmax_cross_entropy", backend="torch", **FAST)
    assert set(report.unsupported) == {"prob"}
    assert report.cases_judged > 20
    assert "unsupported: probability targets (TypeError: class-index targets only)" in str(report)


def test_nan_on_a_feature_is_a_hazard_not_unsupported():
    report = check(nan_on_ignored, "softmax_cross_entropy", backend="torch", **FAST)
    assert "ignored" not in report.unsupported
    assert ("non-finite", "ignored") in _problems(report), report


def test_binary_only_sigmoid_candidate():
    def binary_only(x, t):
        if bool(((t != 0) & (t != 1)).any()):
            raise ValueError("targets must be 0 or 1")
        return F.binary_cross_entropy_with_logits(x, t)

    probed = check(binary_only, "sigmoid_cross_entropy", backend="torch", **FAST)
    assert probed.ok and set(probed.unsupported) == {"soft"}, probed
    declared = check(binary_only, "sigmoid_cross_entropy", backend="torch", binary_targets=True,
                     **FAST)  # fmt: skip
    assert declared.ok and not declared.unsupported, declared
    assert declared.cases_judged >= probed.cases_judged


# ----------------------------------------------------------------------------------------------
# 4. Probability targets at large margins
# ----------------------------------------------------------------------------------------------


def test_probability_targets_only_candidate_is_judged_at_large_margins():
    report = check(capped_categorical_focal, "softmax_focal_loss", backend="torch",
                   options={"gamma": 2.0}, **FAST)  # fmt: skip
    assert "index" in report.unsupported
    assert ("accuracy", "confident_wrong") in _problems(report), report


def test_margin_regions_carry_one_hot_and_smoothed_targets():
    from dualloss.parity._check import adversarial_cases

    cases = adversarial_cases("softmax_focal_loss", "float32", {"gamma": 2.0})
    margins = [c for c in cases if c.region == "confident_wrong" and not c.index_targets]
    assert any(c.label.endswith("one-hot") for c in margins)
    smoothed = [c for c in margins if c.label.endswith("smoothed")]
    assert smoothed and all(np.allclose(c.targets.sum(-1), 1.0) for c in smoothed)
    assert all(c.targets.max() < 1.0 for c in smoothed)


# ----------------------------------------------------------------------------------------------
# 5. Refusals
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"options": {"gama": 2.0}}, ValueError, r"`options` has 'gama', which spec"),
        ({"options": {"reduction": "avg"}}, ValueError, r"`reduction` must be one of"),
        ({"options": {"gamma": -1.0}}, ValueError, r"`gamma` must be a finite number >= 0"),
        ({"skip": ("ignroed",)}, ValueError, r"`skip` entries must be among .* 'ignroed'"),
        ({"dtypes": ["float8"]}, ValueError, r"`dtypes` entries must be among .* 'float8'"),
        ({"standard": "lenient"}, ValueError, r"`standard` must be .* standard='lenient'"),
        ({"options": {"axis": 1}}, ValueError, r"`options` must not contain 'axis'"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        check(textbook_focal, "softmax_focal_loss", backend="torch", **kwargs)


def test_cli_usage_errors_exit_2(capsys):
    for extra in (["--option", "gama=2.0"], ["--skip", "ignroed"], ["--dtypes", "float8"]):
        with pytest.raises(SystemExit) as info:
            main(["check", "torch.nn.functional:cross_entropy", "--reference",
                  "softmax_cross_entropy", "--backend", "torch", *extra])  # fmt: skip
        assert info.value.code == 2, extra
    assert "'float8'" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# 6. Reports
# ----------------------------------------------------------------------------------------------


def test_readme_example_report_fits_one_screen_nan_first():
    report = check(readme_focal, "softmax_focal_loss", backend="torch", options={"gamma": 2.0})
    text = str(report)
    assert not report.ok
    assert len(text.splitlines()) <= 60, text
    assert report.failures[0].kind == "non-finite"
    assert "nan" in report.failures[0].problems[0]
    assert text.index("non-finite") < text.index("Unsupported")
    assert "np.float64" not in text and "np.int64" not in text
    assert "gamma=0.0" not in text and "gamma=0.5" not in text  # labels show the options used
    assert "float32" in text and "float64" in text  # every requested dtype ran
    assert report.examples_run > 0
    kinds_regions = [(h.failure.kind, h.region) for h in report.hazards]
    assert len(kinds_regions) == len(set(kinds_regions)), "one reproducer per kind x region"


def test_stop_at_first_stops():
    report = check(readme_focal, "softmax_focal_loss", backend="torch", options={"gamma": 2.0},
                   stop_at_first=True)  # fmt: skip
    assert report.hazards and {tuple(h.dtypes) for h in report.hazards} == {("float32",)}
    assert report.examples_run == 0
