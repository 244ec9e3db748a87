"""The JAX fused linear losses with the head weight split over the classes (issue 29, DESIGN 12).

In one subprocess with 8 forced host devices (the flag must be set before jax is imported):

* ``axis_name=`` inside ``jax.shard_map``, the weight's columns (H, V) and the bias split over a
  1-D mesh axis of 3 devices (V = 9, N = 12, H = 8, row blocks of 5): value and gradients of
  hidden, weight and bias judged against the spec to the strict standard of the fused losses
  (``dualloss.parity.linear``'s derived bound) and against the unsharded ``jax_impl`` fused loss
  to the same per-entry tolerance; regions ignored, confident, ties, bias mask, all ignored;
  cross entropy, class weights, focal gamma 2 and gamma 0.5 with a vector alpha; reductions
  mean, none and a normalizer; float64, float32 and bfloat16; `z_loss` with `softcap` (cross
  entropy, focal) and label smoothing (with class weights, and with z_loss and softcap) in a
  normalizer (float64) and the mean (float32). The compiled program gathers
  nothing and all-reduces per-row numbers and the (rows, H) hidden gradient only. `return_aux`
  (lse, z-term, whether the first top logit over the slices is the target) against the spec.
  Logits spanning more than float32's largest number (the top class on the first slice, the far
  target class on the last): the spec's finite loss, finite gradients.
* a 2-D (data x vocab = 2 x 4) mesh: rows split over data, classes over vocab, the normalizer
  ``global_count(..., axis_name='data')``: the psum'd loss and the gradients equal the unsharded
  one-batch mean.
* plain ``jax.jit`` with the weight (H, V) and bias sharded over V by ``NamedSharding`` on an
  8-device mesh: XLA's partitioner keeps the fused losses vocab-parallel: the compiled HLO of
  value and gradients has no all-gather (of the weight, the logits or anything else), only
  all-reduces of per-row numbers and of each block's (rows, H) hidden gradient; the results equal
  the unsharded ones.

Bad input (`axis_name` not bound, focal label smoothing with gamma != 0) is checked in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from dualloss import jax_impl  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import json, re, sys
    from functools import partial
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from dualloss import jax_impl, spec
    from dualloss.parity import linear as L
    from dualloss.parity.tolerance import UNIT_ROUNDOFF

    N, H, V, CHUNK = 12, 8, 9, 5
    LOSSES = {
        "ce": ("linear_softmax_cross_entropy", {}),
        "ce_weight": ("linear_softmax_cross_entropy", {"weight": "vector"}),
        "focal": ("linear_softmax_focal_loss", {"gamma": 2.0}),
        "focal_alpha": ("linear_softmax_focal_loss", {"gamma": 0.5, "alpha": "vector"}),
        # the LLM head options and label smoothing (DESIGN 13)
        "ce_head": ("linear_softmax_cross_entropy", {"z_loss": 1e-2, "softcap": 5.0}),
        "focal_head": ("linear_softmax_focal_loss",
                       {"gamma": 2.0, "alpha": "vector", "z_loss": 1e-2, "softcap": 30.0}),
        "ce_smooth": ("linear_softmax_cross_entropy",
                      {"weight": "vector", "label_smoothing": 0.1}),
        "ce_smooth_head": ("linear_softmax_cross_entropy",
                           {"label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 5.0}),
    }
    PLAIN = ("ce", "ce_weight", "focal", "focal_alpha")
    OPTIONS = ("ce_head", "focal_head", "ce_smooth", "ce_smooth_head")
    REDUCTIONS = {"mean": {"reduction": "mean"}, "none": {"reduction": "none"},
                  "normalizer": {"reduction": "mean", "normalizer": 5.0}}
    REGIONS = ("ignored", "confident", "ties", "bias_mask", "all_ignored")
    # every reduction in float64; the mean in float32 and (two losses) bfloat16
    RUNS = [(loss, reduction, "float64") for loss in PLAIN for reduction in REDUCTIONS]
    RUNS += [(loss, "mean", "float32") for loss in PLAIN]
    RUNS += [(loss, "mean", "bfloat16") for loss in ("ce", "focal_alpha")]
    # the options: a normalizer in float64 and the mean in float32, in the same mesh
    RUNS += [(loss, red, dt) for loss in OPTIONS
             for red, dt in (("normalizer", "float64"), ("mean", "float32"))]
    if sys.argv[1:] != ["full"]:
        # the default profile: every loss with two (reduction, dtype) pairs and the options with
        # one, every reduction with every dtype it runs in above (26 runs, each two compilations)
        RUNS = [("ce", "mean", "float32"), ("ce", "none", "float64"), ("ce", "mean", "bfloat16"),
                ("ce_weight", "mean", "float64"), ("ce_weight", "mean", "float32"),
                ("focal", "none", "float64"), ("focal", "mean", "float32"),
                ("focal_alpha", "normalizer", "float64"), ("focal_alpha", "mean", "bfloat16"),
                ("ce_head", "normalizer", "float64"), ("focal_head", "mean", "float32"),
                ("ce_smooth", "mean", "float32"), ("ce_smooth_head", "normalizer", "float64")]
    out = {"cases": {}, "collectives": {}, "runs": RUNS}


    def collectives(hlo):
        # (kind, [shapes]) of every collective in the compiled program
        found = []
        for line in hlo.splitlines():
            m = re.search(r"= (.*?) (all-gather|all-reduce|all-to-all|collective-permute|"
                          r"reduce-scatter)(-start)?\\(", line)
            if m:
                shapes = [[int(d) for d in dims.split(",") if d]
                          for dims in re.findall(r"[a-z]+\\d*\\[([\\d,]*)\\]", m.group(1))]
                found.append((m.group(2), shapes))
        return found


    def prepared(loss, reduction, region, dtype):
        name, options = LOSSES[loss]
        hidden, kernel, bias, targets = L.region_inputs(region, N, H, V, seed=29)
        options = L.option_values({**options, **REDUCTIONS[reduction]}, V)
        case = L.LinearCase(name, region, f"{N}x{H}x{V}", hidden, kernel, bias, targets, options)
        return name, L.prepare(case, dtype)


    def tolerances(name, prep, want):
        normalizer = prep.options.get("normalizer")
        if normalizer is None:
            return L.tolerances(name, prep, want, "strict")
        # the bound of the sum divided by the normalizer, plus the division's own rounding
        options = {k: v for k, v in prep.options.items() if k != "normalizer"}
        summed = L.Prepared(prep.case, prep.dtype, prep.hidden, prep.linear_weight, prep.bias,
                            {**options, "reduction": "sum"})
        tol = L.tolerances(name, summed, L.expected(name, summed), "strict")
        u = UNIT_ROUNDOFF["float32" if prep.dtype == "bfloat16" else prep.dtype]
        return {k: t / normalizer + u * np.abs(want[k]) for k, t in tol.items()}


    def worst(got, want, tol):
        got = np.asarray(got, np.float64)
        if not np.all(np.isfinite(got)):
            return float("inf")
        bound = np.maximum(np.broadcast_to(tol, np.shape(want)), 1e-300)
        return float(np.max(np.abs(got - want) / bound, initial=0.0))


    # --- axis_name= inside shard_map, 1-D mesh of 3 devices (3 classes each) ----------------
    mesh = Mesh(np.array(jax.devices()[:3]), ("vocab",))
    for loss, reduction, dtype in RUNS:
        name, _ = LOSSES[loss]
        fn = getattr(jax_impl, name)
        _, prep0 = prepared(loss, reduction, "ignored", dtype)
        kw = {k: (jnp.asarray(v, dtype) if isinstance(v, np.ndarray) else v)
              for k, v in prep0.options.items()}

        @partial(jax.shard_map, mesh=mesh, in_specs=(P(), P(None, "vocab"), P("vocab"), P()),
                 out_specs=P())
        def total(h, w, b, y):
            return jnp.sum(fn(h, w, y, bias=b, chunk_size=CHUNK, axis_name="vocab", **kw))

        f = jax.jit(jax.value_and_grad(total, argnums=(0, 1, 2)))
        # the unsharded fused loss on the same inputs
        f_one = jax.jit(jax.value_and_grad(
            lambda h, w, b, y: jnp.sum(fn(h, w, y, bias=b, chunk_size=CHUNK, **kw)),
            argnums=(0, 1, 2)))
        for region in REGIONS:
            if region == "all_ignored" and (reduction, dtype) != ("mean", "float32"):
                continue
            name, prep = prepared(loss, reduction, region, dtype)
            h, w, b = (jnp.asarray(x, dtype) for x in prep.ref)
            y = jnp.asarray(prep.case.targets)
            if loss in ("ce", "ce_smooth_head") and region == "ignored":
                out["collectives"][f"shard_map {loss} {reduction} {dtype}"] = collectives(
                    f.lower(h, w, b, y).compile().as_text())
            value, grads = f(h, w, b, y)
            dtypes = {str(x.dtype) for x in (value, *grads)}
            got = {"value": np.asarray(value, np.float64)}
            got.update(zip(("hidden", "linear_weight", "bias"),
                           (np.asarray(g, np.float64) for g in grads)))
            value, grads = f_one(h, w, b, y)
            theirs = {"value": np.asarray(value, np.float64)}
            theirs.update(zip(("hidden", "linear_weight", "bias"),
                              (np.asarray(g, np.float64) for g in grads)))
            want = L.expected(name, prep)
            if reduction == "none":
                want["value"] = np.sum(want["value"])
            tol = tolerances(name, prep, want)
            if reduction == "none":
                tol["value"] = np.sum(tol["value"])
            out["cases"][f"{loss}-{reduction}-{region}-{dtype}"] = {
                "spec": max(worst(got[k], want[k], tol[k]) for k in want),
                "unsharded": max(worst(got[k], theirs[k], tol[k]) for k in want),
                "dtypes": sorted(dtypes),
            }

    # --- return_aux over the mesh axis: lse, z-term, whether the first top is the target -----
    out["aux"] = {}
    for loss in ("ce", "focal_head", "ce_smooth_head"):
        for reduction, dtype in (("none", "float64"), ("mean", "float32")):
            name, _ = LOSSES[loss]
            fn = getattr(jax_impl, name)
            _, prep0 = prepared(loss, reduction, "ties", dtype)
            kw = {k: (jnp.asarray(v, dtype) if isinstance(v, np.ndarray) else v)
                  for k, v in prep0.options.items()}

            @partial(jax.shard_map, mesh=mesh, in_specs=(P(), P(None, "vocab"), P("vocab"), P()),
                     out_specs=P())
            def with_aux(h, w, b, y):
                return fn(h, w, y, bias=b, chunk_size=CHUNK, axis_name="vocab", return_aux=True,
                          **kw)

            with_aux = jax.jit(with_aux)
            for region in ("ties", "bias_mask", "confident"):
                name, prep = prepared(loss, reduction, region, dtype)
                h, w, b = (jnp.asarray(x, dtype) for x in prep.ref)
                y = jnp.asarray(prep.case.targets)
                _, aux = with_aux(h, w, b, y)
                hidden, kernel, bias = prep.ref
                _, want = getattr(spec, name)(hidden, kernel, prep.case.targets, bias=bias,
                                              **prep.options, return_aux=True)
                eps = float(jnp.finfo(dtype).eps)
                # a few roundings of the dtype at the statistic's scale; `correct` exactly
                gaps = {key: worst(aux[key], want[key],
                                   8 * eps * np.max(np.abs(want[key]), initial=1.0))
                        for key in ("lse", "z_term")}
                gaps["correct"] = float(np.any(np.asarray(aux["correct"], np.float64)
                                               != np.asarray(want["correct"], dtype)))
                out["aux"][f"{loss}-{reduction}-{region}-{dtype}"] = gaps

    # --- logits spanning more than float32's largest number, over the mesh axis --------------
    # the top class (bias 0.9 max) on the first slice, the far target class (bias -0.9 max,
    # weight / alpha 0.25) on the last: z_y - z_top overflows there, the loss does not
    big = 0.9 * float(np.finfo(np.float32).max)
    rng = np.random.default_rng(7)
    hs = rng.normal(size=(4, H)).astype(np.float32)
    ks = (0.1 * rng.normal(size=(H, V))).astype(np.float32)
    bs = np.zeros(V, np.float32)
    bs[0], bs[V - 1] = big, -big
    vs = np.linspace(0.2, 0.9, V).astype(np.float32)
    vs[V - 1] = 0.25
    ys = np.array([V - 1, V - 1, 3, V - 1])
    out["span"] = {}
    for name, kw in (("linear_softmax_cross_entropy", {"weight": vs}),
                     ("linear_softmax_focal_loss", {"gamma": 2.0, "alpha": vs}),
                     ("linear_softmax_cross_entropy", {"weight": vs, "label_smoothing": 0.1})):
        fn = getattr(jax_impl, name)
        kj = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}

        @partial(jax.shard_map, mesh=mesh, in_specs=(P(), P(None, "vocab"), P("vocab"), P()),
                 out_specs=P())
        def spanned(h, w, b, y):
            return fn(h, w, y, bias=b, chunk_size=3, axis_name="vocab", reduction="none", **kj)

        got = np.asarray(jax.jit(spanned)(hs, ks, bs, ys), np.float64)
        grads = jax.grad(lambda h, w, b: jnp.sum(spanned(h, w, b, ys)), argnums=(0, 1, 2))(
            hs, ks, bs)
        want = getattr(spec, name)(*(x.astype(np.float64) for x in (hs, ks)), ys,
                                   bias=bs.astype(np.float64), reduction="none",
                                   **{k: (v.astype(np.float64) if isinstance(v, np.ndarray)
                                          else v) for k, v in kw.items()})
        out["span"][f"{name} {sorted(kw)}"] = {
            "finite": bool(np.all(np.isfinite(want))),
            "error": float(np.max(np.abs(got - want) / np.abs(want))),
            "grads_finite": all(bool(jnp.all(jnp.isfinite(g))) for g in grads),
        }

    # --- a 2-D mesh: rows over data, classes over vocab, the global mean ---------------------
    mesh2 = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "vocab"))
    V2 = 12
    hidden, kernel, bias, targets = L.region_inputs("ignored", N, H, V2, seed=3)
    args = tuple(jnp.asarray(x) for x in (hidden, kernel, bias))
    for name in ("linear_softmax_cross_entropy", "linear_softmax_focal_loss"):
        fn = getattr(jax_impl, name)

        @partial(jax.shard_map, mesh=mesh2,
                 in_specs=(P("data"), P(None, "vocab"), P("vocab"), P("data")), out_specs=P())
        def step(h, w, b, y):
            count = jax_impl.global_count(y, axis_name="data")
            loss = fn(h, w, y, bias=b, chunk_size=CHUNK, axis_name="vocab", normalizer=count)
            return jax.lax.psum(loss, "data")

        got = jax.jit(jax.value_and_grad(step, argnums=(0, 1, 2)))(*args, jnp.asarray(targets))
        want = jax.value_and_grad(lambda h, w, b: fn(h, w, jnp.asarray(targets), bias=b),
                                  argnums=(0, 1, 2))(*args)
        gaps = [float(np.max(np.abs(np.asarray(a) - np.asarray(e)) /
                             (1e-300 + np.max(np.abs(np.asarray(e))))))
                for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
        out[f"2-D {name}"] = max(gaps)

    # --- plain jit, the weight sharded over V by NamedSharding on 8 devices -------------------
    mesh8 = Mesh(np.array(jax.devices()), ("classes",))
    N8, H8, V8 = 16, 8, 64
    hidden, kernel, bias, targets = L.region_inputs("ignored", N8, H8, V8, seed=5)
    h, w, b = (jnp.asarray(x, jnp.float32) for x in (hidden, kernel, bias))
    y = jnp.asarray(targets)
    ws = jax.device_put(w, NamedSharding(mesh8, P(None, "classes")))
    bs = jax.device_put(b, NamedSharding(mesh8, P("classes")))
    for name, kw in (("linear_softmax_cross_entropy", {}),
                     ("linear_softmax_focal_loss", {"gamma": 0.5}),
                     ("linear_softmax_cross_entropy", {"reduction": "none"})):
        fn = getattr(jax_impl, name)
        f = jax.jit(jax.value_and_grad(
            lambda h, w, b, y: jnp.sum(fn(h, w, y, bias=b, chunk_size=4, **kw)),
            argnums=(0, 1, 2)))
        label = f"jit {name} {sorted(kw.items())}"
        out["collectives"][label] = collectives(f.lower(h, ws, bs, y).compile().as_text())
        got, want = f(h, ws, bs, y), f(h, w, b, y)
        out[label] = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(e)) /
                         (1e-30 + np.max(np.abs(np.asarray(e))))))
            for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def results(full_tests):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "full" if full_tests else "default"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def test_axis_name_matches_the_spec_and_the_unsharded_loss(results):
    cases, runs = results["cases"], results["runs"]
    # every run in four regions, the float32 mean also all ignored; 26 runs, 13 by default
    assert len(runs) in (26, 13)
    assert len(cases) == len(runs) * 4 + sum(r[1:] == ["mean", "float32"] for r in runs)
    for case, judged in cases.items():
        dtype = case.rsplit("-", 1)[1]
        assert judged["dtypes"] == [dtype], (case, judged["dtypes"])
        # the worst entry's error as a multiple of the strict tolerance
        assert judged["spec"] <= 1.0, f"{case}: {judged['spec']:.3g} x the tolerance (spec)"
        assert judged["unsharded"] <= 1.0, (
            f"{case}: {judged['unsharded']:.3g} x the tolerance (unsharded jax_impl)"
        )


def test_axis_name_programs_gather_nothing_and_reduce_rows_and_the_hidden_gradient(results):
    found = {k: v for k, v in results["collectives"].items() if k.startswith("shard_map")}
    # each run of cross entropy (full: float64 mean, none and normalizer, float32, bfloat16)
    # and of label smoothing with z_loss and softcap (full: float64 normalizer, float32)
    assert len(found) == sum(r[0] in ("ce", "ce_smooth_head") for r in results["runs"]) >= 4
    for label, calls in found.items():
        kinds = {kind for kind, _ in calls}
        assert kinds == {"all-reduce"}, (label, calls)
        for _, shapes in calls:
            for dims in shapes:
                # per row of a block (5, 1) or (5,), or the hidden gradient (rows, H): label
                # smoothing's third number per row rides in the same psum
                size = int(np.prod(dims))
                assert size <= 5 or dims[-1] == 8, (label, dims)


def test_return_aux_over_the_mesh_axis_matches_the_spec(results):
    # lse and the z-term within a few roundings, `correct` exactly (the "ties" region ties
    # across the slices: the first top over every slice decides)
    aux = results["aux"]
    assert len(aux) == 18, sorted(aux)
    for label, gaps in aux.items():
        assert gaps["correct"] == 0.0, (label, gaps)
        assert gaps["lse"] <= 1.0 and gaps["z_term"] <= 1.0, (label, gaps)


def test_logits_spanning_beyond_the_largest_number_give_the_finite_loss_over_the_axis(results):
    # z_y rides in the psum beside z_y - z_top, and label smoothing's far form of the
    # class-weighted sum (``_linear_block``): every slice returned inf where the spec's loss is
    # about 0.25 x 0.9 x float32's largest number
    assert len(results["span"]) == 3
    for label, judged in results["span"].items():
        assert judged["finite"] and judged["grads_finite"], (label, judged)
        # float32 roundings of the logits and of a few terms: 1e-6 of the loss
        assert judged["error"] <= 1e-6, (label, judged)


def test_a_batch_split_over_data_gives_the_one_batch_mean(results):
    for name in ("linear_softmax_cross_entropy", "linear_softmax_focal_loss"):
        # float32 sums in a different order: a few ULPs of the largest entry
        assert results[f"2-D {name}"] <= 1e-6, (name, results[f"2-D {name}"])


def test_jit_with_the_weight_sharded_over_v_compiles_without_any_all_gather(results):
    found = {k: v for k, v in results["collectives"].items() if k.startswith("jit")}
    assert len(found) == 3
    for label, calls in found.items():
        assert calls, f"{label}: no collective at all, the weight was not split"
        for kind, shapes in calls:
            assert kind == "all-reduce", (label, kind, shapes)
            for dims in shapes:
                # per row of a block of 4, or that block's hidden gradient (4, H = 8)
                assert int(np.prod(dims)) <= 4 or dims == [4, 8], (label, dims)
        assert results[label] <= 1e-6, (label, results[label])


def test_bad_axis_name_and_unsupported_options_raise_one_sentence():
    h, w, y = jnp.zeros((4, 3)), jnp.zeros((3, 5)), jnp.arange(4)
    with pytest.raises(ValueError, match=r"^`axis_name` must name a mesh axis of the enclosing"):
        jax_impl.linear_softmax_cross_entropy(h, w, y, axis_name="vocab")
    with pytest.raises(
        ValueError,
        match=r"^`label_smoothing` is not supported with `axis_name` for the focal loss with "
        r"gamma != 0 \(yet\): pass 0\.0\. Received: label_smoothing=0\.1 with gamma=2\.0\.$",
    ):
        jax_impl.linear_softmax_focal_loss(h, w, y, axis_name="vocab", label_smoothing=0.1)
