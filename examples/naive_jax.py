"""Two focal losses as they are written by hand in JAX, both one bad step from NaN.

Kept in their own module so that the oracle's reproducers can import them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def classic_focal_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """The classic: ``log(softmax)`` then ``take_along_axis``, gamma = 2.

    ``softmax`` rounds a confidently wrong target's probability to 0, ``log(0) = -inf``, and the
    backward pass multiplies ``1/p = inf`` by 0.
    """
    p = jax.nn.softmax(logits, axis=-1)
    log_pt = jnp.take_along_axis(jnp.log(p), targets[:, None], axis=-1)[:, 0]
    return jnp.mean(-((1 - jnp.exp(log_pt)) ** 2) * log_pt)


def textbook_focal_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """The textbook fix: ``log_softmax``, and ``(1 - p) ** gamma`` with gamma = 0.5 < 1.

    The forward pass is finite, but once a target's probability rounds to 1 the derivative of
    ``(1 - p) ** 0.5`` is ``inf`` and the backward pass multiplies it by ``log p = 0``.
    """
    log_p = jax.nn.log_softmax(logits, axis=-1)
    log_pt = jnp.take_along_axis(log_p, targets[:, None], axis=-1)[:, 0]
    return jnp.mean(-((1 - jnp.exp(log_pt)) ** 0.5) * log_pt)
