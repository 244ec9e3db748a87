"""The parity oracle: judges any loss implementation against the float64 spec.

Importing it imports neither torch nor jax.
"""

from .tolerance import Judgement, assert_matches_spec, judge

__all__ = ["Judgement", "assert_matches_spec", "judge"]
