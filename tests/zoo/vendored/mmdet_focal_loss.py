# MMDetection, Apache License 2.0, Copyright (c) OpenMMLab
# (the repository's LICENSE; the source file carries no header of its own)
# Licensed under the Apache License, Version 2.0: http://www.apache.org/licenses/LICENSE-2.0
#
# Source: https://github.com/open-mmlab/mmdetection/blob/00e97308fa85d98e9049a312cee5f9a451a3f44b/mmdet/models/losses/focal_loss.py
#   (py_sigmoid_focal_loss verbatim; the mmcv CUDA op, the registry and FocalLoss left out;
#   weight_reduce_loss from mmdet/models/losses/utils.py reduced to its weight=None,
#   avg_factor=None path, which is reduce_loss)

import torch.nn.functional as F


def reduce_loss(loss, reduction):
    """Reduce loss as specified (mmdet/models/losses/utils.py)."""
    reduction_enum = F._Reduction.get_enum(reduction)
    # none: 0, elementwise_mean:1, sum: 2
    if reduction_enum == 0:
        return loss
    elif reduction_enum == 1:
        return loss.mean()
    elif reduction_enum == 2:
        return loss.sum()


def weight_reduce_loss(loss, weight=None, reduction='mean', avg_factor=None):
    """Apply element-wise weight and reduce loss (weight=None, avg_factor=None only)."""
    assert weight is None and avg_factor is None
    loss = reduce_loss(loss, reduction)
    return loss


# This method is only for debugging
def py_sigmoid_focal_loss(pred,
                          target,
                          weight=None,
                          gamma=2.0,
                          alpha=0.25,
                          reduction='mean',
                          avg_factor=None):
    pred_sigmoid = pred.sigmoid()
    target = target.type_as(pred)
    pt = (1 - pred_sigmoid) * target + pred_sigmoid * (1 - target)
    focal_weight = (alpha * target + (1 - alpha) *
                    (1 - target)) * pt.pow(gamma)
    loss = F.binary_cross_entropy_with_logits(
        pred, target, reduction='none') * focal_weight
    loss = weight_reduce_loss(loss, weight, reduction, avg_factor)
    return loss
