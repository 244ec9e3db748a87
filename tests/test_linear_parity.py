"""Both backends' fused linear losses against the spec over adversarial regions, every dtype,
and ``parity.check`` on fused losses (ours, a planted bug, torch's ``F.linear_cross_entropy``).

The regions, the error bound (derived, not tuned) and the runs live in ``dualloss.parity.linear``
(its docstring derives the bound); ``dualloss-parity run`` and ``parity.check`` use the same.
Regions: typical, huge hidden norms, exact ties, ignored rows, all rows ignored, one class
dominant. Options: plain cross entropy, class weights with label smoothing, focal (gamma 2),
focal with a vector alpha, gamma 0.5 and label smoothing. dtypes: float64, float32, bfloat16
(hidden, weight and bias in bfloat16; the backends compute and accumulate in float32 and round
the results once: the strict standard). NaN-free: every value and gradient must be finite.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dualloss import jax_impl as J
from dualloss import spec
from dualloss import torch_impl as T
from dualloss.parity import check
from dualloss.parity import linear as L

BACKENDS = ("torch", "jax")
DTYPES = ("float64", "float32", "bfloat16")
OPTIONS = {
    "ce": ("linear_softmax_cross_entropy", L.OPTION_SETS["linear_softmax_cross_entropy"][0]),
    "ce_weight_smoothing": (
        "linear_softmax_cross_entropy",
        L.OPTION_SETS["linear_softmax_cross_entropy"][1],
    ),
    "focal": ("linear_softmax_focal_loss", L.OPTION_SETS["linear_softmax_focal_loss"][0]),
    "focal_alpha_smoothing": (
        "linear_softmax_focal_loss",
        L.OPTION_SETS["linear_softmax_focal_loss"][1],
    ),
}


def _region(name, n=45, h=16, v=97):
    return L.region_inputs(name, n, h, v)


def _matrix():
    """float32 with reduction 'mean' in the quick loop; float64, bfloat16 and 'none' under slow."""
    for backend in BACKENDS:
        for dtype in DTYPES:
            for region in L.REGIONS:
                for option in OPTIONS:
                    for reduction in ("mean", "none"):
                        quick = dtype == "float32" and reduction == "mean"
                        marks = () if quick else (pytest.mark.slow,)
                        params = (backend, dtype, region, option, reduction)
                        yield pytest.param(*params, marks=marks, id="-".join(params))


def _judged(backend, name, options, dtype, region, reduction):
    (case,) = L.make_cases(name, options, regions=[region])
    prep = L.prepare(case, dtype)
    fn = L.ours(backend, name, prep.options, reduction)
    prep.options["reduction"] = reduction
    outcome = L.run(fn, backend, prep)
    assert outcome.error is None, outcome.error
    return prep, outcome, L.judge(name, prep, outcome, "strict")


# strength 1 (every value of each parameter): CI's parity command (README) judges both backends
# on every linear region in all four dtypes with the plain options and 'mean' and with class
# weights / alpha and label smoothing and 'none' (``parity.linear.plan``); this adds the other
# pairings
@pytest.mark.exhaustive(strength=1)
@pytest.mark.parametrize(("backend", "dtype", "region", "option", "reduction"), list(_matrix()))
def test_backend_matches_spec_within_the_derived_bound(backend, dtype, region, option, reduction):
    name, options = OPTIONS[option]
    prep, outcome, judgement = _judged(backend, name, options, dtype, region, reduction)
    context = f"[{backend}.{name}({options}), {dtype}, {region}, {reduction}]"
    assert set(outcome.dtypes) == {dtype}, f"output dtypes {outcome.dtypes} {context}"
    for what, got in judgement.received.items():
        assert np.all(np.isfinite(got)), f"non-finite {what} {context}"
    assert judgement.kind == "ok", f"{'; '.join(judgement.problems)} {context}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_class_dominant_loss_keeps_its_relative_accuracy(backend):
    # p_y = 1 - ~1e-13: lse - z_y computed as a difference would be 0 or off by 100%
    (case,) = L.make_cases("linear_softmax_focal_loss", {"gamma": 0.5},
                           regions=["one_class_dominant"])  # fmt: skip
    case.hidden, case.targets = case.hidden[:30], case.targets[:30]
    prep = L.prepare(case, "float32")
    fn = L.ours(backend, "linear_softmax_focal_loss", prep.options, "none")
    got = L.run(fn, backend, prep).value
    h, k, b = prep.ref
    expected = spec.linear_softmax_focal_loss(
        h, k, case.targets, bias=b, gamma=0.5, reduction="none"
    )
    assert np.all(expected > 0) and np.all(expected < 1e-10)
    np.testing.assert_allclose(got, expected, rtol=1e-4)


# ----------------------------------------------------------------------------------------------
# parity.check on fused losses
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_passes_our_fused_losses_under_the_strict_standard(backend):
    module = T if backend == "torch" else J

    def ours(h, w, t, b):
        return module.linear_softmax_focal_loss(h, w, t, bias=b, gamma=0.5)

    report = check(ours, "linear_softmax_focal_loss", backend=backend, dtypes=["float32"], jit=True,
                   options={"bias": True, "gamma": 0.5}, standard="strict")  # fmt: skip
    assert report.ok, report
    assert report.cases_judged == len(L.REGIONS) and report.examples_run >= 50


def _log_of_softmax(h, w, t, b):
    # pytorch/pytorch#46225's log(softmax): p = 0 for a masked or outvoted class gives NaN grads
    return F.nll_loss(torch.log(F.softmax(F.linear(h, w, b), dim=1)), t)


def _divides_by_n(h, w, t, b):
    # a mean over every row, ignored ones included
    return F.cross_entropy(F.linear(h, w, b), t, reduction="sum") / t.numel()


def _half_logits(h, w, t, b):
    # logits formed in the input dtype: past 65504 they are inf in float16
    return F.cross_entropy(F.linear(h, w, b), t)


@pytest.mark.parametrize(
    ("candidate", "dtype", "regions"),
    [
        (_log_of_softmax, "float32", {"confident", "bias_mask", "half_overflow"}),
        (_divides_by_n, "float32", {"mostly_ignored"}),
        (_half_logits, "float16", {"half_overflow"}),
    ],
)
def test_new_regions_catch_what_goes_wrong_in_fused_losses(candidate, dtype, regions):
    report = check(candidate, "linear_softmax_cross_entropy", backend="torch", dtypes=[dtype],
                   options={"bias": True}, skip=("all_ignored_nan",), max_examples=0)  # fmt: skip
    assert regions <= {h.region for h in report.hazards}, report
    assert report.examples_run == 0


def test_search_shrinks_a_float16_overflow_to_a_runnable_one_row_reproducer(capsys):
    report = check(_half_logits, "linear_softmax_cross_entropy", backend="torch",
                   dtypes=["float16"], options={"bias": True}, skip=("all_ignored_nan",),
                   max_examples=30)  # fmt: skip
    (found,) = [h.failure for h in report.hazards if h.region == "hypothesis"]
    assert found.kind == "non-finite" and found.case == "hypothesis (shrunk)", report
    assert found.rows == 1 and "from_values([[" in found.reproducer, found.reproducer
    # which overflow the shrinking lands on depends on the examples drawn before it (the suite's
    # order): a loss past float16's largest number (value inf) or a row whose logits overflow to
    # +inf together (inf - inf: value NaN where the exact loss is finite, 0 for a confident row)
    problem = found.problems[0]
    assert problem.startswith(("value is inf", "value is nan")), found.problems
    # the reproducer, run as printed, gives that very failure (not merely some printed number, a
    # gradient, that reads "nan" or "inf"), on one row, and it is float16's overflow: the same
    # values in float64 give a finite loss
    capsys.readouterr()
    namespace = {"_half_logits": _half_logits}
    exec(found.reproducer, namespace)  # noqa: S102 - our own line
    assert capsys.readouterr().out
    y, h, w, t, b = (namespace[k] for k in ("y", "h", "w", "t", "b"))
    assert h.dtype == torch.float16 and h.shape[0] == 1, h
    assert (torch.isinf(y) if "inf" in problem.split()[2] else torch.isnan(y)).all(), (problem, y)
    logits = F.linear(h.double(), w.double(), b.double())
    exact = F.cross_entropy(logits, t)
    half_max = torch.finfo(torch.float16).max
    assert torch.isfinite(exact), exact
    # inf: the loss itself is past float16's largest number; NaN: a logit is
    overflowing = exact if torch.isinf(y).all() else logits.abs().max()
    assert overflowing > half_max, (exact, logits)


def test_flushed_subnormal_logit_gradients_are_forgiven_through_the_linear_layer():
    # p = e^-90 ~ 8e-40 is subnormal in float32 (flushed by XLA); times h = 30 the spec's weight
    # gradient, 2.5e-38, is normal: the bound lets the flushed p through the layer, nothing more
    prep = L.prepare(L.LinearCase("linear_softmax_focal_loss", "hypothesis", "drawn",
                                  np.array([[30.0]]), np.array([[0.0, 1.0, 4.0]]), np.zeros(3),
                                  np.array([0]), {"gamma": 0.5}), "float32")  # fmt: skip
    want = L.expected("linear_softmax_focal_loss", prep)
    outcome = L.Outcome(want["value"], {k: v.copy() for k, v in want.items() if k != "value"})
    outcome.grads["linear_weight"][0, 1] = 0.0
    assert 2e-38 < want["linear_weight"][0, 1] < 3e-38
    assert L.judge("linear_softmax_focal_loss", prep, outcome, "strict").kind == "ok"
    outcome.grads["linear_weight"][0, 1] = 1e-36
    assert L.judge("linear_softmax_focal_loss", prep, outcome, "strict").kind == "accuracy"


def test_check_finds_a_gradient_dropped_through_the_bias():
    # a textbook fused loss whose bias is detached: every bias gradient is 0
    def detached_bias(h, w, t, b):
        return F.cross_entropy(F.linear(h, w, b.detach()), t)

    report = check(detached_bias, "linear_softmax_cross_entropy", backend="torch",
                   dtypes=["float32"], options={"bias": True},
                   skip=("all_ignored_nan",))  # fmt: skip
    assert not report.ok
    problems = [p for f in report.failures for p in f.problems]
    assert problems and all("gradient w.r.t. bias" in p for p in problems), report
    assert "inputs('linear_softmax_cross_entropy', 'float32'" in report.failures[0].reproducer


def test_check_without_bias_folds_it_and_judges_two_gradients():
    def textbook(h, w, t):
        return F.cross_entropy(h @ w.T, t, reduction="sum")

    report = check(textbook, "linear_softmax_cross_entropy", backend="torch",
                   dtypes=["float64"], options={"reduction": "sum"})  # fmt: skip
    assert report.ok, report
    assert "gradients w.r.t. hidden, linear_weight," in str(report)


def test_check_reports_ignored_labels_unsupported_when_the_candidate_raises_on_them():
    # a gather without ignore_index raises on the -100 targets: unsupported, the rest judged
    def gather(h, w, t):
        return -torch.log_softmax(h @ w.T, dim=1).gather(1, t[:, None]).mean()

    report = check(gather, "linear_softmax_cross_entropy", backend="torch", dtypes=["float64"])
    assert report.ok, report
    assert set(report.unsupported) == {"ignored", "all_ignored"}
    with_ignored = [
        c for c in L.make_cases("linear_softmax_cross_entropy") if (c.targets == -100).any()
    ]
    assert report.cases_judged == len(L.REGIONS) - len(with_ignored)


def test_check_uses_the_candidates_ignore_index():
    def ignores_seven(h, w, t):
        return F.cross_entropy(h @ w.T, t, ignore_index=7)

    report = check(ignores_seven, "linear_softmax_cross_entropy", backend="torch",
                   dtypes=["float64"], options={"ignore_index": 7},
                   skip=("all_ignored_nan",))  # fmt: skip
    # the ignored rows carry 7 (with -100 left in, this candidate would raise on them)
    assert not report.unsupported and report.cases_judged == len(L.REGIONS), report
    # F.cross_entropy's all-ignored mean is NaN (0 / 0, accepted by the skip) with zero gradients
    assert report.ok, report


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"axis": 1}, "`options` has 'axis', which spec.linear_softmax_cross_entropy does"),
        ({"bias": "yes"}, "`options['bias']` must be True"),
        ({"reduction": "avg"}, "`reduction` must be one of 'none', 'mean', 'sum'"),
    ],
)  # fmt: skip
def test_check_refuses_bad_options_with_one_sentence(options, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        check(lambda h, w, t: h.sum(), "linear_softmax_cross_entropy", backend="torch",
              options=options)  # fmt: skip


def _torch_chunked(h, w, t, b):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return F.linear_cross_entropy(h, w, t, linear_bias=b,
                                      options=torch.nn.LinearCrossEntropyOptions())  # fmt: skip


def test_check_on_torch_chunked_linear_cross_entropy_practical():
    # docs/linear.md: the one finding under the default (practical) standard, in every dtype,
    # is the all-ignored batch: the mean's 0 / 0 is NaN (torch's documented choice, named), and
    # so is every gradient (non-finite: the spec's gradient is 0)
    report = check(_torch_chunked, "linear_softmax_cross_entropy", backend="torch",
                   dtypes=["float64", "float32", "bfloat16"], options={"bias": True})  # fmt: skip
    assert [(h.region, h.failure.kind, h.dtypes) for h in report.hazards] == [
        ("all_ignored", "non-finite", ["float64", "float32", "bfloat16"])
    ], report
    problems = report.hazards[0].failure.problems
    assert len(problems) == 4 and all("is nan" in p for p in problems[:3]), problems
    assert problems[3].startswith("NaN loss on an all-ignored batch: "), problems
    assert report.cases_judged == 3 * len(L.REGIONS)


def test_check_on_torch_chunked_linear_cross_entropy_strict_bfloat16():
    # docs/linear.md: held to our own standard (float32 accumulation, results rounded once),
    # torch's bfloat16 gradients fail: the linear_weight gradient is accumulated in bfloat16
    report = check(_torch_chunked, "linear_softmax_cross_entropy", backend="torch",
                   dtypes=["bfloat16"], options={"bias": True}, standard="strict",
                   skip=["all_ignored"])  # fmt: skip
    weight = [h for h in report.hazards if any("linear_weight" in p for p in h.failure.problems)]
    assert {h.failure.kind for h in report.hazards} == {"accuracy"}, report
    assert {h.region for h in weight} >= {"typical", "ties", "one_class_dominant"}, report


# ----------------------------------------------------------------------------------------------
# JAX transformations
# ----------------------------------------------------------------------------------------------


def test_jax_jit_vmap_and_grad_agree_with_eager_calls():
    hidden, kernel, bias, targets = _region("ignored", n=12, v=20)
    h, k, b = (jnp.asarray(x, jnp.float32) for x in (hidden, kernel, bias))
    y = jnp.asarray(targets, jnp.int32)

    def f(h, k, b, y):
        return J.linear_softmax_focal_loss(h, k, y, bias=b, chunk_size=5)

    eager = f(h, k, b, y)
    np.testing.assert_allclose(jax.jit(f)(h, k, b, y), eager, rtol=1e-6)
    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(h, k, b, y)
    eager_grads = jax.grad(f, argnums=(0, 1, 2))(h, k, b, y)
    for g, e in zip(grads, eager_grads, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
    # vmap over a batch of 3 problems: each equals its own call
    hs = jnp.stack([h, 2 * h, -h])
    batched = jax.vmap(f, in_axes=(0, None, None, None))(hs, k, b, y)
    for i in range(3):
        np.testing.assert_allclose(batched[i], f(hs[i], k, b, y), rtol=1e-6)


def test_jax_out_of_range_index_under_jit_gives_nan_not_a_number():
    hidden, kernel, bias, targets = _region("typical", n=6, v=9)
    targets[2] = 11
    f = jax.jit(lambda y: J.linear_softmax_cross_entropy(hidden, kernel, y, reduction="none"))
    loss = np.asarray(f(jnp.asarray(targets)))
    assert np.isnan(loss[2]) and np.all(np.isfinite(np.delete(loss, 2)))


def test_jax_class_weight_gradient_is_nan_never_a_silent_zero():
    hidden, kernel, bias, targets = _region("typical", n=6, v=9)
    g = jax.grad(lambda w: J.linear_softmax_cross_entropy(hidden, kernel, targets, weight=w))(
        jnp.ones(9)
    )
    assert np.all(np.isnan(g))
