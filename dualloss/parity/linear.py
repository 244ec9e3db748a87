"""The oracle for the fused linear losses: regions, the derived error bound, runs, ``check``.

    report = check(my_fused_loss, "linear_softmax_cross_entropy", backend="torch")

The fused families (``losses.LINEAR_LOSSES``) take (hidden, linear_weight, targets) instead of
(logits, targets), so they have their own cases and bound here; ``parity.check`` hands them to
``check`` below, and ``dualloss-parity run`` judges dualloss's own backends with ``run_ours``.

Candidate: ``candidate(hidden, linear_weight, targets)`` in the backend's layout (torch:
linear_weight (V, H) as ``nn.Linear``; JAX: (H, V) as flax's Dense kernel), or
``candidate(hidden, linear_weight, targets, bias)`` with ``options={"bias": True}`` (the bias is
then a differentiable fourth argument, (V,)). It returns the loss reduced as
``options['reduction']`` (default 'mean'); its gradients w.r.t. hidden, linear_weight (and bias)
come from the framework's autodiff and are judged against the spec's closed forms. Without a
bias the cases fold theirs into the inputs (a constant feature 1 in hidden, the bias as that
feature's row of linear_weight): the same logits, so the same regions.

Regions (``REGIONS``; N = 45 rows, H = 16 features, V = 97 classes at --quick): typical, huge
hidden norms (logits ~1e4: one-hot softmax, exp underflow everywhere), exact ties (duplicated
vocabulary columns), ignored rows, all rows ignored, one class dominant (p_y within ~1e-13 of 1:
the loss and gradient are ~1e-13, judged at their own scale), confident rows (each row's own
target ahead by 20 to 36: losses 1e-9 to 1e-16), near ties (columns a few float32 ULPs apart,
exact ties once rounded to a half dtype), mostly ignored (one kept row: the mean divides by 1),
a finite mask through the bias (-1e4 on every other class, no -inf anywhere), logits past
float16's range from hidden and weights inside it, and three of their own shape (``OWN_SHAPE``):
N = 1, V = 4099 (prime, many vocabulary blocks and a partial one), H = 1024 (long dot products:
bfloat16 accumulation). After the regions, ``check`` runs a Hypothesis search (``_explore``).

The bound (``bound``), derived rather than tuned. The spec is evaluated at the inputs the
candidate saw (rounded to the dtype), so only the candidate's own arithmetic is judged. With u
the unit roundoff of the working precision, A_ic = sum_k |h_ik W_kc| + |b_c| and
gamma_n = (n + 1) u:

* logits: a dot product of length H is off by at most |dz_ic| <= gamma_H A_ic;
  D_i = gamma_H max_c A_ic bounds the row.
* loss of row i: |dl_i| <= D_i sum_c |G_ic| (first order in dz; G the spec's gradient w.r.t.
  the logits) plus the row's own arithmetic, 8 u (|l_i| + log2(V) m_i) (the normaliser is a sum
  of V terms, its log is off by log2(V) u, at least u: its exp and log round even for V = 1;
  m_i = (1 + gamma) sum_c a_ic bounds the gradient).
* logits' gradient: p moves by a factor exp(+-2 D_i) under dz, the focal factors by (1 + gamma)
  more: |dG_ic| <= E_ic = (2 D_i (1 + gamma)^2 + 8 u log2 V) (p_ic m_i + a_ic).
* through the linear layer: dh_ik = sum_c G_ic W_ck is off by sum_c E_ic |W_ck| +
  gamma_V sum_c |G_ic W_ck|; dW and db likewise with the sum over rows (gamma_N).
* reductions: summing N rows adds gamma_N sum_i |l_i|; 'mean' scales every bound as the loss.
* flushed subnormals: an entry of p or of the logits' gradient below the working precision's
  smallest normal s may come out 0 (XLA and GPUs flush them), so E_ic gains s (1 + m_i) on kept
  rows, which the linear layer multiplies by |W| or |h| as above: a gradient of 2.5e-38
  (30 x a flushed p of 8e-40) may be 0 in float32.

Two standards, as ``tolerance.py``:

* ``strict`` (dualloss's own backends): u of the compute dtype (float32 for float16 and
  bfloat16: the backends compute and accumulate in float32 and round the results once, so the
  half dtypes add one rounding, u_half |result|); differences below the compute dtype's
  smallest normal are forgiven (flushed subnormals).
* ``practical`` (the default of ``check``): u of the candidate's own dtype (every product and
  sum may be done in it: bfloat16 accumulation is allowed its worst-case error), plus K u times
  the largest entry of the result (the scale of the whole result), and a mean over no kept row
  may be NaN (torch's choice, 0 / 0) where the spec gives 0; its gradients must still be finite.

NaN-free: every value and gradient must be finite (all these regions have finite math); a
non-finite result is its own kind of failure.

Imports: the report types from ``findings``; it must not import ``_check`` (which imports it to
hand the fused losses over) and imports no framework at import time.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import losses, spec
from . import backends as B
from . import devices as D
from .backends import _literal
from .cases import DTYPE_MAX
from .findings import (
    UNNAMED_NOTE,
    CheckReport,
    Hazard,
    _name_of,
    _plain,
    shrink_search,
    unsupported_lines,
)
from .runner import Record, _short
from .tolerance import (
    ACCEPT_ALL_IGNORED_NAN,
    ALL_IGNORED_NAN,
    ALL_IGNORED_NAN_NOTE,
    CAP_ULPS,
    SMALLEST_NORMAL,
    SMALLEST_SUBNORMAL,
    STANDARDS,
    UNIT_ROUNDOFF,
    K,
    ulp,
)

REGIONS = losses.LINEAR_REGIONS
NAMES = losses.LINEAR_NAMES
WRT = ("hidden", "linear_weight", "bias")
# the positional arguments of a candidate, as the input guard names them
ARGS = ("hidden", "linear_weight", "targets", "bias")
HALF = ("float16", "bfloat16")
# (N, H, V) per level: small enough for a 2-core CPU, V prime (no block divides it evenly)
SHAPES = {"quick": ((45, 16, 97),), "full": ((45, 16, 97), (130, 24, 1031))}
# the option sets dualloss's own backends are run with ("vector": a ramp over the classes).
# Their chunk sizes leave a partial last block of rows at every shape (the default chunk would
# take all N rows in one block): 45 = 2 x 16 + 13 = 4 x 11 + 1 (one extra row), 130 = 8 x 16 + 2
# = 11 x 11 + 9. The spec accepts chunk_size and has nothing to chunk.
OPTION_SETS = {
    losses.LINEAR_SOFTMAX_CROSS_ENTROPY.name: (
        {"chunk_size": 16},
        {"weight": "vector", "label_smoothing": 0.1, "chunk_size": 11},
    ),
    losses.LINEAR_SOFTMAX_FOCAL_LOSS.name: (
        {"gamma": 2.0, "chunk_size": 16},
        {"gamma": 0.5, "alpha": "vector", "label_smoothing": 0.1, "chunk_size": 11},
    ),
}


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------


def _typical(rng, n, h, v):
    hidden = rng.normal(size=(n, h))
    kernel = rng.normal(size=(h, v)) / math.sqrt(h)
    bias = rng.normal(size=v) * 0.1
    targets = rng.integers(0, v, size=n)
    return hidden, kernel, bias, targets


def _huge_norms(rng, n, h, v):
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    return hidden * 3e3, kernel, bias, targets


def _ties(rng, n, h, v):
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    kernel[:, 1] = kernel[:, 2] = kernel[:, 0]
    bias[1] = bias[2] = bias[0]
    targets[: n // 2] = rng.integers(0, 3, size=n // 2)
    return hidden, kernel, bias, targets


def _ignored(rng, n, h, v):
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    targets[::3] = -100
    return hidden, kernel, bias, targets


def _all_ignored(rng, n, h, v):
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    targets[:] = -100
    return hidden, kernel, bias, targets


def _one_class_dominant(rng, n, h, v):
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    bias[5] = 40.0
    targets[: 2 * n // 3] = 5
    return hidden, kernel, bias, targets


def _confident(rng, n, h, v):
    # each row's own target dominates by a margin of 20 to 36 (p_y within 1e-9 to 1e-16 of 1):
    # the loss and its gradients are tiny, judged at their own scale; lse - z_y formed as a
    # difference of two large numbers loses them
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    hidden *= 0.1
    margins = np.linspace(20.0, 36.0, n)
    for i in range(n):
        direction = kernel[:, targets[i]] / np.dot(kernel[:, targets[i]], kernel[:, targets[i]])
        for _ in range(60):
            z = hidden[i] @ kernel + bias
            gap = z[targets[i]] - np.max(np.delete(z, targets[i]))
            if gap >= margins[i]:
                break
            hidden[i] += (margins[i] - gap + 1.0) * direction
    return hidden, kernel, bias, targets


def _near_ties(rng, n, h, v):
    # three vocabulary columns a few float32 ULPs apart: float32 keeps them apart, the half
    # dtypes round them to exact ties; the targets sit on them
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    kernel[:, 1] = kernel[:, 0] * (1 + 2.0**-20)
    kernel[:, 2] = kernel[:, 0] * (1 - 2.0**-21)
    bias[1] = bias[2] = bias[0]
    targets[:] = rng.integers(0, 3, size=n)
    return hidden, kernel, bias, targets


def _mostly_ignored(rng, n, h, v):
    # one kept row among ignored ones: the mean divides by 1 (not by N)
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    targets[:-1] = -100
    return hidden, kernel, bias, targets


def _bias_mask(rng, n, h, v):
    # classes masked without -inf: a bias of -1e4 (finite in every dtype) on every other class;
    # their probabilities underflow to exactly 0 in float32, the targets avoid them
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    bias[1::2] = -1e4
    targets[:] = 2 * rng.integers(0, (v + 1) // 2, size=n)
    return hidden, kernel, bias, targets


def _half_overflow(rng, n, h, v):
    # hidden and weight finite in float16 (|h| <= 3e4), their product is not: a third of the
    # rows have a target logit past 65504 (float16's largest), so logits formed in float16 are
    # inf; the other rows are typical
    hidden, kernel, bias, targets = _typical(rng, n, h, v)
    for i in range(n // 3):
        column = kernel[:, targets[i]]
        hidden[i] = 3e4 * np.sign(column) * (np.abs(column) > 0.25 * np.abs(column).max())
    return hidden, kernel, bias, targets


def _one_row(rng, n, h, v):
    # N = 1: no reduction over rows to hide a bad row behind
    return _typical(rng, 1, h, v)


def _wide_vocab(rng, n, h, v):
    # V = 4099 (prime): many times any vocabulary block, with a partial last block
    return _typical(rng, min(n, 8), h, 4099)


def _long_hidden(rng, n, h, v):
    # H = 1024: dot products long enough that accumulating them in bfloat16 costs digits
    return _typical(rng, min(n, 12), 1024, v)


# the regions that fix their own shape (N, H or V) instead of the level's
OWN_SHAPE = ("one_row", "wide_vocab", "long_hidden")
# one generator per region: (rng, N, H, V) -> hidden (N, H), kernel (H, V), bias (V,), targets;
# the last three regions fix their own shape (N, H or V)
GENERATORS = {
    "typical": _typical,
    "huge_norms": _huge_norms,
    "ties": _ties,
    "ignored": _ignored,
    "all_ignored": _all_ignored,
    "one_class_dominant": _one_class_dominant,
    "confident": _confident,
    "near_ties": _near_ties,
    "mostly_ignored": _mostly_ignored,
    "bias_mask": _bias_mask,
    "half_overflow": _half_overflow,
    "one_row": _one_row,
    "wide_vocab": _wide_vocab,
    "long_hidden": _long_hidden,
}


@dataclass
class LinearCase:
    """One input in the spec's layout (float64; targets int64, -100 ignored) and its options."""

    loss: str
    region: str
    label: str
    hidden: np.ndarray
    linear_weight: np.ndarray  # (H, V)
    bias: np.ndarray | None
    targets: np.ndarray
    options: dict = field(default_factory=dict)
    # the loss's record; `loss` may be given as the record too (``cases.Case`` does the same)
    info: losses.LossInfo = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.loss, losses.LossInfo):
            self.info = self.loss
        elif self.info is None:
            self.info = losses.get(self.loss)
        self.loss = self.info.name

    @property
    def name(self) -> str:
        return f"{self.region}/{self.label}"

    def rows(self, index: int) -> LinearCase:
        """The case restricted to one row."""
        return replace(
            self,
            label=f"{self.label}[row {index}]",
            hidden=self.hidden[index : index + 1],
            targets=self.targets[index : index + 1],
        )

    def folded(self) -> LinearCase:
        """The same logits without a bias: a constant feature 1 carries it."""
        if self.bias is None:
            return self
        ones = np.ones((*self.hidden.shape[:-1], 1))
        return replace(
            self,
            hidden=np.concatenate([ones, self.hidden], axis=-1),
            linear_weight=np.concatenate([self.bias[None, :], self.linear_weight], axis=0),
            bias=None,
        )


def _classes(options: dict) -> int | None:
    """The number of classes an array option (class weights, alpha) fixes, or None."""
    sizes = [np.size(v) for v in options.values() if isinstance(v, np.ndarray) or
             (hasattr(v, "shape") and np.ndim(v))]  # fmt: skip
    return sizes[0] if sizes else None


def region_inputs(region: str, n: int = 45, h: int = 16, v: int = 97, seed: int = 0):
    """(hidden, kernel, bias, targets) of `region` at (N, H, V), float64, seeded."""
    if region not in GENERATORS:
        raise ValueError(f"`region` must be one of {REGIONS}. Received: region={region!r}.")
    return GENERATORS[region](np.random.default_rng(seed), n, h, v)


def option_values(options: dict, num_classes: int) -> dict:
    """`options` with "vector" replaced by a ramp of class weights in [0.2, 0.9]."""
    ramp = np.linspace(0.2, 0.9, num_classes)
    return {k: (ramp if isinstance(v, str) and v == "vector" else v) for k, v in options.items()}


def make_cases(
    loss: str, options: dict | None = None, *, level: str = "quick", regions=None, skip=()
) -> list[LinearCase]:
    """Every case of `loss` (a name or its record) with `options` (spec options; "vector"
    entries become ramps)."""
    info = losses.get(loss)
    if level not in SHAPES:
        raise ValueError(f"`level` must be 'quick' or 'full'. Received: level={level!r}.")
    out, seen = [], set()
    for n, h, v in SHAPES[level]:
        for region in REGIONS:
            if (regions is not None and region not in regions) or region in skip:
                continue
            hidden, kernel, bias, targets = region_inputs(region, n, h, v)
            # a region that fixes its own shape gives the same case at every level's shape
            label = "x".join(str(d) for d in (*hidden.shape, kernel.shape[1]))
            v_of = kernel.shape[1]
            if (region, label) in seen or _classes(dict(options or {})) not in (None, v_of):
                continue
            seen.add((region, label))
            # ignored rows carry the options' ignore_index
            targets = np.where(targets == -100, dict(options or {}).get("ignore_index", -100),
                               targets)  # fmt: skip
            out.append(
                LinearCase(info, region, label, hidden, kernel, bias, targets.astype(np.int64),
                           option_values(dict(options or {}), kernel.shape[1]))
            )  # fmt: skip
    return out


def case_by_name(loss: str, name: str, options: dict | None = None) -> LinearCase:
    """The case called `name` ('ignored/45x16x97', with '[row i]' for one row), for reproducers."""
    base, _, row = name.partition("[row ")
    region, _, label = base.partition("/")
    for case in make_cases(loss, options, level="full", regions=[region]):
        if case.label == label:
            return case.rows(int(row.rstrip("]"))) if row else case
    raise ValueError(f"`name` must name a case of {loss}. Received: name={name!r}.")


@dataclass
class Prepared:
    """A case rounded to a dtype: what the candidate gets (its dtype) and the spec's float64."""

    case: LinearCase
    dtype: str
    hidden: np.ndarray
    linear_weight: np.ndarray
    bias: np.ndarray | None
    options: dict  # array options rounded to the dtype, as float64

    @property
    def ref(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """hidden, linear_weight, bias in float64: exactly the values the candidate gets."""
        as64 = [None if x is None else x.astype(np.float64) for x in (self.hidden,
                self.linear_weight, self.bias)]  # fmt: skip
        return as64[0], as64[1], as64[2]


def prepare(case: LinearCase, dtype: str) -> Prepared:
    rounded = [None if x is None else B.round_to(x, dtype) for x in (case.hidden,
               case.linear_weight, case.bias)]  # fmt: skip
    options = {
        k: (B.round_to(v, dtype).astype(np.float64) if isinstance(v, np.ndarray) else v)
        for k, v in case.options.items()
    }
    return Prepared(case, dtype, rounded[0], rounded[1], rounded[2], options)


def inputs(loss: str, dtype: str, name: str, backend: str, bias: bool = True, device="cpu"):
    """The backend's arrays (hidden, linear_weight in the backend's layout, targets[, bias]) of
    the case called `name`, rounded to `dtype`; hidden, linear_weight and bias require grad
    (torch). For reproducers: ``h, w, t, b = inputs(...)``."""
    case = case_by_name(loss, name)
    prep = prepare(case if bias else case.folded(), dtype)
    return _backend_arrays(prep, backend, D.device_object(backend, D.canonical(device)))[0]


def from_values(hidden, linear_weight, targets, bias=None, *, dtype: str, backend: str,
                device="cpu"):  # fmt: skip
    """The backend's arrays (as ``inputs``) of explicit values: `linear_weight` in the spec's
    layout (H, V), transposed for torch. For the reproducers of inputs Hypothesis drew."""
    case = LinearCase(
        NAMES[0], "hypothesis", "drawn", np.asarray(hidden, dtype=np.float64),
        np.asarray(linear_weight, dtype=np.float64),
        None if bias is None else np.asarray(bias, dtype=np.float64),
        np.asarray(targets, dtype=np.int64),
    )  # fmt: skip
    prep = prepare(case, dtype)
    return _backend_arrays(prep, backend, D.device_object(backend, D.canonical(device)))[0]


# ----------------------------------------------------------------------------------------------
# Running a candidate
# ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    value: np.ndarray | None = None
    grads: dict = field(default_factory=dict)  # spec layout, float64
    error: str | None = None
    dtypes: tuple = ()  # of the value and the gradients, as the candidate returned them
    written: tuple = ()  # the inputs the call changed (``backends.fingerprints``)


def _backend_arrays(prep: Prepared, backend: str, device):
    """([hidden, linear_weight, targets, (bias)], leaves) as the backend's arrays."""
    dtype = prep.dtype
    targets = prep.case.targets.astype(np.int64)
    if backend == "torch":
        h = B.torch_array(prep.hidden, dtype, device).requires_grad_(True)
        w = B.torch_array(np.ascontiguousarray(prep.linear_weight.T), dtype, device)
        w.requires_grad_(True)
        args = [h, w, B.torch_array(targets, dtype, device)]
        if prep.bias is not None:
            args.append(B.torch_array(prep.bias, dtype, device).requires_grad_(True))
        return args, [a for i, a in enumerate(args) if i != 2]
    args = [B.jax_array(prep.hidden, dtype, device), B.jax_array(prep.linear_weight, dtype, device)]
    args.append(B.jax_array(targets, dtype, device))
    if prep.bias is not None:
        args.append(B.jax_array(prep.bias, dtype, device))
    return args, [a for i, a in enumerate(args) if i != 2]


# id(candidate) -> (candidate, its jax.jit): the candidate is held so that its id stays its own
_JITTED: dict = {}


def run(fn, backend: str, prep: Prepared, device: Any = "cpu", jit: bool = False) -> Outcome:
    """`fn(hidden, linear_weight, targets[, bias])`'s value and gradients of its sum (spec
    layout, float64); an exception is the outcome's `error`."""
    names = WRT if prep.bias is not None else WRT[:2]
    if isinstance(device, str):
        device = D.device_object(backend, D.canonical(device, "device"))
    try:
        if backend == "torch":
            import torch

            args, leaves = _backend_arrays(prep, backend, device)
            inputs = dict(zip(ARGS, args, strict=False))
            before = B.fingerprints(inputs, backend)
            out = fn(*args)
            if not isinstance(out, torch.Tensor):
                out = torch.as_tensor(out)
            grads = [None] * len(leaves)
            if out.requires_grad:
                grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)
            pairs = zip(leaves, grads, strict=True)
            grads = [torch.zeros_like(x) if g is None else g for x, g in pairs]
            dtypes = tuple(str(x.dtype).replace("torch.", "") for x in (out, *grads))
            grads[1] = grads[1].T
            written = B.changed(before, inputs, backend)
            value = out.detach().to(torch.float64).cpu().numpy()
            grads = [g.detach().to(torch.float64).cpu().numpy() for g in grads]
        else:
            import jax
            import jax.numpy as jnp

            with jax.enable_x64(prep.dtype == "float64" or bool(jax.config.jax_enable_x64)):
                args, leaves = _backend_arrays(prep, backend, device)
                inputs = dict(zip(ARGS, args, strict=False))
                before = B.fingerprints(inputs, backend)
                targets = args[2]
                if jit:
                    # one jitted function per candidate: the shapes share it
                    if id(fn) not in _JITTED:
                        _JITTED[id(fn)] = (fn, jax.jit(lambda h, w, t, *b: fn(h, w, t, *b)))
                    jitted = _JITTED[id(fn)][1]

                    def f(*leaves):
                        return jitted(leaves[0], leaves[1], targets, *leaves[2:])
                else:

                    def f(*leaves):
                        return fn(leaves[0], leaves[1], targets, *leaves[2:])

                value, pull = jax.vjp(f, *leaves)
                grads = list(pull(jnp.ones_like(value)))
                dtypes = tuple(str(x.dtype) for x in (value, *grads))
                value = np.asarray(value).astype(np.float64)
                grads = [np.asarray(g).astype(np.float64) for g in grads]
                written = B.changed(before, inputs, backend)
    except Exception as error:  # noqa: BLE001 - a crash is a finding, reported as such
        return Outcome(error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
    return Outcome(value=value, grads=dict(zip(names, grads, strict=True)), dtypes=dtypes,
                   written=written)  # fmt: skip


def ours(backend: str, loss: str, options: dict, reduction: str):
    """dualloss's `backend` implementation of `loss` as a candidate with a bias argument."""
    if backend == "torch":
        import torch

        from .. import torch_impl as module

        def convert(x, like):
            return torch.tensor(x).to(like.device, like.dtype)
    else:
        import jax.numpy as jnp

        from .. import jax_impl as module

        def convert(x, like):
            return jnp.asarray(x, like.dtype)

    fn = getattr(module, loss)
    options = {k: v for k, v in options.items() if k != "reduction"}

    def candidate(hidden, linear_weight, targets, bias=None):
        kw = {k: convert(v, hidden) if isinstance(v, np.ndarray) else v
              for k, v in options.items()}  # fmt: skip
        return fn(hidden, linear_weight, targets, bias=bias, reduction=reduction, **kw)

    candidate.__qualname__ = f"{'torch_impl' if backend == 'torch' else 'jax_impl'}.{loss}"
    return candidate


# ----------------------------------------------------------------------------------------------
# The bound and the judgement
# ----------------------------------------------------------------------------------------------


def expected(loss: str, prep: Prepared) -> dict:
    """The spec's value and gradients (float64) at exactly the candidate's inputs."""
    hidden, kernel, bias = prep.ref
    info = losses.get(loss)
    targets = prep.case.targets
    out = {"value": np.asarray(info.spec(hidden, kernel, targets, bias=bias, **prep.options))}
    for wrt in WRT if bias is not None else WRT[:2]:
        out[wrt] = np.asarray(info.grad(hidden, kernel, targets, bias=bias, wrt=wrt,
                                        **prep.options))  # fmt: skip
    return out


def bound(loss: str, hidden, kernel, bias, targets, options: dict, u: float,
          tiny: float = 0.0) -> dict:  # fmt: skip
    """The error bound of the module docstring, per entry of the value and each gradient, for
    unit roundoff `u`; float64 inputs in the spec's layout. `tiny`: the smallest normal of the
    working precision, below which the logits' gradient (and the p it is made of) may be
    flushed to 0, an error the linear layer then multiplies by |W| (hidden) or |h| (weight)."""
    info = losses.get(loss)
    reduction = options.get("reduction", "mean")
    n, size = hidden.shape
    v = kernel.shape[1]
    gamma = info.gamma(options)
    b = np.zeros(v) if bias is None else bias
    logits = hidden @ kernel + b
    a_matrix = np.abs(hidden) @ np.abs(kernel) + np.abs(b)
    delta = (size + 1) * u * a_matrix.max(axis=1, keepdims=True)
    softmax = spec.softmax_focal_loss_intermediates if info.is_focal else (
        spec.softmax_cross_entropy_intermediates)  # fmt: skip
    kw = {k: val for k, val in options.items() if k not in ("reduction", "chunk_size")}
    elements = softmax(logits, targets, **kw)
    terms = elements.terms
    scale = 1.0
    if reduction == "mean":
        scale = 0.0 if elements.denominator == 0 else 1.0 / elements.denominator
    g_abs = np.abs(terms.grad) * scale
    mass = (1.0 + gamma) * np.sum(elements.a, axis=1, keepdims=True)
    # the normaliser's exp and log round even over one class: log2(V), at least 1
    log_v = max(math.log2(v), 1.0)
    # the LLM head options (DESIGN 13): the softmax sees c = cap tanh(logits / cap), which moves
    # by at most the logits' error (dc/dz <= 1) plus its own CAP_ULPS roundings
    # (``tolerance._softmax_spreads``); the gradient in c comes back times dc/dz
    delta_c = delta
    if elements.dcap is not None:
        c_top = np.max(np.where(np.isfinite(elements.z), np.abs(elements.z), 0.0), axis=1)
        delta_c = delta + CAP_ULPS * u * c_top[:, None]
    capped_abs = g_abs if elements.capped_grad is None else np.abs(elements.capped_grad) * scale
    e = (2 * delta_c * (1 + gamma) ** 2 + 8 * u * log_v) * (terms.p * mass + elements.a) * scale
    if elements.z_loss != 0.0:
        # the z part 2 z_loss lse p: p moves by 2 delta_c p relative, lse by delta_c + u |lse|,
        # and the part is rounded at its own size (8 u)
        lse = np.abs(elements.terms.lse)[:, None]
        z_part = 2.0 * elements.z_loss * terms.p
        e = e + z_part * (lse * (2 * delta_c + 8 * u) + delta_c + u * lse) * scale
    if elements.dcap is not None:
        # dc/dz = sech^2(x), x = logits / cap, moves by 2 |tanh x| sech^2(x) dx, with
        # dx = delta / cap + u |x| (the logits' error and the quotient's), plus 2 u for itself
        x = logits / elements.softcap
        dx = delta / elements.softcap + u * np.abs(x)
        ddcap = 2.0 * np.abs(np.tanh(x)) * elements.dcap * dx + 2.0 * u * elements.dcap
        e = e * elements.dcap + capped_abs * ddcap
    e = np.where(elements.keep[:, None], e, 0.0)
    loss_rows = np.abs(terms.loss)
    row_bound = (
        delta_c[:, 0] * np.sum(capped_abs, axis=1)
        + 8 * u * (loss_rows + log_v * mass[:, 0]) * scale
    )
    row_bound = np.where(elements.keep, row_bound, 0.0)
    gamma_v, gamma_n = (v + 1) * u, (n + 1) * u
    if reduction == "none":
        value = row_bound
    else:
        value = np.sum(row_bound) + gamma_n * np.sum(loss_rows) * scale
    # flushed subnormals: p_ic (times sum_c v_c <= m_i) and G_ic itself, each below tiny
    e = e + np.where(elements.keep[:, None], tiny * (1.0 + mass * scale), 0.0)
    out = {
        "value": np.asarray(value),
        "hidden": e @ np.abs(kernel).T + gamma_v * g_abs @ np.abs(kernel).T,
        "linear_weight": np.abs(hidden).T @ e + gamma_n * np.abs(hidden).T @ g_abs,
    }
    if bias is not None:
        out["bias"] = e.sum(axis=0) + gamma_n * g_abs.sum(axis=0)
    return out, elements.denominator


def tolerances(loss: str, prep: Prepared, want: dict, standard: str) -> dict:
    """Per entry of the value and each gradient: the bound of `standard` (module docstring)."""
    dtype = prep.dtype
    hidden, kernel, bias = prep.ref
    practical = standard == "practical"
    work = dtype if practical or dtype not in HALF else "float32"
    u = UNIT_ROUNDOFF[work]
    out, _ = bound(loss, hidden, kernel, bias, prep.case.targets, prep.options, u,
                   SMALLEST_NORMAL[work])  # fmt: skip
    for what, tolerance in out.items():
        e = np.abs(want[what])
        tolerance = tolerance + SMALLEST_NORMAL[work] * (K if practical else 1.0)
        if practical:
            tolerance = tolerance + K * u * np.max(e, initial=0.0)
        elif dtype in HALF:
            # computed in float32, rounded once to the half dtype
            tolerance = tolerance + UNIT_ROUNDOFF[dtype] * e + SMALLEST_SUBNORMAL[dtype]
        out[what] = tolerance
    return out


@dataclass
class Judgement:
    kind: str  # ok | non-finite | accuracy | tolerance.ALL_IGNORED_NAN
    expected: dict
    received: dict
    problems: list[str]
    ratio: float = 0.0


def judge(loss: str, prep: Prepared, outcome: Outcome, standard: str = "strict") -> Judgement:
    """The candidate's value and gradients against the spec within ``tolerances``."""
    if standard not in STANDARDS:
        raise ValueError(
            f"`standard` must be 'practical' or 'strict'. Received: standard={standard!r}."
        )
    want = expected(loss, prep)
    tol = tolerances(loss, prep, want, standard)
    got = {"value": outcome.value, **outcome.grads}
    nonfinite, inaccurate, worst = [], [], 0.0
    nan_on_empty = False
    kept = prep.case.targets != prep.options.get("ignore_index", -100)
    empty_mean = prep.options.get("reduction", "mean") == "mean" and not kept.any()
    for what, e in want.items():
        g = np.broadcast_to(np.asarray(got[what], dtype=np.float64), e.shape)
        if what == "value" and standard == "practical" and empty_mean and np.isnan(g).all():
            nan_on_empty = True  # 0 / 0: a hazard of its own kind (``tolerance.ALL_IGNORED_NAN``)
            continue
        if not np.all(np.isfinite(g)):
            at = tuple(int(i) for i in np.argwhere(~np.isfinite(g))[0]) if g.ndim else ()
            count = int(np.sum(~np.isfinite(g)))
            nonfinite.append(
                f"{_label(what)} is {float(g[at])!r} at {at} where the spec gives "
                f"{float(e[at])!r} ({count} of {g.size} entries non-finite)"
            )
            continue
        err = np.abs(g - e)
        ratio = err / np.maximum(tol[what], SMALLEST_SUBNORMAL["float64"])
        at = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.ndim else ()
        at = tuple(int(i) for i in at)
        worst = max(worst, float(ratio[at]))
        if ratio[at] > 1.0:
            inaccurate.append(
                f"{_label(what)} is {float(g[at])!r} at {at} where the spec gives "
                f"{float(e[at])!r}: error {float(err[at]):.3g} > tolerance "
                f"{float(np.asarray(tol[what])[at]):.3g} ({float(ratio[at]):.3g}x; "
                f"{float(err[at] / ulp(e[at], prep.dtype)):.3g} ULP of {prep.dtype})"
            )
    kind = "non-finite" if nonfinite else ("accuracy" if inaccurate else "ok")
    problems = nonfinite + inaccurate
    if nan_on_empty:
        kind = ALL_IGNORED_NAN if kind == "ok" else kind
        problems.append(f"{ALL_IGNORED_NAN}: {ALL_IGNORED_NAN_NOTE}")
    return Judgement(kind, want, got, problems, worst)


def _label(what: str) -> str:
    return "value" if what == "value" else f"gradient w.r.t. {what}"


def evaluate(fn, backend, loss, prep, device="cpu", jit=False, standard="strict"):
    """(kind, judgement or None, outcome) of one call."""
    outcome = run(fn, backend, prep, device, jit)
    if outcome.error is not None:
        return "error", None, outcome
    try:
        judgement = judge(loss, prep, outcome, standard)
    except Exception as error:  # noqa: BLE001 - e.g. a wrong output shape
        outcome.error = f"could not judge the output: {type(error).__name__}: {error}"
        return "error", None, outcome
    if outcome.written:
        return "writes input", judgement, outcome
    return judgement.kind, judgement, outcome


# ----------------------------------------------------------------------------------------------
# Failures and reproducers
# ----------------------------------------------------------------------------------------------


@dataclass
class LinearFailure:
    """One failing call, shrunk to one row where that row fails the same way."""

    kind: str
    loss: str
    impl: str
    backend: str
    device: str
    mode: str
    dtype: str
    case: str
    problems: list[str]
    options: dict
    rows: int
    expected: dict
    received: dict
    reproducer: str

    def describe(self) -> str:
        lines = [f"[{self.kind}] {self.impl}.{self.loss} {self.dtype} {self.device} {self.mode} "
                 f"case {self.case}"]  # fmt: skip
        lines += [f"    {p}" for p in self.problems]
        lines.append(f"    options: {_short(self.options)}")
        lines.append(f"    reproduce: {self.reproducer}")
        return "\n".join(lines)


def reproducer(call: str, imports: str, prep: Prepared, backend: str, device: str) -> str:
    """One line of Python that rebuilds the inputs of `prep` and calls the candidate."""
    bias = prep.bias is not None
    loss, dtype, name = prep.case.loss, prep.dtype, prep.case.name
    args = "h, w, t, b" if bias else "h, w, t"
    head = "import torch" if backend == "torch" else "import jax, jax.numpy as jnp"
    if backend == "jax" and dtype == "float64":
        head += "; jax.config.update('jax_enable_x64', True)"
    make = (f"from dualloss.parity.linear import inputs; {args} = inputs({loss!r}, {dtype!r}, "
            f"{name!r}, {backend!r}, bias={bias}, device={device!r})")  # fmt: skip
    if prep.case.region == "hypothesis":
        # a drawn input has no name to rebuild it from: its values, as the candidate got them
        hidden, kernel, b = prep.ref
        values = f"{_literal(hidden)}, {_literal(kernel)}, {_literal(prep.case.targets)}"
        if bias:
            values += f", {_literal(b)}"
        make = (f"from dualloss.parity.linear import from_values; {args} = from_values("
                f"{values}, dtype={dtype!r}, backend={backend!r}, device={device!r})")  # fmt: skip
    imports = f"; {imports}" if imports else ""
    if backend == "torch":
        grads = "h.grad, w.grad" + (", b.grad" if bias else "")
        return (f"{head}{imports}; {make}; y = {call}({args}); y.sum().backward(); "
                f"print(y, {grads})")  # fmt: skip
    argnums = "(0, 1, 3)" if bias else "(0, 1)"
    return (f"{head}{imports}; {make}; print(jax.value_and_grad(lambda h, w, t"
            f"{', b' if bias else ''}: {call}(h, w, t{', b' if bias else ''}).sum(), "
            f"argnums={argnums})({args}))")  # fmt: skip


def _failure(name, imports, call, fn, backend, loss, prep, label, mode, dev, kind, judgement,
             outcome, jit, standard) -> LinearFailure:  # fmt: skip
    """The failure of the whole case (its problems, at their real size), reproduced by the
    first of the case's first 16 rows that fails the same way (else by the whole case)."""
    problems = judgement.problems if judgement is not None else [outcome.error or "failed"]
    problems = [f"{B.WRITTEN} {n} (it differs after the call)" for n in outcome.written] + problems
    loss = prep.case.info
    small = prep
    for i in range(min(prep.hidden.shape[0], 16) if prep.hidden.shape[0] > 1 else 0):
        row = prepare(prep.case.rows(i), prep.dtype)
        row.options = dict(prep.options)
        if evaluate(fn, backend, loss, row, dev, jit, standard)[0] == kind:
            small = row
            break
    return LinearFailure(
        kind, loss.name, name, backend, label, mode, prep.dtype, prep.case.name, problems,
        dict(prep.options), int(small.hidden.shape[0]),
        {} if judgement is None else judgement.expected,
        {} if judgement is None else judgement.received,
        reproducer(call, imports, small, backend, label),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# check: a user's fused loss
# ----------------------------------------------------------------------------------------------

FEATURES = {
    "ignored": "ignored labels (targets equal to ignore_index)",
    "all_ignored": "all-ignored batches",
}


@dataclass(repr=False)
class LinearCheckReport(CheckReport):
    """``CheckReport`` of a fused linear loss: the hazards carry ``LinearFailure``s."""

    def __str__(self) -> str:
        options = ", ".join(f"{k}={_plain(v)}" for k, v in self.options.items()) or "defaults"
        if self.ok:
            verdict = "OK"
        elif not self.hazards:
            verdict = "NOT VERIFIED (nothing judged)"
        else:
            counts: dict[str, int] = {}
            for h in self.hazards:
                counts[h.failure.kind] = counts.get(h.failure.kind, 0) + 1
            verdict = (f"FAILS: {len(self.hazards)} distinct problem(s) ("
                       + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")")  # fmt: skip
        lines = [
            f"{self.candidate} vs spec.{self.reference} ({self.backend}; {options}): {verdict}",
            f"  device: {self.device}",
            f"  {self.cases_judged} of {self.cases_run} adversarial cases judged "
            f"({', '.join(self.dtypes)}), {self.examples_run} Hypothesis examples, values and "
            "gradients w.r.t. "
            f"{', '.join(WRT if self.options.get('bias') else WRT[:2])}, {self.standard} standard",
        ]
        for i, h in enumerate(self.hazards, 1):
            f = h.failure
            more = f"; {h.count} cases" if h.count > 1 else ""
            lines.append(f"{i}. [{f.kind}] region {h.region}, {'/'.join(h.dtypes)}{more}: "
                         f"case {f.case}")  # fmt: skip
            lines += [f"   {p}" for p in f.problems[:4]]
            lines.append(f"   reproduce: {f.reproducer}")
        lines += unsupported_lines(self.unsupported)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def _validate(info, options: dict, skip, dtypes, max_examples) -> list[str]:
    allowed = [n for n in inspect.signature(info.spec).parameters if n not in info.inputs]
    for name in options:
        if name not in allowed:
            raise ValueError(
                f"`options` has {name!r}, which spec.{info.name} does not take (it takes "
                f"{', '.join(allowed)}). Received: options={options!r}."
            )
    if options.get("bias") not in (None, True, False):
        raise ValueError(
            "`options['bias']` must be True (the candidate takes a bias as its fourth argument) "
            f"or False. Received: bias={options['bias']!r}."
        )
    scalars = {k: v for k, v in options.items() if k != "bias" and not isinstance(v, np.ndarray)
               and not hasattr(v, "shape") and not isinstance(v, (list, tuple))}  # fmt: skip
    info.spec(*info.sample_inputs(), **scalars)  # the spec's own one-sentence errors
    for region in skip:
        if region not in REGIONS + (ACCEPT_ALL_IGNORED_NAN,):
            raise ValueError(
                f"`skip` entries must be among {', '.join(REGIONS)}, {ACCEPT_ALL_IGNORED_NAN}. "
                f"Received: {region!r}."
            )
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes or ("float32", "float64"))
    if not dtypes:
        raise ValueError("`dtypes` must name at least one dtype. Received: dtypes=[].")
    for dtype in dtypes:
        if dtype not in B.DTYPES:
            raise ValueError(f"`dtypes` entries must be among {', '.join(B.DTYPES)}. "
                             f"Received: {dtype!r}.")  # fmt: skip
    return dtypes


def _features(case: LinearCase, options: dict) -> set[str]:
    ignored = case.targets == options.get("ignore_index", -100)
    if ignored.size and ignored.all():
        return {"all_ignored"}
    return {"ignored"} if ignored.any() else set()


def _explore(candidate, backend, info, options, dtype, with_bias, dev, jit, standard,
             max_examples, unsupported, skip, failure_of):  # fmt: skip
    """Hypothesis search over small fused inputs (as ``_check._explore`` for the logits: the
    same settings, derandomized, shrunk): (the shrunk input's failure or None, examples run).

    N in [1, 3], H in [1, 3], V in [1, 7]; hidden entries typical or huge (up to 3e4, finite in
    float16, and products past float16's range), weights typical or large, the bias typical,
    dominant (40) or a finite mask (-1e4); ignored rows when the candidate supports them, never
    every row (the all-ignored region judges that); the features the candidate lacks are not
    drawn. `failure_of(prep, kind, judgement, outcome)` makes the report's failure."""
    try:
        from hypothesis import strategies as st
    except ImportError:
        return None, 0
    big = 0.5 * DTYPE_MAX[dtype]
    huge = "huge_norms" not in skip and "half_overflow" not in skip
    hidden_specials = [0.0, 1.0, -1.0, 30.0, -30.0] + ([300.0, -300.0, 3e4, -3e4] if huge else [])
    hidden_element = st.one_of(st.floats(-4.0, 4.0, width=32), st.sampled_from(hidden_specials))
    weight_element = st.one_of(st.floats(-2.0, 2.0, width=32),
                               st.sampled_from([0.0, 1.0, -1.0, 4.0, -4.0]))  # fmt: skip
    bias_specials = [0.0, 40.0] + ([-1e4] if "bias_mask" not in skip else [])
    bias_element = st.one_of(st.floats(-4.0, 4.0, width=32), st.sampled_from(bias_specials))
    ignore_index = options.get("ignore_index", -100)
    allow_ignore = "ignored" not in skip and "ignored" not in unsupported
    # a class-weight (or alpha) vector the user gave fixes V
    fixed_v = _classes(options)

    @st.composite
    def draw_inputs(draw):
        n, h = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        v = fixed_v or draw(st.integers(1, 7))
        hidden = np.array(draw(st.lists(hidden_element, min_size=n * h, max_size=n * h)))
        kernel = np.array(draw(st.lists(weight_element, min_size=h * v, max_size=h * v)))
        bias = np.array(draw(st.lists(bias_element, min_size=v, max_size=v)))
        targets = np.array(draw(st.lists(st.integers(0, v - 1), min_size=n, max_size=n)))
        if allow_ignore and n > 1:
            ignored = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
            ignored[-1] = False  # never every row
            targets = np.where(ignored, ignore_index, targets)
        hidden = np.clip(hidden.reshape(n, h), -big, big)
        return hidden, kernel.reshape(h, v), bias, targets.astype(np.int64)

    def attempt(data):
        hidden, kernel, bias, targets = data
        case = LinearCase(info, "hypothesis", "drawn", hidden, kernel, bias, targets,
                          option_values(dict(options), kernel.shape[1]))  # fmt: skip
        if not with_bias:
            case = case.folded()
        prep = prepare(case, dtype)
        kind, judgement, outcome = evaluate(candidate, backend, info, prep, dev, jit, standard)
        return None if kind in ("ok", ALL_IGNORED_NAN) else (prep, kind, judgement, outcome)

    last, count = shrink_search(draw_inputs(), attempt, max_examples)
    return (None, count) if last is None else (failure_of(*last), count)


def check(
    candidate,
    reference: str,
    *,
    backend: str,
    options: dict | None = None,
    dtypes=None,
    max_examples: int | None = None,
    skip=(),
    device: str | None = None,
    jit: bool = False,
    stop_at_first: bool = False,
    standard: str = "practical",
    binary_targets: bool = False,
) -> LinearCheckReport:
    """``parity.check`` for a fused linear loss (module docstring); the same arguments.

    `options` are the spec keyword arguments the candidate implements, fixed for every input
    (weight, alpha, gamma, ignore_index, label_smoothing, reduction), plus ``bias=True`` when
    the candidate takes a bias as its fourth argument. There is no Hypothesis exploration for
    After the regions, Hypothesis draws `max_examples` small inputs per dtype (default 50; 0:
    none) and shrinks the first failing one to the smallest it finds, reproduced with its
    values (``_explore``).
    """
    info = losses.get(reference)  # ``parity.check`` hands over the record it resolved
    if backend not in B.BACKENDS:
        raise ValueError(f"`backend` must be one of {B.BACKENDS}. Received: backend={backend!r}.")
    if standard not in STANDARDS:
        raise ValueError(
            f"`standard` must be 'practical' or 'strict'. Received: standard={standard!r}."
        )
    if binary_targets:
        raise ValueError(
            f"`binary_targets` applies to sigmoid losses only. Received: reference={info.name!r}."
        )
    if max_examples is not None and int(max_examples) < 0:
        raise ValueError(f"`max_examples` must be >= 0. Received: max_examples={max_examples}.")
    max_examples = 50 if max_examples is None else int(max_examples)
    options = dict(options or {})
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    dtypes = _validate(info, options, skip, dtypes, max_examples)
    # not a region: the user accepts a NaN loss over an all-ignored batch (torch's 0 / 0)
    accept_nan = ACCEPT_ALL_IGNORED_NAN in skip
    skip = tuple(r for r in skip if r != ACCEPT_ALL_IGNORED_NAN)
    with_bias = bool(options.get("bias"))
    spec_options = {k: v for k, v in options.items() if k != "bias"}
    name, imports, call = _name_of(candidate)
    label, dev = D.one_device(backend, device)
    mode = "jit" if (jit and backend == "jax") else "eager"
    report = LinearCheckReport(name, info.name, backend, options, standard, dtypes, device=label,
                               info=info)  # fmt: skip
    report.precision = D.pin_precision([backend])
    if call == "candidate":
        report.notes.append(UNNAMED_NOTE)
    hazards: dict[tuple[str, str], Hazard] = {}
    cases = make_cases(info, spec_options, skip=skip)
    if not with_bias:
        cases = [case.folded() for case in cases]
    jit = jit and backend == "jax"
    for dtype in dtypes:
        unsupported = set()
        by_feature = {}
        for case in cases:
            for feature in _features(case, spec_options):
                by_feature.setdefault(feature, case)
        plain = next((c for c in cases if not _features(c, spec_options)), None)
        if plain is not None:
            kind, _, outcome = evaluate(candidate, backend, info, prepare(plain, dtype), dev,
                                        jit, standard)  # fmt: skip
            if kind == "error":
                failure = _failure(name, imports, call, candidate, backend, info,
                                   prepare(plain, dtype), label, mode, dev, "error", None,
                                   outcome, jit, standard)  # fmt: skip
                failure.problems = [f"raised on every input tried: {outcome.error}"]
                hazards.setdefault(("error", "every input"), Hazard(failure, "every input", 1,
                                                                    [dtype]))  # fmt: skip
                report.cases_run += len(cases)
                continue
        for feature, case in by_feature.items():
            prep = prepare(case, dtype)
            kind, _, outcome = evaluate(candidate, backend, info, prep, dev, jit, standard)
            if kind == "error":
                unsupported.add(feature)
                repro = reproducer(call, imports, prep, backend, label)
                report.unsupported.setdefault(feature, f"{outcome.error}\n      reproduce: {repro}")
        if "ignored" in unsupported:
            unsupported.add("all_ignored")
        for case in cases:
            report.cases_run += 1
            if _features(case, spec_options) & unsupported:
                continue
            prep = prepare(case, dtype)
            kind, judgement, outcome = evaluate(candidate, backend, info, prep, dev, jit,
                                                standard)  # fmt: skip
            report.cases_judged += kind != "error"
            if kind == ALL_IGNORED_NAN and accept_nan:
                note = f"accepted (skip={ACCEPT_ALL_IGNORED_NAN!r}): {ALL_IGNORED_NAN}"
                if note not in report.notes:
                    report.notes.append(note)
                continue
            if kind == "ok":
                continue
            key = (kind, case.region)
            if key in hazards:
                hazards[key].count += 1
                if dtype not in hazards[key].dtypes:
                    hazards[key].dtypes.append(dtype)
                continue
            failure = _failure(name, imports, call, candidate, backend, info, prep, label,
                               mode, dev, kind, judgement, outcome, jit, standard)  # fmt: skip
            hazards[key] = Hazard(failure, case.region, 1, [dtype])
        if hazards and stop_at_first:
            break
        if max_examples:

            def failure_of(prep, kind, judgement, outcome, dtype=dtype):
                found = _failure(name, imports, call, candidate, backend, info, prep, label,
                                 mode, dev, kind, judgement, outcome, jit, standard)  # fmt: skip
                found.case = "hypothesis (shrunk)"
                return found

            found, count = _explore(candidate, backend, info, spec_options, dtype, with_bias, dev,
                                    jit, standard, max_examples, unsupported, skip,
                                    failure_of)  # fmt: skip
            report.examples_run += count
            if found is not None:
                key = (found.kind, "hypothesis")
                if key in hazards:
                    hazards[key].count += 1
                    hazards[key].dtypes.append(dtype)
                else:
                    hazards[key] = Hazard(found, "hypothesis", 1, [dtype])
                if stop_at_first:
                    break
    order = {"non-finite": 0, "writes input": 1, "accuracy": 2, "error": 3, ALL_IGNORED_NAN: 4}
    report.hazards = sorted(hazards.values(), key=lambda h: order.get(h.failure.kind, 3))
    if report.cases_judged == 0 and not report.hazards:
        report.notes.append("nothing was judged: every case used a feature the candidate lacks")
    return report


# ----------------------------------------------------------------------------------------------
# The parity run: dualloss's own backends
# ----------------------------------------------------------------------------------------------


def plan(loss: str, level: str) -> list[tuple[dict, str]]:
    """(options, reduction) pairs to run: quick, the plain options with 'mean' and the option
    set with class weights / alpha and label smoothing with 'none'; full, all four."""
    first, second = OPTION_SETS[loss]
    if level == "quick":
        return [(first, "mean"), (second, "none")]
    return [(o, r) for o in (first, second) for r in ("mean", "none")]


def run_ours(
    backends=B.BACKENDS,
    dtypes=B.DTYPES,
    device_names=("cpu",),
    level: str = "quick",
    names=NAMES,
    regions=None,
    jit: bool = True,
) -> tuple[list[Record], list[LinearFailure], float]:
    """dualloss's own backends on every linear case (``plan``) under the strict standard:
    (records, failures, seconds), in the shapes ``runner.RunResult`` holds."""
    started = time.monotonic()
    records, failures = [], []
    for backend in backends:
        modes = ["eager"] if backend == "torch" else (["jit"] if jit else ["eager"])
        if backend == "jax" and jit and level == "full":
            modes.append("eager")
        for label in device_names:
            dev = D.device_object(backend, label)
            for loss in names:
                for at, (options, reduction) in enumerate(plan(loss, level)):
                    for dtype in dtypes:
                        # at --quick the regions of their own shape run with the first option set
                        # and below float64 only: each new shape costs JAX one compilation per
                        # option set and dtype, and their hazards are accumulation in low precision
                        thin = level == "quick" and (at or dtype == "float64")
                        chosen = [r for r in (regions or REGIONS)
                                  if not (thin and r in OWN_SHAPE)]  # fmt: skip
                        for mode in modes:
                            made = {}  # one candidate per V (its class-weight vector)
                            for case in make_cases(loss, options, level=level, regions=chosen):
                                prep = prepare(case, dtype)
                                num_classes = case.linear_weight.shape[1]
                                if num_classes not in made:
                                    made[num_classes] = ours(backend, loss, prep.options, reduction)
                                fn = made[num_classes]
                                prep.options["reduction"] = reduction
                                compiled = mode == "jit"
                                kind, judgement, outcome = evaluate(
                                    fn, backend, loss, prep, dev, compiled, "strict"
                                )
                                impl = "torch_impl" if backend == "torch" else "jax_impl"
                                records.append(Record(
                                    loss, impl, backend, label, mode, dtype, case.region,
                                    f"{case.name} {_plain(options)} {reduction}", kind,
                                    ratio=0.0 if judgement is None else judgement.ratio,
                                    gamma=losses.get(loss).gamma(options),
                                ))  # fmt: skip
                                if kind != "ok":
                                    num_classes = case.linear_weight.shape[1]
                                    call = (
                                        f"ours({backend!r}, {loss!r}, option_values("
                                        f"{options!r}, {num_classes}), {reduction!r})"
                                    )
                                    failures.append(_failure(
                                        impl, "from dualloss.parity.linear import ours, "
                                        "option_values", call, fn, backend, loss, prep, label,
                                        mode, dev, kind, judgement, outcome, compiled, "strict",
                                    ))  # fmt: skip
    return records, failures, time.monotonic() - started
