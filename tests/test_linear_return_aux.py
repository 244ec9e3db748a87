"""``return_aux=True`` on the fused linear losses (DESIGN 13): the per-row lse of the capped
logits, the z-term and whether the largest logit is the target, from the same block pass,
reduced as the spec says ('none' per row, 'sum', 'mean' over the kept rows, or over a
normalizer).

The spec's statistics are judged against its softmax losses' ``return_aux`` on the logits it
forms (an independent path: the linear spec computes them through ``_softmax_elements``), the
backends' against the spec, in float64 (to a few ULPs) and float32 (computed in float32: the
statistics of logits rounded in float32, to float32's resolution of the lse), with row blocks
that leave a partial last block, ties (the first index wins), ignored rows and the LLM head
options. The loss and its gradients are the ones without `return_aux`. Over a process group /
mesh axis: tests/test_linear_torch_vocab_parallel.py, tests/test_linear_jax_sharded.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from dualloss import spec
from dualloss.parity import linear as L

N, H, V, CHUNK = 13, 6, 11, 4
LOSSES = ("linear_softmax_cross_entropy", "linear_softmax_focal_loss")
OPTIONS = (
    {},
    {"z_loss": 1e-2, "softcap": 3.0},
    {"label_smoothing": 0.1, "vector": True, "z_loss": 1e-3},
)
REDUCTIONS = ({"reduction": "none"}, {"reduction": "sum"}, {"reduction": "mean"},
              {"reduction": "mean", "normalizer": 7.0})  # fmt: skip


def _options(loss, options):
    options = dict(options)
    if options.pop("vector", False):
        options["alpha" if loss.endswith("focal_loss") else "weight"] = np.linspace(0.2, 0.9, V)
    if loss.endswith("focal_loss"):
        options["gamma"] = 2.0
    return options


def _inputs(region):
    hidden, kernel, bias, targets = L.region_inputs(region, N, H, V, seed=7)
    return hidden, kernel, bias, targets.astype(np.int64)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("region", ["ties", "ignored"])
def test_spec_aux_equals_the_softmax_loss_aux_of_the_logits(loss, region):
    hidden, kernel, bias, targets = _inputs(region)
    softmax = getattr(spec, loss.removeprefix("linear_"))
    for options in OPTIONS:
        for reduction in REDUCTIONS:
            kw = {**_options(loss, options), **reduction}
            value, aux = getattr(spec, loss)(hidden, kernel, targets, bias=bias, return_aux=True,
                                             **kw)  # fmt: skip
            want_value, want = softmax(hidden @ kernel + bias, targets, return_aux=True, **kw)
            np.testing.assert_array_equal(value, want_value)
            assert set(aux) == {"lse", "z_term", "correct"}
            for key in want:
                np.testing.assert_allclose(aux[key], want[key], rtol=1e-13, atol=1e-300,
                                           err_msg=f"{key} {loss} {kw}")  # fmt: skip


def _check_backend(backend, dtype):
    u = {"float64": 2.0**-53, "float32": 2.0**-24}[dtype]
    # JAX compiles each program: per row and the normalizer's mean (the sum and the plain mean
    # reduce the same per-row numbers as torch's, which runs all four)
    reductions = REDUCTIONS if backend == "torch" else REDUCTIONS[::3]
    for loss in LOSSES:
        for region in ("ties", "ignored", "confident"):
            hidden, kernel, bias, targets = _inputs(region)
            for options in OPTIONS:
                for reduction in reductions:
                    kw = {**_options(loss, options), **reduction}
                    case = L.LinearCase(loss, region, "x", hidden, kernel, bias, targets, kw)
                    prep = L.prepare(case, dtype)
                    h, k, b = prep.ref
                    want_value, want = getattr(spec, loss)(
                        h, k, targets, bias=b, return_aux=True, **prep.options
                    )
                    # the loss is the one without return_aux, bit for bit
                    plain = _call(backend, loss, prep, kw["reduction"], dtype, False)
                    got_value, got = _call(backend, loss, prep, kw["reduction"], dtype, True)
                    np.testing.assert_array_equal(got_value, plain)
                    # the logits formed in the dtype: each moves by ~H u |h||w|, the lse with them
                    scale = (np.abs(h) @ np.abs(k) + np.abs(b)).max(axis=1)
                    per_row = 8 * (H + 1) * u * scale + 8 * u * np.abs(want["lse"]).max()
                    count = N if kw["reduction"] != "none" else 1
                    for key in want:
                        tol = per_row.max() * count
                        if key == "z_term":
                            tol = tol * 2 * kw.get("z_loss", 0.0) * (np.abs(want["lse"]).max() + 1)
                        if key == "correct":
                            # argmax is exact (no near ties but exact ones): the count
                            # is, and its division (JAX: times the reciprocal) rounds in the dtype
                            tol = 2 * u * np.abs(want[key])
                        got_key = np.asarray(got[key], np.float64)
                        assert got_key.shape == np.shape(want[key]), (key, got_key.shape)
                        assert np.all(np.abs(got_key - want[key]) <= tol + 1e-300), (
                            f"{key}: {got_key} but spec gives {want[key]} [{backend}.{loss} "
                            f"{region} {kw} {dtype}]"
                        )


_JITTED: dict = {}


def _call(backend, loss, prep, reduction, dtype, return_aux):
    """The loss (with `return_aux`, and the statistics) as float64 arrays."""
    h, k, b = prep.hidden, prep.linear_weight, prep.bias
    options = {key: value for key, value in prep.options.items() if key != "reduction"}
    extra = {"return_aux": True} if return_aux else {}
    if backend == "torch":
        import torch

        from dualloss import torch_impl as module

        t = getattr(torch, dtype)
        kw = {key: torch.tensor(v).to(t) if isinstance(v, np.ndarray) else v
              for key, v in options.items()}  # fmt: skip
        out = getattr(module, loss)(
            torch.tensor(h).to(t), torch.tensor(k.T).to(t), torch.tensor(prep.case.targets),
            bias=torch.tensor(b).to(t), reduction=reduction, chunk_size=CHUNK, **kw, **extra,
        )  # fmt: skip
        if not return_aux:
            return out.double().numpy()
        value, aux = out
        assert all(x.dtype == t for x in (value, *aux.values()))
        return value.double().numpy(), {key: x.double().numpy() for key, x in aux.items()}
    import jax
    import jax.numpy as jnp

    from dualloss import jax_impl as module

    with jax.enable_x64(dtype == "float64"):
        kw = {key: jnp.asarray(v, dtype) if isinstance(v, np.ndarray) else v
              for key, v in options.items()}  # fmt: skip

        def fn(hh, kk, bb, tt):
            return getattr(module, loss)(hh, kk, tt, bias=bb, reduction=reduction,
                                         chunk_size=CHUNK, **kw, **extra)  # fmt: skip

        # one compiled program per loss, options, reduction and dtype, shared by the regions
        # (the class vector is the same ramp in every case)
        key = (loss, repr(sorted((n, v) for n, v in kw.items() if not hasattr(v, "shape"))),
               tuple(sorted(kw)), reduction, dtype, return_aux)  # fmt: skip
        if key not in _JITTED:
            _JITTED[key] = jax.jit(fn)
        out = _JITTED[key](*(jnp.asarray(x, dtype) for x in (h, k, b)),
                           jnp.asarray(prep.case.targets))  # fmt: skip
        if not return_aux:
            return np.asarray(out, np.float64)
        value, aux = out
        assert all(str(x.dtype) == dtype for x in (value, *aux.values()))
        return np.asarray(value, np.float64), {key: np.asarray(x, np.float64)
                                               for key, x in aux.items()}  # fmt: skip


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_aux_matches_the_spec_and_leaves_the_loss_unchanged(dtype):
    pytest.importorskip("torch")
    _check_backend("torch", dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_jax_aux_matches_the_spec_and_leaves_the_loss_unchanged(dtype):
    pytest.importorskip("jax")
    _check_backend("jax", dtype)


def test_return_aux_that_is_not_a_bool_raises_one_sentence():
    jax = pytest.importorskip("jax")
    from dualloss import jax_impl

    h, w, y = jax.numpy.zeros((4, 3)), jax.numpy.zeros((3, 5)), jax.numpy.arange(4)
    with pytest.raises(TypeError, match=r"^`return_aux` must be True or False\. Received: retu"):
        jax_impl.linear_softmax_focal_loss(h, w, y, return_aux="yes")
