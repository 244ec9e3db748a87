"""The parity run: loss x implementation x dtype x device x mode x case, each judged by the spec.

``run_matrix`` returns a ``RunResult``: one ``Record`` per judged call, the failures with a
minimal reproducer each, and cross-backend / cross-device diagnostics (differences between
implementations on the same rounded inputs; informative, never a failure by themselves).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .. import losses as _registry
from . import backends as B
from . import devices as D
from .cases import LOSSES, Case, make_cases
from .tolerance import ALL_IGNORED_NAN, ALL_IGNORED_NAN_NOTE, ulp
from .tolerance import judge as _judge

# the kinds of a call that was judged (the others: error, compile-error, skipped)
JUDGED = ("ok", "non-finite", "accuracy", "writes input", ALL_IGNORED_NAN)
# dualloss's own implementations: they take every option of their record, so an option they
# lack or refuse does not leave the run holding
OWN = ("torch_impl", "jax_impl", B.TRITON)


@dataclass
class Record:
    loss: str
    impl: str
    backend: str
    device: str
    mode: str
    dtype: str
    region: str
    case: str
    kind: str  # ok | non-finite | accuracy | error | skipped
    value_ulp: float = 0.0
    grad_ulp: float = 0.0
    ratio: float = 0.0
    margin: float = 0.0
    gamma: float = 0.0
    value: Any = None  # the received (reduced) value, for the diagnostics


@dataclass
class Failure:
    """One failing call, shrunk to a minimal input where the batch allowed it."""

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
    logits: Any
    targets: Any
    expected_value: Any
    received_value: Any
    expected_grad: Any
    received_grad: Any
    reproducer: str
    # the largest error relative to its result's largest entry (``Judgement.scaled_error``)
    scaled_error: float = 0.0

    def describe(self) -> str:
        lines = [
            f"[{self.kind}] {self.impl}.{self.loss} {self.dtype} {self.device} {self.mode} "
            f"case {self.case}",
        ]
        lines += [f"    {p}" for p in self.problems]
        lines.append(f"    options: {_short(self.options)}")
        lines.append(f"    logits: {_short(self.logits)}  targets: {_short(self.targets)}")
        expected, received = _short(self.expected_value), _short(self.received_value)
        lines.append(f"    expected value {expected}, received {received}")
        if self.expected_grad is not None:
            expected, received = _short(self.expected_grad), _short(self.received_grad)
            lines.append(f"    expected grad {expected}, received {received}")
        lines.append(f"    reproduce: {self.reproducer}")
        return "\n".join(lines)


def _short(value, limit=160) -> str:
    if isinstance(value, dict):
        text = "{" + ", ".join(f"{k}={_short(v, 60)}" for k, v in value.items()) + "}"
    elif isinstance(value, np.ndarray):
        text = np.array2string(value, precision=6, threshold=12, max_line_width=10_000)
        text = text.replace("\n", "")
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class RunResult:
    records: list[Record] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    diagnostics: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    seconds: float = 0.0
    # implementations asked for that could not be loaded: the run did not judge them
    unavailable: list[str] = field(default_factory=list)
    # "backend/device/mode" planned but not judged (nothing ran there, compile failed, budget)
    untested: list[str] = field(default_factory=list)
    # torch.compile failures: the function compiles wrongly or not at all (its eager call works)
    compile_failures: list[str] = field(default_factory=list)
    # options an implementation does not take (a peer) or refuses with an exception where the
    # same call without them works: its cases with them are not judged, nor failed (DESIGN 14);
    # one dict per implementation and loss: impl, loss, options, cases, regions, why, reproducer
    unsupported: list[dict] = field(default_factory=list)

    @property
    def judged(self) -> int:
        return sum(r.kind in JUDGED for r in self.records)

    @property
    def ok(self) -> bool:
        """Parity holds: something was judged, every implementation asked for was, and no call
        failed or raised."""
        if self.unavailable or self.untested or self.compile_failures or self.judged == 0:
            return False
        if any(entry["impl"] in OWN for entry in self.unsupported):
            return False
        return not self.failures and not any(r.kind == "error" for r in self.records)

    def unsupported_lines(self) -> list[str]:
        """One line per implementation and loss with options it lacks, with a reproducer of a
        refusal where it raised."""
        lines = []
        for entry in self.unsupported:
            line = (
                f"{entry['impl']}.{entry['loss']}: option {', '.join(entry['options'])} "
                f"({entry['cases']} calls of region {', '.join(entry['regions'])} not judged): "
                f"{entry['why']}"
            )
            if entry["impl"] in OWN:
                line += " [dualloss's own backend: this does not hold]"
            if entry["reproducer"]:
                line += f"\n      reproduce: {entry['reproducer']}"
            lines.append(line)
        return lines

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "unavailable": self.unavailable,
            "untested": self.untested,
            "compile_failures": self.compile_failures,
            "unsupported": _jsonable(self.unsupported),
            "config": self.config,
            "seconds": self.seconds,
            "notes": self.notes,
            "records": [_jsonable(asdict(r)) for r in self.records],
            "failures": [_jsonable(asdict(f)) for f in self.failures],
            "diagnostics": _jsonable(self.diagnostics),
        }


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        value = float(value)
        if value != value or value in (np.inf, -np.inf):
            return str(value)
        return value
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


# ----------------------------------------------------------------------------------------------
# One call, judged
# ----------------------------------------------------------------------------------------------


def judge_outcome(prep: B.Prepared, outcome: B.Outcome, standard: str = "strict"):
    return _judge(
        prep.case.info,
        prep.ref_logits,
        prep.ref_targets,
        prep.options,
        prep.dtype,
        outcome.value,
        outcome.grad,
        standard=standard,
        input_grads=outcome.input_grads,
    )


def evaluate(
    impl: B.Implementation, prep: B.Prepared, device: Any, compiled: bool, standard: str = "strict"
):
    """(kind, judgement or None, outcome); `standard` as ``tolerance.judge``."""
    outcome = B.run_case(impl, prep, device, compiled)
    if outcome.skipped:
        return "skipped", None, outcome
    if outcome.compile_failed:
        return "compile-error", None, outcome
    if outcome.error is not None:
        return "error", None, outcome
    if outcome.input_grad_errors and impl.name.split("[", 1)[0] in OWN:
        # dualloss's own backends differentiate every input ``backends.our_wrt`` names (a
        # peer's or a candidate's that raises is left out and noted): one that raises is a
        # failure, never a gradient silently not judged
        name, why = next(iter(outcome.input_grad_errors.items()))
        outcome.error = f"the gradient w.r.t. {name}: {why}"
        return "error", None, outcome
    try:
        judgement = judge_outcome(prep, outcome, standard)
    except Exception as error:  # noqa: BLE001 - e.g. a wrong output shape
        outcome.error = f"could not judge the output: {type(error).__name__}: {error}"
        return "error", None, outcome
    if outcome.written:
        # a hazard of its own kind whatever the value (a user reads the input afterwards)
        return "writes input", judgement, outcome
    return judgement.kind, judgement, outcome


def refused_options(impl, prep: B.Prepared, device: Any, compiled: bool) -> tuple[str, ...]:
    """For a call that raised: the LLM head options of the case (``losses.HEAD_OPTIONS``, away
    from their neutral value) without which the same call works, i.e. the options it refuses
    as a whole feature; () when there are none or the call raises without them too."""
    info = prep.case.info
    names = tuple(
        name for name in _registry.HEAD_OPTIONS
        if name in prep.options and not info.option(name).is_neutral(prep.options[name])
    )  # fmt: skip
    if not names:
        return ()
    without = {k: v for k, v in prep.case.options.items() if k not in names}
    plain = B.prepare(replace(prep.case, options=without), prep.dtype)
    return names if evaluate(impl, plain, device, compiled)[0] != "error" else ()


def _note_unsupported(result, impl, case, options, why, reproducer) -> None:
    """Counts one call of `impl` not judged for lacking `options` in ``result.unsupported``."""
    for entry in result.unsupported:
        if (entry["impl"], entry["loss"]) == (impl.name, impl.loss):
            entry["options"] = sorted(set(entry["options"]) | set(options))
            entry["cases"] += 1
            entry["regions"] = sorted(set(entry["regions"]) | {case.region})
            if reproducer and not entry["reproducer"]:
                entry["why"], entry["reproducer"] = why, reproducer
            return
    result.unsupported.append({
        "impl": impl.name, "loss": impl.loss, "options": sorted(options), "cases": 1,
        "regions": [case.region], "why": why, "reproducer": reproducer,
    })  # fmt: skip


COMPILED_MINIMISE_ROWS = 8


def minimise(
    impl, prep, device, compiled, kind, standard: str = "strict"
) -> tuple[B.Prepared, Any, B.Outcome]:
    """The smallest failing input found among the case's single rows (hot rows first)."""
    case = prep.case
    n = case.logits.shape[0] if case.logits.ndim >= 2 else 1
    if n <= 1:
        return prep, None, None
    # compiled: every new shape or option may recompile, so fewer tries
    limit = COMPILED_MINIMISE_ROWS if compiled and impl.backend == "torch" else 96
    order = list(case.hot_rows) + [i for i in range(min(n, 96)) if i not in case.hot_rows]
    order = order[:limit]
    fallback = None
    for i in order:
        small = B.prepare(case.rows(i), prep.dtype)
        got, judgement, outcome = evaluate(impl, small, device, compiled, standard)
        if got == kind:
            return small, judgement, outcome
        if got not in ("ok", "skipped") and fallback is None:
            fallback = (small, judgement, outcome)
    return fallback if fallback else (prep, None, None)


def make_failure(impl, prep, device_label, mode, kind, judgement, outcome) -> Failure:
    if judgement is not None:
        problems = judgement.nonfinite + judgement.inaccurate
        if judgement.all_ignored_nan:
            problems = problems + [f"{ALL_IGNORED_NAN}: {ALL_IGNORED_NAN_NOTE}"]
        expected_value, received_value = judgement.expected_value, judgement.received_value
        expected_grad, received_grad = judgement.expected_grad, judgement.received_grad
    else:
        problems = [outcome.error or "failed"]
        expected_value = received_value = expected_grad = received_grad = None
    written = getattr(outcome, "written", ())
    problems = [
        f"{B.WRITTEN} {name} (it differs after the call: a caller who reads it "
        "afterwards reads what the loss left there)"
        for name in written
    ] + problems
    return Failure(
        kind=kind,
        loss=prep.case.loss,
        impl=impl.name,
        backend=impl.backend,
        device=device_label,
        mode=mode,
        dtype=prep.dtype,
        case=prep.case.name,
        problems=problems,
        options=prep.options,
        logits=prep.ref_logits,
        targets=prep.ref_targets,
        expected_value=expected_value,
        received_value=received_value,
        expected_grad=expected_grad,
        received_grad=received_grad,
        reproducer=B.reproducer(impl, prep, device_label, written=written),
        scaled_error=0.0 if judgement is None else judgement.scaled_error,
    )


# ----------------------------------------------------------------------------------------------
# The matrix
# ----------------------------------------------------------------------------------------------


class Progress:
    """A tqdm bar on stderr, advanced by each case's expected cost (so its ETA is honest), as
    wide as the terminal; silent when stderr is not a terminal or tqdm is not installed."""

    def __init__(self, total: float, enabled: bool = True):
        self.bar = None
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self.bar = tqdm(
            total=max(total, 1e-9), file=sys.stderr, disable=None, dynamic_ncols=True,
            bar_format="{desc}{percentage:3.0f}%|{bar}| {elapsed}<{remaining}", leave=False,
        )  # fmt: skip

    def step(self, label: str, cost: float = 1.0) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"parity {label[:48]} ", refresh=False)
            self.bar.update(cost)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def case_cost(case: Case, backend: str, mode: str) -> float:
    """The expected cost of one judged call, in units of a small torch eager call: the spec's
    float64 work grows with the input's size; JAX's eager mode compiles every primitive for each
    new shape, torch.compile compiles for seconds."""
    cost = 1.0 + case.logits.size / 20_000
    if backend == "jax":
        cost *= 6.0 if mode == "eager" else 2.0
    if mode == "compile":
        cost *= 40.0
    return cost


def _compiled_subset(cases: list[Case], level: str, dtype: str) -> set[int]:
    """Which cases also run in the backend's second mode: with level 'full', the first of each
    region and the hidden batches; with 'quick', float32 only, the first typical case and the
    first hidden batch (JAX's eager mode compiles every primitive for every shape, about 2 s a
    call on a CPU; the jitted mode runs every case)."""
    chosen, seen = set(), set()
    if level == "quick" and dtype != "float32":
        return chosen
    for i, case in enumerate(cases):
        if level == "full":
            if case.region not in seen or "hidden" in case.label:
                chosen.add(i)
            seen.add(case.region)
        elif case.region == "typical" and "typical" not in seen:
            chosen.add(i)
            seen.add("typical")
        elif "hidden" in case.label and "hidden" not in seen:
            chosen.add(i)
            seen.add("hidden")
    return chosen


# the regions whose cases differ in their options (each a different branch of a kernel), not in
# their margins or shapes: the interpreted kernels run all of their cases
_OPTION_REGIONS = ("options", "label_smoothing", "where", "llm_head", "wide_span", "all_ignored")


def _interpreted_subset(cases: list[Case], dtype: str) -> set[int]:
    """The cases Triton's interpreter runs with level 'quick' (NumPy, one program after another:
    a batch of 67 rows takes 1-3 s): every case of the regions that vary the options, and of the
    others the first case and one hidden batch (the batch that hides each margin's row among
    ordinary rows, so every margin still reaches the kernel). Where a region has a hidden batch
    per gamma, the gamma goes round the regions and the dtypes, so that each (region, gamma)
    meets the kernel in one dtype. The full level runs every case."""
    regions = list(dict.fromkeys(case.region for case in cases))
    turn = B.DTYPES.index(dtype) if dtype in B.DTYPES else 0
    hidden: dict[str, list[int]] = {}
    chosen, seen = set(), set()
    for i, case in enumerate(cases):
        if case.region in _OPTION_REGIONS or case.region not in seen:
            chosen.add(i)
        elif "hidden" in case.label:
            hidden.setdefault(case.region, []).append(i)
        seen.add(case.region)
    for region, batches in hidden.items():
        chosen.add(batches[(regions.index(region) + turn) % len(batches)])
    return chosen


def run_matrix(
    implementations: list[B.Implementation],
    *,
    dtypes=B.DTYPES,
    devices: list[str] | None = None,
    level: str = "quick",
    losses=LOSSES,
    regions=None,
    skip=(),
    jit: bool = True,
    torch_compile: bool | None = None,
    progress: bool = True,
    compile_budget_s: float = 900.0,
    side_by_side: bool = False,
) -> RunResult:
    """Runs every implementation on every case of its loss, dtype, device and mode.

    `side_by_side`: each backend's implementations in a thread of their own, torch's in the
    calling thread (``backends.time_limit`` needs its SIGALRM), the others beside it. XLA's
    compilations, torch's kernels and NumPy release the GIL for much of their time: on 2 CPU
    cores the quick run's JAX and torch halves (about 300 s and 140 s alone) take about 360 s
    together. The result is the one a run of one backend after the other gives (records and
    failures in the order of `implementations`, the cross-backend diagnostics from every
    value), its `seconds` the wall time.
    """
    kwargs = dict(dtypes=dtypes, devices=devices, level=level, losses=losses, regions=regions,
                  skip=skip, jit=jit, torch_compile=torch_compile,
                  compile_budget_s=compile_budget_s)  # fmt: skip
    if side_by_side:
        groups: dict[str, list[B.Implementation]] = {}
        for impl in implementations:
            groups.setdefault(impl.backend, []).append(impl)
        if len(groups) > 1:
            merged = _side_by_side(groups, kwargs, progress)
            # in the order of `implementations`, as one run after the other gives them
            order = {(i.name, i.loss): at for at, i in reversed(list(enumerate(implementations)))}
            merged.records.sort(key=lambda r: order.get((r.impl, r.loss), len(order)))
            merged.failures.sort(key=lambda f: order.get((f.impl, f.loss), len(order)))
            merged.config["implementations"] = [i.name for i in implementations]
            return merged
    result, values = _run_matrix(implementations, progress=progress, **kwargs)
    result.diagnostics = _diagnostics(values)
    return result


def _side_by_side(groups: dict, kwargs: dict, progress: bool) -> RunResult:
    """``run_matrix``'s backends in threads, merged as one run (see it)."""
    import threading

    started = time.monotonic()
    backends = [b for b in B.BACKENDS if b in groups] + [b for b in groups if b not in B.BACKENDS]
    D.start([b for b in backends if b in B.BACKENDS])  # JAX before torch, once, here
    # every device must exist for every backend (``devices.DeviceError``), as in one run
    D.resolve(backends, kwargs["devices"])
    main = "torch" if "torch" in groups else backends[0]
    outcomes: dict[str, tuple] = {}
    errors: dict[str, BaseException] = {}

    def run(backend, show):
        try:
            outcomes[backend] = _run_matrix(groups[backend], progress=show, **kwargs)
        except BaseException as error:  # noqa: BLE001 - raised again in the calling thread
            errors[backend] = error

    # the progress bar follows the longest half (JAX's compilations), where there is one
    longest = "jax" if "jax" in groups else main
    threads = [threading.Thread(target=run, args=(b, progress and b == longest), daemon=True)
               for b in backends if b != main]  # fmt: skip
    for thread in threads:
        thread.start()
    run(main, progress and main == longest)
    for thread in threads:
        thread.join()
    for backend in backends:
        if backend in errors:
            raise errors[backend]
    merged = RunResult(config=dict(outcomes[backends[0]][0].config))
    values: dict = {}
    for backend in backends:
        part, part_values = outcomes[backend]
        merged.records += part.records
        merged.failures += part.failures
        merged.notes += [n for n in part.notes if n not in merged.notes]
        merged.unavailable += part.unavailable
        merged.untested += part.untested
        merged.compile_failures += part.compile_failures
        merged.unsupported += part.unsupported
        # (the implementations are listed by ``run_matrix``, in their order)
        if backend != backends[0]:
            merged.config["precision"] = {**merged.config.get("precision", {}),
                                          **part.config.get("precision", {})}  # fmt: skip
        for key, by_impl in part_values.items():
            values.setdefault(key, {}).update(by_impl)
    merged.diagnostics = _diagnostics(values)
    merged.seconds = time.monotonic() - started
    return merged


def _run_matrix(
    implementations: list[B.Implementation],
    *,
    dtypes,
    devices,
    level,
    losses,
    regions,
    skip,
    jit,
    torch_compile,
    progress,
    compile_budget_s,
) -> tuple[RunResult, dict]:
    """Runs every implementation on every case of its loss, dtype, device and mode: the run's
    result without its diagnostics, and the values they are computed from.

    Modes: every case runs in the backend's main mode (torch eager, jax.jit: JAX's eager mode
    compiles each primitive for each new shape, slower than one jit per shape), and a subset
    (the first case of each region) in the other ('eager' for JAX, 'compile' for torch); with
    level 'full' both JAX modes run every case. torch.compile runs only with level 'full' unless
    `torch_compile` says otherwise: it takes seconds per shape on a CPU.

    Devices: ``devices.resolve`` over the backends of the implementations (default cpu plus the
    first GPU; a device one backend lacks raises ``devices.DeviceError``). Matmul precision is
    pinned (no TF32) and recorded in ``config``. A (backend, device, mode) that was planned but
    judged nothing is listed in ``untested`` and the run does not hold. torch.compile: a call
    whose compiled form raises while its eager form works is a compile failure (not a loss
    error); compiling stops for an implementation after its first compile failure, for every
    implementation once `compile_budget_s` seconds went into compiled calls (also enforced
    within one call by a timer where the platform has SIGALRM), and recompilations are bounded
    (``backends.RECOMPILE_LIMIT``; hitting the limit is a compile failure, not a silent fallback
    to eager).
    """
    started = time.monotonic()
    result = RunResult(config={
        "implementations": [i.name for i in implementations], "dtypes": list(dtypes),
        "devices": devices, "level": level, "losses": list(losses),
    })  # fmt: skip
    if torch_compile is None:
        torch_compile = level == "full"
    backends = [b for b in B.BACKENDS if any(i.backend == b and i.fn is not None
                                             for i in implementations)]  # fmt: skip
    result.notes += D.start(backends)
    names = D.resolve(backends, devices)  # DeviceError: a requested device is missing
    result.config["devices"] = names
    result.config["precision"] = D.pin_precision(backends)
    plan = []  # (impl, device_label, device, mode)
    for impl in implementations:
        result.notes += [n for n in impl.notes if n not in result.notes]
        if impl.loss not in losses:
            continue
        if impl.fn is None:
            result.unavailable.append(f"{impl.name}.{impl.loss}")
            continue
        pairs = [(name, D.device_object(impl.backend, name)) for name in names]
        for label, device in pairs:
            plan.append((impl, label, device, "eager"))
            if impl.backend == "jax" and jit:
                plan.insert(len(plan) - 1, (impl, label, device, "jit"))
            if impl.backend == "torch" and torch_compile:
                plan.append((impl, label, device, "compile"))
    cases_by = {}
    for impl, _, _, _ in plan:
        for dtype in dtypes:
            key = (impl.loss, dtype)
            if key not in cases_by:
                cases_by[key] = make_cases(
                    impl.loss, dtype, level=level, regions=regions, skip=skip
                )

    def subset(cases, impl, mode, dtype, label):
        """Every case in the main mode of the backend, a subset in the others; with level
        'quick' a subset for the kernels under Triton's interpreter (on the CPU)."""
        main = "jit" if impl.backend == "jax" and jit else "eager"
        if level == "quick" and impl.name == B.TRITON and label == "cpu":
            return sorted(_interpreted_subset(cases, dtype))
        if mode == main or level == "full" and mode != "compile":
            return range(len(cases))
        return sorted(_compiled_subset(cases, level, dtype))

    total = 0.0
    for impl, label, _, mode in plan:
        for dtype in dtypes:
            cases = cases_by[(impl.loss, dtype)]
            for i in subset(cases, impl, mode, dtype, label):
                total += case_cost(cases[i], impl.backend, mode)
    bar = Progress(total, enabled=progress)
    prepared = {}
    values = {}  # (loss, dtype, case) -> {(impl, device, mode): value}
    compile_seconds = 0.0
    compile_stopped: dict[str, str] = {}  # impl key -> why compiling stopped
    for impl, label, device, mode in plan:
        for dtype in dtypes:
            cases = cases_by[(impl.loss, dtype)]
            for i in subset(cases, impl, mode, dtype, label):
                case = cases[i]
                key = (impl.loss, dtype, i)
                if key not in prepared:
                    prepared[key] = B.prepare(case, dtype)
                prep = prepared[key]
                compiled = mode != "eager"
                torch_compiled = mode == "compile"
                impl_key = f"{impl.name}.{impl.loss} {label}"
                if torch_compiled and compile_seconds >= compile_budget_s:
                    compile_stopped.setdefault(
                        impl_key, f"the torch.compile budget of {compile_budget_s:.0f}s was spent"
                    )
                if torch_compiled and impl_key in compile_stopped:
                    bar.step(impl_key, case_cost(case, impl.backend, mode))
                    continue
                began = time.monotonic()
                limit = max(compile_budget_s - compile_seconds, 1.0) if torch_compiled else None
                with B.time_limit(limit):
                    kind, judgement, outcome = evaluate(impl, prep, device, compiled)
                if torch_compiled:
                    compile_seconds += time.monotonic() - began
                bar.step(f"{impl.name} {impl.loss} {dtype} {mode}",
                         case_cost(case, impl.backend, mode))  # fmt: skip
                if kind == "skipped":
                    # a case the function cannot express for an option it lacks (not for
                    # its targets or shape: ``Implementation.supports``)
                    missing = B.lacking(impl, prep.options) if impl.supports(prep) else ()
                    if missing:
                        _note_unsupported(result, impl, case, missing, "it does not take them",
                                          "")  # fmt: skip
                    continue
                refused = refused_options(impl, prep, device, compiled) if kind == "error" else ()
                if refused:
                    _note_unsupported(result, impl, case, refused, f"it raised {outcome.error}",
                                      B.reproducer(impl, prep, label))  # fmt: skip
                    continue
                if kind == "compile-error":
                    compile_stopped[impl_key] = f"compile failure: {outcome.error}"
                    result.compile_failures.append(
                        f"{impl_key} {dtype} case {case.name}: {outcome.error}"
                    )
                    continue
                record = Record(
                    impl.loss, impl.name, impl.backend, label, mode, dtype, case.region,
                    case.name, kind, margin=case.margin, gamma=case.gamma,
                )  # fmt: skip
                if judgement is not None:
                    record.value_ulp = judgement.worst_value_ulp
                    record.grad_ulp = judgement.worst_grad_ulp
                    record.ratio = judgement.worst_ratio
                    values.setdefault((impl.loss, dtype, case.name), {})[
                        (impl.name, impl.backend, label, mode)
                    ] = (outcome.value, outcome.grad)
                result.records.append(record)
                if kind != "ok":
                    small, small_judgement, small_outcome = minimise(
                        impl, prep, device, compiled, kind
                    )
                    if small_outcome is None:
                        small, small_judgement, small_outcome = prep, judgement, outcome
                    result.failures.append(
                        make_failure(
                            impl, small, label, mode, kind, small_judgement, small_outcome
                        )  # fmt: skip
                    )
    bar.close()
    judged = {(r.impl, r.loss, r.device, r.mode) for r in result.records
              if r.kind in JUDGED}  # fmt: skip
    # a peer whose every case needs an option it lacks is listed as unsupported, not untested
    lacks = {(e["impl"], e["loss"]) for e in result.unsupported if e["impl"] not in OWN}
    for impl, label, _, mode in plan:
        if (impl.name, impl.loss, label, mode) in judged:
            continue
        if (impl.name, impl.loss) in lacks and not any(
            r.impl == impl.name and r.loss == impl.loss and r.device == label and r.mode == mode
            for r in result.records
        ):
            continue
        if not any(subset(cases_by[(impl.loss, d)], impl, mode, d, label) for d in dtypes):
            # a second mode with no case planned at this level and these dtypes (quick: its
            # subset is float32 only): nothing was meant to run, so nothing is missing
            continue
        why = compile_stopped.get(f"{impl.name}.{impl.loss} {label}", "nothing was judged")
        entry = f"{impl.name}.{impl.loss} on {label} ({mode}): {why}"
        if entry not in result.untested:
            result.untested.append(entry)
    for impl_key, why in compile_stopped.items():
        if why.startswith("the torch.compile budget"):
            entry = f"{impl_key} (compile): some cases not run, {why}"
            if not any(u.startswith(impl_key) for u in result.untested):
                result.untested.append(entry)
    result.seconds = time.monotonic() - started
    return result, values


def _diagnostics(values) -> list[dict]:
    """Largest differences between implementations / devices / modes on the same inputs, in ULPs
    of the dtype at the largest entry of the value (or gradient) array, one entry per (loss,
    dtype, pair), worst case named."""
    worst = {}
    for (loss, dtype, case), by_impl in values.items():
        keys = sorted(by_impl)
        for a_i in range(len(keys)):
            for b_i in range(a_i + 1, len(keys)):
                a, b = keys[a_i], keys[b_i]
                (va, ga), (vb, gb) = by_impl[a], by_impl[b]
                diff = 0.0
                for x, y in ((va, vb), (ga, gb)):
                    if x is None or y is None or np.shape(x) != np.shape(y):
                        continue
                    x = np.asarray(x, float)
                    y = np.asarray(y, float)
                    with np.errstate(all="ignore"):
                        both = np.isfinite(x) & np.isfinite(y)
                        # ULPs at the array's largest entry: tiny entries do not blow up
                        top = np.max(np.where(both, np.maximum(abs(x), abs(y)), 0.0), initial=0.0)
                        d = np.where(both, np.abs(x - y), 0.0) / ulp(top, dtype)
                        mismatch = (~both) & ~((np.isnan(x) & np.isnan(y)) | (x == y))
                    diff = max(diff, float(np.max(d, initial=0.0)))
                    if mismatch.any():
                        diff = float("inf")
                pair = (loss, dtype, " vs ".join("/".join(k) for k in (a, b)))
                if diff > worst.get(pair, (-1.0, ""))[0]:
                    worst[pair] = (diff, case)
    out = [
        {"loss": loss, "dtype": dtype, "pair": pair, "max_ulp": diff, "case": case}
        for (loss, dtype, pair), (diff, case) in worst.items()
    ]
    out.sort(key=lambda d: -d["max_ulp"])
    return out


def default_implementations(
    backends=B.BACKENDS, losses=LOSSES, peers: bool = False, kernels: bool = True
):
    """dualloss's own backends for each loss, torch's Triton kernels (``backends.TRITON``, where
    Triton runs: the CPU under its interpreter) when `kernels`, and the public peers when
    `peers`."""
    impls = []
    backends = [b for b in backends if importlib.util.find_spec(b) is not None]
    D.start(backends)  # JAX before torch
    for backend in backends:
        for loss in losses:
            impls.append(B.ours(backend, loss))
            if backend == "torch" and kernels:
                impls += [i for i in [B.ours_triton(loss)] if i is not None]
    if peers:
        from .peers import available_peers

        impls += [p for p in available_peers(backends) if p.loss in losses]
    return impls
