"""The worst strict-standard error of each backend, loss and dtype over the parity suite's
adversarial cases: ``python -m dev.strict_sweep [--dtypes float32,...] [--losses ...]``.

Prints one row per (backend, loss, dtype): the worst error / tolerance ratio of the strict
standard (``dualloss.parity.tolerance``, <= 1 holds), the worst error in ULPs of the result's
own magnitude, and the first failing case.
"""

from __future__ import annotations

import argparse

from dualloss import losses
from dualloss.parity import backends as B
from dualloss.parity import runner


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default=",".join(B.DTYPES))
    parser.add_argument("--losses", default=",".join(losses.NAMES))
    parser.add_argument("--backends", default=",".join(B.BACKENDS))
    parser.add_argument("--regions", default=None)
    args = parser.parse_args(argv)
    failed = False
    print(f"{'backend':<6} {'loss':<24} {'dtype':<9} {'calls':>6} {'worst err/tol':>13} "
          f"{'worst ULP':>10}  first failure")  # fmt: skip
    for backend in args.backends.split(","):
        for name in args.losses.split(","):
            impl = B.ours(backend, name)
            for dtype in args.dtypes.split(","):
                result = runner.run_matrix(
                    [impl], dtypes=[dtype], devices=["cpu"], losses=[name],
                    regions=None if args.regions is None else args.regions.split(","),
                    torch_compile=False, progress=False,
                )  # fmt: skip
                judged = [r for r in result.records if r.kind != "skipped"]
                bad = [r for r in judged if r.kind != "ok"]
                ratio = max((r.ratio for r in judged), default=0.0)
                ulps = max((max(r.value_ulp, r.grad_ulp) for r in judged), default=0.0)
                first = ""
                if result.failures:
                    failure = result.failures[0]
                    first = f"{failure.case}: {'; '.join(failure.problems)[:200]}"
                failed |= bool(bad)
                print(f"{backend:<6} {name:<24} {dtype:<9} {len(judged):>6} {ratio:>13.3g} "
                      f"{ulps:>10.3g}  {first}", flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
