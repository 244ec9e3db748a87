"""spec, torch_impl and jax_impl export the same four losses with the same keyword arguments."""

from __future__ import annotations

import importlib
import inspect

import pytest

CANONICAL = [
    "softmax_cross_entropy",
    "softmax_focal_loss",
    "sigmoid_cross_entropy",
    "sigmoid_focal_loss",
]
# the class axis default is the one intended difference: torch layout (N, C, ...)
AXIS_DEFAULT = {"spec": -1, "jax_impl": -1, "torch_impl": 1}


def _keyword_only(module_name, name):
    module = importlib.import_module(f"dualloss.{module_name}")
    assert name in getattr(module, "__all__", dir(module)), f"{module_name} does not export {name}"
    parameters = inspect.signature(getattr(module, name)).parameters.values()
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY}
    return positional, keywords


@pytest.mark.parametrize("module_name", ["torch_impl", "jax_impl"])
@pytest.mark.parametrize("name", CANONICAL)
def test_backends_mirror_the_spec_signature(name, module_name):
    spec_positional, spec_keywords = _keyword_only("spec", name)
    positional, keywords = _keyword_only(module_name, name)
    assert positional == spec_positional == ["logits", "targets"]
    assert list(keywords) == list(spec_keywords), f"{module_name}.{name} keyword arguments"
    for keyword, default in spec_keywords.items():
        if keyword == "axis":
            assert keywords["axis"] == AXIS_DEFAULT[module_name]
            assert default == AXIS_DEFAULT["spec"]
        else:
            assert keywords[keyword] == default, f"{module_name}.{name}({keyword}=...)"


@pytest.mark.parametrize("module_name", ["spec", "torch_impl", "jax_impl"])
def test_every_module_exports_the_four_canonical_losses(module_name):
    module = importlib.import_module(f"dualloss.{module_name}")
    exported = set(getattr(module, "__all__", ()))
    assert set(CANONICAL) <= exported


def test_gradient_functions_are_spec_only():
    jax_impl = importlib.import_module("dualloss.jax_impl")
    assert not [name for name in jax_impl.__all__ if name.endswith("_grad")]
