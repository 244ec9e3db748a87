"""The closed-form derivative rules of the torch backend: the ``torch.autograd.Function`` adapter
(``_ClosedFormGrad``, wrapped by ``_with_closed_form_grad``, as ``jax_impl._autodiff`` wraps
``jax.custom_jvp``), the gradients w.r.t. the other inputs, and its in-place rules.

May import ``_inputs``; never a loss family (``softmax``, ``linear``, ``sigmoid``) or ``dropins``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._inputs import _values_are_concrete


class _ClosedFormGrad(torch.autograd.Function):
    """loss_or_grad(*saved, *options, None) with backward loss_or_grad(*saved, *options, grad_loss).

    Saves the first `num_saved` inputs only (tensors or None); the options are kept as they are.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(loss_or_grad, num_saved, *inputs):
        return loss_or_grad(*inputs, None)

    @staticmethod
    def setup_context(ctx, inputs, output):
        loss_or_grad, num_saved, *inputs = inputs
        ctx.save_for_backward(*inputs[:num_saved])
        ctx.loss_or_grad = loss_or_grad
        ctx.options = inputs[num_saved:]

    @staticmethod
    def backward(ctx, grad_loss):
        saved = ctx.saved_tensors
        needs_grad = ctx.needs_input_grad[2:]
        grads = [None] * (len(saved) + len(ctx.options))
        if needs_grad[0]:
            grads[0] = ctx.loss_or_grad(*saved, *ctx.options, grad_loss)
        wrt = [i for i in range(1, len(saved)) if needs_grad[i]]
        if wrt:
            other_grads = _other_input_grads(ctx.loss_or_grad, saved, ctx.options, wrt, grad_loss)
            for i, grad in zip(wrt, other_grads, strict=True):
                grads[i] = grad
        return None, None, *grads


def _other_input_grads(loss_or_grad, saved, options, wrt, grad_loss):
    """Gradients w.r.t. the saved inputs `wrt` other than the logits (targets, weights, alpha).

    The loss is smooth and cheap in them (linear for the cross entropies), so the vector-Jacobian
    product of the forward formula (written NaN-safe for it: the double wheres) gives them; only
    when one of them requires grad is anything recomputed. ``torch.func.vjp`` rather than
    ``torch.autograd.grad``, so that ``torch.func`` transforms of the backward (jacrev, vmap over
    grad) work too; with create_graph the logits stay attached, giving the mixed second derivatives.
    """

    def forward(*values):
        inputs = list(saved)
        for i, value in zip(wrt, values, strict=True):
            inputs[i] = value
        return loss_or_grad(*inputs, *options, None)

    _, vjp = torch.func.vjp(forward, *[saved[i] for i in wrt])
    return vjp(grad_loss)


def _asks_for_no_gradient(inputs) -> bool:
    """True when nothing can ask for a gradient of a call on `inputs`: no input requires grad (or
    grad mode is off) and no ``torch.func`` transform is active (under ``jvp`` or ``grad`` the
    autograd function decides, as before). Then the losses compute their value directly, without
    an autograd function: ``torch.compile(fullgraph=True)`` cannot trace an autograd function
    taking a Python callable when no input requires grad (evaluation, ``torch.no_grad()``)."""
    if torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad for x in inputs):
        return False
    # under torch.compile the functorch level is not traceable; compile has no forward-mode AD
    return torch.compiler.is_compiling() or torch._C._functorch.maybe_current_level() is None


def _with_closed_form_grad(loss_or_grad, num_saved):
    """`loss_or_grad(logits, ...)` (its last argument `grad_loss` left out) as an autograd function
    whose gradient w.r.t. the logits is the closed form ``loss_or_grad(logits, ..., grad_loss)``."""

    def value(*inputs):
        if _asks_for_no_gradient(inputs):
            return loss_or_grad(*inputs, None)
        return _ClosedFormGrad.apply(loss_or_grad, num_saved, *inputs)

    return value


def _frees_saved_tensors() -> bool:
    """In a backward: True when the graph is released after it (no ``retain_graph``, no
    ``create_graph``), so that a saved temporary of our own may be overwritten by the gradient.
    Outside a backward, under torch.compile and where torch does not say: False (AOTAutograd asks
    torch the same question)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return keep_graph is not None and not keep_graph()


def _saved_tensors_are_private() -> bool:
    """In a forward: True when no ``saved_tensors_hooks`` are active, so that what the function
    saves stays its own (a pack hook may keep the very tensor, to offload or inspect it); False
    under torch.compile, which does not run our backward eagerly."""
    if torch.compiler.is_compiling():
        return False
    top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top_hooks is not None and top_hooks(False) is None


def _inplace(*tensors):
    """In-place updates of fresh temporaries are safe: not when autograd records the backward
    (create_graph=True) or when torch.func may batch one operand and not the other."""
    if torch.is_grad_enabled():
        return False
    return all(x is None or _values_are_concrete(x) for x in tensors)


def _in_transform() -> bool:
    """A torch.func transform is active (its batched or dual tensors take the eager path)."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._functorch.maybe_current_level() is not None
