"""How fast a softmax cross entropy built from torch's own CPU kernels can be: the floor under
``dualloss.torch_impl.softmax_cross_entropy``'s fast path, against ``F.cross_entropy``.

    python -m benchmarks.softmax_floor                      # 4096x1000, 512x32000, 65536x10
    python -m benchmarks.softmax_floor --shapes 4096x1000 --reps 41

The floor is an ``autograd.Function`` that runs only the kernels our fast path cannot do without,
and nothing else: torch's fused ``softmax``, one row sum of p and one gather of p_y in forward,
the gradient written over the saved p (one in-place multiply) and one scatter at the target in
backward, with a mean. No argument checks, no ignored targets, no class weights, no repair of
confident rows (its loss is log(sum p) - log p_y, which rounds a confident row's loss to 0):
it is a measuring stick, not a loss. The issue's goal for the cross entropy (0.6x
``F.cross_entropy`` at 4096 x 1000, at most 0.72x at the other shapes) is reachable with torch's
kernels only if this floor is well below it.

Each repetition times the floor, dualloss and ``F.cross_entropy`` (forward+backward, 2 threads by
default), in an order rotated every repetition; ratios are medians of the per-repetition ratios
("paired", as ``benchmarks.run``). Take the figures on an idle machine, with the allocator kept
as ``benchmarks.run`` does (this module restarts itself with it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence

from benchmarks.run import (
    DEFAULT_SHAPES,
    allocator_line,
    make_inputs,
    parse_shapes,
    reexec_for_allocator,
)
from dualloss import losses


def _floor_function():
    import torch

    class SoftmaxFloor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets):
            p = torch.softmax(logits, dim=-1)
            y = targets.unsqueeze(-1)
            p_y = p.gather(-1, y)
            total = p.sum(dim=-1, keepdim=True)
            ctx.save_for_backward(p, y, p_y, total)
            return (total.log() - p_y.log()).mean()

        @staticmethod
        def backward(ctx, grad):
            p, y, p_y, total = ctx.saved_tensors
            scale = grad / (total * p.shape[0])
            return p.mul_(scale).scatter_(-1, y, (p_y - total) * scale), None

    return SoftmaxFloor.apply


def measure(shape: tuple[int, int], reps: int, warmup: int) -> dict[str, float]:
    """Median ms of each candidate and the paired ratios against ``F.cross_entropy``."""
    import torch
    import torch.nn.functional as F

    from dualloss import torch_impl

    logits_np, targets_np = make_inputs(losses.SOFTMAX_CROSS_ENTROPY.name, shape)
    logits = torch.from_numpy(logits_np).requires_grad_(True)
    targets = torch.from_numpy(targets_np)
    steps = {
        "floor": _floor_function(),
        "dualloss": torch_impl.softmax_cross_entropy,
        "F.cross_entropy": F.cross_entropy,
    }
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + reps):
        order = names[i % 3 :] + names[: i % 3]
        for name in order:
            logits.grad = None
            start = time.perf_counter()
            steps[name](logits, targets).backward()
            if i >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    peer = times["F.cross_entropy"]
    result = {f"{name} ms": statistics.median(times[name]) for name in names}
    for name in ("floor", "dualloss"):
        result[f"{name} / peer"] = statistics.median(
            a / b for a, b in zip(times[name], peer, strict=True)
        )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="comma-separated NxC, e.g. 4096x1000")
    parser.add_argument("--reps", type=int, default=31, help="timed repetitions (default 31)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions first")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        parser.error(
            f"--reps must be >= 1 and --warmup >= 0. Received: {args.reps}, {args.warmup}."
        )
    shapes = parse_shapes(args.shapes) if args.shapes else list(DEFAULT_SHAPES)
    import torch

    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), load average "
        f"{os.getloadavg()[0]:.2f} at the start, {args.reps} repetitions, float32. "
        + allocator_line()
    )
    print()
    print(
        "| N x C | floor ms | dualloss ms | F.cross_entropy ms | floor / peer | dualloss / peer |\n"
        "|---|---:|---:|---:|---:|---:|"
    )
    for shape in shapes:
        r = measure(shape, args.reps, args.warmup)
        print(
            f"| {shape[0]}x{shape[1]} | {r['floor ms']:.2f} | {r['dualloss ms']:.2f} | "
            f"{r['F.cross_entropy ms']:.2f} | {r['floor / peer']:.2f} | "
            f"{r['dualloss / peer']:.2f} |"
        )
    print()
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    reexec_for_allocator(sys.argv[1:], "benchmarks.softmax_floor")
    sys.exit(main())
