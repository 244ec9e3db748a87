"""The parity oracle: judges any loss implementation against the float64 spec.

Importing it imports neither torch nor jax.

* ``check(candidate, reference, *, backend, options=None, dtypes=None, max_examples=None)``:
  judge your own loss (adversarial cases, then Hypothesis); returns a report with ``.ok``.
* ``judge`` / ``assert_matches_spec``: one call, one verdict (``tolerance.py`` has the derivation).
* ``dualloss-parity run|check`` (or ``python -m dualloss.parity``): the command line.
"""

from __future__ import annotations

from typing import Any

from .tolerance import Judgement, assert_matches_spec, judge

__all__ = ["CheckReport", "Judgement", "assert_matches_spec", "check", "judge"]


def check(candidate: Any, reference: str, **kwargs: Any):
    """Judges `candidate` against ``dualloss.spec.<reference>``; see ``parity.check.check``."""
    from .check import check as _check

    return _check(candidate, reference, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "CheckReport":
        from .check import CheckReport

        return CheckReport
    raise AttributeError(name)
