"""The PyTorch backend of dualloss: the losses of ``dualloss.spec``, autograd-ready, fast, NaN-safe.

The math, the options and the full docstrings live in ``dualloss.spec``; this package follows it
module by module and function by function with the same local names. What differs:

* Layout: the class axis defaults to ``axis=1``, torch's ``(N, C, d1, ..., dk)``.
* Dtypes: float64 and float32 are computed in their own precision; float16 and bfloat16 in float32,
  the loss returned (and the gradient given back) in the input dtype. Weights, ``alpha`` and
  ``pos_weight`` are moved to the logits' device and compute dtype.
* Gradients: where the spec's ``*_terms`` functions return (loss, grad), each one here takes a
  last argument `grad_loss` and returns the per-element loss when it is None, else the logits'
  gradient times `grad_loss`. Every loss goes through one ``torch.autograd.Function``
  (``_ClosedFormGrad``, wrapped by ``_with_closed_form_grad`` like jax_impl's custom_jvp) whose
  forward is ``loss_or_grad(*inputs, None)`` and whose backward is the spec's closed-form gradient
  ``loss_or_grad(*inputs, grad_loss)`` (``setup_context`` style, ``generate_vmap_rule = True``:
  ``torch.func.grad``/``vmap`` work; the sigmoid losses use ``_SigmoidLoss``, the same adapter
  that also takes the sum in forward). The backward recomputes the probabilities from the saved
  inputs (the logits, the targets, the user's ``where``/weights) plus nothing else, so the loss
  keeps no tensor alive beyond its own inputs. The backward is written in differentiable torch ops
  (with the "double where" around every branch), so ``create_graph=True`` gives second-order
  gradients.
* Fast path: class-index targets without label smoothing never build an N x C target tensor;
  only the target's column is gathered (the spec's ``_softmax_focal_terms`` with a one-hot
  ``a``). For float32/float64 logits this is ``_SoftmaxAtTarget``: torch's fused softmax and
  the others' share r = 1 - p_y (the row sum of p with the target's entry left out) in forward,
  and one multiplication per entry in backward (p v_y off the target, -(1 - p_y) v_y at it, from
  one value per row). It keeps p for backward (the size of the logits) instead of the logits,
  and p and r are outputs of that Function, so ``create_graph=True`` differentiates the backward
  through them. Half inputs
  (whose own logits are the smaller thing to keep) and class weights that require grad take the
  general path (``_softmax_focal_terms_sparse``).
* ``log(1 - p_top)`` uses ``log s`` directly (s = sum_{j != top} exp(z_j - z_top)) instead of the
  spec's runner-up rescaling; when s underflows, every term it enters is O(s^(1 + gamma)), below
  the dtype's smallest normal number, so nothing representable changes.
* Every other tensor that requires grad gets its true gradient: probability targets, ``weight``,
  ``pos_weight``, a vector or tensor ``alpha`` (the vector-Jacobian product of the forward formula,
  recomputed in backward only when one of them requires grad: nothing more is saved).
  ``gamma``, ``label_smoothing`` and the sigmoid focal ``alpha`` are Python numbers; a tensor
  there raises ``TypeError``, never a silently missing gradient.
* Inputs are torch tensors: a NumPy or JAX array raises ``TypeError`` (never silently converted).
* Under ``torch.autocast`` the floating inputs (float64 aside) are cast to float32 and the loss is
  float32, as torch does for ``cross_entropy`` and ``binary_cross_entropy_with_logits``.
* ``where`` follows optax: a mask that broadcasts to the logits is a class mask (masked classes
  leave the softmax and the target sum); otherwise a mask of the batch shape (the logits shape
  without ``axis``) masks whole elements. An element with no class left, or with a class-index
  target on a masked class, counts as ignored (loss 0, zero gradient, left out of the mean).

Finite math: values and gradients are finite wherever the exact result is representable in the
compute dtype (float32 for half inputs). The gradient is always bounded by (1 + gamma) sum_c a_c,
so it is finite for every finite input. The loss itself can genuinely overflow: with float32
logits (3e38, -3e38) and the target on the second class, the exact loss 6e38 exceeds the float32
range, and ``z - z_top`` rounds to -inf, so the loss is +inf (never NaN); with the target on the
first class it is 0. Float16/bfloat16 inputs never reach this (their range is far inside float32's).

Index validation: class indices in [0, C) (and a vector ``alpha`` in [0, 1]) are checked by
default. On the CPU eager calls raise the same ``_checks`` message as the spec; on an accelerator
the check is an asynchronous device assertion (``torch._assert_async``: no host synchronisation,
the error surfaces at the next sync, as with torch's own losses), and a vector ``alpha`` is
checked once per tensor (docs/devices.md has the table). ``DUALLOSS_VALIDATE_INDICES=sync`` (or
``set_validate_indices('sync')``) gives the exact message on every device at one sync per call.
Turn the checks off with ``DUALLOSS_VALIDATE_INDICES=0``, globally with
``set_validate_indices(False)``, or for a block with ``with set_validate_indices(False): ...``.
It is skipped under ``torch.func`` transforms when the targets are batched (their values are
not concrete there) and under ``torch.compile`` (no host read, no graph break:
``fullgraph=True`` works). Unchecked out-of-range indices are undefined behaviour, as in
``torch.gather`` (an error on CPU, a device assert on CUDA).

Layout (``docs/design.md``, "Layout"): ``_inputs`` (argument handling, value checks, reductions),
``_autodiff`` (the closed-form ``autograd.Function`` adapter), ``softmax``, ``linear``,
``sigmoid``, ``dropins`` (the ``F.*`` / ``nn.*Loss`` signatures), ``_kernels`` (the Triton
kernels and their custom ops); each module's docstring says what it may import.

Kernels (DESIGN 11): on CUDA, where Triton imports, the softmax losses with class-index targets
(no label smoothing, no ``where``) and the sigmoid losses run fused Triton kernels (two launches
per forward + backward); everything else takes the eager closed forms. ``kernels("triton")``
(a context manager) or ``DUALLOSS_TORCH_KERNELS=auto|triton|eager`` chooses; ``triton`` on CPU
tensors runs the kernels under Triton's interpreter, which is how CPU machines test them.
"""

from ._inputs import set_validate_indices
from ._kernels import kernels
from .dropins import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    FocalLoss,
    SigmoidFocalLoss,
    binary_cross_entropy_with_logits,
    cross_entropy,
    linear_cross_entropy,
)
from .linear import linear_softmax_cross_entropy, linear_softmax_focal_loss
from .parallel import global_count
from .sigmoid import sigmoid_cross_entropy, sigmoid_focal_loss
from .softmax import softmax_cross_entropy, softmax_focal_loss

__all__ = [
    "softmax_cross_entropy",
    "softmax_focal_loss",
    "sigmoid_cross_entropy",
    "sigmoid_focal_loss",
    "linear_softmax_cross_entropy",
    "linear_softmax_focal_loss",
    "cross_entropy",
    "linear_cross_entropy",
    "binary_cross_entropy_with_logits",
    "CrossEntropyLoss",
    "BCEWithLogitsLoss",
    "FocalLoss",
    "SigmoidFocalLoss",
    "set_validate_indices",
    "kernels",
    "global_count",
]
