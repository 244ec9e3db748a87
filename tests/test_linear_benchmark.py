"""benchmarks/linear.py keeps working (tiny shape, seconds, no timed assertions), and its pairs
compute the same loss, so that a ratio compares like with like."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

for _module in ("torch", "jax", "optax"):
    pytest.importorskip(_module)

from benchmarks import linear  # noqa: E402


def test_torch_methods_compute_the_same_cross_entropy():
    hidden, weight, targets = linear._torch_inputs(64, 16, 500)
    values = {
        m: linear._torch_loss(m)(hidden, weight, targets).item() for m in linear.TORCH_METHODS
    }
    ce = values.pop("ours_focal")
    assert ce < values["ours"]  # the focal loss is smaller than CE for every row
    for value in values.values():
        assert abs(value - values["unfused"]) <= 1e-5 * abs(values["unfused"])


def test_jax_methods_compute_the_same_cross_entropy():
    jitted, hidden, weight = linear._jax_functions(64, 16, 500)
    ours = float(jitted["ours"](hidden, weight)[0])
    unfused = float(jitted["unfused"](hidden, weight)[0])
    assert abs(ours - unfused) <= 1e-5 * abs(unfused)


def test_benchmark_parts_run_at_a_tiny_shape():
    assert set(linear.torch_times(32, 8, 100, reps=1)) == set(linear.TORCH_METHODS)
    assert set(linear.jax_times(32, 8, 100, reps=1)) == set(linear.JAX_METHODS)
    memory = linear.jax_memory(32, 8, 100)
    assert memory["unfused"] >= 32 * 100 * 4  # the logits are among XLA's temporaries
    assert linear.torch_memory("ours", 32, 8, 100) >= 0
