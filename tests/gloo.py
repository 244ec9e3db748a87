"""Gloo worlds for the tests of the torch losses over a process group (DESIGN 12).

``spawn_world(size, out_dir, bodies)`` starts `size` processes on this machine, each joining one
gloo group (rank r of `size`, a free local port), runs every function of `bodies` in turn as
``body(rank, size, results)`` filling that rank's dict, and returns ``{rank: results}`` once all
have saved theirs. A body that raises ends its rank's run; the traceback comes back and the
call fails with it, naming the rank, instead of a hang or a bare exit code. The bodies must be
module-level functions (the processes are spawned, so they are pickled by name).
"""

from __future__ import annotations

import os
import socket
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, size, port, out_dir, bodies, keys):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    results = {key: {} for key in keys}
    try:
        for body in bodies:
            body(rank, size, results)
    except BaseException:  # noqa: BLE001 (handed to the parent, which fails with it)
        results["crash"] = traceback.format_exc()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def spawn_world(size, out_dir, bodies, keys=()):
    """{rank: results} of one gloo world of `size` processes running `bodies` (each rank's
    results start as one empty dict per name in `keys`)."""
    out_dir = str(out_dir)
    mp.spawn(
        _rank, args=(size, free_port(), out_dir, tuple(bodies), tuple(keys)), nprocs=size, join=True
    )
    ranks = {
        r: torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(size)
    }
    for rank, results in ranks.items():
        assert "crash" not in results, f"rank {rank}:\n{results['crash']}"
    return ranks
