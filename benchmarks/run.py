"""Forward+backward time and saved memory of dualloss against the loss a user would otherwise call.

    python -m benchmarks.run                     # full run, prints the tables
    python -m benchmarks.run --quick             # fewer repetitions
    python -m benchmarks.run --tiny              # seconds; what tests/test_benchmarks_smoke.py runs
    python -m benchmarks.run --shapes 4096x1000 --frameworks torch --losses sigmoid_focal_loss
    python -m benchmarks.run --compile        # also torch.compile(ours) vs torch.compile(peer)
    python -m benchmarks.run --compile --update-doc docs/benchmarks.md --plot docs/benchmarks.png

Time: candidate (dualloss) and peer run in the same process on the same inputs, interleaved: each
repetition times one forward+backward of each, alternating which goes first. The table reports the
median of each and the ratio of the medians (below 1: dualloss is faster). ``--device`` (``cpu`` or
``gpu:N``, alias ``cuda:N``; default ``gpu:0`` when a GPU is present, else ``cpu``) applies to
both frameworks: torch runs eagerly there (``torch.cuda.synchronize`` of that device around each
timing); JAX times a jitted ``value_and_grad`` with its inputs placed there, compiled before
timing, with ``block_until_ready``. JAX is imported before torch and, when both share a GPU, does
not preallocate (``XLA_PYTHON_CLIENT_PREALLOCATE=false``). Device memory: torch's
``max_memory_allocated`` over one forward+backward beyond what was allocated before it, and the
JAX device's ``memory_stats()`` peak, both as multiples of the logits' bytes (GPU only).

Memory: for torch, the bytes autograd keeps alive between forward and backward, i.e. every tensor
saved for backward (``torch.autograd.graph.saved_tensors_hooks``, plus tensors a custom
``autograd.Function`` stores as ``ctx`` attributes, which those hooks do not see), counted once per
storage, as a multiple of the logits' size. "full" counts the storages larger than one value per
row, "total" everything, "beyond inputs" everything but the logits' and targets' own storages;
whether the logits (and targets) are among them is reported. The memory target is judged on
"full": a saved input is kept alive by the loss. For JAX, XLA's memory analysis of the compiled
``value_and_grad``: temporary buffers and peak (as XLA:CPU reports it), as a multiple of the
logits' size.

Targets (``TIME_TARGETS``, ``MEMORY_TARGET``) are the speed issue's goals. Time is judged on the
median of the per-pair ratios ("paired"): at 4096 x 1000 against the goal, at 512 x 32000 and
65536 x 10 against min(1.0, 1.2 x the goal) (``time_limit``); memory at every shape. The summary
lists every goal with PASS/MISS ("not measured" when a loss failed).
``--profile`` adds a torch.profiler table per torch loss and, for JAX, the N x C buffers and
transcendental ops of the optimized HLO.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from benchmarks import peers
from dualloss import losses as L
from dualloss.losses import get as loss_info
from dualloss.parity import devices as D

DEFAULT_SHAPES = ((4096, 1000), (512, 32000), (65536, 10))
TINY_SHAPES = ((64, 10), (16, 100))
TARGET_SHAPE = (4096, 1000)

# Time ratio targets (dualloss / peer), judged at TARGET_SHAPE, float32.
TIME_TARGETS: dict[tuple[str, str], float] = {
    # the goals of the speed issue: ours / the peer a user would otherwise call, fwd + bwd
    ("torch", L.SOFTMAX_CROSS_ENTROPY.name): 0.6,
    ("torch", L.SOFTMAX_FOCAL_LOSS.name): 0.5,
    ("torch", L.SIGMOID_CROSS_ENTROPY.name): 1.0,
    ("torch", L.SIGMOID_FOCAL_LOSS.name): 0.5,
    ("jax", L.SOFTMAX_CROSS_ENTROPY.name): 1.05,
    ("jax", L.SOFTMAX_FOCAL_LOSS.name): 1.0,
    ("jax", L.SIGMOID_CROSS_ENTROPY.name): 1.0,
    ("jax", L.SIGMOID_FOCAL_LOSS.name): 0.7,
}
# Memory target: every torch loss keeps at most this many logits' worth of full-size tensors.
MEMORY_TARGET = 1.0
# The same goals at the two other shapes: no loss slower than its peer there, and none
# slower than its goal at TARGET_SHAPE by more than 20 %. Read as: the ratio there must be
# <= OTHER_SHAPE_LIMIT and <= OTHER_SHAPE_SLACK x the goal, i.e. <= min(1.0, 1.2 x goal).
OTHER_SHAPES = ((512, 32000), (65536, 10))
OTHER_SHAPE_LIMIT = 1.0
OTHER_SHAPE_SLACK = 1.2


def time_limit(framework: str, loss: str, shape: Sequence[int]) -> float | None:
    """The time-ratio limit for this framework, loss and shape; None where nothing is judged."""
    goal = TIME_TARGETS.get((framework, loss))
    if goal is None:
        return None
    if tuple(shape) == TARGET_SHAPE:
        return goal
    if tuple(shape) in OTHER_SHAPES:
        return min(OTHER_SHAPE_LIMIT, OTHER_SHAPE_SLACK * goal)
    return None


try:
    LOAD_AT_START = os.getloadavg()[0]
except OSError:
    LOAD_AT_START = float("nan")

DOC_BEGIN = "<!-- benchmarks:begin (generated by python -m benchmarks.run) -->"
DOC_END = "<!-- benchmarks:end -->"


@dataclass
class TimeRow:
    framework: str
    loss: str
    shape: tuple[int, int]
    device: str
    peer: str
    dualloss_ms: float
    peer_ms: float
    ratio: float
    paired_ratio: float
    reps: int
    target: float | None = None
    status: str = ""
    dualloss_ms_all: list[float] = field(default_factory=list)
    peer_ms_all: list[float] = field(default_factory=list)
    # the bandwidth floor at this shape (see ``bandwidth_floor``) and dualloss_ms / floor_ms
    floor_ms: float = math.nan
    floor_ratio: float = math.nan


@dataclass
class CompileRow:
    """``torch.compile(dualloss)`` against ``torch.compile(peer)``, forward+backward (no goal).
    A side that fails to compile or run has its error here and NaN times."""

    loss: str
    shape: tuple[int, int]
    device: str
    peer: str
    backend: str
    dualloss_ms: float = math.nan
    peer_ms: float = math.nan
    ratio: float = math.nan
    paired_ratio: float = math.nan
    reps: int = 0
    # seconds of the first forward+backward (compilation of both graphs included)
    compile_s: dict[str, float] = field(default_factory=dict)
    # dynamo's graph-break count while compiling and warming up each side
    graph_breaks: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class MemoryRow:
    framework: str
    loss: str
    shape: tuple[int, int]
    device: str
    peer: str
    logits_bytes: int
    # torch: saved-for-backward bytes / logits bytes; JAX: XLA temp and peak / logits bytes
    dualloss: dict[str, float | bool | int]
    peer_stats: dict[str, float | bool | int]
    target: float | None = None
    status: str = ""
    # on a GPU: peak device memory of one forward+backward, multiples of the logits' bytes
    device_peak: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


def make_inputs(loss: str, shape: tuple[int, int], seed: int = 0):
    """NumPy float32 logits and targets: class indices (softmax) or multi-label 0/1 (sigmoid)."""
    rng = np.random.default_rng(seed)
    n, c = shape
    logits = (2.0 * rng.standard_normal((n, c))).astype(np.float32)
    if loss_info(loss).is_softmax:
        targets = rng.integers(0, c, size=(n,))
    else:
        targets = (rng.random((n, c)) < 0.1).astype(np.float32)
    return logits, targets


def _summary(cand: list[float], peer: list[float]) -> tuple[float, float, float, float]:
    cand_med = statistics.median(cand)
    peer_med = statistics.median(peer)
    paired = statistics.median(a / b for a, b in zip(cand, peer, strict=True))
    return cand_med, peer_med, cand_med / peer_med, paired


def interleave(
    step_cand: Callable[[], float], step_peer: Callable[[], float], reps: int, warmup: int
):
    """Runs both steps alternately (order flipped every repetition); returns their times in ms."""
    for _ in range(warmup):
        step_cand()
        step_peer()
    cand, peer = [], []
    for i in range(reps):
        if i % 2 == 0:
            cand.append(step_cand())
            peer.append(step_peer())
        else:
            peer.append(step_peer())
            cand.append(step_cand())
    return cand, peer


# ----------------------------------------------------------------------------------------------
# Bandwidth floor
# ----------------------------------------------------------------------------------------------


def bandwidth_floor(shape, device: str, reps: int, warmup: int) -> float:
    """The least time any forward+backward can take: reading the logits and writing their
    gradient once. Measured as the median time (ms) of a ``Tensor.copy_`` of an N x C float32
    buffer into another on `device` (a canonical name, 'cpu' or 'gpu:N'), which reads and writes
    exactly those bytes; with JAX (a jitted ``2 * x``) where torch is not installed."""
    n, c = shape
    try:
        import torch

        dev = D.torch_name(device)
        src = torch.ones((n, c), dtype=torch.float32, device=dev)
    except Exception:  # no torch, or torch without this device: the JAX run's own device
        import jax
        import jax.numpy as jnp

        src = jax.device_put(jnp.ones((n, c), jnp.float32), D.device_object("jax", device))
        double = jax.jit(lambda x: 2.0 * x)
        times = interleave(_jax_step(lambda x, _: double(x), src, None), lambda: 0.0,
                           reps, warmup)[0]  # fmt: skip
        return statistics.median(times)
    dst = torch.empty_like(src)
    cuda = dev.startswith("cuda")

    def step() -> float:
        if cuda:
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        dst.copy_(src)
        if cuda:
            torch.cuda.synchronize(dev)
        return (time.perf_counter() - start) * 1e3

    return statistics.median(interleave(step, lambda: 0.0, reps, warmup)[0])


def set_floors(time_rows: list[TimeRow], floors: dict[tuple[int, int], float]) -> None:
    for row in time_rows:
        row.floor_ms = floors.get(tuple(row.shape), math.nan)
        row.floor_ratio = row.dualloss_ms / row.floor_ms


def floor_line(floors: dict[tuple[int, int], float]) -> str:
    parts = [
        f"{_shape(shape)} {ms:.3f} ms ({2 * 4 * shape[0] * shape[1] / ms / 1e6:.1f} GB/s)"
        for shape, ms in floors.items()
    ]
    return (
        "Bandwidth floor (reading the float32 logits and writing their gradient once: the median"
        " time of a copy_ of an N x C buffer, measured in this run; GB/s counts both): "
        + "; ".join(parts)
        + ". The floor column is dualloss ms / floor ms."
    )


# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------


def device_name(requested: str, frameworks=("torch", "jax")) -> str:
    """The canonical device ('cpu', 'gpu:N') for `requested` ('auto': gpu:0 when a framework
    sees a GPU, else cpu); a device a framework lacks raises ``devices.DeviceError``."""
    wanted = None if requested == "auto" else [requested]
    names = D.resolve(frameworks, wanted)
    return names[-1] if requested == "auto" else names[0]


def torch_device(requested: str) -> str:
    """The torch device string ('cpu', 'cuda:N') for a device name or 'auto'."""
    return D.torch_name(device_name(requested, ("torch",)))


def _torch_tensors(loss: str, shape, device: str, seed: int = 0):
    import torch

    logits_np, targets_np = make_inputs(loss, shape, seed)
    logits = torch.from_numpy(logits_np).to(device).requires_grad_(True)
    targets = torch.from_numpy(targets_np).to(device)
    return logits, targets


def _torch_step(fn: Callable, logits, targets, device: str) -> Callable[[], float]:
    import torch

    cuda = device.startswith("cuda")

    def step() -> float:
        logits.grad = None
        if cuda:
            torch.cuda.synchronize(device)  # that device, not the current one
        start = time.perf_counter()
        fn(logits, targets).backward()
        if cuda:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) * 1e3

    return step


def _ctx_tensors(root) -> list:
    """Tensors held as Python attributes of custom autograd.Function contexts in the graph."""
    import torch

    found, seen, stack = [], set(), [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        attrs = getattr(node, "__dict__", None) or {}
        for value in attrs.values():
            values = value if isinstance(value, (list, tuple)) else (value,)
            found.extend(v for v in values if isinstance(v, torch.Tensor))
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return found


def torch_saved_bytes(fn: Callable, logits, targets) -> dict[str, float | bool | int]:
    """What autograd keeps alive between forward and backward, as multiples of the logits' size."""
    import torch

    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    def unpack(tensor):
        return tensor

    logits.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = fn(logits, targets)
    ctx_saved = _ctx_tensors(loss.grad_fn)
    rows = logits.numel() // logits.shape[1] if logits.ndim > 1 else 1
    logits_key = logits.untyped_storage().data_ptr()
    targets_key = targets.untyped_storage().data_ptr()
    storages: dict[tuple[str, int], tuple[int, int]] = {}
    for tensor in saved + ctx_saved:
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        storages[key] = (storage.nbytes(), storage.nbytes() // max(tensor.element_size(), 1))
    total = sum(nbytes for nbytes, _ in storages.values())
    full = sum(nbytes for nbytes, numel in storages.values() if numel > rows)
    # what the caller does not hold anyway: everything but the logits' and targets' storages
    extra = sum(
        nbytes for key, (nbytes, _) in storages.items() if key[1] not in (logits_key, targets_key)
    )
    logits_bytes = logits.numel() * logits.element_size()
    result = {
        "full": full / logits_bytes,
        "total": total / logits_bytes,
        "extra": extra / logits_bytes,
        "logits_saved": any(key[1] == logits_key for key in storages),
        "targets_saved": any(key[1] == targets_key for key in storages),
        "tensors": len(saved) + len(ctx_saved),
        "storages": len(storages),
        "ctx_attribute_tensors": len(ctx_saved),
    }
    loss.backward()
    logits.grad = None
    return result


def torch_peak(fn: Callable, logits, targets, device: str) -> dict[str, float]:
    """``max_memory_allocated`` during one forward+backward beyond what was allocated before
    (the N x C temporaries included), as a multiple of the logits' bytes; {} off the GPU."""
    name = D.canonical(device)
    if not D.is_gpu(name):
        return {}
    import torch

    logits.grad = None
    D.synchronize("torch", name)
    before = torch.cuda.memory_allocated(device)
    D.reset_peak_memory("torch", name)
    fn(logits, targets).backward()
    D.synchronize("torch", name)
    peak = D.peak_memory("torch", name)["max_memory_allocated"]
    return {"max_allocated": (peak - before) / (logits.numel() * logits.element_size())}


def bench_torch(losses, shapes, device, reps, warmup, candidates, peer_fns, log, errors=None):
    errors = [] if errors is None else errors
    label = D.canonical("gpu" + device[4:] if device.startswith("cuda") else device)
    device = D.torch_name(label)
    time_rows, memory_rows = [], []
    for shape in shapes:
        for loss in losses:
            logits, targets = _torch_tensors(loss, shape, device)
            log(f"torch {loss} {shape} ...")
            try:
                candidates[loss](logits, targets).backward()
            except Exception as error:  # a broken backend: report it, go on with the others
                errors.append(f"torch {loss} {_shape(shape)}: {type(error).__name__}: {error}")
                log(errors[-1])
                continue
            cand_ms, peer_ms = interleave(
                _torch_step(candidates[loss], logits, targets, device),
                _torch_step(peer_fns[loss], logits, targets, device),
                reps,
                warmup,
            )
            c_med, p_med, ratio, paired = _summary(cand_ms, peer_ms)
            time_rows.append(
                TimeRow(
                    "torch",
                    loss,
                    tuple(shape),
                    label,
                    peers.PEER_NAMES["torch", loss],
                    c_med,
                    p_med,
                    ratio,
                    paired,
                    reps,
                    dualloss_ms_all=cand_ms,
                    peer_ms_all=peer_ms,
                )
            )
            memory_rows.append(
                MemoryRow(
                    "torch",
                    loss,
                    tuple(shape),
                    label,
                    peers.PEER_NAMES["torch", loss],
                    logits.numel() * logits.element_size(),
                    torch_saved_bytes(candidates[loss], logits, targets),
                    torch_saved_bytes(peer_fns[loss], logits, targets),
                    device_peak=_pair(
                        torch_peak(candidates[loss], logits, targets, device),
                        torch_peak(peer_fns[loss], logits, targets, device),
                    ),
                )
            )
            del logits, targets
    return time_rows, memory_rows


def _error_text(error: BaseException, limit: int = 300) -> str:
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bench_torch_compile(
    losses, shape, device, reps, warmup, candidates, peer_fns, log, backend: str = "inductor"
) -> list[CompileRow]:
    """Times ``torch.compile(dualloss)`` against ``torch.compile(peer)``, forward+backward, at
    one shape: both compiled (default mode, `backend`) and warmed up outside the timing, then
    interleaved like the eager rows. A compile or run failure becomes the row's error."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    label = D.canonical("gpu" + device[4:] if device.startswith("cuda") else device)
    device = D.torch_name(label)
    rows = []
    for loss in losses:
        row = CompileRow(loss, tuple(shape), label, peers.PEER_NAMES["torch", loss], backend)
        rows.append(row)
        logits, targets = _torch_tensors(loss, shape, device)
        torch._dynamo.reset()  # a fresh cache per loss: no recompile limits carried over
        compiled = {}
        for side, fn in (("dualloss", candidates[loss]), ("peer", peer_fns[loss])):
            log(f"torch.compile({backend}) {side} {loss} {shape} ...")
            breaks = sum(counters["graph_break"].values())
            try:
                step = _torch_step(torch.compile(fn, backend=backend), logits, targets, device)
                row.compile_s[side] = step() / 1e3  # compiles forward and backward
                step()  # a second call: any recompilation happens here, not in the timing
                compiled[side] = step
            except Exception as error:  # report, do not crash: there is no goal here
                row.errors[side] = _error_text(error)
                log(f"torch.compile {side} {loss}: {row.errors[side]}")
            row.graph_breaks[side] = sum(counters["graph_break"].values()) - breaks
        if len(compiled) < 2:
            continue
        try:
            cand_ms, peer_ms = interleave(compiled["dualloss"], compiled["peer"], reps, warmup)
        except Exception as error:
            row.errors["timing"] = _error_text(error)
            continue
        row.dualloss_ms, row.peer_ms, row.ratio, row.paired_ratio = _summary(cand_ms, peer_ms)
        row.reps = reps
    return rows


# ----------------------------------------------------------------------------------------------
# JAX
# ----------------------------------------------------------------------------------------------


def _jax_step(jitted, logits, targets) -> Callable[[], float]:
    import jax

    def step() -> float:
        start = time.perf_counter()
        jax.block_until_ready(jitted(logits, targets))
        return (time.perf_counter() - start) * 1e3

    return step


def jax_memory(jitted, logits, targets) -> dict[str, float | bool | int]:
    """XLA's memory analysis of the compiled function, as multiples of the logits' size."""
    stats = jitted.lower(logits, targets).compile().memory_analysis()
    logits_bytes = logits.size * logits.dtype.itemsize
    if stats is None:
        return {}
    result: dict[str, float | bool | int] = {"temp": stats.temp_size_in_bytes / logits_bytes}
    peak = getattr(stats, "peak_memory_in_bytes", None)
    if peak:
        result["peak"] = peak / logits_bytes
    return result


def _pair(candidate: dict, peer: dict) -> dict[str, float]:
    return {f"{side}_{k}": v for side, d in (("dualloss", candidate), ("peer", peer))
            for k, v in d.items()}  # fmt: skip


def jax_peak(jitted, logits, targets, device: str) -> dict[str, float]:
    """The device's peak bytes in use (``memory_stats``; the process's peak so far, JAX cannot
    reset it) after one call, as a multiple of the logits' bytes; {} where not reported."""
    import jax

    jax.block_until_ready(jitted(logits, targets))
    stats = D.peak_memory("jax", device)
    if not stats or "peak_bytes_in_use" not in stats:
        return {}
    return {"peak_in_use": stats["peak_bytes_in_use"] / (logits.size * logits.dtype.itemsize)}


def bench_jax(
    losses, shapes, reps, warmup, candidates, peer_fns, log, errors=None, device: str = "cpu"
):
    errors = [] if errors is None else errors
    import jax

    device = D.canonical(device)
    placed = D.device_object("jax", device)
    time_rows, memory_rows = [], []
    for shape in shapes:
        for loss in losses:
            logits_np, targets_np = make_inputs(loss, shape)
            logits = jax.device_put(logits_np, placed)
            targets = jax.device_put(
                targets_np.astype(np.int32) if loss_info(loss).is_softmax else targets_np, placed
            )
            cand = jax.jit(jax.value_and_grad(candidates[loss]))
            peer = jax.jit(jax.value_and_grad(peer_fns[loss]))
            log(f"jax {loss} {shape} ...")
            try:
                jax.block_until_ready(cand(logits, targets))  # compile outside the timing
            except Exception as error:  # a broken backend: report it, go on with the others
                errors.append(f"jax {loss} {_shape(shape)}: {type(error).__name__}: {error}")
                log(errors[-1])
                continue
            jax.block_until_ready(peer(logits, targets))
            cand_ms, peer_ms = interleave(
                _jax_step(cand, logits, targets), _jax_step(peer, logits, targets), reps, warmup
            )
            c_med, p_med, ratio, paired = _summary(cand_ms, peer_ms)
            time_rows.append(
                TimeRow(
                    "jax",
                    loss,
                    tuple(shape),
                    device,
                    peers.PEER_NAMES["jax", loss],
                    c_med,
                    p_med,
                    ratio,
                    paired,
                    reps,
                    dualloss_ms_all=cand_ms,
                    peer_ms_all=peer_ms,
                )
            )
            memory_rows.append(
                MemoryRow(
                    "jax",
                    loss,
                    tuple(shape),
                    device,
                    peers.PEER_NAMES["jax", loss],
                    logits.size * logits.dtype.itemsize,
                    jax_memory(cand, logits, targets),
                    jax_memory(peer, logits, targets),
                    device_peak=_pair(
                        jax_peak(cand, logits, targets, device),
                        jax_peak(peer, logits, targets, device),
                    ),
                )
            )
    return time_rows, memory_rows


# ----------------------------------------------------------------------------------------------
# Judging, tables, plot
# ----------------------------------------------------------------------------------------------


def judge(time_rows: list[TimeRow], memory_rows: list[MemoryRow]) -> None:
    """PASS/MISS per row: time on the median of the per-pair ratios (the issue's measure), at
    TARGET_SHAPE against the goal and at OTHER_SHAPES against ``time_limit``; memory (torch) on
    the "full" saved-for-backward multiple at every shape."""
    for row in time_rows:
        target = time_limit(row.framework, row.loss, row.shape)
        if target is not None:
            row.target = target
            row.status = "PASS" if row.paired_ratio <= target else "MISS"
    for row in memory_rows:
        if row.framework == "torch":
            row.target = MEMORY_TARGET
            row.status = "PASS" if row.dualloss["full"] <= MEMORY_TARGET + 1e-9 else "MISS"


def _shape(shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def time_table(rows: list[TimeRow]) -> str:
    lines = [
        "| framework | loss | N x C | device | dualloss ms | peer | peer ms | ratio | paired "
        "| target | | / floor |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        target = f"<= {r.target:.2f}" if r.target is not None else ""
        lines.append(
            f"| {r.framework} | {r.loss} | {_shape(r.shape)} | {r.device} | {r.dualloss_ms:.2f} "
            f"| {r.peer} | {r.peer_ms:.2f} | {r.ratio:.2f} | {r.paired_ratio:.2f} | {target} "
            f"| {r.status} | {r.floor_ratio:.1f}x |"
        )
    return "\n".join(lines)


def compile_table(rows: list[CompileRow]) -> str:
    if not rows:
        return ""
    r0, reps = rows[0], max(r.reps for r in rows)
    lines = [
        f"torch.compile (backend {r0.backend!r}, default mode), ours compiled against the peer "
        f"compiled, forward+backward at {_shape(r0.shape)}, median ms of {reps} interleaved "
        "repetitions after compilation and warm-up (no goal yet); compile s: the first call; "
        "breaks: dynamo graph breaks:",
        "",
        "| loss | N x C | device | dualloss ms | peer | peer ms | ratio | paired "
        "| compile s (ours / peer) | breaks (ours / peer) | error |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        errors = "; ".join(f"{side}: {text}" for side, text in r.errors.items())
        errors = errors.replace("|", "\\|").replace("\n", " ")
        compile_s = " / ".join(f"{r.compile_s[k]:.1f}" if k in r.compile_s else "-"
                               for k in ("dualloss", "peer"))  # fmt: skip
        breaks = " / ".join(str(r.graph_breaks.get(k, "-")) for k in ("dualloss", "peer"))
        lines.append(
            f"| {r.loss} | {_shape(r.shape)} | {r.device} | {r.dualloss_ms:.2f} | {r.peer} "
            f"| {r.peer_ms:.2f} | {r.ratio:.2f} | {r.paired_ratio:.2f} | {compile_s} | {breaks} "
            f"| {errors} |"
        )
    return "\n".join(lines)


def _fmt_torch_mem(stats) -> str:
    if not stats:
        return "n/a"
    saved = [name for name in ("logits", "targets") if stats[f"{name}_saved"]]
    inputs = f"saves {' and '.join(saved)}" if saved else "saves neither input"
    return (
        f"{stats['full']:.2f}x full, {stats['total']:.2f}x total, "
        f"{stats['extra']:.2f}x beyond inputs ({inputs})"
    )


def _fmt_jax_mem(stats) -> str:
    if not stats:
        return "not reported"
    text = f"temp {stats['temp']:.2f}x"
    if "peak" in stats:
        text += f", peak {stats['peak']:.2f}x"
    return text


def memory_table(rows: list[MemoryRow]) -> str:
    lines = []
    torch_rows = [r for r in rows if r.framework == "torch"]
    jax_rows = [r for r in rows if r.framework == "jax"]
    if torch_rows:
        lines += [
            "torch, saved for backward (multiples of the logits' bytes):",
            "",
            "| loss | N x C | dualloss | peer | peer saved | target | |",
            "|---|---|---|---|---|---:|---|",
        ]
        for r in torch_rows:
            lines.append(
                f"| {r.loss} | {_shape(r.shape)} | {_fmt_torch_mem(r.dualloss)} | {r.peer} "
                f"| {_fmt_torch_mem(r.peer_stats)} | <= {r.target:.2f} full | {r.status} |"
            )
    if jax_rows:
        if lines:
            lines.append("")
        lines += [
            "JAX, XLA memory analysis of jit(value_and_grad) (multiples of the logits' bytes):",
            "",
            "| loss | N x C | dualloss | peer | peer memory |",
            "|---|---|---|---|---|",
        ]
        for r in jax_rows:
            lines.append(
                f"| {r.loss} | {_shape(r.shape)} | {_fmt_jax_mem(r.dualloss)} | {r.peer} "
                f"| {_fmt_jax_mem(r.peer_stats)} |"
            )
    peaks = [r for r in rows if r.device_peak]
    if peaks:
        lines += [
            "",
            "Device memory, one forward+backward (torch: max_memory_allocated beyond the inputs;"
            " JAX: the device's peak bytes in use so far), multiples of the logits' bytes:",
            "",
            "| framework | loss | N x C | device | dualloss | peer |",
            "|---|---|---|---|---|---|",
        ]
        for r in peaks:
            ours = ", ".join(f"{k[9:]} {v:.2f}x" for k, v in r.device_peak.items()
                             if k.startswith("dualloss_"))  # fmt: skip
            theirs = ", ".join(f"{k[5:]} {v:.2f}x" for k, v in r.device_peak.items()
                               if k.startswith("peer_"))  # fmt: skip
            lines.append(
                f"| {r.framework} | {r.loss} | {_shape(r.shape)} | {r.device} | {ours} | {theirs} |"
            )
    return "\n".join(lines)


def summary_table(
    time_rows: list[TimeRow], memory_rows: list[MemoryRow], requested=tuple(TIME_TARGETS)
) -> str:
    """The targets only: one line per target with its measured value and PASS/MISS. Every time
    goal among the `requested` (framework, loss) pairs is listed at TARGET_SHAPE ("not measured"
    when no row came back, e.g. a failed loss), then the judged rows at the other shapes, then
    memory."""
    judged = (TARGET_SHAPE, *OTHER_SHAPES)
    if not any(tuple(r.shape) in judged for r in time_rows + memory_rows):
        shapes = ", ".join(_shape(s) for s in judged)
        return f"(none: no judged shape ({shapes}) among this run's shapes)"
    lines = ["| target | measured (paired) | limit | |", "|---|---:|---:|---|"]
    for shape in judged:
        if not any(tuple(r.shape) == shape for r in time_rows + memory_rows):
            continue
        for framework, loss in TIME_TARGETS:
            if (framework, loss) not in requested:
                continue
            found = [
                r
                for r in time_rows
                if (r.framework, r.loss, tuple(r.shape)) == (framework, loss, shape)
            ]
            if found:
                r = found[0]
                lines.append(
                    f"| {r.framework} {r.loss} time vs {r.peer}, {_shape(r.shape)} "
                    f"| {r.paired_ratio:.2f}x | {r.target:.2f}x | {r.status} |"
                )
            elif shape == TARGET_SHAPE:
                limit = time_limit(framework, loss, shape)
                lines.append(
                    f"| {framework} {loss} time vs {peers.PEER_NAMES[framework, loss]}, "
                    f"{_shape(shape)} | | {limit:.2f}x | not measured |"
                )
    for r in memory_rows:
        if r.target is not None and tuple(r.shape) == TARGET_SHAPE:
            lines.append(
                f"| {r.framework} {r.loss} saved for backward, {_shape(r.shape)} "
                f"| {r.dualloss['full']:.2f}x | {r.target:.2f}x | {r.status} |"
            )
    return "\n".join(lines)


def machine_line(time_rows: list[TimeRow]) -> str:
    parts = [platform.processor() or platform.machine(), f"{os.cpu_count()} logical CPUs"]
    try:
        import torch

        parts.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
        if torch.cuda.is_available():
            parts.append(torch.cuda.get_device_name())  # gpu:0
    except ImportError:
        pass
    try:
        import jax

        parts.append(f"jax {jax.__version__} ({jax.devices()[0].platform})")
    except ImportError:
        pass
    try:
        parts.append(
            f"load average {LOAD_AT_START:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
        )
    except OSError:
        pass
    reps = sorted({r.reps for r in time_rows})
    if reps:
        parts.append(f"{'/'.join(map(str, reps))} interleaved repetitions, float32")
    return ", ".join(parts)


def plot(time_rows: list[TimeRow], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frameworks = [f for f in ("torch", "jax") if any(r.framework == f for r in time_rows)]
    fig, axes = plt.subplots(
        1, len(frameworks), figsize=(6.5 * len(frameworks), 4.2), squeeze=False
    )
    for ax, framework in zip(axes[0], frameworks, strict=True):
        rows = [r for r in time_rows if r.framework == framework]
        losses = [loss for loss in peers.LOSSES if any(r.loss == loss for r in rows)]
        shapes = list(dict.fromkeys(tuple(r.shape) for r in rows))
        width = 0.8 / max(len(shapes), 1)
        for j, shape in enumerate(shapes):
            xs, ys = [], []
            for i, loss in enumerate(losses):
                for r in rows:
                    if r.loss == loss and tuple(r.shape) == shape:
                        xs.append(i + (j - (len(shapes) - 1) / 2) * width)
                        ys.append(r.paired_ratio)  # what the targets are judged on
            bars = ax.bar(xs, ys, width, label=_shape(shape))
            ax.bar_label(bars, labels=[f"{y:.2f}" for y in ys], fontsize=7)
        targets = []
        for i, loss in enumerate(losses):
            target = TIME_TARGETS.get((framework, loss))
            if target is not None:
                targets.append(target)
                ax.hlines(target, i - 0.45, i + 0.45, colors="black", linestyles="dashed")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_yscale("log")
        values = [r.paired_ratio for r in rows] + targets + [1.0]
        low, high = min(values) / 1.6, max(values) * 1.6
        ax.set_ylim(low, high)
        ticks = [t for t in (0.1, 0.2, 0.35, 0.5, 1, 2, 3, 5, 10, 20, 50) if low <= t <= high]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xticks(range(len(losses)))
        ax.set_xticklabels([loss.replace("_", "\n", 1) for loss in losses], fontsize=8)
        ax.set_ylabel("time ratio dualloss / peer, paired (log scale)")
        device = rows[0].device if rows else ""
        ax.set_title(f"{framework} ({device}), forward+backward, float32")
        ax.legend(title="N x C", fontsize=8)
    fig.suptitle("Below 1: dualloss faster. Dashed: target at 4096 x 1000", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_doc(path: str, text: str) -> None:
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    begin, end = doc.find(DOC_BEGIN), doc.find(DOC_END)
    if begin < 0 or end < begin:
        raise ValueError(f"`{path}` has no {DOC_BEGIN!r} ... {DOC_END!r} block to replace.")
    doc = doc[: begin + len(DOC_BEGIN)] + "\n" + text + "\n" + doc[end:]
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc)


# ----------------------------------------------------------------------------------------------
# Profiling
# ----------------------------------------------------------------------------------------------


def profile_torch(losses, shape, device, candidates, peer_fns, rows: int = 15) -> str:
    """torch.profiler tables (self time per op) of a few forward+backward passes of each."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    out = []
    for loss in losses:
        logits, targets = _torch_tensors(loss, shape, device)
        for name, fn in (
            ("dualloss", candidates[loss]),
            (peers.PEER_NAMES["torch", loss], peer_fns[loss]),
        ):
            step = _torch_step(fn, logits, targets, device)
            for _ in range(3):
                step()
            with profile(activities=activities) as prof:
                for _ in range(5):
                    step()
            out.append(f"== torch {loss} {_shape(shape)}: {name} (5 forward+backward) ==")
            out.append(prof.key_averages().table(sort_by=sort, row_limit=rows))
    return "\n".join(out)


def profile_jax(losses, shape, candidates, peer_fns) -> str:
    """What each compiled value_and_grad does per logit: from the optimized HLO, the N x C
    buffers the entry computation writes (fusions and other ops with the logits' shape) and the
    N x C transcendental ops (exp, log, log1p, expm1, tanh, power, divide, logistic) inside
    all computations."""
    import re
    from collections import Counter

    import jax
    import jax.numpy as jnp

    full = f"[{shape[0]},{shape[1]}]"
    transcendental = (
        "exponential",
        "log",
        "log-plus-one",
        "exponential-minus-one",
        "tanh",
        "power",
        "divide",
        "logistic",
        "rsqrt",
        "sqrt",
    )
    out = []
    for loss in losses:
        logits_np, targets_np = make_inputs(loss, shape)
        logits = jnp.asarray(logits_np)
        targets = jnp.asarray(
            targets_np.astype(np.int32) if loss_info(loss).is_softmax else targets_np
        )
        for name, fn in (
            ("dualloss", candidates[loss]),
            (peers.PEER_NAMES["jax", loss], peer_fns[loss]),
        ):
            text = jax.jit(jax.value_and_grad(fn)).lower(logits, targets).compile().as_text()
            entry = text[text.find("ENTRY") :]
            written = Counter(
                op
                for op in re.findall(r"= \w+" + re.escape(full) + r"\S* ([\w-]+)\(", entry)
                if op != "parameter"
            )
            ops = Counter(
                op
                for op in re.findall(r"= \w+" + re.escape(full) + r"\S* ([\w-]+)\(", text)
                if op in transcendental
            )
            out.append(
                f"== jax {loss} {_shape(shape)}: {name}: N x C buffers written by the entry "
                f"computation {sum(written.values())} {dict(written)}; N x C transcendental ops "
                f"{sum(ops.values())} {dict(ops)}"
            )
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        n, c = item.lower().split("x")
        shapes.append((int(n), int(c)))
    return shapes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0]
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="default shapes, 7 repetitions")
    size.add_argument("--tiny", action="store_true", help="tiny shapes, 3 repetitions (smoke test)")
    parser.add_argument(
        "--shapes", type=parse_shapes, help="comma-separated NxC, e.g. 4096x1000,512x32000"
    )
    parser.add_argument("--frameworks", default="torch,jax", help="comma-separated: torch,jax")
    parser.add_argument(
        "--losses", default=",".join(peers.LOSSES), help="comma-separated loss names"
    )
    parser.add_argument(
        "--reps", type=int, help="timed repetitions per candidate and peer (default 31)"
    )
    parser.add_argument("--warmup", type=int, help="untimed repetitions first (default 3)")
    parser.add_argument(
        "--allocator",
        choices=("kept", "default"),
        default="kept",
        help="kept (default): glibc keeps freed memory, as a caching allocator does (the module "
        "restarts itself with MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set); default: "
        "glibc's own settings, where large buffers can be page-faulted back on every call",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="cpu or gpu:N (alias cuda:N) for both frameworks (default auto: gpu:0 if present)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch.set_num_threads; 1 also turns off XLA:CPU's Eigen threads (default: theirs)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time torch.compile(dualloss) against torch.compile(peer) at 4096x1000 (or the"
        " first shape when that is not run); a table, no goal",
    )
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend for --compile (default inductor; aot_eager for a quick check)",
    )
    parser.add_argument("--out", help="write the results as JSON to this file")
    parser.add_argument("--plot", help="write the ratio plot (PNG or SVG) to this file")
    parser.add_argument("--update-doc", help="replace the generated block of this Markdown file")
    parser.add_argument(
        "--profile", action="store_true", help="also profile each loss at the first shape"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    shapes = args.shapes or list(TINY_SHAPES if args.tiny else DEFAULT_SHAPES)
    reps = args.reps or (3 if args.tiny else 7 if args.quick else 31)
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    frameworks = [f for f in args.frameworks.split(",") if f]
    losses = [loss for loss in args.losses.split(",") if loss]
    unknown = sorted(set(losses) - set(peers.LOSSES)) + sorted(set(frameworks) - {"torch", "jax"})
    if unknown:
        parser.error(f"unknown loss or framework: {', '.join(unknown)}")

    def log(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    if "jax" in frameworks and args.threads == 1 and "jax" not in sys.modules:
        # XLA:CPU, before jax is imported: no intra-op thread pool
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
    try:
        D.start(frameworks)  # JAX before torch; no JAX preallocation when torch shares the GPU
        name = device_name(args.device, frameworks)
    except ValueError as error:
        parser.error(str(error))
    log(f"device: {name}")

    time_rows: list[TimeRow] = []
    memory_rows: list[MemoryRow] = []
    compile_rows: list[CompileRow] = []
    profiles = []
    errors: list[str] = []
    if "torch" in frameworks:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        device = D.torch_name(name)
        candidates, peer_fns = peers.torch_candidates(), peers.torch_peers()
        t, m = bench_torch(losses, shapes, device, reps, warmup, candidates, peer_fns, log, errors)
        time_rows += t
        memory_rows += m
        if args.compile:
            shape = TARGET_SHAPE if TARGET_SHAPE in map(tuple, shapes) else tuple(shapes[0])
            compile_rows = bench_torch_compile(
                losses, shape, device, reps, warmup, candidates, peer_fns, log,
                args.compile_backend,
            )  # fmt: skip
        if args.profile:
            profiles.append(profile_torch(losses, shapes[0], device, candidates, peer_fns))
    if "jax" in frameworks:
        candidates, peer_fns = peers.jax_candidates(), peers.jax_peers()
        t, m = bench_jax(losses, shapes, reps, warmup, candidates, peer_fns, log, errors, name)
        time_rows += t
        memory_rows += m
        if args.profile:
            profiles.append(profile_jax(losses, shapes[0], candidates, peer_fns))

    judge(time_rows, memory_rows)
    floors = {}
    for shape in shapes:
        log(f"bandwidth floor {shape} ...")
        floors[tuple(shape)] = bandwidth_floor(shape, name, max(reps, 11), warmup)
    set_floors(time_rows, floors)
    machine = machine_line(time_rows)
    report = "\n\n".join(
        [
            f"Machine: {machine}. {allocator_line()}.",
            "Forward+backward, median ms; ratio = median dualloss / median peer (below 1: dualloss"
            " faster); paired = median over repetitions of the ratio within each interleaved pair.",
            floor_line(floors),
            time_table(time_rows),
            memory_table(memory_rows),
            *([compile_table(compile_rows)] if compile_rows else []),
            f"Targets (float32; time: the median of the per-pair ratios, at {_shape(TARGET_SHAPE)}"
            f" the goal, at {', '.join(_shape(s) for s in OTHER_SHAPES)} min({OTHER_SHAPE_LIMIT:g},"
            f" {OTHER_SHAPE_SLACK:g} x the goal); memory: saved for backward, full):",
            summary_table(time_rows, memory_rows, [(f, x) for f in frameworks for x in losses]),
        ]
    )
    if errors:
        report += "\n\nFailed (not timed):\n\n" + "\n".join(f"- {e}" for e in errors)
    print(report)
    for text in profiles:
        print()
        print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "machine": machine,
                    "allocator": allocator_line(),
                    "time": [asdict(r) for r in time_rows],
                    "memory": [asdict(r) for r in memory_rows],
                    "floor_ms": {_shape(s): ms for s, ms in floors.items()},
                    "compile": [asdict(r) for r in compile_rows],
                },
                f,
                indent=1,
            )
    if args.plot:
        plot(time_rows, args.plot)
    if args.update_doc:
        update_doc(args.update_doc, report)
    return 1 if errors or any(math.isnan(r.ratio) for r in time_rows) else 0


# glibc keeps freed memory (no return to the OS, no mmap per large buffer): what a caching
# allocator (CUDA's) gives. With glibc's defaults a process page-faults its 16-64 MB buffers back
# on many calls, differently for each loss and each process (docs/benchmarks.md, "Page faults").
KEPT_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}


def allocator_line() -> str:
    kept = all(os.environ.get(k) == v for k, v in KEPT_ALLOCATOR.items())
    if kept:
        return (
            "glibc allocator: freed memory kept ("
            + " ".join(f"{k}={v}" for k, v in KEPT_ALLOCATOR.items())
            + "; --allocator default for glibc's own settings)"
        )
    return (
        "glibc allocator: its own settings (--allocator default): large buffers may be"
        " page-faulted back on every call"
    )


def reexec_for_allocator(argv: Sequence[str], module: str = "benchmarks.run") -> None:
    """`--allocator kept` (the default) needs the environment set before the process starts:
    start `module` again with it (once; the variables mark the second start)."""
    if "--allocator=default" in argv or (
        "--allocator" in argv and argv[argv.index("--allocator") + 1 :][:1] == ["default"]
    ):
        return
    if all(os.environ.get(k) == v for k, v in KEPT_ALLOCATOR.items()):
        return
    env = dict(os.environ, **KEPT_ALLOCATOR)
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


if __name__ == "__main__":
    reexec_for_allocator(sys.argv[1:])
    sys.exit(main())
