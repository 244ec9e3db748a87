"""The parity oracle: judges any loss implementation against the float64 spec.

Importing it imports neither torch nor jax.

* ``check(candidate, reference, *, backend, options=None, dtypes=None, max_examples=None, ...)``:
  judge your own loss (feature probes, adversarial cases, then Hypothesis) under the practical
  standard; returns a ``CheckReport`` with ``.ok``; ``report.assert_ok()`` (or
  ``assert_passes(candidate, reference, ...)``) fails a test with the whole report.
* ``check(..., mesh=, axis_name=)`` (JAX) / ``check(..., process_group=)`` (torch, on every rank):
  a vocab-parallel loss, called through ``shard_classes`` on the global cases.
* ``judge`` / ``assert_matches_spec``: one call, one verdict (``tolerance.py`` has the derivation).
* ``dualloss-parity run|check`` (or ``python -m dualloss.parity``): the command line.
"""

from __future__ import annotations

# imported eagerly: a lazy ``from .check import check`` would let the submodule replace the
# function as the package attribute after the first call (hence the module's name, _check)
from ._check import CheckReport, assert_passes, check
from .sharded import shard_classes
from .tolerance import Judgement, assert_matches_spec, judge

__all__ = [
    "CheckReport",
    "Judgement",
    "assert_matches_spec",
    "assert_passes",
    "check",
    "judge",
    "shard_classes",
]
