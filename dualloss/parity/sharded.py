"""The oracle past one device (issue 29 item 4, DESIGN 12 and 14): a vocab-parallel loss called on
the global inputs of an ordinary case, so that every case, the judge, ``minimise`` and the
reproducers of the unsharded oracle apply unchanged.

``shard_classes(candidate, mesh=..., axis_name=...)`` (JAX) or ``shard_classes(candidate,
process_group=...)`` (torch) returns ``f(logits, targets, **kwargs)`` of the global arrays:

* JAX: ``candidate(local_logits, targets, **kwargs)`` runs inside ``jax.shard_map`` over `mesh`
  with the class axis (the last) split over `axis_name` (every other mesh axis replicates), the
  targets global class indices (probability targets and element-wise masks split like the
  logits), class vectors (weight, alpha) global, and the output replicated (``out_specs=P()``:
  a loss that differs between the devices of `axis_name` is refused by shard_map's replication
  check, as in training). A class count that is not a multiple of the axis size is padded with
  -inf classes (probability exactly 0, so the spec's value and gradient are those of the case;
  padded probability targets and masks are 0 / False, class vectors 1): real vocab-parallel code
  pads its vocabulary the same way. Label smoothing spreads over every class, so a padded case
  with label smoothing is left out (``pads_exactly``).
* torch: `candidate(local_logits, targets, **kwargs)` on this rank's contiguous slice of the
  classes (``tensor_split`` over the class dim 1, in rank order; sizes differ by at most one), the
  targets global class indices (probability targets and element-wise masks split like the
  logits). Backward all-reduces the zero-padded slice gradients, so every
  rank holds the whole gradient; the value every rank returns is rank 0's (broadcast), so every
  rank judges the same numbers and takes the same path through the check (it is called on every
  rank; the candidate must raise on all of them or none). Cases with fewer classes than ranks
  are left out.

``run_profile`` is ``dualloss-parity run --sharded``: dualloss's own vocab-parallel paths (JAX
``axis_name=`` on a 1-D and a 2 x 4 mesh and jit over ``NamedSharding`` class-sharded arrays, in
a subprocess with 8 forced host devices; torch ``process_group=`` in 2 and 4 gloo processes and a
DTensor sharded on the class dim) over the softmax losses' cases, each judged against the spec
with the strict standard and compared entry by entry with the unsharded backend on the same
inputs to the same tolerance; and the fused linear losses' sharded paths (``_linear_sharded``:
torch ``process_group=`` on 2 ranks, JAX ``axis_name=`` on 2 host devices) judged with their own
bound (``parity.linear``). Imports no framework at import time.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

import numpy as np

from .. import losses as _registry
from . import backends as B
from .runner import Record, RunResult, evaluate, make_failure, minimise

HOST_DEVICES = 8
# the JAX meshes of the profile: (label, shape, axis names, class axis, how it is called)
JAX_CONFIGS = (
    ("axis_name, mesh 8", (8,), ("vocab",), "shard_map"),
    ("axis_name, mesh 2x4", (2, 4), ("data", "vocab"), "shard_map"),
    ("jit NamedSharding, mesh 2x4", (2, 4), ("data", "vocab"), "jit"),
)
TORCH_WORLDS = (2, 4)
# the losses with a vocab-parallel path: the softmax losses of logits (the records say which)
SHARDED_LOSSES = tuple(n for n in _registry.NAMES if _registry.get(n).is_softmax)


# ----------------------------------------------------------------------------------------------
# The wrappers
# ----------------------------------------------------------------------------------------------


def pads_exactly(case, size: int) -> bool:
    """Whether padding `case`'s classes to a multiple of `size` with -inf classes leaves the spec's
    loss unchanged: always, except label smoothing (spread over every class)."""
    classes = case.logits.shape[-1]
    return classes % size == 0 or not case.options.get("label_smoothing")


def _mesh_axis(mesh, axis_name):
    names = tuple(mesh.axis_names)
    if axis_name is None:
        if len(names) != 1:
            raise ValueError(
                "`axis_name` must name the mesh axis the classes are split over when the mesh "
                f"has several axes. Received: axis_name=None for a mesh with axes {names}."
            )
        return names[0]
    if axis_name not in names:
        raise ValueError(
            f"`axis_name` must be an axis of `mesh` ({', '.join(map(repr, names))}). "
            f"Received: axis_name={axis_name!r}."
        )
    return axis_name


def _shard_jax(candidate, mesh, axis_name):
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    size = mesh.shape[axis_name]

    def f(logits, targets, **kwargs):
        classes = logits.shape[-1]
        extra = -classes % size
        split = P(*([None] * (logits.ndim - 1)), axis_name)

        def pad(a, value):
            if not extra:
                return a
            widths = [(0, 0)] * (a.ndim - 1) + [(0, extra)]
            return jnp.pad(a, widths, constant_values=value)

        index = jnp.issubdtype(targets.dtype, jnp.integer)
        logits = pad(logits, -jnp.inf)
        targets = targets if index else pad(targets, 0)
        specs = [split, P() if index else split]
        names, values, value_specs = [], [], []
        for name, value in kwargs.items():
            if isinstance(value, jax.Array) and value.shape[-1:] == (classes,):
                if value.ndim == logits.ndim:  # an element-wise mask or weight
                    values.append(pad(value, False if value.dtype == jnp.bool_ else 0))
                    value_specs.append(split)
                else:  # a class vector: global, every device holds it
                    values.append(pad(value, 1))
                    value_specs.append(P())
                names.append(name)
        static = {k: v for k, v in kwargs.items() if k not in names}

        def local(x, t, *arrays):
            return candidate(x, t, **static, **dict(zip(names, arrays, strict=True)))

        call = jax.shard_map(
            local, mesh=mesh, in_specs=(*specs, *value_specs), out_specs=P()
        )  # fmt: skip
        return call(logits, targets, *values)

    return f


def _torch_functions():
    """The two autograd functions of the torch wrapper (defined on first use: no torch import
    at module import)."""
    import torch
    import torch.distributed as dist

    class ClassSlice(torch.autograd.Function):
        """This rank's classes of the global tensor; backward puts the slice's gradient in place
        and all-reduces, so every rank holds the whole gradient."""

        @staticmethod
        def forward(ctx, full, start, stop, group):
            ctx.shape, ctx.span, ctx.group = full.shape, (start, stop), group
            return full[:, start:stop].clone()

        @staticmethod
        def backward(ctx, grad):
            start, stop = ctx.span
            whole = torch.zeros(ctx.shape, dtype=torch.float64, device=grad.device)
            whole[:, start:stop] = grad.to(torch.float64)
            dist.all_reduce(whole, group=ctx.group)
            return whole.to(grad.dtype), None, None, None

    class RankZero(torch.autograd.Function):
        """Rank 0's value on every rank (each rank's own gradient flows back unchanged)."""

        @staticmethod
        def forward(ctx, value, group):
            out = value.detach().to(torch.float64).clone()
            dist.broadcast(out, src=dist.get_global_rank(group, 0), group=group)
            return out.to(value.dtype)

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    return ClassSlice, RankZero


def _shard_torch(candidate, group, dtensor=False):
    import torch
    import torch.distributed as dist

    ClassSlice, RankZero = _torch_functions()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if dtensor:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        device_mesh = init_device_mesh("cpu", (world,))

    def f(logits, targets, **kwargs):
        classes = logits.shape[1]
        bounds = np.cumsum([0] + [len(s) for s in np.array_split(np.arange(classes), world)])
        start, stop = int(bounds[rank]), int(bounds[rank + 1])
        x = ClassSlice.apply(logits, start, stop, group)
        if targets.is_floating_point() and targets.shape == logits.shape:
            targets = ClassSlice.apply(targets, start, stop, group)
        given = {}
        for name, value in kwargs.items():
            elementwise = isinstance(value, torch.Tensor) and value.shape == logits.shape
            given[name] = value[:, start:stop] if elementwise else value
        if dtensor:
            # torch.chunk's slices, which DTensor's Shard(1) requires: tensor_split's for 2 ranks
            shape = (x.shape[0], classes, *x.shape[2:])
            x = DTensor.from_local(x, device_mesh, [Shard(1)], run_check=False, shape=shape,
                                   stride=torch.empty(shape).stride())  # fmt: skip
        out = candidate(x, targets, **given)
        if dtensor:
            out = out.to_local()
        if not isinstance(out, torch.Tensor):
            out = torch.as_tensor(out)
        return RankZero.apply(out, group)

    return f


def shard_classes(candidate, *, mesh=None, axis_name=None, process_group=None):
    """`candidate`, a loss of this device's (or rank's) slice of the classes, as a function of the
    global logits and targets: ``f(logits, targets, **kwargs)`` (see the module docstring for
    what each device or rank receives). Give `mesh` (and `axis_name` when it has several axes)
    for JAX, `process_group` for torch (call it on every rank)."""
    if (mesh is None) == (process_group is None):
        raise ValueError(
            "`mesh` (JAX) or `process_group` (torch) must be given, not both. Received: "
            f"mesh={mesh!r}, process_group={process_group!r}."
        )
    if mesh is not None:
        return _shard_jax(candidate, mesh, _mesh_axis(mesh, axis_name))
    return _shard_torch(candidate, process_group)


# ----------------------------------------------------------------------------------------------
# check(..., mesh=) / check(..., process_group=): the implementation and its reproducer
# ----------------------------------------------------------------------------------------------


def jax_mesh_setup(mesh) -> str:
    """Python that builds a mesh of `mesh`'s shape and axis names on forced host devices (the
    reproducers' head: it must run before jax is imported)."""
    shape = tuple(mesh.devices.shape)
    return (
        f"import os; os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count="
        f"{mesh.size}'; import numpy as np; import jax; "
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P; "
        f"mesh = Mesh(np.array(jax.devices()[:{mesh.size}]).reshape({shape}), "
        f"{tuple(mesh.axis_names)!r})"
    )


def sharded_implementation(impl: B.Implementation, call: str, *, mesh=None, axis_name=None,
                           process_group=None) -> tuple[B.Implementation, Any, str]:  # fmt: skip
    """(the implementation calling ``shard_classes(impl.fn, ...)``, the device object for
    ``backends.run_case``, a label): what ``check`` judges when given a mesh or a group."""
    from dataclasses import replace

    if mesh is not None:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        axis_name = _mesh_axis(mesh, axis_name)
        size = mesh.shape[axis_name]
        fn = _shard_jax(impl.fn, mesh, axis_name)
        where = f"mesh=mesh, axis_name={axis_name!r}"
        device = NamedSharding(mesh, P())
        label = f"mesh {'x'.join(map(str, mesh.devices.shape))} ({axis_name!r})"

        def supports(prep):
            return pads_exactly(prep.case, size) and impl.supports(prep)
    else:
        import torch.distributed as dist

        fn = _shard_torch(impl.fn, process_group)
        world = dist.get_world_size(process_group)
        where = "process_group=group"
        device = "cpu"
        label = f"{world} ranks"

        def supports(prep):
            return prep.case.logits.shape[-1] >= world and impl.supports(prep)

    partial = "from functools import partial" if call.startswith("partial(") else ""
    imports = "; ".join(
        i for i in (impl.imports, partial, "from dualloss.parity import shard_classes") if i
    )
    return replace(
        impl, fn=fn, supports=supports, imports=imports,
        expr=lambda kw: f"shard_classes({call}, {where})(x, t{B.format_kwargs(kw)})",
    ), device, label  # fmt: skip


def sharded_reproducer(line: str, *, mesh=None, world=None) -> str:
    """A reproducer of the unsharded oracle made to run sharded: JAX, on a mesh like `mesh` of
    forced host devices; torch, on every rank of a group."""
    if mesh is not None:
        head = jax_mesh_setup(mesh)
        # the inputs uncommitted (device=None): jit puts them on the mesh
        old = "import jax, jax.numpy as jnp; d = jax.devices('cpu')[0]"
        line = line.replace(old, f"{head}; import jax.numpy as jnp; d = None")
        return line
    return (
        f"on each of {world} ranks (torchrun --nproc-per-node={world}), after "
        "torch.distributed.init_process_group('gloo') and group = torch.distributed.group.WORLD: "
        + line
    )


# ----------------------------------------------------------------------------------------------
# The profile: dualloss-parity run --sharded
# ----------------------------------------------------------------------------------------------


# the LLM head options (DESIGN 13) the sharded paths take: each case of these regions is judged a
# second time with them (a cap below the typical regions' logits, so that it bites)
HEAD_OPTIONS = {"z_loss": 1e-3, "softcap": 8.0}
HEAD_REGIONS = ("typical", "confident_correct", "confident_wrong", "masked", "where", "ignored")


def _cases(losses, dtypes, level, regions):
    """The oracle's cases, then those of ``HEAD_REGIONS`` again with ``HEAD_OPTIONS``."""
    from dataclasses import replace

    from .cases import make_cases

    for loss in losses:
        for dtype in dtypes:
            cases = make_cases(loss, dtype, level=level, regions=regions)
            for case in cases:
                yield loss, dtype, case
            for case in cases:
                if case.region in HEAD_REGIONS:
                    label = f"{case.label} z_loss softcap"
                    options = {**case.options, **HEAD_OPTIONS}
                    yield loss, dtype, replace(case, label=label, options=options)


def _compare(prep, outcome, unsharded, judgement, name) -> list[str]:
    """The sharded result against the unsharded backend's on the same inputs: the same finite
    pattern, and every entry within the strict tolerance of the spec's judgement."""
    if unsharded.error is not None:
        return [f"unsharded {name} raised {unsharded.error}"]
    problems = []
    for what, ours, theirs, tolerance in (
        ("value", outcome.value, unsharded.value, judgement.value_tolerance),
        ("gradient", outcome.grad, unsharded.grad, judgement.grad_tolerance),
    ):
        ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
        if ours.shape != theirs.shape:
            problems.append(f"{what} of shape {ours.shape}, unsharded {name} {theirs.shape}")
            continue
        if not np.array_equal(np.isfinite(ours), np.isfinite(theirs)):
            problems.append(f"{what}: not finite where unsharded {name}'s is, or the reverse")
            continue
        finite = np.isfinite(theirs)
        gap = np.abs(ours - theirs)[finite]
        bound = np.broadcast_to(np.asarray(tolerance, np.float64), theirs.shape)[finite]
        if np.any(gap > bound):
            worst = float(np.max(gap / np.maximum(bound, 1e-300)))
            problems.append(
                f"{what} differs from unsharded {name} by {worst:.3g} x the strict tolerance"
            )
    return problems


def _judge_all(impl, unsharded, label, losses, dtypes, level, regions, device, mode, lead,
               reproduce, release=lambda: None):  # fmt: skip
    """Records and failures of `impl(loss)` for each loss, each case it supports; `lead` is
    whether this process keeps them (torch: rank 0); `reproduce` rewrites a reproducer;
    `release` is called after each loss and dtype (JAX: drop the compiled programs)."""
    records, failures, left_out = [], [], 0
    # one implementation per loss: its function's identity keys the compiled-function cache
    impls = {loss: impl(loss) for loss in losses}
    theirs_by = {loss: unsharded(loss) for loss in losses}
    current = None
    for loss, dtype, case in _cases(losses, dtypes, level, regions):
        if (loss, dtype) != current:
            release()
            current = (loss, dtype)
        sharded = impls[loss]
        prep = B.prepare(case, dtype)
        kind, judgement, outcome = evaluate(sharded, prep, device, mode == "jit")
        if kind == "skipped":
            left_out += 1
            continue
        record = Record(loss, sharded.name, sharded.backend, label, mode, dtype, case.region,
                        case.name, kind, margin=case.margin, gamma=case.gamma)  # fmt: skip
        problems = []
        if judgement is not None:
            record.value_ulp = judgement.worst_value_ulp
            record.grad_ulp = judgement.worst_grad_ulp
            record.ratio = judgement.worst_ratio
            them = theirs_by[loss]
            theirs = B.run_case(them, prep, _cpu_device(them), mode == "jit")
            problems = _compare(prep, outcome, theirs, judgement, them.name)
            if problems and kind == "ok":
                record.kind = kind = "accuracy"
        records.append(record)
        if kind != "ok":
            if problems:
                failure = make_failure(sharded, prep, "cpu", mode, kind, judgement, outcome)
                failure.problems = problems + failure.problems
            else:
                small, small_j, small_o = minimise(sharded, prep, device, mode == "jit", kind)
                if small_o is None:
                    small, small_j, small_o = prep, judgement, outcome
                failure = make_failure(sharded, small, "cpu", mode, kind, small_j, small_o)
            # the reproducer's device is the CPU (a mesh or ranks of it); the report names both
            failure.device = label
            failure.reproducer = reproduce(failure.reproducer)
            failures.append(failure)
    return (records, failures, left_out) if lead else ([], [], left_out)


def _cpu_device(impl):
    """The unsharded backend's device: the CPU."""
    if impl.backend == "jax":
        import jax

        return jax.devices("cpu")[0]
    return "cpu"


def _release_jax():
    """Drops every compiled program: thousands of 8-device CPU executables exhaust the process's
    memory maps (LLVM: 'Cannot allocate memory') before the profile ends."""
    import jax

    B._compiled_cache.clear()
    jax.clear_caches()


def _jax_child(out_path, losses, dtypes, level, regions):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = np.array(jax.devices())
    records, failures, notes = [], [], []
    for label, shape, names, how in JAX_CONFIGS:
        mesh = Mesh(devices[: int(np.prod(shape))].reshape(shape), names)
        size = mesh.shape["vocab"]

        def impl(loss, mesh=mesh, how=how, label=label, size=size):
            ours = B.ours("jax", loss)
            if how == "shard_map":
                # the class axis split over `vocab`: jax_impl's own axis_name= inside shard_map
                def local(x, t, _fn=ours.fn, **kwargs):
                    return _fn(x, t, axis_name="vocab", **kwargs)

                local.__name__ = loss
                sharded, _, _ = sharded_implementation(
                    ours, f"partial(jax_impl.{loss}, axis_name='vocab')", mesh=mesh,
                    axis_name="vocab",
                )  # fmt: skip
                sharded.fn = _shard_jax(local, mesh, "vocab")
            else:
                from dataclasses import replace

                def constrained(x, t, _fn=ours.fn, **kwargs):
                    # the logits sharded over the class axis: XLA's partitioner does the rest
                    # (a class count not a multiple of the axis: XLA pads the last slice)
                    spec = P(*([None] * (x.ndim - 1)), "vocab")
                    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
                    return _fn(x, t, **kwargs)

                sharded = replace(ours, fn=constrained)
            sharded.name = f"jax_impl[{label}]"
            return sharded

        got, lost, left_out = _judge_all(
            impl, lambda loss: B.ours("jax", loss), f"cpu x{mesh.size}", losses, dtypes, level,
            regions, NamedSharding(mesh, P()), "jit", True,
            lambda line, mesh=mesh: sharded_reproducer(line, mesh=mesh), _release_jax,
        )  # fmt: skip
        records += got
        failures += lost
        if left_out:
            notes.append(
                f"jax_impl[{label}]: {left_out} cases with label smoothing and a class count "
                f"not a multiple of {size} left out (padding would change them)"
            )
    with open(out_path, "wb") as handle:
        pickle.dump((records, failures, notes), handle)


def _torch_worker(rank, world, port, out_dir, losses, dtypes, level, regions):
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = None
    try:
        group = dist.group.WORLD
        records, failures, notes = [], [], []
        for how in ("process_group", "DTensor") if world == 2 else ("process_group",):
            name = f"torch_impl[{how}, {world} ranks]"

            def impl(loss, how=how, name=name):
                ours = B.ours("torch", loss)
                extra = {"process_group": group} if how == "process_group" else {}

                def local(x, t, _fn=ours.fn, _extra=extra, **kwargs):
                    return _fn(x, t, **_extra, **kwargs)

                call = f"partial(torch_impl.{loss}{', process_group=group' * bool(extra)})"
                sharded, _, _ = sharded_implementation(ours, call, process_group=group)
                sharded.fn = _shard_torch(local, group, dtensor=how == "DTensor")
                sharded.name = name
                return sharded

            got, lost, left_out = _judge_all(
                impl, lambda loss: B.ours("torch", loss), f"cpu x{world}", losses, dtypes, level,
                regions, "cpu", "eager", rank == 0,
                lambda line: sharded_reproducer(line, world=world),
            )  # fmt: skip
            records += got
            failures += lost
            if left_out and rank == 0:
                notes.append(f"{name}: {left_out} cases left out: fewer than {world} "
                             "classes")  # fmt: skip
        result = (records, failures, notes)
    except BaseException:  # noqa: BLE001 - handed to the parent, which reports it
        result = ([], [], [f"torch rank {rank} of {world} crashed: {traceback.format_exc()}"])
    if rank == 0:
        with open(os.path.join(out_dir, f"torch{world}.pkl"), "wb") as handle:
            pickle.dump(result, handle)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_profile(backends, dtypes, losses, regions, level="quick") -> RunResult:
    """``dualloss-parity run --sharded``: see the module docstring."""
    started = time.monotonic()
    linear = [loss for loss in losses if loss in LINEAR_SHARDED_LOSSES]
    losses = [loss for loss in losses if loss in SHARDED_LOSSES]
    result = RunResult(config={
        "profile": "sharded", "implementations": [], "dtypes": list(dtypes),
        "devices": ["cpu"], "level": level, "losses": losses,
    })  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as out_dir:
        if "jax" in backends:
            env = dict(os.environ, JAX_PLATFORMS="cpu")
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={HOST_DEVICES}"
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
            path = os.path.join(out_dir, "jax.pkl")
            code = (
                "import json, sys; from dualloss.parity import sharded; "
                "sharded._jax_child(sys.argv[1], *json.loads(sys.argv[2]))"
            )

            import json

            arguments = json.dumps([losses, list(dtypes), level, regions])
            child = subprocess.run([sys.executable, "-c", code, path, arguments], env=env,
                                   capture_output=True, text=True)  # fmt: skip
            _merge(result, path, "jax_impl (8 host devices)", child)
        if "torch" in backends:
            import torch.multiprocessing as mp

            for world in TORCH_WORLDS:
                path = os.path.join(out_dir, f"torch{world}.pkl")
                try:
                    arguments = (world, _free_port(), out_dir, losses, list(dtypes), level, regions)
                    mp.spawn(_torch_worker, nprocs=world, join=True, args=arguments)
                except Exception as error:  # noqa: BLE001 - reported as not tested
                    result.untested.append(f"torch_impl on {world} gloo ranks: {error}")
                    continue
                _merge(result, path, f"torch_impl on {world} gloo ranks", None)
    _linear_sharded(result, backends, dtypes, linear, regions, root)
    result.config["implementations"] = sorted({r.impl for r in result.records})
    result.seconds = time.monotonic() - started
    return result


def _merge(result: RunResult, path: str, what: str, child) -> None:
    """Adds what a child (a JAX subprocess or rank 0 of a gloo world) pickled to `path`:
    (records, failures, notes), the notes that say it crashed listed as untested; a child that
    wrote nothing is untested, with the tail of its output."""
    if not os.path.exists(path):
        tail = "" if child is None else (child.stderr or child.stdout)[-2000:]
        result.untested.append(f"{what}: the process wrote no results. {tail}")
        return
    with open(path, "rb") as handle:
        records, failures, notes = pickle.load(handle)
    crashed = [n for n in notes if " crashed: " in n]
    result.untested += crashed
    result.notes += [n for n in notes if n not in crashed]
    result.records += records
    result.failures += failures


# ----------------------------------------------------------------------------------------------
# The fused linear losses split over V: torch process_group= (2 ranks), JAX axis_name=
# ----------------------------------------------------------------------------------------------

LINEAR_SHARDED_LOSSES = _registry.LINEAR_NAMES
# (N, H, V): V even (shard_map's slices are even; torch's 2 ranks take the same halves), N not a
# multiple of the chunk sizes (a partial last block of rows)
LINEAR_SHAPE = (45, 16, 96)
LINEAR_WORLD = 2
# per loss family, (options, reduction): the plain loss, then class weights / alpha with the LLM
# head options (DESIGN 13) and, for the cross entropy, label smoothing ("vector": a ramp)
LINEAR_PLANS = {
    "cross_entropy": (
        ({"chunk_size": 16}, "mean"),
        ({"weight": "vector", "label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 8.0,
          "chunk_size": 11}, "none"),
    ),
    "focal": (
        ({"gamma": 2.0, "chunk_size": 16}, "mean"),
        ({"gamma": 0.5, "alpha": "vector", "z_loss": 1e-3, "softcap": 8.0, "chunk_size": 11},
         "none"),
    ),
}  # fmt: skip


def _linear_sharded(result, backends, dtypes, losses, regions, root) -> None:
    """The fused linear losses' own sharded paths, added to `result`: torch ``process_group=``
    on 2 gloo ranks (each rank holds half of the weight's rows and of the bias) and JAX
    ``axis_name=`` inside ``shard_map`` over 2 host devices (half of the kernel's columns), on
    the fused losses' regions (those of their own shape left out) at (N, H, V) =
    ``LINEAR_SHAPE``, with ``LINEAR_PLANS``' options. Each call is judged against the spec with
    the fused losses' own strict bound (``parity.linear.judge``) and compared entry by entry
    with the unsharded backend on the same inputs, to the same per-entry tolerance."""
    from . import linear as L

    losses = [loss for loss in losses if loss in LINEAR_SHARDED_LOSSES]
    chosen = [r for r in (regions or L.REGIONS) if r in L.REGIONS and r not in L.OWN_SHAPE]
    if not losses or not chosen:
        return
    import json

    with tempfile.TemporaryDirectory() as out_dir:
        outcomes = []
        if "jax" in backends:
            env = dict(os.environ, JAX_PLATFORMS="cpu")
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LINEAR_WORLD}"
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
            path = os.path.join(out_dir, "linear_jax.pkl")
            arguments = json.dumps(["jax", 0, list(dtypes), losses, chosen, path, 0])
            code = (
                "import json, sys; from dualloss.parity import sharded; "
                "sharded._linear_child(*json.loads(sys.argv[1]))"
            )
            child = subprocess.run([sys.executable, "-c", code, arguments], env=env,
                                   capture_output=True, text=True)  # fmt: skip
            outcomes.append((path, "jax_impl fused linear (axis_name, 2 host devices)", child))
        if "torch" in backends:
            import torch.multiprocessing as mp

            path = os.path.join(out_dir, "linear_torch.pkl")
            arguments = ("torch", list(dtypes), losses, chosen, path, _free_port())
            try:
                mp.spawn(_linear_torch_rank, nprocs=LINEAR_WORLD, join=True, args=arguments)
            except Exception as error:  # noqa: BLE001 - reported as not tested
                result.untested.append(f"torch_impl fused linear on 2 gloo ranks: {error}")
            outcomes.append((path, "torch_impl fused linear (process_group, 2 ranks)", None))
        for path, what, child in outcomes:
            _merge(result, path, what, child)


def _linear_torch_rank(rank, backend, dtypes, losses, chosen, path, port):
    """A gloo rank of ``_linear_sharded`` (``torch.multiprocessing.spawn`` passes the rank)."""
    _linear_child(backend, rank, dtypes, losses, chosen, path, port)


def _linear_child(backend, rank, dtypes, losses, chosen, path, port):
    """``_linear_sharded``'s judging, in the JAX child or on each torch rank: (records,
    failures, crashes) pickled to `path` by rank 0 (every rank judges the same numbers)."""
    from . import linear as L

    n, h, v = LINEAR_SHAPE
    records, failures, crashed = [], [], []
    label = f"cpu x{LINEAR_WORLD}"
    try:
        if backend == "torch":
            import torch
            import torch.distributed as dist

            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            dist.init_process_group("gloo", rank=rank, world_size=LINEAR_WORLD)
            group = dist.group.WORLD
            ClassSlice, _ = _torch_functions()
            from .. import torch_impl as module

            impl, mode = f"torch_impl[process_group, {LINEAR_WORLD} ranks]", "eager"
            device = "cpu"
            start, stop = rank * v // LINEAR_WORLD, (rank + 1) * v // LINEAR_WORLD

            def sharded(loss, options, reduction):
                fn = getattr(module, loss)

                def candidate(hidden, linear_weight, targets, bias=None):
                    # this rank's rows of the (V, H) weight and of the bias; backward puts each
                    # slice's gradient in place and all-reduces (every rank the whole gradient)
                    w = ClassSlice.apply(linear_weight.T, start, stop, group).T
                    b = ClassSlice.apply(bias[None, :], start, stop, group)[0]
                    kw = {k: torch.tensor(x).to(hidden.dtype) if isinstance(x, np.ndarray) else x
                          for k, x in options.items()}  # fmt: skip
                    return fn(hidden, w, targets, bias=b, reduction=reduction,
                              process_group=group, **kw)  # fmt: skip

                return candidate
        else:
            import jax
            import jax.numpy as jnp
            from jax.sharding import Mesh, NamedSharding
            from jax.sharding import PartitionSpec as P

            from .. import jax_impl as module

            mesh = Mesh(np.array(jax.devices()[:LINEAR_WORLD]), ("vocab",))
            impl, mode = f"jax_impl[axis_name, mesh {LINEAR_WORLD}]", "jit"
            # the inputs replicated over the mesh: shard_map takes each device's slice
            device = NamedSharding(mesh, P())

            def sharded(loss, options, reduction):
                fn = getattr(module, loss)

                def candidate(hidden, linear_weight, targets, bias=None):
                    kw = {k: jnp.asarray(x, hidden.dtype) if isinstance(x, np.ndarray) else x
                          for k, x in options.items()}  # fmt: skip

                    def local(hh, ww, tt, bb):
                        # the kernel's columns and the bias split over `vocab`, the rest global
                        return fn(hh, ww, tt, bias=bb, reduction=reduction, axis_name="vocab",
                                  **kw)  # fmt: skip

                    specs = (P(), P(None, "vocab"), P(), P("vocab"))
                    call = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P())
                    return call(hidden, linear_weight, targets, bias)

                return candidate

        for loss in losses:
            plans = LINEAR_PLANS["focal" if _registry.get(loss).is_focal else "cross_entropy"]
            for options, reduction in plans:
                values = L.option_values(options, v)
                for dtype in dtypes:
                    fn = sharded(loss, values, reduction)
                    one = L.ours(backend, loss, values, reduction)
                    for region in chosen:
                        hidden, kernel, bias, targets = L.region_inputs(region, n, h, v)
                        case = L.LinearCase(loss, region, f"{n}x{h}x{v}", hidden, kernel, bias,
                                            targets.astype(np.int64), dict(values))  # fmt: skip
                        prep = L.prepare(case, dtype)
                        prep.options["reduction"] = reduction
                        jit = mode == "jit"
                        kind, judgement, outcome = L.evaluate(fn, backend, loss, prep, device, jit)
                        problems = [outcome.error] if judgement is None else judgement.problems
                        if judgement is not None:
                            # the unsharded fused loss on the same inputs, the same tolerance
                            theirs = L.run(one, backend, prep, "cpu", jit)
                            want = judgement.expected
                            tol = L.tolerances(loss, prep, want, "strict")
                            for what in want if theirs.error is None else ():
                                ours = np.asarray(judgement.received[what], np.float64)
                                other = theirs.value if what == "value" else theirs.grads[what]
                                other = np.asarray(other, np.float64)
                                gap = np.abs(ours - other)
                                if dtype in L.HALF:
                                    # each side is its float32 result rounded once to the half
                                    # dtype: one ulp of it apart where those straddle a tie
                                    gap = gap - 2.0 * L.UNIT_ROUNDOFF[dtype] * np.abs(other)
                                if not np.all(gap <= tol[what]):
                                    problems.append(f"{L._label(what)} differs from the "
                                                    "unsharded backend's beyond the strict "
                                                    "tolerance")  # fmt: skip
                                    kind = "accuracy" if kind == "ok" else kind
                            if theirs.error is not None:
                                problems.append(f"the unsharded backend raised {theirs.error}")
                        records.append(Record(
                            loss, impl, backend, label, mode, dtype, region,
                            f"{case.name} {L._plain(options)} {reduction}", kind,
                            ratio=0.0 if judgement is None else judgement.ratio,
                            gamma=float(options.get("gamma", 0.0)),
                        ))  # fmt: skip
                        if kind != "ok":
                            failures.append(L.LinearFailure(
                                kind, loss, impl, backend, label, mode, dtype, case.name,
                                problems, dict(prep.options), n,
                                {} if judgement is None else judgement.expected,
                                {} if judgement is None else judgement.received,
                                f"dualloss-parity run --sharded --backends {backend} --losses "
                                f"{loss} --regions {region} --dtypes {dtype}",
                            ))  # fmt: skip
    except BaseException:  # noqa: BLE001 - handed to the parent, which reports it
        crashed.append(f"{backend} fused linear, rank {rank} crashed: {traceback.format_exc()}")
    if rank == 0:
        with open(path, "wb") as handle:
            pickle.dump((records, failures, crashed), handle)
    if backend == "torch":
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
