"""Every claim docs/nan-hazards.md makes about another project, as the one line that shows it.

Each reproducer is a Python expression that is true while the claim holds; the page quotes it
verbatim next to the claim (``test_every_reproducer_is_quoted_in_the_page``). When a peer changes
and a reproducer turns false, correct the page to what reproduces now, then the line here.

Names the lines use: ``F`` = ``torch.nn.functional``, ``inf`` = ``math.inf``, ``tvf`` =
torchvision's ``sigmoid_focal_loss`` formula (``dualloss.parity.peers.torchvision_sigmoid_focal``,
torchvision cannot be installed next to this torch build), ``check`` = ``dualloss.parity.check``,
``kornia_focal`` = ``dualloss.parity.peers.kornia_focal`` (kornia's map summed over the classes),
``ALL`` = the four dtype names, ``spec`` / ``jax_impl`` = ``dualloss.spec`` / ``dualloss.jax_impl``.
JAX runs with float64 enabled, so the JAX lines that depend on a dtype name it.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                    "nan-hazards.md")  # fmt: skip

# (id, peers the line imports, reproducer)
CLAIMS = [
    # torch.nn.functional.cross_entropy
    ("torch-ce-all-ignored-mean-is-nan", ("torch",),
     "F.cross_entropy(torch.zeros(1, 4), torch.tensor([-100])).isnan()"),
    ("torch-ce-prob-targets-under-inf-logits-nan-every-dtype", ("torch",),
     "all(F.cross_entropy(torch.tensor([[-inf, 1.]], dtype=d), torch.tensor([[0., 1.]], dtype=d))"
     ".isnan() for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64))"),
    ("torch-ce-index-targets-under-inf-logits-fine", ("torch",),
     "F.cross_entropy(torch.tensor([[-inf, 1.]]), torch.tensor([1])) == 0"),
    ("torch-ce-otherwise-passes", ("torch",),
     'check(F.cross_entropy, "softmax_cross_entropy", backend="torch", dtypes=ALL, '
     'max_examples=0, skip=("masked", "masked_soft", "wide_span", "all_ignored_nan")).ok'),
    ("torch-ce-prob-targets-spanning-the-range-inf", ("torch",),
     "F.cross_entropy(torch.tensor([[3e38, -3e38, 0.]]), torch.tensor([[0.5, 0.25, 0.25]]))"
     ".isinf()"),
    ("torch-ce-smoothing-overflows-float32", ("torch",),
     "F.cross_entropy(torch.tensor([[0.] + 4 * [-1.7e38]]), torch.tensor([0]), "
     "label_smoothing=0.1).isinf()"),
    ("torch-ce-smoothing-float64-exact", ("torch",),
     "math.isclose(F.cross_entropy(torch.tensor([[0.] + 4 * [-1.7e38]], dtype=torch.float64), "
     "torch.tensor([0]), label_smoothing=0.1).item(), 1.36e37, rel_tol=1e-12)"),
    ("torch-ce-smoothing-overflows-half", ("torch",),
     "F.cross_entropy(torch.tensor([[0.] + 4 * [-1.7e38]], dtype=torch.bfloat16), "
     "torch.tensor([0]), label_smoothing=0.1).isinf() and F.cross_entropy(torch.tensor([[0.] + "
     "4 * [-6e4]], dtype=torch.float16), torch.tensor([0]), label_smoothing=0.1).isinf()"),
    ("torch-ce-smoothing-over-inf-logits-is-inf", ("torch",),
     "F.cross_entropy(torch.tensor([[0., -inf]]), torch.tensor([0]), label_smoothing=0.1)"
     ".isinf()"),
    ("torch-ce-no-absorption-at-800", ("torch",),
     "abs(F.cross_entropy(torch.tensor([[800., 800.]]), torch.tensor([0])).item() - math.log(2))"
     " < 1e-7"),
    ("torch-ce-log-softmax-finite-gradient", ("torch",),
     "torch.func.grad(lambda x: F.cross_entropy(x, torch.tensor([0])))(torch.tensor([[0., "
     "-200.8, -200.3, -200., -200.3]])).isfinite().all()"),
    # torch.nn.functional.binary_cross_entropy_with_logits
    ("torch-bce-passes", ("torch",),
     'check(F.binary_cross_entropy_with_logits, "sigmoid_cross_entropy", backend="torch", '
     "dtypes=ALL, max_examples=0).ok"),
    # torch.where and jnp.where
    ("torch-where-log-gradient-nan", ("torch",),
     "torch.func.grad(lambda x: torch.where(x > 0, torch.log(x), 0.))(torch.tensor(0.)).isnan()"),
    ("jax-where-log-gradient-nan", ("jax",),
     "jnp.isnan(jax.grad(lambda x: jnp.where(x > 0, jnp.log(x), 0.))(0.))"),
    ("jax-pow-zero-gradient-nan", ("jax",), "jnp.isnan(jax.grad(lambda x: x ** 0.)(0.))"),
    # optax
    ("optax-integer-ce-absorbs-at-800", ("optax",),
     "round(float(optax.softmax_cross_entropy_with_integer_labels(jnp.array([[800., 800.]], "
     "jnp.float32), jnp.array([0]))[0]), 6) == 0.693176"),
    ("optax-integer-ce-zero-at-huge-shift", ("optax",),
     "optax.softmax_cross_entropy_with_integer_labels(jnp.full((1, 5), 1.7e38, jnp.float32), "
     "jnp.array([0]))[0] == 0"),
    ("optax-integer-ce-index-targets-under-inf-logits-fine", ("optax",),
     "optax.softmax_cross_entropy_with_integer_labels(jnp.array([[-inf, 1.]]), jnp.array([1]))[0]"
     " == 0"),
    ("optax-integer-ce-log-softmax-finite-gradient", ("optax",),
     "jnp.isfinite(jax.grad(lambda x: optax.softmax_cross_entropy_with_integer_labels(x, "
     "jnp.array([0])).sum())(jnp.array([[0., -200.8, -200.3, -200., -200.3]], jnp.float32)))"
     ".all()"),
    ("optax-prob-ce-under-inf-logits-nan-every-dtype", ("optax",),
     "all(jnp.isnan(optax.softmax_cross_entropy(jnp.array([[-inf, 1.]], d), jnp.array([[0., 1.]],"
     " d))).all() for d in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64))"),
    ("optax-sigmoid-bce-passes", ("optax",),
     "check(lambda x, t: optax.sigmoid_binary_cross_entropy(x, t).mean(), "
     '"sigmoid_cross_entropy", backend="jax", dtypes=ALL, max_examples=0).ok'),
    ("optax-sigmoid-focal-passes-float32-float64", ("optax",),
     "all(p.startswith('gradient w.r.t. targets') for h in check(lambda x, t: "
     "optax.sigmoid_focal_loss(x, t, gamma=0.25).mean(), "
     '"sigmoid_focal_loss", backend="jax", options={"gamma": 0.25}, '
     'dtypes=("float32", "float64"), max_examples=0).hazards for p in h.failure.problems)'),
    ("jax-logsumexp-b-zero-drops-the-derivative", ("jax",),
     "float(jax.grad(lambda b: jax.nn.logsumexp(jnp.zeros(2), "
     "b=jnp.stack([b, 1.])))(0.)) == 0.0"),
    ("optax-sigmoid-focal-half-overflow-only-alpha-off", ("optax",),
     "[bool(jnp.isnan(jax.grad(lambda x: optax.sigmoid_focal_loss(x, d(0.), alpha=a))(d(m)))) "
     "for d, m, a in ((jnp.float16, 32992., None), (jnp.float16, 32992., .25), "
     "(jnp.bfloat16, 32992., None), (jnp.bfloat16, 1.7e38, None))] == [True, False, False, True]"),
    # kornia.losses.focal_loss
    ("kornia-focal-half-overflow-only-alpha-off", ("torch", "kornia"),
     "[bool(torch.func.grad(lambda x: kornia.losses.focal_loss(x, torch.tensor([0]), alpha=a, "
     "reduction='sum'))(torch.tensor([[0., m]], dtype=d)).isnan().any()) for d, m, a in "
     "((torch.float16, 32992., None), (torch.float16, 32992., .25), (torch.bfloat16, 32992., "
     "None), (torch.bfloat16, 1.7e38, None))] == [True, False, False, True]"),
    ("kornia-focal-passes-float32-float64", ("torch", "kornia"),
     'check(kornia_focal, "softmax_focal_loss", backend="torch", dtypes=("float32", "float64"), '
     "max_examples=0).ok"),
    ("kornia-focal-loses-tiny-gradients", ("torch", "kornia"),
     "(torch.func.grad(lambda x: kornia.losses.focal_loss(x, torch.tensor([0]), alpha=None, "
     "reduction='sum'))(torch.tensor([[20., 0., 0.]])) == 0).all() and "
     "(spec.softmax_focal_loss_grad(np.array([[20., 0., 0.]]), np.array([0])) != 0).all()"),
    ("kornia-focal-log-softmax-finite-gradient", ("torch", "kornia"),
     "torch.func.grad(lambda x: kornia.losses.focal_loss(x, torch.tensor([0]), alpha=None, "
     "reduction='sum'))(torch.tensor([[0., -200.8, -200.3, -200., -200.3]])).isfinite().all()"),
    ("kornia-focal-all-ignored-mean-is-zero", ("torch", "kornia"),
     "kornia.losses.focal_loss(torch.zeros(1, 4), torch.tensor([-100]), alpha=None, "
     "reduction='mean') == 0"),
    # torchvision.ops.sigmoid_focal_loss, its formula
    ("torchvision-focal-small-gamma-nan-every-dtype", ("torch",),
     "all(torch.func.grad(lambda x: tvf(x, torch.zeros(1, dtype=d), gamma=g))(torch.tensor([-40.],"
     " dtype=d)).isnan() for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64) "
     "for g in (0.25, 0.5))"),
    ("torchvision-focal-half-overflow-only-alpha-off", ("torch",),
     "[bool(torch.func.grad(lambda x: tvf(x, torch.zeros((), dtype=d), alpha=a))(torch.tensor(m,"
     " dtype=d)).isnan()) for d, m, a in ((torch.float16, 32992., None), (torch.float16, 32992., "
     ".25), (torch.bfloat16, 32992., None), (torch.bfloat16, 1.7e38, None))] == "
     "[True, False, False, True]"),
    # dualloss itself (the page's note on jax_impl)
    ("jax-impl-sigmoid-focal-bfloat16-finite-at-the-range", ("jax",),
     "jnp.isfinite(jax.grad(lambda x: jax_impl.sigmoid_focal_loss(x, jnp.ones((1, 1), "
     "jnp.bfloat16)))(jnp.full((1, 1), -1.7e38, jnp.bfloat16))).all()"),
]  # fmt: skip


def _namespace(modules):
    names = {"math": math, "np": np, "inf": math.inf}
    names["ALL"] = ("float32", "float64", "float16", "bfloat16")
    from dualloss import spec
    from dualloss.parity import check

    names.update(spec=spec, check=check)
    if "torch" in modules:
        torch = pytest.importorskip("torch")
        from dualloss.parity.peers import kornia_focal, torchvision_sigmoid_focal

        names.update(torch=torch, F=torch.nn.functional, tvf=torchvision_sigmoid_focal)
        names.update(kornia_focal=kornia_focal)
    if "jax" in modules or "optax" in modules:
        jax = pytest.importorskip("jax")
        from dualloss import jax_impl

        names.update(jax=jax, jnp=jax.numpy, jax_impl=jax_impl)
    for name in ("optax", "kornia"):
        if name in modules:
            names[name] = pytest.importorskip(name)
    return names


# the oracle over every region in JAX's eager mode: about a minute each; the default profile
# leaves them to --full, as tests/test_parity_known_bugs.py runs the oracle on the same optax
# losses (test_optax_sigmoid_binary_cross_entropy_passes, ..._focal_loss_passes_in_float32)
SLOW = {"optax-sigmoid-bce-passes", "optax-sigmoid-focal-passes-float32-float64"}
ON_DEMAND = pytest.mark.on_demand("test_parity_known_bugs.py checks optax in float32")


@pytest.mark.parametrize(
    ("modules", "reproducer"),
    [
        pytest.param(*c[1:], id=c[0], marks=[pytest.mark.slow, ON_DEMAND] if c[0] in SLOW else [])
        for c in CLAIMS
    ],
)
def test_claim_reproduces(modules, reproducer):
    names = _namespace(modules)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peers warn about float16 on CPU and the like
        if "jax" in names:
            with names["jax"].enable_x64(True):
                holds = eval(reproducer, names)  # noqa: S307 - our own reproducer lines
        else:
            holds = eval(reproducer, names)  # noqa: S307
    assert bool(holds), f"docs/nan-hazards.md claims `{reproducer}`, now false: correct the page"


@pytest.mark.parametrize("reproducer", [c[2] for c in CLAIMS], ids=[c[0] for c in CLAIMS])
def test_every_reproducer_is_quoted_in_the_page(reproducer):
    with open(PAGE, encoding="utf-8") as page:
        assert f"`{reproducer}`" in page.read()
