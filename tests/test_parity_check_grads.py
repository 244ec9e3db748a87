"""``parity.check`` judges gradients w.r.t. probability targets and the options a candidate takes
(issue 10, item 8). Each sound candidate (must pass, with those gradients counted as judged) is
paired with the same candidate carrying a bug only in that gradient (must fail, or be reported as
"not available"), so neither direction can drift."""

from __future__ import annotations

import numpy as np
import pytest

from dualloss.parity import check, judge

torch = pytest.importorskip("torch")
F = torch.nn.functional
# no -inf masks: the textbook forms t * log p, which is 0 * -inf = NaN on a masked class; no
# wide span: log_softmax's z - max overflows to -inf there (real hazards of those candidates,
# reported elsewhere); here only the gradients are at stake
FAST = {"dtypes": ["float32"], "max_examples": 10,
        "skip": ("masked", "masked_soft", "wide_span")}  # fmt: skip


def _problems(report):
    return {(h.failure.kind, h.region) for h in report.hazards}


def _target_lines(report):
    return [p for h in report.hazards for p in h.failure.problems
            if p.startswith("gradient w.r.t. targets")]  # fmt: skip


def _probabilities_only(t):
    if not t.is_floating_point():
        raise TypeError("probability targets only")


# ----------------------------------------------------------------------------------------------
# Probability targets
# ----------------------------------------------------------------------------------------------


def textbook_soft_ce(x, t):
    """-(t * log_softmax).sum(1).mean(): its target gradient is -log_softmax / N."""
    _probabilities_only(t)
    return -(t * F.log_softmax(x, 1)).sum(1).mean()


def detached_targets_ce(x, t):
    """The same value and logits gradient; the targets cut out of autograd."""
    _probabilities_only(t)
    return -(t.detach() * F.log_softmax(x, 1)).sum(1).mean()


def nan_target_gradient_ce(x, t):
    """exp(log t) is t, with d/dt = t / t = NaN where t = 0, where the truth is -log p / N."""
    _probabilities_only(t)
    return -(torch.exp(torch.log(t)) * F.log_softmax(x, 1)).sum(1).mean()


def where_target_gradient_ce(x, t):
    """where(t > 0, t log p, 0): right value, right logits gradient, target gradient 0 where
    t = 0 (the truth there is -log p / N)."""
    _probabilities_only(t)
    return -torch.where(t > 0, t * F.log_softmax(x, 1), 0.0).sum(1).mean()


def test_textbook_soft_target_cross_entropy_passes_with_its_target_gradient_judged():
    report = check(textbook_soft_ce, "softmax_cross_entropy", backend="torch", **FAST)
    assert report.ok, report
    assert report.judged_grads.get("targets", 0) >= 20, report.judged_grads
    assert "gradients judged w.r.t. logits, targets" in str(report)


def test_detached_targets_are_reported_not_available_and_the_rest_is_judged():
    report = check(detached_targets_ce, "softmax_cross_entropy", backend="torch", **FAST)
    assert "grad:targets" in report.unsupported, report
    assert "targets" not in report.judged_grads
    text = str(report)
    assert "unsupported: gradient w.r.t. targets not available (the framework returned" in text
    assert ".requires_grad_(); y = detached_targets_ce(x, t)" in report.unsupported["grad:targets"]
    assert report.cases_judged >= 20  # value and logits gradient still judged: and sound
    assert not report.hazards, report


def test_a_nan_target_gradient_where_the_math_is_finite_is_a_hazard():
    report = check(nan_target_gradient_ce, "softmax_cross_entropy", backend="torch", **FAST)
    assert not report.ok
    assert {kind for kind, _ in _problems(report)} == {"non-finite"}, report
    lines = _target_lines(report)
    assert lines and all("is nan" in line for line in lines), report
    # only the target gradient is wrong: the value and the logits gradient are not named
    assert all(p.startswith("gradient w.r.t. targets") for h in report.hazards
               for p in h.failure.problems), report  # fmt: skip


def test_a_target_gradient_of_zero_where_the_truth_is_not_fails():
    report = check(where_target_gradient_ce, "softmax_cross_entropy", backend="torch", **FAST)
    assert ("accuracy", "soft_targets") in _problems(report), report
    assert any("gradient w.r.t. targets is -0.0" in line or "is 0.0" in line
               for line in _target_lines(report)), report  # fmt: skip


def test_sigmoid_target_gradient_of_bce_passes_and_a_detached_one_is_not_available():
    def bce(x, t):
        return F.binary_cross_entropy_with_logits(x, t)

    def bce_detached(x, t):
        return F.binary_cross_entropy_with_logits(x, t.detach())

    sound = check(bce, "sigmoid_cross_entropy", backend="torch", dtypes=["float32"],
                  max_examples=10)  # fmt: skip
    assert sound.ok and sound.judged_grads.get("targets", 0) >= 10, sound
    cut = check(bce_detached, "sigmoid_cross_entropy", backend="torch", dtypes=["float32"],
                max_examples=0)  # fmt: skip
    assert "grad:targets" in cut.unsupported, cut


def test_binary_targets_are_not_differentiated():
    def bce(x, t):
        return F.binary_cross_entropy_with_logits(x, t)

    report = check(bce, "sigmoid_cross_entropy", backend="torch", dtypes=["float32"],
                   max_examples=0, binary_targets=True)  # fmt: skip
    assert report.ok and "targets" not in report.judged_grads, report


# ----------------------------------------------------------------------------------------------
# Options the candidate takes as arguments
# ----------------------------------------------------------------------------------------------

WEIGHT = np.array([0.5, 1.0, 2.0, 0.25, 1.5])


def weighted_ce(x, t, weight):
    """Textbook weighted cross entropy (torch's mean: divided by the targets' weights)."""
    log_p = F.log_softmax(x, 1)
    if t.is_floating_point():
        return -(t * weight * log_p).sum(1).mean()
    kept = t != -100
    index = torch.where(kept, t, 0)
    w = torch.where(kept, weight[index], 0.0)
    picked = log_p.gather(1, index[:, None])[:, 0]
    return -(w * picked).sum() / w.sum()


def weighted_ce_detached(x, t, weight):
    return weighted_ce(x, t, weight.detach())


def focal_with_gamma(x, t, gamma):
    """The textbook focal loss with gamma a tensor: sound for gamma >= 1, class indices only."""
    if t.is_floating_point():
        raise TypeError("class-index targets only")
    log_p = F.log_softmax(x, dim=1).gather(1, t[:, None])[:, 0]
    return (-((1 - log_p.exp()) ** gamma) * log_p).mean()


def focal_with_gamma_as_float(x, t, gamma):
    return focal_with_gamma(x, t, float(gamma))


def test_class_weights_taken_as_an_argument_get_their_gradient_judged():
    report = check(weighted_ce, "softmax_cross_entropy", backend="torch",
                   options={"weight": WEIGHT}, **FAST)  # fmt: skip
    assert report.ok, report
    assert report.judged_grads.get("weight", 0) >= 20, report.judged_grads
    assert "not judged" not in str(report)


def test_torch_cross_entropy_has_no_weight_gradient_for_class_indices():
    # measured: nll_loss is not differentiable w.r.t. `weight` (torch raises when it requires
    # grad); the probability-target path is, and its weight gradient is judged and sound
    def torch_ce(x, t, weight):
        return F.cross_entropy(x, t, weight=weight)

    report = check(torch_ce, "softmax_cross_entropy", backend="torch",
                   options={"weight": WEIGHT}, **FAST)  # fmt: skip
    assert report.ok, report
    assert "not differentiable with respect to argument 'weight'" in report.unsupported[
        "grad:weight"]  # fmt: skip
    assert report.judged_grads.get("weight", 0) >= 10


def test_detached_class_weights_are_reported_not_available():
    report = check(weighted_ce_detached, "softmax_cross_entropy", backend="torch",
                   options={"weight": WEIGHT}, **FAST)  # fmt: skip
    assert "grad:weight" in report.unsupported, report
    assert "gradient w.r.t. weight not available" in str(report)
    assert "weight = torch.tensor([0.5, 1.0, 2.0, 0.25, 1.5]" in report.unsupported["grad:weight"]


def test_a_wrong_weight_gradient_fails():
    def squared_weight(x, t, weight):
        # the value at these weights is right only where every weight is 1; here the value is
        # wrong too, and so is the gradient: the judge must name the weight gradient
        return F.cross_entropy(x, t, weight=weight * weight.detach())

    report = check(squared_weight, "softmax_cross_entropy", backend="torch",
                   options={"weight": WEIGHT}, **FAST)  # fmt: skip
    assert not report.ok
    assert any("gradient w.r.t. weight" in p for h in report.hazards
               for p in h.failure.problems), report  # fmt: skip


def test_scalar_gamma_as_a_tensor_gets_its_gradient_judged():
    report = check(focal_with_gamma, "softmax_focal_loss", backend="torch",
                   options={"gamma": 2.0}, **FAST)  # fmt: skip
    assert report.ok, report
    assert report.judged_grads.get("gamma", 0) >= 20, report.judged_grads


def test_gamma_turned_into_a_float_is_reported_not_available():
    report = check(focal_with_gamma_as_float, "softmax_focal_loss", backend="torch",
                   options={"gamma": 2.0}, **FAST)  # fmt: skip
    assert "grad:gamma" in report.unsupported, report
    assert report.ok, report  # the value and logits gradient are sound


def test_options_the_candidate_does_not_take_are_said_not_judged():
    def closed_over(x, t):
        return F.cross_entropy(x, t, weight=torch.tensor(WEIGHT, dtype=x.dtype))

    report = check(closed_over, "softmax_cross_entropy", backend="torch",
                   options={"weight": WEIGHT}, dtypes=["float64"], max_examples=0,
                   skip=("masked", "masked_soft"))  # fmt: skip
    assert report.ok, report
    assert "gradient w.r.t. weight not judged" in str(report)


# ----------------------------------------------------------------------------------------------
# dualloss's own backends, strict standard
# ----------------------------------------------------------------------------------------------


def test_torch_impl_target_and_weight_gradients_meet_the_strict_standard():
    from dualloss import torch_impl

    def ours(x, t, weight):
        return torch_impl.softmax_cross_entropy(x, t, weight=weight)

    report = check(ours, "softmax_cross_entropy", backend="torch", options={"weight": WEIGHT},
                   standard="strict", dtypes=["float32", "float64"], max_examples=10,
                   skip=("masked", "masked_soft"))  # fmt: skip
    assert report.ok, report
    assert report.judged_grads.get("targets", 0) >= 40 and report.judged_grads["weight"] >= 40


@pytest.mark.parametrize(
    "backend, gamma",
    [
        ("torch", 0.5),
        ("torch", 2.0),
        ("jax", 0.5),
        pytest.param(
            "jax",
            2.0,
            marks=pytest.mark.on_demand(
                "CI's parity command judges jax_impl's target gradient of the sigmoid focal loss "
                "at gamma 0, 0.5 and 2 in every region and dtype; the jax row at 0.5 here runs "
                "check()"
            ),
        ),
    ],
)
def test_sigmoid_focal_target_gradient_meets_the_strict_standard(backend, gamma):
    """Both backends' closed-form target gradients, every region and Hypothesis: hard targets on
    confident logits (1 - p_t below the smallest normal), logits near the dtype's range (no
    intermediate overflow), soft targets."""
    if backend == "jax":
        pytest.importorskip("jax")
        from dualloss import jax_impl as module
    else:
        from dualloss import torch_impl as module

    def ours(x, t):
        return module.sigmoid_focal_loss(x, t, gamma=gamma, alpha=0.25)

    report = check(ours, "sigmoid_focal_loss", backend=backend,
                   options={"gamma": gamma, "alpha": 0.25}, standard="strict",
                   dtypes=["float32", "float64"], max_examples=10, jit=True)  # fmt: skip
    assert report.ok, report
    assert report.judged_grads.get("targets", 0) >= 40, report.judged_grads


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_sigmoid_cross_entropy_option_gradients_meet_the_strict_standard(backend):
    if backend == "jax":
        pytest.importorskip("jax")
        from dualloss import jax_impl as module
    else:
        from dualloss import torch_impl as module

    def ours(x, t, weight, pos_weight):
        return module.sigmoid_cross_entropy(x, t, weight=weight, pos_weight=pos_weight)

    options = {"weight": np.array(0.5), "pos_weight": np.array([1.5, 0.25, 2.0])}
    report = check(ours, "sigmoid_cross_entropy", backend=backend, options=options,
                   standard="strict", dtypes=["float32", "float64"], max_examples=10,
                   jit=True)  # fmt: skip
    assert report.ok, report
    assert set(report.judged_grads) == {"targets", "weight", "pos_weight"}, report.judged_grads


# ----------------------------------------------------------------------------------------------
# What the judge found in dualloss's own backends (kept failing until fixed)
# ----------------------------------------------------------------------------------------------


def test_torch_sigmoid_focal_target_gradient_where_p_is_subnormal():
    """Found by the judge: float32, gamma < 1, the target gradient at x <= -88 (p below float32's
    normal range) was 3.8x (x = -90) to 560x (x = -100) the truth, through a subnormal or clamped
    1 - p_t; now in closed form (``_sigmoid_focal_targets_grad``)."""
    from dualloss import torch_impl

    x = torch.tensor([[-90.0, -100.0]], dtype=torch.float32)
    t = torch.zeros_like(x).requires_grad_()
    options = {"gamma": 0.5, "alpha": 0.75}
    value = torch_impl.sigmoid_focal_loss(x, t, **options)
    (grad,) = torch.autograd.grad(value, t)
    judgement = judge("sigmoid_focal_loss", x.double().numpy(), np.zeros((1, 2)), options,
                      "float32", value.item(), input_grads={"targets": grad.double().numpy()},
                      standard="practical")  # fmt: skip
    assert judgement.ok, judgement.inaccurate


@pytest.mark.xfail(
    strict=True,
    reason="both backends give 0 for d loss / d t_c on a class masked"
    " by a -inf logit; the spec (and the textbook -log_softmax) give +inf",
)
def test_torch_target_gradient_on_a_masked_class():
    from dualloss import torch_impl

    x = torch.tensor([[0.5, -float("inf"), 1.0]], dtype=torch.float64)
    t = torch.tensor([[0.5, 0.0, 0.5]], dtype=torch.float64, requires_grad=True)
    value = torch_impl.softmax_cross_entropy(x, t)
    (grad,) = torch.autograd.grad(value, t)
    judgement = judge("softmax_cross_entropy", x.numpy(), t.detach().numpy(), {}, "float64",
                      value.item(), input_grads={"targets": grad.numpy()},
                      standard="strict")  # fmt: skip
    assert judgement.ok, judgement.nonfinite
