"""Gradient accumulation with ``normalizer=global_count(...)`` gives the one-batch gradient (issue
29): the example's claim, in torch and JAX, plus ``global_count`` itself.

The logits' gradient of each micro-batch is the one-batch gradient's rows, bit for bit (the same
rows divided by the same count). The head's gradient sums the four micro-batches' products in
another order than the one-batch product: it may differ by the reordering of a sum of 64 products,
at most 64 u sum_i |x_i| |g_i| per entry (u = 2^-53), and by nothing else; each micro-batch's own
mean (the bug) is off by more than 10%.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from dualloss import jax_impl, spec  # noqa: E402
from dualloss import torch_impl as ti  # noqa: E402
from examples import grad_accumulation as example  # noqa: E402

U = 2.0**-53


def _reordering_bound(seed):
    """64 u sum_i |x_i| |g_i|, g the spec's gradient of the one-batch mean w.r.t. the logits."""
    features, head, targets = example.data(seed)
    g = spec.softmax_focal_loss_grad(features @ head, targets, gamma=2.0)
    return 64 * U * (np.abs(features).T @ np.abs(g))


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("seed", [0, 1])
def test_accumulated_head_gradient_is_the_one_batch_gradient(framework, seed):
    gradients = {"torch": example.torch_gradients, "jax": example.jax_gradients}[framework]
    one, accumulated = gradients("normalizer", seed)
    bound = _reordering_bound(seed)
    assert np.all(np.abs(accumulated - one) <= bound), np.max(np.abs(accumulated - one) / bound)
    # the per-micro-batch mean is the bug the normalizer fixes: far outside the bound
    one, wrong = gradients("mean", seed)
    assert np.max(np.abs(wrong - one)) > 0.1 * np.max(np.abs(one))


def test_torch_micro_batch_logit_gradients_are_the_one_batch_rows_bit_for_bit():
    features, head, targets = example.data(2)
    logits = torch.tensor(features @ head, requires_grad=True)
    targets = torch.tensor(targets)
    ti.softmax_cross_entropy(logits, targets, label_smoothing=0.1).backward()
    count = ti.global_count(list(targets.chunk(4)))
    rows = []
    for z, t in zip(logits.detach().chunk(4), targets.chunk(4), strict=True):
        z = z.clone().requires_grad_(True)
        ti.softmax_cross_entropy(z, t, label_smoothing=0.1, normalizer=count).backward()
        rows.append(z.grad)
    np.testing.assert_array_equal(torch.cat(rows).numpy(), logits.grad.numpy())


def test_jax_micro_batch_logit_gradients_are_the_one_batch_rows_bit_for_bit():
    features, head, targets = example.data(2)
    with jax.enable_x64(True):
        logits, targets = jnp.asarray(features @ head), jnp.asarray(targets)

        def loss(z, t, n=None):
            return jax_impl.softmax_cross_entropy(z, t, label_smoothing=0.1, normalizer=n)

        one = jax.grad(loss)(logits, targets)
        count = jax_impl.global_count(jnp.split(targets, 4))
        rows = [jax.grad(loss)(z, t, count) for z, t in
                zip(jnp.split(logits, 4), jnp.split(targets, 4), strict=True)]  # fmt: skip
        np.testing.assert_array_equal(np.concatenate(rows), np.asarray(one))


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_global_count_counts_kept_targets_and_sums_their_weights(backend):
    targets = np.array([0, 3, -100, 2, 3, 1])
    weight = np.array([0.5, 1.0, 2.0, 4.0])
    if backend == "torch":
        count = ti.global_count(torch.tensor(targets))
        weighted = ti.global_count(
            [torch.tensor(targets[:3]), torch.tensor(targets[3:])],
            weight=torch.tensor(weight),
        )
        assert count.dtype == torch.int64
    else:
        count = jax_impl.global_count(jnp.asarray(targets))
        weighted = jax_impl.global_count(
            [jnp.asarray(targets[:3]), jnp.asarray(targets[3:])],
            weight=jnp.asarray(weight),
        )
    assert int(count) == 5
    # the micro-batches counted together: weight[y] over the kept targets 0, 3, 2, 3, 1
    assert float(weighted) == 0.5 + 4.0 + 2.0 + 4.0 + 1.0
    assert int(jax_impl.global_count(jnp.asarray(targets), ignore_index=3)) == 4


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_global_count_refuses_floating_targets_and_an_uninitialised_group(backend):
    if backend == "torch":
        with pytest.raises(TypeError, match=r"`targets` must hold integer class indices"):
            ti.global_count(torch.zeros(3))
        with pytest.raises(ValueError, match=r"`process_group` needs torch.distributed"):
            ti.global_count(torch.zeros(3, dtype=torch.int64), process_group=object())
    else:
        with pytest.raises(TypeError, match=r"`targets` must hold integer class indices"):
            jax_impl.global_count(jnp.zeros(3))
