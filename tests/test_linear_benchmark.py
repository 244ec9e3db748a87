"""benchmarks/linear.py keeps working (tiny shape, seconds, no timed assertions), and its pairs
compute the same loss, so that a ratio compares like with like."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

for _module in ("torch", "jax", "optax"):
    pytest.importorskip(_module)

from benchmarks import linear  # noqa: E402


def test_torch_methods_compute_the_same_cross_entropy():
    hidden, weight, targets = linear._torch_inputs(64, 16, 500)
    values = {
        m: linear._torch_loss(m)(hidden, weight, targets).item() for m in linear.TORCH_METHODS
    }
    ce = values.pop("ours_focal")
    assert ce < values["ours"]  # the focal loss is smaller than CE for every row
    for value in values.values():
        assert abs(value - values["unfused"]) <= 1e-5 * abs(values["unfused"])


def test_jax_methods_compute_the_same_cross_entropy():
    jitted, hidden, weight = linear._jax_functions(64, 16, 500)
    ours = float(jitted["ours"](hidden, weight)[0])
    unfused = float(jitted["unfused"](hidden, weight)[0])
    assert abs(ours - unfused) <= 1e-5 * abs(unfused)


def test_benchmark_parts_run_at_a_tiny_shape():
    assert set(linear.torch_times(32, 8, 100, reps=1)) == set(linear.TORCH_METHODS)
    assert set(linear.jax_times(32, 8, 100, reps=1)) == set(linear.JAX_METHODS)
    memory = linear.jax_memory(32, 8, 100)
    assert memory["unfused"] >= 32 * 100 * 4  # the logits are among XLA's temporaries
    ratios, ours, unfused = linear.torch_pair_ratios(32, 8, 100, pairs=3)
    assert len(ratios) == len(ours) == len(unfused) == 3
    assert min(ours) > 0 and min(unfused) > 0


def test_torch_memory_sees_the_logits_unfused_and_only_the_block_fused():
    # (N, H, V) = (1024, 16, 8192): 32 MiB of float32 logits, large against the RSS noise; the
    # unfused loss holds the logits and their gradient together (measured 3.0x the logits), ours
    # the (r, V) block and the hidden gradient of the memory model (measured 1.07x the model)
    n, h, v = 1024, 16, 8192
    logits = n * v * 4
    unfused = linear.torch_memory("unfused", n, h, v)
    assert unfused >= 2 * logits, f"unfused: {unfused} bytes, logits alone are {logits}"
    model = linear.torch_model_bytes(n, h, v)
    ours = linear.torch_memory("ours", n, h, v)
    assert 0.9 * model <= ours <= 1.25 * model, f"ours: {ours} bytes, the model says {model}"


def test_memory_model_uses_the_default_block_of_docs_linear_md():
    # r = 512 rows at V = 8k (the 16 MiB floor), 256 at 32k (1/16 of the logits), 256 and 128
    # at 64k and 128k (the 64 MiB cap); plus the (N, H) float32 hidden gradient
    rows = {8192: 512, 32768: 256, 65536: 256, 131072: 128}
    for v, r in rows.items():
        assert linear.torch_model_bytes(4096, 256, v) == r * v * 4 + 4096 * 256 * 4


def test_memory_plot_is_written(tmp_path):
    vs = [8192, 16384]
    sweep = {"V": vs, "N": 64, "H": 16, "model": [1.0, 2.0]}
    sweep.update({key: [2.0**20, 2.0**21] for key in linear.LABELS})
    path = tmp_path / "memory.png"
    linear.plot_memory(sweep, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_torch_llm_head_methods_compute_the_same_loss():
    """The torch rows of ``--llm`` (the CPU, eager, a small shape): each method is the same
    cross entropy of the same bfloat16 inputs (Liger's where it imports), so their times
    compare like with like."""
    import torch

    shape = (16, 8, 50)
    values = {}
    for method in linear.TORCH_LLM_METHODS:
        if "liger" in method:
            continue  # its Triton kernels need CUDA or the interpreter
        fn, inputs = linear._torch_llm_function(method, shape)
        values[method] = fn(*inputs).float().item()
    assert values.pop("torch_linear_ours_focal") < values["torch_linear_ours"]
    for method in ("torch_linear_chunked", "torch_linear_unfused"):
        torch.testing.assert_close(values[method], values["torch_linear_ours"], rtol=2e-2, atol=0)
    torch.testing.assert_close(values["torch_logits_ours"], values["torch_logits_torch"],
                               rtol=1e-2, atol=0)  # fmt: skip


def test_torch_llm_one_prints_one_json_row(capsys):
    import json

    linear.torch_llm_one("torch_logits_ours", 1, (8, 4, 30))
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["method"] == "torch_logits_ours" and row["seconds"] > 0
    assert row["logits_bytes"] == 8 * 30 * 2 and row["launches"] is None  # no CUDA here
