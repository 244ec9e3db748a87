"""The softmax losses of the torch backend: ``softmax_cross_entropy`` and ``softmax_focal_loss``.

Sections as in ``spec.softmax``: the core (the spec's ``_log_softmax``, ``_focal_phi`` and terms,
dense and sparse), the class-index fast path (``_SoftmaxAtTarget``), the reductions, the public
functions. The math lives in ``dualloss.spec.softmax``. May import ``_inputs`` and
``_autodiff`` and ``_kernels``; never ``linear``, ``sigmoid`` or ``dropins``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import _checks
from . import _inputs, _kernels
from ._autodiff import (
    _frees_saved_tensors,
    _in_transform,
    _inplace,
    _saved_tensors_are_private,
    _with_closed_form_grad,
)
from ._inputs import (
    _compute_dtype,
    _gamma,
    _mean_divisor,
    _normalizer,
    _reduce,
    _softmax_inputs,
    _softmax_keep,
    _softmax_targets,
    _values_are_concrete,
)
from .parallel import (
    _batch_group,
    _class_slice,
    _from_dtensor,
    _is_dtensor,
    _process_group,
    _to_dtensor,
)

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


def _minus_log_p_times(weighted, log_p, z, z_top, log_norm, zero):
    """-weighted log p, log p = (z - z_top) - log_norm (log_norm >= 0, log1p(s) or its like), 0
    where `zero` (0 log 0 = 0: no target mass at a class whose logit is -inf).

    Logits that span more than the dtype's largest number (z_top > 0 > z, both finite) make
    z - z_top overflow to -inf though the loss may be finite: there
    -weighted log p = weighted z_top - weighted z + weighted log_norm, a sum of terms of one sign
    (no cancellation, a few ULP; inf only where the loss itself is beyond the largest number).
    Elsewhere the product as before, with its own rounding. Double wheres: d/dweighted stays
    finite (a -inf log p or a -inf logit is never multiplied by the 0 of an unselected branch).
    """
    # z - z_top overflowed though z is finite (a +inf or NaN logit makes the row's log p NaN)
    far = (log_p == -math.inf) & torch.isfinite(z)
    near = -(weighted * torch.where(zero | far, 0.0, log_p))
    z_far = torch.where(far, z, 0.0)
    z_top_far = torch.where(far, z_top, 0.0)
    return torch.where(far, _far_loss(weighted, z_far, z_top_far, log_norm), near)


def _far_loss(weighted, z, z_top, log_norm):
    """-weighted log p where z - z_top overflowed (z_top > 0 > z): see ``_minus_log_p_times``."""
    # -a log p = a z_top - a z + a log_norm: z_top > 0 > z, every term >= 0
    return (weighted * z_top - weighted * z) + weighted * log_norm


def _log_softmax(z):
    """log p, log(1 - p), p and 1 - p along the last axis (``spec._log_softmax``), and the
    row's largest logit z_top (as ``_vocab_parallel_log_softmax``).

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
    return log_p, log_not_p, p, not_p, is_top, s, log1p_s, z_top


def _softcap(z, softcap):
    """c = softcap tanh(z / softcap) and dc/dz = sech^2(z / softcap) (``spec._softcap``), or
    (z, None) without a cap. Infinite logits keep their meaning: -inf a masked class, +inf a NaN
    row (DESIGN 5), where tanh would make them finite."""
    if softcap is None:
        return z, None
    x = z / softcap
    # sech^2 x = 4 e / (1 + e)^2, e = exp(-2 |x|): no 1 - tanh^2 cancellation, no overflow
    e = torch.exp(-2.0 * x.abs())
    dcap = 4.0 * e / ((1.0 + e) * (1.0 + e))
    c = torch.where(torch.isinf(z), z, softcap * torch.tanh(x))
    return c, dcap


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


def _softmax_focal_terms(z, a, gamma, grad_loss, z_loss=0.0):
    """Per-element loss -sum_c a_c (1 - p_c)^gamma log p_c + z_loss lse**2, or its gradient times
    `grad_loss`, lse = logsumexp(z) = z_top + log1p(s).

    With gamma = 0 this is the (weighted) softmax cross entropy -sum_c a_c log p_c.
    The gradient is p_j sum_{c != j} v_c - (1 - p_j) v_j, the same as p * sum(v) - v but free of
    the cancellation p_j - 1 when p_j is close to 1, plus the z-loss's 2 z_loss lse p_j (one
    more number in p_j's coefficient, the same pass). Class axis last; `grad_loss` None: the loss.
    """
    log_p, log_not_p, p, not_p, is_top, s, log1p_s, z_top = _log_softmax(z)
    # logsumexp(z) = z_top + log1p(s): the top's 1 apart, so a confident row keeps its digits
    lse = z_top + log1p_s if z_loss != 0.0 else None
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
        # (and logits spanning more than the largest number: ``_minus_log_p_times``)
        zero = (a == 0.0) & (log_p == -math.inf)
        loss = _minus_log_p_times(weighted, log_p, z, z_top, log1p_s, zero).sum(dim=-1)
        if lse is None:
            return loss
        # z-loss: z_loss lse^2
        return loss + ((z_loss * lse) * lse).squeeze(-1)
    coefficient = _sum_except_self(v)
    if lse is not None:
        # z-loss: d/dz_j z_loss lse^2 = 2 z_loss lse p_j, in p_j's coefficient
        coefficient = coefficient + (2.0 * z_loss) * lse
    grad = p * coefficient - not_p * v
    return grad * grad_loss.unsqueeze(-1)


def _softmax_focal_terms_sparse(z, y, a_y, gamma, grad_loss, z_loss=0.0):
    """``_softmax_focal_terms`` for a = a_y * onehot(y): only column y of the N x C work is done.

    The loss is -a_y (1 - p_y)^gamma log p_y (+ z_loss lse^2, lse = z_top + log1p(s)); with v
    nonzero only at y, sum_{c != j} v_c is v_y for j != y and 0 for j = y, so the gradient is
    p_j (v_y + 2 z_loss lse) off y and -(1 - p_y) v_y + 2 z_loss lse p_y at y. Returns the loss
    (`grad_loss` None, shape [...]) or the gradient times `grad_loss`.
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
        # (and logits spanning more than the largest number: ``_minus_log_p_times``)
        zero = (a_y == 0.0) & (log_p == -math.inf)
        z_y = z.gather(-1, y)
        loss = _minus_log_p_times(weighted, log_p, z_y, z_top, log1p_s, zero)
        if z_loss != 0.0:
            # z-loss: z_loss lse^2, logsumexp(z) = z_top + log1p(s)
            lse = z_top + log1p_s
            loss = loss + (z_loss * lse) * lse
        return loss.squeeze(-1)
    coefficient = grad_loss.unsqueeze(-1) * v
    at_y = -not_p * coefficient
    if z_loss != 0.0:
        # z-loss: d/dz_j z_loss lse^2 = 2 z_loss lse p_j, in p_j's coefficient (the same pass)
        z_coefficient = (2.0 * z_loss) * grad_loss.unsqueeze(-1) * (z_top + log1p_s)
        at_y = at_y + z_coefficient * p
        coefficient = coefficient + z_coefficient
    if inplace:
        # p_j = exp(z_j - z_top) / (1 + s) off the top, 1 / (1 + s) at it: the temporary reused
        p_top = torch.exp(-log1p_s)
        grad = others.mul_(coefficient * p_top)
        grad = grad.scatter_(-1, top, coefficient * p_top)
        return grad.scatter_(-1, y, at_y)
    # p_j = exp(z_j - z_top - log1p(s)): one pass over the logits, then column y
    grad = torch.exp(shifted - log1p_s) * coefficient
    return grad.scatter(-1, y, at_y)


def _softmax_loss_or_grad(
    logits,
    targets,
    where,
    class_weight,
    axis,
    gamma,
    ignore_index,
    label_smoothing,
    z_loss,
    softcap,
    grad_loss,
):
    """The per-element loss (`grad_loss` None) or the logits' gradient (times `grad_loss`).

    With `softcap` the terms are those of the capped logits c and the gradient is taken through
    the cap (times dc/dz); `z_loss` adds z_loss lse(c)^2 per element."""
    z, a, y, a_y, keep, valid = _softmax_targets(
        logits, targets, where, class_weight, axis, ignore_index, label_smoothing
    )
    # soft-capping: c = softcap tanh(z / softcap), a fresh tensor (the terms may work in place)
    z, dcap = _softcap(z, softcap)
    if a is None:
        result = _softmax_focal_terms_sparse(z, y, a_y, gamma, grad_loss, z_loss)
    else:
        result = _softmax_focal_terms(z, a, gamma, grad_loss, z_loss)
    if dcap is not None and grad_loss is not None:
        # the chain rule through the cap: dl/dz = dl/dc sech^2(z / softcap)
        result = result * dcap
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


# saves logits, targets, where, class_weight; axis, gamma, ignore_index, label_smoothing, z_loss,
# softcap are options
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

    The LLM head options (DESIGN 13, ``forward(..., z_loss, softcap)``) ride in the same passes.
    `softcap`: the softmax is that of c = softcap tanh(z / softcap), formed in one temporary that
    softmax reads (``_capped_logits``); c is not kept: backward multiplies the gradient by
    dc/dz = sech^2(z / softcap) from the logits z, saved for it (``_times_dcap``). `z_loss`:
    forward adds z_loss lse^2 with lse = logsumexp(c) from the row's largest c (one more read of
    c) and p there (``_target_lse``), a fourth output (0 on rows not kept), and backward adds
    2 z_loss lse to p_j's coefficient, the same multiplication. Without them the fourth output
    is zeros and nothing else changes.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(z, y, a_y, keep, gamma, z_loss, softcap):
        # soft-capping: the softmax of c = softcap tanh(z / softcap), a temporary of our own
        c = z if softcap is None else _capped_logits(z, softcap)
        p = torch.softmax(c, dim=-1)
        p_y = p.gather(-1, y)
        inplace = _inplace(p, y)
        on_host = inplace and _inputs._reads_on_host(p)
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
        # the target's logit (also read where c_y - c_top overflows, below); off the CPU the
        # rows' largest logit and probability, once for both
        c_y = c.gather(-1, y)
        if on_host:
            if bool(small.any()):
                rows = small.squeeze(-1).nonzero(as_tuple=True)
                z_rows, p_rows = c[rows], p[rows]
                log_p_y[rows] = (c_y[rows] - z_rows.amax(dim=-1, keepdim=True)) + torch.log(
                    p_rows.amax(dim=-1, keepdim=True) / (p_y[rows] + r[rows])
                )
        else:
            c_top = c.amax(dim=-1, keepdim=True)
            p_top = p.amax(dim=-1, keepdim=True)
            from_logits = (c_y - c_top) + torch.log(p_top / (p_y + r))
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
        # logits spanning more than the largest number: c_y - c_top overflowed to -inf, the loss
        # need not have (``_far_loss``, log_norm = log((p_y + r) / p_top) >= 0); on the CPU
        # those rows only, found from N values
        far = (log_p_y == -math.inf) & torch.isfinite(c_y)
        mass = torch.ones_like(log_p_y) if a_y is None else a_y
        mass = mass if focal_weight is None else mass * focal_weight
        if on_host:
            if bool(far.any()):
                rows = far.squeeze(-1).nonzero(as_tuple=True)
                p_top = p[rows].amax(dim=-1, keepdim=True)
                log_norm = torch.log((p_y[rows] + r[rows]) / p_top)
                c_top = c[rows].amax(dim=-1, keepdim=True)
                loss[rows] = _far_loss(mass[rows], c_y[rows], c_top, log_norm)
        else:
            log_norm = torch.log((p_y + r) / p_top)
            c_far = torch.where(far, c_y, 0.0)
            c_top_far = torch.where(far, c_top, 0.0)
            loss = torch.where(far, _far_loss(mass, c_far, c_top_far, log_norm), loss)
        if z_loss != 0.0:
            # z-loss: z_loss lse^2, rows not kept 0 (their lse too: backward reads it)
            lse = _target_lse(c, y, p, p_y, r, log_p_y)
            if keep is not None:
                lse = torch.where(keep.unsqueeze(-1), lse, 0.0)
            loss = loss + (z_loss * lse) * lse
        else:
            lse = torch.zeros_like(r)
        loss = loss.squeeze(-1)
        if keep is not None:
            # ignored elements give 0, whatever their logits
            loss = torch.where(keep, loss, 0.0)
        return loss, p, r, lse

    @staticmethod
    def setup_context(ctx, inputs, output):
        z, y, a_y, keep, gamma, z_loss, softcap = inputs
        _, p, r, lse = output
        # lse for the z-term, the logits for the cap's derivative (the caller's tensor: no
        # copy), keep for either; without the options p, r, y and a_y as before
        options = z_loss != 0.0 or softcap is not None
        ctx.save_for_backward(
            p,
            r,
            y,
            a_y,
            lse if z_loss != 0.0 else None,
            keep if options else None,
            z if softcap is not None else None,
        )
        ctx.gamma, ctx.z_loss, ctx.softcap = gamma, z_loss, softcap
        ctx.p_is_private = _saved_tensors_are_private()
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_loss, grad_p, grad_r, grad_lse):
        p, r, y, a_y, lse, keep, z = ctx.saved_tensors
        # p is ours (an output nobody else holds, no pack hook kept it): once this backward is the
        # graph's last, the gradient may overwrite it, unless a gradient through p still reads it
        reuse_p = (
            ctx.p_is_private
            and grad_p is None
            and grad_r is None
            and grad_lse is None
            and _frees_saved_tensors()
        )
        grad = None
        z_coefficient = None
        if grad_loss is not None and ctx.z_loss != 0.0:
            # z-loss: d/dc_j z_loss lse^2 = 2 z_loss lse p_j (lse is 0 on rows not kept)
            z_coefficient = (2.0 * ctx.z_loss) * grad_loss.unsqueeze(-1) * lse
        if grad_loss is not None and ctx.gamma == 0.0:
            # cross entropy: p_j c off the target, -(1 - p_y) c = -r k c at it (k below)
            p_y = p.gather(-1, y)
            k = 1.0 / (p_y + r)
            coefficient = grad_loss.unsqueeze(-1) if a_y is None else grad_loss.unsqueeze(-1) * a_y
            scale = coefficient * k
            at_y = -(r * scale)
            if z_coefficient is not None:
                # the z-loss's 2 z_loss lse p_j (p_j = p k renormalised) in p_j's coefficient
                z_scale = z_coefficient * k
                at_y = at_y + p_y * z_scale
                scale = scale + z_scale
            if reuse_p and _inplace(p, scale):
                # the gradient written over the saved p: one read and one write of N x C
                # (detached: p, an output of this function, carries its graph)
                grad = p.detach().mul_(scale).scatter_(-1, y, at_y)
            elif _inplace(p, scale):
                grad = torch.mul(p, scale).scatter_(-1, y, at_y)
            else:
                grad = (p * scale).scatter(-1, y, at_y)
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
            scale = coefficient * k
            at_y = -not_p_y * coefficient
            if z_coefficient is not None:
                # the z-loss's 2 z_loss lse p_j in p_j's coefficient (p_y renormalised above)
                at_y = at_y + p_y * z_coefficient
                scale = scale + z_coefficient * k
            if reuse_p and _inplace(p, scale):
                grad = p.detach().mul_(scale).scatter_(-1, y, at_y)
            elif _inplace(p, scale):
                grad = torch.mul(p, scale).scatter_(-1, y, at_y)
            else:
                grad = (p * scale).scatter(-1, y, at_y)
        if grad_p is not None:
            # the softmax's Jacobian: p (grad_p - sum_k p_k grad_p_k)
            through_p = torch._softmax_backward_data(grad_p, p, -1, p.dtype)
            grad = through_p if grad is None else grad + through_p
        if grad_r is not None:
            # r = 1 - p_y: dr/dz_k = p_y p_k off the target, -p_y r at it
            scale = grad_r * p.gather(-1, y)
            through_r = (p * scale).scatter(-1, y, -scale * r)
            grad = through_r if grad is None else grad + through_r
        if grad_lse is not None:
            # lse = logsumexp(c) on the kept rows (0 elsewhere): d lse / dc = p
            scale = grad_lse if keep is None else torch.where(keep.unsqueeze(-1), grad_lse, 0.0)
            through_lse = p * scale
            grad = through_lse if grad is None else grad + through_lse
        if grad is not None and ctx.softcap is not None:
            # the chain rule through the cap: dl/dz = dl/dc sech^2(z / softcap)
            grad = _times_dcap(grad, z, ctx.softcap)
            if keep is not None:
                # rows not kept get 0, also where a NaN logit made sech^2 NaN (0 / cosh(NaN))
                if _inplace(grad, keep) and _inputs._reads_on_host(grad):
                    grad[~keep] = 0.0
                else:
                    grad = torch.where(keep.unsqueeze(-1), grad, 0.0)
        return grad, None, None, None, None, None, None


def _capped_logits(z, softcap):
    """c = softcap tanh(z / softcap) in one fresh temporary (the quotient, then tanh and the
    product in place), for a forward that records no graph. Infinite logits as ``_softcap``
    (-inf a masked class, +inf a NaN row): where the values can be read on the host, one read
    of the logits (their smallest and largest) tells whether any is infinite, and only then
    does the masking where run; elsewhere it always does."""
    c = (z / softcap).tanh_().mul_(softcap)
    if z.numel() > 0 and _inplace(z) and _inputs._reads_on_host(z):
        low, high = torch.aminmax(z)
        # finite: no infinite logit (a NaN one makes it NaN, and so does tanh: checked anyway)
        if bool(torch.isfinite(high - low)):
            return c
    return torch.where(torch.isinf(z), z, c)


def _times_dcap(grad, z, softcap):
    """`grad` times dc/dz = sech^2(z / softcap) (``_softcap``), written as 1 / cosh^2: two
    divisions by one temporary, in place on `grad` (ours) where no graph is recorded, so the
    cap's backward is two passes over N x C more. cosh overflows beyond |x| ~ 89 (float32; 710
    in float64), where sech^2 is below the smallest subnormal: the quotient is 0 as it should
    be, and dividing twice (rather than by cosh^2) keeps sech^2 down to the subnormals. Under
    create_graph: the differentiable 4 e / (1 + e)^2 of ``_softcap``."""
    if not _inplace(grad, z):
        return grad * _softcap(z, softcap)[1]
    # sech^2 x = 1 / cosh^2 x
    cosh = (z / softcap).cosh_()
    return grad.div_(cosh).div_(cosh)


def _target_lse(c, y, p, p_y, r, log_p_y):
    """logsumexp(c) per row ([..., 1]) from the fast path's softmax: at a top target
    c_y - log p_y = c_top + log1p(s) (the spec's form, a confident row keeps its digits);
    elsewhere c_top - log(p_top / (p_y + r)), p_top >= 1 / C renormalised by softmax's own row
    sum (k = 1 / (p_y + r), as backward). One read of c for its largest entry."""
    c_top, top = torch.max(c, dim=-1, keepdim=True)
    from_top = c_top - torch.log(p.gather(-1, top) / (p_y + r))
    return torch.where(top == y, c.gather(-1, y) - log_p_y, from_top)


def _softmax_at_target(
    logits, targets, where, class_weight, axis, gamma, ignore_index, z_loss=0.0, softcap=None
):
    """The per-element loss through ``_SoftmaxAtTarget`` (its outputs p, r and lse only feed
    the backward)."""
    z, _, y, a_y, keep, _ = _softmax_targets(
        logits, targets, where, class_weight, axis, ignore_index, 0.0
    )
    loss, _, _, _ = _SoftmaxAtTarget.apply(z, y, a_y, keep, gamma, z_loss, softcap)
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
# Triton kernels (DESIGN 11): class-index targets (with `where` and label smoothing), and
# probability targets, on CUDA
# ----------------------------------------------------------------------------------------------

_TRITON = None  # kernels.softmax, imported on first use


class _SoftmaxTriton(torch.autograd.Function):
    """The kernels' forward and backward, class indices (``softmax_index_fwd_``) or probability
    targets (``softmax_dense_fwd_``, `weighted` and `ignore_index` unused): the forward kernel
    writes the loss and, where a gradient is needed, the gradient into a buffer of its own;
    backward scales that buffer (in place in the graph's last backward) or, under
    ``create_graph=True``, returns the eager closed form of the saved logits in differentiable
    ops, so second derivatives exist as on the eager path. The buffers are saved, not returned:
    autograd keeps no views of them. No gradient for the targets (probability targets that need
    one take the eager path)."""

    @staticmethod
    def forward(
        ctx, z, targets, w, axis, gamma, ignore_index, reduction, weighted, z_loss, softcap, where,
        label_smoothing,
    ):  # fmt: skip
        # float32/float64 keep the gradient from forward (backward scales it); half precision
        # recomputes it in backward rather than round it twice
        keeps_grad = ctx.needs_input_grad[0] and z.dtype in (torch.float32, torch.float64)
        grad = torch.empty_like(z) if keeps_grad else None
        shape = z.shape[:axis] + z.shape[axis + 1 :]
        loss = z.new_empty(shape if reduction == "none" else ())
        acc = torch.float64 if z.dtype == torch.float64 else torch.float32
        denominator = loss.new_empty((), dtype=acc) if reduction == "mean" else None
        ctx.dense = targets.is_floating_point()
        if ctx.dense:
            _TRITON.softmax_dense_fwd_(
                z, targets, w, where, axis, gamma, label_smoothing, loss, denominator, grad,
                z_loss, softcap,
            )  # fmt: skip
        else:
            _TRITON.softmax_index_fwd_(
                z, targets, w, axis, gamma, ignore_index, weighted, loss, denominator, grad,
                z_loss, softcap, where, label_smoothing,
            )  # fmt: skip
        ctx.save_for_backward(z, targets, w, denominator, grad, where)
        ctx.axis, ctx.gamma, ctx.ignore_index = axis, gamma, ignore_index
        ctx.z_loss, ctx.softcap, ctx.label_smoothing = z_loss, softcap, label_smoothing
        ctx.grad_is_private = _saved_tensors_are_private()
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        z, targets, w, divisor, grad, where = ctx.saved_tensors
        # the mean's backward divides the incoming gradient by the forward's denominator
        if torch.is_grad_enabled():
            scale = grad_loss if divisor is None else grad_loss / divisor
            grad = _softmax_loss_or_grad(
                z, targets, where, w, ctx.axis, ctx.gamma, ctx.ignore_index, ctx.label_smoothing,
                ctx.z_loss, ctx.softcap, scale,
            )  # fmt: skip
        elif grad is None and ctx.dense:
            # half precision: recomputed with the incoming gradient, one rounding
            grad = _TRITON.softmax_dense_bwd(
                z, targets, w, where, ctx.axis, ctx.gamma, ctx.label_smoothing, grad_loss,
                divisor, ctx.z_loss, ctx.softcap,
            )  # fmt: skip
        elif grad is None:
            grad = _TRITON.softmax_index_bwd(
                z, targets, w, ctx.axis, ctx.gamma, ctx.ignore_index, grad_loss, divisor,
                ctx.z_loss, ctx.softcap, where, ctx.label_smoothing,
            )  # fmt: skip
        elif ctx.grad_is_private and _frees_saved_tensors():
            # the graph's last backward: the kernel's buffer scaled in place (no second N x C)
            _TRITON.scale_rows_(grad, ctx.axis, grad_loss, divisor)
        else:
            grad = _TRITON.scale_rows(grad, ctx.axis, grad_loss, divisor)
        return (grad,) + (None,) * 12


def _softmax_takes_triton(logits, targets, class_weight, is_index):
    """Whether the Triton kernels compute this call (``torch_impl.kernels`` decides where):
    class indices or probability targets (with or without `where` and label smoothing), no
    gradient asked of probability targets or of the class weight."""
    return (
        (is_index or not targets.requires_grad)
        and (class_weight is None or not class_weight.requires_grad)
        and not _in_transform()
        and _kernels.use_triton(logits)
    )


def _softmax_triton(
    logits, targets, class_weight, axis, gamma, ignore_index, weighted, reduction, z_loss, softcap,
    where, label_smoothing,
):  # fmt: skip
    """The loss in the logits' dtype, reduced by the kernels: the mean divides by the kept
    targets' class weights (`weighted`, torch's weighted mean) or their number (probability
    targets: the elements with a class inside `where`); the LLM head options (DESIGN 13), the
    class mask `where` (read in place, broadcast or not) and label smoothing in the kernel's
    own passes."""
    global _TRITON
    if _TRITON is None:
        _TRITON = _kernels.softmax_ops()
    z = logits if logits.is_contiguous() else logits.contiguous()
    targets = targets if targets.is_contiguous() else targets.contiguous()
    return _SoftmaxTriton.apply(
        z, targets, class_weight, axis, float(gamma), ignore_index, reduction, weighted, z_loss,
        softcap, where, float(label_smoothing),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Vocab-parallel (DESIGN 12): the class axis split over a process group
# ----------------------------------------------------------------------------------------------


class _VocabParallel(torch.autograd.Function):
    """The fast path's loss where each rank holds a contiguous slice of the classes.

    forward(z, y, a_y, keep, gamma, start, group, m, m_y, m_rest, z_loss): z the class-last local
    logits [..., C_r] in the compute dtype (capped already with `softcap`: the cap is
    elementwise), y the global target indices [..., 1] (ignored rows at 0), a_y [..., 1] the
    target's mass (None: 1; (1 - eps) w_y with label smoothing), keep [...] or None, `start` this
    rank's first global class. Three per-row numbers cross ranks, in two all-reduces: the largest
    logit z_top (MAX), then (SUM) the target's logit z_y from the rank that owns y (0 elsewhere;
    t = z_y - z_top formed after it, so that where t overflows, logits spanning more than the
    largest number, the loss is a_y z_top - a_y z_y + a_y log(exp(t) + s): ``_minus_log_p_times``)
    and s = sum_{j != y} exp(z_j - z_top). The row's normaliser is
    exp(t) + s and, as on one device,

      log p_y = t - log(exp(t) + s) = t - log1p(expm1(t) + s),

    which is -log1p(s) at a top target (t = 0): a confident row keeps its tiny loss. At a top
    target s is the spec's s (the others' share over the top's), so ``_log_not_p`` and
    ``_focal_phi`` take it as they are; elsewhere p_y <= 1/2 and 1 - p_y needs no care.

    Label smoothing (cross entropy): m, the smoothing mass m_c = eps w_c / C (over the classes
    inside `where`: eps w_c / C_valid) of this rank's classes ([..., C_r] or [C_r]), at the
    target (m_y) and summed over every rank's other classes (m_rest, [..., 1]); None without.
    Its loss -sum_c m_c log p_c = M log(exp(t) + s) - sum_c m_c (z_c - z_top), M = m_y + m_rest:
    one more number per row in the SUM. Probability targets (cross entropy): `y` None, `a_y` 0
    and m = w t~ this rank's slice of the target mass; the row's first top class over the ranks
    (one more all-reduce, MIN of its index) takes the target's place, and the SUM carries its
    mass m_y and the others' m_rest too (so 1 - p_top = s / (exp(t) + s) and M - m_top keep
    their digits); m's gradient is -log p_c, local. The z-loss z_loss lse^2 needs only
    lse = z_top + log(exp(t) + s), which the row already has; the second output is lse.

    Backward is local: p_j = exp(z_j - z_top) / (exp(t) + s) from the saved logits and per-row
    numbers, the gradient p_j V - m_j + 2 z_loss lse p_j off the target (V = v + M, v the
    target's term, as ``_softmax_focal_terms_sparse``) and p_y m_rest - (1 - p_y)(v + m_y) +
    2 z_loss lse p_y at it (owned rows only). Not twice differentiable (the collectives are
    outside the graph).
    """

    @staticmethod
    def forward(ctx, z, y, a_y, keep, gamma, start, group, m, m_y, m_rest, z_loss):
        num_local = z.shape[-1]
        if y is None:
            local_top, local_first = z.max(dim=-1, keepdim=True)
            z_top = local_top.clone()
        else:
            z_top = z.amax(dim=-1, keepdim=True)
        # the row's largest logit over every rank: exp(z - z_top) cannot overflow
        dist.all_reduce(z_top, op=dist.ReduceOp.MAX, group=group)
        if y is None:
            # probability targets: the row's first top class over the ranks takes the target's
            # part (t = 0, s the others' share), its mass m_y and the rest's m_rest summed below
            none = torch.iinfo(torch.int64).max
            y = torch.where(local_top == z_top, start + local_first, none)
            dist.all_reduce(y, op=dist.ReduceOp.MIN, group=group)
            # a NaN row has no top: any class (its loss is NaN through s)
            y = torch.where(y == none, start, y)
        local_y = y - start
        owns = (local_y >= 0) & (local_y < num_local)
        local_y = torch.where(owns, local_y, 0)
        shifted = z - z_top
        exp_shifted = torch.exp(shifted)
        # the target's logit itself (t = z_y - z_top is formed after the SUM, the same rounding
        # on every rank): where z_y - z_top overflowed ``_minus_log_p_times`` reads it
        z_y = torch.where(owns, z.gather(-1, local_y), 0.0)
        # the target's own term left out of s, on the rank that owns it (no 1 + s - 1 rounding)
        exp_y = torch.where(owns, 0.0, exp_shifted.gather(-1, local_y))
        s = exp_shifted.scatter(-1, local_y, exp_y).sum(dim=-1, keepdim=True)
        columns = [z_y, s]
        if m is not None:
            # 0 log 0 = 0: a class without smoothing mass (outside `where`) adds nothing at -inf;
            # where z - z_top overflowed though z is finite (logits spanning more than the
            # largest number, z_top > 0 > z) m (z - z_top) = m z - m z_top, two terms <= 0
            far = (shifted == -math.inf) & torch.isfinite(z)
            m_far = m * torch.where(far, z, 0.0) - m * torch.where(far, z_top, 0.0)
            m_shifted = torch.where(m == 0.0, 0.0, torch.where(far, m_far, m * shifted))
            columns.append(m_shifted.sum(dim=-1, keepdim=True))
            if m_y is None:
                # probability targets: the mass at the top class (from the rank that owns it)
                # and off it, summed apart (no cancellation in M - m_y)
                m = m.expand(z.shape)
                at_top = m.gather(-1, local_y)
                columns.append(torch.where(owns, at_top, 0.0))
                off = m.scatter(-1, local_y, torch.where(owns, 0.0, at_top))
                columns.append(off.sum(dim=-1, keepdim=True))
        stats = torch.cat(columns, dim=-1)
        # z_y from the rank that owns the target (the others add 0), s the sum of the other
        # classes' exponentials over every rank (a NaN logit anywhere makes s NaN);
        # with label smoothing, sum_c m_c (z_c - z_top) over every rank's classes (and, for
        # probability targets, the top's mass and the others')
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
        z_y, s = stats[..., :1], stats[..., 1:2]
        t = z_y - z_top
        if m is not None and m_y is None:
            m_y, m_rest = stats[..., 3:4], stats[..., 4:5]
        is_top = t == 0.0
        # log(exp(t) + s) = log1p(expm1(t) + s): log1p(s) at a top target
        log1p_s = torch.log1p(torch.expm1(t) + s)
        log_p = t - log1p_s
        # exp(t) / (exp(t) + s): within ~1 ULP (exp(log p) would not be)
        normaliser = torch.exp(t) + s
        p = torch.exp(t) / normaliser
        # 1 - p_top = s / (1 + s), never formed as 1 - p
        not_p = torch.where(is_top, s / normaliser, 1.0 - p)
        if gamma == 0.0:
            # (1 - p)^0 = 1, also at p = 1
            focal_weight = None
            v = torch.ones_like(p) if a_y is None else a_y
        else:
            tiny = torch.finfo(z.dtype).tiny
            is_normal = s >= tiny
            log_s = torch.where(is_normal, torch.log(torch.where(is_normal, s, 1.0)), -math.inf)
            log_not_p = _log_not_p(p, is_top, s, log_s, log1p_s)
            # (1 - p)^gamma = exp(gamma log(1 - p))
            focal_weight = torch.exp(gamma * log_not_p)
            phi = _focal_phi(log_p, p, not_p, is_top, s, log1p_s)
            v = (1.0 - gamma * phi) * focal_weight
            v = v if a_y is None else a_y * v
        per_mass = far_terms = None
        # logits spanning more than the largest number: ``_minus_log_p_times``, log(exp(t) + s)
        # the normaliser's log
        if a_y is None:
            weighted = torch.ones_like(log_p) if focal_weight is None else focal_weight
            no_mass = torch.zeros_like(log_p, dtype=torch.bool)
            loss = _minus_log_p_times(weighted, log_p, z_y, z_top, log1p_s, no_mass)
        else:
            weighted = a_y if focal_weight is None else a_y * focal_weight
            # 0 log 0 = 0: no target mass contributes nothing, also when its logit is -inf
            zero = (a_y == 0.0) & (log_p == -math.inf)
            loss = _minus_log_p_times(weighted, log_p, z_y, z_top, log1p_s, zero)
            if ctx.needs_input_grad[2]:
                # the loss per unit of target mass: its derivative w.r.t. a_y (weight / alpha)
                per_mass = -torch.where(zero, 0.0, log_p)
                per_mass = per_mass if focal_weight is None else focal_weight * per_mass
                # where t overflowed (p_y = 0: the focal weight is 1) z_top - z_y +
                # log(exp(t) + s), formed in backward times the incoming gradient term by term
                # (finite where a mean's 1/N makes it so), also at a_y = 0
                far = (log_p == -math.inf) & torch.isfinite(z_y)
                if keep is not None:
                    per_mass = torch.where(keep.unsqueeze(-1), per_mass, 0.0)
                    far = far & keep.unsqueeze(-1)
                far_terms = (far, torch.where(far, z_y, 0.0))
        if m is not None:
            # -sum_c m_c log p_c = M log(exp(t) + s) - sum_c m_c (z_c - z_top)
            loss = loss + ((m_y + m_rest) * log1p_s - stats[..., 2:3])
        # lse = z_top + log(exp(t) + s): the z-loss and ``return_aux``'s lse
        lse = z_top + log1p_s
        if z_loss != 0.0:
            loss = loss + (z_loss * lse) * lse
        loss, lse = loss.squeeze(-1), lse.squeeze(-1)
        if keep is not None:
            # ignored elements give 0, whatever their logits
            loss = torch.where(keep, loss, 0.0)
            lse = torch.where(keep, lse, 0.0)
        # the mass's own derivative -log p_c (0 where p_c = 0), for differentiable targets
        log_norm = log1p_s if m is not None and ctx.needs_input_grad[7] else None
        ctx.save_for_backward(
            z,
            z_top,
            normaliser,
            not_p,
            v,
            local_y,
            owns,
            keep,
            per_mass,
            m,
            m_y,
            m_rest,
            lse,
            log_norm,
            *(far_terms or (None, None)),
            log1p_s if far_terms else None,
        )
        ctx.z_loss = z_loss
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, grad_lse):
        z, z_top, normaliser, not_p, v, local_y, owns, keep, per_mass, m, m_y, m_rest, lse = (
            ctx.saved_tensors[:13]
        )
        log_norm = ctx.saved_tensors[13]
        g = grad_loss.unsqueeze(-1)
        coefficient = g * v
        # at the target, -(1 - p_y) times its own mass (v, and m_y with smoothing) ...
        own = coefficient if m is None else coefficient + g * m_y
        # ... plus p_y times the rest of the row's: m_rest and the z-term's 2 z_loss lse, each
        # formed apart (never as the total less the target's own: that would cancel)
        rest = None if m is None else g * m_rest
        if ctx.z_loss != 0.0:
            # d/dz_j z_loss lse^2 = 2 z_loss lse p_j
            z_term = g * ((2.0 * ctx.z_loss) * lse.unsqueeze(-1))
            rest = z_term if rest is None else rest + z_term
        # the row's whole target mass (and z-term) times the incoming gradient
        total = own if rest is None else own + rest
        # p_j = exp(z_j - z_top) / (exp(t) + s), from this rank's logits and the row's numbers
        p = torch.exp(z - z_top) / normaliser
        grad = p * total
        if m is not None:
            grad = grad - g * m
        # p_y total - own = p_y rest - (1 - p_y) own, without cancelling
        at_y = -not_p * own
        if rest is not None:
            at_y = at_y + p.gather(-1, local_y) * rest
        at_y = torch.where(owns, at_y, grad.gather(-1, local_y))
        grad = grad.scatter(-1, local_y, at_y)
        if keep is not None:
            # ignored elements get no gradient, whatever their logits
            grad = torch.where(keep.unsqueeze(-1), grad, 0.0)
        # the target mass's gradient (a_y = weight[y] or alpha[y]), the same on every rank
        grad_a = None
        if ctx.needs_input_grad[2]:
            far, z_y_far, log_exp_t_s = ctx.saved_tensors[14:17]
            # -log p_y = z_top - z_y + log(exp(t) + s) where t overflowed, each term times g first
            far_grad = _far_loss(g, z_y_far, torch.where(far, z_top, 0.0), log_exp_t_s)
            grad_a = torch.where(far, far_grad, g * per_mass)
        # the local mass's gradient -log p_c = log(exp(t) + s) - (z_c - z_top) (probability
        # targets: each rank its slice; +inf where p_c = 0, as the spec), 0 on rows not kept
        grad_m = None
        if log_norm is not None:
            shifted = z - z_top
            grad_m = g * (log_norm - shifted)
            # where z - z_top overflowed (logits spanning more than the largest number), each
            # term times g first: g log_norm + g z_top - g z, finite where a mean's 1/N makes it so
            far = (shifted == -math.inf) & torch.isfinite(z)
            z_far, z_top_far = torch.where(far, z, 0.0), torch.where(far, z_top, 0.0)
            grad_m = torch.where(far, g * log_norm + (g * z_top_far - g * z_far), grad_m)
            if keep is not None:
                grad_m = torch.where(keep.unsqueeze(-1), grad_m, 0.0)
        return grad, None, grad_a, None, None, None, None, grad_m, None, None, None


def _vocab_parallel_log_softmax(z, start, group):
    """``_log_softmax`` on this rank's slice of the classes: the same seven results for the local
    classes and the row's largest logit z_top (lse = z_top + log1p(s)), from three numbers per row
    reduced over the ranks (the largest logit, its first class, and s, the sum of
    exp(z_j - z_top) off that class): a MAX, a MIN and a SUM."""
    z_top, top = _first_top(z.detach(), start, group)
    is_top = start + torch.arange(z.shape[-1], device=z.device) == top
    shifted = z - z_top
    # the others' share over the top's, without the top's 1: this rank's, then every rank's
    s = torch.exp(shifted.masked_fill(is_top, -math.inf)).sum(dim=-1, keepdim=True)
    dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
    # + 0 * z_top: a row with a NaN or +inf logit (or only -inf ones) gives NaN, never a number
    log1p_s = torch.log1p(s) + 0.0 * z_top
    tiny = torch.finfo(z.dtype).tiny
    is_normal = s >= tiny
    log_s = torch.where(is_normal, torch.log(torch.where(is_normal, s, 1.0)), -math.inf)
    log_p = shifted - log1p_s
    # p = exp(z - z_top) / (1 + s): within ~1 ULP (as ``_log_softmax``)
    p = torch.exp(shifted) / (1.0 + s)
    # 1 - p_top = s / (1 + s), never formed as 1 - p
    not_p = torch.where(is_top, s / (1.0 + s), 1.0 - p)
    log_not_p = _log_not_p(p, is_top, s, log_s, log1p_s)
    return log_p, log_not_p, p, not_p, is_top, s, log1p_s, z_top


class _VocabParallelDense(torch.autograd.Function):
    """``_softmax_focal_terms`` where each rank holds a contiguous slice of the classes: the focal
    loss (gamma > 0) with a target mass on every class (probability targets, label smoothing),
    whose gradient needs a sum over the classes of every rank (jax_impl's
    ``_sharded_focal_terms``, mirrored).

    forward(z, a, keep, gamma, start, group, z_loss): z the class-last local logits [..., C_r] in
    the compute dtype (capped already with `softcap`), a the target mass of this rank's classes
    (class weight or alpha times the smoothed target), keep [...] or None; returns the row's
    loss (every rank the same) and lse. Every per-class quantity is local; the rows cross ranks
    in ``_vocab_parallel_log_softmax``'s MAX, MIN and SUM and, for the gradient
    p_j sum_{c != j} v_c - (1 - p_j) v_j (``_sum_except_self`` over the ranks), a MAX and a MIN
    of the row's largest v (its place) and one SUM of three numbers: the row's loss, the total
    of v and the sum of v off its largest entry (no cancellation). The gradient is formed in
    forward and scaled in backward (the collectives stay in forward); the target mass's own
    derivative -(1 - p_c)^gamma log p_c is local (+inf where p_c = 0, as the spec). Not twice
    differentiable.
    """

    @staticmethod
    def forward(ctx, z, a, keep, gamma, start, group, z_loss):
        log_p, log_not_p, p, not_p, is_top, s, log1p_s, z_top = _vocab_parallel_log_softmax(
            z, start, group
        )
        # (1 - p)^gamma = exp(gamma log(1 - p))
        focal_weight = torch.exp(gamma * log_not_p)
        phi = _focal_phi(log_p, p, not_p, is_top, s, log1p_s)
        v = a * focal_weight * (1.0 - gamma * phi)
        # 0 log 0 = 0: a class with no target mass contributes nothing, also when its logit is
        # -inf; logits spanning more than the largest number: ``_minus_log_p_times``
        weighted = a * focal_weight
        zero = (a == 0.0) & (log_p == -math.inf)
        local = _minus_log_p_times(weighted, log_p, z, z_top, log1p_s, zero)
        columns = [local.sum(dim=-1, keepdim=True)]
        needs_grad = ctx.needs_input_grad[0]
        if needs_grad:
            # sum_{c != j} v_c over every rank: the row's largest v and its place (a MAX and a
            # MIN), then its total and the others' sum at the largest, in the loss's SUM
            _, big = _first_top(v.detach(), start, group)
            is_big = start + torch.arange(z.shape[-1], device=z.device) == big
            columns.append(v.sum(dim=-1, keepdim=True))
            columns.append(v.masked_fill(is_big, 0.0).sum(dim=-1, keepdim=True))
        stats = torch.cat(columns, dim=-1)
        # the row's loss (and v's total and rest) over every rank's classes
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
        loss = stats[..., :1]
        # lse = z_top + log1p(s): the z-loss and ``return_aux``'s lse
        lse = z_top + log1p_s
        if z_loss != 0.0:
            loss = loss + (z_loss * lse) * lse
        grad = None
        if needs_grad:
            coefficient = torch.where(is_big, stats[..., 2:3], stats[..., 1:2] - v)
            if z_loss != 0.0:
                # d/dz_j z_loss lse^2 = 2 z_loss lse p_j, in p_j's coefficient
                coefficient = coefficient + (2.0 * z_loss) * lse
            grad = p * coefficient - not_p * v
        per_mass = far = z_far = None
        if ctx.needs_input_grad[1]:
            # d loss / d a_c = -(1 - p_c)^gamma log p_c: +inf where p_c = 0 (as the spec); where
            # z - z_top overflowed (logits spanning more than the largest number, p_c = 0: the
            # focal weight is 1) z_top - z + log1p(s), formed in backward times the incoming
            # gradient term by term (finite where a mean's 1/N makes it so)
            per_mass = -(focal_weight * log_p)
            far = (log_p == -math.inf) & torch.isfinite(z)
            z_far = torch.where(far, z, 0.0)
        loss, lse = loss.squeeze(-1), lse.squeeze(-1)
        if keep is not None:
            # ignored elements give 0 and no gradient, whatever their logits
            loss = torch.where(keep, loss, 0.0)
            lse = torch.where(keep, lse, 0.0)
            kept = keep.unsqueeze(-1)
            grad = None if grad is None else torch.where(kept, grad, 0.0)
            per_mass = None if per_mass is None else torch.where(kept, per_mass, 0.0)
            far = None if far is None else far & kept
        ctx.save_for_backward(grad, per_mass, far, z_far, z_top, log1p_s)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, grad_lse):
        grad, per_mass, far, z_far, z_top, log1p_s = ctx.saved_tensors
        g = grad_loss.unsqueeze(-1)
        grad_z = None if grad is None else grad * g
        grad_a = None
        if per_mass is not None:
            # -log p = z_top - z + log1p(s) where z - z_top overflowed, each term times g first
            far_grad = _far_loss(g, z_far, torch.where(far, z_top, 0.0), log1p_s)
            grad_a = torch.where(far, far_grad, per_mass * g)
        return grad_z, grad_a, None, None, None, None, None


class _SoftCap(torch.autograd.Function):
    """c = softcap tanh(z / softcap) (``_softcap``: -inf stays a masked class, +inf a NaN row),
    with the closed-form backward dc/dz = sech^2(z / softcap) = 4 e / (1 + e)^2,
    e = exp(-2 |z / softcap|): no 1 - tanh^2 cancellation where the logits are far beyond the
    cap (autograd's tanh backward loses every digit of sech^2 there). Works on one fresh
    temporary each way (in place where no graph of the backward is recorded)."""

    @staticmethod
    def forward(ctx, z, softcap):
        ctx.save_for_backward(z)
        ctx.softcap = softcap
        c = (z / softcap).tanh_().mul_(softcap)
        return torch.where(torch.isinf(z), z, c)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph: out of place, differentiable
            return grad * _softcap(z, ctx.softcap)[1], None
        # e = exp(-2 |x|), then sech^2 x = 4 e / (1 + e)^2, in the quotient's buffer
        e = (z / ctx.softcap).abs_().mul_(-2.0).exp_()
        denominator = (e + 1.0).square_()
        return e.mul_(4.0).div_(denominator).mul_(grad), None


def _softmax_vocab_parallel(
    logits, targets, where, class_weight, axis, gamma, ignore_index, label_smoothing, is_index,
    start, num_classes, group, z_loss, softcap, return_aux,
):  # fmt: skip
    """(the per-element loss, keep, aux) of class-sharded `logits` (this rank's slice, whose
    first class is `start`, of `num_classes`) through ``_VocabParallel``; `targets` global class
    indices or probabilities sliced like the logits, `class_weight` the global vector, `where` a
    class mask sliced like the logits (or a per-element one). `keep` the kept elements (None:
    all), `aux` the per-element statistics of ``return_aux`` (None without it)."""
    dense = not is_index or label_smoothing != 0.0
    raw = logits.movedim(axis, -1).to(_compute_dtype(logits.dtype))
    num_local = raw.shape[-1]
    dtype = raw.dtype
    keep = _softmax_keep(targets, None, ignore_index, True) if is_index else None
    local_weight = None if class_weight is None else class_weight[start : start + num_local]
    # the weight of the classes other than the target, over every rank (smoothing's m_rest)
    rest_weight = None
    valid = None
    if where is not None:
        valid = where.expand(logits.shape).movedim(axis, -1)
        columns = [valid.sum(dim=-1, keepdim=True).to(dtype)]
        if is_index:
            y = torch.where(keep, targets, 0) if keep is not None else targets
            local_y = (y - start).unsqueeze(-1)
            owns = (local_y >= 0) & (local_y < num_local)
            local_y = torch.where(owns, local_y, 0)
            at_y = valid.gather(-1, local_y) & owns
            columns.append(at_y.to(dtype))
            if label_smoothing != 0.0:
                # the smoothing's weight of the classes left, off the target
                weights = valid.to(dtype) if local_weight is None else valid * local_weight
                at = torch.where(owns, 0.0, weights.gather(-1, local_y))
                columns.append(weights.scatter(-1, local_y, at).sum(dim=-1, keepdim=True))
        stats = torch.cat(columns, dim=-1)
        # per row, over every rank: the classes left inside `where`, whether the target is one
        # of them (from the rank that owns it), and (smoothing) their weight off the target
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
        num_valid = stats[..., :1]
        # a row with no class left, or its target outside `where`, is left out like an ignored one
        left = num_valid.squeeze(-1) > 0.0
        if is_index:
            left = left & (stats[..., 1] > 0.0)
            rest_weight = stats[..., 2:]
        keep = left if keep is None else keep & left
        # classes outside `where` leave the softmax (-inf); rows left out: zeros (finite)
        kept = keep.unsqueeze(-1)
        raw = torch.where(valid & kept, raw, torch.where(kept, -math.inf, 0.0).to(dtype))
    m = m_y = m_rest = None
    if is_index:
        y = (targets if keep is None else torch.where(keep, targets, 0)).unsqueeze(-1)
        if class_weight is None:
            a_y = None if keep is None else keep.to(dtype).unsqueeze(-1)
        elif keep is None:
            a_y = class_weight[y]
        else:
            a_y = torch.where(keep.unsqueeze(-1), class_weight[y], 0.0)
    else:
        # probability targets: this rank's slice of the target mass, no one-hot part
        y = None
        a_y = raw.new_zeros(raw.shape[:-1] + (1,))
        m = targets.movedim(axis, -1).to(dtype)
        if valid is not None:
            # target mass on a class outside `where` leaves the sum (optax), it does not give +inf
            m = torch.where(valid & keep.unsqueeze(-1), m, 0.0)
    target_mass = m
    if label_smoothing != 0.0:
        # t~ = (1 - eps) t + eps / C: the target keeps (1 - eps) of its mass ...
        if is_index:
            ones = torch.ones_like(y, dtype=dtype)
            a_y = (1.0 - label_smoothing) * (ones if a_y is None else a_y)
        else:
            m = (1.0 - label_smoothing) * m
        # ... and eps / C goes to every class (inside `where`: eps / C_valid, outside 0)
        if where is None:
            uniform = label_smoothing / num_classes
        else:
            uniform = torch.where(valid, label_smoothing / num_valid.clamp_min(1.0), 0.0)
        if is_index:
            w_y = torch.ones_like(a_y) if class_weight is None else class_weight[y]
            if where is None:
                if class_weight is None:
                    rest_weight = torch.full_like(a_y, num_classes - 1.0)
                else:
                    # sum_{c != y} w_c without cancellation, from the global vector (C numbers)
                    rest_weight = _sum_except_self(class_weight.detach())[y]
                m = torch.full((num_local,), uniform, dtype=dtype, device=raw.device)
                scale = uniform
            else:
                m = uniform
                scale = label_smoothing / num_valid.clamp_min(1.0)
            m_y, m_rest = w_y * scale, rest_weight * scale
        else:
            m = m + uniform
            target_mass = m
        if is_index and local_weight is not None:
            m = m * local_weight
    if not is_index and local_weight is not None:
        # the class weight times the (smoothed) target mass
        m = m * local_weight
    z = raw
    if softcap is not None:
        # the cap is elementwise: this rank's slice capped, sech^2 of it in backward
        z = _SoftCap.apply(raw, softcap)
    if dense and gamma != 0.0:
        # the focal terms of every class (``_VocabParallelDense``): the whole target mass a_c of
        # this rank's classes, the smoothing's and (class indices) a_y at the target
        a = m.expand(raw.shape)
        if is_index:
            local_classes = start + torch.arange(num_local, device=raw.device)
            a = a + torch.where(local_classes == y, a_y, 0.0)
        if keep is not None:
            a = torch.where(keep.unsqueeze(-1), a, 0.0)
        loss, lse = _VocabParallelDense.apply(z, a, keep, gamma, start, group, z_loss)
    else:
        loss, lse = _VocabParallel.apply(
            z, y, a_y, keep, gamma, start, group, m, m_y, m_rest, z_loss
        )  # fmt: skip
    aux = None
    if return_aux:
        # the target class: the index, or the class of the largest target mass
        target = y if is_index else target_mass.detach()
        aux = _vocab_parallel_aux(raw.detach(), target, keep, lse, start, z_loss, group)
    return loss, keep, aux


def _first_top(x, start, group):
    """The row's largest entry over every rank and its global index (the first on ties; none,
    int64's largest, for a NaN row), each [..., 1]: two all-reduces of one number per row (the
    largest entry, then its first class)."""
    local_top, local_first = x.max(dim=-1, keepdim=True)
    top = local_top.clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    none = torch.iinfo(torch.int64).max
    first = torch.where(local_top == top, start + local_first, none)
    # its first class in the row: the smallest of the ranks that hold it
    dist.all_reduce(first, op=dist.ReduceOp.MIN, group=group)
    return top, first


def _vocab_parallel_aux(raw, y, keep, lse, start, z_loss, group):
    """``return_aux``'s per-element statistics over the ranks: lse and the z-term from the loss's
    own pass, and whether the largest logit (the first on ties, over every rank) is the target
    (`y` the class indices [..., 1], or the probability targets' slice of the target mass, whose
    largest entry is the target class): two (four) more all-reduces of one number per row."""
    with torch.no_grad():
        # the row's largest logit before the cap (the cap keeps the order, not every tie)
        _, first = _first_top(raw, start, group)
        if y.shape[-1] != 1 or y.is_floating_point():
            _, y = _first_top(y, start, group)
        correct = first == y
        correct = correct.squeeze(-1) if keep is None else correct.squeeze(-1) & keep
        return {"lse": lse, "z_term": z_loss * lse * lse, "correct": correct.to(lse.dtype)}


def _softmax_sharded(
    logits, targets, axis, class_weight_arg, gamma, is_focal, ignore_index, label_smoothing,
    where, reduction, normalizer, z_loss, softcap, return_aux, process_group,
):  # fmt: skip
    """``_softmax`` for class-sharded logits (DESIGN 12): this rank's slice with
    `process_group`, or a DTensor sharded on the class dim (its mesh's group for that dim)."""
    return_aux = _checks.return_aux(return_aux)
    if is_focal:
        gamma = _gamma(gamma)
        weight, alpha = None, class_weight_arg
    else:
        weight, alpha = class_weight_arg, None
    layout = None
    if _is_dtensor(logits):
        # loss_parallel's input: this rank's slice of the classes, the group of that mesh dim
        logits, targets, process_group, layout = _from_dtensor(logits, targets, axis, process_group)
    process_group = _process_group(process_group)
    local = _inputs._as_array("logits", logits)
    num_local = local.shape[_checks.class_axis(axis, local.ndim)]
    start, num_classes = _class_slice(num_local, process_group, local.device)
    logits, targets, where, class_weight, axis, ignore_index, label_smoothing, is_index = (
        _softmax_inputs(
            logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where, num_classes
        )
    )
    dense = not is_index or label_smoothing != 0.0
    if dense and class_weight is not None and class_weight.requires_grad:
        what = "alpha" if is_focal else "weight"
        raise ValueError(
            f"`{what}` must not require grad with label smoothing or probability targets and "
            "`process_group` (its gradient would be split over the ranks): detach it. "
            f"Received: a `{what}` that requires grad."
        )
    loss, keep, aux = _softmax_vocab_parallel(
        logits, targets, where, class_weight, axis, gamma, ignore_index, label_smoothing,
        is_index, start, num_classes, process_group, z_loss, softcap, return_aux,
    )  # fmt: skip
    batch_group = None if layout is None else _batch_group(layout)
    count = None
    if reduction == "mean" and normalizer is None:
        count = torch.tensor(loss.numel(), device=loss.device) if keep is None else keep.sum()
        if is_index and not is_focal and class_weight is not None:
            denominator = _kept_weight_sum(targets, keep, class_weight)
        else:
            denominator = count
        if batch_group is not None:
            # the rows split over the mesh's other dimension: the mean's denominator (and the
            # kept count of `return_aux`) of every rank's rows, one all-reduce of two numbers
            both = torch.stack([denominator.to(torch.float64), count.to(torch.float64)])
            dist.all_reduce(both, op=dist.ReduceOp.SUM, group=batch_group)
            denominator, count = both[0], both[1]
    else:
        denominator = None
    loss = _reduce(loss, reduction, _mean_divisor(denominator, normalizer)).to(logits.dtype)
    if aux is not None:
        divisor = _mean_divisor(count, normalizer)
        aux = {k: _reduce(v, reduction, divisor).to(logits.dtype) for k, v in aux.items()}
    if layout is not None:
        loss = _to_dtensor(loss, layout, reduction)
        if aux is not None:
            aux = {key: _to_dtensor(value, layout, reduction) for key, value in aux.items()}
    return loss if aux is None else (loss, aux)


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------


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
    normalizer,
    z_loss,
    softcap,
    return_aux,
    process_group,
):
    reduction, normalizer = _normalizer(reduction, normalizer)
    z_loss = _checks.z_loss(z_loss)
    softcap = _checks.softcap(softcap)
    if process_group is not None or _is_dtensor(logits):
        # the classes split over ranks (DESIGN 12)
        return _softmax_sharded(
            logits, targets, axis, class_weight_arg, gamma, is_focal, ignore_index,
            label_smoothing, where, reduction, normalizer, z_loss, softcap, return_aux,
            process_group,
        )  # fmt: skip
    if _checks.return_aux(return_aux):
        loss = _softmax(
            logits, targets, axis, class_weight_arg, gamma, is_focal, ignore_index,
            label_smoothing, where, reduction, normalizer, z_loss, softcap, False, None,
        )  # fmt: skip
        logits, targets, where, _, axis, ignore_index, _, is_index = _softmax_inputs(
            logits, targets, axis, None, None, ignore_index, label_smoothing, where, None
        )
        aux = _softmax_aux(
            logits, targets, where, axis, ignore_index, is_index, z_loss, softcap, reduction,
            normalizer,
        )  # fmt: skip
        return loss, aux
    if is_focal:
        gamma = _gamma(gamma)
        weight, alpha = None, class_weight_arg
    else:
        weight, alpha = class_weight_arg, None
    logits, targets, where, class_weight, axis, ignore_index, label_smoothing, is_index = (
        _softmax_inputs(logits, targets, axis, weight, alpha, ignore_index, label_smoothing, where)
    )
    # with a normalizer the kernel sums and the division follows: one rounding of the quotient
    # needs the sum in at least the working precision, so half precision takes the eager path
    exact_sum = normalizer is None or logits.dtype in (torch.float32, torch.float64)
    if exact_sum and _softmax_takes_triton(logits, targets, class_weight, is_index):
        # the kernel's op reduces: torch's weighted mean for the weighted cross entropy with class
        # indices, the kept elements otherwise (0 kept: a mean of 0)
        weighted = is_index and not is_focal and class_weight is not None
        kernel_reduction = "sum" if normalizer is not None else reduction
        loss = _softmax_triton(
            logits, targets, class_weight, axis, gamma, ignore_index, weighted, kernel_reduction,
            z_loss, softcap, where, label_smoothing,
        )  # fmt: skip
        if normalizer is not None:
            loss = _reduce(loss, reduction, normalizer).to(logits.dtype)
        return loss
    # the LLM head options (DESIGN 13) ride in each path's own passes
    if _at_target(logits, class_weight, label_smoothing, is_index):
        loss = _softmax_at_target(
            logits, targets, where, class_weight, axis, gamma, ignore_index, z_loss, softcap
        )
    else:
        loss = _softmax_focal_loss(
            logits, targets, where, class_weight, axis, gamma, ignore_index, label_smoothing,
            z_loss, softcap,
        )  # fmt: skip
    return _softmax_reduce(
        loss, logits, targets, where, class_weight, axis, ignore_index, is_index, is_focal,
        reduction, normalizer,
    )  # fmt: skip


def _softmax_aux(
    logits, targets, where, axis, ignore_index, is_index, z_loss, softcap, reduction, normalizer
):
    """``return_aux``'s statistics (``spec._aux``): per-element lse of the capped logits, the
    z-term and whether the largest logit is the target class (0 where not kept), reduced as the
    spec says, in the logits' dtype; no gradient flows through them."""
    with torch.no_grad():
        if targets.is_floating_point():
            targets = targets.detach()
        z, a, y, _, keep, _ = _softmax_targets(
            logits.detach(), targets, where, None, axis, ignore_index, 0.0
        )
        c, _ = _softcap(z, softcap)
        lse = torch.logsumexp(c, dim=-1)
        # the largest logit (the first on ties) on the target class; for probability targets
        # the class of the largest target mass
        target_class = y.squeeze(-1) if is_index else torch.argmax(a, dim=-1)
        correct = torch.argmax(z, dim=-1) == target_class
        if keep is not None:
            correct = correct & keep
            lse = torch.where(keep, lse, 0.0)
        stats = {"lse": lse, "z_term": z_loss * lse * lse, "correct": correct.to(lse.dtype)}
        count = lse.numel() if keep is None else keep.sum()
        divisor = _mean_divisor(count, normalizer)
        return {
            key: _reduce(value, reduction, divisor).to(logits.dtype) for key, value in stats.items()
        }


def _kept_weight_sum(targets, keep, class_weight):
    """torch's weighted mean's denominator: the class weights of the kept targets, summed."""
    if keep is None:
        return class_weight[targets].sum()
    return torch.where(keep, class_weight[torch.where(keep, targets, 0)], 0.0).sum()


def _softmax_reduce(
    loss, logits, targets, where, class_weight, axis, ignore_index, is_index, is_focal, reduction,
    normalizer,
):  # fmt: skip
    """`reduction` of the per-element losses, in the logits' dtype: torch's weighted mean for
    the weighted cross entropy, the kept elements' mean otherwise, or sum / `normalizer`."""
    if reduction != "mean" or normalizer is not None:
        denominator = None
    else:
        valid = None if where is None else where.expand(logits.shape).movedim(axis, -1)
        keep = _softmax_keep(targets, valid, ignore_index, is_index)
        if is_index and not is_focal and class_weight is not None:
            denominator = _kept_weight_sum(targets, keep, class_weight)
        elif keep is not None:
            # plain mean over the kept elements (probability targets: those with a class left)
            denominator = keep.sum()
        else:
            denominator = loss.numel()
    loss = _reduce(loss, reduction, _mean_divisor(denominator, normalizer))
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
    normalizer: Tensor | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    return_aux: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> Tensor | tuple[Tensor, dict]:
    """Softmax cross entropy, torch ``F.cross_entropy`` semantics (``spec.softmax_cross_entropy``).

    Differs from the spec: class axis default 1 (torch layout); the result is a tensor in the
    logits' dtype (half precision computed in float32); the gradient is the spec's closed form.
    A mean over no kept element is 0 (torch: NaN). `normalizer` (a number or a 0-d tensor, never
    read on the host; one that requires grad raises) replaces the mean's divisor, as in the spec.

    Vocab-parallel (DESIGN 12, docs/scaling.md): with `process_group`, `logits` is this rank's
    slice of the classes (contiguous, in rank order, sizes may differ) and `targets` are global
    class indices; `weight` is the global vector (length: all ranks' classes). Per row, three
    numbers cross ranks (two ``all_reduce`` calls: the max, then the target's logit and the sum of
    exponentials); no row is gathered, and backward communicates nothing. Every rank gets the
    same loss and its slice's gradient. A DTensor `logits` sharded on the class axis of a 1-D
    mesh, or of a 2-D data x vocab mesh, works without `process_group`, as ``loss_parallel``
    does (the loss a DTensor replicated over the vocab dim, Partial or sharded over the data dim).
    `z_loss`, `softcap`, `return_aux`, `label_smoothing` and `where` (sliced like the logits)
    work there too (label smoothing adds one number per row, `where` one all-reduce), and
    probability targets sliced like the logits (the focal loss with them or with smoothing only
    at gamma = 0); not twice differentiable. `z_loss` and `softcap` (DESIGN 13, see the spec)
    ride in each path's own passes (the Triton kernel, the class-index fast path, the dense
    closed form; over a process group the local slice capped, lse from the row's own sums).
    `return_aux=True` returns (loss, {'lse', 'z_term', 'correct'}) as the spec, in the logits'
    dtype (one more logsumexp pass, no gradient).
    """
    return _softmax(
        logits,
        targets,
        axis,
        weight,
        0.0,
        False,
        ignore_index,
        label_smoothing,
        where,
        reduction,
        normalizer,
        z_loss,
        softcap,
        return_aux,
        process_group,
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
    normalizer: Tensor | float | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    return_aux: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> Tensor | tuple[Tensor, dict]:
    """Softmax focal loss (see ``spec.softmax_focal_loss``), class axis default 1.

    Result in the logits' dtype (half precision computed in float32), closed-form gradient,
    bounded for every gamma >= 0. `process_group` (class-sharded logits, global targets, the
    global `alpha` vector): as in ``softmax_cross_entropy``, the same three numbers per row
    (with label smoothing or probability targets at gamma > 0, the focal terms of every class:
    six all-reduces of one to three numbers per row, docs/scaling.md).
    `z_loss`, `softcap`: as ``softmax_cross_entropy``.
    """
    return _softmax(
        logits,
        targets,
        axis,
        alpha,
        gamma,
        True,
        ignore_index,
        label_smoothing,
        where,
        reduction,
        normalizer,
        z_loss,
        softcap,
        return_aux,
        process_group,
    )
