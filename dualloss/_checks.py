"""Framework-free argument validation shared by ``spec``, ``torch_impl`` and ``jax_impl``.

Every function here takes plain Python values (shapes as tuples, dtype names as strings, NumPy
arrays for value checks), so the three implementations raise byte-identical messages. Each message
is one sentence: the argument in backticks, what was expected, what was received.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

REDUCTIONS = ("none", "mean", "sum")


def _shape(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def reduction(reduction: object) -> str:
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(
            f"`reduction` must be one of 'none', 'mean', 'sum'. Received: reduction={reduction!r}."
        )
    return reduction


def normalizer_reduction(reduction: str) -> None:
    """A `normalizer` replaces the divisor of reduction 'mean': the reduction must be 'mean'."""
    if reduction != "mean":
        raise ValueError(
            "`normalizer` replaces the divisor of reduction='mean' (the loss becomes the sum over "
            f"the kept elements divided by it), so it needs reduction='mean'. Received: "
            f"reduction={reduction!r}."
        )


def normalizer_number(normalizer: object) -> float:
    """A Python number given as `normalizer`: finite and >= 0 (a count or a sum of weights)."""
    if isinstance(normalizer, bool) or not isinstance(normalizer, numbers.Real):
        raise TypeError(
            "`normalizer` must be a number or a scalar array (the global count of kept targets "
            f"or the sum of their weights). Received: normalizer={normalizer!r}."
        )
    value = float(normalizer)
    if not 0.0 <= value < math.inf:
        raise ValueError(
            "`normalizer` must be a finite number >= 0 (the global count of kept targets or the "
            f"sum of their weights). Received: normalizer={normalizer!r}."
        )
    return value


def normalizer_array(shape: Sequence[int], is_real: bool, dtype: object) -> None:
    """An array given as `normalizer`: a scalar of a floating or integer dtype."""
    if not is_real:
        raise TypeError(
            "`normalizer` must have a floating or integer dtype. "
            f"Received: normalizer.dtype={dtype}."
        )
    if len(shape) != 0:
        raise ValueError(
            "`normalizer` must be a scalar (a number or a 0-d array). "
            f"Received: normalizer.shape={_shape(shape)}."
        )


def real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number. Received: {name}={value!r}.")
    return float(value)


# The scalar options' rules are comparisons only, apart from their messages: torch.compile traces a
# float that changes between calls as a symbol, which compares but has no math.isfinite nor repr
# (torch_impl states the rule alone there; see its ``_gamma``).
GAMMA_RULE = "`gamma` must be a finite number >= 0."


def gamma_holds(value: float) -> bool:
    return 0.0 <= value < math.inf  # False for NaN


def gamma(gamma: object) -> float:
    value = real("gamma", gamma)
    if not gamma_holds(value):
        raise ValueError(f"{GAMMA_RULE} Received: gamma={gamma!r}.")
    return value


Z_LOSS_RULE = "`z_loss` must be a finite number >= 0 (the weight of logsumexp(logits)**2)."
SOFTCAP_RULE = (
    "`softcap` must be None or a finite number > 0 (the logits become softcap * tanh(logits / "
    "softcap))."
)


def z_loss(z_loss: object) -> float:
    """The z-loss weight: a finite number >= 0 (0 turns the term off)."""
    value = real("z_loss", z_loss)
    if not 0.0 <= value < math.inf:  # False for NaN
        raise ValueError(f"{Z_LOSS_RULE} Received: z_loss={z_loss!r}.")
    return value


def softcap(softcap: object) -> float | None:
    """The logit cap: None (no cap) or a finite number > 0."""
    if softcap is None:
        return None
    value = real("softcap", softcap)
    if not 0.0 < value < math.inf:  # False for NaN
        raise ValueError(f"{SOFTCAP_RULE} Received: softcap={softcap!r}.")
    return value


def return_aux(return_aux: object) -> bool:
    """`return_aux`: True or False (a NumPy bool too)."""
    if not isinstance(return_aux, (bool, np.bool_)):
        raise TypeError(f"`return_aux` must be True or False. Received: return_aux={return_aux!r}.")
    return bool(return_aux)


def unit_interval_rule(name: str) -> str:
    return f"`{name}` must be in [0, 1]."


def unit_interval_holds(value: float) -> bool:
    return 0.0 <= value <= 1.0  # False for NaN


def unit_interval(name: str, value: object) -> float:
    """A scalar option that must lie in [0, 1] (`label_smoothing`, scalar `alpha`)."""
    number = real(name, value)
    if not unit_interval_holds(number):
        raise ValueError(f"{unit_interval_rule(name)} Received: {name}={value!r}.")
    return number


def ignore_index(ignore_index: object) -> int:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(
            f"`ignore_index` must be an integer. Received: ignore_index={ignore_index!r}."
        )
    return int(ignore_index)


def float_logits(name: str, is_floating: bool, dtype: object) -> None:
    if not is_floating:
        raise TypeError(f"`{name}` must have a floating dtype. Received: {name}.dtype={dtype}.")


def class_axis(axis: object, ndim: int) -> int:
    """Normalises `axis` for logits of `ndim` dimensions (negative counts from the end)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"`axis` must be an integer. Received: axis={axis!r}.")
    if ndim == 0:
        raise ValueError(
            "`logits` must have at least one dimension (the class axis). Received: logits.shape=()."
        )
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"`axis` must be in [-{ndim}, {ndim}) for logits with {ndim} dimensions. "
            f"Received: axis={axis}."
        )
    return int(axis) % ndim


def softmax_targets(
    targets_kind: str,
    targets_shape: Sequence[int],
    targets_dtype: object,
    logits_shape: Sequence[int],
    axis: int,
) -> None:
    """`targets_kind` is 'index' (integer dtype), 'prob' (floating dtype) or anything else."""
    targets_shape = _shape(targets_shape)
    logits_shape = _shape(logits_shape)
    if targets_kind == "index":
        expected = logits_shape[:axis] + logits_shape[axis + 1 :]
        if targets_shape != expected:
            raise ValueError(
                f"`targets` of class indices must have shape {expected}, the logits shape "
                f"{logits_shape} without axis {axis}. Received: targets.shape={targets_shape}."
            )
    elif targets_kind == "prob":
        if targets_shape != logits_shape:
            raise ValueError(
                f"`targets` of class probabilities must have the logits shape {logits_shape}. "
                f"Received: targets.shape={targets_shape}."
            )
    else:
        raise TypeError(
            "`targets` must hold integer class indices or floating class probabilities. "
            f"Received: targets.dtype={targets_dtype}."
        )


def class_indices(targets: np.ndarray, num_classes: int, ignore_index: int) -> None:
    """Every index lies in [0, num_classes) or equals ignore_index (needs concrete values)."""
    targets = np.asarray(targets)
    bad = ((targets < 0) | (targets >= num_classes)) & (targets != ignore_index)
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        value = int(targets[position])
        raise ValueError(
            f"`targets` has class index {value} at position {position}, outside "
            f"[0, {num_classes}) and not ignore_index={ignore_index}."
        )


def validation_mode(setting: object) -> bool | str:
    """The value-check setting (``DUALLOSS_VALIDATE_INDICES`` or ``set_validate_indices``):
    False (off), True (exact checks where values are on the host, asynchronous device checks
    elsewhere), or 'sync' (exact checks everywhere: one host synchronisation per call)."""
    if isinstance(setting, str):
        text = setting.strip().lower()
        if text in ("0", "false", "off", "no"):
            return False
        if text in ("1", "true", "on", "yes", ""):
            return True
        if text == "sync":
            return "sync"
    elif isinstance(setting, bool):
        return setting
    raise ValueError(
        "`validate` must be True, False or 'sync' (DUALLOSS_VALIDATE_INDICES: 1, 0 or sync). "
        f"Received: {setting!r}."
    )


def kernel_mode(name: str, setting: object) -> str:
    """The torch kernel selection (``DUALLOSS_TORCH_KERNELS`` or ``torch_impl.kernels``)."""
    if isinstance(setting, str) and setting.strip().lower() in ("auto", "triton", "eager"):
        return setting.strip().lower()
    raise ValueError(f"`{name}` must be 'auto', 'triton' or 'eager'. Received: {setting!r}.")


def class_indices_device_message(num_classes: int, ignore_index: int) -> str:
    """The device-side (asynchronous) form of the `class_indices` error: no value, no position
    (reading them would synchronise the device)."""
    return (
        f"`targets` has a class index outside [0, {num_classes}) and not "
        f"ignore_index={ignore_index} (checked on the device; DUALLOSS_VALIDATE_INDICES=sync "
        "gives its position)."
    )


UNIT_INTERVAL_DEVICE_MESSAGE = (
    "`alpha` must have every entry in [0, 1] (checked on the device; "
    "DUALLOSS_VALIDATE_INDICES=sync gives the entry)."
)


def class_vector(name: str, shape: Sequence[int], num_classes: int) -> None:
    """`weight` or vector `alpha`: one entry per class."""
    shape = _shape(shape)
    if shape != (num_classes,):
        raise ValueError(
            f"`{name}` must be a vector of length {num_classes} (one entry per class). "
            f"Received: {name}.shape={shape}."
        )


def unit_interval_values(name: str, values: np.ndarray) -> None:
    """Every entry of a vector option (vector `alpha`) lies in [0, 1] (needs concrete values)."""
    values = np.asarray(values, dtype=np.float64)
    bad = ~((values >= 0.0) & (values <= 1.0))
    if bad.any():
        position = int(np.argwhere(bad)[0][0])
        raise ValueError(
            f"`{name}` must have every entry in [0, 1]. "
            f"Received: {name}[{position}]={float(values[position])!r}."
        )


def class_mask(
    shape: Sequence[int], is_bool: bool, dtype: object, logits_shape: Sequence[int]
) -> None:
    """`where`: a boolean mask that broadcasts to the logits shape."""
    shape = _shape(shape)
    logits_shape = _shape(logits_shape)
    if not is_bool:
        raise TypeError(f"`where` must be a boolean mask. Received: where.dtype={dtype}.")
    broadcastable(name="where", shape=shape, logits_shape=logits_shape)


def where_mask(
    shape: Sequence[int], is_bool: bool, dtype: object, logits_shape: Sequence[int], axis: int
) -> bool:
    """`where` of the softmax losses (optax semantics): False for a class mask (it broadcasts to
    the logits shape), True for a per-element mask of the batch shape (the logits shape without
    the class axis `axis`, >= 0: the caller inserts the class axis there); anything else raises
    the ``class_mask`` error."""
    try:
        class_mask(shape, is_bool, dtype, logits_shape)
        return False
    except ValueError:
        shape = _shape(shape)
        logits_shape = _shape(logits_shape)
        batch_shape = logits_shape[:axis] + logits_shape[axis + 1 :]
        try:
            per_element = np.broadcast_shapes(shape, batch_shape) == batch_shape
        except ValueError:
            per_element = False
        if len(shape) != len(batch_shape) or not per_element:
            raise
        return True


def broadcastable(name: str, shape: Sequence[int], logits_shape: Sequence[int]) -> None:
    shape = _shape(shape)
    logits_shape = _shape(logits_shape)
    try:
        ok = np.broadcast_shapes(shape, logits_shape) == logits_shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"`{name}` must broadcast to the logits shape {logits_shape}. "
            f"Received: {name}.shape={shape}."
        )


def sigmoid_targets(
    targets_shape: Sequence[int], is_floating: bool, dtype: object, logits_shape: Sequence[int]
) -> None:
    targets_shape = _shape(targets_shape)
    logits_shape = _shape(logits_shape)
    if not is_floating:
        raise TypeError(
            f"`targets` must have a floating dtype (probabilities in [0, 1]). "
            f"Received: targets.dtype={dtype}."
        )
    if targets_shape != logits_shape:
        raise ValueError(
            f"`targets` must have the logits shape {logits_shape}. "
            f"Received: targets.shape={targets_shape}."
        )


def sigmoid_focal_targets(targets: np.ndarray) -> None:
    """The sigmoid focal loss's targets lie in [0, 1] (needs concrete values; NaN propagates).

    Its weight (1 - p_t)^gamma, p_t = p t + (1 - p)(1 - t), is a power of a probability only
    there: outside it, 1 - p_t can be negative (no real power) or above 1. The other losses are
    linear in their targets and take any real value, as torch does.
    """
    targets = np.asarray(targets)
    bad = (targets < 0.0) | (targets > 1.0)
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        # str of the NumPy scalar: the shortest repr in the targets' own precision
        raise ValueError(
            "`targets` of the sigmoid focal loss must be probabilities in [0, 1] (its weight "
            f"(1 - p_t)^gamma needs them). Received: {targets[position]!s} at position "
            f"{position}."
        )


SIGMOID_FOCAL_TARGETS_DEVICE_MESSAGE = (
    "`targets` of the sigmoid focal loss must be probabilities in [0, 1] (checked on the device; "
    "DUALLOSS_VALIDATE_INDICES=sync gives the entry)."
)


def focal_alpha(alpha: object, num_classes: int | None) -> None:
    """Scalar `alpha` in [0, 1]; for the softmax focal loss also a length-C vector.

    Vector values are checked by `unit_interval_values`, by the caller, where they are concrete.
    """
    if alpha is None:
        return
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, bool):
        unit_interval("alpha", alpha)
        return
    shape = getattr(alpha, "shape", None)
    if shape is None or num_classes is None:
        raise TypeError(
            "`alpha` must be None or a number in [0, 1]"
            + ("" if num_classes is None else " or a vector of one entry per class")
            + f". Received: alpha={alpha!r}."
        )
    if len(shape) == 0:
        return
    class_vector("alpha", shape, num_classes)


def linear_shapes(
    hidden_shape: Sequence[int],
    weight_shape: Sequence[int],
    bias_shape: Sequence[int] | None,
    targets_shape: Sequence[int],
    vocab_axis: int,
    names: tuple[str, str, str] = ("hidden", "bias", "targets"),
) -> tuple[int, int]:
    """The fused linear losses: `hidden` (..., H), `linear_weight` (H, V) (`vocab_axis` 1: spec,
    jax_impl) or (V, H) (`vocab_axis` 0: torch_impl), `bias` (V,), class-index `targets` (...).
    `names`: what the caller calls hidden, bias and targets (torch's drop-in: input,
    linear_bias, target). Returns (H, V)."""
    hidden, bias, targets = names
    hidden_shape = _shape(hidden_shape)
    weight_shape = _shape(weight_shape)
    targets_shape = _shape(targets_shape)
    if len(hidden_shape) == 0:
        raise ValueError(
            f"`{hidden}` must have at least one dimension (the features). "
            f"Received: {hidden}.shape=()."
        )
    size = hidden_shape[-1]
    layout = "(H, V)" if vocab_axis == 1 else "(V, H)"
    if len(weight_shape) != 2 or weight_shape[1 - vocab_axis] != size:
        raise ValueError(
            f"`linear_weight` must have shape {layout} with H = {size}, the last dimension of "
            f"{hidden}. Received: linear_weight.shape={weight_shape}."
        )
    num_classes = weight_shape[vocab_axis]
    if bias_shape is not None and _shape(bias_shape) != (num_classes,):
        raise ValueError(
            f"`{bias}` must be a vector of length {num_classes} (one entry per class). "
            f"Received: {bias}.shape={_shape(bias_shape)}."
        )
    if targets_shape != hidden_shape[:-1]:
        raise ValueError(
            f"`{targets}` of class indices must have shape {hidden_shape[:-1]}, the {hidden} "
            f"shape {hidden_shape} without its last dimension. "
            f"Received: {targets}.shape={targets_shape}."
        )
    return size, num_classes


def index_targets(is_integer: bool, dtype: object, name: str = "targets") -> None:
    """The fused linear losses take class indices only."""
    if not is_integer:
        raise TypeError(
            f"`{name}` must hold integer class indices. Received: {name}.dtype={dtype}."
        )


def chunk_size(chunk_size: object) -> int | None:
    """Rows per chunk of the fused linear losses: None (chosen from the shapes) or an int >= 1."""
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral):
        raise TypeError(
            f"`chunk_size` must be None or an integer. Received: chunk_size={chunk_size!r}."
        )
    if chunk_size < 1:
        raise ValueError(f"`chunk_size` must be >= 1. Received: chunk_size={chunk_size!r}.")
    return int(chunk_size)


def default_chunk_size(
    num_rows: int, num_classes: int, budget: int = 1 << 22, fraction: int | None = None
) -> int:
    """Rows per chunk when `chunk_size` is None: each (rows, V) block of logits holds at most
    `budget` (4M) entries, 16 MB in float32, a power of two between 1 and the number of rows.

    With `fraction` the budget grows to 1/fraction of the N x V logits, up to 4 x `budget`:
    fewer, taller blocks make the dW accumulation (one (V, H) read and write per block) cheaper.
    """
    if fraction is not None:
        budget = min(max(budget, num_rows * num_classes // fraction), 4 * budget)
    rows = max(1, budget // max(num_classes, 1))
    rows = 1 << (rows.bit_length() - 1)
    return max(1, min(rows, max(num_rows, 1)))
