"""Everything the model needs from its distribution backend, in one place: Horovod today.

Training code calls only these functions (ranks, collectives, the distributed optimizer and
the Keras callbacks), so another backend (tf.distribute's MultiWorkerMirroredStrategy) can
slot in by providing the same functions. Every collective must be reached by every rank in
the same order; `name` tells Horovod's matching calls apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import tensorflow as tf

# One rank per device: each rank pins its GPU (or its share of the CPU threads).
PINS_DEVICES = True
# Rank 0 alone writes checkpoints and the export.
EVERY_RANK_WRITES = False


def init() -> None:
    hvd.init()


def rank() -> int:
    return int(hvd.rank())


def size() -> int:
    return int(hvd.size())


def local_rank() -> int:
    return int(hvd.local_rank())


def local_size() -> int:
    return int(hvd.local_size())


def replicas_per_rank() -> int:
    """Model replicas one rank trains: one per Horovod rank."""
    return 1


def sum_across_ranks(values: list[float], name: str) -> list[float]:
    total = hvd_tf.allreduce(tf.constant(values, tf.float64), op=hvd_tf.Sum, name=name)
    return [float(value) for value in total.numpy()]


def min_across_ranks(value: int, name: str) -> int:
    return int(hvd_tf.allreduce(tf.constant(value, tf.int64), op=hvd_tf.Min, name=name).numpy())


def any_rank(flag: bool, name: str) -> bool:
    """Whether `flag` is true on any rank."""
    agreed = hvd_tf.allreduce(tf.constant(int(flag), tf.int32), op=hvd_tf.Max, name=name)
    return bool(agreed.numpy())


def barrier(name: str) -> None:
    hvd_tf.allreduce(tf.constant(0, tf.int32), op=hvd_tf.Sum, name=name)


def gather(value: Any, name: str) -> list[Any]:
    """Every rank's `value` (picklable), in rank order."""
    return list(hvd_tf.allgather_object(value, name=name))


def broadcast(value: Any, name: str) -> Any:
    """Rank 0's `value` (picklable) on every rank."""
    return hvd_tf.broadcast_object(value, root_rank=0, name=name)


def broadcast_variables(variables: list[tf.Variable]) -> None:
    """Rank 0's values into every rank's variables."""
    hvd_tf.broadcast_variables(variables, root_rank=0)


def distributed_optimizer(optimizer: tf.keras.optimizers.Optimizer) -> Any:
    """The optimizer whose gradients are averaged across ranks before each step."""
    return hvd.DistributedOptimizer(optimizer)


def training_callbacks() -> list[tf.keras.callbacks.Callback]:
    """Callbacks fit() needs under this backend, before the model's own."""
    return [
        # Redundant after the explicit broadcast; kept as the guard Horovod documents,
        # should anything create variables in the first step.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Before any callback that reads the epoch's metrics.
        hvd.callbacks.MetricAverageCallback(),
    ]


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Where the model and optimizer are created (nothing to enter under Horovod)."""
    yield


def distribute(dataset: tf.data.Dataset) -> Any:
    """fit()'s input: each rank's own batches, as they are."""
    return dataset


def run_locally(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` on this rank alone."""
    return function(*args)
