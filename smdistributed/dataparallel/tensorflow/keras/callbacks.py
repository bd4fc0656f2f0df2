"""`smdistributed.dataparallel.tensorflow.keras.callbacks`, on horovod.tensorflow.keras's."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow.keras as hvd_keras

from smdistributed.dataparallel import mapping

__all__ = list(mapping.KERAS_CALLBACK_NAMES)

# Broadcasts the initial variables from root_rank once training starts.
BroadcastGlobalVariablesCallback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback
# Averages the epoch's metrics over every rank.
MetricAverageCallback = hvd_keras.callbacks.MetricAverageCallback


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise mapping.unsupported(__name__, name, mapping.KERAS_CALLBACK_NAMES)
