"""The README's training example states facts; a shortened run of it checks them.

The README's table (``python -m examples.focal_digits --update-docs``, 2000 steps) says that in
float16 the two hand-written focal losses drive the weights to NaN within a few hundred steps and
dualloss does not, and that ``dualloss.parity.check`` flags both hand-written losses before any
training. Here: 600 steps in float16 (the same seed, weights and batch order, so the first 600
steps are the README run's first 600), in torch and in JAX, and the oracle on both losses.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

for _module in ("torch", "jax", "optax", "sklearn", "tqdm"):
    pytest.importorskip(_module)

from examples import common, train_jax, train_torch  # noqa: E402

STEPS = 600
SCRIPTS = {"torch": train_torch, "jax": train_jax}
NAIVE = ("classic", "textbook")


def _readme_float16_claims() -> dict[tuple[str, str], int | None]:
    """(framework, loss) -> the step at which the README says the float16 run died (None:
    finite), read from the README's table."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    header = re.search(r"^\| framework \| loss \|(.*)\|$", text, re.M)
    assert header, "README.md has no table with a 'framework | loss | <dtypes>' header"
    dtypes = [c.strip() for c in header.group(1).split("|")]
    column = dtypes.index("float16")
    labels = {label: key for key, label, _ in common.LOSSES}
    claims = {}
    for framework, label, cells in re.findall(r"^\| (torch|jax) \| ([^|]+) \|(.*)\|$", text, re.M):
        cell = cells.split("|")[column]
        died = re.search(r"NaN at step (\d+)", cell)
        claims[(framework, labels[label.strip()])] = int(died.group(1)) if died else None
    return claims


@pytest.fixture(scope="module")
def claims():
    return _readme_float16_claims()


def test_readme_table_says_naive_losses_die_in_float16_and_dualloss_does_not(claims):
    for framework in SCRIPTS:
        for loss in NAIVE:
            step = claims[(framework, loss)]
            assert step is not None and step <= STEPS, (
                f"README: {framework} {loss} float16 should die within {STEPS} steps; "
                f"it says {step} [rerun python -m examples.focal_digits --update-docs]"
            )
        assert claims[(framework, "dualloss")] is None


@pytest.mark.parametrize("framework", list(SCRIPTS))
def test_float16_training_naive_losses_go_non_finite_and_dualloss_does_not(framework, claims):
    runs = {r.loss: r for r in SCRIPTS[framework].train_all(STEPS, ("float16",), progress=False)}
    for loss in NAIVE:
        run = runs[loss]
        assert run.died_at is not None, (
            f"{framework} {loss} float16 stayed finite for {STEPS} steps; README says NaN at "
            f"step {claims[(framework, loss)]}"
        )
        assert run.test_accuracy is None  # dead: non-finite outputs
    run = runs["dualloss"]
    assert run.died_at is None, (
        f"{framework} dualloss float16: non-finite {run.died_in} after step {run.died_at}"
    )
    assert all(map(_finite, run.losses + run.grad_norms))
    assert run.test_accuracy > 0.9, (
        f"{framework} dualloss float16: test accuracy {run.test_accuracy}"
    )


# JAX: ~10 s (a compilation per input shape)
@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=pytest.mark.slow)])
def test_oracle_flags_the_hand_written_losses_with_a_reproducer(framework, capsys):
    verdicts = SCRIPTS[framework].oracle()
    assert {v.loss for v in verdicts} == set(NAIVE)
    for verdict in verdicts:
        assert not verdict.ok, f"oracle passed {framework} {verdict.loss}"
        line = verdict.reproducer
        assert line and "\n" not in line, line
        capsys.readouterr()
        exec(compile(line, "<reproducer>", "exec"), {})  # one line that shows the NaN
        printed = capsys.readouterr().out
        assert "nan" in printed.lower(), f"{framework} {verdict.loss}: {line} printed {printed}"


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def test_focal_digits_writes_its_figure_to_the_output_directory_not_to_docs(tmp_path, monkeypatch):
    # `python -m examples.focal_digits` must not rewrite the tracked docs/training-digits.png
    # unless asked (--update-docs); the training and the oracle are stubbed: only where the
    # figure goes is tested here
    from examples import focal_digits

    def fake_runs(steps, dtypes):
        return [
            common.Run(framework, loss, dtype, steps, losses=[1.0, 0.5], grad_norms=[1.0, 1.0],
                       train_accuracy=0.5, test_accuracy=0.5)
            for framework in ("torch", "jax") for loss, _, _ in common.LOSSES for dtype in dtypes
        ]  # fmt: skip

    monkeypatch.setattr(
        train_torch, "train_all", lambda steps, dtypes: fake_runs(steps, dtypes)[:3]
    )
    monkeypatch.setattr(train_jax, "train_all", lambda steps, dtypes: fake_runs(steps, dtypes)[3:])
    monkeypatch.setattr(train_torch, "oracle", lambda full=False: [])
    monkeypatch.setattr(train_jax, "oracle", lambda full=False: [])
    docs_figure = os.path.join(ROOT, focal_digits.FIGURE)
    before = os.stat(docs_figure).st_mtime_ns
    monkeypatch.chdir(tmp_path)  # a relative docs/training-digits.png would land here
    focal_digits.main(["--steps", "2", "--dtypes", "float32", "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "training-digits.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "docs").exists()
    assert os.stat(docs_figure).st_mtime_ns == before
    assert focal_digits.figure_path("elsewhere", update_docs=True) == focal_digits.FIGURE
