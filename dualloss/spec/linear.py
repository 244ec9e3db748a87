"""The fused linear + softmax losses of the spec: ``linear_softmax_cross_entropy``,
``linear_softmax_focal_loss`` and their ``_grad`` (w.r.t. hidden, linear_weight, bias).

The spec forms the (N, V) logits in float64 and reuses ``softmax._softmax``. May import
``_inputs``, ``wrt`` and ``softmax``; never ``sigmoid`` or ``intermediates``.
"""

from __future__ import annotations

import numpy as np

from .. import _checks
from ._inputs import ArrayLike, _as_array, _normalize, _normalizer
from .softmax import _softmax, _softmax_aux, _softmax_elements
from .wrt import LinearSoftmaxWrt, _check_wrt, _needs_option


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
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
    z_loss=0.0,
    softcap=None,
):
    """The loss of logits = hidden @ linear_weight + bias, and its gradient w.r.t. `wrt` for each
    of 'hidden', 'linear_weight', 'bias' (a dict; 'bias' only when `bias` is given).

    The logits are formed in float64 ((..., H) flattened to (M, H)) and handed to ``_softmax``;
    with G = dL/dlogits (M, V), the chain rule through the linear map gives
    dL/dhidden = G W^T, dL/dW = hidden^T G, dL/dbias = sum_rows G.
    """
    hidden = _as_array(hidden)
    linear_weight = _as_array(linear_weight)
    targets = _as_array(targets)
    _checks.float_logits("hidden", np.issubdtype(hidden.dtype, np.floating), hidden.dtype)
    _checks.float_logits(
        "linear_weight", np.issubdtype(linear_weight.dtype, np.floating), linear_weight.dtype
    )
    _checks.index_targets(np.issubdtype(targets.dtype, np.integer), targets.dtype)
    bias_shape = None if bias is None else np.shape(bias)
    size, num_classes = _checks.linear_shapes(
        hidden.shape, linear_weight.shape, bias_shape, targets.shape, 1
    )
    # accepted for a signature shared with the backends; the spec has nothing to chunk
    _checks.chunk_size(chunk_size)
    h = hidden.astype(np.float64).reshape(-1, size)
    w = linear_weight.astype(np.float64)
    logits = h @ w
    if bias is not None:
        logits = logits + _as_array(bias).astype(np.float64)
    loss, grad = _softmax(
        logits,
        targets.reshape(-1),
        -1,
        class_weight_arg,
        gamma,
        is_focal,
        ignore_index,
        label_smoothing,
        None,
        reduction,
        z_loss,
        softcap,
    )
    if reduction == "none":
        loss = loss.reshape(targets.shape)
    grads = {"hidden": (grad @ w.T).reshape(hidden.shape), "linear_weight": h.T @ grad}
    if bias is not None:
        grads["bias"] = np.sum(grad, axis=0)
    return loss, grads


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _linear_aux(
    hidden, linear_weight, targets, bias, class_weight_arg, gamma, is_focal, ignore_index,
    label_smoothing, reduction, normalizer, z_loss, softcap,
):  # fmt: skip
    """``return_aux``'s statistics of the logits hidden @ linear_weight + bias (float64): those
    of ``softmax_cross_entropy`` (``softmax._softmax_aux``), shaped like `targets` for 'none'.
    The arguments were checked by ``_linear_softmax``."""
    hidden = _as_array(hidden)
    linear_weight = _as_array(linear_weight).astype(np.float64)
    targets = _as_array(targets)
    logits = hidden.astype(np.float64).reshape(-1, linear_weight.shape[0]) @ linear_weight
    if bias is not None:
        logits = logits + _as_array(bias).astype(np.float64)
    weight, alpha = (None, class_weight_arg) if is_focal else (class_weight_arg, None)
    elements = _softmax_elements(
        logits, targets.reshape(-1), -1, weight, alpha, gamma, is_focal, ignore_index,
        label_smoothing, None, z_loss, softcap,
    )  # fmt: skip
    aux = _softmax_aux(elements, reduction, normalizer)
    if reduction == "none":
        aux = {key: value.reshape(targets.shape) for key, value in aux.items()}
    return aux


def _linear_grad(grads, wrt, allowed, name):
    """The entry `wrt` of ``_linear_softmax``'s gradients (checked against the `wrt` Literal)."""
    _check_wrt(wrt, allowed, name)
    if wrt not in grads:
        _needs_option(wrt, None)
    return grads[wrt]


def linear_softmax_cross_entropy(
    hidden: ArrayLike,
    linear_weight: ArrayLike,
    targets: ArrayLike,
    *,
    bias: ArrayLike | None = None,
    weight: ArrayLike | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    return_aux: bool = False,
) -> np.ndarray | tuple[np.ndarray, dict]:
    """Softmax cross entropy of a linear layer's output, ``F.linear_cross_entropy`` semantics.

    l = softmax_cross_entropy(hidden @ linear_weight + bias, targets): the loss of a language
    model's head without the (N, V) logits in the backends (they stream over chunks of rows);
    here, the reference, the logits are formed in float64 and handed to ``softmax_cross_entropy``.

    Args:
      hidden: floating array (..., H), the features.
      linear_weight: floating array (H, V) (``hidden @ linear_weight``, flax's Dense kernel;
        ``torch_impl`` takes torch's (V, H)).
      targets: integer class indices of shape (...) (the hidden shape without H).
      bias: optional (V,) added to the logits.
      weight, ignore_index, label_smoothing, reduction, normalizer: as
        ``softmax_cross_entropy`` (class weights; 'mean' divides by the summed weights of the
        kept targets, 0 when none is kept, or by `normalizer` when given).
      z_loss, softcap: as ``softmax_cross_entropy`` (DESIGN 13): the loss of
        c = softcap tanh(logits / softcap) plus z_loss logsumexp(c)**2 per kept row; the
        backends apply both per block of rows, never forming the (N, V) logits.
      chunk_size: rows per chunk in the backends (None: chosen from the shapes); accepted and
        checked here, where nothing is chunked.
      return_aux: as ``softmax_cross_entropy``: also {'lse', 'z_term', 'correct'} of the
        logits, per row for 'none' (shaped like `targets`), else reduced over the kept rows;
        the backends compute them in the same pass over the blocks.

    Returns:
      float64 array of shape (...) for 'none', a float64 scalar otherwise; with `return_aux`,
      (loss, aux).

    Example:
      >>> hidden, kernel = np.array([[1.0, 0.0]]), np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
      >>> round(float(linear_softmax_cross_entropy(hidden, kernel, np.array([0]))), 6)
      0.169846

    References:
      torch.nn.functional.linear_cross_entropy; Wijmans et al., "Cut Your Losses in
      Large-Vocabulary Language Models", https://arxiv.org/abs/2411.09009
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    loss, _ = _linear_softmax(
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
        z_loss,
        softcap,
    )
    if _checks.return_aux(return_aux):
        aux = _linear_aux(
            hidden, linear_weight, targets, bias, weight, 0.0, False, ignore_index,
            label_smoothing, reduction, normalizer, z_loss, softcap,
        )  # fmt: skip
        return _normalize(loss, normalizer), aux
    return _normalize(loss, normalizer)


def linear_softmax_cross_entropy_grad(
    hidden: ArrayLike,
    linear_weight: ArrayLike,
    targets: ArrayLike,
    *,
    bias: ArrayLike | None = None,
    weight: ArrayLike | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    wrt: LinearSoftmaxWrt = "hidden",
) -> np.ndarray:
    """Gradient of ``linear_softmax_cross_entropy`` (reduced as `reduction` says) w.r.t. `wrt`.

    With G = ``softmax_cross_entropy_grad`` at the logits (M, V), hidden flattened to (M, H):
    'hidden': G W^T (shaped like hidden), 'linear_weight': hidden^T G (H, V), 'bias' (needs
    `bias`): the column sums of G (V,). Float64.

    Raises:
      ValueError: `wrt` is not one of the names above; 'bias' with `bias` None.
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    _, grads = _linear_softmax(
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
        z_loss,
        softcap,
    )
    return _normalize(
        _linear_grad(grads, wrt, LinearSoftmaxWrt, "linear_softmax_cross_entropy_grad"), normalizer
    )


def linear_softmax_focal_loss(
    hidden: ArrayLike,
    linear_weight: ArrayLike,
    targets: ArrayLike,
    *,
    bias: ArrayLike | None = None,
    gamma: float = 2.0,
    alpha: ArrayLike | float | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    return_aux: bool = False,
) -> np.ndarray | tuple[np.ndarray, dict]:
    """Softmax focal loss of a linear layer's output: ``softmax_focal_loss`` of
    hidden @ linear_weight + bias (logits in float64).

    Args:
      hidden, linear_weight, targets, bias, chunk_size: as ``linear_softmax_cross_entropy``.
      gamma, alpha, ignore_index, label_smoothing, reduction: as ``softmax_focal_loss`` ('mean'
        over the kept rows). gamma = 0 with alpha None is ``linear_softmax_cross_entropy``.
      normalizer, z_loss, softcap, return_aux: as ``linear_softmax_cross_entropy``.

    Returns:
      float64 array of shape (...) for 'none', a float64 scalar otherwise.

    Example:
      >>> hidden, kernel = np.array([[1.0, 0.0]]), np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
      >>> round(float(linear_softmax_focal_loss(hidden, kernel, np.array([0]))), 6)
      0.004144

    References:
      Lin et al., "Focal Loss for Dense Object Detection", https://arxiv.org/abs/1708.02002
    """
    reduction, normalizer = _normalizer(reduction, normalizer)
    loss, _ = _linear_softmax(
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
        z_loss,
        softcap,
    )
    if _checks.return_aux(return_aux):
        aux = _linear_aux(
            hidden, linear_weight, targets, bias, alpha, gamma, True, ignore_index,
            label_smoothing, reduction, normalizer, z_loss, softcap,
        )  # fmt: skip
        return _normalize(loss, normalizer), aux
    return _normalize(loss, normalizer)


def linear_softmax_focal_loss_grad(
    hidden: ArrayLike,
    linear_weight: ArrayLike,
    targets: ArrayLike,
    *,
    bias: ArrayLike | None = None,
    gamma: float = 2.0,
    alpha: ArrayLike | float | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: ArrayLike | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    wrt: LinearSoftmaxWrt = "hidden",
) -> np.ndarray:
    """Gradient of ``linear_softmax_focal_loss`` w.r.t. `wrt`: G = ``softmax_focal_loss_grad``
    at the logits mapped through the linear layer, as ``linear_softmax_cross_entropy_grad``."""
    reduction, normalizer = _normalizer(reduction, normalizer)
    _, grads = _linear_softmax(
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
        z_loss,
        softcap,
    )
    return _normalize(
        _linear_grad(grads, wrt, LinearSoftmaxWrt, "linear_softmax_focal_loss_grad"), normalizer
    )
