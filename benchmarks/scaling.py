"""Vocab-parallel losses against gather-then-loss on host devices (docs/scaling.md, issue 29 #5).

    python -m benchmarks.scaling jax --shape 8192x32000      # 8 forced host devices, 2 x 4 mesh
    python -m benchmarks.scaling torch --shape 2048x32000 --world 4   # gloo processes
    python -m benchmarks.scaling jax-linear --shape 4096x32000 --hidden 1024 --no-run

JAX (run in a subprocess of its own: ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` is set
before jax is imported): ``jit(value_and_grad(...))`` of a ``shard_map`` over a data x vocab mesh,
``axis_name="vocab"`` against ``all_gather`` over vocab then the unsharded loss. Reported per
program: the all-reduce ops and their bytes per device and the all-gather / reduce-scatter bytes
per device read from ``compiled.as_text()``, the temporaries of ``compiled.memory_analysis()``
and the flops of ``compiled.cost_analysis()``, then the mean wall time of `--steps` steps after
one warm-up step (skipped with ``--no-run``).

torch: `--world` gloo processes, each with a contiguous slice of the classes: ``process_group=``
against ``all_gather`` of the slices (``torch.distributed.nn.functional.all_gather``, so backward
reduce-scatters) then ``F.cross_entropy``; the mean wall time of `--steps` forward + backward
steps after one warm-up, rank 0's clock, with a barrier before each step.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time

_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s64": 8}


def collectives(hlo: str) -> dict[str, tuple[int, int]]:
    """{op: (count, bytes of its results per device)} from a compiled program's text."""
    out = {}
    for line in hlo.splitlines():
        for op in _OPS:
            match = re.search(rf"= (.*?) {op}(?:-start)?\(", line)
            if not match:
                continue
            size = 0
            for kind, dims in re.findall(r"([a-z]+\d*)\[([\d,]*)\]", match.group(1)):
                count = 1
                for d in dims.split(","):
                    count *= int(d) if d else 1
                size += count * _BYTES.get(kind, 4)
            n, b = out.get(op, (0, 0))
            out[op] = (n + 1, b + size)
    return out


def _jax(shape, steps, run):
    from functools import partial

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from dualloss import jax_impl, losses

    n, c = shape
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "vocab"))
    rows = P("data", "vocab")

    def program(name, gather):
        fn = getattr(jax_impl, name)
        options = {"gamma": 2.0} if losses.get(name).is_focal else {}

        @partial(jax.shard_map, mesh=mesh, in_specs=(rows, P("data")), out_specs=P())
        def f(x, t):
            if gather:
                x = jax.lax.all_gather(x, "vocab", axis=1, tiled=True)
                value = fn(x, t, reduction="sum", **options)
                # every vocab device computed the whole rows: count them once
                value = value / jax.lax.psum(1, "vocab")
                value = jax.lax.psum(value, "vocab")
            else:
                value = fn(x, t, reduction="sum", axis_name="vocab", **options)
            return jax.lax.psum(value, "data")

        return jax.jit(jax.value_and_grad(f))

    rng = np.random.default_rng(0)
    x = jax.device_put(
        jnp.asarray(rng.standard_normal((n, c), dtype=np.float32)), NamedSharding(mesh, rows)
    )
    t = jax.device_put(jnp.asarray(rng.integers(0, c, n)), NamedSharding(mesh, P("data")))
    print(f"JAX {jax.__version__}, {len(jax.devices())} host devices, 2 x 4 (data x vocab), "
          f"N={n}, C={c}, float32, reduction='sum', {os.cpu_count()} CPUs")  # fmt: skip
    print("| program | all-reduce ops | all-reduced bytes per device | all-gather / reduce-scatter"
          " bytes per device | temp per device | GFLOP | wall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in [n for n in losses.NAMES if losses.get(n).is_softmax]:
        for gather in (False, True):
            compiled = program(name, gather).lower(x, t).compile()
            ops = collectives(compiled.as_text())
            memory = compiled.memory_analysis()
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            flops = (cost or {}).get("flops", float("nan"))
            wall = "not run"
            if run:
                jax.block_until_ready(compiled(x, t))
                start = time.perf_counter()
                for _ in range(steps):
                    jax.block_until_ready(compiled(x, t))
                wall = f"{(time.perf_counter() - start) / steps:.2f} s"
            label = (f"`all_gather` over vocab, then `{name}`" if gather
                     else f"`{name}(axis_name=\"vocab\")`")  # fmt: skip
            reduce_n, reduce_b = ops.get("all-reduce", (0, 0))
            moved = ops.get("all-gather", (0, 0))[1] + ops.get("reduce-scatter", (0, 0))[1]
            temp = memory.temp_size_in_bytes / 2**20 if memory is not None else float("nan")
            reduce_b, moved = f"{reduce_b:,}".replace(",", " "), f"{moved:,}".replace(",", " ")
            print(f"| {label} | {reduce_n} | {reduce_b} | {moved} | {temp:.0f} MiB | "
                  f"{flops / 1e9:.2f} | {wall} |", flush=True)  # fmt: skip


def _torch_worker(rank, world, port, shape, steps):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.nn.functional import all_gather

    from dualloss import torch_impl

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    n, c = shape
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(n, c, generator=generator)
    targets = torch.randint(0, c, (n,), generator=generator)
    local = logits.tensor_split(world, dim=1)[rank].contiguous()

    def ours():
        x = local.clone().requires_grad_()
        torch_impl.softmax_cross_entropy(x, targets, process_group=dist.group.WORLD).backward()

    def gathered():
        x = local.clone().requires_grad_()
        F.cross_entropy(torch.cat(all_gather(x), dim=1), targets).backward()

    times = {}
    for name, step in (("process_group", ours), ("gather", gathered)):
        step()
        total = 0.0
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            step()
            total += time.perf_counter() - start
        times[name] = total / steps
    if rank == 0:
        print(f"torch {torch.__version__}, gloo, {world} processes (1 thread each), N={n}, C={c}"
              f", float32, mean of {steps} forward + backward steps (rank 0)")  # fmt: skip
        print(f"| `softmax_cross_entropy(process_group=...)` | {times['process_group']:.3f} s |")
        print(f"| `all_gather` then `F.cross_entropy` | {times['gather']:.3f} s |", flush=True)
    dist.destroy_process_group()


def _jax_linear(shape, size, steps, run):
    """The fused linear losses with the head weight (H, V) split over V on a 1-D mesh of the 8
    host devices, hidden replicated, float32, reduction 'sum': ``axis_name="vocab"`` inside
    ``shard_map``, plain ``jit`` over a weight sharded by ``NamedSharding``, and two gather
    alternatives (the weight all-gathered, then the unsharded fused loss; the logits formed per
    slice and all-gathered, then ``softmax_cross_entropy``). Collectives inside the loop over row
    blocks (metadata ``while/body``) run once per block: their bytes are counted that many times."""
    from functools import partial

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from dualloss import jax_impl

    n, v = shape
    rows = 256
    blocks = -(-n // rows)
    mesh = Mesh(np.array(jax.devices()), ("vocab",))
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.standard_normal((n, size), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((size, v), dtype=np.float32) / np.sqrt(size))
    y = jnp.asarray(rng.integers(0, v, n))
    fused = jax_impl.linear_softmax_cross_entropy
    specs = (P(), P(None, "vocab"), P())

    @partial(jax.shard_map, mesh=mesh, in_specs=specs, out_specs=P())
    def ours(h, w, y):
        return fused(h, w, y, reduction="sum", chunk_size=rows, axis_name="vocab")

    def plain(h, w, y):
        return fused(h, w, y, reduction="sum", chunk_size=rows)

    @partial(jax.shard_map, mesh=mesh, in_specs=specs, out_specs=P())
    def gather_weight(h, w, y):
        w = jax.lax.all_gather(w, "vocab", axis=1, tiled=True)
        # every device computed the whole loss: counted once (one scalar all-reduce)
        return jax.lax.psum(fused(h, w, y, reduction="sum", chunk_size=rows), "vocab") / 8

    @partial(jax.shard_map, mesh=mesh, in_specs=specs, out_specs=P())
    def gather_logits(h, w, y):
        logits = jax.lax.all_gather(h @ w, "vocab", axis=1, tiled=True)
        value = jax_impl.softmax_cross_entropy(logits, y, reduction="sum")
        return jax.lax.psum(value, "vocab") / 8

    sharded_w = jax.device_put(w, NamedSharding(mesh, P(None, "vocab")))
    print(f"JAX {jax.__version__}, {len(jax.devices())} host devices (1-D vocab mesh), "
          f"N={n}, H={size}, V={v}, float32, reduction='sum', row blocks of {rows}, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print("| program | all-reduced bytes per device | all-gather / reduce-scatter bytes per "
          "device | temp per device | wall |")  # fmt: skip
    print("|---|---|---|---|---|")
    for label, fn in (
        ('`linear_softmax_cross_entropy(axis_name="vocab")` in `shard_map`', ours),
        ("`jit`, the weight sharded over V by `NamedSharding`", plain),
        ("`all_gather` of the weight, then the unsharded fused loss", gather_weight),
        ("logits per slice, `all_gather` of the logits, then `softmax_cross_entropy`",
         gather_logits),
    ):  # fmt: skip
        compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(h, sharded_w, y)
        compiled = compiled.compile()
        moved = {"all-reduce": 0, "other": 0}
        for line in compiled.as_text().splitlines():
            ops = collectives(line)
            times = blocks if "while/body" in line else 1
            for op, (_, size_bytes) in ops.items():
                moved["all-reduce" if op == "all-reduce" else "other"] += size_bytes * times
        memory = compiled.memory_analysis()
        temp = memory.temp_size_in_bytes / 2**20 if memory is not None else float("nan")
        wall = "not run"
        if run:
            jax.block_until_ready(compiled(h, sharded_w, y))
            start = time.perf_counter()
            for _ in range(steps):
                jax.block_until_ready(compiled(h, sharded_w, y))
            wall = f"{(time.perf_counter() - start) / steps:.2f} s"
        reduced, other = (f"{moved[k]:,}".replace(",", " ") for k in ("all-reduce", "other"))
        print(f"| {label} | {reduced} | {other} | {temp:.0f} MiB | {wall} |", flush=True)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shape(text):
    n, c = text.lower().split("x")
    return int(n), int(c)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__)
    parser.add_argument("framework", choices=["jax", "jax-linear", "torch"])
    parser.add_argument("--shape", type=_shape, default=(8192, 32000), help="NxC")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world", type=int, default=4, help="torch: gloo processes")
    parser.add_argument("--hidden", type=int, default=1024, help="jax-linear: H")
    parser.add_argument("--no-run", action="store_true", help="JAX: compile and read only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.framework in ("jax", "jax-linear"):
        if not args.child:
            env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
            env["JAX_PLATFORMS"] = "cpu"
            command = [sys.executable, "-m", "benchmarks.scaling", *(argv or sys.argv[1:])]
            return subprocess.run([*command, "--child"], env=env).returncode
        if args.framework == "jax-linear":
            _jax_linear(args.shape, args.hidden, args.steps, not args.no_run)
        else:
            _jax(args.shape, args.steps, not args.no_run)
        return 0
    import torch.multiprocessing as mp

    mp.spawn(_torch_worker, args=(args.world, _free_port(), args.shape, args.steps),
             nprocs=args.world, join=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
