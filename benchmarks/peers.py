"""The losses a user would call instead of dualloss, one per (framework, loss).

Each peer is called exactly like the dualloss function it is compared with in ``run.py``:
``peer(logits, targets)`` returns a scalar (mean reduction), with the loss settings of
``SETTINGS`` below, so that candidate and peer do the same amount of work.

torch:
  softmax_cross_entropy  torch.nn.functional.cross_entropy
  softmax_focal_loss     kornia.losses.focal_loss (alpha weights class 0 by 1 - alpha and the
                         others by alpha; ours weights every class by alpha: same cost)
  sigmoid_cross_entropy  torch.nn.functional.binary_cross_entropy_with_logits
  sigmoid_focal_loss     torchvision.ops.sigmoid_focal_loss, its formula as in
                         ``dualloss.parity.peers`` (torchvision cannot be installed next to this
                         torch build)
JAX (the benchmark jits value_and_grad of both):
  softmax_cross_entropy  optax.softmax_cross_entropy_with_integer_labels(...).mean()
  softmax_focal_loss     a log_softmax-based focal loss, as a user would write it (below)
  sigmoid_cross_entropy  optax.sigmoid_binary_cross_entropy(...).mean()
  sigmoid_focal_loss     optax.sigmoid_focal_loss(...).mean()
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from dualloss import losses
from dualloss.parity.peers import torchvision_sigmoid_focal

LOSSES = losses.NAMES

# Loss settings shared by candidate and peer: the defaults of the focal-loss papers (registry).
GAMMA = losses.SOFTMAX_FOCAL_LOSS.benchmark_options["gamma"]
ALPHA = losses.SOFTMAX_FOCAL_LOSS.benchmark_options["alpha"]
SETTINGS: dict[str, dict[str, float]] = {
    info.name: info.benchmark_options for info in losses.LOSSES
}

PEER_NAMES = {
    ("torch", "softmax_cross_entropy"): "F.cross_entropy",
    ("torch", "softmax_focal_loss"): "kornia.losses.focal_loss",
    ("torch", "sigmoid_cross_entropy"): "F.binary_cross_entropy_with_logits",
    ("torch", "sigmoid_focal_loss"): "torchvision sigmoid_focal_loss formula",
    ("jax", "softmax_cross_entropy"): "optax.softmax_cross_entropy_with_integer_labels",
    ("jax", "softmax_focal_loss"): "log_softmax focal (user-written)",
    ("jax", "sigmoid_cross_entropy"): "optax.sigmoid_binary_cross_entropy",
    ("jax", "sigmoid_focal_loss"): "optax.sigmoid_focal_loss",
}


# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------


def torch_peers() -> dict[str, Callable]:
    """Peer callables ``f(logits, targets) -> scalar`` for torch, class dim 1."""
    import kornia.losses
    import torch.nn.functional as F

    def softmax_cross_entropy(logits, targets):
        return F.cross_entropy(logits, targets)

    def softmax_focal_loss(logits, targets):
        # kornia needs alpha as a Python float; its 'mean' divides by N * C, not N (same cost).
        return kornia.losses.focal_loss(logits, targets, alpha=ALPHA, gamma=GAMMA, reduction="mean")

    def sigmoid_cross_entropy(logits, targets):
        return F.binary_cross_entropy_with_logits(logits, targets)

    def sigmoid_focal_loss(logits, targets):
        return torchvision_sigmoid_focal(logits, targets, gamma=GAMMA, alpha=ALPHA)

    return {
        "softmax_cross_entropy": softmax_cross_entropy,
        "softmax_focal_loss": softmax_focal_loss,
        "sigmoid_cross_entropy": sigmoid_cross_entropy,
        "sigmoid_focal_loss": sigmoid_focal_loss,
    }


def torch_candidates() -> dict[str, Callable]:
    """dualloss.torch_impl callables with the same settings and calling convention as the peers
    (class axis: the backend's default)."""
    from dualloss import torch_impl

    return {
        info.name: partial(getattr(torch_impl, info.name), **info.benchmark_options)
        for info in losses.LOSSES
    }


# ----------------------------------------------------------------------------------------------
# JAX
# ----------------------------------------------------------------------------------------------


def log_softmax_focal_loss(logits, labels, alpha: float = 0.25, gamma: float = 2.0):
    """Softmax focal loss with integer labels as a JAX user writes it: log_softmax, gather, mean."""
    import jax
    import jax.numpy as jnp

    log_p = jax.nn.log_softmax(logits, axis=-1)
    log_p_t = jnp.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
    p_t = jnp.exp(log_p_t)
    loss = -alpha * (1.0 - p_t) ** gamma * log_p_t
    return loss.mean()


def jax_peers() -> dict[str, Callable]:
    """Peer callables ``f(logits, targets) -> scalar`` for JAX, class axis -1 (not jitted)."""
    import optax

    def softmax_cross_entropy(logits, targets):
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def softmax_focal_loss(logits, targets):
        return log_softmax_focal_loss(logits, targets, alpha=ALPHA, gamma=GAMMA)

    def sigmoid_cross_entropy(logits, targets):
        return optax.sigmoid_binary_cross_entropy(logits, targets).mean()

    def sigmoid_focal_loss(logits, targets):
        return optax.sigmoid_focal_loss(logits, targets, alpha=ALPHA, gamma=GAMMA).mean()

    return {
        "softmax_cross_entropy": softmax_cross_entropy,
        "softmax_focal_loss": softmax_focal_loss,
        "sigmoid_cross_entropy": sigmoid_cross_entropy,
        "sigmoid_focal_loss": sigmoid_focal_loss,
    }


def jax_candidates() -> dict[str, Callable]:
    """dualloss.jax_impl callables with the same settings and calling convention as the peers
    (class axis: the backend's default)."""
    from dualloss import jax_impl

    return {
        info.name: partial(getattr(jax_impl, info.name), **info.benchmark_options)
        for info in losses.LOSSES
    }
