"""`import smdistributed.dataparallel.tensorflow as dist`: SageMaker's data-parallel TensorFlow
API on Horovod (horovod.tensorflow), so scripts written for AWS's TensorFlow containers run
unchanged. Every name is a thin call of its Horovod twin and works inside tf.function; names of
the library this image does not provide fail with one line naming them (`__getattr__`).
docs/aws-tf-scripts.md has the table."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable
from typing import Any

from smdistributed.dataparallel import mapping

# Before anything resolves tf.keras (Horovod's Keras API does): scripts for the library are
# Keras 2 scripts (mapping.legacy_keras_setting says why and when).
_LEGACY_KERAS = mapping.legacy_keras_setting(
    os.environ, tf_keras_installed=importlib.util.find_spec("tf_keras") is not None
)
if _LEGACY_KERAS is not None:
    os.environ[mapping.LEGACY_KERAS_ENV] = _LEGACY_KERAS

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

from smdistributed.dataparallel.mapping import ReduceOp  # noqa: E402

__all__ = list(mapping.TENSORFLOW_NAMES)

log = logging.getLogger(__name__)

# tf.keras is TensorFlow's lazy loader until first used, then the Keras module it chose (Keras
# 3's is keras._tf_keras.keras): a script that used it before importing this module has Keras 3.
_TF_KERAS = vars(tf).get("keras")
if (
    _LEGACY_KERAS is not None
    and not type(_TF_KERAS).__name__.endswith("LazyLoader")
    and getattr(_TF_KERAS, "__name__", "").startswith("keras.")
):
    log.warning(
        "tf.keras was Keras 3 before smdistributed.dataparallel.tensorflow was imported: "
        "a Keras 2 script (opt.variables(), model.save(folder)) needs it imported before "
        "tf.keras is used, or %s=1 in the job's environment",
        mapping.LEGACY_KERAS_ENV,
    )

# Compression.none / Compression.fp16: Horovod's classes carry the same names.
Compression = hvd.Compression

# The library raises on a second init(); Horovod's is idempotent, which this keeps.
init = hvd.init
shutdown = hvd.shutdown
size = hvd.size
local_size = hvd.local_size
rank = hvd.rank
local_rank = hvd.local_rank


def _op(op: object, api: str) -> Any:
    return getattr(hvd, mapping.horovod_op_name(op, api=api))


def allreduce(
    tensor: Any,
    param_index: int | None = None,
    num_params: int | None = None,
    compression: Any = Compression.none,
    op: ReduceOp = ReduceOp.AVERAGE,
) -> tf.Tensor:
    """Allreduce of a gradient tensor. param_index/num_params order the library's own buckets;
    Horovod fuses by name and needs neither."""
    del param_index, num_params
    return hvd.allreduce(tensor, compression=compression, op=_op(op, "allreduce"))


def oob_allreduce(
    tensor: Any, compression: Any = Compression.none, op: ReduceOp = ReduceOp.AVERAGE
) -> tf.Tensor:
    """The library's "out-of-band" allreduce of a non-gradient value (a loss, a metric, a list
    of floats). It returns the reduced value, as AWS's examples use it."""
    return hvd.allreduce(
        tf.convert_to_tensor(tensor), compression=compression, op=_op(op, "oob_allreduce")
    )


def broadcast(tensor: Any, root_rank: int) -> tf.Tensor:
    return hvd.broadcast(tensor, root_rank)


def broadcast_variables(variables: Iterable[tf.Variable], root_rank: int) -> Any:
    return hvd.broadcast_variables(variables, root_rank)


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1 graph mode only, as in the library (Horovod says so in one line under eager)."""
    return hvd.broadcast_global_variables(root_rank)


def overlap(tensor: Any) -> tf.Tensor:
    """The library's XLA hint that lets its allreduce overlap the backward pass; Horovod
    overlaps on its own, so this is an identity."""
    return tf.identity(tensor)


def DistributedOptimizer(  # noqa: N802, PLR0917 (the library's signature)
    optimizer: Any,
    name: str | None = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: ReduceOp = ReduceOp.AVERAGE,
    bucket_cap_mb: float = mapping.DEFAULT_BUCKET_CAP_MB,
    **horovod_options: Any,
) -> Any:
    """horovod.tensorflow.DistributedOptimizer; other Horovod options pass through."""
    return wrap_optimizer(
        hvd.DistributedOptimizer,
        optimizer,
        api="DistributedOptimizer",
        op=op,
        bucket_cap_mb=bucket_cap_mb,
        name=name,
        use_locking=use_locking,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        **horovod_options,
    )


def wrap_optimizer(
    horovod_factory: Any,
    optimizer: Any,
    *,
    api: str,
    op: object,
    bucket_cap_mb: float,
    **options: Any,
) -> Any:
    """What both DistributedOptimizers do before Horovod's: the op, and bucket_cap_mb said to
    be ignored when it is not the default."""
    note = mapping.bucket_cap_note(bucket_cap_mb)
    if note:
        log.warning(note)
    return horovod_factory(optimizer, op=_op(op, api), **options)


def DistributedGradientTape(  # noqa: N802, PLR0917 (the library's signature)
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: ReduceOp = ReduceOp.AVERAGE,
    **horovod_options: Any,
) -> Any:
    """horovod.tensorflow.DistributedGradientTape: tape.gradient() returns averaged gradients."""
    return hvd.DistributedGradientTape(
        gradtape,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        op=_op(op, "DistributedGradientTape"),
        **horovod_options,
    )


def BroadcastGlobalVariablesHook(root_rank: int, device: str = "") -> Any:  # noqa: N802
    """A tf.estimator SessionRunHook that broadcasts the initial variables from root_rank."""
    return hvd.BroadcastGlobalVariablesHook(root_rank, device=device)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise mapping.unsupported(__name__, name, mapping.TENSORFLOW_NAMES)
