"""The place for the torch backend's accelerator kernels (DESIGN section 11).

What goes here: one module per loss family (``softmax``, ``sigmoid``, ``linear``, the names of
the eager modules next to this package) holding its Triton kernels, the custom op
(``torch.library.triton_op`` or ``custom_op``) with its fake (shape-only) implementation, and
the thin launcher that picks block sizes from the shapes (``tl.constexpr`` derived from C, never
scattered literals). The autograd glue stays where the eager path's is (``_autodiff`` and the
family module), which picks the kernel or the eager code; this package never imports them.

The rules each kernel keeps:

* The spec's closed forms, in the spec's symbols: a kernel's docstring names the
  ``dualloss.spec`` function it mirrors. One program per row (softmax) or per block of elements
  (sigmoid); the forward computes the loss and, when a gradient is needed, the gradient in the
  same pass into its own buffer; backward scales it.
* The strict standard of the eager path: libdevice's exact ``exp``/``log`` where the fast
  approximate ones would cost digits.
* Custom ops, so ``torch.compile`` (fullgraph), autocast and ``torch.func`` see no graph break.
* Selection ``auto`` / ``triton`` / ``eager`` via ``DUALLOSS_TORCH_KERNELS`` or
  ``torch_impl.kernels(...)``; on a CPU tensor ``triton`` runs under ``TRITON_INTERPRET=1``, and
  that is how CPU machines test the kernels, against the spec.
* No loss ever writes into a caller's tensor; memory is saved by recomputing, never by reusing
  inputs.
* Per forward + backward: no more dispatched torch ops than the peer, 1-3 kernel launches, no
  host synchronisation.

May import ``dualloss._checks``, torch and triton; never the family modules or ``dropins``.
Triton is imported on first use only (``softmax_ops()``), never by ``import dualloss``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from ... import _checks

_MODE: str | None = None  # set by kernels(...); None: the environment's


def _mode() -> str:
    if _MODE is not None:
        return _MODE
    return _checks.kernel_mode(
        "DUALLOSS_TORCH_KERNELS", os.environ.get("DUALLOSS_TORCH_KERNELS", "auto")
    )


@contextlib.contextmanager
def kernels(mode: str) -> Iterator[None]:
    """Within the block the torch losses run `mode`: ``"auto"`` (Triton on CUDA where it imports,
    the eager closed forms elsewhere), ``"triton"`` (the kernels wherever a loss has one; on CPU
    tensors under Triton's interpreter) or ``"eager"``. Outside, ``DUALLOSS_TORCH_KERNELS``
    decides (default ``auto``)."""
    global _MODE
    mode = _checks.kernel_mode("mode", mode)
    previous, _MODE = _MODE, mode
    try:
        yield
    finally:
        _MODE = previous


def _missing(device: torch.device) -> str | None:
    from . import _triton

    return _triton.missing(device)


def use_triton(x: torch.Tensor) -> bool:
    """Whether a loss on `x` takes its Triton kernel: ``auto`` on CUDA where Triton runs;
    ``triton`` wherever it runs, and a one-sentence error where it cannot."""
    mode = _mode()
    if mode == "eager" or (mode == "auto" and x.device.type != "cuda"):
        return False
    reason = _missing(x.device)
    if reason is None:
        return True
    if mode == "triton":
        raise RuntimeError(f"torch_impl.kernels('triton'): {reason}.")
    return False


def path(device: torch.device | str) -> str:
    """The path the torch losses take on `device` now, in words (``dualloss-parity doctor``)."""
    device = torch.device(device)
    mode = _mode()
    if mode == "eager" or (mode == "auto" and device.type != "cuda"):
        return f"eager closed forms ({mode})"
    reason = _missing(device)
    if reason is not None:
        return f"eager closed forms ({mode}; Triton unavailable: {reason})"
    from . import _triton

    how = "interpreted" if _triton.interpreted() else "compiled"
    return (
        f"Triton kernels, {how} ({mode}), for the softmax losses with class-index targets "
        "(with where and label smoothing) and with probability targets, and the sigmoid "
        "losses; the eager closed forms for the rest"
    )


def factor_supported(f: torch.Tensor | None, shape) -> bool:
    """Whether the sigmoid kernels read a weight / pos_weight `f` as it is (``sigmoid._factor``):
    one number, one per element (the logits' `shape`) or one per class of the last axis."""
    if f is None or f.numel() == 1 or tuple(f.shape) == tuple(shape):
        return True
    return len(shape) > 0 and f.shape[-1] == shape[-1] and f.numel() == shape[-1]


def softmax_ops():
    """The softmax kernels' custom ops (imports Triton on first use)."""
    from . import softmax

    return softmax


def sigmoid_ops():
    """The sigmoid kernels' custom ops (imports Triton on first use)."""
    from . import sigmoid

    return sigmoid
