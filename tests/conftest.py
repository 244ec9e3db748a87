"""Shared pytest setup: the hypothesis profiles and the `tests` directory on sys.path."""

from __future__ import annotations

import os
import sys

from hypothesis import HealthCheck, settings

# tests/strategies.py and tests/mp_oracle.py are imported as plain modules
sys.path.insert(0, os.path.dirname(__file__))

# Deterministic and short: the same examples on every run, so CI failures reproduce.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# Local bug hunting: HYPOTHESIS_PROFILE=dev python -m pytest tests/test_spec_properties.py
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_generate_tests(metafunc):
    """`device`: every device a test may run on, CPU here and every GPU where present
    (``dualloss.parity.devices.test_devices``; JAX is started before torch)."""
    if "device" in metafunc.fixturenames:
        from dualloss.parity import devices

        metafunc.parametrize("device", devices.test_devices())
