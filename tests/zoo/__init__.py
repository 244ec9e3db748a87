"""The zoo (issue 28, item 8): loss code from libraries that are not dualloss's peers, each with
the verdict read from its code before the oracle ran (docs/zoo.md).

Each candidate below calls the vendored library code (``vendored/``, with its licence header and
source) the way that library's users call it, adapted only to the oracle's calling convention
``f(logits, targets) -> loss`` in the backend's layout; the adaptation is named in the docstring.
``ZOO`` records, for each, how ``parity.check`` is called and the verdict expected from reading
the code and from the probes in ``probes.py`` (the library code and mpmath at the suspect input).
tests/test_zoo.py asserts the probes' claims and that the oracle reaches every verdict for the
stated reason. Nothing in the installed package imports this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------


def monai_sigmoid_focal(x, t):
    """MONAI ``sigmoid_focal_loss`` (gamma=2, alpha=None), reduced as ``FocalLoss(reduction=
    'mean')`` reduces it: the mean over every element."""
    from zoo.vendored.monai_focal_loss import sigmoid_focal_loss

    return sigmoid_focal_loss(x, t, gamma=2.0).mean()


def monai_softmax_focal(x, t):
    """MONAI ``softmax_focal_loss`` (gamma=2) on ``one_hot(t)`` as ``FocalLoss(use_softmax=True,
    to_onehot_y=True)`` calls it; reduced over the class axis, then the mean over the rows and
    positions (MONAI's own 'mean' also divides by the number of classes)."""
    from zoo.vendored.monai_focal_loss import one_hot, softmax_focal_loss

    return softmax_focal_loss(x, one_hot(t.unsqueeze(1), x.shape[1]), gamma=2.0).sum(1).mean()


def toolbelt_focal(x, t):
    """pytorch-toolbelt ``focal_loss_with_logits`` with its defaults (gamma=2, alpha=0.25,
    reduction='mean')."""
    from zoo.vendored.toolbelt_functional import focal_loss_with_logits

    return focal_loss_with_logits(x, t)


def toolbelt_softmax_focal(x, t):
    """pytorch-toolbelt ``softmax_focal_loss_with_logits`` with its defaults (gamma=2,
    ignore_index=-100, reduction='mean')."""
    from zoo.vendored.toolbelt_functional import softmax_focal_loss_with_logits

    return softmax_focal_loss_with_logits(x, t)


def toolbelt_label_smoothed_nll(x, t):
    """pytorch-toolbelt ``label_smoothed_nll_loss`` on ``log_softmax(x)``, epsilon=0.1,
    ignore_index=-100, reduction='mean', over the class axis (dim=1) as its
    ``SoftCrossEntropyLoss`` calls it."""
    import torch.nn.functional as F

    from zoo.vendored.toolbelt_functional import label_smoothed_nll_loss

    return label_smoothed_nll_loss(
        F.log_softmax(x, dim=1), t, epsilon=0.1, ignore_index=-100, reduction="mean", dim=1
    )


def mmdet_sigmoid_focal(x, t):
    """MMDetection ``py_sigmoid_focal_loss`` with its defaults (gamma=2, alpha=0.25, 'mean')."""
    from zoo.vendored.mmdet_focal_loss import py_sigmoid_focal_loss

    return py_sigmoid_focal_loss(x, t)


def timm_label_smoothing(x, t):
    """timm ``LabelSmoothingCrossEntropy(smoothing=0.1)``."""
    from zoo.vendored.timm_cross_entropy import LabelSmoothingCrossEntropy

    return LabelSmoothingCrossEntropy(smoothing=0.1)(x, t)


def timm_soft_target(x, t):
    """timm ``SoftTargetCrossEntropy()`` (the loss its mixup/cutmix training uses)."""
    from zoo.vendored.timm_cross_entropy import SoftTargetCrossEntropy

    return SoftTargetCrossEntropy()(x, t)


def hf_masked_lm(x, t):
    """transformers ``ForMaskedLMLoss`` with ``num_items_in_batch`` counted as the Trainer counts
    it for one batch, the labels that are not -100 (so the loss is the mean over kept tokens)."""
    from zoo.vendored.transformers_loss_utils import ForMaskedLMLoss

    return ForMaskedLMLoss(x, t, vocab_size=x.shape[1], num_items_in_batch=(t != -100).sum())


def torchtune_chunked_ce(x, t):
    """torchtune ``CEWithChunkedOutputLoss(num_output_chunks=8)``: the rows as one sequence of
    tokens, (1, N, C), its logits split into 8 chunks along the tokens as the model's output
    layer hands them over (``tensor_split(8, dim=1)``)."""
    from zoo.vendored.torchtune_ce_chunked_output_loss import CEWithChunkedOutputLoss

    loss_fn = CEWithChunkedOutputLoss(num_output_chunks=8)
    chunks = list(x.unsqueeze(0).tensor_split(loss_fn.num_output_chunks, dim=1))
    return loss_fn(chunks, t.unsqueeze(0))


# ----------------------------------------------------------------------------------------------
# JAX
# ----------------------------------------------------------------------------------------------


def t5x_weighted_ce(logits, targets):
    """t5x ``compute_weighted_cross_entropy`` (custom-VJP ``cross_entropy_with_logits``; no
    weights, label_smoothing=0, z_loss=0), its summed loss over its ``weight_sum`` (every
    position), as t5x's ``loss_normalizing_factor='NUM_TOTAL_TARGET_TOKENS'`` divides it."""
    from zoo.vendored.t5x_losses import compute_weighted_cross_entropy

    loss, _, weight_sum = compute_weighted_cross_entropy(logits, targets)
    return loss / weight_sum


def flax_wmt_weighted_ce(logits, targets):
    """flax ``examples/wmt`` ``compute_weighted_cross_entropy`` (no weights, label_smoothing=0),
    its summed loss over its normalizing factor, as its ``train_step`` divides it."""
    from zoo.vendored.flax_wmt_train import compute_weighted_cross_entropy

    loss, normalizing_factor = compute_weighted_cross_entropy(logits, targets)
    return loss / normalizing_factor


def big_vision_softmax_xent(logits, labels):
    """big_vision ``softmax_xent`` (reduction=True: the mean over rows); labels are
    probabilities (one-hot or mixed), as big_vision's input pipelines make them."""
    from zoo.vendored.big_vision_utils import softmax_xent

    return softmax_xent(logits=logits, labels=labels)


def big_vision_sigmoid_xent(logits, labels):
    """big_vision ``sigmoid_xent(reduction=False)`` summed: its per-row sums added up, judged as
    reduction='sum' (its own reduction=True is the mean over rows of the sum over classes, which
    no elementwise mean equals)."""
    from zoo.vendored.big_vision_utils import sigmoid_xent

    return sigmoid_xent(logits=logits, labels=labels, reduction=False).sum()


# ----------------------------------------------------------------------------------------------
# The records
# ----------------------------------------------------------------------------------------------

NONFINITE, SCALE, ALL_IGNORED_NAN, ACCURACY = (
    "non-finite",
    "wrong at the result's scale",
    "NaN loss on an all-ignored batch",
    "accuracy",
)


@dataclass(frozen=True)
class Entry:
    """One zoo member: how ``parity.check`` is called on it and the verdict read beforehand.

    expected: 'pass', or the consequence (``findings.CONSEQUENCE``) of the report's first
      problem; region: a region where a problem of that consequence must be found (None for a
      pass); why: the reason, from reading the code (its probe in probes.py); also: further
      problems the reading predicts, not asserted. oracle, after: see below.
    """

    name: str
    library: str
    source: str
    licence: str
    backend: str
    reference: str
    dtypes: tuple[str, ...]
    expected: str
    region: str | None
    why: str
    also: str = ""
    kwargs: dict = field(default_factory=dict)
    # written after the oracle ran (docs/zoo.md): where it disagrees, the oracle's first problem
    # (consequence, region), which the test asserts instead, and why (probes.AFTER checks it)
    oracle: tuple[str, str] | None = None
    after: str = ""

    @property
    def function(self):
        return globals()[self.name]


_GH = "https://github.com/"
ZOO: tuple[Entry, ...] = (
    Entry(
        "monai_sigmoid_focal", "MONAI", _GH + "Project-MONAI/MONAI/blob/00bb641/monai/losses/"
        "focal_loss.py", "Apache-2.0", "torch", "sigmoid_focal_loss", ("float32",), SCALE,
        "soft_targets",
        "for soft targets its modulating factor is sigmoid(-x (2t - 1))^gamma, not the "
        "(1 - p_t)^gamma of the spec (and torchvision, optax): at x = 1, t = 0.25 the loss is "
        "2.3% off. Binary targets pass: the BCE x - x t - logsigmoid(x) cancels to 0 at t = 0, "
        "x <= -17 in float32, an error of ~e^{3x} that is within u times the focal scale",
        "binary targets: pass",
        {"options": {"gamma": 2.0}},
        after="the oracle also finds binary targets wrong at the result's scale (confident "
        "regions, typical, x = 1, t = 0): in the gradient w.r.t. the targets, which the "
        "reading did not consider; MONAI's factor agrees with (1 - p_t)^gamma at t in {0, 1} "
        "but not its derivative in t. With binary_targets=True (targets not differentiated) "
        "it passes",
    ),
    Entry(
        "monai_softmax_focal", "MONAI", _GH + "Project-MONAI/MONAI/blob/00bb641/monai/losses/"
        "focal_loss.py", "Apache-2.0", "torch", "softmax_focal_loss", ("float32",), NONFINITE,
        "masked",
        "-(1 - exp(ls))^2 * ls * one_hot over every class: at a masked class ls = -inf and the "
        "one-hot is 0, so 0 * inf = NaN in the value and its gradient",
        "ignored labels and probability targets unsupported (one_hot scatters -100 and float "
        "labels raise)",
        {"options": {"gamma": 2.0}},
    ),
    Entry(
        "toolbelt_focal", "pytorch-toolbelt", _GH + "BloodAxe/pytorch-toolbelt/blob/0fc0ca9/"
        "pytorch_toolbelt/losses/functional.py", "MIT", "torch", "sigmoid_focal_loss",
        ("float32", "float64"), NONFINITE, "confident_wrong",
        "output.float() computes float64 input in float32: logits beyond 3.4e38 become +-inf "
        "and BCE-with-logits of -inf is NaN: at t = 1, x = -1e307 NaN where the loss is "
        "2.5e306. float32 passes: the torchvision formula, 1 - p_t rounded to 0 at "
        "margin >= 17 is the textbook rounding the standard allows for gamma >= 1",
        "float64: accuracy at ~1e-7 relative everywhere (float32 arithmetic); float32: pass",
        {"options": {"gamma": 2.0, "alpha": 0.25}},
    ),
    Entry(
        "toolbelt_softmax_focal", "pytorch-toolbelt", _GH + "BloodAxe/pytorch-toolbelt/blob/"
        "0fc0ca9/pytorch_toolbelt/losses/functional.py", "MIT", "torch", "softmax_focal_loss",
        ("float32",), SCALE, "typical",
        "not the softmax focal loss: sum over classes of pt_c^gamma * BCE-with-logits(x_c, "
        "onehot_c), a per-class sigmoid loss weighted by softmax probabilities; at x = (1, 0, "
        "-1), y = 0 it gives 0.0792 where -(1 - p_y)^2 log p_y = 0.0457",
        "",
        {"options": {"gamma": 2.0}},
        oracle=(NONFINITE, "masked"),
        after="disagrees: the reading looked at the formula and missed that the per-class "
        "BCE-with-logits also runs over masked classes, where x t = -inf * 0 = NaN (a row with "
        "one finite class: NaN value and NaN gradient). The oracle is right: non-finite ranks "
        "first; the wrong formula is found too, wrong at the result's scale in typical and 8 "
        "other regions",
    ),
    Entry(
        "toolbelt_label_smoothed_nll", "pytorch-toolbelt", _GH + "BloodAxe/pytorch-toolbelt/blob/"
        "0fc0ca9/pytorch_toolbelt/losses/functional.py", "MIT", "torch",
        "softmax_cross_entropy", ("float32", "float64"), SCALE, "ignored",
        "zeroes the ignored rows, then takes the mean over all N rows: the loss is (kept / N) "
        "times the mean over kept rows that F.cross_entropy and the spec give",
        "everything else passes (torch's smoothing convention eps/C; inf at a masked class, as "
        "in the spec)",
        {"options": {"label_smoothing": 0.1}},
        oracle=(NONFINITE, "confident_correct"),
        after="disagrees: the reading missed that the smoothing term sums the C log-probabilities "
        "first: at margin 1.7e38 (about half float32's range) four of them add up past "
        "3.4e38 to -inf, so the loss is inf where it is 1.36e37. The oracle is right; the "
        "predicted problem, the mean over ignored rows, is found as well (ignored, float32 and "
        "float64)",
    ),
    Entry(
        "mmdet_sigmoid_focal", "MMDetection", _GH + "open-mmlab/mmdetection/blob/00e9730/mmdet/"
        "models/losses/focal_loss.py", "Apache-2.0", "torch", "sigmoid_focal_loss",
        ("float32", "float64"), "pass", None,
        "torchvision's formula in other words (pt = 1 - p_t): BCE-with-logits is stable, and "
        "1 - sigmoid rounded to 0 at large margins is the textbook rounding allowed for "
        "gamma >= 1; no cast, so float64 stays float64",
        "",
        {"options": {"gamma": 2.0, "alpha": 0.25}},
    ),
    Entry(
        "timm_label_smoothing", "timm", _GH + "huggingface/pytorch-image-models/blob/308d0b9/timm/"
        "loss/cross_entropy.py", "Apache-2.0", "torch", "softmax_cross_entropy",
        ("float32", "float64"), "pass", None,
        "log_softmax throughout, torch's convention (1 - eps) nll + eps mean(-log p); at a "
        "masked class the smoothing term is inf, as in the spec",
        "unsupported: ignored labels (gather at -100 raises), spatial (dim=-1 gathers out of "
        "range on the probe), probability targets",
        {"options": {"label_smoothing": 0.1}},
        oracle=(NONFINITE, "confident_correct"),
        after="disagrees, and flips the verdict: -logprobs.mean(dim=-1) sums before dividing, "
        "so at margin 1.7e38 in float32 the sum overflows to -inf and the loss is inf where it "
        "is 1.36e37; the reading called the smoothing term safe because it is inf only at "
        "-inf logits. The oracle is right",
    ),
    Entry(
        "timm_soft_target", "timm", _GH + "huggingface/pytorch-image-models/blob/308d0b9/timm/"
        "loss/cross_entropy.py", "Apache-2.0", "torch", "softmax_cross_entropy", ("float32",),
        NONFINITE, "masked_soft",
        "-target * log_softmax: a masked class with zero target mass is 0 * -inf = NaN",
        "class-index targets unsupported (broadcasting raises); spatial probability targets "
        "take the softmax over the last axis (dim=-1), not the class axis",
    ),
    Entry(
        "hf_masked_lm", "transformers", _GH + "huggingface/transformers/blob/0114da0/src/"
        "transformers/loss/loss_utils.py", "Apache-2.0", "torch", "softmax_cross_entropy",
        ("float32",), ALL_IGNORED_NAN, "all_ignored",
        "sum / num_items_in_batch is 0 / 0 on an all-ignored batch; the gradient stays finite "
        "(nll_loss's backward writes 0 for ignored rows without reading the inf from 1 / 0)",
        "probability targets unsupported (labels.view(-1) no longer matches the rows); spatial "
        "skipped: the layout is class-last (batch, seq, vocab), flattened by view(-1, V)",
        {"skip": ("spatial",)},
    ),
    Entry(
        "torchtune_chunked_ce", "torchtune", _GH + "pytorch/torchtune/blob/10ff7cd/torchtune/"
        "modules/loss/ce_chunked_output_loss.py", "BSD-3-Clause", "torch",
        "softmax_cross_entropy", ("float32", "bfloat16"), ALL_IGNORED_NAN, "all_ignored",
        "total_loss / total_elements is 0 / 0 on an all-ignored batch, with finite gradients "
        "as above; the chunks are upcast to float32, so bfloat16 input is more than accurate",
        "spatial skipped: class-last layout",
        {"skip": ("spatial",)},
    ),
    Entry(
        "t5x_weighted_ce", "t5x", _GH + "google-research/t5x/blob/08058ed/t5x/losses.py",
        "Apache-2.0", "jax", "softmax_cross_entropy", ("float32",), NONFINITE, "masked",
        "-sum(targets * log_softmax) with one-hot targets: 0 * -inf = NaN at a masked class "
        "(the custom backward, softmax - targets, stays finite)",
        "C = 1 raises ZeroDivisionError ((1 - confidence) / (vocab_size - 1) in Python floats): "
        "an error in 'classes'; probability targets unsupported (the shape check raises); "
        "ignored labels skipped (JAX: t5x marks padding with weights)",
        {"skip": ("ignored", "all_ignored")},
        after="the oracle's first problem is non-finite in huge_shift, which the reading missed: "
        "the custom forward adds z_loss * square(log_z) with z_loss = 0, and at logits of "
        "1.7e38 square(log_z) is inf in float32, 0 * inf = NaN. The predicted NaN in masked "
        "and the C = 1 ZeroDivisionError (error in classes) are found too",
    ),
    Entry(
        "flax_wmt_weighted_ce", "flax (examples/wmt)", _GH + "google/flax/blob/0e5fc04/examples/"
        "wmt/train.py", "Apache-2.0", "jax", "softmax_cross_entropy", ("float32",), NONFINITE,
        "masked",
        "-sum(soft_targets * log_softmax(logits)): 0 * -inf = NaN at a masked class (autodiff's "
        "gradient stays finite: the cotangent there is -0)",
        "C = 1 raises ZeroDivisionError as in t5x; probability targets unsupported; ignored "
        "labels skipped (weights)",
        {"skip": ("ignored", "all_ignored")},
    ),
    Entry(
        "big_vision_softmax_xent", "big_vision", _GH + "google-research/big_vision/blob/11eea57/"
        "big_vision/utils.py", "Apache-2.0", "jax", "softmax_cross_entropy", ("float32",),
        NONFINITE, "masked_soft",
        "-sum(labels * log_softmax): 0 * -inf = NaN at a masked class with zero label mass",
        "class-index targets, hence ignored labels, unsupported (broadcasting (N,) against "
        "(N, C) raises)",
    ),
    Entry(
        "big_vision_sigmoid_xent", "big_vision", _GH + "google-research/big_vision/blob/11eea57/"
        "big_vision/utils.py", "Apache-2.0", "jax", "sigmoid_cross_entropy",
        ("float32", "float64"), "pass", None,
        "log_sigmoid(x) and log_sigmoid(-x), the stable pair, and no other arithmetic",
        "",
        {"options": {"reduction": "sum"}},
    ),
)  # fmt: skip


def run_entry(entry: Entry, max_examples: int = 5):
    """``parity.check`` of one entry, as the table and the test run it."""
    from dualloss.parity import check

    return check(entry.function, entry.reference, backend=entry.backend,
                 dtypes=list(entry.dtypes), max_examples=max_examples, **entry.kwargs)  # fmt: skip


def oracle_verdict(report) -> tuple[str, str]:
    """(the consequence of the report's first problem, or 'pass'; its region)."""
    if report.ok:
        return "pass", ""
    first = report.hazards[0]
    return first.consequence, first.region


def agrees(entry: Entry, report) -> bool:
    """Whether the oracle reached the entry's verdict for the stated reason: a pass; or a first
    problem of the expected consequence, and a problem of that consequence in the region named."""
    if entry.expected == "pass":
        return report.ok
    if report.ok or report.hazards[0].consequence != entry.expected:
        return False
    return any(h.consequence == entry.expected and h.region == entry.region
               for h in report.hazards)  # fmt: skip


def markdown_table(verdicts: dict | None = None) -> str:
    """docs/zoo.md's table: the verdicts read from the code, and with `verdicts` (name ->
    (consequence, region, agrees) from fresh runs) the oracle's next to them."""
    head = "| # | library | loss (vendored as tests/zoo/...) | backend, dtypes | expected (read) |"
    rule = "|---|---|---|---|---|"
    if verdicts is not None:
        head += " oracle's first problem | agrees |"
        rule += "---|---|"
    rows = [head, rule]
    for i, e in enumerate(ZOO, 1):
        expected = "pass" if e.expected == "pass" else f"{e.expected} ({e.region})"
        row = (f"| {i} | [{e.library}]({e.source}) ({e.licence}) | `{e.name}` "
               f"| {e.backend}, {'/'.join(e.dtypes)} | {expected} |")  # fmt: skip
        if verdicts is not None:
            said, region, ok = verdicts[e.name]
            row += f" {said}{f' ({region})' if region else ''} | {'yes' if ok else '**no**'} |"
        rows.append(row)
    return "\n".join(rows)
