"""Past one device (DESIGN 12), torch: the global count that ``normalizer=`` divides by, and the
process-group side of the vocab-parallel softmax losses.

``global_count`` counts the kept class-index targets (or sums their class weights) of this rank's
batch and adds the other ranks' with one ``torch.distributed.all_reduce``: passed as
``normalizer=`` to every micro-batch on every rank, the summed gradients equal the gradient of the
one-big-batch mean.

``process_group=`` on the softmax losses: ``_process_group`` checks the argument,
``_from_dtensor`` takes a DTensor sharded on the class axis apart into its local slice and its
mesh's group, ``_class_slice`` finds where this rank's slice starts and how many classes there are
in all (one all-reduce of one number per rank). The loss itself, with its per-row collectives,
lives in ``softmax`` (``_VocabParallel``). Imports ``_inputs`` only; ``softmax`` imports this
module.
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


# ----------------------------------------------------------------------------------------------
# Vocab-parallel softmax losses: the process group and this rank's slice of the classes
# ----------------------------------------------------------------------------------------------


def _process_group(process_group):
    """The checked `process_group`: a ``torch.distributed.ProcessGroup`` of an initialised
    ``torch.distributed`` (``dist.group.WORLD`` is one)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "`process_group` needs torch.distributed to be initialised "
            "(torch.distributed.init_process_group). "
            f"Received: process_group={process_group!r}."
        )
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            "`process_group` must be a torch.distributed.ProcessGroup (the ranks that hold the "
            "slices of the classes). "
            f"Received: process_group of type {type(process_group).__name__}."
        )
    return process_group


def _is_dtensor(x) -> bool:
    """Whether `x` is a DTensor (without importing torch.distributed.tensor where it is unused)."""
    return type(x).__name__ == "DTensor" and hasattr(x, "device_mesh") and hasattr(x, "to_local")


def _from_dtensor(logits, targets, axis, process_group):
    """A DTensor `logits` sharded on the class axis over one dimension of its mesh, as
    ``loss_parallel`` takes it: (local logits, local targets, that dimension's group, the layout
    for ``_to_dtensor``). The mesh may have a second dimension that splits the batch (a
    ``Shard`` of a batch dim) or replicates it. `targets` may be a plain tensor (this rank's rows
    of global class indices) or a DTensor replicated over the class dimension and laid out like
    the logits' batch (its local tensor is then this rank's rows)."""
    from torch.distributed.tensor import Replicate, Shard

    mesh = logits.device_mesh
    placements = tuple(logits.placements)
    class_axis = _checks.class_axis(axis, logits.ndim)
    if process_group is not None:
        raise ValueError(
            "`process_group` must be None when `logits` is a DTensor (its device mesh names the "
            f"group). Received: process_group={process_group!r}."
        )
    class_dims = [d for d, p in enumerate(placements) if p == Shard(class_axis)]
    others = [p for d, p in enumerate(placements) if d not in class_dims]
    batch_ok = all(
        p == Replicate() or (isinstance(p, Shard) and p.dim not in (class_axis, -1)) for p in others
    )
    if mesh.ndim > 2 or len(class_dims) != 1 or not batch_ok:
        raise ValueError(
            "`logits` as a DTensor must be sharded on the class axis over one dimension of a "
            f"one- or two-dimensional mesh (placements (Shard({class_axis}),), or (Shard(0) or "
            f"Replicate(), Shard({class_axis})) for data x vocab). Received: "
            f"placements={placements}, mesh of {mesh.ndim} dimensions."
        )
    class_dim = class_dims[0]
    # the batch dimension of the loss (the logits' shape without the class axis) a Shard splits
    out_placements = []
    for d, p in enumerate(placements):
        if d == class_dim or p == Replicate():
            out_placements.append(Replicate())
        else:
            out_placements.append(Shard(p.dim if p.dim < class_axis else p.dim - 1))
    if _is_dtensor(targets) and targets.ndim == logits.ndim:
        # probability targets: sliced like the logits
        if tuple(targets.placements) != placements or targets.device_mesh != mesh:
            raise ValueError(
                "`targets` of probabilities as a DTensor must be laid out like the logits. "
                f"Received: placements={tuple(targets.placements)}."
            )
        targets = targets.to_local()
    elif _is_dtensor(targets):
        if tuple(targets.placements) != tuple(out_placements) or targets.device_mesh != mesh:
            raise ValueError(
                "`targets` as a DTensor must be replicated over the class dimension of the mesh "
                "and laid out like the logits' batch (global class indices on every rank). "
                f"Received: placements={tuple(targets.placements)}."
            )
        targets = targets.to_local()
    # the loss's global shape (for rows split unevenly over the batch dimension)
    shape = tuple(logits.shape[:class_axis]) + tuple(logits.shape[class_axis + 1 :])
    layout = (mesh, class_dim, tuple(out_placements), shape)
    return logits.to_local(), targets, mesh.get_group(class_dim), layout


def _batch_group(layout):
    """The group of the mesh dimension that splits the batch, or None (no such dimension)."""
    from torch.distributed.tensor import Shard

    mesh, class_dim, placements, _ = layout
    for d, p in enumerate(placements):
        if d != class_dim and isinstance(p, Shard):
            return mesh.get_group(d)
    return None


def _to_dtensor(loss, layout, reduction):
    """The loss (the same on every rank of the class dimension) as a DTensor on the logits' mesh,
    as ``loss_parallel`` returns it: replicated over the class dimension; over a dimension that
    splits the batch, sharded like the rows for reduction 'none' and ``Partial`` (a sum over that
    dimension: each rank's share of the global sum or mean) for 'sum' and 'mean'. Its gradient
    flows back to the local slice unchanged."""
    from torch.distributed.tensor import DTensor, Partial, Shard

    mesh, class_dim, placements, shape = layout
    if reduction != "none":
        placements = tuple(Partial() if isinstance(p, Shard) else p for p in placements)
        shape = ()
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        loss, mesh, list(placements), run_check=False, shape=shape, stride=stride
    )


def _class_slice(num_local: int, group, device, name: str = "logits") -> tuple[int, int]:
    """(start, num_classes): the global index of this rank's first class and the classes of all
    ranks, the slices contiguous in rank order, none empty. Read on the host (one small
    synchronisation on an accelerator). `name`: the argument that holds the slice."""
    rank = dist.get_rank(group)
    sizes = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=device)
    sizes[rank] = num_local
    # every rank's slice size, each at its rank (no all_gather: one sum of a vector per call)
    dist.all_reduce(sizes, op=dist.ReduceOp.SUM, group=group)
    sizes = sizes.tolist()
    if 0 in sizes:
        # raised on every rank alike (each has read the sizes): none waits on a collective
        raise ValueError(
            f"`{name}` must hold at least one class on every rank of `process_group`. "
            f"Received: class slices of sizes {sizes}."
        )
    return sum(sizes[:rank]), sum(sizes)
