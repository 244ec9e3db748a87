# pytorch-toolbelt, MIT License, Copyright (c) Eugene Khvedchenya
# (the repository's LICENSE; the source file carries no header of its own)
#
# Permission is hereby granted, free of charge, to any person obtaining a copy of this software
# and associated documentation files (the "Software"), to deal in the Software without
# restriction, including without limitation the rights to use, copy, modify, merge, publish,
# distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
# Software is furnished to do so, subject to the following conditions: The above copyright
# notice and this permission notice shall be included in all copies or substantial portions of
# the Software. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
# IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A
# PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE
# LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
# OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
# DEALINGS IN THE SOFTWARE.
#
# Source: https://github.com/BloodAxe/pytorch-toolbelt/blob/0fc0ca9d9d4dd790655d28cea91e717910525a91/pytorch_toolbelt/losses/functional.py
#   (focal_loss_with_logits, softmax_focal_loss_with_logits, label_smoothed_nll_loss: verbatim,
#   docstrings shortened; the deprecation wrappers and the other losses left out)

from typing import Optional

import torch
import torch.nn.functional as F


def focal_loss_with_logits(
    output: torch.Tensor,
    target: torch.Tensor,
    gamma: float = 2.0,
    alpha: Optional[float] = 0.25,
    reduction: str = "mean",
    normalized: bool = False,
    reduced_threshold: Optional[float] = None,
    eps: float = 1e-6,
    ignore_index=None,
    activation: str = "sigmoid",
    softmax_dim: Optional[int] = None,
    class_weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Compute binary focal loss between target and output logits.

    References:
        https://github.com/open-mmlab/mmdetection/blob/master/mmdet/core/loss/losses.py
    """
    output = output.float()
    target = target.float()

    with torch.amp.autocast(device_type=output.device.type, enabled=False):
        if activation == "sigmoid":
            p = torch.sigmoid(output)
        else:
            p = torch.softmax(output, dim=softmax_dim)

        ce_loss = F.binary_cross_entropy_with_logits(output, target, reduction="none")
        pt = p * target + (1 - p) * (1 - target)

        # compute the loss
        if reduced_threshold is None:
            focal_term = (1.0 - pt).pow(gamma)
        else:
            focal_term = ((1.0 - pt) / (1 - reduced_threshold)).pow(
                gamma
            )  # the focal term continuity breaks when reduced_threshold not equal to 0.5. At pt equal to reduced_threshold, the value of piecewise function of focal term should be 1 from both sides .
            focal_term = torch.masked_fill(focal_term, pt < reduced_threshold, 1)

        loss = focal_term * ce_loss

        if alpha is not None:
            loss *= alpha * target + (1 - alpha) * (1 - target)

        if class_weights is not None:
            # class_weights is of shape [C]
            # Loss is of shape [B,C ...]
            # Reshape class_weights to [1, C, ...]
            class_weights = class_weights.view(1, -1, *(1 for _ in range(loss.dim() - 2)))
            loss *= class_weights

        if ignore_index is not None:
            ignore_mask = target.eq(ignore_index)
            loss = torch.masked_fill(loss, ignore_mask, 0)
            if normalized:
                focal_term = torch.masked_fill(focal_term, ignore_mask, 0)

        if normalized:
            norm_factor = focal_term.sum(dtype=torch.float32).clamp_min(eps)
            loss /= norm_factor

        if reduction == "mean":
            loss = loss.mean()
        if reduction == "sum":
            loss = loss.sum()
        if reduction == "batchwise_mean":
            loss = loss.sum(dim=0)

    return loss


def softmax_focal_loss_with_logits(
    output: torch.Tensor,
    target: torch.Tensor,
    class_weights: Optional[torch.Tensor] = None,
    gamma: float = 2.0,
    reduction: str = "mean",
    normalized: bool = False,
    reduced_threshold: Optional[float] = None,
    eps: float = 1e-6,
    ignore_index: int = -100,
) -> torch.Tensor:
    """
    Softmax version of focal loss between target and output logits.
    See :class:`~pytorch_toolbelt.losses.CrossEntropyFocalLoss` for details.
    """
    ignore_mask = target.eq(ignore_index)
    pos_mask = ~ignore_mask
    targets_masked = torch.masked_fill(target, ignore_mask, 0)
    targets_oh = F.one_hot(targets_masked, num_classes=output.size(1)).moveaxis(-1, 1).float()
    probs = F.softmax(output, dim=1)
    pt = (1 - targets_oh) * probs + targets_oh * (1 - probs)

    loss = F.binary_cross_entropy_with_logits(output, targets_oh, reduction="none")

    # compute the loss
    if reduced_threshold is None:
        focal_term = pt.pow(gamma)
    else:
        focal_term = (pt / reduced_threshold).pow(gamma)
        focal_term[pt < reduced_threshold] = 1

    loss = focal_term * loss
    if class_weights is not None:
        class_weights = class_weights.reshape(1, -1, *[1 for _ in range(loss.dim() - 2)])
        loss = loss * class_weights
    loss = loss.sum(dim=1) * pos_mask

    if normalized:
        # Does not really work, will be removed in future
        norm_factor = focal_term.sum().clamp_min(eps)
        loss = loss / norm_factor

    if reduction == "mean":
        loss = loss.mean()
    if reduction == "sum":
        loss = loss.sum()
    if reduction == "batchwise_mean":
        loss = loss.sum(0)

    return loss


def label_smoothed_nll_loss(
    lprobs: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index=None, reduction="mean", dim=-1
) -> torch.Tensor:
    """

    Source: https://github.com/pytorch/fairseq/blob/master/fairseq/criterions/label_smoothed_cross_entropy.py
    """
    if target.dim() == lprobs.dim() - 1:
        target = target.unsqueeze(dim)

    if ignore_index is not None:
        pad_mask = target.eq(ignore_index)
        target = target.masked_fill(pad_mask, 0)
        nll_loss = -lprobs.gather(dim=dim, index=target)
        smooth_loss = -lprobs.sum(dim=dim, keepdim=True)

        # nll_loss.masked_fill_(pad_mask, 0.0)
        # smooth_loss.masked_fill_(pad_mask, 0.0)
        nll_loss = nll_loss.masked_fill(pad_mask, 0.0)
        smooth_loss = smooth_loss.masked_fill(pad_mask, 0.0)
    else:
        nll_loss = -lprobs.gather(dim=dim, index=target)
        smooth_loss = -lprobs.sum(dim=dim, keepdim=True)

        nll_loss = nll_loss.squeeze(dim)
        smooth_loss = smooth_loss.squeeze(dim)

    if reduction == "sum":
        nll_loss = nll_loss.sum()
        smooth_loss = smooth_loss.sum()
    if reduction == "mean":
        nll_loss = nll_loss.mean()
        smooth_loss = smooth_loss.mean()

    eps_i = epsilon / lprobs.size(dim)
    loss = (1.0 - epsilon) * nll_loss + eps_i * smooth_loss
    return loss
