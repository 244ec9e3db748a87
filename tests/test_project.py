"""Promises about the project itself: opt-in backends, and CI running the README's commands."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in command for command in commands), commands
    assert any("dualloss-parity run" in command for command in commands)
    assert any("pytest" in command for command in commands)


def test_ci_runs_the_readme_commands_verbatim():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in _readme_commands():
        assert command in ci, f".ci/run does not run the README command {command!r}"


def test_importing_dualloss_imports_neither_torch_nor_jax():
    code = (
        "import sys, dualloss, dualloss.spec, dualloss.parity; "
        "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
