"""The benchmark command keeps working: one tiny run of each part (seconds, no timed assertions).

Also checks that each benchmark pair computes the same thing, so that a ratio compares like with
like: dualloss and its peer agree on the loss value with the settings the benchmark uses.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from dualloss import losses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

for _module in ("torch", "jax", "optax", "kornia", "matplotlib"):
    pytest.importorskip(_module)

from benchmarks import peers, run  # noqa: E402

TINY = (16, 7)


@pytest.mark.slow
def test_benchmark_command_runs_at_tiny_size(tmp_path):
    out, png = tmp_path / "results.json", tmp_path / "ratios.png"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--tiny",
            "--shapes",
            "16x7",
            "--reps",
            "2",
            "--warmup",
            "1",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--plot",
            str(png),
            "-q",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "| torch | softmax_cross_entropy | 16x7 |" in completed.stdout
    assert "| jax | sigmoid_focal_loss | 16x7 |" in completed.stdout
    results = json.loads(out.read_text())
    assert len(results["time"]) == 2 * len(peers.LOSSES)
    assert all(math.isfinite(row["ratio"]) and row["ratio"] > 0 for row in results["time"])
    assert len(results["memory"]) == 2 * len(peers.LOSSES)
    for row in results["memory"]:
        if row["framework"] == "torch":
            assert row["dualloss"]["total"] > 0 and row["peer_stats"]["total"] > 0
    assert png.stat().st_size > 0


def test_targets_are_judged_at_the_target_shape():
    rows = run.bench_torch(
        ["softmax_cross_entropy"],
        [run.TARGET_SHAPE[:1] + (3,)],
        "cpu",
        1,
        0,
        peers.torch_candidates(),
        peers.torch_peers(),
        lambda message: None,
    )[0]
    run.judge(rows, [])
    assert rows[0].status == ""  # not the target shape: no verdict
    rows[0].shape = run.TARGET_SHAPE
    target = run.TIME_TARGETS["torch", "softmax_cross_entropy"]
    for ratio, expected in ((0.9 * target, "PASS"), (target, "PASS"), (1.1 * target, "MISS")):
        rows[0].ratio = ratio
        run.judge(rows, [])
        assert (rows[0].status, rows[0].target) == (expected, target), ratio


def test_update_doc_replaces_only_the_generated_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{run.DOC_BEGIN}\nold\n{run.DOC_END}\noutro\n")
    run.update_doc(str(doc), "new table")
    assert doc.read_text() == f"intro\n{run.DOC_BEGIN}\nnew table\n{run.DOC_END}\noutro\n"


@pytest.mark.parametrize("loss", peers.LOSSES)
def test_torch_pair_computes_the_same_loss(loss):
    import torch

    logits_np, targets_np = run.make_inputs(loss, TINY)
    logits, targets = torch.from_numpy(logits_np).double(), torch.from_numpy(targets_np)
    if not losses.get(loss).is_softmax:
        targets = targets.double()
    candidate = peers.torch_candidates()[loss](logits, targets)
    peer = peers.torch_peers()[loss](logits, targets)
    if losses.get(loss).class_vector == "alpha":
        # kornia weights class 0 by 1 - alpha and divides 'mean' by N * C: the same work, and
        # the same value once rescaled with a per-class alpha.
        from dualloss import torch_impl

        alpha = torch.full((TINY[1],), peers.ALPHA, dtype=torch.float64)
        alpha[0] = 1 - peers.ALPHA
        candidate = (
            torch_impl.softmax_focal_loss(logits, targets, axis=1, gamma=peers.GAMMA, alpha=alpha)
            / TINY[1]
        )
    np.testing.assert_allclose(candidate.item(), peer.item(), rtol=1e-10, err_msg=loss)


@pytest.mark.parametrize("loss", peers.LOSSES)
def test_jax_pair_computes_the_same_loss(loss):
    import jax.numpy as jnp

    logits_np, targets_np = run.make_inputs(loss, TINY)
    targets = targets_np.astype(np.int32) if losses.get(loss).is_softmax else targets_np
    candidate = peers.jax_candidates()[loss](jnp.asarray(logits_np), jnp.asarray(targets))
    peer = peers.jax_peers()[loss](jnp.asarray(logits_np), jnp.asarray(targets))
    np.testing.assert_allclose(float(candidate), float(peer), rtol=2e-5, err_msg=loss)
