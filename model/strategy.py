"""The model's distribution backend under tf.distribute.MultiWorkerMirroredStrategy: the same
functions as model/collective.py (Horovod), on the strategy's collectives.

One process per host (a "rank" is a worker: TF_CONFIG's task index), whose replicas are its
local devices (one on a CPU host). Every collective is a replica-context all-reduce or
all-gather inside `strategy.run`, so every worker must reach them in the same order, exactly as
with Horovod. Values are counted once per worker: only each worker's first replica contributes.

What differs from Horovod, and why:
- Variables are created in `scope()`; the gradients are averaged by Keras' optimizer under the
  strategy, so `distributed_optimizer` returns the optimizer as it is, and no callback is needed.
- fit() gets a distributed dataset (each worker reads its own share, as under Horovod).
- Reading a sync-on-read variable (BatchNormalization's moving statistics) outside a replica
  context is itself an all-reduce across workers: so evaluation runs the model in the replica
  context (`run_locally`), and every worker writes checkpoints and the export, the chief's to
  the real places and the others' to a scratch folder, as TensorFlow's multi-worker guide asks.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

# The strategy sets up its own devices: a worker drives every local GPU, so nothing is pinned.
PINS_DEVICES = False
# Every worker writes checkpoints and the export (see the module's docstring).
EVERY_RANK_WRITES = True


@functools.cache
def _strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    # Created once per process, before any other TensorFlow op: it configures the runtime
    # for the cluster in TF_CONFIG (a cached constructor: the strategy is process-wide state
    # TensorFlow itself keeps, this only avoids creating it twice).
    return tf.distribute.MultiWorkerMirroredStrategy()


def init() -> None:
    _strategy()


def rank() -> int:
    resolver = _strategy().cluster_resolver
    return int(resolver.task_id or 0) if resolver.task_type else 0


def size() -> int:
    spec = _strategy().cluster_resolver.cluster_spec()
    return len(spec.job_tasks("worker")) if "worker" in spec.jobs else 1


def local_rank() -> int:
    return 0


def local_size() -> int:
    return 1


def _local_replicas() -> int:
    return len(_strategy().extended.worker_devices)


def replicas_per_rank() -> int:
    """Model replicas one worker trains: one per local device (GPU), else one."""
    return _local_replicas()


def _once_per_worker(value: tf.Tensor) -> tf.Tensor:
    """`value` on each worker's first replica, zeros on its others."""
    context = tf.distribute.get_replica_context()
    first = tf.equal(context.replica_id_in_sync_group % _local_replicas(), 0)
    return tf.where(first, value, tf.zeros_like(value))


@functools.cache
def _sum_function() -> Callable[[tf.Tensor], tf.Tensor]:
    """The all-reduce as one tf.function (a trace per dtype and shape): run eagerly, every
    call would be a new collective instance whose parameters the workers first agree on over
    gRPC, a round trip more on every training step's stop vote."""
    strategy = _strategy()

    def replica(value: tf.Tensor) -> tf.Tensor:
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM, _once_per_worker(value))

    @tf.function
    def reduce(value: tf.Tensor) -> tf.Tensor:
        return strategy.experimental_local_results(strategy.run(replica, args=(value,)))[0]

    return reduce


def _sum(value: tf.Tensor) -> tf.Tensor:
    return _sum_function()(value)


def _gather(value: tf.Tensor) -> tf.Tensor:
    """Every worker's `value`, stacked in rank order."""

    def replica(value: tf.Tensor) -> tf.Tensor:
        context = tf.distribute.get_replica_context()
        return context.all_gather(value[tf.newaxis], axis=0)

    strategy = _strategy()
    stacked = strategy.experimental_local_results(strategy.run(replica, args=(value,)))[0]
    return stacked[:: _local_replicas()]


def sum_across_ranks(values: list[float], name: str) -> list[float]:
    del name  # collectives are matched by order under the strategy
    return [float(value) for value in _sum(tf.constant(values, tf.float64)).numpy()]


def min_across_ranks(value: int, name: str) -> int:
    del name
    return int(tf.reduce_min(_gather(tf.constant(value, tf.int64))).numpy())


def any_rank(flag: bool, name: str) -> bool:
    """Whether `flag` is true on any rank."""
    del name
    return bool(_sum(tf.constant(int(flag), tf.int32)).numpy() > 0)


def barrier(name: str) -> None:
    del name
    _sum(tf.constant(0, tf.int32))


def gather(value: Any, name: str) -> list[Any]:
    """Every rank's `value` (picklable), in rank order: lengths first, then padded bytes."""
    del name
    data = np.frombuffer(pickle.dumps(value), dtype=np.uint8)
    lengths = _gather(tf.constant(len(data), tf.int64)).numpy()
    # int32: the collectives take no uint8; listings and digests are a few kB.
    padded = np.zeros(int(lengths.max()), dtype=np.int32)
    padded[: len(data)] = data
    rows = _gather(tf.constant(padded)).numpy().astype(np.uint8)
    # Our own workers' bytes, produced just above by this same program.
    return [pickle.loads(row[:length].tobytes()) for row, length in zip(rows, lengths, strict=True)]  # noqa: S301


def broadcast(value: Any, name: str) -> Any:
    """Rank 0's `value` (picklable) on every rank."""
    return gather(value, name)[0]


def broadcast_variables(variables: list[tf.Variable]) -> None:
    """Rank 0's values into every rank's variables (after rank 0 alone restored a checkpoint):
    one all-reduce of rank 0's values and everyone else's zeros. The values are read in the
    replica context: outside it, reading a sync-on-read variable is an all-reduce of its own,
    which rank 0 alone would start."""
    own = rank() == 0

    def replica() -> list[tf.Tensor]:
        context = tf.distribute.get_replica_context()
        values = [
            tf.identity(variable) if own else tf.zeros(variable.shape, variable.dtype)
            for variable in variables
        ]
        return context.all_reduce(
            tf.distribute.ReduceOp.SUM, [_once_per_worker(value) for value in values]
        )

    strategy = _strategy()
    reduced = strategy.experimental_local_results(strategy.run(replica))[0]
    for variable, value in zip(variables, reduced, strict=True):
        variable.assign(value)


def distributed_optimizer(optimizer: tf.keras.optimizers.Optimizer) -> Any:
    """Keras' optimizer averages the gradients across replicas itself under the strategy."""
    return optimizer


def training_callbacks() -> list[tf.keras.callbacks.Callback]:
    """fit() under the strategy already reports metrics over every worker."""
    return []


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Where the model and optimizer must be created."""
    with _strategy().scope():
        yield


def distribute(dataset: tf.data.Dataset) -> Any:
    """This worker's own batches as the strategy's input (no sharding: each worker's dataset
    already reads only its share)."""
    return _strategy().distribute_datasets_from_function(lambda _context: dataset)


def run_locally(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` in this worker's replica context, where reading sync-on-read
    variables is local (not an all-reduce across workers)."""
    strategy = _strategy()
    return strategy.experimental_local_results(strategy.run(function, args=args))[0]
