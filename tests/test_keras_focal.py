"""Keras 3's focal losses on the JAX backend, judged by ``parity.check`` (issue 10).

Measured with keras 3.15.1 (``keras/src/losses/losses.py``):

* ``categorical_focal_crossentropy(from_logits=True)`` takes the softmax, then clips it to
  [1e-7, 1 - 1e-7]: the loss stops at alpha * -log(1e-7) = 0.25 * 16.118 = 4.0295 where a
  confidently wrong row's loss is larger (margin 20: 5.23; margin 100: 25), with a logits
  gradient of 0 (the clip), for every gamma. The clip also keeps it finite: no NaN at gamma 0.5.
* ``binary_focal_crossentropy(from_logits=True)`` clips sigmoid(x) for the cross entropy (it
  stops at -log(1 - fl32(1 - 1e-7)) = 15.94, gradient 0), but forms the focal factor
  (1 - p_t) ** gamma from the unclipped p_t: at a confident correct element 1 - p_t is exactly
  0, and for gamma < 1 its derivative gamma * 0 ** (gamma - 1) = inf meets sigmoid's 0: a NaN
  logits gradient. With the default gamma = 2 it is finite.

So the issue's "NaN on the JAX backend" holds for the binary loss with gamma < 1 only, and the
4.03 cap is the categorical loss at its default alpha = 0.25.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

# the backend is chosen when keras is first imported
os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
jnp = pytest.importorskip("jax.numpy")

from dualloss import spec  # noqa: E402
from dualloss.parity import check  # noqa: E402

if keras.backend.backend() != "jax":  # keras was imported earlier with another backend
    pytest.skip("keras is not on its JAX backend in this process", allow_module_level=True)

# only the margin regions, which hold the verdicts (the others add time, not findings, here)
OTHERS = ("typical", "near_ties", "huge_shift", "masked", "soft_targets", "masked_soft",
          "ignored", "all_ignored", "classes", "spatial")  # fmt: skip
FAST = {"dtypes": ["float32"], "max_examples": 0, "jit": True, "skip": OTHERS}
ONLY_WRONG = dict(FAST, skip=(*OTHERS, "confident_correct"))
ONLY_CORRECT = dict(FAST, skip=(*OTHERS, "confident_wrong"))
CAP = 0.25 * -np.log(np.float32(1e-7))  # 4.0295


def keras_categorical_focal(x, t, gamma=2.0):
    """Keras's categorical focal loss as check calls a candidate: (logits, targets) -> mean."""
    if not jnp.issubdtype(t.dtype, jnp.floating):
        raise TypeError("categorical_focal_crossentropy takes one-hot / probability targets")
    loss = keras.losses.categorical_focal_crossentropy(t, x, from_logits=True, gamma=gamma)
    return jnp.mean(loss)


def keras_binary_focal(x, t, gamma=2.0):
    return jnp.mean(keras.losses.binary_focal_crossentropy(t, x, from_logits=True, gamma=gamma))


def _hazards(report):
    return {(h.failure.kind, h.region): h.failure for h in report.hazards}


def test_keras_categorical_focal_is_capped_at_4_03_with_a_vanishing_gradient():
    report = check(keras_categorical_focal, "softmax_focal_loss", backend="jax",
                   options={"gamma": 2.0, "alpha": 0.25}, **ONLY_WRONG)  # fmt: skip
    found = _hazards(report)
    assert set(report.unsupported) == {"index"}, report
    assert not any(kind == "non-finite" for kind, _ in found), report
    wrong = found[("accuracy", "confident_wrong")]
    assert wrong.received_value == pytest.approx(CAP, rel=1e-6), report
    assert wrong.expected_value > CAP + 1.0
    assert not np.any(wrong.received_grad), "the clip leaves no gradient"
    assert np.max(np.abs(wrong.expected_grad)) >= 0.2
    # the row: margin 100, the truth 25, keras 4.03
    z, t = np.array([[0.0, -100.0]], np.float32), np.array([[0.0, 1.0]], np.float32)
    keras_value = float(keras_categorical_focal(jnp.asarray(z), jnp.asarray(t)))
    truth = float(spec.softmax_focal_loss(z.astype(float), t.astype(float), alpha=0.25))
    assert keras_value == pytest.approx(CAP, rel=1e-6) and truth == pytest.approx(25.0)


def test_keras_categorical_focal_stays_finite_for_gamma_below_one():
    fn = lambda x, t: keras_categorical_focal(x, t, gamma=0.5)  # noqa: E731
    report = check(fn, "softmax_focal_loss", backend="jax", options={"gamma": 0.5, "alpha": 0.25},
                   **ONLY_CORRECT)  # fmt: skip
    assert report.cases_judged >= 20
    assert not any(h.failure.kind == "non-finite" for h in report.hazards), report


def test_keras_binary_focal_is_capped_at_15_94_and_nan_for_gamma_below_one():
    report = check(keras_binary_focal, "sigmoid_focal_loss", backend="jax",
                   options={"gamma": 2.0}, **ONLY_WRONG)  # fmt: skip
    found = _hazards(report)
    assert not any(kind == "non-finite" for kind, _ in found), report
    wrong = found[("accuracy", "confident_wrong")]
    assert wrong.received_value == pytest.approx(15.942385, rel=1e-6), report
    assert wrong.expected_value >= 19.9 and not np.any(wrong.received_grad)

    fn = lambda x, t: keras_binary_focal(x, t, gamma=0.5)  # noqa: E731
    report = check(fn, "sigmoid_focal_loss", backend="jax", options={"gamma": 0.5}, **ONLY_CORRECT)
    nan = _hazards(report)[("non-finite", "confident_correct")]
    assert nan.problems[0].startswith("gradient is nan"), report
    assert np.all(np.isfinite(nan.expected_grad))
