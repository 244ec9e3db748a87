"""The fused linear losses with the head weight split over the classes, ``process_group=`` (issue
29, DESIGN 12): gloo in local processes on the CPU, 2 ranks for the matrix and 4 for a few cases.

Each world runs once (a module fixture, ``torch.multiprocessing.spawn``): every rank computes
every case with its rows of the weight and of the bias (uneven slices, V = 9: [4, 5] and
[2, 3, 1, 3]) and hands back its loss, the gradients of hidden and of its slices, and the
collectives it issued. Here the slices are put together and judged:

* against the spec (``spec.linear_softmax_*``) to the strict standard of the fused losses
  (``dualloss.parity.linear``'s derived bound), in float64, float32 and bfloat16 (computed in
  float32): the regions ignored rows, confident rows (losses ~1e-9 to 1e-16), exact ties (the
  tied columns on different ranks in the 4-rank world), a bias mask (every other class at -1e4)
  and all rows ignored; cross entropy, class weights, focal with gamma 2 and with gamma 0.5 and
  a vector alpha; `z_loss` with `softcap` (cross entropy, focal), label smoothing (with class
  weights, and with z_loss and softcap); reductions mean, sum, none and a normalizer; row
  blocks of 5 (N = 12);
* against the unsharded ``torch_impl`` fused loss on the same inputs, to the same per-entry
  tolerance;
* by the collectives: every gather, broadcast, scatter and all-to-all raises in the workers;
  the calls are exactly the slice sizes, per block one MAX of one number per row and one SUM of
  three (five with label smoothing), and with a gradient one SUM of the (N, H) hidden gradient;
* logits spanning more than float32's largest number (the top class on the first rank, the far
  target class on the last): the spec's finite loss on every rank, finite gradients;
* every rank gets the same loss and the same hidden gradient; no input is written; bad input
  (targets outside the global V, a weight of the local length, focal label smoothing with
  gamma != 0, an empty slice, a group of the wrong type) raises one sentence on every rank.
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
from dualloss.parity import linear as L  # noqa: E402
from dualloss.parity.tolerance import UNIT_ROUNDOFF  # noqa: E402

N, H, V = 12, 8, 9
CHUNK = 5  # three row blocks: 5, 5 and 2 rows
SIZES = {2: [4, 5], 4: [2, 3, 1, 3]}
LOSSES = {
    "ce": ("linear_softmax_cross_entropy", {}),
    "ce_weight": ("linear_softmax_cross_entropy", {"weight": "vector"}),
    "focal": ("linear_softmax_focal_loss", {"gamma": 2.0}),
    "focal_alpha": ("linear_softmax_focal_loss", {"gamma": 0.5, "alpha": "vector"}),
    # the LLM head options and label smoothing (DESIGN 13), judged the same way
    "ce_head": ("linear_softmax_cross_entropy", {"z_loss": 1e-2, "softcap": 5.0}),
    "focal_head": (
        "linear_softmax_focal_loss",
        {"gamma": 2.0, "alpha": "vector", "z_loss": 1e-2, "softcap": 30.0},
    ),
    "ce_smooth": ("linear_softmax_cross_entropy", {"weight": "vector", "label_smoothing": 0.1}),
    "ce_smooth_head": (
        "linear_softmax_cross_entropy",
        {"label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 5.0},
    ),
}
# the losses of the first matrix, and those of the options (a smaller one)
PLAIN = ("ce", "ce_weight", "focal", "focal_alpha")
OPTIONS = ("ce_head", "focal_head", "ce_smooth", "ce_smooth_head")
REDUCTIONS = {
    "mean": {"reduction": "mean"},
    "sum": {"reduction": "sum"},
    "none": {"reduction": "none"},
    "normalizer": {"reduction": "mean", "normalizer": 5.0},
}
REGIONS = ("ignored", "confident", "ties", "bias_mask")
CASES = {
    2: [
        (loss, reduction, region, dtype)
        for loss in PLAIN
        for reduction in ("mean", "none", "normalizer")
        for region in REGIONS
        for dtype in ("float64", "float32")
    ]
    + [
        (loss, reduction, region, dtype)
        for loss in OPTIONS
        for reduction, dtype in (
            ("mean", "float64"),
            ("none", "float32"),
            ("normalizer", "float64"),
        )
        for region in REGIONS
    ]
    + [(loss, "mean", "all_ignored", "float32") for loss in LOSSES]
    + [(loss, "sum", "ignored", "bfloat16") for loss in LOSSES],
    4: [(loss, "sum", "ties", "float64") for loss in LOSSES],
}
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


def _prepared(case):
    """The case's inputs (spec layout, float64 values rounded to the dtype) and its options."""
    loss, reduction, region, dtype = case
    name, options = LOSSES[loss]
    hidden, kernel, bias, targets = L.region_inputs(region, N, H, V, seed=29)
    options = L.option_values({**options, **REDUCTIONS[reduction]}, V)
    label = f"{N}x{H}x{V}"
    linear_case = L.LinearCase(name, region, label, hidden, kernel, bias, targets, options)
    return name, L.prepare(linear_case, dtype)


def _torch_options(prep):
    dtype = getattr(torch, prep.dtype)
    return {
        key: torch.tensor(value).to(dtype) if isinstance(value, np.ndarray) else value
        for key, value in prep.options.items()
    }


# ----------------------------------------------------------------------------------------------
# The workers
# ----------------------------------------------------------------------------------------------


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"torch.distributed.{name} called: no row may be gathered")

    return refuse


def _worker_cases(rank, world, results):
    sizes = SIZES[world]
    start, stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
    calls = []
    all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append((str(op).rsplit(".", 1)[-1], tensor.numel()))
        return all_reduce(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = counting_all_reduce
    for name in FORBIDDEN:
        if hasattr(dist, name):
            setattr(dist, name, _refuse(name))
    for case in CASES[world]:
        name, prep = _prepared(case)
        dtype = getattr(torch, prep.dtype)
        # the values the spec sees (float64, exact in the dtype)
        ref_hidden, ref_kernel, ref_bias = prep.ref
        hidden = torch.tensor(ref_hidden).to(dtype).requires_grad_(True)
        # this rank's rows of the (V, H) weight and of the bias
        weight = torch.tensor(ref_kernel.T[start:stop]).to(dtype).requires_grad_(True)
        bias = torch.tensor(ref_bias[start:stop]).to(dtype).requires_grad_(True)
        targets = torch.tensor(prep.case.targets)
        inputs = [x.detach().clone() for x in (hidden, weight, bias, targets)]
        del calls[:]
        loss = getattr(ti, name)(
            hidden, weight, targets, bias=bias, chunk_size=CHUNK,
            process_group=dist.group.WORLD, **_torch_options(prep),
        )  # fmt: skip
        loss.sum().backward()
        written = [
            what
            for what, x, before in zip(("hidden", "weight", "bias", "targets"),
                                       (hidden, weight, bias, targets), inputs, strict=True)
            if not torch.equal(x.detach(), before)
        ]  # fmt: skip
        loss_calls = list(calls)
        # return_aux (no gradient): the loss's own forward, then four all-reduces per block
        del calls[:]
        _, aux = getattr(ti, name)(
            hidden.detach(), weight.detach(), targets, bias=bias.detach(), chunk_size=CHUNK,
            process_group=dist.group.WORLD, return_aux=True, **_torch_options(prep),
        )  # fmt: skip
        results["aux"][case] = ({k: v.double().numpy() for k, v in aux.items()}, list(calls))
        results["cases"][case] = {
            "value": loss.detach().double().numpy(),
            "hidden": hidden.grad.double().numpy(),
            "weight": weight.grad.double().numpy(),
            "bias": bias.grad.double().numpy(),
            "dtypes": {str(x.dtype) for x in (loss, hidden.grad, weight.grad, bias.grad)},
            "calls": loss_calls,
            "written": written,
        }


def _worker_errors(rank, world, results):
    sizes = SIZES[world]
    group = dist.group.WORLD
    hidden = torch.zeros(N, H)
    weight = torch.zeros(sizes[rank], H)
    targets = torch.arange(N) % V
    attempts = {
        # the last class is on the last rank: out of every other slice, but in range
        "in_range": lambda: ti.linear_softmax_cross_entropy(
            hidden, weight, torch.full((N,), V - 1), process_group=group
        ),
        "out_of_range": lambda: ti.linear_softmax_focal_loss(
            hidden, weight, torch.full((N,), V), process_group=group
        ),
        "weight_length": lambda: ti.linear_softmax_cross_entropy(
            hidden, weight, targets, weight=torch.ones(sizes[rank]), process_group=group
        ),
        "label_smoothing": lambda: ti.linear_softmax_focal_loss(
            hidden, weight, targets, label_smoothing=0.1, process_group=group
        ),
        "group_type": lambda: ti.linear_softmax_cross_entropy(
            hidden, weight, targets, process_group="world"
        ),
        # the last rank holds no class
        "empty": lambda: ti.linear_softmax_cross_entropy(
            hidden,
            weight if rank < world - 1 else torch.zeros(0, H),
            targets,
            process_group=group,
        ),  # fmt: skip
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            results["errors"][what] = None
        except (TypeError, ValueError) as error:
            results["errors"][what] = (type(error).__name__, str(error))


# logits spanning more than float32's largest number: the top class (bias 0.9 max) on the first
# rank, the far class (bias -0.9 max, weight / alpha 0.25) on the last, where the targets are
SPAN = {
    "ce_weight": ("linear_softmax_cross_entropy", {"weight": "span"}),
    "focal_alpha": ("linear_softmax_focal_loss", {"gamma": 2.0, "alpha": "span"}),
    "ce_smooth": ("linear_softmax_cross_entropy", {"weight": "span", "label_smoothing": 0.1}),
}


def _span_inputs():
    """(hidden, kernel (H, V), bias, targets, class vector), float32 values as float64."""
    big = 0.9 * float(np.finfo(np.float32).max)
    rng = np.random.default_rng(7)
    hidden = rng.normal(size=(4, H)).astype(np.float32).astype(np.float64)
    kernel = (0.1 * rng.normal(size=(H, V))).astype(np.float32).astype(np.float64)
    bias = np.zeros(V)
    bias[0], bias[V - 1] = big, -big
    bias = bias.astype(np.float32).astype(np.float64)
    vector = np.linspace(0.2, 0.9, V).astype(np.float32).astype(np.float64)
    vector[V - 1] = 0.25
    return hidden, kernel, bias, np.array([V - 1, V - 1, 3, V - 1]), vector


def _worker_span(rank, world, results):
    sizes = SIZES[world]
    start, stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
    hidden, kernel, bias, targets, vector = _span_inputs()
    for key, (name, options) in SPAN.items():
        kw = {k: torch.tensor(vector, dtype=torch.float32) if v == "span" else v
              for k, v in options.items()}  # fmt: skip
        h = torch.tensor(hidden, dtype=torch.float32, requires_grad=True)
        w = torch.tensor(kernel.T[start:stop], dtype=torch.float32, requires_grad=True)
        b = torch.tensor(bias[start:stop], dtype=torch.float32, requires_grad=True)
        loss = getattr(ti, name)(
            h, w, torch.tensor(targets), bias=b, chunk_size=3, reduction="none",
            process_group=dist.group.WORLD, **kw,
        )  # fmt: skip
        loss.sum().backward()
        grads_finite = all(bool(torch.all(torch.isfinite(x.grad))) for x in (h, w, b))
        results["span"][key] = (loss.detach().double().numpy(), grads_finite)


def _spawn(size, tmp_path_factory):
    """(size, {rank: results}) of one spawned gloo world of `size` processes."""
    out_dir = tmp_path_factory.mktemp(f"linear_world{size}")
    bodies = (_worker_cases, _worker_errors, _worker_span)
    return size, gloo.spawn_world(size, out_dir, bodies, keys=("cases", "aux", "errors", "span"))


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    return _spawn(2, tmp_path_factory)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    return _spawn(4, tmp_path_factory)


@pytest.fixture(params=sorted(SIZES))
def world(request):
    """Each world in turn (each spawned once per module)."""
    return request.getfixturevalue(f"world{request.param}")


# ----------------------------------------------------------------------------------------------
# The judgements
# ----------------------------------------------------------------------------------------------


def _gathered(ranks, case):
    """The outcome in the spec's layout: rank 0's loss and hidden gradient (after checking every
    rank has the same), the weight's and the bias's gradients put together from the slices."""
    results = [ranks[r]["cases"][case] for r in sorted(ranks)]
    for rank, result in enumerate(results):
        for what in ("value", "hidden"):
            np.testing.assert_array_equal(
                result[what], results[0][what], err_msg=f"rank {rank}'s {what} {case}"
            )
    weight = np.concatenate([r["weight"] for r in results], axis=0).T
    bias = np.concatenate([r["bias"] for r in results])
    grads = {"hidden": results[0]["hidden"], "linear_weight": weight, "bias": bias}
    return L.Outcome(value=results[0]["value"], grads=grads)


def _tolerances(name, prep, want):
    """The strict per-entry tolerances; with a normalizer (which the bound does not take) the
    bound of the sum divided by it, plus the division's own rounding."""
    normalizer = prep.options.get("normalizer")
    if normalizer is None:
        return L.tolerances(name, prep, want, "strict")
    options = {k: v for k, v in prep.options.items() if k != "normalizer"}
    summed = L.Prepared(prep.case, prep.dtype, prep.hidden, prep.linear_weight, prep.bias,
                        {**options, "reduction": "sum"})  # fmt: skip
    tolerances = L.tolerances(name, summed, L.expected(name, summed), "strict")
    u = UNIT_ROUNDOFF["float32" if prep.dtype == "bfloat16" else prep.dtype]
    return {
        what: tolerance / normalizer + u * np.abs(want[what])
        for what, tolerance in tolerances.items()
    }


def _within(what, got, want, tolerance, context):
    got = np.asarray(got, np.float64)
    assert np.all(np.isfinite(got)), f"non-finite {what} {context}"
    gap = np.abs(got - want)
    bound = np.broadcast_to(tolerance, np.shape(want))
    assert np.all(gap <= bound), (
        f"{what} off by {np.max(gap / np.maximum(bound, 1e-300)):.3g} x the strict tolerance "
        f"{context}"
    )


def _judge(case, outcome, context):
    name, prep = _prepared(case)
    want = L.expected(name, prep)
    tolerances = _tolerances(name, prep, want)
    got = {"value": outcome.value, **outcome.grads}
    for what in want:
        _within(what, got[what], want[what], tolerances[what], f"against the spec {context}")
    # the unsharded fused loss on the same inputs, to the same standard
    one = L.run(L.ours("torch", name, prep.options, prep.options["reduction"]), "torch", prep)
    assert one.error is None, one.error
    theirs = {"value": one.value, **one.grads}
    for what in want:
        _within(what, got[what], theirs[what], tolerances[what], f"against unsharded {context}")


def _cases(world_size):
    return [pytest.param(case, id="-".join(case)) for case in CASES[world_size]]


def _check_case(world, case):
    size, ranks = world
    outcome = _gathered(ranks, case)
    _judge(case, outcome, f"{case} [{size} ranks {SIZES[size]}]")
    dtypes = ranks[0]["cases"][case]["dtypes"]
    assert dtypes == {f"torch.{case[3]}"}, dtypes


@pytest.mark.parametrize("case", _cases(2))
def test_two_ranks_match_the_spec_and_the_unsharded_loss(world2, case):
    _check_case(world2, case)


@pytest.mark.parametrize("case", _cases(4))
def test_four_ranks_match_the_spec_and_the_unsharded_loss(world4, case):
    _check_case(world4, case)


def test_no_row_is_gathered_and_each_block_reduces_three_numbers_per_row(world):
    size, ranks = world
    blocks = [min(CHUNK, N - start) for start in range(0, N, CHUNK)]
    for rank, results in ranks.items():
        for case, result in results["cases"].items():
            # z_y - z_top, S_y and z_y (for logits spanning more than the largest number); label
            # smoothing: the row's weighted sum of logits and its far form ride in the same SUM
            width = 5 if "label_smoothing" in LOSSES[case[0]][1] else 3
            forward = [call for rows in blocks for call in (("MAX", rows), ("SUM", width * rows))]
            if case[1] == "none":
                # forward without a gradient, then backward recomputes the blocks
                expected = [("SUM", size), *forward, *forward, ("SUM", N * H)]
            else:
                # the gradient computed along with the loss; backward scales it
                expected = [("SUM", size), *forward, ("SUM", N * H)]
            assert result["calls"] == expected, (rank, case, result["calls"])
            assert result["written"] == [], (rank, case, result["written"])


def test_return_aux_over_ranks_matches_the_spec(world):
    # lse of the capped logits and whether the first top logit over every rank is the target
    # (the "ties" region ties across ranks), the same on every rank; each block adds a MAX and a
    # SUM (lse), a MAX and a MIN (the first top class) before the loss's own
    size, ranks = world
    blocks = [min(CHUNK, N - start) for start in range(0, N, CHUNK)]
    for case in ranks[0]["aux"]:
        name, prep = _prepared(case)
        dtype = getattr(torch, prep.dtype)
        # the values the spec sees (float64, exact in the dtype)
        hidden, kernel, bias = prep.ref
        _, want = getattr(spec, name)(hidden, kernel, prep.case.targets, bias=bias,
                                      **prep.options, return_aux=True)  # fmt: skip
        eps = float(torch.finfo(dtype).eps)
        width = 5 if "label_smoothing" in LOSSES[case[0]][1] else 3
        per_block = (("MAX", 1), ("SUM", 1), ("MAX", 1), ("MIN", 1), ("MAX", 1), ("SUM", width))
        forward = [(op, k * rows) for rows in blocks for op, k in per_block]
        for rank, results in ranks.items():
            aux, calls = results["aux"][case]
            assert sorted(aux) == ["correct", "lse", "z_term"], (rank, case)
            rounded = torch.tensor(want["correct"]).to(dtype).double().numpy()
            np.testing.assert_array_equal(aux["correct"], rounded, err_msg=f"{rank} {case}")
            for key in ("lse", "z_term"):
                # a few roundings of the dtype at the statistic's scale (float32 arithmetic
                # for bfloat16)
                scale = np.max(np.abs(want[key][np.isfinite(want[key])]), initial=1.0)
                np.testing.assert_allclose(aux[key], want[key], rtol=0, atol=8 * eps * scale,
                                           err_msg=f"rank {rank} {case} {key}")  # fmt: skip
            assert calls == [("SUM", size), *forward], (rank, case, calls)


def test_bad_input_gets_one_sentence_naming_the_argument_on_every_rank(world):
    size, ranks = world
    for rank, results in ranks.items():
        errors = results["errors"]
        assert errors["in_range"] is None, errors["in_range"]
        assert errors["out_of_range"] == (
            "ValueError",
            f"`targets` has class index {V} at position (0,), outside [0, {V}) and not "
            "ignore_index=-100.",
        )
        kind, message = errors["weight_length"]
        assert kind == "ValueError" and message.startswith("`weight`") and str(V) in message
        assert errors["label_smoothing"] == (
            "ValueError",
            "`label_smoothing` is not supported with `process_group` for the focal loss with "
            "gamma != 0 (yet): pass 0.0. Received: label_smoothing=0.1 with gamma=2.0.",
        ), errors["label_smoothing"]
        kind, message = errors["group_type"]
        assert kind == "TypeError" and message.startswith("`process_group` must be a torch")
        kind, message = errors["empty"]
        assert kind == "ValueError" and message.startswith(
            "`linear_weight` must hold at least one class on every rank of `process_group`."
        ), message


def test_process_group_without_torch_distributed_raises():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=r"^`process_group` needs torch.distributed to be initial"):
        ti.linear_softmax_focal_loss(
            torch.zeros(2, 3), torch.zeros(4, 3), torch.tensor([0, 1]), process_group=object()
        )


def test_logits_spanning_beyond_the_largest_number_give_the_finite_loss_on_every_rank(world):
    # z_y - z_top overflowed on the rank that owns y: z_y itself rides in the SUM, and label
    # smoothing's far form of the class-weighted sum (``_linear_block``); every rank returned
    # inf where the spec's loss is about 0.25 x 0.9 x the largest number
    size, ranks = world
    hidden, kernel, bias, targets, vector = _span_inputs()
    for key, (name, options) in SPAN.items():
        kw = {k: vector if v == "span" else v for k, v in options.items()}
        want = getattr(spec, name)(hidden, kernel, targets, bias=bias, reduction="none", **kw)
        assert np.all(np.isfinite(want)), (key, want)
        for rank, results in ranks.items():
            value, grads_finite = results["span"][key]
            assert grads_finite, (size, rank, key)
            # float32 roundings of the logits and of a few terms: 1e-6 of the loss
            np.testing.assert_allclose(value, want, rtol=1e-6, atol=0,
                                       err_msg=f"{size} ranks, rank {rank}, {key}")  # fmt: skip
