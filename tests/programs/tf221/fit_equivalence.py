"""`model.fit` with hvd.DistributedOptimizer must train exactly as one process does on the union
of the ranks' data: same weights on every rank, equal within float tolerance to a one-process
run (plain SGD, no shuffling, the same initial weights, every rank's batch the same size, so
the average of the ranks' gradients is the gradient of the union batch). Then the same model
with the plain optimizer, to show that this check sees unsynchronized training.

`--keras tf_keras` sets TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (tf.keras is then
tf_keras, Keras 2); `--keras keras3` (the default) leaves tf.keras Keras 3. Prints one
FIT_EQUIVALENCE line on rank 0; exits 1 if a check fails."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--keras", choices=("keras3", "tf_keras"), default="keras3")
parser.add_argument("--steps", type=int, default=6)
args, _ = parser.parse_known_args()
if args.keras == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import horovod.tensorflow.keras as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
BATCH = 8
FEATURES = 12
CLASSES = 3
# float32 sums in a different order: a few ulps after a few steps.
TOLERANCE = 1e-5


def data(world: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's rows, rank-major: rank r's step-i batch is rows [r][i*BATCH:(i+1)*BATCH]."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(world, steps * BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(world, steps * BATCH)).astype(np.int64)
    return x, y


def model() -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input(shape=(FEATURES,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(CLASSES),
        ]
    )


def train(
    optimizer: keras.optimizers.Optimizer, x: np.ndarray, y: np.ndarray, batch: int, *, ranks: bool
) -> np.ndarray:
    """`ranks`: run by every rank (with Horovod's broadcast callback), else by rank 0 alone."""
    net = model()
    net.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)] if ranks else []
    net.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return np.concatenate([w.ravel() for w in net.get_weights()])


def spread(weights: np.ndarray) -> float:
    """The largest difference between any rank's weights and rank 0's."""
    every = hvd.allgather(tf.constant(weights[np.newaxis])).numpy()
    return float(np.max(np.abs(every - every[0])))


def main() -> int:
    hvd.init()
    world, rank = hvd.size(), hvd.rank()
    x, y = data(world, args.steps)

    distributed = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    synced = train(distributed, x[rank], y[rank], BATCH, ranks=True)
    synced_spread = spread(synced)
    plain = keras.optimizers.SGD(0.1)
    unsynced_spread = spread(train(plain, x[rank], y[rank], BATCH, ranks=True))

    failed = 0
    if rank == 0:
        # The union of the ranks' step-i batches is one batch of world * BATCH rows.
        union_x = x.reshape(world, args.steps, BATCH, FEATURES).transpose(1, 0, 2, 3)
        union_y = y.reshape(world, args.steps, BATCH).transpose(1, 0, 2)
        single = train(
            keras.optimizers.SGD(0.1),
            union_x.reshape(-1, FEATURES),
            union_y.reshape(-1),
            world * BATCH,
            ranks=False,
        )
        single_diff = float(np.max(np.abs(synced - single)))
        moved = float(np.max(np.abs(single - train_nothing())))
        ok = synced_spread == 0.0 and single_diff < TOLERANCE and unsynced_spread > 1e-3
        print(
            f"FIT_EQUIVALENCE keras={args.keras} tf.keras={keras.__name__} "
            f"ranks={world} steps={args.steps} same_on_every_rank={synced_spread == 0.0} "
            f"single_process_diff={single_diff:.2e} moved={moved:.2e} "
            f"unsynchronized_spread={unsynced_spread:.2e} ok={ok}",
            flush=True,
        )
        failed = 0 if ok and moved > 1e-3 else 1
    return int(hvd.allreduce(tf.constant(failed), op=hvd.Sum).numpy() > 0)


def train_nothing() -> np.ndarray:
    """The initial weights: training must have moved them, or equality proves nothing."""
    return np.concatenate([w.ravel() for w in model().get_weights()])


if __name__ == "__main__":
    sys.exit(main())
