"""`import smdistributed.dataparallel.tensorflow.keras as dist`: the data-parallel library's
Keras names, on horovod.tensorflow.keras. AWS does not document this module; these are the
names its examples use (DistributedOptimizer, callbacks.BroadcastGlobalVariablesCallback, rank
and size), with the rest of the TensorFlow API's process functions."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow.keras as hvd_keras

from smdistributed.dataparallel import mapping
from smdistributed.dataparallel.mapping import ReduceOp
from smdistributed.dataparallel.tensorflow import (
    Compression,
    allreduce,
    broadcast,
    init,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
    wrap_optimizer,
)
from smdistributed.dataparallel.tensorflow.keras import callbacks

__all__ = list(mapping.KERAS_NAMES)
_EXPORTED = (allreduce, broadcast, init, local_rank, local_size, rank, shutdown, size, callbacks)


def DistributedOptimizer(  # noqa: N802, PLR0917 (the library's signature)
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: ReduceOp = ReduceOp.AVERAGE,
    bucket_cap_mb: float = mapping.DEFAULT_BUCKET_CAP_MB,
    **horovod_options: Any,
) -> Any:
    """horovod.tensorflow.keras.DistributedOptimizer for model.compile(optimizer=...)."""
    return wrap_optimizer(
        hvd_keras.DistributedOptimizer,
        optimizer,
        api="keras.DistributedOptimizer",
        op=op,
        bucket_cap_mb=bucket_cap_mb,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        **horovod_options,
    )


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise mapping.unsupported(__name__, name, mapping.KERAS_NAMES)
