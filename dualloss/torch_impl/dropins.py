"""The torch drop-ins: ``torch.nn.functional`` signatures (``cross_entropy``,
``linear_cross_entropy``, ``binary_cross_entropy_with_logits``) and the ``nn.Module`` config
holders (``CrossEntropyLoss``, ``BCEWithLogitsLoss``, ``FocalLoss``, ``SigmoidFocalLoss``).

The top of the torch backend: thin wrappers over ``softmax``, ``linear`` and ``sigmoid``; may
import every other module of ``torch_impl``, none imports it.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor

from .. import _checks
from ._inputs import _as_array, _dtype_name, _is_index
from .linear import linear_softmax_cross_entropy
from .sigmoid import sigmoid_cross_entropy, sigmoid_focal_loss
from .softmax import softmax_cross_entropy, softmax_focal_loss


def _legacy_reduction(size_average: bool | None, reduce: bool | None, reduction: str) -> str:
    """torch's handling of the deprecated `size_average`/`reduce` (with its warning)."""
    if size_average is not None or reduce is not None:
        return torch.nn._reduction.legacy_get_string(size_average, reduce)
    return reduction


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Drop-in for ``torch.nn.functional.cross_entropy`` (same signature and defaults).

    Input (C,) or (N, C, d1, ...). Differences: a mean over no kept target is 0, not NaN; NaN-safe
    closed-form gradient; `weight` gets a gradient when it requires one (torch raises). Class
    indices must be int64 or uint8, as torch requires.
    """
    target = _as_array("target", target)
    if _is_index(target) and target.dtype not in (torch.int64, torch.uint8):
        # torch: "expected target dtype to be Long or Byte" (RuntimeError), so the same class here
        dtype = _dtype_name(target.dtype)
        raise RuntimeError(
            "`target` of class indices must be int64 or uint8, as for "
            f"torch.nn.functional.cross_entropy. Received: target.dtype={dtype}."
        )
    reduction = _legacy_reduction(size_average, reduce, reduction)
    axis = 1 if input.dim() >= 2 else 0
    return softmax_cross_entropy(
        input,
        target,
        axis=axis,
        weight=weight,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )


def linear_cross_entropy(
    input: Tensor,
    linear_weight: Tensor,
    target: Tensor,
    *,
    linear_bias: Tensor | None = None,
    weight: Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
    options: Any = None,
) -> Tensor:
    """Drop-in for ``torch.nn.functional.linear_cross_entropy`` (same signature and defaults).

    Class-index targets go through ``linear_softmax_cross_entropy`` (row blocks, no (N, V)
    logits) whatever `options` says, label smoothing included; ``options.batch_chunk_size``,
    when set, is the block size. `ignore_index` None means -100, as in torch. Probability targets
    (the logits' shape) and K-dimensional `linear_weight` (C, d1, ..., H) take torch's reference
    path, ``cross_entropy(F.linear(...))`` with this module's ``cross_entropy`` (the logits are
    formed there, as torch does on that path). Difference: a mean over no kept target is 0, not
    NaN (torch's chunked path gives NaN on purpose).
    """
    input = _as_array("input", input)
    linear_weight = _as_array("linear_weight", linear_weight)
    target = _as_array("target", target)
    out_features = tuple(linear_weight.shape[1:-1])
    logits_shape = (*input.shape[:-1], linear_weight.shape[0], *out_features)
    if tuple(target.shape) == logits_shape and target.is_floating_point() or out_features:
        if tuple(target.shape) == logits_shape and ignore_index is not None:
            # torch's own sentence and class for this combination
            raise RuntimeError(
                "ignore_index cannot be specified when target contains probabilities"
            )
        weight_2d = linear_weight.reshape(-1, linear_weight.shape[-1])
        bias_1d = None if linear_bias is None else linear_bias.reshape(-1)
        logits = torch.nn.functional.linear(input, weight_2d, bias_1d).reshape(logits_shape)
        return cross_entropy(
            logits,
            target,
            weight=weight,
            ignore_index=-100 if ignore_index is None else ignore_index,
            reduction=reduction,
            label_smoothing=label_smoothing,
        )
    # the shapes and dtypes under the drop-in's own argument names
    _checks.float_logits("input", input.is_floating_point(), _dtype_name(input.dtype))
    _checks.index_targets(_is_index(target), _dtype_name(target.dtype), "target")
    bias_shape = None if linear_bias is None else linear_bias.shape
    names = ("input", "linear_bias", "target")
    _checks.linear_shapes(input.shape, linear_weight.shape, bias_shape, target.shape, 0, names)
    chunk_size = getattr(options, "batch_chunk_size", None) if options is not None else None
    return linear_softmax_cross_entropy(
        input,
        linear_weight,
        target,
        bias=linear_bias,
        weight=weight,
        ignore_index=-100 if ignore_index is None else ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
        chunk_size=chunk_size,
    )


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    pos_weight: Tensor | None = None,
) -> Tensor:
    """Drop-in for ``torch.nn.functional.binary_cross_entropy_with_logits`` (same signature)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return sigmoid_cross_entropy(
        input, target, weight=weight, pos_weight=pos_weight, reduction=reduction
    )


class CrossEntropyLoss(torch.nn.Module):
    """Drop-in for ``torch.nn.CrossEntropyLoss``; `weight` is a buffer."""

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", None if weight is None else _as_array("weight", weight))
        self.ignore_index = ignore_index
        self.reduction = _checks.reduction(_legacy_reduction(size_average, reduce, reduction))
        self.label_smoothing = _checks.unit_interval("label_smoothing", label_smoothing)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class BCEWithLogitsLoss(torch.nn.Module):
    """Drop-in for ``torch.nn.BCEWithLogitsLoss``; `weight` and `pos_weight` are buffers."""

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
        pos_weight: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", None if weight is None else _as_array("weight", weight))
        self.register_buffer(
            "pos_weight", None if pos_weight is None else _as_array("pos_weight", pos_weight)
        )
        self.reduction = _checks.reduction(_legacy_reduction(size_average, reduce, reduction))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return binary_cross_entropy_with_logits(
            input, target, self.weight, reduction=self.reduction, pos_weight=self.pos_weight
        )


class FocalLoss(torch.nn.Module):
    """Softmax focal loss as a module (``softmax_focal_loss``); a vector `alpha` is a buffer."""

    def __init__(
        self,
        gamma: float = 2.0,
        alpha: Tensor | float | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        axis: int = 1,
    ) -> None:
        super().__init__()
        self.gamma = _checks.gamma(gamma)
        if alpha is None or isinstance(alpha, numbers.Real):
            self.alpha_scalar = alpha
            self.register_buffer("alpha", None)
        else:
            self.alpha_scalar = None
            self.register_buffer("alpha", _as_array("alpha", alpha))
        self.ignore_index = _checks.ignore_index(ignore_index)
        self.label_smoothing = _checks.unit_interval("label_smoothing", label_smoothing)
        self.reduction = _checks.reduction(reduction)
        self.axis = axis

    def forward(self, input: Tensor, target: Tensor, where: Tensor | None = None) -> Tensor:
        return softmax_focal_loss(
            input,
            target,
            axis=self.axis,
            gamma=self.gamma,
            alpha=self.alpha if self.alpha is not None else self.alpha_scalar,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            where=where,
            reduction=self.reduction,
        )


class SigmoidFocalLoss(torch.nn.Module):
    """Sigmoid focal loss as a module (``sigmoid_focal_loss``, torchvision semantics)."""

    def __init__(
        self, gamma: float = 2.0, alpha: float | None = None, reduction: str = "mean"
    ) -> None:
        super().__init__()
        self.gamma = _checks.gamma(gamma)
        _checks.focal_alpha(alpha, None)
        self.alpha = alpha
        self.reduction = _checks.reduction(reduction)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return sigmoid_focal_loss(
            input, target, gamma=self.gamma, alpha=self.alpha, reduction=self.reduction
        )
