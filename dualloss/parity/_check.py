"""``check``: the oracle for any loss function: feature probes, adversarial cases, Hypothesis.

    report = check(my_loss, "softmax_focal_loss", backend="torch", options={"gamma": 0.5})
    report.assert_ok()  # in a test: fails it with the whole report (``assert report.ok, report``
                        # shows pytest's 240-character repr of it, reproducers cut)

`candidate(logits, targets)` takes the backend's layout (torch: class dim 1; JAX: class axis -1)
and returns the loss reduced as ``options["reduction"]`` (default "mean"); its gradient comes
from the framework's autodiff. `options` are the spec's keyword arguments that the candidate
implements (gamma, alpha, weight, label_smoothing, ...), fixed for every input.

Gradients w.r.t. targets and options (issue 10, item 8): the gradient w.r.t. probability targets
(soft targets of a sigmoid loss) is judged too, and so is the gradient w.r.t. each
differentiable option the candidate names as a parameter (``def loss(x, t, *, weight)``): it
receives that option as a tensor / array of the case's dtype (a scalar as a 0-d one, its value
rounded to that dtype for the reference too) and autodiff differentiates it. An option the
candidate closes over instead is said not to be judged. A gradient autodiff cannot give (torch
returns None, or differentiating raises; a scalar is then retried as a Python number) is listed
as "gradient w.r.t. ... not available" with a reproducer, and the rest is judged. Array options
apply to the cases they fit (a class vector of length C: the cases with C classes).

Judgement: the "practical" standard of ``tolerance.py`` by default (backward stable and accurate
at the scale of the whole result; non-finite where the math is finite always fails).

Features (DESIGN.md section 8): before the cases run, one small probe per feature (class-index
targets, probability targets, ignored labels, all-ignored batches, -inf class masks; soft targets
for a sigmoid loss) asks whether the candidate implements it. A probe that raises marks the
feature unsupported: it is listed in the report with its reproducer, and the cases that use it are
not judged. A probe that returns NaN is judged like any other input: a hazard, never
"unsupported". A candidate that raises on every probe is not OK: nothing was verified.

Imports: the report types from ``findings`` and the fused linear losses' ``check`` from
``linear``, one way (neither imports this module); no framework at import time.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
from dataclasses import replace
from typing import Any

import numpy as np

from .. import losses
from . import backends as B
from . import devices as D
from .cases import DTYPE_MAX, Case, make_cases
from .findings import (
    GRAD_PREFIX,
    OPTION_PREFIX,
    UNNAMED_NOTE,
    CheckReport,
    Hazard,
    _name_of,
    shrink_search,
)
from .linear import check as check_linear
from .runner import Failure, evaluate, make_failure, minimise
from .tolerance import ACCEPT_ALL_IGNORED_NAN, ALL_IGNORED_NAN, STANDARDS

# the regions that vary only the inputs (the others are option grids)
CHECK_REGIONS = (
    "typical", "confident_correct", "confident_wrong", "near_ties", "huge_shift", "masked",
    "soft_targets", "masked_soft", "ignored", "all_ignored", "classes", "spatial", "wide_span",
)  # fmt: skip
# the margin regions, also run with one-hot and smoothed probability targets (softmax)
MARGIN_REGIONS = ("confident_correct", "confident_wrong", "huge_shift", "masked")

# regions whose `skip` also leaves their feature out of every other region and of Hypothesis
_SKIPPED_FEATURES = {"ignored": "ignored", "all_ignored": "all_ignored", "masked": "masked"}
_SUBJECT = re.compile(r"^gradient w\.r\.t\. (\w+)")


# the errors of a JAX function that jax.jit cannot trace (Python control flow or float() on a
# traced value, ...): the same call may work eagerly
TRACER_ERRORS = (
    "ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
    "TracerArrayConversionError", "UnexpectedTracerError", "NonConcreteBooleanIndexError",
)  # fmt: skip
JIT_HINT = "jax.jit could not trace it: pass jit=False if the function is eager-only"
# when it raises so eagerly too: autodiff (jax.vjp) traces the logits in either mode
VJP_HINT = ("it raises eagerly too: jax.vjp traces the logits, so float(), bool() or an `if` "
            "on a value computed from them cannot be differentiated; use jnp.where or "
            "jax.lax.cond")  # fmt: skip


def _untraceable(impl, info, options, binary, dtype, device, standard) -> tuple[str, bool]:
    """(the error of a probe that raises under jax.jit for want of a concrete value and works
    eagerly, or ''; whether such an error was also raised eagerly)."""
    eagerly_too = False
    for case in probes(info, options, binary).values():
        prep = B.prepare(case, dtype)
        kind, _, outcome = evaluate(impl, prep, device, True, standard)
        if kind == "error" and outcome.error.startswith(TRACER_ERRORS):
            eager_kind, _, eager = evaluate(impl, prep, device, False, standard)
            if eager_kind != "error":
                error = outcome.error
                return (error if len(error) <= 120 else error[:117] + "..."), False
            eagerly_too = eagerly_too or eager.error.startswith(TRACER_ERRORS)
    return "", eagerly_too


def _named_options(candidate, info, options: dict) -> tuple[str, ...]:
    """The differentiable options given in `options` that `candidate` names as parameters: check
    passes them as arrays of the case's dtype and judges its gradient w.r.t. them."""
    try:
        parameters = inspect.signature(candidate).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return ()
    named = [n for n, p in parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
    return tuple(
        option.name for option in info.options
        if option.differentiable and option.name in named and options.get(option.name) is not None
    )  # fmt: skip


def judged_inputs(info, grads) -> frozenset[str] | None:
    """The inputs besides the logits whose gradients `grads` asks to judge: None for 'all'
    (every one the candidate's gradient reaches), none for 'logits', else the names given
    ('logits', 'targets' and the loss's differentiable options)."""
    allowed = ("logits", "targets", *(o.name for o in info.options if o.differentiable))
    if isinstance(grads, str) and grads in ("all", "logits"):
        return None if grads == "all" else frozenset()
    names = (grads,) if isinstance(grads, str) else grads
    try:
        names = tuple(names)
    except TypeError:
        names = (grads,)
    if not names or any(not isinstance(n, str) or n not in allowed for n in names):
        raise ValueError(
            f"`grads` must be 'all', 'logits' or a tuple of names among {', '.join(allowed)}. "
            f"Received: grads={grads!r}."
        )
    return frozenset(n for n in names if n != "logits")


def _implementation(candidate, info, backend, options=None, binary=False,
                    judged=None) -> B.Implementation:  # fmt: skip
    display, imports, call = _name_of(candidate)
    takes = _named_options(candidate, info, options or {})

    def fn(x, t, **given):
        return candidate(x, t, **given)

    def kwargs(opts, array):
        return {n: array(np.asarray(opts[n], dtype=np.float64)) for n in takes
                if opts.get(n) is not None}  # fmt: skip

    def wrt(prep):
        floats = not binary and not (info.is_softmax and prep.case.index_targets)
        names = ("targets",) * floats + tuple(n for n in takes if prep.options.get(n) is not None)
        return tuple(n for n in names if judged is None or n in judged)

    return B.Implementation(
        name=display, backend=backend, loss=info, fn=fn, kwargs=kwargs,
        imports=imports, expr=lambda kw: f"{call}(x, t{B.format_kwargs(kw)})", wrt=wrt,
    )  # fmt: skip


def _for_dtype(options: dict, takes: tuple[str, ...], dtype: str) -> dict:
    """`options` with the scalars the candidate takes as arrays rounded to `dtype`, the value the
    candidate receives (arrays are rounded by ``backends.prepare``)."""
    out = dict(options)
    for name in takes:
        if np.ndim(out[name]) == 0:
            out[name] = float(B.round_to(np.asarray(out[name]), dtype).astype(np.float64))
    return out


def _fingerprint(case: Case) -> str:
    h = hashlib.sha1()
    h.update(np.ascontiguousarray(case.logits).tobytes())
    h.update(np.ascontiguousarray(case.targets).tobytes())
    h.update(str(case.logits.shape).encode())
    h.update(str(case.targets.dtype).encode())
    return h.hexdigest()


# the parts of a generated label that name the generator's options, not the user's
_OPTION_LABEL = re.compile(r" (?:gamma=[^ \]]+|ignore_index=[^ \]]+|sum|none)(?=$| )")


def _probability_variants(case: Case) -> list[Case]:
    """One-hot and smoothed (7/8 on the target, 1/8 over the other finite classes, in 64ths)
    probability targets for a margin case with class-index targets."""
    z, t = case.logits, case.targets
    c = z.shape[-1]
    if not case.index_targets or np.any((t < 0) | (t >= c)):
        return []
    one_hot = (np.arange(c) == t[..., None]).astype(np.float64)
    finite = np.isfinite(z) & (one_hot == 0.0)
    others = finite.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.where(others > 0, finite / np.maximum(others, 1), 0.0)
    mass = np.where(others > 0, 1.0 / 8.0, 0.0)
    smooth = np.round((one_hot * (1.0 - mass) + mass * spread) * 64.0) / 64.0
    smooth = smooth + one_hot * (1.0 - smooth.sum(axis=-1, keepdims=True))
    return [
        replace(case, label=f"{case.label} one-hot", targets=one_hot),
        replace(case, label=f"{case.label} smoothed", targets=smooth),
    ]


def adversarial_cases(
    reference, dtype: str, options: dict, skip=(), binary: bool = False
) -> list[Case]:
    """The input regions of ``cases`` with `options` fixed; duplicates (option variants) dropped.

    The margin regions also come with probability targets (softmax); with `binary`, a sigmoid
    loss gets its targets rounded to {0, 1}. `reference`: the loss's name or its record."""
    info = losses.get(reference)
    ignore_index = options.get("ignore_index", -100)
    out, seen = [], set()
    for case in make_cases(info, dtype, regions=CHECK_REGIONS, skip=skip):
        case.label = _OPTION_LABEL.sub("", case.label)
        if case.index_targets:
            if case.region == "ignored" and "ignore_index" in case.options:
                case.targets = np.where(case.targets == case.options["ignore_index"], -100,
                                        case.targets)  # fmt: skip
            case.targets = np.where(case.targets == -100, ignore_index, case.targets)
        if binary and not info.is_softmax:
            case.targets = (case.targets >= 0.5).astype(np.float64)
        variants = [case]
        if info.is_softmax and case.region in MARGIN_REGIONS:
            variants += _probability_variants(case)
        for variant in variants:
            key = _fingerprint(variant)
            if key in seen:
                continue
            seen.add(key)
            out.append(replace(variant, options=dict(options)))
    return out


def fits(case: Case, options: dict) -> bool:
    """Whether the array options apply to `case`: a class vector of its number of classes, an
    element-wise weight that broadcasts to its logits. A case they do not fit is not run."""
    for option in case.info.options:
        value = options.get(option.name)
        if value is None or np.ndim(value) == 0 or option.kind in ("mask", "choice", "index"):
            continue
        if option.kind in ("class_vector", "scalar_or_class_vector"):
            if np.shape(value)[-1] != case.logits.shape[-1]:
                return False
        elif option.kind == "elementwise":
            try:
                shape = np.broadcast_shapes(np.shape(value), case.logits.shape)
            except ValueError:
                return False
            if shape != case.logits.shape:
                return False
    return True


def features(case: Case, options: dict) -> frozenset[str]:
    """The features (keys of ``FEATURES``) that `case` uses."""
    used = set()
    if case.logits.ndim > 2:
        used.add("spatial")
    if case.info.is_softmax:
        if case.index_targets:
            used.add("index")
            ignored = case.targets == options.get("ignore_index", -100)
            if ignored.size and ignored.all():
                used.add("all_ignored")
            elif ignored.any():
                used.add("ignored")
        else:
            used.add("prob")
        if np.any(np.isneginf(case.logits)):
            used.add("masked")
    elif np.any((case.targets != 0.0) & (case.targets != 1.0)):
        used.add("soft")
    return frozenset(used)


def _fixed_shape(info, options: dict) -> tuple[int | None, int | None]:
    """(rows, classes) that the array options fix (a class vector: C; element-wise weights: their
    shape), None where they leave it free."""
    shaped = [np.shape(options[o.name]) for o in info.options
              if o.kind in ("class_vector", "scalar_or_class_vector", "elementwise")
              and np.ndim(options.get(o.name)) > 0]  # fmt: skip
    fixed_c = next((s[-1] for s in shaped if s[-1] != 1), None)
    fixed_n = next((s[-2] for s in shaped if len(s) > 1 and s[-2] != 1), None)
    return fixed_n, fixed_c


def probes(reference, options: dict, binary: bool = False) -> dict[str, Case]:
    """One small input per feature: a plain batch, plus that feature alone (where it can be);
    4 x 5 unless the array options fix another shape. `reference`: the loss's name or its
    record."""
    info = losses.get(reference)
    rng = np.random.default_rng(20240611)
    n, c = _fixed_shape(info, options)
    n, c = n or 4, c or 5
    if (n, c) != (4, 5):
        return _probes_of_shape(info, options, binary, n, c, rng)
    # quarters: exact in every dtype, short in reproducers
    z = np.round(rng.standard_normal((4, 5)) * 8.0) / 4.0

    def case(name, logits, targets):
        return Case(info, "probe", name, np.asarray(logits, float), np.asarray(targets),
                    dict(options))  # fmt: skip

    if not info.is_softmax:
        hard = (rng.random((4, 5)) < 0.5).astype(float)
        out = {"plain": case("plain", z, hard)}
        if not binary:
            out["soft"] = case("soft", z, np.resize([0.25, 0.5, 0.75, 0.0, 1.0], (4, 5)))
        out["spatial"] = case("spatial", z.reshape(2, 2, 5), hard.reshape(2, 2, 5))
        return out
    ignore_index = options.get("ignore_index", -100)
    index = np.array([0, 1, 2, 3])
    prob = np.array([[1, 1, 0, 2, 4], [4, 2, 1, 1, 0], [0, 0, 8, 0, 0], [2, 2, 2, 1, 1]]) / 8.0
    masked_z = z.copy()
    masked_z[0, 4] = masked_z[1, [0, 2]] = masked_z[2, [1, 3, 4]] = -np.inf
    return {
        # (2, 2) positions of 5 classes: the class axis last here, second for torch
        "spatial": case("spatial", z.reshape(2, 2, 5), index.reshape(2, 2)),
        "spatial_prob": case("spatial", z.reshape(2, 2, 5), prob.reshape(2, 2, 5)),
        "index": case("index", z, index),
        "prob": case("prob", z, prob),
        "ignored": case("ignored", z, np.where(index == 1, ignore_index, index)),
        "all_ignored": case("all_ignored", z, np.full(4, ignore_index)),
        "masked": case("masked", masked_z, index),
        "masked_prob": case("masked", np.where(prob == 0.0, -np.inf, z), prob),
    }


def _probes_of_shape(info, options, binary, n, c, rng) -> dict[str, Case]:
    """``probes`` for n rows of c classes (the shape array options fix)."""
    z = np.round(rng.standard_normal((n, c)) * 8.0) / 4.0

    def case(name, logits, targets):
        return Case(info, "probe", name, np.asarray(logits, float), np.asarray(targets),
                    dict(options))  # fmt: skip

    # a spatial probe where the options fix no element-wise shape: (2, n / 2) positions
    spatial = n % 2 == 0 and not any(
        o.kind == "elementwise" and np.ndim(options.get(o.name)) > 0 for o in info.options
    )
    if not info.is_softmax:
        hard = (rng.random((n, c)) < 0.5).astype(float)
        out = {"plain": case("plain", z, hard)}
        if not binary:
            out["soft"] = case("soft", z, np.resize([0.25, 0.5, 0.75, 0.0, 1.0], (n, c)))
        if spatial:
            out["spatial"] = case("spatial", z.reshape(2, n // 2, c), hard.reshape(2, n // 2, c))
        return out
    ignore_index = options.get("ignore_index", -100)
    index = np.arange(n) % c
    # row i: 3/4 on class i, 1/4 on the next (mass in quarters: exact in every dtype)
    prob = 0.75 * np.eye(c)[index] + 0.25 * np.eye(c)[(index + 1) % c]
    masked_z = np.where((np.arange(c) != index[:, None]) & (np.arange(c) % 2 == 1), -np.inf, z)
    ignored = np.where(np.arange(n) == min(1, n - 1), ignore_index, index)
    out = {
        "index": case("index", z, index),
        "prob": case("prob", z, prob),
        "ignored": case("ignored", z, ignored),
        "all_ignored": case("all_ignored", z, np.full(n, ignore_index)),
        "masked": case("masked", masked_z, index),
        "masked_prob": case("masked", np.where(prob == 0.0, -np.inf, z), prob),
    }
    if spatial:
        out["spatial"] = case("spatial", z.reshape(2, n // 2, c), index.reshape(2, n // 2))
        out["spatial_prob"] = case("spatial", z.reshape(2, n // 2, c), prob.reshape(2, n // 2, c))
    return out


def _validate(info, options: dict, skip, dtypes) -> list[str]:
    """Refuses unknown option names (against the spec's signature), bad option values (the
    spec's own message), unknown regions and dtypes; returns the dtype names."""
    allowed = [name for name in inspect.signature(info.spec).parameters
               if name not in ("logits", "targets", "axis")]  # fmt: skip
    for name in options:
        if name == "axis":
            raise ValueError(
                "`options` must not contain 'axis': the class axis is the backend's. "
                f"Received: options={options!r}."
            )
        if name not in allowed:
            raise ValueError(
                f"`options` has {name!r}, which spec.{info.name} does not take (it takes "
                f"{', '.join(allowed)}). Received: options={options!r}."
            )
    scalars = {k: v for k, v in options.items() if not isinstance(v, np.ndarray)
               and not hasattr(v, "shape") and not isinstance(v, (list, tuple))}  # fmt: skip
    logits, targets = info.sample_inputs()
    info.spec(logits, targets, **scalars)  # the spec's own one-sentence errors
    if isinstance(skip, str):
        skip = (skip,)
    for region in skip:
        if region not in CHECK_REGIONS + (ACCEPT_ALL_IGNORED_NAN,):
            raise ValueError(
                f"`skip` entries must be among {', '.join(CHECK_REGIONS)}, "
                f"{ACCEPT_ALL_IGNORED_NAN}. Received: {region!r}."
            )
    if isinstance(dtypes, str):
        dtypes = [dtypes]
    dtypes = list(dtypes or ("float32", "float64"))
    if not dtypes:
        raise ValueError("`dtypes` must name at least one dtype. Received: dtypes=[].")
    for dtype in dtypes:
        if dtype not in B.DTYPES:
            raise ValueError(f"`dtypes` entries must be among {', '.join(B.DTYPES)}. "
                             f"Received: {dtype!r}.")  # fmt: skip
    return dtypes


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
    jit: bool | None = None,
    stop_at_first: bool = False,
    standard: str = "practical",
    binary_targets: bool = False,
    grads="all",
    mesh=None,
    axis_name=None,
    process_group=None,
) -> CheckReport:
    """Judges `candidate` against ``dualloss.spec.<reference>`` with `options`.

    Args:
      candidate: ``candidate(logits, targets) -> loss``, in the backend's layout, reduced as
        ``options['reduction']`` (default 'mean'); differentiable by the framework.
      reference: a spec loss name ('softmax_cross_entropy', 'softmax_focal_loss',
        'sigmoid_cross_entropy', 'sigmoid_focal_loss'), or a fused linear loss
        ('linear_softmax_cross_entropy', 'linear_softmax_focal_loss'): then the candidate is
        ``candidate(hidden, linear_weight, targets)`` (with ``options={'bias': True}``, also a
        fourth argument bias) and ``parity.linear.check`` judges it. The loss's record
        (``losses.LossInfo``) is accepted too; either is looked up once.
      backend: 'torch' or 'jax'.
      options: the spec keyword arguments the candidate implements (its class axis is the
        backend's; do not pass `axis`). Unknown names are refused.
      dtypes: dtype names to try (default: float32 and float64).
      max_examples: Hypothesis examples per dtype after the adversarial cases (default 50; 0:
        none).
      skip: region names to leave out. Rarely needed: a feature the candidate raises on is found
        and reported as unsupported without it. ``'all_ignored_nan'`` is not a region: it
        accepts a NaN loss over an all-ignored batch (torch's 0 / 0, reported otherwise as the
        hazard "NaN loss on an all-ignored batch"); a NaN gradient there still fails.
      device: 'cpu' (the default, for both backends) or 'gpu:N' (alias 'cuda:N'); a device the
        backend does not see raises ``devices.DeviceError`` (a ValueError). On a CUDA device,
        inputs with ignored labels run on the CPU first (see ``backends.run_case``).
      jit: JAX: run the candidate under ``jax.jit`` (the default, None, for JAX: one compilation
        per input shape, where eager JAX compiles every primitive for every shape and a check
        takes minutes). A candidate that jax.jit cannot trace (``float()`` or an ``if`` on a
        traced value) runs eagerly, and the report says why; ``jit=False`` runs it eagerly from
        the start. torch: ignored (eager).
      stop_at_first: stop after the first dtype that fails (faster on broken losses).
      standard: 'practical' (default: backward stable, accurate at the whole result's scale) or
        'strict' (the standard dualloss's own backends are held to); see ``tolerance.py``.
      binary_targets: a sigmoid candidate that takes targets in {0, 1} only.
      mesh, axis_name: JAX, a vocab-parallel candidate: it is called inside ``jax.shard_map``
        over `mesh` with the class axis split over `axis_name` (needed when the mesh has several
        axes), the targets global class indices and its output replicated
        (``parity.shard_classes``; docs/parity.md).
      process_group: torch, a vocab-parallel candidate: call ``check`` on every rank of the
        group; the candidate gets this rank's contiguous slice of the classes and the global
        targets, every rank judges rank 0's value and the whole gradient, and every rank returns
        the same report. Gradients w.r.t. options are not judged (a replicated option's gradient
        depends on where the candidate reads it).
      grads: which gradients to judge besides the value: 'all' (the default: the logits' and
        every other one the candidate's autodiff reaches, probability targets and the options
        it takes as arguments), 'logits' (the logits' only, for a loss meant to be
        differentiated in the logits alone), or a tuple of names among 'logits', 'targets' and
        the loss's differentiable options. The logits' gradient is always judged. Echoed in
        the report. The fused linear losses judge hidden, linear_weight (and bias): 'all'.

    Returns:
      a ``CheckReport``: ``.ok``, ``.failures`` (one per kind x region, each with a minimal input,
      expected vs received, and one line of Python that reproduces it), ``.unsupported``,
      readable ``str()``.
    """
    jit = backend == "jax" if jit is None else bool(jit)
    try:
        # the one lookup: from here on the loss travels as its record
        info = losses.get(reference)
    except ValueError:
        raise ValueError(
            f"`reference` must be one of {losses.ALL_NAMES}. Received: reference={reference!r}."
        ) from None
    judged = judged_inputs(info, grads) if not info.is_linear else None
    sharded = mesh is not None or process_group is not None
    if sharded:
        judged = _sharded_arguments(info, backend, mesh, process_group, judged)
    if info.is_linear:
        if grads != "all":
            raise ValueError(
                "`grads` must be 'all' for the fused linear losses (their check judges hidden, "
                f"linear_weight and bias). Received: grads={grads!r}."
            )
        # the fused linear losses: their own cases and bound (``parity.linear``)
        return check_linear(
            candidate, info, backend=backend, options=options, dtypes=dtypes,
            max_examples=max_examples, skip=skip, device=device, jit=jit,
            stop_at_first=stop_at_first, standard=standard, binary_targets=binary_targets,
        )  # fmt: skip
    if backend not in B.BACKENDS:
        raise ValueError(f"`backend` must be one of {B.BACKENDS}. Received: backend={backend!r}.")
    if standard not in STANDARDS:
        raise ValueError(
            f"`standard` must be 'practical' or 'strict'. Received: standard={standard!r}."
        )
    if binary_targets and info.is_softmax:
        raise ValueError(
            f"`binary_targets` applies to sigmoid losses only. Received: reference={info.name!r}."
        )
    options = dict(options or {})
    dtypes = _validate(info, options, skip, dtypes)
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    # not a region: the user accepts a NaN loss over an all-ignored batch (torch's 0 / 0)
    accept_nan = ACCEPT_ALL_IGNORED_NAN in skip
    skip = tuple(r for r in skip if r != ACCEPT_ALL_IGNORED_NAN)
    max_examples = 50 if max_examples is None else int(max_examples)
    if max_examples < 0:
        raise ValueError(f"`max_examples` must be >= 0. Received: max_examples={max_examples}.")
    impl = _implementation(candidate, info, backend, options, binary_targets, judged)
    takes = _named_options(candidate, info, options)
    unnamed = _name_of(candidate)[2] == "candidate"
    label, dev = D.one_device(backend, device)
    if sharded:
        from .sharded import sharded_implementation, sharded_reproducer

        impl, dev, where = sharded_implementation(
            impl, _name_of(candidate)[2], mesh=mesh, axis_name=axis_name,
            process_group=process_group,
        )  # fmt: skip
        world = None if process_group is None else _world(process_group)
    report = CheckReport(impl.name, info.name, backend, options, standard, dtypes, device=label,
                         info=info, grads=grads)  # fmt: skip
    report.precision = D.pin_precision([backend])
    jit = jit and backend == "jax"
    if jit:
        report.eager_because, eagerly_too = _untraceable(
            impl, info, _for_dtype(options, takes, dtypes[0]), binary_targets, dtypes[0], dev,
            standard,
        )  # fmt: skip
        jit = not report.eager_because
    hint = VJP_HINT if jit and eagerly_too else JIT_HINT
    mode = report.mode = "jit" if jit else "eager"
    hazards: dict[tuple[str, str, str], Hazard] = {}
    if unnamed:
        report.notes.append(UNNAMED_NOTE)
    if sharded:
        report.notes.append(
            f"vocab-parallel: called through parity.shard_classes on {where}, the classes split "
            "over it, the targets global class indices"
        )
    closed_over = [o.name for o in info.options if o.differentiable and o.name not in takes
                   and options.get(o.name) is not None
                   and (judged is None or o.name in judged)]  # fmt: skip
    if closed_over:
        report.notes.append(
            f"gradient w.r.t. {', '.join(closed_over)} not judged: the candidate does not take "
            f"{'it' if len(closed_over) == 1 else 'them'} as an argument (name "
            f"{'it' if len(closed_over) == 1 else 'them'} in its signature to have "
            f"{'it' if len(closed_over) == 1 else 'them'} judged)"
        )

    def record(failure: Failure, region: str, dtype: str) -> None:
        if sharded:
            failure.reproducer = sharded_reproducer(failure.reproducer, mesh=mesh, world=world)
        if failure.kind == "error" and jit and any(
                name in p for p in failure.problems for name in TRACER_ERRORS):  # fmt: skip
            failure.problems = [f"{p} ({hint})" for p in failure.problems]
        # a problem only in the gradient w.r.t. targets or an option is a distinct hazard
        subjects = {m.group(1) for m in map(_SUBJECT.match, failure.problems) if m}
        only = "/".join(sorted(subjects)) if subjects and all(
            _SUBJECT.match(p) for p in failure.problems) else ""  # fmt: skip
        key = (failure.kind, region, only)
        hazard = hazards.get(key)
        if hazard is None:
            hazards[key] = Hazard(failure, region, 1, [dtype])
            return
        hazard.count += 1
        if dtype not in hazard.dtypes:
            hazard.dtypes.append(dtype)
        # the region's reproducer: its most consequential failure, then the smallest input
        new, old = Hazard(failure, region).rank(), hazard.rank()
        if (new[0], new[3]) < (old[0], old[3]):
            hazard.failure = failure

    user_options = options
    for dtype in dtypes:
        options = _for_dtype(user_options, takes, dtype)
        unsupported = _probe(impl, info, options, binary_targets, dtype, dev, jit, standard,
                             report)  # fmt: skip
        if unsupported is None and _refused_options(impl, info, options, takes, binary_targets,
                                                    dtype, dev, jit, standard, report):  # fmt: skip
            continue  # an option it refuses: nothing with the user's options can be judged
        if unsupported is None:  # raised on every probe: nothing to judge
            prep = B.prepare(next(iter(probes(info, options).values())), dtype)
            kind, judgement, outcome = evaluate(impl, prep, dev, jit, standard)
            failure = make_failure(impl, prep, label, mode, "error", judgement, outcome)
            failure.problems = [f"raised on every input tried: {outcome.error}"]
            record(failure, "every input", dtype)
            continue
        left_out = unsupported | {_SKIPPED_FEATURES[r] for r in skip if r in _SKIPPED_FEATURES}
        for case in adversarial_cases(info, dtype, options, skip, binary_targets):
            report.cases_run += 1
            if features(case, options) & left_out or not fits(case, options):
                continue
            prep = B.prepare(case, dtype)
            kind, judgement, outcome = evaluate(impl, prep, dev, jit, standard)
            if kind == "skipped":
                continue
            report.cases_judged += kind != "error"
            _note_input_grads(report, impl, prep, outcome, kind)
            if kind == ALL_IGNORED_NAN and accept_nan:
                note = f"accepted (skip={ACCEPT_ALL_IGNORED_NAN!r}): {ALL_IGNORED_NAN}"
                if note not in report.notes:
                    report.notes.append(note)
                continue
            if kind == "ok":
                continue
            small, small_j, small_o = minimise(impl, prep, dev, jit, kind, standard)
            if small_o is None:
                small, small_j, small_o = prep, judgement, outcome
            failure = make_failure(impl, small, label, mode, kind, small_j, small_o)
            record(failure, case.region, dtype)
        if hazards and stop_at_first:
            break
        if max_examples:
            found, count = _explore(impl, info, options, dtype, dev, label, mode, jit,
                                    max_examples, left_out, skip, standard,
                                    binary_targets)  # fmt: skip
            report.examples_run += count
            if found is not None:
                record(found, "hypothesis", dtype)
                if stop_at_first:
                    break
    report.hazards = sorted(hazards.values(), key=Hazard.rank)
    if sharded:
        for key, text in report.unsupported.items():
            why, _, line = text.partition("\n      reproduce: ")
            line = sharded_reproducer(line, mesh=mesh, world=world) if line else line
            report.unsupported[key] = f"{why}\n      reproduce: {line}" if line else why
    if report.cases_judged == 0 and not report.hazards:
        report.notes.append("nothing was judged: every case used a feature the candidate lacks")
    return report


def _sharded_arguments(info, backend, mesh, process_group, judged):
    """Checks `mesh` / `process_group` against the loss and backend; the gradients judged (torch:
    not the options')."""
    if mesh is not None and process_group is not None:
        raise ValueError(
            "`mesh` (JAX) and `process_group` (torch) cannot both be given. Received: both."
        )
    if not info.is_softmax or info.is_linear:
        raise ValueError(
            "`mesh` and `process_group` apply to the softmax losses (classes split over "
            f"devices). Received: reference={info.name!r}."
        )
    if mesh is not None and backend != "jax":
        raise ValueError(f"`mesh` needs backend='jax'. Received: backend={backend!r}.")
    if process_group is not None:
        if backend != "torch":
            raise ValueError(
                f"`process_group` needs backend='torch'. Received: backend={backend!r}."
            )
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "`process_group` needs torch.distributed to be initialised (torch.distributed."
                f"init_process_group). Received: process_group={process_group!r}."
            )
        # the gradient w.r.t. a replicated option depends on where the candidate reads it
        return frozenset({"targets"}) if judged is None else judged & {"targets"}
    return judged


def _world(process_group) -> int:
    import torch.distributed as dist

    return dist.get_world_size(process_group)


def assert_passes(candidate, reference: str, **kwargs) -> CheckReport:
    """``check(candidate, reference, **kwargs).assert_ok()``: in a test, fails it with the whole
    report (every reproducer); returns the report when it holds."""
    __tracebackhide__ = True
    return check(candidate, reference, **kwargs).assert_ok()


def _note_input_grads(report, impl, prep, outcome, kind) -> None:
    """Counts the gradients w.r.t. targets and options that were judged; one that autodiff could
    not give is listed as not available, with a reproducer (the first case that showed it)."""
    if kind == "error":
        return
    for name in outcome.input_grads:
        report.judged_grads[name] = report.judged_grads.get(name, 0) + 1
    for name, why in outcome.input_grad_errors.items():
        key = GRAD_PREFIX + name
        size = prep.logits.size
        if key not in report.unsupported or size < report._grad_sizes.get(key, 0):
            # the smallest case that showed it, for a short reproducer
            report._grad_sizes[key] = size
            repro = B.reproducer(impl, prep, report.device, wrt=(name,))
            report.unsupported[key] = f"{why}\n      reproduce: {repro}"


def _probe(impl, info, options, binary, dtype, device, jit, standard, report):
    """The features the candidate raises on (recorded in `report.unsupported` with their
    reproducers), or None when it raises on every probe."""
    found = probes(info, options, binary)
    raised, worked = {}, set()
    for name, case in found.items():
        prep = B.prepare(case, dtype)
        kind, _, outcome = evaluate(impl, prep, device, jit, standard)
        if kind == "error":
            raised[name] = (prep, outcome)
        else:
            worked.add(name)
    if not worked:
        return None
    unsupported = set()
    if info.is_softmax:
        # the masked and spatial probes run on whichever targets the candidate takes
        for feature in ("masked", "spatial"):
            both = [n for n in (feature, f"{feature}_prob") if n in found]
            if not any(n in worked for n in both):
                if feature in raised or f"{feature}_prob" in raised:
                    raised.setdefault(feature, raised.get(f"{feature}_prob"))
            else:
                raised.pop(feature, None)
            raised.pop(f"{feature}_prob", None)
        for name in ("ignored", "all_ignored"):
            if "index" in raised:
                raised.pop(name, None)
    raised.pop("plain", None)
    for name, (prep, outcome) in raised.items():
        unsupported.add(name)
        if name not in report.unsupported:
            repro = B.reproducer(impl, prep, report.device)
            report.unsupported[name] = f"{outcome.error}\n      reproduce: {repro}"
    if info.is_softmax and "index" in unsupported:
        unsupported |= {"ignored", "all_ignored"}
    return frozenset(unsupported)


def _refused_options(impl, info, options, takes, binary, dtype, device, jit, standard,
                     report) -> bool:  # fmt: skip
    """For a candidate that raised on every probe: the options it takes that it raises on, each
    found by the plain probe working with that option at its neutral value (the record's
    ``neutral``: 0 for label smoothing, None, left out, for a weight). Recorded in
    `report.unsupported` as ``option:<name>`` with the message and a reproducer of the refusal;
    True when there was one."""
    plain = next(iter(probes(info, options, binary).values()))
    found = False
    for option in info.options:
        name = option.name
        if options.get(name) is None or name not in takes:
            continue
        without = dict(options, **{name: option.neutral})
        prep = B.prepare(replace(plain, options=without), dtype)
        if evaluate(impl, prep, device, jit, standard)[0] == "error":
            continue
        refused = B.prepare(plain, dtype)
        error = evaluate(impl, refused, device, jit, standard)[2].error
        key = OPTION_PREFIX + name
        if key not in report.unsupported:
            repro = B.reproducer(impl, refused, report.device)
            report.unsupported[key] = f"{error}\n      reproduce: {repro}"
        found = True
    return found


# ----------------------------------------------------------------------------------------------
# Hypothesis exploration
# ----------------------------------------------------------------------------------------------


def _explore(
    impl,
    info,
    options,
    dtype,
    device,
    label,
    mode,
    jit,
    max_examples,
    unsupported,
    skip=(),
    standard="practical",
    binary=False,
):
    """Hypothesis search for a failing input; returns (shrunk Failure or None, examples run).
    It draws only the features the candidate supports (`unsupported` from the probes)."""
    try:
        from hypothesis import strategies as st
    except ImportError:
        return None, 0
    big = 0.5 * DTYPE_MAX[dtype]
    specials = [0.0, 1.0, -1.0, 20.0, -20.0, 90.0, -90.0, 800.0, -800.0]
    if "huge_shift" not in skip:
        specials += [1e4, -1e4, big, -big]
    # the skipped regions' hazards stay out of the exploration too
    mask_index = "masked" not in skip and "masked" not in unsupported
    mask_prob = "masked_soft" not in skip and "masked" not in unsupported
    element = st.one_of(st.floats(-30.0, 30.0, width=32), st.sampled_from(specials))
    softmax = info.is_softmax
    kinds = [k for k in ("index", "prob") if k not in unsupported] if softmax else ["prob"]
    if not kinds:
        return None, 0
    ignore_index = options.get("ignore_index", -100)
    allow_ignore = "ignored" not in skip and "ignored" not in unsupported
    sigmoid_targets = [0.0, 1.0] if binary or "soft" in unsupported else [0.0, 1.0, 0.5, 0.25]

    fixed_n, fixed_c = _fixed_shape(info, options)

    @st.composite
    def inputs(draw):
        n = fixed_n or draw(st.integers(1, 3))
        c = fixed_c or (draw(st.integers(1, 6)) if softmax else draw(st.integers(1, 4)))
        values = draw(st.lists(element, min_size=n * c, max_size=n * c))
        z = np.clip(np.array(values, dtype=np.float64).reshape(n, c), -big, big)
        if not softmax:
            t = np.array(draw(st.lists(st.sampled_from(sigmoid_targets),
                                       min_size=n * c, max_size=n * c))).reshape(n, c)  # fmt: skip
            return z, t
        masked = np.array(draw(st.lists(st.booleans(), min_size=n * c, max_size=n * c)))
        if draw(st.sampled_from(kinds)) == "index":
            t = np.array(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)))
            keep_finite = np.arange(c) == t[:, None]
            z = np.where(masked.reshape(n, c) & ~keep_finite & mask_index, -np.inf, z)
            if allow_ignore and n > 1 and draw(st.booleans()):
                t[0] = ignore_index
            return z, t.astype(np.int64)
        t = draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=n * c,
                          max_size=n * c))  # fmt: skip
        t = np.array(t).reshape(n, c)
        t[:, 0] += np.maximum(1.0 - t.sum(-1), 0.0)
        t = t / t.sum(-1, keepdims=True)
        t = np.round(t * 64) / 64
        t[:, 0] += 1.0 - t.sum(-1)
        z = np.where(masked.reshape(n, c) & (t == 0.0) & mask_prob, -np.inf, z)
        return z, t

    def attempt(data):
        z, t = data
        case = Case(info, "hypothesis", "example", z, t, dict(options))
        if not fits(case, options):
            return None
        prep = B.prepare(case, dtype)
        kind, judgement, outcome = evaluate(impl, prep, device, jit, standard)
        return None if kind in ("ok", "skipped") else (prep, kind, judgement, outcome)

    last, count = shrink_search(inputs(), attempt, max_examples)
    if last is None:
        return None, count
    prep, kind, judgement, outcome = last
    failure = make_failure(impl, prep, label, mode, kind, judgement, outcome)
    failure.case = "hypothesis (shrunk)"
    return failure, count


def resolve(spec: str) -> Any:
    """'package.module:function' -> the function."""
    if ":" not in spec:
        raise ValueError(f"`candidate` must be written MODULE:FUNCTION. Received: {spec!r}.")
    module_name, _, attr = spec.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
