"""Gradient accumulation that gives exactly the one-batch gradient (issue 29, DESIGN 12).

A batch of 64 tokens (some ignored, ``-100``) is split into four micro-batches with different
numbers of kept tokens. Dividing each micro-batch's loss by its own count (``reduction='mean'``,
the 2024 gradient-accumulation bug in transformers' trainers) and averaging over the micro-batches
weighs tokens unequally; ``normalizer=global_count(...)`` divides every micro-batch by the count of
the whole step, so the accumulated gradient is the one-batch gradient. The same in torch and JAX;
on several ranks/devices, ``global_count(..., process_group=...)`` / ``(..., axis_name=...)`` adds
the other ranks' counts with one all-reduce.

Run: ``python -m examples.grad_accumulation``.
"""

from __future__ import annotations

import numpy as np

MICRO_BATCHES = 4


def data(seed: int = 0, n: int = 64, hidden: int = 16, classes: int = 10):
    """Features (n, hidden), a head (hidden, classes) and targets with a varying share ignored."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, hidden))
    head = rng.normal(size=(hidden, classes)) * 0.3
    targets = rng.integers(0, classes, size=n)
    # the first micro-batch keeps few tokens, the last all: per-micro-batch means disagree
    targets[: n // 8 * 3] = np.where(
        rng.uniform(size=n // 8 * 3) < 0.7, -100, targets[: n // 8 * 3]
    )
    return features, head, targets


def torch_gradients(accumulate: str = "normalizer", seed: int = 0):
    """The head's gradient, one batch and accumulated over four micro-batches (float64).

    `accumulate`: 'normalizer' (the global count) or 'mean' (each micro-batch's own mean,
    averaged: the bug). Returns (one_batch, accumulated) NumPy arrays."""
    import torch

    from dualloss import torch_impl

    features, head, targets = (torch.tensor(a) for a in data(seed))
    weight = head.clone().requires_grad_(True)
    torch_impl.softmax_focal_loss(features @ weight, targets, gamma=2.0).backward()
    one_batch = weight.grad.clone()
    weight.grad = None
    micro = list(zip(features.chunk(MICRO_BATCHES), targets.chunk(MICRO_BATCHES), strict=True))
    count = torch_impl.global_count([t for _, t in micro])  # one all-reduce per step if distributed
    for x, t in micro:
        if accumulate == "normalizer":
            loss = torch_impl.softmax_focal_loss(x @ weight, t, gamma=2.0, normalizer=count)
        else:
            loss = torch_impl.softmax_focal_loss(x @ weight, t, gamma=2.0) / MICRO_BATCHES
        loss.backward()
    return one_batch.numpy(), weight.grad.numpy()


def jax_gradients(accumulate: str = "normalizer", seed: int = 0):
    """As ``torch_gradients``, in JAX (float64)."""
    import jax
    import jax.numpy as jnp

    from dualloss import jax_impl

    with jax.enable_x64(True):
        features, head, targets = (jnp.asarray(a) for a in data(seed))

        def loss(weight, x, t, normalizer=None):
            return jax_impl.softmax_focal_loss(x @ weight, t, gamma=2.0, normalizer=normalizer)

        one_batch = jax.grad(loss)(head, features, targets)
        micro = list(
            zip(jnp.split(features, MICRO_BATCHES), jnp.split(targets, MICRO_BATCHES), strict=True)
        )
        count = jax_impl.global_count([t for _, t in micro])  # axis_name=...: one psum
        accumulated = jnp.zeros_like(head)
        for x, t in micro:
            if accumulate == "normalizer":
                accumulated = accumulated + jax.grad(loss)(head, x, t, count)
            else:
                accumulated = accumulated + jax.grad(loss)(head, x, t) / MICRO_BATCHES
        return np.asarray(one_batch), np.asarray(accumulated)


def main() -> None:
    for name, gradients in (("torch", torch_gradients), ("jax", jax_gradients)):
        for accumulate in ("normalizer", "mean"):
            one, acc = gradients(accumulate)
            error = np.max(np.abs(acc - one)) / np.max(np.abs(one))
            print(f"{name:5s} {accumulate:10s} max relative difference {error:.1e}")


if __name__ == "__main__":
    main()
