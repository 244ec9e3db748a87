"""Hypothesis strategies for the spec property tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dualloss import losses

# moderate logits: central finite differences stay meaningful (see test_spec_properties.py)
LOGIT_BOUND = 20.0

gammas = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.3]) | st.floats(0.0, 5.0)
label_smoothings = st.just(0.0) | st.floats(0.0, 1.0)
reductions = st.sampled_from(["none", "mean", "sum"])


def logits(shape, bound: float = LOGIT_BOUND):
    """Finite float64 logits of `shape`, in [-bound, bound]."""
    return hnp.arrays(
        np.float64, shape, elements=st.floats(-bound, bound, allow_subnormal=False, width=64)
    )


@st.composite
def softmax_problems(draw, soft=None, max_batch: int = 4, max_classes: int = 5):
    """(logits of shape (N, C), targets): class indices of shape (N,) or probabilities (N, C)."""
    n = draw(st.integers(1, max_batch))
    c = draw(st.integers(2, max_classes))
    z = draw(logits((n, c)))
    if soft is None:
        soft = draw(st.booleans())
    if soft:
        raw = draw(hnp.arrays(np.float64, (n, c), elements=st.floats(0.0, 1.0)))
        raw[:, 0] += 1e-3
        targets = raw / raw.sum(axis=-1, keepdims=True)
    else:
        targets = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    return z, targets


@st.composite
def class_vectors(draw, num_classes: int, low: float = 0.0, high: float = 1.0):
    """A length-C float64 vector with entries in [low, high] (weights, alpha)."""
    return draw(hnp.arrays(np.float64, (num_classes,), elements=st.floats(low, high)))


@st.composite
def focal_alphas(draw, num_classes: int):
    """None, a scalar in [0, 1], or a length-C vector in [0, 1]."""
    kind = draw(st.sampled_from(["none", "scalar", "vector"]))
    if kind == "none":
        return None
    if kind == "scalar":
        return draw(st.floats(0.0, 1.0))
    return draw(class_vectors(num_classes))


@st.composite
def sigmoid_problems(draw, max_size: int = 6, bound: float = LOGIT_BOUND):
    """(logits, targets) of the same shape (a vector or a small matrix), targets in [0, 1]."""
    shape = draw(st.sampled_from([(max_size,), (2, max_size // 2)]))
    z = draw(logits(shape, bound))
    t = draw(
        hnp.arrays(np.float64, shape, elements=st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0))
    )
    return z, t


@st.composite
def softmax_options(draw, num_classes: int, focal: bool):
    """Keyword arguments of softmax_cross_entropy (focal False) or softmax_focal_loss."""
    kwargs = {"label_smoothing": draw(label_smoothings), "reduction": draw(reductions)}
    if focal:
        kwargs["gamma"] = draw(gammas)
        kwargs["alpha"] = draw(focal_alphas(num_classes))
    else:
        kwargs["weight"] = draw(st.none() | class_vectors(num_classes, 0.1, 3.0))
    return kwargs


@st.composite
def softmax_calls(draw, soft=None):
    """(name, logits, targets, kwargs) for one of the two softmax losses."""
    name = draw(st.sampled_from([info.name for info in losses.of_family("softmax")]))
    z, targets = draw(softmax_problems(soft=soft))
    kwargs = draw(softmax_options(z.shape[-1], focal=losses.get(name).is_focal))
    return name, z, targets, kwargs


@st.composite
def sigmoid_calls(draw):
    """(name, logits, targets, kwargs) for one of the two sigmoid losses."""
    name = draw(st.sampled_from([info.name for info in losses.of_family("sigmoid")]))
    z, t = draw(sigmoid_problems())
    kwargs = {"reduction": draw(reductions)}
    if losses.get(name).is_focal:
        kwargs["gamma"] = draw(gammas)
        kwargs["alpha"] = draw(st.none() | st.floats(0.0, 1.0))
    else:
        positive = st.floats(0.1, 3.0)
        kwargs["weight"] = draw(st.none() | hnp.arrays(np.float64, z.shape, elements=positive))
        kwargs["pos_weight"] = draw(
            st.none() | hnp.arrays(np.float64, z.shape[-1:], elements=positive)
        )
    return name, z, t, kwargs
