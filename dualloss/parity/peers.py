"""The peers: other libraries' public functions of the spec's losses, in one table.

Each ``Peer`` says which framework it belongs to, which spec loss it computes (the registry's
record), the spec options it takes, how the parity run calls it (``implementation``: the spec's
options translated into its own keyword arguments, the cases it cannot express skipped, a
reproducer line) and how the benchmarks time it (``timed``: ``f(logits, targets) -> scalar``
with the loss's ``benchmark_options``). The parity run (``available_peers``), the benchmarks
(``benchmarks/peers.py``, ``benchmarks/run.py``) and the tests read this table; the registry's
``LossInfo.peers`` names the judged ones by ``key``. The measured verdicts are in
docs/nan-hazards.md.

Imports NumPy, the registry and ``backends`` only: torch, kornia, optax and JAX are imported
when a peer is called for, so that neither the oracle nor the benchmarks depend on them. It must
not import ``_check``, ``linear``, ``runner`` or the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import losses
from .backends import Implementation, Prepared, format_kwargs

# ``Peer.timed``: the benchmark calls the peer as the parity run does, with the loss's settings
AS_JUDGED = "as judged"


@dataclass(frozen=True)
class Peer:
    """One public function of another library that computes a spec loss.

    key: how the registry names it (``LossInfo.peers``).
    framework: 'torch' or 'jax'.
    loss: the record of the spec loss it computes.
    title: its public name, as the parity run's reports print it.
    options: the spec options it takes (a case with any other option away from its neutral
      value is skipped).
    library: imports the library and returns the function, called ``fn(logits, targets,
      **options)``; None for a peer that is only timed.
    imports, spelled: the reproducer's import line and the call as it writes it (default: the
      library's name and the function's, as ``optax.sigmoid_focal_loss``).
    reduces: whether the function takes ``reduction`` itself (torch's functions); otherwise it
      returns the loss per element and the run reduces it (optax's functions).
    supports: the cases it can express (default: all those its options allow).
    timed: how the benchmarks call it, ``timed(settings) -> f(logits, targets)``; ``AS_JUDGED``:
      the parity run's call with the settings; None: not timed.
    label: its name in the benchmark tables.
    """

    key: str
    framework: str
    loss: losses.LossInfo
    title: str
    options: frozenset[str] = frozenset()
    library: Callable[[], Callable] | None = None
    imports: str = ""
    spelled: str = ""
    reduces: bool = True
    supports: Callable[[Prepared], bool] | None = None
    timed: Callable[[dict], Callable] | str | None = None
    label: str = ""

    @property
    def judged(self) -> bool:
        """Whether the parity run judges it (it has a library function to call)."""
        return self.library is not None

    def function(self) -> Callable:
        """The function the parity run calls, ``fn(logits, targets, reduction='mean', **options)``
        (imports the library)."""
        fn = self.library()
        return fn if self.reduces else _reduced(fn)

    def implementation(self) -> Implementation:
        """The peer as the parity run judges it (imports the library)."""
        raw = self.library()
        spelled = self.spelled or f"{raw.__module__.split('.')[0]}.{raw.__name__}"
        extra = {} if self.supports is None else {"supports": self.supports}
        return Implementation(
            self.title, self.framework, self.loss, raw if self.reduces else _reduced(raw),
            _translate(self.loss, self.options), self.imports, _expr(spelled, self.reduces),
            takes=self.options, **extra,
        )  # fmt: skip

    def timed_call(self, settings: dict | None = None) -> Callable:
        """``f(logits, targets) -> scalar`` as the benchmarks time it, with `settings` (default:
        the loss's ``benchmark_options``); imports the library."""
        settings = dict(self.loss.benchmark_options if settings is None else settings)
        if self.timed is None:
            raise ValueError(f"`peer` must be timed by the benchmarks. Received: {self.key!r}.")
        if self.timed != AS_JUDGED:
            return self.timed(settings)
        fn = self.function()

        def call(logits, targets):
            return fn(logits, targets, **settings)

        call.__name__ = self.loss.name
        return call


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


def _expr(spelled: str, reduces: bool) -> Callable[[dict], str]:
    """The reproducer's call: `spelled` with the keyword arguments (and, for a function that
    does not reduce, the reduction applied after)."""

    def expr(kw):
        if reduces:
            return f"{spelled}(x, t{format_kwargs(kw)})"
        kw = dict(kw)
        reduction = kw.pop("reduction", "mean")
        return f"{spelled}(x, t{format_kwargs(kw)}){_suffix(reduction)}"

    return expr


def _reduced(fn):
    """`fn` (the loss per element) with a ``reduction`` argument, as the spec's."""

    def call(x, t, reduction="mean", **kwargs):
        return _reduce(fn(x, t, **kwargs), reduction)

    call.__name__ = fn.__name__
    return call


# ----------------------------------------------------------------------------------------------
# The functions that stand for a peer (a library call adapted, or a formula)
# ----------------------------------------------------------------------------------------------


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


def _kornia_mean(settings: dict) -> Callable:
    """kornia.losses.focal_loss as a user calls it: alpha as a Python float (it weights class 0
    by 1 - alpha and the others by alpha; ours weights every class by alpha: the same cost), its
    own 'mean' (over N * C, not N: the same cost)."""
    import kornia.losses

    alpha, gamma = settings["alpha"], settings["gamma"]

    def call(logits, targets):
        return kornia.losses.focal_loss(logits, targets, alpha=alpha, gamma=gamma, reduction="mean")

    return call


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


def log_softmax_focal_loss(logits, labels, alpha: float = 0.25, gamma: float = 2.0):
    """Softmax focal loss with integer labels as a JAX user writes it: log_softmax, gather, mean."""
    import jax
    import jax.numpy as jnp

    log_p = jax.nn.log_softmax(logits, axis=-1)
    log_p_t = jnp.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
    p_t = jnp.exp(log_p_t)
    loss = -alpha * (1.0 - p_t) ** gamma * log_p_t
    return loss.mean()


def _user_written_focal(settings: dict) -> Callable:
    def call(logits, targets):
        return log_softmax_focal_loss(logits, targets, **settings)

    return call


def _imported(path: str) -> Callable[[], Callable]:
    """A loader of the function at the dotted `path` ('optax.sigmoid_focal_loss')."""

    def load():
        import importlib

        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)

    return load


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------

_F = "import torch.nn.functional as F"
_OPTAX = "import optax"

TABLE: tuple[Peer, ...] = (
    Peer(
        "torch.cross_entropy", "torch", losses.SOFTMAX_CROSS_ENTROPY,
        "torch.nn.functional.cross_entropy", frozenset({"weight", "ignore_index",
        "label_smoothing"}), _imported("torch.nn.functional.cross_entropy"), _F, "F.cross_entropy",
        timed=AS_JUDGED, label="F.cross_entropy",
    ),
    Peer(
        "torch.binary_cross_entropy_with_logits", "torch", losses.SIGMOID_CROSS_ENTROPY,
        "torch.nn.functional.binary_cross_entropy_with_logits", frozenset({"weight",
        "pos_weight"}), _imported("torch.nn.functional.binary_cross_entropy_with_logits"), _F,
        "F.binary_cross_entropy_with_logits",
        timed=AS_JUDGED, label="F.binary_cross_entropy_with_logits",
    ),
    Peer(
        "kornia.focal_loss", "torch", losses.SOFTMAX_FOCAL_LOSS, "kornia.losses.focal_loss",
        frozenset({"gamma", "ignore_index"}), lambda: kornia_focal,
        "from dualloss.parity.peers import kornia_focal", "kornia_focal",
        supports=lambda prep: prep.case.index_targets,
        timed=_kornia_mean, label="kornia.losses.focal_loss",
    ),
    # torchvision cannot be installed next to this torch build: its formula stands for it
    Peer(
        "torchvision.sigmoid_focal_loss", "torch", losses.SIGMOID_FOCAL_LOSS,
        "torchvision.ops.sigmoid_focal_loss (formula)", frozenset({"gamma", "alpha"}),
        lambda: torchvision_sigmoid_focal,
        "from dualloss.parity.peers import torchvision_sigmoid_focal",
        "torchvision_sigmoid_focal",
        timed=AS_JUDGED, label="torchvision sigmoid_focal_loss formula",
    ),
    Peer(
        "optax.softmax_cross_entropy_with_integer_labels", "jax", losses.SOFTMAX_CROSS_ENTROPY,
        "optax.softmax_cross_entropy_with_integer_labels", frozenset({"where"}),
        _imported("optax.softmax_cross_entropy_with_integer_labels"), _OPTAX, reduces=False,
        supports=lambda prep: prep.case.index_targets and not _has_ignored(prep),
        timed=AS_JUDGED, label="optax.softmax_cross_entropy_with_integer_labels",
    ),
    Peer(
        "optax.softmax_cross_entropy", "jax", losses.SOFTMAX_CROSS_ENTROPY,
        "optax.softmax_cross_entropy", frozenset({"where"}),
        _imported("optax.softmax_cross_entropy"), _OPTAX, reduces=False,
        supports=lambda prep: not prep.case.index_targets,
    ),
    Peer(
        "optax.sigmoid_binary_cross_entropy", "jax", losses.SIGMOID_CROSS_ENTROPY,
        "optax.sigmoid_binary_cross_entropy", frozenset(),
        _imported("optax.sigmoid_binary_cross_entropy"), _OPTAX, reduces=False,
        timed=AS_JUDGED, label="optax.sigmoid_binary_cross_entropy",
    ),
    Peer(
        "optax.sigmoid_focal_loss", "jax", losses.SIGMOID_FOCAL_LOSS, "optax.sigmoid_focal_loss",
        frozenset({"gamma", "alpha"}), _imported("optax.sigmoid_focal_loss"), _OPTAX, reduces=False,
        timed=AS_JUDGED, label="optax.sigmoid_focal_loss",
    ),
    # optax has no softmax focal loss: the benchmark times the one a JAX user writes
    Peer(
        "jax.log_softmax_focal_loss", "jax", losses.SOFTMAX_FOCAL_LOSS,
        "a log_softmax focal loss (user-written)", frozenset({"gamma", "alpha"}),
        timed=_user_written_focal, label="log_softmax focal (user-written)",
    ),
)  # fmt: skip
PEERS: dict[str, Peer] = {peer.key: peer for peer in TABLE}


def timed(framework: str) -> dict[str, Peer]:
    """The peer the benchmarks time for each loss of `framework` ('torch' or 'jax'), by the
    loss's name, in the registry's order."""
    out = {p.loss.name: p for p in TABLE if p.framework == framework and p.timed is not None}
    return {info.name: out[info.name] for info in losses.RECORDS if info.name in out}


def available_peers(backends=("torch", "jax")) -> list[Implementation]:
    """Every judged peer whose library imports, for the given backends."""
    out = []
    for peer in TABLE:
        if not peer.judged or peer.framework not in backends:
            continue
        try:
            out.append(peer.implementation())
        except Exception:  # noqa: BLE001 - a missing optional library just drops its peers
            continue
    return out
