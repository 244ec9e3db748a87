"""A zoo of loss implementations written the way libraries and users write them, each judged by
``dualloss.parity.check`` (issue 28, item 8); ``python -m examples.zoo --update-docs`` reruns
every check and rewrites the table in docs/zoo.md.

Like ``examples.naive_torch`` / ``examples.naive_jax``, the functions live in an importable module
so that the oracle's reproducers (``from examples.zoo import ...``) run as printed. Each one is a
transcription of its source's formula into the oracle's calling convention (``f(logits,
targets)``, reduced to a mean), not a byte-for-byte copy: the sources named are all under
permissive licences (Apache-2.0, MIT, BSD-3-Clause), and each function's docstring says what
was kept and what was adapted. ``ZOO`` records, for each, the verdict expected from reading the
code (written before the oracle ran) next to the settings it is checked with; the test
(tests/test_zoo.py) asserts that the oracle reaches that verdict for the stated reason.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------


def monai_sigmoid_focal(x, t):
    """MONAI ``monai/losses/focal_loss.py`` (Apache-2.0), ``sigmoid_focal_loss`` with gamma=2,
    alpha=None: the BCE as ``x - x t - logsigmoid(x)`` and the modulating factor in log space,
    ``exp(gamma * logsigmoid(-x (2t - 1)))``; mean. Binary targets only (the factor is not
    torchvision's for soft targets)."""
    import torch.nn.functional as F

    loss = x - x * t - F.logsigmoid(x)
    invprobs = F.logsigmoid(-x * (t * 2 - 1))
    return ((invprobs * 2.0).exp() * loss).mean()


def toolbelt_focal(x, t):
    """pytorch-toolbelt ``pytorch_toolbelt/losses/functional.py`` (MIT),
    ``focal_loss_with_logits`` with gamma=2, alpha=None, not normalized: ``pt = exp(-bce)`` and
    ``(1 - pt) ** gamma * bce``; mean."""
    import torch
    import torch.nn.functional as F

    logpt = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    pt = torch.exp(-logpt)
    return ((1.0 - pt).pow(2.0) * logpt).mean()


def toolbelt_focal_gamma_half(x, t):
    """``toolbelt_focal`` with gamma=0.5 (``focal_loss_with_logits(..., gamma=0.5)``)."""
    import torch
    import torch.nn.functional as F

    logpt = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    pt = torch.exp(-logpt)
    return ((1.0 - pt).pow(0.5) * logpt).mean()


def mmdet_sigmoid_focal(x, t):
    """MMDetection ``mmdet/models/losses/focal_loss.py`` (Apache-2.0), ``py_sigmoid_focal_loss``
    with gamma=2, alpha=0.25: ``pt = (1 - sigmoid) t + sigmoid (1 - t)`` (their ``pt`` is
    1 - p_t), weight ``(alpha t + (1 - alpha)(1 - t)) pt ** gamma`` times BCE; mean."""
    import torch.nn.functional as F

    p = x.sigmoid()
    pt = (1 - p) * t + p * (1 - t)
    focal_weight = (0.25 * t + 0.75 * (1 - t)) * pt.pow(2.0)
    return (F.binary_cross_entropy_with_logits(x, t, reduction="none") * focal_weight).mean()


def tutorial_bce(x, t):
    """The BCE of countless tutorials: ``-(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x)))``."""
    import torch

    p = torch.sigmoid(x)
    return (-(t * torch.log(p) + (1 - t) * torch.log(1 - p))).mean()


def timm_label_smoothing(x, t):
    """timm ``timm/loss/cross_entropy.py`` (Apache-2.0), ``LabelSmoothingCrossEntropy`` with
    smoothing=0.1: ``confidence * nll + smoothing * -mean(log_softmax)``; mean."""
    import torch.nn.functional as F

    logprobs = F.log_softmax(x, dim=-1)
    nll_loss = -logprobs.gather(dim=-1, index=t.unsqueeze(1)).squeeze(1)
    smooth_loss = -logprobs.mean(dim=-1)
    return (0.9 * nll_loss + 0.1 * smooth_loss).mean()


def timm_soft_target(x, t):
    """timm ``timm/loss/cross_entropy.py`` (Apache-2.0), ``SoftTargetCrossEntropy``:
    ``sum(-t * log_softmax(x))`` over classes; mean."""
    import torch
    import torch.nn.functional as F

    return torch.sum(-t * F.log_softmax(x, dim=-1), dim=-1).mean()


def hf_fixed_cross_entropy(x, t):
    """Hugging Face transformers ``transformers/loss/loss_utils.py`` (Apache-2.0),
    ``fixed_cross_entropy``: the summed loss divided by ``num_items_in_batch``, here the batch's
    own count of non-ignored targets (what the trainer passes for one micro-batch)."""
    import torch.nn.functional as F

    num_items_in_batch = (t != -100).sum()
    return F.cross_entropy(x, t, ignore_index=-100, reduction="sum") / num_items_in_batch


def micro_batch_mean(x, t):
    """The gradient-accumulation mean that transformers fixed in 2024 (huggingface/transformers
    #34191): each of two micro-batches takes its own ``F.cross_entropy`` mean and the means are
    averaged, so a micro-batch with fewer kept targets weighs more (and an all-ignored one is
    0 / 0)."""
    import torch.nn.functional as F

    half = max(x.shape[0] // 2, 1)
    parts = [(x[:half], t[:half]), (x[half:], t[half:])]
    means = [F.cross_entropy(a, b) for a, b in parts if a.shape[0]]
    return sum(means) / len(means)


def bf16_logsumexp_ce(x, t):
    """A hand-written cross entropy as the core of a hand-written z-loss (t5x/PaLM style,
    ``lse - z_y + z_loss * lse ** 2``) with z_loss = 0 (the spec has no z_loss yet), computed
    in the input dtype: ``logsumexp(x) - x[y]``; mean."""
    import torch

    lse = torch.logsumexp(x, dim=1)
    return (lse - x.gather(1, t[:, None])[:, 0]).mean()


class _InPlaceCrossEntropy:
    """Liger-Kernel style (``liger_kernel/ops/cross_entropy.py``, BSD-2-Clause): the forward
    computes the loss and stores the gradient in the logits' own memory, which backward then
    hands out (saves one (N, C) buffer)."""

    @staticmethod
    def apply(x, t):
        import torch

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, logits, targets):
                log_p = torch.log_softmax(logits, dim=1)
                loss = -log_p.gather(1, targets[:, None])[:, 0].mean()
                grad = log_p.exp()
                grad[torch.arange(len(targets)), targets] -= 1.0
                logits.copy_(grad / len(targets))  # the gradient, in the logits' memory
                ctx.save_for_backward(logits)
                return loss

            @staticmethod
            def backward(ctx, grad_output):
                (grad,) = ctx.saved_tensors
                return grad * grad_output, None

        return Fn.apply(x, t)


def liger_style_in_place(x, t):
    """See ``_InPlaceCrossEntropy``: cross entropy whose forward writes its gradient into x."""
    return _InPlaceCrossEntropy.apply(x, t)


def half_logits_linear_ce(h, w, t):
    """The fused-head loss most code writes: ``F.cross_entropy(F.linear(h, w), t)``, with the
    logits formed in the input dtype (float16 here: past 65504 they are inf)."""
    import torch.nn.functional as F

    return F.cross_entropy(F.linear(h, w), t)


# ----------------------------------------------------------------------------------------------
# JAX
# ----------------------------------------------------------------------------------------------


def flax_one_hot_ce(logits, labels):
    """flax ``examples/imagenet/train.py`` (Apache-2.0), ``cross_entropy_loss``:
    ``one_hot(labels) * log_softmax(logits)`` summed over classes; mean."""
    import jax
    import jax.numpy as jnp

    one_hot = jax.nn.one_hot(labels, logits.shape[-1])
    return jnp.mean(-jnp.sum(one_hot * jax.nn.log_softmax(logits), axis=-1))


def jnp_where_focal(logits, labels):
    """A focal loss that guards ``log(p)`` with one ``jnp.where`` (the JAX FAQ's "gradients
    contain NaN where using where" trap): ``where(p > 0, log(p), -100)``, gamma = 2; mean."""
    import jax
    import jax.numpy as jnp

    p = jax.nn.softmax(logits)
    p_t = jnp.take_along_axis(p, labels[:, None], axis=-1)[:, 0]
    log_p_t = jnp.where(p_t > 0, jnp.log(p_t), -100.0)
    return jnp.mean(-((1 - p_t) ** 2) * log_p_t)


def optax_style_focal_gamma_half(logits, labels):
    """A softmax focal loss as an optax user writes it (``optax.losses`` has only the sigmoid
    one): ``log_softmax`` then ``(1 - exp(log_p)) ** gamma`` with gamma = 0.5; mean."""
    import jax
    import jax.numpy as jnp

    log_p = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)[:, 0]
    return jnp.mean(-((1 - jnp.exp(log_p)) ** 0.5) * log_p)


def keras_categorical_focal(logits, labels):
    """Keras 3 ``keras.losses.categorical_focal_crossentropy`` (Apache-2.0) called for real,
    ``from_logits=True``, gamma=2, alpha=1 (alpha 0.25 by default; 1 here to match the spec's
    unweighted loss), on one-hot labels; mean."""
    import jax
    import jax.numpy as jnp
    import keras

    one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    loss = keras.losses.categorical_focal_crossentropy(one_hot, logits, alpha=1.0, gamma=2.0,
                                                       from_logits=True)  # fmt: skip
    return jnp.mean(loss)


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One zoo member: how it is checked and the verdict read from its code beforehand.

    expected: 'pass' or the hazard kind expected ('non-finite', 'accuracy', 'writes input',
      'NaN loss on an all-ignored batch'); region: the region expected to show it (None for a
      pass); why: the reason, from reading the code.
    """

    name: str
    source: str
    backend: str
    reference: str
    dtypes: tuple[str, ...]
    expected: str
    region: str | None
    why: str
    kwargs: dict = field(default_factory=dict)

    @property
    def function(self):
        return globals()[self.name]


ZOO: tuple[Entry, ...] = (
    Entry("monai_sigmoid_focal", "MONAI FocalLoss (sigmoid)", "torch", "sigmoid_focal_loss",
          ("float32", "float64"), "pass", None,
          "log-space BCE and log-space modulating factor", {"binary_targets": True}),
    Entry("toolbelt_focal", "pytorch-toolbelt focal_loss_with_logits", "torch",
          "sigmoid_focal_loss", ("float32",), "accuracy", "confident_correct",
          "1 - exp(-bce) rounds to 0 when bce < u: loss 0 where it is ~bce^3",
          {"binary_targets": True}),
    Entry("toolbelt_focal_gamma_half", "pytorch-toolbelt focal_loss_with_logits, gamma=0.5",
          "torch", "sigmoid_focal_loss", ("float32",), "non-finite", "confident_correct",
          "d/dq q**0.5 at q = 1 - pt = 0 is inf", {"binary_targets": True,
                                                  "options": {"gamma": 0.5}}),
    Entry("mmdet_sigmoid_focal", "MMDetection py_sigmoid_focal_loss", "torch",
          "sigmoid_focal_loss", ("float32",), "accuracy", "confident_correct",
          "1 - sigmoid(x) rounds to 0 at x > 17: loss 0 where it is ~e^-3x",
          {"binary_targets": True, "options": {"alpha": 0.25}}),
    Entry("tutorial_bce", "tutorial BCE (log of sigmoid)", "torch", "sigmoid_cross_entropy",
          ("float32",), "non-finite", "huge_shift", "log(1 - sigmoid(x)) = log 0 at x > 17",
          {"binary_targets": True}),
    Entry("timm_label_smoothing", "timm LabelSmoothingCrossEntropy", "torch",
          "softmax_cross_entropy", ("float32", "float64"), "pass", None,
          "log_softmax throughout; smoothing over a -inf class is infinite in the spec too",
          {"options": {"label_smoothing": 0.1}, "skip": ("ignored",)}),
    Entry("timm_soft_target", "timm SoftTargetCrossEntropy", "torch", "softmax_cross_entropy",
          ("float32",), "non-finite", "masked", "0 * log_softmax = 0 * -inf at a masked class"),
    Entry("hf_fixed_cross_entropy", "transformers fixed_cross_entropy", "torch",
          "softmax_cross_entropy", ("float32",), "non-finite", "all_ignored",
          "an all-ignored micro-batch: sum / 0 = 0 / 0, gradient 0 / 0"),
    Entry("micro_batch_mean", "per-micro-batch mean, averaged (transformers #34191)", "torch",
          "softmax_cross_entropy", ("float32",), "accuracy", "ignored",
          "a mean of means weighs micro-batches by their kept counts' inverses"),
    Entry("bf16_logsumexp_ce", "hand-written lse - z_y (z-loss core) in bfloat16", "torch",
          "softmax_cross_entropy", ("bfloat16",), "pass", None,
          "lse - z_y in bfloat16 is backward stable: the practical standard allows it",
          {"skip": ("ignored",)}),
    Entry("liger_style_in_place", "Liger-Kernel style in-place gradient", "torch",
          "softmax_cross_entropy", ("float32",), "writes input", "typical",
          "the forward stores the gradient in the logits' memory", {"skip": ("ignored",)}),
    Entry("half_logits_linear_ce", "F.cross_entropy(F.linear(h, w)) in float16", "torch",
          "linear_softmax_cross_entropy", ("float16",), "non-finite", "half_overflow",
          "logits formed in float16 overflow past 65504", {"skip": ("all_ignored_nan",)}),
    Entry("flax_one_hot_ce", "flax imagenet example cross_entropy_loss", "jax",
          "softmax_cross_entropy", ("float32",), "non-finite", "masked",
          "one_hot * log_softmax is 0 * -inf at a masked class", {"skip": ("ignored",)}),
    Entry("jnp_where_focal", "jnp.where-guarded log(p) focal", "jax", "softmax_focal_loss",
          ("float32",), "non-finite", "confident_wrong",
          "the where's unselected log(0) branch has an inf gradient: 0 * inf",
          {"skip": ("ignored",)}),
    Entry("optax_style_focal_gamma_half", "log_softmax focal, gamma=0.5 (optax user)", "jax",
          "softmax_focal_loss", ("float32",), "non-finite", "confident_correct",
          "d/dq q**0.5 at q = 1 - p = 0 is inf", {"options": {"gamma": 0.5}, "skip": ("ignored",)}),
    Entry("keras_categorical_focal", "keras.losses.categorical_focal_crossentropy", "jax",
          "softmax_focal_loss", ("float32",), "accuracy", "confident_wrong",
          "softmax clipped to [1e-7, 1 - 1e-7]: the loss stops at -log(1e-7)",
          {"skip": ("ignored",)}),
)  # fmt: skip


def run_entry(entry: Entry, max_examples: int = 10):
    """``parity.check`` of one entry, as the table and the test run it."""
    from dualloss.parity import check

    kwargs = dict(entry.kwargs)
    return check(entry.function, entry.reference, backend=entry.backend,
                 dtypes=list(entry.dtypes), max_examples=max_examples, **kwargs)  # fmt: skip


def verdict(report) -> tuple[str, str, str, str]:
    """(verdict, the first hazard's kind, its region, its reproducer) of a report."""
    if report.ok:
        return "pass", "", "", ""
    first = report.hazards[0]
    return "fail", first.failure.kind, first.region, first.failure.reproducer


def agrees(entry: Entry, report) -> bool:
    """Whether the oracle reached the entry's expected verdict for the stated reason: a pass, or
    a hazard of the expected kind in the expected region."""
    if entry.expected == "pass":
        return report.ok
    return any(h.failure.kind == entry.expected and h.region == entry.region
               for h in report.hazards)  # fmt: skip


def table(max_examples: int = 10) -> tuple[str, int, float]:
    """docs/zoo.md's table from fresh runs: (markdown, agreements, seconds)."""
    started = time.monotonic()
    rows = [
        "| implementation | where it comes from | expected (read from the code) | oracle verdict "
        "| hazard found (kind, region) | smallest reproducer |",
        "|---|---|---|---|---|---|",
    ]
    agreed = 0
    for entry in ZOO:
        report = run_entry(entry, max_examples)
        said, kind, region, repro = verdict(report)
        ok = agrees(entry, report)
        agreed += ok
        expected = "pass" if entry.expected == "pass" else f"{entry.expected} in {entry.region}"
        hazards = "; ".join(f"{h.failure.kind} ({h.region})" for h in report.hazards) or "none"
        rows.append(
            f"| `examples.zoo.{entry.name}` ({entry.backend}, {'/'.join(entry.dtypes)}) "
            f"| {entry.source} | {expected}: {entry.why} | {said}{'' if ok else ' (disagrees)'} "
            f"| {hazards} | {'`' + repro + '`' if repro else ''} |"
        )
    return "\n".join(rows), agreed, time.monotonic() - started


BEGIN, END = "<!-- zoo table: begin -->", "<!-- zoo table: end -->"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update-docs", action="store_true", help="rewrite docs/zoo.md's table")
    parser.add_argument("--max-examples", type=int, default=10)
    args = parser.parse_args(argv)
    text, agreed, seconds = table(args.max_examples)
    summary = (f"The oracle agrees with {agreed} of {len(ZOO)} verdicts read from the code "
               f"({seconds:.0f} s on this machine, max_examples={args.max_examples}).")  # fmt: skip
    print(text)
    print(summary)
    if args.update_docs:
        path = Path(__file__).resolve().parent.parent / "docs" / "zoo.md"
        doc = path.read_text()
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        path.write_text(f"{head}{BEGIN}\n{text}\n\n{summary}\n{END}{tail}")


if __name__ == "__main__":
    main()
