"""The closed-form derivative rules of the JAX backend: the ``jax.custom_jvp`` adapter
(``_with_closed_form_grad``, as ``torch_impl._autodiff`` wraps ``torch.autograd.Function``),
whose tangent is linear in the input tangents, so reverse and forward mode both work.

May import ``_inputs``; never a loss family (``softmax``, ``linear``, ``sigmoid``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero


def _is_zero(tangent) -> bool:
    return tangent is None or isinstance(tangent, SymbolicZero)


def _forward_tangent(value, primals, tangents):
    """Tangent of value(*primals) along the non-zero `tangents`, by autodiff of the forward formula.

    Used for the arguments after the logits only (targets, weights), where the forward formula
    is linear or smooth; the logits' tangent always goes through the closed-form gradient.
    """
    moving = [i for i, tangent in enumerate(tangents) if not _is_zero(tangent)]

    def restricted(*args):
        full = list(primals)
        for i, arg in zip(moving, args, strict=True):
            full[i] = arg
        return value(*full)

    args = tuple(primals[i] for i in moving)
    return jax.jvp(restricted, args, tuple(tangents[i] for i in moving))[1]


def _closed_form_jvp(terms, class_sum, other_tangent=None):
    """custom_jvp rule: loss, grad = terms(z, *rest); tangent = sum(grad * dz) + d(rest) term.

    Linear in the tangents, so reverse mode transposes it; `class_sum` sums over the class axis
    (softmax losses, one loss per row) or not (sigmoid losses, one loss per entry).
    """

    def rule(static, primals, tangents):
        z, *rest = primals
        dz, *drest = tangents
        loss, grad = terms(z, *rest, *static)
        tangent = jnp.zeros_like(loss)
        if not _is_zero(dz):
            product = grad * dz
            tangent = tangent + (jnp.sum(product, axis=-1) if class_sum else product)
        if not all(_is_zero(d) for d in drest):
            if other_tangent is None:
                tangent = tangent + _forward_tangent(
                    lambda *args: terms(z, *args, *static)[0], rest, drest
                )
            else:
                tangent = tangent + other_tangent(z, rest, drest, *static)
        return loss, tangent

    return rule


def _with_closed_form_grad(terms, num_static, class_sum, other_tangent=None):
    """`terms(z, *rest, *static)[0]` as a custom_jvp function with the closed-form gradient."""
    num_args = terms.__code__.co_argcount
    static_argnums = tuple(range(num_args - num_static, num_args))

    def value(*args):
        return terms(*args)[0]

    value = jax.custom_jvp(value, nondiff_argnums=static_argnums)
    rule = _closed_form_jvp(terms, class_sum, other_tangent)
    value.defjvp(
        lambda *args: rule(args[:num_static], args[num_static], args[num_static + 1]),
        symbolic_zeros=True,
    )
    return value
