"""The fused linear + cross-entropy / focal losses against the alternatives (issue 13).

    python -m benchmarks.linear                      # (4096, 256, 32000) float32, fwd+bwd
    python -m benchmarks.linear --big                # also memory at (8192, 512, 128000)
    python -m benchmarks.linear --tiny               # seconds; tests/test_linear_benchmark.py
    python -m benchmarks.linear --json out.json
    python -m benchmarks.linear --pairs 40 --shape 2048,256,32000   # torch ours/unfused ratio
    python -m benchmarks.linear --plot docs/linear-memory.png   # memory against V (minutes)
    python -m benchmarks.linear --llm                # GPU only: the LLM head in bfloat16

LLM head (``--llm``, issue 27; opt-in, sized for a GPU, never run on the CPU by default): JAX
only, bfloat16, forward+backward, each method in a fresh process (so that the device's
``memory_stats()`` peak is its own): the fused linear losses at (N, H, V) = (8192, 4096, 128256)
against the unfused optax head (``hidden @ weight`` in bfloat16, then
``optax.softmax_cross_entropy_with_integer_labels``) and ``tokamax``'s linear softmax cross
entropy where it imports, and the softmax cross entropy on (8192, 128256) bfloat16 logits
against optax. Peak bytes beyond the inputs as a multiple of the bfloat16 logits' bytes.

Time (median of --reps forward+backward calls after one warm-up, same process, same inputs):
torch: ours (``torch_impl.linear_softmax_cross_entropy``), torch's chunked
``F.linear_cross_entropy(..., options=LinearCrossEntropyOptions())``, unfused ``F.linear`` +
``F.cross_entropy``, and our focal loss; JAX: jitted ``value_and_grad`` of ours, unfused
(``hidden @ weight`` + ``optax.softmax_cross_entropy_with_integer_labels``) and our focal loss.
The load average (``os.getloadavg()``) is printed with every row: on a shared machine the ratios
are rough.

Memory: torch, in a fresh process per measurement, the peak resident set (VmHWM) during one
forward+backward minus the resident set of a baseline that holds the inputs and tensors the size
of their gradients (a warm-up call at a tiny shape loads the kernels first); JAX, XLA's
``temp_size_in_bytes`` of the compiled ``value_and_grad`` (no run needed). Both as a multiple of
the float32 logits' bytes N V 4.

Plot (``--plot PATH``): the memory measurements only, swept over V = 8k .. 128k at N = 4096,
H = 256 (``--plot-rows``, ``--plot-hidden``): torch ours, torch chunked, torch unfused
(fresh-process peak RSS) and JAX ours and unfused (XLA temp), with the logits' size and our torch
memory model (docs/linear.md) drawn for reference; log2 V against MiB on log axes.

Goals (issue 13): extra memory <= 0.1x logits; time <= 1.0x torch chunked and <= 1.1x unfused;
focal <= 1.2x our CE.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TORCH_METHODS = ("ours", "torch_chunked", "unfused", "ours_focal")
JAX_METHODS = ("ours", "unfused", "ours_focal")


def _torch_inputs(n, h, v, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h**0.5).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


def _torch_loss(method):
    import torch
    import torch.nn.functional as F

    from dualloss import torch_impl

    if method == "ours":
        return lambda h, w, y: torch_impl.linear_softmax_cross_entropy(h, w, y)
    if method == "ours_focal":
        return lambda h, w, y: torch_impl.linear_softmax_focal_loss(h, w, y, gamma=2.0)
    if method == "torch_chunked":
        options = torch.nn.LinearCrossEntropyOptions()
        return lambda h, w, y: F.linear_cross_entropy(h, w, y, options=options)
    if method == "unfused":
        return lambda h, w, y: F.cross_entropy(F.linear(h, w), y)
    raise ValueError(f"`method` must be one of {TORCH_METHODS}. Received: method={method!r}.")


def _step(loss, hidden, weight, targets):
    hidden.grad = weight.grad = None
    value = loss(hidden, weight, targets)
    value.backward()
    return value


def torch_times(n, h, v, reps):
    """Median seconds of one forward+backward per method, interleaved across repetitions."""
    hidden, weight, targets = _torch_inputs(n, h, v)
    losses = {m: _torch_loss(m) for m in TORCH_METHODS}
    for loss in losses.values():
        _step(loss, hidden, weight, targets)
    times = {m: [] for m in TORCH_METHODS}
    for rep in range(reps):
        order = TORCH_METHODS if rep % 2 == 0 else TORCH_METHODS[::-1]
        for method in order:
            start = time.perf_counter()
            _step(losses[method], hidden, weight, targets)
            times[method].append(time.perf_counter() - start)
    return {m: statistics.median(t) for m, t in times.items()}


def torch_pair_ratios(n, h, v, pairs, first="ours", second="unfused"):
    """Seconds of `first` over `second` for each of `pairs` back-to-back pairs of one
    forward+backward (the order alternates): on a shared machine the load drifts over minutes,
    far less within a pair, so the median of the per-pair ratios is steadier than a ratio of
    medians. Returns (ratios, first's seconds, second's seconds)."""
    hidden, weight, targets = _torch_inputs(n, h, v)
    losses = {m: _torch_loss(m) for m in (first, second)}
    for loss in losses.values():
        _step(loss, hidden, weight, targets)
    times = {first: [], second: []}
    for pair in range(pairs):
        for method in (first, second) if pair % 2 == 0 else (second, first):
            start = time.perf_counter()
            _step(losses[method], hidden, weight, targets)
            times[method].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times[first], times[second], strict=True)]
    return ratios, times[first], times[second]


def _rss(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _torch_memory_child(method, n, h, v):
    """Run in a fresh process: extra peak bytes of one forward+backward beyond the baseline."""
    import torch

    loss = _torch_loss(method)
    # load the kernels and thread pools at a tiny shape first
    _step(loss, *_torch_inputs(8, h, min(v, 64)))
    hidden, weight, targets = _torch_inputs(n, h, v)
    # the baseline holds the inputs and tensors the size of their gradients
    stand_ins = [torch.ones_like(hidden), torch.ones_like(weight)]
    baseline = _rss("VmRSS")
    del stand_ins
    _step(loss, hidden, weight, targets)
    # VmHWM (the peak) >= VmRSS at any moment, so the difference is >= 0 without a clamp
    return _rss("VmHWM") - baseline


def torch_memory(method, n, h, v):
    code = (
        f"import json, sys; sys.path.insert(0, {ROOT!r}); from benchmarks import linear; "
        f"print(json.dumps(linear._torch_memory_child({method!r}, {n}, {h}, {v})))"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _jax_functions(n, h, v):
    import jax
    import jax.numpy as jnp
    import optax

    from dualloss import jax_impl

    key = jax.random.PRNGKey(0)
    hidden = jax.random.normal(key, (n, h), jnp.float32)
    weight = jax.random.normal(jax.random.PRNGKey(1), (h, v), jnp.float32) / h**0.5
    targets = jax.random.randint(jax.random.PRNGKey(2), (n,), 0, v)
    losses = {
        "ours": lambda x, w: jax_impl.linear_softmax_cross_entropy(x, w, targets),
        "ours_focal": lambda x, w: jax_impl.linear_softmax_focal_loss(x, w, targets, gamma=2.0),
        "unfused": lambda x, w: jnp.mean(
            optax.softmax_cross_entropy_with_integer_labels(x @ w, targets)
        ),
    }
    jitted = {m: jax.jit(jax.value_and_grad(f, argnums=(0, 1))) for m, f in losses.items()}
    return jitted, hidden, weight


def jax_memory(n, h, v):
    """XLA temp_size_in_bytes of each compiled value_and_grad (compiled, never run)."""
    jitted, hidden, weight = _jax_functions(n, h, v)
    return {
        m: f.lower(hidden, weight).compile().memory_analysis().temp_size_in_bytes
        for m, f in jitted.items()
    }


def jax_times(n, h, v, reps):
    import jax

    jitted, hidden, weight = _jax_functions(n, h, v)
    for f in jitted.values():
        jax.block_until_ready(f(hidden, weight))
    times = {m: [] for m in jitted}
    for rep in range(reps):
        order = list(jitted) if rep % 2 == 0 else list(jitted)[::-1]
        for method in order:
            start = time.perf_counter()
            jax.block_until_ready(jitted[method](hidden, weight))
            times[method].append(time.perf_counter() - start)
    return {m: statistics.median(t) for m, t in times.items()}


LLM_LINEAR = (8192, 4096, 128256)
LLM_METHODS = ("linear_ours", "linear_ours_focal", "linear_unfused", "linear_tokamax",
               "logits_ours", "logits_optax")  # fmt: skip
# torch (issue 26): ours (Triton kernels on CUDA), torch's own, Liger-Kernel's where installed
TORCH_LLM_METHODS = ("torch_linear_ours", "torch_linear_ours_focal", "torch_linear_chunked",
                     "torch_linear_liger", "torch_linear_unfused", "torch_logits_ours",
                     "torch_logits_torch", "torch_logits_liger")  # fmt: skip


def _llm_function(method, shape=LLM_LINEAR):
    """(jitted value_and_grad, its arguments) of one LLM-head method, bfloat16 inputs (N, H, V
    `shape`; the logits N x V)."""
    import jax
    import jax.numpy as jnp
    import optax

    from dualloss import jax_impl

    n, h, v = shape
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    targets = jax.random.randint(keys[2], (n,), 0, v)
    if method.startswith("logits_"):
        logits = (2.0 * jax.random.normal(keys[0], (n, v), jnp.float32)).astype(jnp.bfloat16)
        fn = {
            "logits_ours": lambda z: jax_impl.softmax_cross_entropy(z, targets),
            "logits_optax": lambda z: optax.softmax_cross_entropy_with_integer_labels(
                z, targets
            ).mean(),
        }[method]
        return jax.jit(jax.value_and_grad(fn)), (logits,)
    hidden = jax.random.normal(keys[0], (n, h), jnp.bfloat16)
    weight = (jax.random.normal(keys[1], (h, v), jnp.float32) / h**0.5).astype(jnp.bfloat16)
    if method == "linear_tokamax":
        import tokamax  # optional: absent where it does not install

        def fn(x, w):
            return tokamax.linear_softmax_cross_entropy_loss(x, targets, w, reduction="mean")
    else:
        fn = {
            "linear_ours": lambda x, w: jax_impl.linear_softmax_cross_entropy(x, w, targets),
            "linear_ours_focal": lambda x, w: jax_impl.linear_softmax_focal_loss(
                x, w, targets, gamma=2.0
            ),
            "linear_unfused": lambda x, w: optax.softmax_cross_entropy_with_integer_labels(
                x @ w, targets
            ).mean(),
        }[method]
    return jax.jit(jax.value_and_grad(fn, argnums=(0, 1))), (hidden, weight)


def llm_one(method, reps, shape=LLM_LINEAR):
    """One method in this process: median seconds, peak device bytes beyond the inputs
    (``memory_stats``) and XLA's temp bytes, as a JSON line."""
    import jax

    fn, args = _llm_function(method, shape)
    jax.block_until_ready(args)
    device = jax.devices()[0]
    base = (device.memory_stats() or {}).get("bytes_in_use", 0)
    temp = fn.lower(*args).compile().memory_analysis().temp_size_in_bytes
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
    n, _, v = shape
    print(json.dumps({
        "method": method, "seconds": statistics.median(times), "temp_bytes": temp,
        "peak_beyond_inputs_bytes": None if peak is None else peak - base,
        "logits_bytes": n * v * 2, "device": str(device),
    }))  # fmt: skip


def _torch_llm_function(method, shape):
    """(loss function of the inputs, the inputs that require grad, all inputs) of one torch
    LLM-head method, bfloat16 inputs on the default CUDA device (the CPU where there is none)."""
    import torch
    import torch.nn.functional as F

    from dualloss import torch_impl

    n, h, v = shape
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device="cpu").manual_seed(0)
    targets = torch.randint(0, v, (n,), generator=g).to(device)
    if "_logits_" in method:
        logits = (2.0 * torch.randn(n, v, generator=g)).to(device, torch.bfloat16)
        if method == "torch_logits_liger":
            from liger_kernel.transformers import LigerCrossEntropyLoss  # optional

            liger = LigerCrossEntropyLoss()
            # Liger writes the gradient over the logits it is given: each call gets its own
            # copy (its cost is in the time, as a caller who reads the logits again pays it)
            fn = lambda z: liger(z.clone(), targets)  # noqa: E731
        else:
            fn = {
                "torch_logits_ours": lambda z: torch_impl.softmax_cross_entropy(z, targets),
                "torch_logits_torch": lambda z: F.cross_entropy(z, targets),
            }[method]
        return fn, [logits.requires_grad_()]
    hidden = torch.randn(n, h, generator=g).to(device, torch.bfloat16).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(device, torch.bfloat16)
    weight.requires_grad_()
    if method == "torch_linear_liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # optional

        liger = LigerFusedLinearCrossEntropyLoss()
        return (lambda x, w: liger(w, x, targets)), [hidden, weight]
    options = (
        torch.nn.LinearCrossEntropyOptions()
        if hasattr(torch.nn, "LinearCrossEntropyOptions")
        else None
    )
    fn = {
        "torch_linear_ours": lambda x, w: torch_impl.linear_softmax_cross_entropy(x, w, targets),
        "torch_linear_ours_focal": lambda x, w: torch_impl.linear_softmax_focal_loss(
            x, w, targets, gamma=2.0
        ),
        "torch_linear_chunked": lambda x, w: F.linear_cross_entropy(x, w, targets, options=options),
        "torch_linear_unfused": lambda x, w: F.cross_entropy(F.linear(x, w), targets),
    }[method]
    return fn, [hidden, weight]


def torch_llm_one(method, reps, shape=LLM_LINEAR):
    """One torch method in this process: median seconds of forward+backward, the device's peak
    bytes beyond the inputs (``max_memory_allocated``) and the kernel launches of one call
    (``torch.profiler``, CUDA only), as a JSON line."""
    import torch

    fn, inputs = _torch_llm_function(method, shape)
    cuda = inputs[0].is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        for x in inputs:
            x.grad = None
        fn(*inputs).backward()

    step()  # warm-up: compiles the kernels, allocates the gradients
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    launches = None
    if cuda:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync()
        launches = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    n, v = shape[0], shape[2]
    print(json.dumps({
        "method": method, "seconds": statistics.median(times),
        "peak_beyond_inputs_bytes": peak, "launches": launches, "temp_bytes": None,
        "logits_bytes": n * v * 2, "device": str(inputs[0].device),
    }))  # fmt: skip


def llm(reps, frameworks=("jax", "torch"), shape=None):
    """Every LLM-head method in a fresh process; prints a table and returns the rows."""
    rows = []
    methods = (LLM_METHODS if "jax" in frameworks else ()) + (
        TORCH_LLM_METHODS if "torch" in frameworks else ()
    )
    extra = [] if shape is None else ["--llm-shape", ",".join(str(x) for x in shape)]
    for method in methods:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.linear", "--llm-one", method, "--reps", str(reps),
             *extra],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode != 0 or not lines:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1][:160]
            print(f"  {method:18s} failed: {tail}")
            rows.append({"method": method, "error": tail})
            continue
        row = json.loads(lines[-1])
        rows.append(row)
        peak = row["peak_beyond_inputs_bytes"]
        peak_text = "n/a" if peak is None else f"{peak / row['logits_bytes']:.3f}x logits"
        temp = row["temp_bytes"]
        temp_text = "" if temp is None else f"  XLA temp {temp / row['logits_bytes']:.3f}x logits"
        launches = row.get("launches")
        launch_text = "" if launches is None else f"  {launches} launches"
        print(f"  {method:24s} {row['seconds'] * 1e3:9.2f} ms  peak beyond inputs {peak_text}"
              f"{temp_text}{launch_text}")  # fmt: skip
    by = {r["method"]: r for r in rows if "seconds" in r}
    for a, b in (("linear_ours", "linear_unfused"), ("linear_ours", "linear_tokamax"),
                 ("logits_ours", "logits_optax"),
                 ("torch_linear_ours", "torch_linear_chunked"),
                 ("torch_linear_ours", "torch_linear_liger"),
                 ("torch_linear_ours", "torch_linear_unfused"),
                 ("torch_logits_ours", "torch_logits_torch"),
                 ("torch_logits_ours", "torch_logits_liger")):  # fmt: skip
        if a in by and b in by:
            print(f"  {a} / {b}: {by[a]['seconds'] / by[b]['seconds']:.2f}")
    return rows


def _load():
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def run(n, h, v, reps, measure_time=True, frameworks=("torch", "jax"), torch_methods=None):
    """Measures and prints; returns the results as a dict (JSON-ready)."""
    logits = n * v * 4
    result = {"shape": [n, h, v], "logits_bytes": logits, "torch": {}, "jax": {}}
    print(f"(N, H, V) = ({n}, {h}, {v}) float32, logits {logits / 2**20:.0f} MiB, {_load()}")
    if "torch" in frameworks:
        for method in torch_methods or TORCH_METHODS:
            extra = torch_memory(method, n, h, v)
            result["torch"].setdefault(method, {})["extra_peak_bytes"] = extra
            print(f"  torch {method:14s} extra peak {extra / 2**20:8.1f} MiB = "
                  f"{extra / logits:.3f}x logits   [{_load()}]")  # fmt: skip
    if "jax" in frameworks:
        for method, temp in jax_memory(n, h, v).items():
            result["jax"].setdefault(method, {})["temp_bytes"] = temp
            print(f"  jax   {method:14s} XLA temp   {temp / 2**20:8.1f} MiB = "
                  f"{temp / logits:.3f}x logits")  # fmt: skip
    if not measure_time:
        return result
    if "torch" in frameworks:
        times = torch_times(n, h, v, reps)
        result["torch_load"] = os.getloadavg()
        for method, seconds in times.items():
            result["torch"][method]["seconds"] = seconds
        print(f"  torch times [{_load()}]: " + ", ".join(f"{m} {s:.3f}s" for m, s in times.items()))
        ours = times["ours"]
        print(
            f"  torch ratios: ours/chunked {ours / times['torch_chunked']:.2f} (goal <= 1.0), "
            f"ours/unfused {ours / times['unfused']:.2f} (<= 1.1), "
            f"focal/ours {times['ours_focal'] / ours:.2f} (<= 1.2)"
        )
    if "jax" in frameworks:
        times = jax_times(n, h, v, reps)
        result["jax_load"] = os.getloadavg()
        for method, seconds in times.items():
            result["jax"][method]["seconds"] = seconds
        print(f"  jax times [{_load()}]: " + ", ".join(f"{m} {s:.3f}s" for m, s in times.items()))
        print(
            f"  jax ratios: ours/unfused {times['ours'] / times['unfused']:.2f} (<= 1.1), "
            f"focal/ours {times['ours_focal'] / times['ours']:.2f} (<= 1.2)"
        )
    return result


PLOT_VOCABULARIES = (8192, 16384, 32768, 65536, 131072)
PLOT_TORCH = ("ours", "torch_chunked", "unfused")
PLOT_JAX = ("ours", "unfused")


def torch_model_bytes(n, h, v):
    """Our torch loss's extra bytes by the memory model of docs/linear.md (float32 inputs, 'mean'):
    the (r, V) block, r the default rows per block, plus the (N, H) scaled hidden gradient."""
    from dualloss import _checks

    rows = _checks.default_chunk_size(n, v, 1 << 22, fraction=16)
    return rows * v * 4 + n * h * 4


def memory_sweep(n, h, vocabularies=PLOT_VOCABULARIES):
    """Extra memory (bytes) per method and V: {"torch ours": [...], "jax unfused": [...], ...}."""
    sweep = {"V": list(vocabularies), "N": n, "H": h}
    for v in vocabularies:
        for method in PLOT_TORCH:
            extra = torch_memory(method, n, h, v)
            sweep.setdefault(f"torch {method}", []).append(extra)
            print(f"  V={v:6d} torch {method:14s} {extra / 2**20:8.1f} MiB   [{_load()}]")
        temps = jax_memory(n, h, v)
        for method in PLOT_JAX:
            sweep.setdefault(f"jax {method}", []).append(temps[method])
            print(f"  V={v:6d} jax   {method:14s} {temps[method] / 2**20:8.1f} MiB")
        sweep.setdefault("model", []).append(torch_model_bytes(n, h, v))
    return sweep


LABELS = {
    "torch ours": "torch: dualloss (fused, row blocks)",
    "torch torch_chunked": "torch: F.linear_cross_entropy (chunked)",
    "torch unfused": "torch: F.linear + F.cross_entropy (unfused)",
    "jax ours": "JAX: dualloss (XLA temp)",
    "jax unfused": "JAX: x @ w + optax (XLA temp)",
}
STYLES = {
    "torch ours": dict(color="C0", marker="o"),
    "torch torch_chunked": dict(color="C1", marker="s"),
    "torch unfused": dict(color="C3", marker="^"),
    "jax ours": dict(color="C0", marker="o", linestyle="--", markerfacecolor="none"),
    "jax unfused": dict(color="C3", marker="^", linestyle="--", markerfacecolor="none"),
}


def plot_memory(sweep, path):
    """Writes the memory-against-V figure to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mib = 2**20
    v = sweep["V"]
    n, h = sweep["N"], sweep["H"]
    fig, ax = plt.subplots(figsize=(8, 6.4), dpi=120)
    logits = [n * x * 4 / mib for x in v]
    ax.plot(v, logits, color="0.55", linestyle=":", label="the float32 logits, N·V·4")
    ax.plot(v, [x / 10 for x in logits], color="0.75", linestyle=":", label="goal: 0.1 × logits")
    model = [x / mib for x in sweep["model"]]
    ax.plot(v, model, color="C0", linestyle="-.", alpha=0.6,
            label="model (ours, torch): r·V·4 + N·H·4")  # fmt: skip
    for key, label in LABELS.items():
        if key in sweep:
            ax.plot(v, [x / mib for x in sweep[key]], label=label, **STYLES[key])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(v, [f"{x // 1024}k" for x in v])
    ax.set_xlabel("vocabulary size V (log2 scale)")
    ax.set_ylabel("extra memory of one forward+backward (MiB, log2 scale)")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_title(f"Linear + cross entropy, N = {n}, H = {h}, float32, CPU\n"
                 "torch: peak RSS beyond the inputs and gradients; JAX: XLA temp_size_in_bytes",
                 fontsize=10)  # fmt: skip
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="(64, 16, 500), one repetition")
    parser.add_argument("--big", action="store_true", help="also memory at (8192, 512, 128000)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--llm", action="store_true",
                        help="GPU only: the LLM head (8192, 4096, 128256) in bfloat16")  # fmt: skip
    parser.add_argument(
        "--llm-one", choices=LLM_METHODS + TORCH_LLM_METHODS, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--llm-frameworks", default="jax,torch", help="with --llm: the frameworks, comma-separated"
    )
    parser.add_argument("--llm-shape", default=None,
                        help="with --llm: N,H,V instead of the LLM head (a CPU rehearsal at a "
                        "small shape; the logits are N x V)")  # fmt: skip
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--pairs", type=int, default=0,
                        help="time only: this many interleaved pairs of torch ours and unfused, "
                        "median of the per-pair ratios (with --shape)")  # fmt: skip
    parser.add_argument("--shape", default="4096,256,32000", help="N,H,V of --pairs")
    parser.add_argument("--plot", help="sweep V (memory only) and write the figure here (PNG)")
    parser.add_argument("--plot-rows", type=int, default=4096, help="N of the sweep")
    parser.add_argument("--plot-hidden", type=int, default=256, help="H of the sweep")
    args = parser.parse_args(argv)
    shape = None if args.llm_shape is None else tuple(int(x) for x in args.llm_shape.split(","))
    if args.llm_one in TORCH_LLM_METHODS:
        torch_llm_one(args.llm_one, args.reps, shape or LLM_LINEAR)
        return
    if args.llm_one:
        llm_one(args.llm_one, args.reps, shape or LLM_LINEAR)
        return
    if args.llm:
        frameworks = tuple(args.llm_frameworks.split(","))
        bad = [f for f in frameworks if f not in ("jax", "torch")]
        if bad:
            parser.error(f"--llm-frameworks must be among jax, torch. Received: {','.join(bad)}.")
        rows = llm(args.reps, frameworks, shape)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(rows, out, indent=1)
        return
    if args.plot:
        sweep = memory_sweep(args.plot_rows, args.plot_hidden)
        plot_memory(sweep, args.plot)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(sweep, out, indent=1)
        return
    if args.pairs:
        n, h, v = (int(x) for x in args.shape.split(","))
        print(f"(N, H, V) = ({n}, {h}, {v}) float32, {args.pairs} pairs, {_load()}")
        ratios, ours, unfused = torch_pair_ratios(n, h, v, args.pairs)
        print(f"  torch ours / unfused: median of per-pair ratios {statistics.median(ratios):.3f} "
              f"(quartiles {statistics.quantiles(ratios, n=4)[0]:.3f} "
              f"{statistics.quantiles(ratios, n=4)[2]:.3f}); medians ours "
              f"{statistics.median(ours):.3f}s, unfused {statistics.median(unfused):.3f}s "
              f"[{_load()}]")  # fmt: skip
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"shape": [n, h, v], "ratios": ratios, "ours": ours,
                           "unfused": unfused}, out, indent=1)  # fmt: skip
        return
    results = []
    if args.tiny:
        results.append(run(64, 16, 500, 1))
    else:
        results.append(run(4096, 256, 32000, args.reps))
        if args.big:
            # memory only: the unfused torch loss would hold ~3 x 4 GiB; ours, chunked and XLA's
            # analysis (compile only) are measured
            results.append(
                run(8192, 512, 128000, 1, measure_time=False,
                    torch_methods=("ours", "torch_chunked", "ours_focal"))
            )  # fmt: skip
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
