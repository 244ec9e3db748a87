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

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import losses
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
    )


# ----------------------------------------------------------------------------------------------
# Devices
# ----------------------------------------------------------------------------------------------


def torch_devices() -> list[str]:
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return devices


def jax_devices() -> list[Any]:
    import jax

    devices = list(jax.devices())
    if devices and devices[0].platform != "cpu":
        try:
            devices += list(jax.devices("cpu"))
        except RuntimeError:
            pass
    return devices


def device_label(backend: str, device: Any) -> str:
    if backend == "torch":
        return str(device)
    return f"{device.platform}:{device.id}"


def devices_for(backend: str, wanted: list[str] | None = None) -> list[tuple[str, Any]]:
    """(label, device) pairs of `backend`, filtered by `wanted` ('cpu', 'cuda', 'gpu:1', ...)."""
    found = torch_devices() if backend == "torch" else jax_devices()
    pairs = [(device_label(backend, d), d) for d in found]
    if not wanted:
        return pairs

    def matches(label):
        kind = label.split(":")[0]
        for w in wanted:
            w_kind = w.split(":")[0].replace("gpu", "cuda")
            if label == w or (":" not in w and kind.replace("gpu", "cuda") == w_kind):
                return True
            if (
                ":" in w
                and kind.replace("gpu", "cuda") == w_kind
                and label.split(":")[1] == w.split(":")[1]
            ):
                return True
        return False

    return [(label, d) for label, d in pairs if matches(label)]


# ----------------------------------------------------------------------------------------------
# Calling
# ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    value: np.ndarray | None = None
    grad: np.ndarray | None = None  # spec layout (class axis last)
    error: str | None = None
    skipped: bool = False


def _torch_dtype(dtype: str):
    import torch

    return getattr(torch, dtype)


def torch_array(array: np.ndarray, dtype: str, device: str):
    """A torch tensor with exactly the values of `array` (already rounded to `dtype`)."""
    import torch

    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)
    exact = torch.from_numpy(np.ascontiguousarray(array.astype(np.float64)))
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


def _set_torch_compile_limits():
    import torch

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 4096))


def run_torch(impl: Implementation, prep: Prepared, device: str, compiled: bool) -> Outcome:
    import torch

    softmax = losses.get(impl.loss).is_softmax
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
            _compiled_cache[key] = torch.compile(impl.fn, dynamic=False)
        fn = _compiled_cache[key]
    try:
        x = torch_array(logits, prep.dtype, device).requires_grad_(True)
        t = torch_array(targets, prep.dtype, device)
        out = fn(x, t, **kwargs)
        if not isinstance(out, torch.Tensor):
            out = torch.as_tensor(out)
        value = out.detach().to(torch.float64).cpu().numpy()
        if out.requires_grad:
            (grad,) = torch.autograd.grad(out.sum(), x, allow_unused=True)
        else:
            grad = None
        grad = np.zeros(x.shape) if grad is None else grad.to(torch.float64).cpu().numpy()
    except Exception as error:  # noqa: BLE001 - a crash is a finding, reported as such
        return Outcome(error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
    if softmax:
        grad = from_torch_layout(grad)
    return Outcome(value=value, grad=grad)


def _jax_value_and_grad(fn, static):
    """(x, t, arrays) -> (value, d sum(value) / dx); `static` are the non-array kwargs."""
    import jax
    import jax.numpy as jnp

    def value_and_grad(x, t, arrays):
        value, pull = jax.vjp(lambda x: fn(x, t, **static, **arrays), x)
        (grad,) = pull(jnp.ones_like(value))
        return value, grad

    return value_and_grad


def _static_key(static: dict):
    try:
        key = tuple(sorted(static.items()))
        hash(key)
        return key
    except TypeError:
        return None


def run_jax(impl: Implementation, prep: Prepared, device: Any, compiled: bool) -> Outcome:
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(prep.dtype == "float64" or bool(jax.config.jax_enable_x64)):
        kwargs = impl.kwargs(prep.options, lambda a, like_logits=True: (
            jax_array(round_to(a, prep.dtype), prep.dtype, device) if like_logits
            else jax_array(a, prep.dtype, device)))  # fmt: skip
        if kwargs is None:
            return Outcome(skipped=True)
        arrays = {k: v for k, v in kwargs.items() if isinstance(v, jax.Array)}
        static = {k: v for k, v in kwargs.items() if k not in arrays}
        # one compiled function per (implementation, static options): shapes share it
        key = ("jax", id(impl.fn), _static_key(static), compiled)
        fn = _compiled_cache.get(key) if key[2] is not None else None
        if fn is None:
            fn = _jax_value_and_grad(impl.fn, static)
            if compiled:
                fn = jax.jit(fn)
            if key[2] is not None:
                _compiled_cache[key] = fn
        try:
            x = jax_array(prep.logits, prep.dtype, device)
            t = jax_array(prep.targets, prep.dtype, device)
            value, grad = fn(x, t, arrays)
            value = np.asarray(jnp.asarray(value)).astype(np.float64)
            grad = np.asarray(grad).astype(np.float64)
        except Exception as error:  # noqa: BLE001 - a crash is a finding, reported as such
            return Outcome(error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
    return Outcome(value=value, grad=grad)


def run_case(impl: Implementation, prep: Prepared, device: Any, compiled: bool) -> Outcome:
    if impl.fn is None or not impl.supports(prep):
        return Outcome(skipped=True)
    if impl.backend == "torch":
        return run_torch(impl, prep, device, compiled)
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


def reproducer(impl: Implementation, prep: Prepared) -> str:
    """One line of Python that calls `impl` on exactly the inputs of `prep` (value and grad)."""
    case = prep.case
    softmax = losses.get(impl.loss).is_softmax
    big = prep.logits.size > _LITERAL_LIMIT
    if impl.backend == "torch":
        lib = "torch"
        dt = f"torch.{prep.dtype}"

        def arr(a, dtype=None):
            a = np.asarray(a)
            if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
                return f"torch.tensor({_literal(a)})"
            return f"torch.tensor({_literal(a.astype(np.float64))}, dtype={dtype or dt})"

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
                return f"jnp.array({_literal(a)})"
            return f"jnp.array({_literal(a.astype(np.float64))}, dtype={dtype or dt})"

        logits, targets = prep.logits, prep.targets
        head = "import jax, jax.numpy as jnp"
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
            x = f"torch.tensor(c.logits{sl}).to({dt}){move}"
            t = f"torch.tensor(c.targets{sl})"
        else:
            x = f"jnp.array(c.logits{sl}, dtype={dt})"
            t = f"jnp.array(c.targets{sl})"
        head = f"{head}; {setup}"
    else:
        x = arr(logits)
        t = arr(targets)
    kwargs = impl.kwargs(prep.options, lambda a, like_logits=True: _Code(arr(a)))
    call = impl.expr(kwargs or {})
    imports = f"; {impl.imports}" if impl.imports else ""
    if lib == "torch":
        return (
            f"{head}{imports}; x = {x}.requires_grad_(); t = {t}; y = {call}; "
            "y.sum().backward(); print(y, x.grad)"
        )
    return (
        f"{head}{imports}; x = {x}; t = {t}; print(jax.value_and_grad(lambda x: ({call}).sum())(x))"
    )


class _Code(str):
    """A string whose repr is itself (code inside a generated line)."""

    def __repr__(self) -> str:
        return str(self)
