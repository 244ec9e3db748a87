"""The JAX backend of dualloss: the losses of ``dualloss.spec``, ``jit``/``vmap``/``grad``-ready.

The math, the arguments and the docstrings with formulas live in ``dualloss.spec``; this package
follows it module by module and function by function with the same local names, so that
``diff spec/softmax.py jax_impl/softmax.py`` shows mostly ``np.`` against ``jnp.``. What differs:

* Class axis: ``-1`` by default, as in spec (JAX layout ``(..., C)``).
* dtypes: float32 and float64 (with ``jax_enable_x64``) are computed in themselves; float16 and
  bfloat16 are computed in float32 and the result is returned in the input dtype.
* Gradients: the closed-form gradients of the spec, attached with ``jax.custom_jvp`` (not
  ``jax.custom_vjp``). A ``custom_vjp`` function cannot be forward-differentiated
  (``jax.hessian`` = ``jacfwd(jacrev(f))`` raises "can't apply forward-mode autodiff (jvp) to a
  custom_vjp function"), while a ``custom_jvp`` rule whose tangent is linear in the input tangents,
  ``tangent_out = sum(grad * tangent_in)``, serves both modes: reverse mode transposes it, and
  forward mode over it differentiates the gradient code, which is written to be differentiable
  itself (every ``where`` double-guarded), so Hessians are finite too. The gradient w.r.t. the
  logits never goes through autodiff of the forward formula (whose intermediates are non-finite
  at large margins, e.g. ``0 * log 0``). Tangents of the other array arguments (probability
  targets, ``weight``, ``alpha``, ``pos_weight``) are exact closed forms or autodiff of the
  forward formula where that is finite; for the softmax losses a zero target entry has a zero
  derivative (the ``0 log 0 = 0`` convention extended, so masked classes never give inf).
* Index targets without label smoothing take a gather path: the class sums of the spec collapse
  to the target class, so no N x C one-hot is formed (same formulas, same accuracy).
* Bad input: eager calls raise the ``_checks`` errors of the spec, except that class indices
  already on an accelerator are not copied to the host to be checked (they are handled as under
  ``jit``; ``DUALLOSS_VALIDATE_INDICES=sync`` checks them exactly) and a vector ``alpha`` on an
  accelerator is copied once per array, not per call. Inside ``jit`` the class
  indices are not concrete: an index outside [0, C) (other than ``ignore_index``) gives a NaN loss
  and NaN gradient for its element, and ``checkify.checkify(f, errors=checkify.user_checks)``
  turns it into an error with the spec's message.
* Mean over zero elements: 0 with zero gradient, as in spec (torch gives NaN).

* Options: `gamma`, `alpha`, `label_smoothing`, `weight` and `pos_weight` may be traced values
  (``jit`` arguments, ``vmap`` over them, ``grad``/``jvp`` with respect to them). Concrete values
  are validated as in spec; a traced invalid value gives NaN (and a ``checkify`` error), as an
  out-of-range class index does. A Python gamma = 0 takes an exact branch; a traced gamma = 0
  gives exactly (1 - p)^0 = 1 too.
* `where`: optax semantics (see ``spec.softmax_cross_entropy``): a class mask, or a per-element
  mask of the batch shape; elements left with no class, or whose class-index target is masked,
  count as ignored.
* Wrong framework: a torch tensor raises one TypeError naming the argument (never converted).

Drop-ins with optax's signatures and per-example outputs:
``softmax_cross_entropy_with_integer_labels`` and ``sigmoid_binary_cross_entropy``, the same
functions as in ``dualloss.optax`` (which also has ``softmax_cross_entropy`` and
``sigmoid_focal_loss`` with optax's signatures).

Layout (``docs/design.md``, "Layout"): ``_inputs`` (argument handling, value checks, optax's
arguments, reductions), ``_autodiff`` (the closed-form ``custom_jvp`` adapter), ``softmax``,
``linear``, ``sigmoid``; each module's docstring says what it may import. ``dualloss.optax``
sits above this package; nothing here imports it.
"""

from .linear import linear_softmax_cross_entropy, linear_softmax_focal_loss
from .parallel import global_count
from .sigmoid import sigmoid_binary_cross_entropy, sigmoid_cross_entropy, sigmoid_focal_loss
from .softmax import (
    softmax_cross_entropy,
    softmax_cross_entropy_with_integer_labels,
    softmax_focal_loss,
)

__all__ = [
    "softmax_cross_entropy",
    "softmax_focal_loss",
    "sigmoid_cross_entropy",
    "sigmoid_focal_loss",
    "linear_softmax_cross_entropy",
    "linear_softmax_focal_loss",
    "softmax_cross_entropy_with_integer_labels",
    "sigmoid_binary_cross_entropy",
    "global_count",
]
