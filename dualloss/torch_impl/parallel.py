"""Past one device (DESIGN 12), torch: the global count that ``normalizer=`` divides by.

``global_count`` counts the kept class-index targets (or sums their class weights) of this rank's
batch and adds the other ranks' with one ``torch.distributed.all_reduce``: passed as
``normalizer=`` to every micro-batch on every rank, the summed gradients equal the gradient of the
one-big-batch mean. Imports ``_inputs`` only; the losses do not import this module.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .. import _checks
from ._inputs import _as_array, _dtype_name, _is_index


def global_count(
    targets: Tensor | list[Tensor] | tuple[Tensor, ...],
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    process_group: dist.ProcessGroup | None = None,
) -> Tensor:
    """The number of targets not equal to `ignore_index` (or, with `weight`, the sum of their class
    weights) over `targets` (one tensor, or the micro-batches of one step) and every rank of
    `process_group`, for ``normalizer=``.

    Args:
      targets: integer class indices; a list or tuple of them (the micro-batches of one step) is
        counted together, so the step needs one all-reduce.
      weight: optional per-class weights (torch's weighted mean divides by their sum over the kept
        targets); a constant: the result takes no gradient.
      ignore_index: targets equal to it are not counted.
      process_group: the group whose ranks' counts are summed (``all_reduce``, SUM); None is the
        default group when ``torch.distributed`` is initialised, and this process's count alone
        when it is not.

    Returns:
      a 0-d tensor on the targets' device: int64 for a count, the weights' dtype for a weight sum.
    """
    parts = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    ignore_index = _checks.ignore_index(ignore_index)
    if not parts:
        raise ValueError("`targets` must hold at least one tensor. Received: targets=[].")
    total = None
    for part in parts:
        part = _as_array("targets", part)
        _checks.index_targets(_is_index(part), _dtype_name(part.dtype))
        keep = part != ignore_index
        if weight is None:
            count = keep.sum()
        else:
            weights = weight.detach().to(part.device)
            count = torch.where(keep, weights[torch.where(keep, part, 0).long()], 0.0).sum()
        total = count if total is None else total + count
    if process_group is not None and not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "`process_group` needs torch.distributed to be initialised "
            "(torch.distributed.init_process_group). "
            f"Received: process_group={process_group!r}."
        )
    if dist.is_available() and dist.is_initialized():
        # the kept targets of every rank: one all-reduce of one scalar per step
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=process_group)
    return total
