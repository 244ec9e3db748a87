"""Both backends' row blocks against the spec where N is not a multiple of the block.

The fused losses stream over blocks of `chunk_size` rows (torch_impl: a Python loop over
slices; jax_impl: the rows padded to whole blocks for a ``lax.scan``). A block that is not full
is where a slice, a pad or an accumulator can go wrong without touching the full blocks: a pad
that repeats the last row (instead of an ignored row) counts it again in the weight and bias
gradients, a last block shifted back to be full counts the overlap twice, a loop that stops at
the last full block drops the rest. The default chunk size never leaves a partial block at test
shapes (it is a power of two, capped at N), and comparing two chunk sizes, or jit with eager,
compares the code with itself. So every case here is judged against the spec's value and its
gradients w.r.t. hidden, linear_weight and bias, at the sizes where the blocks do not fit:

* fewer rows than one block (3 rows, blocks of 5);
* exactly one extra row (11 = 2 x 5 + 1);
* one row short of whole blocks (14 = 3 x 5 - 1: the pad is one row);
* the issue's shape (12 = 2 x 5 + 2).

The last row is always kept (an ignored last row would hide a repeated one: it enters with
hidden 0) and an earlier row is ignored. Options: plain cross entropy, class weights, class
weights with label smoothing and an ignore_index of 7, focal (gamma 2), focal with a vector alpha
and label smoothing (the dense block path), focal with a scalar alpha and an ignore_index of 3;
reductions 'none', 'mean', 'sum'; float64 and float32. The judgement is ``parity.linear``'s
strict standard (the derived bound of test_linear_parity.py, nothing loosened).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dualloss import spec
from dualloss import torch_impl as T
from dualloss.parity import linear as L

H, V = 6, 23  # V prime: no block of classes divides it either
CHUNK = 5
ROWS = {
    "fewer_rows_than_a_block": 3,
    "one_extra_row": 11,
    "one_row_short": 14,
    "two_extra_rows": 12,
}
OPTIONS = {
    "ce": ("linear_softmax_cross_entropy", {}),
    "ce_weight": ("linear_softmax_cross_entropy", {"weight": "vector"}),
    "ce_weight_smoothing_ignore7": (
        "linear_softmax_cross_entropy",
        {"weight": "vector", "label_smoothing": 0.1, "ignore_index": 7},
    ),
    "focal": ("linear_softmax_focal_loss", {"gamma": 2.0}),
    "focal_alpha_smoothing": (
        "linear_softmax_focal_loss",
        {"gamma": 0.5, "alpha": "vector", "label_smoothing": 0.1},
    ),
    "focal_alpha_ignore3": (
        "linear_softmax_focal_loss",
        {"gamma": 1.5, "alpha": 0.25, "ignore_index": 3},
    ),
}
REDUCTIONS = ("none", "mean", "sum")
DTYPES = ("float64", "float32")


def _case(loss, options, rows, seed=0):
    """A case of `rows` rows with the last row kept and row 1 ignored, blocks of CHUNK rows."""
    rng = np.random.default_rng(seed)
    ignore_index = options.get("ignore_index", -100)
    hidden = rng.normal(size=(rows, H))
    kernel = rng.normal(size=(H, V)) / np.sqrt(H)
    bias = rng.normal(size=V) * 0.5
    # never the ignore_index by chance: only row 1 is ignored
    targets = (ignore_index + 1 + rng.integers(0, V - 1, size=rows)) % V
    if rows > 2:
        targets[1] = ignore_index
    options = {**L.option_values(options, V), "chunk_size": CHUNK}
    return L.LinearCase(loss, "partial_blocks", f"{rows}x{H}x{V}/blocks of {CHUNK}", hidden,
                        kernel, bias, targets.astype(np.int64), options)  # fmt: skip


@pytest.mark.exhaustive(cover=("backend", "rows"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("backend", ("torch", "jax"))
def test_partial_row_blocks_match_the_spec(backend, rows, option, reduction, dtype):
    name, options = OPTIONS[option]
    case = _case(name, options, ROWS[rows])
    assert case.targets[-1] != options.get("ignore_index", -100)
    prep = L.prepare(case, dtype)
    fn = L.ours(backend, name, prep.options, reduction)
    prep.options["reduction"] = reduction
    outcome = L.run(fn, backend, prep)
    assert outcome.error is None, outcome.error
    judgement = L.judge(name, prep, outcome, "strict")
    context = f"[{backend}.{name}({options}, chunk_size={CHUNK}), {rows}, {reduction}, {dtype}]"
    assert judgement.kind == "ok", f"{'; '.join(judgement.problems)} {context}"


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("rows", ROWS)
def test_drop_in_batch_chunks_with_partial_blocks_match_the_spec(rows, reduction):
    # torch_impl.linear_cross_entropy takes its block size from options.batch_chunk_size
    case = _case("linear_softmax_cross_entropy",
                 {"weight": "vector", "label_smoothing": 0.1}, ROWS[rows])  # fmt: skip
    hidden = torch.tensor(case.hidden, requires_grad=True)
    kernel = torch.tensor(case.linear_weight.T.copy(), requires_grad=True)
    bias = torch.tensor(case.bias, requires_grad=True)
    weight = torch.tensor(case.options["weight"])
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=CHUNK)
    loss = T.linear_cross_entropy(hidden, kernel, torch.tensor(case.targets), linear_bias=bias,
                                  weight=weight, reduction=reduction, label_smoothing=0.1,
                                  options=options)  # fmt: skip
    loss.sum().backward()
    args = (case.hidden, case.linear_weight, case.targets)
    kwargs = dict(bias=case.bias, weight=case.options["weight"], label_smoothing=0.1,
                  reduction=reduction)  # fmt: skip
    expected = [spec.linear_softmax_cross_entropy(*args, **kwargs)] + [
        spec.linear_softmax_cross_entropy_grad(*args, wrt=wrt, **kwargs) for wrt in L.WRT
    ]
    expected[2] = expected[2].T
    got = (loss.detach(), hidden.grad, kernel.grad, bias.grad)
    # the tolerance of test_linear_torch.py's float64 comparisons with the spec
    for what, g, e in zip(("value", *L.WRT), got, expected, strict=True):
        e = np.asarray(e)
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-11, atol=1e-13 * np.abs(e).max(),
                                   err_msg=f"{what} [{rows}, {reduction}]")  # fmt: skip
