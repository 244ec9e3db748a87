"""The PyTorch backend of dualloss: the losses of ``dualloss.spec``, autograd-ready, fast, NaN-safe.

The math, the options and the full docstrings live in ``dualloss.spec``; this module follows it
function by function with the same local names. What differs:

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
"""

from __future__ import annotations

import math
import numbers
import os
import weakref
from typing import Any

import torch
from torch import Tensor

from . import _checks

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
]

ArrayLike = Any

_VALIDATE_INDICES = _checks.validation_mode(os.environ.get("DUALLOSS_VALIDATE_INDICES", "1"))


class set_validate_indices:
    """Turns the index-range (and vector `alpha`) value checks on or off; returns to the previous
    setting when used as a context manager, like ``torch.set_grad_enabled``. True (the default):
    exact checks on the CPU, asynchronous device assertions on accelerators (no host sync);
    ``'sync'``: exact checks (value and position) everywhere, one host sync per call.

    >>> set_validate_indices(False)      # from now on  # doctest: +SKIP
    >>> with set_validate_indices(False):  # for a block  # doctest: +SKIP
    ...     loss = softmax_cross_entropy(logits, targets)
    """

    def __init__(self, enabled: bool | str) -> None:
        global _VALIDATE_INDICES
        mode = _checks.validation_mode(enabled)
        self.previous = _VALIDATE_INDICES
        _VALIDATE_INDICES = mode

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        global _VALIDATE_INDICES
        _VALIDATE_INDICES = self.previous


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


def _as_array(name: str, x: ArrayLike, device: torch.device | None = None) -> Tensor:
    """`x` on `device` (if given); it must already be a torch.Tensor.

    A NumPy or JAX array is refused, never silently converted (torch.nn.functional does the same).
    """
    if not isinstance(x, Tensor):
        kind = f"{type(x).__module__}.{type(x).__qualname__}"
        raise TypeError(f"`{name}` must be a torch.Tensor. Received: {name} of type {kind}.")
    return x if device is None else x.to(device)


def _autocast_float32(x: Tensor, device_type: str) -> Tensor:
    """`x` in float32 where torch.autocast would run cross_entropy / BCE-with-logits in float32.

    Both are on autocast's float32 list: inside an autocast region their floating inputs on that
    device (float64 aside) are cast to float32 and the loss is float32, whatever the autocast dtype.
    """
    if (
        x is not None
        and x.is_floating_point()
        and x.dtype != torch.float64
        and x.device.type == device_type
        and torch.is_autocast_enabled(device_type)
    ):
        return x.float()
    return x


def _dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32: the spelling NumPy uses, so `_checks` messages match."""
    return str(dtype).replace("torch.", "")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 and bfloat16 are computed in float32; float32 and float64 in themselves."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _is_index(targets: Tensor) -> bool:
    return not (targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool)


def _values_are_concrete(x: Tensor) -> bool:
    """False under torch.compile (values are symbolic: no host reads, no graph break) and under
    torch.func transforms that batch `x` (its values cannot be read there)."""
    if torch.compiler.is_compiling():
        return False
    is_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return is_wrapped is None or not is_wrapped(x)


def _reads_on_host(x: Tensor) -> bool:
    """True where a value check may read `x` on the host: it is on the CPU (no synchronisation),
    or the user asked for exact checks everywhere (``set_validate_indices('sync')``)."""
    return x.device.type == "cpu" or _VALIDATE_INDICES == "sync"


def _check_class_indices(targets: Tensor, num_classes: int, ignore_index: int) -> None:
    """Indices in [0, C) or ignore_index: the exact ``_checks`` error where values are on the
    host; on an accelerator an asynchronous device assertion (no host sync; it fails the way
    torch's own ``cross_entropy`` does, at the next synchronisation)."""
    if _reads_on_host(targets):
        if targets.numel() == 0:
            return
        # one pass over the targets when every one is a class (the usual case)
        low, high = torch.aminmax(targets)
        if int(low) >= 0 and int(high) < num_classes:
            return
        bad = ((targets < 0) | (targets >= num_classes)) & (targets != ignore_index)
        if bool(bad.any()):
            _checks.class_indices(targets.cpu().numpy(), num_classes, ignore_index)
        return
    bad = ((targets < 0) | (targets >= num_classes)) & (targets != ignore_index)
    torch._assert_async(~bad.any(), _checks.class_indices_device_message(num_classes, ignore_index))


def _scalar_option(name, value, holds, rule):
    """A scalar option checked under torch.compile, where a float that changes between calls is
    a symbol: compared by a check that torch keeps in the graph, never formatted into the message
    (which states the rule alone)."""
    number = _checks.real(name, value)
    torch._check_value(holds(number), lambda: rule)
    return number


def _gamma(gamma):
    """``_checks.gamma``, traceable for a float option that changes between compiled calls."""
    if torch.compiler.is_compiling():
        return _scalar_option("gamma", gamma, _checks.gamma_holds, _checks.GAMMA_RULE)
    return _checks.gamma(gamma)


def _unit_interval(name, value):
    """``_checks.unit_interval``, traceable as ``_gamma``."""
    if torch.compiler.is_compiling():
        rule = _checks.unit_interval_rule(name)
        return _scalar_option(name, value, _checks.unit_interval_holds, rule)
    return _checks.unit_interval(name, value)


def _check_sigmoid_focal_targets(targets: Tensor) -> None:
    """The sigmoid focal loss's targets in [0, 1] (NaN propagates): the exact ``_checks`` error
    where values are on the host, one pass when they are; an asynchronous device assertion on an
    accelerator (as ``_check_class_indices``)."""
    targets = targets.detach()
    if _reads_on_host(targets):
        if targets.numel() == 0:
            return
        low, high = torch.aminmax(targets)
        if not (bool(low < 0.0) or bool(high > 1.0)):
            return
        # float16 and bfloat16 read as float32 (NumPy has no bfloat16), the value unchanged
        _checks.sigmoid_focal_targets(targets.to(_compute_dtype(targets.dtype)).cpu().numpy())
        return
    ok = ~((targets < 0.0) | (targets > 1.0)).any()
    torch._assert_async(ok, _checks.SIGMOID_FOCAL_TARGETS_DEVICE_MESSAGE)


# vector `alpha` tensors already checked: id -> (weak reference, version when checked)
_CHECKED_ALPHA: dict[int, tuple[Any, int]] = {}


def _check_alpha_values(alpha: Tensor) -> None:
    """Every entry of a vector `alpha` in [0, 1], checked once per tensor (again after an
    in-place change, which bumps its version): the exact error on the host, an asynchronous
    device assertion on an accelerator."""
    entry = _CHECKED_ALPHA.get(id(alpha))
    if entry is not None and entry[0]() is alpha and entry[1] == alpha._version:
        return
    if _reads_on_host(alpha):
        _checks.unit_interval_values("alpha", alpha.detach().double().cpu().numpy().ravel())
    else:
        ok = ((alpha >= 0.0) & (alpha <= 1.0)).all()
        torch._assert_async(ok, _checks.UNIT_INTERVAL_DEVICE_MESSAGE)
    if len(_CHECKED_ALPHA) > 64:
        _CHECKED_ALPHA.clear()
    _CHECKED_ALPHA[id(alpha)] = (weakref.ref(alpha), alpha._version)


def _softmax_inputs(logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where):
    """Validates the softmax arguments (the checking half of ``spec._softmax_inputs``).

    Returns (logits, targets, where, class_weight, axis, ignore_index, label_smoothing, is_index):
    tensors on the logits' device, `where` a class mask (a batch-shape mask gets the class axis
    inserted), `class_weight` the per-class vector (`weight` or `alpha`) in the compute dtype, or
    None for ones. The float conversion happens in ``_softmax_targets``, inside the autograd
    Function, so that nothing but the inputs is kept for backward. Under torch.autocast the
    floating inputs are float32, as for ``torch.nn.functional.cross_entropy``.
    """
    logits = _as_array("logits", logits)
    device_type = logits.device.type
    logits = _autocast_float32(logits, device_type)
    targets = _autocast_float32(_as_array("targets", targets, logits.device), device_type)
    _checks.float_logits("logits", logits.is_floating_point(), _dtype_name(logits.dtype))
    axis = _checks.class_axis(axis, logits.ndim)
    num_classes = logits.shape[axis]
    if _is_index(targets):
        kind = "index"
    elif targets.is_floating_point():
        kind = "prob"
    else:
        kind = "other"
    _checks.softmax_targets(kind, targets.shape, _dtype_name(targets.dtype), logits.shape, axis)
    ignore_index = _checks.ignore_index(ignore_index)
    label_smoothing = _unit_interval("label_smoothing", label_smoothing)
    if kind == "index" and _VALIDATE_INDICES and _values_are_concrete(targets):
        _check_class_indices(targets, num_classes, ignore_index)
    if kind == "index":
        # gather and indexing take int64 (a uint8 index tensor would even be read as a mask)
        targets = targets.long()
    if weight is not None:
        weight = _as_array("weight", weight, logits.device)
        _checks.class_vector("weight", weight.shape, num_classes)
    if alpha is not None:
        if not isinstance(alpha, numbers.Real):
            alpha = _as_array("alpha", alpha, logits.device)
        # a number is checked here (no NumPy call: torch.compile traces this function)
        if isinstance(alpha, numbers.Real):
            alpha = _unit_interval("alpha", alpha)
        _checks.focal_alpha(alpha, num_classes)
        if (
            not isinstance(alpha, numbers.Real)
            and _VALIDATE_INDICES
            and _values_are_concrete(alpha)
        ):
            _check_alpha_values(alpha)
    if where is not None:
        where = _as_array("where", where, logits.device)
        is_bool = where.dtype == torch.bool
        # a class mask, or (optax's [batch]) a per-element mask: the class axis inserted
        if _checks.where_mask(where.shape, is_bool, _dtype_name(where.dtype), logits.shape, axis):
            where = where.unsqueeze(axis)

    vector = weight if weight is not None else alpha
    dtype = _compute_dtype(logits.dtype)
    if vector is None:
        class_weight = None
    elif isinstance(vector, numbers.Real):
        class_weight = torch.full((num_classes,), float(vector), dtype=dtype, device=logits.device)
    else:
        # not detached: a `weight` or `alpha` that requires grad gets its gradient (autograd)
        class_weight = vector.to(dtype).expand(num_classes)
    return (
        logits,
        targets,
        where,
        class_weight,
        axis,
        ignore_index,
        label_smoothing,
        kind == "index",
    )


def _softmax_keep(targets, valid, ignore_index, is_index):
    """The elements that count (batch shape, `valid` class axis last), or None for all of them.

    Left out, like an ignored target: a class index equal to `ignore_index`, an element with no
    class left inside `where`, and a class-index target on a class outside `where`.
    """
    keep = targets != ignore_index if is_index else None
    if valid is None:
        if keep is not None and _reads_on_host(keep) and _values_are_concrete(keep):
            # every element kept (the usual case): None, and no per-element masking follows
            return None if bool(keep.all()) else keep
        return keep
    has_class = valid.any(dim=-1)
    keep = has_class if keep is None else keep & has_class
    if is_index:
        y = targets.clamp(0, valid.shape[-1] - 1).unsqueeze(-1)
        keep = keep & valid.gather(-1, y).squeeze(-1)
    return keep


def _softmax_targets(logits, targets, where, class_weight, axis, ignore_index, label_smoothing):
    """The converting half of ``spec._softmax_inputs``, in the compute dtype, class axis last.

    Returns (z, a, y, a_y, keep, valid): `z` the logits with masked classes at -inf, `keep` the
    non-ignored elements, `valid` the classes inside `where` (None: all). Either `a` is the dense
    target mass class_weight * t~ (probability targets, or label smoothing), or (fast path, class
    indices without smoothing) `a` is None and the one-hot mass is `a_y` at class `y` ([..., 1]).
    """
    z = logits.movedim(axis, -1).to(_compute_dtype(logits.dtype))
    num_classes = z.shape[-1]
    # classes outside `where` leave the softmax: exactly a logit of -inf
    if where is None:
        valid = None
    else:
        valid = where.expand(logits.shape).movedim(axis, -1)
        # double where: a row with no class left is all -inf (NaN statistics); it is left out
        # (keep), and zeros keep its unused branch finite for the gradients through it
        has_class = valid.any(dim=-1, keepdim=True)
        z = torch.where(valid, z, torch.where(has_class, -math.inf, 0.0))
    is_index = _is_index(targets)
    keep = _softmax_keep(targets, valid, ignore_index, is_index)
    if is_index:
        y = (targets if keep is None else torch.where(keep, targets, 0)).unsqueeze(-1)
        if label_smoothing == 0.0:
            # fast path: a = class_weight * onehot(y) is nonzero only at y (a_y None: 1)
            if class_weight is None:
                a_y = None if keep is None else keep.to(z.dtype).unsqueeze(-1)
            elif keep is None:
                a_y = class_weight[y]
            else:
                a_y = torch.where(keep.unsqueeze(-1), class_weight[y], 0.0)
            return z, None, y, a_y, keep, valid
        classes = torch.arange(num_classes, device=z.device)
        one_hot = classes == y
        if keep is not None:
            one_hot = one_hot & keep.unsqueeze(-1)
        t = one_hot.to(z.dtype)
    else:
        t = targets.movedim(axis, -1).to(z.dtype)
        if valid is not None:
            # target mass on a class outside `where` leaves the sum (optax), it does not give +inf
            t = torch.where(valid & keep.unsqueeze(-1), t, 0.0)
    if label_smoothing != 0.0:
        # t~ = (1 - eps) t + eps / C, the eps mass spread over the classes inside `where` only
        if valid is None:
            uniform = 1.0 / num_classes
        else:
            num_valid = valid.sum(dim=-1, keepdim=True)
            uniform = torch.where(valid, 1.0 / num_valid.clamp_min(1).to(z.dtype), 0.0)
        if keep is not None:
            uniform = uniform * keep.unsqueeze(-1).to(z.dtype)
        t = (1.0 - label_smoothing) * t + label_smoothing * uniform
    a = t if class_weight is None else class_weight * t
    return z, a, None, None, keep, valid


# ----------------------------------------------------------------------------------------------
# Closed-form derivative rules
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Softmax core
# ----------------------------------------------------------------------------------------------


def _row_stats(z):
    """Per-row z_top (largest logit), top (its index), s, log1p(s) and log(s), shapes [..., 1].

    s = sum_{j != top} exp(z_j - z_top), formed without the top's 1, so log1p(s) keeps full
    relative accuracy when s is tiny (where logsumexp - z_top would round to 0).
    """
    z_top, top = torch.max(z, dim=-1, keepdim=True)
    # shift so that the largest logit is 0: exp cannot overflow (a row of -inf gives NaN)
    shifted = z - z_top
    others = shifted.scatter(-1, top, -math.inf)
    s = torch.exp(others).sum(dim=-1, keepdim=True)
    # + 0 * z_top: a row with a NaN or +inf logit (or only -inf ones) gives NaN, never a number
    log1p_s = torch.log1p(s) + 0.0 * z_top
    # log s where s is a normal number; below that every term using it is O(s^(1+gamma)) ~ 0,
    # and the double where keeps d(log s)/ds = 1/s out of second-order gradients
    tiny = torch.finfo(z.dtype).tiny
    is_normal = s >= tiny
    log_s = torch.where(is_normal, torch.log(torch.where(is_normal, s, 1.0)), -math.inf)
    return z_top, top, shifted, s, log1p_s, log_s


def _log_not_p(p, is_top, s, log_s, log1p_s):
    """log(1 - p): log s - log1p(s) at a top with s < 1 (two numbers of opposite sign),
    log1p(-p) elsewhere, also at a top with s >= 1 (p <= 1/2), where the two logarithms would
    cancel (as spec). Double where: log1p(-p) is -inf at the top when p rounds to 1."""
    from_s = is_top & (s < 1.0)
    return torch.where(from_s, log_s - log1p_s, torch.log1p(-torch.where(from_s, 0.0, p)))


def _log_softmax(z):
    """log p, log(1 - p), p and 1 - p along the last axis (``spec._log_softmax``).

    Only the largest logit (the "top" class, first one on ties) can have p > 1/2. With
    s = sum_{j != top} exp(z_j - z_top), the normaliser is 1 + s exactly, so
      log p_c       = (z_c - z_top) - log1p(s)
      log(1 - p_top) = log(s) - log1p(s),  log s = logsumexp_{j != top} (z_j - z_top), when s < 1
      log(1 - p_c)  = log1p(-p_c) for every other class and a top with s >= 1 (p_c <= 1/2).
    """
    num_classes = z.shape[-1]
    z_top, top, shifted, s, log1p_s, log_s = _row_stats(z)
    is_top = torch.arange(num_classes, device=z.device) == top
    log_p = shifted - log1p_s
    # p = exp(z - z_top) / (1 + s): within ~1 ULP, where exp(log p) would multiply the absolute
    # error of log p by |log p| (as spec)
    p = torch.exp(shifted) / (1.0 + s)
    # 1 - p_top = s / (1 + s), never formed as 1 - p
    not_p = torch.where(is_top, s / (1.0 + s), 1.0 - p)
    log_not_p = _log_not_p(p, is_top, s, log_s, log1p_s)
    return log_p, log_not_p, p, not_p, is_top, s, log1p_s


def _focal_phi(log_p, p, not_p, is_top, s, log1p_s):
    """phi(p) = p log p / (1 - p), in [-1, 0]: phi(0) = 0, phi -> -1 as p -> 1.

    For the top class p = 1 / (1 + s) and 1 - p = s / (1 + s), so phi = -log1p(s) / s.
    Below s = eps the series -1 + s/2 is exact to rounding (and its derivative stays finite where
    the second-order gradient of log1p(s) / s would divide by s^2).
    """
    eps = torch.finfo(s.dtype).eps
    is_big = s > eps
    phi_top = torch.where(is_big, -log1p_s / torch.where(is_big, s, 1.0), s / 2.0 - 1.0)
    # double where: p log p is 0 * (-inf) for a class at -inf, and 1 - p may be 0 at the top
    has_p = (p > 0.0) & ~is_top
    safe_log_p = torch.where(has_p, log_p, 0.0)
    phi_rest = torch.where(has_p, p * safe_log_p / torch.where(has_p, not_p, 1.0), 0.0)
    return torch.where(is_top, phi_top, phi_rest)


def _sum_except_self(v):
    """sum_{c != j} v_c for each j, for v >= 0, without cancellation.

    S - v_j is accurate when v_j <= S / 2, which holds for all but at most one class per row (the
    largest); for that one the sum of the others is formed directly.
    """
    total = v.sum(dim=-1, keepdim=True)
    big = torch.argmax(v, dim=-1, keepdim=True)
    rest_of_big = v.scatter(-1, big, 0.0).sum(dim=-1, keepdim=True)
    return (total - v).scatter(-1, big, rest_of_big)


def _softmax_focal_terms(z, a, gamma, grad_loss):
    """Per-element loss -sum_c a_c (1 - p_c)^gamma log p_c, or its gradient times `grad_loss`.

    With gamma = 0 this is the (weighted) softmax cross entropy -sum_c a_c log p_c.
    The gradient is p_j sum_{c != j} v_c - (1 - p_j) v_j, the same as p * sum(v) - v but free of
    the cancellation p_j - 1 when p_j is close to 1. Class axis last; `grad_loss` None: the loss.
    """
    log_p, log_not_p, p, not_p, is_top, s, log1p_s = _log_softmax(z)
    if gamma == 0.0:
        # (1 - p)^0 = 1, also at p = 1
        focal_weight = None
        v = a
    else:
        # (1 - p)^gamma = exp(gamma log(1 - p))
        focal_weight = torch.exp(gamma * log_not_p)
        phi = _focal_phi(log_p, p, not_p, is_top, s, log1p_s)
        v = a * focal_weight * (1.0 - gamma * phi)
    if grad_loss is None:
        # 0 log 0 = 0: a class with no target mass contributes nothing, also when its logit is
        # -inf (double where: d/da stays -(1 - p)^gamma log p, finite, wherever p > 0)
        weighted = a if focal_weight is None else a * focal_weight
        loss = -(weighted * torch.where((a == 0.0) & (log_p == -math.inf), 0.0, log_p))
        return loss.sum(dim=-1)
    grad = p * _sum_except_self(v) - not_p * v
    return grad * grad_loss.unsqueeze(-1)


def _softmax_focal_terms_sparse(z, y, a_y, gamma, grad_loss):
    """``_softmax_focal_terms`` for a = a_y * onehot(y): only column y of the N x C work is done.

    The loss is -a_y (1 - p_y)^gamma log p_y; with v nonzero only at y, sum_{c != j} v_c is v_y for
    j != y and 0 for j = y, so the gradient is p_j v_y off y and -(1 - p_y) v_y at y. Returns the
    loss (`grad_loss` None) or the gradient times `grad_loss` (shape [...]).
    """
    if a_y is None:
        # a target mass of 1 (every element kept, no class weight)
        a_y = torch.ones(y.shape, dtype=z.dtype, device=z.device)
    inplace = _inplace(z, y, a_y, grad_loss)
    if inplace:
        # fast path of _row_stats on one temporary: exp(z - z_top) with the top's 1 left out
        z_top, top = torch.max(z, dim=-1, keepdim=True)
        shifted = z - z_top
        shifted_y = shifted.gather(-1, y)
        others = shifted.scatter_(-1, top, -math.inf).exp_()
        s = others.sum(dim=-1, keepdim=True)
        log1p_s = torch.log1p(s) + 0.0 * z_top
        tiny = torch.finfo(z.dtype).tiny
        log_s = torch.where(s >= tiny, torch.log(s.clamp_min(tiny)), -math.inf)
    else:
        z_top, top, shifted, s, log1p_s, log_s = _row_stats(z)
        shifted_y = shifted.gather(-1, y)
    is_top = y == top
    log_p = shifted_y - log1p_s
    p = torch.exp(log_p)
    # 1 - p_top = s / (1 + s), never formed as 1 - p (exp(-log1p_s) carries a NaN row along)
    not_p = torch.where(is_top, s * torch.exp(-log1p_s), 1.0 - p)
    log_not_p = _log_not_p(p, is_top, s, log_s, log1p_s)
    if gamma == 0.0:
        # (1 - p)^0 = 1, also at p = 1
        focal_weight = None
        v = a_y
    else:
        # (1 - p)^gamma = exp(gamma log(1 - p))
        focal_weight = torch.exp(gamma * log_not_p)
        phi = _focal_phi(log_p, p, not_p, is_top, s, log1p_s)
        v = a_y * focal_weight * (1.0 - gamma * phi)
    if grad_loss is None:
        # 0 log 0 = 0: no target mass contributes nothing, also when its logit is -inf
        weighted = a_y if focal_weight is None else a_y * focal_weight
        loss = -(weighted * torch.where((a_y == 0.0) & (log_p == -math.inf), 0.0, log_p))
        return loss.squeeze(-1)
    coefficient = grad_loss.unsqueeze(-1) * v
    if inplace:
        # p_j = exp(z_j - z_top) / (1 + s) off the top, 1 / (1 + s) at it: the temporary reused
        p_top = torch.exp(-log1p_s)
        grad = others.mul_(coefficient * p_top)
        grad = grad.scatter_(-1, top, coefficient * p_top)
        return grad.scatter_(-1, y, -not_p * coefficient)
    # p_j = exp(z_j - z_top - log1p(s)): one pass over the logits, then column y
    grad = torch.exp(shifted - log1p_s) * coefficient
    return grad.scatter(-1, y, -not_p * coefficient)


def _softmax_loss_or_grad(
    logits, targets, where, class_weight, axis, gamma, ignore_index, label_smoothing, grad_loss
):
    """The per-element loss (`grad_loss` None) or the logits' gradient (times `grad_loss`)."""
    z, a, y, a_y, keep, valid = _softmax_targets(
        logits, targets, where, class_weight, axis, ignore_index, label_smoothing
    )
    if a is None:
        result = _softmax_focal_terms_sparse(z, y, a_y, gamma, grad_loss)
    else:
        result = _softmax_focal_terms(z, a, gamma, grad_loss)
    if grad_loss is None:
        # ignored elements give 0, whatever their logits
        return result if keep is None else torch.where(keep, result, 0.0)
    # ignored elements and masked classes get no gradient
    mask = None if keep is None else keep.unsqueeze(-1)
    if valid is not None:
        mask = valid if mask is None else mask & valid
    if mask is None:
        grad = result
    elif _inplace(result, mask):
        grad = result.masked_fill_(~mask, 0.0)
    else:
        grad = torch.where(mask, result, 0.0)
    return grad.movedim(-1, axis).to(logits.dtype)


# saves logits, targets, where, class_weight; axis, gamma, ignore_index, label_smoothing are options
_softmax_focal_loss = _with_closed_form_grad(_softmax_loss_or_grad, 4)


# ----------------------------------------------------------------------------------------------
# Fast path: class-index targets without label smoothing, float32/float64 logits
# ----------------------------------------------------------------------------------------------


def _target_rows(p_y, log_p_y, q, p_top, is_top, a_y, gamma):
    """The focal terms (gamma != 0) of the target class y of each row ([..., 1] each): v_y, the
    coefficient of the gradient (p_j v_y off y, -(1 - p_y) v_y at y), 1 - p_y and
    (1 - p_y)^gamma; `a_y` None is a target mass of 1.

    `q` = 1 - p_top = sum_{j != top} p_j (no cancellation), so at the top 1 - p_y = q and
    s = sum_{j != top} exp(z_j - z_top) = q / p_top, the quantities ``_focal_phi`` takes.
    """
    not_p_y = torch.where(is_top, q, 1.0 - p_y)
    # log(1 - p_y): log q at the top (-inf below the smallest normal, double where: the
    # second-order gradient of log q at q = 0 stays out), log1p(-p_y) elsewhere
    tiny = torch.finfo(q.dtype).tiny
    q_normal = q >= tiny
    log_q = torch.where(q_normal, torch.log(torch.where(q_normal, q, 1.0)), -math.inf)
    log_not_p = torch.where(is_top, log_q, torch.log1p(-torch.where(is_top, 0.0, p_y)))
    focal_weight = torch.exp(gamma * log_not_p)
    s = q / p_top
    phi = _focal_phi(log_p_y, p_y, not_p_y, is_top, s, torch.log1p(s))
    v = focal_weight * (1.0 - gamma * phi)
    return v if a_y is None else a_y * v, not_p_y, focal_weight


def _sum_except_target(p, y, p_y, inplace):
    """r = sum_{j != y} p_j ([..., 1]): the target's entry zeroed, p summed and (in place) the
    entry put back; one pass over p, no temporary when `inplace`."""
    zero = torch.zeros_like(p_y)  # a tensor: torch's scatter_ of a number is 3x slower at C ~ 10
    if not inplace:
        return p.scatter(-1, y, zero).sum(dim=-1, keepdim=True)
    r = p.scatter_(-1, y, zero).sum(dim=-1, keepdim=True)
    p.scatter_(-1, y, p_y)
    return r


class _SoftmaxAtTarget(torch.autograd.Function):
    """Softmax CE / focal loss with class-index targets, no label smoothing: the fast path.

    forward(z, y, a_y, keep, gamma) with z the class-last logits (float32 or float64), y and a_y
    of shape [..., 1], keep [...] or None, returns (loss [...], p [..., C], r [..., 1]). Two
    passes over N x C in forward (torch's fused softmax, then the row sum of p) and one in
    backward (p times one number per row, then the target's entry): the backward recomputes
    nothing, and in the graph's last backward it writes the gradient over p. The saved tensor is
    p (the size of the logits; the logits themselves are not kept).

    r = sum_{j != y} p_j is 1 - p_y without cancellation: where the target does not dominate its
    row (r >= p_y) the row sum less p_y, which loses under one ULP of r to the subtraction; where
    it does, the row summed with the target's entry left out (on the CPU those rows only, found
    from N values; elsewhere every row that way). So in every row

      log p_y = -log1p(s),  s = r / p_y = sum_{j != y} exp(z_j - z_y),   1 - p_y = r / (p_y + r):

    a confident row keeps its tiny loss log1p(s) where softmax's p_y rounds to 1, and the ratio
    cancels the rounding of softmax's own row sum (p_y + r is that sum in cascade summation). Below
    the smallest normal number p_y has lost digits (0 once it underflows): there
    log p_y = (z_y - z_top) + log(p_top / (p_y + r)) from the logits, on those rows only on the
    CPU (p_top >= 1 / C never underflows). The focal terms need to know whether y is the top
    class where p_y is close to 1: it is where p_y > r (the target dominates its row).

    p and r are outputs of the function (saved as such), so under ``create_graph=True`` the
    backward, written in differentiable ops of them, is differentiated through them: their
    gradients come back here as grad_p (softmax's Jacobian) and grad_r (r = 1 - p_y).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(z, y, a_y, keep, gamma):
        p = torch.softmax(z, dim=-1)
        p_y = p.gather(-1, y)
        inplace = _inplace(p, y)
        on_host = inplace and _reads_on_host(p)
        if on_host:
            # where the target does not dominate its row (r >= p_y) the row sum less p_y loses
            # under one ULP of r; where it does, the others are summed apart, on those rows only
            r = p.sum(dim=-1, keepdim=True) - p_y
            dominant = (p_y > r).squeeze(-1)
            count = int(dominant.count_nonzero())
            if 4 * count > dominant.numel():
                r = _sum_except_target(p, y, p_y, inplace=True)
            elif count > 0:
                rows = dominant.nonzero(as_tuple=True)  # found once, for every gather below
                r[rows] = _sum_except_target(p[rows], y[rows], p_y[rows], inplace=True)
        else:
            r = _sum_except_target(p, y, p_y, inplace)
        if keep is not None:
            # an ignored row with a NaN or inf logit has a NaN softmax; its gradient is 0 (p * 0
            # would be NaN), so its p becomes 0 and r 1 (a finite p_y + r): on the CPU only when
            # there is such a row (no sync), elsewhere one masked pass
            bad = (~keep).unsqueeze(-1) & torch.isnan(r + p_y)
            if not (on_host and not bool(bad.any())):
                r = torch.where(bad, 1.0, r)
                p_y = torch.where(bad, 0.0, p_y)
                p = torch.where(bad, 0.0, p)
        # log p_y = -log(1 + r / p_y), the ratio free of softmax's own rounded row sum
        log_p_y = torch.log1p(r / p_y).neg_()
        # below the smallest normal number p_y has lost digits (0 once it underflows): there
        # log p_y = (z_y - z_top) + log(p_top / (p_y + r)) from the logits
        small = p_y < torch.finfo(p.dtype).tiny
        if on_host:
            if bool(small.any()):
                rows = small.squeeze(-1).nonzero(as_tuple=True)
                z_rows, p_rows = z[rows], p[rows]
                log_p_y[rows] = (
                    z_rows.gather(-1, y[rows]) - z_rows.amax(dim=-1, keepdim=True)
                ) + torch.log(p_rows.amax(dim=-1, keepdim=True) / (p_y[rows] + r[rows]))
        else:
            from_logits = (z.gather(-1, y) - z.amax(dim=-1, keepdim=True)) + torch.log(
                p.amax(dim=-1, keepdim=True) / (p_y + r)
            )
            log_p_y = torch.where(small, from_logits, log_p_y)
        if gamma == 0.0:
            focal_weight = None
        else:
            k = 1.0 / (p_y + r)
            is_top = p_y > r
            _, _, focal_weight = _target_rows(
                torch.exp(log_p_y), log_p_y, r * k, torch.where(is_top, p_y * k, 1.0), is_top,
                a_y, gamma,
            )  # fmt: skip
        if a_y is None:
            # a target mass of 1 (every element kept, no class weight)
            loss = -log_p_y if focal_weight is None else -(focal_weight * log_p_y)
        else:
            weighted = a_y if focal_weight is None else a_y * focal_weight
            # 0 log 0 = 0: no target mass contributes nothing, also when its logit is -inf
            zero = (a_y == 0.0) & (log_p_y == -math.inf)
            loss = -(weighted * torch.where(zero, 0.0, log_p_y))
        loss = loss.squeeze(-1)
        if keep is not None:
            # ignored elements give 0, whatever their logits
            loss = torch.where(keep, loss, 0.0)
        return loss, p, r

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, y, a_y, _, gamma = inputs
        _, p, r = output
        ctx.save_for_backward(p, r, y, a_y)
        ctx.gamma = gamma
        ctx.p_is_private = _saved_tensors_are_private()
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_loss, grad_p, grad_r):
        p, r, y, a_y = ctx.saved_tensors
        # p is ours (an output nobody else holds, no pack hook kept it): once this backward is the
        # graph's last, the gradient may overwrite it, unless a gradient through p still reads it
        reuse_p = ctx.p_is_private and grad_p is None and grad_r is None and _frees_saved_tensors()
        grad = None
        if grad_loss is not None and ctx.gamma == 0.0:
            # cross entropy: p_j c off the target, -(1 - p_y) c = -r k c at it (k below)
            k = 1.0 / (p.gather(-1, y) + r)
            coefficient = grad_loss.unsqueeze(-1) if a_y is None else grad_loss.unsqueeze(-1) * a_y
            scale = coefficient * k
            if reuse_p and _inplace(p, scale):
                # the gradient written over the saved p: one read and one write of N x C
                # (detached: p, an output of this function, carries its graph)
                grad = p.detach().mul_(scale).scatter_(-1, y, (r * scale).neg_())
            elif _inplace(p, scale):
                grad = torch.mul(p, scale).scatter_(-1, y, (r * scale).neg_())
            else:
                grad = (p * scale).scatter(-1, y, -(r * scale))
        elif grad_loss is not None:
            p_y = p.gather(-1, y)
            is_top = p_y > r
            # softmax's row sum is rounded by its own kernel (tens of ULP at C ~ 30k); the sum
            # of its terms is p_y + r (cascade summation), so k = 1 / (p_y + r) renormalises
            # p to within a few ULP (k is 1 in exact arithmetic: under create_graph it adds
            # nothing, as dr = -dp_y)
            k = 1.0 / (p_y + r)
            p_y = p_y * k
            r = r * k
            # log p_y enters only phi (as p_y log p_y): p_y from the softmax is enough here
            has_p = p_y > 0.0
            log_p_y = torch.where(
                is_top,
                torch.log1p(-r),
                torch.where(has_p, torch.log(torch.where(has_p, p_y, 1.0)), -math.inf),
            )
            p_top = torch.where(is_top, p_y, 1.0)
            v, not_p_y, _ = _target_rows(p_y, log_p_y, r, p_top, is_top, a_y, ctx.gamma)
            coefficient = grad_loss.unsqueeze(-1) * v
            if reuse_p and _inplace(p, coefficient):
                grad = p.detach().mul_(coefficient * k).scatter_(-1, y, -not_p_y * coefficient)
            elif _inplace(p, coefficient):
                grad = torch.mul(p, coefficient * k).scatter_(-1, y, -not_p_y * coefficient)
            else:
                grad = (p * (coefficient * k)).scatter(-1, y, -not_p_y * coefficient)
        if grad_p is not None:
            # the softmax's Jacobian: p (grad_p - sum_k p_k grad_p_k)
            through_p = torch._softmax_backward_data(grad_p, p, -1, p.dtype)
            grad = through_p if grad is None else grad + through_p
        if grad_r is not None:
            # r = 1 - p_y: dr/dz_k = p_y p_k off the target, -p_y r at it
            scale = grad_r * p.gather(-1, y)
            through_r = (p * scale).scatter(-1, y, -scale * r)
            grad = through_r if grad is None else grad + through_r
        return grad, None, None, None, None


def _softmax_at_target(logits, targets, where, class_weight, axis, gamma, ignore_index):
    """The per-element loss through ``_SoftmaxAtTarget`` (its outputs p and r only feed the
    backward)."""
    z, _, y, a_y, keep, _ = _softmax_targets(
        logits, targets, where, class_weight, axis, ignore_index, 0.0
    )
    loss, _, _ = _SoftmaxAtTarget.apply(z, y, a_y, keep, gamma)
    return loss


def _at_target(logits, class_weight, label_smoothing, is_index):
    """Whether ``_SoftmaxAtTarget`` applies: class indices, no smoothing, float32/float64 logits
    (half inputs keep their own, smaller, saved logits), no class weight that needs a gradient."""
    return (
        is_index
        and label_smoothing == 0.0
        and logits.dtype in (torch.float32, torch.float64)
        and (
            class_weight is None
            or (not class_weight.requires_grad and _values_are_concrete(class_weight))
        )
    )


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------


def _reduce(loss, reduction, denominator):
    """Applies `reduction` to per-element losses (autograd carries the gradients).

    A mean over a zero denominator (every target ignored, or no elements) is 0 with zero gradient.
    `denominator` is a number, or a tensor (summed class weights) that is never read on the host.
    """
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    if not isinstance(denominator, Tensor):
        if denominator == 0:
            return total * 0.0
        return total / denominator
    is_zero = denominator == 0.0
    return torch.where(is_zero, total * 0.0, total / torch.where(is_zero, 1.0, denominator))


def _softmax(
    logits,
    targets,
    axis,
    class_weight_arg,
    gamma,
    is_focal,
    ignore_index,
    label_smoothing,
    where,
    reduction,
):
    reduction = _checks.reduction(reduction)
    if is_focal:
        gamma = _gamma(gamma)
        weight, alpha = None, class_weight_arg
    else:
        weight, alpha = class_weight_arg, None
    logits, targets, where, class_weight, axis, ignore_index, label_smoothing, is_index = (
        _softmax_inputs(logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where)
    )
    if _at_target(logits, class_weight, label_smoothing, is_index):
        loss = _softmax_at_target(logits, targets, where, class_weight, axis, gamma, ignore_index)
    else:
        loss = _softmax_focal_loss(
            logits, targets, where, class_weight, axis, gamma, ignore_index, label_smoothing
        )
    if reduction != "mean":
        denominator = None
    else:
        valid = None if where is None else where.expand(logits.shape).movedim(axis, -1)
        keep = _softmax_keep(targets, valid, ignore_index, is_index)
        if is_index and not is_focal and class_weight is not None:
            # torch: the weighted mean divides by the weights of the kept targets
            if keep is None:
                denominator = class_weight[targets].sum()
            else:
                targets = torch.where(keep, targets, 0)
                denominator = torch.where(keep, class_weight[targets], 0.0).sum()
        elif keep is not None:
            # plain mean over the kept elements (probability targets: those with a class left)
            denominator = keep.sum()
        else:
            denominator = loss.numel()
    loss = _reduce(loss, reduction, denominator)
    return loss.to(logits.dtype)


# ----------------------------------------------------------------------------------------------
# Public API: softmax losses
# ----------------------------------------------------------------------------------------------


def softmax_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    *,
    axis: int = 1,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    where: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Softmax cross entropy, torch ``F.cross_entropy`` semantics (``spec.softmax_cross_entropy``).

    Differs from the spec: class axis default 1 (torch layout); the result is a tensor in the
    logits' dtype (half precision computed in float32); the gradient is the spec's closed form.
    A mean over no kept element is 0 (torch: NaN).
    """
    return _softmax(
        logits, targets, axis, weight, 0.0, False, ignore_index, label_smoothing, where, reduction
    )


def softmax_focal_loss(
    logits: Tensor,
    targets: Tensor,
    *,
    axis: int = 1,
    gamma: float = 2.0,
    alpha: Tensor | float | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    where: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Softmax focal loss (see ``spec.softmax_focal_loss``), class axis default 1.

    Result in the logits' dtype (half precision computed in float32), closed-form gradient,
    bounded for every gamma >= 0.
    """
    return _softmax(
        logits, targets, axis, alpha, gamma, True, ignore_index, label_smoothing, where, reduction
    )


# ----------------------------------------------------------------------------------------------
# Fused linear + softmax losses (large vocabularies)
# ----------------------------------------------------------------------------------------------


def _linear_block(z, y, a_y, kept, class_weight, gamma, label_smoothing, grad_loss):
    """Loss of each row of the block's logits `z` (rows, V) and, with `grad_loss`, the gradient
    w.r.t. `z` times grad_loss, written over `z` itself (the block's only (rows, V) tensor).

    Index targets y with mass a_y = class_weight_y (0 for ignored rows), `kept` 1 or 0 per row.
    With e = exp(z - z_top), S_y = sum_{j != y} e_j (column y left out of the sum, so no
    cancellation) and r = S_y / e_y:
      log p_y = -log1p(r) (r <= 1) or (z_y - z_top) - log(S) (r > 1, p_y < 1/2),
      log(1 - p_y) = log r - log1p(r) (r <= 1) or log1p(-p_y),  1 - p_y = S_y / S,
      phi(p_y) = p log p / (1 - p) = -log1p(r) / r (-1 + r / 2 below eps),
    the identities of ``spec._log_softmax`` / ``_focal_phi`` with y in place of the top class:
    exact for every y, also p_y within 1e-30 of 1. The gradient is p_j v_y off y and
    -(1 - p_y) v_y at y (``_softmax_focal_terms_sparse``). Label smoothing (cross entropy only,
    gamma = 0): a = (1 - eps) a_y onehot(y) + eps w / V, loss = sum_c a_c (log S - (z_c - z_top)),
    gradient p sum(a) - a.
    """
    num_classes = z.shape[-1]
    # shift so that the largest logit is 0: exp cannot overflow; a NaN or +inf logit gives NaN
    z_top = torch.amax(z, dim=-1, keepdim=True)
    shifted = z.sub_(z_top)
    shifted_y = shifted.gather(-1, y)
    if label_smoothing != 0.0:
        uniform = label_smoothing / num_classes
        if class_weight is None:
            spread = shifted.sum(dim=-1, keepdim=True)
            weight_sum = float(num_classes)
        else:
            spread = (shifted @ class_weight).unsqueeze(-1)
            weight_sum = class_weight.sum()
    e = shifted.exp_()
    e_y = e.gather(-1, y)
    others = e.scatter_(-1, y, 0.0).sum(dim=-1, keepdim=True)
    total = others + e_y
    log_total = torch.log(total)
    if label_smoothing != 0.0:
        # the eps share of the mass sits on every class: no one-hot shortcut for the loss
        mass = (1.0 - label_smoothing) * a_y + uniform * weight_sum * kept
        loss = (1.0 - label_smoothing) * a_y * (log_total - shifted_y)
        loss = loss + uniform * kept * (weight_sum * log_total - spread)
        focal_weight = None
        v = (1.0 - label_smoothing) * a_y
    else:
        has_y = e_y > 0.0
        r = others / torch.where(has_y, e_y, 1.0)
        small = has_y & (r <= 1.0)
        log1p_r = torch.log1p(torch.where(small, r, 0.0))
        log_p = torch.where(small, -log1p_r, shifted_y - log_total)
        p = e_y / total
        if gamma == 0.0:
            # (1 - p)^0 = 1, also at p = 1
            focal_weight = None
            v = a_y
        else:
            log_not_p = torch.where(
                small, torch.log(r) - log1p_r, torch.log1p(-torch.where(small, 0.0, p))
            )
            # (1 - p)^gamma = exp(gamma log(1 - p))
            focal_weight = torch.exp(gamma * log_not_p)
            eps = torch.finfo(z.dtype).eps
            is_big = r > eps
            phi = torch.where(is_big, -log1p_r / torch.where(is_big, r, 1.0), r / 2.0 - 1.0)
            phi = torch.where(small, phi, torch.where(has_y, p * log_p / (others / total), 0.0))
            v = a_y * focal_weight * (1.0 - gamma * phi)
        # 0 log 0 = 0: no target mass (ignored row, zero weight) contributes nothing
        weighted = a_y if focal_weight is None else a_y * focal_weight
        loss = -torch.where(a_y == 0.0, 0.0, weighted * log_p)
        mass = v
    if grad_loss is None:
        return loss.squeeze(-1), None
    coefficient = grad_loss.unsqueeze(-1) * mass / total
    # p_j v off y (column y of e is 0 now), -(1 - p_y) v_y at y: 1 - p_y = S_y / S
    grad = e.mul_(coefficient)
    if label_smoothing != 0.0:
        # minus the eps share eps w_c / V of every class; column y: p_y sum(a) - a_y
        uniform_mass = uniform * grad_loss.unsqueeze(-1) * kept
        if class_weight is None:
            grad.sub_(uniform_mass)
            uniform_y = uniform_mass
        else:
            grad.addcmul_(uniform_mass, class_weight, value=-1.0)
            uniform_y = uniform_mass * class_weight[y]
        at_y = grad_loss.unsqueeze(-1) * (e_y / total * mass - (1.0 - label_smoothing) * a_y)
        at_y = at_y - uniform_y
    else:
        at_y = -(others / total) * grad_loss.unsqueeze(-1) * v
    grad = grad.scatter_(-1, y, at_y)
    return loss.squeeze(-1), grad


def _linear_chunks(h, w, b, y, class_weight, gamma, ignore_index, label_smoothing, rows, grad_loss):
    """The per-row losses of logits = h w^T + b, one block of `rows` rows at a time, and (with
    `grad_loss`, per-row factors) the gradients of sum_i grad_loss_i l_i w.r.t. h, w and b.

    Each block's (rows, V) logits are formed in the compute dtype (float32 for half inputs);
    ``_linear_block`` turns them in place into the block's gradient G, mapped through the linear
    layer at once: dh = G w, dw += G^T h, db += sum_rows G. The focal loss with label smoothing
    takes the softmax losses' dense path (``_softmax_loss_or_grad``) instead. The accumulators
    are in the compute dtype: float32 for half inputs (a bfloat16 running sum loses every small
    update). Ignored rows enter with hidden 0 (their loss and gradient are 0 whatever their
    features, NaN included). Returns (loss, dh, dw, db); the gradients None without
    `grad_loss`, db None without `b`.
    """
    dtype = _compute_dtype(h.dtype)
    num_rows = h.shape[0]
    w = w.to(dtype)
    b = None if b is None else b.to(dtype)
    loss = torch.empty(num_rows, dtype=dtype, device=h.device)
    dh = dw = db = None
    if grad_loss is not None:
        dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        dw = torch.zeros(w.shape, dtype=dtype, device=h.device)
        db = None if b is None else torch.zeros(b.shape, dtype=dtype, device=h.device)
    dense = gamma != 0.0 and label_smoothing != 0.0
    # one (rows, V) buffer for every block: the allocator hands no block back and forth (glibc
    # keeps freed blocks resident once its mmap threshold has risen to their size)
    buffer = torch.empty((min(rows, num_rows), w.shape[0]), dtype=dtype, device=h.device)
    for start in range(0, num_rows, rows):
        y_block = y[start : start + rows]
        keep = (y_block != ignore_index).unsqueeze(-1)
        h_block = torch.where(keep, h[start : start + rows].to(dtype), 0.0)
        z = buffer[: h_block.shape[0]]
        if b is None:
            torch.mm(h_block, w.T, out=z)
        else:
            torch.addmm(b, h_block, w.T, out=z)
        block_grad = None if grad_loss is None else grad_loss[start : start + rows]
        if dense:
            options = (1, gamma, ignore_index, label_smoothing)
            block_loss = _softmax_loss_or_grad(z, y_block, None, class_weight, *options, None)
            grad = None
            if block_grad is not None:
                grad = _softmax_loss_or_grad(z, y_block, None, class_weight, *options, block_grad)
        else:
            y_safe = torch.where(keep, y_block.unsqueeze(-1), 0)
            ones = torch.ones((), dtype=dtype, device=h.device)
            a_y = torch.where(keep, ones if class_weight is None else class_weight[y_safe], 0.0)
            kept = keep.to(dtype)
            block_loss, grad = _linear_block(
                z, y_safe, a_y, kept, class_weight, gamma, label_smoothing, block_grad
            )
        loss[start : start + rows] = block_loss
        if grad is None:
            continue
        dh[start : start + rows] = grad @ w
        dw.addmm_(grad.T, h_block)
        if db is not None:
            db += grad.sum(dim=0)
    return loss, dh, dw, db


class _LinearSoftmax(torch.autograd.Function):
    """The fused loss as one autograd node: nothing of size (N, V) outlives a block.

    Reductions 'mean' and 'sum': when a gradient is wanted, the forward computes it along with
    the loss (one pass: 3 matrix products per block, as the unfused loss), for an output gradient
    of 1, and the backward scales it (a second backward, retain_graph, recomputes it from the saved
    inputs). Reduction 'none': the backward recomputes the blocks with the per-row output gradient.
    The backward itself is not differentiable (create_graph raises, never a silent None).
    """

    @staticmethod
    def forward(ctx, h, w, b, y, class_weight, row_scale, options):
        gamma, ignore_index, label_smoothing, rows, per_row = options
        needs = any(ctx.needs_input_grad[:3])
        grad_loss = None
        if needs and not per_row:
            grad_loss = row_scale.expand(h.shape[0])
        loss, dh, dw, db = _linear_chunks(
            h, w, b, y, class_weight, gamma, ignore_index, label_smoothing, rows, grad_loss
        )
        ctx.save_for_backward(h, w, b, y, class_weight, row_scale)
        ctx.options = options
        ctx.precomputed = None if grad_loss is None else (dh, dw, db)
        if per_row:
            return loss
        # each term divided before summing: 0 when nothing is kept (row_scale 0)
        return (loss * row_scale).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        h, w, b, y, class_weight, row_scale = ctx.saved_tensors
        gamma, ignore_index, label_smoothing, rows, per_row = ctx.options
        if ctx.precomputed is not None:
            dh, dw, db = ctx.precomputed
            ctx.precomputed = None
            scale = grad_output.to(dw.dtype)
        else:
            grad_loss = grad_output if per_row else (row_scale * grad_output).expand(h.shape[0])
            _, dh, dw, db = _linear_chunks(
                h, w, b, y, class_weight, gamma, ignore_index, label_smoothing, rows, grad_loss
            )
            scale = None
        if scale is not None:
            dh = (dh * scale).to(h.dtype)
            dw = dw.mul_(scale)
            db = None if db is None else db.mul_(scale)
        dw = dw.to(w.dtype)
        db = None if db is None else db.to(b.dtype)
        return dh, dw, db, None, None, None, None


def _linear_softmax(
    hidden,
    linear_weight,
    targets,
    bias,
    class_weight_arg,
    gamma,
    is_focal,
    ignore_index,
    label_smoothing,
    reduction,
    chunk_size,
):
    """Validates the fused loss's arguments and applies ``_LinearSoftmax`` to the rows of
    `hidden` (``spec._linear_softmax``, without its (N, V) logits)."""
    reduction = _checks.reduction(reduction)
    hidden = _as_array("hidden", hidden)
    linear_weight = _as_array("linear_weight", linear_weight, hidden.device)
    targets = _as_array("targets", targets, hidden.device)
    _checks.float_logits("hidden", hidden.is_floating_point(), _dtype_name(hidden.dtype))
    _checks.float_logits(
        "linear_weight", linear_weight.is_floating_point(), _dtype_name(linear_weight.dtype)
    )
    _checks.index_targets(_is_index(targets), _dtype_name(targets.dtype))
    if bias is not None:
        bias = _as_array("bias", bias, hidden.device)
    bias_shape = None if bias is None else bias.shape
    size, num_classes = _checks.linear_shapes(
        hidden.shape, linear_weight.shape, bias_shape, targets.shape, 0
    )
    chunk_size = _checks.chunk_size(chunk_size)
    ignore_index = _checks.ignore_index(ignore_index)
    label_smoothing = _unit_interval("label_smoothing", label_smoothing)
    if is_focal:
        gamma = _gamma(gamma)
        name = "alpha"
    else:
        name = "weight"
    vector = class_weight_arg
    dtype = _compute_dtype(hidden.dtype)
    if vector is not None and not isinstance(vector, numbers.Real):
        vector = _as_array(name, vector, hidden.device)
        if vector.requires_grad:
            raise ValueError(
                f"`{name}` must not require grad: the fused linear losses give no gradient "
                f"w.r.t. it (pass {name}.detach()). Received: {name}.requires_grad=True."
            )
    if is_focal:
        _checks.focal_alpha(vector, num_classes)
        if isinstance(vector, Tensor) and _VALIDATE_INDICES and _values_are_concrete(vector):
            _checks.unit_interval_values("alpha", vector.double().cpu().numpy().ravel())
    elif vector is not None:
        _checks.class_vector("weight", vector.shape, num_classes)
    if vector is None:
        class_weight = None
    elif isinstance(vector, numbers.Real):
        class_weight = torch.full((num_classes,), float(vector), dtype=dtype, device=hidden.device)
    else:
        class_weight = vector.to(dtype).expand(num_classes)
    y = targets.reshape(-1)
    if _VALIDATE_INDICES and _values_are_concrete(y):
        # one device synchronisation; see the module docstring to skip it
        bad = ((y < 0) | (y >= num_classes)) & (y != ignore_index)
        if bool(bad.any()):
            _checks.class_indices(targets.cpu().numpy(), num_classes, ignore_index)
    y = y.long()
    h = hidden.reshape(-1, size)
    keep = y != ignore_index
    if reduction == "mean":
        if is_focal or class_weight is None:
            # plain mean over the kept rows
            denominator = keep.sum().to(dtype)
        else:
            # torch: the weighted mean divides by the weights of the kept targets
            denominator = torch.where(keep, class_weight[torch.where(keep, y, 0)], 0.0).sum()
        is_zero = denominator == 0.0
        row_scale = torch.where(is_zero, 0.0, 1.0 / torch.where(is_zero, 1.0, denominator))
    else:
        row_scale = torch.ones((), dtype=dtype, device=hidden.device)
    if chunk_size is None:
        # the dense path (label smoothing) holds ~8 temporaries per block, the gather path ~3
        budget = (1 << 22) if label_smoothing == 0.0 else (1 << 19)
        # up to 1/16 of the logits (64 MiB blocks at most): at (4096, 256, 32000) 256 rows, 1.3x
        # faster than 128 rows on CPU, the block 0.0625x the logits
        chunk_size = _checks.default_chunk_size(h.shape[0], num_classes, budget, fraction=16)
    options = (gamma, ignore_index, label_smoothing, chunk_size, reduction == "none")
    loss = _LinearSoftmax.apply(h, linear_weight, bias, y, class_weight, row_scale, options)
    if reduction == "none":
        loss = loss.reshape(targets.shape)
    return loss.to(hidden.dtype)


def linear_softmax_cross_entropy(
    hidden: Tensor,
    linear_weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Softmax cross entropy of ``F.linear(hidden, linear_weight, bias)`` without the (N, V)
    logits (``spec.linear_softmax_cross_entropy``).

    Differs from the spec: `linear_weight` is (V, H) as ``nn.Linear``; rows are processed in
    blocks of `chunk_size` (default: (rows, V) blocks of 4M entries (512K with label smoothing),
    grown up to 1/16 of the logits and 16M entries), so the extra memory is one block plus, for
    half inputs, float32 copies of `linear_weight` and its gradient accumulator. Result in the
    hidden dtype (half precision computed in float32). Gradients for `hidden`, `linear_weight`
    and `bias`; a class `weight` that requires grad raises (no gradient is given for it). A
    mean over no kept row is 0.
    """
    return _linear_softmax(
        hidden,
        linear_weight,
        targets,
        bias,
        weight,
        0.0,
        False,
        ignore_index,
        label_smoothing,
        reduction,
        chunk_size,
    )


def linear_softmax_focal_loss(
    hidden: Tensor,
    linear_weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    gamma: float = 2.0,
    alpha: Tensor | float | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Softmax focal loss of ``F.linear(hidden, linear_weight, bias)`` without the (N, V) logits
    (``spec.linear_softmax_focal_loss``); layout, blocks and dtypes as
    ``linear_softmax_cross_entropy``. A vector `alpha` that requires grad raises."""
    return _linear_softmax(
        hidden,
        linear_weight,
        targets,
        bias,
        alpha,
        gamma,
        True,
        ignore_index,
        label_smoothing,
        reduction,
        chunk_size,
    )


# ----------------------------------------------------------------------------------------------
# Sigmoid core
# ----------------------------------------------------------------------------------------------


def _sigmoid_inputs(logits, targets, weight, pos_weight):
    """Validates the sigmoid arguments; returns logits, targets, weight, pos_weight as tensors
    (the factors None when not given: ones are never materialised)."""
    logits = _as_array("logits", logits)
    device_type = logits.device.type
    logits = _autocast_float32(logits, device_type)
    targets = _autocast_float32(_as_array("targets", targets, logits.device), device_type)
    _checks.float_logits("logits", logits.is_floating_point(), _dtype_name(logits.dtype))
    _checks.sigmoid_targets(
        targets.shape, targets.is_floating_point(), _dtype_name(targets.dtype), logits.shape
    )
    factors = []
    for name, factor in (("weight", weight), ("pos_weight", pos_weight)):
        if factor is None:
            factors.append(None)
            continue
        factor = _autocast_float32(_as_array(name, factor, logits.device), device_type)
        _checks.broadcastable(name, factor.shape, logits.shape)
        # not detached: a `weight` or `pos_weight` that requires grad gets its gradient
        factors.append(factor)
    return logits, targets, factors[0], factors[1]


def _softplus(x):
    """softplus(x) = log(1 + exp(x)) = -log_sigmoid(-x), accurate for every x.

    torch's kernel returns x above the threshold: exp(-threshold) must be below half an ULP of it.
    """
    threshold = 37.0 if x.dtype == torch.float64 else 20.0
    return torch.nn.functional.softplus(x, beta=1.0, threshold=threshold)


def _sigmoid(x):
    """sigmoid(x), to a few ULPs relative for every x (torch's kernel is 1 / (1 + exp(-x)))."""
    return torch.sigmoid(x)


def _scaled_sigmoid(c, x, sign):
    """c sigma(sign x) (sign = +-1) in one kernel, no negated copy of x: torch's softplus
    derivative exp(sign x) / (1 + exp(sign x)) times c (broadcast), c itself above the threshold
    where sigma rounds to 1. Relative error a few ULPs, as ``_sigmoid``; a fresh tensor."""
    threshold = 37.0 if x.dtype == torch.float64 else 20.0
    return torch.ops.aten.softplus_backward(c, x, float(sign), threshold)


def _sigmoids(x, inplace):
    """(sigma(x), sigma(-x)), fresh tensors, each to a few ULPs relative (no 1 - sigma).

    Two kernels with `inplace` (``_scaled_sigmoid``); otherwise torch.sigmoid of x and of -x, whose
    derivative formulas give second-order gradients to full accuracy (create_graph=True)."""
    if not inplace:
        return _sigmoid(x), _sigmoid(-x)
    one = torch.ones((), dtype=x.dtype, device=x.device)
    return _scaled_sigmoid(one, x, 1), _scaled_sigmoid(one, x, -1)


def _sigmoid_terms(x, t, w, q, grad_loss):
    """Per-element sigmoid cross entropy, or its gradient times `grad_loss` (`w`, `q` None: 1).

    l = (1 - t) softplus(x) + q t softplus(-x), the same as torch's
    (1 - t) x + (1 + (q - 1) t) softplus(-x).
    dl/dx = (1 - t) sigma(x) - q t sigma(-x), the same as (q t + 1 - t) sigma(x) - q t.
    Fast path (q = 1): l = softplus(x) - t x and dl/dx = sigma(x) - t, each formed without
    the cancellation of a confident element (x >> 0, t = 1: softplus(x) and t x agree to far
    below the loss; sigma(x) rounds to 1):
      l = softplus(-|x|) + (relu(x) - t x),  dl/dx = lerp(sigma(x), -sigma(-x), t),
    the loss a sum of two terms >= 0 (five kernels), the gradient (1 - t) sigma(x) - t sigma(-x)
    by torch.lerp, which forms it from the nearer end (exact -sigma(-x) at t = 1, sigma(x) at
    t = 0; three kernels, `grad_loss` folded into the two sigmoids). A NaN logit gives NaN in
    both; a +inf logit gives a NaN loss (t x is 0 * inf or inf - inf) and a finite gradient,
    which ``_SigmoidLoss`` makes NaN. `grad_loss` may be a scalar tensor (broadcast here). The
    weight `w` multiplies the loss, or the gradient before `grad_loss` does.
    """
    inplace = _inplace(x, t, w, q, grad_loss)
    if grad_loss is None:
        if q is None:
            # softplus(x) - t x = softplus(-|x|) + (relu(x) - t x); torch's softplus with
            # beta = -1 is -softplus(-|x|) at |x|
            loss = _addcmul(x.clamp_min(0.0), t, x, -1.0, inplace)
            minus_e = torch.nn.functional.softplus(x.abs(), beta=-1.0, threshold=20.0)
            loss = loss.sub_(minus_e) if inplace else loss - minus_e
        else:
            # -log(1 - sigma(x)) = softplus(x), -log(sigma(x)) = softplus(-x)
            not_log_not_p = _softplus(x)
            not_log_p = _softplus(-x)
            loss = _addcmul(not_log_not_p, t, not_log_not_p, -1.0, inplace)
            loss = _addcmul(loss, q * t, not_log_p, 1.0, inplace)
        if w is None:
            return loss
        return loss.mul_(w) if inplace else loss * w
    coefficient = grad_loss if w is None else grad_loss * w
    if q is None:
        # (1 - t) sigma(x) - t sigma(-x)
        if inplace:
            p = _scaled_sigmoid(coefficient, x, 1)
            return p.lerp_(_scaled_sigmoid(torch.neg(coefficient), x, -1), t)
        p, not_p = _sigmoids(x, inplace)
        return torch.lerp(p, -not_p, t) * coefficient
    p, not_p = _sigmoids(x, inplace)
    grad = _addcmul(p, t, p, -1.0, inplace)
    grad = _addcmul(grad, q * t, not_p, -1.0, inplace)
    return grad.mul_(coefficient) if inplace else grad * coefficient


def _addcmul(a, b, c, value, inplace):
    """a + value * b * c in one pass; in place on `a` (a fresh temporary) when `inplace`."""
    return a.addcmul_(b, c, value=value) if inplace else torch.addcmul(a, b, c, value=value)


def _sigmoid_cross_entropy_or_grad(logits, targets, weight, pos_weight, grad_loss):
    """The per-element loss (`grad_loss` None) or the logits' gradient (times `grad_loss`)."""
    x = logits.to(_compute_dtype(logits.dtype))
    if pos_weight is not None:
        # NaN or +inf in the logits: NaN in that element (DESIGN 5), never a plausible inf or 0;
        # without pos_weight the terms give it (``_sigmoid_terms``, ``_SigmoidLoss``)
        x = torch.nan_to_num(x, nan=math.nan, posinf=math.nan, neginf=-math.inf)
    t = targets.to(x.dtype)
    w = None if weight is None else weight.to(x.dtype)
    q = None if pos_weight is None else pos_weight.to(x.dtype)
    grad_loss = None if grad_loss is None else grad_loss.to(x.dtype)
    result = _sigmoid_terms(x, t, w, q, grad_loss)
    return result if grad_loss is None else result.to(logits.dtype)


def _posinf_to_nan(logits, grad):
    """`grad` with NaN where `logits` is +inf (DESIGN 5: the loss is NaN there, so is its
    gradient), in place on `grad` (a fresh tensor) when that is safe."""
    is_posinf = logits == math.inf
    if _inplace(logits, grad):
        return grad.masked_fill_(is_posinf, math.nan)
    return torch.where(is_posinf, math.nan, grad)


class _SigmoidLoss(torch.autograd.Function):
    """The element-wise losses: loss_or_grad(*inputs, None), summed when `reduce`, with backward
    loss_or_grad(*inputs, grad_loss); otherwise as ``_ClosedFormGrad`` (the first `num_saved`
    inputs saved, the rest options, the other inputs' gradients by ``_other_input_grads``).

    The sum is taken here, so backward gets one number, which the terms broadcast (never an
    expanded N x C tensor). A +inf logit has a NaN loss but a finite closed-form gradient: a
    finite sum (read on the host where that costs no synchronisation, the CPU, and only where
    values are concrete) proves there is none, else backward makes the gradient NaN there.
    Saved: the inputs (the logits and the targets: the second-order gradients and the targets'
    gradient need both, recomputed in backward).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(loss_or_grad, num_saved, reduce, *inputs):
        loss = loss_or_grad(*inputs, None)
        return loss.sum() if reduce else loss

    @staticmethod
    def setup_context(ctx, inputs, output):
        loss_or_grad, num_saved, reduce, *inputs = inputs
        ctx.save_for_backward(*inputs[:num_saved])
        ctx.loss_or_grad = loss_or_grad
        ctx.options = inputs[num_saved:]
        ctx.reduce = reduce
        ctx.finite = False
        # on the CPU only (``_reads_on_host``, but not in 'sync' mode: this is no validation)
        on_cpu = output.device.type == "cpu" and _reads_on_host(output)
        if on_cpu and _values_are_concrete(output):
            total = output if reduce else output.detach().sum()
            ctx.finite = bool(torch.isfinite(total))

    @staticmethod
    def backward(ctx, grad_loss):
        saved = ctx.saved_tensors
        logits = saved[0]
        needs_grad = ctx.needs_input_grad[3:]
        grads = [None] * (len(saved) + len(ctx.options))
        if needs_grad[0]:
            grads[0] = ctx.loss_or_grad(*saved, *ctx.options, grad_loss)
        wrt = [i for i in range(1, len(saved)) if needs_grad[i]]
        full = grad_loss.expand(logits.shape) if ctx.reduce else grad_loss
        closed_form = _TARGETS_GRAD.get(ctx.loss_or_grad)
        if closed_form is not None and 1 in wrt:
            grads[1] = closed_form(*saved, *ctx.options, full)
            wrt.remove(1)
        if wrt:
            other_grads = _other_input_grads(ctx.loss_or_grad, saved, ctx.options, wrt, full)
            for i, grad in zip(wrt, other_grads, strict=True):
                grads[i] = grad
        if not ctx.finite:
            # the targets' gradient is -x there, so it is made NaN too
            for i in (0, 1):
                if grads[i] is not None:
                    grads[i] = _posinf_to_nan(logits, grads[i])
        return None, None, None, *grads


def _sigmoid_loss(loss_or_grad, num_saved, reduce, *inputs):
    """``_SigmoidLoss``, or its value alone where nothing asks for a gradient (as
    ``_with_closed_form_grad``)."""
    if _asks_for_no_gradient(inputs):
        loss = loss_or_grad(*inputs, None)
        return loss.sum() if reduce else loss
    return _SigmoidLoss.apply(loss_or_grad, num_saved, reduce, *inputs)


def _sigmoid_reduce(loss, reduction, count):
    """`loss` from ``_SigmoidLoss``: per element ('none') or summed; 'mean' divides by `count`
    (0 with zero gradient for no elements)."""
    if reduction != "mean":
        return loss
    return loss * 0.0 if count == 0 else loss / count


# ----------------------------------------------------------------------------------------------
# Public API: sigmoid losses
# ----------------------------------------------------------------------------------------------


def _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction):
    reduction = _checks.reduction(reduction)
    logits, targets, w, q = _sigmoid_inputs(logits, targets, weight, pos_weight)
    # saves logits, targets, weight, pos_weight
    loss = _sigmoid_loss(
        _sigmoid_cross_entropy_or_grad, 4, reduction != "none", logits, targets, w, q
    )
    if loss.shape != logits.shape and reduction == "none":
        # a weight broadcast over more than the logits' elements cannot occur (checked above)
        loss = loss.expand(logits.shape)
    return _sigmoid_reduce(loss, reduction, logits.numel()).to(logits.dtype)


def sigmoid_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    *,
    weight: Tensor | None = None,
    pos_weight: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Sigmoid cross entropy with logits, torch semantics (see ``spec.sigmoid_cross_entropy``).

    Result in the logits' dtype (half precision computed in float32), closed-form gradient.
    """
    return _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction)


def _sigmoid_focal_terms(x, t, alpha, gamma, grad_loss):
    """Per-element sigmoid focal loss, or its gradient times `grad_loss` (torchvision semantics).

    p_t = p t + (1 - p)(1 - t), so 1 - p_t = p (1 - t) + (1 - p) t;
    l = alpha_t (1 - p_t)^gamma ce,
    dl/dx = alpha_t (1 - p_t)^gamma [(p - t) + gamma ce (1 - 2t) r],  r = p (1 - p) / (1 - p_t).

    Fast form of the spec's log-space one, one fused kernel per line: 1 - p_t is
    lerp(p, 1 - p, t), a sum of two terms >= 0 with p and 1 - p = sigma(-x) each accurate (lerp
    switches to end - (end - start)(1 - t) for t >= 1/2, so no cancellation either way); the
    power is pow(1 - p_t, gamma), 0 where 1 - p_t underflows (there ce <= c (1 - p_t)(1 + |x|),
    so the dropped term is below the dtype's roundoff of the loss); p - t is
    (1 - p_t) - 2 t (1 - p), exact for a hard target (p at t = 0, -(1 - p) at t = 1), so no
    cancellation where p rounds to t. For gamma >= 1 the gradient is
      alpha_t (1 - p_t)^(gamma - 1) [(1 - p_t)(p - t) + gamma ce (1 - 2t) p (1 - p)]
    (no division; (1 - p_t)^(gamma - 1) <= 1, so a bracket that underflows leaves a gradient
    below the smallest normal); for gamma < 1 the power is unbounded there and r is formed
    instead, with 1 - p_t clamped at the smallest normal (0 where p (1 - p) underflows with it).
    `grad_loss` may be a scalar tensor (broadcast here).
    """
    inplace = _inplace(x, t, grad_loss)
    if grad_loss is None or gamma != 0.0:
        ce = _sigmoid_terms(x, t, None, None, None)
    if gamma != 0.0:
        p, not_p = _sigmoids(x, inplace)
        # 1 - p_t = p (1 - t) + (1 - p) t (in place on p when the loss alone is asked for)
        if inplace and grad_loss is None:
            not_pt = p.lerp_(not_p, t)
        else:
            not_pt = torch.lerp(p, not_p, t)
    if grad_loss is None:
        loss = ce
        if gamma != 0.0:
            if gamma < 1.0:
                # the power's derivative is unbounded at 0: the targets' gradient (autograd
                # through this formula) would be 0 * inf there
                tiny = torch.finfo(x.dtype).tiny
                not_pt = not_pt.clamp_min_(tiny) if inplace else not_pt.clamp_min(tiny)
            # (1 - p_t)^gamma
            focal_weight = not_pt.pow_(gamma) if inplace else not_pt.pow(gamma)
            loss = loss.mul_(focal_weight) if inplace else loss * focal_weight
        if alpha is not None:
            # alpha_t = alpha t + (1 - alpha)(1 - t)
            one_minus_alpha = torch.full((), 1.0 - alpha, dtype=x.dtype, device=x.device)
            alpha_t = torch.add(one_minus_alpha, t, alpha=2.0 * alpha - 1.0)
            loss = loss.mul_(alpha_t) if inplace else loss * alpha_t
        return loss
    if alpha is None:
        coefficient = grad_loss
    else:
        # alpha_t grad_loss = (1 - alpha) grad_loss + (2 alpha - 1) t grad_loss
        coefficient = torch.addcmul(
            grad_loss * (1.0 - alpha), t, grad_loss, value=2.0 * alpha - 1.0
        )
    if gamma == 0.0:
        # (1 - p_t)^0 = 1: the cross entropy's gradient p - t
        return _sigmoid_terms(x, t, None, None, coefficient)
    # p - t = (1 - p_t) - 2 t (1 - p)
    p_minus_t = _addcmul(not_pt, t, not_p, -2.0, False)
    # 1 - 2t, the derivative of 1 - p_t by p
    sign = torch.rsub(t, 1.0, alpha=2.0)
    if gamma >= 1.0:
        # (1 - p_t)(p - t) + gamma ce (1 - 2t) p (1 - p)
        rate = p.mul_(not_p).mul_(ce) if inplace else p * not_p * ce
        grad = p_minus_t.mul_(not_pt) if inplace else p_minus_t * not_pt
        grad = _addcmul(grad, rate, sign, gamma, inplace)
        if gamma != 1.0:
            # (1 - p_t)^(gamma - 1)
            if gamma == 2.0:
                power = not_pt
            else:
                power = not_pt.pow_(gamma - 1.0) if inplace else not_pt.pow(gamma - 1.0)
            grad = grad.mul_(power) if inplace else grad * power
    else:
        # r = p (1 - p) / (1 - p_t) <= 1
        tiny = torch.finfo(x.dtype).tiny
        not_pt = not_pt.clamp_min_(tiny) if inplace else not_pt.clamp_min(tiny)
        r = p.mul_(not_p).div_(not_pt) if inplace else p * not_p / not_pt
        focal_weight = not_pt.pow_(gamma) if inplace else not_pt.pow(gamma)
        # (p - t) + gamma ce (1 - 2t) r
        term = r.mul_(ce) if inplace else r * ce
        grad = _addcmul(p_minus_t, term, sign, gamma, inplace)
        grad = grad.mul_(focal_weight) if inplace else grad * focal_weight
    return grad.mul_(coefficient) if inplace else grad * coefficient


def _sigmoid_focal_loss_or_grad(logits, targets, gamma, alpha, grad_loss):
    """The per-element loss (`grad_loss` None) or the logits' gradient (times `grad_loss`).

    NaN or +inf in the logits gives NaN in that element's loss (DESIGN 5), by the cross entropy's
    terms (``_sigmoid_terms``); ``_SigmoidLoss`` makes the gradient NaN there.
    """
    x = logits.to(_compute_dtype(logits.dtype))
    t = targets.to(x.dtype)
    grad_loss = None if grad_loss is None else grad_loss.to(x.dtype)
    result = _sigmoid_focal_terms(x, t, alpha, gamma, grad_loss)
    return result if grad_loss is None else result.to(logits.dtype)


def _log_softplus(y):
    """log(softplus(y)), also where softplus(y) underflows: y itself below -40 (there
    softplus(y) = e^y (1 - e^y / 2 + ...) and e^y is below every dtype's roundoff)."""
    small = y < -40.0
    return torch.where(small, y, torch.log(_softplus(torch.where(small, 0.0, y))))


def _sigmoid_focal_targets_grad(logits, targets, gamma, alpha, grad_loss):
    """d loss / d t of the sigmoid focal loss in closed form, times `grad_loss` (as jax_impl's
    ``_sigmoid_focal_other_tangent``; the targets' gradient in ``_SigmoidLoss``).

    With m = (1 - p_t)^gamma and ce the cross entropy,
      d l / d t = alpha_t [m (-x) + gamma m (ce / (1 - p_t)) (1 - 2p)] + (2 alpha - 1) m ce,
    1 - 2p = tanh(-x / 2). Where 1 - p_t is a normal number, m = pow(1 - p_t, gamma) and the
    quotient ce / (1 - p_t) are formed directly (1 - p_t = lerp(p, 1 - p, t), as in forward).
    Below that (a hard target on a confident logit, where m (-x) is still a normal number for
    gamma < 1, and where the vector-Jacobian product of the forward formula, through a subnormal
    or clamped 1 - p_t, was off by 4x-560x) both come from logs: log(1 - p_t) =
    logaddexp(log(1 - t) + log p, log t + log(1 - p)), log ce = logaddexp(log(1 - t) +
    log softplus(x), log t + log softplus(-x)).
    """
    x = logits.to(_compute_dtype(logits.dtype))
    t = targets.to(x.dtype)
    ce = _sigmoid_terms(x, t, None, None, None)
    not_pt = torch.lerp(*_sigmoids(x, False), t)
    normal = not_pt >= torch.finfo(x.dtype).tiny
    safe_not_pt = torch.where(normal, not_pt, 1.0)
    # log t and log(1 - t), -inf at the labels (double where: no 1 / 0 in second order)
    has_t = t > 0.0
    log_t = torch.where(has_t, torch.log(torch.where(has_t, t, 1.0)), -math.inf)
    has_not_t = t < 1.0
    log_not_t = torch.where(has_not_t, torch.log1p(-torch.where(has_not_t, t, 0.0)), -math.inf)
    log_not_pt = torch.logaddexp(log_not_t - _softplus(-x), log_t - _softplus(x))
    # alpha_t and the incoming gradient scale each term first: no intermediate overflows where
    # the result does not
    grad_loss = grad_loss.to(x.dtype)
    scale = grad_loss if alpha is None else (alpha * t + (1.0 - alpha) * (1.0 - t)) * grad_loss
    if gamma == 0.0:
        focal_weight = torch.ones_like(x)
    else:
        focal_weight = torch.where(
            normal, torch.pow(safe_not_pt, gamma), torch.exp(gamma * log_not_pt)
        )
    grad = (scale * -x) * focal_weight
    if gamma != 0.0:
        log_ce = torch.logaddexp(log_not_t + _log_softplus(x), log_t + _log_softplus(-x))
        ratio = torch.where(normal, ce / safe_not_pt, torch.exp(log_ce - log_not_pt))
        grad = grad + (scale * gamma) * focal_weight * ratio * torch.tanh(-x / 2.0)
    if alpha is not None:
        grad = grad + ((2.0 * alpha - 1.0) * grad_loss) * (focal_weight * ce)
    return grad.to(targets.dtype)


# the targets' gradient of these losses in closed form (the others: autograd of the forward)
_TARGETS_GRAD = {_sigmoid_focal_loss_or_grad: _sigmoid_focal_targets_grad}


def _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction):
    reduction = _checks.reduction(reduction)
    gamma = _gamma(gamma)
    if isinstance(alpha, numbers.Real):
        alpha = _unit_interval("alpha", alpha)
    _checks.focal_alpha(alpha, None)
    alpha = None if alpha is None else float(alpha)
    logits, targets, _, _ = _sigmoid_inputs(logits, targets, None, None)
    if _VALIDATE_INDICES and _values_are_concrete(targets):
        _check_sigmoid_focal_targets(targets)
    # saves logits, targets; gamma, alpha are options
    loss = _sigmoid_loss(
        _sigmoid_focal_loss_or_grad, 2, reduction != "none", logits, targets, gamma, alpha
    )
    return _sigmoid_reduce(loss, reduction, logits.numel()).to(logits.dtype)


def sigmoid_focal_loss(
    logits: Tensor,
    targets: Tensor,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Sigmoid focal loss, torchvision semantics (see ``spec.sigmoid_focal_loss``).

    Note torchvision's default alpha is 0.25; here (as in the spec) it is None. Result in the
    logits' dtype (half precision computed in float32), closed-form gradient.
    """
    return _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction)


# ----------------------------------------------------------------------------------------------
# Drop-ins: torch.nn.functional signatures and nn.Module config holders
# ----------------------------------------------------------------------------------------------


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
