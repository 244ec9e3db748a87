"""Argument handling of the torch backend: tensors checked and converted, the value checks that
never synchronise an accelerator, the validation switch, and the reductions.

Holds the module state of the value checks, in this module only: ``_VALIDATE_INDICES`` (set by
``set_validate_indices``; other modules read it as ``_inputs._VALIDATE_INDICES``, never a copy),
the ``_CHECKED_ALPHA`` cache, and ``_reads_on_host`` (tests and ``dualloss-parity smoke`` patch
it here). Imports torch and ``dualloss._checks`` only: no other module of ``torch_impl``.
"""

from __future__ import annotations

import math
import numbers
import os
import weakref
from typing import Any

import torch
from torch import Tensor

from .. import _checks

# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


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


def _softmax_inputs(
    logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where, num_classes=None
):
    """Validates the softmax arguments (the checking half of ``spec._softmax_inputs``).

    `num_classes`: the global class count where the logits hold a slice of the classes
    (``process_group=``): the class indices and the `weight` / `alpha` vectors are checked
    against it; None is the logits' own class count.

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
    if num_classes is None:
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


def _normalizer(reduction, normalizer):
    """The checked `reduction` and `normalizer` (``spec._normalizer``): None, a float, or a 0-d
    tensor that is never read on the host. The reduction stays 'mean': `normalizer` is the
    mean's divisor (``_reduce``). A tensor that requires grad raises: the divisor is a constant,
    and its gradient would otherwise be silently None."""
    reduction = _checks.reduction(reduction)
    if normalizer is None:
        return reduction, None
    _checks.normalizer_reduction(reduction)
    if not isinstance(normalizer, Tensor):
        return reduction, _checks.normalizer_number(normalizer)
    is_real = normalizer.dtype != torch.bool and not normalizer.is_complex()
    _checks.normalizer_array(normalizer.shape, is_real, _dtype_name(normalizer.dtype))
    if normalizer.requires_grad:
        raise ValueError(
            "`normalizer` is a constant divisor and takes no gradient (pass normalizer.detach()). "
            "Received: normalizer with requires_grad=True."
        )
    return reduction, normalizer


def _mean_divisor(denominator, normalizer):
    """The divisor of reduction 'mean': `normalizer` where given, else the mean's own."""
    return denominator if normalizer is None else normalizer
