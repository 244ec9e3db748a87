"""The oracle flags known NaN bugs with a minimal reproducer, and passes sound implementations."""

from __future__ import annotations

import numpy as np
import pytest

from dualloss.parity import check

torch = pytest.importorskip("torch")
F = torch.nn.functional
FAST = {"dtypes": ["float32"], "max_examples": 15}


def _kinds(report):
    return {f.kind for f in report.failures}


def _first_line_runs(report):
    """The reproducer of the smallest failure is one line of Python that runs."""
    line = report.failures[0].reproducer
    assert "\n" not in line
    exec(compile(line, "<reproducer>", "exec"), {})


# ----------------------------------------------------------------------------------------------
# Known bugs: flagged
# ----------------------------------------------------------------------------------------------


def log_softmax_via_log_focal(logits, targets, gamma=2.0):
    """pytorch#46225 style: log(softmax) then gather."""
    p = F.softmax(logits, dim=1)
    log_p = torch.log(p).gather(1, targets[:, None])[:, 0]
    p_t = p.gather(1, targets[:, None])[:, 0]
    return (-((1 - p_t) ** gamma) * log_p).mean()


def test_log_of_softmax_focal_is_flagged_non_finite(capsys):
    report = check(
        log_softmax_via_log_focal,
        "softmax_focal_loss",
        backend="torch",
        options={"gamma": 2.0},
        skip=("ignored", "all_ignored", "masked_soft"),
        **FAST,
    )
    assert not report.ok
    assert "non-finite" in _kinds(report)
    smallest = report.failures[0]
    assert smallest.logits.shape[0] == 1, "minimised to one row"
    assert "log_softmax_via_log_focal" in str(report)
    _first_line_runs(report)


def torchvision_focal(x, t, gamma=0.5, alpha=0.25):
    """torchvision.ops.sigmoid_focal_loss, its formula (torchvision is not installable here)."""
    p = torch.sigmoid(x)
    ce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce * ((1 - p_t) ** gamma)
    alpha_t = alpha * t + (1 - alpha) * (1 - t)
    return (alpha_t * loss).mean()


def test_torchvision_sigmoid_focal_gamma_half_is_flagged():
    report = check(
        torchvision_focal,
        "sigmoid_focal_loss",
        backend="torch",
        options={"gamma": 0.5, "alpha": 0.25},
        **FAST,
    )
    assert "non-finite" in _kinds(report)
    failure = report.failures[0]
    assert failure.logits.size == 1, failure.describe()
    assert "gradient is" in failure.problems[0]
    _first_line_runs(report)


jax = pytest.importorskip("jax")
jnp = jax.numpy


def jax_focal_pow_zero(logits, targets):
    """(1 - p_t) ** 0.0 in JAX: the gradient of x ** 0 at x = 0 is 0 * 0 ** -1 = NaN."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    log_p_t = jnp.take_along_axis(log_p, targets[:, None], axis=-1)[:, 0]
    return (-((1 - jnp.exp(log_p_t)) ** 0.0) * log_p_t).mean()


@pytest.mark.slow
def test_jax_pow_zero_is_flagged():
    report = check(
        jax_focal_pow_zero,
        "softmax_focal_loss",
        backend="jax",
        options={"gamma": 0.0},
        skip=("ignored", "all_ignored", "masked_soft"),
        **FAST,
    )
    assert "non-finite" in _kinds(report)
    assert report.failures[0].logits.shape[0] == 1
    _first_line_runs(report)


def jax_where_log(logits, labels):
    """jnp.where(mask, jnp.log(x), 0): the unselected log(0) = -inf makes the gradient NaN."""
    p = jax.nn.sigmoid(logits)
    pos = jnp.where(labels > 0, jnp.log(p), 0.0)
    neg = jnp.where(labels < 1, jnp.log(1 - p), 0.0)
    return -(labels * pos + (1 - labels) * neg).mean()


@pytest.mark.slow
def test_jax_where_log_is_flagged():
    report = check(jax_where_log, "sigmoid_cross_entropy", backend="jax", **FAST)
    assert "non-finite" in _kinds(report)
    assert report.failures[0].logits.size == 1
    _first_line_runs(report)


def test_all_ignored_mean_nan_of_cross_entropy_is_flagged_by_our_standard():
    # the practical standard accepts torch's NaN for 0 / 0 (test_parity_check.py); ours does not
    report = check(F.cross_entropy, "softmax_cross_entropy", backend="torch",
                   dtypes=["float32"], max_examples=0, standard="strict")  # fmt: skip
    cases = {f.case.split("[")[0] for f in report.failures}
    assert "all_ignored/mean" in cases
    assert any(c.startswith("masked_soft/") for c in cases), cases  # 0 * -inf with prob targets


# ----------------------------------------------------------------------------------------------
# Sound implementations: pass
# ----------------------------------------------------------------------------------------------


def test_torch_cross_entropy_passes_but_for_zero_times_inf_and_a_wide_span():
    # its hazards: probability targets with zero mass on a -inf logit, 0 * -inf = NaN (flagged
    # above), and logits spanning more than the largest number, where z - max overflows to -inf
    # and the loss is inf though the spec's is finite (0.34 max); everything else passes, the
    # all-ignored mean's NaN accepted (issue 28: a named hazard without the skip)
    report = check(F.cross_entropy, "softmax_cross_entropy", backend="torch",
                   skip=("masked_soft", "all_ignored_nan"), dtypes=["float32", "float64"],
                   max_examples=20)  # fmt: skip
    assert report.hazards, "the masked margin cases with probability targets must catch it"
    assert any(f.case.startswith("wide_span") for f in report.failures), report
    for failure in report.failures:
        assert failure.kind == "non-finite", report
        if failure.case.startswith("wide_span"):
            assert np.abs(failure.logits).max() > 0.4 * np.finfo(np.float32).max, report
            continue
        assert failure.targets.dtype.kind == "f" and np.isneginf(failure.logits).any(), report


def test_torch_cross_entropy_label_smoothing_passes_in_float64():
    # float32: eps/C * sum_c log p_c overflows at margins ~1e38 (inf for a 1.4e37 loss), a finding
    fn = lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1)  # noqa: E731
    report = check(fn, "softmax_cross_entropy", backend="torch", options={"label_smoothing": 0.1},
                   skip=("all_ignored", "masked", "masked_soft", "huge_shift"), dtypes=["float64"],
                   max_examples=15)  # fmt: skip
    assert report.ok, str(report)


def test_torch_bce_with_logits_passes():
    report = check(F.binary_cross_entropy_with_logits, "sigmoid_cross_entropy", backend="torch",
                   dtypes=["float32", "float64", "float16"], max_examples=20)  # fmt: skip
    assert report.ok, str(report)


optax = pytest.importorskip("optax")


@pytest.mark.slow
def test_optax_integer_labels_passes_outside_large_logits():
    # no ignore_index in optax; huge_shift: optax's lse - z_y loses u * max|z| (absorption), a
    # finding (docs/nan-hazards.md); Hypothesis finds it at [[800, 800]], so adversarial only
    fn = lambda x, t: optax.softmax_cross_entropy_with_integer_labels(x, t).mean()  # noqa: E731
    report = check(fn, "softmax_cross_entropy", backend="jax",
                   skip=("ignored", "all_ignored", "huge_shift"), dtypes=["float32", "float16"],
                   max_examples=0)  # fmt: skip
    assert report.ok, str(report)


def test_optax_integer_labels_huge_shift_absorption_is_within_the_input_spread():
    # lse(z) - z_y at a shift of 1.7e38 returns 0 for log 5: what moving the inputs by one ULP
    # (2e31) already implies, so even the strict standard lets it through in float32
    fn = lambda x, t: optax.softmax_cross_entropy_with_integer_labels(x, t).mean()  # noqa: E731
    report = check(fn, "softmax_cross_entropy", backend="jax", dtypes=["float32"],
                   skip=("ignored", "all_ignored"), max_examples=0, standard="strict")  # fmt: skip
    assert not [f for f in report.failures if f.case.startswith("huge_shift")], report
    # what strict does flag: the confident rows' tiny losses, which optax rounds to 0
    assert {f.kind for f in report.failures} == {"accuracy"}, report
    assert any(f.case.startswith("confident_correct") for f in report.failures), report


@pytest.mark.slow
def test_optax_sigmoid_binary_cross_entropy_passes():
    fn = lambda x, t: optax.sigmoid_binary_cross_entropy(x, t).mean()  # noqa: E731
    report = check(fn, "sigmoid_cross_entropy", backend="jax", **FAST)
    assert report.ok, str(report)


@pytest.mark.slow
def test_optax_sigmoid_focal_loss_passes_in_float32_but_for_its_target_gradient():
    # values and logits gradients pass; the gradient w.r.t. the targets is wrong at hard labels:
    # log(1 - p_t) = logsumexp([log p, log q], b=[1 - t, t]), and JAX's logsumexp drops the
    # terms with b = 0 together with their derivative (d/db at b = 0 comes back 0)
    fn = lambda x, t: optax.sigmoid_focal_loss(x, t, gamma=2.0).mean()  # noqa: E731
    report = check(fn, "sigmoid_focal_loss", backend="jax", options={"gamma": 2.0}, **FAST)
    problems = [p for h in report.hazards for p in h.failure.problems]
    assert problems and all(p.startswith("gradient w.r.t. targets") for p in problems), report
    assert ("accuracy", "typical") in {(h.failure.kind, h.region) for h in report.hazards}
