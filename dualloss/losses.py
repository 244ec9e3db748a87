"""The registry: one record per loss, everything the machinery needs to know about it.

A loss *is* its ``LossInfo``: its name and family, the spec's value and gradient functions, its
options (domain, default, neutral value, whether it is differentiable), the adversarial regions
the parity suite feeds it, the error inputs every implementation must refuse with the same
message, and the public peers it is measured against. Code that asks "is this a softmax loss,
does it have gamma, which option is its per-class vector" asks the record, never the name's text
(the model is torch's OpInfo, ``torch/testing/_internal/opinfo/core.py``).

Adding a loss = its function in the family's module of ``spec``, ``torch_impl`` and ``jax_impl``
(``softmax.py``, ``sigmoid.py``, ``linear.py``; same order, same local names) + one ``LossInfo``
here + one mpmath formula in ``tests/mp_oracle.py``.

Framework-free: importing this module imports NumPy and the spec only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import spec

__all__ = [
    "ALL_NAMES",
    "ErrorInput",
    "HEAD_OPTIONS",
    "LINEAR_LOSSES",
    "LINEAR_NAMES",
    "LINEAR_REGIONS",
    "LOSSES",
    "LossInfo",
    "NAMES",
    "Option",
    "RECORDS",
    "REGIONS",
    "get",
    "of_family",
]

# 'linear': the fused linear + softmax losses, whose inputs are (hidden, linear_weight, targets)
FAMILIES = ("softmax", "sigmoid", "linear")

# every adversarial region of the parity suite (``dualloss.parity.cases``), in seed order
REGIONS = (
    "typical",
    "confident_correct",
    "confident_wrong",
    "near_ties",
    "huge_shift",
    "masked",
    "soft_targets",
    "masked_soft",
    "label_smoothing",
    "ignored",
    "all_ignored",
    "classes",
    "spatial",
    "where",
    "options",
    "llm_head",
    "wide_span",
)
SIGMOID_REGIONS = (
    "typical",
    "confident_correct",
    "confident_wrong",
    "near_ties",
    "soft_targets",
    "spatial",
    "options",
)
# the regions of the fused linear losses (``dualloss.parity.linear``), in seed order
LINEAR_REGIONS = (
    "typical",
    "huge_norms",
    "ties",
    "ignored",
    "all_ignored",
    "one_class_dominant",
    "confident",
    "near_ties",
    "mostly_ignored",
    "bias_mask",
    "half_overflow",
    "one_row",
    "wide_vocab",
    "long_hidden",
)


@dataclass(frozen=True)
class Option:
    """A keyword argument of a loss.

    `kind` says what it is: 'real' (a number; `low`/`high` bound it), 'class_vector' (length C),
    'scalar_or_class_vector' (softmax focal alpha), 'elementwise' (broadcastable to the logits),
    'index' (an integer), 'mask' (boolean, the logits or the batch shape), 'choice' (`choices`),
    'size' (None or an integer >= 1: the fused linear losses' rows per block), 'normalizer' (None,
    or a number or 0-d array >= 0 that replaces the divisor of reduction 'mean').
    `neutral` is the value at which the option changes nothing; `factor` marks the weights that
    multiply the loss (their size scales every error, see ``parity.tolerance``).
    """

    name: str
    kind: str
    default: Any
    neutral: Any
    differentiable: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple = ()
    factor: bool = False

    def is_neutral(self, value: Any) -> bool:
        """True when `value` is this option's neutral value (arrays never are)."""
        if value is None or self.neutral is None:
            return value is None and self.neutral is None
        return bool(np.isscalar(value) and value == self.neutral)


@dataclass(frozen=True)
class ErrorInput:
    """A call that every implementation must refuse: `kwargs` added to the loss's sample call
    (``LossInfo.sample_inputs``), or its `logits` / `targets` replaced (NumPy, at most 2-D, so
    that the torch layout reads them alike), or any positional input replaced by name in
    `inputs` (spec layout), the exception type and the exact message."""

    description: str
    kwargs: dict = field(default_factory=dict)
    error: type = ValueError
    message: str = ""
    logits: Any = None
    targets: Any = None
    inputs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class LossInfo:
    """Everything about one loss (see the module docstring)."""

    name: str
    family: str
    options: tuple[Option, ...]
    differentiable: tuple[str, ...]
    regions: tuple[str, ...]
    error_inputs: tuple[ErrorInput, ...] = ()
    # keys of ``dualloss.parity.peers.PEERS``: the public functions of the same loss
    peers: tuple[str, ...] = ()
    # the option that holds the per-class vector (softmax), if any
    class_vector: str | None = None
    # the mean's denominator for class-index targets: 'weights' (summed weights of the kept
    # targets, torch's weighted CE) or 'kept' (number of kept targets)
    index_mean: str = "kept"
    # settings shared by candidate and peer in ``benchmarks`` (the focal papers' defaults)
    benchmark_options: dict = field(default_factory=dict)
    # the positional arguments, in order, in the spec's layout
    inputs: tuple[str, ...] = ("logits", "targets")
    # the positional inputs torch_impl takes transposed (the linear layer's (V, H) matrix)
    torch_transposed: tuple[str, ...] = ()

    def sample_inputs(self) -> tuple[np.ndarray, ...]:
        """A small valid call's positional inputs (``inputs``, spec layout): (4, 5) logits with
        class indices for the softmax family, (2, 3) with probabilities 0.5 for the sigmoid
        family, hidden (4, 3), linear_weight (3, 7) and class indices for the linear family."""
        if self.is_linear:
            return np.zeros((4, 3)), np.zeros((3, 7)), np.arange(4)
        if self.is_softmax:
            return np.zeros((4, 5)), np.arange(4)
        return np.zeros((2, 3)), np.full((2, 3), 0.5)

    @property
    def spec(self) -> Callable:
        return getattr(spec, self.name)

    @property
    def grad(self) -> Callable:
        return getattr(spec, self.name + "_grad")

    @property
    def intermediates(self) -> Callable:
        """The spec's loss before its reduction (``spec.<name>_intermediates``)."""
        return getattr(spec, self.name + "_intermediates")

    @property
    def is_softmax(self) -> bool:
        return self.family == "softmax"

    @property
    def is_linear(self) -> bool:
        """A fused linear + loss family: inputs (hidden, linear_weight, targets)."""
        return self.family == "linear"

    @property
    def is_focal(self) -> bool:
        return self.has("gamma")

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(option.name for option in self.options)

    def has(self, name: str) -> bool:
        return name in self.option_names

    def option(self, name: str) -> Option:
        for option in self.options:
            if option.name == name:
                return option
        raise ValueError(
            f"`option` must be one of {self.option_names} for {self.name}. Received: {name!r}."
        )

    def default(self, name: str) -> Any:
        return self.option(name).default

    def gamma(self, options: dict) -> float:
        """The focusing parameter in effect: `options['gamma']`, its default, or 0 (no gamma)."""
        if not self.is_focal:
            return 0.0
        return float(options.get("gamma", self.default("gamma")))

    def factors(self) -> tuple[str, ...]:
        """The options that multiply the loss (weights, alpha, pos_weight)."""
        return tuple(option.name for option in self.options if option.factor)


# ----------------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------------

REDUCTION = Option("reduction", "choice", "mean", None, choices=("none", "mean", "sum"))
GAMMA = Option("gamma", "real", 2.0, 0.0, differentiable=True, low=0.0)
IGNORE_INDEX = Option("ignore_index", "index", -100, -100)
LABEL_SMOOTHING = Option(
    "label_smoothing", "real", 0.0, 0.0, differentiable=True, low=0.0, high=1.0
)
WHERE = Option("where", "mask", None, None)
# the mean's divisor when given (a number or a 0-d array; a constant, never differentiated)
NORMALIZER = Option("normalizer", "normalizer", None, None)
AXIS = Option("axis", "index", -1, -1)
# the LLM head options (DESIGN 13): the z-loss weight and the logit cap (None: no cap)
Z_LOSS = Option("z_loss", "real", 0.0, 0.0, low=0.0)
SOFTCAP = Option("softcap", "real", None, None, low=0.0)
# the options a loss may lack as a whole feature: a call that refuses one of them, or a peer that
# does not take it, is reported unsupported by the parity run, not failed
HEAD_OPTIONS = ("z_loss", "softcap")
# (loss, {'lse', 'z_term', 'correct'}): the per-element statistics of the same pass
RETURN_AUX = Option("return_aux", "choice", False, False, choices=(False, True))

# the error inputs every loss of a family shares (messages of ``dualloss._checks``)
_REDUCTION_ERROR = ErrorInput(
    "unknown reduction",
    {"reduction": "avg"},
    ValueError,
    "`reduction` must be one of 'none', 'mean', 'sum'. Received: reduction='avg'.",
)
_NORMALIZER_ERRORS = (
    ErrorInput(
        "normalizer with reduction sum",
        {"reduction": "sum", "normalizer": 4.0},
        ValueError,
        "`normalizer` replaces the divisor of reduction='mean' (the loss becomes the sum over the "
        "kept elements divided by it), so it needs reduction='mean'. Received: reduction='sum'.",
    ),
    ErrorInput(
        "negative normalizer",
        {"normalizer": -1.0},
        ValueError,
        "`normalizer` must be a finite number >= 0 (the global count of kept targets or the sum "
        "of their weights). Received: normalizer=-1.0.",
    ),
)
_GAMMA_ERRORS = (
    ErrorInput(
        "negative gamma",
        {"gamma": -1.0},
        ValueError,
        "`gamma` must be a finite number >= 0. Received: gamma=-1.0.",
    ),
    ErrorInput(
        "gamma given as text",
        {"gamma": "2"},
        TypeError,
        "`gamma` must be a real number. Received: gamma='2'.",
    ),
)
_SOFTMAX_ERRORS = (
    _REDUCTION_ERROR,
    *_NORMALIZER_ERRORS,
    ErrorInput(
        "label smoothing above 1",
        {"label_smoothing": 1.5},
        ValueError,
        "`label_smoothing` must be in [0, 1]. Received: label_smoothing=1.5.",
    ),
    ErrorInput(
        "negative z_loss",
        {"z_loss": -1.0},
        ValueError,
        "`z_loss` must be a finite number >= 0 (the weight of logsumexp(logits)**2). "
        "Received: z_loss=-1.0.",
    ),
    ErrorInput(
        "softcap of zero",
        {"softcap": 0.0},
        ValueError,
        "`softcap` must be None or a finite number > 0 (the logits become softcap * "
        "tanh(logits / softcap)). Received: softcap=0.0.",
    ),
    ErrorInput(
        "class index out of range",
        {},
        ValueError,
        "`targets` has class index 7 at position (3,), outside [0, 5) and not ignore_index=-100.",
        targets=np.array([0, 1, -100, 7]),
    ),
    ErrorInput(
        "integer logits",
        {},
        TypeError,
        "`logits` must have a floating dtype. Received: logits.dtype=int32.",
        logits=np.zeros((4, 5), dtype=np.int32),
    ),
    ErrorInput(
        "boolean targets",
        {},
        TypeError,
        "`targets` must hold integer class indices or floating class probabilities. "
        "Received: targets.dtype=bool.",
        targets=np.ones(4, dtype=bool),
    ),
    ErrorInput(
        "class-index targets of the wrong shape",
        {},
        ValueError,
        "`targets` of class indices must have shape (4,), the logits shape (4, 5) without axis 1. "
        "Received: targets.shape=(5,).",
        targets=np.zeros(5, dtype=np.int32),
    ),
    ErrorInput(
        "class axis out of range",
        {"axis": 3},
        ValueError,
        "`axis` must be in [-2, 2) for logits with 2 dimensions. Received: axis=3.",
    ),
    ErrorInput(
        "non-integer ignore_index",
        {"ignore_index": 1.5},
        TypeError,
        "`ignore_index` must be an integer. Received: ignore_index=1.5.",
    ),
    ErrorInput(
        "non-boolean where",
        {"where": np.ones(5, dtype=np.float32)},
        TypeError,
        "`where` must be a boolean mask. Received: where.dtype=float32.",
    ),
    ErrorInput(
        "where that does not broadcast",
        {"where": np.ones((3, 5), dtype=bool)},
        ValueError,
        "`where` must broadcast to the logits shape (4, 5). Received: where.shape=(3, 5).",
    ),
    ErrorInput(
        "probability targets of the wrong shape",
        {},
        ValueError,
        "`targets` of class probabilities must have the logits shape (4, 5). "
        "Received: targets.shape=(4, 4).",
        targets=np.full((4, 4), 0.25),
    ),
)
_SIGMOID_ERRORS = (
    _REDUCTION_ERROR,
    *_NORMALIZER_ERRORS,
    ErrorInput(
        "targets of the wrong shape",
        {},
        ValueError,
        "`targets` must have the logits shape (2, 3). Received: targets.shape=(3,).",
        targets=np.full(3, 0.5),
    ),
    ErrorInput(
        "integer targets",
        {},
        TypeError,
        "`targets` must have a floating dtype (probabilities in [0, 1]). "
        "Received: targets.dtype=int32.",
        targets=np.ones((2, 3), dtype=np.int32),
    ),
)


# ----------------------------------------------------------------------------------------------
# The losses
# ----------------------------------------------------------------------------------------------

SOFTMAX_CROSS_ENTROPY = LossInfo(
    name="softmax_cross_entropy",
    family="softmax",
    options=(
        AXIS,
        Option("weight", "class_vector", None, None, differentiable=True, factor=True),
        IGNORE_INDEX,
        LABEL_SMOOTHING,
        WHERE,
        REDUCTION,
        NORMALIZER,
        Z_LOSS,
        SOFTCAP,
        RETURN_AUX,
    ),
    differentiable=("logits", "targets", "weight", "label_smoothing"),
    regions=REGIONS,
    error_inputs=_SOFTMAX_ERRORS
    + (
        ErrorInput(
            "weight of the wrong length",
            {"weight": np.ones(3, dtype=np.float32)},
            ValueError,
            "`weight` must be a vector of length 5 (one entry per class). "
            "Received: weight.shape=(3,).",
        ),
    ),
    peers=(
        "torch.cross_entropy",
        "optax.softmax_cross_entropy_with_integer_labels",
        "optax.softmax_cross_entropy",
    ),
    class_vector="weight",
    index_mean="weights",
)

SOFTMAX_FOCAL_LOSS = LossInfo(
    name="softmax_focal_loss",
    family="softmax",
    options=(
        AXIS,
        GAMMA,
        Option(
            "alpha",
            "scalar_or_class_vector",
            None,
            None,
            differentiable=True,
            low=0.0,
            high=1.0,
            factor=True,
        ),
        IGNORE_INDEX,
        LABEL_SMOOTHING,
        WHERE,
        REDUCTION,
        NORMALIZER,
        Z_LOSS,
        SOFTCAP,
        RETURN_AUX,
    ),
    differentiable=("logits", "targets", "gamma", "alpha", "label_smoothing"),
    regions=REGIONS,
    error_inputs=_SOFTMAX_ERRORS
    + _GAMMA_ERRORS
    + (
        ErrorInput(
            "alpha above 1",
            {"alpha": 1.5},
            ValueError,
            "`alpha` must be in [0, 1]. Received: alpha=1.5.",
        ),
        ErrorInput(
            "alpha vector with an entry above 1",
            {"alpha": np.array([0.5, 2.0, 0.0, 0.0, 0.0], dtype=np.float32)},
            ValueError,
            "`alpha` must have every entry in [0, 1]. Received: alpha[1]=2.0.",
        ),
        ErrorInput(
            "alpha vector of the wrong length",
            {"alpha": np.full(3, 0.5, dtype=np.float32)},
            ValueError,
            "`alpha` must be a vector of length 5 (one entry per class). "
            "Received: alpha.shape=(3,).",
        ),
    ),
    peers=("kornia.focal_loss",),
    class_vector="alpha",
    index_mean="kept",
    benchmark_options={"gamma": 2.0, "alpha": 0.25},
)

SIGMOID_CROSS_ENTROPY = LossInfo(
    name="sigmoid_cross_entropy",
    family="sigmoid",
    options=(
        Option("weight", "elementwise", None, None, differentiable=True, factor=True),
        Option("pos_weight", "elementwise", None, None, differentiable=True, factor=True),
        REDUCTION,
        NORMALIZER,
    ),
    differentiable=("logits", "targets", "weight", "pos_weight"),
    regions=SIGMOID_REGIONS,
    error_inputs=_SIGMOID_ERRORS
    + (
        ErrorInput(
            "pos_weight that does not broadcast",
            {"pos_weight": np.ones(2, dtype=np.float32)},
            ValueError,
            "`pos_weight` must broadcast to the logits shape (2, 3). "
            "Received: pos_weight.shape=(2,).",
        ),
        ErrorInput(
            "weight that does not broadcast",
            {"weight": np.ones((3, 3), dtype=np.float32)},
            ValueError,
            "`weight` must broadcast to the logits shape (2, 3). Received: weight.shape=(3, 3).",
        ),
    ),
    peers=("torch.binary_cross_entropy_with_logits", "optax.sigmoid_binary_cross_entropy"),
)

SIGMOID_FOCAL_LOSS = LossInfo(
    name="sigmoid_focal_loss",
    family="sigmoid",
    options=(
        GAMMA,
        Option("alpha", "real", None, None, differentiable=True, low=0.0, high=1.0, factor=True),
        REDUCTION,
        NORMALIZER,
    ),
    differentiable=("logits", "targets", "gamma", "alpha"),
    regions=SIGMOID_REGIONS,
    error_inputs=_SIGMOID_ERRORS
    + _GAMMA_ERRORS
    + (
        ErrorInput(
            "alpha above 1",
            {"alpha": 1.5},
            ValueError,
            "`alpha` must be in [0, 1]. Received: alpha=1.5.",
        ),
        ErrorInput(
            "alpha given as a vector",
            {"alpha": [0.25, 0.75]},
            TypeError,
            "`alpha` must be None or a number in [0, 1]. Received: alpha=[0.25, 0.75].",
        ),
    ),
    peers=("torchvision.sigmoid_focal_loss", "optax.sigmoid_focal_loss"),
    benchmark_options={"gamma": 2.0, "alpha": 0.25},
)

# the fused linear + softmax losses (DESIGN section 9, docs/linear.md): the loss of
# hidden @ linear_weight + bias; judged by ``dualloss.parity.linear`` (their own regions and
# error bound), through ``parity.check`` like the others
_LINEAR_SHARED_ERRORS = (
    _REDUCTION_ERROR,
    *_NORMALIZER_ERRORS,
    ErrorInput(
        "bias of the wrong length",
        {"bias": np.zeros(3)},
        ValueError,
        "`bias` must be a vector of length 7 (one entry per class). Received: bias.shape=(3,).",
    ),
    ErrorInput(
        "class index out of range",
        {},
        ValueError,
        "`targets` has class index 9 at position (2,), outside [0, 7) and not ignore_index=-100.",
        targets=np.array([0, 1, 9, 2]),
    ),
    ErrorInput(
        "probability targets",
        {},
        TypeError,
        "`targets` must hold integer class indices. Received: targets.dtype=float32.",
        targets=np.zeros(4, dtype=np.float32),
    ),
    ErrorInput(
        "integer hidden",
        {},
        TypeError,
        "`hidden` must have a floating dtype. Received: hidden.dtype=int32.",
        inputs={"hidden": np.zeros((4, 3), dtype=np.int32)},
    ),
    ErrorInput(
        "chunk_size below 1",
        {"chunk_size": -1},
        ValueError,
        "`chunk_size` must be >= 1. Received: chunk_size=-1.",
    ),
    ErrorInput(
        "label smoothing above 1",
        {"label_smoothing": 1.5},
        ValueError,
        "`label_smoothing` must be in [0, 1]. Received: label_smoothing=1.5.",
    ),
)
# the bias and the rows per block (None: chosen from V); the class weights, alpha, gamma and
# label smoothing get no gradient in the backends (docs/design.md, Known gaps)
BIAS = Option("bias", "class_vector", None, None, differentiable=True)
CHUNK_SIZE = Option("chunk_size", "size", None, None)
LINEAR_LABEL_SMOOTHING = Option("label_smoothing", "real", 0.0, 0.0, low=0.0, high=1.0)

LINEAR_SOFTMAX_CROSS_ENTROPY = LossInfo(
    name="linear_softmax_cross_entropy",
    family="linear",
    options=(
        BIAS,
        Option("weight", "class_vector", None, None, factor=True),
        IGNORE_INDEX,
        LINEAR_LABEL_SMOOTHING,
        REDUCTION,
        NORMALIZER,
        Z_LOSS,
        SOFTCAP,
        CHUNK_SIZE,
        RETURN_AUX,
    ),
    differentiable=("hidden", "linear_weight", "bias"),
    regions=LINEAR_REGIONS,
    error_inputs=_LINEAR_SHARED_ERRORS,
    class_vector="weight",
    index_mean="weights",
    inputs=("hidden", "linear_weight", "targets"),
    torch_transposed=("linear_weight",),
)

LINEAR_SOFTMAX_FOCAL_LOSS = LossInfo(
    name="linear_softmax_focal_loss",
    family="linear",
    options=(
        BIAS,
        Option("gamma", "real", 2.0, 0.0, low=0.0),
        Option("alpha", "scalar_or_class_vector", None, None, low=0.0, high=1.0, factor=True),
        IGNORE_INDEX,
        LINEAR_LABEL_SMOOTHING,
        REDUCTION,
        NORMALIZER,
        Z_LOSS,
        SOFTCAP,
        CHUNK_SIZE,
        RETURN_AUX,
    ),
    differentiable=("hidden", "linear_weight", "bias"),
    regions=LINEAR_REGIONS,
    error_inputs=_LINEAR_SHARED_ERRORS + _GAMMA_ERRORS,
    class_vector="alpha",
    index_mean="kept",
    inputs=("hidden", "linear_weight", "targets"),
    torch_transposed=("linear_weight",),
)

# the losses of logits: what ``parity.cases`` generates and ``parity.tolerance`` judges
LOSSES: tuple[LossInfo, ...] = (
    SOFTMAX_CROSS_ENTROPY,
    SOFTMAX_FOCAL_LOSS,
    SIGMOID_CROSS_ENTROPY,
    SIGMOID_FOCAL_LOSS,
)
NAMES: tuple[str, ...] = tuple(info.name for info in LOSSES)
LINEAR_LOSSES: tuple[LossInfo, ...] = (LINEAR_SOFTMAX_CROSS_ENTROPY, LINEAR_SOFTMAX_FOCAL_LOSS)
LINEAR_NAMES: tuple[str, ...] = tuple(info.name for info in LINEAR_LOSSES)
# every record: what the API-mirror, option and error-input tests iterate over
RECORDS: tuple[LossInfo, ...] = LOSSES + LINEAR_LOSSES
ALL_NAMES: tuple[str, ...] = tuple(info.name for info in RECORDS)
_BY_NAME = {info.name: info for info in RECORDS}


def get(name: Any) -> LossInfo:
    """The record of the loss called `name` (a LossInfo is returned as it is)."""
    if isinstance(name, LossInfo):
        return name
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"`loss` must be one of {ALL_NAMES}. Received: loss={name!r}.") from None


def of_family(family: str) -> tuple[LossInfo, ...]:
    """The records of one family ('softmax', 'sigmoid' or 'linear')."""
    if family not in FAMILIES:
        raise ValueError(f"`family` must be one of {FAMILIES}. Received: family={family!r}.")
    return tuple(info for info in RECORDS if info.family == family)
