"""The two test profiles of tests/conftest.py: the default run's covering subsets of the
`exhaustive` matrices, `on_demand` tests left out, and `--full` / DUALLOSS_FULL_TESTS=1 running
everything."""

from __future__ import annotations

import itertools
import os
import pathlib
import shutil
import subprocess
import sys

import conftest
import pytest

HERE = pathlib.Path(__file__).resolve().parent


class _Item:
    """What `_covering` reads of a pytest item."""

    def __init__(self, index, params, slow=False):
        self.nodeid = f"t.py::test[{index}]"
        self.callspec = type("CallSpec", (), {"params": params})()
        self._slow = slow

    def get_closest_marker(self, name):
        return object() if name == "slow" and self._slow else None


def _matrix(**values):
    names = list(values)
    return [
        _Item(i, dict(zip(names, combination)))
        for i, combination in enumerate(itertools.product(*values.values()))
    ]


def _chosen(items, strength=2, cover=()):
    kept = conftest._covering(items, strength, cover)
    return [item.callspec.params for item in items if item.nodeid in kept]


def test_default_subset_holds_every_pair_of_values_and_is_smaller():
    items = _matrix(dtype=["f64", "f32", "f16", "bf16"], region=list("abcdef"), red=["m", "n"])
    chosen = _chosen(items)
    assert len(chosen) < len(items)
    for first, second in itertools.combinations(["dtype", "region", "red"], 2):
        every = {(i.callspec.params[first], i.callspec.params[second]) for i in items}
        assert {(p[first], p[second]) for p in chosen} == every


def test_strength_one_holds_every_value_and_cover_every_combination_of_its_names():
    items = _matrix(backend=["torch", "jax"], loss=list("wxyz"), dtype=["f64", "bf16"])
    once = _chosen(items, strength=1)
    assert len(once) == 4
    assert {p["loss"] for p in once} == set("wxyz")
    assert {p["dtype"] for p in once} == {"f64", "bf16"}
    covered = _chosen(items, strength=1, cover=("backend", "loss"))
    assert len(covered) == 8 and len({(p["backend"], p["loss"]) for p in covered}) == 8


def test_subset_is_deterministic_and_prefers_the_quick_loop():
    items = _matrix(dtype=["f64", "f32"], region=list("abc"))
    for item in items:
        item._slow = item.callspec.params["dtype"] != "f32"
    first = conftest._covering(items, 1, ())
    assert first == conftest._covering(items, 1, ())
    chosen = [i.callspec.params for i in items if i.nodeid in first]
    assert sum(p["dtype"] == "f32" for p in chosen) == 2 and len(chosen) == 3


def test_unhashable_values_count_by_identity():
    options = [{"a": 1}, {"b": 2}, {"a": 1}]
    items = _matrix(options=options, dtype=["x", "y", "z"])
    assert {id(p["options"]) for p in _chosen(items, strength=1)} == {id(o) for o in options}


SAMPLE = """
import pytest

@pytest.mark.exhaustive
@pytest.mark.parametrize("a", [1, 2, 3])
@pytest.mark.parametrize("b", [1, 2, 3])
@pytest.mark.parametrize("c", [1, 2, 3])
def test_matrix(a, b, c):
    pass

@pytest.mark.on_demand("test_plain repeats it")
def test_repeat():
    pass

def test_plain():
    pass
"""


@pytest.mark.slow
def test_default_profile_deselects_and_full_collects_everything(tmp_path):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(SAMPLE)

    def collect(*args, **env):
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             "-p", "no:dualloss", *args],
            cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, **env),
            timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        return [line for line in out.stdout.splitlines() if "::" in line], out.stdout

    default, text = collect()
    matrix = [node for node in default if "test_matrix" in node]
    assert 9 <= len(matrix) < 27 and default[-1] == "test_sample.py::test_plain"
    assert "test_sample.py::test_repeat" not in default
    assert f"{27 - len(matrix) + 1} deselected" in text and "--full" in text
    assert len(collect("--full")[0]) == 27 + 2
    assert len(collect(DUALLOSS_FULL_TESTS="1")[0]) == 27 + 2
    # a parameter set named on the command line runs, chosen or not
    named = [n for n in (f"test_sample.py::test_matrix[{i}-{i}-1]" for i in (1, 2, 3))]
    assert len(collect(*named)[0]) == 3
