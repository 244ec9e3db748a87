"""The LLM head options (`z_loss=`, `softcap=`, DESIGN 13) of torch_impl and jax_impl against the
float64 spec under the strict standard (``dualloss.parity.tolerance``, which derives what the
cap and the z-term add to it), every dtype, class-index and probability targets, with the other
options, every reduction; the path that must decline them (Triton) does so correctly, and the
vocab-parallel ones (process_group, axis_name) take them."""

from __future__ import annotations

import numpy as np
import pytest

from dualloss.parity import assert_matches_spec

torch = pytest.importorskip("torch")

from dualloss import torch_impl as ti  # noqa: E402

TORCH_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
LOSSES = ["softmax_cross_entropy", "softmax_focal_loss"]
HEAD = [
    {"z_loss": 1e-4},
    {"softcap": 30.0},
    {"z_loss": 1e-3, "softcap": 15.0},
    {"z_loss": 0.5, "softcap": 0.5},
    {"z_loss": 1e-2, "softcap": 1e4},
]
OTHER = [
    {},
    {"label_smoothing": 0.1},
    {"weight": "vector"},
    {"where": "mask"},
    {"ignore_index": 2},
]


def _case(kind, scale, seed=0, shape=(6, 7)):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=shape) * scale
    logits[0, 0] = 40.0 * scale  # far beyond a small cap, and a confident row
    if kind == "prob":
        raw = rng.normal(size=shape) * 2
        targets = np.exp(raw) / np.exp(raw).sum(axis=1, keepdims=True)
    else:
        targets = rng.integers(0, shape[1], size=shape[0])
        targets[1] = -100
    return logits, targets


def _materialise(loss, options, num_classes):
    options = dict(options)
    rng = np.random.default_rng(1)
    if options.get("weight") == "vector":
        del options["weight"]
        key = "alpha" if loss == "softmax_focal_loss" else "weight"
        options[key] = rng.uniform(0.1, 1.0, size=num_classes)
    if options.get("where") == "mask":
        mask = np.ones(num_classes, dtype=bool)
        mask[3] = False
        options["where"] = mask
    return options


def _prepare(loss, kind, other, head, scale):
    logits, targets = _case(kind, scale)
    options = _materialise(loss, dict(other, **head), logits.shape[1])
    if "where" in options:
        if kind == "index":
            targets = np.where(targets == 3, 1, targets)
        else:
            targets = targets * options["where"]
    if "ignore_index" in options and kind == "index":
        targets = np.where(targets == -100, options["ignore_index"], targets)
    return logits, targets, options


def _torch_run(loss, logits, targets, options, dtype):
    z = torch.tensor(logits).to(dtype).requires_grad_(True)
    t = torch.tensor(targets)
    if t.is_floating_point():
        t = t.to(dtype)
    kwargs = {}
    for key, value in options.items():
        if isinstance(value, np.ndarray):
            value = torch.tensor(value)
            if value.is_floating_point():
                value = value.to(dtype)
        kwargs[key] = value
    value = getattr(ti, loss)(z, t, axis=1, **kwargs)
    assert value.dtype == dtype
    value.sum().backward()
    spec_z = z.detach().double().numpy()
    spec_t = t.double().numpy() if t.is_floating_point() else t.numpy()
    spec_options = {
        k: (v.double().numpy() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in kwargs.items()
    }
    spec_options = {
        k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in spec_options.items()
    }
    return spec_z, spec_t, spec_options, value.detach().double().numpy(), z.grad.double().numpy()


# every pair of values of any two parameters, and every loss with every head (--full: all)
@pytest.mark.exhaustive(cover=("loss", "head"))
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("kind", ["index", "prob"])
@pytest.mark.parametrize("head", HEAD, ids=repr)
@pytest.mark.parametrize("loss", LOSSES)
def test_torch_head_options_match_spec(loss, head, kind, reduction, dtype):
    for other in OTHER:
        if "ignore_index" in other and kind == "prob":
            continue
        logits, targets, options = _prepare(loss, kind, other, head, scale=4.0)
        options["reduction"] = reduction
        gammas = (0.0, 2.0) if loss == "softmax_focal_loss" else (None,)
        for gamma in gammas:
            call = dict(options) if gamma is None else dict(options, gamma=gamma)
            z, t, spec_options, value, grad = _torch_run(loss, logits, targets, call, dtype)
            assert_matches_spec(
                loss, z, t, dict(spec_options, axis=1), dtype, value, grad,
                context=f"torch_impl.{loss}({spec_options})",
            )  # fmt: skip


JAX_DTYPES = ["float64", "float32", "float16", "bfloat16"]


def _jax_run(loss, logits, targets, options, dtype):
    import jax
    import jax.numpy as jnp

    from dualloss import jax_impl as ji

    with jax.enable_x64(dtype == "float64"):
        work = jnp.dtype(dtype)

        def seen(a):
            # what the candidate saw, as float64 (half dtypes read exactly through float32)
            a = jnp.asarray(a, work)
            return np.asarray(a.astype(jnp.float32) if dtype != "float64" else a, np.float64)

        x = jnp.asarray(logits, work)
        floating = np.issubdtype(np.asarray(targets).dtype, np.floating)
        t = jnp.asarray(targets, work) if floating else jnp.asarray(targets, jnp.int32)
        kwargs = {
            k: (jnp.asarray(v, work) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
            for k, v in options.items()
        }
        value, pull = jax.vjp(lambda x: getattr(ji, loss)(x, t, **kwargs), x)
        (grad,) = pull(jnp.ones_like(value))
        assert value.dtype == x.dtype and grad.dtype == x.dtype
        spec_options = {
            k: (seen(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
            for k, v in options.items()
        }
        spec_t = seen(t) if floating else np.asarray(t)
        return seen(x), spec_t, spec_options, seen(value), seen(grad)


# every pair of values of any two parameters, and every loss with every head (--full: all)
@pytest.mark.exhaustive(cover=("loss", "head"))
@pytest.mark.parametrize("dtype", JAX_DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("kind", ["index", "prob"])
@pytest.mark.parametrize("head", HEAD, ids=repr)
@pytest.mark.parametrize("loss", LOSSES)
def test_jax_head_options_match_spec(loss, head, kind, reduction, dtype):
    pytest.importorskip("jax")
    for other in OTHER:
        if "ignore_index" in other and kind == "prob":
            continue
        logits, targets, options = _prepare(loss, kind, other, head, scale=4.0)
        options["reduction"] = reduction
        gammas = (0.0, 2.0) if loss == "softmax_focal_loss" else (None,)
        for gamma in gammas:
            call = dict(options) if gamma is None else dict(options, gamma=gamma)
            z, t, spec_options, value, grad = _jax_run(loss, logits, targets, call, dtype)
            assert_matches_spec(
                loss, z, t, spec_options, dtype, value, grad,
                context=f"jax_impl.{loss}({spec_options})",
            )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Cost: the options in the loss's own passes (issue 30)
# ----------------------------------------------------------------------------------------------

# ops that only gather or write one entry per row (the target's), or views: not passes over N x C
_NOT_A_PASS = {
    "gather", "scatter", "scatter_", "index_put_", "permute", "detach", "view", "_unsafe_view",
    "expand", "unsqueeze", "squeeze", "t", "transpose", "alias", "slice", "select", "as_strided",
}  # fmt: skip


def _passes_over_the_logits(fn, x, t, **options):
    """The dispatched torch ops of a forward + backward that read or write a tensor of the
    logits' size (each one is a pass over memory on the eager path), in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    size = x.numel()

    class Passes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket).removeprefix("aten.")
            outs = out if isinstance(out, (tuple, list)) else (out,)
            touched = [*args, *(kwargs or {}).values(), *outs]
            if name not in _NOT_A_PASS and any(
                isinstance(a, torch.Tensor) and a.numel() == size for a in touched
            ):
                self.ops.append(name)
            return out

    x.grad = None
    with Passes() as passes:
        fn(x, t, **options).backward()
    return passes.ops


# what each option may add to the plain fast path's passes on the CPU (eager): the z-term one
# read (the row's largest capped logit, for lse; 2 z_loss lse joins p's multiplication), the cap
# four each way (forward: the quotient, tanh, the product, one read for infinite logits;
# backward: the quotient, cosh, two divisions). The composition before issue 30 added 6 and 14.
EAGER_EXTRA_PASSES = [
    ({"z_loss": 1e-4}, 1),
    ({"softcap": 30.0}, 8),
    ({"z_loss": 1e-4, "softcap": 30.0}, 9),
]


@pytest.mark.parametrize(("head", "extra"), EAGER_EXTRA_PASSES, ids=repr)
@pytest.mark.parametrize("loss", LOSSES)
def test_options_add_only_their_own_passes_to_the_fast_path(loss, head, extra):
    x = torch.randn(64, 100, requires_grad=True)
    t = torch.randint(0, 100, (64,))
    t[3] = -100
    with ti.kernels("eager"):
        plain = _passes_over_the_logits(getattr(ti, loss), x, t)
        options = _passes_over_the_logits(getattr(ti, loss), x, t, **head)
    # the counter sees the fast path's softmax, its row sum and backward's multiplication
    assert plain == ["_softmax", "sum", "mul_"], plain
    assert len(options) <= len(plain) + extra, (options, plain)


@pytest.mark.parametrize("loss", LOSSES)
def test_the_kernel_takes_the_options_and_meets_the_strict_standard(loss, monkeypatch):
    """With kernels('triton') (the interpreter on this CPU) a call with z_loss or softcap runs
    the Triton kernel (the options in its own two passes) and meets the strict standard."""
    pytest.importorskip("triton")
    from dualloss.torch_impl import softmax as torch_softmax

    calls = []
    kernel = torch_softmax._softmax_triton

    def counted(*args, **kwargs):
        calls.append(args)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch_softmax, "_softmax_triton", counted)
    logits, targets = _case("index", 4.0)
    for dtype in (torch.float32, torch.bfloat16):
        z = torch.tensor(logits, dtype=dtype)
        t = torch.tensor(targets)
        for head in HEAD:
            for reduction in ("mean", "none"):
                x = z.clone().requires_grad_(True)
                before = len(calls)
                with ti.kernels("triton"):
                    value = getattr(ti, loss)(x, t, axis=1, reduction=reduction, **head)
                value.sum().backward()
                assert len(calls) == before + 1, f"{head} did not reach the kernel"
                assert_matches_spec(
                    loss, z.double().numpy(), targets,
                    dict(head, axis=1, reduction=reduction), str(dtype).removeprefix("torch."),
                    value.detach().double().numpy(), x.grad.double().numpy(),
                    context=f"torch_impl.{loss}({head}, {reduction}) under kernels('triton')",
                )  # fmt: skip


@pytest.mark.parametrize("backend", ["torch", "torch-triton", "jax"])
@pytest.mark.parametrize("loss", LOSSES)
def test_special_logits_with_the_options_give_the_spec_pattern(loss, backend):
    """-inf a masked class, +inf and NaN a NaN element, NaN and +inf logits on ignored rows 0 with
    zero gradient, with the cap (whose tanh would make them finite) and the z-term, on the fused
    paths (where the cap's masking and sech^2 come from the logits themselves)."""
    import math

    from dualloss import spec

    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 5)) * 5
    x[1, 2] = -math.inf
    x[2, 3] = math.inf
    x[3, 0] = math.nan
    x[4, 1] = math.inf
    x[5, 4] = math.nan
    t = np.array([0, 1, 2, -100, -100, 4])
    for head in ({"z_loss": 0.1}, {"softcap": 3.0}, {"z_loss": 0.1, "softcap": 3.0}):
        expected = getattr(spec, loss)(x, t, axis=1, reduction="none", **head)
        expected_grad = getattr(spec, f"{loss}_grad")(x, t, axis=1, reduction="none", **head)
        if backend == "jax":
            jax = pytest.importorskip("jax")
            from dualloss import jax_impl as ji

            with jax.enable_x64(True):
                value, pull = jax.vjp(
                    lambda z: getattr(ji, loss)(z, t, reduction="none", **head), x
                )
                (grad,) = pull(np.ones_like(value))
            value, grad = np.asarray(value), np.asarray(grad)
        else:
            if backend == "torch-triton":
                pytest.importorskip("triton")
            z = torch.tensor(x, requires_grad=True)
            with ti.kernels("triton" if backend == "torch-triton" else "eager"):
                out = getattr(ti, loss)(z, torch.tensor(t), reduction="none", **head)
            out.sum().backward()
            value, grad = out.detach().numpy(), z.grad.numpy()
        context = f"{backend}.{loss}({head})"
        np.testing.assert_array_equal(np.isnan(value), np.isnan(expected), err_msg=context)
        np.testing.assert_array_equal(np.isnan(grad), np.isnan(expected_grad), err_msg=context)
        np.testing.assert_allclose(value, expected, rtol=1e-12, atol=0.0, err_msg=context)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-10, atol=1e-15, err_msg=context)
        assert np.all(value[[3, 4]] == 0.0) and np.all(grad[[3, 4]] == 0.0), context


@pytest.fixture
def one_rank_group():
    """A gloo group of this process alone, destroyed afterwards (no other test sees it)."""
    import os

    import torch.distributed as dist

    if dist.is_initialized():
        yield dist.group.WORLD
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("head", [{"z_loss": 1e-4}, {"softcap": 30.0, "z_loss": 1e-3}])
@pytest.mark.parametrize("loss", LOSSES)
def test_process_group_takes_the_options_on_one_rank(loss, head, one_rank_group):
    # the vocab-parallel path on a group of one rank (tests/test_torch_vocab_parallel.py splits
    # the classes over 2 and 4 gloo processes)
    logits, targets = _case("index", 3.0)
    x = torch.tensor(logits, requires_grad=True)
    value = getattr(ti, loss)(x, torch.tensor(targets), process_group=one_rank_group, **head)
    value.backward()
    assert_matches_spec(
        loss, logits, targets, dict(head, axis=1), "float64", value.detach().numpy(),
        x.grad.numpy(), context=f"torch_impl.{loss}({head}, process_group=one rank)",
    )  # fmt: skip


@pytest.mark.parametrize("head", [{"z_loss": 1e-4}, {"softcap": 30.0, "z_loss": 1e-3}])
@pytest.mark.parametrize("loss", LOSSES)
def test_axis_name_takes_the_options_on_one_device(loss, head):
    # the class split over a mesh axis of one device (tests/test_jax_axis_name.py: 8 devices)
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from dualloss import jax_impl as ji

    logits, targets = _case("index", 3.0)
    logits = logits.astype(np.float32)
    mesh = Mesh(np.array(jax.devices()[:1]), ("vocab",))

    def f(x, t):
        return getattr(ji, loss)(x, t, axis_name="vocab", **head)

    g = jax.shard_map(f, mesh=mesh, in_specs=(P(None, "vocab"), P()), out_specs=P())
    # under jit, as shard_map runs in training (eager, every op is dispatched on its own)
    value, grad = jax.jit(jax.value_and_grad(g))(logits, targets)
    assert_matches_spec(
        loss, logits.astype(np.float64), targets, head, "float32", np.asarray(value, np.float64),
        np.asarray(grad, np.float64), context=f"jax_impl.{loss}({head}, axis_name)",
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The fused linear losses: the options per row block, judged by the linear oracle's strict bound
# ----------------------------------------------------------------------------------------------

LINEAR_HEAD = [
    ("linear_softmax_cross_entropy", {"z_loss": 1e-4, "softcap": 30.0}),
    ("linear_softmax_cross_entropy", {"z_loss": 0.5, "softcap": 0.5, "label_smoothing": 0.1}),
    ("linear_softmax_focal_loss", {"gamma": 2.0, "z_loss": 1e-3}),
    ("linear_softmax_focal_loss", {"gamma": 0.5, "softcap": 15.0, "alpha": "vector"}),
]
LINEAR_REGIONS = ("typical", "huge_norms", "ignored", "confident", "half_overflow")


# every pair of values of any two parameters (--full: all)
@pytest.mark.exhaustive
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize(("name", "options"), LINEAR_HEAD, ids=repr)
def test_fused_linear_head_options_meet_the_strict_bound(name, options, backend, reduction, dtype):
    from dualloss.parity import linear as L

    for case in L.make_cases(name, options, regions=LINEAR_REGIONS):
        prep = L.prepare(case, dtype)
        fn = L.ours(backend, name, dict(prep.options, chunk_size=16), reduction)
        prep.options["reduction"] = reduction
        outcome = L.run(fn, backend, prep)
        assert outcome.error is None, outcome.error
        judgement = L.judge(name, prep, outcome, "strict")
        context = f"[{backend}.{name}({options}), {dtype}, {case.region}, {reduction}]"
        assert judgement.kind == "ok", f"{context}: " + "; ".join(judgement.problems)


@pytest.mark.parametrize("name", ["linear_softmax_cross_entropy", "linear_softmax_focal_loss"])
def test_fused_linear_options_never_form_the_logits(name, monkeypatch):
    """No tensor of the (N, V) logits' size is created with the options (blocks of 8 rows)."""
    from dualloss.torch_impl import linear as torch_linear

    sizes = []
    real = torch_linear._softmax_loss_or_grad

    def spy(z, *args):
        sizes.append(tuple(z.shape))
        return real(z, *args)

    monkeypatch.setattr(torch_linear, "_softmax_loss_or_grad", spy)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 8, generator=g, requires_grad=True)
    w = torch.randn(50, 8, generator=g, requires_grad=True)
    y = torch.randint(0, 50, (64,), generator=g)
    loss = getattr(ti, name)(h, w, y, z_loss=1e-3, softcap=5.0, chunk_size=8)
    loss.backward()
    assert sizes and all(rows <= 8 for rows, _ in sizes), sizes


# ----------------------------------------------------------------------------------------------
# return_aux: the per-element statistics against the spec's
# ----------------------------------------------------------------------------------------------

AUX_OPTIONS = [{}, {"z_loss": 1e-3, "softcap": 30.0}, {"z_loss": 0.5, "where": "mask"}]
UNIT = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def _aux_tolerance(name, expected, c_max, n, z_loss, dtype, cap):
    """lse = c_top + log(sum exp(c - c_top)) in the working precision: the shift rounds each
    c_k - c_top (one ULP of the largest |c|, CAP_ULPS of them for computed capped logits, as
    ``parity.tolerance``), plus 8 ULPs of its own; the z-term 2 z_loss |lse| times that plus 8
    ULPs; 'correct' is exact per element; a reduction adds pairwise summation of n terms; half
    dtypes one rounding at the end."""
    from dualloss.parity.tolerance import CAP_ULPS

    work = "float32" if dtype in ("float16", "bfloat16") else dtype
    u = UNIT[work]
    shift = (CAP_ULPS if cap else 1.0) * 2.0 * u * c_max
    lse_tol = shift + 8 * u * np.abs(expected["lse"])
    tol = {
        "lse": lse_tol,
        "z_term": 2 * z_loss * np.abs(expected["lse"]) * lse_tol + 8 * u * expected["z_term"],
        "correct": 8 * u * np.abs(expected["correct"]),
    }
    if np.ndim(expected["lse"]) == 0:
        tol = {k: v * n + (1 + np.ceil(np.log2(n))) * u * np.abs(expected[k]) * n
               for k, v in tol.items()}  # fmt: skip
    if dtype != work:
        tol = {k: v + UNIT[dtype] * np.abs(expected[k]) for k, v in tol.items()}
    return tol


# every pair of values of any two parameters (--full: all)
@pytest.mark.exhaustive
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("kind", ["index", "prob"])
@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("loss", LOSSES)
def test_return_aux_matches_the_spec(loss, backend, kind, reduction, dtype):
    from dualloss import spec

    for head in AUX_OPTIONS:
        logits, targets, options = _prepare(loss, kind, {}, head, scale=4.0)
        options["reduction"] = reduction
        if backend == "torch":
            run = _torch_run
            torch_dtype = getattr(torch, dtype)
            z, t, spec_options, _, _ = run(loss, logits, targets, options, torch_dtype)
            kw = {k: (torch.tensor(v) if isinstance(v, np.ndarray) else v)
                  for k, v in spec_options.items()}  # fmt: skip
            zt = torch.tensor(z).to(torch_dtype)
            tt = torch.tensor(t).to(torch_dtype) if t.dtype.kind == "f" else torch.tensor(t)
            value, aux = getattr(ti, loss)(zt, tt, axis=1, return_aux=True, **kw)
            got = {k: v.double().numpy() for k, v in aux.items()}
            spec_options = dict(spec_options, axis=1)
        else:
            z, t, spec_options, _, _ = _jax_run(loss, logits, targets, options, dtype)
            import jax
            import jax.numpy as jnp

            from dualloss import jax_impl as ji

            with jax.enable_x64(dtype == "float64"):
                kw = {k: (jnp.asarray(v, dtype) if isinstance(v, np.ndarray) and v.dtype.kind
                          == "f" else v) for k, v in spec_options.items()}  # fmt: skip
                tj = jnp.asarray(t, dtype) if t.dtype.kind == "f" else jnp.asarray(t)
                value, aux = getattr(ji, loss)(jnp.asarray(z, dtype), tj, return_aux=True, **kw)
                got = {k: np.asarray(v.astype(jnp.float32) if dtype != "float64" else v,
                                     np.float64) for k, v in aux.items()}  # fmt: skip
        expected_value, expected = getattr(spec, loss)(z, t, return_aux=True, **spec_options)
        cap = spec_options.get("softcap")
        c = np.abs(cap * np.tanh(z / cap)) if cap else np.abs(z)
        tol = _aux_tolerance(loss, expected, c.max(), z.shape[0], spec_options.get("z_loss", 0.0),
                             dtype, cap)  # fmt: skip
        for key in ("lse", "z_term", "correct"):
            err = np.abs(got[key] - expected[key])
            assert np.all(err <= tol[key]), (
                f"{backend}.{loss}({head}, {kind}, {reduction}, {dtype}) aux[{key!r}] = "
                f"{got[key]}, spec {expected[key]}"
            )
        if reduction == "none":
            assert np.array_equal(got["correct"], expected["correct"])


def test_return_aux_correct_is_the_token_accuracy_and_ignores_ignored_rows():
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [5.0, 0.0, 0.0]])
    targets = torch.tensor([0, 0, 2, -100])
    weight = torch.tensor([4.0, 1.0, 1.0])
    _, aux = ti.softmax_cross_entropy(logits, targets, weight=weight, return_aux=True)
    assert float(aux["correct"]) == pytest.approx(2.0 / 3.0)
    _, aux = ti.softmax_cross_entropy(logits, targets, reduction="none", return_aux=True)
    assert aux["correct"].tolist() == [1.0, 0.0, 1.0, 0.0] and float(aux["lse"][3]) == 0.0


def test_return_aux_takes_no_gradient_and_refuses_non_booleans():
    x = torch.randn(4, 5, requires_grad=True)
    loss, aux = ti.softmax_focal_loss(x, torch.arange(4), z_loss=0.1, return_aux=True)
    assert not any(v.requires_grad for v in aux.values())
    loss.backward()
    with pytest.raises(TypeError, match=r"^`return_aux` must be True or False\. Received: "):
        ti.softmax_cross_entropy(x, torch.arange(4), return_aux="yes")


# ----------------------------------------------------------------------------------------------
# The oracle: the hand-written soft-capped, z-lossed loss as a client
# ----------------------------------------------------------------------------------------------

CAP, ZL = 30.0, 1e-4


def hand_written(logits, targets):
    """What users write around F.cross_entropy (Gemma 2's cap, PaLM's z-loss), in bfloat16."""
    import torch.nn.functional as F

    c = CAP * torch.tanh(logits / CAP)
    return F.cross_entropy(c, targets) + ZL * torch.logsumexp(c, -1).pow(2).mean()


def test_check_flags_the_hand_written_composition_with_a_reproducer():
    """Its z-term averages over every row, ignored ones included: a padding row's logits get a
    gradient (and an all-ignored batch a NaN loss). check finds it in bfloat16, names the region
    and gives a line that reproduces it."""
    from dualloss import parity

    report = parity.check(
        hand_written, "softmax_cross_entropy", backend="torch",
        options={"z_loss": ZL, "softcap": CAP}, dtypes=["bfloat16"], grads="logits",
    )  # fmt: skip
    assert not report.ok
    regions = {hazard.region for hazard in report.hazards}
    assert "all_ignored" in regions, str(report)
    reproducer = next(h for h in report.hazards if h.region == "all_ignored").failure.reproducer
    assert "hand_written(x, t)" in reproducer and "bfloat16" in reproducer


@pytest.mark.parametrize("loss", LOSSES)
def test_check_passes_ours_with_the_options_under_the_strict_standard(loss):
    from dualloss import parity

    def ours(logits, targets):
        return getattr(ti, loss)(logits, targets, z_loss=ZL, softcap=CAP)

    report = parity.check(
        ours, loss, backend="torch", options={"z_loss": ZL, "softcap": CAP},
        dtypes=["bfloat16", "float32"], standard="strict", grads="logits",
    )  # fmt: skip
    assert report.ok, str(report)


@pytest.mark.parametrize("loss", LOSSES)
def test_torch_options_pass_gradcheck_and_gradgradcheck(loss):
    """The cap and the z-term's closed-form backward, and their create_graph branch, against
    finite differences (float64)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 5, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    t = torch.tensor([0, 2, -100, 4])

    def fn(x):
        return getattr(ti, loss)(x, t, z_loss=0.3, softcap=2.5, reduction="sum")

    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))
