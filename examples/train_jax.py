"""JAX + optax: a 64-256-10 MLP on scikit-learn's digits, trained with three focal losses.

    python -m examples.train_jax            # 2000 steps, float32 / float16 / bfloat16
    python -m examples.train_jax --steps 300 --dtypes float16

The same runs as ``examples.train_torch`` (same initial weights, same batches): (a) the classic
``log(softmax)`` focal loss, (b) a textbook ``log_softmax`` focal loss with gamma < 1,
(c) ``dualloss.jax_impl.softmax_focal_loss``; ``optax.sgd`` on weights held in the run's dtype.
The steps run inside ``jax.lax.scan``, CHUNK at a time. Then ``dualloss.parity.check`` judges
(a) and (b) as it would have before training.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualloss import jax_impl

from . import common, naive_jax
from .common import Run

CHUNK = 100  # steps per jitted scan (and per progress-bar update)

LOSS_FNS = {
    "classic": naive_jax.classic_focal_loss,
    "textbook": naive_jax.textbook_focal_loss,
    "dualloss": functools.partial(jax_impl.softmax_focal_loss, gamma=2.0),
}


def forward(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """The MLP: ``relu(x W1 + b1) W2 + b2``."""
    h = jax.nn.relu(x @ params["hidden.weight"] + params["hidden.bias"])
    return h @ params["out.weight"] + params["out.bias"]


@functools.cache
def make_chunk(loss: str):
    """A jitted function running len(indices) SGD steps; per step it returns the loss, the
    gradient norm (float32) and, per parameter, whether it is all finite after the update."""
    loss_fn = LOSS_FNS[loss]
    optimizer = optax.sgd(common.LR)

    def step(carry, batch):
        params, opt_state = carry
        x, y = batch
        value, grads = jax.value_and_grad(lambda p: loss_fn(forward(p, x), y))(params)
        grad_norm = jnp.sqrt(
            sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads.values())
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        finite = {name: jnp.all(jnp.isfinite(p)) for name, p in params.items()}
        return (params, opt_state), (value.astype(jnp.float32), grad_norm, finite)

    @jax.jit
    def chunk(params, opt_state, x, y):
        return jax.lax.scan(step, (params, opt_state), (x, y))

    return chunk, optimizer


def train(loss: str, dtype: str, steps: int, data, batches: np.ndarray, bar=None) -> Run:
    """One run; stops after the chunk in which a weight first went non-finite, and keeps the
    records up to that step."""
    start = time.perf_counter()
    jax_dtype = jnp.dtype(dtype)
    x_train, y_train, x_test, y_test = data
    chunk, optimizer = make_chunk(loss)
    params = {k: jnp.asarray(v, jax_dtype) for k, v in common.init_params().items()}
    opt_state = optimizer.init(params)
    x_all = jnp.asarray(x_train, jax_dtype)
    run = Run("jax", loss, dtype, steps)
    for first in range(0, steps, CHUNK):
        index = batches[first : min(first + CHUNK, steps)]
        (params, opt_state), (values, norms, finite) = chunk(
            params, opt_state, x_all[index], jnp.asarray(y_train[index])
        )
        finite = {name: np.asarray(ok) for name, ok in finite.items()}
        all_finite = np.logical_and.reduce(list(finite.values()))
        done = len(index) if all_finite.all() else int(np.argmin(all_finite)) + 1
        run.losses += np.asarray(values, np.float64)[:done].tolist()
        run.grad_norms += np.asarray(norms, np.float64)[:done].tolist()
        if bar is not None:
            bar.update(len(index))
        if done < len(index) or not all_finite.all():
            run.died_at = first + done
            run.died_in = ", ".join(n for n, ok in finite.items() if not ok[done - 1])
            if bar is not None:
                bar.update(steps - first - len(index))
            break
    run.train_accuracy = common.accuracy(forward(params, x_all), y_train)
    run.test_accuracy = common.accuracy(forward(params, jnp.asarray(x_test, jax_dtype)), y_test)
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
    with tqdm(total=total, desc="jax", unit="step", disable=not progress) as bar:
        for dtype in dtypes:
            for loss in losses:
                bar.set_postfix_str(f"{dtype} {loss}")
                runs.append(train(loss, dtype, steps, data, batches, bar))
    return runs


def oracle(full: bool = False) -> list[common.OracleVerdict]:
    """``common.oracle`` on this script's hand-written losses, jitted as in training (4x faster
    than op by op for the classic loss)."""
    return common.oracle("jax", LOSS_FNS, full, jit=True)


def main(argv=None) -> list[Run]:
    return common.main(__doc__.splitlines()[0], train_all, oracle, argv)


if __name__ == "__main__":
    main()
