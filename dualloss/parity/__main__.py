"""Command line: ``dualloss-parity run ...`` and ``dualloss-parity check MODULE:FUNCTION ...``.

Exit status: 0 when parity holds, 1 on failures, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys

from .. import losses as _registry
from .cases import LOSSES, REGIONS
from .smoke import STEPS as SMOKE_STEPS

# the fused linear losses run too (``parity.linear``: their own regions and bound)
RUN_LOSSES = LOSSES + _registry.LINEAR_NAMES
RUN_REGIONS = REGIONS + tuple(r for r in _registry.LINEAR_REGIONS if r not in REGIONS)

USAGE_ERROR, FAILED, OK = 2, 1, 0

# the quick run's time, word for word as README.md and docs/parity.md give it (a test holds the
# three to this phrase): 7m32s measured on 2 idle CPU cores on 2026-12-07 (JAX beside torch in
# two threads, the interpreted kernels on their quick subset)
QUICK_RUN_TIME = "about 7 minutes on 2 CPU cores"


def _grads(text: str):
    """--grads: 'all', 'logits', or comma-separated names (a tuple)."""
    return text if text in ("all", "logits") else tuple(_csv(text))


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _option(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"`--option` must be key=value. Received: {text!r}.")
    key, _, raw = text.partition("=")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key.strip(), value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dualloss-parity",
        description="Judge loss implementations against the float64 dualloss spec. "
        "Exit status: 0 parity holds, 1 failures (or nothing judged), 2 usage error.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run dualloss's backends (and peers) over every case",
        description="Judge dualloss's own backends (and, with --peers, torch / optax / kornia) on "
        "every adversarial case, dtype, device and mode; print a summary, optionally write a "
        "JSON + Markdown report with plots.",
    )
    run.add_argument(
        "--backends",
        type=_csv,
        default=["torch", "jax"],
        help="comma-separated frameworks to judge (default: torch,jax)",
    )
    run.add_argument(
        "--devices",
        type=_csv,
        default=None,
        help="cpu, gpu:N (alias cuda:N) or all (default: cpu and gpu:0 when a GPU is present;"
        " every device must exist for every backend, else exit 2)",
    )
    run.add_argument(
        "--dtypes",
        type=_csv,
        default=["float32", "float64", "float16", "bfloat16"],
        help="comma-separated dtypes (default: all four)",
    )
    run.add_argument(
        "--losses",
        type=_csv,
        default=list(RUN_LOSSES),
        help=f"comma-separated spec losses (default: all: {', '.join(RUN_LOSSES)})",
    )
    run.add_argument(
        "--regions",
        type=_csv,
        default=None,
        help="comma-separated case regions (default: all; see docs/parity.md), among: "
        + ", ".join(RUN_REGIONS),
    )
    level = run.add_mutually_exclusive_group()
    level.add_argument(
        "--quick",
        action="store_const",
        dest="level",
        const="quick",
        help=f"the CI's case set (default): {QUICK_RUN_TIME}",
    )
    level.add_argument(
        "--full",
        action="store_const",
        dest="level",
        const="full",
        help="more margins, gammas and shapes; both JAX modes; torch.compile",
    )
    run.add_argument(
        "--sharded",
        action="store_true",
        help="the sharded profile: the softmax losses' vocab-parallel paths (JAX axis_name= and"
        " jit over class-sharded arrays on 8 forced host devices; torch process_group= and"
        " DTensor in 2 and 4 gloo processes) judged against the spec and the unsharded backend",
    )
    run.add_argument("--peers", action="store_true", help="also measure torch/optax/kornia")
    run.add_argument("--only-peers", action="store_true", help="measure the peers only")
    run.add_argument("--no-jit", action="store_true", help="JAX eager mode only")
    run.add_argument("--no-kernels", action="store_true",
                     help="leave out torch_impl's Triton kernels (judged as torch_impl+triton "
                          "where Triton runs; on a CPU under its interpreter)")  # fmt: skip
    run.add_argument("--compile", action="store_true", help="torch.compile also with --quick")
    run.add_argument(
        "--compile-budget",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="time allowed for torch.compile calls in all (default 900); past it the compiled"
        " mode is reported untested",
    )
    run.add_argument(
        "--report",
        metavar="DIR",
        default=None,
        help="write parity.json, report.md and PNG plots here",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is shown only on a terminal anyway)",
    )
    run.add_argument(
        "--max-failures",
        type=int,
        default=10,
        help="failures printed per kind (default 10; the JSON has all)",
    )
    run.set_defaults(level="quick")

    check = sub.add_parser(
        "check",
        help="check your own loss function",
        description="Judge MODULE:FUNCTION, called as FUNCTION(logits, targets) in the "
        "backend's layout, against spec.REFERENCE: feature probes, adversarial cases, then "
        "Hypothesis, under the practical standard (docs/parity.md). Features it raises on are "
        "reported as unsupported; NaN, inf and errors beyond the tolerance are failures.",
    )
    check.add_argument(
        "candidate",
        metavar="MODULE:FUNCTION",
        help="the loss to judge (the current directory is on sys.path)",
    )
    check.add_argument(
        "--reference",
        required=True,
        choices=RUN_LOSSES,
        help="the spec loss (a fused linear loss: FUNCTION(hidden, linear_weight, targets), with"
        " --option bias=True also a fourth argument bias)",
    )
    check.add_argument(
        "--backend", required=True, choices=["torch", "jax"], help="the candidate's framework"
    )
    check.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a spec keyword argument the candidate implements (a Python literal;"
        " repeat for several), e.g. gamma=0.5 or reduction='\"sum\"'",
    )
    check.add_argument(
        "--dtypes",
        type=_csv,
        default=None,
        help="comma-separated dtypes (default: float32,float64)",
    )
    check.add_argument(
        "--max-examples",
        type=int,
        default=None,
        help="Hypothesis examples per dtype (default 50; 0: none)",
    )
    check.add_argument(
        "--skip", type=_csv, default=[], help="comma-separated regions to leave out (rarely needed)"
    )
    check.add_argument(
        "--grads",
        type=_grads,
        default="all",
        help="which gradients to judge: all (the default), logits, or comma-separated names"
        " (logits,targets,weight,...)",
    )
    check.add_argument("--device", default=None, help="cpu (the default) or gpu:N (alias cuda:N)")
    jit = check.add_mutually_exclusive_group()
    jit.add_argument(
        "--jit",
        dest="jit",
        action="store_const",
        const=True,
        default=None,
        help="JAX: run the candidate under jax.jit (the default; eager where jit cannot trace it)",
    )
    jit.add_argument(
        "--no-jit",
        dest="jit",
        action="store_const",
        const=False,
        help="JAX: run the candidate eagerly only (slower; for code that jit cannot trace)",
    )
    check.add_argument(
        "--standard",
        choices=["practical", "strict"],
        default="practical",
        help="the tolerance (default practical; strict: the one dualloss's own backends meet)",
    )
    check.add_argument(
        "--binary-targets",
        action="store_true",
        help="sigmoid losses: the candidate takes targets in {0, 1} only",
    )
    check.add_argument(
        "--stop-at-first", action="store_true", help="stop after the first dtype that fails"
    )

    doctor = sub.add_parser(
        "doctor",
        help="frameworks, versions, devices, Triton, matmul precision",
        description="Print the frameworks and their versions, the devices each sees (JAX "
        "started before torch, as the suite does), Triton, and the matmul precision settings. "
        "Exit status 1 when a framework is missing or the two disagree about the GPUs.",
    )
    doctor.add_argument("--backends", type=_csv, default=["torch", "jax"],
                        help="frameworks to inspect (default: torch,jax)")  # fmt: skip

    smoke = sub.add_parser(
        "smoke",
        help="the GPU smoke test: a PASS/FAIL line per step, at most ~10 minutes",
        description="doctor; every loss on the GPU in float32/bfloat16/float64 with sync and "
        "transfer guards on; a parity slice with torch.compile; graph breaks; the device-assert "
        "poisoning check; a quick benchmark with memory; the device tests. Without a GPU the CPU "
        "steps run and the GPU steps are listed as NEEDS GPU. Exit status 1 on any FAIL.",
    )
    smoke.add_argument("--device", default="gpu:0", help="the GPU to test (default gpu:0)")
    smoke.add_argument(
        "--skip",
        type=_csv,
        default=[],
        help="comma-separated steps to leave out, among: " + ", ".join(SMOKE_STEPS),
    )
    return parser  # fmt: skip


def _run(args, parser) -> int:
    from . import backends as B
    from . import devices, runner

    for name, values, allowed in (("--backends", args.backends, B.BACKENDS),
                                  ("--dtypes", args.dtypes, B.DTYPES),
                                  ("--losses", args.losses, RUN_LOSSES),
                                  ("--regions", args.regions or [], RUN_REGIONS)):  # fmt: skip
        bad = [v for v in values if v not in allowed]
        if bad:
            parser.error(f"{name} must be among {', '.join(allowed)}. Received: {','.join(bad)}.")
    missing = [b for b in args.backends if importlib.util.find_spec(b) is None]
    if missing:
        parser.error(
            f"--backends {','.join(missing)}: not installed (pip install dualloss[{missing[0]}])."
        )
    if args.sharded:
        return _run_sharded(args, parser)
    devices.start(args.backends)  # JAX before torch
    linear = [] if args.only_peers else [n for n in args.losses if _registry.get(n).is_linear]
    logits = [n for n in args.losses if not _registry.get(n).is_linear]
    if args.regions is not None and not set(args.regions) & set(REGIONS):
        logits = []  # only regions of the fused linear losses were asked for
    impls = (
        []
        if args.only_peers
        else runner.default_implementations(args.backends, logits, kernels=not args.no_kernels)
    )
    if args.peers or args.only_peers:
        from .peers import available_peers

        impls += [p for p in available_peers(args.backends) if p.loss in logits]
    try:
        devices.parse(args.devices)
        if impls or not linear:
            result = runner.run_matrix(
                impls, dtypes=args.dtypes, devices=args.devices, level=args.level,
                losses=logits, regions=args.regions, jit=not args.no_jit,
                torch_compile=True if args.compile else None, progress=not args.no_progress,
                compile_budget_s=args.compile_budget, side_by_side=True,
            )  # fmt: skip
        else:
            names = devices.resolve(args.backends, args.devices)
            result = runner.RunResult(config={"devices": names})
        if linear:
            from . import linear as fused

            records, failures, seconds = fused.run_ours(
                args.backends, args.dtypes, result.config["devices"], args.level, linear,
                args.regions, not args.no_jit,
            )  # fmt: skip
            result.records += records
            result.failures += failures
            result.seconds += seconds
            result.config["linear_losses"] = linear
    except ValueError as error:  # devices.DeviceError, or a device name it cannot read
        parser.error(str(error))
    return _summarise(result, args)


def _summarise(result, args) -> int:
    """Prints the run's summary, writes the report where --report asks, and gives the exit
    status: the one ending of `run` and `run --sharded`."""
    from . import report

    print(report.terminal_summary(result, args.max_failures))
    if args.report:
        os.makedirs(args.report, exist_ok=True)
        report.write_json(result, os.path.join(args.report, "parity.json"))
        path = report.write_markdown(result, args.report)
        print(f"report: {path}, {os.path.join(args.report, 'parity.json')}")
        not_drawn = report.plots_not_drawn(result)
        if not_drawn:
            print(f"warning: {not_drawn}.", file=sys.stderr)
    return OK if result.ok else FAILED


def _run_sharded(args, parser) -> int:
    """--sharded: JAX in a subprocess with 8 forced host devices, torch in gloo processes."""
    from . import sharded

    for flag, given in (("--peers", args.peers), ("--only-peers", args.only_peers),
                        ("--compile", args.compile), ("--no-jit", args.no_jit),
                        ("--devices", args.devices is not None)):  # fmt: skip
        if given:
            parser.error(f"--sharded runs dualloss's own backends on host devices: drop {flag}.")
    judged = sharded.SHARDED_LOSSES + sharded.LINEAR_SHARDED_LOSSES
    losses = [n for n in args.losses if n in judged]
    if not losses:
        parser.error(
            f"--sharded judges {', '.join(judged)}. Received: --losses {','.join(args.losses)}."
        )
    result = sharded.run_profile(args.backends, args.dtypes, losses, args.regions, args.level)
    return _summarise(result, args)


def _check(args, parser) -> int:
    from ._check import check, resolve

    sys.path.insert(0, os.getcwd())
    try:
        candidate = resolve(args.candidate)
    except (ValueError, ImportError, AttributeError) as error:
        parser.error(f"cannot load {args.candidate!r}: {error}")
    try:
        result = check(
            candidate, args.reference, backend=args.backend, options=dict(args.option),
            dtypes=args.dtypes, max_examples=args.max_examples, skip=args.skip,
            device=args.device, jit=args.jit, standard=args.standard,
            binary_targets=args.binary_targets, stop_at_first=args.stop_at_first,
            grads=args.grads,
        )  # fmt: skip
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    print(result)
    return OK if result.ok else FAILED


def _doctor(args, parser) -> int:
    from . import backends as B
    from . import devices

    bad = [b for b in args.backends if b not in B.BACKENDS]
    if bad:
        allowed = ", ".join(B.BACKENDS)
        parser.error(f"--backends must be among {allowed}. Received: {','.join(bad)}.")
    lines, ok = devices.doctor(args.backends)
    print("\n".join(lines))
    return OK if ok else FAILED


def _smoke(args, parser) -> int:
    from . import devices, smoke

    try:
        device = devices.canonical(args.device, "device")
    except ValueError as error:
        parser.error(str(error))
    if not devices.is_gpu(device):
        parser.error(f"`--device` must be a GPU, gpu:N. Received: {args.device!r}.")
    unknown = [s for s in args.skip if s not in smoke.STEPS]
    if unknown:
        allowed = ", ".join(smoke.STEPS)
        parser.error(f"--skip must be among {allowed}. Received: {','.join(unknown)}.")
    return OK if smoke.main(device, skip=args.skip) else FAILED


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args, parser)
    if args.command == "doctor":
        return _doctor(args, parser)
    if args.command == "smoke":
        return _smoke(args, parser)
    return _check(args, parser)


if __name__ == "__main__":
    sys.exit(main())
