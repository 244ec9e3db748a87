#!/usr/bin/env bash
# The GPU checks of one device session, in one call (docs/devices.md, "First GPU run"):
#   the smoke test, tests/test_devices.py with full tracebacks (the open host-sync failure),
#   the benchmark at three shapes, the launch profile of the torch losses, the JAX losses' compiled
#   programs on the GPU (no conditional/while/host transfer; a jitted training step under
#   jax.transfer_guard("disallow")), and the LLM head in bfloat16 (benchmarks.linear --llm: JAX,
#   then torch with its Triton kernels against F.cross_entropy, F.linear_cross_entropy and
#   Liger-Kernel where its wheel is in .whl/, each row with launches and max_memory_allocated).
# The torch losses take their Triton kernels on CUDA (DUALLOSS_TORCH_KERNELS=auto), so the smoke
# test's on-device step and the benchmark judge and time the kernel path.
# Run from the repository root on a GPU machine where torch (CUDA) and jax (CUDA) are installed;
# a missing package (kornia, for the benchmark's focal peer) comes as wheels in .whl/, installed
# first when present. Writes everything under ${OUT:-gpu-check}/; about 7-8 minutes on an H200
# (smoke 2.5, tests 1.5, benchmark 3, profile 0.5) plus the JAX checks (1) and the LLM head (5-6,
# not yet timed on a GPU).
set -uo pipefail
out="${OUT:-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
nvidia-smi -L | tee "$out/gpu.txt"
python3 -m dualloss.parity smoke 2>&1 | tee "$out/smoke.txt"
timeout 150 python3 -m pytest tests/test_devices.py -q -p no:cacheprovider --tb=long -rf \
    > "$out/test_devices.txt" 2>&1
tail -3 "$out/test_devices.txt"
timeout 170 python3 -m benchmarks.run --device gpu:0 --shapes 4096x1000,65536x10,512x32000 \
    --reps 11 --out "$out/bench.json" > "$out/bench.txt" 2>&1
grep -E "^\| (torch|jax) \| (softmax|sigmoid)_[a-z_]+ \| 4096x1000" "$out/bench.txt"
timeout 90 python3 -m dev.gpu_profile --device gpu:0 > "$out/profile.txt" 2>&1
grep "ms/call" "$out/profile.txt"
timeout 120 python3 -m pytest tests/test_jax_hlo.py -q -p no:cacheprovider --tb=short -rf \
    -k "transfer_guard or control_flow or loop_over_blocks" > "$out/jax_hlo.txt" 2>&1
tail -3 "$out/jax_hlo.txt"
timeout 420 python3 -m benchmarks.linear --llm --reps 5 --json "$out/llm.json" > "$out/llm.txt" 2>&1
cat "$out/llm.txt"
