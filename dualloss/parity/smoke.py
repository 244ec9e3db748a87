"""``dualloss-parity smoke``: the device path end to end in at most ~10 minutes, PASS/FAIL per step.

Each step runs in its own subprocess (``python -m dualloss.parity.smoke STEP DEVICE``) with a
time limit, so a device-side assert, a hung compile or a crash fails that step only. Without a
GPU the steps that mean something on a CPU run there (with the CPU's stand-ins for the guards)
and the GPU-only steps print ``NEEDS GPU``; the last line says which kind of run it was.

Steps:

* ``doctor``: frameworks, devices (JAX first), Triton, precision; no disagreement.
* ``losses_on_device``: every loss of the registry, both backends, float32/bfloat16/float64,
  forward and backward on the device with the sync and transfer guards on
  (``torch.cuda.set_sync_debug_mode("error")``, ``jax.transfer_guard("disallow")``; on the CPU a
  torch function mode that refuses host reads stands in for the first), judged by the spec.
* ``parity_compile``: a parity slice (three regions, float32, every loss) with torch.compile,
  on the device, compile budget 150 s.
* ``graph_breaks``: ``torch._dynamo.explain`` of every torch loss: 0 graph breaks.
* ``assert_poisoning`` (GPU): a gather with -100 poisons a CUDA process (shown in a subprocess);
  ``check`` of a gather-based focal loss on the GPU still completes, ignored labels reported
  unsupported by the CPU screen, and CUDA works afterwards.
* ``benchmark`` (GPU): a quick benchmark on the device with device memory (needs the
  repository's ``benchmarks/``).
* ``device_tests``: ``pytest tests/test_devices.py`` (needs the repository's ``tests/``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

STEPS = (
    "doctor",
    "losses_on_device",
    "parity_compile",
    "graph_breaks",
    "assert_poisoning",
    "benchmark",
    "device_tests",
)
GPU_ONLY = ("assert_poisoning", "benchmark")
LIMITS = {
    "doctor": 60,
    "losses_on_device": 90,
    "parity_compile": 200,
    "graph_breaks": 60,
    "assert_poisoning": 60,
    "benchmark": 60,
    "device_tests": 180,
}
TOTAL_SECONDS = 600
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST_READS = {"__bool__", "item", "cpu", "numpy", "tolist", "__float__", "__int__", "__index__"}


def main(device: str = "gpu:0", skip=(), has_gpu: bool | None = None) -> bool:
    """Runs every step not in `skip`, prints a line each; False when a step failed."""
    from . import devices

    if has_gpu is None:
        devices.start()
        has_gpu = device in devices.visible("torch") or device in devices.visible("jax")
    target = device if has_gpu else "cpu"
    print(f"dualloss smoke on {target}" + ("" if has_gpu else f" ({device} not present)"))
    started = time.monotonic()
    failed, passed, needs = [], [], []
    for step in STEPS:
        if step in skip:
            print(f"SKIP       {step} (asked)")
            continue
        if step in GPU_ONLY and not has_gpu:
            needs.append(step)
            print(f"NEEDS GPU  {step}")
            continue
        left = TOTAL_SECONDS - (time.monotonic() - started)
        if left < 5:
            failed.append(step)
            print(f"FAIL       {step} (the {TOTAL_SECONDS}s budget is spent)")
            continue
        limit = min(LIMITS[step], left)
        began = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "dualloss.parity.smoke", step, target],
                capture_output=True, text=True, timeout=limit, cwd=ROOT,
            )  # fmt: skip
            lines = (done.stdout + done.stderr).strip().splitlines()
            detail = lines[-1] if lines else ""
            ok = done.returncode == 0
            skipped = done.returncode == 3
        except subprocess.TimeoutExpired:
            ok, skipped, detail = False, False, f"timed out after {limit:.0f}s"
        seconds = time.monotonic() - began
        word = "SKIP" if skipped else "PASS" if ok else "FAIL"
        print(f"{word:<10} {step} ({seconds:.0f}s): {detail[:300]}")
        if skipped:
            continue
        (passed if ok else failed).append(step)
    total = time.monotonic() - started
    verdict = "FAIL" if failed else "PASS"
    kind = "GPU run" if has_gpu else "CPU run: the GPU path was NOT exercised"
    needs_text = f", {len(needs)} need a GPU ({', '.join(needs)})" if needs else ""
    print(
        f"SMOKE {verdict} ({kind}): {len(passed)} passed, {len(failed)} failed{needs_text}, "
        f"{total:.0f}s"
    )
    return not failed


# ----------------------------------------------------------------------------------------------
# The steps (each in its own process; exit 0 pass, 1 fail, 3 skipped)
# ----------------------------------------------------------------------------------------------


def step_doctor(device: str) -> bool:
    from . import devices

    lines, ok = devices.doctor()
    print("\n".join(lines[1:]))
    return ok


def _host_read_guard():
    """A torch function mode that raises on host reads of tensor values (the CPU's stand-in for
    ``torch.cuda.set_sync_debug_mode('error')``)."""
    from torch.overrides import TorchFunctionMode

    class RefuseHostReads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in HOST_READS:
                raise RuntimeError(f"host read of a tensor value: {func.__name__}")
            return func(*args, **(kwargs or {}))

    return RefuseHostReads()


def step_losses_on_device(device: str) -> bool:
    from . import devices

    devices.start()
    import jax
    import numpy as np
    import torch

    from .. import losses
    from . import backends as B
    from .cases import LOSSES, from_torch_layout, make_cases, to_torch_layout
    from .tolerance import judge

    jax.config.update("jax_enable_x64", True)
    devices.pin_precision()
    from dualloss import jax_impl, torch_impl

    if not devices.is_gpu(device):
        # the CPU stands in for an accelerator: the losses take their accelerator validation path
        torch_impl._inputs._reads_on_host = lambda x: False
        jax_impl._inputs._on_host = lambda x: not isinstance(x, jax.Array)
        print("cpu: the accelerator validation path forced, host reads refused by a torch mode")
    torch_dev = devices.torch_name(device)
    jax_dev = devices.device_object("jax", device)
    problems, calls = [], 0
    for name in LOSSES:
        softmax = losses.get(name).is_softmax
        for dtype in ("float32", "bfloat16", "float64"):
            case = make_cases(name, dtype, regions=["typical"])[0]
            prep = B.prepare(case, dtype)
            options = {k: v for k, v in prep.options.items() if k != "axis"}
            if any(isinstance(v, np.ndarray) for v in options.values()):
                continue
            # torch, inputs on the device first, then the call under the guard
            logits = to_torch_layout(prep.logits) if softmax else prep.logits
            targets = prep.targets
            if softmax and not case.index_targets:
                targets = to_torch_layout(targets)
            x = B.torch_array(logits, dtype, torch_dev).requires_grad_(True)
            t = B.torch_array(targets, dtype, torch_dev)
            fn = getattr(torch_impl, name)
            try:
                if devices.is_gpu(device):
                    torch.cuda.set_sync_debug_mode("error")
                    guard = None
                else:
                    guard = _host_read_guard()
                    guard.__enter__()
                try:
                    out = fn(x, t, **options)
                    (grad,) = torch.autograd.grad(out.sum(), x)
                finally:
                    if devices.is_gpu(device):
                        torch.cuda.set_sync_debug_mode("default")
                    else:
                        guard.__exit__(None, None, None)
                value = out.detach().double().cpu().numpy()
                grad = grad.double().cpu().numpy()
                if softmax:
                    grad = from_torch_layout(grad)
                j = judge(name, prep.ref_logits, prep.ref_targets, prep.options, dtype, value,
                          grad, standard="strict")  # fmt: skip
                calls += 1
                if j.kind != "ok":
                    problems.append(f"torch {name} {dtype}: {j.kind}")
            except Exception as error:  # noqa: BLE001 - the finding
                problems.append(f"torch {name} {dtype}: {type(error).__name__}: {error}"[:200])
            # JAX: eager and jit, under the transfer guard
            xj = jax.device_put(np.asarray(prep.logits), jax_dev)
            tj = jax.device_put(np.asarray(prep.targets), jax_dev)
            jfn = getattr(jax_impl, name)
            for mode in ("eager", "jit"):
                try:

                    def f(x, t, jfn=jfn, options=options):
                        return jfn(x, t, **options)

                    def value_and_grad(x, t, f=f):
                        value, pull = jax.vjp(lambda x: f(x, t), x)
                        return value, pull(jax.numpy.ones_like(value))[0]

                    call = jax.jit(value_and_grad) if mode == "jit" else value_and_grad
                    # eager ops move their Python scalars host-to-device by design: there
                    # only device-to-host copies (a host sync) are refused
                    guard = (
                        jax.transfer_guard if mode == "jit" else jax.transfer_guard_device_to_host
                    )
                    with guard("disallow"):
                        value, grad = call(xj, tj)
                        jax.block_until_ready((value, grad))
                    value = np.asarray(value).astype(np.float64)
                    grad = np.asarray(grad).astype(np.float64)
                    j = judge(name, prep.ref_logits, prep.ref_targets, prep.options, dtype, value,
                              grad, standard="strict")  # fmt: skip
                    calls += 1
                    if j.kind != "ok":
                        problems.append(f"jax {mode} {name} {dtype}: {j.kind}")
                except Exception as error:  # noqa: BLE001 - the finding
                    text = f"jax {mode} {name} {dtype}: {type(error).__name__}: {error}"
                    problems.append(text.splitlines()[0][:200])
    for p in problems:
        print(p)
    print(f"{calls} calls judged on {device} with guards on; {len(problems)} problems")
    return calls > 0 and not problems


def step_parity_compile(device: str) -> bool:
    from . import devices, report, runner

    devices.start()
    impls = runner.default_implementations()
    result = runner.run_matrix(
        impls, dtypes=["float32"], devices=[device], level="quick",
        regions=["typical", "ignored", "confident_correct"], torch_compile=True,
        progress=False, compile_budget_s=150.0,
    )  # fmt: skip
    text = report.terminal_summary(result, max_failures=3)
    print("\n".join(text.splitlines()[-12:]))
    return result.ok


def step_graph_breaks(device: str) -> bool:
    from .. import losses
    from . import devices

    devices.start(["torch"])
    import torch

    from dualloss import torch_impl

    dev = devices.torch_name(device)
    x = torch.randn(8, 5, device=dev, requires_grad=True)
    index = torch.tensor([0, 1, 2, 3, 4, 0, 1, -100], device=dev)
    soft = torch.rand(8, 5, device=dev)
    calls = {
        losses.SOFTMAX_CROSS_ENTROPY: (index, {"label_smoothing": 0.1}),
        losses.SOFTMAX_FOCAL_LOSS: (index, {"gamma": 2.0, "alpha": torch.rand(5, device=dev)}),
        losses.SIGMOID_CROSS_ENTROPY: (soft, {}),
        losses.SIGMOID_FOCAL_LOSS: (soft, {"gamma": 2.0, "alpha": 0.25}),
    }
    worst = 0
    for info, (t, kwargs) in calls.items():
        torch._dynamo.reset()
        explained = torch._dynamo.explain(getattr(torch_impl, info.name))(x, t, **kwargs)
        count = explained.graph_break_count
        worst = max(worst, count)
        print(f"{info.name}: {count} graph breaks, {explained.graph_count} graph(s)")
    print(f"graph breaks on {device}: at most {worst}")
    return worst == 0


def _gather_focal(logits, targets):
    """A focal loss written with gather and no ignore_index (a device assert on CUDA at -100)."""
    import torch

    log_p = torch.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    return (-((1 - log_p.exp()) ** 2) * log_p).mean()


def step_assert_poisoning(device: str) -> bool:
    from . import devices

    if not devices.is_gpu(device):
        return True
    dev = devices.torch_name(device)
    poison = (
        f"import torch; x = torch.randn(4, 5, device={dev!r}); t = torch.tensor([0, 1, 2, -100], "
        f"device={dev!r}); print(x.gather(1, t[:, None]).sum().item())"
    )
    child = subprocess.run([sys.executable, "-c", poison], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    poisoned = child.returncode != 0
    outcome = "failed (device-side assert), as expected" if poisoned else "did NOT fail"
    print(f"a gather with -100 on {dev} in a child process: {outcome}")
    from .. import losses
    from ._check import check

    report = check(_gather_focal, losses.SOFTMAX_FOCAL_LOSS.name, backend="torch", device=device,
                   dtypes=["float32"], max_examples=5)  # fmt: skip
    import torch

    alive = torch.ones(3, device=dev).sum().item() == 3.0
    screened = "ignored" in report.unsupported and "CPU screen" in report.unsupported["ignored"]
    print(f"check() on {device}: ok={report.ok}, ignored labels unsupported via the CPU screen: "
          f"{screened}, CUDA usable afterwards: {alive}")  # fmt: skip
    return poisoned and screened and alive and report.ok


def step_benchmark(device: str) -> int:
    if not os.path.isdir(os.path.join(ROOT, "benchmarks")):
        print("benchmarks/ not found (run from a checkout of the repository)")
        return 3
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--tiny", "--shapes", "4096x1000", "--reps", "5",
         "--device", device, "-q"],
        capture_output=True, text=True, timeout=LIMITS["benchmark"] - 5, cwd=ROOT,
    )  # fmt: skip
    print(done.stdout[-3000:] + done.stderr[-1000:])
    has_memory = "Device memory" in done.stdout or not device.startswith("gpu")
    print(f"benchmark on {device}: exit {done.returncode}, device memory reported: {has_memory}")
    return done.returncode == 0 and has_memory


def step_device_tests(device: str) -> int:
    path = os.path.join(ROOT, "tests", "test_devices.py")
    if not os.path.exists(path):
        print("tests/test_devices.py not found (run from a checkout of the repository)")
        return 3
    command = [sys.executable, "-m", "pytest", path, "-q", "-x", "-p", "no:cacheprovider"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          timeout=LIMITS["device_tests"] - 5)  # fmt: skip
    print(done.stdout[-2000:])
    return done.returncode == 0


def _run_step(step: str, device: str) -> int:
    result = globals()[f"step_{step}"](device)
    if result is True or result is False:
        return 0 if result else 1
    return int(result) if result in (0, 1, 3) else (0 if result else 1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in STEPS:
        print(f"usage: python -m dualloss.parity.smoke STEP DEVICE, STEP among {', '.join(STEPS)}")
        sys.exit(2)
    sys.exit(_run_step(sys.argv[1], sys.argv[2]))
