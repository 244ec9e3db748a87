"""Shared pytest setup: the two test profiles, the hypothesis profiles, the `device` parameter,
and the `tests` directory on sys.path.

Two profiles (README, "Set-up"):

* default (``python -m pytest``, what CI runs): every test, but the big matrices as a bounded,
  deterministic, representative subset. A test marked ``@pytest.mark.exhaustive`` runs the
  parameter sets of a covering subset (``_covering``): every pair of values of any two of its
  parameters (all-pairs; ``strength=1``: every value of every parameter), and every combination
  of the parameters named in ``cover=``. A test marked ``@pytest.mark.on_demand(reason)``
  repeats a check the default run already makes elsewhere (the reason says where) and is left
  out. Hypothesis runs the "ci" profile.
* full (``python -m pytest --full``, or ``DUALLOSS_FULL_TESTS=1``): every parameter set of every
  test, and Hypothesis at the "full" profile's example count.

Left-out tests are reported as deselected, never as skipped or passed.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# tests/strategies.py and tests/mp_oracle.py are imported as plain modules
sys.path.insert(0, os.path.dirname(__file__))

# Deterministic: the same examples on every run, so CI failures reproduce.
_DETERMINISTIC = dict(
    derandomize=True, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", max_examples=20, **_DETERMINISTIC)
settings.register_profile("full", max_examples=40, **_DETERMINISTIC)
# Local bug hunting: HYPOTHESIS_PROFILE=dev python -m pytest tests/test_spec_properties.py
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="run the exhaustive matrices in full: every parameter set of the tests marked "
        "`exhaustive`, the tests marked `on_demand`, Hypothesis at its full example count "
        "(also DUALLOSS_FULL_TESTS=1)",
    )


def full_profile(config) -> bool:
    return bool(config.getoption("--full")) or os.environ.get("DUALLOSS_FULL_TESTS") == "1"


@pytest.fixture(scope="session")
def full_tests(request) -> bool:
    """True under ``--full``: for a test whose matrix is not a parametrization (a subprocess's
    runs) to choose its own full set."""
    return full_profile(request.config)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "exhaustive(strength=2, cover=()): a parameter matrix; the default run keeps a covering "
        "subset (every combination of the values of any `strength` parameters, and of the "
        "parameters named in `cover`), --full runs all of it",
    )
    config.addinivalue_line(
        "markers",
        "on_demand(reason): repeats what the default run checks elsewhere (the reason says "
        "where); runs only under --full",
    )
    if "HYPOTHESIS_PROFILE" not in os.environ and full_profile(config):
        settings.load_profile("full")


def pytest_generate_tests(metafunc):
    """`device`: every device a test may run on, CPU here and every GPU where present
    (``dualloss.parity.devices.test_devices``; JAX is started before torch)."""
    if "device" in metafunc.fixturenames:
        from dualloss.parity import devices

        metafunc.parametrize("device", devices.test_devices())


# ----------------------------------------------------------------------------------------------
# The default profile's subset
# ----------------------------------------------------------------------------------------------


def _value_key(value):
    """A parameter value as a set member: itself if hashable, else its identity (parametrize
    hands the same object to every parameter set of a matrix)."""
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return ("value", type(value).__name__, value)


def _units(item, strength, cover):
    """What one parameter set covers: the values of each `strength` of its parameters together
    (1: each value, 2: each pair of values of two parameters), and the values of the parameters
    named in `cover` together."""
    params = {name: _value_key(value) for name, value in item.callspec.params.items()}
    names = sorted(params)
    units = {
        tuple((name, params[name]) for name in group)
        for group in itertools.combinations(names, min(strength, len(names)))
    }
    named = [name for name in cover if name in params]
    if named:
        units.add(tuple((name, params[name]) for name in named))
    return units


def _covering(items, strength, cover):
    """A deterministic covering subset of one test's parameter sets, chosen greedily: each step
    takes the set that covers the most units not yet covered, preferring sets not marked `slow`
    (the quick loop's), then the values chosen least so far (so that a dtype left over is spread
    over the rest, not always the first), then the earliest collected. Same collection, same
    subset."""
    units = [_units(item, strength, cover) for item in items]
    values = [_units(item, 1, ()) for item in items]
    missing = set().union(*units)
    used: dict = {}
    chosen = []
    while missing:
        best = max(
            range(len(items)),
            key=lambda i: (
                len(units[i] & missing),
                items[i].get_closest_marker("slow") is None,
                -sum(used.get(value, 0) for value in values[i]),
                -i,
            ),
        )
        chosen.append(best)
        missing -= units[best]
        for value in values[best]:
            used[value] = used.get(value, 0) + 1
    return {items[i].nodeid for i in chosen}


def _named_on_the_command_line(config):
    """Node ids given with their parameters on the command line: these always run."""
    named = set()
    for arg in config.args:
        if "::" in arg and "[" in arg:
            path, rest = arg.split("::", 1)
            path = os.path.relpath(os.path.abspath(path), config.rootpath).replace(os.sep, "/")
            named.add(f"{path}::{rest}")
    return named


def pytest_collection_modifyitems(config, items):
    if full_profile(config):
        return
    named = _named_on_the_command_line(config)
    matrices: dict[str, list] = {}
    for item in items:
        if item.get_closest_marker("exhaustive") is not None and hasattr(item, "callspec"):
            matrices.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    keep = set()
    for group in matrices.values():
        marker = group[0].get_closest_marker("exhaustive")
        strength = marker.kwargs.get("strength", 2)
        keep |= _covering(group, strength, tuple(marker.kwargs.get("cover", ())))
    selected, deselected = [], []
    for item in items:
        if item.nodeid in named:
            selected.append(item)
        elif item.get_closest_marker("on_demand") is not None:
            deselected.append(item)
        elif item.nodeid.split("[", 1)[0] in matrices and item.nodeid not in keep:
            deselected.append(item)
        else:
            selected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
        config._dualloss_on_demand = len(deselected)
        if hasattr(config, "workeroutput"):
            # a pytest-xdist worker (`-n 2`): the controller prints the summary line
            config.workeroutput["dualloss_on_demand"] = len(deselected)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: every worker collects (and leaves out) the same tests."""
    left_out = getattr(node, "workeroutput", {}).get("dualloss_on_demand", 0)
    node.config._dualloss_on_demand = max(getattr(node.config, "_dualloss_on_demand", 0), left_out)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left_out = getattr(config, "_dualloss_on_demand", 0)
    if left_out:
        terminalreporter.write_line(
            f"default profile: {left_out} parameter sets of the exhaustive matrices and on-demand "
            "tests left out (deselected); `python -m pytest --full` runs them"
        )
