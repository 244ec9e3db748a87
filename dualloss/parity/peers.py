"""Public implementations measured by the oracle: torch, optax, kornia, torchvision's formula.

Each peer is an ``Implementation`` that translates the spec's options into the peer's own keyword
arguments and skips the cases the peer cannot express (optax has no ``ignore_index``, kornia no
label smoothing, ...). The measured verdicts are in docs/nan-hazards.md.
"""

from __future__ import annotations

import numpy as np

from .. import losses
from .backends import Implementation, Prepared, format_kwargs


def _only(info, allowed, options):
    """True when every option is one the peer has (or is at the loss's neutral value)."""
    for key, value in options.items():
        if key in allowed or key == "reduction":
            continue
        if info.has(key) and info.option(key).is_neutral(value):
            continue
        return False
    return True


def _has_ignored(prep: Prepared) -> bool:
    return prep.case.index_targets and bool(
        np.any(prep.targets == prep.options.get("ignore_index", -100))
    )


def _suffix(reduction):
    return {"mean": ".mean()", "sum": ".sum()", "none": ""}[reduction]


def _reduce(value, reduction):
    if reduction == "mean":
        return value.mean()
    if reduction == "sum":
        return value.sum()
    return value


def _translate(info, allowed, rename=None, defaults=None):
    def kwargs(options, array):
        if not _only(info, allowed, options):
            return None
        out = dict(defaults or {})
        for key, value in options.items():
            if key not in allowed and key != "reduction":
                continue
            if isinstance(value, np.ndarray):
                value = array(value, like_logits=value.dtype != np.bool_)
            out[(rename or {}).get(key, key)] = value
        return out

    return kwargs


def _peer(name, backend, loss, fn, allowed, imports, expr, **kwargs) -> Implementation:
    """An ``Implementation`` of a public function that takes the options in `allowed` (and
    skips the cases with any other option away from its neutral value)."""
    translate = _translate(losses.get(loss), allowed)
    return Implementation(name, backend, loss, fn, translate, imports, expr, **kwargs)


# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------


def torch_cross_entropy() -> Implementation:
    import torch.nn.functional as F

    return _peer(
        "torch.nn.functional.cross_entropy", "torch", "softmax_cross_entropy", F.cross_entropy,
        {"weight", "ignore_index", "label_smoothing"},
        "import torch.nn.functional as F", lambda kw: f"F.cross_entropy(x, t{format_kwargs(kw)})",
    )  # fmt: skip


def torch_bce_with_logits() -> Implementation:
    import torch.nn.functional as F

    return _peer(
        "torch.nn.functional.binary_cross_entropy_with_logits", "torch", "sigmoid_cross_entropy",
        F.binary_cross_entropy_with_logits, {"weight", "pos_weight"},
        "import torch.nn.functional as F",
        lambda kw: f"F.binary_cross_entropy_with_logits(x, t{format_kwargs(kw)})",
    )  # fmt: skip


def kornia_focal(x, t, gamma=2.0, ignore_index=-100, reduction="mean"):
    """kornia.losses.focal_loss (alpha=None), its (B, C, *) map summed over the classes, the mean
    over the kept elements (kornia's own 'mean' divides by C times every element)."""
    import kornia

    loss_map = kornia.losses.focal_loss(
        x, t, alpha=None, gamma=gamma, reduction="none", ignore_index=ignore_index
    )
    per_element = loss_map.sum(1)
    if reduction == "none":
        return per_element
    if reduction == "sum":
        return per_element.sum()
    kept = (t != ignore_index).sum().clamp(min=1)
    return per_element.sum() / kept


def kornia_focal_loss() -> Implementation:
    return _peer(
        "kornia.losses.focal_loss", "torch", "softmax_focal_loss", kornia_focal,
        {"gamma", "ignore_index"},
        "from dualloss.parity.peers import kornia_focal",
        lambda kw: f"kornia_focal(x, t{format_kwargs(kw)})",
        supports=lambda prep: prep.case.index_targets,
    )  # fmt: skip


def torchvision_sigmoid_focal(x, t, gamma=2.0, alpha=None, reduction="mean"):
    """torchvision.ops.sigmoid_focal_loss, its formula (torchvision 0.19); alpha None: off."""
    import torch.nn.functional as F

    p = torch_sigmoid(x)
    ce_loss = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce_loss * ((1 - p_t) ** gamma)
    if alpha is not None and alpha >= 0:
        alpha_t = alpha * t + (1 - alpha) * (1 - t)
        loss = alpha_t * loss
    return _reduce(loss, reduction)


def torch_sigmoid(x):
    import torch

    return torch.sigmoid(x)


def torchvision_focal_formula() -> Implementation:
    return _peer(
        "torchvision.ops.sigmoid_focal_loss (formula)", "torch", "sigmoid_focal_loss",
        torchvision_sigmoid_focal, {"gamma", "alpha"},
        "from dualloss.parity.peers import torchvision_sigmoid_focal",
        lambda kw: f"torchvision_sigmoid_focal(x, t{format_kwargs(kw)})",
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# optax
# ----------------------------------------------------------------------------------------------


def _optax_expr(name):
    def expr(kw):
        kw = dict(kw)
        reduction = kw.pop("reduction", "mean")
        return f"optax.{name}(x, t{format_kwargs(kw)}){_suffix(reduction)}"

    return expr


def _optax_wrap(fn):
    def call(x, t, reduction="mean", **kwargs):
        return _reduce(fn(x, t, **kwargs), reduction)

    call.__name__ = fn.__name__
    return call


def optax_integer_ce() -> Implementation:
    import optax

    return _peer(
        "optax.softmax_cross_entropy_with_integer_labels", "jax", "softmax_cross_entropy",
        _optax_wrap(optax.softmax_cross_entropy_with_integer_labels), {"where"},
        "import optax", _optax_expr("softmax_cross_entropy_with_integer_labels"),
        supports=lambda prep: prep.case.index_targets and not _has_ignored(prep),
    )  # fmt: skip


def optax_prob_ce() -> Implementation:
    import optax

    return _peer(
        "optax.softmax_cross_entropy", "jax", "softmax_cross_entropy",
        _optax_wrap(optax.softmax_cross_entropy), {"where"},
        "import optax", _optax_expr("softmax_cross_entropy"),
        supports=lambda prep: not prep.case.index_targets,
    )  # fmt: skip


def optax_sigmoid_bce() -> Implementation:
    import optax

    return _peer(
        "optax.sigmoid_binary_cross_entropy", "jax", "sigmoid_cross_entropy",
        _optax_wrap(optax.sigmoid_binary_cross_entropy), set(),
        "import optax", _optax_expr("sigmoid_binary_cross_entropy"),
    )  # fmt: skip


def optax_sigmoid_focal() -> Implementation:
    import optax

    return _peer(
        "optax.sigmoid_focal_loss", "jax", "sigmoid_focal_loss",
        _optax_wrap(optax.sigmoid_focal_loss), {"gamma", "alpha"},
        "import optax", _optax_expr("sigmoid_focal_loss"),
    )  # fmt: skip


PEERS = {
    "torch.cross_entropy": torch_cross_entropy,
    "torch.binary_cross_entropy_with_logits": torch_bce_with_logits,
    "kornia.focal_loss": kornia_focal_loss,
    "torchvision.sigmoid_focal_loss": torchvision_focal_formula,
    "optax.softmax_cross_entropy_with_integer_labels": optax_integer_ce,
    "optax.softmax_cross_entropy": optax_prob_ce,
    "optax.sigmoid_binary_cross_entropy": optax_sigmoid_bce,
    "optax.sigmoid_focal_loss": optax_sigmoid_focal,
}


def available_peers(backends=("torch", "jax")) -> list[Implementation]:
    """Every peer whose library imports, for the given backends."""
    out = []
    for make in PEERS.values():
        try:
            impl = make()
        except Exception:  # noqa: BLE001 - a missing optional library just drops its peers
            continue
        if impl.backend in backends:
            out.append(impl)
    return out
