"""The device path (docs/devices.md), checked on whatever devices are here: naming, defaults,
missing and one-sided GPUs (mocked device lists), JAX before torch, reproducers and ``check`` on
the right device, no host sync in the losses on an accelerator, compile failures and budgets,
the CPU screen before CUDA, pinned precision, benchmarks, and the smoke command.

Tests that take `device` run once per device (tests/conftest.py: CPU here, every GPU where
present)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from dualloss import losses
from dualloss.parity import backends as B
from dualloss.parity import devices as D
from dualloss.parity import runner
from dualloss.parity.__main__ import main
from dualloss.parity.cases import make_cases

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from dualloss import jax_impl, torch_impl  # noqa: E402 - after the importorskips

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_READS = {"__bool__", "item", "cpu", "numpy", "tolist", "__float__", "__int__", "__index__"}


def _missing_gpu() -> str:
    """A GPU that no framework here sees (gpu:0 on a CPU machine)."""
    count = max(D.gpu_count("torch"), D.gpu_count("jax"))
    return f"gpu:{count}"


@pytest.fixture
def seen(monkeypatch):
    """Replace what each framework sees: seen({'torch': [...], 'jax': [...]})."""

    def install(table):
        monkeypatch.setattr(D, "visible", lambda backend: list(table[backend]))
        monkeypatch.setattr(D, "start", lambda backends=D.BACKENDS: [])

    return install


# ----------------------------------------------------------------------------------------------
# 1. Names, defaults, missing and one-sided devices
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [("cpu", "cpu"), ("CPU:0", "cpu"), ("cpu:1", "cpu:1"), ("cuda", "gpu:0"), ("cuda:3", "gpu:3"),
     ("gpu", "gpu:0"), (" gpu:1 ", "gpu:1"), ("all", "all")],
)  # fmt: skip
def test_one_name_per_device(name, expected):
    assert D.canonical(name) == expected


@pytest.mark.parametrize("name", ["tpu:0", "cuda:-1", "gpu:x", "", "cuda0", 3, None])
def test_unknown_device_names_are_refused_in_one_sentence(name):
    with pytest.raises(
        ValueError, match=r"^`devices` entries must be 'cpu', 'gpu:N' .* Received: "
    ):
        D.canonical(name)


def test_aliases_collapse_to_one_device():
    assert D.parse("cuda:0,gpu:0,cpu,cpu:0") == ["gpu:0", "cpu"]
    assert D.torch_name("gpu:2") == "cuda:2"
    with pytest.raises(D.DeviceError, match="`devices` has 'cpu:1', which torch does not have"):
        D.torch_name("cpu:1")


def test_default_is_cpu_and_the_first_gpu_only(seen):
    gpus = [f"gpu:{i}" for i in range(8)]
    seen({"torch": ["cpu", *gpus], "jax": ["cpu", *gpus]})
    assert D.resolve(("torch", "jax")) == ["cpu", "gpu:0"]
    assert D.resolve(("torch", "jax"), ["all"]) == ["cpu", *gpus]


def test_default_without_a_gpu_is_the_cpu(seen):
    seen({"torch": ["cpu"], "jax": ["cpu"]})
    assert D.resolve(("torch", "jax")) == ["cpu"]


def test_a_gpu_one_framework_lacks_is_a_hard_failure(seen):
    seen({"torch": ["cpu", "gpu:0"], "jax": ["cpu"]})
    with pytest.raises(D.DeviceError, match="'gpu:0', which torch sees but jax does not"):
        D.resolve(("torch", "jax"))
    with pytest.raises(D.DeviceError, match="which torch sees but jax does not"):
        D.resolve(("torch", "jax"), ["all"])
    # restricting the backends lifts it
    assert D.resolve(("torch",)) == ["cpu", "gpu:0"]
    assert D.resolve(("torch", "jax"), ["cpu"]) == ["cpu"]


def test_a_missing_device_is_a_hard_failure(seen):
    seen({"torch": ["cpu", "gpu:0"], "jax": ["cpu", "gpu:0"]})
    with pytest.raises(D.DeviceError, match="'gpu:1', which none of torch, jax sees"):
        D.resolve(("torch", "jax"), ["cpu", "cuda:1"])


def test_cli_run_on_a_missing_device_exits_2_naming_it(capsys):
    missing = _missing_gpu()
    alias = "cuda:" + missing.split(":")[1]
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--devices", f"cpu,{alias}", "--losses", "sigmoid_cross_entropy",
              "--dtypes", "float32", "--regions", "typical", "--no-progress"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"`devices` has '{missing}'" in err and "PARITY" not in err


def test_cli_run_with_a_one_sided_gpu_exits_2(seen, capsys):
    seen({"torch": ["cpu", "gpu:0"], "jax": ["cpu"]})
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--losses", "sigmoid_cross_entropy", "--dtypes", "float32",
              "--regions", "typical", "--no-progress"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "torch sees but jax does not" in capsys.readouterr().err


def test_cli_run_refuses_an_unknown_device_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--devices", "tpu:0"])
    assert exit_info.value.code == 2
    assert "Received: 'tpu:0'" in capsys.readouterr().err


def _sigmoid_impls():
    return [B.ours("torch", "sigmoid_cross_entropy"), B.ours("jax", "sigmoid_cross_entropy")]


def test_a_planned_device_that_judged_nothing_is_not_verified():
    sound = B.ours("torch", "sigmoid_cross_entropy")
    silent = B.ours("jax", "sigmoid_cross_entropy")
    silent.supports = lambda prep: False  # every case skipped: nothing judged there
    # on the CPU (a GPU machine's default adds gpu:0, which this test does not plan for)
    result = runner.run_matrix([sound, silent], dtypes=["float32"], regions=["typical"],
                               devices=["cpu"], progress=False)  # fmt: skip
    assert result.judged > 0 and not result.failures
    assert not result.ok
    assert sorted(result.untested) == [
        "jax_impl.sigmoid_cross_entropy on cpu (eager): nothing was judged",
        "jax_impl.sigmoid_cross_entropy on cpu (jit): nothing was judged",
    ]
    from dualloss.parity import report

    text = report.terminal_summary(result)
    assert "NOT TESTED: jax_impl.sigmoid_cross_entropy on cpu" in text
    assert "PARITY NOT VERIFIED" in text and "PARITY HOLDS" not in text


def test_run_records_devices_and_pinned_precision():
    torch.backends.cuda.matmul.allow_tf32 = True
    jax.config.update("jax_default_matmul_precision", "bfloat16")
    try:
        result = runner.run_matrix(_sigmoid_impls(), dtypes=["float32"], regions=["typical"],
                                   progress=False)  # fmt: skip
        assert result.ok
        # the default: cpu, plus gpu:0 on a GPU machine
        assert result.config["devices"] == D.defaults(["torch", "jax"])
        precision = result.config["precision"]
        assert precision["torch.backends.cuda.matmul.allow_tf32"] is False
        assert precision["jax_default_matmul_precision"] == "highest"
        assert torch.backends.cuda.matmul.allow_tf32 is False
        labels = {r.device for r in result.records}
        assert labels == set(D.defaults(["torch", "jax"]))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
        jax.config.update("jax_default_matmul_precision", None)


def test_jax_is_started_before_torch_and_does_not_preallocate():
    script = (
        "import sys, os; from dualloss.parity import runner; "
        "runner.default_implementations(('torch', 'jax'), ['sigmoid_cross_entropy']); "
        "order = list(sys.modules); "
        "print(order.index('jax') < order.index('torch'), "
        "os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "false"]


# ----------------------------------------------------------------------------------------------
# 2. doctor
# ----------------------------------------------------------------------------------------------


def test_doctor_reports_and_exits_0_when_the_frameworks_agree(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for needle in ("import order: jax then torch", "torch ", "jax ", "triton:",
                   "torch.backends.cuda.matmul.allow_tf32", "jax_default_matmul_precision",
                   "default devices: cpu", "doctor: OK"):  # fmt: skip
        assert needle in out, needle


def test_doctor_says_which_path_the_torch_losses_take(monkeypatch):
    monkeypatch.setenv("DUALLOSS_TORCH_KERNELS", "eager")
    lines, ok = D.doctor()
    assert ok and "torch losses take: cpu: eager closed forms (eager)" in lines
    monkeypatch.setenv("DUALLOSS_TORCH_KERNELS", "fast")
    lines, ok = D.doctor()
    assert not ok
    assert any("DUALLOSS_TORCH_KERNELS` must be 'auto', 'triton' or 'eager'" in x for x in lines)


def test_doctor_fails_on_a_disagreement(seen):
    seen({"torch": ["cpu", "gpu:0"], "jax": ["cpu"]})
    lines, ok = D.doctor()
    assert not ok
    assert any(line.startswith("DISAGREEMENT: GPUs seen torch 1, jax 0") for line in lines)


# ----------------------------------------------------------------------------------------------
# 3. Reproducers and check()
# ----------------------------------------------------------------------------------------------


def _prep(loss="softmax_focal_loss", dtype="float32"):
    return B.prepare(make_cases(loss, dtype, regions=["typical"])[0], dtype)


def test_reproducers_carry_the_device():
    prep = _prep()
    torch_line = B.reproducer(B.ours("torch", "softmax_focal_loss"), prep, "gpu:1")
    assert torch_line.count("device='cuda:1'") == 2  # logits and targets
    jax_line = B.reproducer(B.ours("jax", "softmax_focal_loss"), prep, "gpu:1")
    assert "d = jax.devices('gpu')[1]" in jax_line and jax_line.count("device=d") == 2
    assert "d = jax.devices('cpu')[0]" in B.reproducer(B.ours("jax", "softmax_focal_loss"), prep)


def test_cpu_reproducer_of_jax_runs_on_the_cpu(capsys):
    line = B.reproducer(B.ours("jax", "softmax_focal_loss"), _prep(), "cpu")
    exec(compile(line, "<reproducer>", "exec"), {})
    assert "Array" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_check_defaults_to_the_cpu_for_both_backends_and_says_so(backend, monkeypatch):
    places = set()
    runner_name = "run_torch" if backend == "torch" else "run_jax"
    original = getattr(B, runner_name)

    def spy(impl, prep, device, compiled):
        places.add(D.label(backend, device))
        return original(impl, prep, device, compiled)

    monkeypatch.setattr(B, runner_name, spy)
    module = torch_impl if backend == "torch" else jax_impl

    def candidate(logits, targets):
        return module.sigmoid_cross_entropy(logits, targets)

    from dualloss.parity import check

    report = check(candidate, "sigmoid_cross_entropy", backend=backend, dtypes=["float32"],
                   max_examples=0)  # fmt: skip
    assert report.ok, report
    assert report.device == "cpu" and places == {"cpu"}
    assert "device: cpu (the default device" in str(report)
    assert report.precision.get("torch.backends.cuda.matmul.allow_tf32", False) is False


def test_check_refuses_a_missing_or_unknown_device():
    from dualloss.parity import check

    def loss(x, t):
        return x.sum()

    missing = _missing_gpu()
    with pytest.raises(ValueError, match=f"^`device` is '{missing}', which torch does not see"):
        check(loss, "sigmoid_cross_entropy", backend="torch", device=missing)
    with pytest.raises(ValueError, match=r"^`device` must be 'cpu', 'gpu:N' .* Received: 'npu'"):
        check(loss, "sigmoid_cross_entropy", backend="torch", device="npu")


# ----------------------------------------------------------------------------------------------
# 4. No host sync in the losses on an accelerator
# ----------------------------------------------------------------------------------------------


class _HostReads(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_READS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _torch_calls(dev):
    x = torch.randn(6, 5, device=dev, requires_grad=True)
    index = torch.tensor([0, 1, 2, 3, 4, -100], device=dev)
    alpha = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5], device=dev)
    soft = torch.rand(6, 5, device=dev)
    return x, [
        ("softmax_cross_entropy", index, {}),
        ("softmax_cross_entropy", index, {"weight": alpha, "label_smoothing": 0.1}),
        ("softmax_focal_loss", index, {"alpha": alpha, "gamma": 0.5}),
        ("softmax_focal_loss", torch.softmax(soft, 1), {"alpha": alpha}),
        ("sigmoid_cross_entropy", soft, {"pos_weight": alpha}),
        ("sigmoid_focal_loss", soft, {"alpha": 0.25}),
    ]


def test_the_cpu_path_reads_the_host_so_the_spy_can_fail():
    x, calls = _torch_calls("cpu")
    with _HostReads() as spy:
        torch_impl.softmax_cross_entropy(x, calls[0][1])
    assert "__bool__" in spy.seen


def test_no_host_read_in_the_losses_on_an_accelerator(monkeypatch, device):
    """The accelerator path (forced on the CPU; the real one on a GPU, with CUDA's own sync
    guard too) reads no tensor value on the host, validation on.

    The inputs are made before the guard is on: ``torch.tensor(list, device="cuda")`` copies from
    pageable host memory with a synchronising cudaMemcpy, which the guard reports as the test's own
    sync (the likely cause of the one GPU failure recorded in docs/devices.md)."""
    x, calls = _torch_calls(D.torch_name(device))
    if D.is_gpu(device):
        torch.cuda.synchronize(x.device)
        torch.cuda.set_sync_debug_mode("error")
    else:
        monkeypatch.setattr(torch_impl._inputs, "_reads_on_host", lambda x: False)
    try:
        for name, targets, kwargs in calls:
            with _HostReads() as spy:
                getattr(torch_impl, name)(x, targets, **kwargs).backward()
            assert spy.seen == [], (name, kwargs, spy.seen)
    finally:
        if D.is_gpu(device):
            torch.cuda.set_sync_debug_mode("default")


def test_accelerator_index_check_is_a_device_assertion(monkeypatch):
    monkeypatch.setattr(torch_impl._inputs, "_reads_on_host", lambda x: False)
    x = torch.randn(3, 5)
    message = r"`targets` has a class index outside \[0, 5\) and not ignore_index=-100 \(checked"
    with pytest.raises(RuntimeError, match=message):
        torch_impl.softmax_cross_entropy(x, torch.tensor([0, 7, 1]))
    with pytest.raises(RuntimeError, match=r"`alpha` must have every entry in \[0, 1\]"):
        torch_impl.softmax_focal_loss(x, torch.tensor([0, 1, 2]), alpha=torch.full((5,), 2.0))


def test_sync_mode_gives_the_exact_message_everywhere(monkeypatch):
    meta = torch.empty(2, device="meta")
    assert torch_impl._inputs._reads_on_host(
        torch.zeros(2)
    ) and not torch_impl._inputs._reads_on_host(meta)
    with torch_impl.set_validate_indices("sync"):
        assert torch_impl._inputs._reads_on_host(meta)
    assert not torch_impl._inputs._reads_on_host(meta)
    with pytest.raises(ValueError, match=r"^`validate` must be True, False or 'sync'"):
        torch_impl.set_validate_indices("sometimes")


def test_vector_alpha_is_checked_once_per_tensor_version(monkeypatch):
    checked = []
    original = torch_impl._inputs._checks.unit_interval_values

    def counted(name, values):
        checked.append(name)
        return original(name, values)

    monkeypatch.setattr(torch_impl._inputs._checks, "unit_interval_values", counted)
    x, t = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    alpha = torch.tensor([0.2, 0.3, 0.5])
    for _ in range(3):
        torch_impl.softmax_focal_loss(x, t, alpha=alpha)
    assert checked == ["alpha"]
    alpha[1] = 1.5  # in place: checked again, and refused
    with pytest.raises(ValueError, match=r"`alpha` must have every entry in \[0, 1\]"):
        torch_impl.softmax_focal_loss(x, t, alpha=alpha)
    with pytest.raises(ValueError, match=r"`alpha` must have every entry in \[0, 1\]"):
        torch_impl.softmax_focal_loss(x, t, alpha=alpha)  # a bad alpha is never cached


def test_jax_eager_does_not_copy_accelerator_targets_to_the_host(monkeypatch):
    def refuse(*args):
        raise AssertionError("class indices copied to the host")

    logits = jax.numpy.zeros((3, 4))
    targets = jax.numpy.array([0, 9, 1])
    monkeypatch.setattr(jax_impl._inputs._checks, "class_indices", refuse)
    monkeypatch.setattr(jax_impl._inputs, "_on_host", lambda x: not isinstance(x, jax.Array))
    loss = jax_impl.softmax_cross_entropy(logits, targets, reduction="none")
    assert np.isnan(np.asarray(loss)[1]) and np.isfinite(np.asarray(loss)[[0, 2]]).all()
    # host arrays are still checked exactly (no copy needed)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"`targets` has class index 9 at position \(1,\)"):
        jax_impl.softmax_cross_entropy(logits, np.array([0, 9, 1]))
    on_cpu = jax.device_put(jax.numpy.zeros(2), jax.devices("cpu")[0])
    assert jax_impl._inputs._on_host(np.zeros(2)) and jax_impl._inputs._on_host(on_cpu)


def test_jax_vector_alpha_on_an_accelerator_is_copied_once(monkeypatch):
    checked = []
    original = jax_impl._inputs._checks.unit_interval_values

    def counted(name, values):
        checked.append(name)
        return original(name, values)

    monkeypatch.setattr(jax_impl._inputs._checks, "unit_interval_values", counted)
    monkeypatch.setattr(jax_impl._inputs, "_on_host", lambda x: not isinstance(x, jax.Array))
    logits, t = jax.numpy.zeros((2, 3)), np.array([0, 1])
    alpha = jax.numpy.array([0.2, 0.3, 0.5])
    for _ in range(3):
        jax_impl.softmax_focal_loss(logits, t, alpha=alpha)
    assert checked == ["alpha"]
    with pytest.raises(ValueError, match=r"`alpha` must have every entry in \[0, 1\]"):
        jax_impl.softmax_focal_loss(logits, t, alpha=jax.numpy.array([0.2, 1.3, 0.5]))


@pytest.mark.parametrize("loss", losses.NAMES)
def test_both_backends_match_the_spec_on_each_device(loss, device):
    """float32 forward and backward of a typical case on `device`, against the float64 spec."""
    from dualloss.parity.tolerance import judge

    prep = _prep(loss)
    for backend in ("torch", "jax"):
        if device not in D.visible(backend):
            pytest.skip(f"{backend} does not see {device} (dualloss-parity doctor says why)")
        outcome = B.run_case(B.ours(backend, loss), prep, D.device_object(backend, device), False)
        assert outcome.error is None, outcome.error
        j = judge(loss, prep.ref_logits, prep.ref_targets, prep.options, "float32",
                  outcome.value, outcome.grad, standard="strict")  # fmt: skip
        assert j.kind == "ok", (backend, device, j.nonfinite + j.inaccurate)


# ----------------------------------------------------------------------------------------------
# 5. Candidates: the CPU screen, compile failures, time and recompilation bounds
# ----------------------------------------------------------------------------------------------


def _gather_focal(logits, targets):
    log_p = torch.log_softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    return (-((1 - log_p.exp()) ** 2) * log_p).mean()


def test_ignored_labels_are_screened_on_the_cpu_before_cuda(monkeypatch):
    """A CUDA device is simulated by the CPU; the screen runs first and its error is final, so
    the device run never gets an index it would assert on."""
    calls = []
    original = B.run_torch

    def spy(impl, prep, device, compiled):
        calls.append((device, bool(np.any(prep.targets < 0))))
        return original(impl, prep, device, compiled)

    monkeypatch.setattr(B, "run_torch", spy)
    monkeypatch.setattr(B, "needs_cpu_screen", lambda device: True)
    impl = B.Implementation("gather_focal", "torch", "softmax_focal_loss",
                            lambda x, t, **_: _gather_focal(x, t), lambda o, a: {}, "",
                            lambda kw: "gather_focal(x, t)")  # fmt: skip
    case = make_cases("softmax_focal_loss", "float32", regions=["ignored"])[0]
    outcome = B.run_case(impl, B.prepare(case, "float32"), "cpu", False)
    assert "raised on the CPU screen" in outcome.error
    assert calls == [("cpu", True)]  # the screen only: the "device" never saw -100
    calls.clear()
    typical = B.prepare(make_cases("softmax_focal_loss", "float32", regions=["typical"])[0],
                        "float32")  # fmt: skip
    assert B.run_case(impl, typical, "cpu", False).error is None
    assert calls == [("cpu", False)]  # nothing out of range: no screen


def test_a_poisoned_cuda_context_stops_the_run(monkeypatch):
    def broken(device=None):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(torch.cuda, "synchronize", broken)
    with pytest.raises(B.DevicePoisoned, match="unusable after a device-side assert"):
        B._raise_if_poisoned("cuda:0")


@pytest.fixture(scope="module")
def uncompilable():
    """An op without a fake (meta) implementation: eager works, torch.compile cannot trace it."""

    @torch.library.custom_op("dualloss_test::opaque_copy", mutates_args=())
    def opaque_copy(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    opaque_copy.register_autograd(
        lambda ctx, grad: grad, setup_context=lambda ctx, inputs, output: None
    )

    def loss(logits, targets, **kwargs):
        return torch_impl.sigmoid_cross_entropy(opaque_copy(logits), targets, **kwargs)

    kwargs = B._our_kwargs("sigmoid_cross_entropy", "torch")
    return B.Implementation("opaque_bce", "torch", "sigmoid_cross_entropy", loss, kwargs, "",
                            lambda kw: "opaque_bce(x, t)")  # fmt: skip


def test_a_compile_failure_is_reported_as_one_not_as_a_loss_error(uncompilable):
    result = runner.run_matrix([uncompilable], dtypes=["float32"], regions=["typical"],
                               devices=["cpu"], torch_compile=True, progress=False)  # fmt: skip
    eager = [r for r in result.records if r.mode == "eager"]
    assert eager and all(r.kind == "ok" for r in eager)
    assert not any(r.kind == "error" for r in result.records) and not result.failures
    assert len(result.compile_failures) == 1  # compiling stops after the first failure
    assert "opaque_bce.sigmoid_cross_entropy cpu" in result.compile_failures[0]
    assert not result.ok
    from dualloss.parity import report

    text = report.terminal_summary(result)
    assert "COMPILE FAILURE (torch.compile, not the loss; eager works)" in text
    assert "PARITY NOT VERIFIED" in text and "PARITY FAILS" not in text


def test_the_compile_budget_bounds_compiled_calls():
    began = time.monotonic()
    result = runner.run_matrix([B.ours("torch", "sigmoid_cross_entropy")], dtypes=["float32"],
                               regions=["typical"], torch_compile=True, progress=False,
                               compile_budget_s=0.0)  # fmt: skip
    assert time.monotonic() - began < 60
    assert not [r for r in result.records if r.mode == "compile"]
    assert any("budget of 0s was spent" in u for u in result.untested)
    assert not result.ok


def test_time_limit_interrupts_a_long_call():
    began = time.monotonic()
    with pytest.raises(B.CompileTimeout, match="time limit of 0s"):
        with B.time_limit(0.2):
            while time.monotonic() - began < 10:
                time.sleep(0.01)
    assert time.monotonic() - began < 2


def test_recompilations_are_bounded_and_never_fall_back_silently():
    B._set_torch_compile_limits()
    config = torch._dynamo.config
    assert config.recompile_limit == B.RECOMPILE_LIMIT <= 256
    assert config.fail_on_recompile_limit_hit is True
    assert runner.COMPILED_MINIMISE_ROWS <= 8


# ----------------------------------------------------------------------------------------------
# 7. Benchmarks
# ----------------------------------------------------------------------------------------------


def test_benchmark_synchronises_the_device_it_times(monkeypatch):
    from benchmarks import run

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    x = torch.randn(4, 3, requires_grad=True)
    step = run._torch_step(lambda x, t: x.sum(), x, None, "cuda:1")
    step()
    assert synced == ["cuda:1", "cuda:1"]


def test_benchmark_device_names_and_memory(capsys):
    from benchmarks import run

    assert run.device_name("auto") == ("gpu:0" if D.defaults() != ["cpu"] else "cpu")
    assert run.torch_device("cpu") == "cpu" and run.torch_peak(None, None, None, "cpu") == {}
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--tiny", "--device", _missing_gpu(), "-q"])
    assert exit_info.value.code == 2
    assert f"`devices` has '{_missing_gpu()}'" in capsys.readouterr().err


def test_benchmark_jax_runs_on_the_named_device():
    from benchmarks import peers, run

    time_rows, memory_rows = run.bench_jax(
        ["sigmoid_cross_entropy"], [(8, 3)], 1, 0, peers.jax_candidates(), peers.jax_peers(),
        lambda message: None, device="cpu",
    )  # fmt: skip
    assert [r.device for r in time_rows + memory_rows] == ["cpu", "cpu"]


# ----------------------------------------------------------------------------------------------
# 8. The smoke command
# ----------------------------------------------------------------------------------------------


def test_smoke_on_a_cpu_machine_names_the_steps_that_need_a_gpu(capsys):
    from dualloss.parity import smoke

    heavy = ["losses_on_device", "parity_compile", "graph_breaks", "device_tests"]
    assert smoke.main("gpu:0", skip=heavy, has_gpu=False)
    out = capsys.readouterr().out
    assert "dualloss smoke on cpu (gpu:0 not present)" in out
    assert "NEEDS GPU  assert_poisoning" in out and "NEEDS GPU  benchmark" in out
    assert out.splitlines()[1].startswith("PASS       doctor")
    assert (
        "SMOKE PASS (CPU run: the GPU path was NOT exercised): 1 passed, 0 failed, 2 need a GPU"
        in out
    )


def test_smoke_fails_a_failing_step(monkeypatch, capsys):
    from dualloss.parity import smoke

    monkeypatch.setitem(smoke.LIMITS, "doctor", 0.01)  # the step cannot finish in time
    skip = [s for s in smoke.STEPS if s != "doctor"]
    assert not smoke.main("gpu:0", skip=skip, has_gpu=False)
    out = capsys.readouterr().out
    assert "FAIL       doctor" in out and "timed out" in out and "SMOKE FAIL" in out


def test_smoke_cli_refuses_a_cpu_device(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["smoke", "--device", "cpu"])
    assert exit_info.value.code == 2
    assert "`--device` must be a GPU" in capsys.readouterr().err


def test_parity_report_json_has_devices_and_untested(tmp_path):
    from dualloss.parity import report

    result = runner.run_matrix(_sigmoid_impls()[:1], dtypes=["float32"], regions=["typical"],
                               devices=["cpu"], progress=False)  # fmt: skip
    report.write_json(result, str(tmp_path / "p.json"))
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["config"]["devices"] == ["cpu"] and data["untested"] == []
    assert data["config"]["precision"]["torch.backends.cuda.matmul.allow_tf32"] is False


def test_jax_checks_host_data_as_it_came_not_after_conversion(monkeypatch):
    """With every JAX array treated as accelerator data, NumPy targets and alpha are still
    checked on the host, from the NumPy arrays themselves (no device-to-host copy)."""
    seen = []
    monkeypatch.setattr(jax_impl._inputs, "_on_host", lambda x: not isinstance(x, jax.Array))
    monkeypatch.setattr(
        jax_impl._inputs, "_check_alpha_values", lambda alpha: seen.append(type(alpha))
    )
    logits = jax.numpy.zeros((3, 4))
    with pytest.raises(ValueError, match=r"`targets` has class index 9 at position \(1,\)"):
        jax_impl.softmax_cross_entropy(logits, np.array([0, 9, 1]))
    jax_impl.softmax_focal_loss(logits, np.array([0, 1, 2]), alpha=np.full(4, 0.25))
    assert seen == [np.ndarray]
