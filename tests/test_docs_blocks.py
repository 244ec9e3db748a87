"""Every ```python block of README.md and docs/*.md runs as written, on its own: a reader who
pastes one into a fresh interpreter gets no NameError or ImportError.

Each block runs in a fresh namespace, compiled with the Markdown file's line numbers, so a
traceback points at the line of the document. A block too long for CI (a full training or
benchmark run) is marked in the Markdown, just before its fence, with

    <!-- docs-test: skip, the reason -->

and reported as skipped with that reason; keep such blocks very few.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"^\s*<!--\s*docs-test:\s*skip\s*,\s*(?P<reason>.+?)\s*-->\s*$")
FENCE = re.compile(r"^```python[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)


def python_blocks(path: pathlib.Path) -> list[tuple[int, str, str | None]]:
    """(line of the opening fence, code, skip reason or None) of each ```python block."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]  # the line above
        marker = SKIP.match(before)
        blocks.append((line, match.group("code"), marker.group("reason") if marker else None))
    return blocks


BLOCKS = [
    pytest.param(path, line, code, reason, id=f"{path.relative_to(ROOT)}:{line}")
    for path in DOCUMENTS
    for line, code, reason in python_blocks(path)
]


def test_every_python_fence_is_found():
    # a fence the pattern missed would be a block that silently never runs
    for path in DOCUMENTS:
        fences = len(re.findall(r"^```python", path.read_text(encoding="utf-8"), re.M))
        assert len(python_blocks(path)) == fences, path
    assert len(BLOCKS) >= 7


def test_skip_marker_is_read_with_its_reason(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip, trains for 90 s -->\n"
        "```python\ny = 2\n```\n"
    )
    assert python_blocks(doc) == [(3, "x = 1\n", None), (8, "y = 2\n", "trains for 90 s")]


@pytest.mark.parametrize(("path", "line", "code", "reason"), BLOCKS)
def test_python_block_runs_as_written(path, line, code, reason, monkeypatch, tmp_path):
    if reason is not None:
        pytest.skip(f"marked in {path.name}: {reason}")
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    # the fence's line + 1 is the code's first line: pad so that tracebacks give the doc's lines
    source = "\n" * line + code
    namespace = {"__name__": "__docs__"}
    exec(compile(source, f"{path.relative_to(ROOT)}", "exec"), namespace)
