"""The parity run's verdict and summary: a run that judged nothing, or could not load an
implementation it was asked for, does not hold; the table leads with err/tol."""

from __future__ import annotations

import pytest

from dualloss.parity import backends as B
from dualloss.parity import report, runner
from dualloss.parity.cases import make_cases

pytest.importorskip("torch")


def _unavailable(loss="sigmoid_cross_entropy"):
    """What ``backends.ours`` returns when torch_impl cannot be imported."""
    return B.Implementation(
        "torch_impl", "torch", loss, None, lambda o, a: None, "", lambda kw: "",
        notes=[f"dualloss.torch_impl.{loss} unavailable: ImportError: broken"],
    )  # fmt: skip


def test_unloadable_implementation_is_not_parity():
    result = runner.run_matrix([_unavailable()], dtypes=["float32"], regions=["typical"],
                               progress=False)  # fmt: skip
    assert result.judged == 0 and not result.ok
    assert result.unavailable == ["torch_impl.sigmoid_cross_entropy"]
    text = report.terminal_summary(result)
    assert "PARITY NOT VERIFIED" in text and "PARITY HOLDS" not in text
    assert "NOT JUDGED: torch_impl.sigmoid_cross_entropy" in text


def test_unloadable_next_to_a_sound_one_is_not_parity():
    sound = B.ours("torch", "sigmoid_cross_entropy")
    result = runner.run_matrix([sound, _unavailable()], dtypes=["float32"],
                               regions=["typical"], progress=False)  # fmt: skip
    assert result.judged > 0 and not result.failures
    assert not result.ok


def test_empty_run_is_not_parity():
    result = runner.run_matrix([], dtypes=["float32"], progress=False)
    assert not result.ok
    assert "PARITY NOT VERIFIED: 0 judged calls" in report.terminal_summary(result)


def test_summary_leads_with_err_over_tol_and_drops_raw_ulps():
    sound = B.ours("torch", "sigmoid_cross_entropy")
    result = runner.run_matrix([sound], dtypes=["float32"], regions=["typical"], progress=False)
    text = report.terminal_summary(result)
    header = next(line for line in text.splitlines() if line.startswith("loss"))
    assert header.split()[5:7] == ["worst", "err/tol"], header
    assert "ULP" not in header
    assert "PARITY HOLDS" in text


def test_progress_is_quiet_when_not_a_terminal(capsys):
    bar = runner.Progress(10.0)
    bar.step("label", 4.0)
    bar.close()
    assert capsys.readouterr().err == ""


def test_case_cost_weights_expensive_modes():
    case = make_cases("softmax_cross_entropy", "float32", regions=["typical"])[0]
    big = make_cases("softmax_cross_entropy", "float32", regions=["classes"])[-1]
    assert runner.case_cost(big, "torch", "eager") > 2 * runner.case_cost(case, "torch", "eager")
    assert runner.case_cost(case, "jax", "eager") > runner.case_cost(case, "jax", "jit")
    eager = runner.case_cost(case, "torch", "eager")
    assert runner.case_cost(case, "torch", "compile") > 10 * eager


def test_backends_side_by_side_give_the_run_one_after_the_other_gives():
    # the CLI runs each backend in a thread of its own (torch in the calling one): the same
    # records in the same order, the same verdicts, notes and cross-backend diagnostics
    pytest.importorskip("jax")
    impls = [B.ours("torch", "softmax_focal_loss"), B.ours("jax", "softmax_focal_loss")]
    impls.append(_unavailable("softmax_focal_loss"))
    kwargs = dict(dtypes=["float32"], regions=["typical", "confident_wrong"], progress=False)
    apart = runner.run_matrix(impls, side_by_side=True, **kwargs)
    along = runner.run_matrix(impls, **kwargs)
    assert apart.judged > 0 and not apart.failures

    def rows(result):
        return [(r.impl, r.mode, r.dtype, r.case, r.kind, r.value_ulp, r.grad_ulp)
                for r in result.records]  # fmt: skip

    assert rows(apart) == rows(along)
    assert [d["pair"] for d in apart.diagnostics] == [d["pair"] for d in along.diagnostics]
    assert any("jax_impl" in d["pair"] and "torch_impl" in d["pair"] for d in apart.diagnostics)
    for field in ("notes", "unavailable", "untested", "unsupported", "config"):
        assert getattr(apart, field) == getattr(along, field), field
    assert apart.ok == along.ok is False  # the unloadable implementation


def test_a_gradient_of_our_own_backend_that_raises_is_a_failure_not_left_out():
    # the run differentiates dualloss's backends w.r.t. the probability targets and class
    # vectors too (``backends.our_wrt``); where that raised (JAX inside shard_map: pmax has no
    # differentiation rule) the call fell back to the logits' gradient alone and held
    jax = pytest.importorskip("jax")
    from dualloss import jax_impl

    def opaque_targets(x, t, **kwargs):
        # the targets through a callback, which has no derivative: differentiating them raises
        t = jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(t.shape, t.dtype), t)
        return jax_impl.softmax_cross_entropy(x, t, **kwargs)

    impl = B.ours("jax", "softmax_cross_entropy")
    impl.fn = opaque_targets
    result = runner.run_matrix([impl], dtypes=["float32"], regions=["typical", "soft_targets"],
                               progress=False)  # fmt: skip
    cases = make_cases("softmax_cross_entropy", "float32", regions=["typical", "soft_targets"])
    index = {c.name for c in cases if c.index_targets}
    # class indices: nothing but the logits to differentiate, judged as before
    assert sorted({r.kind for r in result.records if r.case in index}) == ["ok"]
    assert sorted({r.kind for r in result.records if r.case not in index}) == ["error"]
    assert not result.ok
    assert any(
        "the gradient w.r.t. targets: differentiating it raised" in f.problems[0]
        for f in result.failures
    ), [f.problems for f in result.failures]
