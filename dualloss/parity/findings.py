"""The report of a check: ``Hazard``, ``CheckReport`` and the names a reproducer calls.

The types every producer of a check's findings shares (``_check`` for losses of logits,
``linear`` for the fused linear losses), with the way a report reads: the order of consequence,
the grouping of one problem seen in several regions, what scopes it, and how a candidate is
named in a reproducer (``_name_of``).

It sits below both producers: it imports the registry, ``runner`` (the failures it holds) and
``tolerance``, and must not import ``_check``, ``linear``, ``peers`` or any framework.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import losses
from .runner import Failure, _short
from .tolerance import ALL_IGNORED_NAN, VISIBLE

# what a candidate may or may not implement, as the report names it
FEATURES = {
    "index": "class-index targets",
    "prob": "probability targets",
    "ignored": "ignored labels (targets equal to ignore_index)",
    "all_ignored": "all-ignored batches",
    "masked": "masked classes (-inf logits)",
    "soft": "soft targets (strictly between 0 and 1)",
    "spatial": "spatial layout (extra dims: (N, C, d1, ...) in torch, (N, d1, ..., C) in JAX)",
}
# an option the candidate takes and raises on (``check`` probes it at its neutral value)
OPTION_PREFIX = "option:"
# the order of consequence (issue 31): non-finite, wrong at the result's scale, writes its input
# (issue 28: the caller's logits or targets are garbage afterwards), raised on a supported
# feature, then accuracy below the result's scale (what only a few-ULP tolerance sees)
# then a NaN loss over an all-ignored batch with finite gradients (torch's choice, acceptable)
CONSEQUENCE = ("non-finite", "wrong at the result's scale", "writes input", "error",
               ALL_IGNORED_NAN, "accuracy")  # fmt: skip
# a gradient w.r.t. targets or an option the candidate takes that autodiff could not give
GRAD_PREFIX = "grad:"

# said when the candidate has no name to call it by (a lambda, a partial, a callable object)
UNNAMED_NOTE = ("the reproducers call your function `candidate` (it has no name of its own): "
                "bind it first, `candidate = <your function>`")  # fmt: skip


# the short names of the features in the report's "unsupported: <feature> (<message>)"
FEATURE_KEYS = {
    "index": "class-index targets", "prob": "probability targets", "ignored": "ignored labels",
    "all_ignored": "all-ignored batches", "masked": "masked classes (-inf logits)",
    "soft": "soft targets", "spatial": "spatial",
}  # fmt: skip


def _feature_key(feature: str) -> str:
    """The short name the report gives a feature: 'spatial', 'gradient w.r.t. weight', ..."""
    if feature.startswith(GRAD_PREFIX):
        return f"gradient w.r.t. {feature[len(GRAD_PREFIX) :]} not available"
    if feature.startswith(OPTION_PREFIX):
        return f"option {feature[len(OPTION_PREFIX) :]}"
    return FEATURE_KEYS.get(feature, feature)


def unsupported_lines(unsupported: dict) -> list[str]:
    """The report's section on what the candidate refused: "unsupported: <feature> (<its
    message>)" per feature, then its reproducer."""
    if not unsupported:
        return []
    lines = ["Unsupported by the candidate (a clear exception on the whole feature: those cases "
             "were not judged; a crash on a supported feature is a failure above):"]  # fmt: skip
    for feature, entry in unsupported.items():
        message, _, rest = entry.partition("\n")
        lines.append(f"  - unsupported: {_feature_key(feature)} ({message})")
        if rest:
            lines.append(rest)
    return lines


@dataclass
class Hazard:
    """One distinct problem (kind x region): its smallest reproducer and how often it occurred."""

    failure: Failure
    region: str
    count: int = 1
    dtypes: list[str] = field(default_factory=list)

    @property
    def consequence(self) -> str:
        """One of ``CONSEQUENCE``: an accuracy failure is "wrong at the result's scale" when its
        error reaches ``tolerance.VISIBLE`` of the result's largest entry."""
        f = self.failure
        if f.kind == "accuracy" and getattr(f, "scaled_error", 0.0) >= VISIBLE:
            return CONSEQUENCE[1]
        return f.kind if f.kind in CONSEQUENCE else "error"

    def rank(self) -> tuple:
        """Sort key: consequence, then the larger error at the result's scale, adversarial cases
        before Hypothesis's, the smaller input."""
        f = self.failure
        return (CONSEQUENCE.index(self.consequence), -getattr(f, "scaled_error", 0.0),
                self.region == "hypothesis", np.size(getattr(f, "logits", None)))  # fmt: skip


@dataclass(repr=False)
class CheckReport:
    """The verdict of ``check``: ``.ok``, ``.failures`` (one per kind x region, real hazards
    first, then smallest input), ``.unsupported`` (feature -> reproducer) and ``str()``."""

    candidate: str
    reference: str
    backend: str
    options: dict
    standard: str = "practical"
    dtypes: list[str] = field(default_factory=list)
    hazards: list[Hazard] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)
    cases_run: int = 0
    cases_judged: int = 0
    examples_run: int = 0
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"
    # matmul precision in force while judging (pinned: no TF32), for the record
    precision: dict = field(default_factory=dict)
    # how many cases judged the gradient w.r.t. 'targets' and each option the candidate takes
    judged_grads: dict[str, int] = field(default_factory=dict)
    # how the candidate ran: 'eager' or 'jit' (JAX: jax.jit, the default), and why not jit
    mode: str = "eager"
    eager_because: str = ""
    # which gradients the user asked to judge (``check(grads=...)``): 'all', 'logits' or names
    grads: Any = "all"
    _grad_sizes: dict[str, int] = field(default_factory=dict, repr=False)
    # the record of `reference` (``losses.LossInfo``), as the check resolved it
    info: losses.LossInfo | None = field(default=None, repr=False, compare=False)

    @property
    def failures(self) -> list[Failure]:
        return [h.failure for h in self.hazards]

    @property
    def ok(self) -> bool:
        return not self.hazards and self.cases_judged > 0

    def __bool__(self) -> bool:
        return self.ok

    def assert_ok(self) -> CheckReport:
        """Raises ``AssertionError`` whose message is the whole report (every reproducer) unless
        `.ok`; returns the report. Use it in tests: ``assert report.ok, report`` hands pytest
        the report object, which it shows as a repr cut to 240 characters."""
        __tracebackhide__ = True  # pytest: the failure points at the caller's line
        if not self.ok:
            raise AssertionError("\n" + str(self))
        return self

    def __str__(self) -> str:
        options = ", ".join(f"{k}={_plain(v)}" for k, v in self.options.items()) or "defaults"
        if self.ok:
            verdict = "OK"
        elif not self.hazards:
            verdict = "NOT VERIFIED (nothing judged)"
        else:
            counts = {}
            for group in _groups(self.hazards):
                counts[group[0].consequence] = counts.get(group[0].consequence, 0) + 1
            verdict = (
                f"FAILS: {sum(counts.values())} problem(s) in {len(self.hazards)} region(s) ("
                + ", ".join(f"{n} {k}" for k, n in counts.items())
                + ")"
            )
        on = self.device + (" (the default device; pass device='gpu:0' for the GPU)"
                            if self.device == "cpu" else "")  # fmt: skip
        lines = [
            f"{self.candidate} vs spec.{self.reference} ({self.backend}; {options}): {verdict}",
            f"  device: {on}",
            f"  ran: {_ran(self)}",
            f"  {self.cases_judged} of {self.cases_run} adversarial cases judged "
            f"({', '.join(self.dtypes)}), {self.examples_run} Hypothesis examples, "
            f"{self.standard} standard",
        ]
        asked = self.grads if isinstance(self.grads, str) else tuple(self.grads)
        lines.append(f"  grads={asked!r}: gradients judged w.r.t. logits" + "".join(
            f", {name} ({n} cases)" for name, n in self.judged_grads.items()))  # fmt: skip
        softmax = (self.info or losses.get(self.reference)).is_softmax
        groups = _groups(self.hazards)
        for i, group in enumerate(groups, 1):
            lines += _describe(i, group[0])
            if len(group) > 1:
                lines += _wrap("   the same in: " + ", ".join(
                    f"{h.region} ({'/'.join(h.dtypes)}; {h.count} case{'s' * (h.count > 1)})"
                    for h in group[1:]), "     ")  # fmt: skip
            scope = _scope(group, softmax)
            if scope:
                lines += _wrap(f"   only {scope}", "     ")
        if len(groups) < len(self.hazards):
            lines.append(f"note: {REPRODUCERS}")
        lines += unsupported_lines(self.unsupported)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def _ran(report: CheckReport) -> str:
    """How the candidate ran, for the report."""
    if report.backend != "jax":
        return "eagerly"
    if report.mode == "jit":
        return "under jax.jit (one compilation per input shape; jit=False for eager-only code)"
    if report.eager_because:
        why = report.eager_because
        return f"eagerly, op by op (slow): jax.jit cannot trace the candidate ({why})"
    return "eagerly, op by op (jit=False)"


def _plain(value) -> str:
    if isinstance(value, np.ndarray):
        return _short(value, 60)
    if isinstance(value, (np.floating, np.integer)):
        return repr(value.item())
    return repr(value)


def _signature(hazard: Hazard) -> tuple:
    """Hazards with one signature are one problem seen in several regions: non-finite results of
    the same quantity and kind (nan, inf), accuracy at or below the result's scale, the same
    exception."""
    consequence = hazard.consequence
    problem = hazard.failure.problems[0] if hazard.failure.problems else ""
    if consequence == "non-finite":
        subject, _, rest = problem.partition(" is ")
        return (consequence, subject, rest.split(" ")[0])
    if consequence in ("error", "writes input", ALL_IGNORED_NAN):
        return (consequence, problem[:80])
    return (consequence,)


def _groups(hazards: list[Hazard]) -> list[list[Hazard]]:
    """`hazards` (in order of consequence) gathered by ``_signature``, in order of first sight."""
    groups: dict[tuple, list[Hazard]] = {}
    for hazard in hazards:
        groups.setdefault(_signature(hazard), []).append(hazard)
    return list(groups.values())


REPRODUCERS = ("each region's own reproducer: "
               "for h in report.hazards: print(h.region, h.failure.reproducer)")  # fmt: skip
# the inputs a user may not pass (tag -> what they are, and how to scope the check to the rest)
_SCOPES = {
    "masked": "with -inf logits (class masks): if your logits never hold -inf, "
              "skip=('masked', 'masked_soft') leaves them out. Masks written as "
              "torch.finfo(dtype).min, as Hugging Face models write them, are finite logits "
              "that the huge_shift and confident regions cover",
    "prob": "with probability targets (soft, one-hot or smoothed): no concern for calls with "
            "class indices (skip=('soft_targets', 'masked_soft', 'wide_span') leaves out the "
            "regions made of them)",
    "soft": "with soft targets (strictly between 0 and 1): binary_targets=True judges targets "
            "in {0, 1} only",
    "huge": "at logits near half the dtype's range: skip=('huge_shift',) leaves them out, but "
            "masks written as torch.finfo(dtype).min, as Hugging Face models write them, put "
            "logits there",
    "wide": "at logits spanning more than the dtype's largest number in one row (z - max "
            "overflows though the loss is finite): skip=('wide_span',) leaves them out",
}  # fmt: skip


def _tags(hazard: Hazard, softmax: bool) -> set[str]:
    f = hazard.failure
    logits = np.asarray(getattr(f, "logits", None), dtype=np.float64)
    targets = np.asarray(getattr(f, "targets", None))
    tags = set()
    if hazard.region in ("masked", "masked_soft") or np.any(np.isneginf(logits)):
        tags.add("masked")
    if softmax and targets.dtype.kind == "f":
        tags.add("prob")
    if not softmax and np.any((targets != 0.0) & (targets != 1.0)):
        tags.add("soft")
    if hazard.region == "huge_shift":
        tags.add("huge")
    if hazard.region == "wide_span":
        tags.add("wide")
    return tags


def _scope(group: list[Hazard], softmax: bool) -> str:
    """What every hazard of `group` needs from its input, and how to scope the check without
    it; '' when they have nothing in common."""
    common = set.intersection(*(_tags(h, softmax) for h in group))
    return "; ".join(_SCOPES[tag] for tag in _SCOPES if tag in common)


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False)


def _describe(i: int, hazard: Hazard) -> list[str]:
    f = hazard.failure
    more = f"; {hazard.count} cases" if hazard.count > 1 else ""
    where = "Hypothesis (shrunk)" if hazard.region == "hypothesis" else f"region {hazard.region}"
    case = "" if hazard.region == "hypothesis" else f": case {f.case}"
    lines = [f"{i}. [{hazard.consequence}] {where}, {'/'.join(hazard.dtypes)}{more}{case}"]
    lines += [f"   {p}" for p in f.problems[:2]]
    lines.append(f"   logits {_short(f.logits, 110)}  targets {_short(f.targets, 60)}")
    if f.expected_value is not None:
        lines.append(
            f"   value: expected {_short(f.expected_value, 60)}, "
            f"received {_short(f.received_value, 60)}"
        )
        if f.expected_grad is not None:
            lines.append(
                f"   grad:  expected {_short(f.expected_grad, 70)}, "
                f"received {_short(f.received_grad, 70)}"
            )
    lines.append(f"   reproduce: {f.reproducer}")
    return lines


def _name_of(candidate) -> tuple[str, str, str]:
    """(display name, import line, call expression) for reproducers: an importable function is
    imported by its module; one that is not (defined in ``__main__``, a notebook, inside a test)
    is called by its own name, so that the line runs pasted next to its definition. Only what
    has no name (a lambda, a partial, a callable object) is called ``candidate``."""
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
        except Exception:  # noqa: BLE001 - then the reproducer calls it by its own name
            pass
    name = qualname or repr(candidate)
    own = getattr(candidate, "__name__", "")
    if inspect.isfunction(candidate) and own.isidentifier() and own != "<lambda>":
        return name, "", own
    return name, "", "candidate"


def shrink_search(strategy, attempt, max_examples):
    """Hypothesis search with shrinking, the one used by ``_check`` and ``linear``: derandomized,
    no example database, no deadline, every health check off, generate then shrink.

    `attempt(data)` judges one drawn input and returns None where it holds, else a record of the
    failure (its second entry the failure's kind). Returns (the last record, that of the shrunk
    input, or None; the examples run); None too where Hypothesis itself raised."""
    from hypothesis import HealthCheck, Phase, given, settings

    state = {"count": 0, "last": None}

    @settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
              report_multiple_bugs=False)  # fmt: skip
    @given(strategy)
    def search(data):
        state["count"] += 1
        found = attempt(data)
        if found is not None:
            state["last"] = found
            raise AssertionError(found[1])

    try:
        search()
    except AssertionError:
        pass
    except Exception:  # noqa: BLE001 - Hypothesis internals; report, do not crash
        return None, state["count"]
    return state["last"], state["count"]
