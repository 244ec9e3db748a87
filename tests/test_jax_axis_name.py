"""``axis_name=`` (issue 29 item 1, DESIGN 12): the softmax losses inside ``jax.shard_map`` with the
class axis split over a mesh axis. In a subprocess with 8 forced host devices (the flag must be set
before jax is imported), on a 1-D class mesh (8 slices) and a 2-D (data x vocab = 2 x 4) mesh, in
float32 and float64 (the default profile a bounded subset of the runs, ``--full`` all of them):
the value and the gradient w.r.t. the logits are judged against the spec with the strict standard
(``dualloss.parity.tolerance.judge``), and so is the unsharded jax_impl result for the same inputs
(``--full``); the rows hold a confident row (every other class below the smallest normal), an
ignored target, ties across slices, -inf classes and a whole slice of -inf, targets on every slice;
every option; the compiled programs all-reduce only per-row or scalar values and gather nothing.
Bad `axis_name` values are refused with one sentence, in this process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dualloss import jax_impl

SCRIPT = textwrap.dedent(
    """
    import re, sys, time
    from functools import partial
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, PartitionSpec as P
    from dualloss import jax_impl
    from dualloss.parity.tolerance import judge

    start = time.time()
    N, C = 16, 64
    devices = np.array(jax.devices())
    MESHES = {
        "1-D": (Mesh(devices, ("vocab",)), None),
        "2-D": (Mesh(devices.reshape(2, 4), ("data", "vocab")), "data"),
    }


    def inputs(dtype):
        rng = np.random.default_rng(1)
        x = rng.normal(size=(N, C)) * 3.0
        y = rng.integers(0, C, size=N)
        y[:8] = [61, 45, 7, 33, 12, 20, 50, 2]
        # confident: every other class below the smallest normal (float32: e^-95, float64: e^-750)
        x[0, 61] = 95.0 if dtype == "float32" else 750.0
        # confident, normal sums
        x[1, 45] = 25.0
        y[2] = -100
        # -inf classes, the target elsewhere
        x[3, [0, 9, 40]] = -np.inf
        # a tie for the top across two slices, the target on a third
        x[4, [5, 60]] = 12.0
        # a whole slice of -inf (classes 16..23), the target on another
        x[5, 16:24] = -np.inf
        x = x.astype(dtype)
        p = rng.dirichlet(np.ones(C), size=N)
        p[:, 10:14] = 0.0  # 0 log 0
        p[3, [0, 9, 40]] = 0.0
        p[5, 16:24] = 0.0
        p /= p.sum(axis=1, keepdims=True)
        mask = np.ones((N, C), bool)
        mask[6, 30:34] = False
        mask[7] = False  # no class left: left out
        mask[8, y[8]] = False  # the target masked: ignored
        return x, y, p.astype(dtype), mask


    W = np.linspace(0.2, 1.0, C)
    FULL = []
    for loss, base in (("softmax_cross_entropy", {}), ("softmax_focal_loss", {"gamma": 2.0})):
        vector = "alpha" if loss == "softmax_focal_loss" else "weight"
        for extra in ({}, {vector: W, "reduction": "none"},
                      {"label_smoothing": 0.1, "reduction": "sum"}, {"where": True}):
            for kind in ("index", "probs"):
                FULL.append((loss, dict(base, **extra), kind))
    FULL.append(("softmax_focal_loss", {"gamma": 0.5, "alpha": W, "label_smoothing": 0.2}, "index"))
    FULL.append(("softmax_focal_loss", {"gamma": 0.0}, "index"))
    FULL.append(("softmax_cross_entropy", {"all_ignored": True}, "index"))
    # the LLM head options (DESIGN 13): the cap on the local slice, lse from the row's reductions
    FULL.append(("softmax_cross_entropy", {"z_loss": 1e-2, "softcap": 5.0, "reduction": "none"},
                 "index"))
    FULL.append(("softmax_focal_loss", {"gamma": 2.0, "z_loss": 1e-3, "softcap": 10.0}, "probs"))
    FULL.append(("softmax_cross_entropy", {"z_loss": 1e-2, "softcap": 4.0, "where": True,
                                           "label_smoothing": 0.1, "weight": W,
                                           "reduction": "sum"}, "index"))
    SMALL = [FULL[0], FULL[3], FULL[9], FULL[14]]
    # (dtype, mesh, cases, judge the unsharded backend too, read the compiled program)
    PROFILES = {
        # every option strictly in float64 on the 2-D mesh (the data-axis normalizer too) and
        # read compiled; the 8-slice mesh on a few
        "default": [("float64", "2-D", FULL, False, True), ("float32", "1-D", SMALL, False, True)],
        "full": [("float64", "1-D", FULL, True, False), ("float32", "2-D", FULL, True, True),
                 ("float32", "1-D", SMALL, False, True), ("float64", "2-D", SMALL, False, False)],
    }
    RUNS = PROFILES[sys.argv[1]]


    def kept_rows(targets, mask, has_where):
        # the spec's mean denominator without weights: rows with a class left and a target
        left = mask.any(axis=1) if has_where else np.ones(N, bool)
        if targets.ndim == 1:
            on = targets != -100
            if has_where:
                on &= mask[np.arange(N), np.clip(targets, 0, C - 1)]
            left &= on
        return float(left.sum())


    def sharded(fn, mesh, data, options, kind, has_where, reduction, normalizer):
        rows = P(data, "vocab")
        in_specs = (rows, rows if kind == "probs" else P(data), rows if has_where else P())

        @partial(jax.shard_map, mesh=mesh, in_specs=in_specs, out_specs=(P(), P(data)))
        def f(x, t, m):
            opts = dict(options)
            if has_where:
                opts["where"] = m
            if normalizer == "count":
                # the global mean over a batch split over `data`: the kept targets of every
                # data slice, one psum (global_count)
                opts["normalizer"] = jax_impl.global_count(t, axis_name=data)
            elif normalizer is not None:
                opts["normalizer"] = normalizer
            value = fn(x, t, axis_name="vocab", **opts)
            rows_value = value if reduction == "none" else jnp.zeros(x.shape[0], x.dtype)
            total = jnp.sum(value)
            # the batch split over `data`: the rows' sums add up over it
            return (total if data is None else jax.lax.psum(total, data)), rows_value
        return f


    failures, count, hlo_checked = [], 0, 0
    for dtype, mesh_name, cases, unsharded, read_hlo in RUNS:
        x, y, p, mask = inputs(dtype)
        mesh, data = MESHES[mesh_name]
        for loss, options, kind in cases:
            options = dict(options)
            all_ignored = options.pop("all_ignored", False)
            targets = np.full(N, -100) if all_ignored else (y if kind == "index" else p)
            has_where = options.pop("where", False)
            reduction = options.get("reduction", "mean")
            normalizer = None
            if data is not None and reduction == "mean":
                # a batch split over `data` needs the global count as the normalizer
                plain = kind == "index" and not has_where and "weight" not in options
                normalizer = "count" if plain else kept_rows(targets, mask, has_where)
            fn = getattr(jax_impl, loss)
            name = f"{loss}({sorted(options)}, where={has_where}, {kind}, {dtype}, {mesh_name})"
            f = sharded(fn, mesh, data, options, kind, has_where, reduction, normalizer)
            g = jax.jit(jax.value_and_grad(lambda a, t, m: f(a, t, m), has_aux=True))
            args = (jnp.asarray(x), jnp.asarray(targets), jnp.asarray(mask))
            compiled = g.lower(*args).compile()
            (value, rows_value), grad = compiled(*args)
            value = rows_value if reduction == "none" else value
            spec_options = dict(options)
            if has_where:
                spec_options["where"] = mask
            x64 = np.asarray(x, np.float64)
            j = judge(loss, x64, targets, spec_options, dtype, np.asarray(value, np.float64),
                      np.asarray(grad, np.float64))
            if not j.ok:
                failures.append(f"{name}: {'; '.join(j.nonfinite + j.inaccurate)}")
            if all_ignored and (np.any(np.asarray(value)) or np.any(np.asarray(grad))):
                failures.append(f"{name}: all ignored, but value or gradient not 0")
            count += 1
            if unsharded:
                # the unsharded backend on the same inputs, judged the same way
                def unsharded_sum(a, t, m):
                    opts = dict(options, where=m) if has_where else options
                    return jnp.sum(fn(a, t, **opts))

                h = jax.jit(jax.value_and_grad(unsharded_sum))
                u_value, u_grad = h(*args)
                if reduction == "none":
                    u_value = fn(args[0], args[1], **spec_options)
                j = judge(loss, x64, targets, spec_options, dtype,
                          np.asarray(u_value, np.float64), np.asarray(u_grad, np.float64))
                if not j.ok:
                    failures.append(f"unsharded {name}: {'; '.join(j.nonfinite + j.inaccurate)}")
            if read_hlo:
                hlo = compiled.as_text()
                hlo_checked += 1
                for op in ("all-gather", "all-to-all", "collective-permute", "reduce-scatter"):
                    if op + "(" in hlo or op + "-start(" in hlo:
                        failures.append(f"{name}: the compiled program has an {op}")
                for line in hlo.splitlines():
                    if " all-reduce(" not in line and " all-reduce-start(" not in line:
                        continue
                    result = line.split("=", 1)[1].split("all-reduce")[0]
                    for dims in re.findall(r"[a-z]+\\d+\\[([\\d,]*)\\]", result):
                        sizes = [int(d) for d in dims.split(",") if d]
                        # the sum of exponentials rides with the top's logit: two per row
                        if int(np.prod(sizes)) > 2 * N:
                            failures.append(f"{name}: all-reduce of {result.strip()}, "
                                            "more than two values per row")
    # return_aux over the slices: lse, the z-term and `correct` (the first top over the slices,
    # row 4's tie) against the spec's, to a few roundings of each statistic's scale
    from dualloss import spec
    mesh = MESHES["1-D"][0]
    for dtype in ("float64", "float32"):
        x, y, p, mask = inputs(dtype)
        for loss, options, kind in (FULL[-3], FULL[-2], FULL[-1]):
            options = dict(options)
            has_where = options.pop("where", False)
            targets = y if kind == "index" else p

            @partial(jax.shard_map, mesh=mesh, out_specs=(P(), P()),
                     in_specs=(P(None, "vocab"), P(None, "vocab") if kind == "probs" else P(),
                               P(None, "vocab")))
            def with_aux(a, t, m):
                opts = dict(options, where=m) if has_where else options
                return getattr(jax_impl, loss)(a, t, axis_name="vocab", return_aux=True, **opts)

            _, aux = jax.jit(with_aux)(jnp.asarray(x), jnp.asarray(targets), jnp.asarray(mask))
            spec_options = dict(options, where=mask) if has_where else options
            _, expected = getattr(spec, loss)(np.asarray(x, np.float64),
                                              np.asarray(targets, np.float64) if kind == "probs"
                                              else targets, return_aux=True, **spec_options)
            eps = float(np.finfo(dtype).eps)
            for key, want in expected.items():
                got = np.asarray(aux[key], np.float64)
                scale = max(1.0, float(np.max(np.abs(want))))
                if key == "correct":
                    ok = np.array_equal(got, np.asarray(want, dtype).astype(np.float64))
                else:
                    ok = np.all(np.abs(got - want) <= 8 * eps * scale)
                if not ok:
                    failures.append(f"return_aux {loss}({sorted(options)}, {kind}, {dtype}) "
                                    f"{key}: {got} where the spec gives {want}")
        count += 1
    if failures:
        sys.exit("\\n".join(failures[:20]))
    print(f"axis_name ok {count} cases, {hlo_checked} programs read, {time.time() - start:.1f} s")
    """
)


def _on_host_devices(script: str, count: int, *args: str) -> subprocess.CompletedProcess:
    """`script` run by a fresh interpreter with `count` forced host devices (the flag must be
    set before jax is imported), this checkout first on its path."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}")
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "profile",
    [
        "default",
        pytest.param(
            "full",
            marks=pytest.mark.on_demand(
                "the default profile judges every option in float64 on the 2-D mesh and reads "
                "its programs; the unsharded backend is judged by test_conformance.py"
            ),
        ),
    ],
)
def test_axis_name_matches_spec_and_unsharded_on_class_and_data_by_class_meshes(profile):
    result = _on_host_devices(SCRIPT, 8, profile)
    assert result.returncode == 0, result.stderr[-4000:]
    assert re.search(r"axis_name ok \d+ cases, \d+ programs read", result.stdout), result.stdout


# the gradients w.r.t. the other differentiable arguments inside shard_map (their tangents are
# autodiff of the forward formula, ``parallel._with_sharded_grad``): each raised "Differentiation
# rule for 'pmax' not implemented" (the row's top over the slices); the rows spanning beyond the
# largest number keep the class vector's gradient finite (torch's process_group= path gave inf)
GRAD_SCRIPT = textwrap.dedent(
    """
    import sys
    from functools import partial
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from dualloss import jax_impl

    N, C = 8, 12
    mesh = Mesh(np.array(jax.devices()[:4]), ("vocab",))
    rng = np.random.default_rng(5)
    x = rng.normal(size=(N, C)) * 3.0
    x[1, 7] += 40.0  # confident and right
    y = rng.integers(0, C, size=N)
    y[1], y[2] = 7, -100
    probs = rng.dirichlet(np.ones(C), size=N)
    weight = rng.uniform(0.2, 1.0, size=C)
    alpha = rng.uniform(0.1, 0.9, size=C)
    # logits spanning beyond float32's largest number: row 0's top on the first slice, its
    # target at -0.9 x the largest number on the last, with a class weight (alpha) of 0.25
    span = np.where(np.isfinite(x), x, 0.0)
    span[0, 0], span[0, C - 1] = 0.9 * 3.4028235e38, -0.9 * 3.4028235e38
    span_y = np.where(y >= 0, y, 3)
    span_y[0] = C - 1
    span_vector = np.full(C, 0.5)
    span_vector[C - 1] = 0.25
    # (loss, logits, targets, the argument differentiated, its value, other options)
    CASES = [
        ("softmax_cross_entropy", x, y, "weight", weight, {}),
        ("softmax_cross_entropy", x, y, "weight", weight, {"label_smoothing": 0.1}),
        ("softmax_focal_loss", x, y, "alpha", alpha, {"gamma": 2.0}),
        ("softmax_cross_entropy", x, probs, "targets", probs, {}),
        ("softmax_focal_loss", x, probs, "targets", probs, {"gamma": 0.5}),
        ("softmax_focal_loss", x, y, "gamma", np.float64(1.5), {}),
        ("softmax_cross_entropy", span, span_y, "weight", span_vector, {}),
        ("softmax_focal_loss", span, span_y, "alpha", span_vector, {"gamma": 2.0}),
    ]
    failures, count = [], 0
    for dtype in ("float64", "float32"):
        eps = float(np.finfo(dtype).eps)
        for loss, logits, targets, name, arg, options in CASES:
            if logits is span and dtype == "float64":
                continue  # nothing overflows in float64
            fn = getattr(jax_impl, loss)
            a = jnp.asarray(logits, dtype)
            t = jnp.asarray(targets, dtype) if name == "targets" else jnp.asarray(targets)
            g = jnp.asarray(arg, dtype)

            def call(z, arg, **sharding):
                if name == "targets":
                    return fn(z, arg, **options, **sharding)
                return fn(z, t, **{name: arg}, **options, **sharding)

            arg_spec = P(None, "vocab") if name == "targets" else P()

            @partial(jax.shard_map, mesh=mesh, in_specs=(P(None, "vocab"), arg_spec),
                     out_specs=P())
            def sharded(z, arg):
                return call(z, arg, axis_name="vocab")

            with jax.set_mesh(mesh):
                placed = (jax.device_put(a, NamedSharding(mesh, P(None, "vocab"))),
                          jax.device_put(g, NamedSharding(mesh, arg_spec)))
                value, grads = jax.jit(jax.value_and_grad(sharded, argnums=(0, 1)))(*placed)
            want, want_grads = jax.jit(jax.value_and_grad(call, argnums=(0, 1)))(a, g)
            label = f"{loss}({name}, {sorted(options)}, {dtype}, span {logits is span})"
            for what, got, ref in (("value", value, want), ("logits' gradient", grads[0],
                                   want_grads[0]), (f"{name}'s gradient", grads[1], want_grads[1])):
                got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
                scale = float(np.max(np.abs(ref), initial=0.0))
                if not (np.all(np.isfinite(got)) and np.all(np.isfinite(ref))):
                    failures.append(f"{label}: {what} not finite: {got} (unsharded {ref})")
                elif np.max(np.abs(got - ref), initial=0.0) > 16 * eps * scale:
                    failures.append(f"{label}: {what} {got} where unsharded gives {ref}")
            count += 1
    # second derivatives: forward mode over the gradient (Hessian-vector products), float64;
    # with a constant shift the top's term was a constant 1, and they were 0.06 off where the
    # entries are 0.09
    v = jnp.asarray(rng.normal(size=(N, C)))
    for loss, targets, options in (("softmax_cross_entropy", y, {}),
                                   ("softmax_focal_loss", y, {"gamma": 2.0}),
                                   ("softmax_cross_entropy", probs, {"label_smoothing": 0.1})):
        fn = getattr(jax_impl, loss)
        t = jnp.asarray(targets)
        t_spec = P(None, "vocab") if t.ndim == 2 else P()

        @partial(jax.shard_map, mesh=mesh, in_specs=(P(None, "vocab"), t_spec), out_specs=P())
        def sharded(z, t):
            return fn(z, t, axis_name="vocab", **options)

        def hvp(f, z, t):
            return jax.jvp(lambda w: jax.grad(f)(w, t), (z,), (v,))[1]

        with jax.set_mesh(mesh):
            placed = (jax.device_put(jnp.asarray(x), NamedSharding(mesh, P(None, "vocab"))),
                      jax.device_put(t, NamedSharding(mesh, t_spec)))
            got = np.asarray(jax.jit(lambda z, t: hvp(sharded, z, t))(*placed))
        unsharded = lambda z, t: fn(z, t, **options)  # noqa: E731
        want = np.asarray(jax.jit(lambda z, t: hvp(unsharded, z, t))(jnp.asarray(x), t))
        scale = float(np.max(np.abs(want)))
        if not np.max(np.abs(got - want)) <= 16 * np.finfo(np.float64).eps * scale:
            failures.append(f"{loss}({sorted(options)}) Hessian-vector product {got} where "
                            f"unsharded gives {want}")
        count += 1
    if failures:
        sys.exit("\\n".join(failures[:20]))
    print(f"axis_name gradients ok {count} cases")
    """
)


def test_gradients_of_class_vectors_targets_gamma_and_second_derivatives_match_unsharded():
    result = _on_host_devices(GRAD_SCRIPT, 4)
    assert result.returncode == 0, result.stderr[-4000:]
    assert re.search(r"axis_name gradients ok 17 cases", result.stdout), result.stdout


@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "softmax_focal_loss"])
def test_axis_name_outside_shard_map_is_refused_with_one_sentence(loss):
    fn = getattr(jax_impl, loss)
    message = (
        r"^`axis_name` must name a mesh axis of the enclosing `jax.shard_map` .*axis_name='vocab'"
    )
    with pytest.raises(ValueError, match=message):
        fn(jnp.zeros((2, 4)), jnp.array([0, 1]), axis_name="vocab")
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda x: fn(x, jnp.array([0, 1]), axis_name="vocab"))(jnp.zeros((2, 4)))


def test_axis_name_not_a_mesh_axis_is_refused_with_one_sentence():
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("classes",))

    def f(x):
        return jax_impl.softmax_cross_entropy(x, jnp.array([0, 1]), axis_name="vocab")

    g = jax.shard_map(f, mesh=mesh, in_specs=P(None, "classes"), out_specs=P())
    with pytest.raises(ValueError, match=r"Received: axis_name='vocab', not bound here\."):
        g(jnp.zeros((2, 4)))
