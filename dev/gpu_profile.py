"""Where a GPU call of each torch loss spends its time: ``python -m dev.gpu_profile [--device
gpu:0] [--shape 4096x1000]`` (``--device cpu`` runs the same on the CPU).

For softmax CE, softmax focal, sigmoid CE and F.cross_entropy (and the two softmax CEs with
probability targets): the wall time per forward+backward
(synchronised, 20 calls after 5 warm-ups), then a ``torch.profiler`` table (CPU and CUDA) of three
calls, sorted by host time: the kernel launches per call and host time against GPU time show
whether a loss is launch-bound (docs/devices.md, first GPU run).
"""

from __future__ import annotations

import argparse
import time

from dualloss.parity import devices


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gpu:0", help="cpu or gpu:N (alias cuda:N)")
    parser.add_argument("--shape", default="4096x1000")
    parser.add_argument("--rows", type=int, default=22, help="profiler table rows")
    args = parser.parse_args(argv)
    devices.start(["torch", "jax"])
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from dualloss import torch_impl

    n, c = (int(v) for v in args.shape.split("x"))
    where = devices.canonical(args.device, "--device")
    if where == "all":
        parser.error("--device must name one device ('cpu' or 'gpu:N'). Received: 'all'.")
    dev = devices.torch_name(where)
    x = torch.randn(n, c, device=dev, requires_grad=True)
    y = torch.randint(0, c, (n,), device=dev)
    t = (torch.rand(n, c, device=dev) < 0.1).float()
    soft = torch.softmax(torch.randn(n, c, device=dev), dim=-1)
    calls = {
        "softmax_cross_entropy": lambda: torch_impl.softmax_cross_entropy(x, y),
        "softmax_focal_loss": lambda: torch_impl.softmax_focal_loss(x, y),
        "sigmoid_cross_entropy": lambda: torch_impl.sigmoid_cross_entropy(x, t),
        "F.cross_entropy": lambda: F.cross_entropy(x, y),
        # probability targets with label smoothing: the dense kernel against torch's own
        "softmax_cross_entropy (probabilities, smoothing 0.1)": lambda: (
            torch_impl.softmax_cross_entropy(x, soft, label_smoothing=0.1)
        ),
        "F.cross_entropy (probabilities, smoothing 0.1)": lambda: F.cross_entropy(
            x, soft, label_smoothing=0.1
        ),
    }
    activities = [ProfilerActivity.CPU]
    if devices.is_gpu(where):
        activities.append(ProfilerActivity.CUDA)

    def repeat(call, times):
        for _ in range(times):
            call().backward()
            x.grad = None
        devices.synchronize("torch", where)

    for name, call in calls.items():
        repeat(call, 5)
        began = time.perf_counter()
        repeat(call, 20)
        per_call = (time.perf_counter() - began) / 20 * 1e3
        print(f"{name} {args.shape} on {where}: {per_call:.3f} ms/call")
        with profile(activities=activities) as prof:
            repeat(call, 3)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
