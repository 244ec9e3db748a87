"""The benchmark's pairs: for each (framework, loss), the dualloss function and the peer a user
would call instead, both called ``f(logits, targets)`` -> a scalar (mean reduction) with the
loss's ``benchmark_options`` (``SETTINGS``), so that candidate and peer do the same work.

The peers themselves (which function, how it is called, its name in the tables) are the one
table ``dualloss.parity.peers.TABLE`` (its ``timed`` entries); this module only hands them to
``run.py`` keyed by the loss's name. JAX: the benchmark jits value_and_grad of both.

Imports the registry and the peers table only: torch, kornia, optax and JAX are imported when
the callables are made.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from dualloss import losses
from dualloss.parity import peers as _table

LOSSES = losses.NAMES

# Loss settings shared by candidate and peer: the defaults of the focal-loss papers (registry).
GAMMA = losses.SOFTMAX_FOCAL_LOSS.benchmark_options["gamma"]
ALPHA = losses.SOFTMAX_FOCAL_LOSS.benchmark_options["alpha"]
SETTINGS: dict[str, dict[str, float]] = {
    info.name: info.benchmark_options for info in losses.LOSSES
}

# (framework, loss) -> the peer's name in the benchmark tables
PEER_NAMES: dict[tuple[str, str], str] = {
    (framework, loss): peer.label
    for framework in ("torch", "jax")
    for loss, peer in _table.timed(framework).items()
}


def _peers(framework: str) -> dict[str, Callable]:
    return {loss: peer.timed_call() for loss, peer in _table.timed(framework).items()}


def _candidates(module) -> dict[str, Callable]:
    return {
        info.name: partial(getattr(module, info.name), **info.benchmark_options)
        for info in losses.LOSSES
    }


def torch_peers() -> dict[str, Callable]:
    """Peer callables ``f(logits, targets) -> scalar`` for torch, class dim 1."""
    return _peers("torch")


def torch_candidates() -> dict[str, Callable]:
    """dualloss.torch_impl callables with the same settings and calling convention as the peers
    (class axis: the backend's default)."""
    from dualloss import torch_impl

    return _candidates(torch_impl)


def jax_peers() -> dict[str, Callable]:
    """Peer callables ``f(logits, targets) -> scalar`` for JAX, class axis -1 (not jitted)."""
    return _peers("jax")


def jax_candidates() -> dict[str, Callable]:
    """dualloss.jax_impl callables with the same settings and calling convention as the peers
    (class axis: the backend's default)."""
    from dualloss import jax_impl

    return _candidates(jax_impl)
