"""Vocab-parallel softmax losses over ``torch.distributed`` (issue 29 item 2, DESIGN 12): logits
split over the class axis, ``process_group=`` with global targets, and a DTensor sharded on the
class dim, in 2 and 4 gloo processes on the CPU.

Each world runs once (a module fixture, ``torch.multiprocessing.spawn``): every rank computes
every case on its slice (uneven sizes, one of a single class) and hands back its loss, its
slice's gradient and the collectives it issued. Here the slices are put together and judged:

* against the spec, to the strict standard (``dualloss.parity.tolerance.judge``), in float64,
  float32 and bfloat16 (computed in float32), with ignored rows, all rows ignored, confident rows
  (loss ~1e-26, which the log1p form keeps), ties split over ranks, -inf classes (a whole rank's
  slice among them), class weights and alpha, every reduction and a normalizer;
* against unsharded ``torch_impl`` on the same inputs, to the same per-entry tolerance;
* by the collectives themselves: every ``all_gather``-like call (and broadcast, scatter,
  all_to_all) raises in the workers, and a forward + backward issues exactly three all-reduces:
  the slice sizes (one number per rank), the row max (N numbers) and the row sums (2N).
"""

from __future__ import annotations

import os
import socket
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

from dualloss import torch_impl as ti  # noqa: E402
from dualloss.parity.tolerance import judge  # noqa: E402

N, C = 9, 13
# uneven slices, one of a single class; the DTensor cases use torch.chunk's slices instead
SIZES = {2: [4, 9], 4: [3, 5, 1, 4]}
LOSSES = {
    "ce": ("softmax_cross_entropy", {}),
    "ce_weight": ("softmax_cross_entropy", {"weight": "vector"}),
    "focal": ("softmax_focal_loss", {"gamma": 2.0}),
    "focal_alpha": ("softmax_focal_loss", {"gamma": 0.5, "alpha": "vector"}),
}
REDUCTIONS = {
    "mean": {"reduction": "mean"},
    "sum": {"reduction": "sum"},
    "none": {"reduction": "none"},
    "normalizer": {"reduction": "mean", "normalizer": 5.0},
}
ROWS = ("mixed", "all_ignored")
DTYPES = ("float64", "float32", "bfloat16")
CASES = [
    (loss, reduction, rows, dtype)
    for loss in LOSSES
    for reduction in REDUCTIONS
    for rows in ROWS
    for dtype in DTYPES
]
DTENSOR_CASES = [("ce", "mean", "mixed", "float32"), ("focal_alpha", "sum", "mixed", "float64")]
FORBIDDEN = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "gather",
    "broadcast",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
)


def _inputs(rows):
    """Global float64 logits (N, C) and targets; the rows sit on rank boundaries of SIZES[4]
    (classes 0-2 | 3-7 | 8 | 9-12)."""
    rng = np.random.default_rng(29)
    logits = rng.normal(size=(N, C)) * 3.0
    targets = rng.integers(0, C, size=N)
    targets[1] = -100  # ignored (its logits are garbage that must not leak)
    logits[1, 4] = np.inf
    logits[2, 3] += 60.0  # confident and right: loss ~ 12 exp(-60), on rank 1's first class
    targets[2] = 3
    logits[3, [0, 1, 2, 8, 11]] = -np.inf  # -inf classes: all of rank 0's and rank 2's slice
    targets[3] = 9
    logits[4, 12] += 40.0  # confident and wrong: the max on the last rank, the target on rank 0
    targets[4] = 0
    logits[5, [2, 10]] = 7.5  # a tie at the top across ranks, the target one of the two
    targets[5] = 10
    logits[6, 8] += 30.0  # confident and right on the single-class rank
    targets[6] = 8
    if rows == "all_ignored":
        targets[:] = -100
    return logits, targets


def _options(loss, reduction):
    name, options = LOSSES[loss]
    options = {**options, **REDUCTIONS[reduction]}
    for key, value in options.items():
        if value == "vector":
            options[key] = np.linspace(0.2, 1.0, C)
    return name, options


def _torch_options(options, dtype):
    return {
        key: torch.tensor(value, dtype=dtype) if isinstance(value, np.ndarray) else value
        for key, value in options.items()
    }


def _call(name, logits, targets, options, **extra):
    """(value, gradient) of one call; 'none' differentiates the sum of the elements."""
    loss = getattr(ti, name)(logits, targets, **options, **extra)
    total = loss.sum() if options["reduction"] == "none" else loss
    total.backward()
    return loss


# ----------------------------------------------------------------------------------------------
# The workers
# ----------------------------------------------------------------------------------------------


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"torch.distributed.{name} called: no row may be gathered")

    return refuse


def _worker(rank, world, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {"cases": {}, "dtensor": {}, "errors": {}}
    try:
        _worker_cases(rank, world, results)
    except BaseException:  # noqa: BLE001 (handed to the parent, which fails with it)
        results["crash"] = traceback.format_exc()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _worker_cases(rank, world, results):
    sizes = SIZES[world]
    start = sum(sizes[:rank])
    calls = []
    all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append((str(op).rsplit(".", 1)[-1], tensor.numel()))
        return all_reduce(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = counting_all_reduce
    for name in FORBIDDEN:
        if hasattr(dist, name):
            setattr(dist, name, _refuse(name))
    for case in CASES:
        loss, reduction, rows, dtype_name = case
        dtype = getattr(torch, dtype_name)
        name, options = _options(loss, reduction)
        logits, targets = _inputs(rows)
        local = torch.tensor(logits[:, start : start + sizes[rank]], dtype=dtype)
        local.requires_grad_(True)
        del calls[:]
        value = _call(
            name, local, torch.tensor(targets), _torch_options(options, dtype),
            process_group=dist.group.WORLD,
        )  # fmt: skip
        results["cases"][case] = (
            value.detach().double().numpy(),
            local.grad.double().numpy(),
            list(calls),
        )
    _worker_dtensor(rank, world, results)
    _worker_errors(rank, world, results)


def _worker_dtensor(rank, world, results):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    chunks = [len(c) for c in torch.arange(C).chunk(world)]
    start = sum(chunks[:rank])
    for case in DTENSOR_CASES:
        loss, reduction, rows, dtype_name = case
        dtype = getattr(torch, dtype_name)
        name, options = _options(loss, reduction)
        logits, targets = _inputs(rows)
        local = torch.tensor(logits[:, start : start + chunks[rank]], dtype=dtype)
        local.requires_grad_(True)
        sharded = DTensor.from_local(
            local, mesh, [Shard(1)], run_check=False, shape=(N, C), stride=(C, 1)
        )
        value = _call(name, sharded, torch.tensor(targets), _torch_options(options, dtype))
        results["dtensor"][case] = (
            type(value).__name__,
            [p.is_replicate() for p in value.placements],
            value.to_local().detach().numpy(),
            local.grad.numpy(),
        )


def _worker_errors(rank, world, results):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    sizes = SIZES[world]
    local = torch.zeros(N, sizes[rank])
    logits, targets = _inputs("mixed")
    attempts = {
        # 12 is a class of the last rank's slice: out of every other slice, but in range
        "in_range": lambda: ti.softmax_cross_entropy(
            local, torch.full((N,), C - 1), process_group=dist.group.WORLD
        ),
        "out_of_range": lambda: ti.softmax_cross_entropy(
            local, torch.full((N,), C), process_group=dist.group.WORLD
        ),
        "weight_length": lambda: ti.softmax_cross_entropy(
            local,
            torch.tensor(targets),
            weight=torch.ones(sizes[rank]),
            process_group=dist.group.WORLD,
        ),  # fmt: skip
        "group_type": lambda: ti.softmax_focal_loss(
            local, torch.tensor(targets), process_group="world"
        ),
        "probabilities": lambda: ti.softmax_cross_entropy(
            local, torch.full((N, sizes[rank]), 0.1), process_group=dist.group.WORLD
        ),
        "label_smoothing": lambda: ti.softmax_cross_entropy(
            local, torch.tensor(targets), label_smoothing=0.1, process_group=dist.group.WORLD
        ),
        "replicated_dtensor": lambda: ti.softmax_cross_entropy(
            DTensor.from_local(
                torch.zeros(N, C), init_device_mesh("cpu", (world,)), [Replicate()], run_check=False
            ),
            torch.tensor(targets),
        ),  # fmt: skip
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            results["errors"][what] = None
        except (TypeError, ValueError) as error:
            results["errors"][what] = (type(error).__name__, str(error))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=sorted(SIZES))
def world(request, tmp_path_factory):
    """{rank: results} of one spawned gloo world of `request.param` processes."""
    size = request.param
    out_dir = str(tmp_path_factory.mktemp(f"world{size}"))
    mp.spawn(_worker, args=(size, _free_port(), out_dir), nprocs=size, join=True)
    ranks = {
        r: torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(size)
    }
    for rank, results in ranks.items():
        assert "crash" not in results, f"rank {rank}:\n{results['crash']}"
    return size, ranks


# ----------------------------------------------------------------------------------------------
# The judgements
# ----------------------------------------------------------------------------------------------


def _gathered(ranks, key, case):
    """The value (rank 0's, after checking every rank has the same) and the full gradient."""
    values = [ranks[r][key][case][0] for r in sorted(ranks)]
    for rank, value in enumerate(values):
        np.testing.assert_array_equal(value, values[0], err_msg=f"rank {rank}'s loss")
    grad = np.concatenate([ranks[r][key][case][1] for r in sorted(ranks)], axis=1)
    return values[0], grad


def _judge_against_spec_and_unsharded(case, value, grad, context):
    loss, reduction, rows, dtype_name = case
    dtype = getattr(torch, dtype_name)
    name, options = _options(loss, reduction)
    logits, targets = _inputs(rows)
    # the inputs the candidate saw: float32 rounding is exact in float64
    seen = torch.tensor(logits, dtype=dtype).double().numpy()
    # and the class vectors it saw, rounded to its dtype like the logits
    seen_options = {
        key: torch.tensor(value, dtype=dtype).double().numpy()
        if isinstance(value, np.ndarray)
        else value
        for key, value in options.items()
    }
    assert grad.shape == seen.shape
    judgement = judge(name, seen, targets, seen_options, dtype_name, value, grad)
    problems = "; ".join(judgement.nonfinite + judgement.inaccurate)
    assert judgement.ok, f"{context} {case} against the spec [{dtype_name}]: {problems}"
    full = torch.tensor(logits, dtype=dtype, requires_grad=True)
    one = _call(name, full, torch.tensor(targets), _torch_options(options, dtype))
    one_value, one_grad = one.detach().double().numpy(), full.grad.double().numpy()
    # the same standard between the two: each entry within the strict tolerance of the other
    for what, ours, theirs, tolerance in (
        ("value", value, one_value, judgement.value_tolerance),
        ("gradient", grad, one_grad, judgement.grad_tolerance),
    ):
        ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
        np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs))
        finite = np.isfinite(theirs)
        gap = np.abs(ours - theirs)[finite]
        bound = np.broadcast_to(tolerance, theirs.shape)[finite]
        assert np.all(gap <= bound), (
            f"{context} {case}: the {what} differs from unsharded torch_impl by "
            f"{np.max(gap / np.maximum(bound, 1e-300)):.3g} x the strict tolerance"
        )


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_sharded_value_and_gradient_match_the_spec_and_unsharded_torch(world, case):
    size, ranks = world
    value, grad = _gathered(ranks, "cases", case)
    _judge_against_spec_and_unsharded(case, value, grad, f"{size} ranks {SIZES[size]}")


def test_confident_rows_keep_their_tiny_loss(world):
    # the log1p form: 12 exp(-60) ~ 1e-25, where logsumexp - z_y would round to 0
    size, ranks = world
    value, _ = _gathered(ranks, "cases", ("ce", "none", "mixed", "float64"))
    logits, _ = _inputs("mixed")
    exact = np.log1p(np.sum(np.exp(np.delete(logits[2], 3) - logits[2, 3])))
    assert 0.0 < value[2] and abs(value[2] - exact) <= 4 * np.finfo(np.float64).eps * exact
    assert value[1] == 0.0  # ignored, although its logits hold +inf


def test_no_row_is_gathered_and_three_all_reduces_carry_three_numbers_per_row(world):
    size, ranks = world
    for rank, results in ranks.items():
        for case, (_, _, calls) in results["cases"].items():
            # forward: the slice sizes, the row max, the target's logit and the sum per row;
            # backward: nothing
            assert calls == [("SUM", size), ("MAX", N), ("SUM", 2 * N)], (rank, case, calls)


@pytest.mark.parametrize("case", DTENSOR_CASES, ids=["-".join(c) for c in DTENSOR_CASES])
def test_dtensor_sharded_on_the_class_dim_works_as_loss_parallel(world, case):
    size, ranks = world
    for rank, results in ranks.items():
        kind, placements, _, _ = results["dtensor"][case]
        assert (kind, placements) == ("DTensor", [True]), rank  # replicated, as loss_parallel
    values = [ranks[r]["dtensor"][case][2] for r in sorted(ranks)]
    grad = np.concatenate([ranks[r]["dtensor"][case][3] for r in sorted(ranks)], axis=1)
    _judge_against_spec_and_unsharded(case, values[0], grad, f"DTensor on {size} ranks")


def test_bad_input_gets_one_sentence_naming_the_argument(world):
    size, ranks = world
    for rank, results in ranks.items():
        errors = results["errors"]
        assert errors["in_range"] is None, errors["in_range"]
        assert errors["out_of_range"] == (
            "ValueError",
            f"`targets` has class index {C} at position (0,), outside [0, {C}) and not "
            "ignore_index=-100.",
        )
        kind, message = errors["weight_length"]
        assert kind == "ValueError" and message.startswith("`weight`") and str(C) in message
        kind, message = errors["group_type"]
        assert kind == "TypeError" and message.startswith("`process_group` must be a torch")
        assert "Received: process_group of type str." in message
        kind, message = errors["probabilities"]
        assert kind == "ValueError" and message.startswith("`targets` must be class indices")
        kind, message = errors["label_smoothing"]
        assert kind == "ValueError" and "label_smoothing=0.1" in message
        kind, message = errors["replicated_dtensor"]
        assert kind == "ValueError" and "placements=(Replicate(),)" in message


def test_process_group_without_torch_distributed_raises():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=r"^`process_group` needs torch.distributed to be initial"):
        ti.softmax_cross_entropy(torch.zeros(2, 3), torch.tensor([0, 1]), process_group=object())
