"""Promises about the project itself: opt-in backends, and CI running the README's commands."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
    spec = importlib.util.spec_from_file_location(
        "readme_commands", ROOT / ".ci" / "readme_commands.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.readme_commands(ROOT / "README.md")


def test_readme_has_exactly_two_setup_commands():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in command for command in commands), commands
    assert any("dualloss-parity run" in command for command in commands)
    assert any("pytest" in command for command in commands)


def test_ci_runs_the_readme_commands_verbatim():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 .ci/readme_commands.py" in ci and 'bash -c "$command"' in ci


@pytest.mark.slow
@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("false && echo ran-$((40 + 2))", "echo second", 1),
        ("echo first", "true && false", 1),
        ("echo first", "echo second", 0),
    ],
)
def test_ci_fails_when_any_part_of_a_readme_command_fails(tmp_path, first, second, expected):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n## Set-up\n\n```bash\n{first}\n```\n\n```bash\n{second}\n```\n")
    # its own TMPDIR: CI's virtual environment (the one running this test) must stay untouched
    env = dict(os.environ, DUALLOSS_CI_README=str(readme), TMPDIR=str(tmp_path))
    out = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == expected, out.stdout + out.stderr
    assert "ran-42" not in out.stdout
    if expected:
        assert "CI: the README command failed" in out.stderr


@pytest.mark.slow
def test_importing_dualloss_imports_neither_torch_nor_jax():
    code = (
        "import sys, dualloss, dualloss.spec, dualloss.parity; "
        "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
