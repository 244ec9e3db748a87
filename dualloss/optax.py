"""Drop-ins for ``optax.losses`` with optax's exact signatures, defaults and per-example outputs.

Built on ``dualloss.jax_impl`` (its closed-form, NaN-safe gradients); nothing here imports
optax. This module sits above ``jax_impl``: ``softmax_cross_entropy_with_integer_labels`` and
``sigmoid_binary_cross_entropy`` are jax_impl's own (``jax_impl.softmax``, ``jax_impl.sigmoid``),
imported here, and nothing in ``jax_impl`` imports this module.
Replace ``optax.losses.X`` with ``dualloss.optax.X``:

* ``softmax_cross_entropy_with_integer_labels(logits, labels, axis=-1, where=None)``
* ``softmax_cross_entropy(logits, labels, axis=-1, where=None)``
* ``sigmoid_binary_cross_entropy(logits, labels)``
* ``sigmoid_focal_loss(logits, labels, *, alpha=None, gamma=2.0)``

As in optax: `axis` is an int or a tuple of axes (the class axes, flattened in their order; a
label is a flat index into them); `where` is of the logits shape or of the batch shape (a mask
with fewer dimensions than the logits gets the class axes inserted at `axis`, optax's
``expand_dims``); a `where`-masked class leaves the normaliser and the target sum; a row with no
class left gives 0. Labels are cast to the logits dtype and broadcast where optax does.

Where the result differs from optax, dualloss is the one that is finite or exact:

* A class-index label on a class outside `where` gives 0 and zero gradient (the label has no
  mass left, the row counts as ignored); optax gives ``logsumexp_where(z) - z_label``, a finite
  number that is no cross entropy (it can be negative).
* A -inf logit (a class mask by logit) with label 0 gives 0 and a finite gradient, not NaN
  (optax's ``softmax_cross_entropy`` computes 0 * -inf); gradients are dualloss's closed forms.
* Labels equal to -100 give 0 (torch's ignore_index); other labels outside [0, C) raise in eager
  calls and give NaN under jit (optax gathers an arbitrary or filled value).
* ``sigmoid_focal_loss``: `alpha` must be None or a scalar in [0, 1] (optax also takes an array
  broadcastable to the logits), `gamma` a scalar >= 0; both may be traced.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from . import _checks, jax_impl
from .jax_impl._inputs import _class_axes_last, _expand_where, _not_torch
from .jax_impl.sigmoid import sigmoid_binary_cross_entropy
from .jax_impl.softmax import softmax_cross_entropy_with_integer_labels

__all__ = [
    "softmax_cross_entropy_with_integer_labels",
    "softmax_cross_entropy",
    "sigmoid_binary_cross_entropy",
    "sigmoid_focal_loss",
]

ArrayLike = Any


def softmax_cross_entropy(
    logits: ArrayLike,
    labels: ArrayLike,
    axis: int | tuple[int, ...] | None = -1,
    where: ArrayLike | None = None,
) -> jax.Array:
    """``optax.losses.softmax_cross_entropy``: -sum_c labels_c log softmax(logits)_c.

    Args:
      logits: floating array.
      labels: class probabilities (or one-hot rows), broadcastable to the logits; cast to the
        logits dtype.
      axis: the class axis, a tuple of class axes, or None (every axis).
      where: boolean mask of the logits shape or of the batch shape (see the module docstring).

    Returns:
      The per-example losses, the logits shape without the class axes.
    """
    _not_torch(logits=logits, labels=labels, where=where)
    logits = jnp.asarray(logits)
    _checks.float_logits("logits", jnp.issubdtype(logits.dtype, jnp.floating), logits.dtype)
    labels = jnp.broadcast_to(jnp.asarray(labels).astype(logits.dtype), logits.shape)
    if axis is None:
        axis = tuple(range(logits.ndim))
    where = _expand_where(where, logits, axis)
    if not isinstance(axis, int) or isinstance(axis, bool):
        logits, (labels, where), axis = _class_axes_last(logits, axis, labels, where)
    return jax_impl.softmax_cross_entropy(logits, labels, axis=axis, where=where, reduction="none")


def sigmoid_focal_loss(
    logits: ArrayLike,
    labels: ArrayLike,
    *,
    alpha: ArrayLike | None = None,
    gamma: ArrayLike = 2.0,
) -> jax.Array:
    """``optax.losses.sigmoid_focal_loss``: alpha_t (1 - p_t)^gamma ce, element-wise.

    `labels` (0/1 or soft, in [0, 1]) are cast to the logits dtype and broadcast. `alpha` None
    or a scalar in [0, 1], `gamma` a scalar >= 0; either may be traced.
    """
    _not_torch(logits=logits, labels=labels, alpha=alpha, gamma=gamma)
    logits = jnp.asarray(logits)
    _checks.float_logits("logits", jnp.issubdtype(logits.dtype, jnp.floating), logits.dtype)
    labels = jnp.broadcast_to(jnp.asarray(labels).astype(logits.dtype), logits.shape)
    return jax_impl.sigmoid_focal_loss(logits, labels, gamma=gamma, alpha=alpha, reduction="none")
