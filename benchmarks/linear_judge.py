"""Judges torch's chunked ``F.linear_cross_entropy`` against the spec (docs/linear.md).

    python -m benchmarks.linear_judge

The regions, options and the error bound of ``tests/test_linear_parity.py`` (the bound our own
backends meet: float32 logits and accumulators, half-precision results rounded once), applied to
``F.linear_cross_entropy(..., options=LinearCrossEntropyOptions())`` in float64, float32 and
bfloat16, values and gradients w.r.t. input, linear_weight and linear_bias, reduction 'mean'.
Prints per case whether torch took the chunked path or fell back (with a warning) to the
reference path, and every quantity that is non-finite or beyond the bound (by how much).
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

import test_linear_parity as P  # noqa: E402

from dualloss import spec  # noqa: E402

CASES = (
    ("ce", {}),
    ("ce_weight", {"weight": "vector"}),
    ("ce_smoothing", {"label_smoothing": 0.1}),
)


def judge(dtype, region, options):
    hidden, kernel, bias, targets = P._region(region)
    options = P._options(options, kernel.shape[1])
    hidden, kernel, bias = (P._rounded(x, dtype) for x in (hidden, kernel, bias))
    tdtype = getattr(torch, dtype)
    leaves = [
        torch.tensor(hidden).to(tdtype).requires_grad_(),
        torch.tensor(kernel.T.copy()).to(tdtype).requires_grad_(),
        torch.tensor(bias).to(tdtype).requires_grad_(),
    ]
    kw = {
        k: (torch.tensor(v).to(tdtype) if isinstance(v, np.ndarray) else v)
        for k, v in options.items()
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = F.linear_cross_entropy(
            leaves[0], leaves[1], torch.tensor(targets), linear_bias=leaves[2],
            options=torch.nn.LinearCrossEntropyOptions(), **kw,
        )  # fmt: skip
        loss.backward()
    path = "fallback" if any("options" in str(w.message) for w in caught) else "chunked"
    got = [loss.detach(), leaves[0].grad, leaves[1].grad.T, leaves[2].grad]
    got = [x.double().numpy() for x in got]
    name = "linear_softmax_cross_entropy"
    expected = [spec.linear_softmax_cross_entropy(hidden, kernel, targets, bias=bias, **options)]
    expected += [
        spec.linear_softmax_cross_entropy_grad(hidden, kernel, targets, bias=bias, wrt=w, **options)
        for w in P.WRT
    ]
    bounds = P._bound(name, dtype, hidden, kernel, bias, targets, "mean", options)
    findings = []
    for what, g, e, bound in zip(("value", *P.WRT), got, expected, bounds, strict=True):
        e = np.asarray(e)
        if dtype == "bfloat16":
            bound = bound + 2.0**-8 * np.abs(e)
        if not np.all(np.isfinite(g)):
            findings.append(f"{what} non-finite")
            continue
        excess = np.max(np.abs(g - e) / (bound + np.finfo(np.float32).tiny))
        if excess > 1:
            findings.append(f"{what} {excess:.2g}x the bound")
    return path, findings


def main():
    for dtype in ("float64", "float32", "bfloat16"):
        for region in P.REGIONS:
            for label, options in CASES:
                path, findings = judge(dtype, region, options)
                print(
                    f"{dtype:9s} {region:19s} {label:13s} {path:9s} {'; '.join(findings) or 'ok'}"
                )


if __name__ == "__main__":
    main()
