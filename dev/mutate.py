"""Mutation check: plant plausible bugs in the backends, one at a time, and see which tests fail.

    python dev/mutate.py                 # every mutation, the conformance suite in every dtype
    python dev/mutate.py --list          # the mutations (exit status 1 if one is stale)
    python dev/mutate.py --only 3,5      # some of them
    python dev/mutate.py --markdown docs/mutation.md   # write the results table there

Each mutation replaces one exact snippet of ``dualloss/<backend>/<module>.py`` (it must occur
exactly once, else the mutation is reported as stale) in a copy of the repository, then runs the
conformance tests of that backend and loss (``tests/test_conformance.py``, the parity machinery
against the spec) once per dtype, plus the backend's own test file. The fused linear losses have no
conformance tests: for them each dtype runs ``dualloss-parity run`` on that backend and loss
(``parity.linear``'s cases, strict standard). A mutation is *caught* in a dtype when a
test of that dtype fails. A mutation that no test catches in some dtype is a hole in the suite.
The copy is run with ``python -m pytest`` from its own directory, so it imports the mutated
package, never the installed one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Mutation:
    module: str  # the file under dualloss/ that holds `old`, e.g. torch_impl/softmax.py
    loss: str  # the conformance tests to run (a registry name)
    what: str
    old: str
    new: str
    # extra pytest -k expression for the backend's own tests (None: conformance only), and the
    # file they are in (None: tests/test_<backend>_impl.py)
    own_tests: str | None = None
    own_file: str | None = None


MUTATIONS = (
    Mutation(
        "torch_impl/softmax.py", "softmax_focal_loss", "focal backward drops the gamma * phi term",
        "    v = focal_weight * (1.0 - gamma * phi)\n",
        "    v = focal_weight\n",
    ),
    Mutation(
        "jax_impl/softmax.py", "softmax_focal_loss", "focal gradient drops the gamma * phi term",
        "        phi = jnp.where(positive, p_log_p / jnp.where(positive, s_y, 1.0), -1.0)\n"
        "        v = a_y * focal_weight * (1.0 - gamma * phi)\n",
        "        phi = jnp.where(positive, p_log_p / jnp.where(positive, s_y, 1.0), -1.0)\n"
        "        v = a_y * focal_weight\n",
    ),
    Mutation(
        "jax_impl/_inputs.py", "softmax_cross_entropy", "label smoothing spread as eps / (C - 1)",
        "        uniform = jnp.where(valid, 1.0 / jnp.maximum(num_valid, 1), 0.0)\n",
        "        uniform = jnp.where(valid, 1.0 / jnp.maximum(num_valid - 1, 1), 0.0)\n",
    ),
    Mutation(
        "torch_impl/_inputs.py", "softmax_cross_entropy", "label smoothing spread as eps / (C - 1)",
        "            uniform = 1.0 / num_classes\n",
        "            uniform = 1.0 / (num_classes - 1)\n",
    ),
    Mutation(
        "torch_impl/softmax.py", "softmax_focal_loss", "log1p(s) computed as log(1 + s)",
        "        log_p_y = torch.log1p(r / p_y).neg_()\n",
        "        log_p_y = torch.log(1.0 + r / p_y).neg_()\n",
    ),
    Mutation(
        "jax_impl/softmax.py", "softmax_focal_loss", "log1p(s) computed as log(1 + s)",
        "    log1p_s = jnp.log1p(s)\n    has_others",
        "    log1p_s = jnp.log(1.0 + s)\n    has_others",
    ),
    Mutation(
        "jax_impl/softmax.py",
        "softmax_cross_entropy", "the target's e - 1 in s without its derivative",
        "    s = s_y + (e_y - 1.0)\n",
        "    s = s_y + jax.lax.stop_gradient(e_y - 1.0)\n",
        "hessian or check_grads", "tests/test_jax_transforms.py",
    ),
    Mutation(
        "jax_impl/softmax.py",
        "softmax_focal_loss", "focal mean over every row, ignored ones included",
        "        denominator = jnp.sum(keep)\n",
        "        denominator = keep.size\n",
    ),
    Mutation(
        "torch_impl/softmax.py",
        "softmax_focal_loss", "focal mean over every row, ignored ones included",
        "        denominator = keep.sum()\n",
        "        denominator = keep.numel()\n",
    ),
    Mutation(
        "jax_impl/sigmoid.py", "sigmoid_focal_loss", "alpha_t with alpha and 1 - alpha swapped",
        "        alpha_t = alpha * t + (1.0 - alpha) * (1.0 - t)\n    # r = p",
        "        alpha_t = (1.0 - alpha) * t + alpha * (1.0 - t)\n    # r = p",
    ),
    Mutation(
        "torch_impl/sigmoid.py", "sigmoid_cross_entropy", "pos_weight applied to the negative term",
        "    grad = _addcmul(grad, q * t, not_p, -1.0, inplace)\n",
        "    grad = _addcmul(grad, q * (1.0 - t), not_p, -1.0, inplace)\n",
    ),
    Mutation(
        "jax_impl/softmax.py",
        "softmax_cross_entropy", "log1p(s) computed as log(1 + s) (the fast path)",
        "    log1p_s = jnp.log1p(s)\n    return z_top, shifted",
        "    log1p_s = jnp.log(1.0 + s)\n    return z_top, shifted",
    ),
    Mutation(
        "torch_impl/sigmoid.py",
        "sigmoid_cross_entropy", "softplus(x) - t x formed with its cancellation",
        "            loss = _addcmul(x.clamp_min(0.0), t, x, -1.0, inplace)\n"
        "            minus_e = torch.nn.functional.softplus(x.abs(), beta=-1.0, threshold=20.0)\n",
        "            loss = _addcmul(_softplus(x), t, x, -1.0, inplace)\n"
        "            minus_e = torch.zeros_like(x)\n",
    ),
    Mutation(
        "torch_impl/sigmoid.py", "sigmoid_focal_loss", "sigma(x) - t formed with its cancellation",
        "    p_minus_t = _addcmul(not_pt, t, not_p, -2.0, False)\n",
        "    p_minus_t = p - t\n",
    ),
    Mutation(
        "torch_impl/softmax.py",
        "softmax_cross_entropy", "1 - p_y at the top formed as 1 - p_y (fast path)",
        "            at_y = -(r * scale)\n",
        "            at_y = -((1.0 - p_y * k) * scale)\n",
    ),
    Mutation(
        "torch_impl/softmax.py",
        "softmax_cross_entropy", "1 - p_y as the row sum less p_y in every row",
        "            count = int(dominant.count_nonzero())\n",
        "            count = 0\n",
    ),
    Mutation(
        "torch_impl/softmax.py",
        "softmax_focal_loss", "an underflowed p_y's log from p_y alone (fast path)",
        "            log_p_y = torch.where(small, from_logits, log_p_y)\n",
        "            log_p_y = log_p_y\n",
        own_tests="fast_path_branches",
    ),
    Mutation(
        "torch_impl/sigmoid.py",
        "sigmoid_cross_entropy", "sigma(x) - t with its cancellation (CE fast path)",
        "            return p.lerp_(_scaled_sigmoid(torch.neg(coefficient), x, -1), t)\n",
        "            return p.sub_(t * coefficient)\n",
    ),
    Mutation(
        "torch_impl/sigmoid.py", "sigmoid_focal_loss", "+inf logits keep a finite gradient",
        "                    grads[i] = _posinf_to_nan(logits, grads[i])\n",
        "                    pass\n",
        own_tests="sigmoid_special_logits",
    ),
    Mutation(
        "jax_impl/sigmoid.py",
        "sigmoid_cross_entropy", "log1p(e) of the shared sigmoid parts as log(1 + e)",
        "    log1p_e = jnp.log1p(e)\n    sigma_abs",
        "    log1p_e = jnp.log(1.0 + e)\n    sigma_abs",
    ),
    Mutation(
        "jax_impl/sigmoid.py",
        "sigmoid_focal_loss", "r without its a = 0 branch (0 / 0 where e underflows)",
        "    r = jnp.where(no_a, sigma_abs, _ratio(e * sigma_abs, jnp.where(no_a, 1.0, y)))\n",
        "    r = _ratio(e * sigma_abs, y)\n",
    ),
    Mutation(
        "jax_impl/sigmoid.py",
        "sigmoid_focal_loss", "log(1 - p_t) near 1 as log(a + e b), never log1p",
        "    near_one = z <= 0.25\n",
        "    near_one = z < 0.0\n",
    ),
    Mutation(
        "jax_impl/sigmoid.py",
        "sigmoid_focal_loss", "r as a plain quotient (d r forms (1 - p_t)^-2)",
        "_ratio(e * sigma_abs, jnp.where(no_a, 1.0, y))",
        "e * sigma_abs / jnp.where(no_a, 1.0, y)",
        "tiny_soft_targets", "tests/test_jax_transforms.py",
    ),
    Mutation(
        "torch_impl/softmax.py",
        "softmax_cross_entropy", "1 - p_y as 1 - p_y where not dominant (no row sum)",
        "            r = p.sum(dim=-1, keepdim=True) - p_y\n",
        "            r = 1.0 - p_y\n",
        own_tests="renormalises_softmax",
    ),
    Mutation(
        "jax_impl/softmax.py",
        "softmax_cross_entropy", "every class scaled through its exp's argument (rounded)",
        "    half = jnp.exp(0.5 * shifted) * 2.0 ** (_unflush_power(shifted.dtype) // 2)\n"
        "    return half * half\n",
        "    return jnp.exp(shifted + _unflush_power(shifted.dtype) * math.log(2.0))\n",
        "any_class_count", "tests/test_strict.py",
    ),
    Mutation(
        "jax_impl/softmax.py",
        "softmax_cross_entropy", "flushed subnormal classes summed as they are",
        "    half = jnp.exp(0.5 * shifted) * 2.0 ** (_unflush_power(shifted.dtype) // 2)\n"
        "    return half * half\n",
        "    return jnp.exp(shifted) * 2.0 ** _unflush_power(shifted.dtype)\n",
        "any_class_count", "tests/test_strict.py",
    ),
    Mutation(
        "jax_impl/softmax.py",
        "softmax_focal_loss", "log(1 - p_y) as log s_y - log1p(s) also at p_y <= 1/2",
        "        from_s = e_y > s_y\n",
        "        from_s = e_y >= 0.0\n",
        "any_class_count", "tests/test_strict.py",
    ),
    Mutation(
        "jax_impl/linear.py", "linear_softmax_cross_entropy",
        "last row block padded with the last row (counted again in dW, db)",
        "        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))\n",
        "        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), mode=\"edge\")\n",
        "blocks", "tests/test_linear_blocks.py",
    ),
    Mutation(
        "torch_impl/linear.py", "linear_softmax_cross_entropy",
        "last row block shifted back to be full (overlap counted twice in dW, db)",
        "    for start in range(0, num_rows, rows):\n",
        "    for start in range(0, num_rows, rows):\n"
        "        start = max(0, min(start, num_rows - rows))\n",
        "blocks", "tests/test_linear_blocks.py",
    ),
    Mutation(
        "torch_impl/linear.py", "linear_softmax_focal_loss", "dW skips a partial last row block",
        "        dw.addmm_(grad.T, h_block)\n",
        "        if h_block.shape[0] == rows:\n"
        "            dw.addmm_(grad.T, h_block)\n",
        "blocks", "tests/test_linear_blocks.py",
    ),
)  # fmt: skip


def _copy(destination: Path) -> None:
    for name in ("dualloss", "tests", "pyproject.toml"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, destination / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(source, destination / name)


def _pytest(directory: Path, *args: str) -> tuple[bool, str]:
    """(passed, tail of the output) of python -m pytest in `directory`."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args]
    # the full profile (tests/conftest.py): a mutant must meet every parameter set, not a subset
    env = dict(os.environ, DUALLOSS_CONFORMANCE_DTYPES="all", DUALLOSS_FULL_TESTS="1")
    out = subprocess.run(command, cwd=directory, capture_output=True, text=True, env=env)
    return out.returncode == 0, (out.stdout + out.stderr).strip().splitlines()[-1:]


def _parity_run(directory: Path, backend: str, loss: str, dtype: str) -> tuple[bool, str]:
    """(passed, tail of the output) of ``dualloss-parity run`` on one fused linear loss and dtype
    in `directory` (the linear cases, in partial row blocks, every region, strict)."""
    command = [sys.executable, "-m", "dualloss.parity", "run", "--backends", backend,
               "--losses", loss, "--dtypes", dtype, "--no-progress"]  # fmt: skip
    out = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command)} exited {out.returncode}: {out.stderr[-2000:]}")
    return out.returncode == 0, (out.stdout + out.stderr).strip().splitlines()[-1:]


def _backend(mutation: Mutation) -> str:
    """torch_impl or jax_impl: the package the mutated file is in."""
    return mutation.module.split("/")[0]


def is_stale(mutation: Mutation, root: Path = ROOT) -> bool:
    """The snippet does not occur exactly once in its file (the code moved or changed)."""
    return (root / "dualloss" / mutation.module).read_text().count(mutation.old) != 1


def run(mutation: Mutation, log) -> dict:
    backend = "torch" if _backend(mutation) == "torch_impl" else "jax"
    with tempfile.TemporaryDirectory(prefix="dualloss-mutant-") as tmp:
        tmp = Path(tmp)
        _copy(tmp)
        if is_stale(mutation, tmp):
            return {"stale": True}
        path = tmp / "dualloss" / mutation.module
        text = path.read_text()
        path.write_text(text.replace(mutation.old, mutation.new))
        caught = {}
        for dtype in DTYPES:
            if mutation.loss.startswith("linear_"):
                # the fused losses have no conformance tests: their parity run, strict standard
                passed, tail = _parity_run(tmp, backend, mutation.loss, dtype)
                caught[dtype] = not passed
                log(f"    {dtype}: {'caught' if not passed else 'MISSED'} {' '.join(tail)[:100]}")
                continue
            test = (
                "tests/test_conformance.py::test_backend_matches_spec_on_every_adversarial_case"
                f"[{backend}-{mutation.loss}-{dtype}]"
            )
            passed, tail = _pytest(tmp, test)
            caught[dtype] = not passed
            log(f"    {dtype}: {'caught' if not passed else 'MISSED'} {' '.join(tail)[:100]}")
        if mutation.own_tests is not None:
            own = mutation.own_file or f"tests/test_{backend}_impl.py"
            passed, _ = _pytest(tmp, own, "-k", mutation.own_tests)
            caught["own tests"] = not passed
        return {"stale": False, "caught": caught}


def markdown(results: list[tuple[Mutation, dict]]) -> str:
    lines = [
        "| # | backend | loss | mutation | " + " | ".join(DTYPES) + " | backend tests |",
        "|---|---|---|---|" + "---|" * (len(DTYPES) + 1),
    ]
    for i, (m, r) in enumerate(results):
        own = r.get("caught", {}).get("own tests")
        cells = (
            ["stale"] * (len(DTYPES) + 1)
            if r["stale"]
            else ["caught" if r["caught"][d] else "**missed**" for d in DTYPES]
            + ["-" if own is None else ("caught" if own else "**missed**")]
        )
        lines.append(f"| {i} | {_backend(m)} | {m.loss} | {m.what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the mutations and stop")
    parser.add_argument("--only", default=None, help="comma-separated mutation numbers")
    parser.add_argument("--markdown", default=None, help="write the results table to this file")
    args = parser.parse_args(argv)
    chosen = list(enumerate(MUTATIONS))
    if args.only:
        wanted = {int(i) for i in args.only.split(",")}
        unknown = wanted - set(range(len(MUTATIONS)))
        if unknown:
            parser.error(
                f"--only must name mutations 0..{len(MUTATIONS) - 1}. Received: {unknown}."
            )
        chosen = [(i, m) for i, m in chosen if i in wanted]
    if args.list:
        for i, m in chosen:
            print(f"{i}: {m.module} {m.loss}: {m.what}{'  [STALE]' if is_stale(m) else ''}")
        return 1 if any(is_stale(m) for _, m in chosen) else 0
    results = []
    started = time.monotonic()
    for i, m in chosen:
        print(f"[{i}] {m.module} {m.loss}: {m.what}", flush=True)
        results.append((m, run(m, lambda text: print(text, flush=True))))
    table = markdown(results)
    print(table)
    print(f"{time.monotonic() - started:.0f} s")
    if args.markdown:
        Path(args.markdown).write_text(
            "# Mutation check\n\nGenerated by `python dev/mutate.py --markdown docs/mutation.md`: "
            "each row plants one bug in a backend and runs the conformance suite of that backend "
            "and loss in each dtype (see the script's docstring).\n\n" + table + "\n"
        )
    holes = [m for m, r in results if r["stale"] or not all(r["caught"].values())]
    return 1 if holes else 0


if __name__ == "__main__":
    sys.exit(main())
