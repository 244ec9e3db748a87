"""Promises about the project itself: opt-in backends, and CI running the README's commands."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ci_module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / ".ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _readme_commands():
    return _ci_module("readme_commands").readme_commands(ROOT / "README.md")


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


# pip 23's output for `pip install -e '.[torch,jax,reprot]'` on this project's machines: the
# misspelt extra is one warning among harmless ones, and the install exits 0
PIP_OUTPUT = """\
Looking in links: /opt/wheels
WARNING: Location 'file:///opt/wheels' is ignored: it is either a non-existing path or lacks a specific scheme.
Obtaining file:///work/dualloss
  Installing build dependencies ... done
WARNING: dualloss 0.1.0 does not provide the extra 'reprot'
Successfully installed dualloss-0.1.0
"""  # noqa: E501


def test_ci_finds_pip_warning_about_an_extra_that_does_not_exist():
    unknown_extras = _ci_module("unknown_extras").unknown_extras
    assert unknown_extras(PIP_OUTPUT) == [
        "WARNING: dualloss 0.1.0 does not provide the extra 'reprot'"
    ]
    harmless = PIP_OUTPUT.replace("does not provide the extra 'reprot'", "is installed")
    assert unknown_extras(harmless) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("warning", "expected"),
    [
        ("WARNING: dualloss 0.1.0 does not provide the extra 'reprot'", 1),
        ("WARNING: Location 'file:///opt/wheels' is ignored: it is either a non-existing path", 0),
    ],
)
def test_ci_fails_when_pip_warns_that_an_extra_does_not_exist(tmp_path, warning, expected):
    # the command exits 0, as pip does after the warning; CI must fail on the warning alone
    readme = tmp_path / "README.md"
    first, second = f'echo "{warning}" >&2 && echo installed-$((1 + 1))', "echo ran-$((40 + 2))"
    readme.write_text(f"# x\n\n## Set-up\n\n```bash\n{first}\n```\n\n```bash\n{second}\n```\n")
    env = dict(os.environ, DUALLOSS_CI_README=str(readme), TMPDIR=str(tmp_path))
    out = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == expected, out.stdout + out.stderr
    assert "installed-2" in out.stdout  # the command's output is still shown
    assert ("ran-42" in out.stdout) == (not expected)  # CI stops at the failing command
    if expected:
        assert "an extra that does not exist" in out.stderr and "reprot" in out.stderr


@pytest.mark.slow
def test_importing_dualloss_imports_neither_torch_nor_jax():
    code = (
        "import sys, dualloss, dualloss.spec, dualloss.parity; "
        "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.slow
def test_the_spec_gradient_accuracy_matrices_have_no_parameter_set_that_always_skips():
    # a parameter set that skips whatever the code does is a test that cannot fail (issue 31):
    # impossible combinations (a gradient w.r.t. alpha=None, w.r.t. class-index targets) are
    # left out of the matrices, not skipped at run time
    tests = "sigmoid_focal_loss_input_grads or reduced_input_grads"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         str(ROOT / "tests" / "test_spec_grad_accuracy.py"), "-k", tests],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert " passed" in out.stdout and "skipped" not in out.stdout, out.stdout[-3000:]
