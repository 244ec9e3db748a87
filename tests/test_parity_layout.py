"""The oracle's and the benchmarks' layout holds (issue 25): no import circles among their modules,
loss names spelled in code only where they must be, no dispatch on a name's text, and a loss
looked up in the registry once per ``parity.check``.

The source tests read the files (``ast``), so that a regression names the file and the line.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from dualloss import losses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the packages whose modules may not import each other in a circle (the other modules of
# dualloss have their own test)
PACKAGES = ("dualloss/parity", "benchmarks")
# the library: every module of dualloss and the benchmarks (not the tests)
LIBRARY = ("dualloss", "benchmarks")
REGISTRY = os.path.join("dualloss", "losses.py")
# the most library files outside the registry that may spell a loss name in code (issue 25)
MOST_FILES_SPELLING_NAMES = 4


def _modules(folders) -> dict[str, str]:
    """module name -> path, for every .py file under `folders` (relative to the root)."""
    out = {}
    for folder in folders:
        for where, _, files in os.walk(os.path.join(ROOT, folder)):
            for file in sorted(files):
                if file.endswith(".py"):
                    path = os.path.join(where, file)
                    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    out[".".join(parts)] = path
    return out


def _imports(module: str, path: str, known) -> set[str]:
    """The modules of `known` that `module` imports, at its top or inside a function."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from package import submodule` imports the submodule
            subs = {f"{base}.{alias.name}" for alias in node.names} & set(known)
            found |= subs or {base}
    return {name for name in found if name in known and name != module}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the list of its modules."""
    circles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return circles


def test_no_import_circles_in_the_oracle_and_the_benchmarks():
    modules = _modules(PACKAGES)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # the package's __init__ imports its submodules; a submodule importing a sibling is no circle
    for name in graph:
        graph[name] -= {p for p in graph if name.startswith(p + ".")}
    assert _circles(graph) == []
    # the report types sit below both producers of reports
    assert "dualloss.parity._check" not in graph["dualloss.parity.linear"]
    assert "dualloss.parity._check" not in graph["dualloss.parity.findings"]
    assert "dualloss.parity.linear" not in graph["dualloss.parity.findings"]


def test_the_circle_test_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c", "a"]]


# ----------------------------------------------------------------------------------------------
# Loss names in code
# ----------------------------------------------------------------------------------------------


def _docstrings(tree) -> set[int]:
    """ids of the docstring constants of `tree`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _exports(tree) -> set[int]:
    """ids of the string constants of `__all__` (an export names a function; it dispatches on
    nothing)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            out |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return out


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string literal in code that is a loss name (docstrings, comments
    and ``__all__`` excluded)."""
    tree = ast.parse(source)
    left_out = _docstrings(tree) | _exports(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and node.value in losses.ALL_NAMES
        and id(node) not in left_out
    )


def test_spelled_names_sees_literals_not_docstrings():
    source = (
        '"""softmax_focal_loss"""\n__all__ = ["softmax_focal_loss"]\n'
        'def f():\n    """sigmoid_focal_loss"""\n    return {"sigmoid_cross_entropy": 1}\n'
    )
    assert spelled_names(source) == [(5, "sigmoid_cross_entropy")]


def test_few_library_files_spell_a_loss_name():
    spelling = {}
    for path in _modules(LIBRARY).values():
        if os.path.relpath(path, ROOT) == REGISTRY:
            continue
        found = spelled_names(open(path).read())
        if found:
            spelling[os.path.relpath(path, ROOT)] = found
    assert len(spelling) <= MOST_FILES_SPELLING_NAMES, spelling
    # the oracle and the benchmarks ask the records
    assert not [p for p in spelling if p.startswith(PACKAGES)], spelling


# a test of a loss name's text: "focal" in name, name.startswith("sigmoid"), name == "<a loss>",
# reference in losses.LINEAR_NAMES (the record says is_focal, is_softmax, is_linear, family)
_WORD = r"(?:softmax|sigmoid|linear|focal|cross_entropy)"
_TEXT_DISPATCH = re.compile(
    rf"[\"'][a-z_]*{_WORD}[a-z_]*[\"']\s+(?:not\s+)?in\b"
    rf"|\.(?:startswith|endswith|removeprefix|removesuffix)\(\s*[\"'][a-z_]*{_WORD}"
    rf"|(?:==|!=)\s*[\"'](?:{'|'.join(losses.ALL_NAMES)})[\"']"
    rf"|[\"'](?:{'|'.join(losses.ALL_NAMES)})[\"']\s*(?:==|!=)"
    r"|(?<!for )\b\w+\s+(?:not\s+)?in\s+(?:\w+\.)*(?:LINEAR_NAMES|ALL_NAMES|NAMES)\b"
)


def test_text_dispatch_pattern_sees_the_usual_forms():
    for line in ('if "focal" in name:', 'if loss.startswith("sigmoid"):',
                 "if reference in losses.LINEAR_NAMES:", 'if name == "softmax_focal_loss":',
                 "linear = [n for n in names if n not in _registry.LINEAR_NAMES]"):  # fmt: skip
        assert _TEXT_DISPATCH.search(line), line
    for line in ("if info.is_focal:", "if option.name == name:", 'if name == "targets":',
                 'r.region.startswith("confident")', "for name in losses.NAMES:"):  # fmt: skip
        assert not _TEXT_DISPATCH.search(line), line


def test_no_dispatch_on_a_loss_names_text():
    found = []
    for path in _modules(LIBRARY).values():
        source = open(path).read()
        tree = ast.parse(source)
        ids = _docstrings(tree)
        docs = [(n.lineno, n.end_lineno) for n in ast.walk(tree) if id(n) in ids]
        for number, line in enumerate(source.splitlines(), 1):
            if any(a <= number <= b for a, b in docs):
                continue
            if _TEXT_DISPATCH.search(line.split("#")[0]):
                found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert found == []


# ----------------------------------------------------------------------------------------------
# One lookup per check
# ----------------------------------------------------------------------------------------------


def _counting(monkeypatch) -> list:
    """Replaces ``losses.get`` by one that records each lookup of a name (a record passed in is
    returned as it is: no lookup)."""
    names, get = [], losses.get

    def counted(name):
        if not isinstance(name, losses.LossInfo):
            names.append(name)
        return get(name)

    monkeypatch.setattr(losses, "get", counted)
    return names


@pytest.mark.parametrize("reference", ["softmax_focal_loss", "sigmoid_cross_entropy"])
def test_check_looks_the_loss_up_once(monkeypatch, reference):
    pytest.importorskip("torch")
    from dualloss import torch_impl
    from dualloss.parity import check

    fn = getattr(torch_impl, reference)

    def candidate(x, t):
        return fn(x, t)

    names = _counting(monkeypatch)
    report = check(candidate, reference, backend="torch", dtypes="float64", max_examples=3)
    assert report.cases_judged > 0 and report.examples_run > 0
    assert names == [reference]
    str(report)  # the report reads the record it was given
    assert names == [reference]


def test_linear_check_looks_the_loss_up_once(monkeypatch):
    pytest.importorskip("torch")
    from dualloss import torch_impl
    from dualloss.parity import check

    def candidate(hidden, linear_weight, targets):
        return torch_impl.linear_softmax_cross_entropy(hidden, linear_weight, targets)

    names = _counting(monkeypatch)
    report = check(candidate, losses.LINEAR_SOFTMAX_CROSS_ENTROPY.name, backend="torch",
                   dtypes="float64", skip=("huge_norms", "ties", "one_class_dominant"))  # fmt: skip
    assert report.cases_judged > 0
    assert names == [losses.LINEAR_SOFTMAX_CROSS_ENTROPY.name]
    str(report)
    assert names == [losses.LINEAR_SOFTMAX_CROSS_ENTROPY.name]


# ----------------------------------------------------------------------------------------------
# One table of peers
# ----------------------------------------------------------------------------------------------


def test_the_peers_table_and_the_registry_agree():
    from dualloss.parity.peers import PEERS, TABLE, timed

    assert len(PEERS) == len(TABLE)
    for info in losses.RECORDS:
        judged = [p.key for p in TABLE if p.judged and p.loss is info]
        assert judged == list(info.peers), info.name
    for peer in TABLE:
        assert peer.loss in losses.RECORDS and peer.framework in ("torch", "jax")
        assert peer.options <= set(peer.loss.option_names), peer.key
    # the benchmarks time one peer per framework and loss of logits
    for framework in ("torch", "jax"):
        assert list(timed(framework)) == list(losses.NAMES)


def test_the_benchmarks_and_the_parity_run_read_the_one_table():
    from benchmarks import peers as bench
    from dualloss.parity import peers

    for (framework, loss), label in bench.PEER_NAMES.items():
        assert peers.timed(framework)[loss].label == label
    # no second table: the benchmark module defines no peer function of its own
    source = open(os.path.join(ROOT, "benchmarks", "peers.py")).read()
    assert "import kornia" not in source and "import optax" not in source
