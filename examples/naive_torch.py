"""Two focal losses as they are written by hand in PyTorch, both one bad step from NaN.

Kept in their own module so that the oracle's reproducers can import them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def classic_focal_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The classic: ``log(softmax)`` then ``gather``, gamma = 2.

    ``softmax`` rounds a confidently wrong target's probability to 0, ``log(0) = -inf``, and the
    backward pass multiplies ``1/p = inf`` by 0.
    """
    p = F.softmax(logits, dim=1)
    log_pt = torch.log(p).gather(1, targets[:, None])[:, 0]
    return (-((1 - log_pt.exp()) ** 2) * log_pt).mean()


def textbook_focal_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The textbook fix: ``log_softmax``, and ``(1 - p) ** gamma`` with gamma = 0.5 < 1.

    The forward pass is finite, but once a target's probability rounds to 1 the derivative of
    ``(1 - p) ** 0.5`` is ``inf`` and the backward pass multiplies it by ``log p = 0``.
    """
    log_pt = F.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    return (-((1 - log_pt.exp()) ** 0.5) * log_pt).mean()
