"""Judging a candidate's value and gradient against the float64 spec: two derived standards.

The candidate saw inputs in its own dtype; the reference is ``dualloss.spec`` in float64 evaluated
on exactly those inputs (already rounded). What remains is the error of the candidate's arithmetic
in its working precision, with unit roundoff u:

    u = 2**-53 (float64), 2**-24 (float32), 2**-11 (float16), 2**-8 (bfloat16).

Two standards (DESIGN.md section 8), chosen by ``judge(..., standard=...)``:

Strict (``"strict"``: dualloss's own backends, the parity suite and the tests)
------------------------------------------------------------------------------

Every value and every gradient entry is within a few ULPs of its own magnitude, beyond the spread
that moving the inputs by one ULP causes. Per entry r (the spec's value or gradient entry):

    tolerance = STRICT_ULPS ulp(r) + spread + STRICT_FORGIVEN * TINY * (1 + g) * max|weights|

* ``STRICT_ULPS`` = 8: the backend's own rounding on its longest chain (the focal gradient: exp,
  log1p, a power, three products, a class sum; up to 4 ULP) plus the float64 reference's (the
  spec is within 3.25 ULP of a 50-digit mpmath oracle, ``tests/test_spec_accuracy.py``). ulp(r)
  is the spacing of the dtype's numbers at |r|, so a tiny loss is judged at its own scale: a
  confident row's loss exp(-20) = 2e-9 returned as 0 in float32 is 1e7 ULPs off and fails.
* ``spread``: what an error of one ULP in each input causes, to first order. Every shift-first
  algorithm rounds z_c - z_top (absolute error u |z_c - z_top| <= ulp(z_c) + ulp(z_top)), which is
  the same as moving the inputs; a backend cannot do better than that, and needs no more.
  - softmax losses, with delta_c = ulp(z_c) and the gradient g_j = p_j S - v_j, S = sum_c v_c
    (v from DESIGN.md): |dp_c| <= p_c (q_c delta_c + sum_{k != c} p_k delta_k), q_c = 1 - p_c
    (the sum over the others formed directly for the largest p, the only one near 1), so
      value spread    = sum_c |df/dz_c| delta_c  (the spec's gradient),
      gradient spread = |dp_j| |S| + p_j sum_c |v'_c| |dp_c| + |v'_j| |dp_j|,
    with v'/a = -2 g q^(g-1) - g q^(g-1) log p + g (g-1) p q^(g-2) log p (0 for cross entropy),
    formed in log space so that 0 * inf never occurs. Where more than one class carries target
    mass (label smoothing, soft targets), the mass a_c is itself rounded and the class sums
    S = sum_c v_c and sum_c a_c (...) have n_c terms: both add (1 + ceil(log2 n_c)) u times the
    sum of the terms' magnitudes (pairwise summation, Higham, Accuracy and Stability, section
    4.2; torch's and XLA's reductions are blocked and pairwise-like).
  - sigmoid losses (element-wise): the largest change of the spec's value and gradient entry when
    the logit moves by one ULP either way, or a soft target (0 < t < 1) by one ULP of t or of 1 - t
    (the quantity an implementation rounds), evaluated by the spec itself. Hard targets 0 and 1
    are exact in every implementation and are not moved: t = 1 moved by u would move the loss by
    u |x| and forgive a confident element's whole loss.
* reductions: a sum of n per-element losses adds (1 + ceil(log2 n)) u sum_i |l_i| (pairwise
  summation), divided by the mean's denominator, as does every spread.
* differences below the working precision's smallest normal TINY are forgiven (XLA:CPU and GPUs
  flush subnormal results to zero), scaled by the factors that can multiply an underflowed
  intermediate (1 + gamma, the class weights or alpha).
* float16 and bfloat16 are computed in float32 and rounded once: the tolerance is the float32
  one (u, ulp and TINY of float32, the inputs moved by one float32 ULP) plus one ULP of the half
  dtype (its smallest normal for a result below that, which the rounding may flush to zero).
  A dropped focal term, a wrong smoothing denominator or log(1 + s) for log1p(s) is far outside
  it in every dtype (``docs/mutation.md``).
* on accelerators (docs/devices.md) nothing is loosened per device. CUDA's float32 exp, log,
  log1p, expm1 are within 1-2 ULP, like the CPU libraries the backend's 4 ULP assume (``pow``
  is up to ~4 ULP, which is why the losses form powers as exp(g log(1 - p))). Reductions on a
  GPU may sum in another order from run to run (XLA:GPU tree shapes): the pairwise term bounds
  every tree order; a sum in an order outside it (atomics) that loses more fails on that device
  and is reported for it, each run judged on its own. Matmul precision is pinned for judged runs
  (``allow_tf32=False``, JAX ``highest``): a TF32 dot has u = 2**-11 and fails by design.

Practical (``"practical"``: the default of ``parity.check``, for users' code)
-----------------------------------------------------------------------------

The base of the practical standard is a first-order forward error bound of the textbook,
log-space algorithm, written as
``tolerance = K * u * (|reference| + scale)``, where ``scale`` collects, term by term, how much an
error of u in each elementary operation can move the result:

Softmax losses (per element, classes c; a_c = class weight x smoothed target mass, w_c = (1-p_c)^g,
kappa_c = |z_c - z_top| the shifted logit, which an implementation rounds with absolute error
u * kappa_c before exponentiating):

* log p_c = (z_c - z_top) - log(sum_j exp(z_j - z_top)) carries an absolute error of
  u (1 + kappa_c + |log p_c|);
* w_c = exp(g log(1 - p_c)) carries a relative error of u g (1 + |log(1 - p_c)|);
* so  value scale = sum_c a_c w_c (1 + kappa_c + |log p_c|) (1 + g (1 + |log(1 - p_c)|)).

  The gradient g_j = p_j sum_{c != j} v_c - (1 - p_j) v_j (v from DESIGN.md) is a difference of two
  products; p_j has relative error u (1 + kappa_j), v_c relative error u (1 + g (1 + |log(1-p_c)|)).
  With V_c = |v_c| (1 + kappa_c) (1 + g (1 + |log(1 - p_c)|)):
  grad scale_j = p_j (1 + kappa_j) sum_c V_c + V_j.

* Class sums (added after the parity suite measured F.cross_entropy with label smoothing at
  C = 32771 in float64, 1.2e4 ULPs off in one gradient entry): sum_c a_c (...) and sum_c v_c run
  over every class with target mass, all C of them with label smoothing or dense soft targets.
  Recursive summation of n terms has error up to (n - 1) u sum |terms| (Higham, Accuracy and
  Stability, Thm 4.2), and torch's CPU reductions are close to recursive per SIMD lane (the
  measured error was ~C/4 u). So with n_c the number of classes with a_c != 0, the value scale
  gets (n_c - 1) sum_c a_c w_c |log p_c| and sum_c V_c gets (n_c - 1) sum_c |v_c|. For class
  index targets without smoothing n_c = 1 and nothing changes.

  This base is deliberately absolute where the loss is tiny (the strict standard is not): a
  confident, correct prediction with cross entropy exp(-20) has scale ~ w_y, so
  ``torch.nn.functional.cross_entropy`` in float32, which returns 0 there (log(1 + s) rounds to
  0), is within it, as it should be for users' code: the error is below u times the natural size
  of the computation. A NaN, an inf, a bias from ``log(p + eps)`` or
  ``clip`` on a non-tiny probability, or a wrong formula are far outside it.

Sigmoid losses (per element; x the logit, t the target, q = pos_weight, w = weight):

* cross entropy: value scale = |w| (|1 - t| + |q t|) (1 + |x|) (the products t x and the softplus
  arguments are rounded with absolute error u |x|); grad scale = 2 |w| (|1 - t| + |q t|).
* focal: m = (1 - p_t)^g, r = p(1 - p)/(1 - p_t); value scale = alpha_t m (1 + |x|)
  (1 + g (1 + |log(1 - p_t)|)); grad scale = (1 + g) times the value scale.

Reductions add the error of summing n terms pairwise, (1 + ceil(log2 n)) u sum_i |l_i|, and the
division by the mean's denominator; gradients of a mean are the element gradients divided by it.

Underflow (added after the parity suite measured optax on XLA:CPU): the model above,
fl(x op y) = (x op y)(1 + delta), holds only for results in the normal range. The full model is
fl(x op y) = (x op y)(1 + delta) + eta, with |eta| up to the smallest normal number of the
working precision when the hardware flushes subnormal results to zero (XLA:CPU and GPUs run with
FTZ/DAZ) and half a subnormal spacing otherwise. A probability exp(-90) is 8e-40 in float32:
subnormal, so ``softmax - onehot`` flushes it to 0 and a gradient entry of 1e-39 comes back as 0,
an error of "1e6 ULPs" of a subnormal that no float32 algorithm on such hardware can avoid. So
every value and gradient entry gets an absolute term K * TINY * (1 + g) * max(1, |weights|),
TINY the dtype's smallest normal number (the weights and the focal factor 1 + g multiply an
underflowed intermediate at most that much); a reduced value gets it once per element, divided by
the mean's denominator. This is below every ULP of the normal range, so it never hides a NaN, a
bias, or a lost normal-range gradient.

K = 8 covers the handful of correctly rounded operations (exp, log1p, the subtraction, the
products, the final rounding to the output dtype) that each contribute up to u, with a factor ~2
for library functions that are accurate to 1-2 ULP rather than 0.5. It is the same for every dtype,
loss and input region: there is no per-case fudge.

On top of that base, the candidate need not be forward-accurate, only backward stable and
accurate at the scale of its whole result. An algorithm is backward stable when its result is
the exact result for inputs x~ with |x~_i - x_i| <= c u |x_i|; to first order its error is then
at most ``sum_i |df/dx_i| c u |x_i|`` (Higham, Accuracy and Stability, section 1.5). So the
tolerance gets more terms:

- value: K u sum_i |df/dx_i| |x_i|, with df/dx the spec's own closed-form gradient (per element
  for reduction 'none', summed over the class axis; over every logit for a reduced value). This
  is what rounding the inputs already implies: ``lse(z) - z_y`` in float32 at logits of 800
  returns log 2 with an error of ~800 u, and the allowance is 8 u (0.5 * 800 + 0.5 * 800).
- gradient: the same argument with the Hessian in place of df/dx. The error model above already
  charges each shifted logit kappa_c = |z_c - z_top| an absolute error u kappa_c; perturbing
  every input by u |x_i| moves z_c - z_top by at most u (|z_c| + |z_top|), so the practical
  gradient scale is the one above with kappa_c + |z_c| + |z_top| in place of kappa_c (sigmoid:
  the grad scale times (1 + |x|), as |d sigma / dx| <= 1/4 and |x| enters once).
- focal losses: the textbook forms 1 - p from p, an absolute error of u p in q = 1 - p, so the
  focal weight q^g and v_c = a_c (q^g - g q^(g-1) p log p) are allowed the change from q to
  q + u p, computed exactly: value K sum_c a_c |(q + u p)^g - q^g| |log p_c|, gradient
  K (p_j sum_c |dv_c| + |dv_j|). For g >= 1 this covers the loss of 1 - p = 8e-9 at margin 20
  (it rounds to 0 in float32, so the textbook returns 0 where the truth is 1e-24); for g < 1
  the textbook's gradient there is inf, a hazard.
- both: K u max|result| over the whole value (or gradient) tensor. A gradient of 0 where the
  truth is 1.7e-24, next to entries of 0.1, is a rounding of that tensor, not a bug.

- a mean over zero elements (every target ignored) is 0 / 0: dualloss defines it as 0
  (DESIGN.md section 5), torch as NaN. A NaN there with finite gradients is not a non-finite
  failure but a hazard of its own kind, ``ALL_IGNORED_NAN`` (issue 28: a NaN loss summed across
  micro-batches ruins a run), which the user may accept; a NaN gradient there is non-finite.

What still fails: anything non-finite where the math is finite, and anything wrong at its own
scale: ``log(p + 1e-8)`` returns 18.4 where a confidently wrong row's loss is 100 (error 82,
allowance ~1e-4) with a vanishing gradient (error ~1 at entries of size ~1), and clamping the
logits to +-1e3 is wrong by the margin beyond 1e3.

LLM head options (practical; DESIGN 13, issue 30)
-------------------------------------------------

With ``softcap`` the loss is taken of c = cap tanh(z / cap) and every scale above is that of c
(kappa_c from the capped logits); ``_head_option_scales`` adds:

* z-loss z_loss lse(c)^2: lse has absolute error u (1 + |c_top| + |lse|), so the value gets
  z_loss |lse| (|lse| + 2 (1 + |c_top| + |lse|)) and the gradient 2 z_loss lse p_j gets
  2 z_loss p_j (|lse| (1 + kappa_j) + 1 + |c_top| + |lse|);
* cap: the gradient w.r.t. z is dl/dc sech^2(z / cap), so the gradient scale is the one of c
  times sech^2(x), x = z / cap, plus |dl/dc| (2 + 2 |tanh x| |x| sech^2(x)): sech^2 computed as
  1 - tanh^2 (its usual form) carries 2 u absolutely, and moving z by u |z| (the
  backward-stable allowance relative to z) moves it by 2 |tanh x| sech^2(x) |x| u. The focal
  allowance of the gradient below comes back times sech^2(x) too. The value needs nothing
  more: cap |tanh x| = |c| >= sech^2(x) |z|, so the |c| in kappa covers how far the inputs'
  rounding moves c, and the value's backward-stable term below uses the spec's gradient w.r.t.
  z (through the cap) times |z|.

So a hand-written ``cap * tanh(z / cap)`` before ``F.cross_entropy`` passes where it is right
(its 1 - tanh^2 is 0 in float32 beyond |x| = 9, where sech^2 < 6e-8: within the 2 u), and its
-inf masks, which the cap turns into -cap, fail at the result's scale.

Gradients w.r.t. targets and options (both standards; ``judge(input_grads=...)``)
--------------------------------------------------------------------------------

``parity.check`` also judges the gradient w.r.t. probability targets and w.r.t. the options a
candidate takes as arguments (weight, alpha, gamma, pos_weight, label_smoothing) against
``spec.<loss>_grad(wrt=...)``. Each of them is a sum of the pieces the value is made of, so the
error model is the value's, per piece, with that gradient's coefficient:

* softmax: every one is built from the loss per unit of mass g_c = -(1 - p_c)^g log p_c, whose
  error model is the value's per class, U_c = (1 - p_c)^g (1 + kappa_c + |log p_c|)
  (1 + g (1 + |log(1 - p_c)|)) (kappa_c with the inputs' own rounding, as in the practical
  base). The coefficients: targets (1 - eps) |w_c| (per entry, no sum); a class vector (weight,
  alpha) |t~_c| summed over the elements; a scalar alpha the same over everything; gamma
  |a_c| (1 + |log(1 - p_c)|) (the extra factor: log(1 - p) is itself computed); label smoothing
  |w_c| |u_c - t_c| (u the uniform share). Weighted index cross entropy with 'mean' is a
  quotient, dL/dw_c = S_c / D - n_c T / D^2: the second term adds n_c sum_k |w_k| scale_k / D.
* sigmoid (per element, x the logit): cross entropy, targets |w| (1 + |q|) (1 + |x|), weight
  (|1 - t| + |q t|) (1 + |x|), pos_weight |w t| (1 + |x|); focal, with base = (1 - p_t)^g
  (1 + |x|) (1 + g (1 + |log(1 - p_t)|)): targets (|2 alpha - 1| + |alpha_t|) (1 + g) base,
  gamma |alpha_t| base (1 + |log(1 - p_t)|), alpha |2t - 1| base. The |x| is both the rounding
  of x itself and what d ce / dt = -x carries.
* a sum over n terms (every option gradient but the targets') adds pairwise summation,
  (1 + ceil(log2 n)) u sum |terms|, each term's scale bounding its size: the summed scale is
  (2 + ceil(log2 n)) sum scale.
* practical: K u (|reference| + scale / divisor) + K u max|gradient| + the underflow term +
  the rounded-probability allowance of the next section;
  strict: STRICT_ULPS ulp(reference) + u scale / divisor + STRICT_FORGIVEN TINY (1 + g)
  max|weights| (one rounding of each piece at its size plus the one-ULP input spread, which the
  kappa_c and |x| terms carry), and for float16 / bfloat16 the float32 tolerance plus one
  rounding to the half dtype, as for the logits gradient.
* the scales are formed times 2**-16 (exact), so that logits near half the float64 range do
  not overflow them, and u is divided by it again.

One allowance for every judged quantity (practical; issue 28)
-------------------------------------------------------------

The textbook focal loss forms 1 - p from a rounded p: q = 1 - p carries an absolute error u p,
which no input rounding explains and which is largest exactly where q is tiny (a confident,
correct element). Every judged quantity of a focal loss gets the change this causes, derived
once: r = max(|((q + u p) / q)^g - 1|, |((q + u p) / q)^(g - 1) - 1|), the relative change of the
focal weight q^g and of its derivative g q^(g - 1) (``_rounded_probability``), times the size of
the terms that carry them:

* softmax value and logit gradient: ``_textbook_focal_allowance`` (the exact change of q^g and
  of v_c);
* sigmoid value: r |loss|; logit gradient: r (|m' ce dq/dx| + |m dce/dx|)
  (``_sigmoid_focal_terms``);
* target and option gradients (weight, alpha, gamma, pos_weight, label_smoothing): r times that
  gradient's terms, m_c |log p_c| (1 + |log(1 - p_c)|) per class (softmax) or m (1 + |x|)
  (1 + |log(1 - p_t)|) per element (sigmoid), with the coefficients and sums of the section
  above.

So torchvision's ``ce * (1 - p_t) ** gamma`` at x = -20, t = 0 in float64 (its target gradient
off by a relative u / p = 6e-8, as its value is) passes, and a target gradient that lacks a term
(the focal weight detached) still fails: r is below 2 g u wherever p <= 1/2, where such a term is
of the gradient's own size. Cross entropy (g = 0) gets nothing from it.

A gradient the candidate cannot give (autograd returns none, or differentiating raises) is not
judged: ``check`` lists it as "gradient w.r.t. ... not available" with a reproducer.

A true result beyond the dtype's largest number (a float32 gradient of 5.1e38) returned as inf of
its sign is that result correctly rounded, not a failure.

A non-finite candidate value or gradient where the spec is finite is a failure of its own kind
("non-finite"), never an accuracy failure; so is a finite candidate where the spec is NaN or inf
("hidden non-finite"): NaN logits must propagate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import losses

UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
SMALLEST_SUBNORMAL = {
    "float64": 2.0**-1074,
    "float32": 2.0**-149,
    "float16": 2.0**-24,
    "bfloat16": 2.0**-133,
}
SMALLEST_NORMAL = {
    "float64": 2.0**-1022,
    "float32": 2.0**-126,
    "float16": 2.0**-14,
    "bfloat16": 2.0**-126,
}
LARGEST = {
    "float64": float(np.finfo(np.float64).max),
    "float32": float(np.finfo(np.float32).max),
    "float16": 65504.0,
    "bfloat16": (2.0 - 2.0**-7) * 2.0**127,
}
MANTISSA_BITS = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}
K = 8.0
# an error above this fraction of its result's largest entry (2 ULPs of float16 there) is "wrong
# at the result's scale": it shows in the loss or gradient a user logs, in any dtype. ``check``
# reports those before the errors that only a tolerance of a few ULPs catches
VISIBLE = 2.0**-10
# "strict": dualloss's own backends; "practical": users' code (`parity.check`)
STANDARDS = ("strict", "practical")
# the kind of a call whose mean over an all-ignored batch is NaN (0 / 0) with finite gradients
# (issue 28): a hazard of its own, which ``check(skip=(ACCEPT_ALL_IGNORED_NAN,))`` accepts
ALL_IGNORED_NAN = "NaN loss on an all-ignored batch"
ACCEPT_ALL_IGNORED_NAN = "all_ignored_nan"
ALL_IGNORED_NAN_NOTE = (
    "the value is NaN on a batch whose every target is ignored (a mean over zero elements, "
    "0 / 0; the spec gives 0) while the gradients are finite. torch's F.cross_entropy does the "
    "same by design; an all-ignored micro-batch is routine in LLM training (padding, prompt-only "
    "sequences) and a NaN loss logged or summed across micro-batches ruins the run. "
    f"skip=({ACCEPT_ALL_IGNORED_NAN!r},) accepts it (the gradients there are still judged)"
)

LOSSES = losses.NAMES


def dtype_name(dtype: Any) -> str:
    """'float32' for np.float32, torch.float32, jnp.float32, 'float32', ..."""
    name = str(dtype).replace("torch.", "").replace("<class '", "").replace("'>", "")
    name = name.split(".")[-1]
    if name not in UNIT_ROUNDOFF:
        raise ValueError(
            f"`dtype` must be one of {sorted(UNIT_ROUNDOFF)}. Received: dtype={dtype!r}."
        )
    return name


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of `dtype` numbers at |x| (the smallest subnormal near 0), as float64."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    bits = MANTISSA_BITS[dtype]
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent = np.floor(np.log2(np.where(x > 0, x, 1.0)))
    spacing = np.exp2(exponent - bits)
    return np.maximum(np.where(np.isfinite(x), spacing, np.inf), SMALLEST_SUBNORMAL[dtype])


# ----------------------------------------------------------------------------------------------
# Per-element scales
# ----------------------------------------------------------------------------------------------


def _softmax_scales(info, elements, options):
    """Per-element value scale (logits shape less the class axis) and grad scale (logits shape)
    of the practical base; the shifted logits also carry the inputs' own rounding,
    u (|z_c| + |z_top|)."""
    gamma = info.gamma(options)
    with np.errstate(all="ignore"):
        terms = elements.terms
        z = elements.z
        a = np.abs(elements.a)
        z_top = np.max(z, axis=-1, keepdims=True)
        kappa = np.where(np.isfinite(z), np.abs(z - z_top), 0.0)
        top = np.where(np.isfinite(z_top), np.abs(z_top), 0.0)
        kappa = kappa + np.where(np.isfinite(z), np.abs(z), 0.0) + top
        log_not_p = terms.log_not_p
        focal_weight = terms.focal_weight
        power_error = 1.0 + gamma * (1.0 + np.abs(np.where(np.isfinite(log_not_p), log_not_p, 0.0)))
        finite_log_p = np.where(np.isfinite(terms.log_p), np.abs(terms.log_p), 0.0)
        terms_scale = np.where(
            a == 0.0, 0.0, a * focal_weight * (1.0 + kappa + finite_log_p) * power_error
        )
        # the class sums over the n_c classes with target mass (n_c = C with label smoothing)
        # carry the recursive-summation error (n_c - 1) u sum |term| (Higham, Thm 4.2)
        n_terms = np.sum(a != 0.0, axis=-1, keepdims=True)
        extra = np.maximum(n_terms - 1, 0)
        value_scale = np.sum(terms_scale, axis=-1) + extra[..., 0] * np.sum(
            np.where(a == 0.0, 0.0, a * focal_weight * finite_log_p), axis=-1
        )
        # v = a for gamma = 0; |v| because a weight or alpha may be negative in users' options
        v = np.abs(terms.v)
        big_v = v * (1.0 + kappa) * power_error
        sum_v = np.sum(big_v, axis=-1, keepdims=True) + extra * np.sum(v, axis=-1, keepdims=True)
        grad_scale = terms.p * (1.0 + kappa) * sum_v + big_v
        value_scale, grad_scale = _head_option_scales(elements, value_scale, grad_scale, kappa, top)
        value_scale = np.where(elements.keep, value_scale, 0.0)
        grad_scale = np.where(elements.keep[..., None] & elements.valid, grad_scale, 0.0)
    return value_scale, np.moveaxis(grad_scale, -1, elements.axis)


def _head_option_scales(elements, value_scale, grad_scale, kappa, top):
    """The practical scales (in units of u, class axis last for the gradient) with what the LLM
    head options add (DESIGN 13; unchanged without them), module docstring "LLM head options".

    z-loss: lse carries the absolute error of the log-sum-exp, u (1 + |c_top| + |lse|); the
    value z_loss lse^2 then moves by 2 z_loss |lse| times it plus its own rounding u z_loss lse^2,
    its gradient 2 z_loss lse p_j by 2 z_loss (|lse| |dp_j| + p_j |dlse|), p_j with relative
    error u (1 + kappa_j) as in the base. Cap: every scale above is in the capped logits c; the
    gradient w.r.t. the logits is dl/dc times dc/dz = sech^2(x), x = z / cap, so its scale comes
    back times sech^2(x), plus the error of sech^2 itself: 2 u absolute (1 - tanh^2, its usual
    form, rounds tanh^2 near 1) and, backward-stable relative to z (z moved by u |z|), the
    change 2 |tanh x| sech^2(x) |x| u, both times |dl/dc|. The value needs nothing more: the
    shifted logits already carry |c|, and |c| = cap |tanh x| >= sech^2(x) |z|, what the
    inputs' own rounding moves c by."""
    terms = elements.terms
    if elements.z_loss != 0.0:
        lse = np.abs(np.where(np.isfinite(terms.lse), terms.lse, 0.0))[..., None]
        dlse = 1.0 + top + lse
        value_scale = value_scale + elements.z_loss * (lse * (lse + 2.0 * dlse))[..., 0]
        grad_scale = grad_scale + 2.0 * elements.z_loss * terms.p * (lse * (1.0 + kappa) + dlse)
    if elements.dcap is None:
        return value_scale, grad_scale
    raw = elements.logits
    x = np.where(np.isfinite(raw), raw, 0.0) / elements.softcap
    dcap_error = 2.0 + 2.0 * np.abs(np.tanh(x)) * np.abs(x) * elements.dcap
    return value_scale, grad_scale * elements.dcap + np.abs(elements.capped_grad) * dcap_error


def _sigmoid_scales(info, elements, options):
    """Per-element value and grad scales (logits shape) of a sigmoid loss in the practical base;
    the gradient also moves by the inputs' own rounding u |x| (times (1 + |x|))."""
    gamma = info.gamma(options)
    with np.errstate(all="ignore"):
        x, t = elements.x, elements.t
        if elements.focal is None:
            mass = np.abs(elements.w) * (np.abs(1.0 - t) + np.abs(elements.q) * np.abs(t))
            return mass * (1.0 + np.abs(x)), 2.0 * mass * (1.0 + np.abs(x))
        focal = elements.focal
        log_not_pt = focal.log_not_pt
        power_error = 1.0 + gamma * (1.0 + np.abs(np.where(np.isfinite(log_not_pt), log_not_pt, 0)))
        base = np.abs(focal.alpha_t) * focal.focal_weight * (1.0 + np.abs(x)) * power_error
        return base, base * (1.0 + gamma) * (1.0 + np.abs(x))


_SCALES = {"softmax": _softmax_scales, "sigmoid": _sigmoid_scales}


# ----------------------------------------------------------------------------------------------
# The strict standard (dualloss's own backends)
# ----------------------------------------------------------------------------------------------

HALF = ("float16", "bfloat16")
# "a few ULPs" (module docstring): the backend's own rounding, up to 4 ULP on its longest chain
# (the focal gradient), plus the float64 reference's, up to 4 ULP (measured: 3.25 against mpmath)
STRICT_ULPS = 8.0
# a difference below the smallest normal number, times how much the loss can scale it up
STRICT_FORGIVEN = 2.0
# the soft-capped logit c = cap tanh(logits / cap) as computed, in ULPs of c (``_softmax_spreads``)
CAP_ULPS = 3.0


def _softmax_spreads(info, elements, options, dtype):
    """The first-order change of each per-element value (logits shape less the class axis) and
    gradient entry (logits shape) when every logit moves by one ULP of `dtype` and the target
    mass a_c by a relative u (module docstring, "strict"); float64."""
    gamma = info.gamma(options)
    u = UNIT_ROUNDOFF[dtype]
    with np.errstate(all="ignore"):
        terms = elements.terms
        z = elements.z
        finite = np.isfinite(z)
        delta = np.where(finite, ulp(np.where(finite, z, 0.0), dtype), 0.0)
        dcap = elements.dcap
        if dcap is not None:
            # soft-capping: z holds c = cap tanh(x), x = logits / cap. A one-ULP logit moves c by
            # dcap ulp(logit), and c itself is computed: fl(cap fl(tanh(fl(x)))) is within
            # CAP_ULPS ulp(c) of it (the quotient's rounding moves c by cap sech^2(x) |x| u / 2
            # <= ulp(c) / 4, the library tanh 2 ULPs of tanh as exp and log above, the product
            # half an ULP), which acts on the softmax as an input moved that much: the
            # shifted-logit argument above holds for c with that delta
            raw = elements.logits
            raw_delta = np.where(finite, ulp(np.where(finite, raw, 0.0), dtype), 0.0)
            delta = CAP_ULPS * delta + dcap * raw_delta
        p = np.where(finite, terms.p, 0.0)
        log_p, log_q = terms.log_p, terms.log_not_p
        q = np.exp(log_q)
        a = np.abs(elements.a)
        v = terms.v
        # |dp_c| <= p_c (q_c delta_c + sum_{k != c} p_k delta_k); the sum over the others is
        # formed directly for the largest p (the only one that can be close to 1)
        weighted = p * delta
        total = np.sum(weighted, axis=-1, keepdims=True)
        num_classes = z.shape[-1]
        is_top = np.arange(num_classes) == np.argmax(p, axis=-1)[..., None]
        rest_of_top = np.sum(np.where(is_top, 0.0, weighted), axis=-1, keepdims=True)
        others = np.where(is_top, rest_of_top, np.maximum(total - weighted, 0.0))
        log_dp = log_p + np.log(q * delta + others)
        dp = np.where(finite, np.exp(log_dp), 0.0)
        # value: sum_c |df/dz_c| delta_c, with df/dz_c = p_c sum(v) - v_c (+ the z-term's part)
        grad_terms = np.abs(terms.grad if elements.capped_grad is None else elements.capped_grad)
        # gradient: g_j = p_j S - v_j, S = sum_c v_c, v_c a function of p_c (focal):
        # |dg_j| <= |dp_j| |S| + p_j sum_c |v'_c| |dp_c| + |v'_j| |dp_j|, with
        # v'/a = -2 g q^(g-1) - g q^(g-1) log p + g (g-1) p q^(g-2) log p (formed in log space)
        big_s = np.abs(np.sum(v, axis=-1, keepdims=True))
        if gamma == 0.0:
            dv = np.zeros_like(dp)
        else:
            log_a = np.log(a)
            abs_log_p = np.abs(log_p)
            first = np.exp(
                log_a + np.log(gamma) + (gamma - 1.0) * log_q + np.log(2.0 + abs_log_p) + log_dp
            )
            second = np.exp(
                log_a + np.log(gamma * abs(gamma - 1.0)) + log_p + np.log(abs_log_p)
                + (gamma - 2.0) * log_q + log_dp
            )  # fmt: skip
            dv = np.where(np.isfinite(first), first, 0.0) + np.where(
                np.isfinite(second), second, 0.0
            )
            dv = np.where(finite & (a != 0.0), dv, 0.0)
        grad_spread = dp * big_s + p * np.sum(dv, axis=-1, keepdims=True) + dv
        # the target mass a_c = class weight x smoothed target, rounded (relative u), and the class
        # sums over the n_c classes with mass (pairwise: 1 + ceil(log2 n_c) roundings)
        n_terms = np.sum(a != 0.0, axis=-1, keepdims=True)
        mass_error = np.where(
            n_terms > 1, (1.0 + np.ceil(np.log2(np.maximum(n_terms, 1)))) * u, 0.0
        )
        abs_v = np.abs(v)
        grad_spread = grad_spread + mass_error * (p * np.sum(abs_v, axis=-1, keepdims=True) + abs_v)
        grad_spread = _head_option_spreads(elements, grad_spread, p, dp, delta, dtype)
        value_terms = np.where(a == 0.0, 0.0, a * terms.focal_weight * np.abs(log_p))
        value_spread = np.sum(grad_terms * delta, axis=-1) + mass_error[..., 0] * np.sum(
            value_terms, axis=-1
        )
        value_spread = np.where(elements.keep & np.isfinite(value_spread), value_spread, 0.0)
        grad_spread = np.where(
            elements.keep[..., None] & elements.valid & np.isfinite(grad_spread), grad_spread, 0.0
        )
    return value_spread, np.moveaxis(grad_spread, -1, elements.axis)


def _head_option_spreads(elements, grad_spread, p, dp, delta, dtype):
    """`grad_spread` (of the loss's own part, in the space of the softmax's logits) with what the
    LLM head options add (DESIGN 13; unchanged without them), in the logits' space.

    z-loss: its gradient part 2 z_loss lse p_j moves by 2 z_loss (|lse| |dp_j| + p_j |dlse|),
    dlse = sum_c p_c delta_c + u |lse| (lse rounded once); it is formed apart from the loss's own
    part and added, so each part is rounded at its own size: STRICT_ULPS u of |2 z_loss lse p_j|
    (the two cancel at the target, where ulp(result) alone would ask more than a sum can give).
    Cap: the spread in c comes back times dc/dz = sech^2(x), x = logits / cap; dc/dz itself
    moves by 2 |tanh x| sech^2(x) dx when x does, dx = ulp(logits) / cap + u |x| (the logit's
    ULP and the rounding of the quotient), plus 2 u sech^2(x) for its own evaluation: the
    capped gradient times that."""
    u = UNIT_ROUNDOFF[dtype]
    z_loss, dcap = elements.z_loss, elements.dcap
    if z_loss != 0.0:
        lse = elements.terms.lse[..., None]
        dlse = np.sum(p * delta, axis=-1, keepdims=True) + u * np.abs(lse)
        z_grad = 2.0 * z_loss * np.abs(lse) * p
        grad_spread = (
            grad_spread + 2.0 * z_loss * (np.abs(lse) * dp + p * dlse) + STRICT_ULPS * u * z_grad
        )
    if dcap is None:
        return grad_spread
    raw, cap = elements.logits, elements.softcap
    finite = np.isfinite(raw)
    x = np.where(finite, raw, 0.0) / cap
    dx = ulp(np.where(finite, raw, 0.0), dtype) / cap + u * np.abs(x)
    ddcap = 2.0 * np.abs(np.tanh(x)) * dcap * dx + 2.0 * u * dcap
    return grad_spread * dcap + np.abs(elements.capped_grad) * ddcap


def _sigmoid_spreads(info, elements, options, dtype):
    """The change of each per-element value and gradient entry (logits shape) when the logit
    moves by one ULP of `dtype` either way, or a soft target t (0 < t < 1) by one ULP of t or of
    1 - t (whichever an implementation rounds), from the spec itself (element-wise, so the four
    moves bound it); float64. Hard targets 0 and 1 are exact in every implementation."""
    x, t = elements.x, elements.t
    with np.errstate(all="ignore"):
        dx = np.where(np.isfinite(x), ulp(np.where(np.isfinite(x), x, 0.0), dtype), 0.0)
        soft = (t > 0.0) & (t < 1.0)
        dt = np.where(soft, np.maximum(ulp(t, dtype), ulp(1.0 - t, dtype)), 0.0)
        element_options = dict(options, reduction="none")
        value_spread = np.zeros_like(x)
        grad_spread = np.zeros_like(x)
        # a rounded soft target stays in [0, 1] (the sigmoid focal loss's domain: its spec
        # raises outside); near 0 one ULP of 1 - t would carry it below
        up, down = np.minimum(t + dt, 1.0), np.maximum(t - dt, 0.0)
        for moved_x, moved_t in ((x + dx, t), (x - dx, t), (x, up), (x, down)):
            moved = info.intermediates(moved_x, moved_t, **element_options)
            value_spread = np.fmax(value_spread, np.abs(moved.loss - elements.loss))
            grad_spread = np.fmax(grad_spread, np.abs(moved.grad - elements.grad))
        value_spread = np.where(np.isfinite(value_spread), value_spread, 0.0)
        grad_spread = np.where(np.isfinite(grad_spread), grad_spread, 0.0)
    return value_spread, grad_spread


_SPREADS = {"softmax": _softmax_spreads, "sigmoid": _sigmoid_spreads}


def _one_rounding(result, dtype: str) -> np.ndarray:
    """One ULP of `dtype` at |result|, or its smallest normal where |result| is below it."""
    tiny = SMALLEST_NORMAL[dtype]
    return np.where(np.abs(result) < tiny, tiny, ulp(result, dtype))


def _strict_tolerances(info, options, dtype, expected_value, expected_grad, elements, values):
    """Value and gradient tolerances of the strict standard (module docstring)."""
    work = "float32" if dtype in HALF else dtype
    u = UNIT_ROUNDOFF[work]
    reduction = options.get("reduction", "mean")
    element_options = dict(options, reduction="none")
    value_spread, grad_spread = _SPREADS[info.family](info, elements, element_options, work)
    multiplier = _underflow_multiplier(info, options)
    # intermediates flush in the working precision (float32 for the half dtypes)
    forgiven = STRICT_FORGIVEN * SMALLEST_NORMAL[work] * multiplier
    with np.errstate(all="ignore"):
        if reduction == "none":
            divisor = 1.0
            value_tolerance = STRICT_ULPS * ulp(expected_value, work) + value_spread + forgiven
        else:
            divisor = _mean_divisor(elements) if reduction == "mean" else 1.0
            n = max(values.size, 1)
            summation = 1.0 + math.ceil(math.log2(n))
            value_tolerance = np.asarray(
                STRICT_ULPS * ulp(expected_value, work)
                + (np.sum(value_spread) + summation * u * np.sum(np.abs(values))) / divisor
                + forgiven * n / divisor
            )
        grad_tolerance = None
        if expected_grad is not None:
            grad_tolerance = (
                STRICT_ULPS * ulp(expected_grad, work) + grad_spread / divisor + forgiven
            )
        if dtype in HALF:
            # computed in float32, rounded once to the half dtype (a result below its smallest
            # normal may be flushed to zero there)
            value_tolerance = value_tolerance + _one_rounding(expected_value, dtype)
            if grad_tolerance is not None:
                grad_tolerance = grad_tolerance + _one_rounding(expected_grad, dtype)
    return value_tolerance, grad_tolerance


# ----------------------------------------------------------------------------------------------
# Judgement
# ----------------------------------------------------------------------------------------------


@dataclass
class Judgement:
    """The verdict on one call: reference, tolerance, and what went wrong (if anything)."""

    loss: str
    dtype: str
    options: dict
    expected_value: np.ndarray
    received_value: np.ndarray
    expected_grad: np.ndarray | None
    received_grad: np.ndarray | None
    value_tolerance: np.ndarray
    grad_tolerance: np.ndarray | None
    nonfinite: list[str] = field(default_factory=list)
    inaccurate: list[str] = field(default_factory=list)
    worst_value_ulp: float = 0.0
    worst_grad_ulp: float = 0.0
    worst_ratio: float = 0.0
    # the largest error relative to its result's scale (the largest |entry| of that value or
    # gradient, 1 where all are 0): at or above VISIBLE it is "wrong at the result's scale"
    scaled_error: float = 0.0
    # gradients w.r.t. targets and options (``judge(input_grads=...)``), by name
    expected_input_grads: dict = field(default_factory=dict)
    received_input_grads: dict = field(default_factory=dict)
    # practical: the value is NaN over an all-ignored batch (0 / 0), everything else finite
    all_ignored_nan: bool = False

    @property
    def ok(self) -> bool:
        return not self.nonfinite and not self.inaccurate and not self.all_ignored_nan

    @property
    def kind(self) -> str:
        if self.nonfinite:
            return "non-finite"
        if self.inaccurate:
            return "accuracy"
        return ALL_IGNORED_NAN if self.all_ignored_nan else "ok"


def _compare(what, expected, received, tolerance, dtype, nonfinite, inaccurate):
    """Fills `nonfinite` / `inaccurate` with one line per problem; returns (worst ULP, ratio)."""
    expected = np.asarray(expected, dtype=np.float64)
    received = np.broadcast_to(np.asarray(received, dtype=np.float64), expected.shape)
    exp_finite = np.isfinite(expected)
    rec_finite = np.isfinite(received)
    # a true result beyond the dtype's largest number rounds to inf of its sign: correct
    with np.errstate(invalid="ignore"):
        rounded_to_inf = received == np.sign(expected) * np.inf
        overflow = exp_finite & (np.abs(expected) > LARGEST[dtype]) & rounded_to_inf
    exp_finite = exp_finite & ~overflow
    bad = exp_finite & ~rec_finite
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0]) if expected.ndim else ()
        nonfinite.append(
            f"{what} is {_num(received[where])} at {where} where the spec gives "
            f"{_num(expected[where])} ({int(bad.sum())} of {bad.size} entries non-finite)"
        )
    # where the spec is NaN or inf, the candidate must not return a plausible number
    hidden = ~exp_finite & ~overflow
    hidden = hidden & ~((np.isnan(expected) & np.isnan(received)) | (expected == received))
    if hidden.any():
        where = tuple(int(i) for i in np.argwhere(hidden)[0]) if expected.ndim else ()
        nonfinite.append(
            f"{what} is {_num(received[where])} at {where} where the spec gives "
            f"{_num(expected[where])} (a non-finite result hidden)"
        )
    both = exp_finite & rec_finite
    if not both.any():
        return 0.0, 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.where(both, np.abs(received - expected), 0.0)
    ulps = error / ulp(expected, dtype)
    ratio = np.where(both, error / np.maximum(tolerance, SMALLEST_SUBNORMAL[dtype]), 0.0)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.ndim else ()
    worst = tuple(int(i) for i in worst)
    if ratio[worst] > 1.0:
        scale = _largest(expected) or 1.0
        # an ULP count only where the spec's entry has ULPs of its own (ulp(0) is a convention)
        where = (f"{ulps[worst]:.3g} ULP of {dtype}" if expected[worst] != 0.0
                 else "the spec gives exactly 0 here")  # fmt: skip
        inaccurate.append(
            f"{what} is {_num(received[worst])} at {worst} where the spec gives "
            f"{_num(expected[worst])}: "
            f"error {error[worst]:.3g} > tolerance {float(np.asarray(tolerance)[worst]):.3g}"
            f" ({where}; {float(np.max(error)) / scale:.2g} of the largest |{what.split()[0]}|)"
        )
    return float(np.max(ulps)), float(ratio[worst])


def _scaled_error(expected, received) -> float:
    """max |received - expected| / the largest |expected| (1 where it is 0), over the entries
    finite in both."""
    expected = np.asarray(expected, dtype=np.float64)
    received = np.broadcast_to(np.asarray(received, dtype=np.float64), expected.shape)
    both = np.isfinite(expected) & np.isfinite(received)
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.where(both, np.abs(received - expected), 0.0)
    return float(np.max(error, initial=0.0)) / (_largest(expected) or 1.0)


def _num(x) -> str:
    """A plain Python number for messages: 0.5, nan, -inf (never ``np.float64(0.5)``)."""
    return repr(float(x))


def judge(
    loss: str,
    logits: Any,
    targets: Any,
    options: dict | None,
    dtype: Any,
    value: Any,
    grad: Any = None,
    *,
    standard: str = "strict",
    input_grads: dict | None = None,
) -> Judgement:
    """Compares a candidate's value (and gradients) with the spec.

    Args:
      loss: the spec loss name, e.g. 'softmax_focal_loss', or its record.
      logits, targets: exactly the inputs the candidate saw, as NumPy arrays (upcast to float64
        is exact); the class axis where ``options['axis']`` says (default -1).
      options: keyword arguments of the spec loss (axis, gamma, alpha, weight, reduction, ...).
      dtype: the candidate's dtype (any spelling: np.float16, torch.bfloat16, 'float32').
      value: the candidate's loss, as NumPy.
      grad: the candidate's gradient of the (summed, for reduction 'none') loss w.r.t. the logits,
        or None to judge the value alone.
      standard: 'strict' (dualloss's own backends) or 'practical' (users' code: the
        backward-stability and whole-result allowances of the module docstring).
      input_grads: the candidate's gradients of the same sum w.r.t. 'targets' (probability
        targets, the logits' layout) and options ('weight', 'alpha', 'gamma', 'pos_weight',
        'label_smoothing'), shaped like them; judged against ``spec.<loss>_grad(wrt=...)``.

    Returns:
      a ``Judgement``; ``.ok`` is True when both are finite where the spec is and within tolerance.
    """
    info = losses.get(loss)
    dtype = dtype_name(dtype)
    if standard not in STANDARDS:
        raise ValueError(
            f"`standard` must be 'practical' or 'strict'. Received: standard={standard!r}."
        )
    practical = standard == "practical"
    options = dict(options or {})
    reduction = options.get("reduction", "mean")
    expected_value = np.asarray(info.spec(logits, targets, **options))
    expected_grad = None if grad is None else np.asarray(info.grad(logits, targets, **options))
    # a `normalizer` is the divisor of 'mean': the error model divides by it instead of the
    # mean's own denominator, and the per-element calls leave it out
    normalizer = options.pop("normalizer", None)
    called = options if normalizer is None else dict(options, normalizer=normalizer)
    element_options = dict(options, reduction="none")
    elements = np.asarray(info.spec(logits, targets, **element_options))
    # the spec's per-element intermediates, computed once for every term of the error model
    with np.errstate(all="ignore"):
        intermediates = info.intermediates(logits, targets, **element_options)
    if normalizer is not None:
        intermediates = intermediates._replace(denominator=float(np.asarray(normalizer)))
    if practical:
        value_tolerance, grad_tolerance = _practical_tolerances(
            info, logits, targets, options, dtype, expected_value, expected_grad, intermediates,
            elements,
        )  # fmt: skip
    else:
        value_tolerance, grad_tolerance = _strict_tolerances(
            info, options, dtype, expected_value, expected_grad, intermediates, elements
        )
    all_ignored_nan = False
    # what the candidate returned, as the report prints it (the NaN of an all-ignored batch is
    # replaced below for the comparison only)
    received_value = np.asarray(value, dtype=np.float64)
    if practical and reduction == "mean" and _mean_is_empty(intermediates):
        # 0 / 0: torch's NaN is a hazard of its own kind, not a non-finite failure (module
        # docstring); its gradients are judged as usual
        received = np.asarray(value, dtype=np.float64)
        all_ignored_nan = bool(np.any(np.isnan(received)))
        value = np.where(np.isnan(received), expected_value, value)
    nonfinite: list[str] = []
    inaccurate: list[str] = []
    worst_value_ulp, value_ratio = _compare(
        "value", expected_value, value, value_tolerance, dtype, nonfinite, inaccurate
    )
    worst_grad_ulp, grad_ratio = 0.0, 0.0
    if grad is not None:
        worst_grad_ulp, grad_ratio = _compare(
            "gradient", expected_grad, grad, grad_tolerance, dtype, nonfinite, inaccurate
        )
    expected_inputs, received_inputs = {}, {}
    for name, received in (input_grads or {}).items():
        expected = np.asarray(info.grad(logits, targets, **called, wrt=name), dtype=np.float64)
        tolerance = _input_grad_tolerance(info, logits, targets, options, dtype, standard, name,
                                          expected, intermediates)  # fmt: skip
        received = np.asarray(received, dtype=np.float64)
        if received.shape != expected.shape and received.size == expected.size:
            received = received.reshape(expected.shape)
        ulps, ratio = _compare(f"gradient w.r.t. {name}", expected, received, tolerance, dtype,
                               nonfinite, inaccurate)  # fmt: skip
        worst_grad_ulp, grad_ratio = max(worst_grad_ulp, ulps), max(grad_ratio, ratio)
        expected_inputs[name], received_inputs[name] = expected, received
    scaled = [_scaled_error(expected_value, value)]
    if grad is not None:
        scaled.append(_scaled_error(expected_grad, grad))
    scaled += [_scaled_error(expected_inputs[n], received_inputs[n]) for n in expected_inputs]
    return Judgement(
        scaled_error=max(scaled),
        loss=loss,
        dtype=dtype,
        options=called,
        expected_value=expected_value,
        received_value=received_value,
        expected_grad=expected_grad,
        received_grad=None if grad is None else np.asarray(grad, dtype=np.float64),
        value_tolerance=value_tolerance,
        grad_tolerance=grad_tolerance,
        nonfinite=nonfinite,
        inaccurate=inaccurate,
        worst_value_ulp=worst_value_ulp,
        worst_grad_ulp=worst_grad_ulp,
        worst_ratio=max(value_ratio, grad_ratio),
        expected_input_grads=expected_inputs,
        received_input_grads=received_inputs,
        all_ignored_nan=all_ignored_nan,
    )


def _practical_tolerances(
    info, logits, targets, options, dtype, expected_value, expected_grad, intermediates, elements
):
    """Value and gradient tolerances of the practical standard (module docstring)."""
    u = UNIT_ROUNDOFF[dtype]
    reduction = options.get("reduction", "mean")
    element_options = dict(options, reduction="none")
    value_scale, grad_scale = _SCALES[info.family](info, intermediates, element_options)
    if not info.is_softmax and intermediates.focal is not None:
        # the rounded probability p_t (1 - p_t formed from it): r times the terms that carry
        # the focal weight, the allowance every judged quantity gets (softmax:
        # ``_textbook_focal_allowance``); in units of u, as the scales are
        value_terms, grad_terms = _sigmoid_focal_terms(info, intermediates, element_options)
        rounding = _probability_rounding(info, intermediates, element_options, u) / u
        value_scale = value_scale + rounding * value_terms
        grad_scale = grad_scale + rounding * grad_terms
    underflow = K * SMALLEST_NORMAL[dtype] * _underflow_multiplier(info, options)
    with np.errstate(all="ignore"):
        if reduction == "none":
            value_tolerance = K * u * (np.abs(elements) + value_scale) + underflow
            divisor = 1.0
        else:
            divisor = _mean_divisor(intermediates) if reduction == "mean" else 1.0
            n = max(elements.size, 1)
            summation = 1.0 + math.ceil(math.log2(n))
            value_tolerance = np.asarray(
                K * u * (np.sum(value_scale) + summation * np.sum(np.abs(elements))) / divisor
                + K * u * np.abs(expected_value)
                + underflow * n / divisor
            )
        grad_tolerance = None
        if expected_grad is not None:
            grad_tolerance = K * u * (np.abs(expected_grad) + grad_scale / divisor) + underflow
        if info.is_softmax and info.gamma(options) > 0.0:
            value_focal, grad_focal = _textbook_focal_allowance(
                info, intermediates, element_options, u
            )
            if reduction == "none":
                value_tolerance = value_tolerance + K * value_focal
            else:
                value_tolerance = value_tolerance + K * np.sum(value_focal) / divisor
            if grad_tolerance is not None:
                grad_tolerance = grad_tolerance + K * grad_focal / divisor
        value_tolerance = value_tolerance + _practical_value_allowance(
            info, logits, targets, options, u
        )
        value_tolerance = value_tolerance + K * u * _largest(expected_value)
        if grad_tolerance is not None:
            grad_tolerance = grad_tolerance + K * u * _largest(expected_grad)
    return value_tolerance, grad_tolerance


def _textbook_focal_allowance(info, elements, options, u):
    """The change of a softmax focal loss (per element) and of its gradient (logits shape) when
    q = 1 - p_c carries an absolute error u p_c (module docstring), in float64."""
    gamma = info.gamma(options)
    with np.errstate(all="ignore"):
        terms = elements.terms
        a = np.abs(elements.a)
        p = terms.p
        q = np.exp(terms.log_not_p)
        shifted = q + u * p
        log_p = np.where(np.isfinite(terms.log_p), terms.log_p, 0.0)
        w_change = np.abs(shifted**gamma - q**gamma)
        value = np.sum(np.where(a == 0.0, 0.0, a * w_change * np.abs(log_p)), axis=-1)

        def v_of(q_):
            low = np.where(q_ > 0.0, q_ ** (gamma - 1.0), 0.0)
            return a * (q_**gamma - gamma * low * p * log_p)

        dv = np.where(a == 0.0, 0.0, np.abs(v_of(shifted) - v_of(q)))
        dv = np.where(np.isfinite(dv), dv, 0.0)
        grad = p * np.sum(dv, axis=-1, keepdims=True) + dv
        if elements.dcap is not None:
            # the change in the capped logits' gradient, through the cap's derivative
            grad = grad * elements.dcap
        value = np.where(elements.keep & np.isfinite(value), value, 0.0)
        grad = np.where(elements.keep[..., None] & elements.valid & np.isfinite(grad), grad, 0.0)
    return value, np.moveaxis(grad, -1, elements.axis)


def _rounded_probability(gamma: float, log_p, log_q, u: float) -> np.ndarray:
    """r: the largest relative change of (1 - p)^gamma and of gamma (1 - p)^(gamma - 1) when
    q = 1 - p moves by u p, the absolute error of forming 1 - p from a rounded p (module
    docstring, "One allowance for every judged quantity"); 0 for gamma = 0 and where p = 1."""
    if gamma == 0.0:
        return np.zeros(np.shape(log_p))
    with np.errstate(all="ignore"):
        step = np.log1p(u * np.exp(np.asarray(log_p) - np.asarray(log_q)))  # log(1 + u p / q)
        r = np.maximum(np.abs(np.expm1(gamma * step)), np.abs(np.expm1((gamma - 1.0) * step)))
    return np.where(np.isfinite(r), r, 0.0)


def _sigmoid_focal_terms(info, elements, options):
    """|loss| per element and |t1| + |t2| of its logit gradient d(a m ce)/dx = a (m' ce dq/dx +
    m dce/dx), m = q^gamma, q = 1 - p_t, dq/dx = -(2t - 1) p (1 - p), dce/dx = p - t: the terms
    that the focal weight multiplies (logits shape, float64)."""
    gamma = info.gamma(options)
    focal = elements.focal
    with np.errstate(all="ignore"):
        x, t = elements.x, elements.t
        log_p = -np.logaddexp(0.0, -x)
        log_not_p = -np.logaddexp(0.0, x)
        loss = np.abs(focal.loss)
        slope = gamma * np.abs(2.0 * t - 1.0) * np.exp(log_p + log_not_p - focal.log_not_pt)
        first = slope * loss
        second = np.abs(focal.alpha_t) * focal.focal_weight * np.abs(np.exp(log_p) - t)
        grad = np.where(np.isfinite(first), first, 0.0) + np.where(np.isfinite(second), second, 0)
    return np.where(np.isfinite(loss), loss, 0.0), grad


def _probability_rounding(info, elements, options, u) -> np.ndarray:
    """``_rounded_probability`` per class (softmax, class axis last) or per element (sigmoid,
    the logits' shape, with p the probability of the target p_t)."""
    gamma = info.gamma(options)
    if info.is_softmax:
        terms = elements.terms
        return _rounded_probability(gamma, terms.log_p, terms.log_not_p, u)
    if elements.focal is None:
        return np.zeros(np.shape(elements.x))
    log_not_pt = elements.focal.log_not_pt
    with np.errstate(all="ignore"):
        log_pt = np.log(-np.expm1(log_not_pt))
    return _rounded_probability(gamma, log_pt, log_not_pt, u)


# ----------------------------------------------------------------------------------------------
# Gradients w.r.t. the targets and the options
# ----------------------------------------------------------------------------------------------


def _softmax_input_scale(info, elements, logits, targets, options, name, rounding=None):
    """The scale of d(loss)/d`name` (module docstring, "Gradients w.r.t. targets and options"):
    per target entry (class axis last) for 'targets', per class for a class vector, a number
    for the scalars; before the division by the mean's denominator. With `rounding` (per class,
    ``_probability_rounding``) each class's unit of mass is scaled by it: the rounded-probability
    allowance of the module docstring."""
    gamma = info.gamma(options)
    eps = float(options.get("label_smoothing", 0.0))
    vector = info.class_vector
    with np.errstate(all="ignore"):
        terms = elements.terms
        z = elements.z
        z_top = np.max(z, axis=-1, keepdims=True)
        kappa = np.where(np.isfinite(z), np.abs(z - z_top) + np.abs(z), 0.0)
        kappa = kappa + np.where(np.isfinite(z_top), np.abs(z_top), 0.0)
        log_not_p = np.where(np.isfinite(terms.log_not_p), np.abs(terms.log_not_p), 0.0)
        power_error = 1.0 + gamma * (1.0 + log_not_p)
        finite_log_p = np.where(np.isfinite(terms.log_p), np.abs(terms.log_p), 0.0)
        # one unit of mass: g_c = -(1 - p_c)^gamma log p_c and the error of computing it (in
        # units of 1 / SHRINK: logits near half the float64 range would overflow the sums)
        unit = terms.focal_weight * (SHRINK + SHRINK * kappa + SHRINK * finite_log_p) * power_error
        if rounding is not None:
            # the size of the focal weight's terms alone: m_c |log p_c| (1 + |log(1 - p_c)|)
            unit = terms.focal_weight * SHRINK * finite_log_p * (1.0 + log_not_p) * rounding
        unit = np.where(elements.keep[..., None] & elements.valid & np.isfinite(unit), unit, 0.0)
        weights = options.get(vector) if vector else None
        class_weight = 1.0 if weights is None else np.abs(np.asarray(weights, dtype=np.float64))
        if name == "targets":
            return (1.0 - eps) * class_weight * unit
        plain = dict(options, reduction="none", **({vector: None} if vector else {}))
        smoothed = np.abs(info.intermediates(logits, targets, **plain).a)
        if name == "gamma":
            per_entry = np.abs(elements.a) * unit * (1.0 + log_not_p)
        elif name == "label_smoothing":
            # dl/deps = sum_c w_c (u_c - t_c) g_c: u the uniform share, t the unsmoothed target
            u = info.intermediates(logits, targets, **dict(plain, label_smoothing=1.0)).a
            t = info.intermediates(logits, targets, **dict(plain, label_smoothing=0.0)).a
            per_entry = class_weight * np.abs(u - t) * unit
        else:  # the class vector (weight, alpha): dl/dw_c = t~_c g_c
            per_entry = smoothed * unit
        per_entry = np.where(np.isfinite(per_entry), per_entry, 0.0)
        flat = per_entry.reshape(-1, per_entry.shape[-1])
        # pairwise summation over the elements (and classes, for a number): (1 + ceil(log2 n)) u
        # sum |terms|, each term's scale bounding its size
        if name in ("weight", "alpha") and np.ndim(weights) == 1:
            summation = 2.0 + math.ceil(math.log2(max(flat.shape[0], 1)))
            per_class = summation * np.sum(flat, axis=0)
            if (
                name == "weight"
                and targets.dtype.kind in "iu"
                and options.get("reduction", "mean") == "mean"
            ):
                # L = T / D, D = sum_k w_k n_k: dL/dw_c = S_c / D - n_c T / D^2; the second
                # term's scale is n_c sum_k |w_k| scale_k / D, the division by D done by the caller
                one_hot = info.intermediates(logits, targets, **dict(plain, label_smoothing=0.0)).a
                counts = np.sum(one_hot.reshape(-1, flat.shape[-1]), axis=0)
                denominator = max(elements.denominator, 1e-300)
                others = np.sum(class_weight * per_class) / denominator
                per_class = per_class + counts * others
            return per_class
        summation = 2.0 + math.ceil(math.log2(max(flat.size, 1)))
        return np.float64(summation * np.sum(flat))


def _sigmoid_input_scale(info, elements, options, name, shape, rounding=None):
    """The scale of d(loss)/d`name` for a sigmoid loss (module docstring), summed to `shape`
    (the option's, or the logits' for 'targets'); before the division by the mean's divisor.
    With `rounding` (per element, ``_probability_rounding``) each element's scale is scaled by
    it before the sum."""
    gamma = info.gamma(options)
    with np.errstate(all="ignore"):
        x, t, w, q = elements.x, elements.t, np.abs(elements.w), np.abs(elements.q)
        # in units of 1 / SHRINK, as for the softmax losses
        grow = SHRINK + SHRINK * np.abs(x)
        if elements.focal is None:
            if name == "targets":
                scale = w * (1.0 + q) * grow
            elif name == "weight":
                scale = (np.abs(1.0 - t) + q * np.abs(t)) * grow
            else:  # pos_weight
                scale = w * np.abs(t) * grow
        else:
            focal = elements.focal
            log_not_pt = np.where(np.isfinite(focal.log_not_pt), np.abs(focal.log_not_pt), 0.0)
            base = focal.focal_weight * grow * (1.0 + gamma * (1.0 + log_not_pt))
            if rounding is not None:
                # the size of the focal weight's terms alone, times the rounding
                base = focal.focal_weight * grow * (1.0 + log_not_pt) * rounding
            alpha = options.get("alpha")
            slope = 0.0 if alpha is None else abs(2.0 * float(alpha) - 1.0)
            if name == "targets":
                scale = (slope + np.abs(focal.alpha_t)) * (1.0 + gamma) * base
            elif name == "gamma":
                scale = np.abs(focal.alpha_t) * base * (1.0 + log_not_pt)
            else:  # alpha
                scale = np.abs(2.0 * t - 1.0) * base
        scale = np.where(np.isfinite(scale), scale, 0.0)
        if name == "targets":
            return scale
        shape = tuple(shape)
        summed = np.sum(scale, axis=tuple(range(scale.ndim - len(shape))))
        stretched = tuple(i for i, n in enumerate(shape) if n == 1 and summed.shape[i] != 1)
        summed = np.sum(summed, axis=stretched, keepdims=True).reshape(shape)
        summation = 2.0 + math.ceil(math.log2(max(scale.size // max(summed.size, 1), 1)))
        return summation * summed


# the input-gradient scales are formed times SHRINK (exact: a power of two), so that they stay
# finite for logits near half the float64 range; the tolerance multiplies u / SHRINK back in
SHRINK = 2.0**-16


def _input_grad_tolerance(info, logits, targets, options, dtype, standard, name, expected,
                          intermediates):  # fmt: skip
    """Tolerance of the gradient w.r.t. `name` (module docstring, both standards)."""
    reduction = options.get("reduction", "mean")
    element_options = dict(options, reduction="none")

    def scale_of(rounding=None):
        if info.is_softmax:
            scale = _softmax_input_scale(info, intermediates, logits, np.asarray(targets),
                                         element_options | {"reduction": reduction}, name,
                                         rounding)  # fmt: skip
            return np.moveaxis(scale, -1, intermediates.axis) if name == "targets" else scale
        return _sigmoid_input_scale(info, intermediates, element_options, name,
                                    np.shape(expected), rounding)  # fmt: skip

    scale = scale_of()
    divisor = _mean_divisor(intermediates) if reduction == "mean" else 1.0
    multiplier = _underflow_multiplier(info, options)
    with np.errstate(all="ignore"):
        if standard == "practical":
            u = UNIT_ROUNDOFF[dtype]
            # the rounded probability (1 - p formed from p), as the value and logits get it
            rounding = _probability_rounding(info, intermediates, element_options, u)
            rounded = scale_of(rounding) if np.any(rounding) else 0.0
            return (
                K * u * np.abs(expected)
                + (K * u / SHRINK) * scale / divisor
                + (K / SHRINK) * rounded / divisor
                + K * u * _largest(expected)
                + K * SMALLEST_NORMAL[dtype] * multiplier
            )
        work = "float32" if dtype in HALF else dtype
        tolerance = (
            STRICT_ULPS * ulp(expected, work)
            + (UNIT_ROUNDOFF[work] / SHRINK) * scale / divisor
            + STRICT_FORGIVEN * SMALLEST_NORMAL[work] * multiplier
        )
        if dtype in HALF:
            tolerance = tolerance + _one_rounding(expected, dtype)
        return tolerance


def _largest(array) -> float:
    """max |finite entry| of `array` (0 when none): the scale of the whole result."""
    array = np.asarray(array, dtype=np.float64)
    finite = np.isfinite(array)
    return float(np.max(np.abs(np.where(finite, array, 0.0)), initial=0.0))


def _practical_value_allowance(info, logits, targets, options, u) -> np.ndarray:
    """K u sum_i |df/dx_i| |x_i| (module docstring): per element for reduction 'none' (summed
    over the class axis of a softmax loss), over every logit for a reduced value."""
    with np.errstate(all="ignore"):
        x = np.asarray(logits, dtype=np.float64)
        gradient = np.asarray(info.grad(logits, targets, **options), dtype=np.float64)
        terms = np.abs(gradient) * np.where(np.isfinite(x), np.abs(x), 0.0)
        terms = np.where(np.isfinite(terms), terms, 0.0)
        if options.get("reduction", "mean") != "none":
            return np.asarray(K * u * np.sum(terms))
        if info.is_softmax:
            terms = np.sum(terms, axis=options.get("axis", -1))
        return K * u * terms


def _underflow_multiplier(info, options: dict) -> float:
    """(1 + gamma) * max(1, |weight|, |alpha|, |pos_weight|): how much an underflowed
    intermediate can be scaled up before it reaches the output."""
    largest = 1.0
    for key in info.factors():
        value = options.get(key)
        if value is not None:
            largest = max(largest, float(np.max(np.abs(np.asarray(value, dtype=np.float64)))))
    return (1.0 + info.gamma(options)) * largest


def _mean_is_empty(elements) -> bool:
    """True when reduction 'mean' divides by zero (every element ignored, or none at all)."""
    return elements.denominator == 0.0


def _mean_divisor(elements) -> float:
    """The denominator of reduction 'mean' (torch semantics, DESIGN.md section 6), as the spec
    computes it; 1 when it is 0 (the mean is then 0)."""
    return elements.denominator if elements.denominator != 0.0 else 1.0


def assert_matches_spec(
    loss: str,
    logits: Any,
    targets: Any,
    options: dict | None,
    dtype: Any,
    value: Any,
    grad: Any = None,
    *,
    context: str = "",
    standard: str = "strict",
    input_grads: dict | None = None,
) -> Judgement:
    """``judge``, raising AssertionError with every problem and the call named in `context`."""
    judgement = judge(loss, logits, targets, options, dtype, value, grad, standard=standard,
                      input_grads=input_grads)  # fmt: skip
    if not judgement.ok:
        problems = "; ".join(judgement.nonfinite + judgement.inaccurate)
        raise AssertionError(f"{context or loss} [{judgement.dtype}]: {problems}")
    return judgement
