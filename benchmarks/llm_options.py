"""What the LLM head options cost (issue 30, DESIGN 13): `z_loss` and `softcap` together over the
plain softmax cross entropy, in each backend, with the hand-written composition as the peer.

    python -m benchmarks.llm_options                        # 4096x1000, 512x32000
    python -m benchmarks.llm_options --shapes 4096x1000 --reps 41
    python -m benchmarks.llm_options --device gpu:0 --llm   # also (8192, 128256) bfloat16

Per framework, forward + backward of the mean loss over logits with class-index targets (float32,
or ``--dtype bfloat16``; ``--llm`` adds the LLM head's (8192, 128256) in bfloat16), on
``--device`` (``cpu`` or ``gpu:N``; default ``gpu:0`` where a GPU is present, as
``benchmarks.run``): torch eagerly (its Triton kernels on CUDA, ``torch.cuda.synchronize``
around each timing), JAX a jitted value_and_grad with its inputs placed on the device:

* plain: ``softmax_cross_entropy`` (torch: its class-index fast path);
* options: the same with ``z_loss=1e-4, softcap=30.0`` (Gemma 2's cap, PaLM's weight);
* hand-written: the composition users write around a library loss,
  ``c = cap * tanh(z / cap); F.cross_entropy(c, t) + z_loss * logsumexp(c).pow(2).mean()``
  (JAX: the same with ``optax.softmax_cross_entropy_with_integer_labels``).

Each repetition times the three in an order rotated every repetition; the ratios are medians of
the per-repetition ratios ("paired", as ``benchmarks.run``), which is what keeps them usable on a
machine loaded by other work. Take the figures on an idle machine when they are to be compared
with a target; the table records the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from benchmarks.run import (
    allocator_line,
    device_name,
    make_inputs,
    parse_shapes,
    reexec_for_allocator,
)
from dualloss import losses
from dualloss.parity import devices as D

SHAPES = ((4096, 1000), (512, 32000))
# the LLM head (issues 26, 27): Llama 3's vocabulary, a batch of 8192 tokens, bfloat16
LLM_SHAPE = (8192, 128256)
DTYPES = ("float32", "bfloat16")
Z_LOSS = 1e-4
SOFTCAP = 30.0
NAMES = ("plain", "options", "hand-written")


def torch_steps(shape, device="cpu", dtype="float32") -> dict[str, Callable[[], float]]:
    """The three steps on `device` (canonical: 'cpu', 'gpu:N'), each returning its ms."""
    import torch
    import torch.nn.functional as F

    from dualloss import torch_impl

    device = D.torch_name(device)
    logits_np, targets_np = make_inputs(losses.SOFTMAX_CROSS_ENTROPY.name, shape)
    logits = torch.from_numpy(logits_np).to(device, getattr(torch, dtype)).requires_grad_(True)
    targets = torch.from_numpy(targets_np).to(device)
    cuda = device.startswith("cuda")

    def hand_written(z, t):
        c = SOFTCAP * torch.tanh(z / SOFTCAP)
        return F.cross_entropy(c, t) + Z_LOSS * torch.logsumexp(c, dim=-1).pow(2).mean()

    fns = {
        "plain": torch_impl.softmax_cross_entropy,
        "options": lambda z, t: torch_impl.softmax_cross_entropy(
            z, t, z_loss=Z_LOSS, softcap=SOFTCAP
        ),
        "hand-written": hand_written,
    }

    def step(fn):
        def run() -> float:
            logits.grad = None
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn(logits, targets).backward()
            if cuda:
                torch.cuda.synchronize(device)
            return (time.perf_counter() - start) * 1e3

        return run

    return {name: step(fn) for name, fn in fns.items()}


def jax_steps(shape, device="cpu", dtype="float32") -> dict[str, Callable[[], float]]:
    """The three steps, jitted, their inputs placed on `device`; each returns its ms."""
    import jax
    import jax.numpy as jnp
    import optax

    from dualloss import jax_impl

    placed = D.device_object("jax", device)
    logits_np, targets_np = make_inputs(losses.SOFTMAX_CROSS_ENTROPY.name, shape)
    logits = jax.device_put(jnp.asarray(logits_np, getattr(jnp, dtype)), placed)
    targets = jax.device_put(jnp.asarray(targets_np), placed)

    def hand_written(z, t):
        c = SOFTCAP * jnp.tanh(z / SOFTCAP)
        ce = optax.softmax_cross_entropy_with_integer_labels(c, t).mean()
        return ce + Z_LOSS * jnp.mean(jax.nn.logsumexp(c, axis=-1) ** 2)

    fns = {
        "plain": jax_impl.softmax_cross_entropy,
        "options": lambda z, t: jax_impl.softmax_cross_entropy(
            z, t, z_loss=Z_LOSS, softcap=SOFTCAP
        ),
        "hand-written": hand_written,
    }

    def step(fn):
        jitted = jax.jit(jax.value_and_grad(fn))

        def run() -> float:
            start = time.perf_counter()
            jax.block_until_ready(jitted(logits, targets))
            return (time.perf_counter() - start) * 1e3

        return run

    return {name: step(fn) for name, fn in fns.items()}


def measure(steps: dict[str, Callable[[], float]], reps: int, warmup: int) -> dict[str, float]:
    """Median ms of each step and the paired ratios against 'plain'."""
    times: dict[str, list[float]] = {name: [] for name in NAMES}
    for i in range(warmup + reps):
        order = NAMES[i % 3 :] + NAMES[: i % 3]
        for name in order:
            ms = steps[name]()
            if i >= warmup:
                times[name].append(ms)
    result = {f"{name} ms": statistics.median(times[name]) for name in NAMES}
    for name in NAMES[1:]:
        result[f"{name} / plain"] = statistics.median(
            a / b for a, b in zip(times[name], times["plain"], strict=True)
        )
    result["options / hand-written"] = statistics.median(
        a / b for a, b in zip(times["options"], times["hand-written"], strict=True)
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="comma-separated NxC, e.g. 4096x1000")
    parser.add_argument("--reps", type=int, default=21, help="timed repetitions (default 21)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions first")
    parser.add_argument("--frameworks", default="torch,jax", help="torch, jax or both")
    parser.add_argument("--device", default="auto", help="cpu or gpu:N (default: gpu:0 if any)")
    parser.add_argument("--dtype", default="float32", help="the logits' dtype: float32, bfloat16")
    parser.add_argument("--llm", action="store_true", help=f"also {LLM_SHAPE} in bfloat16")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        parser.error(
            f"--reps must be >= 1 and --warmup >= 0. Received: {args.reps}, {args.warmup}."
        )
    if args.dtype not in DTYPES:
        parser.error(f"--dtype must be one of {', '.join(DTYPES)}. Received: {args.dtype!r}.")
    frameworks = [f for f in args.frameworks.split(",") if f]
    unknown = sorted(set(frameworks) - {"torch", "jax"})
    if unknown or not frameworks:
        parser.error(f"--frameworks takes torch and jax. Received: {args.frameworks!r}.")
    try:
        device = device_name(args.device, tuple(frameworks))
    except ValueError as error:  # devices.DeviceError: a device a framework lacks
        parser.error(str(error))
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else list(SHAPES)
    except ValueError:
        parser.error(
            f"--shapes takes comma-separated NxC, e.g. 4096x1000. Received: {args.shapes!r}."
        )
    runs = [(shape, args.dtype) for shape in shapes]
    if args.llm:
        runs.append((LLM_SHAPE, "bfloat16"))
    print(
        f"device {device}, load average {os.getloadavg()[0]:.2f} at the start, {args.reps} "
        f"repetitions, z_loss={Z_LOSS}, softcap={SOFTCAP}. " + allocator_line()
    )
    print()
    print(
        "| framework | N x C | dtype | plain ms | options ms | hand-written ms | options / plain | "
        "hand-written / plain | options / hand-written |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|"
    )
    for framework in frameworks:
        make = torch_steps if framework == "torch" else jax_steps
        for shape, dtype in runs:
            r = measure(make(shape, device, dtype), args.reps, args.warmup)
            print(
                f"| {framework} | {shape[0]}x{shape[1]} | {dtype} | {r['plain ms']:.2f} | "
                f"{r['options ms']:.2f} | {r['hand-written ms']:.2f} | "
                f"{r['options / plain']:.2f} | {r['hand-written / plain']:.2f} | "
                f"{r['options / hand-written']:.2f} |"
            )
    print()
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    reexec_for_allocator(sys.argv[1:], "benchmarks.llm_options")
    sys.exit(main())
