"""Cases are deterministic, cover the regions, and survive the torch layout round trip."""

from __future__ import annotations

import numpy as np
import pytest

from dualloss import spec
from dualloss.parity import backends as B
from dualloss.parity.cases import LOSSES, REGIONS, from_torch_layout, make_cases, margins


@pytest.mark.parametrize("loss", LOSSES)
def test_cases_are_deterministic(loss):
    a = make_cases(loss, "float32")
    b = make_cases(loss, "float32")
    assert [c.name for c in a] == [c.name for c in b]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.logits, y.logits)


def test_softmax_regions_all_present():
    found = {c.region for c in make_cases("softmax_focal_loss", "float16")}
    assert found == set(REGIONS)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_margins_reach_near_the_dtype_range_and_stay_finite(dtype):
    ms = margins(dtype)
    assert ms[0] == 20.0
    rounded = B.round_to(np.array(ms), dtype).astype(float)
    assert np.all(np.isfinite(rounded))
    assert ms[-1] > 1e4


def test_hidden_rows_sit_at_odd_offsets():
    hidden = [c for c in make_cases("softmax_cross_entropy", "float32") if "hidden" in c.label]
    assert hidden and all(c.logits.shape[0] == 67 and 37 in c.hot_rows for c in hidden)


def test_large_c_case_is_present_and_small_n():
    (big,) = [
        c for c in make_cases("softmax_cross_entropy", "float32") if c.label.startswith("C=3")
    ]
    assert big.logits.shape[-1] >= 32768 and big.logits.shape[0] <= 2


def test_spec_is_finite_on_every_case():
    for loss in LOSSES:
        for case in make_cases(loss, "float32"):
            grad = getattr(spec, loss + "_grad")(case.logits, case.targets, **case.options)
            if case.region != "masked_soft":
                assert np.all(np.isfinite(grad)), case.name


def test_rounding_is_single_and_exact():
    x = np.array([1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-11 + 2.0**-40])
    assert B.round_to(x, "bfloat16").astype(float)[0] == 1 + 2.0**-7
    assert B.round_to(x, "float16").astype(float)[1] == 1 + 2.0**-10


def test_torch_layout_round_trip():
    torch = pytest.importorskip("torch")
    case = [c for c in make_cases("softmax_cross_entropy", "float32") if c.region == "spatial"][0]
    assert case.logits.ndim == 4  # (N, d1, d2, C)
    t = B.torch_array(B.to_torch_layout(case.logits), "float32", "cpu")
    assert t.dtype == torch.float32
    # torch's layout written out: t[n, c, i, j] is logits[n, i, j, c], rounded to float32
    expected = case.logits.astype(np.float32).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(t.numpy(), expected)
    n, i, j, c = (s - 1 for s in case.logits.shape)
    assert t[n, c, i, j].item() == np.float32(case.logits[n, i, j, c])
    back = from_torch_layout(t.double().numpy())
    np.testing.assert_array_equal(back, case.logits.astype(np.float32).astype(float))


def test_both_frameworks_get_identical_bits():
    pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    case = make_cases("sigmoid_focal_loss", "bfloat16")[0]
    prep = B.prepare(case, "bfloat16")
    xt = B.torch_array(prep.logits, "bfloat16", "cpu")
    xj = B.jax_array(prep.logits, "bfloat16", jax.devices()[0])
    np.testing.assert_array_equal(xt.float().numpy(), np.asarray(xj).astype(np.float32))
