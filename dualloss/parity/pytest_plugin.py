"""pytest plugin (entry point ``pytest11: dualloss``): the ``loss_oracle`` fixture.

def test_my_focal_loss(loss_oracle):
    report = loss_oracle(my_focal_loss, "softmax_focal_loss", backend="torch",
                         options={"gamma": 0.5})
    report.assert_ok()

``report.assert_ok()`` fails the test with the whole report, every reproducer; ``assert
report.ok, report`` would show pytest's repr of the report object, cut to 240 characters.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def loss_oracle():
    """``dualloss.parity.check``: judges a loss function against the float64 spec."""
    from ._check import check

    return check
