"""Devices, in one place: naming, defaults, framework start-up, precision, synchronisation.

One naming for both frameworks (docs/devices.md):

* ``cpu``: the host (torch ``cpu``, JAX's first CPU device); ``cpu:N`` names JAX's extra host
  devices (``XLA_FLAGS=--xla_force_host_platform_device_count``), which torch does not have;
* ``gpu:N``: the N-th GPU, torch ``cuda:N`` and JAX ``jax.devices("gpu")[N]``. ``cuda:N``,
  ``cuda`` and ``gpu`` are accepted as aliases; reports always say ``gpu:N``;
* ``all``: every device the frameworks see (opt-in: with 8 GPUs that is 9 devices per backend).

The default is ``cpu`` plus ``gpu:0`` when a GPU is present. Every requested device must exist
for every requested backend: a missing one, or a GPU that one framework sees and the other does
not (a CPU-only torch next to a CUDA JAX, or JAX that fell back to the CPU because torch
initialised CUDA first, jax-ml/jax#18032), is a ``DeviceError`` (the CLI exits 2), never a note
beside a verdict. Restricting the backends (``--backends torch``) lifts the check for the other.

``start(backends)`` imports JAX and initialises its backends *before* importing torch, and turns
JAX's GPU preallocation off when torch shares the process (``XLA_PYTHON_CLIENT_PREALLOCATE``).
``pin_precision`` fixes float32 matmuls at full precision (no TF32) for judged runs and returns
the settings, which the reports record.

Nothing here imports torch or jax at import time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import Any

BACKENDS = ("torch", "jax")
ALL = "all"
_NAME = re.compile(r"^(cpu|gpu|cuda)(?::(\d+))?$")


class DeviceError(ValueError):
    """A requested device that a requested backend does not have (one sentence)."""


# ----------------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------------


def canonical(name: object, argument: str = "devices") -> str:
    """'cpu', 'cpu:N' or 'gpu:N' for any accepted spelling ('cuda:1' -> 'gpu:1', 'cpu:0' ->
    'cpu', 'gpu' -> 'gpu:0'); 'all' stays 'all'. Anything else is a ValueError naming it."""
    text = name.strip().lower() if isinstance(name, str) else None
    if text == ALL:
        return ALL
    match = _NAME.match(text) if text is not None else None
    if match is None:
        what = f"`{argument}` entries" if argument.endswith("s") else f"`{argument}`"
        raise ValueError(
            f"{what} must be 'cpu', 'gpu:N' (alias 'cuda:N') or 'all'. Received: {name!r}."
        )
    kind, index = match.group(1), int(match.group(2) or 0)
    if kind == "cpu":
        return "cpu" if index == 0 else f"cpu:{index}"
    return f"gpu:{index}"


def parse(names, argument: str = "devices") -> list[str] | None:
    """A list (or comma-separated string) of device names in canonical form, duplicates dropped;
    None stays None (the default)."""
    if names is None:
        return None
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    out: list[str] = []
    for name in names:
        name = canonical(name, argument)
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError(f"`{argument}` must name at least one device. Received: {names!r}.")
    return out


def is_gpu(name: str) -> bool:
    return name.startswith("gpu:")


def index(name: str) -> int:
    return int(name.split(":")[1]) if ":" in name else 0


def torch_name(name: str) -> str:
    """The torch device string: 'cpu' or 'cuda:N'."""
    if is_gpu(name):
        return f"cuda:{index(name)}"
    if name != "cpu":
        raise DeviceError(f"`devices` has {name!r}, which torch does not have (one CPU device).")
    return "cpu"


def label(backend: str, device: Any) -> str:
    """The canonical name of a framework's device object (or torch string)."""
    if backend == "torch":
        device = str(device)
        return canonical("gpu" + device[4:] if device.startswith("cuda") else device)
    platform = "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform
    if platform == "cpu":
        return canonical(f"cpu:{_jax_position(device)}")
    return f"{platform}:{_jax_position(device)}"


def _jax_position(device) -> int:
    """The position of `device` among JAX's devices of its platform (its canonical index)."""
    import jax

    try:
        same = jax.devices(device.platform)
    except RuntimeError:
        return device.id
    for i, d in enumerate(same):
        if d == device:
            return i
    return device.id


# ----------------------------------------------------------------------------------------------
# Start-up and what each framework sees
# ----------------------------------------------------------------------------------------------

_started: dict[str, list[str]] = {}


def start(backends=BACKENDS) -> list[str]:
    """Imports the requested frameworks, JAX first (and its backends initialised) so that torch's
    CUDA initialisation cannot make JAX fall back to the CPU; with both, JAX does not preallocate
    GPU memory (torch shares the GPU). Returns notes (e.g. torch imported first elsewhere)."""
    notes = []
    backends = tuple(backends)
    if "jax" in backends:
        if "torch" in backends and "jax" not in sys.modules:
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if "torch" in sys.modules and "jax" not in _started:
            torch = sys.modules["torch"]
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_initialized():
                notes.append(
                    "torch initialised CUDA before JAX started: if JAX sees no GPU, import "
                    "dualloss.parity (or JAX) before torch"
                )
        import jax  # noqa: F401 - first, with its backends initialised by `visible`

        _started["jax"] = visible("jax")
    if "torch" in backends:
        import torch  # noqa: F401 - imported after JAX on purpose

        _started["torch"] = visible("torch")
    return notes


def visible(backend: str) -> list[str]:
    """The canonical names of the devices `backend` sees (CPU first)."""
    if backend == "torch":
        import torch

        names = ["cpu"]
        if torch.cuda.is_available():
            names += [f"gpu:{i}" for i in range(torch.cuda.device_count())]
        return names
    names = [label("jax", d) for d in _jax_platform("cpu")]
    names += [f"gpu:{i}" for i in range(len(_jax_platform("gpu")))]
    return names


def _jax_platform(platform: str) -> list:
    import jax

    try:
        return list(jax.devices(platform))
    except RuntimeError:  # no such platform
        return []


def gpu_count(backend: str) -> int:
    return sum(is_gpu(n) for n in visible(backend))


def defaults(backends=BACKENDS) -> list[str]:
    """`cpu`, plus `gpu:0` when any requested framework sees a GPU (all GPUs are opt-in)."""
    if any(gpu_count(b) for b in backends):
        return ["cpu", "gpu:0"]
    return ["cpu"]


def _describe(names: list[str]) -> str:
    return ", ".join(names) if names else "no device"


def resolve(backends, wanted=None) -> list[str]:
    """The devices to run on, canonical, each present for every backend in `backends`.

    `wanted` None: ``defaults``; 'all': every device any of them sees. A device that one of the
    backends lacks raises ``DeviceError`` naming the device, the backend and what it sees, with
    the one-framework-sees-a-GPU case spelt out."""
    backends = tuple(backends)
    start(backends)
    wanted = parse(wanted)
    seen = {b: visible(b) for b in backends}
    if wanted is None:
        wanted = defaults(backends)
    elif ALL in wanted:
        wanted = []
        for b in backends:
            wanted += [n for n in seen[b] if n not in wanted]
        if len(backends) > 1:
            # 'all' keeps to the devices every backend has, except a GPU only one side sees
            common = [n for n in wanted if all(n in seen[b] for b in backends)]
            gpu_mismatch = [n for n in wanted if is_gpu(n) and n not in common]
            wanted = common + gpu_mismatch
    for name in wanted:
        lacking = [b for b in backends if name not in seen[b]]
        if not lacking:
            continue
        backend = lacking[0]
        having = [b for b in backends if name in seen[b]]
        if is_gpu(name) and having:
            raise DeviceError(
                f"`devices` has {name!r}, which {having[0]} sees but {backend} does not "
                f"({backend} sees {_describe(seen[backend])}): install {backend} with GPU "
                f"support, or run one framework with --backends {having[0]}, or --devices cpu."
            )
        if len(lacking) > 1:
            raise DeviceError(
                f"`devices` has {name!r}, which none of {', '.join(lacking)} sees "
                f"(they see {'; '.join(f'{b}: {_describe(seen[b])}' for b in lacking)})."
            )
        raise DeviceError(
            f"`devices` has {name!r}, which {backend} does not see "
            f"(it sees {_describe(seen[backend])})."
        )
    return wanted


def device_object(backend: str, name: str) -> Any:
    """What the backend takes as a device: a torch string, or a JAX device object."""
    if backend == "torch":
        return torch_name(name)
    found = _jax_platform("gpu" if is_gpu(name) else "cpu")
    if index(name) >= len(found):
        raise DeviceError(
            f"`devices` has {name!r}, which jax does not see (it sees {_describe(visible('jax'))})."
        )
    return found[index(name)]


def one_device(backend: str, device: object) -> tuple[str, Any]:
    """The canonical name and the backend's device object for `device` (None: the CPU), as
    ``check`` takes it: one device, seen by `backend` (errors name the argument `device`)."""
    label = canonical("cpu" if device is None else device, "device")
    if label == ALL:
        raise ValueError(f"`device` must name one device. Received: device={device!r}.")
    start([backend])
    try:
        resolve([backend], [label])
    except DeviceError as error:
        raise DeviceError(str(error).replace("`devices` has", "`device` is", 1)) from None
    return label, device_object(backend, label)


def test_devices(backends=BACKENDS) -> list[str]:
    """`cpu` and every GPU any installed backend sees: the parameters of device-parametrized
    tests (a test of one backend skips a GPU that backend lacks; ``doctor`` flags that)."""
    installed = [b for b in backends if importlib.util.find_spec(b) is not None]
    start(installed)
    names = ["cpu"]
    for b in installed:
        names += [n for n in visible(b) if is_gpu(n) and n not in names]
    return names


# ----------------------------------------------------------------------------------------------
# Precision
# ----------------------------------------------------------------------------------------------


def precision_settings(backends=BACKENDS) -> dict[str, object]:
    """The matmul precision settings as they are now, for the reports."""
    out: dict[str, object] = {}
    if "torch" in backends and "torch" in sys.modules:
        import torch

        out["torch.backends.cuda.matmul.allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        out["torch.backends.cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
        out["torch.get_float32_matmul_precision()"] = torch.get_float32_matmul_precision()
    if "jax" in backends and "jax" in sys.modules:
        import jax

        value = jax.config.jax_default_matmul_precision
        value = "default (TF32-class on GPU)" if value is None else value
        out["jax_default_matmul_precision"] = value
    return out


def pin_precision(backends=BACKENDS) -> dict[str, object]:
    """Full float32 precision for matmuls and convolutions (no TF32: JAX float32 dots on a GPU
    default to ~1e-3 relative error), for the judged runs; returns the settings now in force."""
    if "torch" in backends and "torch" in sys.modules:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    if "jax" in backends and "jax" in sys.modules:
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    return precision_settings(backends)


# ----------------------------------------------------------------------------------------------
# Timing and memory (benchmarks)
# ----------------------------------------------------------------------------------------------


def synchronize(backend: str, name: str, value: Any = None) -> None:
    """Waits for the device's queued work: torch synchronises that device (not the current one);
    JAX blocks on `value`."""
    if backend == "torch":
        if is_gpu(name):
            import torch

            torch.cuda.synchronize(torch_name(name))
        return
    if value is not None:
        import jax

        jax.block_until_ready(value)


def reset_peak_memory(backend: str, name: str) -> None:
    if backend == "torch" and is_gpu(name):
        import torch

        torch.cuda.reset_peak_memory_stats(torch_name(name))


def peak_memory(backend: str, name: str) -> dict[str, int] | None:
    """torch: ``max_memory_allocated`` of the device; JAX: the device's ``memory_stats()``
    (peak and in use, where the platform reports them); None on a CPU."""
    if backend == "torch":
        if not is_gpu(name):
            return None
        import torch

        device = torch_name(name)
        return {
            "max_memory_allocated": int(torch.cuda.max_memory_allocated(device)),
            "memory_allocated": int(torch.cuda.memory_allocated(device)),
        }
    stats = device_object("jax", name).memory_stats()
    if not stats:
        return None
    keys = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
    return {k: int(stats[k]) for k in keys if k in stats}


# ----------------------------------------------------------------------------------------------
# doctor
# ----------------------------------------------------------------------------------------------


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - installed without metadata
        return getattr(importlib.import_module(module), "__version__", "unknown")


def triton_status() -> str:
    """'absent', 'present (x.y)', or, with a GPU, whether a tiny torch.compile kernel runs."""
    triton = _version("triton")
    if triton is None:
        return "absent (torch.compile cannot generate GPU kernels)"
    text = f"present ({triton})"
    if "torch" in sys.modules and gpu_count("torch"):
        import torch

        try:
            fn = torch.compile(lambda x: torch.exp(x) + 1.0, fullgraph=True)
            fn(torch.ones(4, device="cuda:0")).cpu()
            text += ", a compiled kernel ran on gpu:0"
        except Exception as error:  # noqa: BLE001 - the finding
            text += f", compiling on gpu:0 FAILED: {type(error).__name__}: {error}"[:300]
    return text


def torch_kernel_paths() -> tuple[str, bool]:
    """Which path torch_impl's losses take on each torch device under the current selection
    (``DUALLOSS_TORCH_KERNELS``, ``torch_impl.kernels``): Triton kernels or the eager closed
    forms, and why not the kernels where they cannot run; not ok for an unknown selection."""
    import torch

    from ..torch_impl import _kernels

    devices = ["cpu"] + [f"cuda:{i}" for i in range(gpu_count("torch"))]
    try:
        return "; ".join(f"{d}: {_kernels.path(torch.device(d))}" for d in devices), True
    except ValueError as error:  # a bad DUALLOSS_TORCH_KERNELS: its one sentence
        return f"unknown ({error})", False


def doctor(backends=BACKENDS) -> tuple[list[str], bool]:
    """(lines to print, ok): frameworks, versions, devices each sees (JAX started first, as the
    suite does), Triton, matmul precision; not ok on any disagreement or a missing framework."""
    lines = [f"python {sys.version.split()[0]} ({sys.executable})"]
    ok = True
    installed = [b for b in backends if importlib.util.find_spec(b) is not None]
    for b in backends:
        if b not in installed:
            lines.append(f"{b}: NOT INSTALLED (pip install dualloss[{b}])")
            ok = False
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")
    notes = start(installed)
    if preallocate is None and "XLA_PYTHON_CLIENT_PREALLOCATE" in os.environ:
        notes.append("XLA_PYTHON_CLIENT_PREALLOCATE=false set here: torch shares the process")
    lines.append("import order: " + " then ".join(b for b in ("jax", "torch") if b in installed))
    seen = {}
    for b in installed:
        seen[b] = visible(b)
        extra = ""
        if b == "torch":
            import torch

            extra = f", CUDA build {torch.version.cuda or 'none'}"
            try:
                names = [torch.cuda.get_device_name(i) for i in range(gpu_count("torch"))]
                extra += f", {'; '.join(names)}" if names else ""
            except (RuntimeError, AssertionError):  # a CPU-only build
                pass
        else:
            import jax

            extra = f", default backend {jax.default_backend()}"
            plugin = _version("jax-cuda12-plugin") or _version("jax-cuda13-plugin")
            extra += f", CUDA plugin {plugin or 'none'}"
        lines.append(f"{b} {_version(b)}: sees {_describe(seen[b])}{extra}")
    if len(seen) > 1:
        counts = {b: sum(is_gpu(n) for n in names) for b, names in seen.items()}
        if len(set(counts.values())) > 1:
            ok = False
            lines.append(
                "DISAGREEMENT: GPUs seen "
                + ", ".join(f"{b} {n}" for b, n in counts.items())
                + " (the parity run would refuse the GPU; see docs/devices.md)"
            )
        else:
            lines.append(f"agreement: both frameworks see {counts[installed[0]]} GPU(s)")
    lines.append(f"default devices: {', '.join(defaults(installed)) if installed else 'none'}")
    lines.append(f"triton: {triton_status()}")
    if "torch" in installed:
        text, kernels_ok = torch_kernel_paths()
        lines.append(f"torch losses take: {text}")
        ok = ok and kernels_ok
    for key, value in precision_settings(installed).items():
        lines.append(f"precision now: {key} = {value}")
    lines.append("judged runs pin: allow_tf32=False, jax_default_matmul_precision='highest'")
    env = {k: os.environ[k] for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_PLATFORMS",
                                        "CUDA_VISIBLE_DEVICES") if k in os.environ}  # fmt: skip
    lines.append(f"environment: {env or 'no XLA_PYTHON_CLIENT_PREALLOCATE/JAX_PLATFORMS/CUDA_*'}")
    lines += [f"note: {n}" for n in notes]
    lines.append("doctor: OK" if ok else "doctor: PROBLEMS FOUND")
    return lines, ok
