"""PyTorch: a 64-256-10 MLP on scikit-learn's digits, trained with three focal losses.

    python -m examples.train_torch            # 2000 steps, float32 / float16 / bfloat16
    python -m examples.train_torch --steps 300 --dtypes float16

(a) the classic ``log(softmax)`` focal loss, (b) a textbook ``log_softmax`` focal loss with
gamma < 1, (c) ``dualloss.torch_impl.softmax_focal_loss``; plain ``torch.optim.SGD`` on weights
held in the run's dtype (no autocast, no loss scaling: what half precision does to the loss
itself). Then ``dualloss.parity.check`` judges (a) and (b) as it would have before training.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
from torch import nn

from dualloss import torch_impl

from . import common, naive_torch
from .common import Run

LOSS_FNS = {
    "classic": naive_torch.classic_focal_loss,
    "textbook": naive_torch.textbook_focal_loss,
    "dualloss": functools.partial(torch_impl.softmax_focal_loss, gamma=2.0),
}


def make_model(dtype: torch.dtype) -> nn.Sequential:
    """The MLP, with ``common.init_params``'s weights, in `dtype`."""
    model = nn.Sequential()
    model.add_module("hidden", nn.Linear(*common.SIZES[:2]))
    model.add_module("relu", nn.ReLU())
    model.add_module("out", nn.Linear(*common.SIZES[1:]))
    with torch.no_grad():
        for name, value in common.init_params().items():
            value = value.T if name.endswith("weight") else value  # nn.Linear: (out, in)
            model.get_parameter(name).copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return model.to(dtype)


def train(loss: str, dtype: str, steps: int, data, batches: np.ndarray, bar=None) -> Run:
    """One run; stops at the first step after which a weight is non-finite (SGD would carry the
    NaN into every weight on the next step)."""
    start = time.perf_counter()
    torch_dtype = getattr(torch, dtype)
    x_train, y_train, x_test, y_test = data
    x = torch.from_numpy(x_train).to(torch_dtype)
    y = torch.from_numpy(y_train)
    model = make_model(torch_dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=common.LR)
    loss_fn = LOSS_FNS[loss]
    run = Run("torch", loss, dtype, steps)
    for step, index in enumerate(torch.from_numpy(batches[:steps]), start=1):
        optimizer.zero_grad()
        value = loss_fn(model(x[index]), y[index])
        value.backward()
        grads = [p.grad.double() for p in model.parameters()]
        run.losses.append(value.item())
        run.grad_norms.append(float(torch.sqrt(sum((g * g).sum() for g in grads))))
        optimizer.step()
        bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        if bar is not None:
            bar.update(1)
        if bad:
            run.died_at, run.died_in = step, ", ".join(bad)
            if bar is not None:
                bar.update(steps - step)
            break
    with torch.no_grad():
        run.train_accuracy = common.accuracy(model(x).float().numpy(), y_train)
        test_logits = model(torch.from_numpy(x_test).to(torch_dtype))
        run.test_accuracy = common.accuracy(test_logits.float().numpy(), y_test)
    run.seconds = time.perf_counter() - start
    return run


def train_all(
    steps: int = common.STEPS,
    dtypes=common.DTYPES,
    losses=tuple(LOSS_FNS),
    progress: bool = True,
) -> list[Run]:
    """Every (dtype, loss) run, one progress bar for all of them."""
    from tqdm.auto import tqdm

    data = common.digits()
    batches = common.batch_indices(len(data[1]), steps)
    runs = []
    total = steps * len(dtypes) * len(losses)
    threads = torch.get_num_threads()
    # one thread: these matrices are tiny, and a second thread that has to wait for a busy core
    # makes every step up to ~20x slower on a 2-core machine whose other core is busy
    torch.set_num_threads(1)
    try:
        with tqdm(total=total, desc="torch", unit="step", disable=not progress) as bar:
            for dtype in dtypes:
                for loss in losses:
                    bar.set_postfix_str(f"{dtype} {loss}")
                    runs.append(train(loss, dtype, steps, data, batches, bar))
    finally:
        torch.set_num_threads(threads)
    return runs


def oracle(full: bool = False) -> list[common.OracleVerdict]:
    """``common.oracle`` on this script's hand-written losses."""
    return common.oracle("torch", LOSS_FNS, full)


def main(argv=None) -> list[Run]:
    return common.main(__doc__.splitlines()[0], train_all, oracle, argv)


if __name__ == "__main__":
    main()
