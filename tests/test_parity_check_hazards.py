"""``parity.check`` against the situations of issue 28, each built from scratch: a candidate that
writes its inputs, a false alarm on a target gradient, an honest refusal of a whole feature,
all-ignored batches, and the choice of gradients to judge. Each test asserts the verdict the
issue asks for; a sound candidate beside each one must keep passing."""

from __future__ import annotations

import numpy as np
import pytest

from dualloss.parity import backends as B
from dualloss.parity import check

torch = pytest.importorskip("torch")
F = torch.nn.functional
FAST = {"dtypes": ["float32"], "max_examples": 0}


def _kinds(report):
    return {h.failure.kind for h in report.hazards}


# ----------------------------------------------------------------------------------------------
# Item 3: the input guard
# ----------------------------------------------------------------------------------------------


def stores_softmax_in_logits(logits, targets):
    """A 'fused kernel' that keeps the softmax in the logits' storage to save memory."""
    loss = F.cross_entropy(logits, targets)
    with torch.no_grad():
        logits.copy_(F.softmax(logits, dim=1))
    return loss


def fills_ignored_targets(logits, targets):
    """Replaces the ignored labels by 0 in the caller's tensor, then masks them out."""
    keep = targets != -100
    targets.masked_fill_(~keep, 0)
    per_row = F.cross_entropy(logits, targets, reduction="none")
    return (per_row * keep).sum() / keep.sum().clamp(min=1)


def test_a_candidate_that_writes_its_logits_fails_with_its_own_hazard():
    report = check(stores_softmax_in_logits, "softmax_cross_entropy", backend="torch", **FAST)
    assert not report.ok
    written = [h for h in report.hazards if h.failure.kind == "writes input"]
    assert written, report
    failure = written[0].failure
    assert failure.problems[0].startswith("writes its input logits"), report
    # the reproducer copies the logits first and prints whether they are unchanged
    assert "x_before = x.detach().clone()" in failure.reproducer
    assert "'logits unchanged:', torch.equal(x.detach(), x_before)" in failure.reproducer
    assert "[writes input]" in str(report)


def test_the_reproducer_of_a_written_input_shows_the_write():
    report = check(stores_softmax_in_logits, "softmax_cross_entropy", backend="torch", **FAST)
    failure = next(h.failure for h in report.hazards if h.failure.kind == "writes input")
    namespace = {"stores_softmax_in_logits": stores_softmax_in_logits}
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(failure.reproducer, namespace)  # noqa: S102 - the report's own line
    assert "logits unchanged: False" in out.getvalue()


def test_a_candidate_that_writes_its_targets_is_named_for_the_targets():
    report = check(fills_ignored_targets, "softmax_cross_entropy", backend="torch", **FAST)
    problems = [p for h in report.hazards if h.failure.kind == "writes input"
                for p in h.failure.problems]  # fmt: skip
    assert any(p.startswith("writes its input targets") for p in problems), report

    # the same loss on a copy of the targets writes nothing
    def copies_first(logits, targets):
        targets = targets.clone()
        keep = targets != -100
        targets.masked_fill_(~keep, 0)
        per_row = F.cross_entropy(logits, targets, reduction="none")
        return (per_row * keep).sum() / keep.sum().clamp(min=1)

    sound = check(copies_first, "softmax_cross_entropy", backend="torch", **FAST)
    assert "writes input" not in _kinds(sound), sound


def test_the_guard_sees_a_jax_buffer_given_away_and_a_torch_tensor_written():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(4.0)
    y = torch.arange(4.0)
    before = B.fingerprints({"logits": x, "targets": y.clone()}, "jax")
    torch_before = B.fingerprints({"targets": y}, "torch")
    x.delete()  # what donate_argnums does to the caller's buffer
    y[1] = -0.0 * 0.0  # -0.0: the same number, other bytes (a written input nonetheless)
    assert B.changed(before, {"logits": x, "targets": y}, "jax") == ("logits",)
    assert B.changed(torch_before, {"targets": y}, "torch") == ("targets",)


def test_the_fused_linear_check_guards_its_inputs_too():
    def zeroes_hidden_after(h, w, t):
        loss = F.cross_entropy(h @ w.T, t)
        h.data.zero_()
        return loss

    report = check(zeroes_hidden_after, "linear_softmax_cross_entropy", backend="torch",
                   dtypes=["float64"])  # fmt: skip
    problems = [p for f in report.failures for p in f.problems]
    assert any(p.startswith("writes its input hidden") for p in problems), report
    assert {f.kind for f in report.failures} >= {"writes input"}


# ----------------------------------------------------------------------------------------------
# Item 1: one allowance for every judged quantity
# ----------------------------------------------------------------------------------------------


def torchvision_sigmoid_focal(inputs, targets, gamma=2.0):
    """torchvision.ops.sigmoid_focal_loss's formula (alpha < 0: no alpha), reduction 'none'."""
    p = torch.sigmoid(inputs)
    ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    return ce_loss * ((1 - p_t) ** gamma)


def test_the_target_gradient_gets_the_allowance_the_value_gets():
    # the element: x = -20, t = 0, float64; 1 - p_t formed from p_t is off by a relative
    # u / p = 6e-8, which the value was forgiven and the target gradient was not
    from dualloss.parity import judge

    x = torch.tensor([[-20.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    y = torchvision_sigmoid_focal(x, t)
    y.sum().backward()
    assert t.grad.item() == 9.346378754814526e-17  # the number: the same computation
    options = {"gamma": 2.0, "reduction": "none"}
    judgement = judge("sigmoid_focal_loss", x.detach().numpy(), t.detach().numpy(), options,
                      "float64", y.detach().numpy(), x.grad.numpy(), standard="practical",
                      input_grads={"targets": t.grad.numpy()})  # fmt: skip
    assert judgement.ok, judgement.inaccurate
    report = check(torchvision_sigmoid_focal, "sigmoid_focal_loss", backend="torch",
                   dtypes=["float64", "float32"], options=options, max_examples=20)  # fmt: skip
    assert report.ok, report
    assert report.judged_grads.get("targets", 0) > 0


def test_the_allowance_does_not_forgive_a_wrong_target_gradient():
    # the same loss with (1 - p_t) ** gamma detached from the targets: its target gradient
    # lacks the focal term's derivative, wrong at its own scale wherever p_t is not near 1
    def detached_weight(inputs, targets, gamma=2.0):
        p = torch.sigmoid(inputs)
        ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
        p_t = p * targets.detach() + (1 - p) * (1 - targets.detach())
        return ce_loss * ((1 - p_t) ** gamma)

    report = check(detached_weight, "sigmoid_focal_loss", backend="torch", dtypes=["float64"],
                   options={"gamma": 2.0, "reduction": "none"}, max_examples=0)  # fmt: skip
    problems = [p for f in report.failures for p in f.problems]
    assert problems and any(p.startswith("gradient w.r.t. targets") for p in problems), report


# ----------------------------------------------------------------------------------------------
# Item 2: an honest refusal of a whole feature is "unsupported", a crash stays a failure
# ----------------------------------------------------------------------------------------------


def flat_only(logits, targets):
    """Supports (N, C) only, and says so."""
    if logits.dim() != 2:
        raise ValueError(f"flat_only supports (N, C) logits only; got shape {tuple(logits.shape)}")
    return F.cross_entropy(logits, targets)


def test_a_clear_refusal_of_spatial_input_is_unsupported_not_a_failure():
    # (F.cross_entropy's own NaN at -inf logits with probability targets and its inf where the
    # logits span more than the largest number are left out)
    report = check(flat_only, "softmax_cross_entropy", backend="torch",
                   skip=("masked", "masked_soft", "wide_span", "all_ignored_nan"),
                   **FAST)  # fmt: skip
    assert report.ok, report
    assert set(report.unsupported) == {"spatial"}, report
    text = str(report)
    assert "unsupported: spatial (ValueError: flat_only supports (N, C) logits only" in text
    assert "reproduce: " in report.unsupported["spatial"]

    # one that takes the spatial probe, then crashes on spatial cases with ignored labels: a
    # crash on a supported feature stays a failure
    def crashes_on_spatial_ignored(logits, targets):
        if logits.dim() > 2 and bool((targets == -100).any()):
            raise IndexError("index -100 is out of bounds")
        return F.cross_entropy(logits, targets)

    crash = check(crashes_on_spatial_ignored, "softmax_cross_entropy", backend="torch", **FAST)
    assert "spatial" not in crash.unsupported
    assert ("error", "spatial") in {(h.failure.kind, h.region) for h in crash.hazards}, crash


def test_a_sigmoid_loss_refusing_spatial_input_is_unsupported():
    def flat_bce(x, t):
        if x.dim() != 2:
            raise NotImplementedError("2-D inputs only")
        return F.binary_cross_entropy_with_logits(x, t)

    report = check(flat_bce, "sigmoid_cross_entropy", backend="torch", **FAST)
    assert report.ok and set(report.unsupported) == {"spatial"}, report


def test_an_option_the_candidate_refuses_is_unsupported_by_name():
    def no_smoothing(logits, targets, label_smoothing=0.0):
        if float(label_smoothing) != 0.0:
            raise NotImplementedError("label_smoothing is not implemented")
        return F.cross_entropy(logits, targets)

    report = check(no_smoothing, "softmax_cross_entropy", backend="torch",
                   options={"label_smoothing": 0.1}, **FAST)  # fmt: skip
    assert "option:label_smoothing" in report.unsupported, report
    assert not report.hazards, report  # a refusal, not a failure; and nothing judged: not OK
    assert not report.ok
    assert (
        "unsupported: option label_smoothing (NotImplementedError: label_smoothing is not"
        in str(report)
    )


# ----------------------------------------------------------------------------------------------
# Item 4: all-ignored batches
# ----------------------------------------------------------------------------------------------


# F.cross_entropy's own NaN at -inf logits with probability targets is another matter
# F.cross_entropy's own hazards, flagged in test_parity_known_bugs: NaN at -inf logits with
# probability targets, inf where the logits span more than the largest number
NO_MASKS = ("masked", "masked_soft", "wide_span")


def test_f_cross_entropy_reports_its_nan_on_an_all_ignored_batch_as_a_named_hazard():
    report = check(F.cross_entropy, "softmax_cross_entropy", backend="torch", skip=NO_MASKS,
                   **FAST)  # fmt: skip
    assert not report.ok
    named = [h for h in report.hazards if h.failure.kind == "NaN loss on an all-ignored batch"]
    assert [h.region for h in named] == ["all_ignored"], report
    text = str(report)
    assert "F.cross_entropy does the same by design" in text
    assert "skip=('all_ignored_nan',) accepts it" in text
    # the value line prints what F.cross_entropy returned (NaN), not the 0 it was judged as
    assert np.isnan(named[0].failure.received_value), named[0].failure.received_value
    (line,) = [x for x in text.splitlines() if x.strip().startswith("value: expected 0")]
    assert "received nan" in line, line
    # accepted: OK, and the report says what was accepted
    accepted = check(F.cross_entropy, "softmax_cross_entropy", backend="torch",
                     skip=("all_ignored_nan", *NO_MASKS), **FAST)  # fmt: skip
    assert accepted.ok, accepted
    assert any(n.startswith("accepted (skip='all_ignored_nan')") for n in accepted.notes)


def test_a_nan_gradient_on_an_all_ignored_batch_fails_even_when_the_nan_value_is_accepted():
    def nan_everywhere_when_empty(logits, targets):
        keep = targets != -100
        per_row = F.cross_entropy(logits, targets.clamp(min=0), reduction="none")
        return (per_row * keep).sum() / keep.sum()  # 0 / 0: NaN value and NaN gradient

    report = check(nan_everywhere_when_empty, "softmax_cross_entropy", backend="torch",
                   skip=("all_ignored_nan",), **FAST)  # fmt: skip
    failing = {(h.failure.kind, h.region) for h in report.hazards}
    assert ("non-finite", "all_ignored") in failing, report
    problems = [p for h in report.hazards if h.region == "all_ignored" for p in h.failure.problems]
    assert any(p.startswith("gradient is nan") for p in problems), report


def test_the_fused_linear_check_names_the_nan_loss_of_an_all_ignored_batch():
    def textbook(h, w, t):
        return F.cross_entropy(h @ w.T, t)  # 0 / 0 over an all-ignored batch: NaN, finite grads

    report = check(textbook, "linear_softmax_cross_entropy", backend="torch", dtypes=["float64"])
    assert [h.region for h in report.hazards] == ["all_ignored"], report
    assert report.hazards[0].failure.kind == "NaN loss on an all-ignored batch"
    accepted = check(textbook, "linear_softmax_cross_entropy", backend="torch",
                     dtypes=["float64"], skip=("all_ignored_nan",))  # fmt: skip
    assert accepted.ok, accepted


# ----------------------------------------------------------------------------------------------
# Item 5: grads= chooses the gradients to judge
# ----------------------------------------------------------------------------------------------


def detached_target_gradient(logits, targets):
    """Cross entropy with probability targets treated as constants: sound in the logits, its
    gradient w.r.t. the targets is not available (torch gives none)."""
    return F.cross_entropy(logits, targets.detach() if targets.is_floating_point() else targets)


def test_grads_logits_judges_the_logits_only_and_says_so():
    everything = check(detached_target_gradient, "softmax_cross_entropy", backend="torch",
                       skip=(*NO_MASKS, "all_ignored_nan"), **FAST)  # fmt: skip
    assert "grad:targets" in everything.unsupported, everything
    logits_only = check(detached_target_gradient, "softmax_cross_entropy", backend="torch",
                        skip=(*NO_MASKS, "all_ignored_nan"), grads="logits", **FAST)  # fmt: skip
    assert logits_only.ok and not logits_only.unsupported, logits_only
    assert not logits_only.judged_grads
    assert "grads='logits': gradients judged w.r.t. logits\n" in str(logits_only)


def test_grads_names_choose_among_the_options():
    weight = np.array([0.5, 1.0, 2.0, 0.25, 1.5])

    def weighted(x, t, weight):
        return F.cross_entropy(x, t, weight=weight)

    chosen = check(weighted, "softmax_cross_entropy", backend="torch", options={"weight": weight},
                   skip=(*NO_MASKS, "all_ignored_nan"), grads=("logits", "weight"),
                   **FAST)  # fmt: skip
    assert set(chosen.judged_grads) == {"weight"}, chosen  # not the probability targets'
    assert "grads=('logits', 'weight')" in str(chosen)
    with pytest.raises(ValueError, match=r"`grads` must be 'all', 'logits' or a tuple of names"):
        check(weighted, "softmax_cross_entropy", backend="torch", grads=("bias",), **FAST)


def test_the_cli_takes_grads(capsys):
    from dualloss.parity.__main__ import main

    code = main(["check", "torch.nn.functional:cross_entropy", "--reference",
                 "softmax_cross_entropy", "--backend", "torch", "--dtypes", "float32",
                 "--max-examples", "0",
                 "--skip", "masked,masked_soft,wide_span,all_ignored_nan",
                 "--grads", "logits"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "grads='logits': gradients judged w.r.t. logits\n" in out


# ----------------------------------------------------------------------------------------------
# Item 6: the parity run judges target and option gradients of our backends
# ----------------------------------------------------------------------------------------------


def test_the_parity_run_differentiates_our_targets_and_array_options():
    from dualloss.parity import runner
    from dualloss.parity.cases import make_cases

    impl = B.ours("torch", "sigmoid_cross_entropy")
    case = next(c for c in make_cases("sigmoid_cross_entropy", "float32", regions=("options",))
                if np.ndim(c.options.get("pos_weight")) > 0)  # fmt: skip
    kind, judgement, outcome = runner.evaluate(impl, B.prepare(case, "float32"), "cpu", False)
    assert kind == "ok", judgement.inaccurate
    assert set(judgement.expected_input_grads) == {"targets", "pos_weight"}
