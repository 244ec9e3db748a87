"""The package layout (docs/design.md, "Layout"): every documented name imports from its documented
path, and no dualloss module imports, directly or through others, a module that imports it back."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

import dualloss

ROOT = pathlib.Path(dualloss.__file__).parent
REPO = ROOT.parent

# ----------------------------------------------------------------------------------------------
# Public import paths (README.md's API table and examples, docs/design.md's "Public API")
# ----------------------------------------------------------------------------------------------

LOSSES = (
    "softmax_cross_entropy",
    "softmax_focal_loss",
    "sigmoid_cross_entropy",
    "sigmoid_focal_loss",
    "linear_softmax_cross_entropy",
    "linear_softmax_focal_loss",
)
DOCUMENTED = {
    "dualloss.spec": (
        *LOSSES,
        *(f"{name}_grad" for name in LOSSES),
        *(f"{name}_intermediates" for name in LOSSES[:4]),
        "SoftmaxTerms",
        "SoftmaxIntermediates",
        "SigmoidFocalTerms",
        "SigmoidIntermediates",
    ),
    "dualloss.torch_impl": (
        *LOSSES,
        "cross_entropy",
        "linear_cross_entropy",
        "binary_cross_entropy_with_logits",
        "CrossEntropyLoss",
        "BCEWithLogitsLoss",
        "FocalLoss",
        "SigmoidFocalLoss",
        "set_validate_indices",
        "kernels",
        "global_count",
    ),
    "dualloss.jax_impl": (
        *LOSSES,
        "softmax_cross_entropy_with_integer_labels",
        "sigmoid_binary_cross_entropy",
        "global_count",
    ),
    "dualloss.optax": (
        "softmax_cross_entropy_with_integer_labels",
        "softmax_cross_entropy",
        "sigmoid_binary_cross_entropy",
        "sigmoid_focal_loss",
    ),
}


@pytest.mark.parametrize("path", sorted(DOCUMENTED))
def test_every_documented_name_imports_from_its_documented_path(path):
    names = DOCUMENTED[path]
    namespace = {}
    exec(f"from {path} import {', '.join(names)}", namespace)  # the `from X import Y` users write
    module = importlib.import_module(path)
    assert list(module.__all__) == list(dict.fromkeys(module.__all__)), "duplicates in __all__"
    assert set(names) == set(module.__all__), f"{path}.__all__ differs from the documented names"
    assert all(callable(namespace[name]) for name in names)


def test_the_jax_drop_ins_are_the_optax_functions():
    from dualloss import jax_impl, optax

    for name in ("softmax_cross_entropy_with_integer_labels", "sigmoid_binary_cross_entropy"):
        assert getattr(jax_impl, name) is getattr(optax, name), name


# `torch_impl.softmax_focal_loss`, `dualloss.optax.sigmoid_focal_loss`, ... in README.md and docs/
# (`optax.X` without `dualloss.` is optax's own; `jax_impl.py` and the like are old file names)
MENTION = re.compile(r"\b(?:dualloss\.(optax)|(?:dualloss\.)?(spec|torch_impl|jax_impl))\.(\w+)\b")


def test_every_name_the_docs_mention_resolves():
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    missing, seen = [], 0
    for path in files:
        for optax, backend, name in MENTION.findall(path.read_text()):
            if name == "py":
                continue
            seen += 1
            if not hasattr(importlib.import_module(f"dualloss.{optax or backend}"), name):
                missing.append(f"{path.name}: {optax or backend}.{name}")
    assert not missing, missing
    assert seen > 20  # the pattern finds the mentions


# ----------------------------------------------------------------------------------------------
# No import circles
# ----------------------------------------------------------------------------------------------

# circles tolerated for now, each a set of module names (none: the parity oracle's `_check` <->
# `linear` circle went with parity/findings.py, issue 25); the test fails when one listed is gone
KNOWN_IMPORT_CYCLES: set[frozenset[str]] = set()


def _module_name(path):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(path): path for path in ROOT.rglob("*.py")}


def _imports(name, path, modules):
    """The dualloss modules `name` imports, at module top level and inside functions alike."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:  # relative: `from . import x`, `from ..y import z`
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            # `from X import y`: the module X.y where y is one, else the module X (but not a
            # package the importing module is in: Python has imported that one first)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            if not (name == base or name.startswith(f"{base}.")):
                targets.append(base)
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def _import_graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.add(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return set(found)


def test_the_import_graph_sees_the_imports_it_must():
    # planted: the graph must see a function-level import and a relative import two levels up
    graph = _import_graph()
    assert "dualloss._checks" in graph["dualloss.torch_impl._inputs"]
    assert "dualloss.jax_impl.softmax" in graph["dualloss.optax"]
    assert "dualloss.jax_impl" in graph["dualloss.optax"]
    assert {"dualloss.parity._check", "dualloss.parity.linear"} <= set(graph)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}


def test_no_import_cycles_among_dualloss_modules():
    cycles = _cycles(_import_graph())
    unexpected = [sorted(c) for c in cycles - KNOWN_IMPORT_CYCLES]
    assert not unexpected, f"import circles: {unexpected}"
    gone = [sorted(c) for c in KNOWN_IMPORT_CYCLES - cycles]
    assert not gone, f"remove from KNOWN_IMPORT_CYCLES, no longer circles: {gone}"


@pytest.mark.parametrize("backend", ["spec", "torch_impl", "jax_impl"])
def test_no_backend_module_imports_a_layer_above_it(backend):
    # the optax drop-ins, the registry and the oracle sit above the backends
    above = ("dualloss.optax", "dualloss.losses", "dualloss.parity")
    graph = _import_graph()
    for name, imported in graph.items():
        if name == f"dualloss.{backend}" or name.startswith(f"dualloss.{backend}."):
            bad = [m for m in imported if m.startswith(above)]
            assert not bad, f"{name} imports {bad}"


def test_every_mutation_finds_its_snippet_once_in_its_module(monkeypatch):
    # dev/mutate.py plants each bug by replacing a snippet of dualloss/<backend>/<module>.py
    monkeypatch.syspath_prepend(str(REPO))
    mutate = importlib.import_module("dev.mutate")
    stale = [
        f"{i}: {m.module} {m.what}" for i, m in enumerate(mutate.MUTATIONS) if mutate.is_stale(m)
    ]
    assert not stale, stale
    assert len({m.module for m in mutate.MUTATIONS}) > 4  # the rows name modules, not packages
