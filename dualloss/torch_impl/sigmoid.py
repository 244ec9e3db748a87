"""The sigmoid losses of the torch backend: ``sigmoid_cross_entropy`` and ``sigmoid_focal_loss``.

Sections as in ``spec.sigmoid``: the core (softplus, sigmoid, the loss-or-gradient bodies and
their ``_SigmoidLoss`` Function), the public functions. The math lives in
``dualloss.spec.sigmoid``; the Triton kernels' section picks ``_kernels.sigmoid`` where it
runs. May import ``_inputs``, ``_autodiff`` and ``_kernels``; never ``softmax``, ``linear`` or
``dropins``.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from .. import _checks
from . import _inputs, _kernels
from ._autodiff import (
    _asks_for_no_gradient,
    _frees_saved_tensors,
    _in_transform,
    _inplace,
    _other_input_grads,
    _saved_tensors_are_private,
)
from ._inputs import (
    _check_sigmoid_focal_targets,
    _compute_dtype,
    _gamma,
    _mean_divisor,
    _normalizer,
    _sigmoid_inputs,
    _unit_interval,
    _values_are_concrete,
)

# ----------------------------------------------------------------------------------------------
# Sigmoid core
# ----------------------------------------------------------------------------------------------


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
        on_cpu = output.device.type == "cpu" and _inputs._reads_on_host(output)
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
    """`loss` from ``_SigmoidLoss``: per element ('none') or summed; 'mean' divides by `count`, a
    number or a 0-d tensor (a normalizer, never read on the host); 0 with zero gradient for 0."""
    if reduction != "mean":
        return loss
    if isinstance(count, Tensor):
        is_zero = count == 0
        return torch.where(is_zero, loss * 0.0, loss / torch.where(is_zero, 1, count))
    return loss * 0.0 if count == 0 else loss / count


# ----------------------------------------------------------------------------------------------
# Triton kernels (DESIGN 11): on CUDA, or forced by torch_impl.kernels("triton")
# ----------------------------------------------------------------------------------------------

_TRITON = None  # kernels.sigmoid, imported on first use


class _SigmoidTriton(torch.autograd.Function):
    """The kernels' forward and backward, as ``softmax._SoftmaxTriton``: the forward kernel
    writes the loss and, where a gradient is needed (float32/float64), the gradient into a
    buffer of its own; backward scales that buffer (in place in the graph's last backward),
    recomputes it with the incoming gradient in half precision (one rounding), or under
    ``create_graph=True`` returns the eager closed form in differentiable ops."""

    @staticmethod
    def forward(ctx, x, t, w, q, gamma, alpha, focal, reduction):
        keeps_grad = ctx.needs_input_grad[0] and x.dtype in (torch.float32, torch.float64)
        grad = torch.empty_like(x) if keeps_grad else None
        loss = x.new_empty(x.shape if reduction == "none" else ())
        _TRITON.sigmoid_fwd_(x, t, w, q, gamma, alpha, focal, reduction == "mean", loss, grad)
        ctx.save_for_backward(x, t, w, q, grad)
        ctx.gamma, ctx.alpha, ctx.focal = gamma, alpha, focal
        ctx.count = float(x.numel()) if reduction == "mean" else 0.0
        ctx.grad_is_private = _saved_tensors_are_private()
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        x, t, w, q, grad = ctx.saved_tensors
        if torch.is_grad_enabled():
            scale = grad_loss / ctx.count if ctx.count else grad_loss
            if ctx.focal:
                grad = _sigmoid_focal_loss_or_grad(x, t, ctx.gamma, ctx.alpha, scale)
            else:
                grad = _sigmoid_cross_entropy_or_grad(x, t, w, q, scale)
            grad = _posinf_to_nan(x, grad)
        elif grad is None:
            grad = _TRITON.sigmoid_bwd(
                x, t, w, q, ctx.gamma, ctx.alpha, ctx.focal, grad_loss, ctx.count
            )
        elif ctx.grad_is_private and _frees_saved_tensors():
            _TRITON.scale_elements_(grad, grad_loss, ctx.count)
        else:
            grad = _TRITON.scale_elements(grad, grad_loss, ctx.count)
        return grad, None, None, None, None, None, None, None


def _sigmoid_takes_triton(logits, targets, normalizer, *factors):
    """Whether the Triton kernel computes this call (``torch_impl.kernels`` decides where): no
    gradient asked of the targets or the factors, factors the kernel reads as they are; with a
    normalizer float32/float64 only (half precision divides the eager float32 sum, one rounding)."""
    if targets.requires_grad or targets.shape != logits.shape:
        return False
    if normalizer is not None and logits.dtype not in (torch.float32, torch.float64):
        return False
    for f in factors:
        if f is not None and (f.requires_grad or not _kernels.factor_supported(f, logits.shape)):
            return False
    return not _in_transform() and _kernels.use_triton(logits)


def _sigmoid_triton(logits, targets, w, q, gamma, alpha, focal, reduction, normalizer=None):
    """The loss in the logits' dtype, computed and reduced by the kernels; with a `normalizer`
    (float32/float64 only: its quotient is rounded once from the kernel's sum) the kernels'
    sum divided by it."""
    global _TRITON
    if _TRITON is None:
        _TRITON = _kernels.sigmoid_ops()
    x = logits if logits.is_contiguous() else logits.contiguous()
    t = targets.to(x.dtype) if targets.dtype != x.dtype else targets
    t = t if t.is_contiguous() else t.contiguous()
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = None if w is None else w.to(acc)
    q = None if q is None else q.to(acc)
    if normalizer is not None:
        total = _SigmoidTriton.apply(x, t, w, q, float(gamma), alpha, focal, "sum")
        return _sigmoid_reduce(total, reduction, normalizer)
    return _SigmoidTriton.apply(x, t, w, q, float(gamma), alpha, focal, reduction)


# ----------------------------------------------------------------------------------------------
# Public API: sigmoid losses
# ----------------------------------------------------------------------------------------------


def _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction, normalizer):
    reduction, normalizer = _normalizer(reduction, normalizer)
    logits, targets, w, q = _sigmoid_inputs(logits, targets, weight, pos_weight)
    if _sigmoid_takes_triton(logits, targets, normalizer, w, q):
        return _sigmoid_triton(logits, targets, w, q, 0.0, None, False, reduction, normalizer)
    # saves logits, targets, weight, pos_weight
    loss = _sigmoid_loss(
        _sigmoid_cross_entropy_or_grad, 4, reduction != "none", logits, targets, w, q
    )
    if loss.shape != logits.shape and reduction == "none":
        # a weight broadcast over more than the logits' elements cannot occur (checked above)
        loss = loss.expand(logits.shape)
    count = _mean_divisor(logits.numel(), normalizer)
    return _sigmoid_reduce(loss, reduction, count).to(logits.dtype)


def sigmoid_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    *,
    weight: Tensor | None = None,
    pos_weight: Tensor | None = None,
    reduction: str = "mean",
    normalizer: Tensor | float | None = None,
) -> Tensor:
    """Sigmoid cross entropy with logits, torch semantics (see ``spec.sigmoid_cross_entropy``).

    Result in the logits' dtype (half precision computed in float32), closed-form gradient.
    """
    return _sigmoid_cross_entropy(logits, targets, weight, pos_weight, reduction, normalizer)


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


def _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction, normalizer):
    reduction, normalizer = _normalizer(reduction, normalizer)
    gamma = _gamma(gamma)
    if isinstance(alpha, numbers.Real):
        alpha = _unit_interval("alpha", alpha)
    _checks.focal_alpha(alpha, None)
    alpha = None if alpha is None else float(alpha)
    logits, targets, _, _ = _sigmoid_inputs(logits, targets, None, None)
    if _inputs._VALIDATE_INDICES and _values_are_concrete(targets):
        _check_sigmoid_focal_targets(targets)
    if _sigmoid_takes_triton(logits, targets, normalizer):
        return _sigmoid_triton(
            logits, targets, None, None, gamma, alpha, True, reduction, normalizer
        )
    # saves logits, targets; gamma, alpha are options
    loss = _sigmoid_loss(
        _sigmoid_focal_loss_or_grad, 2, reduction != "none", logits, targets, gamma, alpha
    )
    count = _mean_divisor(logits.numel(), normalizer)
    return _sigmoid_reduce(loss, reduction, count).to(logits.dtype)


def sigmoid_focal_loss(
    logits: Tensor,
    targets: Tensor,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    reduction: str = "mean",
    normalizer: Tensor | float | None = None,
) -> Tensor:
    """Sigmoid focal loss, torchvision semantics (see ``spec.sigmoid_focal_loss``).

    Note torchvision's default alpha is 0.25; here (as in the spec) it is None. Result in the
    logits' dtype (half precision computed in float32), closed-form gradient.
    """
    return _sigmoid_focal_loss(logits, targets, gamma, alpha, reduction, normalizer)
