#!/usr/bin/env bash
# The GPU checks of one device session (docs/devices.md, "First GPU run"), in two parts that each
# fit one device call (10 minutes at most) and together the session's 15 minutes of device time
# with a machine's start:
#
#   dev/gpu_check.sh checks   # about 4.5 minutes at most: the smoke test, tests/test_devices.py
#                             # with full tracebacks (the open host-sync failure), the JAX losses'
#                             # compiled programs on the GPU (no conditional/while/host transfer; a
#                             # jitted training step under jax.transfer_guard("disallow")) and the
#                             # launch profile of the torch losses -> $OUT/checks.txt
#   dev/gpu_check.sh bench    # about 8 minutes at most: benchmarks.run at 4096x1000 and 512x32000
#                             # (bench.txt, bench.json), benchmarks.llm_options with the LLM head's
#                             # (8192, 128256) bfloat16 (options.txt), and the fused linear LLM head
#                             # (benchmarks.linear --llm, N=8192, H=4096, V=128256 bfloat16: torch's
#                             # Triton kernels against F.cross_entropy, F.linear_cross_entropy and
#                             # Liger-Kernel where its wheel is in .whl/, each row with launches and
#                             # max_memory_allocated, then JAX against optax and tokamax) -> llm.txt
#   dev/gpu_check.sh          # both, one after the other (a machine without the call limit)
#
# Call the second part straight after the first: a machine stays warm 30 s after a call. Each step
# has its own timeout, and every step prints as it goes, so a step cut short keeps what it measured.
# The torch losses take their Triton kernels on CUDA (DUALLOSS_TORCH_KERNELS=auto): the smoke
# test's on-device step and the benchmarks judge and time the kernel path.
# Run from the repository root on a GPU machine where torch (CUDA) and jax (CUDA) are installed;
# a missing package (kornia, for the benchmark's focal peer; liger-kernel) comes as wheels in .whl/,
# installed first when present. Writes under ${OUT:-gpu-check}/, at most 5 files per part (a device
# call brings back 8).
set -uo pipefail
part="${1:-all}"
case "$part" in
    checks | bench | all) ;;
    *)
        echo "dev/gpu_check.sh takes checks, bench or nothing (both). Received: '$part'." >&2
        exit 2
        ;;
esac
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

checks() {
    log="$out/checks.txt"
    nvidia-smi -L | tee "$log"
    echo "## smoke" >> "$log"
    timeout 120 python3 -m dualloss.parity smoke >> "$log" 2>&1
    echo "## tests/test_devices.py" >> "$log"
    timeout 60 python3 -m pytest tests/test_devices.py -q -p no:cacheprovider --tb=long -rf \
        >> "$log" 2>&1
    echo "## tests/test_jax_hlo.py on the GPU" >> "$log"
    timeout 45 python3 -m pytest tests/test_jax_hlo.py -q -p no:cacheprovider --tb=short -rf \
        -k "transfer_guard or control_flow or loop_over_blocks" >> "$log" 2>&1
    echo "## launch profile" >> "$log"
    timeout 45 python3 -m dev.gpu_profile --device gpu:0 >> "$log" 2>&1
    grep -E "passed|failed|error|ms/call|PARITY" "$log" | tail -20
}

bench() {
    timeout 120 python3 -m benchmarks.run --device gpu:0 --shapes 4096x1000,512x32000 \
        --reps 7 --out "$out/bench.json" > "$out/bench.txt" 2>&1
    grep -E "^\| (torch|jax) \| (softmax|sigmoid)_[a-z_]+ \| 4096x1000" "$out/bench.txt"
    timeout 90 python3 -m benchmarks.llm_options --device gpu:0 --llm --reps 5 --warmup 2 \
        > "$out/options.txt" 2>&1
    grep -E "^\| (torch|jax) " "$out/options.txt"
    # torch first (issue 26), then JAX (issue 27): each method in a fresh process, rows as they come
    timeout 150 python3 -m benchmarks.linear --llm --llm-frameworks torch --reps 3 \
        > "$out/llm.txt" 2>&1
    timeout 120 python3 -m benchmarks.linear --llm --llm-frameworks jax --reps 3 \
        >> "$out/llm.txt" 2>&1
    cat "$out/llm.txt"
}

if [ "$part" != bench ]; then checks; fi
if [ "$part" != checks ]; then bench; fi
