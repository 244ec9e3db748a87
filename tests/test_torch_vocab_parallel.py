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

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import gloo  # noqa: E402

from dualloss import spec  # noqa: E402
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
# the options past the three-number path (DESIGN 13 head options, label smoothing, `where`): each
# in float64 and float32, with return_aux in a second call; "mask" is a class mask (sliced like
# the logits), "rows" a per-element one
OPTION_LOSSES = {
    # a small z-loss: its gradient at a confident target is far below the cross entropy's terms
    "ce_z_loss": ("softmax_cross_entropy", {"z_loss": 1e-4}),
    "ce_softcap_weight": (
        "softmax_cross_entropy",
        {"softcap": 5.0, "weight": "vector", "reduction": "none"},
    ),
    "focal_head_alpha": (
        "softmax_focal_loss",
        {"gamma": 2.0, "alpha": "vector", "z_loss": 1e-3, "softcap": 10.0},
    ),
    "ce_smoothing": ("softmax_cross_entropy", {"label_smoothing": 0.1, "reduction": "none"}),
    "ce_smoothing_one_sum": (
        "softmax_cross_entropy",
        {"label_smoothing": 1.0, "reduction": "sum", "where": "mask"},
    ),
    "ce_smoothing_where_weight": (
        "softmax_cross_entropy",
        {"label_smoothing": 0.2, "where": "mask", "weight": "vector", "z_loss": 1e-2},
    ),
    "focal_where_softcap": ("softmax_focal_loss", {"gamma": 0.5, "where": "mask", "softcap": 3.0}),
    "ce_where_rows_normalizer": (
        "softmax_cross_entropy",
        {"where": "rows", "normalizer": 4.0, "z_loss": 1e-2},
    ),
    # probability targets, sliced like the logits (their gradient too)
    "ce_probabilities": ("softmax_cross_entropy", {"targets": "probabilities", "z_loss": 1e-4}),
    "ce_probabilities_smoothing_where": (
        "softmax_cross_entropy",
        {
            "targets": "probabilities",
            "label_smoothing": 0.1,
            "where": "mask",
            "weight": "vector",
            "softcap": 5.0,
            "reduction": "sum",
        },
    ),  # fmt: skip
    # the focal loss with a target mass on every class (the dense terms, DESIGN 12)
    "focal_smoothing_alpha_head": (
        "softmax_focal_loss",
        {"gamma": 2.0, "label_smoothing": 0.1, "alpha": "vector", "z_loss": 1e-3, "softcap": 10.0},
    ),
    "focal_smoothing_where": (
        "softmax_focal_loss",
        {"gamma": 0.5, "label_smoothing": 0.3, "where": "mask", "reduction": "none"},
    ),
    "focal_probabilities_where": (
        "softmax_focal_loss",
        {"targets": "probabilities", "gamma": 1.5, "where": "mask", "reduction": "sum"},
    ),
    "focal_probabilities_smoothing_alpha": (
        "softmax_focal_loss",
        {
            "targets": "probabilities",
            "gamma": 2.0,
            "label_smoothing": 0.2,
            "alpha": "vector",
            "z_loss": 1e-4,
        },
    ),  # fmt: skip
}
# DTensor logits on a 2 x 2 data x vocab mesh: (option loss, how the rows are laid out)
DTENSOR_2D_CASES = {
    "mean": ("ce_z_loss", "data x vocab"),
    "none": ("ce_softcap_weight", "replicated x vocab"),
}
OPTION_CASES = [(loss, dtype) for loss in OPTION_LOSSES for dtype in ("float64", "float32")]
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


def _mask(kind):
    """The `where` of the option cases (global): a class mask with the -inf classes of row 3 out
    (so that smoothing leaves them), some classes of row 6 out, row 7 without a class (left
    out) and row 8's target out (ignored); or a per-element mask of the batch shape."""
    if kind == "rows":
        # (N, 1), broadcast over the classes: a mask of shape (N,) would be read as a class mask
        # on a rank whose slice has N classes (optax's rule: a mask that broadcasts is one)
        return (np.arange(N) % 3 != 0)[:, None]
    _, targets = _inputs("mixed")
    mask = np.ones((N, C), bool)
    mask[3, [0, 1, 2, 8, 11]] = False
    mask[6, 9:12] = False
    mask[7] = False
    mask[8, targets[8]] = False
    return mask


def _probabilities():
    """Global probability targets (N, C), with exact zeros, none on row 3's -inf classes."""
    rng = np.random.default_rng(30)
    p = rng.dirichlet(np.ones(C), size=N)
    p[:, 5:7] = 0.0
    p[3, [0, 1, 2, 8, 11]] = 0.0
    p[2] = 0.0
    p[2, 3] = 1.0  # all the mass on the confident row's top class
    return p / p.sum(axis=1, keepdims=True)


def _option_targets(loss):
    """The global targets of an option case: class indices, or probabilities."""
    _, options = LOSSES[loss] if loss in LOSSES else OPTION_LOSSES[loss]
    if options.get("targets") == "probabilities":
        return _probabilities()
    return _inputs("mixed")[1]


def _option_logits(loss):
    """The global logits of an option case: row 1's +inf (an ignored row's garbage for class
    indices) made finite for probability targets, where the row counts (a +inf logit makes it
    NaN; which of its gradient entries are NaN differs between the paths, and the spec allows
    either)."""
    logits, _ = _inputs("mixed")
    if np.issubdtype(_option_targets(loss).dtype, np.floating):
        logits[1, 4] = 2.0
    return logits


def _option_options(loss):
    """(name, options of the global call) of an option case (its targets: ``_option_targets``)."""
    name, options = LOSSES[loss] if loss in LOSSES else OPTION_LOSSES[loss]
    options = {key: value for key, value in options.items() if key != "targets"}
    for key, value in options.items():
        if value == "vector":
            options[key] = np.linspace(0.2, 1.0, C)
        elif key == "where":
            options[key] = _mask(value)
    return name, options


def _options(loss, reduction):
    name, options = LOSSES[loss]
    options = {**options, **REDUCTIONS[reduction]}
    for key, value in options.items():
        if value == "vector":
            options[key] = np.linspace(0.2, 1.0, C)
    return name, options


def _torch_options(options, dtype):
    return {
        key: torch.tensor(value, dtype=torch.bool if value.dtype == bool else dtype)
        if isinstance(value, np.ndarray)
        else value
        for key, value in options.items()
    }


def _call(name, logits, targets, options, **extra):
    """(value, gradient) of one call; 'none' differentiates the sum of the elements."""
    loss = getattr(ti, name)(logits, targets, **options, **extra)
    total = loss.sum() if options.get("reduction") == "none" else loss
    total.backward()
    return loss


# ----------------------------------------------------------------------------------------------
# The workers
# ----------------------------------------------------------------------------------------------


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"torch.distributed.{name} called: no row may be gathered")

    return refuse


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
    _worker_options(rank, world, results, start, sizes[rank], calls)
    _worker_dtensor(rank, world, results)
    if world == 4:
        _worker_dtensor_2d(rank, results)
    _worker_errors(rank, world, results)
    _worker_span(rank, world, results)


# logits spanning more than float32's largest number: row 0's top class on the first rank, its
# target at -0.9 x the largest number on the last; the class vector requires its gradient
SPAN = {
    "ce-weight": ("softmax_cross_entropy", "weight", {}),
    "focal-alpha": ("softmax_focal_loss", "alpha", {"gamma": 2.0}),
}
SPAN_VECTOR = np.array([0.5, 1.0, 0.75, 0.95, 0.9, 0.6, 0.3, 0.8, 0.45, 0.7, 0.35, 0.55, 0.25])


def _span_inputs():
    logits, targets = _inputs("mixed")
    logits = np.where(np.isfinite(logits), logits, 0.0).astype(np.float32)
    largest = float(np.finfo(np.float32).max)
    logits[0, 0], logits[0, C - 1] = 0.9 * largest, -0.9 * largest
    targets = np.where(targets >= 0, targets, 2)
    targets[0] = C - 1
    return logits, targets


def _worker_span(rank, world, results):
    sizes = SIZES[world]
    start = sum(sizes[:rank])
    logits, targets = _span_inputs()
    results["span"] = {}
    for key, (name, option, extra) in SPAN.items():
        local = torch.tensor(logits[:, start : start + sizes[rank]], requires_grad=True)
        vector = torch.tensor(SPAN_VECTOR, dtype=torch.float32, requires_grad=True)
        loss = getattr(ti, name)(
            local, torch.tensor(targets), **{option: vector}, **extra,
            process_group=dist.group.WORLD,
        )  # fmt: skip
        loss.backward()
        results["span"][key] = (loss.item(), vector.grad.double().numpy())


def _worker_options(rank, world, results, start, size, calls):
    results["options"] = {}
    for case in OPTION_CASES:
        loss, dtype_name = case
        logits = _option_logits(loss)
        dtype = getattr(torch, dtype_name)
        name, options = _option_options(loss)
        options = _torch_options(options, dtype)
        where = options.get("where")
        if where is not None and where.shape[-1] == C:
            # a class mask: this rank's slice, like the logits
            options["where"] = where[:, start : start + size]
        local = torch.tensor(logits[:, start : start + size], dtype=dtype, requires_grad=True)
        targets = torch.tensor(_option_targets(loss))
        if targets.is_floating_point():
            # probabilities: this rank's slice, like the logits, with its gradient
            targets = targets[:, start : start + size].to(dtype).requires_grad_(True)
        group = {"process_group": dist.group.WORLD}
        del calls[:]
        value = _call(name, local, targets, options, **group)
        loss_calls = list(calls)
        _, aux = getattr(ti, name)(
            local.detach(), targets.detach(), **options, **group, return_aux=True
        )
        target_grad = None if targets.grad is None else targets.grad.double().numpy()
        results["options"][case] = (
            value.detach().double().numpy(),
            local.grad.double().numpy(),
            {key: stat.double().numpy() for key, stat in aux.items()},
            target_grad,
            (loss_calls, list(calls[len(loss_calls) :])),
        )


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


def _worker_dtensor_2d(rank, results):
    """A data x vocab mesh of 2 x 2 (4 ranks): the rows split over "data" (torch.chunk's, 5 and
    4) or replicated, the classes over "vocab"; each call's loss comes back as a DTensor, its
    global value by ``full_tensor()``, whose backward gives this rank's block of the gradient."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "vocab"))
    logits, targets = _inputs("mixed")
    rows = [len(c) for c in torch.arange(N).chunk(2)]
    classes = [len(c) for c in torch.arange(C).chunk(2)]
    data, vocab = divmod(rank, 2)  # the mesh [[0, 1], [2, 3]]
    row0, class0 = sum(rows[:data]), sum(classes[:vocab])
    results["dtensor_2d"] = {}
    for case, (loss, placements) in DTENSOR_2D_CASES.items():
        name, options = _option_options(loss)
        options = _torch_options(options, torch.float64)
        split = placements == "data x vocab"
        span = slice(row0, row0 + rows[data]) if split else slice(None)
        local = torch.tensor(logits[span, class0 : class0 + classes[vocab]], requires_grad=True)
        layout = [Shard(0) if split else Replicate(), Shard(1)]
        sharded = DTensor.from_local(local, mesh, layout, run_check=False, shape=(N, C),
                                     stride=(C, 1))  # fmt: skip
        value, aux = getattr(ti, name)(
            sharded, torch.tensor(targets[span]), **options, return_aux=True
        )
        whole = value.full_tensor()
        whole.sum().backward()
        results["dtensor_2d"][case] = (
            [str(p) for p in value.placements],
            whole.detach().numpy(),
            local.grad.numpy(),
            (span, slice(class0, class0 + classes[vocab])),
            aux["lse"].full_tensor().numpy(),
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
        "alpha_grad": lambda: ti.softmax_focal_loss(
            local,
            torch.full((N, sizes[rank]), 0.1),
            alpha=torch.ones(C, requires_grad=True),
            process_group=dist.group.WORLD,
        ),  # fmt: skip
        "smoothing_weight_grad": lambda: ti.softmax_cross_entropy(
            local,
            torch.tensor(targets),
            weight=torch.ones(C, requires_grad=True),
            label_smoothing=0.1,
            process_group=dist.group.WORLD,
        ),  # fmt: skip
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


@pytest.fixture(scope="module", params=sorted(SIZES))
def world(request, tmp_path_factory):
    """{rank: results} of one spawned gloo world of `request.param` processes."""
    size = request.param
    out_dir = tmp_path_factory.mktemp(f"world{size}")
    keys = ("cases", "dtensor", "errors", "span")
    return size, gloo.spawn_world(size, out_dir, (_worker_cases,), keys=keys)


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
    name, options = _options(loss, reduction)
    logits, targets = _inputs(rows)
    _judge_call(name, options, logits, targets, dtype_name, value, grad, f"{context} {case}")


def _judge_call(name, options, logits, targets, dtype_name, value, grad, context):
    """The sharded call's value and gradient against the spec (strict standard) and against
    unsharded torch_impl on the same inputs, entry by entry to the same tolerance."""
    dtype = getattr(torch, dtype_name)
    # the inputs the candidate saw: float32 rounding is exact in float64
    seen = torch.tensor(logits, dtype=dtype).double().numpy()
    # and the class vectors it saw, rounded to its dtype like the logits
    seen_options = {
        key: torch.tensor(value, dtype=dtype).double().numpy()
        if isinstance(value, np.ndarray) and value.dtype != bool
        else value
        for key, value in options.items()
    }
    assert grad.shape == seen.shape
    if np.issubdtype(targets.dtype, np.floating):
        # probabilities: rounded to the dtype like the logits
        targets = torch.tensor(targets, dtype=dtype).double().numpy()
    judgement = judge(name, seen, targets, seen_options, dtype_name, value, grad)
    problems = "; ".join(judgement.nonfinite + judgement.inaccurate)
    assert judgement.ok, f"{context} against the spec [{dtype_name}]: {problems}"
    full = torch.tensor(logits, dtype=dtype, requires_grad=True)
    given = torch.tensor(targets)
    given = given.to(dtype) if given.is_floating_point() else given
    one = _call(name, full, given, _torch_options(options, dtype))
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
            f"{context}: the {what} differs from unsharded torch_impl by "
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


def test_class_vector_gradient_at_logits_spanning_beyond_the_largest_number_is_finite(world):
    # the target's -log p_y = z_top - z_y + log(exp(t) + s) is beyond the largest number, the
    # mean's 1/W (1/N) brings it back: each term is multiplied by the incoming gradient first.
    # Every rank returned inf for the far target's weight (alpha)
    size, ranks = world
    logits, targets = _span_inputs()
    x = logits.astype(np.float64)
    for key, (name, option, extra) in SPAN.items():
        # per row -(1 - p_y)^gamma log p_y without the class vector, in float64 (finite there)
        rows = getattr(spec, name)(x, targets, reduction="none", **extra)
        assert np.all(np.isfinite(rows)) and rows[0] > np.finfo(np.float32).max
        w = SPAN_VECTOR.astype(np.float32).astype(np.float64)[targets]
        if option == "weight":
            # the weighted mean sum_i w_y_i l_i / W: d/dw_c = sum_{y_i = c} (l_i - mean) / W
            mean = np.sum(w * rows) / np.sum(w)
            want = np.bincount(targets, (rows - mean) / np.sum(w), minlength=C)
        else:
            # the mean over rows of alpha_y_i f_i: d/dalpha_c = sum_{y_i = c} f_i / N
            mean = np.mean(w * rows)
            want = np.bincount(targets, rows / N, minlength=C)
        for rank, results in ranks.items():
            value, grad = results["span"][key]
            assert np.all(np.isfinite(grad)), (size, rank, key, grad)
            # float32 roundings of the logits' terms and the sums: 1e-5 of the largest entry
            np.testing.assert_allclose(value, mean, rtol=1e-5, err_msg=f"{size} {rank} {key}")
            np.testing.assert_allclose(grad, want, rtol=0, atol=1e-5 * np.max(np.abs(want)),
                                       err_msg=f"{size} ranks, rank {rank}, {key}")  # fmt: skip


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


@pytest.mark.parametrize("world", [4], indirect=True)  # the 2 x 2 mesh: the 4-rank world
def test_dtensor_on_a_data_by_vocab_mesh_works_as_loss_parallel(world):
    # rows split over "data": the mean is a Partial sum over it (each rank's share of the global
    # mean, the denominator all-reduced), replicated over "vocab"; rows replicated: replicated
    size, ranks = world
    assert size == 4
    expected = {
        "mean": ["P(sum)", "R"],
        "none": ["R", "R"],
    }
    logits, targets = _inputs("mixed")
    for case, (loss, _) in DTENSOR_2D_CASES.items():
        grad = np.full((N, C), np.nan)
        for rank, results in ranks.items():
            placements, value, local_grad, (rows, classes), lse = results["dtensor_2d"][case]
            assert placements == expected[case], (rank, case, placements)
            if rows == slice(None):
                # replicated rows: every rank of a vocab slice holds the same gradient block
                assert np.isnan(grad[rows, classes]).all() or np.array_equal(
                    grad[rows, classes], local_grad
                ), (rank, case)
            grad[rows, classes] = local_grad
            np.testing.assert_array_equal(value, ranks[0]["dtensor_2d"][case][1], err_msg=case)
        assert not np.isnan(grad).any(), case
        name, options = _option_options(loss)
        _judge_call(name, options, logits, targets, "float64", value, grad, f"2 x 2 mesh {case}")
        _, aux = getattr(spec, name)(logits, targets, **options, return_aux=True)
        np.testing.assert_allclose(lse, aux["lse"], rtol=4 * np.finfo(np.float64).eps)


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
        kind, message = errors["smoothing_weight_grad"]
        assert kind == "ValueError" and message.startswith("`weight` must not require grad")
        kind, message = errors["alpha_grad"]
        assert kind == "ValueError" and message.startswith("`alpha` must not require grad")
        kind, message = errors["replicated_dtensor"]
        assert kind == "ValueError" and "placements=(Replicate(),)" in message


@pytest.mark.parametrize("case", OPTION_CASES, ids=["-".join(c) for c in OPTION_CASES])
def test_head_options_smoothing_and_where_match_the_spec_and_unsharded_torch(world, case):
    size, ranks = world
    value, grad = _gathered(ranks, "options", case)
    loss, dtype_name = case
    name, options = _option_options(loss)
    logits, targets = _option_logits(loss), _option_targets(loss)
    _judge_call(name, options, logits, targets, dtype_name, value, grad, f"{size} ranks {case}")
    if np.issubdtype(targets.dtype, np.floating):
        # the probability targets' gradient: each rank its slice, as the spec's (+inf where the
        # class's probability is 0, as on one device)
        dtype = getattr(torch, dtype_name)
        target_grad = np.concatenate([ranks[r]["options"][case][3] for r in sorted(ranks)], axis=1)
        seen = {
            key: torch.tensor(v, dtype=dtype).double().numpy()
            if isinstance(v, np.ndarray) and v.dtype != bool
            else v
            for key, v in options.items()
        }
        expected = getattr(spec, name + "_grad")(
            torch.tensor(logits, dtype=dtype).double().numpy(),
            torch.tensor(targets, dtype=dtype).double().numpy(), **seen, wrt="targets",
        )  # fmt: skip
        eps = float(torch.finfo(dtype).eps)
        scale = np.max(np.abs(expected[np.isfinite(expected)]), initial=1.0)
        np.testing.assert_allclose(target_grad, expected, rtol=0, atol=16 * eps * scale)


def _option_collectives(loss):
    """The all-reduces docs/scaling.md says an option case issues, forward and backward, those
    of its forward alone (no gradient asked) and those return_aux adds: (op, numbers)."""
    _, options = OPTION_LOSSES[loss]
    probabilities = options.get("targets") == "probabilities"
    expected = [("SUM", None)]  # the slice sizes (one per rank)
    if options.get("where") == "mask" or options.get("where") == "rows":
        # the classes left, and (class indices) whether the target is one and (smoothing) their
        # weight off it
        columns = 1 if probabilities else 2 + bool(options.get("label_smoothing"))
        expected.append(("SUM", columns * N))
    expected.append(("MAX", N))
    dense = probabilities or bool(options.get("label_smoothing"))
    if dense and options.get("gamma"):
        # the focal terms of every class: the first top class, s, the row's largest v and its
        # place, then the loss, v's total and v's sum off its largest
        forward = [*expected, ("MIN", N), ("SUM", N), ("SUM", N)]
        expected += [("MIN", N), ("SUM", N), ("MAX", N), ("MIN", N), ("SUM", 3 * N)]
        return expected, forward, [("MAX", N), ("MIN", N)] * (2 if probabilities else 1)
    if probabilities:
        expected.append(("MIN", N))  # the first top class
    # t and s; smoothing's logit sum of the mass; probabilities': the mass at the top and off it
    columns = 2 + bool(options.get("label_smoothing") or probabilities) + 2 * probabilities
    expected.append(("SUM", columns * N))
    # return_aux: the largest raw logit and its first class (probabilities: the target mass's)
    aux = [("MAX", N), ("MIN", N)] * (2 if probabilities else 1)
    return expected, expected, aux


@pytest.mark.parametrize("case", OPTION_CASES, ids=["-".join(c) for c in OPTION_CASES])
def test_options_issue_the_collectives_the_docs_list_and_no_gather(world, case):
    size, ranks = world
    loss, _ = case
    expected, forward, aux = _option_collectives(loss)
    expected, forward = [("SUM", size), *expected[1:]], [("SUM", size), *forward[1:]]
    for rank, results in ranks.items():
        loss_calls, aux_calls = results["options"][case][4]
        assert loss_calls == expected, (rank, case, loss_calls)
        # the aux call (no gradient) repeats the loss's forward, then adds its own
        assert aux_calls == forward + aux, (rank, case, aux_calls)


@pytest.mark.parametrize("case", OPTION_CASES, ids=["-".join(c) for c in OPTION_CASES])
def test_return_aux_over_ranks_matches_the_spec(world, case):
    # lse and the z-term from the loss's own pass, `correct` from the first top over every rank
    # (row 5 ties across ranks at its target: the first of the two is not the target)
    size, ranks = world
    loss, dtype_name = case
    name, options = _option_options(loss)
    logits, targets = _option_logits(loss), _option_targets(loss)
    seen = torch.tensor(logits, dtype=getattr(torch, dtype_name)).double().numpy()
    if np.issubdtype(targets.dtype, np.floating):
        targets = torch.tensor(targets, dtype=getattr(torch, dtype_name)).double().numpy()
    seen_options = {
        key: torch.tensor(value, dtype=getattr(torch, dtype_name)).double().numpy()
        if isinstance(value, np.ndarray) and value.dtype != bool
        else value
        for key, value in options.items()
    }
    _, expected = getattr(spec, name)(seen, targets, **seen_options, return_aux=True)
    eps = float(torch.finfo(getattr(torch, dtype_name)).eps)
    for rank, results in ranks.items():
        aux = results["options"][case][2]
        assert sorted(aux) == ["correct", "lse", "z_term"], rank
        # the count (or its mean) exactly, rounded once to the dtype
        rounded = torch.tensor(expected["correct"]).to(getattr(torch, dtype_name)).double()
        np.testing.assert_array_equal(aux["correct"], rounded.numpy(), err_msg=f"{case}")
        for key in ("lse", "z_term"):
            # a few roundings of the dtype at the statistic's scale (lse = z_top + log1p(...))
            scale = np.max(np.abs(expected[key][np.isfinite(expected[key])]), initial=1.0)
            np.testing.assert_allclose(
                aux[key], expected[key], rtol=0, atol=8 * eps * scale, err_msg=f"{case} {key}"
            )


def test_process_group_without_torch_distributed_raises():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=r"^`process_group` needs torch.distributed to be initial"):
        ti.softmax_cross_entropy(torch.zeros(2, 3), torch.tensor([0, 1]), process_group=object())
