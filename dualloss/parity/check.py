"""``check``: the oracle for any loss function, adversarial cases first, then Hypothesis.

    report = check(my_loss, "softmax_focal_loss", backend="torch", options={"gamma": 0.5})
    assert report.ok, report

`candidate(logits, targets)` takes the backend's layout (torch: class dim 1; JAX: class axis -1)
and returns the loss reduced as ``options["reduction"]`` (default "mean"); its gradient comes
from the framework's autodiff. `options` are the spec's keyword arguments that the candidate
implements (gamma, alpha, weight, label_smoothing, ...), fixed for every input.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import losses
from . import backends as B
from .cases import DTYPE_MAX, LOSSES, Case, make_cases
from .runner import Failure, evaluate, make_failure, minimise

# the regions that vary only the inputs (the others are option grids)
CHECK_REGIONS = (
    "typical", "confident_correct", "confident_wrong", "near_ties", "huge_shift", "masked",
    "soft_targets", "masked_soft", "ignored", "all_ignored", "classes", "spatial",
)  # fmt: skip


@dataclass(repr=False)
class CheckReport:
    """The verdict of ``check``: ``.ok``, ``.failures`` (smallest input first) and ``str()``."""

    candidate: str
    reference: str
    backend: str
    options: dict
    failures: list[Failure] = field(default_factory=list)
    cases_run: int = 0
    examples_run: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = (
            f"{self.candidate} vs spec.{self.reference} ({self.backend}, options={self.options}): "
            f"{'OK' if self.ok else f'{len(self.failures)} failure(s)'}; "
            f"{self.cases_run} adversarial cases, {self.examples_run} Hypothesis examples"
        )
        lines = [head]
        for f in self.failures:
            lines.append(f.describe())
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def _name_of(candidate) -> tuple[str, str, str]:
    """(display name, import line, call expression) for reproducers."""
    module = getattr(candidate, "__module__", None)
    qualname = getattr(candidate, "__qualname__", None) or getattr(candidate, "__name__", None)
    if module and qualname and "<" not in qualname and module != "__main__":
        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            if obj is candidate:
                top = qualname.split(".")[0]
                return f"{module}.{qualname}", f"from {module} import {top}", qualname
        except Exception:  # noqa: BLE001 - then the reproducer names it `candidate`
            pass
    name = qualname or repr(candidate)
    return name, "", "candidate"


def _implementation(candidate, reference, backend) -> B.Implementation:
    display, imports, call = _name_of(candidate)

    def fn(x, t, **_):
        return candidate(x, t)

    return B.Implementation(
        name=display, backend=backend, loss=reference, fn=fn, kwargs=lambda o, a: {},
        imports=imports, expr=lambda kw: f"{call}(x, t)",
    )  # fmt: skip


def _fingerprint(case: Case) -> str:
    h = hashlib.sha1()
    h.update(np.ascontiguousarray(case.logits).tobytes())
    h.update(np.ascontiguousarray(case.targets).tobytes())
    h.update(str(case.logits.shape).encode())
    return h.hexdigest()


def adversarial_cases(reference: str, dtype: str, options: dict, skip=()) -> list[Case]:
    """The input regions of ``cases`` with `options` fixed; duplicates (gamma variants) dropped."""
    out, seen = [], set()
    for case in make_cases(reference, dtype, regions=CHECK_REGIONS, skip=skip):
        if "ignore_index" in options and case.index_targets:
            case.targets = np.where(case.targets == -100, options["ignore_index"], case.targets)
        if "ignored" in skip and case.index_targets:
            if np.any(case.targets == options.get("ignore_index", -100)):
                continue
        key = _fingerprint(case)
        if key in seen:
            continue
        seen.add(key)
        out.append(replace(case, options=dict(options)))
    return out


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
    stop_at_first: bool = True,
) -> CheckReport:
    """Judges `candidate` against ``dualloss.spec.<reference>`` with `options`.

    Args:
      candidate: ``candidate(logits, targets) -> loss``, in the backend's layout, reduced as
        ``options['reduction']`` (default 'mean'); differentiable by the framework.
      reference: a spec loss name ('softmax_cross_entropy', 'softmax_focal_loss',
        'sigmoid_cross_entropy', 'sigmoid_focal_loss').
      backend: 'torch' or 'jax'.
      options: the spec keyword arguments the candidate implements (its class axis is the
        backend's; do not pass `axis`).
      dtypes: dtype names to try (default: float32 and float64).
      max_examples: Hypothesis examples after the adversarial cases (default 50; 0: none).
      skip: region names to leave out (e.g. 'all_ignored' for a loss that follows torch's NaN
        there on purpose, 'ignored' for one without ignore_index).
      device: the device to run on (default: the backend's first, e.g. 'cpu').
      jit: for JAX, wrap the candidate in ``jax.jit``.
      stop_at_first: stop after the first failing dtype's failures (faster on broken losses).

    Returns:
      a ``CheckReport``: ``.ok``, ``.failures`` (each with a minimal input, expected vs received,
      and one line of Python that reproduces it), readable ``str()``.
    """
    if reference not in LOSSES:
        raise ValueError(f"`reference` must be one of {LOSSES}. Received: reference={reference!r}.")
    info = losses.get(reference)
    if backend not in B.BACKENDS:
        raise ValueError(f"`backend` must be one of {B.BACKENDS}. Received: backend={backend!r}.")
    options = dict(options or {})
    if "axis" in options:
        raise ValueError("`options` must not contain 'axis': the layout is the backend's.")
    dtypes = list(dtypes or ("float32", "float64"))
    for dtype in dtypes:
        if dtype not in B.DTYPES:
            raise ValueError(f"`dtypes` entries must be in {B.DTYPES}. Received: {dtype!r}.")
    max_examples = 50 if max_examples is None else max_examples
    impl = _implementation(candidate, reference, backend)
    pairs = B.devices_for(backend, [device] if device else None)
    if not pairs:
        raise ValueError(f"`device` {device!r} not found for backend {backend!r}.")
    label, dev = pairs[0]
    mode = "jit" if (jit and backend == "jax") else "eager"
    report = CheckReport(impl.name, reference, backend, options)
    for dtype in dtypes:
        unsupported = set()
        for case in adversarial_cases(reference, dtype, options, skip):
            kind_key = "index" if case.index_targets else "prob"
            if kind_key in unsupported:
                continue
            prep = B.prepare(case, dtype)
            kind, judgement, outcome = evaluate(impl, prep, dev, jit)
            report.cases_run += 1
            if kind == "error" and case.region == "typical" and info.is_softmax:
                # a candidate for one kind of targets only (e.g. optax integer labels)
                unsupported.add(kind_key)
                report.notes.append(
                    f"{dtype}: {kind_key} targets not supported by the candidate "
                    f"({outcome.error}); those cases skipped"
                )
                continue
            if kind in ("ok", "skipped"):
                continue
            small, small_j, small_o = minimise(impl, prep, dev, jit, kind)
            if small_o is None:
                small, small_j, small_o = prep, judgement, outcome
            report.failures.append(make_failure(impl, small, label, mode, kind, small_j, small_o))
        if report.failures and stop_at_first:
            break
        if max_examples and not report.failures:
            found, count = _explore(impl, reference, options, dtype, dev, label, mode, jit,
                                    max_examples, unsupported, skip)  # fmt: skip
            report.examples_run += count
            if found is not None:
                report.failures.append(found)
                if stop_at_first:
                    break
    report.failures.sort(key=lambda f: np.size(f.logits))
    return report


# ----------------------------------------------------------------------------------------------
# Hypothesis exploration
# ----------------------------------------------------------------------------------------------


def _explore(
    impl, reference, options, dtype, device, label, mode, jit, max_examples, unsupported, skip=()
):
    """Hypothesis search for a failing input; returns (shrunk Failure or None, examples run)."""
    try:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import strategies as st
    except ImportError:
        return None, 0
    big = 0.5 * DTYPE_MAX[dtype]
    specials = [0.0, 1.0, -1.0, 20.0, -20.0, 90.0, -90.0, 800.0, -800.0]
    if "huge_shift" not in skip:
        specials += [1e4, -1e4, big, -big]
    # the skipped regions' hazards stay out of the exploration too
    mask_index = "masked" not in skip
    mask_prob = "masked_soft" not in skip
    element = st.one_of(st.floats(-30.0, 30.0, width=32), st.sampled_from(specials))
    softmax = losses.get(reference).is_softmax
    kinds = [k for k in ("index", "prob") if k not in unsupported] if softmax else ["prob"]
    if not kinds:
        return None, 0
    ignore_index = options.get("ignore_index", -100)
    allow_ignore = "ignored" not in skip

    @st.composite
    def inputs(draw):
        n = draw(st.integers(1, 3))
        c = draw(st.integers(1, 6)) if softmax else draw(st.integers(1, 4))
        values = draw(st.lists(element, min_size=n * c, max_size=n * c))
        z = np.clip(np.array(values, dtype=np.float64).reshape(n, c), -big, big)
        if not softmax:
            t = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, 0.25]),
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

    state = {"count": 0, "last": None}

    @settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
              report_multiple_bugs=False)  # fmt: skip
    @given(inputs())
    def search(data):
        z, t = data
        state["count"] += 1
        case = Case(reference, "hypothesis", "example", z, t, dict(options))
        prep = B.prepare(case, dtype)
        kind, judgement, outcome = evaluate(impl, prep, device, jit)
        if kind in ("ok", "skipped"):
            return
        state["last"] = (prep, kind, judgement, outcome)
        raise AssertionError(kind)

    try:
        search()
    except AssertionError:
        pass
    except Exception:  # noqa: BLE001 - Hypothesis internals; report, do not crash
        return None, state["count"]
    if state["last"] is None:
        return None, state["count"]
    prep, kind, judgement, outcome = state["last"]
    failure = make_failure(impl, prep, label, mode, kind, judgement, outcome)
    failure.case = "hypothesis (shrunk)"
    return failure, state["count"]


def resolve(spec: str) -> Any:
    """'package.module:function' -> the function."""
    if ":" not in spec:
        raise ValueError(f"`candidate` must be written MODULE:FUNCTION. Received: {spec!r}.")
    module_name, _, attr = spec.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
