"""Running one implementation on one case: rounding, layout, devices, autodiff, compilation.

Nothing here imports torch or jax at import time; each framework is imported when first used.

Rounding: the case's float64 inputs are rounded to the candidate's dtype once, in NumPy
(``ml_dtypes`` for bfloat16), with a single correct rounding. PyTorch's own float64 -> float16 and
float64 -> bfloat16 conversions round twice (through float32) and can land one ULP away, which is
why the framework is not asked to do it. The rounded values are then exactly representable, so
every framework and device receives the same bits (and JAX receives PyTorch's buffer by DLPack
when both are loaded); the reference is the spec on those same values, upcast exactly to float64.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import losses
from . import devices as D
from .cases import Case, from_torch_layout, to_torch_layout

BACKENDS = ("torch", "jax")
DTYPES = ("float32", "float64", "float16", "bfloat16")


def numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def round_to(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` rounded once to `dtype` (round to nearest even), as a NumPy array of that dtype."""
    return np.asarray(array, dtype=np.float64).astype(numpy_dtype(dtype))


@dataclass
class Prepared:
    """A case in one dtype: what the candidate gets (NumPy, its dtype) and what the spec gets."""

    case: Case
    dtype: str
    logits: np.ndarray  # the dtype, class axis last
    targets: np.ndarray  # int64 or the dtype
    options: dict  # the spec's options with arrays rounded like the logits
    ref_logits: np.ndarray  # float64, exactly the values above
    ref_targets: np.ndarray


def prepare(case: Case, dtype: str) -> Prepared:
    logits = round_to(case.logits, dtype)
    if case.index_targets:
        targets = case.targets.astype(np.int64)
        ref_targets = targets
    else:
        targets = round_to(case.targets, dtype)
        ref_targets = targets.astype(np.float64)
    options = {}
    for key, value in case.options.items():
        if isinstance(value, np.ndarray) and value.dtype != np.bool_:
            value = round_to(value, dtype).astype(np.float64)
        options[key] = value
    return Prepared(case, dtype, logits, targets, options, logits.astype(np.float64), ref_targets)


# ----------------------------------------------------------------------------------------------
# Implementations under test
# ----------------------------------------------------------------------------------------------


@dataclass
class Implementation:
    """A loss function of one framework, called as ``fn(logits, targets, **kwargs)``.

    `kwargs(options, backend_arrays)` turns the spec's options into the function's keyword
    arguments (None: the function cannot express this case, it is skipped). `expr` is the call
    written as Python for reproducers, with ``{kwargs}`` standing for the keyword arguments.
    `loss` may be given as the loss's record or its name: `loss` holds the name, `info` the
    record.
    """

    name: str
    backend: str
    loss: str
    fn: Callable
    kwargs: Callable[[dict, Callable], dict | None]
    imports: str
    expr: Callable[[dict], str]
    notes: list[str] = field(default_factory=list)
    # False for cases the function cannot express (e.g. ignore_index targets for optax)
    supports: Callable[[Prepared], bool] = lambda prep: True
    # the inputs besides the logits whose gradients are taken and judged in a case: 'targets'
    # (probability targets) and option names, which `kwargs` must then give as float arrays
    wrt: Callable[[Prepared], tuple[str, ...]] = lambda prep: ()
    info: losses.LossInfo = field(default=None, repr=False, compare=False)
    # the spec options the function takes (a peer's); None: every option of the loss
    takes: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.loss, losses.LossInfo):
            self.info = self.loss
        elif self.info is None:
            self.info = losses.get(self.loss)
        self.loss = self.info.name


def lacking(impl: Implementation, options: dict) -> tuple[str, ...]:
    """The options of a case away from their neutral value that `impl` does not take."""
    if impl.takes is None:
        return ()
    return tuple(
        name for name, value in options.items()
        if name not in impl.takes and name != "reduction" and impl.info.has(name)
        and not impl.info.option(name).is_neutral(value)
    )  # fmt: skip


def format_kwargs(kwargs: dict) -> str:
    return "".join(f", {k}={v!r}" for k, v in kwargs.items())


def _our_kwargs(loss: str, backend: str):
    """Keyword arguments of dualloss's own backends: the spec's, arrays converted."""

    def kwargs(options, array):
        out = {}
        for key, value in options.items():
            if key == "axis":
                continue
            if isinstance(value, np.ndarray):
                if key == "where" and backend == "torch":
                    value = to_torch_layout(value)
                value = array(value, like_logits=value.dtype != np.bool_)
            out[key] = value
        return out

    return kwargs


# the options dualloss's backends differentiate: arrays (their real-number options, gamma,
# label_smoothing and a scalar alpha, are Python numbers by the API, not differentiable)
ARRAY_KINDS = ("class_vector", "scalar_or_class_vector", "elementwise")


def our_wrt(info) -> Callable[[Prepared], tuple[str, ...]]:
    """The inputs besides the logits whose gradients the parity run judges for dualloss's own
    backends (issue 28, item 6): probability targets and the array options of the case."""
    names = tuple(o.name for o in info.options if o.differentiable and o.kind in ARRAY_KINDS)

    def wrt(prep: Prepared) -> tuple[str, ...]:
        floats = not (info.is_softmax and prep.case.index_targets)
        # not at -inf logits: both backends give 0 for d loss / d t_c on a masked class where
        # the spec gives +inf (the open disagreement of OUR_MASKED_TARGETS)
        floats = floats and not np.any(np.isneginf(prep.logits))
        given = tuple(n for n in names if np.ndim(prep.options.get(n)) > 0)
        return ("targets",) * floats + given

    return wrt


# said in the parity run's notes: what the judged target gradients leave out, and why
OUR_MASKED_TARGETS = (
    "gradients w.r.t. probability targets are not judged for dualloss's backends at -inf "
    "logits: both give 0 for a masked class where the spec gives +inf (an open disagreement, "
    "tests/test_parity_check_grads.py::test_torch_target_gradient_on_a_masked_class)"
)


def ours(backend: str, loss: str) -> Implementation | None:
    """dualloss.torch_impl / dualloss.jax_impl's `loss`, or None when not importable yet."""
    module_name = "torch_impl" if backend == "torch" else "jax_impl"
    try:
        module = __import__(f"dualloss.{module_name}", fromlist=[loss])
        fn = getattr(module, loss)
    except Exception as error:  # noqa: BLE001 - a half-written backend must not stop the run
        return Implementation(
            module_name, backend, loss, None, lambda o, a: None, "", lambda kw: "",
            notes=[f"dualloss.{module_name}.{loss} unavailable: {type(error).__name__}: {error}"],
        )  # fmt: skip
    return Implementation(
        name=module_name,
        backend=backend,
        loss=loss,
        fn=fn,
        kwargs=_our_kwargs(loss, backend),
        imports=f"from dualloss import {module_name}",
        expr=lambda kw: f"{module_name}.{loss}(x, t{format_kwargs(kw)})",
        wrt=our_wrt(losses.get(loss)),
        notes=[OUR_MASKED_TARGETS] if losses.get(loss).is_softmax else [],
    )


# the kernel path judged as a backend of its own (DESIGN 11): its implementation's name
TRITON = "torch_impl+triton"


def ours_triton(loss: str) -> Implementation | None:
    """torch_impl's `loss` with its Triton kernels forced (``torch_impl.kernels("triton")``;
    on a CPU under Triton's interpreter), or None for a loss without kernels or where Triton
    cannot run (the reason is ``torch_impl._kernels.path``'s)."""
    if losses.get(loss).is_linear:
        return None
    try:
        from ..torch_impl import _kernels
        from ..torch_impl import kernels as kernel_mode

        fn = getattr(__import__("dualloss.torch_impl", fromlist=[loss]), loss)
    except Exception:  # noqa: BLE001 - judged with the eager backend's own note
        return None
    if _kernels._missing(__import__("torch").device("cpu")) is not None:
        return None
    mine = ours("torch", loss)
    mine.name, mine.fn = TRITON, kernel_mode("triton")(fn)
    # kernels() is a decorator too: the reproducer forces the same path
    mine.expr = lambda kw: (
        f"torch_impl.kernels('triton')(torch_impl.{loss})(x, t{format_kwargs(kw)})"
    )
    return mine


# ----------------------------------------------------------------------------------------------
# Devices
# ----------------------------------------------------------------------------------------------


def devices_for(backend: str, wanted=None) -> list[tuple[str, Any]]:
    """(canonical name, device) pairs of `backend` for `wanted` ('cpu', 'gpu:1', alias 'cuda:1',
    'all'; default: cpu plus the first GPU). A device the backend lacks raises
    ``devices.DeviceError``; see ``devices.resolve`` for the checks across backends."""
    names = D.resolve([backend], wanted)
    return [(name, D.device_object(backend, name)) for name in names]


# ----------------------------------------------------------------------------------------------
# Calling
# ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    value: np.ndarray | None = None
    grad: np.ndarray | None = None  # spec layout (class axis last)
    error: str | None = None
    # gradients w.r.t. the targets and options of ``Implementation.wrt`` (spec layout), and why
    # one is missing: the framework gave none (disconnected) or differentiating it raised
    input_grads: dict = field(default_factory=dict)
    input_grad_errors: dict = field(default_factory=dict)
    skipped: bool = False
    # the inputs the call changed (logits, targets, an option): their fingerprints before and
    # after the call (value and gradient) differ, or their buffer was given away (JAX donation)
    written: tuple[str, ...] = ()
    # torch.compile raised (or timed out) where the eager call of the same function works
    compile_failed: bool = False


def _torch_dtype(dtype: str):
    import torch

    return getattr(torch, dtype)


def torch_array(array: np.ndarray, dtype: str, device: str):
    """A torch tensor with exactly the values of `array` (already rounded to `dtype`)."""
    import torch

    # np.ascontiguousarray makes a 0-d array 1-d: the shape is restored (a scalar option)
    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        return torch.from_numpy(np.ascontiguousarray(array)).reshape(array.shape).to(device)
    exact = torch.from_numpy(np.ascontiguousarray(array.astype(np.float64))).reshape(array.shape)
    return exact.to(_torch_dtype(dtype)).to(device)


def jax_array(array: np.ndarray, dtype: str, device: Any):
    """A jax array with exactly the values of `array`; via PyTorch's buffer (DLPack) if loaded."""
    import jax
    import jax.numpy as jnp

    if "torch" in sys.modules and array.dtype != np.bool_ and array.size:
        try:
            tensor = torch_array(array, dtype, "cpu")
            return jax.device_put(jnp.from_dlpack(tensor.contiguous()), device)
        except Exception:  # noqa: BLE001 - DLPack is an optimisation; NumPy is exact too
            pass
    if str(array.dtype) not in ("bool", "int64", "int32"):
        array = array.astype(numpy_dtype(dtype))
    return jax.device_put(jnp.asarray(array), device)


_compiled_cache: dict = {}

# torch.compile's options for the compiled mode (dynamic=False: the shapes the cases use)
COMPILE_OPTIONS: dict = {"dynamic": False}

# recompilations allowed per compiled function (dynamic=False: one per shape and option set);
# beyond it torch.compile would fall back to eager silently, here it is a compile failure
RECOMPILE_LIMIT = 128


def _set_torch_compile_limits():
    import torch

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, RECOMPILE_LIMIT)
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit,
                                                 4 * RECOMPILE_LIMIT)  # fmt: skip
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


class CompileTimeout(Exception):
    """A compiled call ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raises ``CompileTimeout`` in the block after `seconds` (SIGALRM, main thread only; a no-op
    elsewhere and for None)."""
    usable = (
        seconds is not None
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CompileTimeout(f"torch.compile ran past its time limit of {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------------------------
# The input guard: a call must not write its inputs (issue 28, item 3)
# ----------------------------------------------------------------------------------------------

WRITTEN = "writes its input"


def _torch_fingerprint(tensor) -> tuple:
    """Shape, dtype and the bytes of `tensor` (NaN payloads and signed zeros included)."""
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return (tuple(tensor.shape), str(tensor.dtype), flat.view(torch.uint8).numpy().tobytes())


def _jax_fingerprint(array) -> tuple:
    """As ``_torch_fingerprint``; None once the buffer was deleted (donated to the call)."""
    if array.is_deleted():
        return None
    host = np.asarray(array)
    return (tuple(host.shape), str(host.dtype), np.ascontiguousarray(host).tobytes())


def fingerprints(inputs: dict, backend: str) -> dict:
    """name -> fingerprint of each array in `inputs` (non-arrays are left out)."""
    out = {}
    for name, value in inputs.items():
        if backend == "torch":
            import torch

            if isinstance(value, torch.Tensor):
                out[name] = _torch_fingerprint(value)
        elif hasattr(value, "is_deleted"):
            out[name] = _jax_fingerprint(value)
    return out


def changed(before: dict, inputs: dict, backend: str) -> tuple[str, ...]:
    """The names of `inputs` whose fingerprint differs from `before` (taken before the call)."""
    after = fingerprints({n: inputs[n] for n in before}, backend)
    return tuple(n for n in before if after[n] != before[n])


NO_GRADIENT = "the framework returned no gradient (the loss does not depend on it through autodiff)"


def _call_torch(fn, x, t, kwargs, wrt=()):
    """(value, grad, input grads) of `fn` at x, as float64 NumPy (the class axis where the
    candidate has it); input grads: name -> array, or None where autograd gave none."""
    import torch

    out = fn(x, t, **kwargs)
    if not isinstance(out, torch.Tensor):
        out = torch.as_tensor(out)
    value = out.detach().to(torch.float64).cpu().numpy()
    inputs = [x] + [t if name == "targets" else kwargs[name] for name in wrt]
    if out.requires_grad:
        grads = torch.autograd.grad(out.sum(), inputs, allow_unused=True)
    else:
        grads = [None] * len(inputs)
    grad = np.zeros(x.shape) if grads[0] is None else grads[0].to(torch.float64).cpu().numpy()
    others = {name: None if g is None else g.to(torch.float64).cpu().numpy()
              for name, g in zip(wrt, grads[1:], strict=True)}  # fmt: skip
    return value, grad, others


def _attempts(info, wrt: tuple[str, ...], kwargs: dict) -> list[tuple[tuple[str, ...], dict]]:
    """The calls to try, each (inputs to differentiate, keyword arguments): everything; then the
    real-number options (gamma, a scalar alpha, label_smoothing) as Python floats, for a loss
    that takes only numbers there; then nothing differentiated. A call that raises passes on to
    the next; the last one's error is final."""
    scalars = [n for n in wrt if n != "targets" and np.ndim(kwargs[n]) == 0
               and info.option(n).kind in ("real", "scalar_or_class_vector")]  # fmt: skip
    as_floats = {**kwargs, **{n: float(kwargs[n]) for n in scalars}}
    attempts = [(tuple(wrt), kwargs)]
    if scalars:
        attempts.append((tuple(n for n in wrt if n not in scalars), as_floats))
    if wrt:
        attempts.append(((), as_floats))
    return attempts


def _error_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


def run_torch(impl: Implementation, prep: Prepared, device: str, compiled: bool) -> Outcome:
    import torch

    softmax = impl.info.is_softmax
    logits = to_torch_layout(prep.logits) if softmax else prep.logits
    targets = prep.targets
    if softmax and not prep.case.index_targets:
        targets = to_torch_layout(targets)
    kwargs = impl.kwargs(prep.options, lambda a, like_logits=True: (
        torch_array(round_to(a, prep.dtype), prep.dtype, device) if like_logits
        else torch_array(a, prep.dtype, device)))  # fmt: skip
    if kwargs is None:
        return Outcome(skipped=True)
    fn = impl.fn
    if compiled:
        _set_torch_compile_limits()
        key = ("torch", id(impl.fn))
        if key not in _compiled_cache:
            _compiled_cache[key] = torch.compile(impl.fn, **COMPILE_OPTIONS)
        fn = _compiled_cache[key]
    t = torch_array(targets, prep.dtype, device)
    input_errors = {}
    try:
        attempts = _attempts(impl.info, impl.wrt(prep), kwargs)
        for i, (wrt, given) in enumerate(attempts):
            x = torch_array(logits, prep.dtype, device).requires_grad_(True)
            leaves = {n: (t if n == "targets" else given[n]).detach().requires_grad_(True)
                      for n in wrt}  # fmt: skip
            options = {n: v for n, v in leaves.items() if n != "targets"}
            inputs = {"logits": x, "targets": t, **given}
            if i == 0:  # a later attempt's fresh logits hold the same bytes
                before = fingerprints(inputs, "torch")
            try:
                value, grad, others = _call_torch(
                    fn, x, leaves.get("targets", t), {**given, **options}, wrt
                )
                written = changed(before, inputs, "torch")
                break
            except Exception as error:  # noqa: BLE001 - the last attempt's error is the loss's
                if i == len(attempts) - 1:
                    raise
                dropped = set(wrt) - set(attempts[i + 1][0])
                line = f"differentiating it raised {_error_line(error)}"
                input_errors.update({n: line for n in dropped if n not in input_errors})
    except Exception as error:  # noqa: BLE001 - a crash is a finding, reported as such
        if not compiled:
            return Outcome(error=_error_line(error))
        # the loss's own error, or the compiler's? the eager call of the same function decides
        try:
            x = torch_array(logits, prep.dtype, device).requires_grad_(True)
            _call_torch(impl.fn, x, t, kwargs)
        except Exception:  # noqa: BLE001 - raises eagerly too: the loss's error
            return Outcome(error=_error_line(error))
        return Outcome(error=_error_line(error), compile_failed=True)
    if softmax:
        grad = from_torch_layout(grad)
    input_grads = {}
    for name, g in others.items():
        if g is None:
            input_errors[name] = NO_GRADIENT
        else:
            input_grads[name] = from_torch_layout(g) if softmax and name == "targets" else g
    return Outcome(value=value, grad=grad, input_grads=input_grads,
                   input_grad_errors=input_errors, written=written)  # fmt: skip


def _jax_value_and_grad(fn, static, wrt=()):
    """(x, t, arrays) -> (value, d sum(value) / dx, {name: d sum(value) / d name for `wrt`});
    `static` are the non-array kwargs, `wrt` names 'targets' and keys of `arrays`."""
    import jax
    import jax.numpy as jnp

    def value_and_grad(x, t, arrays):
        def call(x, leaves):
            given = {**arrays, **{n: v for n, v in leaves.items() if n != "targets"}}
            return fn(x, leaves.get("targets", t), **static, **given)

        leaves = {n: (t if n == "targets" else arrays[n]) for n in wrt}
        value, pull = jax.vjp(call, x, leaves)
        grad, others = pull(jnp.ones_like(value))
        return value, grad, others

    return value_and_grad


def _static_key(static: dict):
    try:
        key = tuple(sorted(static.items()))
        hash(key)
        return key
    except TypeError:
        return None


def _jax_call(impl, kwargs, compiled, wrt, x, t):
    """(value, grad, {name: grad}) as float64 NumPy, through one compiled function per
    (implementation, static options, wrt): shapes share it."""
    import jax
    import jax.numpy as jnp

    arrays = {k: v for k, v in kwargs.items() if isinstance(v, jax.Array)}
    static = {k: v for k, v in kwargs.items() if k not in arrays}
    key = ("jax", id(impl.fn), _static_key(static), compiled, wrt)
    fn = _compiled_cache.get(key) if key[2] is not None else None
    if fn is None:
        fn = _jax_value_and_grad(impl.fn, static, wrt)
        if compiled:
            fn = jax.jit(fn)
        if key[2] is not None:
            _compiled_cache[key] = fn
    value, grad, others = fn(x, t, arrays)
    value = np.asarray(jnp.asarray(value)).astype(np.float64)
    others = {n: np.asarray(g).astype(np.float64) for n, g in others.items()}
    return value, np.asarray(grad).astype(np.float64), others


def run_jax(impl: Implementation, prep: Prepared, device: Any, compiled: bool) -> Outcome:
    import jax

    with jax.enable_x64(prep.dtype == "float64" or bool(jax.config.jax_enable_x64)):
        kwargs = impl.kwargs(prep.options, lambda a, like_logits=True: (
            jax_array(round_to(a, prep.dtype), prep.dtype, device) if like_logits
            else jax_array(a, prep.dtype, device)))  # fmt: skip
        if kwargs is None:
            return Outcome(skipped=True)
        wrt = impl.wrt(prep)
        input_errors = {}
        try:
            x = jax_array(prep.logits, prep.dtype, device)
            t = jax_array(prep.targets, prep.dtype, device)
            attempts = _attempts(impl.info, wrt, kwargs)
            for i, (names, given) in enumerate(attempts):
                inputs = {"logits": x, "targets": t, **given}
                if i == 0:
                    before = fingerprints(inputs, "jax")
                try:
                    value, grad, others = _jax_call(impl, given, compiled, names, x, t)
                    written = changed(before, inputs, "jax")
                    break
                except Exception as error:  # noqa: BLE001 - the last attempt's error is final
                    if i == len(attempts) - 1:
                        raise
                    dropped = set(names) - set(attempts[i + 1][0])
                    line = f"differentiating it raised {_error_line(error)}"
                    input_errors.update({n: line for n in dropped if n not in input_errors})
        except Exception as error:  # noqa: BLE001 - a crash is a finding, reported as such
            return Outcome(error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
    return Outcome(value=value, grad=grad, input_grads=others, input_grad_errors=input_errors,
                   written=written)  # fmt: skip


class DevicePoisoned(RuntimeError):
    """A device-side assert left the CUDA context unusable: every later call would fail."""


def needs_cpu_screen(device: Any) -> bool:
    """True for torch CUDA devices: there a gather with an index out of range (an ignored label
    of -100 fed to a loss without ``ignore_index``) is a device-side assert that makes every later
    CUDA call in the process fail; on the CPU it is an ordinary exception."""
    return str(device).startswith("cuda")


def _has_out_of_range_index(prep: Prepared) -> bool:
    if not prep.case.index_targets or prep.logits.ndim == 0:
        return False
    classes = prep.logits.shape[-1]
    return bool(np.any((prep.targets < 0) | (prep.targets >= classes)))


def _raise_if_poisoned(device: str) -> None:
    import torch

    try:
        torch.cuda.synchronize(device)
    except RuntimeError as error:
        raise DevicePoisoned(
            f"the CUDA context of {device} is unusable after a device-side assert ({error}); "
            "the run cannot continue in this process"
        ) from error


def run_case(impl: Implementation, prep: Prepared, device: Any, compiled: bool) -> Outcome:
    """One call. A torch case with indices outside [0, C) (ignored labels) runs on the CPU first
    when `device` is a CUDA device: if it raises there, that error is the outcome and the CUDA
    device never sees it (a device-side assert would poison the process)."""
    if impl.fn is None or not impl.supports(prep):
        return Outcome(skipped=True)
    if impl.backend == "torch":
        screen = needs_cpu_screen(device)
        if screen and _has_out_of_range_index(prep):
            on_cpu = run_torch(impl, prep, "cpu", False)
            if on_cpu.error is not None:
                on_cpu.error += (
                    f" (raised on the CPU screen; not run on {D.label('torch', device)}, where"
                    " an index out of range is a device-side assert that poisons the process)"
                )
                return on_cpu
        outcome = run_torch(impl, prep, device, compiled)
        if screen and outcome.error is not None:
            _raise_if_poisoned(device)
        return outcome
    return run_jax(impl, prep, device, compiled)


# ----------------------------------------------------------------------------------------------
# Reproducers
# ----------------------------------------------------------------------------------------------

_LITERAL_LIMIT = 256


def _literal(array: np.ndarray) -> str:
    def fmt(v):
        if isinstance(v, (bool, np.bool_)):
            return repr(bool(v))
        if isinstance(v, (int, np.integer)):
            return repr(int(v))
        v = float(v)
        if v != v:
            return "float('nan')"
        if v in (np.inf, -np.inf):
            return "float('inf')" if v > 0 else "-float('inf')"
        return repr(v)

    def walk(a):
        if a.ndim == 0:
            return fmt(a[()])
        return "[" + ", ".join(walk(r) for r in a) + "]"

    return walk(np.asarray(array))


def reproducer(
    impl: Implementation, prep: Prepared, device: str = "cpu", wrt=None, written=()
) -> str:
    """One line of Python that calls `impl` on exactly the inputs of `prep` (value and grad), on
    `device` (a canonical name: torch gets ``device='cuda:N'``, JAX ``jax.devices(...)[N]``, the
    CPU named too, since JAX's default device on a GPU machine is the GPU). The gradients
    w.r.t. the targets and options of `wrt` (default: ``impl.wrt(prep)``) are printed too. The
    inputs named in `written` (logits, targets, options) are copied before the call and the line
    prints whether each is unchanged after it."""
    wrt = tuple(impl.wrt(prep) if wrt is None else wrt)
    case = prep.case
    softmax = impl.info.is_softmax
    big = prep.logits.size > _LITERAL_LIMIT
    if impl.backend == "torch":
        lib = "torch"
        dt = f"torch.{prep.dtype}"

        on = "" if device == "cpu" else f", device={D.torch_name(device)!r}"

        def arr(a, dtype=None):
            a = np.asarray(a)
            if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
                return f"torch.tensor({_literal(a)}{on})"
            return f"torch.tensor({_literal(a.astype(np.float64))}, dtype={dtype or dt}{on})"

        logits = to_torch_layout(prep.logits) if softmax else prep.logits
        targets = prep.targets
        if softmax and not case.index_targets:
            targets = to_torch_layout(targets)
        head = "import torch"
    else:
        lib = "jax"
        dt = f"jnp.{prep.dtype}"

        def arr(a, dtype=None):
            a = np.asarray(a)
            if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
                return f"jnp.array({_literal(a)}, device=d)"
            return f"jnp.array({_literal(a.astype(np.float64))}, dtype={dtype or dt}, device=d)"

        logits, targets = prep.logits, prep.targets
        platform = "gpu" if D.is_gpu(device) else "cpu"
        head = f"import jax, jax.numpy as jnp; d = jax.devices({platform!r})[{D.index(device)}]"
        if prep.dtype == "float64":
            head += "; jax.config.update('jax_enable_x64', True)"
    if big:
        setup = (
            "import numpy as np; from dualloss.parity.cases import make_cases; "
            f"c = [c for c in make_cases({impl.loss!r}, {prep.dtype!r}, level='full') + "
            f"make_cases({impl.loss!r}, {prep.dtype!r}) "
            f"if c.name == {case.name.split('[')[0]!r}][0]"
        )
        row = case.label.split("[row ")[1].rstrip("]") if "[row " in case.label else None
        sl = f"[{row}:{int(row) + 1}]" if row else ""
        if lib == "torch":
            move = ".movedim(-1, 1)" if softmax and logits.ndim > 2 else ""
            to = "" if device == "cpu" else f".to({D.torch_name(device)!r})"
            x = f"torch.tensor(c.logits{sl}).to({dt}){move}{to}"
            t = f"torch.tensor(c.targets{sl}){to}"
        else:
            x = f"jnp.array(c.logits{sl}, dtype={dt}, device=d)"
            t = f"jnp.array(c.targets{sl}, device=d)"
        head = f"{head}; {setup}"
    else:
        x = arr(logits)
        t = arr(targets)
    kwargs = impl.kwargs(prep.options, lambda a, like_logits=True: _Code(arr(a))) or {}
    options = [n for n in wrt if n != "targets"]
    # the differentiated options as named variables
    bound = "".join(f"; {n} = {kwargs[n]}" + (".requires_grad_()" if lib == "torch" else "")
                    for n in options)  # fmt: skip
    kwargs = {**kwargs, **{n: _Code(n) for n in options}}
    call = impl.expr(kwargs)
    imports = f"; {impl.imports}" if impl.imports else ""
    # the written inputs, as variables of the line: kept before the call, compared after it
    var = {"logits": "x", "targets": "t", **{n: n for n in options}}
    kept = [(n, var[n]) for n in written if n in var]
    if lib == "torch":
        keep = "".join(f"; {v}_before = {v}.detach().clone()" for _, v in kept)
        show = "".join(f", '{n} unchanged:', torch.equal({v}.detach(), {v}_before)"
                       for n, v in kept)  # fmt: skip
    else:
        keep = "".join(f"; {v}_before = np.asarray({v}).copy()" for _, v in kept)
        keep = "; import numpy as np" + keep if kept else ""
        show = "".join(f", '{n} unchanged:', np.array_equal(np.asarray({v}), {v}_before)"
                       for n, v in kept)  # fmt: skip
    if lib == "torch":
        t_grad = ".requires_grad_()" if "targets" in wrt else ""
        grads = "".join(f", {'t' if n == 'targets' else n}.grad" for n in wrt)
        return (
            f"{head}{imports}; x = {x}.requires_grad_(); t = {t}{t_grad}{bound}{keep}; "
            f"y = {call}; y.sum().backward(); print(y, x.grad{grads}{show})"
        )
    if not wrt:
        return (
            f"{head}{imports}; x = {x}; t = {t}{keep}; "
            f"print(jax.value_and_grad(lambda x: ({call}).sum())(x){show})"
        )
    names = ["x", *("t" if n == "targets" else n for n in wrt)]
    fixed = "" if "targets" in wrt else ", t=t"
    params = ", ".join(names)
    return (
        f"{head}{imports}; x = {x}; t = {t}{bound}{keep}; print(jax.value_and_grad(lambda "
        f"{params}{fixed}: ({call}).sum(), argnums={tuple(range(len(names)))})({params}){show})"
    )


class _Code(str):
    """A string whose repr is itself (code inside a generated line)."""

    def __repr__(self) -> str:
        return str(self)
