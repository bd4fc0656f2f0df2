"""The pure part of the mapping from the data-parallel library's API to Horovod's (no
TensorFlow, no Horovod import: unit-tested on the host).

The API is AWS's `smdistributed.dataparallel.tensorflow`, "designed to be close to Horovod
APIs" (the SageMaker Python SDK's doc/api/training/sdp_versions/latest/
smd_data_parallel_tensorflow.rst); docs/aws-tf-scripts.md lists each name with its Horovod twin.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

# The process and collective functions both modules provide.
_COMMON_NAMES: tuple[str, ...] = (
    "init",
    "shutdown",
    "size",
    "local_size",
    "rank",
    "local_rank",
    "allreduce",
    "broadcast",
    "DistributedOptimizer",
    "Compression",
    "ReduceOp",
)
# What smdistributed.dataparallel.tensorflow provides here (the library's documented API).
TENSORFLOW_NAMES: tuple[str, ...] = (
    *_COMMON_NAMES,
    "oob_allreduce",
    "broadcast_variables",
    "broadcast_global_variables",
    "overlap",
    "DistributedGradientTape",
    "BroadcastGlobalVariablesHook",
)
# ... and .keras (the names AWS's examples use, plus what it shares with the TensorFlow API).
KERAS_NAMES: tuple[str, ...] = (*_COMMON_NAMES, "callbacks")
KERAS_CALLBACK_NAMES: tuple[str, ...] = (
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
)

# The library's default fusion buffer (DistributedOptimizer's bucket_cap_mb).
DEFAULT_BUCKET_CAP_MB = 25


class ReduceOp(enum.Enum):
    """The library's reduction operations; each is a Horovod op of the same meaning."""

    AVERAGE = "Average"
    SUM = "Sum"
    MIN = "Min"
    MAX = "Max"

    @property
    def horovod_name(self) -> str:
        """The name of Horovod's module constant (horovod.tensorflow.Average, ...)."""
        return self.value


class UnsupportedError(AttributeError):
    """A name of the library that this image does not provide. An AttributeError, so that
    `hasattr` and `getattr(module, name, default)` still answer False/default."""


def horovod_op_name(op: object, *, api: str) -> str:
    """The Horovod op for `op` (a ReduceOp), or a one-line error naming the call."""
    if isinstance(op, ReduceOp):
        return op.horovod_name
    choices = ", ".join(f"ReduceOp.{member.name}" for member in ReduceOp)
    raise ValueError(f"{api}: op={op!r} is not one of {choices}")


def unsupported(module: str, name: str, supported: tuple[str, ...]) -> UnsupportedError:
    """The error for a name this image does not provide, in one line."""
    return UnsupportedError(
        f"{module}.{name} is not provided by this image (sm-horovod maps the SageMaker "
        f"data-parallel API onto Horovod; available: {', '.join(supported)}; "
        "see docs/aws-tf-scripts.md)"
    )


def bucket_cap_note(bucket_cap_mb: float) -> str | None:
    """DistributedOptimizer's bucket_cap_mb is the library's fusion buffer; Horovod's is the
    job-wide HOROVOD_FUSION_THRESHOLD (bytes), read once by init(). A non-default value is
    accepted and said to be ignored, never silently."""
    if bucket_cap_mb == DEFAULT_BUCKET_CAP_MB:
        return None
    threshold = int(bucket_cap_mb * 1024 * 1024)
    return (
        f"DistributedOptimizer: bucket_cap_mb={bucket_cap_mb:g} is ignored; Horovod's fusion "
        f"buffer is HOROVOD_FUSION_THRESHOLD (bytes), e.g. HOROVOD_FUSION_THRESHOLD={threshold} "
        "in the job's environment"
    )


# TensorFlow's switch that makes tf.keras tf_keras (Keras 2) on TensorFlow >= 2.16, where
# tf.keras is Keras 3 (tensorflow/python/util/lazy_loader.py reads it when tf.keras is first
# used, not when TensorFlow is imported).
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"


def legacy_keras_setting(env: Mapping[str, str], *, tf_keras_installed: bool) -> str | None:
    """The TF_USE_LEGACY_KERAS value importing the TensorFlow API sets, or None to leave the
    environment alone.

    Scripts for the library are Keras 2 scripts: its last TensorFlow release was for Keras 2,
    and AWS's tutorial calls `optimizer.variables()` (a list, not a method, in Keras 3) and
    saves a SavedModel with `model.save(folder)` (Keras 3 wants a .keras file). Where tf_keras
    is installed (the 2.21 line) they run unchanged on it; a job that sets the variable itself
    (`TF_USE_LEGACY_KERAS=0`: Keras 3) keeps its choice. Where tf_keras is not installed (the
    2.14 line, whose tf.keras is Keras 2 anyway) nothing changes.
    """
    if LEGACY_KERAS_ENV in env or not tf_keras_installed:
        return None
    return "1"
