"""Past one device (DESIGN 12), JAX: the global count that ``normalizer=`` divides by.

``global_count`` counts the kept class-index targets (or sums their class weights) and, inside
``shard_map``/``pmap``, adds the other devices' with one ``psum`` over the named mesh axes: passed
as ``normalizer=`` to every micro-batch on every device, the summed gradients equal the gradient
of the one-big-batch mean. Imports ``_inputs`` only; the losses do not import this module.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import jax
import jax.numpy as jnp

from .. import _checks
from ._inputs import ArrayLike, _as_array, _not_torch


def global_count(
    targets: ArrayLike | list | tuple,
    *,
    weight: ArrayLike | None = None,
    ignore_index: int = -100,
    axis_name: Hashable | Sequence[Hashable] | None = None,
) -> jax.Array:
    """The number of targets not equal to `ignore_index` (or, with `weight`, the sum of their class
    weights) over `targets` (one array, or the micro-batches of one step) and every device along
    `axis_name`, for ``normalizer=``.

    Args:
      targets: integer class indices; a list or tuple of them (the micro-batches of one step) is
        counted together, so the step needs one ``psum``.
      weight: optional per-class weights (torch's weighted mean divides by their sum over the kept
        targets); a constant: the result is behind ``stop_gradient``.
      ignore_index: targets equal to it are not counted.
      axis_name: None (this call's targets only), or the mesh axis name(s) of ``shard_map`` /
        ``pmap`` the batch is split over (a name or a tuple of names): one ``psum`` over them.

    Returns:
      a 0-d array: int32 for a count, the weights' dtype for a weight sum.
    """
    parts = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    ignore_index = _checks.ignore_index(ignore_index)
    if not parts:
        raise ValueError("`targets` must hold at least one array. Received: targets=[].")
    total = None
    for part in parts:
        _not_torch(targets=part)
        part = _as_array(part)
        _checks.index_targets(jnp.issubdtype(part.dtype, jnp.integer), part.dtype)
        keep = part != ignore_index
        if weight is None:
            count = jnp.sum(keep, dtype=jnp.int32)
        else:
            weights = jax.lax.stop_gradient(_as_array(weight))
            count = jnp.sum(jnp.where(keep, weights[jnp.where(keep, part, 0)], 0.0))
        total = count if total is None else total + count
    if axis_name is not None:
        # the kept targets of every device along the named axes: one psum of one scalar
        total = jax.lax.psum(total, axis_name)
    return total
