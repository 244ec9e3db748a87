"""Importing Triton for the kernels: compiled on CUDA, interpreted on a CPU machine.

Triton's interpreter (``TRITON_INTERPRET=1``) has to be on when Triton itself is first imported
(its own reductions are decorated then), so on a machine without CUDA this module turns it on
before the first import, and where something imported Triton before (``torch._dynamo`` does),
lets Triton's own helpers run interpreted; on a CUDA machine the kernels compile for the GPU
and CPU tensors keep the eager path. ``missing()`` says in one sentence why the kernels cannot
run on a device, or returns None.

May import torch and triton only.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

_ERROR: str | None = None


def _load() -> str | None:
    """Imports triton once; the reason it cannot be used, or None."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    imported_before = "triton" in sys.modules
    if not torch.cuda.is_available():
        # no GPU to compile for: the kernels run under Triton's interpreter (NumPy, on the CPU)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton  # noqa: F401
    except Exception as error:  # a broken install says why, it does not crash the loss
        return f"triton does not import ({type(error).__name__}: {error})"
    if imported_before and interpreted():
        _interpret_library_functions()
    return None


def _interpret_library_functions() -> None:
    """Triton was imported before the interpreter was turned on (``torch._dynamo`` imports it),
    so its own helpers (the combine functions of ``tl.max``, ``tl.sum``) are compiled-only
    ``JITFunction``s, which refuse to be called from Python. On a machine without CUDA nothing
    can compile them anyway: called from an interpreted kernel, they run interpreted too, as
    they would had the interpreter been on at import."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    interpreted_versions: dict[int, InterpretedFunction] = {}

    def call(self, *args, **kwargs):
        version = interpreted_versions.get(id(self))
        if version is None:
            version = interpreted_versions[id(self)] = InterpretedFunction(self.fn)
        return version(*args, **kwargs)

    JITFunction.__call__ = call


def interpreted() -> bool:
    """True when the kernels run under Triton's interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def missing(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on `device`, in one sentence, or None."""
    if _ERROR is not None:
        return _ERROR
    if device.type == "cuda":
        if interpreted():
            return "TRITON_INTERPRET=1 is set, so Triton runs on CPU tensors only"
        return None
    if device.type == "cpu":
        if interpreted():
            return None
        return (
            "Triton kernels on CPU tensors run under Triton's interpreter, which must be on "
            "before triton is first imported (set TRITON_INTERPRET=1)"
        )
    return f"Triton kernels run on CUDA (or on the CPU, interpreted), not on {device.type}"


_ERROR = _load()
